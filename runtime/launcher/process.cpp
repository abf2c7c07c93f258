// Running processes in a container: join (setns into the holder's namespaces, used by `gantry exec`,
// `gantry run` and the SPANK plugin's tasks) and run_in (fork + join + exec, with signal forwarding
// and the command's exit status).
#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "internal.hpp"

extern char** environ;

namespace gantry {
namespace launcher {

int open_pidfd(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
int signal_pidfd(int pidfd, int sig) {
    return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

unsigned long long process_start_time(pid_t pid) {
    if (pid <= 0) return 0;
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    if (!std::getline(f, stat)) return 0;
    // Field 22; the command name (field 2) may hold spaces, so count from its closing parenthesis.
    auto paren = stat.rfind(')');
    if (paren == std::string::npos) return 0;
    std::istringstream in(stat.substr(paren + 2));
    std::string field;
    for (int i = 3; i <= 22 && (in >> field); ++i) {
        if (i == 22) return std::stoull(field);
    }
    return 0;
}

unsigned long long own_pid_namespace() {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

bool sees_every_process_of(unsigned long long pidns) {
    unsigned long long own = own_pid_namespace();
    return pidns == 0 || pidns == own || own == kInitPidNamespace;
}

std::vector<pid_t> parse_nspid(std::string_view status) {
    std::vector<pid_t> out;
    size_t at = status.find("\nNSpid:");
    if (at == std::string_view::npos) {
        if (status.substr(0, 6) != "NSpid:") return out;
        at = 0;
    } else {
        at += 1;
    }
    size_t end = status.find('\n', at);
    std::istringstream fields(std::string(status.substr(at + 6, end == std::string_view::npos ? end : end - at - 6)));
    for (long pid = 0; fields >> pid;) {
        if (pid <= 0) return {};
        out.push_back(static_cast<pid_t>(pid));
    }
    return out;
}

pid_t pid_in_own_view(pid_t pid, unsigned long long pidns) {
    if (pid <= 0) return -1;
    if (pidns == 0 || pidns == own_pid_namespace()) return pid;
    // Another pid namespace's number (a job's under Slurm's namespace/linux, read by the epilog): the
    // process whose own pid namespace is that one and whose innermost NSpid is that number. Its first
    // NSpid field is its pid in our /proc, i.e. its directory's name. A namespace we cannot see into
    // (not ours nor below ours) lists nothing here: -1, as for a process that is gone.
    DIR* d = ::opendir("/proc");
    if (d == nullptr) return -1;
    pid_t found = -1;
    while (dirent* e = ::readdir(d)) {
        char* end = nullptr;
        long candidate = std::strtol(e->d_name, &end, 10);
        if (candidate <= 0 || *end != '\0') continue;
        std::string dir = std::string("/proc/") + e->d_name;
        struct stat ns {};
        if (::stat((dir + "/ns/pid").c_str(), &ns) != 0 || static_cast<unsigned long long>(ns.st_ino) != pidns)
            continue;
        std::ifstream in(dir + "/status");
        std::stringstream text;
        text << in.rdbuf();
        auto nspid = parse_nspid(text.str());
        if (!nspid.empty() && nspid.back() == pid && nspid.front() == static_cast<pid_t>(candidate)) {
            found = static_cast<pid_t>(candidate);
            break;
        }
    }
    ::closedir(d);
    return found;
}

}  // namespace launcher

Result<JoinHandles> open_join_handles(const ContainerState& state) {
    std::string what = "joining container " + (state.name.empty() ? std::to_string(state.holder_pid) : state.name);
    if (launcher::process_start_time(state.holder_pid) != state.holder_start_time)
        return make_error(what + ": the container is not running");
    std::string proc = "/proc/" + std::to_string(state.holder_pid);
    JoinHandles h;
    auto open_ns = [&](const char* ns, UniqueFd& out) -> Status {
        out.reset(::open((proc + "/ns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
        if (!out) return system_error(what + ": opening its " + ns + " namespace");
        return {};
    };
    GANTRY_TRY(open_ns("user", h.userns));
    GANTRY_TRY(open_ns("mnt", h.mntns));
    if (state.unshare.net) GANTRY_TRY(open_ns("net", h.netns));
    if (state.unshare.ipc) GANTRY_TRY(open_ns("ipc", h.ipcns));
    if (state.unshare.uts) GANTRY_TRY(open_ns("uts", h.utsns));
    // The holder's root, opened from the host side before we switch namespaces.
    h.root.reset(::open((proc + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!h.root) return system_error(what + ": opening its root");
    if (launcher::process_start_time(state.holder_pid) != state.holder_start_time)
        return make_error(what + ": the container is not running");
    return h;
}

Status join(const ContainerState& state, const JoinOptions& options) {
    auto handles = open_join_handles(state);
    if (!handles) return handles.error();
    return join(state, *handles, options);
}

Status join(const ContainerState& state, const JoinHandles& h, const JoinOptions& options) {
    std::string what = "joining container " + (state.name.empty() ? std::to_string(state.holder_pid) : state.name);
    const bool as_root = state.defaults.remap_root && !options.as_user;
    // The user namespace first: it gives the capabilities the other setns calls need.
    if (::setns(h.userns.get(), CLONE_NEWUSER) != 0) return system_error(what + ": entering its user namespace");
    if (::setns(h.mntns.get(), CLONE_NEWNS) != 0) return system_error(what + ": entering its mount namespace");
    const std::pair<int, int> extra[] = {
        {h.netns.get(), CLONE_NEWNET}, {h.ipcns.get(), CLONE_NEWIPC}, {h.utsns.get(), CLONE_NEWUTS}};
    for (const auto& [fd, type] : extra)
        if (fd >= 0 && ::setns(fd, type) != 0) return system_error(what + ": entering its namespaces");
    if (::fchdir(h.root.get()) != 0 || ::chroot(".") != 0) return system_error(what + ": entering its root");
    // A new instance: a copy of the mount namespace just entered, which the kernel makes from the
    // mounts this process sees and into which it moves our root and working directory (hence after
    // the chroot above, which names the holder's root). Not privileged on the host: CAP_SYS_ADMIN
    // over the container's user namespace, which the user owns and the setns above gave us; the copy
    // is owned by that namespace too. Every mount in it is then made a slave (as make_mounts_private
    // did in the holder; a user mount asked `shared` would otherwise be a peer of the holder's): what
    // is mounted in the copy reaches neither the running container nor the node.
    if (options.as == JoinAs::new_instance) {
        if (::unshare(CLONE_NEWNS) != 0) return system_error(what + ": making a mount namespace for a new instance");
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
            return system_error(what + ": making the new instance's mounts its own");
    }
    std::string workdir = state.defaults.workdir.empty() ? "/" : state.defaults.workdir;
    if (::chdir(workdir.c_str()) != 0) return system_error("changing to working directory " + workdir);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return system_error("setting no_new_privs");
    // With --remap-root the user is root of the container and keeps the namespace's capabilities
    // (package managers need them); otherwise nothing is left to gain, but for CAP_SYS_ADMIN in a
    // container with its own UTS namespace: `hostname NAME` works for the job user, as under Enroot.
    // It grants nothing --remap-root would not give the same user: a capability of the container's
    // user namespace (the user's own uid alone), over the namespaces the holder made in it.
    // As the user in a remap_root container (JoinOptions::as_user), CAP_SETFCAP of the container's
    // namespace is kept for gantry-entry alone, which execs next: the kernel lets a new user namespace
    // map its parent's root (the user's own id here) only when its maker had that capability. The
    // namespace it makes then starts without ambient capabilities, and the task runs as a non-root id.
    if (!as_root) {
        const int keep = options.as_user ? CAP_SETFCAP : state.unshare.uts ? CAP_SYS_ADMIN : -1;
        GANTRY_TRY(launcher::drop_capabilities(keep));
    }
    // Last: the chown and set*id calls the single-id namespace refuses become no-ops (seccomp.cpp),
    // so package managers work as the fake root; with and without remap-root, as Enroot.
    return launcher::install_syscall_filter();
}

namespace {

std::vector<std::string> host_environment() {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
    return env;
}

const int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

[[noreturn]] void exec_in_container(const ContainerState& container, const std::vector<std::string>& argv,
                                    const std::vector<std::string>& env, const sigset_t& old_mask) {
    for (int sig : kForwarded) ::signal(sig, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    auto st = join(container);
    if (!st) {
        std::fprintf(stderr, "gantry: %s\n", st.error().message.c_str());
        ::_exit(125);
    }
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    // execvp looks PATH up in the current environment: install the container's first, so the search
    // runs inside the container with the image's PATH.
    environ = envp.data();
    ::execvp(args[0], args.data());
    int err = errno;
    std::fprintf(stderr, "gantry: executing %s: %s\n", argv[0].c_str(), std::strerror(err));
    ::_exit(err == ENOENT ? 127 : 126);
}

}  // namespace

Result<int> run_in(const ContainerState& container, const ProcessSpec& process) {
    auto argv = resolve_command(process);
    // `gantry run`/`exec` keep Docker's rule: the caller's shell stays outside the container.
    auto env = container_environment(container.defaults, host_environment(), EnvironmentRule::docker);

    sigset_t set, old;
    sigemptyset(&set);
    for (int sig : kForwarded) sigaddset(&set, sig);
    sigaddset(&set, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &set, &old);
    Defer restore([&] { ::sigprocmask(SIG_SETMASK, &old, nullptr); });

    pid_t child = ::fork();
    if (child < 0) return system_error("starting the command");
    if (child == 0) exec_in_container(container, argv, env, old);

    while (true) {
        siginfo_t info{};
        if (::sigwaitinfo(&set, &info) < 0) {
            if (errno == EINTR) continue;
            return system_error("waiting for the command");
        }
        if (info.si_signo == SIGCHLD) {
            int status = 0;
            pid_t p = ::waitpid(child, &status, WNOHANG);
            if (p == child) {
                if (WIFEXITED(status)) return WEXITSTATUS(status);
                if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
            }
            continue;
        }
        // Terminal-generated signals (SI_KERNEL) already reached the command: it shares our process
        // group. Signals somebody sent to us (kill, Slurm) are passed on.
        if (info.si_code != SI_KERNEL) ::kill(child, info.si_signo);
    }
}

}  // namespace gantry
