// File-system helpers shared by the store, the CLI and the launcher.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

struct open_how;

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry {

// openat2(2), retried while the kernel answers EAGAIN: a RESOLVE_IN_ROOT/RESOLVE_BENEATH lookup that
// races with any rename or mount anywhere on the system fails with EAGAIN and is meant to be retried
// (containers being set up at the same time on a node make that common). Returns the fd, or -1/errno.
int openat2_retrying(int dirfd, const std::string& path, const struct open_how& how);

// mkdir -p with `mode` for the directories it creates.
Status make_directories(const std::string& path, mode_t mode = 0755);

Result<std::string> read_file(const std::string& path);
// The file's content, or nothing when it cannot be read (for optional files: configs, sysfs entries).
std::optional<std::string> try_read_file(const std::string& path);

// Writes `content` to a temporary file beside `path`, fsyncs it and renames it over `path`, so readers
// see the old or the new content, never a mix.
Status write_file_atomic(const std::string& path, const std::string& content, mode_t mode = 0644);

// rm -rf; a missing path is fine. The last component and everything below it are removed with
// remove_tree_at (never following a symlink, never leaving the file system of its parent).
Status remove_tree(const std::string& path);

// Total size in bytes of regular files under `path` (not following symlinks).
uint64_t tree_size(const std::string& path);

// An open directory and the path it was opened at (for messages only). Operations inside it are
// relative to the descriptor, so a component replaced on the path after opening changes nothing they
// touch: what shared storage needs, where other users can write (docs/store.md, "Trust model").
class Directory {
public:
    // Opens `path` as given (the caller chose it; symlinks in it are followed).
    static Result<Directory> open(const std::string& path);
    // Opens the subdirectory `name`, refusing a symlink (O_NOFOLLOW) or anything not a directory.
    [[nodiscard]] Result<Directory> open_sub(const std::string& name) const;

    [[nodiscard]] int fd() const { return fd_.get(); }
    [[nodiscard]] const std::string& path() const { return path_; }
    [[nodiscard]] std::string path_of(const std::string& name) const { return path_ + "/" + name; }

private:
    Directory(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
    UniqueFd fd_;
    std::string path_;
};

// The names in `dir` except . and ..
Result<std::vector<std::string>> list_directory(const Directory& dir);

// A regular file opened inside a directory: O_NOFOLLOW (a symlink is refused, ELOOP), O_NONBLOCK (a
// FIFO or device cannot hang the open), then fstat: anything but a regular file is refused.
struct RegularFile {
    UniqueFd fd;
    struct stat st {};
};
// `flags`: O_RDONLY, O_WRONLY or O_RDWR, optionally O_CREAT (with `mode`) or O_EXCL.
Result<RegularFile> open_regular_at(const Directory& dir, const std::string& name, int flags, mode_t mode = 0644);

// Writes all of `data` to `fd` (a file or pipe), retrying short writes and EINTR; an error names `what`
// ("writing PATH").
Status write_all(int fd, std::string_view data, const std::string& what);
// Reads at most `max_bytes` from `fd` (from offset 0); a longer file is an error naming `what`.
Result<std::string> read_capped(int fd, size_t max_bytes, const std::string& what);
// The most a configuration or credential file may hold: gantry.conf and its enroot_conf, Docker
// config.json / auth.json, Enroot .credentials, AWS config / credentials / token files, CDI specs. Real
// ones hold a few KiB; the cap means /dev/zero or a runaway file in one's place cannot grow memory
// without end (docs/admin.md, "Limits").
inline constexpr size_t kMaxConfigFileBytes = size_t{4} << 20;
// Reads a configuration or credential file named by a path (symlinks followed: admins and users link
// these files). The open is O_NONBLOCK, so a FIFO in the file's place cannot hang it (nor a pull, nor
// slurmstepd); only a regular file of at most `max_bytes` is read, and /dev/null reads as empty
// (GANTRY_CONFIG=/dev/null means "no file"). Errors name `what` ("reading WHAT: ..."); a failed open
// keeps its errno, so ENOENT tells a missing file.
Result<std::string> read_config_file(const std::string& path, const std::string& what,
                                     size_t max_bytes = kMaxConfigFileBytes);
// open_regular_at + read_capped; `st` receives the file's status when given.
Result<std::string> read_regular_at(const Directory& dir, const std::string& name, size_t max_bytes,
                                    struct stat* st = nullptr);

// write_file_atomic inside `dir`: the temporary file is created there with O_EXCL|O_NOFOLLOW and
// renamed over `name` with renameat.
Status write_file_atomic_at(const Directory& dir, const std::string& name, const std::string& content,
                            mode_t mode = 0644);

// rm -rf of `name` inside `dir` that never follows a symlink (a symlink is removed, not its target) and
// never crosses into another file system (a mount point below is an error and is left in place). A
// missing `name` is fine.
Status remove_tree_at(const Directory& dir, const std::string& name);
// Total size of the regular files under `name` inside `dir`, on the same terms as remove_tree_at.
uint64_t tree_size_at(const Directory& dir, const std::string& name);

// "host:pid" for lock owner records and messages.
std::string host_and_pid();

}  // namespace gantry
