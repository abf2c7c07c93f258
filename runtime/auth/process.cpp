// Runs credential helpers (`docker-credential-<name> get`) and Enroot password commands: argv only
// (no shell of ours), stdin from a pipe filled before the child starts, stdout/stderr captured, the
// child in its own process group so that a timeout kills it and everything it started.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "gantry/auth.hpp"
#include "gantry/fd.hpp"

extern char** environ;

namespace gantry::auth {

double helper_timeout_s() {
    const char* v = std::getenv("GANTRY_CREDENTIAL_TIMEOUT");
    if (v != nullptr && *v != '\0') {
        char* end = nullptr;
        double d = std::strtod(v, &end);
        if (end != v && *end == '\0' && d > 0 && d < 3600) return d;
    }
    return 10.0;
}

Result<CommandOutput> run_command(const std::vector<std::string>& argv, const std::string& input, double timeout_s) {
    if (argv.empty()) return make_error("running a command: no command");
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return system_error("running " + argv[0] + ": pipe");
    UniqueFd in_r(in[0]), in_w(in[1]);
    if (::pipe2(out, O_CLOEXEC) != 0) return system_error("running " + argv[0] + ": pipe");
    UniqueFd out_r(out[0]), out_w(out[1]);
    if (::pipe2(err, O_CLOEXEC) != 0) return system_error("running " + argv[0] + ": pipe");
    UniqueFd err_r(err[0]), err_w(err[1]);
    // The input (a registry name) is far below the pipe's capacity: writing it before the child
    // exists means a child that exits without reading cannot raise SIGPIPE in this process.
    if (input.size() > 60000) return make_error("running " + argv[0] + ": input too large");
    if (!input.empty() && ::write(in_w.get(), input.data(), input.size()) != static_cast<ssize_t>(input.size()))
        return system_error("running " + argv[0] + ": writing its input");
    in_w.reset();

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in_r.get(), 0);
    posix_spawn_file_actions_adddup2(&fa, out_w.get(), 1);
    posix_spawn_file_actions_adddup2(&fa, err_w.get(), 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, &attr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) return system_error("running " + argv[0], rc);
    in_r.reset();
    out_w.reset();
    err_w.reset();

    CommandOutput result;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    bool timed_out = false;
    const size_t cap = 1u << 20;
    while (out_r || err_r) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd p[2];
        int n = 0;
        if (out_r) p[n++] = {out_r.get(), POLLIN, 0};
        if (err_r) p[n++] = {err_r.get(), POLLIN, 0};
        int r = ::poll(p, n, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        for (int i = 0; i < n; ++i) {
            if (p[i].revents == 0) continue;
            char buf[8192];
            ssize_t got = ::read(p[i].fd, buf, sizeof(buf));
            bool is_out = out_r && p[i].fd == out_r.get();
            if (got <= 0) {
                (is_out ? out_r : err_r).reset();
                continue;
            }
            std::string& dst = is_out ? result.out : result.err;
            if (dst.size() < cap) dst.append(buf, static_cast<size_t>(got));
        }
    }
    // Both pipes closed: the child may still linger (it closed them itself); wait up to the deadline.
    int status = 0;
    while (!timed_out) {
        pid_t w = ::waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) break;
        if (std::chrono::steady_clock::now() >= deadline)
            timed_out = true;
        else
            ::usleep(10000);
    }
    if (timed_out) {
        // The child and anything it started share its process group, which it leads: kill them all.
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%g", timeout_s);
        return make_error("running " + argv[0] + ": no answer after " + secs +
                          " s (killed; GANTRY_CREDENTIAL_TIMEOUT)");
    }
    result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return result;
}

}  // namespace gantry::auth
