// The login nodes' stage server (`gantry stage-server`, docs/admin.md "Staging into a trusted store"):
// a small service run by the trusted store's account that pulls an image into the store at submit time
// for a user who cannot write the store. Owner: runtime/stage/.
//
// The protocol, one request and one answer per connection on a Unix stream socket:
//   request: one line, a JSON object {"image": "IMAGE@DIGEST", "credentials": HAND-OVER}, where
//            HAND-OVER is the user's credentials for the image's registry in the credential hand-over
//            format of auth.hpp ({} when none); at most kMaxStageRequestBytes, read under a deadline.
//            Any other member is ignored: who asks is what the kernel says (SO_PEERCRED), never the
//            message.
//   answer:  one line, "ok DIGEST" or "error TEXT".
// The server parses every byte a client sends, in a child process of its own per connection (a
// bounded number, and a bounded number per uid), so a client that sends nothing, or too much, holds
// only its own child until the deadline, never the server or another user's request.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "gantry/result.hpp"

namespace gantry {

constexpr size_t kMaxStageRequestBytes = 64 * 1024;

struct StageRequest {
    std::string image;        // IMAGE@DIGEST: always digest-pinned (the client resolved the tag)
    std::string credentials;  // the credential hand-over (auth.hpp), "{}" when none
};

// Who sent a request, as the kernel reported it when the connection was made (SO_PEERCRED).
struct StagePeer {
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
};

std::string encode_stage_request(const StageRequest& request);
// Checks what the server relies on: a JSON object, an image that parses and is pinned to a digest
// and names a registry, credentials in the hand-over format for that image's registry (or none).
Result<StageRequest> decode_stage_request(const std::string& line);

// The client's side: connects to `socket_path`, sends the request, and with `wait_for_answer` reads
// the server's line ("ok DIGEST" / "error TEXT") until `deadline`; without, returns once the request
// is handed over (the pull goes on in the server) and the answer is "". Every step is bounded by
// `deadline`: a full backlog or a stalled server is an error, never a wait without end.
Result<std::string> send_stage_request(const std::string& socket_path, const StageRequest& request,
                                       bool wait_for_answer, std::chrono::milliseconds deadline);

struct StageServerOptions {
    int listen_fd = -1;                               // a bound, listening Unix stream socket
    std::chrono::milliseconds read_deadline{10'000};  // for a client's whole request
    unsigned max_requests = 32;                       // children at once, all users together
    unsigned max_requests_per_uid = 4;                // children at once for one uid
    // Runs in the request's own child once the request is read and checked; returns the answer line
    // without its newline ("ok DIGEST", "error TEXT").
    std::function<std::string(const StagePeer&, const StageRequest&)> handle;
    // Polled between connections: true ends the loop (SIGTERM from systemd).
    std::function<bool()> should_stop;
    // One line per request (peer, image, answer), for the service's log.
    std::function<void(const std::string&)> note;
};

// Accepts connections until should_stop; each one is served by a forked child (see the top of this
// file). Children still running when it stops are left to finish their pulls (the store's lock makes a
// half-done pull harmless: the next producer resumes it). Errors: accepting failed for good.
Status serve_stage_requests(const StageServerOptions& options);

// A listening socket at `path` for the server: a stale socket left there by an earlier server of the
// same account is replaced; anything else at `path` is an error. Mode 0666: any user may connect
// (who they are is what SO_PEERCRED says); the directory's permissions are the admin's.
Result<int> listen_on_stage_socket(const std::string& path);

}  // namespace gantry
