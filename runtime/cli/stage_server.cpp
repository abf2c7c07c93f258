// `gantry stage-server`: the login nodes' stage server for a trusted store (docs/admin.md, "Staging into
// a trusted store"). It runs as gantry.conf's store_owner, never as root: the submitting user cannot
// write the store, so sbatch hands the pull of the digest it resolved, with the user's credentials for
// that registry, to this service (include/gantry/stage_service.hpp: protocol, accept loop, limits).
// What a request does is exactly what a node does for a step: `gantry pull --credentials-fd 3
// --report-fd 4` as the store account with those credentials and nothing else (plugin/pull.cpp,
// pull_into_trusted_store), so the registry decides whether this user may have the image, one producer
// per digest holds across login nodes and compute nodes (the store's lock), and every registry byte is
// parsed by an unprivileged process of the store account.
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "command.hpp"
#include "common.hpp"
#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/fd.hpp"
#include "gantry/log.hpp"
#include "gantry/pull_report.hpp"
#include "gantry/spawn.hpp"
#include "gantry/stage_service.hpp"
#include "gantry/strings.hpp"

namespace gantry::cli {
namespace {

// A staged pull may take as long as `gantry stage --background` lets one (its default deadline).
constexpr std::chrono::hours kPullDeadline{1};

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) {
    g_stop = true;
}

struct ServerArgs {
    std::string socket;
    int read_seconds = 10;
    unsigned max_requests = 32, max_per_uid = 4;
};

// The socket systemd passed (socket activation: LISTEN_PID is us, one descriptor at 3), or -1.
int socket_from_systemd() {
    const Environment& env = environment();
    if (!env.listen_pid.set || !env.listen_fds.set) return -1;
    if (std::strtol(env.listen_pid.value.c_str(), nullptr, 10) != ::getpid() ||
        std::strtol(env.listen_fds.value.c_str(), nullptr, 10) != 1)
        return -1;
    // Not for the pulls we start (they are no socket-activated services).
    unset_environment_variable("LISTEN_PID");
    unset_environment_variable("LISTEN_FDS");
    unset_environment_variable("LISTEN_FDNAMES");
    (void)::fcntl(3, F_SETFD, FD_CLOEXEC);
    return 3;
}

// The one environment the pulls get: the account's own basics, the config we were started with, and
// the site's proxies (its network path); nothing a client sent.
std::vector<std::string> pull_environment(const passwd& self) {
    const Environment& env = environment();
    return store_owner_pull_environment(self.pw_dir, self.pw_name, env.gantry_config.value, env.proxies);
}

// The store account's pull of one request, as a node's (pull_into_trusted_store, the same recipe:
// auth.hpp): the credentials on a pipe as fd 3, the typed report on fd 4. Returns the answer line.
std::string pull_for(const std::string& store, const std::vector<std::string>& env, const StageRequest& r) {
    // At most kMaxStageRequestBytes: it fits a pipe's buffer, so this write never waits on the pull.
    auto read_end = hand_over_pipe(r.credentials);
    if (!read_end) return "error " + read_end.error().message;
    std::string report;
    ProcessRequest rq;
    rq.argv = store_owner_pull_argv(self_program(), store, r.image, false);
    rq.env = env;
    rq.inputs = {{read_end->get(), kHandOverCredentialsFd}};
    rq.outputs = {{kHandOverReportFd, &report, kMaxPullReportBytes, "report"}};
    rq.timeout = kPullDeadline;
    auto o = spawn(rq);
    if (!o) return "error " + o.error().message;
    auto rep = decode_pull_report(report);
    if (!rep) {
        std::string why = o->timed_out ? "the pull ran past its deadline of 1 h" : last_line(o->err);
        if (starts_with(why, "gantry: ")) why = why.substr(8);
        return "error " + (why.empty() ? "the pull ended without a report" : why.substr(0, 500));
    }
    if (rep->error != PullErrorKind::none) return "error " + rep->message.substr(0, 500);
    return "ok " + rep->digest;
}

int cmd_stage_server(const ServerArgs& a) {
    // Root must never parse registry bytes or act for users here: the server is the store account's.
    if (::geteuid() == 0)
        return fail(
            make_error("stage-server: runs as the store account (gantry.conf store_owner), never as root; "
                       "start it with systemd's gantry-stage.service or as that account"));
    auto config = load_config();
    if (!config) return fail(config.error());
    if (config->store_owner.empty() || config->store_path.empty())
        return fail(
            make_error("stage-server: gantry.conf sets no store_path and store_owner: the stage server "
                       "fills a trusted store only (other stores are filled by their users)"));
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* self = nullptr;
    if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &self) != 0 || self == nullptr)
        return fail(make_error("stage-server: uid " + std::to_string(::geteuid()) + " has no account entry"));
    if (config->store_owner != self->pw_name)
        return fail(make_error("stage-server: runs as store_owner '" + config->store_owner + "', not as '" +
                               self->pw_name + "'"));
    auto store = open_store(*config, "", false);
    if (!store) return fail(store.error().wrap("stage-server"));
    if (!store->trusted(*config) || ::access(store->root().c_str(), W_OK) != 0)
        return fail(make_error("stage-server: the store " + store->root() + " is not a trusted store that " +
                               self->pw_name + " may write (docs/store.md, \"Trusted shared store\")"));
    if (a.read_seconds < 1 || a.read_seconds > 600 || a.max_requests < 1 || a.max_per_uid < 1)
        return usage_error(make_error("stage-server: --read-timeout 1-600, --max-requests and --max-per-user >= 1"));

    int listen_fd = socket_from_systemd();
    if (listen_fd < 0) {
        const std::string path = a.socket.empty() ? config->stage_socket : a.socket;
        if (path.empty())
            return usage_error(
                make_error("stage-server: no socket: pass --socket PATH, set stage_socket in "
                           "gantry.conf, or start it through gantry-stage.socket"));
        auto fd = listen_on_stage_socket(path);
        if (!fd) return fail(fd.error().wrap("stage-server"));
        listen_fd = *fd;
        log::info("stage-server: listening on " + path + " for " + store->root());
    }
    UniqueFd listening(listen_fd);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);

    const std::string root = store->root();
    const std::vector<std::string> env = pull_environment(*self);
    StageServerOptions o;
    o.listen_fd = listening.get();
    o.read_deadline = std::chrono::seconds(a.read_seconds);
    o.max_requests = a.max_requests;
    o.max_requests_per_uid = a.max_per_uid;
    o.handle = [&](const StagePeer&, const StageRequest& r) { return pull_for(root, env, r); };
    o.should_stop = [] { return g_stop.load(); };
    o.note = [](const std::string& line) { log::info("stage-server: " + line); };
    if (auto st = serve_stage_requests(o); !st) return fail(st.error().wrap("stage-server"));
    return 0;
}

