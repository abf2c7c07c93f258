// The registry's recent "yes" to a user for an image, remembered on one node for a bounded time
// (gantry.conf authorization_cache_seconds). In a trusted store (store_owner) the registry is what
// authorises a job user to have a stored image: the store account's half of each pull asks it with the
// user's own credentials (docs/store.md). A step whose reference is pinned to a digest, by the user or
// by srun's local resolution, may skip that request on a node that got a positive answer for the same
// user and digest less than that long ago.
//
// The key is (uid, digest), not the repository: a registry that served manifest DIGEST to the user's
// credentials under any name let the user have those very bytes. An entry is written only by root
// (slurmstepd) after the store account's pull -- a process the job user cannot trace or preload into --
// reported that digest; the user's environment, which names the digest, never writes one. The directory
// is node-local (runtime_path), root's, mode 0700: no other account can plant or age an entry.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry {

class AuthorizationCache {
public:
    // `dir` is made (0700) if missing; it must be a directory owned by the calling account (root in
    // the plugin), not writable by group or others, and not a symlink.
    static Result<AuthorizationCache> open(const std::string& dir);

    // True when the registry said yes to `uid` for `digest` at most `ttl` ago (and not in the future:
    // a clock set back does not stretch an entry). ttl 0: never.
    [[nodiscard]] bool fresh(uid_t uid, const std::string& digest, std::chrono::seconds ttl) const;
    // Records a yes now. Best effort: an entry that cannot be written only costs a registry request.
    void remember(uid_t uid, const std::string& digest) const;
    // Removes the entry (the registry said no, or the image turned out unusable).
    void forget(uid_t uid, const std::string& digest) const;

private:
    explicit AuthorizationCache(UniqueFd dir) : dir_(std::move(dir)) {}
    static std::string entry_name(uid_t uid, const std::string& digest);
    UniqueFd dir_;
};

}  // namespace gantry
