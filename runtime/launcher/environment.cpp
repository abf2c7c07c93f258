// What a containerized process gets: its environment (image Env, the job's variables under Pyxis's
// rule, Slurm/PMI wiring, --env names) and its argv (OCI entrypoint/cmd rules). Pure functions,
// unit-tested without namespaces.
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
// They describe this step and this rank, so the caller's value replaces an image's (stale) one.
bool is_slurm_wiring(const std::string& name) {
    return starts_with(name, "SLURM_") || starts_with(name, "SLURMD_") || starts_with(name, "PMI") ||
           starts_with(name, "PMIX_");
}

// Job variables that describe the host rather than the job, so a Slurm task's value stays outside
// (docs/user.md, "Environment inside"): search paths of the host's file system (PATH, LD_LIBRARY_PATH,
// LD_PRELOAD: Pyxis keeps these three from Enroot too), the host's home and working directory (HOME
// has its own rule; the container starts in its workdir, and a shell sets PWD from it), and the
// host's locales (Pyxis drops LANG, LANGUAGE and LC_ALL; the other LC_* categories name host locales
// just the same, e.g. LC_CTYPE=UTF-8 from a macOS ssh client). --container-env brings any of them in.
bool describes_host(const std::string& name) {
    for (const char* n : {"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "PWD", "OLDPWD", "LANG", "LANGUAGE"})
        if (name == n) return true;
    return starts_with(name, "LC_");
}

}  // namespace

std::vector<std::string> container_environment(const ProcessDefaults& defaults,
                                               const std::vector<std::string>& caller_env, EnvironmentRule rule) {
    EnvList env;
    std::string name, value;
    // 1-2. What the container itself defines: the image, the device wiring, PATH and HOME.
    for (const auto& e : defaults.image_env)
        if (split_entry(e, name, value)) env.set(name, value);
    for (const auto& e : defaults.device_env)
        if (split_entry(e, name, value)) env.set(name, value);
    if (!env.has("PATH")) env.set("PATH", kDefaultPath);

    auto named = [&](const std::string& n) {
        return std::find(defaults.env_names.begin(), defaults.env_names.end(), n) != defaults.env_names.end();
    };
    if (!named("HOME")) env.set("HOME", defaults.home.empty() ? "/" : defaults.home);

    // 3. The caller's variables for the names still free; 4. the Slurm wiring over everything.
    for (const auto& e : caller_env) {
        if (!split_entry(e, name, value)) continue;
        bool passes = rule == EnvironmentRule::pyxis ? !describes_host(name) : name == "TERM";
        if (is_slurm_wiring(name) || (passes && !env.has(name))) env.set(name, value);
    }
    // 5. --env NAME: the caller's value wins; a name the caller lacks keeps the value above.
    for (const auto& want : defaults.env_names) {
        for (const auto& e : caller_env) {
            if (split_entry(e, name, value) && name == want) env.set(name, value);
        }
    }
    // 6. --env NAME=VALUE: what the user wrote on the command line, over everything else.
    for (const auto& e : defaults.env_values)
        if (split_entry(e, name, value)) env.set(name, value);
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
