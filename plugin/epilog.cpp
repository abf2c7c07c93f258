// The job epilog (root): named containers of the job end with it (container_scope=job), then the
// fuse image servers its containers shared on this node and (cgroup/v2) the job's own cgroup leaf,
// and node-wide image mounts idle for too long are released.
#include <string>

#include "gantry/launcher.hpp"
#include "gantry/strings.hpp"
#include "step.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {

void clean_up_job(spank_t sp, const Settings& settings) {
    Config config = load_plugin_config(settings);
    (void)release_idle_mounts(config);  // node-wide kernel image mounts idle too long
    uint32_t jobid = 0;
    if (!item(sp, S_JOB_ID, &jobid)) return;
    // Named containers of the job (container_scope=job), and any step's own container left behind
    // (pyxis_JOBID.STEPID: normally stopped with its step).
    std::string named = "pyxis_" + std::to_string(jobid) + "_", unnamed = "pyxis_" + std::to_string(jobid) + ".";
    for (const auto& name : list_containers(config)) {
        if (!starts_with(name, unnamed) && !(settings.container_scope == "job" && starts_with(name, named))) continue;
        if (auto c = Container::open(name, config)) (void)c->stop();
    }
    if (int ended = end_job_image_servers(config, jobid); ended > 0)
        log::debug("ended " + std::to_string(ended) + " image server(s) of job " + std::to_string(jobid));
    // cgroup/v2: whatever is left in the job's own leaf (a holder's or server's children), then the leaf.
    if (int removed = end_job_cgroups(config, jobid); removed > 0)
        log::debug("removed " + std::to_string(removed) + " cgroup(s) of job " + std::to_string(jobid));
}

}  // namespace gantry::plugin
