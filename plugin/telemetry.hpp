// Start-up telemetry in the plugin (issue #37; include/gantry/telemetry.hpp): srun hands its start and
// its resolution of the tag to the nodes; each node, once its first task is exec'd, writes its record
// of the step into gantry.conf's telemetry_dir. Slurm glue only.
#pragma once

extern "C" {
#include <slurm/spank.h>
}

#include <string>

namespace gantry::plugin {

// Any context, slurm_spank_init: remember this process's trace points (the phases are their differences).
void record_start_points();
// srun, after pin_image_digest: its start time and the resolve's length, in the step's environment.
void hand_srun_times();
// slurmstepd, prepare_step: where the image came from (PullReport::outcome).
void note_image_outcome(const std::string& outcome);
// slurmstepd, after prepare_step (before Slurm forks the tasks): arms the record when the step made a
// container and telemetry_dir is set.
void start_record_armed(spank_t sp);
// slurmstepd, task_post_fork: the tasks exist; wait (in a thread, with a deadline) for the first exec.
void start_record_tasks_forked();
// A task, as the user, just before Slurm execs it: tells slurmstepd "now".
void start_record_task_execs();
// slurmstepd, slurm_spank_exit: ends the wait if it still runs.
void start_record_finish();

}  // namespace gantry::plugin
