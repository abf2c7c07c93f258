// NewBlockedThreads (include/gantry/threads.hpp): the plugin's watch on slurmstepd's new threads, read from
// /proc/self/task.
#include "gantry/threads.hpp"

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <vector>

namespace gantry {
namespace {

std::vector<pid_t> threads_now() {
    std::vector<pid_t> out;
    DIR* dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return out;
    while (dirent* e = ::readdir(dir)) {
        char* end = nullptr;
        long tid = std::strtol(e->d_name, &end, 10);
        if (end != e->d_name && *end == '\0' && tid > 0) out.push_back(static_cast<pid_t>(tid));
    }
    ::closedir(dir);
    return out;
}

// The thread's current system call as the kernel reports it ("202 0x7f.. 0x80 ..." while it waits in
// futex, "running" while it runs), or "" when the thread is gone.
std::string syscall_of(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
    std::string line;
    std::getline(in, line);
    return line;
}

bool in_futex_wait(const std::string& line) {
    char* end = nullptr;
    long nr = std::strtol(line.c_str(), &end, 10);
    return end != line.c_str() && nr == SYS_futex;
}

}  // namespace

NewBlockedThreads::NewBlockedThreads() {
    for (pid_t tid : threads_now()) before_.insert(tid);
}

bool NewBlockedThreads::check(std::chrono::milliseconds at_least, std::string* which) {
    auto now = std::chrono::steady_clock::now();
    std::map<pid_t, Seen> still;
    bool found = false;
    for (pid_t tid : threads_now()) {
        if (before_.count(tid) != 0) continue;
        std::string line = syscall_of(tid);
        if (!in_futex_wait(line)) continue;  // running, sleeping elsewhere (reading a socket), or gone
        // Only the futex number and its word's address: the remaining arguments may differ per retry.
        std::string wait = line.substr(0, line.find(' ', line.find(' ') + 1));
        auto old = blocked_.find(tid);
        Seen seen{wait, now};
        if (old != blocked_.end() && old->second.wait == wait) seen.since = old->second.since;
        if (now - seen.since >= at_least) {
            found = true;
            if (which != nullptr) *which = "tid " + std::to_string(tid);
        }
        still.emplace(tid, seen);
    }
    blocked_ = std::move(still);
    return found;
}

}  // namespace gantry
