// Placing a container's holder in the cgroups of a Slurm step or job (proctrack/cgroup, task/cgroup,
// cgroup v1 and v2): the plugin creates the holder before the task exists, from slurmstepd, so the
// holder (and its fuse daemon) starts wherever slurmstepd is: on v1 outside the job, on cgroup/v2 in
// STEP/slurm, where slurmstepd sits during the SPANK callbacks. Left there, a holder would escape the
// step's kill on v1, and on v2 keep STEP populated after Slurm 25.05's cgroup.kill of STEP/user, which
// makes proctrack wait UnkillableStepTimeout and drain the node.
// So the places are decided from the kernel's account of a task Slurm has placed (/proc/TASK/cgroup),
// never from the job's or step's directory names (a 26.05 job directory is a SLUID): a step's holder
// goes into the task's own leaf, a job's processes into a leaf of Gantry's own in the job's directory
// (outside every step), ended by the job epilog with cgroup.kill (no pid to go stale, and right under
// namespace/linux, where the pids the plugin sees are not the epilog's).
// The fuse image server a job's containers share on a node (ContainerSpec::fuse_server_scope) goes
// there too, and is also recorded by pid (with the pid namespace the pid is a number of, which the
// epilog translates into its own view) in root's runtime directory so that the job's epilog ends it
// whatever the process tracking (linuxproc: no cgroups at all).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace launcher {

std::vector<CgroupHierarchy> parse_cgroup_mounts(std::string_view mountinfo) {
    std::vector<CgroupHierarchy> out;
    std::istringstream in{std::string(mountinfo)};
    std::string line;
    while (std::getline(in, line)) {
        auto dash = line.find(" - ");
        if (dash == std::string::npos) continue;
        std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
        std::string id, parent, devno;
        CgroupHierarchy m;
        std::string source, super;
        if (!(head >> id >> parent >> devno >> m.root >> m.point) || !(tail >> m.fstype >> source >> super)) continue;
        if (m.fstype != "cgroup" && m.fstype != "cgroup2") continue;
        if (m.point.find('\\') != std::string::npos) continue;  // escaped characters: not a standard mount
        m.options = split_list(super, ',');
        out.push_back(std::move(m));
    }
    return out;
}

namespace {

// "/a/b/c" -> "/a/b"; "/a" -> "/"; "/" -> "".
std::string parent_of(const std::string& path) {
    if (path == "/" || path.empty()) return {};
    auto slash = path.rfind('/');
    return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
    return path.substr(path.rfind('/') + 1);
}

std::string child_of(const std::string& dir, const std::string& name) {
    return dir == "/" ? "/" + name : dir + "/" + name;
}

// "/slurm_n1/uid_5/job_7/step_0/task_1" cut after the component starting with `level` ("job_"); ""
// when there is none. cgroup/v1 only: its job cgroup is always job_ID.
std::string cut_at(const std::string& path, const std::string& level) {
    size_t pos = path.find("/" + level);
    if (pos == std::string::npos) return {};
    return path.substr(0, path.find('/', pos + 1));
}

// The hierarchy mounted for a /proc/PID/cgroup line's controllers ("" = the unified one), holding `path`.
const CgroupHierarchy* hierarchy_for(const std::vector<CgroupHierarchy>& mounts, const std::string& controllers,
                                     const std::string& path) {
    for (const auto& m : mounts) {
        bool match = controllers.empty() ? m.fstype == "cgroup2" : m.fstype == "cgroup";
        for (const auto& c : split_list(controllers, ','))
            if (std::find(m.options.begin(), m.options.end(), c) == m.options.end()) match = false;
        if (match && (m.root == "/" || path == m.root || starts_with(path, m.root + "/"))) return &m;
    }
    return nullptr;
}

}  // namespace

