// The node's memory of the registry's recent positive answers (include/gantry/authorization_cache.hpp):
// one empty file per (uid, digest) in a 0700 directory of root's, its mtime the moment of the answer.
#include "gantry/authorization_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "gantry/digest.hpp"

namespace gantry {

Result<AuthorizationCache> AuthorizationCache::open(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return system_error("creating " + dir);
    UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return system_error("opening " + dir);
    // Checked on the descriptor that is used from now on: ours alone, or entries could be planted.
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("checking " + dir);
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
        return make_error("refusing to use " + dir + ": not a 0700 directory of uid " + std::to_string(::geteuid()));
    return AuthorizationCache(std::move(fd));
}

std::string AuthorizationCache::entry_name(uid_t uid, const std::string& digest) {
    return std::to_string(uid) + "-" + digest_hex(digest);
}

bool AuthorizationCache::fresh(uid_t uid, const std::string& digest, std::chrono::seconds ttl) const {
    if (ttl.count() <= 0 || !validate_digest(digest)) return false;
    struct stat st {};
    if (::fstatat(dir_.get(), entry_name(uid, digest).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) return false;
    const auto age = static_cast<long long>(std::time(nullptr)) - static_cast<long long>(st.st_mtim.tv_sec);
    return age >= 0 && age <= ttl.count();
}

void AuthorizationCache::remember(uid_t uid, const std::string& digest) const {
    if (!validate_digest(digest)) return;
    UniqueFd f(::openat(dir_.get(), entry_name(uid, digest).c_str(),
                        O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
    if (f) (void)::futimens(f.get(), nullptr);
}

void AuthorizationCache::forget(uid_t uid, const std::string& digest) const {
    if (!validate_digest(digest)) return;
    (void)::unlinkat(dir_.get(), entry_name(uid, digest).c_str(), 0);
}

}  // namespace gantry
