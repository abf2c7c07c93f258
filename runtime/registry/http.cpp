// libcurl wrapper for the registry module: RAII for easy/share/URL handles, header capture,
// manual redirect following that drops Authorization across origins, and cancellation.
#include "registry/http.hpp"

#include <curl/curl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "auth/http_client.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry::http {
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

}  // namespace

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
    std::mutex locks_[kLocks];
};

std::shared_ptr<Transport> make_transport(TransportSettings settings) {
    return std::make_shared<Transport>(std::move(settings));
}

struct HttpConnection::State {
    std::shared_ptr<Transport> transport;
    CURL* easy = nullptr;
    char errbuf[CURL_ERROR_SIZE] = {};

    // Per transfer (one hop of a redirect chain).
    const Request* request = nullptr;
    Response* response = nullptr;
    bool started = false;  // the sink has been told the status
    bool have_headers = false;  // status and headers read from libcurl (first body byte, or the end)
    auth::http::HeaderCount header_count;

    static size_t on_body(char* data, size_t size, size_t n, void* user) {
        auto* st = static_cast<State*>(user);
        size_t len = size * n;
        Response& r = *st->response;
        if (!st->have_headers) {
            auth::http::read_response(st->easy, r.status, r.headers);
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

HttpConnection::HttpConnection(std::shared_ptr<Transport> transport) : s_(std::make_unique<State>()) {
    s_->transport = std::move(transport);
    s_->easy = curl_easy_init();
}

HttpConnection::~HttpConnection() {
    if (s_->easy != nullptr) curl_easy_cleanup(s_->easy);
}

Result<Response> HttpConnection::perform(const Request& request) {
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
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 30L);
        // A connection that delivers under 1 KiB/s for 60 s is dead; the caller retries and resumes.
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, request.timeout_s);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
        if (!ts.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, ts.ca_file.c_str());
        if (!ts.ca_dir.empty()) curl_easy_setopt(e, CURLOPT_CAPATH, ts.ca_dir.c_str());
        if (!ts.extra_ca_file.empty()) {
            // The callback edits the store, so the store must not come from libcurl's shared cache.
            curl_easy_setopt(e, CURLOPT_CA_CACHE_TIMEOUT, 0L);
            curl_easy_setopt(e, CURLOPT_SSL_CTX_FUNCTION, &State::add_extra_ca);
            curl_easy_setopt(e, CURLOPT_SSL_CTX_DATA, const_cast<std::string*>(&ts.extra_ca_file));
        }
        if (s_->transport->share() != nullptr) curl_easy_setopt(e, CURLOPT_SHARE, s_->transport->share());
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &State::on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, s_.get());
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &auth::http::count_header_bytes);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &s_->header_count);
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, &State::on_progress);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, s_.get());
        if (request.method == "HEAD") {
            curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
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
        if (send_auth) add("Authorization: " + request.authorization);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());

        CURLcode rc = curl_easy_perform(e);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, nullptr);
        // The header list holds the Authorization value: scrub it before it is freed.
        for (curl_slist* n = headers.get(); n != nullptr; n = n->next)
            if (n->data != nullptr && std::strncmp(n->data, "Authorization:", 14) == 0)
                OPENSSL_cleanse(n->data, std::strlen(n->data));
        if (!s_->have_headers) auth::http::read_response(e, response.status, response.headers);
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
            response.curl_error = auth::http::response_headers_too_large();
        }
        log::debug(request.method + " " + redact_url(url) + " -> " +
                   (rc == CURLE_OK ? "HTTP " + std::to_string(response.status) : response.curl_error));
        if (rc != CURLE_OK) return response;

        bool redirect = response.status == 301 || response.status == 302 || response.status == 303 ||
                        response.status == 307 || response.status == 308;
        if (!redirect) return response;
        char* next = nullptr;
        curl_easy_getinfo(e, CURLINFO_REDIRECT_URL, &next);
        if (next == nullptr) return response;  // a 3xx without Location: the caller reports it
        if (hop >= 10) return make_error("too many redirects, last to " + redact_url(next));
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

}  // namespace gantry::http
