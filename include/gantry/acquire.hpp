// Acquiring a stored image for a container or a composition: its squashfs files (a whole image's one,
// or a layered image's layers) opened once, checked on the open descriptors, and handed on as those
// descriptors, never as paths (docs/store.md, "Trust model"). A path into a store another user can
// rename entries in is void the moment it has been checked; an open descriptor keeps naming the file
// that was checked.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/result.hpp"
#include "gantry/spawn.hpp"
#include "gantry/store.hpp"

namespace gantry {

// Acquired descriptors get numbers from here up, clear of the fixed numbers helper programs are
// given (0-5), so that every process down the line can receive each one under its own number.
// Below 64 on purpose: a process's descriptor table starts with 64 slots, and growing it in a
// process with threads (slurmstepd) waits for an RCU grace period (the kernel's expand_fdtable):
// 10-20 ms of every step's start when a whole image's descriptor was numbered 64.
constexpr int kFirstImageDescriptor = 16;

struct AcquiredImage {
    std::string digest;
    ImageMetadata metadata;
    bool layered = false;
    // The squashfs files, bottom first (a whole image: one), each a regular file of an account the
    // store trusts, writable by nobody else, starting with the squashfs magic: checked on this very
    // descriptor (acquire_image). Close-on-exec: children get them only through pass_image_descriptors.
    std::vector<UniqueFd> files;
    // The store's in-use lease (ImageStore::open_in_use), so gc leaves the image alone while it is used;
    // empty when this account could not take one (gc then may remove the names, never our open files).
    UniqueFd in_use;
    // acquire_image_as only: whether the helper also reported the image's config (metadata.config_json,
    // the user's word, as a pull's report is); a helper from before it did says nothing.
    bool reported = false;

    // "/proc/self/fd/N" of each file, bottom first, for the code that takes a path: it names this
    // descriptor in this process and in every child given it under the same number.
    [[nodiscard]] std::vector<std::string> paths() const;
};

// The one decision whether a stored image's files may be used (by the user's FUSE server, by the
// kernel's loop device with the trusted-store check on top, by a composition): loads `digest`'s
// record from `store` (ImageStore::find's checks), then opens each of its squashfs files relative to
// the store's images/ descriptor without following any symlink (openat2 RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS, O_NOFOLLOW), non-blocking (a FIFO planted under the name cannot hang us), and
// checks owner, mode, type and magic with fstat/pread on the descriptor itself.
Result<AcquiredImage> acquire_image(const ImageStore& store, const std::string& digest);

// acquire_image run by `holder` (gantry-holder --acquire) as `who`, in `store_root`, with only that
// account's rights: for root acting for a user whose store root must not open (the plugin's per-user
// or open store). The files come back over a socket (SCM_RIGHTS); root opens nothing by name and
// reads nothing from them: the helper checked type and magic on these very descriptors, as the user,
// before sending them (the user could make a helper of theirs send anything: only the user's own
// containers, served as the user, ever read them). No lease: the user's store is the user's to collect.
// The answer is waited for at most `limit` (gantry.conf's check_timeout_seconds) and not past
// `should_stop` (the step's stop request); then the helper is killed and reaped by pidfd.
// The helper also marks the image used, records `resolved_tag` (srun's resolution of the user's tag,
// when given) as a pull of the digest would, and reports the image's config from the store's record:
// metadata.config_json with `reported` set, so that a pinned digest the store holds needs no pull.
Result<AcquiredImage> acquire_image_as(const ProcessIdentity& who, const std::string& holder,
                                       const std::string& store_root, const std::string& digest,
                                       std::chrono::milliseconds limit, const std::function<bool()>& should_stop,
                                       const std::string& resolved_tag = "");
// The answer of a helper or holder that ran acquire_image for us (send_acquired_image) on `channel`:
// the descriptors (renumbered from kFirstImageDescriptor up, close-on-exec) and the reported config.
// Waits at most until `deadline` and not past `should_stop`; `what` and `sender` word the errors.
Result<AcquiredImage> receive_acquired_image(int channel, const std::string& digest,
                                             std::chrono::steady_clock::time_point deadline,
                                             const std::function<bool()>& should_stop, const std::string& what,
                                             const std::string& sender);
// gantry-holder --acquire STORE DIGEST [TAG]: the helper's side, answering on descriptor `channel`
// (also the container holder's first answer when it acquires the image itself: it then keeps what it
// sent in `keep`).
int send_acquired_image(int channel, const std::string& store_root, const std::string& digest,
                        const std::string& resolved_tag = "", AcquiredImage* keep = nullptr);

// "/proc/self/fd/N".
std::string descriptor_path(int fd);
// N for "/proc/self/fd/N", else -1.
int descriptor_of_path(const std::string& path);
// Adds every descriptor that `paths` name ("/proc/self/fd/N") to `rq.inputs` under its own number,
// so that the program opens the same files through the same names.
void pass_image_descriptors(ProcessRequest& rq, const std::vector<std::string>& paths);

}  // namespace gantry
