// The stage server's protocol and its accept loop (include/gantry/stage_service.hpp). What a request
// makes the server do (the store account's pull) is the CLI's: runtime/cli/stage_server.cpp.
#include "gantry/stage_service.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "gantry/auth.hpp"
#include "gantry/digest.hpp"
#include "gantry/fd.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point end) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1'000'000));
}

// Waits until `fd` is ready for `events` or `end` passes; false on the deadline.
Result<bool> wait_ready(int fd, short events, Clock::time_point end) {
    for (;;) {
        pollfd p{fd, events, 0};
        int n = ::poll(&p, 1, remaining_ms(end));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return system_error("waiting on the stage socket");
        return n > 0;
    }
}

// One line (up to '\n' or the end of the stream) of at most `cap` bytes, read before `end`.
Result<std::string> read_line(int fd, size_t cap, Clock::time_point end, const std::string& what) {
    std::string line;
    char buf[4096];
    for (;;) {
        auto ready = wait_ready(fd, POLLIN, end);
        if (!ready) return ready.error();
        if (!*ready) return make_error(what + ": nothing complete within the deadline");
        ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return system_error(what);
        if (n == 0) {
            if (line.empty()) return make_error(what + ": the other side closed without a line");
            return line;
        }
        line.append(buf, static_cast<size_t>(n));
        if (auto nl = line.find('\n'); nl != std::string::npos) {
            line.resize(nl);
            if (line.size() > cap) break;
            return line;
        }
        if (line.size() > cap) break;
    }
    return make_error(what + ": longer than " + std::to_string(cap) + " bytes");
}

Status write_before(int fd, std::string_view data, Clock::time_point end, const std::string& what) {
    while (!data.empty()) {
        auto ready = wait_ready(fd, POLLOUT, end);
        if (!ready) return ready.error();
        if (!*ready) return make_error(what + ": the stage server took nothing within the deadline");
        ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return system_error(what);
        data.remove_prefix(static_cast<size_t>(n));
    }
    return {};
}

// The answer is one short line: the socket's buffer takes it at once, and a client that has gone (or
// that never reads) costs nothing.
void answer(int fd, const std::string& line) {
    std::string text = line;
    std::replace(text.begin(), text.end(), '\n', ' ');  // one line, whatever a registry's message held
    text += "\n";
    (void)!::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

sockaddr_un socket_address(const std::string& path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    return a;
}

Status check_socket_path(const std::string& path) {
    if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path))
        return make_error("stage socket '" + path + "': expected a path of 1 to " +
                          std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " characters");
    return {};
}

// One connection, in its own child: read and check the request under the deadline, have it handled,
// answer. Returns the child's exit status.
int serve_one(const StageServerOptions& o, int fd, const StagePeer& peer) {
    const auto end = Clock::now() + o.read_deadline;
    const std::string who = "uid " + std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) + ")";
    auto line = read_line(fd, kMaxStageRequestBytes, end, "reading the request");
    if (!line) {
        answer(fd, "error " + line.error().message);
        if (o.note) o.note(who + ": " + line.error().message);
        return 1;
    }
    auto request = decode_stage_request(*line);
    if (!request) {
        answer(fd, "error " + request.error().message);
        if (o.note) o.note(who + ": " + request.error().message);
        return 1;
    }
    std::string said = o.handle(peer, *request);
    answer(fd, said);
    if (o.note) o.note(who + ": " + request->image + ": " + said);
    return starts_with(said, "ok ") ? 0 : 1;
}

}  // namespace

std::string encode_stage_request(const StageRequest& request) {
    nlohmann::json credentials = nlohmann::json::parse(request.credentials, nullptr, false);
    if (credentials.is_discarded()) credentials = nlohmann::json::object();
    return nlohmann::json{{"image", request.image}, {"credentials", credentials}}.dump() + "\n";
}

Result<StageRequest> decode_stage_request(const std::string& line) {
    if (line.size() > kMaxStageRequestBytes)
        return make_error("the request is longer than " + std::to_string(kMaxStageRequestBytes) + " bytes");
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("the request is not a JSON object");
    StageRequest r;
    auto image = j.find("image");
    if (image == j.end() || !image->is_string()) return make_error("the request names no image");
    r.image = image->get<std::string>();
    auto credentials = j.find("credentials");
    r.credentials = credentials == j.end() ? "{}" : credentials->dump();
    auto ref = parse_reference(r.image);
    if (!ref) return ref.error().wrap("the request's image");
    if (ref->names_imported_image() || ref->registry.empty())
        return make_error("the request's image " + r.image + " names no registry");
    if (ref->digest.empty() || !validate_digest(ref->digest))
        return make_error("the request's image " + r.image + " is not pinned to a digest (IMAGE@sha256:...)");
    auto registry = credential_hand_over_registry(r.credentials);
    if (!registry) return registry.error().wrap("the request's credentials");
    if (!registry->empty() && *registry != ref->registry)
        return make_error("the request's credentials are for " + *registry + ", not for the image's registry " +
                          ref->registry);
    return r;
}

