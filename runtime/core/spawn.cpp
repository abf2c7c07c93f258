// spawn(): fork + exec of a helper with an explicit identity, environment and descriptors, and capped
// capture of everything it writes (see include/gantry/spawn.hpp).
#include "gantry/spawn.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "gantry/environment.hpp"
#include "gantry/fd.hpp"
#include "gantry/trace.hpp"

namespace gantry {
namespace {

// Exit statuses the child uses before exec: ours, so that they are not confused with the program's.
constexpr int kIdentityFailed = 126;
constexpr int kSetupFailed = 125;
constexpr int kExecFailed = 127;

struct Stream {
    UniqueFd fd;
    std::string* text;
    size_t cap;
    std::string name;
};

// Everything the child needs, prepared before fork: between fork and exec it only makes system calls.
struct ChildPlan {
    const ProcessRequest* rq = nullptr;
    std::vector<char*> argv, envp;
    std::vector<gid_t> groups;
    std::vector<std::pair<int, int>> passed;  // (our descriptor, its number in the program)
    std::vector<int> keep;                    // the program's descriptor numbers, sorted
    int highest = 2;
    bool null_output = false;  // stdout/stderr to /dev/null unless passed
};

ChildPlan plan_child(const ProcessRequest& rq, std::vector<std::pair<int, int>> passed) {
    ChildPlan p;
    p.rq = &rq;
    for (const auto& a : rq.argv) p.argv.push_back(const_cast<char*>(a.c_str()));
    p.argv.push_back(nullptr);
    for (const auto& e : rq.env) p.envp.push_back(const_cast<char*>(e.c_str()));
    p.envp.push_back(nullptr);
    if (rq.identity)
        p.groups = rq.identity->groups.empty() ? std::vector<gid_t>{rq.identity->gid} : rq.identity->groups;
    for (const auto& in : rq.inputs) passed.emplace_back(in.fd, in.as);
    p.highest = rq.root_of.empty() ? 2 : rq.root_as;
    for (const auto& [fd, as] : passed) p.highest = std::max({p.highest, fd, as});
    for (const auto& [fd, as] : passed) p.keep.push_back(as);
    if (!rq.root_of.empty()) p.keep.push_back(rq.root_as);
    std::sort(p.keep.begin(), p.keep.end());
    p.passed = std::move(passed);
    return p;
}

[[noreturn]] void become_program(const ChildPlan& p) {
    const ProcessRequest& rq = *p.rq;
    // Only system calls from here to exec: the parent may be multi-threaded.
    sigset_t none;
    sigemptyset(&none);
    (void)::sigprocmask(SIG_SETMASK, &none, nullptr);  // the caller's blocked signals are not the program's
    if (rq.own_session)
        (void)::setsid();
    else
        (void)::setpgid(0, 0);
    // First move every passed descriptor above all target numbers, then onto its target: a
    // target number may be another passed descriptor's current one.
    int spare = p.highest + 1;
    std::pair<int, int> moved[256];
    size_t count = 0;
    for (const auto& [fd, as] : p.passed) {
        int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, spare);
        if (copy < 0 || count == 256) ::_exit(kSetupFailed);
        moved[count++] = {copy, as};
    }
    for (size_t i = 0; i < count; ++i)
        if (::dup2(moved[i].first, moved[i].second) < 0) ::_exit(kSetupFailed);  // dup2 clears close-on-exec
    auto kept = [&](int n) { return std::find(p.keep.begin(), p.keep.end(), n) != p.keep.end(); };
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || (!kept(STDIN_FILENO) && ::dup2(null, STDIN_FILENO) < 0)) ::_exit(kSetupFailed);  // unless passed
    if (p.null_output)
        for (int n : {STDOUT_FILENO, STDERR_FILENO})
            if (!kept(n) && ::dup2(null, n) < 0) ::_exit(kSetupFailed);
    if (rq.identity) {
        const auto& id = *rq.identity;
        // For good: groups, then gid, then uid (after the uid we could not change the others).
        if (::setgroups(p.groups.size(), p.groups.data()) != 0 || ::setresgid(id.gid, id.gid, id.gid) != 0 ||
            ::setresuid(id.uid, id.uid, id.uid) != 0)
            ::_exit(kIdentityFailed);
        if (::getuid() != id.uid || ::geteuid() != id.uid || ::getegid() != id.gid) ::_exit(kIdentityFailed);
    }
    if (rq.death_signal != 0 && ::prctl(PR_SET_PDEATHSIG, rq.death_signal, 0, 0, 0) != 0) ::_exit(kSetupFailed);
    if (rq.userns_fd >= 0 && ::setns(rq.userns_fd, CLONE_NEWUSER) != 0) ::_exit(kSetupFailed);
    if (!rq.root_of.empty()) {
        int root = ::open(rq.root_of.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0 || ::dup2(root, rq.root_as) < 0) ::_exit(kSetupFailed);
    }
    // Everything else we hold (e.g. slurmstepd's descriptors without close-on-exec) stays behind:
    // close 3.. except the targets, walking the gaps between kept numbers.
    unsigned from = 3;
    for (int k : p.keep) {
        if (k < 3) continue;
        if (static_cast<unsigned>(k) > from) ::close_range(from, static_cast<unsigned>(k) - 1, 0);
        from = static_cast<unsigned>(k) + 1;
    }
    ::close_range(from, ~0U, 0);
    if (rq.no_new_privs && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(kSetupFailed);
    ::execve(p.argv[0], p.argv.data(), p.envp.data());
    ::_exit(kExecFailed);
}

// How a trace point names a program: its file name and first argument ("gantry-holder --acquire").
std::string traced_name(const ProcessRequest& rq) {
    if (!trace::on()) return {};
    std::string name = rq.argv[0].substr(rq.argv[0].rfind('/') + 1);
    return rq.argv.size() > 1 ? name + " " + rq.argv[1] : name;
}

}  // namespace

