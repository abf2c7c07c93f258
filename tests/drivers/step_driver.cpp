// gantry-step-driver: the plugin's container life in a Slurm step, driven from a test without
// slurmstepd (tests/integration/cgroup_v2.bats), through the same library calls plugin/stepd.cpp and
// plugin/epilog.cpp make: what a node whose Slurm this machine cannot run (cgroup/v2, Slurm 25.05+)
// would do with Gantry's code, on the kernel's real cgroup2 hierarchy.
//
//   gantry-step-driver step --runtime DIR --image FILE --uid U --gid G --job J --task PID
//                           [--name NAME] [--scope job|global]
//     do_prepare's create for the job user (fuse backend, the job's shared image server), the record
//     of that server, then task_forked's placement against the task PID Slurm "placed", and
//     record_job_cgroups. Prints "holder PID", "server PID" and "ready", then stays, as slurmstepd
//     does until the step ends, until SIGTERM; a named container is left running for the epilog.
//   gantry-step-driver epilog --runtime DIR --job J
//     clean_up_job: the job's named containers (pyxis_J_*), its image servers, its cgroup leaves.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "gantry/launcher.hpp"
#include "gantry/run_request.hpp"
#include "gantry/strings.hpp"

using namespace gantry;

namespace {

int fail(const std::string& message) {
    std::fprintf(stderr, "gantry-step-driver: %s\n", message.c_str());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return fail("usage: gantry-step-driver step|epilog --OPTION VALUE...");
    std::string verb = argv[1];
    std::map<std::string, std::string> opt;
    for (int i = 2; i + 1 < argc; i += 2) opt[argv[i]] = argv[i + 1];
    auto need = [&](const char* key) -> std::string {
        auto it = opt.find(key);
        return it == opt.end() ? std::string() : it->second;
    };
    Config config;
    config.runtime_path = need("--runtime");
    if (config.runtime_path.empty()) return fail("--runtime DIR is required");
    config.mount_backend = "fuse";
    auto jobid = static_cast<uint32_t>(std::strtoul(need("--job").c_str(), nullptr, 10));

    if (verb == "epilog") {
        for (const auto& name : list_containers(config))
            if (starts_with(name, "pyxis_" + std::to_string(jobid) + "_"))
                if (auto c = Container::open(name, config)) (void)c->stop();
        int servers = end_job_image_servers(config, jobid);
        int leaves = end_job_cgroups(config, jobid);
        std::printf("servers %d\nleaves %d\n", servers, leaves);
        return 0;
    }
    if (verb != "step") return fail("unknown verb " + verb);

    RunRequest rq;
    rq.config = config;
    rq.uid = static_cast<uid_t>(std::strtoul(need("--uid").c_str(), nullptr, 10));
    rq.gid = static_cast<gid_t>(std::strtoul(need("--gid").c_str(), nullptr, 10));
    rq.image_path = need("--image");
    rq.image_source = ImageSource::store;
    rq.backend = MountBackend::fuse;
    std::string name = need("--name"), scope = need("--scope").empty() ? "job" : need("--scope");
    if (!name.empty()) name = scope == "job" ? "pyxis_" + std::to_string(jobid) + "_" + name : "pyxis_" + name;
    rq.name = name;
    rq.detach = !name.empty();
    auto task = static_cast<pid_t>(std::strtol(need("--task").c_str(), nullptr, 10));
    if (rq.image_path.empty() || task <= 0) return fail("--image FILE and --task PID are required");
    auto prepared = container_spec_for(std::move(rq));
    if (!prepared) return fail(prepared.error().message);
    char host[HOST_NAME_MAX + 1] = {};
    (void)::gethostname(host, sizeof host - 1);
    if (name.empty() || scope == "job")
        prepared->spec.fuse_server_scope = "job " + std::to_string(jobid) + " on " + host;
    auto created = Container::create(prepared->spec);
    if (!created) return fail(created.error().message);
    ContainerState state = created->state();
    if (!name.empty()) created->release();  // outlives the step; stopped by the job epilog
    if (auto recorded = record_job_image_server(config, jobid, state); !recorded) return fail(recorded.error().message);
    CgroupLevel level = name.empty() ? CgroupLevel::step : scope == "job" ? CgroupLevel::job : CgroupLevel::node;
    // As the plugin's task_post_fork and finish_step: planned now, carried out by a thread, waited for.
    CgroupPlacement placement;
    placement.start(task, state, level, config, jobid);
    for (const auto& placed : placement.finish())
        if (!placed) return fail(placed.error().message);
    std::printf("holder %d\nserver %d\nready\n", static_cast<int>(state.holder_pid),
                static_cast<int>(state.server_pid));
    std::fflush(stdout);
    // slurmstepd lives until the step ends: so does this stand-in, until SIGTERM. An unnamed
    // container's handle is then dropped, as the plugin's finish_step stops it.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    (void)::sigprocmask(SIG_BLOCK, &set, nullptr);
    int sig = 0;
    (void)::sigwait(&set, &sig);
    return 0;
}
