// The environment of an Enroot-made image (its /etc/environment), read as the user: the image file is
// the user's bytes and path, so root never opens or parses it (include/gantry/dropins.hpp).
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "gantry/dropins.hpp"
#include "gantry/squashfs.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

constexpr size_t kMaxEnvironmentBytes = 64 << 10;  // an image's /etc/environment: a few lines in practice
constexpr size_t kMaxReplyBytes = 4 * kMaxEnvironmentBytes;

// Reads and parses the file with the caller's rights: "NAME=VALUE" entries.
Result<std::vector<std::string>> read_as_caller(const std::string& image, const std::vector<std::string>& env) {
    GANTRY_TRY(launcher::check_squashfs(image));  // a regular squashfs file, with the usual messages
    auto text = read_image_file(image, "/etc/environment", kMaxEnvironmentBytes);
    if (!text) return text.error();
    if (!*text) return std::vector<std::string>{};
    return parse_environment_file(**text, env, image + ":/etc/environment", true);
}

}  // namespace

Result<std::vector<std::string>> read_image_environment(const std::string& image, uid_t uid, gid_t gid,
                                                        const std::vector<std::string>& env) {
    if (::geteuid() != 0 || uid == static_cast<uid_t>(-1) || uid == 0) return read_as_caller(image, env);
    // Root for a job user: a child takes the user's groups, gid and uid (checked) and reads the image;
    // only its reply comes back on a pipe: "!" and an error, or NUL-terminated NAME=VALUE entries.
    std::vector<gid_t> groups = {gid};
    if (struct passwd* pw = ::getpwuid(uid)) {
        int n = 256;
        groups.resize(static_cast<size_t>(n));
        if (::getgrouplist(pw->pw_name, gid, groups.data(), &n) < 0) n = 0;
        groups.resize(static_cast<size_t>(n));
        if (groups.empty()) groups.push_back(gid);
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return system_error("creating a pipe");
    UniqueFd rd(fds[0]), wr(fds[1]);
    pid_t pid = ::fork();
    if (pid < 0) return system_error("reading the environment of image " + image + " as uid " + std::to_string(uid));
    if (pid == 0) {
        rd.reset();
        std::string reply = "!could not switch to uid " + std::to_string(uid);
        if (::setgroups(groups.size(), groups.data()) == 0 && ::setresgid(gid, gid, gid) == 0 &&
            ::setresuid(uid, uid, uid) == 0 && ::geteuid() == uid) {
            auto vars = read_as_caller(image, env);
            if (!vars) {
                reply = "!" + vars.error().message;
            } else {
                reply.clear();
                for (const auto& v : *vars) reply.append(v).push_back('\0');
            }
        }
        size_t off = 0, len = std::min(reply.size(), kMaxReplyBytes);
        while (off < len) {
            ssize_t n = ::write(wr.get(), reply.data() + off, len - off);
            if (n <= 0 && errno != EINTR) break;
            if (n > 0) off += static_cast<size_t>(n);
        }
        ::_exit(0);
    }
    wr.reset();
    std::string reply;
    char chunk[4096];
    ssize_t n;
    while ((n = ::read(rd.get(), chunk, sizeof chunk)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0 && reply.size() < kMaxReplyBytes) reply.append(chunk, static_cast<size_t>(n));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return make_error("reading the environment of image " + image + " as uid " + std::to_string(uid) + " failed");
    if (!reply.empty() && reply[0] == '!') return make_error(reply.substr(1));
    // The child's entries are checked again here: only NAME=VALUE with a valid NAME passes.
    std::vector<std::string> out;
    size_t start = 0;
    while (start < reply.size()) {
        size_t end = reply.find('\0', start);
        if (end == std::string::npos) break;  // a truncated last entry is dropped
        std::string entry = reply.substr(start, end - start);
        start = end + 1;
        auto eq = entry.find('=');
        if (eq == 0 || eq == std::string::npos) continue;
        bool ok = std::isdigit(static_cast<unsigned char>(entry[0])) == 0 &&
                  std::all_of(entry.begin(), entry.begin() + static_cast<long>(eq),
                              [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; });
        if (ok) out.push_back(std::move(entry));
    }
    return out;
}

}  // namespace gantry