Result<pid_t> start_process(const ProcessRequest& rq, UniqueFd* daemon_pidfd) {
    if (rq.argv.empty() || rq.argv[0].empty() || rq.argv[0][0] != '/')
        return make_error("running a helper: an absolute program path is needed");
    ChildPlan plan = plan_child(rq, {});
    plan.null_output = true;
    // A daemon's pid, from the intermediate (`told`), which then waits until we have closed `held`:
    // until it exits the daemon is its child, so its pid names it (not reaped by anyone) while we
    // take the pidfd.
    int told[2] = {-1, -1}, held[2] = {-1, -1};
    bool tell = rq.daemonize && daemon_pidfd != nullptr;
    if (tell && (::pipe2(told, O_CLOEXEC) != 0 || ::pipe2(held, O_CLOEXEC) != 0)) {
        for (int fd : {told[0], told[1], held[0], held[1]})
            if (fd >= 0) ::close(fd);
        return system_error("starting " + rq.argv[0]);
    }
    UniqueFd told_r(told[0]), told_w(told[1]), held_r(held[0]), held_w(held[1]);
    if (trace::on()) trace::point("start", traced_name(rq));
    pid_t pid = ::fork();
    if (pid < 0) return system_error("starting " + rq.argv[0]);
    if (pid == 0) {
        if (rq.daemonize) {
            // The intermediate: a session of its own first, so that the program is in no terminal's
            // process group, then the program's own fork; it exits at once (after saying the
            // program's pid and waiting for our end of `held` to close, when asked) and we reap it below.
            (void)::setsid();
            pid_t again = ::fork();
            if (again > 0 && tell) {
                ::close(held[1]);
                (void)!::write(told[1], &again, sizeof again);
                char c;
                while (::read(held[0], &c, 1) < 0 && errno == EINTR) {
                }
            }
            if (again != 0) ::_exit(again < 0 ? kSetupFailed : 0);
        }
        become_program(plan);
    }
    if (!rq.daemonize) return pid;
    if (tell) {
        told_w.reset();
        held_r.reset();
        pid_t daemon = 0;
        ssize_t n;
        while ((n = ::read(told_r.get(), &daemon, sizeof daemon)) < 0 && errno == EINTR) {
        }
        if (n == static_cast<ssize_t>(sizeof daemon) && daemon > 0)
            *daemon_pidfd = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, daemon, 0)));
        held_w.reset();  // the intermediate may exit now
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return make_error("starting " + rq.argv[0] + ": could not fork");
    return 0;
}

