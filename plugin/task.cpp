// The task context (each rank, as the job user, before exec): enter the step's container and set
// the rank's environment (Pyxis's rule, runtime/launcher/environment.cpp) and entrypoint.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gantry/devices.hpp"
#include "gantry/strings.hpp"
#include "step.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {

void prepare_task(spank_t) {
    StepState& st = state();
    if (!st.error.empty() || st.run_on_host || st.joined.holder_pid <= 0) return;
    // Still root: the holder root started is not the user's to open (not dumpable).
    auto handles = open_join_handles(st.joined);
    if (!handles)
        st.error = "gantry: " + handles.error().message;
    else
        st.handles = std::move(*handles);
}

Status join_step(spank_t sp) {
    StepState& st = state();
    if (!st.error.empty()) return make_error(st.error.substr(8));
    std::vector<std::string> before = job_environment(sp);
    // slurmstepd's own output while it prepared the step never reaches srun; a task's stderr does.
    // Only node 0 has notices, and only its first task prints them: once per step.
    if (!st.notices.empty() && find_env(before, "SLURM_LOCALID").value_or("") == "0")
        (void)!::write(STDERR_FILENO, st.notices.data(), st.notices.size());
    if (st.run_on_host || st.joined.holder_pid <= 0) return {};
    // --- devices (issue 7): the selection's warnings, once per step, on the user's terminal ---
    if (!st.device_warnings.empty() && find_env(before, "SLURM_LOCALID").value_or("") == "0")
        (void)!::write(STDERR_FILENO, st.device_warnings.data(), st.device_warnings.size());
    // The entrypoint helper is opened before entering the container: it is our file on the host, and
    // the task execs it as /proc/self/fd/N from inside, where the image need not contain it.
    UniqueFd entry;
    if (!st.entrypoint.empty() || st.as_user) {
        entry.reset(::open(st.entry_helper.c_str(), O_RDONLY));  // inherited by the exec on purpose
        if (!entry) return system_error("opening the entrypoint helper " + st.entry_helper);
    }
    JoinOptions how;
    how.as = st.new_instance ? JoinAs::new_instance : JoinAs::attach;
    how.as_user = st.as_user;
    // The user's own ids, read before the container's user namespace renames them: gantry-entry maps
    // them back (JoinOptions::as_user).
    const std::string user_ids = std::to_string(::getuid()) + ":" + std::to_string(::getgid());
    GANTRY_TRY(st.handles ? join(st.joined, *st.handles, how) : join(st.joined, how));
    // Pyxis's rule (docs/user.md): the job's variables come in unless the image defines them.
    std::vector<std::string> after = container_environment(st.joined.defaults, before, EnvironmentRule::pyxis);
    // --- devices and wiring (issue 7): PMIx MCA mapping and PyTorch ranks of this task ---
    for (auto& e : task_environment(st.config, st.joined.defaults.image_env, before)) after.push_back(std::move(e));
    GANTRY_TRY(check_task_fabric(st, before, after));
    // --- end devices ---
    std::map<std::string, std::string> wanted;
    for (const auto& e : after) {
        auto eq = e.find('=');
        if (eq != std::string::npos) wanted[e.substr(0, eq)] = e.substr(eq + 1);
    }
    for (const auto& e : before) {
        std::string name = e.substr(0, e.find('='));
        if (wanted.find(name) == wanted.end()) spank_unsetenv(sp, name.c_str());
    }
    // Which image this rank runs: the same digest on every node of the step.
    if (!st.digest.empty()) wanted[kDigestVar] = st.digest;
    if (entry) {
        char** argv = nullptr;
        int argc = 0;
        if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1)
            return make_error("could not read the task's command to put the entrypoint in front of it");
        wanted["GANTRY_ENTRY_ARGV0"] = argv[0];
        wanted["GANTRY_ENTRY_ARGC"] = std::to_string(st.entrypoint.size());
        for (size_t i = 0; i < st.entrypoint.size(); ++i)
            wanted["GANTRY_ENTRY_ARG_" + std::to_string(i)] = st.entrypoint[i];
        wanted["GANTRY_ENTRY_FD"] = std::to_string(entry.get());
        if (st.entrypoint_log) wanted["GANTRY_ENTRY_LOG"] = "1";
        if (st.as_user) wanted["GANTRY_ENTRY_USERNS"] = user_ids;
        // Slurm execs argv[0] after this hook; the array is Slurm's, the string is ours (never freed:
        // the process execs right away).
        argv[0] = ::strdup(("/proc/self/fd/" + std::to_string(entry.release())).c_str());
    }
    for (const auto& [k, v] : wanted) spank_setenv(sp, k.c_str(), v.c_str(), 1);
    return {};
}

}  // namespace gantry::plugin