std::vector<CgroupTarget> cgroup_targets(std::string_view task_cgroups, const std::vector<CgroupHierarchy>& mounts,
                                         CgroupLevel level) {
    std::vector<launcher::CgroupTarget> out;
    std::istringstream in{std::string(task_cgroups)};
    std::string line;
    while (std::getline(in, line)) {
        auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
        if (c1 == std::string::npos || c2 == std::string::npos) continue;
        std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
        std::string task = line.substr(c2 + 1);
        if (task.empty() || task[0] != '/') continue;
        bool unified = line.substr(0, c1) == "0" && controllers.empty();
        CgroupTarget t;
        t.unified = unified;
        if (level == CgroupLevel::step) {
            t.path = task;
        } else if (unified) {
            // Slurm's cgroup/v2 layout (22.05 to 26.05): JOB/STEP/user/TASK, JOB being job_ID or a
            // SLUID. Only the shape is relied on: a task in a directory called "user", two levels
            // below the job's directory.
            std::string user = parent_of(task), step = parent_of(user), job = parent_of(step);
            if (base_of(user) != "user" || job.empty() || job == "/") continue;
            std::string dir = level == CgroupLevel::job ? job : parent_of(job);
            if (dir.empty()) continue;
            t.path = child_of(dir, "gantry");
            t.make_leaf = true;
        } else if (level == CgroupLevel::job) {
            t.path = cut_at(task, "job_");
        }
        if (t.path.empty()) continue;
        const CgroupHierarchy* m = hierarchy_for(mounts, controllers, t.path);
        if (m == nullptr) continue;
        std::string rel = m->root == "/" ? t.path : t.path.substr(m->root.size());
        t.dir = m->point + (rel == "/" ? "" : rel);
        out.push_back(std::move(t));
    }
    return out;
}

}  // namespace launcher

