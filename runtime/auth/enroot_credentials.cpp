// Enroot's credentials file ($ENROOT_CONFIG_PATH/.credentials), for users coming from Pyxis:
//   machine nvcr.io login $oauthtoken password <key>
//   machine 123456789012.dkr.ecr.us-east-1.amazonaws.com login AWS password $(aws ecr get-login-password)
// The USER@ selector of an image reference picks the entry with that login. A password written as
// $(command) is run as `/bin/sh -c command` -- the text between "$(" and the final ")" as one argv
// element, nothing of ours interpolated into it -- and only when the file belongs to the user and no
// one else can write it; otherwise it is refused with a message (docs/auth.md explains why).
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include "auth/internal.hpp"
#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace auth {
namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

std::string trim_ws(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return std::string(s);
}

// Strips one pair of matching quotes, as the shell would for a simple quoted word.
std::string unquote(std::string s) {
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
        return s.substr(1, s.size() - 2);
    return s;
}

bool is_hub(const std::string& h) {
    return h == "index.docker.io" || h == "docker.io" || h == "registry-1.docker.io" ||
           h == "registry.hub.docker.com" || h == "auth.docker.io";
}

std::string config_dir() {
    std::string dir = environment().enroot_config_path.value;
    if (!dir.empty()) return dir;
    std::string xdg = environment().xdg_config_home.value;
    if (!xdg.empty()) return xdg + "/enroot";
    std::string home = home_dir();
    return home.empty() ? std::string() : home + "/.config/enroot";
}

}  // namespace

std::vector<NetrcEntry> parse_netrc(std::string_view text) {
    std::vector<NetrcEntry> out;
    std::istringstream in{std::string(text)};
    std::string line;
    NetrcEntry* cur = nullptr;
    while (std::getline(in, line)) {
        // Tokens up to "password"; Enroot takes the rest of that line as the password (it may be a
        // command with spaces), so do we.
        size_t i = 0;
        auto next = [&]() -> std::string {
            while (i < line.size() && is_space(line[i])) ++i;
            size_t b = i;
            while (i < line.size() && !is_space(line[i])) ++i;
            return line.substr(b, i - b);
        };
        for (std::string tok = next(); !tok.empty(); tok = next()) {
            if (tok[0] == '#') break;
            if (tok == "machine") {
                out.push_back(NetrcEntry{next(), "", ""});
                cur = &out.back();
            } else if (tok == "default") {
                cur = nullptr;  // never used: it would send a password to every registry
            } else if (tok == "login" && cur != nullptr) {
                cur->login = next();
            } else if (tok == "password" && cur != nullptr) {
                cur->password = trim_ws(std::string_view(line).substr(std::min(i, line.size())));
                break;
            }
        }
    }
    return out;
}

}  // namespace auth

std::string enroot_credentials_source() {
    std::string dir = auth::config_dir();
    if (dir.empty()) return "$ENROOT_CONFIG_PATH/.credentials";
    return auth::display_path(dir + "/.credentials");
}

std::optional<Credentials> enroot_credentials(const ImageReference& ref) {
    std::string dir = auth::config_dir();
    if (dir.empty()) return std::nullopt;
    const std::string path = dir + "/.credentials";
    const std::string source = auth::display_path(path);
    auto text = auth::read_source_file(path, source);
    if (!text) return std::nullopt;
    const std::string registry = lower(ref.registry);
    const auth::NetrcEntry* found = nullptr;
    const auto entries = auth::parse_netrc(*text);
    for (const auto& e : entries) {
        std::string m = lower(e.machine);
        bool host_ok = m == registry || (auth::is_hub(m) && auth::is_hub(registry));
        if (!host_ok || (!ref.user.empty() && e.login != ref.user)) continue;
        found = &e;
        break;
    }
    if (found == nullptr) return std::nullopt;
    log::debug("using the entry for " + ref.registry + " with login " + found->login + " in " + source +
               (ref.user.empty() ? " (no USER@ selector: the first one)" : " (USER@ selector)"));
    Credentials c;
    c.source = source;
    c.username = auth::unquote(found->login);
    std::string pw = found->password;
    if (pw.size() >= 3 && pw.compare(0, 2, "$(") == 0 && pw.back() == ')') {
        const std::string command = pw.substr(2, pw.size() - 3);
        // Run only what the user alone could have written: the file is theirs and not writable by
        // group or others, so the command is no more than they could run themselves. The command
        // text goes to /bin/sh as one argument; the registry name or anything else is never spliced in.
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
            (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
            log::warning(
                "refusing to run the password command for " + ref.registry + " in " + source +
                ": the file must be a regular file owned by you and not writable by group or others (chmod 600)");
            return std::nullopt;
        }
        auto out = auth::run_command({"/bin/sh", "-c", command}, "", auth::helper_timeout_s());
        if (!out) {
            log::warning("password command for " + ref.registry + " in " + source + ": " + out.error().message);
            return std::nullopt;
        }
        if (out->exit_status != 0) {
            std::string first = out->err.substr(0, out->err.find('\n'));
            if (first.size() > 200) first = first.substr(0, 200) + "...";
            log::warning("password command for " + ref.registry + " in " + source + " exited with status " +
                         std::to_string(out->exit_status) + (first.empty() ? "" : ": " + first));
            return std::nullopt;
        }
        pw = auth::trim_ws(out->out);
        c.source = source + " (password command)";
    } else {
        pw = auth::unquote(pw);
    }
    if (pw.empty()) return std::nullopt;
    c.password = pw;
    return c;
}

}  // namespace gantry
