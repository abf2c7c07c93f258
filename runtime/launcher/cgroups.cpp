// Placing a container's holder in the cgroups of a Slurm step or job (proctrack/cgroup, task/cgroup):
// the plugin creates the holder before slurmstepd makes the step's cgroups, so the holder (and its
// fuse daemon) would otherwise stay in slurmd's cgroup, outside the job's accounting and limits and
// outside the end-of-step kill. A task, once Slurm has placed it, shows the right cgroups.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
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

}  // namespace

Status place_in_cgroups_of(pid_t model, const ContainerState& state, CgroupLevel level) {
    // Privileged (root, slurmstepd's task_post_fork hook): moves the holder and its children (the fuse
    // daemon) into the cgroups of a task Slurm has just placed. Safe: the cgroups are the kernel's
    // account of that task (/proc/MODEL/cgroup, read before the task may run any code of the user's:
    // Slurm holds it until every post-fork hook returned), their files are under the cgroup mounts
    // the kernel lists, nothing comes from the user; the pid is our holder's, its start time checked
    // right before (a reused pid is left alone). Moving a process into the job's own cgroup only
    // subjects it to the job's limits and end.
    std::string prefix = level == CgroupLevel::step ? "step_" : "job_";
    auto mounts = cgroup_mounts();
    std::vector<pid_t> pids = {state.holder_pid};
    std::ifstream kids("/proc/" + std::to_string(state.holder_pid) + "/task/" + std::to_string(state.holder_pid) +
                       "/children");
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
            if (p == state.holder_pid && launcher::process_start_time(p) != state.holder_start_time)
                return make_error("the container's holder is gone");
            auto st = write_pid(dir + "/cgroup.procs", p);
            if (!st && result) result = st;
        }
    }
    return result;
}

}  // namespace gantry
