// What the plugin's files share: the state of this step in this slurmstepd (inherited by the forked
// tasks), Slurm item accessors, and the declarations of the Slurm-glue helpers (slurm_env.cpp) and of
// the pulls run as the job user or the store owner (pull.cpp). Internal to the plugin.
#pragma once

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
}

#include <pwd.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/acquire.hpp"
#include "gantry/config.hpp"
#include "gantry/devices.hpp"
#include "gantry/fd.hpp"
#include "gantry/launcher.hpp"
#include "gantry/log.hpp"
#include "gantry/pull_report.hpp"
#include "gantry/result.hpp"
#include "gantry/spawn.hpp"
#include "gantry/threads.hpp"
#include "settings.hpp"

#ifndef GANTRY_CLI_INSTALL_PATH
#define GANTRY_CLI_INSTALL_PATH "/usr/bin/gantry"
#endif
#ifndef GANTRY_HOLDER_INSTALL_PATH
#define GANTRY_HOLDER_INSTALL_PATH "/usr/libexec/gantry/gantry-holder"
#endif
#ifndef GANTRY_ENTRY_INSTALL_PATH
#define GANTRY_ENTRY_INSTALL_PATH "/usr/libexec/gantry/gantry-entry"
#endif

namespace gantry::plugin {

// The head of every message about an image that could not be had, whatever went wrong: Pyxis's
// wording ("failed to import docker image: IMAGE"), which users' scripts grep for.
inline std::string import_failed(const std::string& image) {
    return "failed to import docker image: " + image;
}

// srun's working directory, handed to the nodes when --container-image is a relative path (stepd.cpp).
inline constexpr const char* kSrunDirVar = "GANTRY_SRUN_DIR";

// The digest of the image a rank runs, in every task's environment.
inline constexpr const char* kDigestVar = "GANTRY_CONTAINER_IMAGE_DIGEST";
// The step's image as srun resolved it once for the whole step, "IMAGE@DIGEST", handed to every node
// in the job environment (srun.cpp: pin_image_digest, image_resolved_by_srun).
inline constexpr const char* kResolvedVar = "GANTRY_RESOLVED_IMAGE";
// The job's image as sbatch/salloc resolved and staged it at submit time, "IMAGE@DIGEST", in the job
// environment, for the sruns inside the job (stage.cpp: stage_at_submit, image_staged_at_submit).
inline constexpr const char* kStagedVar = "GANTRY_STAGED_IMAGE";
// Read back in srun's process from gantry::environment() (include/gantry/environment.hpp), whose fields
// bear these names.
static_assert(std::string_view(kResolvedVar) == "GANTRY_RESOLVED_IMAGE" &&
              std::string_view(kStagedVar) == "GANTRY_STAGED_IMAGE");
// The trace phases that bring a step's image to the node (stepd.cpp, do_prepare). Start-up telemetry
// (telemetry.cpp) takes the "pull" phase from where the one that ran ended, so both name them here.
inline constexpr const char* kPhasePullAsUser = "pull (as the user)";
inline constexpr const char* kPhasePullTrusted = "pull (trusted store)";
inline constexpr const char* kPhaseAcquireStored = "acquire_stored_as_user";

// Slurm's requests to signal or end this step (scancel, srun's Ctrl-C or its forwarded signals, the
// end of the job after a node failure or at its time limit) while the plugin still pulls the image in
// slurm_spank_init_post_opt: slurmstepd answers such a request only once the tasks run (it waits on
// the step's state, up to 2 x 60 s, in a thread of its message handler: src/slurmd/slurmstepd/req.c,
// _wait_for_job_running), and the tasks run only after the pull. Without this, a cancelled step's node
// stayed `completing` for as long as the download took. A message-handler thread that starts after
// slurmstepd's own threads (snapshot in slurm_spank_init) and stays in one futex wait for a second is
// such a request: the others (state, stat, attach, completion) answer at once. Any signal counts: the
// program could not have installed a handler for it yet, and slurmd's end of a job starts with SIGCONT.
class StepSignals {
public:
    bool pending() {
        auto now = std::chrono::steady_clock::now();
        if (!found_ && now - last_ >= std::chrono::milliseconds(200)) {
            last_ = now;
            std::string which;
            if (threads_.check(std::chrono::seconds(1), &which)) {
                found_ = true;
                log::info("slurmstepd holds a request to signal this step (" + which +
                          "): stopping the image pull so that the step can end");
            }
        }
        return found_;
    }

private:
    NewBlockedThreads threads_;
    std::chrono::steady_clock::time_point last_{};
    bool found_ = false;
};

// State of this step in this slurmstepd; forked tasks inherit a copy.
struct StepState {
    std::string error;                        // reported by every task when set
    std::optional<Container> container;       // the step's container, created by prepare_step
    ContainerState joined;                    // what tasks join
    std::optional<JoinHandles> handles;       // the holder's namespaces and root, opened as root (task_init_privileged)
    std::optional<CgroupLevel> cgroup_level;  // where the holder goes: the step's or job's cgroups (none: global names)
    bool holder_placed = false;               // task_forked moved it
    CgroupPlacement placement;                // task_forked's moves, finished by finish_step
    bool run_on_host = false;                 // no container for this step (no image, or a host-only step)
    bool new_instance = false;                // NAME:no_exec on a running container: tasks join a copy
    bool as_user = false;                     // --no-container-remap-root in a remap-root container
    std::string digest;                       // the image every rank of the step runs, told to the tasks
    UniqueFd image_in_use;                    // shared lock: the image stays while the step runs
    std::vector<UniqueFd> image_files;        // a trusted store's image as acquire_image opened it
    uint32_t tasks_exited = 0;
    std::vector<std::string> entrypoint;  // run in front of each task's command (--container-entrypoint)
    bool entrypoint_log = false;
    std::string entry_helper;  // gantry-entry, which Slurm execs in the task's place
    std::string save_path;     // --container-save: written after the last task, on node 0
    std::string image_base;    // the directory a relative --container-image was taken against
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    Config config;
    std::string device_warnings;  // devices (issue 7): shown by node 0's first task
    bool efa_devices = false;     // EFA devices went into the container: its fabric is checked (issue 37)
    std::string notices;          // "gantry: ..." lines for srun's terminal, node 0's first task
    std::optional<StepSignals>
        signals;  // slurmstepd only (watch_step_signals): stops pulls and checks of a cancelled step
};

StepState& state();

// Each task, in the container as the job user, before Slurm execs it (fabric.cpp, issue 37): the EFA
// check, by the first task of each node (by every task where efa_required = yes, which fails them).
// `task_env`: Slurm's environment of the task; `container_env`: the one it will run with.
Status check_task_fabric(const StepState& st, const std::vector<std::string>& task_env,
                         const std::vector<std::string>& container_env);

template <typename T>
inline bool item(spank_t sp, spank_item_t what, T* out) {
    return spank_get_item(sp, what, out) == ESPANK_SUCCESS;
}

std::vector<std::string> job_environment(spank_t sp);
std::string container_name(const std::string& name, uint32_t jobid, const Settings& settings);
Config load_plugin_config(const Settings& settings);

struct JobIdentity {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    uint32_t jobid = 0, stepid = 0;
};

Result<JobIdentity> identity(spank_t sp);

// --- srun.cpp: the digest srun handed over for `image` (user input, used as IMAGE@DIGEST would be) ---
std::optional<std::string> image_resolved_by_srun(const std::vector<std::string>& env, const std::string& image);

// --- stage.cpp: the digest sbatch/salloc resolved for `image` at submit, for an srun inside the job ---
std::optional<std::string> image_staged_at_submit(const std::string& image);

// --- slurm_env.cpp: slurmstepd's own configuration and the paths it implies ---
std::optional<std::string> pmix_client_tmpdir(const std::vector<std::string>& env);
std::optional<std::string> slurmd_spool_dir(spank_t sp, const std::vector<std::string>& env);
std::optional<std::string> slurm_mpi_default();
// Binds for --mpi=pmix* steps: the PMIx client directory and the slurmd spool directory (same paths).
void add_pmix_mounts(spank_t sp, const std::vector<std::string>& env, bool named, std::vector<DeviceMount>& mounts);
std::vector<std::string> batch_srun_paths(const std::vector<std::string>& env);

// --- pull.cpp: our programs, and the pulls (as the job user, or as the store owner) ---
std::string helper_path(const Settings& settings, const std::string& name, const char* installed);
std::string gantry_cli(const Settings& settings);
Result<std::string> job_store_path(const Config& config, uid_t uid);
// `whole`: the step's container cannot stack layers (can_stack_layers), so the pull stores the image
// whole (or makes its whole file from the layers a store holds) whatever layered_images says.
// `resolved`: the digest srun resolved `image`'s tag to for the step (image_resolved_by_srun), or empty.
Result<PullReport> pull_as_user(const Settings& settings, const JobIdentity& id, const std::string& store_root,
                                const std::string& image, const std::string& resolved, std::vector<std::string> env,
                                bool whole);
// A digest-pinned image (the user's IMAGE@DIGEST, or srun's resolution: `resolved`) that the store the
// job user pulls into already holds in a form the step runs: acquired by the user's helper
// (acquire_image_as), which also reports its config, so that no `gantry pull` runs. nullopt whenever a
// pull must decide (a tag, private_images, not stored, stored only as layers for a step that needs the
// whole image, a helper that did not report): then the caller pulls as before.
// `in_holder` (an attached container's step): not a helper but the container holder itself acquires
// the image, as the user, before it takes the namespaces (start_holder_acquiring), and waits for its
// set-up in the result's `holder` (ContainerSpec::started_holder): one exec fewer per warm step.
std::optional<HolderWithImage> acquire_stored_as_user(const Settings& settings, const Config& config,
                                                      const JobIdentity& id, const std::string& store_root,
                                                      const std::string& image, const std::string& resolved, bool whole,
                                                      bool in_holder);
Result<PullReport> pull_into_trusted_store(const Settings& settings, const Config& config, const JobIdentity& id,
                                           std::string image, const std::string& resolved, std::vector<std::string> env,
                                           bool whole);

}  // namespace gantry::plugin
