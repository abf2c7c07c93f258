// User-requested container mounts: the Pyxis `--container-mounts` / `gantry run --mount` syntax.
//
//   LIST  := ENTRY[,ENTRY...]
//   ENTRY := SRC[:DST[:FLAGS]]      FLAGS := FLAG[+FLAG...]
//
// SRC is a host path, or `tmpfs` (a fresh tmpfs at DST), or `umount` (DST is unmounted: removes a
// default mount such as /dev/shm). DST defaults to SRC; it is absolute or starts with `.`, and both
// forms name a path inside the container root ("./data" == "/data"). `..` components are rejected.
// FLAGS: ro rw bind rbind nosuid suid nodev dev noexec exec private rprivate slave rslave shared
// rshared unbindable runbindable; tmpfs also takes KEY=VALUE options (size=1G+mode=1777).
// Defaults: rbind, read-write, rprivate. Exact duplicates are dropped (Slurm may hand an option twice).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry {

enum class MountKind { bind, tmpfs, umount };

enum class Propagation { private_, slave, shared, unbindable };

struct MountSpec {
    MountKind kind = MountKind::bind;
    std::string source;       // host path for bind mounts, "tmpfs"/"umount" otherwise
    std::string destination;  // normalized absolute path inside the container: "/fsx"
    bool read_only = false;
    bool recursive = true;  // rbind (default) or bind
    bool nosuid = false;
    bool nodev = false;
    bool noexec = false;
    Propagation propagation = Propagation::private_;
    bool propagation_recursive = true;
    std::string data;  // tmpfs options, comma-joined: "size=1G,mode=1777"
    std::string text;  // the entry as written, for messages
    // A mounts.d entry with `nofail`: left out when the job user does not reach its source (decided as
    // the user, by the path check and the holder; root never looks: the source may hold ${USER}).
    bool nofail = false;
    std::string origin;  // a mounts.d entry's "FILE:LINE", for messages

    bool operator==(const MountSpec&) const = default;
};

// Applies one FLAG (as listed above; tmpfs also KEY=VALUE) to `m`; false when the flag is unknown
// for this kind of mount. Shared with the mounts.d parser (include/gantry/dropins.hpp).
bool apply_mount_flag(MountSpec& m, const std::string& flag);

// Parses one ENTRY. Does not touch the filesystem.
Result<MountSpec> parse_mount(std::string_view entry);

// Parses a comma-separated LIST and appends to `out`, dropping exact duplicates of entries already there.
Status parse_mounts(std::string_view list, std::vector<MountSpec>& out);

// Normalizes a user-named container path: absolute or starting with '.', no `..` component, repeated
// and trailing slashes removed. "./a//b/" -> "/a/b". `what` names the path in errors
// ("mount destination", "working directory").
Result<std::string> normalize_container_path(std::string_view path, const std::string& what);

// Checks that every bind source exists: "mounting SRC at DST: source path does not exist".
Status check_mount_sources(const std::vector<MountSpec>& mounts);

// Paths inside a container root, resolved fd-relative: symlinks are followed as if `root` were "/",
// so an image's `/data -> /etc` lands on the image's /etc, never the host's (openat2 RESOLVE_IN_ROOT).
// `path` is a normalized container path ("/a/b"). Returns an O_PATH descriptor.
Result<UniqueFd> open_in_root(int root, const std::string& path);

enum class NodeType { directory, file };
// Like open_in_root, creating missing directories on the way and the last component as `type`.
Result<UniqueFd> ensure_in_root(int root, const std::string& path, NodeType type);

// "/proc/self/fd/N": how a descriptor is handed to calls that take a path (mount, overlay options).
std::string fd_path(int fd);

}  // namespace gantry
