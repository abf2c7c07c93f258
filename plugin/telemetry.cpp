// Start-up telemetry in the plugin (plugin/telemetry.hpp). The moment of the first exec is the first
// task's own: Slurm forks every task of the node, runs task_post_fork in slurmstepd for each, then
// releases them to task_init and execve. A pipe made before the forks is inherited by every task;
// the first task to reach the end of task_init writes one byte into it, and a thread of slurmstepd,
// waiting on the other end since task_post_fork, takes that as the first exec and writes the record.
#include "telemetry.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gantry/environment.hpp"
#include "gantry/image_config.hpp"
#include "gantry/log.hpp"
#include "gantry/telemetry.hpp"
#include "options.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {
namespace {

// "<srun's start, Unix ns> [<its resolve of the tag, ns>]": set by srun, read by every node. The job's
// environment is the user's, so these two figures of a record are the user's word (docs/admin.md);
// everything else in it is measured by root on the node.
constexpr const char* kSrunTimesVar = "GANTRY_SRUN_TIMES";
// How long slurmstepd waits for a first exec after the tasks were forked.
constexpr int kExecWaitSeconds = 600;

struct StartWatch {
    telemetry::StartRecord record;
    std::string dir;
    std::optional<int64_t> ready_ns;       // the container was ready (prepare_step's end)
    std::optional<int64_t> srun_start_ns;  // Unix time
    std::string outcome;
    UniqueFd read_end, write_end;
    ino_t pipe_ino = 0;
    std::thread waiter;
    std::atomic<bool> stop{false};
};
// Never destroyed: a thread still waiting when slurmstepd exits must not meet ~thread (std::terminate).
StartWatch& watch() {
    static auto* w = new StartWatch;
    return *w;
}

std::optional<double> ms(std::optional<int64_t> from, std::optional<int64_t> to) {
    if (!from || !to || *to < *from) return std::nullopt;
    return static_cast<double>(*to - *from) / 1e6;
}

std::string user_name(uid_t uid) {
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr && found->pw_name != nullptr)
        return found->pw_name;
    return std::to_string(uid);
}

std::string node_name(const std::vector<std::string>& env) {
    // slurmd's name for this node where slurmstepd has it in the job's environment; else the host's.
    if (auto n = find_env(env, "SLURMD_NODENAME"); n && !n->empty()) return *n;
    char host[256] = {};
    (void)::gethostname(host, sizeof host - 1);
    std::string h = host;
    return h.substr(0, h.find('.'));
}

// The thread: waits for the first task's byte (or for every task to be gone, or the deadline, or the
// step's end), then writes the record. Root's wait has an end: kExecWaitSeconds and the stop flag.
void wait_for_first_exec(StartWatch& w) {
    const int64_t deadline = telemetry::monotonic_ns() + int64_t{kExecWaitSeconds} * 1000000000;
    bool execd = false;
    while (!w.stop.load() && telemetry::monotonic_ns() < deadline) {
        pollfd p{w.read_end.get(), POLLIN, 0};
        int r = ::poll(&p, 1, 200);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        if (r == 0) continue;
        char byte = 0;
        execd = (p.revents & POLLIN) != 0 && ::read(w.read_end.get(), &byte, 1) == 1;
        break;  // a byte, or every task gone without one (POLLHUP)
    }
    const int64_t now = telemetry::monotonic_ns();
    w.read_end.reset();
    auto& r = w.record;
    if (execd) {
        r.exec_ms = ms(w.ready_ns, now);
        r.total_ms = ms(telemetry::first_point("prepare_step +"), now);
        if (w.srun_start_ns) r.since_srun_ms = ms(w.srun_start_ns, telemetry::unix_ns_of(now));
    }
    if (auto written = telemetry::write_record(w.dir, r); !written)
        log::warning("start-up telemetry not written: " + written.error().message);
}

}  // namespace

void record_start_points() {
    telemetry::record();
}

