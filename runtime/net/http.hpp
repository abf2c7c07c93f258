// Internal: Gantry's one HTTP client, over libcurl. Registry traffic (manifests, blobs, token
// services), token refreshes and the AWS endpoints (ECR, STS, the instance metadata and container
// credentials endpoints) all pass here. A Connection wraps one curl easy handle (reused for keep-alive)
// and follows redirects itself, so that the Authorization value is never sent to another origin (ECR
// and Docker Hub redirect blob GETs to S3/CDN URLs, which carry credentials of their own). TLS
// verification is always on; proxies come from the environment (https_proxy, no_proxy), as libcurl
// and the AWS CLI read them.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gantry/result.hpp"

namespace gantry::net {

// Settings shared by every connection of one client.
struct TransportSettings {
    std::string ca_file;        // replaces the system CA store, empty: system
    std::string ca_dir;         // empty: system
    std::string extra_ca_file;  // added to the store (gantry.conf ca_bundle), empty: none
    std::string user_agent;
    // The system's CA store as libcurl was built to find it (a bundle file and a directory of
    // hash-named certificates), used when ca_file and ca_dir are empty. With a directory, a
    // connection first trusts by the directory alone: OpenSSL then reads only the certificates a
    // chain names, where the bundle is parsed whole for every process (~150 certificates, 25 ms of
    // a step's start here). A chain the directory cannot verify is tried again once with the bundle
    // too (the Transport remembers it), so what is trusted is what libcurl's defaults trust.
    std::string system_ca_file;
    std::string system_ca_dir;
};

// The settings OpenSSL-based tools honour (libcurl does not read them itself): SSL_CERT_FILE and
// SSL_CERT_DIR, the user agent gantry/VERSION, `extra_ca_file` added to the store, and libcurl's
// built-in CA locations (system_ca_file, system_ca_dir).
TransportSettings settings_from_environment(const std::string& extra_ca_file = {});

struct Response;

struct Request {
    std::string method = "GET";  // GET, HEAD, POST or PUT
    std::string url;
    std::vector<std::string> headers;  // "Name: value"; never secrets (see authorization)
    std::string authorization;         // Authorization value; dropped on a redirect to another origin
    std::string body;                  // POST and PUT
    // Receives the body of a 2xx answer. Called first with (head, nullptr, 0) once the status and
    // headers are known, so that a sink can tell 200 from 206. Returning false aborts the transfer.
    std::function<bool(const Response& head, const char* data, size_t size)> sink;
    size_t max_body = 8u << 20;  // without a sink: the largest 2xx body kept in Response::body
    long timeout_s = 0;          // whole transfer; 0: none (stalls are caught by a speed limit)
    long connect_timeout_ms = 30000;
    // Redirects followed (GET and HEAD only; a POST's or PUT's 3xx is returned as it came): http/https
    // only, never https -> http. 0: every 3xx is returned to the caller.
    int max_redirects = 10;
    const std::atomic<bool>* cancel = nullptr;  // user cancellation
    const std::atomic<bool>* stop = nullptr;    // internal: a sibling transfer failed
};

struct Response {
    long status = 0;                             // 0 when no HTTP answer came (see curl_error)
    std::map<std::string, std::string> headers;  // lower-case names; repeated headers joined by ", "
    std::string body;                            // without a sink; for errors, the first 64 KiB
    std::string url;                             // the URL that answered (after redirects)
    int curl_code = 0;                           // CURLcode; 0 when the transfer worked
    std::string curl_error;                      // libcurl's message when curl_code != 0
    bool cancelled = false;                      // cancel or stop was set
    bool sink_aborted = false;                   // the sink returned false
    bool body_too_large = false;                 // the body exceeded max_body
    // The answer's headers passed kMaxResponseHeaderBytes: the transfer stopped, status and headers
    // are left empty (nothing of such an answer is used) and curl_error says why.
    bool headers_too_large = false;

    [[nodiscard]] std::string header(const std::string& lower_name) const {
        auto it = headers.find(lower_name);
        return it == headers.end() ? std::string() : it->second;
    }
};

// The most header bytes one HTTP answer may carry: its status line, header lines and the blank line
// after them, as received (an interim 1xx answer and each redirect hop count on their own). Registries,
// S3 and the AWS endpoints send a few KiB; past this the server or a proxy is misbehaving, and the
// request stops there: nothing of such an answer is used, and it is not retried.
inline constexpr size_t kMaxResponseHeaderBytes = size_t{256} << 10;

class Transport;

// One reusable curl easy handle. Not thread-safe: one per thread.
class Connection {
public:
    explicit Connection(std::shared_ptr<Transport> transport);
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Performs the request, following redirects as Request::max_redirects says. Transport failures
    // are reported in the Response, not as an Error; an Error means the request could not be made at
    // all (e.g. a forbidden redirect).
    Result<Response> perform(const Request& request);

private:
    struct State;
    std::unique_ptr<State> s_;
};

// What every connection of one client shares: settings and libcurl's DNS and TLS-session caches.
std::shared_ptr<Transport> make_transport(TransportSettings settings);

// One request on a connection of its own, for rare calls (token refreshes, AWS credentials): an Error
// ("METHOD URL: reason", the URL without its query) when no whole HTTP answer came.
Result<Response> fetch(const Request& request, TransportSettings settings);

// ---- URLs
// The scheme://host:port of a URL (lower case, default ports filled in); empty when unparsable.
std::string origin_of(const std::string& url);
// The host of a URL, lower case, without port and brackets; empty when unparsable.
std::string host_of(const std::string& url);
// The Host header a client sends for `url`: host[:port], the port only when not the scheme's default
// (what SigV4 signs).
std::string host_header(const std::string& url);
// Whether `url` is http:// on a loopback or link-local address (where plain HTTP is acceptable).
bool is_local_http(const std::string& url);
// A URL for messages and logs: the query (pre-signed URLs carry signatures there) is cut off.
std::string redact_url(const std::string& url);
// Percent-encodes a query parameter or form value (all but A-Z a-z 0-9 - . _ ~).
std::string escape(const std::string& s);

}  // namespace gantry::net
