// File-system helpers shared by the store, the CLI and the launcher.
#include "gantry/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

namespace gantry {

int openat2_retrying(int dirfd, const std::string& path, const struct open_how& how) {
    for (int attempt = 0;; ++attempt) {
        int fd = static_cast<int>(::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how));
        if (fd >= 0 || errno != EAGAIN || attempt >= 1000) return fd;
    }
}
namespace {

// Deeper trees than this are not ours (staging areas are two levels deep): the walk stops rather than
// recursing without bound through a tree a user built.
constexpr int kMaxTreeDepth = 64;

// The entries of an open directory except . and .. (the descriptor is duplicated: `fd` stays open).
Result<std::vector<std::string>> entries_of(int fd, const std::string& shown) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return system_error("reading directory " + shown);
    DIR* d = ::fdopendir(dup);
    if (d == nullptr) {
        ::close(dup);
        return system_error("reading directory " + shown);
    }
    ::rewinddir(d);
    std::vector<std::string> out;
    while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(std::move(n));
    }
    ::closedir(d);
    return out;
}

// Opens the directory `name` below `parent` for a walk: no symlink, and on the device `dev`.
Result<UniqueFd> open_walk_dir(int parent, const std::string& name, dev_t dev, const std::string& shown) {
    UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return system_error("opening directory " + shown);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("opening directory " + shown);
    if (st.st_dev != dev)
        return make_error("removing " + shown + ": is another file system (a mount point); left in place");
    return fd;
}

Status remove_entry(int parent, const std::string& name, dev_t dev, const std::string& shown, int depth) {
    // Files and symlinks go with unlinkat; only a directory (EISDIR) is entered.
    if (::unlinkat(parent, name.c_str(), 0) == 0 || errno == ENOENT) return {};
    int err = errno;
    struct stat st {};
    if (err != EISDIR &&
        !(err == EPERM && ::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)))
        return system_error("removing " + shown, err);
    if (depth >= kMaxTreeDepth)
        return make_error("removing " + shown + ": deeper than " + std::to_string(kMaxTreeDepth) + " levels");
    auto fd = open_walk_dir(parent, name, dev, shown);
    if (!fd) return fd.error();
    auto names = entries_of(fd->get(), shown);
    if (!names) return names.error();
    Status first;
    for (const auto& n : *names) {
        auto st = remove_entry(fd->get(), n, dev, shown + "/" + n, depth + 1);
        if (!st && first) first = st;
    }
    if (!first) return first;
    if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
        return system_error("removing " + shown);
    return {};
}

uint64_t size_of_entry(int parent, const std::string& name, dev_t dev, int depth) {
    struct stat st {};
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != dev) return 0;
    if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
    if (!S_ISDIR(st.st_mode) || depth >= kMaxTreeDepth) return 0;
    auto fd = open_walk_dir(parent, name, dev, name);
    if (!fd) return 0;
    auto names = entries_of(fd->get(), name);
    if (!names) return 0;
    uint64_t total = 0;
    for (const auto& n : *names) total += size_of_entry(fd->get(), n, dev, depth + 1);
    return total;
}