Result<std::string> send_stage_request(const std::string& socket_path, const StageRequest& request,
                                       bool wait_for_answer, std::chrono::milliseconds deadline) {
    GANTRY_TRY(check_socket_path(socket_path));
    const auto end = Clock::now() + deadline;
    const std::string what = "the stage server at " + socket_path;
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return system_error("creating a socket for " + what);
    sockaddr_un a = socket_address(socket_path);
    // Non-blocking: a server whose backlog is full answers EAGAIN at once instead of keeping sbatch.
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (errno == EAGAIN) return make_error(what + " is busy (its backlog is full)");
        return system_error("connecting to " + what);
    }
    if (auto sent = write_before(fd.get(), encode_stage_request(request), end, "sending the request to " + what);
        !sent) {
        // A server at its limits answers and closes without reading: its line says why.
        auto said = read_line(fd.get(), kMaxStageRequestBytes, Clock::now() + std::chrono::seconds(1), what);
        if (!said) return sent.error();
        if (!wait_for_answer) return make_error(what + ": " + *said);
        return said;
    }
    ::shutdown(fd.get(), SHUT_WR);
    if (!wait_for_answer) return std::string();
    return read_line(fd.get(), kMaxStageRequestBytes, end, "reading the answer of " + what);
}

Result<int> listen_on_stage_socket(const std::string& path) {
    GANTRY_TRY(check_socket_path(path));
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        // Only our own socket (an earlier server's, not removed after a crash) is replaced.
        if (!S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid())
            return make_error("stage socket " + path + ": something else is there (not a socket of this account); " +
                              "remove it or name another path");
        if (::unlink(path.c_str()) != 0) return system_error("removing the stale stage socket " + path);
    } else if (errno != ENOENT) {
        return system_error("stage socket " + path);
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return system_error("creating the stage socket");
    sockaddr_un a = socket_address(path);
    // 0666 from the start (no window with other modes): any user may connect; SO_PEERCRED says who.
    mode_t old = ::umask(0111);
    int bound = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::umask(old);
    if (bound != 0) return system_error("binding the stage socket " + path);
    if (::listen(fd.get(), 128) != 0) return system_error("listening on the stage socket " + path);
    return fd.release();
}

Status serve_stage_requests(const StageServerOptions& o) {
    // A client that went away before its answer must not end a child (or us) with SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);
    // Non-blocking accept: a connection that poll announced and the client aborted before accept must
    // not leave the loop blocked until the next one arrives.
    if (int flags = ::fcntl(o.listen_fd, F_GETFL); flags < 0 || ::fcntl(o.listen_fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return system_error("making the stage socket non-blocking");
    std::map<pid_t, uid_t> children;
    auto running_for = [&](uid_t uid) {
        unsigned n = 0;
        for (const auto& [pid, u] : children) n += u == uid ? 1u : 0u;
        return n;
    };
    // Reaps our own children (only they are waited for: never another process's pid).
    auto reap = [&] {
        for (;;) {
            int status = 0;
            pid_t done = ::waitpid(-1, &status, WNOHANG);
            if (done <= 0) break;
            children.erase(done);
        }
    };
    for (;;) {
        reap();
        if (o.should_stop && o.should_stop()) return {};
        pollfd p{o.listen_fd, POLLIN, 0};
        int n = ::poll(&p, 1, 200);
        if (n < 0 && errno != EINTR) return system_error("waiting for stage requests");
        if (n <= 0) continue;
        UniqueFd conn(::accept4(o.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!conn) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
                continue;
            return system_error("accepting a stage request");
        }
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
        const StagePeer peer{cred.pid, cred.uid, cred.gid};
        reap();  // children that ended while we waited do not count against the limits
        // Refused here, without reading a byte: the parent never waits on a client.
        if (children.size() >= o.max_requests || running_for(peer.uid) >= o.max_requests_per_uid) {
            const bool mine = running_for(peer.uid) >= o.max_requests_per_uid;
            answer(conn.get(), std::string("error the stage server is busy (") +
                                   (mine ? "too many requests of yours at once" : "too many requests at once") +
                                   "); the job's nodes pull the image");
            if (o.note)
                o.note("uid " + std::to_string(peer.uid) + ": refused, " + (mine ? "per-uid" : "server") +
                       " limit reached");
            continue;
        }
        pid_t pid = ::fork();
        if (pid < 0) {
            answer(conn.get(), "error the stage server could not start a process for the request");
            continue;
        }
        if (pid == 0) {
            ::close(o.listen_fd);
            ::signal(SIGTERM, SIG_DFL);
            ::signal(SIGINT, SIG_DFL);
            int status = serve_one(o, conn.get(), peer);
            conn.reset();
            ::_exit(status);
        }
        children.emplace(pid, peer.uid);
    }
}

}  // namespace gantry
