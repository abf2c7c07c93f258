// The container launcher: starts a container from a squashfs image and runs processes in it.
//
// A container is one user + mount namespace (plus net/ipc/uts on request) held open by a small
// *holder* process. `Container::create` builds the root filesystem and starts the holder; every
// process that should run in the container then *joins* it (setns into the holder's namespaces) —
// `gantry run` joins its own container once, `gantry exec` joins a named one, and the SPANK plugin
// has the first local task create the container and every local task join it, so all ranks of a
// node share one namespace set (needed for CMA/shared-memory transports, BRIEF §5).
//
// Nothing here throws; failures come back as gantry::Error with a one-line message.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gantry/acquire.hpp"
#include "gantry/config.hpp"
#include "gantry/devices.hpp"
#include "gantry/fd.hpp"
#include "gantry/image_config.hpp"
#include "gantry/mounts.hpp"
#include "gantry/result.hpp"
#include "gantry/spawn.hpp"

namespace gantry {

// How the squashfs image becomes a directory. `auto`: kernel when privileged and trusted, else fuse
// when /dev/fuse is usable, else extract.
enum class MountBackend { auto_, kernel, fuse, extract };
Result<MountBackend> parse_mount_backend(std::string_view name);
const char* to_string(MountBackend backend);

// Optional extra namespaces (`--unshare net,ipc,uts`).
struct ExtraNamespaces {
    bool net = false;
    bool ipc = false;
    bool uts = false;
};
// "net,ipc" -> {net, ipc}; anything else: "unknown namespace 'pid' (valid: net, ipc, uts)".
Result<ExtraNamespaces> parse_unshare(std::string_view list);

// What a process sees when it runs in the container; shared by the creator and every joiner.
struct ProcessDefaults {
    std::vector<std::string> image_env;   // the image config's Env
    std::vector<std::string> device_env;  // ContainerEdits::env (GPU/CDI/EFA wiring), over the image's
    std::vector<std::string> env_names;   // --env NAME: the host value wins for these
    std::string workdir;                  // absolute path inside the container; "" -> "/"
    std::string home;                     // HOME inside the container
    bool remap_root = false;              // uid/gid 0 inside
    std::vector<std::string> env_values;  // --env NAME=VALUE ("NAME=VALUE" entries): set over everything
    std::string image_workdir;            // the image's WorkingDir ("/" without one): where a later
                                          // step that joins without its own workdir starts, as in Pyxis
};

// A container holder that root started for a job user before the container's spec was known, and
// that acquired the image itself, as that user, before anything else (start_holder_acquiring). It waits
// on `channel` for its set-up; Container::create sends it there instead of starting another holder.
// Dropped unused, it is killed and reaped (within 5 s).
struct StartedHolder {
    pid_t pid = -1;  // our unreaped child, pinned by `pidfd`
    UniqueFd pidfd;
    UniqueFd channel;  // the holder's descriptor 3 is the other end; SO_PASSCRED is set on this one
    StartedHolder() = default;
    StartedHolder(const StartedHolder&) = delete;
    StartedHolder& operator=(const StartedHolder&) = delete;
    ~StartedHolder();
};

// Everything `Container::create` needs.
struct ContainerSpec {
    std::string image_path;  // the squashfs file (a layered image: its top layer's)
    // A store image kept as layers (gantry pull --layered; docs/store.md, "Layers"): every layer's
    // squashfs, bottom first, stacked read-only by overlayfs. Kernel backend only (trusted store, root).
    std::vector<std::string> image_layers;
    bool image_trusted = false;  // the file lies in the trusted store: may be kernel-mounted when root.
                                 // NEVER set for a file a user supplied (see privileged.cpp).
    // A store image's files as acquire_image / acquire_image_as opened them and checked them (a
    // regular squashfs file, type and magic, on the descriptor): image_path and image_layers name
    // those descriptors ("/proc/self/fd/N"). Set by container_spec_for for a store image only, never
    // for a file the user named; Container::create then does not check the image again as the user.
    bool image_acquired = false;
    ImageConfig image_config;
    MountBackend backend = MountBackend::auto_;
    std::vector<MountSpec> mounts;
    bool writable = false;  // writes to / land in a tmpfs upper layer and vanish with the container
    bool remap_root = false;
    bool mount_home = true;
    ExtraNamespaces unshare;
    std::string workdir;  // --workdir; "" -> image WorkingDir, else "/"
    std::vector<std::string> env_names;
    std::vector<std::string> env_values;  // --env NAME=VALUE (`gantry run`; the plugin sets none)
    // The identity inside (mapped 1:1, or to 0 with remap_root). -1: the caller's real ids. A root
    // caller (the plugin's privileged hook) may name the job user: the holder switches to it right
    // after the privileged image mount.
    uid_t uid = static_cast<uid_t>(-1);
    gid_t gid = static_cast<gid_t>(-1);
    std::string name;     // non-empty: record state under runtime_dir() so others can join by name
    bool detach = false;  // the holder outlives the caller; stop it with Container::stop
    Config config;        // runtime_path, scratch_path, host_dev
    // Devices and wiring (include/gantry/devices.hpp, usually from select_devices): device nodes in
    // /dev, read-only driver files, sysfs views, environment, and directories for the ld.so cache.
    ContainerEdits devices;
    // The gantry-holder program that holds the container (an absolute path); "" -> default_holder_program().
    std::string holder_program;
    // The fuse backend's shared image servers (image_server.cpp) for a holder root starts for a user:
    // non-empty (the plugin: "job 12 on node3"), such a holder uses the user's server of that scope
    // (the job's containers on the node share it; the plugin moves it into the job's cgroups and ends
    // it with the job). Empty, it keeps a daemon of its own. A user's own holders share by cgroup.
    std::string fuse_server_scope;
    // The step's stop request (scancel, its time limit; the plugin's StepSignals): every wait of the
    // creator on something the user influences ends when it says so. Not part of the JSON document.
    std::function<bool()> should_stop;
    // A holder already started, which acquired this spec's image itself (start_holder_acquiring): root
    // for a job user, attached containers only. Used once; without it (or once used) a holder is
    // started afresh and given the image's descriptors. Not part of the JSON document.
    std::shared_ptr<StartedHolder> started_holder;
};

// ContainerSpec as a JSON document and back: how the creator hands it to the gantry-holder program.
// The parser refuses documents over kMaxContainerSpecBytes and any missing or mistyped field.
inline constexpr size_t kMaxContainerSpecBytes = 4u << 20;
std::string container_spec_to_json(const ContainerSpec& spec);
Result<ContainerSpec> container_spec_from_json(std::string_view text);

// A Gantry program (gantry-holder, gantry-imagefs) of the tree this code came from: beside the running
// program or the loaded spank_gantry.so, in runtime/ of a build tree or libexec/gantry of an install;
// else `installed`.
std::string program_of_this_tree(const std::string& name, const char* installed);
// Where gantry-holder is: beside the running program (the CLI in the build tree or as installed in
// bindir finds it in libexec) or the installed path. The plugin names its own (ContainerSpec::holder_program).
std::string default_holder_program();
// gantry-imagefs, the fuse backend's server (runtime/imagefs): found as gantry-holder is, beside it.
std::string default_imagefs_program();

// gantry-holder --check-paths: reads a ContainerSpec document from `fd` and checks its user-named paths
// (the image file: a regular squashfs file, opened without blocking; bind sources) with the caller's
// rights; an error goes to stderr. Returns the exit status. Root's Container::create runs it as the user.
int check_container_paths(int fd);

// What a holder started by start_holder_acquiring acquires first, as `uid`:`gid`.
struct HolderAcquisition {
    std::string store_root;
    std::string digest;
    uid_t uid = 0;
    gid_t gid = 0;
    std::string resolved_tag;  // srun's resolution of the user's tag, recorded as a pull would
};

// The body of the gantry-holder program: reads the set-up from descriptor `channel` (a socket to its
// creator), builds the container, reports, then holds the namespaces until told to stop. Never returns.
// With `acquisition` (gantry-holder --acquire-and-hold), it first becomes the job user for good and
// acquires the image with that user's rights (send_acquired_image), then waits for the set-up.
[[noreturn]] void run_container_holder(int channel, const HolderAcquisition* acquisition = nullptr);

// Root for a job user (the plugin, a warm step of a store the user can write): starts the container
// holder at once, as `gantry-holder --acquire-and-hold`, which switches to the user (uid, primary gid:
// the identity it sets the container up with) and opens the stored image as acquire_image_as's helper
// does, with that user's rights, on checked descriptors; it sends them and the image's config, as the
// helper would, and keeps its own copies for the container. One exec instead of two (the helper's and
// the holder's). The answer is waited for at most `limit` and not past `should_stop`; on any failure
// the holder is killed and reaped, and the caller may still take the other way (a pull, the helper).
struct HolderWithImage {
    std::shared_ptr<StartedHolder> holder;
    AcquiredImage image;
};
Result<HolderWithImage> start_holder_acquiring(const std::string& holder_program, const HolderAcquisition& acquisition,
                                               std::chrono::milliseconds limit,
                                               const std::function<bool()>& should_stop);

// gantry-holder --serve-image IMAGE INNER_UID INNER_GID IDLE_SECONDS FUSE_SERVER POLL_US [LAYER...]:
// the fuse backend's shared image server (runtime/launcher/image_server.cpp), with its report socket
// as descriptor 3 and its directory as descriptor 4; with LAYERs (bottom first), the server of a
// layered image's stack. Returns the exit status.
int run_image_server(const std::string& image, const std::string& inner_uid, const std::string& inner_gid,
                     const std::string& idle_seconds, const std::string& fuse_server, const std::string& poll_us,
                     const std::vector<std::string>& layers = {});

// The holder of a running container, as recorded in its state file.
struct ContainerState {
    std::string name;
    pid_t holder_pid = -1;
    unsigned long long holder_start_time = 0;  // /proc/PID/stat starttime: guards against pid reuse
    uid_t uid = 0;                             // owner on the host
    ExtraNamespaces unshare;
    std::string backend;
    ProcessDefaults defaults;
    // The shared fuse image server the container's image comes from (-1: none), as its holder found
    // it (SO_PEERCRED) when the container was made; not kept in the state file.
    pid_t server_pid = -1;
    unsigned long long server_start_time = 0;
    // The pid namespace holder_pid and server_pid are numbers of (the inode of /proc/PID/ns/pid; 0:
    // the reader's own). The holder's own, which differs from the job epilog's under Slurm's
    // namespace/linux with CLONE_NEWPID: Container::open translates into the reader's view.
    unsigned long long pid_namespace = 0;
};

// A command to run inside: argv empty -> the image's Cmd (with entrypoint rules), else /bin/sh.
struct ProcessSpec {
    std::vector<std::string> argv;
    bool use_entrypoint = false;
    std::vector<std::string> entrypoint;  // the image's (used when use_entrypoint)
    std::vector<std::string> cmd;         // the image's
};

class Container {
public:
    // Builds the root filesystem and starts the holder. Returns once the container is ready.
    static Result<Container> create(const ContainerSpec& spec);
    // Finds a named container's holder through its state file; fails when it is gone.
    static Result<Container> open(const std::string& name, const Config& config);

