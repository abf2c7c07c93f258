// Site-wide drop-ins in Enroot's formats (environ.d/*.env, mounts.d/*.fstab) and their application to
// a ContainerSpec; see include/gantry/dropins.hpp for the formats and the precedence.
#include "gantry/dropins.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>

#include "gantry/acquire.hpp"
#include "gantry/files.hpp"
#include "gantry/image_config.hpp"
#include "gantry/launcher.hpp"
#include "gantry/log.hpp"
#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

constexpr size_t kMaxDropinBytes = 1 << 20;  // one drop-in file; real ones are a few lines

bool valid_name(std::string_view name) {
    if (name.empty() || (std::isdigit(static_cast<unsigned char>(name[0])) != 0)) return false;
    return std::all_of(name.begin(), name.end(),
                       [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; });
}

std::vector<std::string> split_fields(const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    std::string f;
    while (in >> f) out.push_back(f);
    return out;
}

// Owned by root (or by the unprivileged caller itself) and writable by nobody else: then only the
// admin (or that caller) decides what the file says. `what` is "directory" or "file".
Status check_owner(const struct stat& st, const std::string& path, const char* what) {
    uid_t me = ::geteuid();
    if (st.st_uid != 0 && st.st_uid != me)
        return make_error("drop-in " + std::string(what) + " " + path + " is owned by uid " +
                          std::to_string(st.st_uid) + ", not root: refusing to read it (chown root " + path + ")");
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
        return make_error("drop-in " + std::string(what) + " " + path + " is writable by its group or others (mode " +
                          mode + "): refusing to read it (chmod go-w " + path + ")");
    }
    return {};
}

struct DropinFile {
    std::string path;
    std::string text;
};

// The *SUFFIX files of `dir` in lexical order, each checked (check_owner) on its open descriptor before
// it is read. Symlinks are followed: the directory is the admin's, so is every link in it.
Result<std::vector<DropinFile>> read_dropin_dir(const std::string& dir, const std::string& suffix) {
    std::vector<DropinFile> out;
    if (dir.empty()) return out;
    UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dfd) {
        if (errno == ENOENT) return out;
        return system_error("opening drop-in directory " + dir);
    }
    struct stat dst {};
    if (::fstat(dfd.get(), &dst) != 0) return system_error("reading drop-in directory " + dir);
    GANTRY_TRY(check_owner(dst, dir, "directory"));
    auto directory = Directory::open(fd_path(dfd.get()));
    if (!directory) return directory.error().wrap("reading drop-in directory " + dir);
    auto names = list_directory(*directory);
    if (!names) return names.error().wrap("reading drop-in directory " + dir);
    std::sort(names->begin(), names->end());
    for (const auto& name : *names) {
        if (name.size() <= suffix.size() || !ends_with(name, suffix) || name[0] == '.') continue;
        std::string path = dir + "/" + name;
        UniqueFd fd(::openat(dfd.get(), name.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
        if (!fd) return system_error("opening drop-in file " + path);
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) return system_error("reading drop-in file " + path);
        if (!S_ISREG(st.st_mode)) return make_error("drop-in file " + path + " is not a regular file");
        GANTRY_TRY(check_owner(st, path, "file"));
        auto text = read_capped(fd.get(), kMaxDropinBytes, "drop-in file " + path);
        if (!text) return text.error();
        out.push_back({path, std::move(*text)});
    }
    return out;
}

Status parse_fstab_options(DropinMount& d, const std::string& options) {
    for (const auto& o : split_list(options, ',')) {
        if (o.empty() || o == "defaults") continue;
        if (o == "nofail") {
            d.nofail = true;
        } else if (starts_with(o, "x-create=")) {
            std::string kind = o.substr(9);
            // Gantry creates every mount point (as a directory or a file, like the source), so the
            // value only has to be one Enroot knows.
            if (kind != "dir" && kind != "file" && kind != "auto")
                return make_error("option '" + o + "': expected x-create=dir, x-create=file or x-create=auto");
        } else if (o == "x-move" || o == "x-detach") {
            return make_error("option '" + o + "' is not supported (Gantry applies bind mounts and tmpfs only)");
        } else if (!apply_mount_flag(d.mount, o)) {
            return make_error("unknown mount option '" + o + "'");
        }
    }
    return {};
}

