// Placing a container's holder in the cgroups of a Slurm step or job (proctrack/cgroup, task/cgroup):
// the plugin creates the holder before slurmstepd makes the step's cgroups, so the holder (and its
// fuse daemon) would otherwise stay in slurmd's cgroup, outside the job's accounting and limits and
// outside the end-of-step kill. A task, once Slurm has placed it, shows the right cgroups.
// The fuse image server a job's containers share on a node (ContainerSpec::fuse_server_scope) goes
// into the job's cgroups, and is recorded in root's runtime directory so that the job's epilog
// ends it whatever the process tracking (linuxproc, cgroup v2: a job cgroup takes no process).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

struct CgroupMount {
    std::string root, point, fstype;
    std::vector<std::string> options;  // super options: the v1 controllers, name=...
};

std::vector<CgroupMount> cgroup_mounts() {
    std::vector<CgroupMount> out;
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        auto dash = line.find(" - ");
        if (dash == std::string::npos) continue;
        std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
        std::string id, parent, devno;
        CgroupMount m;
        std::string source, super;
        if (!(head >> id >> parent >> devno >> m.root >> m.point) || !(tail >> m.fstype >> source >> super)) continue;
        if (m.fstype != "cgroup" && m.fstype != "cgroup2") continue;
        if (m.point.find('\\') != std::string::npos) continue;  // escaped characters: not a standard mount
        m.options = split_list(super, ',');
        out.push_back(std::move(m));
    }
    return out;
}

// "/slurm_n1/uid_5/job_7/step_0/task_1" cut after the component starting with `level` ("step_",
// "job_"); "" when there is none (a hierarchy Slurm does not manage).
std::string cut_at(const std::string& path, const std::string& level) {
    size_t pos = path.find("/" + level);
    if (pos == std::string::npos) return {};
    return path.substr(0, path.find('/', pos + 1));
}

Status write_pid(const std::string& procs, pid_t pid) {
    UniqueFd fd(::open(procs.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return system_error("opening " + procs);
    std::string text = std::to_string(pid);
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return system_error("moving process " + text + " into " + procs);
    return {};
}

// The real uid of a process (/proc/PID/status "Uid:"), -1 when it is gone.
uid_t real_uid_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (starts_with(line, "Uid:")) {
            std::istringstream fields(line.substr(4));
            long uid = -1;
            if (fields >> uid && uid >= 0) return static_cast<uid_t>(uid);
        }
    return static_cast<uid_t>(-1);
}

// One process (the leader: checked to be the one recorded, by start time and, with `owner`, real
// uid, right before each write) and its children, into the cgroups of `model` cut at `level`.
Status move_into_cgroups_of(pid_t model, CgroupLevel level, pid_t leader, unsigned long long leader_start, uid_t owner,
                            const std::string& what) {
    std::string prefix = level == CgroupLevel::step ? "step_" : "job_";
    auto mounts = cgroup_mounts();
    std::vector<pid_t> pids = {leader};
    std::ifstream kids("/proc/" + std::to_string(leader) + "/task/" + std::to_string(leader) + "/children");
    for (pid_t p; kids >> p;) pids.push_back(p);
    std::ifstream in("/proc/" + std::to_string(model) + "/cgroup");
    if (!in) return system_error("reading the cgroups of process " + std::to_string(model));
    std::string line;
    Status result;
    while (std::getline(in, line)) {
        auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
        if (c1 == std::string::npos || c2 == std::string::npos) continue;
        std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
        std::string target = cut_at(line.substr(c2 + 1), prefix);
        if (target.empty()) continue;
        const CgroupMount* mount = nullptr;
        for (const auto& m : mounts) {
            bool match = controllers.empty() ? m.fstype == "cgroup2" : m.fstype == "cgroup";
            for (const auto& c : split_list(controllers, ','))
                if (std::find(m.options.begin(), m.options.end(), c) == m.options.end()) match = false;
            if (match && (m.root == "/" || starts_with(target, m.root + "/"))) {
                mount = &m;
                break;
            }
        }
        if (mount == nullptr) continue;
        std::string dir = mount->point + (mount->root == "/" ? target : target.substr(mount->root.size()));
        for (pid_t p : pids) {
            if (p == leader && (launcher::process_start_time(p) != leader_start ||
                                (owner != static_cast<uid_t>(-1) && real_uid_of(p) != owner)))
                return make_error(what + " is gone");
            auto st = write_pid(dir + "/cgroup.procs", p);
            if (!st && result) result = st;
        }
    }
    return result;
}

}  // namespace

