// One job step on one node (see step.hpp). Only Slurm glue lives here: the work is done by the
// gantry runtime library (Container, join) and by the `gantry` CLI run as the job user (pull).
#include "step.hpp"

#include <dlfcn.h>
#include <slurm/slurm.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/devices.hpp"
#include "gantry/digest.hpp"
#include "gantry/log.hpp"
#include "gantry/image_config.hpp"
#include "gantry/launcher.hpp"
#include "gantry/mounts.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "gantry/pull_report.hpp"
#include "gantry/store.hpp"
#include "gantry/strings.hpp"
#include "gantry/threads.hpp"

#ifndef GANTRY_CLI_INSTALL_PATH
#define GANTRY_CLI_INSTALL_PATH "/usr/bin/gantry"
#endif
#ifndef GANTRY_ENTRY_INSTALL_PATH
#define GANTRY_ENTRY_INSTALL_PATH "/usr/libexec/gantry/gantry-entry"
#endif

namespace gantry::plugin {
namespace {

constexpr const char* kDigestVar = "GANTRY_CONTAINER_IMAGE_DIGEST";

// Slurm's requests to signal or end this step (scancel, srun's Ctrl-C or its forwarded signals, the
// end of the job after a node failure or at its time limit) while the plugin still pulls the image in
// slurm_spank_init_post_opt: slurmstepd answers such a request only once the tasks run (it waits on
// the step's state, up to 2 x 60 s, in a thread of its message handler: src/slurmd/slurmstepd/req.c,
// _wait_for_job_running), and the tasks run only after the pull. Without this, a cancelled step's node
// stayed `completing` for as long as the download took. A message-handler thread that starts after
// slurmstepd's own threads (snapshot in slurm_spank_init) and stays in one futex wait for a second is
// such a request: the others (state, stat, attach, completion) answer at once. Any signal counts: the
// program could not have installed a handler for it yet, and slurmd's end of a job starts with SIGCONT.
class StepSignals {
public:
    bool pending() {
        auto now = std::chrono::steady_clock::now();
        if (!found_ && now - last_ >= std::chrono::milliseconds(200)) {
            last_ = now;
            std::string which;
            if (threads_.check(std::chrono::seconds(1), &which)) {
                found_ = true;
                log::info("slurmstepd holds a request to signal this step (" + which +
                          "): stopping the image pull so that the step can end");
            }
        }
        return found_;
    }

private:
    NewBlockedThreads threads_;
    std::chrono::steady_clock::time_point last_{};
    bool found_ = false;
};

// State of this step in this slurmstepd; forked tasks inherit a copy.
struct StepState {
    std::string error;                   // reported by every task when set
    std::optional<Container> container;  // the step's container, created by prepare_step
    ContainerState joined;               // what tasks join
    bool run_on_host = false;            // no container for this step (no_exec, or no image)
    std::string digest;                  // the image every rank of the step runs, told to the tasks
    UniqueFd image_in_use;               // shared lock: the image stays while the step runs
    uint32_t tasks_exited = 0;
    std::vector<std::string> entrypoint;  // run in front of each task's command (--container-entrypoint)
    bool entrypoint_log = false;
    std::string entry_helper;             // gantry-entry, which Slurm execs in the task's place
    std::string save_path;                // --container-save: written after the last task, on node 0
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    Config config;
    std::string device_warnings;          // devices (issue 7): shown by node 0's first task
    std::optional<StepSignals> signals;   // slurmstepd only (watch_step_signals): stops pulls of a cancelled step
};

StepState& state() {
    static StepState s;
    return s;
}

template <typename T>
bool item(spank_t sp, spank_item_t what, T* out) {
    return spank_get_item(sp, what, out) == ESPANK_SUCCESS;
}

std::vector<std::string> job_environment(spank_t sp) {
    std::vector<std::string> env;
    char** envp = nullptr;
    if (item(sp, S_JOB_ENV, &envp) && envp != nullptr)
        for (char** e = envp; *e != nullptr; ++e) env.emplace_back(*e);
    return env;
}

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

// slurmstepd's own configuration: libslurm's `slurm_conf`, in the layout of the Slurm headers this
// plugin is built against. Looked up rather than linked (it is slurmstepd's, not the SPANK API's);
// null outside slurmstepd/srun.
const slurm_conf_t* stepd_slurm_conf() {
    return static_cast<const slurm_conf_t*>(::dlsym(RTLD_DEFAULT, "slurm_conf"));
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
// the image). Bound read-only at the same paths; what does not exist is left out.
std::vector<std::string> batch_srun_paths(const std::vector<std::string>& env) {
    std::vector<std::string> out;
    auto add_parent = [&](const std::string& file) {
        auto slash = file.rfind('/');
        if (file.empty() || file[0] != '/' || slash == std::string::npos || slash == 0) return;
        out.push_back(file.substr(0, slash));
    };
    std::string conf = find_env(env, "SLURM_CONF").value_or("");
    if (conf.empty() && std::getenv("SLURM_CONF") != nullptr) conf = std::getenv("SLURM_CONF");
    add_parent(conf.empty() ? "/etc/slurm/slurm.conf" : conf);
    std::string socket = "/run/munge/munge.socket.2";
    auto slurm = stepd_slurm_conf();
    // PlugStackConfig, when it is not beside slurm.conf: the file itself (its directory may hold
    // slurmd's own state, e.g. the spool directory in the test harness).
    if (slurm != nullptr && slurm->plugstack != nullptr && slurm->plugstack[0] == '/' &&
        std::none_of(out.begin(), out.end(), [&](const std::string& d) { return starts_with(slurm->plugstack, d + "/"); }))
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
    std::vector<std::string> existing;
    for (const auto& p : out) {
        struct stat sb {};
        if (::stat(p.c_str(), &sb) == 0 && std::find(existing.begin(), existing.end(), p) == existing.end())
            existing.push_back(p);
    }
    return existing;
}

// A program of ours: beside the configured gantry CLI, else in the build tree next to this plugin, else
// where the package installs it.
std::string helper_path(const Settings& settings, const std::string& name, const char* installed) {
    if (!settings.gantry.empty() && name != "gantry") {
        std::string dir = settings.gantry.substr(0, settings.gantry.rfind('/'));
        if (::access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
    }
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&helper_path), &info) != 0 && info.dli_fname != nullptr) {
        std::string self = info.dli_fname;
        std::string candidate = self.substr(0, self.rfind('/')) + "/../runtime/" + name;
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return installed;
}

// The gantry CLI: plugstack `gantry=`, else ours beside this plugin or as installed.
std::string gantry_cli(const Settings& settings) {
    if (!settings.gantry.empty()) return settings.gantry;
    return helper_path(settings, "gantry", GANTRY_CLI_INSTALL_PATH);
}

struct Captured {
    int status = -1;
    int signal = 0;  // the signal that ended the program, 0 when it exited
    bool stopped = false;  // killed by us: Slurm asked to signal or end the step meanwhile
    std::string overflow;  // killed by us: it wrote more than its cap to this stream ("stdout", ...)
    std::string out, err;
};

// Runs argv as the job user (never as root: the pull parses registry bytes, and credentials must be
// read with the user's identity). fork+exec keeps slurmstepd's threads out of it; between fork and
// exec the child only makes system calls.
// With `userns_fd`, the program also enters that user namespace (one the job user owns) after
// dropping to the user, so that it sees the container's files as the container does (FUSE mounts made
// inside the container refuse callers from outside its user namespace); `root_of` (a "/proc/PID/root"
// in that namespace) is then opened as descriptor kRootFd, reachable as /proc/self/fd/<kRootFd>/ by
// the program after it lost the namespace's capabilities in execve.
// With `fd3_in`, that descriptor is the program's fd 3 (credentials handed to the store owner's pull);
// with `fd3_out`, what the program writes to its fd 3 is collected there (the job user's half hands the
// credentials it used back this way): a pipe, never argv, the environment or a file. With `report`,
// what it writes to its fd 4 (`gantry pull --report-fd 4`, include/gantry/pull_report.hpp) is
// collected there.
// Everything collected is capped (kMaxCaptured per stream, kMaxPullReportBytes for the report): a
// program that writes more (an LD_PRELOAD in the job's environment can make it print anything) is
// killed, so slurmstepd's memory stays bounded whatever the user's program does.
// With `stop_when_step_signalled` (the pulls), the program is killed, process group and all, as soon
// as Slurm asks to signal or end this step (see StepSignals): slurmstepd holds such a request until the
// tasks run, and they run only after this returns.
constexpr int kRootFd = 200;
constexpr int kCredentialsFd = 3;
constexpr int kReportFd = 4;
constexpr size_t kMaxCaptured = 64 * 1024;
struct RunOptions {
    int userns_fd = -1;
    std::string root_of;
    int fd3_in = -1;
    std::string* fd3_out = nullptr;
    std::string* report = nullptr;
    bool stop_when_step_signalled = false;
};
Result<Captured> run_as_user(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
                             const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const RunOptions& opts = {}) {
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
    int out[2], err[2], side[2] = {-1, -1}, rep[2] = {-1, -1};
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return system_error("creating pipes");
    if (opts.fd3_out != nullptr && ::pipe2(side, O_CLOEXEC) != 0) return system_error("creating pipes");
    if (opts.report != nullptr && ::pipe2(rep, O_CLOEXEC) != 0) return system_error("creating pipes");
    pid_t pid = ::fork();
    if (pid < 0) return system_error("forking " + argv[0]);
    if (pid == 0) {
        // Its own process group, so that stopping it also stops what it runs (credential helpers).
        (void)::setpgid(0, 0);
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(err[1], STDERR_FILENO);
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
        // dup2 onto itself would keep close-on-exec: then clear the flag instead.
        auto pass = [](int fd, int as) { return fd == as ? ::fcntl(fd, F_SETFD, 0) : ::dup2(fd, as); };
        int third = opts.fd3_out != nullptr ? side[1] : opts.fd3_in;
        if (third >= 0 && pass(third, kCredentialsFd) < 0) ::_exit(125);
        if (rep[1] >= 0 && pass(rep[1], kReportFd) < 0) ::_exit(125);
        // Drop to the job user for good: groups first, then gid, then uid (after setuid we could not).
        if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(126);
        if (::getuid() != uid || ::geteuid() != uid) ::_exit(126);
        if (opts.userns_fd >= 0 && ::setns(opts.userns_fd, CLONE_NEWUSER) != 0) ::_exit(125);
        if (!opts.root_of.empty()) {
            int root = ::open(opts.root_of.c_str(), O_PATH | O_DIRECTORY);
            if (root < 0 || ::dup2(root, kRootFd) < 0) ::_exit(125);
        }
        ::execve(cargv[0], cargv.data(), cenv.data());
        ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (side[1] >= 0) ::close(side[1]);
    if (rep[1] >= 0) ::close(rep[1]);
    Captured c;
    std::string side_text, report_text;
    struct Stream {
        int fd;
        std::string* text;
        size_t cap;
        const char* name;
    };
    std::vector<Stream> streams = {{out[0], &c.out, kMaxCaptured, "stdout"}, {err[0], &c.err, kMaxCaptured, "stderr"}};
    if (side[0] >= 0) streams.push_back({side[0], &side_text, kMaxCaptured, "credentials pipe"});
    if (rep[0] >= 0) streams.push_back({rep[0], &report_text, kMaxPullReportBytes, "report"});
    std::vector<pollfd> fds;
    for (const auto& s : streams) fds.push_back({s.fd, POLLIN, 0});
    size_t open_fds = fds.size();
    char buf[8192];
    auto& watch = state().signals;
    StepSignals* signals = opts.stop_when_step_signalled && watch ? &*watch : nullptr;
    // Safe: the pid is our own child (not reaped yet, so not reused), in its own process group.
    auto kill_child = [&] {
        (void)::kill(-pid, SIGKILL);
        (void)::kill(pid, SIGKILL);
    };
    while (open_fds > 0) {
        int ready = ::poll(fds.data(), fds.size(), signals != nullptr ? 200 : -1);
        if (ready < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (signals != nullptr && !c.stopped && signals->pending()) {
            kill_child();
            c.stopped = true;
        }
        if (ready == 0) continue;
        for (size_t i = 0; i < fds.size(); ++i) {
            if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
            ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
            if (n <= 0) {
                ::close(fds[i].fd);
                fds[i].fd = -1;
                --open_fds;
            } else if (streams[i].text->size() + static_cast<size_t>(n) > streams[i].cap) {
                // Over its cap: stop reading everything and the program (the rest is drained by nobody).
                if (c.overflow.empty()) c.overflow = streams[i].name;
                kill_child();
                for (auto& f : fds)
                    if (f.fd >= 0) ::close(f.fd), f.fd = -1;
                open_fds = 0;
            } else {
                streams[i].text->append(buf, static_cast<size_t>(n));
            }
        }
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (WIFSIGNALED(status)) c.signal = WTERMSIG(status);
    if (opts.fd3_out != nullptr) *opts.fd3_out = std::move(side_text);
    if (opts.report != nullptr) *opts.report = std::move(report_text);
    if (!c.overflow.empty())
        return make_error(argv[0] + " wrote more than " + std::to_string(c.overflow == "report" ? kMaxPullReportBytes : kMaxCaptured) +
                          " bytes to its " + c.overflow + " and was stopped (is something in the job's environment, e.g. LD_PRELOAD, changing it?)");
    if (c.status == 126) return make_error("could not switch to uid " + std::to_string(uid) + " to run " + argv[0]);
    if (c.status == 125 && opts.userns_fd >= 0) return make_error("could not enter the container's user namespace to run " + argv[0]);
    if (c.status == 125 && (opts.fd3_in >= 0 || opts.fd3_out != nullptr || opts.report != nullptr))
        return make_error("could not pass its pipes to " + argv[0]);
    if (c.status == 127) return make_error("could not run " + argv[0] + " (set gantry= in plugstack.conf)");
    return c;
}

std::string last_line(const std::string& text) {
    std::string t = trim(text);
    auto nl = t.rfind('\n');
    return nl == std::string::npos ? t : t.substr(nl + 1);
}

std::string container_name(const std::string& name, uint32_t jobid, const Settings& settings) {
    // Pyxis naming, so that scripts and admins find the same names.
    return settings.container_scope == "global" ? "pyxis_" + name : "pyxis_" + std::to_string(jobid) + "_" + name;
}

Config load_plugin_config(const Settings& settings) {
    auto cfg = load_config(settings.config, true);
    Config c = cfg ? *cfg : Config{};
    if (!settings.runtime_path.empty()) c.runtime_path = settings.runtime_path;
    if (!settings.store.empty()) c.store_path = settings.store;
    if (!settings.mount_backend.empty()) c.mount_backend = settings.mount_backend;
    return c;
}

struct JobIdentity {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    uint32_t jobid = 0, stepid = 0;
};

Result<JobIdentity> identity(spank_t sp) {
    JobIdentity id;
    if (!item(sp, S_JOB_UID, &id.uid) || !item(sp, S_JOB_GID, &id.gid) || !item(sp, S_JOB_ID, &id.jobid) ||
        !item(sp, S_JOB_STEPID, &id.stepid))
        return make_error("could not read the job's user, group and ids from Slurm");
    gid_t* groups = nullptr;
    int ngroups = 0;
    if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &groups, &ngroups) == ESPANK_SUCCESS && groups != nullptr)
        id.groups.assign(groups, groups + ngroups);
    if (id.groups.empty()) id.groups.push_back(id.gid);
    return id;
}

// The job user's account entry: home directory (their per-user store) and name.
Result<passwd> account_of(uid_t uid, std::vector<char>& buf) {
    buf.assign(16384, '\0');
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
        return make_error("uid " + std::to_string(uid) + " has no account entry on this node");
    return pw;
}

// The store the job's pull uses: gantry.conf's store_path, else the job user's own store below the
// home directory in the account database (never slurmstepd's environment, which is root's, and never
// /tmp, where any user could have made it first).
Result<std::string> job_store_path(const Config& config, uid_t uid) {
    if (!config.store_path.empty()) return config.store_path;
    std::vector<char> buf;
    auto pw = account_of(uid, buf);
    if (!pw) return pw.error().wrap("finding the job user's image store");
    std::string home = pw->pw_dir != nullptr ? pw->pw_dir : "";
    while (home.size() > 1 && home.back() == '/') home.pop_back();
    if (home.empty() || home[0] != '/' || home == "/")
        return make_error("the job user's home directory ('" + home + "') cannot hold a per-user image store; set store_path in gantry.conf");
    return home + "/.cache/gantry";
}

// The outcome of a `gantry pull` run by the plugin, from its typed report (never from what it printed):
// a line a user can act on, or the report of a successful pull.
Result<PullReport> pull_outcome(const Captured& r, const std::string& report_text, const std::string& image,
                                const std::string& who) {
    if (r.stopped) {
        // What is downloaded stays in the store's staging area: the next pull of the image resumes it.
        return make_error("failed to import docker image " + image + ": the step was cancelled or signalled while " +
                          "its image was being pulled; the pull on this node was stopped (a later pull resumes it)");
    }
    if (r.signal != 0) {
        // Killed (OOM killer, an admin, a dying node): it printed nothing useful, so say what happened.
        // Its staging area stays for whoever takes over the image next.
        return make_error("failed to import docker image " + image + ": gantry pull" + who + " on this node was killed by signal " +
                          std::to_string(r.signal) + " (" + strsignal(r.signal) + ")");
    }
    auto report = decode_pull_report(report_text);
    if (!report) {
        std::string said = last_line(r.err);
        return make_error("failed to import docker image " + image + ": gantry pull" + who + " exited with status " +
                          std::to_string(r.status) + " and no usable report (" + report.error().message + ")" +
                          (said.empty() ? "" : "; it said: " + said.substr(0, 300)));
    }
    if (report->error != PullErrorKind::none) return make_error(report->message);
    if (r.status != 0) return make_error("failed to import docker image " + image + ": gantry pull" + who + " exited with status " + std::to_string(r.status));
    return *report;
}

// Pulls a registry image as the job user into `store_root` (gantry.conf's store_path or the user's own
// store). Everything it reports (digest, file, config) is the user's word: the image is served only
// unprivileged (squashfuse in the user's namespace), never kernel-mounted.
Result<PullReport> pull_as_user(const Settings& settings, const JobIdentity& id, const std::string& store_root,
                                const std::string& image, std::vector<std::string> env) {
    std::vector<std::string> argv = {gantry_cli(settings), "pull", "--quiet", "--report-fd", std::to_string(kReportFd),
                                     "--store", store_root, image};
    if (::access(settings.config.c_str(), F_OK) == 0) env.push_back("GANTRY_CONFIG=" + settings.config);
    // The nodes of this step share a failed producer's error instead of each retrying the same pull
    // in turn (runtime/store/pull.cpp); a killed producer is still taken over.
    env.push_back("GANTRY_PULL_GROUP=" + std::to_string(id.jobid) + "." + std::to_string(id.stepid));
    std::string report;
    RunOptions run;
    run.report = &report;
    run.stop_when_step_signalled = true;
    auto r = run_as_user(id.uid, id.gid, id.groups, argv, env, run);
    if (!r) return r.error().wrap("failed to import docker image " + image);
    return pull_outcome(*r, report, image, "");
}

// Pulls into a trusted store (owned by root or gantry.conf's store_owner, not writable by the job
// user): its images may be kernel-mounted, so what the plugin serves must not depend on anything the
// job user controls, and root must not parse registry bytes. Two halves:
//  1. as the job user: `gantry pull --credentials-only` looks up the user's credentials for the
//     image's registry (the user's files, helpers and identity) and hands them back on a pipe;
//  2. always (cached or not), as the store owner in a clean environment: `gantry pull` of the image
//     with exactly those credentials (on a pipe: never argv, the environment or a file; never the
//     account's own credential files). It asks the registry for the manifest with the user's
//     credentials, so the registry decides whether THIS user may have the image (docs/store.md,
//     "Private images are not handed to users who cannot pull them"), converts it if it is not stored
//     yet, and its report -- digest, file, config -- comes from a process the job user cannot trace,
//     preload into or otherwise tamper with. Forged credentials only get the registry's 401.
Result<PullReport> pull_into_trusted_store(const Settings& settings, const Config& config, const JobIdentity& id,
                                           const std::string& image, std::vector<std::string> env) {
    bool have_config = ::access(settings.config.c_str(), F_OK) == 0;
    std::vector<std::string> argv = {gantry_cli(settings), "pull", "--credentials-only", "--credentials-out-fd",
                                     std::to_string(kCredentialsFd), image};
    if (have_config) env.push_back("GANTRY_CONFIG=" + settings.config);
    std::string credentials;
    RunOptions run;
    run.fd3_out = &credentials;
    run.stop_when_step_signalled = true;
    auto r = run_as_user(id.uid, id.gid, id.groups, argv, env, run);
    if (!r) return r.error().wrap("failed to import docker image " + image);
    if (r->stopped || r->signal != 0) return pull_outcome(*r, "", image, "").error();
    if (r->status != 0) {
        std::string why = last_line(r->err);
        if (starts_with(why, "gantry: ")) why = why.substr(8);
        return make_error("failed to import docker image " + image + ": looking up your registry credentials: " +
                          (why.empty() ? "gantry pull --credentials-only failed" : why.substr(0, 300)));
    }

    // The store owner's identity, from the account database like the job user's.
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* owner = nullptr;
    if (::getpwnam_r(config.store_owner.c_str(), &pw, buf.data(), buf.size(), &owner) != 0 || owner == nullptr)
        return make_error("failed to import docker image " + image + ": store_owner '" + config.store_owner +
                          "' is not an account on this node");
    int ngroups = 64;
    std::vector<gid_t> groups(static_cast<size_t>(ngroups));
    if (::getgrouplist(owner->pw_name, owner->pw_gid, groups.data(), &ngroups) < 0) ngroups = 0;
    groups.resize(static_cast<size_t>(ngroups));
    if (groups.empty()) groups.push_back(owner->pw_gid);

    // The credentials go into a pipe whose read end is the pull's fd 3; they fit the pipe's buffer
    // (they are a few KiB: the user's half was capped), and the write end is non-blocking, so
    // slurmstepd never waits on a reader that has not started: anything larger fails here instead.
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) return system_error("creating a pipe for the credentials");
    (void)::fcntl(pipefd[1], F_SETFL, O_NONBLOCK);
    UniqueFd read_end(pipefd[0]);
    UniqueFd write_end(pipefd[1]);
    (void)::fcntl(write_end.get(), F_SETPIPE_SZ, 1 << 20);
    if (credentials.empty()) credentials = "{}";
    if (::write(write_end.get(), credentials.data(), credentials.size()) != static_cast<ssize_t>(credentials.size()))
        return system_error("handing the credentials to the store owner's pull");
    write_end.reset();

    std::vector<std::string> owner_argv = {gantry_cli(settings), "pull", "--quiet", "--credentials-fd",
                                           std::to_string(kCredentialsFd), "--report-fd", std::to_string(kReportFd),
                                           "--store", config.store_path, image};
    std::vector<std::string> owner_env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", std::string("HOME=") + owner->pw_dir,
                                          std::string("USER=") + owner->pw_name, "LANG=C.UTF-8"};
    if (have_config) owner_env.push_back("GANTRY_CONFIG=" + settings.config);
    owner_env.push_back("GANTRY_PULL_GROUP=" + std::to_string(id.jobid) + "." + std::to_string(id.stepid));
    // Proxies are the site's network path, not code: the pull needs them where the user's half did.
    for (const char* name : {"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"})
        if (auto v = find_env(env, name)) owner_env.push_back(std::string(name) + "=" + *v);
    std::string report;
    RunOptions owner_run;
    owner_run.fd3_in = read_end.get();
    owner_run.report = &report;
    owner_run.stop_when_step_signalled = true;
    auto o = run_as_user(owner->pw_uid, owner->pw_gid, groups, owner_argv, owner_env, owner_run);
    if (!o) return o.error().wrap("failed to import docker image " + image);
    return pull_outcome(*o, report, image, " (as " + config.store_owner + ")");
}

Status do_prepare(spank_t sp, const Settings& settings) {
    StepState& st = state();
    JobOptions& o = options();
    st.config = load_plugin_config(settings);
    auto id = identity(sp);
    if (!id) return id.error();

    // Steps that never run user tasks in a container.
    if (id->stepid == SLURM_EXTERN_CONT || id->stepid == SLURM_INTERACTIVE_STEP) {
        st.run_on_host = true;
        return {};
    }
    bool batch = id->stepid == SLURM_BATCH_SCRIPT;
    if (batch && !settings.sbatch_support) {
        st.run_on_host = true;
        return {};
    }


    std::string name, mode = "auto";
    if (o.name) {
        name = *o.name;
        auto colon = name.rfind(':');
        if (colon != std::string::npos) {
            mode = name.substr(colon + 1);
            name = name.substr(0, colon);
            if (mode != "auto" && mode != "create" && mode != "exec" && mode != "no_exec")
                return make_error("--container-name=" + *o.name + ": unknown mode '" + mode +
                                  "' (valid: auto, create, exec, no_exec)");
        }
        if (name.empty()) return make_error("--container-name: empty name");
        name = container_name(name, id->jobid, settings);
    }

    // An existing named container is reused (auto, exec) or replaced (create).
    if (!name.empty()) {
        auto existing = Container::open(name, st.config);
        // A name is its owner's: another user can neither join, replace nor stop it (with
        // container_scope=global, names are shared by every job on the node).
        if (existing && existing->state().uid != id->uid)
            return make_error("--container-name=" + *o.name + ": a container of that name belongs to another user; choose another name");
        if (existing && (mode == "auto" || mode == "exec" || mode == "no_exec")) {
            if (mode == "no_exec") {
                st.run_on_host = true;
                return {};
            }
            st.joined = existing->state();
            existing->release();
            return {};
        }
        if (existing && mode == "create") {
            (void)existing->stop();
        } else if (!existing && mode == "exec") {
            return make_error("--container-name=" + *o.name + ": no such container (mode exec needs an existing one)");
        }
    }
    if (!o.image) {
        if (!name.empty()) return make_error("--container-name=" + *o.name + ": no such container and no --container-image");
        st.run_on_host = true;
        return {};
    }

    std::vector<std::string> env = job_environment(sp);
    st.uid = id->uid;
    st.gid = id->gid;
    st.groups = id->groups;
    uint32_t node = 0;
    if (o.save && item(sp, S_JOB_NODEID, &node) && node == 0) {
        if (o.save->empty() || (*o.save)[0] != '/')
            return make_error("--container-save=" + *o.save + ": give an absolute path");
        st.save_path = *o.save;
    }
    ContainerSpec spec;
    spec.config = st.config;
    spec.uid = id->uid;
    spec.gid = id->gid;
    if (is_local_image_path(*o.image)) {
        // A squashfs file the user named: user-controlled bytes, never kernel-mounted (trusted=false).
        spec.image_path = *o.image;
    } else {
        auto ref = parse_reference(*o.image);
        // Pyxis scripts grep for this phrase whatever went wrong with the image, a bad name included.
        if (!ref) return ref.error().wrap("failed to import docker image " + *o.image);
        std::string image = *o.image;
        if (ref->digest.empty())
            if (auto pinned = find_env(env, kDigestVar); pinned && validate_digest(*pinned)) image += "@" + *pinned;
        // With store_owner set and a trusted store, the pull runs in two halves (user, store owner) and
        // its image may be kernel-mounted; otherwise the job user pulls and the image is served
        // unprivileged. Root opens nothing in a store the user can write (a per-user store, or any
        // store that is not trusted): what it needs comes in the pull's report.
        auto store_root = job_store_path(st.config, id->uid);
        if (!store_root) return store_root.error().wrap("failed to import docker image " + image);
        bool two_halves = false;
        if (!st.config.store_owner.empty() && !st.config.store_path.empty()) {
            auto store = ImageStore::open(st.config.store_path, false, st.config);  // the admin's path, root-owned or store_owner's
            two_halves = store && store->trusted(st.config);
        }
        auto pulled = two_halves ? pull_into_trusted_store(settings, st.config, *id, image, env)
                                 : pull_as_user(settings, *id, *store_root, image, env);
        if (!pulled) return pulled.error();
        auto cfg = parse_image_config(pulled->config_json);
        if (!cfg) return cfg.error().wrap("failed to import docker image " + image);
        st.digest = pulled->digest;
        spec.image_path = pulled->squashfs_path;
        spec.image_config = std::move(*cfg);
        spec.image_trusted = two_halves;
        if (two_halves) {
            // The trusted store's own file (the launcher checks its ownership again before mounting):
            // a shared lock keeps `gantry gc` from removing it while the step runs.
            auto store = ImageStore::open(st.config.store_path, false, st.config);
            if (store) {
                if (auto in_use = store->open_in_use(pulled->digest)) st.image_in_use = std::move(*in_use);
            }
        }
    }

    auto backend = parse_mount_backend(st.config.mount_backend);
    if (!backend) return backend.error();
    spec.backend = *backend;
    if (o.mounts) {
        auto st_m = parse_mounts(*o.mounts, spec.mounts);
        if (!st_m) return st_m.error();
    }
    if (batch) {
        // The batch script lives in slurmd's spool directory on the host; make it visible inside.
        char** argv = nullptr;
        int argc = 0;
        if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS && argc > 0 && argv[0][0] == '/') {
            std::string dir = std::string(argv[0]).substr(0, std::string(argv[0]).rfind('/'));
            auto m = parse_mount(dir + ":" + dir + ":ro");
            if (m) spec.mounts.push_back(*m);
        }
        // Inner srun steps: Slurm's configuration, munge and this plugin (batch_srun_paths). Safe:
        // read-only binds of paths the job user can already read on the host.
        if (st.config.batch_srun)
            for (const auto& path : batch_srun_paths(env))
                if (auto m = parse_mount(path + ":" + path + ":ro")) spec.mounts.push_back(*m);
    }
    spec.writable = o.writable.value_or(false);
    spec.remap_root = o.remap_root.value_or(false);
    spec.mount_home = o.mount_home.value_or(true);
    if (o.unshare) {
        auto u = parse_unshare(*o.unshare);
        if (!u) return u.error();
        spec.unshare = *u;
    }
    if (o.workdir) spec.workdir = *o.workdir;
    if (o.env) spec.env_names = split_list(*o.env, ',');
    spec.name = name;
    // --- devices and wiring (issue 7, docs/devices.md): GPUs, CDI, EFA for this step's container ---
    auto edits = select_devices(st.config, env, spec.image_config);
    if (!edits) return edits.error();
    // Warnings (memlock for EFA, stale driver libraries) go to the slurmd log here, and to the user's
    // terminal from the first task of node 0 (join_step): this hook's output never reaches srun.
    uint32_t nodeid = 0;
    for (const auto& w : edits->warnings) log::warning(w);
    if (item(sp, S_JOB_NODEID, &nodeid) && nodeid == 0)
        for (const auto& w : edits->warnings) st.device_warnings += "gantry: warning: " + w + "\n";
    if (!edits->summary.empty()) log::info("devices: " + edits->summary);
    // Open MPI creates its session directory below the PMIx client directory, a host path the server
    // fills only after this hook. Below an image directory the rank could not create it, so the
    // directory is bound at the same path; a TmpFS of /tmp needs nothing (the container's own /tmp
    // is the rank's to write).
    if (st.config.pmix) {
        auto dir = pmix_client_tmpdir(env);
        struct stat sb {};
        if (dir && (*dir)[0] == '/' && *dir != "/" && *dir != "/tmp" && ::stat(dir->c_str(), &sb) == 0 &&
            S_ISDIR(sb.st_mode))
            edits->mounts.push_back({*dir, *dir, false});
        // The PMIx server's own directory (the shared-memory stores clients attach to, ds12/ds21) does
        // not exist yet either; its parent, the node's slurmd spool directory, is bound (read-write, same
        // path) for steps launched with --mpi=pmix*, so the directory appears inside once Slurm makes it.
        // Safe: a bind changes no permission; inside, the user reaches only what the same uid reaches on
        // the host (root-owned entries map to the overflow id, remap-root included).
        auto mpi = find_env(env, "SLURM_MPI_TYPE");
        if (!mpi) mpi = slurm_mpi_default();
        auto spool = slurmd_spool_dir(sp, env);
        if (mpi && starts_with(*mpi, "pmix") && spool && *spool != "/" && ::stat(spool->c_str(), &sb) == 0 &&
            S_ISDIR(sb.st_mode))
            edits->mounts.push_back({*spool, *spool, false});
    }
    spec.devices = std::move(*edits);
    // --- end devices ---
    spec.detach = !name.empty();

