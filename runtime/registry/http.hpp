// Internal: a small HTTP client over libcurl for the registry module. One HttpConnection wraps one
// curl easy handle (reused for keep-alive) and follows redirects itself, so that our Authorization
// header is never sent to another host (ECR and Docker Hub redirect blob GETs to S3/CDN URLs).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gantry/result.hpp"

namespace gantry::http {

// Settings shared by every connection of one client. TLS verification is always on.
struct TransportSettings {
    std::string ca_file;        // replaces the system CA store (from SSL_CERT_FILE), empty: system
    std::string ca_dir;         // from SSL_CERT_DIR, empty: system
    std::string extra_ca_file;  // added to the store (gantry.conf ca_bundle), empty: none
    std::string user_agent;
};

struct Response;

struct Request {
    std::string method = "GET";         // GET or HEAD
    std::string url;
    std::vector<std::string> headers;   // "Name: value"; never secrets (see authorization)
    std::string authorization;          // Authorization value; dropped on a redirect to another origin
    // Receives the body of a 2xx answer. Called first with (head, nullptr, 0) once the status and
    // headers are known, so that a sink can tell 200 from 206. Returning false aborts the transfer.
    std::function<bool(const Response& head, const char* data, size_t size)> sink;
    size_t max_body = 8u << 20;         // without a sink: the largest body kept in Response::body
    long timeout_s = 0;                 // whole transfer; 0: none (stalls are caught by a speed limit)
    const std::atomic<bool>* cancel = nullptr;  // user cancellation
    const std::atomic<bool>* stop = nullptr;    // internal: a sibling transfer failed
};

struct Response {
    long status = 0;                              // 0 when no HTTP answer came (see curl_error)
    std::map<std::string, std::string> headers;   // lower-case names; repeated headers joined by ", "
    std::string body;                             // without a sink; for errors, the first 64 KiB
    std::string url;                              // the URL that answered (after redirects)
    int curl_code = 0;                            // CURLcode; 0 when the transfer worked
    std::string curl_error;                       // libcurl's message when curl_code != 0
    bool cancelled = false;                       // cancel or stop was set
    bool sink_aborted = false;                    // the sink returned false
    bool body_too_large = false;                  // the body exceeded max_body
    // The answer's headers passed auth::http::kMaxResponseHeaderBytes: the transfer stopped, status and
    // headers are left empty (nothing of such an answer is used) and curl_error says why.
    bool headers_too_large = false;

    [[nodiscard]] std::string header(const std::string& lower_name) const {
        auto it = headers.find(lower_name);
        return it == headers.end() ? std::string() : it->second;
    }
};

// The scheme://host:port of a URL (lower case, default ports filled in); empty when unparsable.
std::string origin_of(const std::string& url);
// The host of a URL, without port and brackets; empty when unparsable.
std::string host_of(const std::string& url);
// A URL for messages and logs: the query (pre-signed URLs carry signatures there) is cut off.
std::string redact_url(const std::string& url);
// Percent-encodes a query parameter value.
std::string escape(const std::string& s);

class Transport;

// One reusable curl easy handle. Not thread-safe: one per thread.
class HttpConnection {
public:
    explicit HttpConnection(std::shared_ptr<Transport> transport);
    ~HttpConnection();
    HttpConnection(const HttpConnection&) = delete;
    HttpConnection& operator=(const HttpConnection&) = delete;

    // Performs the request, following up to 10 redirects (http/https only, no https -> http
    // downgrade). Transport failures are reported in the Response, not as an Error; an Error means
    // the request could not be made at all (e.g. a forbidden redirect).
    Result<Response> perform(const Request& request);

private:
    struct State;
    std::unique_ptr<State> s_;
};

// What every connection of one client shares: settings and libcurl's DNS and TLS-session caches.
std::shared_ptr<Transport> make_transport(TransportSettings settings);

}  // namespace gantry::http
