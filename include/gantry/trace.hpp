// Trace points for bench/srun.sh --breakdown: off unless enabled, then one line per point,
// "<CLOCK_MONOTONIC ns> <pid> <what>\n", written with one write() to a descriptor opened for append
// (the plugin's `trace=` plugstack.conf argument opens it in slurmstepd and srun; the container holder
// gets it as GANTRY_TRACE_FD). CLOCK_MONOTONIC is the node's: points of all processes on one node, and
// of all harness nodes (one kernel), order by it. A diagnostic: whoever holds the descriptor may write
// what they like to the file, so it is for benches, not for records anyone trusts.
//
// The same points feed start-up telemetry (issue #37, include/gantry/telemetry.hpp): a recorder set with
// set_recorder() is told every point in this process, whether or not a file is traced to, so a step's
// phases are timed once, by these points, for both.
#pragma once

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <string_view>

namespace gantry::trace {

inline int g_fd = -1;
// Told each point (CLOCK_MONOTONIC ns, what, detail); must not throw.
using Recorder = void (*)(long long ns, std::string_view what, std::string_view detail);
inline Recorder g_recorder = nullptr;

inline void enable(int fd) {
    g_fd = fd;
}
inline void set_recorder(Recorder r) {
    g_recorder = r;
}
// The trace file's descriptor (-1: none), which the holder inherits; on(): anyone listens.
inline int descriptor() {
    return g_fd;
}
inline bool on() {
    return g_fd >= 0 || g_recorder != nullptr;
}

inline void point(std::string_view what, std::string_view detail = {}) {
    if (!on()) return;
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    if (g_recorder != nullptr) g_recorder(static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec, what, detail);
    if (g_fd < 0) return;
    char line[320];
    const char* w = what.empty() ? "" : what.data();
    const char* d = detail.empty() ? "" : detail.data();
    int n = std::snprintf(line, sizeof line, "%lld %d %.*s%s%.*s\n",
                          static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec, static_cast<int>(::getpid()),
                          static_cast<int>(what.size() > 100 ? 100 : what.size()), w, detail.empty() ? "" : " ",
                          static_cast<int>(detail.size() > 200 ? 200 : detail.size()), d);
    if (n > 0)
        (void)!::write(g_fd, line, static_cast<size_t>(n) < sizeof line ? static_cast<size_t>(n) : sizeof line - 1);
}

// A phase: a point when it begins ("NAME +") and when it ends ("NAME -").
class Phase {
public:
    explicit Phase(std::string_view name) : name_(name) {
        if (on()) point(name_, "+");
    }
    ~Phase() {
        if (on()) point(name_, "-");
    }
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;

private:
    std::string_view name_;
};

}  // namespace gantry::trace
