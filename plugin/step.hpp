// What the plugin does for one job step on one node: resolve and pull the image (as the user), create
// the step's container (once per node, in slurmstepd), let every local task join it, and clean up.
#pragma once

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
}

#include "gantry/config.hpp"
#include "gantry/result.hpp"
#include "options.hpp"
#include "settings.hpp"

namespace gantry::plugin {

// srun (local context): tells the user the image is being imported, resolves the image's tag to a
// digest once for the whole step (only where the nodes' pulls would ask the registry: pull policy
// `always`, or a store whose pulls the registry authorises) and hands the digest to every node
// (GANTRY_RESOLVED_IMAGE in srun's own environment, which srun copies into the step's), so all ranks
// run the same image even if the tag moves while the step starts, and the registry is asked once per
// step, not once per node. Best effort: nodes resolve
// it themselves when this fails, except when the registry says the tag does not exist (HTTP 404):
// then the error is printed once here and the step does not start.
// While the nodes pull, srun prints their progress (gantry.conf import_progress_seconds) from a thread
// of its own, until the image is in the store or srun ends (stop_import_watch, slurm_spank_exit).
Status pin_image_digest(spank_t sp, const Settings& settings);
void stop_import_watch();
// sbatch/salloc: a digest resolved for some earlier step (this shell runs inside one) is not handed to
// the job's steps; each srun in the job resolves its own, and the batch step resolves on its node.
void clear_resolved_image();
// sbatch/salloc, after clear_resolved_image: resolves the job's image with the user's credentials and
// starts its pull into the shared store in the background (`gantry stage --at-submit`, gantry.conf
// stage_at_submit), so that it is stored when the nodes are allocated; hands the digest to the job's
// steps. Fails (one line on the user's terminal, Pyxis's words) only when the registry says the image
// cannot be had: no such tag, or credentials refused. Anything else is left to the nodes.
Status stage_at_submit(spank_t sp, const Settings& settings);
// srun outside any job (no SLURM_JOB_ID: srun is about to ask for an allocation of its own), once
// pin_image_digest has `digest` for the step: arms the same stage as sbatch's (gantry.conf
// stage_at_submit, `gantry stage --at-submit`), of that digest, without asking the registry again. It
// starts only if srun's job is still waiting for its nodes a few seconds later (stage.cpp), so that the
// image is stored by the time the job leaves the queue. Nothing when the store holds it already.
void stage_for_own_allocation(const Settings& settings, const Config& config, const std::string& image,
                              const std::string& digest);
// srun (slurm_spank_local_user_init: its allocation has been granted): calls off a stage not yet
// started, and logs (srun -v) what a started one did.
void allocation_granted();

// slurmstepd (remote, in slurm_spank_init, before anything else): notes slurmstepd's own threads, so
// that a pull can tell when Slurm asks to signal or end the step and stop (step.cpp, StepSignals).
void watch_step_signals();

// slurmstepd (remote, root, before tasks exist): pulls the image as the job user and creates the
// container. Errors are kept and reported by join_step, because Slurm ignores some early failures.
Status prepare_step(spank_t sp, const Settings& settings);

// slurmstepd (remote, slurm_spank_user_init: the job user's euid, in the job's working directory,
// --chdir included): takes a relative --container-save against that directory, as Pyxis does
// (SPANK has no item for the directory; the job's PWD is whatever the caller's shell said), and
// refuses a target that is a directory. Failures are reported by every task.
void resolve_save_path();
// user_init: a relative --container-image was taken against srun's directory; fails the step when the
// step runs elsewhere (srun --chdir).
void check_image_base();

// Each task (remote, slurm_spank_task_init_privileged: root, in the task, before Slurm drops to the
// user): opens what join_step needs of the holder. Failures are kept and reported by join_step.
void prepare_task(spank_t sp);

// slurmstepd (remote, root, slurm_spank_task_post_fork: the task is in the step's cgroups and waits):
// moves the holder and its fuse daemon into the step's cgroups (the job's for a named container).
void task_forked(spank_t sp);

// Each task (remote, job user, before exec): enters the container and sets its environment.
Status join_step(spank_t sp);

// slurmstepd (remote, root), each time a local task exits: when the last one has, stops the step's
// unnamed container right away (Slurm waits for every process of the step, the holder included).
void task_exited(spank_t sp, const Settings& settings);

// slurmstepd (remote, root, after the tasks): saves (--container-save) and stops unnamed containers.
void finish_step(spank_t sp, const Settings& settings);

// Job epilog (root): stops the job's named containers when container_scope=job.
void clean_up_job(spank_t sp, const Settings& settings);

}  // namespace gantry::plugin
