// probe_fabric: check_fabric (runtime/devices/fabric_check.cpp) run by a child inside a container,
// for `gantry run` and `gantry doctor --image` (docs/devices.md, "Proving the fabric").
#include "gantry/fabric_probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>

#include "gantry/fd.hpp"

namespace gantry {
namespace {

constexpr int kDeadlineMs = 30000;

// The child's answer, one field a line: "ok" or "problem", then the kind, the cause, the fix, the
// summary (none of them holds a newline: they are made of file names and fixed words).
[[noreturn]] void answer_from_inside(int fd, const ContainerState& container, const std::vector<std::string>& env) {
    std::string text;
    if (auto st = join(container); !st) {
        text = "error\n" + st.error().message + "\n";
    } else {
        auto r = check_fabric(env);
        text = r.problem ? "problem\n" + std::to_string(static_cast<int>(r.problem->kind)) + "\n" + r.problem->cause +
                               "\n" + r.problem->fix + "\n" + r.summary + "\n"
                         : "ok\n\n\n\n" + r.summary + "\n";
    }
    (void)!::write(fd, text.data(), text.size());
    ::_exit(0);
}

}  // namespace

Result<FabricReport> probe_fabric(const ContainerState& container, const std::vector<std::string>& caller_env) {
    auto env = container_environment(container.defaults, caller_env, EnvironmentRule::docker);
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return system_error("checking the fabric: pipe");
    UniqueFd rd(p[0]), wr(p[1]);
    pid_t child = ::fork();
    if (child < 0) return system_error("checking the fabric: fork");
    if (child == 0) answer_from_inside(wr.get(), container, env);
    wr.reset();
    std::string text;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDeadlineMs);
    while (text.size() < 64 * 1024) {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
        struct pollfd pfd {
            rd.get(), POLLIN, 0
        };
        if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0) break;
        char buf[4096];
        ssize_t n = ::read(rd.get(), buf, sizeof buf);
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    ::kill(child, SIGKILL);  // ended already, unless it ran past the deadline
    ::waitpid(child, nullptr, 0);
    std::vector<std::string> f;
    for (size_t at = 0; at < text.size();) {
        auto nl = text.find('\n', at);
        if (nl == std::string::npos) break;
        f.push_back(text.substr(at, nl - at));
        at = nl + 1;
    }
    if (f.size() >= 2 && f[0] == "error") return make_error("checking the fabric: " + f[1]);
    if (f.size() < 5) return make_error("checking the fabric: no answer from inside the container within 30 s");
    FabricReport r;
    r.summary = f[4];
    if (f[0] == "problem") r.problem = FabricProblem{static_cast<FabricProblem::Kind>(std::stoi(f[1])), f[2], f[3]};
    return r;
}

}  // namespace gantry