    if (o.entrypoint.value_or(settings.execute_entrypoint) && !spec.image_config.entrypoint.empty()) {
        st.entrypoint = spec.image_config.entrypoint;
        st.entrypoint_log = o.entrypoint_log.value_or(false);
        st.entry_helper = helper_path(settings, "gantry-entry", GANTRY_ENTRY_INSTALL_PATH);
    }

    auto created = Container::create(spec);
    if (!created) return created.error();
    st.joined = created->state();
    if (name.empty()) {
        st.container = std::move(*created);  // stopped when the step's last task exits
    } else {
        created->release();  // outlives the step; stopped by the job epilog (container_scope=job)
    }
    if (mode == "no_exec") st.run_on_host = true;
    return {};
}

}  // namespace

void watch_step_signals() { state().signals.emplace(); }

void pin_image_digest(spank_t sp, const Settings& settings) {
    JobOptions& o = options();
    if (!o.image || is_local_image_path(*o.image)) return;
    auto ref = parse_reference(*o.image);
    if (!ref || !ref->digest.empty()) return;
    Config config = load_plugin_config(settings);
    // srun waits for this: one quick try, and the nodes resolve the tag themselves when it fails.
    RegistryOptions quick;
    quick.max_attempts = 2;
    RegistryClient client(config, quick);
    auto digest = client.resolve_digest(*ref, Platform::host());
    if (digest) spank_setenv(sp, kDigestVar, digest->c_str(), 1);
}

