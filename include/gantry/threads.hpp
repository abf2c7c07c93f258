// Watching this process's own threads: which ones started after a point and now wait on a futex.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <set>
#include <string>

namespace gantry {

// The threads of this process that appear after construction and then stay blocked in one futex wait
// (a condition variable or a lock) for a while. The plugin uses it inside slurmstepd: a request to
// signal or end a step that has not started yet (scancel, srun's Ctrl-C, the end of the job after a
// node failure or the time limit) is one new thread of slurmstepd's message handler that waits on the
// step's state until the tasks run. Threads present at construction (slurmstepd's own) are ignored.
class NewBlockedThreads {
public:
    NewBlockedThreads();

    // Looks at the threads now. True when a new thread has been seen in the same futex wait (same
    // futex word) at observations spanning at least `at_least`; `which` then names it ("tid 123").
    bool check(std::chrono::milliseconds at_least, std::string* which = nullptr);

private:
    struct Seen {
        std::string wait;  // the syscall line: number and arguments, the futex word's address among them
        std::chrono::steady_clock::time_point since;
    };
    std::set<pid_t> before_;
    std::map<pid_t, Seen> blocked_;
};

}  // namespace gantry
