// fd-relative resolution of user-named paths inside a container root (mount destinations, /etc
// files we generate): nothing here can be redirected out of the root by a symlink in the image.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

#include "gantry/files.hpp"
#include "gantry/mounts.hpp"

namespace gantry {

std::string fd_path(int fd) {
    return "/proc/self/fd/" + std::to_string(fd);
}

Result<UniqueFd> open_in_root(int root, const std::string& path) {
    std::string rel = path.size() > 1 ? path.substr(1) : ".";
    struct open_how how {};
    how.flags = O_PATH | O_CLOEXEC;
    // IN_ROOT: absolute symlinks and ".." are clamped at `root`; NO_MAGICLINKS: an image cannot carry a
    // /proc/self/... style link into the host (there is no /proc under the root yet, but be explicit).
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    int fd = openat2_retrying(root, rel, how);
    if (fd < 0) return system_error("opening " + path + " in the container");
    return UniqueFd(fd);
}

Result<UniqueFd> ensure_in_root(int root, const std::string& path, NodeType type) {
    auto existing = open_in_root(root, path);
    if (existing || existing.error().errnum != ENOENT || path == "/") return existing;

    auto slash = path.rfind('/');
    std::string parent = slash == 0 ? "/" : path.substr(0, slash);
    std::string leaf = path.substr(slash + 1);
    auto dir = ensure_in_root(root, parent, NodeType::directory);
    if (!dir) return dir;
    // The parent was opened inside the root; creating `leaf` relative to it cannot leave the root.
    // O_NOFOLLOW|O_EXCL: a dangling symlink at `leaf` is not followed to create its target.
    if (type == NodeType::directory) {
        if (::mkdirat(dir->get(), leaf.c_str(), 0755) != 0 && errno != EEXIST)
            return system_error("creating directory " + path + " in the container");
    } else {
        int fd = ::openat(dir->get(), leaf.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) return system_error("creating file " + path + " in the container");
        if (fd >= 0) ::close(fd);
    }
    return open_in_root(root, path);
}

}  // namespace gantry
