// The environment forms of the `--container-*` options (PYXIS_CONTAINER_*, GANTRY_CONTAINER_*): read
// from the job's environment in slurmstepd (apply_environment) and checked on srun's side
// (check_environment_forms), as Pyxis does.
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "options.hpp"
#include "options_internal.hpp"

namespace gantry::plugin {
namespace {

std::optional<std::string> job_env(spank_t sp, const std::string& name) {
    char buf[4096];
    if (spank_getenv(sp, name.c_str(), buf, sizeof buf) != ESPANK_SUCCESS) return std::nullopt;
    return std::string(buf);
}

// The environment form of an option: which variable gave it, and its value.
struct EnvForm {
    std::string var;
    std::string value;
};

template <typename Lookup>
std::optional<EnvForm> env_form_from(Lookup&& lookup, const char* suffix) {
    for (const char* prefix : {"GANTRY_CONTAINER_", "PYXIS_CONTAINER_"}) {
        std::string var = std::string(prefix) + suffix;
        if (auto v = lookup(var)) return EnvForm{var, *v};
    }
    return std::nullopt;
}

std::optional<std::string> env_form(spank_t sp, const char* suffix) {
    auto form = env_form_from([&](const std::string& var) { return job_env(sp, var); }, suffix);
    if (!form) return std::nullopt;
    return form->value;
}

// The options that take a value, with the suffix of their environment form.
struct ValueOption {
    int id;
    const char* suffix;
    std::optional<std::string> JobOptions::*slot;
};
constexpr ValueOption kValueOptions[] = {
    {kImage, "IMAGE", &JobOptions::image},       {kMounts, "MOUNTS", &JobOptions::mounts},
    {kWorkdir, "WORKDIR", &JobOptions::workdir}, {kName, "NAME", &JobOptions::name},
    {kSave, "SAVE", &JobOptions::save},          {kEnv, "ENV", &JobOptions::env},
    {kUnshare, "UNSHARE", &JobOptions::unshare},
};

std::optional<bool> env_bool(spank_t sp, const char* suffix) {
    auto v = env_form(sp, suffix);
    if (!v) return std::nullopt;
    if (*v == "1" || *v == "true" || *v == "yes" || *v == "on") return true;
    if (*v == "0" || *v == "false" || *v == "no" || *v == "off" || v->empty()) return false;
    record_error(std::string("gantry: invalid value '") + *v + "' for PYXIS_CONTAINER_" + suffix + " (use 1 or 0)");
    return std::nullopt;
}

}  // namespace

void apply_environment(spank_t sp) {
    JobOptions& o = options();
    auto fill_bool = [&](std::optional<bool>& slot, const char* suffix) {
        if (!slot) slot = env_bool(sp, suffix);
    };
    for (const auto& opt : kValueOptions) {
        std::optional<std::string>& slot = o.*opt.slot;
        if (slot) continue;
        auto form = env_form_from([&](const std::string& var) { return job_env(sp, var); }, opt.suffix);
        if (!form) continue;
        // Pyxis reports a bad environment form and goes on without it; srun has told the user
        // already (check_environment_forms), so here it only reaches slurmd's log.
        auto problem = value_problem(opt.id, form->var, form->value, false);
        if (!problem.empty()) {
            log::warning(problem.substr(std::strlen("gantry: ")) + " (ignored)");
            continue;
        }
        slot = form->value;
    }
    fill_bool(o.mount_home, "MOUNT_HOME");
    fill_bool(o.remap_root, "REMAP_ROOT");
    fill_bool(o.entrypoint, "ENTRYPOINT");
    fill_bool(o.entrypoint_log, "ENTRYPOINT_LOG");
    fill_bool(o.writable, "WRITABLE");
    if (!o.writable) {
        if (auto ro = env_bool(sp, "READONLY")) o.writable = !*ro;
    }
}

void check_environment_forms() {
    const JobOptions& o = options();
    for (const auto& opt : kValueOptions) {
        if (o.*opt.slot) continue;  // the command line wins; its value was checked when parsed
        auto form = env_form_from(
            [](const std::string& var) -> std::optional<std::string> {
                const auto& forms = environment().container_forms;
                auto v = forms.find(var);
                if (v == forms.end()) return std::nullopt;
                return v->second;
            },
            opt.suffix);
        if (!form) continue;
        auto problem = value_problem(opt.id, form->var, form->value, true);
        if (!problem.empty())
            slurm_info("gantry: warning: %s; ignored, as Pyxis does: the job runs as if %s were unset",
                       problem.substr(std::strlen("gantry: ")).c_str(), form->var.c_str());
    }
}

}  // namespace gantry::plugin