namespace {

std::string read_small(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

Status write_pid(const std::string& procs, pid_t pid) {
    UniqueFd fd(::open(procs.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return system_error("opening " + procs);
    std::string text = std::to_string(pid);
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return system_error("moving process " + text + " into " + procs);
    return {};
}

// A field of /proc/PID/status ("Uid:", "PPid:"): its first number, -1 when the process is gone.
long status_field(pid_t pid, const char* name) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (starts_with(line, name)) {
            std::istringstream fields(line.substr(std::string_view(name).size()));
            long value = -1;
            if (fields >> value && value >= 0) return value;
        }
    return -1;
}

uid_t real_uid_of(pid_t pid) {
    long uid = status_field(pid, "Uid:");
    return uid < 0 ? static_cast<uid_t>(-1) : static_cast<uid_t>(uid);
}

// The children of `leader` (its main thread's), as listed now: each is checked again when it is moved.
std::vector<pid_t> children_of(pid_t leader) {
    std::vector<pid_t> out;
    std::ifstream kids("/proc/" + std::to_string(leader) + "/task/" + std::to_string(leader) + "/children");
    for (pid_t p; kids >> p;) out.push_back(p);
    return out;
}

bool has_exited(int pidfd) {
    struct pollfd p {
        pidfd, POLLIN, 0
    };
    return ::poll(&p, 1, 0) != 0;  // readable (or an error) once the process has ended
}

// Writes `pid` into `procs` only while it is the process `is_it` recognises. The pidfd is taken first,
// so a pidfd that has not ended after `is_it` proves `is_it` looked at the process the pidfd names; it
// is checked again right before the write and once more after it: a process that ended in between
// (and whose pid may have been reused by the time of the write) is reported, never taken for a move.
template <typename Check>
Status move_process(const std::string& procs, pid_t pid, Check is_it, const std::string& what) {
    UniqueFd fd(launcher::open_pidfd(pid));
    if (!fd || !is_it() || has_exited(fd.get())) return make_error(what + " is gone");
    Status moved = write_pid(procs, pid);
    if (has_exited(fd.get())) return make_error(what + " ended while it was moved into " + procs);
    return moved;
}

// Makes Gantry's leaf (root, in the Slurm-managed cgroup tree): the directory the kernel names a
// cgroup; its files belong to root, so no user can move processes in or out. EEXIST: made before,
// by an earlier step or job of this node.
Status make_leaf(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return system_error("creating cgroup " + dir);
    struct stat sb {};
    if (::lstat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) return make_error(dir + " is not a cgroup directory");
    return {};
}

// Where one process (the leader) and its children go: the cgroups `level` names for `model`, read from
// the kernel now (plan_move), and moved there later (carry_out), possibly by another thread.
struct PlannedMove {
    std::vector<launcher::CgroupTarget> targets;
    pid_t leader = 0;
    unsigned long long leader_start = 0;
    uid_t owner = static_cast<uid_t>(-1);
    std::string what;
};

// A task's cgroups as the kernel lists them (/proc/MODEL/cgroup) and the cgroup mounts, read once for
// every target computed from them (targets_of).
struct TaskCgroups {
    std::string lines;
    std::vector<launcher::CgroupHierarchy> mounts;
};

Result<TaskCgroups> task_cgroups_of(pid_t model) {
    TaskCgroups t;
    t.lines = read_small("/proc/" + std::to_string(model) + "/cgroup");
    if (t.lines.empty()) return system_error("reading the cgroups of process " + std::to_string(model));
    t.mounts = launcher::parse_cgroup_mounts(read_small("/proc/self/mountinfo"));
    return t;
}

std::vector<launcher::CgroupTarget> targets_of(const TaskCgroups& t, CgroupLevel level) {
    return launcher::cgroup_targets(t.lines, t.mounts, level);
}

PlannedMove plan_move(std::vector<launcher::CgroupTarget> targets, pid_t leader, unsigned long long leader_start,
                      uid_t owner, const std::string& what) {
    PlannedMove plan;
    plan.targets = std::move(targets);
    plan.leader = leader;
    plan.leader_start = leader_start;
    plan.owner = owner;
    plan.what = what;
    return plan;
}

// The leader (checked to be the one recorded, by start time and, with `owner`, real uid) and its
// children (checked to be its children) into the planned cgroups; each is held by a pidfd from before
// its check until after its write (move_process). A child that ended meanwhile is passed over; the
// leader gone ends the move. Only system calls and reads of /proc: safe in a thread of slurmstepd,
// which forks tasks meanwhile (no lock of ours is held across them).
Status carry_out(const PlannedMove& plan) {
    Status result;
    auto keep_first = [&](Status st) {
        if (!st && result) result = std::move(st);
    };
    const pid_t leader = plan.leader;
    for (const auto& t : plan.targets) {
        if (t.make_leaf) {
            if (auto made = make_leaf(t.dir); !made) {
                keep_first(std::move(made));
                continue;
            }
        }
        auto is_leader = [&] {
            return launcher::process_start_time(leader) == plan.leader_start &&
                   (plan.owner == static_cast<uid_t>(-1) || real_uid_of(leader) == plan.owner);
        };
        if (auto moved = move_process(t.dir + "/cgroup.procs", leader, is_leader, plan.what); !moved) {
            if (!is_leader()) return moved;
            keep_first(std::move(moved));
        }
        // Children forked from now on start in the new cgroup; the ones from before follow, each by
        // pidfd while it is still the leader's child and the leader still the one recorded.
        for (pid_t child : children_of(leader)) {
            auto is_child = [&] { return is_leader() && status_field(child, "PPid:") == leader; };
            if (auto moved = move_process(t.dir + "/cgroup.procs", child, is_child,
                                          plan.what + "'s child " + std::to_string(child));
                !moved && is_child())
                keep_first(std::move(moved));
        }
    }
    return result;
}

Status move_into_cgroups_of(pid_t model, CgroupLevel level, pid_t leader, unsigned long long leader_start, uid_t owner,
                            const std::string& what) {
    auto cgroups = task_cgroups_of(model);
    if (!cgroups) return cgroups.error();
    return carry_out(plan_move(targets_of(*cgroups, level), leader, leader_start, owner, what));
}

}  // namespace

Status place_in_cgroups_of(pid_t model, const ContainerState& state, CgroupLevel level) {
    // Privileged (root, slurmstepd's task_post_fork hook): moves the holder and its children (the fuse
    // daemon) into the cgroups of a task Slurm has just placed. Safe: the cgroups are the kernel's
    // account of that task (/proc/MODEL/cgroup, read before the task may run any code of the user's:
    // Slurm holds it until every post-fork hook returned), their files are under the cgroup mounts
    // the kernel lists, nothing comes from the user; the pid is our holder's, its start time checked
    // right before (a reused pid is left alone), its children checked to be its children. Moving a
    // process into the task's own cgroup, or into Gantry's leaf in the job's (or, for a node-wide
    // container, beside the jobs'), only subjects it to limits and an end; the leaf is made by root in
    // root's cgroup tree, under a path computed from the kernel's lines, never from the user's input.
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
std::string job_servers_file_in(const std::string& runtime, uint32_t jobid) {
    return runtime + "/servers/job_" + std::to_string(jobid);
}

std::string job_servers_file(const Config& config, uint32_t jobid) {
    return job_servers_file_in(runtime_dir(config), jobid);
}

Status append_record(const std::string& path, const std::string& line) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) return system_error("opening " + path);
    if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        return system_error("writing " + path);
    return {};
}
}  // namespace

