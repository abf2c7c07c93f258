// Runs credential helpers (`docker-credential-<name> get`), Enroot password commands and AWS
// credential_process: argv only (no shell of ours), stdin from a pipe filled before the program starts,
// stdout/stderr captured and capped, the program in its own process group so that a timeout kills it
// and everything it started. The running is core's spawn() (include/gantry/spawn.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/fd.hpp"
#include "gantry/spawn.hpp"

extern char** environ;

namespace gantry::auth {

double helper_timeout_s() {
    const std::string& text = environment().gantry_credential_timeout.value;
    if (!text.empty()) {
        const char* v = text.c_str();
        char* end = nullptr;
        double d = std::strtod(v, &end);
        if (end != v && *end == '\0' && d > 0 && d < 3600) return d;
    }
    return 10.0;
}

Result<CommandOutput> run_command(const std::vector<std::string>& argv, const std::string& input, double timeout_s) {
    if (argv.empty()) return make_error("running a command: no command");
    std::string program = find_program(argv[0]);
    if (program.empty()) return system_error("running " + argv[0], ENOENT);
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return system_error("running " + argv[0] + ": pipe");
    UniqueFd in_r(in[0]), in_w(in[1]);
    // The input (a registry name) is far below the pipe's capacity: writing it before the program
    // exists means one that exits without reading cannot raise SIGPIPE in this process.
    if (input.size() > 60000) return make_error("running " + argv[0] + ": input too large");
    if (!input.empty() && ::write(in_w.get(), input.data(), input.size()) != static_cast<ssize_t>(input.size()))
        return system_error("running " + argv[0] + ": writing its input");
    in_w.reset();

    ProcessRequest r;
    r.argv = argv;
    r.argv[0] = program;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) r.env.emplace_back(*e);
    r.inputs = {{in_r.get(), 0}};
    r.stdout_cap = 1u << 20;
    r.stderr_cap = 1u << 20;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    r.should_stop = [&] { return std::chrono::steady_clock::now() >= deadline; };
    auto ran = spawn(r);
    if (!ran) return ran.error().wrap("running " + argv[0]);
    if (ran->stopped) {
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%g", timeout_s);
        return make_error("running " + argv[0] + ": no answer after " + secs +
                          " s (killed; GANTRY_CREDENTIAL_TIMEOUT)");
    }
    CommandOutput result;
    result.exit_status = ran->status;
    result.out = std::move(ran->out);
    result.err = std::move(ran->err);
    return result;
}

}  // namespace gantry::auth