    Container(Container&& other) noexcept;
    Container& operator=(Container&& other) noexcept;
    Container(const Container&) = delete;
    Container& operator=(const Container&) = delete;
    // An attached (non-detached) container is stopped when its handle goes away.
    ~Container();

    [[nodiscard]] const ContainerState& state() const { return state_; }
    [[nodiscard]] pid_t pid() const { return state_.holder_pid; }

    // Tells the holder to exit (SIGTERM), waits for it, removes the state file.
    Status stop();
    // Keeps the holder running after this handle is destroyed.
    void release() { owned_ = false; }

private:
    Container() = default;
    ContainerState state_;
    std::string state_file_;
    bool owned_ = false;         // this handle stops the holder on destruction
    bool is_child_ = false;      // the holder is our child: reap it with waitpid
    bool kernel_mount_ = false;  // root stopping a kernel-backend container: sweeps idle image mounts
    Config config_;
};

// What join() needs of a holder, opened from the host: its namespaces and its root directory. A
// holder that root started for a user is not dumpable, so the user cannot open these; whoever joins
// as that user has them opened while still root (the plugin: slurm_spank_task_init_privileged) and
// joins later, as the user: entering a user namespace one owns needs no more than these descriptors.
struct JoinHandles {
    UniqueFd userns, mntns, netns, ipcns, utsns;  // the extra ones only when the container has them
    UniqueFd root;                                // O_PATH: /proc/HOLDER/root
};
// Opens them, checking the holder's start time before and after (pid reuse).
Result<JoinHandles> open_join_handles(const ContainerState& state);

// How a process enters a running container:
//   attach:       into the holder's own mount namespace, beside every process already there (a step
//                 attached to a running named container, `gantry exec`);
//   new_instance: into a copy of it, made at the join (Pyxis's `--container-name=NAME:no_exec` on a
//                 running container: "start a new container instance from the same container's
//                 files"). The copy has the same mounts over the same file systems, so the instance
//                 and the running container see each other's files (the writable layer, /tmp); a
//                 mount made afterwards by either stays its own. The user, network, IPC and UTS
//                 namespaces are the container's; there is no pid namespace in either (as in every
//                 Gantry and Enroot container: /proc is the node's).
enum class JoinAs { attach, new_instance };

struct JoinOptions {
    JoinAs as = JoinAs::attach;
    // In a container made with remap_root, whose user namespace maps the user's id to 0 for as long as
    // it exists: the capabilities of its root are dropped, as in a container made without remap_root,
    // and the caller then execs gantry-entry with GANTRY_ENTRY_USERNS (runtime/entry/gantry_entry.c),
    // which makes a user namespace nested in the container's that maps the user's own ids back (files
    // the container's root owns are then the user's). Not here: a process that switched its ids from
    // root (a Slurm task) may not write its own /proc/self/uid_map; one fresh from exec may. Pyxis's
    // `--no-container-remap-root` on such a container, which sshd needs: as root it switches to its
    // `sshd` user, and refuses to go on when the system call filter fakes that switch.
    bool as_user = false;
};

// Enters the container in the CALLING process: setns into the holder's namespaces (a copy of its
// mount namespace for JoinAs::new_instance), chdir to the workdir, PR_SET_NO_NEW_PRIVS, capabilities
// dropped (kept with remap_root), then the system call filter that answers the chown and set*id
// families with success (runtime/launcher/seccomp.cpp). For the SPANK plugin's task_init: Slurm then
// execs the task's command. Must be called single-threaded.
Status join(const ContainerState& state, const JoinOptions& options = {});
// The same through descriptors opened before (open_join_handles), e.g. with more rights than now.
Status join(const ContainerState& state, const JoinHandles& handles, const JoinOptions& options = {});

// proctrack/cgroup, task/cgroup (cgroup v1 and v2): moves the holder and its children (the fuse daemon)
// into the cgroups that `level` names for process `model` (a task Slurm has placed; read from the
// kernel, /proc/MODEL/cgroup), one hierarchy at a time:
//   step: the task's own cgroup, exactly: a leaf, killed with the step on every release (cgroup/v2
//         since Slurm 25.05 kills only step_N/user, where the task's leaf is);
//   job:  v2: the leaf JOB/gantry (JOB: the task's cgroup three levels up, whatever its name: job_ID
//         or, from 26.05, a SLUID), outside every step, ended by the job epilog (end_job_cgroups);
//         v1: the job's cgroup (job_ID), which takes processes on v1;
//   node: v2: the leaf gantry beside the job directories (a container_scope=global holder: outside
//         every job, so no step end waits for it); v1: left where it is.
// Never a non-leaf cgroup on v2 (EBUSY with controllers; without, a process there escapes the kill).
// Hierarchies where the task is not in Slurm's layout are left alone. Root only. Returns the first
// failure but tries every hierarchy.
enum class CgroupLevel { step, job, node };
Status place_in_cgroups_of(pid_t model, const ContainerState& state, CgroupLevel level);

// The fuse image server a job's containers share on a node (ContainerSpec::fuse_server_scope; the
// plugin, root only). record_job_image_server notes the container's server (state.server_pid, its
// start time, the owner, the pid namespace the pid is a number of) in <runtime_dir>/servers/job_JOBID;
// place_image_server_in_job_cgroups moves it and its children (the FUSE daemon) into the job's cgroups
// of `model`, like place_in_cgroups_of; end_job_image_servers (the job epilog) SIGKILLs the recorded
// servers that are still those processes (each pid translated from its namespace into the epilog's),
// forgets them, and returns how many it killed.
Status record_job_image_server(const Config& config, uint32_t jobid, const ContainerState& state);
Status place_image_server_in_job_cgroups(pid_t model, const ContainerState& state);
int end_job_image_servers(const Config& config, uint32_t jobid);

// task_post_fork's cgroup work at once: place_in_cgroups_of for the holder at `level`,
// place_image_server_in_job_cgroups for its image server (if any), then, with a job id,
// record_job_cgroups. The task's cgroups are read by start() itself, while Slurm holds the task; the
// writes are made by a thread of their own: the first move into a cgroup in a while waits for an RCU
// grace period in the kernel (10-12 ms measured), which the task need not wait for. finish() waits for
// the thread (at most `limit`) and returns each one's result in that order (the server's only when
// there is one), a failure saying which it was. Root only; a process forked meanwhile (a task) never joins or frees it.
class CgroupPlacement {
public:
    CgroupPlacement() = default;
    CgroupPlacement(const CgroupPlacement&) = delete;
    CgroupPlacement& operator=(const CgroupPlacement&) = delete;
    ~CgroupPlacement();
    void start(pid_t model, const ContainerState& state, CgroupLevel level, const Config& config, uint32_t jobid);
    [[nodiscard]] bool started() const { return impl_ != nullptr; }
    std::vector<Status> finish(std::chrono::milliseconds limit = std::chrono::seconds(10));

private:
    struct Impl;
    Impl* impl_ = nullptr;
};

// cgroup v2: the job's own leaf (JOB/gantry, see place_in_cgroups_of) once something was placed there,
// noted in <runtime_dir>/servers/job_JOBID.cgroups (root's file) by record_job_cgroups; the job
// epilog's end_job_cgroups kills what is left in each (cgroup.kill, or SIGKILL by pidfd before Linux
// 5.14), waits up to `deadline_ms` for it to empty, removes the leaf and then the job's directory if
// Slurm left it empty (Slurm's own removal failed while the leaf was there). Returns how many leaves
// it removed; a leaf still populated at the deadline is kept in the record for the next epilog.
Status record_job_cgroups(const Config& config, uint32_t jobid, pid_t model);
int end_job_cgroups(const Config& config, uint32_t jobid, int deadline_ms = 5000);

// How much of the caller's environment enters the container.
enum class EnvironmentRule {
    // `gantry run`/`exec`, like `docker run`: the caller's shell stays outside; only the Slurm/PMI
    // wiring, TERM (when the image has none) and the --env names come in.
    docker,
    // A Slurm task (the SPANK plugin), Pyxis's rule: every job variable comes in unless the image
    // (or the device wiring) defines the same name. srun --export already decided the job's set.
    pyxis,
};

// The environment for a process in the container, from the container defaults and the caller's
// environment (`caller_env`, "NAME=value" entries), later steps replacing earlier ones:
//   1. the image's Env, then the device wiring's variables (ContainerEdits::env) over it;
//   2. PATH: the image's, else the default PATH (never the caller's); HOME: the container user's;
//   3. EnvironmentRule::pyxis: every caller variable whose name steps 1-2 did not set, except the
//      ones that describe the host: PATH, LD_LIBRARY_PATH, LD_PRELOAD, HOME, LANG, LANGUAGE, LC_*,
//      PWD, OLDPWD. EnvironmentRule::docker: TERM only;
//   4. SLURM_*, SLURMD_*, PMI*, PMIX_* from the caller, over an image's value: they describe this step;
//   5. the --env names with the caller's value (a name the caller lacks keeps the value above); a
//      named host variable (PATH, LANG, HOME...) comes in this way only;
//   6. the --env NAME=VALUE entries (ProcessDefaults::env_values), over everything, later ones winning.
std::vector<std::string> container_environment(const ProcessDefaults& defaults,
                                               const std::vector<std::string>& caller_env, EnvironmentRule rule);

// The argv to execute per the OCI rules: with the entrypoint, ENTRYPOINT + (argv or CMD); without,
// argv or CMD; falling back to /bin/sh when that is empty.
std::vector<std::string> resolve_command(const ProcessSpec& process);

// Runs `process` in the container: fork, join, exec with a PATH lookup inside the container. Forwards
// SIGINT/TERM/HUP/QUIT/USR1/USR2 to it and returns its exit status (128+N when killed by signal N).
Result<int> run_in(const ContainerState& container, const ProcessSpec& process);

// Where container state lives: Config::runtime_path for root, $XDG_RUNTIME_DIR/gantry (or
// /tmp/gantry-UID) otherwise.
std::string runtime_dir(const Config& config);

// Names of the containers with state files in runtime_dir(config).
std::vector<std::string> list_containers(const Config& config);

// Whether a kernel release string ("6.1.0-18-amd64", uname -r) is at least MAJOR.MINOR; one that does
// not start with two numbers is not.
bool kernel_release_at_least(std::string_view release, int major, int minor);
// Whether this kernel can stack a layered image's layers: both backends mount overlayfs with
// `userxattr` (the form the store's layers carry their opaque markers in), which Linux 5.11 brought.
// Where it cannot, layered images run as whole images made from their layers (docs/store.md).
bool kernel_stacks_layers();
// Whether a container started here with `backend` (auto: gantry.conf's mount_backend, else what the
// launcher picks: kernel where `privileged` (root and a trusted store), fuse where /dev/fuse and the
// fuse server are usable, extract otherwise) can stack a layered image: not with the extract backend,
// nor on a kernel before Linux 5.11. Asked before a pull, so that an image the container cannot stack
// is stored (or made from stored layers) whole instead of failing the start.
bool can_stack_layers(const Config& config, MountBackend backend, bool privileged);

// Kernel backend: unmounts the node-wide image mounts (<runtime_path>/images) that no container has
// used for config.mount_idle_seconds. A mount seen unused for the first time starts its idle clock
// (there is no daemon that saw its last user leave). Root only (0 for others); returns how many it
// released. Called by privileged `gantry run`, Container::stop and the plugin's job epilog.
Result<int> release_idle_mounts(const Config& config);

// The mount points below "/" in process PID's view, relative to its root ("proc", "etc/hosts"), from
// /proc/PID/mountinfo; the mounts that make up a container's root itself (image clones, overlays of
// top-level directories) are left out.
Result<std::vector<std::string>> mount_points_of(pid_t pid);

// --container-save: writes the container's root file system (image plus what it wrote, without what
// is mounted over it) as a squashfs file at `path`, as `user` inside the container's user namespace
// (the tree is the user's: reading it and writing `path` must not use root's rights).
Status save_container(const ContainerState& container, const ProcessIdentity& user, const std::string& path);

}  // namespace gantry
