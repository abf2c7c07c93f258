// The Pyxis-compatible `--container-*` options: their table, the values a job asked for, and the
// rules Slurm imposes on them (a callback may fire twice; sbatch values reach inner sruns through the
// environment; PYXIS_CONTAINER_* / GANTRY_CONTAINER_* environment forms; command line wins).
#pragma once

extern "C" {
#include <slurm/spank.h>
}

#include <optional>
#include <string>

namespace gantry::plugin {

struct JobOptions {
    std::optional<std::string> image;
    std::optional<std::string> mounts;
    std::optional<std::string> workdir;
    std::optional<std::string> name;  // NAME[:auto|create|exec|no_exec]
    std::optional<std::string> save;
    std::optional<bool> mount_home;
    std::optional<bool> remap_root;
    std::optional<bool> entrypoint;
    std::optional<bool> entrypoint_log;
    std::optional<bool> writable;  // --container-writable / --container-readonly
    std::optional<std::string> env;
    std::optional<std::string> unshare;

    [[nodiscard]] bool any() const;
};

// The values seen so far in this process.
JobOptions& options();

// The option table for spank_option_register.
struct spank_option* option_table();

// First error an option callback saw (Slurm ignores some callback failures; it is reported again at
// task start so the step fails with the message).
std::string& option_error();

// Fills options not given on the command line from the job environment: GANTRY_CONTAINER_<NAME>, then
// PYXIS_CONTAINER_<NAME> (e.g. PYXIS_CONTAINER_IMAGE, PYXIS_CONTAINER_MOUNT_HOME=0).
// A value Pyxis would refuse on the command line (an empty one, an empty element of a list, a
// --container-save target that is a directory) is left out, as Pyxis leaves it out.
void apply_environment(spank_t sp);

// In srun, sbatch and salloc (as the user): tells the user about environment forms that
// apply_environment will leave out, so that a typo in PYXIS_CONTAINER_ENV does not pass silently.
void check_environment_forms();

}  // namespace gantry::plugin