void hand_srun_times() {
    unset_environment_variable(kSrunTimesVar);
    auto start = telemetry::first_point("srun init");
    if (!start) return;
    std::string value = std::to_string(telemetry::unix_ns_of(*start));
    auto from = telemetry::first_point("srun pin_image_digest +");
    auto to = telemetry::last_point("srun pin_image_digest -");
    // Only when srun did resolve a tag for the step (kResolvedVar): otherwise the nodes resolve it, in their pull.
    if (from && to && *to >= *from && environment().gantry_resolved_image.set)
        value += " " + std::to_string(*to - *from);
    set_environment_variable(kSrunTimesVar, value);
}

void note_image_outcome(const std::string& outcome) {
    watch().outcome = outcome;
}

void start_record_armed(spank_t sp) {
    StepState& st = state();
    StartWatch& w = watch();
    if (st.config.telemetry_dir.empty() || !st.error.empty() || st.run_on_host || st.joined.holder_pid <= 0) return;
    auto begun = telemetry::first_point("prepare_step +");
    auto created = telemetry::last_point("Container::create -");
    w.ready_ns = telemetry::last_point("prepare_step -");
    // Only a step that made its container here (not one that joined a named container).
    if (!begun || !created || *created < *begun || !w.ready_ns || !options().image) return;
    auto id = identity(sp);
    if (!id) return;
    const std::vector<std::string> env = job_environment(sp);
    auto& r = w.record;
    r.job = id->jobid;
    r.step = id->stepid;
    r.uid = id->uid;
    r.user = user_name(id->uid);
    r.node = node_name(env);
    r.image = *options().image;
    r.digest = st.digest;
    r.outcome = telemetry::parse_outcome(w.outcome);
    r.start_unix_ms = telemetry::unix_ns_of(*begun) / 1000000;
    // The end of whichever ran: a pull, or (a stored, pinned image) the user's helper acquiring it.
    std::optional<int64_t> pulled;
    for (const char* phase : {kPhasePullAsUser, kPhasePullTrusted, kPhaseAcquireStored})
        if (!pulled) pulled = telemetry::last_point(std::string(phase) + " -");
    r.pull_ms = ms(begun, pulled);
    r.mount_ms = ms(pulled ? pulled : begun, w.ready_ns);
    if (auto times = find_env(env, kSrunTimesVar)) {
        char* end = nullptr;
        long long start = std::strtoll(times->c_str(), &end, 10);
        if (end != times->c_str() && start > 0) w.srun_start_ns = start;
        if (end != nullptr && *end == ' ') {
            long long resolve = std::strtoll(end + 1, nullptr, 10);
            if (resolve >= 0 && resolve < 3600LL * 1000000000) r.resolve_ms = static_cast<double>(resolve) / 1e6;
        }
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    w.read_end.reset(fds[0]);
    w.write_end.reset(fds[1]);
    struct stat sb {};
    if (::fstat(fds[1], &sb) == 0) w.pipe_ino = sb.st_ino;
    w.dir = st.config.telemetry_dir;
}

void start_record_tasks_forked() {
    StartWatch& w = watch();
    // Every task is forked before the first post-fork hook: slurmstepd's own copy of the write end
    // goes, so that the read end sees the end of the pipe once every task has exec'd or died.
    if (!w.write_end || w.waiter.joinable()) return;
    w.write_end.reset();
    try {
        w.waiter = std::thread(wait_for_first_exec, std::ref(w));
    } catch (const std::exception& e) {
        log::warning(std::string("start-up telemetry: no thread to wait for the first exec: ") + e.what());
    }
}

void start_record_task_execs() {
    StartWatch& w = watch();
    if (!w.write_end) return;
    // The descriptor number is checked to still be our pipe before anything is written to it.
    struct stat sb {};
    if (::fstat(w.write_end.get(), &sb) == 0 && S_ISFIFO(sb.st_mode) && sb.st_ino == w.pipe_ino)
        (void)!::write(w.write_end.get(), "x", 1);
    w.write_end.reset();
    w.read_end.reset();
}

void start_record_finish() {
    StartWatch& w = watch();
    w.stop.store(true);
    if (w.waiter.joinable()) w.waiter.join();
}

}  // namespace gantry::plugin