VerbRunner define_stage_server(CLI::App& app) {
    auto a = std::make_shared<ServerArgs>();
    app.add_option("--socket", a->socket,
                   "the Unix socket to listen on (default: gantry.conf stage_socket;\n"
                   "none with systemd's socket activation)")
        ->type_name("PATH");
    app.add_option("--read-timeout", a->read_seconds, "seconds a client has to send its request (default 10)")
        ->type_name("SECONDS");
    app.add_option("--max-requests", a->max_requests, "requests served at once, all users (default 32)")
        ->type_name("N");
    app.add_option("--max-per-user", a->max_per_uid, "requests served at once for one uid (default 4)")->type_name("N");
    return {[a] { return cmd_stage_server(*a); }, {}};
}

const Registration reg_stage_server(
    {{"stage-server", "stage-server [--socket PATH]   the login nodes' stager for a trusted store (as store_owner)",
      "[OPTIONS]",
      "Run by the trusted store's account (gantry.conf store_owner, never root) on login nodes: sbatch,\n"
      "salloc and gantry stage hand it IMAGE@DIGEST and the user's credentials for that registry over\n"
      "gantry.conf's stage_socket, and it pulls that digest into the store with exactly those\n"
      "credentials, as the nodes' store-account pull does (docs/admin.md, \"Staging into a trusted\n"
      "store\"). Who asks is what the kernel says (SO_PEERCRED); each request is read under a deadline\n"
      "and a size limit in a process of its own. Answers one line: 'ok DIGEST' or 'error TEXT'."},
     define_stage_server});

}  // namespace
}  // namespace gantry::cli