Status record_job_image_server(const Config& config, uint32_t jobid, const ContainerState& state) {
    // Privileged (root, the plugin's init_post_opt): appends "PID START UID PIDNS" to a file in root's
    // runtime directory (made 0700 here, never a user's path; O_NOFOLLOW). Only numbers go in: the
    // pid our holder found serving it, its start time, the container's owner, and the pid namespace
    // the pid is a number of (the job's own under namespace/linux, not the epilog's).
    if (state.server_pid <= 0) return {};
    GANTRY_TRY(launcher::ensure_own_dir(runtime_dir(config) + "/servers", 0700, true, "the image servers' directory"));
    unsigned long long pidns = state.pid_namespace != 0 ? state.pid_namespace : launcher::own_pid_namespace();
    return append_record(job_servers_file(config, jobid),
                         std::to_string(state.server_pid) + " " + std::to_string(state.server_start_time) + " " +
                             std::to_string(state.uid) + " " + std::to_string(pidns) + "\n");
}

int end_job_image_servers(const Config& config, uint32_t jobid) {
    // Privileged (root, the job epilog): SIGKILLs each server recorded for the job that is still that
    // process: its pid translated from the recorded pid namespace into ours (the job's namespace
    // under namespace/linux), a pidfd taken, then its start time and real uid compared with the
    // record, so a pid reused since is never signalled. The server's FUSE daemon dies with it
    // (PR_SET_PDEATHSIG) and the mount with its namespace. The record is root's own file
    // (record_job_image_server); a line of three numbers is from before the namespace was recorded.
    std::string path = job_servers_file(config, jobid);
    std::ifstream in(path);
    if (!in) return 0;
    std::set<std::tuple<long, unsigned long long, long, unsigned long long>> servers;
    for (std::string line; servers.size() < 4096 && std::getline(in, line);) {
        std::istringstream fields(line);
        long pid = 0, uid = 0;
        unsigned long long start = 0, pidns = 0;
        if (!(fields >> pid >> start >> uid)) continue;
        if (!(fields >> pidns)) pidns = 0;
        servers.insert({pid, start, uid, pidns});
    }
    in.close();
    ::unlink(path.c_str());
    int killed = 0;
    for (const auto& [p, t, u, ns] : servers) {
        if (p <= 0) continue;
        auto server = launcher::pid_in_own_view(static_cast<pid_t>(p), ns);
        if (server <= 1) continue;
        UniqueFd fd(launcher::open_pidfd(server));
        if (!fd) continue;
        if (launcher::process_start_time(server) != t || real_uid_of(server) != static_cast<uid_t>(u)) continue;
        if (launcher::signal_pidfd(fd.get(), SIGKILL) == 0) ++killed;
    }
    return killed;
}