Status prepare_step(spank_t sp, const Settings& settings) {
    auto st = do_prepare(sp, settings);
    if (!st) state().error = "gantry: " + st.error().message;
    return st;
}

Status join_step(spank_t sp) {
    StepState& st = state();
    if (!st.error.empty()) return make_error(st.error.substr(8));
    if (st.run_on_host || st.joined.holder_pid <= 0) return {};
    std::vector<std::string> before = job_environment(sp);
    // --- devices (issue 7): the selection's warnings, once per step, on the user's terminal ---
    if (!st.device_warnings.empty() && find_env(before, "SLURM_LOCALID").value_or("") == "0")
        (void)!::write(STDERR_FILENO, st.device_warnings.data(), st.device_warnings.size());
    // The entrypoint helper is opened before entering the container: it is our file on the host, and
    // the task execs it as /proc/self/fd/N from inside, where the image need not contain it.
    UniqueFd entry;
    if (!st.entrypoint.empty()) {
        entry.reset(::open(st.entry_helper.c_str(), O_RDONLY));  // inherited by the exec on purpose
        if (!entry) return system_error("opening the entrypoint helper " + st.entry_helper);
    }
    GANTRY_TRY(join(st.joined));
    // Pyxis's rule (docs/user.md): the job's variables come in unless the image defines them.
    std::vector<std::string> after = container_environment(st.joined.defaults, before, EnvironmentRule::pyxis);
    // --- devices and wiring (issue 7): PMIx MCA mapping and PyTorch ranks of this task ---
    for (auto& e : task_environment(st.config, st.joined.defaults.image_env, before)) after.push_back(std::move(e));
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
        // Slurm execs argv[0] after this hook; the array is Slurm's, the string is ours (never freed:
        // the process execs right away).
        argv[0] = ::strdup(("/proc/self/fd/" + std::to_string(entry.release())).c_str());
    }
    for (const auto& [k, v] : wanted) spank_setenv(sp, k.c_str(), v.c_str(), 1);
    return {};
}

