// The step's state and the small Slurm accessors every context uses (see step_internal.hpp).
#include <string>
#include <vector>

#include "gantry/strings.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {

StepState& state() {
    static StepState s;
    return s;
}

std::vector<std::string> job_environment(spank_t sp) {
    std::vector<std::string> env;
    char** envp = nullptr;
    if (item(sp, S_JOB_ENV, &envp) && envp != nullptr)
        for (char** e = envp; *e != nullptr; ++e) env.emplace_back(*e);
    return env;
}

std::string container_name(const std::string& name, uint32_t jobid, const Settings& settings) {
    // Pyxis naming, so that scripts and admins find the same names.
    return settings.container_scope == "global" ? "pyxis_" + name : "pyxis_" + std::to_string(jobid) + "_" + name;
}

Config load_plugin_config(const Settings& settings) {
    auto cfg = load_config(settings.config, true);
    Config c = cfg ? *cfg : Config{};
    if (!settings.runtime_path.empty()) c.runtime_path = settings.runtime_path;
    if (!settings.store.empty()) c.store_path = settings.store;
    if (!settings.mount_backend.empty()) c.mount_backend = settings.mount_backend;
    return c;
}

Result<JobIdentity> identity(spank_t sp) {
    JobIdentity id;
    if (!item(sp, S_JOB_UID, &id.uid) || !item(sp, S_JOB_GID, &id.gid) || !item(sp, S_JOB_ID, &id.jobid) ||
        !item(sp, S_JOB_STEPID, &id.stepid))
        return make_error("could not read the job's user, group and ids from Slurm");
    gid_t* groups = nullptr;
    int ngroups = 0;
    if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &groups, &ngroups) == ESPANK_SUCCESS && groups != nullptr)
        id.groups.assign(groups, groups + ngroups);
    if (id.groups.empty()) id.groups.push_back(id.gid);
    return id;
}

}  // namespace gantry::plugin
