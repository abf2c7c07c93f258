// The file system under the image store, and whether its flock() is coherent across nodes. The store's
// one-producer protocol (docs/store.md) takes an exclusive flock on locks/<digest> before a pull; on a
// shared file system that is only a cluster-wide lock when the client forwards flock to the server:
// Lustre needs the `flock` mount option (`localflock` locks per node only, `noflock` makes flock fail
// with ENOSYS), NFS must not be mounted with `local_lock=flock` or `local_lock=all`.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gantry {

// statfs(2) f_type of a Lustre client mount (LL_SUPER_MAGIC).
inline constexpr long kLustreSuperMagic = 0x0BD00BD0;

// One line of /proc/self/mountinfo (proc(5)), octal escapes (\040) decoded.
struct MountEntry {
    std::string mount_point;
    std::string fstype;
    std::string source;
    std::string mount_options;  // per-mount: rw,nosuid,...
    std::string super_options;  // per-superblock: where Lustre shows flock/localflock
};

std::vector<MountEntry> parse_mountinfo(std::string_view text);

// The mount `path` (absolute, symlinks resolved) lies on: the longest mount point that is `path` or a
// directory above it; of equal ones the last listed (it is mounted over the others).
std::optional<MountEntry> mount_containing(const std::vector<MountEntry>& mounts, std::string_view path);

// What flock() on a file system gives the processes of different nodes. errno plays no part.
enum class FlockScope {
    cluster,   // coherent across nodes (Lustre `flock`, NFS without local_lock of flock)
    node,      // each node sees only its own locks (Lustre `localflock`, NFS local_lock=flock|all)
    disabled,  // flock fails (Lustre `noflock`, or none of the three given: Lustre's default)
    unchecked  // any other file system (local ones: one node, nothing to coordinate)
};
const char* to_string(FlockScope scope);

// The decision for one mount: `fstype` as in mountinfo ("lustre", "nfs4", "ext4"), `options` the
// comma-separated mount and superblock options together. `is_lustre` also counts a statfs magic of
// kLustreSuperMagic when mountinfo names the type differently.
FlockScope flock_scope(std::string_view fstype, std::string_view options, bool is_lustre = false);

}  // namespace gantry