void task_exited(spank_t sp, const Settings& settings) {
    uint32_t local_tasks = 0;
    if (!item(sp, S_JOB_LOCAL_TASK_COUNT, &local_tasks)) return;
    if (++state().tasks_exited >= local_tasks) finish_step(sp, settings);
}

// The mount points below "/" in a process's view, relative to its root ("proc", "etc/hosts"), decoded
// from /proc/PID/mountinfo (field 5, with octal escapes such as \040 for a space). Left out: the
// mounts that make up the root itself — a read-only container's "/" is a skeleton whose top-level
// directories are clones of the image mount (squashfs, squashfuse) or small overlays over it (/etc):
// those are the image, not something mounted over it.
Result<std::vector<std::string>> mount_points_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/mountinfo");
    if (!in) return system_error("reading the mounts of process " + std::to_string(pid));
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string id, parent, devno, root, point;
        if (!(fields >> id >> parent >> devno >> root >> point)) continue;
        std::string fstype;
        if (auto dash = line.find(" - "); dash != std::string::npos)
            fstype = line.substr(dash + 3, line.find(' ', dash + 3) - (dash + 3));
        bool image_part = fstype == "squashfs" || fstype == "overlay" || starts_with(fstype, "fuse.squashfuse");
        if (image_part && point.size() > 1 && point.find('/', 1) == std::string::npos) continue;
        std::string decoded;
        for (size_t i = 0; i < point.size(); ++i) {
            if (point[i] == '\\' && i + 3 < point.size()) {
                decoded.push_back(static_cast<char>(std::stoi(point.substr(i + 1, 3), nullptr, 8)));
                i += 3;
            } else {
                decoded.push_back(point[i]);
            }
        }
        if (decoded.size() > 1 && decoded[0] == '/') out.push_back(decoded.substr(1));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