std::string stop_reason(const ProcessRequest& rq, const ProcessOutcome& outcome, const std::string& setting) {
    if (outcome.stopped) return "the step is being stopped";
    if (!outcome.timed_out) return {};
    auto ms = rq.timeout.count();
    std::string span = ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
    return "no answer within " + span + " (" + setting + " in gantry.conf; is the path on a stalled file system?)";
}

std::string find_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    std::vector<std::string> dirs;
    const std::string& list = environment().path.value;
    for (size_t start = 0; start <= list.size();) {
        size_t end = list.find(':', start);
        if (end == std::string::npos) end = list.size();
        if (end > start) dirs.push_back(list.substr(start, end - start));
        start = end + 1;
    }
    for (const char* d : {"/usr/bin", "/usr/local/bin", "/bin"}) dirs.emplace_back(d);
    for (const auto& dir : dirs) {
        std::string candidate = dir + "/" + name;
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return {};
}

ProcessIdentity user_identity(uid_t uid, gid_t gid) {
    ProcessIdentity id{uid, gid, {gid}};
    std::vector<char> buf(16384);
    struct passwd pw {};
    struct passwd* found = nullptr;
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
        int n = 256;
        id.groups.resize(static_cast<size_t>(n));
        if (::getgrouplist(found->pw_name, gid, id.groups.data(), &n) < 0) n = 0;
        id.groups.resize(static_cast<size_t>(n));
        if (id.groups.empty()) id.groups.push_back(gid);
    }
    return id;
}

