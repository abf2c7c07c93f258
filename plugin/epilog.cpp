// The job epilog (root): named containers of the job end with it (container_scope=job), and
// node-wide image mounts idle for too long are released.
#include <string>

#include "gantry/launcher.hpp"
#include "gantry/strings.hpp"
#include "step.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {

void clean_up_job(spank_t sp, const Settings& settings) {
    (void)release_idle_mounts(load_plugin_config(settings));  // node-wide kernel image mounts idle too long
    if (settings.container_scope != "job") return;
    uint32_t jobid = 0;
    if (!item(sp, S_JOB_ID, &jobid)) return;
    Config config = load_plugin_config(settings);
    std::string prefix = "pyxis_" + std::to_string(jobid) + "_";
    for (const auto& name : list_containers(config)) {
        if (!starts_with(name, prefix)) continue;
        if (auto c = Container::open(name, config)) (void)c->stop();
    }
}

}  // namespace gantry::plugin