namespace {
Status record_job_cgroup_targets(const std::string& runtime, uint32_t jobid,
                                 const std::vector<launcher::CgroupTarget>& targets) {
    std::string lines;
    for (const auto& t : targets) {
        struct stat sb {};
        if (t.make_leaf && ::lstat(t.dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) lines += t.dir + "\n";
    }
    if (lines.empty()) return {};
    GANTRY_TRY(launcher::ensure_own_dir(runtime + "/servers", 0700, true, "the image servers' directory"));
    return append_record(job_servers_file_in(runtime, jobid) + ".cgroups", lines);
}
}  // namespace

Status record_job_cgroups(const Config& config, uint32_t jobid, pid_t model) {
    // Privileged (root, task_post_fork), like record_job_image_server: notes the job's own leaf (the
    // path computed from the task's cgroups, as place_in_cgroups_of does; only once it exists) in
    // root's 0700 runtime directory, for the epilog. Nothing in it comes from the user.
    auto cgroups = task_cgroups_of(model);
    if (!cgroups) return {};  // nothing to note for a task whose cgroups cannot be read
    return record_job_cgroup_targets(runtime_dir(config), jobid, targets_of(*cgroups, CgroupLevel::job));
}

namespace {

bool cgroup_populated(int dirfd) {
    UniqueFd fd(::openat(dirfd, "cgroup.events", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return false;
    char buf[256];
    ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
    if (n <= 0) return false;
    buf[n] = '\0';
    return std::string_view(buf, static_cast<size_t>(n)).find("populated 1") != std::string_view::npos;
}

std::vector<long> cgroup_pids(int dirfd) {
    std::vector<long> out;
    UniqueFd procs(::openat(dirfd, "cgroup.procs", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!procs) return out;
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(procs.get(), buf, sizeof buf)) > 0 && text.size() < (1u << 20);)
        text.append(buf, static_cast<size_t>(n));
    std::istringstream in(text);
    for (long pid = 0; in >> pid;) out.push_back(pid);
    return out;
}

// Ends every process in the cgroup open at `dirfd`: cgroup.kill (Linux 5.14), else SIGKILL by pidfd to
// each process cgroup.procs lists, signalled only if the cgroup still lists it once the pidfd is held
// (a pid reused in between would not be in this cgroup: only root moves processes into it).
void kill_cgroup(int dirfd) {
    if (UniqueFd kill(::openat(dirfd, "cgroup.kill", O_WRONLY | O_NOFOLLOW | O_CLOEXEC)); kill) {
        if (::write(kill.get(), "1", 1) == 1) return;
    }
    for (long pid : cgroup_pids(dirfd)) {
        if (pid <= 1) continue;
        UniqueFd fd(launcher::open_pidfd(static_cast<pid_t>(pid)));
        if (!fd) continue;
        auto now = cgroup_pids(dirfd);
        if (std::find(now.begin(), now.end(), pid) != now.end()) (void)launcher::signal_pidfd(fd.get(), SIGKILL);
    }
}

}  // namespace

int end_job_cgroups(const Config& config, uint32_t jobid, int deadline_ms) {
    // Privileged (root, the job epilog): kills what is left in the job's own leaves and removes them.
    // Safe: the paths come from root's own record (record_job_cgroups, a 0700 directory, O_NOFOLLOW),
    // each is checked again to be a directory named "gantry" on a cgroup2 mount the kernel lists, and
    // opened without following symlinks; what is killed is what the kernel counts in that cgroup, which
    // only root can move processes into. The wait has a deadline; a leaf still busy then is kept in
    // the record (the next epilog of that job id on this node retries) and reported in the log.
    std::string path = job_servers_file(config, jobid) + ".cgroups";
    std::ifstream in(path);
    if (!in) return 0;
    std::set<std::string> dirs;
    for (std::string line; dirs.size() < 64 && std::getline(in, line);)
        if (!line.empty()) dirs.insert(line);
    in.close();
    auto mounts = launcher::parse_cgroup_mounts(read_small("/proc/self/mountinfo"));
    auto on_cgroup2 = [&](const std::string& dir) {
        for (const auto& m : mounts)
            if (m.fstype == "cgroup2" && starts_with(dir, m.point + "/")) return true;
        return false;
    };
    std::string kept;
    int removed = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
    for (const auto& dir : dirs) {
        if (dir.size() < 7 || dir.substr(dir.size() - 7) != "/gantry" || !on_cgroup2(dir)) continue;
        UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!fd) continue;  // gone already
        kill_cgroup(fd.get());
        while (cgroup_populated(fd.get()) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (::rmdir(dir.c_str()) != 0) {
            log::warning("ending job " + std::to_string(jobid) + "'s processes in " + dir + ": " +
                         (cgroup_populated(fd.get()) ? "still populated after the deadline" : std::strerror(errno)));
            kept += dir + "\n";
            continue;
        }
        ++removed;
        // Slurm's removal of the job's directory failed while the leaf was in it: remove it now if it is
        // empty (rmdir of a cgroup with children or processes fails and changes nothing).
        auto slash = dir.rfind('/');
        (void)::rmdir(dir.substr(0, slash).c_str());
    }
    ::unlink(path.c_str());
    if (!kept.empty()) (void)append_record(path, kept);
    return removed;
}

// CgroupPlacement (launcher.hpp): the plans are made by the caller's thread, before it returns to
// Slurm (the task's cgroups read while Slurm holds the task: the same reads, and so the same safety
// argument, as place_in_cgroups_of's); only carry_out runs in the thread.
struct CgroupPlacement::Impl {
    // Each move with the context its failure is reported in.
    std::vector<std::pair<std::string, Result<PlannedMove>>> plans;
    std::vector<Status> results;
    // Then the job's own leaf, once made, noted for the epilog (record_job_cgroups) when jobid is set.
    std::string runtime;
    uint32_t jobid = 0;
    std::vector<launcher::CgroupTarget> job_targets;
    pthread_t thread{};
    pid_t creator = 0;

