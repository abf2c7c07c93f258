// What a containerized process gets: its environment (image Env + Slurm/PMI wiring + --env names)
// and its argv (OCI entrypoint/cmd rules). Pure functions, unit-tested without namespaces.
#include <algorithm>
#include <string>
#include <vector>

#include "gantry/launcher.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

const char* const kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// An ordered NAME -> value list where a later set replaces the value in place.
class EnvList {
public:
    void set(const std::string& name, const std::string& value) {
        for (auto& [n, v] : items_) {
            if (n == name) {
                v = value;
                return;
            }
        }
        items_.emplace_back(name, value);
    }
    [[nodiscard]] bool has(const std::string& name) const {
        return std::any_of(items_.begin(), items_.end(), [&](const auto& p) { return p.first == name; });
    }
    [[nodiscard]] std::vector<std::string> entries() const {
        std::vector<std::string> out;
        out.reserve(items_.size());
        for (const auto& [n, v] : items_) out.push_back(n + "=" + v);
        return out;
    }

private:
    std::vector<std::pair<std::string, std::string>> items_;
};

bool split_entry(const std::string& entry, std::string& name, std::string& value) {
    auto eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    name = entry.substr(0, eq);
    value = entry.substr(eq + 1);
    return true;
}

// The job wiring Slurm and the MPI launchers rely on (Enroot's Slurm hook copies the same prefixes).
bool is_job_variable(const std::string& name) {
    return starts_with(name, "SLURM_") || starts_with(name, "SLURMD_") || starts_with(name, "PMI") ||
           starts_with(name, "PMIX_");
}

}  // namespace

std::vector<std::string> container_environment(const ProcessDefaults& defaults,
                                               const std::vector<std::string>& host_env) {
    EnvList env;
    std::string name, value;
    for (const auto& e : defaults.image_env)
        if (split_entry(e, name, value)) env.set(name, value);
    for (const auto& e : defaults.device_env)
        if (split_entry(e, name, value)) env.set(name, value);
    if (!env.has("PATH")) env.set("PATH", kDefaultPath);

    auto named = [&](const std::string& n) {
        return std::find(defaults.env_names.begin(), defaults.env_names.end(), n) != defaults.env_names.end();
    };
    if (!named("HOME")) env.set("HOME", defaults.home.empty() ? "/" : defaults.home);

    for (const auto& e : host_env) {
        if (!split_entry(e, name, value)) continue;
        if (is_job_variable(name)) env.set(name, value);
        else if (name == "TERM" && !env.has("TERM")) env.set(name, value);
    }
    // --env NAME: the host's value wins; a name the host lacks keeps the image's value.
    for (const auto& want : defaults.env_names) {
        for (const auto& e : host_env) {
            if (split_entry(e, name, value) && name == want) env.set(name, value);
        }
    }
    return env.entries();
}

std::vector<std::string> resolve_command(const ProcessSpec& process) {
    std::vector<std::string> argv;
    if (process.use_entrypoint && !process.entrypoint.empty()) {
        argv = process.entrypoint;
        const auto& rest = process.argv.empty() ? process.cmd : process.argv;
        argv.insert(argv.end(), rest.begin(), rest.end());
    } else {
        argv = process.argv.empty() ? process.cmd : process.argv;
    }
    if (argv.empty()) argv = {"/bin/sh"};
    return argv;
}

}  // namespace gantry
