// Internal: the small HTTP client of the auth module (libcurl): AWS APIs (ECR, STS), the instance
// metadata and container credentials endpoints, and OAuth2 token POSTs. TLS verification is always on;
// plain HTTP only where the caller allows it (loopback and link-local metadata addresses).
#pragma once

#include <curl/curl.h>

#include <map>
#include <string>
#include <vector>

#include "gantry/result.hpp"

namespace gantry::auth::http {

struct Request {
    std::string method = "GET";  // GET, PUT or POST
    std::string url;
    std::vector<std::string> headers;  // "Name: value"
    std::string body;
    long timeout_s = 30;
    long connect_timeout_ms = 10000;
    std::string ca_file;        // replaces the CA store (AWS_CA_BUNDLE); empty: SSL_CERT_FILE or system
    std::string extra_ca_file;  // added to the store (gantry.conf ca_bundle)
};

struct Response {
    long status = 0;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;
    [[nodiscard]] std::string header(const std::string& name) const {
        auto it = headers.find(name);
        return it == headers.end() ? std::string() : it->second;
    }
};

// The most header bytes one HTTP answer may carry: its status line, header lines and the blank line
// after them, as received (an interim 1xx answer and each redirect hop count on their own). Registries,
// S3 and the AWS endpoints send a few KiB; past this the server or a proxy is misbehaving, and the
// request stops there: nothing of such an answer is used, and it is not retried.
inline constexpr size_t kMaxResponseHeaderBytes = size_t{256} << 10;

// A CURLOPT_HEADERFUNCTION (with a HeaderCount as CURLOPT_HEADERDATA) that counts an answer's header
// bytes and stops the transfer (CURLE_WRITE_ERROR) past kMaxResponseHeaderBytes.
struct HeaderCount {
    size_t bytes = 0;
    bool answer_ended = false;  // the blank line was seen: the next line starts another answer
    bool too_large = false;
};
size_t count_header_bytes(char* data, size_t size, size_t n, void* user);
// What a request stopped by that limit says (after "METHOD URL: ").
std::string response_headers_too_large();

// An Error when no HTTP answer came (the message names the URL without its query, and curl's reason).
Result<Response> perform(const Request& request);

// The status and headers of the last response `easy` received so far (libcurl's header API: usable
// after the transfer and from its write callback): names in lower case, a repeated name's values
// joined with ", ". Interim (1xx) answers and earlier redirect hops are not included. The registry
// client uses it too.
void read_response(CURL* easy, long& status, std::map<std::string, std::string>& headers);

// Whether `url` is http:// on a loopback or link-local address (where plain HTTP is acceptable).
bool is_local_http(const std::string& url);
// scheme://host[:port] of a URL and its host alone; empty when unparsable.
std::string host_of(const std::string& url);
// The Host header a client sends for `url`: host[:port], the port only when not the scheme's default
// (what SigV4 signs).
std::string host_header(const std::string& url);
// `url` without its query string, for messages.
std::string redact(const std::string& url);
// Percent-encoding of a form or query value.
std::string form_escape(const std::string& s);

}  // namespace gantry::auth::http
