// Running a helper program from a privileged or long-lived process (the SPANK plugin inside root's
// slurmstepd): fork + exec with an explicit identity, an explicit environment and explicit
// descriptors, every output captured with a cap. Between fork and exec the child only makes system
// calls, so a multi-threaded caller cannot deadlock in it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry {

struct ProcessIdentity {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;  // supplementary groups; empty: just gid
};

// uid with gid and the supplementary groups the account database gives it (just gid when it has no
// entry): the identity a helper acting for that user runs with.
ProcessIdentity user_identity(uid_t uid, gid_t gid);

// The program `name` as execvp would run it, as an absolute path for ProcessRequest::argv: a name with
// a '/' as it is, else the first executable in PATH, then /usr/bin, /usr/local/bin, /bin; "" if none.
std::string find_program(const std::string& name);

struct ProcessRequest {
    std::vector<std::string> argv;  // argv[0] is an absolute path (no PATH search)
    std::vector<std::string> env;   // the whole environment
    // Drop to this identity for good (groups, gid, uid: verified) before exec; unset: stay as we are.
    std::optional<ProcessIdentity> identity;
    // After dropping, enter this user namespace (one the identity owns).
    int userns_fd = -1;
    // After entering it, open this directory (e.g. "/proc/PID/root") as descriptor `root_as`.
    std::string root_of;
    int root_as = 200;
    // Descriptors the program gets: `fd` of ours becomes its `as`.
    struct Input {
        int fd;
        int as;
    };
    std::vector<Input> inputs;
    // Pipes the program writes to as descriptor `as`; collected into `text`, at most `cap` bytes.
    struct Output {
        int as;
        std::string* text;
        size_t cap;
        std::string name;  // for messages: "report", "credentials pipe"
    };
    std::vector<Output> outputs;
    size_t stdout_cap = 64 * 1024;
    size_t stderr_cap = 64 * 1024;
    // PR_SET_NO_NEW_PRIVS before exec: the program (e.g. an image's own ldconfig) can never gain
    // privileges through setuid bits or file capabilities.
    bool no_new_privs = false;
    // Polled about every 200 ms while the program runs: true stops it (SIGKILL to its process group).
    // Honoured until the program has ended, whatever it did with its pipes.
    std::function<bool()> should_stop;
    // Non-zero: the program is stopped the same way once it has run this long (ProcessOutcome::timed_out).
    // Root's waits on anything a user influences (a helper reading the user's files) carry one.
    std::chrono::milliseconds timeout{0};
    // start_process only: a session of its own (setsid) instead of a process group of its own, and
    // `daemonize`: started through an intermediate child that exits at once, so that the program is
    // no child of ours (it outlives us; the kernel reparents it).
    bool own_session = false;
    bool daemonize = false;
    // Non-zero: the program gets this signal when the thread that started it ends (PR_SET_PDEATHSIG,
    // set after the identity switch, which would clear it), e.g. a daemon that serves only us.
    int death_signal = 0;
};

struct ProcessOutcome {
    int status = -1;         // exit status, or 128 + signal
    int signal = 0;          // the signal that ended it, 0 when it exited
    bool stopped = false;    // killed because should_stop said so
    bool timed_out = false;  // killed because it ran past ProcessRequest::timeout
    std::string out, err;    // its stdout and stderr (capped)
};

// Runs the request to completion. The child is watched through a pidfd: a stop request or the
// deadline ends it (its process group is killed and it is reaped) even after it closed every pipe; a
// child the kernel keeps from dying for 5 s after SIGKILL is an error (left unreaped). The program starts with no
// signal blocked, whatever the caller blocks. It runs in a process group of its own (so that stopping it stops what it
// started), with stdin from /dev/null (unless `inputs` names descriptor 0) and only the descriptors named above. A
// program that writes more than a cap to any stream is killed and this returns an error naming the stream, so the
// caller's memory stays bounded whatever the program (or an LD_PRELOAD in its environment) does. Errors also for: a
// failed identity switch, namespace entry or exec.
Result<ProcessOutcome> spawn(const ProcessRequest& request);

// Why the program did not end by itself, for a one-line error: "the step is being stopped" or "no
// answer within N s (SETTING in gantry.conf)"; "" when it did.
std::string stop_reason(const ProcessRequest& request, const ProcessOutcome& outcome, const std::string& setting);

// Starts the request's program and returns without waiting for it: the same identity, namespace,
// descriptor and environment rules as spawn(), but nothing is captured (`outputs`, the caps and
// should_stop are ignored): stdin, stdout and stderr are /dev/null unless `inputs` names them. Returns the program's
// pid, to reap with waitpid; 0 with `daemonize` (the program is no child of ours): then `daemon_pidfd`, when given,
// receives a pidfd of the program, taken while its pid could not yet have been reused (so a caller can end it, e.g.
// past a deadline). A failure before exec shows as its exit status 125-127.
Result<pid_t> start_process(const ProcessRequest& request, UniqueFd* daemon_pidfd = nullptr);

}  // namespace gantry
