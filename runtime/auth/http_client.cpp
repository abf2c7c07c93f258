// The auth module's HTTP client over libcurl: one easy handle per request (token requests are rare),
// with the CA settings OpenSSL-based tools honour. See http_client.hpp.
#include "auth/http_client.hpp"

#include <curl/curl.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>
#include <string_view>

#include "auth/internal.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "gantry/sigv4.hpp"
#include "gantry/version.hpp"

namespace gantry::auth::http {
namespace {

size_t on_body(char* data, size_t size, size_t n, void* user) {
    auto* r = static_cast<Response*>(user);
    if (r->body.size() + size * n > (4u << 20)) return 0;  // no credential answer is this big
    r->body.append(data, size * n);
    return size * n;
}

CURLcode add_extra_ca(CURL*, void* ssl_ctx, void* user) {
    auto* path = static_cast<const std::string*>(user);
    X509_STORE* store = SSL_CTX_get_cert_store(static_cast<SSL_CTX*>(ssl_ctx));
    return store != nullptr && X509_STORE_load_file(store, path->c_str()) == 1 ? CURLE_OK : CURLE_SSL_CACERT_BADFILE;
}

struct CurlDeleter {
    void operator()(CURL* e) const { curl_easy_cleanup(e); }
};
struct SlistDeleter {
    void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

std::string redact(const std::string& url) {
    return url.substr(0, url.find('?'));
}

std::string host_of(const std::string& url) {
    auto p = url.find("://");
    if (p == std::string::npos) return {};
    std::string rest = url.substr(p + 3);
    rest = rest.substr(0, rest.find_first_of("/?#"));
    auto at = rest.rfind('@');
    if (at != std::string::npos) rest = rest.substr(at + 1);
    if (!rest.empty() && rest.front() == '[') return rest.substr(1, rest.find(']') - 1);
    return rest.substr(0, rest.find(':'));
}

std::string host_header(const std::string& url) {
    auto p = url.find("://");
    if (p == std::string::npos) return {};
    p += 3;
    std::string hostport = url.substr(p, url.find_first_of("/?#", p) - p);
    const bool https = url.rfind("https://", 0) == 0;
    const std::string default_port = https ? ":443" : ":80";
    if (hostport.size() > default_port.size() &&
        hostport.compare(hostport.size() - default_port.size(), default_port.size(), default_port) == 0)
        hostport.resize(hostport.size() - default_port.size());
    return hostport;
}

bool is_local_http(const std::string& url) {
    if (url.rfind("http://", 0) != 0) return false;
    std::string h = host_of(url);
    return h == "localhost" || h.rfind("127.", 0) == 0 || h == "::1" || h.rfind("169.254.", 0) == 0 ||
           h.rfind("fd00:ec2:", 0) == 0;
}

std::string form_escape(const std::string& s) {
    return sigv4::uri_encode(s, false);
}

void read_response(CURL* easy, long& status, std::map<std::string, std::string>& headers) {
    status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
    headers.clear();
    for (curl_header* h = nullptr; (h = curl_easy_nextheader(easy, CURLH_HEADER, -1, h)) != nullptr;) {
        std::string name = lower(h->name);
        std::string value = h->value;  // libcurl strips the blanks around it
        auto [slot, fresh] = headers.emplace(std::move(name), value);
        if (!fresh) slot->second += ", " + value;
    }
}

size_t count_header_bytes(char* data, size_t size, size_t n, void* user) {
    auto* count = static_cast<HeaderCount*>(user);
    const size_t len = size * n;
    if (count->answer_ended) *count = HeaderCount{};
    count->bytes += len;
    if (count->bytes > kMaxResponseHeaderBytes) {
        count->too_large = true;
        return 0;  // anything but len stops the transfer
    }
    std::string_view line(data, len);
    count->answer_ended = line == "\r\n" || line == "\n";
    return len;
}

std::string response_headers_too_large() {
    return "the server's response headers passed " + std::to_string(kMaxResponseHeaderBytes >> 10) +
           " KiB and were not read further (a misbehaving server or proxy); check the URL and any proxy "
           "(https_proxy) in between";
}

Result<Response> perform(const Request& request) {
    std::unique_ptr<CURL, CurlDeleter> e(curl_easy_init());
    if (!e) return make_error("HTTP request to " + redact(request.url) + ": curl_easy_init failed");
    Response resp;
    std::unique_ptr<curl_slist, SlistDeleter> headers;
    for (const auto& h : request.headers) headers.reset(curl_slist_append(headers.release(), h.c_str()));
    // libcurl adds "Expect: 100-continue" to larger POSTs; some endpoints dislike it.
    headers.reset(curl_slist_append(headers.release(), "Expect:"));
    CURL* c = e.get();
    std::string ua = std::string("gantry/") + kVersion;
    curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(c, CURLOPT_USERAGENT, ua.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, request.timeout_s);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, request.connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);  // credential endpoints do not redirect
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    // Proxies: libcurl honours https_proxy/no_proxy from the environment, as the AWS CLI does.
    std::string ca_file = !request.ca_file.empty() ? request.ca_file : env("SSL_CERT_FILE");
    std::string ca_dir = env("SSL_CERT_DIR");
    if (!ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca_file.c_str());
    if (!ca_dir.empty()) curl_easy_setopt(c, CURLOPT_CAPATH, ca_dir.c_str());
    if (!request.extra_ca_file.empty()) {
        curl_easy_setopt(c, CURLOPT_SSL_CTX_FUNCTION, &add_extra_ca);
        curl_easy_setopt(c, CURLOPT_SSL_CTX_DATA, const_cast<std::string*>(&request.extra_ca_file));
    }
    if (request.method == "POST" || request.method == "PUT") {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.c_str());
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.body.size()));
        if (request.method == "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp);
    HeaderCount header_count;
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &count_header_bytes);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &header_count);
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(c);
    if (header_count.too_large)
        return make_error(request.method + " " + redact(request.url) + ": " + response_headers_too_large());
    if (rc != CURLE_OK)
        return make_error(request.method + " " + redact(request.url) + ": " +
                          (errbuf[0] != '\0' ? std::string(errbuf) : curl_easy_strerror(rc)));
    read_response(c, resp.status, resp.headers);
    log::debug(request.method + " " + redact(request.url) + " -> " + std::to_string(resp.status));
    return resp;
}

}  // namespace gantry::auth::http
