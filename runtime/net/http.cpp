// Gantry's HTTP client over libcurl (see http.hpp): RAII for easy/share/URL handles, header capture
// with a size limit, manual redirect following that drops Authorization across origins, cancellation.
#include "net/http.hpp"

#include <curl/curl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "gantry/version.hpp"

namespace gantry::net {
namespace {

void global_init() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct UrlHandle {
    CURLU* h = curl_url();
    UrlHandle() = default;
    UrlHandle(const UrlHandle&) = delete;
    UrlHandle& operator=(const UrlHandle&) = delete;
    ~UrlHandle() { curl_url_cleanup(h); }
    std::string get(CURLUPart part, unsigned flags = 0) const {
        char* out = nullptr;
        if (h == nullptr || curl_url_get(h, part, &out, flags) != CURLUE_OK || out == nullptr) return {};
        std::string s(out);
        curl_free(out);
        return s;
    }
};

struct SlistDeleter {
    void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

// The status and headers of the last response `easy` received so far (libcurl's header API: usable
// after the transfer and from its write callback): names in lower case, a repeated name's values
// joined with ", ". Interim (1xx) answers and earlier redirect hops are not included.
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

// Counts an answer's header bytes (a CURLOPT_HEADERFUNCTION) and stops the transfer
// (CURLE_WRITE_ERROR) past kMaxResponseHeaderBytes.
struct HeaderCount {
    size_t bytes = 0;
    bool answer_ended = false;  // the blank line was seen: the next line starts another answer
    bool too_large = false;
};

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

}  // namespace

TransportSettings settings_from_environment(const std::string& extra_ca_file) {
    TransportSettings s;
    s.ca_file = environment().ssl_cert_file.value;
    s.ca_dir = environment().ssl_cert_dir.value;
    s.extra_ca_file = extra_ca_file;
    s.user_agent = std::string("gantry/") + kVersion;
    global_init();
    if (const curl_version_info_data* v = curl_version_info(CURLVERSION_NOW); v != nullptr) {
        if (v->age >= CURLVERSION_SEVENTH && v->cainfo != nullptr) s.system_ca_file = v->cainfo;
        if (v->age >= CURLVERSION_SEVENTH && v->capath != nullptr) s.system_ca_dir = v->capath;
    }
    return s;
}

std::string origin_of(const std::string& url) {
    UrlHandle u;
    if (u.h == nullptr || curl_url_set(u.h, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return {};
    std::string scheme = lower(u.get(CURLUPART_SCHEME));
    std::string host = lower(u.get(CURLUPART_HOST));
    std::string port = u.get(CURLUPART_PORT, CURLU_DEFAULT_PORT);
    if (scheme.empty() || host.empty()) return {};
    return scheme + "://" + host + ":" + port;
}

std::string host_of(const std::string& url) {
    UrlHandle u;
    if (u.h == nullptr || curl_url_set(u.h, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return {};
    std::string host = lower(u.get(CURLUPART_HOST));
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    return host;
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

std::string redact_url(const std::string& url) {
    auto q = url.find('?');
    return q == std::string::npos ? url : url.substr(0, q) + "?…";
}

std::string escape(const std::string& s) {
    global_init();
    char* e = curl_easy_escape(nullptr, s.c_str(), static_cast<int>(s.size()));
    if (e == nullptr) return s;
    std::string out(e);
    curl_free(e);
    return out;
}

// Shared DNS cache and TLS sessions (resumption saves a round trip per new connection).
class Transport {
public:
    explicit Transport(TransportSettings settings) : settings_(std::move(settings)) {
        global_init();
        share_ = curl_share_init();
        if (share_ != nullptr) {
            curl_share_setopt(share_, CURLSHOPT_LOCKFUNC, &Transport::lock);
            curl_share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &Transport::unlock);
            curl_share_setopt(share_, CURLSHOPT_USERDATA, this);
            curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
            curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
        }
    }
    ~Transport() {
        if (share_ != nullptr) curl_share_cleanup(share_);
    }
    Transport(const Transport&) = delete;
    Transport& operator=(const Transport&) = delete;

    [[nodiscard]] const TransportSettings& settings() const { return settings_; }
    [[nodiscard]] CURLSH* share() const { return share_; }
    // Whether a connection trusts by the system's certificate directory alone (see
    // TransportSettings::system_ca_dir): until a chain failed that way once.
    [[nodiscard]] bool directory_first() const { return system_store() && !bundle_needed_.load(); }
    // Whether the store is the system's: nothing else named, or SSL_CERT_FILE / SSL_CERT_DIR naming
    // the very same bundle and directory (many images and login shells export them).
    [[nodiscard]] bool system_store() const {
        const auto& s = settings_;
        return !s.system_ca_dir.empty() && (s.ca_file.empty() || s.ca_file == s.system_ca_file) &&
               (s.ca_dir.empty() || s.ca_dir == s.system_ca_dir);
    }
    void need_bundle() { bundle_needed_.store(true); }

private:
    static void lock(CURL*, curl_lock_data data, curl_lock_access, void* user) {
        static_cast<Transport*>(user)->locks_[static_cast<size_t>(data) % kLocks].lock();
    }
    static void unlock(CURL*, curl_lock_data data, void* user) {
        static_cast<Transport*>(user)->locks_[static_cast<size_t>(data) % kLocks].unlock();
    }
    static constexpr size_t kLocks = 16;
    TransportSettings settings_;
    CURLSH* share_ = nullptr;
    std::atomic<bool> bundle_needed_{false};
    std::mutex locks_[kLocks];
};

std::shared_ptr<Transport> make_transport(TransportSettings settings) {
    return std::make_shared<Transport>(std::move(settings));
}

struct Connection::State {
    std::shared_ptr<Transport> transport;
    CURL* easy = nullptr;
    char errbuf[CURL_ERROR_SIZE] = {};

    // Per transfer (one hop of a redirect chain).
    const Request* request = nullptr;
    Response* response = nullptr;
    bool started = false;       // the sink has been told the status
    bool have_headers = false;  // status and headers read from libcurl (first body byte, or the end)
    HeaderCount header_count;

    static size_t on_body(char* data, size_t size, size_t n, void* user) {
        auto* st = static_cast<State*>(user);
        size_t len = size * n;
        Response& r = *st->response;
        if (!st->have_headers) {
            read_response(st->easy, r.status, r.headers);
            st->have_headers = true;
        }
        bool success = r.status >= 200 && r.status < 300;
        if (success && st->request->sink) {
            if (!st->started) {
                st->started = true;
                if (!st->request->sink(r, nullptr, 0)) {
                    r.sink_aborted = true;
                    return 0;
                }
            }
            if (!st->request->sink(r, data, len)) {
                r.sink_aborted = true;
                return 0;
            }
            return len;
        }
        size_t cap = success ? st->request->max_body : size_t{64} << 10;
        if (r.body.size() + len > cap) {
            if (success) {
                r.body_too_large = true;
                return 0;
            }
            r.body.append(data, cap - r.body.size());
            return len;  // keep reading an error body, keep only its start
        }
        r.body.append(data, len);
        return len;
    }

    static int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
        auto* st = static_cast<State*>(user);
        const Request& rq = *st->request;
        if ((rq.cancel != nullptr && rq.cancel->load()) || (rq.stop != nullptr && rq.stop->load())) {
            st->response->cancelled = true;
            return 1;
        }
        return 0;
    }

    // Adds the gantry.conf CA bundle to the store libcurl built from the system one.
    static CURLcode add_extra_ca(CURL*, void* ssl_ctx, void* user) {
        const auto* path = static_cast<const std::string*>(user);
        X509_STORE* store = SSL_CTX_get_cert_store(static_cast<SSL_CTX*>(ssl_ctx));
        int ok = store != nullptr ? X509_STORE_load_file(store, path->c_str()) : 0;
        ERR_clear_error();
        return ok == 1 ? CURLE_OK : CURLE_SSL_CACERT_BADFILE;
    }
};

Connection::Connection(std::shared_ptr<Transport> transport) : s_(std::make_unique<State>()) {
    s_->transport = std::move(transport);
    s_->easy = curl_easy_init();
}

Connection::~Connection() {
    if (s_->easy != nullptr) curl_easy_cleanup(s_->easy);
}

Result<Response> Connection::perform(const Request& request) {
    if (s_->easy == nullptr) return make_error("libcurl could not create a handle");
    CURL* e = s_->easy;
    const TransportSettings& ts = s_->transport->settings();
    std::string url = request.url;
    bool send_auth = !request.authorization.empty();
    const std::string first_origin = origin_of(url);

    for (int hop = 0;; ++hop) {
        Response response;
        s_->request = &request;
        s_->response = &response;
        s_->started = false;
        s_->have_headers = false;
        s_->header_count = {};
        s_->errbuf[0] = '\0';

        curl_easy_reset(e);
        curl_easy_setopt(e, CURLOPT_URL, url.c_str());
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s_->errbuf);
        curl_easy_setopt(e, CURLOPT_USERAGENT, ts.user_agent.c_str());
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, request.connect_timeout_ms);
        // A connection that delivers under 1 KiB/s for 60 s is dead; the caller retries and resumes.
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, request.timeout_s);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
        const bool directory_first = s_->transport->directory_first();
        if (!s_->transport->system_store()) {
            if (!ts.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, ts.ca_file.c_str());
            if (!ts.ca_dir.empty()) curl_easy_setopt(e, CURLOPT_CAPATH, ts.ca_dir.c_str());
        } else {
            // The system's store: by its directory alone first, else the bundle and the directory
            // (libcurl's own default).
            const char* file = ts.system_ca_file.empty() || directory_first ? nullptr : ts.system_ca_file.c_str();
            curl_easy_setopt(e, CURLOPT_CAINFO, file);
            curl_easy_setopt(e, CURLOPT_CAPATH, ts.system_ca_dir.empty() ? nullptr : ts.system_ca_dir.c_str());
        }
        if (!ts.extra_ca_file.empty()) {
            // The callback edits the store, so the store must not come from libcurl's shared cache.
            curl_easy_setopt(e, CURLOPT_CA_CACHE_TIMEOUT, 0L);
            curl_easy_setopt(e, CURLOPT_SSL_CTX_FUNCTION, &State::add_extra_ca);
            curl_easy_setopt(e, CURLOPT_SSL_CTX_DATA, const_cast<std::string*>(&ts.extra_ca_file));
        }
        if (s_->transport->share() != nullptr) curl_easy_setopt(e, CURLOPT_SHARE, s_->transport->share());
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &State::on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, s_.get());
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &count_header_bytes);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &s_->header_count);
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, &State::on_progress);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, s_.get());
        const bool sends_body = request.method == "POST" || request.method == "PUT";
        if (request.method == "HEAD") {
            curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        } else if (sends_body) {
            curl_easy_setopt(e, CURLOPT_POSTFIELDS, request.body.c_str());
            curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.body.size()));
            if (request.method == "PUT") curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "PUT");
        } else {
            curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
        }

        Slist headers;
        auto add = [&headers](const std::string& h) {
            curl_slist* n = curl_slist_append(headers.get(), h.c_str());
            if (n != nullptr) {
                (void)headers.release();
                headers.reset(n);
            }
        };
        for (const auto& h : request.headers) add(h);
        // libcurl adds "Expect: 100-continue" to larger POSTs; some endpoints dislike it.
        if (sends_body) add("Expect:");
        if (send_auth) add("Authorization: " + request.authorization);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());

        CURLcode rc = curl_easy_perform(e);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, nullptr);
        // The header list holds the Authorization value: scrub it before it is freed.
        for (curl_slist* n = headers.get(); n != nullptr; n = n->next)
            if (n->data != nullptr && std::strncmp(n->data, "Authorization:", 14) == 0)
                OPENSSL_cleanse(n->data, std::strlen(n->data));
        if (!s_->have_headers) read_response(e, response.status, response.headers);
        response.url = url;
        response.curl_code = rc;
        if (rc != CURLE_OK) {
            response.curl_error = s_->errbuf[0] != '\0' ? s_->errbuf : curl_easy_strerror(rc);
            while (!response.curl_error.empty() && response.curl_error.back() == '\n') response.curl_error.pop_back();
            if (rc == CURLE_ABORTED_BY_CALLBACK) response.cancelled = true;
        }
        if (s_->header_count.too_large) {
            // libcurl has parsed the headers it read before the stop (a Docker-Content-Digest may be
            // among them): none of them is kept.
            response.headers_too_large = true;
            response.status = 0;
            response.headers.clear();
            response.body.clear();
            response.curl_error = response_headers_too_large();
        }
        log::debug(request.method + " " + redact_url(url) + " -> " +
                   (rc == CURLE_OK ? "HTTP " + std::to_string(response.status) : response.curl_error));
        if ((rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE) && directory_first &&
            !ts.system_ca_file.empty()) {
            // The directory alone did not verify this chain (a certificate only in the bundle, or no
            // hash-named files): the same hop again with the bundle, as libcurl's default would have
            // had it. Nothing was sent: the handshake failed before the request.
            log::debug("the system's certificate directory did not verify " + redact_url(url) + "; trying again with " +
                       ts.system_ca_file);
            s_->transport->need_bundle();
            --hop;
            continue;
        }
        if (rc != CURLE_OK) return response;

        bool redirect = response.status == 301 || response.status == 302 || response.status == 303 ||
                        response.status == 307 || response.status == 308;
        if (!redirect || sends_body || request.max_redirects <= 0) return response;
        char* next = nullptr;
        curl_easy_getinfo(e, CURLINFO_REDIRECT_URL, &next);
        if (next == nullptr) return response;  // a 3xx without Location: the caller reports it
        if (hop >= request.max_redirects) return make_error("too many redirects, last to " + redact_url(next));
        std::string target = next;
        std::string target_origin = origin_of(target);
        if (target_origin.empty()) return make_error("redirect to an unusable URL " + redact_url(target));
        if (first_origin.rfind("https:", 0) == 0 && target_origin.rfind("https:", 0) != 0)
            return make_error("refusing the redirect from " + redact_url(url) + " to plain-HTTP " + redact_url(target));
        // Our credentials are for the registry only: a pre-signed S3 or CDN URL carries its own, and
        // S3 rejects a request with two (and must never see the registry token anyway).
        if (target_origin != first_origin) send_auth = false;
        url = std::move(target);
    }
}

Result<Response> fetch(const Request& request, TransportSettings settings) {
    Connection conn(make_transport(std::move(settings)));
    auto resp = conn.perform(request);
    const std::string what = request.method + " " + redact_url(request.url);
    if (!resp) return resp.error().wrap(what);
    if (resp->curl_code != 0) return make_error(what + ": " + resp->curl_error);
    return resp;
}

}  // namespace gantry::net