// Writes the container's root file system (image plus the step's writes) as squashfs, as the job user
// inside the container's user namespace: the tree is the user's, so reading it must not use root's
// rights. /proc/PID/root enters the holder's mount namespace; what is mounted over the root (/proc,
// /sys, /dev, /tmp, every bind mount: see mount_points_of) is excluded; -all-root stores every file as
// root's, as Enroot's export does.
Status save_container(const StepState& st) {
    std::string pid = std::to_string(st.joined.holder_pid);
    std::string root = "/proc/self/fd/" + std::to_string(kRootFd) + "/";
    std::string tmp = st.save_path + ".partial";
    UniqueFd userns(::open(("/proc/" + pid + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    if (!userns) return system_error("--container-save: opening the container's user namespace");
    std::vector<std::string> argv = {"/usr/bin/mksquashfs", root, tmp, "-noappend", "-all-root", "-comp", "lz4",
                                     "-quiet", "-no-progress", "-e"};
    // Everything mounted over the root file system (/proc, /sys, /dev, /tmp, binds) stays out. Not
    // -one-file-system: overlayfs reports its files with the device of the layer they come from.
    auto mounts = mount_points_of(st.joined.holder_pid);
    if (!mounts) return mounts.error().wrap("--container-save");
    argv.insert(argv.end(), mounts->begin(), mounts->end());
    if (mounts->empty()) argv.pop_back();
    RunOptions inside;
    inside.userns_fd = userns.get();
    inside.root_of = "/proc/" + pid + "/root";
    auto r = run_as_user(st.uid, st.gid, st.groups, argv, {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, inside);
    if (!r) return r.error().wrap("--container-save " + st.save_path);
    if (r->status != 0) {
        ::unlink(tmp.c_str());
        return make_error("--container-save " + st.save_path + ": mksquashfs failed: " + last_line(r->err + r->out));
    }
    // Renamed as the user too, so a path the user may not write stays unwritten.
    auto mv = run_as_user(st.uid, st.gid, st.groups, {"/bin/mv", "-f", tmp, st.save_path}, {"PATH=/usr/bin:/bin"});
    if (!mv || mv->status != 0) return make_error("--container-save: could not rename " + tmp + " to " + st.save_path);
    return {};
}

void finish_step(spank_t, const Settings&) {
    StepState& st = state();
    if (!st.save_path.empty() && st.joined.holder_pid > 0) {
        if (auto saved = save_container(st); !saved) slurm_error("gantry: %s", saved.error().message.c_str());
        st.save_path.clear();
    }
    if (st.container) {
        (void)st.container->stop();
        st.container.reset();
    }
    st.image_in_use.reset();
}

void clean_up_job(spank_t sp, const Settings& settings) {
    (void)release_idle_mounts(load_plugin_config(settings));  // node-wide kernel image mounts idle too long
    if (settings.container_scope != "job") return;
    uint32_t jobid = 0;
    if (!item(sp, S_JOB_ID, &jobid)) return;
    Config config = load_plugin_config(settings);
    std::string prefix = "pyxis_" + std::to_string(jobid) + "_";
    for (const auto& name : list_containers(config)) {
        if (!starts_with(name, prefix)) continue;
        if (auto c = Container::open(name, config)) (void)c->stop();
    }
}

}  // namespace gantry::plugin