Result<DropinMount> parse_fstab_line(const std::vector<std::string>& raw, const std::vector<std::string>& env) {
    std::vector<std::string> f;
    for (const auto& r : raw) {
        auto e = expand_variables(r, env);
        if (!e) return e.error();
        f.push_back(std::move(*e));
    }
    if (f.size() < 2 || f.size() > 6) return make_error("expected 'SOURCE TARGET [TYPE [OPTIONS]]'");
    std::string type, options;
    if (f.size() == 2) {
        type = f[0] == "tmpfs" ? "tmpfs" : "none";
    } else if (f.size() == 3 && f[2] != "none" && f[2] != "tmpfs") {
        type = f[0] == "tmpfs" ? "tmpfs" : "none";
        options = f[2];
    } else {
        type = f[2];
        if (f.size() > 3) options = f[3];
    }
    DropinMount d;
    if (type == "tmpfs") {
        d.mount.kind = MountKind::tmpfs;
        d.mount.source = "tmpfs";
    } else if (type == "none") {
        d.mount.kind = MountKind::bind;
        d.mount.source = f[0];
        if (f[0].empty() || f[0][0] != '/')
            return make_error("source '" + f[0] + "' is not an absolute host path (or tmpfs)");
        // The kernel would read the source only up to a NUL (as for targets, normalize_container_path).
        if (f[0].find('\0') != std::string::npos) return make_error("source contains a NUL byte");
    } else {
        return make_error("file system type '" + type + "' is not supported (use none for a bind mount, or tmpfs)");
    }
    std::string target = f[1];
    if (!target.empty() && target[0] != '/' && target[0] != '.') target = "/" + target;
    auto dst = normalize_container_path(target, "target");
    if (!dst) return dst.error();
    d.mount.destination = *dst;
    GANTRY_TRY(parse_fstab_options(d, options));
    return d;
}

}  // namespace

Result<std::string> expand_variables(std::string_view text, const std::vector<std::string>& env) {
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
        if (text[i] != '$' || i + 1 >= text.size() || text[i + 1] != '{') {
            out += text[i++];
            continue;
        }
        size_t close = text.find('}', i + 2);
        std::string_view name =
            close == std::string_view::npos ? text.substr(i + 2) : text.substr(i + 2, close - i - 2);
        if (close == std::string_view::npos || !valid_name(name))
            return make_error("'" +
                              std::string(text.substr(i, close == std::string_view::npos ? text.npos : close - i + 1)) +
                              "' is not a ${NAME} reference (only ${NAME} is expanded)");
        if (auto v = find_env(env, std::string(name))) out += *v;
        i = close + 1;
    }
    return out;
}

Result<std::vector<std::string>> parse_environment_file(std::string_view text, const std::vector<std::string>& env,
                                                        const std::string& origin, bool lenient) {
    std::vector<std::string> out;
    GANTRY_TRY(for_each_config_line(text, origin, [&](std::string& line, const std::string& where) -> Status {
        if (starts_with(line, "export ")) line = trim(line.substr(7));
        auto eq = line.find('=');
        std::string name = trim(line.substr(0, eq));
        if (eq == std::string::npos || !valid_name(name)) {
            if (lenient) return {};
            return make_error(where + ": expected NAME=VALUE, got '" + line + "'");
        }
        std::string value = trim(line.substr(eq + 1));
        if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
            value = value.substr(1, value.size() - 2);
        auto expanded = expand_variables(value, env);
        if (!expanded) {
            if (lenient) {
                out.push_back(name + "=" + value);
                return {};
            }
            return expanded.error().wrap(where + ": " + name);
        }
        out.push_back(name + "=" + *expanded);
        return {};
    }));
    return out;
}

Result<std::vector<DropinMount>> parse_fstab_file(std::string_view text, const std::vector<std::string>& env,
                                                  const std::string& origin) {
    std::vector<DropinMount> out;
    GANTRY_TRY(for_each_config_line(text, origin, [&](std::string& line, const std::string& where) -> Status {
        auto d = parse_fstab_line(split_fields(line), env);
        if (!d) return d.error().wrap(where);
        d->where = where;
        d->mount.text = line;
        out.push_back(std::move(*d));
        return {};
    }));
    return out;
}

