// Private to the launcher module: the state carried through container set-up and the steps each
// file implements (namespaces.cpp, image.cpp, privileged.cpp, rootfs.cpp, container.cpp).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/acquire.hpp"
#include "gantry/fd.hpp"
#include "gantry/launcher.hpp"
#include "gantry/result.hpp"

namespace gantry::launcher {

// The image's files as the spec names them (the whole image's or the top layer's, then every layer):
// "/proc/self/fd/N" for an acquired store image, which every program that opens them must be given
// under the same numbers (pass_image_descriptors).
inline std::vector<std::string> image_files(const ContainerSpec& spec) {
    std::vector<std::string> out{spec.image_path};
    out.insert(out.end(), spec.image_layers.begin(), spec.image_layers.end());
    return out;
}

// The trace descriptor (include/gantry/trace.hpp) a tracing creator hands the holder, and the variable
// that says so: below kFirstImageDescriptor, clear of the channel (3).
constexpr int kTraceFd = 5;
constexpr const char* kTraceFdVariable = "GANTRY_TRACE_FD";

// Host facts about the user the container runs as, looked up before any namespace change.
struct Identity {
    uid_t uid = 0;
    gid_t gid = 0;
    std::string name;
    std::string home;     // host home directory (bound at the same path with --mount-home)
    uid_t inner_uid = 0;  // uid/gid seen inside (0 with remap_root)
    gid_t inner_gid = 0;
    std::string group_name;
};

// What the creator (Container::create) sends to the gantry-holder program it starts (spec_json.cpp).
struct HolderRequest {
    ContainerSpec spec;
    Identity id;
    MountBackend backend = MountBackend::fuse;
    std::string staging, image_dir, workdir, home;
    pid_t parent = -1;                 // the creator: an attached holder ends when it does
    bool creator_writes_maps = false;  // root created it for a user: the creator writes the id maps
};
std::string holder_request_to_json(const HolderRequest& request);
Result<HolderRequest> holder_request_from_json(std::string_view text);

// Everything the holder builds up while it sets the container up.
struct Setup {
    const ContainerSpec* spec = nullptr;
    Identity id;
    MountBackend backend = MountBackend::fuse;
    std::string staging;  // host directory the staging tmpfs is mounted on
    bool staging_mounted = false;
    std::string image_dir;  // staging/image: the image as a directory
    std::string rootfs;     // staging/rw/root: the overlay that becomes "/"
    UniqueFd root;          // O_PATH fd of rootfs once mounted
    UniqueFd image;         // O_PATH fd of image_dir (the lower layer)
    UniqueFd upper;         // O_PATH fd of the overlay's upper layer
    std::string home;       // HOME inside
    std::string workdir;    // working directory inside
    pid_t fuse_daemon = -1;
    std::vector<pid_t> layer_daemons;    // fuse, layered image: one server per layer (mount_image_fuse)
    std::vector<UniqueFd> layer_leases;  // kernel, layered image: the image_lease of each layer's mount
    UniqueFd image_lease;    // kernel: shared lock on the node-wide mount's `users` file (shared_mounts.cpp);
                             // fuse: the connection to the user's image server (image_server.cpp)
    UniqueFd server_userns;  // fuse, shared: the image server's user namespace, which the container joins
    UniqueFd image_tree;     // fuse, shared: a detached clone of the server's mount, attached at image_dir
    pid_t server_pid = -1;   // fuse, shared: the server (its socket's peer) and its start time,
    unsigned long long server_start_time = 0;  // reported to the creator with "ok"
    UniqueFd scratch_dir;                      // extract backend: directory holding the unpacked tree
    std::string scratch_name;                  // its entry in scratch_dir, removed when the holder exits
    UniqueFd rw_scratch_dir;                   // --writable: scratch_path, holding the overlay's upper layer
    std::string rw_scratch_name;               // its entry there (gantry-rw-*), removed when the holder exits
    std::vector<UniqueFd> merged_dirs;         // read-only skeleton root: its overlays (e.g. /etc), made read-only last
    int channel = -1;                          // the socket to the creator (holder.cpp)
    bool creator_writes_maps = false;          // see HolderRequest
};

// rootfs.cpp: how one top-level entry of a read-only container's "/" is provided (mount_container_root).
enum class RootEntryKind {
    ours,           // only in the upper layer (a mount point or file we made): kept as it is
    image_dir,      // an image directory: bound from the image itself (shared dentries, host-speed reads)
    image_symlink,  // an image symlink: copied
    image_other,    // an image file (or special file): an empty file with the image's bound over it
    mount_point,    // an image directory that a standard mount covers whole (/proc, /dev, ...): left empty
    merged,         // a directory in the image and in the upper layer: an overlay of the two (e.g. /etc)
};
struct RootEntry {
    std::string name;
    RootEntryKind kind;
};
// The top-level entries of the root, from the image and the prepared upper layer (both directory fds,
// never following a symlink), sorted by name. `covered` names the entries a standard mount hides.
Result<std::vector<RootEntry>> plan_root_entries(int image, int upper, const std::vector<std::string>& covered);

// namespaces.cpp
Status switch_to_user(uid_t uid, gid_t gid);
// Unshares the namespaces and maps the user's single id. With `creator` (a socket to a root creator,
// else -1) the holder stays non-dumpable: it says "userns" and the creator writes the maps
// (write_id_maps), then answers "go".
Status enter_user_namespace(const Identity& id, const ExtraNamespaces& extra, int creator);
Status make_mounts_private();
int namespace_flags(const ExtraNamespaces& extra);
// Empties the bounding set but for KEEP (a capability number), which is also made ambient so that
// the next exec keeps it (-1: none).
Status drop_capabilities(int keep = -1);
Status bring_up_loopback();

// image.cpp
Status check_squashfs(const std::string& path);
// The checks of a spec's user-named paths (the image file, bind sources), with the caller's own rights:
// what `gantry-holder --check-paths` runs as the job user for a root creator (container.cpp).
Status check_paths_here(const ContainerSpec& spec);
MountBackend resolve_backend(const Config& config, MountBackend b, bool privileged_ok);
Result<MountBackend> choose_backend(const ContainerSpec& spec, bool privileged_ok);
// /dev/fuse is usable and the server gantry.conf's fuse_server names is installed.
Status fuse_accessible(const Config& config);
// The FUSE server's program: gantry-imagefs (found beside this program, as gantry-holder is) or
// squashfuse_ll from PATH.
Result<std::string> fuse_server_program(const Config& config);
// serve_image_with_fuse in two halves, so that several servers (a layered image's) start side by
// side: the FUSE mount made and the daemon started; then the first stat, which waits for it.
Result<pid_t> start_fuse_server(const std::string& image, const std::string& target, uid_t uid, gid_t gid,
                                const Config& config);
Status await_fuse_server(const std::string& image, const std::string& target, pid_t pid, const Config& config);
// One started server per layer (layers[i] on dirs[i]), all started before any is waited for; each
// started daemon's pid is appended to `daemons` as soon as it runs, so the caller ends them on error.
Status serve_layers_with_fuse(const std::vector<std::string>& layers, const std::vector<std::string>& dirs, uid_t uid,
                              gid_t gid, const Config& config, std::vector<pid_t>& daemons);
// Mounts `image` with FUSE on `target` (ids `uid`/`gid` as the mounting namespace sees them) and
// starts the fuse_server on it; returns the daemon's pid once it serves. Needs CAP_SYS_ADMIN in the
// user namespace owning the current mount namespace.
Result<pid_t> serve_image_with_fuse(const std::string& image, const std::string& target, uid_t uid, gid_t gid,
                                    const Config& config);
Status mount_image_fuse(Setup& s);  // a private daemon for this container (the holder's child)
// A layered image (ContainerSpec::image_layers): one empty attach point per layer below the staging
// tmpfs (staging/layers/N, bottom first), and the read-only overlayfs of what was attached there,
// mounted at image_dir (`userxattr`: the form the store's layers mark opaque directories in).
Result<std::vector<std::string>> make_layer_dirs(Setup& s);
Status mount_layer_stack(Setup& s, const std::vector<std::string>& dirs);
// The read-only overlayfs of `names` (directories below `base`, bottom first, over `base`/empty) at
// `target`; the lower layers are named relative to `base` to keep the options short. `what` names
// the image in errors.
Status stack_layers(const std::string& base, const std::vector<std::string>& names, const std::string& target,
                    const std::string& what);

Status extract_image(Setup& s);

// image_server.cpp: one FUSE server per (user, image, inner ids, cgroup), shared by that user's containers.
// Finds (or starts) the server as the user, before any namespace change; fills image_lease,
// server_userns and image_tree. An error means "serve this container privately" (the caller says so).
Status attach_image_server(Setup& s);
// Joins the server's user namespace, then unshares the container's mount (and extra) namespaces.
Status enter_server_user_namespace(Setup& s);
// Attaches the server's mount (image_tree) at image_dir, in the container's mount namespace.
Status attach_served_image(Setup& s);
Status bind_extracted_image(Setup& s);
void remove_tree(int dirfd, const std::string& name);

// container.cpp: makes DIR (with `mode`) unless it exists, then checks that it is a directory (not a
// symlink) owned by us and, with `closed`, that nobody else may write it; `what` names it in errors.
Status ensure_own_dir(const std::string& dir, mode_t mode, bool closed, const std::string& what);

// privileged.cpp
bool running_as_real_root();
// Root-owned (or owned by gantry.conf's store_owner account) and not writable by others, file and
// every ancestor: the gate for kernel loop mounts (privileged.cpp says why).
bool is_trusted_path(const std::string& path, const std::string& store_owner);
Status mount_image_kernel(Setup& s);
// Root, for a holder it started for `id`: writes /proc/PID/setgroups, uid_map and gid_map.
// `pidfd` is a pidfd of `pid`: the maps go to that process or to none (a pid reused meanwhile is refused).
Status write_id_maps(int pidfd, pid_t pid, const Identity& id);
// holder.cpp: the launch sequence (run by the holder)
Status set_up_container(Setup& s);

// shared_mounts.cpp: the node-wide kernel mount of one image, as handed to one container.
struct SharedImageMount {
    UniqueFd lease;           // keep open for the container's life: it is the reference
    UniqueFd tree;            // detached clone of the mount, to attach in the container's namespace
    std::string mount_point;  // <runtime_path>/images/<key>/root on the host
};
// The image file's identity as a directory name: 32 hex digits of sha256(real path, device, inode,
// size, mtime), so a file rebuilt in place gets a new name (node-wide mounts, image servers).
Result<std::string> image_key(const std::string& image);
// Mounts `image` once per node (or reuses that mount) and takes a reference on it. Root only; the
// caller has checked the image is trusted. Runs in the host mount namespace.
Result<SharedImageMount> acquire_shared_mount(const std::string& image, const Config& config);
// A layered image's stack (`layers` bottom first): a read-only overlayfs of the layers' shared mounts,
// made once per node and shared the same way (shared_mounts.cpp). The caller has checked every layer
// is trusted. An error with errnum E2BIG: too many layers for one mount's options; stack them per
// container instead.
Result<SharedImageMount> acquire_shared_stack(const std::vector<std::string>& layers, const Config& config);
Result<std::string> stack_key(const std::vector<std::string>& layers);

// rootfs.cpp: the steps that assemble "/" (see Container::create for their order)
Status mount_staging_area(Setup& s);
Status prepare_writable_layer(Setup& s);
Status write_identity_files(Setup& s);
Status mount_overlay_root(Setup& s);
Status mount_skeleton_root(Setup& s);
Status mount_container_root(Setup& s);  // the overlay when --writable or extract, the skeleton otherwise
Status mount_proc_and_sys(Setup& s);
Status set_up_dev(Setup& s);
Status mount_tmp_and_run(Setup& s);
Status bind_host_network_files(Setup& s);
Status mount_home(Setup& s);
Status perform_user_mounts(Setup& s);
Status check_workdir(Setup& s);
// devices.cpp: applying ContainerSpec::devices (see include/gantry/devices.hpp)
Status write_device_files_in_upper(Setup& s);
Status mount_sysfs_views(Setup& s);
Status add_device_nodes(Setup& s);
Status mount_driver_files(Setup& s);
Status update_ld_cache(Setup& s);
Status pivot_into_root(Setup& s);
Status finish_root_flags(Setup& s);

// Mount helpers (rootfs.cpp), all fd-relative to the container root.
Status bind_into(Setup& s, const std::string& source, const std::string& dst, bool recursive, uint64_t attr_set,
                 Propagation propagation = Propagation::private_, bool propagation_recursive = true);
Status tmpfs_into(Setup& s, const std::string& dst, const std::string& options, uint64_t attr_set);

// pidfd system calls (glibc 2.36's <sys/pidfd.h> lacks C linkage for C++, so call them directly).
int open_pidfd(pid_t pid);
int signal_pidfd(int pidfd, int sig);

// seccomp.cpp: the filter every container process runs under (the file says why it is safe).
// The system calls it answers with success without running them, by name.
std::vector<std::string> fake_success_syscalls();
// The filter in libseccomp's readable form (PFC), for tests and debugging.
Result<std::string> describe_syscall_filter();
// Loads the filter into the calling thread, for good (single-threaded callers: join).
Status install_syscall_filter();

// cgroups.cpp: where a holder or image server goes, decided from the kernel's account of a Slurm task
// (its /proc/PID/cgroup lines) and the cgroup mounts (/proc/self/mountinfo). Pure functions, so that
// the recorded lines of every Slurm release can be tested without that release (tests/unit).
struct CgroupHierarchy {
    std::string root, point, fstype;   // mountinfo's root and mount point; "cgroup" or "cgroup2"
    std::vector<std::string> options;  // super options: the v1 controllers, name=...
};
std::vector<CgroupHierarchy> parse_cgroup_mounts(std::string_view mountinfo);
struct CgroupTarget {
    std::string dir;         // the cgroup's directory (mount point + path)
    std::string path;        // the cgroup's path as /proc/PID/cgroup names it
    bool make_leaf = false;  // a leaf of Gantry's own: created (root) if missing
    bool unified = false;    // on the cgroup2 hierarchy
};
// For each hierarchy of the task whose /proc/PID/cgroup text is `task_cgroups`:
//  - step: the task's own cgroup, exactly (a leaf the kernel placed a live task in; Slurm kills it
//    with the step: cgroup/v1 the step's cgroup, cgroup/v2 `cgroup.kill` on step_N/user);
//  - job: v2: the leaf "gantry" in the job's directory, which Slurm's layout puts three levels above
//    the task (JOB/STEP/user/TASK, whatever JOB is named: job_ID or a SLUID); v1: the job's cgroup
//    (the component named job_ID, the only naming v1 has), where a v1 job cgroup takes processes;
//  - node: v2: the leaf "gantry" beside the job directories (slurmstepd.scope/gantry), outside every
//    job; v1: none (left where it started, outside the step).
// A hierarchy where the task is not in Slurm's layout gives no target for job and node.
std::vector<CgroupTarget> cgroup_targets(std::string_view task_cgroups, const std::vector<CgroupHierarchy>& mounts,
                                         CgroupLevel level);

// Process helpers (process.cpp)
unsigned long long process_start_time(pid_t pid);

// Pid namespaces. A pid is a number in one pid namespace; Slurm's namespace/linux (25.11+,
// clone_ns_flags CLONE_NEWPID) runs a job's slurmstepd, and so the plugin, the holders and the image
// servers, in a pid namespace of the job's own, while the job epilog runs in slurmd's. So every pid
// Gantry records for another process to read goes with the namespace it is a number of, and the
// reader translates it into its own view (pid_in_own_view) before it looks at /proc or signals.
// A namespace is named by the inode of /proc/PID/ns/pid (unique on the host while it lives).
// The initial pid namespace's inode (the kernel's PROC_PID_INIT_INO, fixed since Linux 3.8): every
// process is visible from it.
constexpr unsigned long long kInitPidNamespace = 0xEFFFFFFCULL;
// The caller's own pid namespace (0: unknown, /proc is not ours).
unsigned long long own_pid_namespace();
// Whether a process of pid namespace `pidns` that is not found from here is really gone: the
// namespace is ours (or unknown: 0, a record from before), or we are in the initial namespace, which
// sees every process of every namespace.
bool sees_every_process_of(unsigned long long pidns);
// The NSpid line of a /proc/PID/status text: the process's pid in the procfs's pid namespace first,
// its pid in its own namespace last; empty when there is none or it is malformed.
std::vector<pid_t> parse_nspid(std::string_view status);
// `pid`, a number of pid namespace `pidns`, as this process sees it (its /proc and pidfd_open): `pid`
// itself when `pidns` is 0 or our own; else the process whose own pid namespace is `pidns` and whose
// innermost NSpid is `pid` (a scan of /proc); -1 when there is none (gone, or not visible from here).
pid_t pid_in_own_view(pid_t pid, unsigned long long pidns);

// Replaces `name` under `dirfd` with a new file holding `content` (never following a symlink there).
// `what` names the file in errors.
Status write_file_at(int dirfd, const std::string& name, const std::string& content, const std::string& what);

}  // namespace gantry::launcher
