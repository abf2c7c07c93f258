// Slurm glue of the remote context: what slurmstepd's own configuration says about this node (TmpFS,
// the spool directory, MpiDefault, the files an srun inside a batch script needs).
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "gantry/environment.hpp"
#include "gantry/strings.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {
namespace {

// slurmstepd's own configuration: libslurm's `slurm_conf`, in the layout of the Slurm headers this
// plugin is built against. Looked up rather than linked (it is slurmstepd's, not the SPANK API's);
// null outside slurmstepd/srun.
const slurm_conf_t* stepd_slurm_conf() {
    return static_cast<const slurm_conf_t*>(::dlsym(RTLD_DEFAULT, "slurm_conf"));
}

}  // namespace

// Where Slurm's PMIx server tells clients (pmix.tmpdir, pmix.nsdir) to keep their session files: the
// node's TmpFS, read from slurmstepd's own configuration through libslurm's accessor when this process
// has it (it is slurmstepd's, not part of the SPANK API, so it is looked up rather than linked).
std::optional<std::string> pmix_client_tmpdir(const std::vector<std::string>& env) {
    using TmpFsFn = char* (*)(char*);
    auto fn = reinterpret_cast<TmpFsFn>(::dlsym(RTLD_DEFAULT, "slurm_get_tmp_fs"));
    if (fn == nullptr) return std::nullopt;
    std::string node = find_env(env, "SLURMD_NODENAME").value_or("");
    char* dir = fn(node.empty() ? nullptr : node.data());
    if (dir == nullptr) return std::nullopt;
    std::string out = dir;  // Slurm's allocation, a few bytes once per step: left to the process
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    return out;
}

// The slurmd spool directory of this node, below which Slurm's PMIx plugin makes the step's server
// directory (PMIX_SERVER_TMPDIR, `<SlurmdSpoolDir>/pmix.<job>.<step>`) only after the container exists.
// Read from slurmstepd's configuration (stepd_slurm_conf) and expanded like slurmd does (%n node name,
// %h host name).
std::optional<std::string> slurmd_spool_dir(spank_t sp, const std::vector<std::string>& env) {
    auto conf = stepd_slurm_conf();
    if (conf == nullptr || conf->slurmd_spooldir == nullptr || conf->slurmd_spooldir[0] != '/') return std::nullopt;
    // This node's name: SLURMD_NODENAME is set only later, for the tasks; until then it is the step's
    // node list at this node's (step-relative) index.
    std::string node = find_env(env, "SLURMD_NODENAME").value_or("");
    uint32_t nodeid = 0;
    auto list = find_env(env, "SLURM_STEP_NODELIST");
    if (!list) list = find_env(env, "SLURM_JOB_NODELIST");
    if (node.empty() && list && item(sp, S_JOB_NODEID, &nodeid))
        if (auto hosts = expand_hostlist(*list); hosts && nodeid < hosts->size()) node = (*hosts)[nodeid];
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string short_host = host;
    short_host = short_host.substr(0, short_host.find('.'));
    std::string out;
    for (const char* c = conf->slurmd_spooldir; *c != '\0'; ++c) {
        if (c[0] == '%' && c[1] == 'n') {
            if (node.empty()) return std::nullopt;
            out += node, ++c;
        } else if (c[0] == '%' && c[1] == 'h') {
            out += short_host, ++c;
        } else {
            out += *c;
        }
    }
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    return out;
}

// The node's MpiDefault, for steps that name no --mpi (and so carry no SLURM_MPI_TYPE).
std::optional<std::string> slurm_mpi_default() {
    auto conf = stepd_slurm_conf();
    if (conf == nullptr || conf->mpi_default == nullptr) return std::nullopt;
    return std::string(conf->mpi_default);
}