Status place_in_cgroups_of(pid_t model, const ContainerState& state, CgroupLevel level) {
    // Privileged (root, slurmstepd's task_post_fork hook): moves the holder and its children (the fuse
    // daemon) into the cgroups of a task Slurm has just placed. Safe: the cgroups are the kernel's
    // account of that task (/proc/MODEL/cgroup, read before the task may run any code of the user's:
    // Slurm holds it until every post-fork hook returned), their files are under the cgroup mounts
    // the kernel lists, nothing comes from the user; the pid is our holder's, its start time checked
    // right before (a reused pid is left alone). Moving a process into the job's own cgroup only
    // subjects it to the job's limits and end.
    return move_into_cgroups_of(model, level, state.holder_pid, state.holder_start_time, static_cast<uid_t>(-1),
                                "the container's holder");
}

Status place_image_server_in_job_cgroups(pid_t model, const ContainerState& state) {
    // Privileged (root, task_post_fork), as above: the job's cgroups of a task Slurm has just placed.
    // The pid is the one our holder found serving it (the peer of its connection, a process of the
    // job user), checked right before each write to be that process still (start time) and the job
    // user's (real uid): at worst the user has us move another process of theirs into their own job.
    if (state.server_pid <= 0) return {};
    return move_into_cgroups_of(model, CgroupLevel::job, state.server_pid, state.server_start_time, state.uid,
                                "the container's image server");
}

namespace {
std::string job_servers_file(const Config& config, uint32_t jobid) {
    return runtime_dir(config) + "/servers/job_" + std::to_string(jobid);
}
}  // namespace

Status record_job_image_server(const Config& config, uint32_t jobid, const ContainerState& state) {
    // Privileged (root, the plugin's init_post_opt): appends "PID START UID" to a file in root's
    // runtime directory (made 0700 here, never a user's path; O_NOFOLLOW). Only numbers go in: the
    // pid our holder found serving it, its start time, the container's owner.
    if (state.server_pid <= 0) return {};
    GANTRY_TRY(launcher::ensure_own_dir(runtime_dir(config) + "/servers", 0700, true, "the image servers' directory"));
    std::string path = job_servers_file(config, jobid);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) return system_error("opening " + path);
    std::string line = std::to_string(state.server_pid) + " " + std::to_string(state.server_start_time) + " " +
                       std::to_string(state.uid) + "\n";
    if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        return system_error("writing " + path);
    return {};
}

int end_job_image_servers(const Config& config, uint32_t jobid) {
    // Privileged (root, the job epilog): SIGKILLs each server recorded for the job that is still that
    // process: a pidfd taken first, then its start time and real uid compared with the record, so a
    // pid reused since is never signalled. The server's FUSE daemon dies with it (PR_SET_PDEATHSIG)
    // and the mount with its namespace. The record is root's own file (record_job_image_server).
    std::string path = job_servers_file(config, jobid);
    std::ifstream in(path);
    if (!in) return 0;
    std::set<std::tuple<long, unsigned long long, long>> servers;
    long pid = 0, uid = 0;
    unsigned long long start = 0;
    while (servers.size() < 4096 && in >> pid >> start >> uid) servers.insert({pid, start, uid});
    in.close();
    ::unlink(path.c_str());
    int killed = 0;
    for (const auto& [p, t, u] : servers) {
        if (p <= 1) continue;
        UniqueFd fd(launcher::open_pidfd(static_cast<pid_t>(p)));
        if (!fd) continue;
        auto server = static_cast<pid_t>(p);
        if (launcher::process_start_time(server) != t || real_uid_of(server) != static_cast<uid_t>(u)) continue;
        if (launcher::signal_pidfd(fd.get(), SIGKILL) == 0) ++killed;
    }
    return killed;
}

}  // namespace gantry
