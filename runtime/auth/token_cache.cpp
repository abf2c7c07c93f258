// The on-disk token cache shared by native ECR (ECR authorization tokens) and sts:AssumeRole (role
// credentials): one private directory per user, one 0600 JSON file per cache key, and a lock file
// beside it so that many ranks starting at once make one request to the token service while the
// others wait and read its answer.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "auth/internal.hpp"
#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/sigv4.hpp"

namespace gantry::auth {

std::string token_cache_dir() {
    std::string base = environment().xdg_cache_home.value;
    if (base.empty()) {
        std::string home = home_dir();
        if (home.empty()) return {};
        base = home + "/.cache";
    }
    return base + "/gantry/tokens";
}

std::string token_cache_file(const std::string& prefix, const std::string& key) {
    const std::string dir = token_cache_dir();
    if (dir.empty()) return {};
    // Private to the user: the directory 0700, every file 0600 (tokens are credentials).
    if (auto st = make_directories(dir, 0700); !st) {
        log::warning("not caching tokens: " + st.error().message);
        return {};
    }
    ::chmod(dir.c_str(), 0700);
    return dir + "/" + prefix + "-" + sigv4::sha256_hex(key).substr(0, 32);
}

std::optional<std::string> read_private_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return std::nullopt;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
        log::warning("ignoring the token cache file " + display_path(path) + ": not private to you (owner/mode)");
        return std::nullopt;
    }
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd.get(), buf, sizeof(buf))) > 0 && text.size() < (1u << 20))
        text.append(buf, static_cast<size_t>(n));
    return text;
}

UniqueFd lock_file(const std::string& path, double timeout_s) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) return fd;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) return UniqueFd();
        if (std::chrono::steady_clock::now() > deadline) return UniqueFd();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return fd;
}

}  // namespace gantry::auth