// What an `srun` inside a containerized batch script needs from the host besides the Slurm client the
// image brings: the directory of slurm.conf (the job's SLURM_CONF, e.g. configless mode's cache, else
// slurmstepd's, else the default), PlugStackConfig, the munge socket's directory (AuthInfo socket=,
// else munge's default) and this plugin's own file (plugstack.conf names it; its libraries come from
// the image). Bound read-only at the same paths; what the job user does not reach is left out.
std::vector<std::string> batch_srun_paths(const std::vector<std::string>& env) {
    std::vector<std::string> out;
    auto add_parent = [&](const std::string& file) {
        auto slash = file.rfind('/');
        if (file.empty() || file[0] != '/' || slash == std::string::npos || slash == 0) return;
        out.push_back(file.substr(0, slash));
    };
    std::string conf = find_env(env, "SLURM_CONF").value_or("");
    if (conf.empty() && environment().slurm_conf.set) conf = environment().slurm_conf.value;
    add_parent(conf.empty() ? "/etc/slurm/slurm.conf" : conf);
    std::string socket = "/run/munge/munge.socket.2";
    auto slurm = stepd_slurm_conf();
    // PlugStackConfig, when it is not beside slurm.conf: the file itself (its directory may hold
    // slurmd's own state, e.g. the spool directory in the test harness).
    if (slurm != nullptr && slurm->plugstack != nullptr && slurm->plugstack[0] == '/' &&
        std::none_of(out.begin(), out.end(),
                     [&](const std::string& d) { return starts_with(slurm->plugstack, d + "/"); }))
        out.emplace_back(slurm->plugstack);
    if (slurm != nullptr && slurm->authinfo != nullptr) {
        // AuthInfo is a comma-separated list of key=value; only socket= matters here.
        for (const auto& part : split_list(slurm->authinfo, ','))
            if (starts_with(part, "socket=")) socket = part.substr(7);
    }
    add_parent(socket);
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&batch_srun_paths), &info) != 0 && info.dli_fname != nullptr &&
        info.dli_fname[0] == '/')
        out.emplace_back(info.dli_fname);
    // Not looked at here (root; SLURM_CONF is the job's): what the user does not reach is left out by
    // the holder (DeviceMount::if_reachable).
    std::vector<std::string> unique;
    for (const auto& p : out)
        if (std::find(unique.begin(), unique.end(), p) == unique.end()) unique.push_back(p);
    return unique;
}

// The PMIx directories a --mpi=pmix* step's ranks need inside (docs/devices.md, gantry.conf pmix).
void add_pmix_mounts(spank_t sp, const std::vector<std::string>& env, bool named, std::vector<DeviceMount>& mounts) {
    // Open MPI creates its session directory below the PMIx client directory, a host path the server
    // fills only after this hook. Below an image directory the rank could not create it, so the
    // directory is bound at the same path; a TmpFS of /tmp needs nothing (the container's own /tmp
    // is the rank's to write).
    // Both paths may hold the node name from SLURMD_NODENAME (%n), which the job's environment sets:
    // root does not look at them; the holder binds them only if the job user reaches them
    // (DeviceMount::if_reachable), so a step says nothing about what exists where the user cannot see.
    auto dir = pmix_client_tmpdir(env);
    if (dir && (*dir)[0] == '/' && *dir != "/" && *dir != "/tmp") mounts.push_back({*dir, *dir, false, true});
    // The PMIx server's own directory (the shared-memory stores clients attach to, ds12/ds21) does
    // not exist yet either; its parent, the node's slurmd spool directory, is bound (read-write, same
    // path) for steps launched with --mpi=pmix*, so the directory appears inside once Slurm makes it.
    // A named container is bound it whatever its first step's --mpi: a later step that attaches with
    // --mpi=pmix gets its server directory there too (the container's mounts are made once).
    // Safe: a bind changes no permission; inside, the user reaches only what the same uid reaches on
    // the host (root-owned entries map to the overflow id, remap-root included).
    auto mpi = find_env(env, "SLURM_MPI_TYPE");
    if (!mpi) mpi = slurm_mpi_default();
    auto spool = slurmd_spool_dir(sp, env);
    bool pmix_step = mpi && starts_with(*mpi, "pmix");
    if ((pmix_step || named) && spool && *spool != "/") mounts.push_back({*spool, *spool, false, true});
}

}  // namespace gantry::plugin