Result<SiteDefaults> load_site_defaults(const Config& config, const std::vector<std::string>& env) {
    SiteDefaults site;
    auto env_files = read_dropin_dir(config.environ_dir, ".env");
    if (!env_files) return env_files.error();
    for (const auto& f : *env_files) {
        auto vars = parse_environment_file(f.text, env, f.path);
        if (!vars) return vars.error();
        site.env.insert(site.env.end(), vars->begin(), vars->end());
    }
    auto mount_files = read_dropin_dir(config.mounts_dir, ".fstab");
    if (!mount_files) return mount_files.error();
    for (const auto& f : *mount_files) {
        auto mounts = parse_fstab_file(f.text, env, f.path);
        if (!mounts) return mounts.error();
        for (auto& d : *mounts) {
            // The source is not looked at here: this may run as root, and ${USER} or any variable of the
            // job's environment may be part of it, so whether it exists would tell the user about paths
            // they cannot see. The user's own check (check_mount_sources, as the user) and the holder
            // decide: a missing source fails the step with "source path does not exist", a `nofail`
            // one is left out when the user does not reach it.
            d.mount.nofail = d.nofail && d.mount.kind == MountKind::bind;
            d.mount.origin = d.where;
            site.mounts.push_back(std::move(d.mount));
        }
    }
    return site;
}

namespace {

// Words as bash's ${word@Q} writes them: 'text' pieces, '\'' for a quote, separated by blanks.
// nullopt for anything else ($'...' forms, double quotes, variables).
std::optional<std::vector<std::string>> quoted_words(std::string_view s) {
    std::vector<std::string> words;
    size_t i = 0;
    while (true) {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
        if (i == s.size()) return words;
        std::string word;
        while (i < s.size() && s[i] != ' ' && s[i] != '\t') {
            if (s[i] == '\'') {
                size_t end = s.find('\'', i + 1);
                if (end == std::string_view::npos) return std::nullopt;
                word.append(s.substr(i + 1, end - i - 1));
                i = end + 1;
            } else if (s.substr(i, 2) == "\\'") {
                word += '\'';
                i += 2;
            } else {
                return std::nullopt;
            }
        }
        words.push_back(std::move(word));
    }
}

}  // namespace

EnrootImageSettings parse_enroot_rc(std::string_view rc) {
    EnrootImageSettings out;
    // Enroot never writes a NUL byte; a file with one is hand-made and left alone like any other. (A NUL
    // inside a quoted word would also split the helper's NUL-separated reply into entries of its own.)
    if (rc.find('\0') != std::string_view::npos) return out;
    bool cd_seen = false, with_args_seen = false;
    std::istringstream in{std::string(rc)};
    for (std::string raw; std::getline(in, raw);) {
        std::string line = trim(raw);
        if (!cd_seen) {
            if (line.empty() || line[0] == '#' || starts_with(line, "mkdir ")) continue;
            cd_seen = true;  // only the first command may set the working directory
            if (starts_with(line, "cd \"")) {
                size_t end = line.find('"', 4);
                std::string dir = end == std::string::npos ? "" : line.substr(4, end - 4);
                std::string rest = end == std::string::npos ? "" : trim(line.substr(end + 1));
                bool plain = !dir.empty() && dir[0] == '/' && dir.find_first_of("$`\\") == std::string::npos;
                if (plain && (rest.empty() || starts_with(rest, "&&") || starts_with(rest, "||") || rest[0] == ';'))
                    out.workdir = dir;
            } else if (starts_with(line, "cd '")) {
                // As `gantry export` writes it (enroot_rc): cd 'DIR' || exit 1, quoted as ${DIR@Q} would.
                size_t end = 3;
                for (bool quoted = false; end < line.size() && (quoted || (line[end] != ' ' && line[end] != ';'));
                     ++end) {
                    if (!quoted && line[end] == '\\' && end + 1 < line.size() && line[end + 1] == '\'')
                        ++end;  // \' outside quotes: a quote character, not a quote
                    else if (line[end] == '\'')
                        quoted = !quoted;
                }
                auto dir = quoted_words(std::string_view(line).substr(3, end - 3));
                std::string rest = trim(line.substr(end));
                if (dir && dir->size() == 1 && !dir->front().empty() && dir->front()[0] == '/' &&
                    (rest.empty() || starts_with(rest, "&&") || starts_with(rest, "||") || rest[0] == ';'))
                    out.workdir = dir->front();
            }
        }
        if (!starts_with(line, "exec ")) continue;
        std::string_view words = std::string_view(line).substr(5);
        if (!with_args_seen) {
            // exec ENTRYPOINT... "$@": the branch that runs the user's command.
            constexpr std::string_view kArgs = "\"$@\"";
            if (words.size() < kArgs.size() || words.substr(words.size() - kArgs.size()) != kArgs) continue;
            auto entry = quoted_words(words.substr(0, words.size() - kArgs.size()));
            if (!entry) return {out.env, out.workdir, {}, {}};
            out.entrypoint = std::move(*entry);
            with_args_seen = true;
            continue;
        }
        // exec ENTRYPOINT... CMD...: the branch without a command.
        auto all = quoted_words(words);
        if (all && all->size() >= out.entrypoint.size() &&
            std::equal(out.entrypoint.begin(), out.entrypoint.end(), all->begin()))
            out.cmd.assign(all->begin() + static_cast<std::ptrdiff_t>(out.entrypoint.size()), all->end());
        break;
    }
    return out;
}

