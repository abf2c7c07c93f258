// The task side of proving the fabric (issue 37): Slurm glue around check_fabric
// (runtime/devices/fabric_check.cpp). Runs in each task after it joined the step's container, as the
// job user, before Slurm execs the task's command.
#include <unistd.h>

#include "gantry/fabric_check.hpp"
#include "gantry/image_config.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {

Status check_task_fabric(const StepState& st, const std::vector<std::string>& task_env,
                         const std::vector<std::string>& container_env) {
    if (!fabric_check_wanted(container_env, st.efa_devices)) return {};
    // Once per node: the first local task. Where the check decides whether the step runs, every task
    // must know, so each checks (a few stat()s and ELF headers: milliseconds).
    bool first_task = find_env(task_env, "SLURM_LOCALID").value_or("0") == "0";
    if (!first_task && !st.config.efa_required) return {};
    auto report = check_fabric(container_env);
    if (!report.problem) return {};
    if (st.config.efa_required)
        return make_error(report.problem->line() + " (efa_required = yes in gantry.conf: the step does not run)");
    // One line on srun's terminal, from node 0 as the selection's warnings: every node shares the
    // image and, in a uniform cluster, its host libraries. Other nodes' stderr would repeat it N times.
    if (find_env(task_env, "SLURM_NODEID").value_or("0") == "0") {
        std::string line = "gantry: warning: " + report.problem->line() + "\n";
        (void)!::write(STDERR_FILENO, line.data(), line.size());
    }
    return {};
}

}  // namespace gantry::plugin