Result<ProcessOutcome> spawn(const ProcessRequest& rq) {
    if (rq.argv.empty() || rq.argv[0].empty() || rq.argv[0][0] != '/')
        return make_error("running a helper: an absolute program path is needed");
    const std::string traced = traced_name(rq);
    trace::Phase phase(traced.empty() ? std::string_view("spawn") : std::string_view(traced));

    ProcessOutcome outcome;
    // Pipes: stdout, stderr, then one per requested output. The write ends go to the child only.
    std::vector<Stream> streams;
    std::vector<std::pair<int, int>> child_ends;  // (our write end, its descriptor number)
    auto add_pipe = [&](std::string* text, size_t cap, std::string name, int as) -> Status {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) return system_error("creating a pipe for " + rq.argv[0]);
        streams.push_back({UniqueFd(p[0]), text, cap, std::move(name)});
        child_ends.emplace_back(p[1], as);
        return {};
    };
    Defer close_child_ends([&] {
        for (auto& [fd, as] : child_ends) ::close(fd);
    });
    GANTRY_TRY(add_pipe(&outcome.out, rq.stdout_cap, "stdout", STDOUT_FILENO));
    GANTRY_TRY(add_pipe(&outcome.err, rq.stderr_cap, "stderr", STDERR_FILENO));
    for (const auto& o : rq.outputs) GANTRY_TRY(add_pipe(o.text, o.cap, o.name, o.as));
    ChildPlan plan = plan_child(rq, child_ends);

    pid_t pid = ::fork();
    if (pid < 0) return system_error("starting " + rq.argv[0]);
    if (pid == 0) become_program(plan);
    for (auto& [fd, as] : child_ends) ::close(fd);
    child_ends.clear();

    // The child by pidfd: its exit is one more thing to poll, whatever it did with its pipes (a program
    // that closes them and sleeps must not hold us past a stop request or the deadline), and signals
    // through it can never reach a process that reused its pid. Without pidfd_open (Linux < 5.3) we
    // look with waitid(WNOWAIT) at each poll round: pid is our unreaped child, so not reused either.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    std::vector<pollfd> fds;
    for (const auto& s : streams) fds.push_back({s.fd.get(), POLLIN, 0});
    fds.push_back({pidfd.get(), POLLIN, 0});  // poll skips it (fd -1) without a pidfd
    const size_t child_slot = fds.size() - 1;
    size_t open_fds = streams.size();  // streams not at their end yet; 0 also once one broke its cap
    std::string overflow;
    bool exited = false, killed = false;
    auto kill_child = [&] {
        // Safe: pid is our own child, not reaped yet (so neither it nor its process group id can name
        // another process), leader of its own process group.
        (void)::kill(-pid, SIGKILL);
        if (!pidfd || ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0) != 0)
            (void)::kill(pid, SIGKILL);
        killed = true;
        for (size_t i = 0; i < child_slot; ++i) fds[i].fd = -1;  // nothing more is read
        open_fds = 0;
    };
    using Clock = std::chrono::steady_clock;
    const auto started = Clock::now();
    const bool has_deadline = rq.timeout.count() > 0;
    const auto deadline = started + rq.timeout;
    // After SIGKILL the child ends at once unless the kernel holds it (e.g. in an uninterruptible
    // wait on a dead file server): we give it this long, then report it rather than wait for ever.
    constexpr auto kKillGrace = std::chrono::seconds(5);
    Clock::time_point killed_at{};
    char buf[8192];
    while (!exited || open_fds > 0) {
        auto now = Clock::now();
        int wait_ms = -1;
        auto wait_until = [&](Clock::time_point t) {
            auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
            ms = std::clamp<long long>(ms, 0, 1000 * 1000);
            if (wait_ms < 0 || ms < wait_ms) wait_ms = static_cast<int>(ms);
        };
        if (!pidfd && !exited) wait_until(now + std::chrono::milliseconds(200));
        if (killed) {
            wait_until(killed_at + kKillGrace);
        } else {
            if (rq.should_stop) wait_until(now + std::chrono::milliseconds(200));
            if (has_deadline) wait_until(deadline);
        }
        for (auto& f : fds) f.revents = 0;
        int ready = ::poll(fds.data(), fds.size(), wait_ms);
        if (ready < 0 && errno != EINTR && !killed) {
            // Cannot watch it any more: end it rather than wait blind.
            kill_child();
            killed_at = Clock::now();
        }
        now = Clock::now();
        if (!killed && rq.should_stop && rq.should_stop()) {
            outcome.stopped = true;
            kill_child();
            killed_at = now;
        }
        if (!killed && has_deadline && now >= deadline) {
            outcome.timed_out = true;
            kill_child();
            killed_at = now;
        }
        if (!exited && (pidfd ? (fds[child_slot].revents & POLLIN) != 0 : [&] {
                siginfo_t info{};
                return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                       info.si_pid == pid;
            }())) {
            // Gone. What it started may still hold its pipes: those are read to their end as before
            // (within the same stop request and deadline).
            exited = true;
            fds[child_slot].fd = -1;
        }
        if (killed && !exited && now >= killed_at + kKillGrace) break;
        for (size_t i = 0; i < child_slot && ready > 0; ++i) {
            if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
            ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                fds[i].fd = -1;
                --open_fds;
            } else if (streams[i].text->size() + static_cast<size_t>(n) > streams[i].cap) {
                // Over its cap: stop the program and stop reading every stream.
                overflow = streams[i].name + " (more than " + std::to_string(streams[i].cap) + " bytes)";
                kill_child();
                killed_at = now;
                break;
            } else {
                streams[i].text->append(buf, static_cast<size_t>(n));
            }
        }
    }
    streams.clear();  // our read ends: a program still writing gets EPIPE
    int status = 0;
    pid_t reaped = 0;
    while ((reaped = ::waitpid(pid, &status, exited ? 0 : WNOHANG)) < 0 && errno == EINTR) {
    }
    if (reaped != pid)
        return make_error(rq.argv[0] + " (pid " + std::to_string(pid) + ") did not end within " +
                          std::to_string(kKillGrace.count()) +
                          " s of SIGKILL (stuck in the kernel, e.g. on a stopped FUSE mount?)");
    outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
    if (!overflow.empty())
        return make_error(rq.argv[0] + " wrote too much to its " + overflow +
                          " and was stopped (is something in the job's environment, e.g. LD_PRELOAD, changing it?)");
    if (outcome.signal == 0) {
        if (outcome.status == kIdentityFailed && rq.identity)
            return make_error("could not switch to uid " + std::to_string(rq.identity->uid) + " to run " + rq.argv[0]);
        if (outcome.status == kSetupFailed && outcome.out.empty() && outcome.err.empty())
            return make_error("could not set up the descriptors or namespace of " + rq.argv[0]);
        if (outcome.status == kExecFailed && outcome.out.empty() && outcome.err.empty())
            return make_error("could not run " + rq.argv[0]);
    }
    return outcome;
}

}  // namespace gantry