    static void* run(void* self) {
        auto* impl = static_cast<Impl*>(self);
        for (const auto& [context, plan] : impl->plans) {
            Status moved = plan ? carry_out(*plan) : Status(plan.error());
            impl->results.push_back(moved ? moved : Status(moved.error().wrap(context)));
        }
        if (impl->jobid != 0) {
            Status recorded = record_job_cgroup_targets(impl->runtime, impl->jobid, impl->job_targets);
            impl->results.push_back(recorded ? recorded : Status(recorded.error().wrap("recording the job's cgroup")));
        }
        return nullptr;
    }
};

CgroupPlacement::~CgroupPlacement() {
    if (impl_ != nullptr && impl_->creator == ::getpid()) (void)finish();
}

void CgroupPlacement::start(pid_t model, const ContainerState& state, CgroupLevel level, const Config& config,
                            uint32_t jobid) {
    if (impl_ != nullptr) return;
    auto impl = std::make_unique<Impl>();
    impl->creator = ::getpid();
    // The task's cgroups read once, for every target below.
    auto cgroups = task_cgroups_of(model);
    auto plan = [&](CgroupLevel at, pid_t leader, unsigned long long start, uid_t owner,
                    const std::string& what) -> Result<PlannedMove> {
        if (!cgroups) return cgroups.error();
        return plan_move(targets_of(*cgroups, at), leader, start, owner, what);
    };
    impl->plans.emplace_back(
        "placing the container holder in the step's cgroups",
        plan(level, state.holder_pid, state.holder_start_time, static_cast<uid_t>(-1), "the container's holder"));
    if (state.server_pid > 0)
        impl->plans.emplace_back("placing the job's image server in the job's cgroups",
                                 plan(CgroupLevel::job, state.server_pid, state.server_start_time, state.uid,
                                      "the container's image server"));
    if (jobid != 0 && cgroups) {
        impl->runtime = runtime_dir(config);
        impl->jobid = jobid;
        impl->job_targets = targets_of(*cgroups, CgroupLevel::job);
    }
    if (::pthread_create(&impl->thread, nullptr, &Impl::run, impl.get()) != 0) {
        Impl::run(impl.get());  // no thread to be had: here and now, as before
        impl->thread = {};
        impl->creator = -1;  // nothing to join
    }
    impl_ = impl.release();
}

std::vector<Status> CgroupPlacement::finish(std::chrono::milliseconds limit) {
    // Only the process that started it has the thread: a task forked meanwhile has a copy of this
    // object but not of the thread, and must neither join nor free what it does not own.
    if (impl_ == nullptr) return {};
    Impl* impl = impl_;
    if (impl->creator != -1 && impl->creator != ::getpid()) return {};
    impl_ = nullptr;
    if (impl->creator != -1) {
        // A bounded wait, as every wait of root's: cgroup writes do not block for long, but a thread
        // still in one at the limit is left to finish on its own (its memory with it).
        timespec until{};
        ::clock_gettime(CLOCK_REALTIME, &until);
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
        until.tv_sec += static_cast<time_t>(ns / 1000000000);
        until.tv_nsec += static_cast<long>(ns % 1000000000);
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec += 1;
            until.tv_nsec -= 1000000000;
        }
        if (::pthread_timedjoin_np(impl->thread, nullptr, &until) != 0) {
            ::pthread_detach(impl->thread);
            return {make_error("moving the container's processes into the task's cgroups took over " +
                               std::to_string(limit.count()) + " ms; left to finish on its own")};
        }
    }
    std::vector<Status> out = std::move(impl->results);
    delete impl;
    return out;
}

}  // namespace gantry