std::string dir_of(const std::string& path) {
    auto slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Status make_directories(const std::string& path, mode_t mode) {
    if (path.empty()) return make_error("creating directory: empty path");
    std::string cur;
    size_t pos = 0;
    while (pos <= path.size()) {
        size_t next = path.find('/', pos);
        if (next == std::string::npos) next = path.size();
        cur = path.substr(0, next);
        pos = next + 1;
        if (cur.empty()) continue;
        if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return system_error("creating directory " + cur);
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return system_error("creating directory " + path);
    if (!S_ISDIR(st.st_mode)) return make_error("creating directory " + path + ": exists and is not a directory");
    return {};
}

Result<std::string> read_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return system_error("reading " + path);
    std::string out;
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd.get(), buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            return system_error("reading " + path);
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    return out;
}

Result<Directory> Directory::open(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return system_error("opening directory " + path);
    return Directory(std::move(fd), path);
}

Result<Directory> Directory::open_sub(const std::string& name) const {
    UniqueFd fd(::openat(fd_.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd) return Directory(std::move(fd), path_of(name));
    int err = errno;
    struct stat st {};
    if ((err == ELOOP || err == ENOTDIR) && ::fstatat(fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
        return make_error("opening " + path_of(name) + ": " +
                          (S_ISLNK(st.st_mode) ? "is a symbolic link" : "is not a directory") +
                          ", which is never followed here; remove it");
    return system_error("opening " + path_of(name), err);
}

Result<std::vector<std::string>> list_directory(const Directory& dir) {
    return entries_of(dir.fd(), dir.path());
}

Result<RegularFile> open_regular_at(const Directory& dir, const std::string& name, int flags, mode_t mode) {
    RegularFile f;
    f.fd = UniqueFd(::openat(dir.fd(), name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode));
    if (!f.fd) {
        if (errno == ELOOP)
            return make_error("opening " + dir.path_of(name) +
                              ": is a symbolic link, which is never followed here; remove it");
        return system_error("opening " + dir.path_of(name));
    }
    if (::fstat(f.fd.get(), &f.st) != 0) return system_error("opening " + dir.path_of(name));
    if (!S_ISREG(f.st.st_mode)) return make_error("opening " + dir.path_of(name) + ": not a regular file; remove it");
    return f;
}

Status write_all(int fd, std::string_view data, const std::string& what) {
    while (!data.empty()) {
        ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return system_error(what);
        data.remove_prefix(static_cast<size_t>(n));
    }
    return {};
}

Result<std::string> read_capped(int fd, size_t max_bytes, const std::string& what) {
    std::string out;
    char buf[65536];
    for (off_t off = 0;;) {
        ssize_t n = ::pread(fd, buf, sizeof buf, off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return system_error("reading " + what);
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
        off += n;
        if (out.size() > max_bytes)
            return make_error("reading " + what + ": larger than the limit of " + std::to_string(max_bytes) + " bytes");
    }
    return out;
}

namespace {

// read_capped of a regular file whose fstat said `size`: one already larger is refused before a byte
// is read; the cap still holds while reading (the file may grow after the fstat).
Result<std::string> read_regular_capped(int fd, off_t size, size_t max_bytes, const std::string& what) {
    if (static_cast<uint64_t>(size) > max_bytes)
        return make_error("reading " + what + ": larger than the limit of " + std::to_string(max_bytes) + " bytes");
    return read_capped(fd, max_bytes, what);
}

}  // namespace

Result<std::string> read_regular_at(const Directory& dir, const std::string& name, size_t max_bytes, struct stat* st) {
    auto f = open_regular_at(dir, name, O_RDONLY);
    if (!f) return f.error();
    if (st != nullptr) *st = f->st;
    return read_regular_capped(f->fd.get(), f->st.st_size, max_bytes, dir.path_of(name));
}

Result<std::string> read_config_file(const std::string& path, const std::string& what, size_t max_bytes) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!fd) return system_error("reading " + what);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("reading " + what);
    if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) return std::string();  // /dev/null
    if (!S_ISREG(st.st_mode))
        return make_error("reading " + what +
                          ": not a regular file (a FIFO, device or directory is never read as one); put a file there");
    return read_regular_capped(fd.get(), st.st_size, max_bytes, what);
}

Status write_file_atomic_at(const Directory& dir, const std::string& name, const std::string& content, mode_t mode) {
    std::random_device rd;
    std::string tmp = name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
    UniqueFd fd(::openat(dir.fd(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!fd) return system_error("writing " + dir.path_of(tmp));
    Defer cleanup([&] { ::unlinkat(dir.fd(), tmp.c_str(), 0); });
    GANTRY_TRY(write_all(fd.get(), content, "writing " + dir.path_of(tmp)));
    if (::fchmod(fd.get(), mode) != 0) return system_error("setting mode of " + dir.path_of(tmp));
    if (::fsync(fd.get()) != 0) return system_error("flushing " + dir.path_of(tmp));
    if (::close(fd.release()) != 0) return system_error("closing " + dir.path_of(tmp));
    if (::renameat(dir.fd(), tmp.c_str(), dir.fd(), name.c_str()) != 0)
        return system_error("replacing " + dir.path_of(name));
    cleanup.dismiss();
    return {};
}

Status remove_tree_at(const Directory& dir, const std::string& name) {
    struct stat st {};
    if (::fstat(dir.fd(), &st) != 0) return system_error("removing " + dir.path_of(name));
    return remove_entry(dir.fd(), name, st.st_dev, dir.path_of(name), 0);
}

uint64_t tree_size_at(const Directory& dir, const std::string& name) {
    struct stat st {};
    if (::fstat(dir.fd(), &st) != 0) return 0;
    return size_of_entry(dir.fd(), name, st.st_dev, 0);
}

std::optional<std::string> try_read_file(const std::string& path) {
    auto r = read_file(path);
    if (!r) return std::nullopt;
    return std::move(*r);
}

Status write_file_atomic(const std::string& path, const std::string& content, mode_t mode) {
    auto slash = path.find_last_of('/');
    auto dir = Directory::open(dir_of(path));
    if (!dir) return dir.error().wrap("writing " + path);
    return write_file_atomic_at(*dir, slash == std::string::npos ? path : path.substr(slash + 1), content, mode);
}

Status remove_tree(const std::string& path) {
    std::string trimmed = path;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    auto slash = trimmed.find_last_of('/');
    std::string name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
    if (name.empty() || name == "." || name == ".." || trimmed == "/")
        return make_error("removing " + path + ": refused");
    auto parent = Directory::open(dir_of(trimmed));
    if (!parent) return parent.error().errnum == ENOENT ? Status{} : parent.error();
    return remove_tree_at(*parent, name);
}

uint64_t tree_size(const std::string& path) {
    auto slash = path.find_last_of('/');
    auto parent = Directory::open(dir_of(path));
    if (!parent) return 0;
    return tree_size_at(*parent, slash == std::string::npos ? path : path.substr(slash + 1));
}

std::string host_and_pid() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return std::string(host) + ":" + std::to_string(::getpid());
}

}  // namespace gantry
