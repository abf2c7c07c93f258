// File-system helpers shared by the store, the CLI and the launcher.
#include "gantry/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>

namespace gantry {

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

std::optional<std::string> try_read_file(const std::string& path) {
    auto r = read_file(path);
    if (!r) return std::nullopt;
    return std::move(*r);
}

Status write_file_atomic(const std::string& path, const std::string& content, mode_t mode) {
    std::random_device rd;
    std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
    if (!fd) return system_error("writing " + tmp);
    Defer cleanup([&] { ::unlink(tmp.c_str()); });
    size_t off = 0;
    while (off < content.size()) {
        ssize_t n = ::write(fd.get(), content.data() + off, content.size() - off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return system_error("writing " + tmp);
        }
        off += static_cast<size_t>(n);
    }
    if (::fchmod(fd.get(), mode) != 0) return system_error("setting mode of " + tmp);
    if (::fsync(fd.get()) != 0) return system_error("flushing " + tmp);
    if (::close(fd.release()) != 0) return system_error("closing " + tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return system_error("renaming " + tmp + " to " + path);
    cleanup.dismiss();
    return {};
}

Status remove_tree(const std::string& path) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return make_error("removing " + path + ": " + ec.message());
    return {};
}

uint64_t tree_size(const std::string& path) {
    uint64_t total = 0;
    std::error_code ec;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
    for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += static_cast<uint64_t>(st.st_size);
    }
    return total;
}

std::string host_and_pid() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return std::string(host) + ":" + std::to_string(::getpid());
}

}  // namespace gantry