Result<EnrootImageSettings> read_enroot_settings(const std::string& image, uid_t uid, gid_t gid,
                                                 const std::vector<std::string>& env, const std::string& helper,
                                                 std::chrono::seconds timeout,
                                                 const std::function<bool()>& should_stop) {
    ProcessRequest r;
    r.argv = {helper.empty() ? default_holder_program() : helper, "--enroot-settings", image};
    pass_image_descriptors(r, {image});
    r.env = env;  // the job's (or caller's) own variables: ${NAME} in the file expands from them
    r.stdout_cap = 256 << 10;
    r.stderr_cap = 16 << 10;
    const std::string what = "reading the settings of image " + image;
    // Root for a job user: the helper takes the user's groups, gid and uid (checked) before exec, so
    // the image (the user's bytes and path) is opened and parsed with the user's rights only.
    if (::geteuid() == 0 && uid != static_cast<uid_t>(-1) && uid != 0) r.identity = user_identity(uid, gid);
    // The image may sit on a stalled (e.g. SIGSTOPped FUSE) file system the user made: the helper
    // gets a deadline and the step's stop request, and is killed and reaped past either.
    r.timeout = timeout;
    r.should_stop = should_stop;
    auto ran = spawn(r);
    if (!ran) return ran.error().wrap(what);
    if (std::string why = stop_reason(r, *ran, "check_timeout_seconds"); !why.empty())
        return make_error(what + ": " + why);
    if (ran->status != 0) {
        std::string why = trim(ran->err);
        if (why.empty()) why = "the helper " + r.argv[0] + " exited with status " + std::to_string(ran->status);
        return make_error(why.substr(0, why.find('\n')));
    }
    // The helper's entries are checked again here: NAME=VALUE with a valid NAME, or one of the
    // three @ fields; a working directory must be absolute.
    EnrootImageSettings out;
    size_t start = 0;
    const std::string& reply = ran->out;
    while (start < reply.size()) {
        size_t end = reply.find('\0', start);
        if (end == std::string::npos) break;  // a truncated last entry is dropped
        std::string entry = reply.substr(start, end - start);
        start = end + 1;
        auto eq = entry.find('=');
        if (eq == std::string::npos) continue;
        std::string key = entry.substr(0, eq), value = entry.substr(eq + 1);
        if (key == "@workdir" && !value.empty() && value[0] == '/')
            out.workdir = value;
        else if (key == "@entrypoint")
            out.entrypoint.push_back(value);
        else if (key == "@cmd")
            out.cmd.push_back(value);
        else if (valid_name(key))
            out.env.push_back(std::move(entry));
    }
    return out;
}

Status apply_site_defaults(ContainerSpec& spec, const std::vector<std::string>& env) {
    const ImageConfig& ic = spec.image_config;
    if (ic.env.empty() && ic.entrypoint.empty() && ic.cmd.empty()) {
        auto enroot = read_enroot_settings(spec.image_path, spec.uid, spec.gid, env, spec.holder_program,
                                           std::chrono::seconds(spec.config.check_timeout_seconds), spec.should_stop);
        if (!enroot) return enroot.error();
        spec.image_config.env = std::move(enroot->env);
        if (spec.image_config.working_dir.empty()) spec.image_config.working_dir = enroot->workdir;
        spec.image_config.entrypoint = std::move(enroot->entrypoint);
        spec.image_config.cmd = std::move(enroot->cmd);
    }
    auto site = load_site_defaults(spec.config, env);
    if (!site) return site.error();
    for (auto& e : site->env) spec.image_config.env.push_back(std::move(e));
    spec.mounts.insert(spec.mounts.begin(), site->mounts.begin(), site->mounts.end());
    return {};
}

}  // namespace gantry
