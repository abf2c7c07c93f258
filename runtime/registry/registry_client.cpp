// RegistryClient: turns a reference into a verified manifest and config (resolve), or cheaply into
// the digest the registry serves now (resolve_digest). Also the shared request plumbing: URLs,
// authentication rounds, retries with backoff, error messages.
#include <curl/curl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "gantry/version.hpp"
#include "registry/client.hpp"

namespace gantry {
namespace {

Status check_readable(const std::string& path, const std::string& what) {
    if (path.empty()) return {};
    if (::access(path.c_str(), R_OK) != 0) return system_error("reading the CA bundle " + path + " (" + what + ")");
    return {};
}

std::string sources_for(const RegistryOptions& o) {
    if (!o.credential_sources.empty()) return o.credential_sources;
    return o.credentials ? "the configured credential lookup" : default_credential_sources();
}

bool is_manifest_type(const std::string& t) {
    return t == kMediaOciManifest || t == kMediaDockerManifest;
}

std::string bare_type(std::string t) {
    t = t.substr(0, t.find(';'));
    return trim(t);
}

}  // namespace

int default_max_connections() {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                            : static_cast<int>(std::thread::hardware_concurrency());
    if (cpus <= 0) cpus = 1;
    return std::min(8, std::max(4, 2 * cpus));
}

RegistryClient::Impl::Impl(const Config& cfg, RegistryOptions opts)
    : config(cfg),
      options(std::move(opts)),
      transport(net::make_transport(net::settings_from_environment(cfg.ca_bundle))),
      auth(
          options.credentials ? options.credentials : default_credential_lookup(), sources_for(options),
          [this](const std::string& host) { return plain_http_ok(host); }, config.ca_bundle,
          options.credentials ? CredentialLookup{} : default_credential_fallback()) {
    if (auto st = check_readable(config.ca_bundle, "ca_bundle in gantry.conf"); !st) settings_status = st;
    if (auto st = check_readable(environment().ssl_cert_file.value, "SSL_CERT_FILE"); !st) settings_status = st;
    if (options.max_attempts < 1) options.max_attempts = 1;
}

RegistryClient::Impl::Lease RegistryClient::Impl::lease() {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return Lease(*this, std::move(c));
    }
    return Lease(*this, std::make_unique<net::Connection>(transport));
}

void RegistryClient::Impl::give_back(std::unique_ptr<net::Connection> c) {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    idle_.push_back(std::move(c));
}

bool RegistryClient::Impl::plain_http_ok(const std::string& host_or_hostport) const {
    ImageReference probe;
    probe.registry = host_or_hostport;
    if (host_or_hostport.find(':') != std::string::npos && host_or_hostport.front() != '[' &&
        std::count(host_or_hostport.begin(), host_or_hostport.end(), ':') > 1)
        probe.registry = "[" + host_or_hostport + "]";  // a bare IPv6 address from host_of()
    if (probe.registry_is_loopback()) return true;
    for (const auto& r : config.insecure_registries) {
        if (r == host_or_hostport) return true;
        // "host" in the list covers every port of that host
        if (r.find(':') == std::string::npos && host_or_hostport.substr(0, host_or_hostport.rfind(':')) == r)
            return true;
    }
    return false;
}

std::string RegistryClient::Impl::repository_url(const ImageReference& ref) const {
    std::lock_guard<std::mutex> lock(plain_mutex_);
    bool plain = std::find(plain_registries_.begin(), plain_registries_.end(), ref.registry) != plain_registries_.end();
    return std::string(plain ? "http://" : "https://") + ref.registry + "/v2/" + ref.repository;
}

bool RegistryClient::Impl::cancelled(const std::atomic<bool>* stop) const {
    return (options.cancel != nullptr && options.cancel->load()) || (stop != nullptr && stop->load());
}

Result<net::Response> RegistryClient::Impl::send(net::Connection& conn, const ImageReference& ref, net::Request& req) {
    // Every request to a registry passes here: an imported image's name is never sent anywhere, so
    // that no registry (nor a host called "local") can answer for an image someone imported.
    if (ref.names_imported_image())
        return make_error(ref.str() +
                          " names an imported image (local/...), which no registry holds; import it "
                          "first (gantry import --tag " +
                          ref.str() + " SOURCE, docs/user.md)");
    for (int round = 0;; ++round) {
        req.authorization = auth.authorization(ref);
        auto resp = conn.perform(req);
        // TLS first, as Docker does, even where plain HTTP is allowed; a server that does not speak
        // TLS fails the handshake (a certificate problem is not this error, and never falls back).
        const std::string https_prefix = "https://" + ref.registry + "/";
        if (resp && resp->curl_code == CURLE_SSL_CONNECT_ERROR && starts_with(req.url, https_prefix) &&
            plain_http_ok(ref.registry)) {
            log::debug(ref.registry + " does not speak TLS; using plain HTTP (loopback or insecure_registries)");
            {
                std::lock_guard<std::mutex> lock(plain_mutex_);
                if (std::find(plain_registries_.begin(), plain_registries_.end(), ref.registry) ==
                    plain_registries_.end())
                    plain_registries_.push_back(ref.registry);
            }
            req.url = "http://" + req.url.substr(std::string("https://").size());
            --round;
            continue;
        }
        if (!resp || resp->status != 401) return resp;
        if (round == 2) return auth.failure(ref);
        if (auto st = auth.on_unauthorized(conn, ref, *resp, req.authorization); !st) return st.error();
    }
}

bool RegistryClient::Impl::retryable(const net::Response& r) {
    if (r.cancelled || r.sink_aborted || r.body_too_large || r.headers_too_large) return false;
    if (r.curl_code != 0) {
        switch (r.curl_code) {
            // Configuration and trust problems do not heal by themselves.
            case CURLE_COULDNT_RESOLVE_HOST:  // a name that does not resolve will not start to
            case CURLE_UNSUPPORTED_PROTOCOL:
            case CURLE_URL_MALFORMAT:
            case CURLE_PEER_FAILED_VERIFICATION:
            case CURLE_SSL_CACERT_BADFILE:
            case CURLE_SSL_CERTPROBLEM:
            case CURLE_SSL_CIPHER:
            case CURLE_WRITE_ERROR:
            case CURLE_OUT_OF_MEMORY:
                return false;
            default:
                return true;
        }
    }
    return r.status == 408 || r.status == 429 || r.status >= 500;
}

Error RegistryClient::Impl::failure(const std::string& what, const net::Response& r) {
    if (r.cancelled) return make_error(what + ": cancelled");
    if (r.curl_code != 0) return make_error(what + ": " + r.curl_error);
    std::string msg = what + ": HTTP " + std::to_string(r.status);
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("errors") && j["errors"].is_array() && !j["errors"].empty() &&
        j["errors"][0].is_object()) {
        const auto& e = j["errors"][0];
        if (e.contains("code") && e["code"].is_string()) msg += " " + e["code"].get<std::string>();
        if (e.contains("message") && e["message"].is_string() && !e["message"].get<std::string>().empty())
            msg += " (" + e["message"].get<std::string>() + ")";
    } else if (r.status >= 300 && r.status < 400) {
        msg += " (redirect without a usable Location)";
    }
    Error e = make_error(msg);
    e.http_status = r.status;
    return e;
}

bool RegistryClient::Impl::backoff(int attempt, const net::Response& last, const std::atomic<bool>* stop) const {
    double delay = options.retry_base_s * std::pow(2.0, attempt - 1);
    delay = std::min(delay, options.retry_max_s);
    // Spread retries of many clients (640 ranks) so they do not hit the registry in lockstep.
    static thread_local std::minstd_rand rng(std::random_device{}());
    delay *= std::uniform_real_distribution<double>(0.8, 1.2)(rng);
    std::string ra = last.header("retry-after");
    if (!ra.empty() && std::all_of(ra.begin(), ra.end(), [](char c) { return c >= '0' && c <= '9'; }) && ra.size() < 6)
        delay = std::min(60.0, std::max(delay, static_cast<double>(std::stoi(ra))));
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
    while (std::chrono::steady_clock::now() < until) {
        if (cancelled(stop)) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return !cancelled(stop);
}

Result<net::Response> RegistryClient::Impl::send_with_retry(net::Connection& conn, const ImageReference& ref,
                                                            net::Request& req, const std::string& what) {
    req.cancel = options.cancel;
    for (int attempt = 1;; ++attempt) {
        auto resp = send(conn, ref, req);
        if (!resp) return resp.error().wrap(what);
        if (resp->headers_too_large) return failure(what, *resp);  // no part of that answer is used
        if (!retryable(*resp) || attempt >= options.max_attempts) return resp;
        log::debug(failure(what, *resp).message + "; retrying (" + std::to_string(attempt) + "/" +
                   std::to_string(options.max_attempts - 1) + ")");
        if (!backoff(attempt, *resp, nullptr)) return make_error(what + ": cancelled");
    }
}

Result<FetchedManifest> RegistryClient::Impl::fetch_manifest(const ImageReference& ref, const std::string& reference,
                                                             const std::string& expect) {
    Impl& impl = *this;
    const std::string what = "fetching manifest " + ref.registry + "/" + ref.repository +
                             (starts_with(reference, "sha256:") ? "@" : ":") + reference;
    auto conn = impl.lease();
    net::Request req;
    req.url = impl.repository_url(ref) + "/manifests/" + reference;
    req.headers.push_back(std::string("Accept: ") + kManifestAccept);
    req.max_body = 4u << 20;  // the distribution spec's limit for manifests
    req.timeout_s = 300;
    auto resp = impl.send_with_retry(*conn, ref, req, what);
    if (!resp) return resp.error();
    if (resp->body_too_large) return make_error(what + ": larger than 4 MiB, not a manifest");
    // A 200 whose transfer broke off (after the last retry) is the transfer's failure, not a mismatch.
    if (resp->status != 200 || resp->curl_code != 0) return failure(what, *resp);
    FetchedManifest m;
    m.bytes = std::move(resp->body);
    m.digest = Sha256::of(m.bytes);
    if (!expect.empty() && m.digest != expect)
        return make_error(what + ": content does not match the requested digest (got " + m.digest + ")");
    std::string dcd = resp->header("docker-content-digest");
    if (starts_with(dcd, "sha256:") && dcd != m.digest)
        return make_error(what + ": content does not match the Docker-Content-Digest header " + dcd + " (got " +
                          m.digest + ")");
    auto parsed = parse_manifest(m.bytes, resp->header("content-type"));
    if (!parsed) return parsed.error().wrap(what);
    m.parsed = std::move(*parsed);
    return m;
}

RegistryClient::RegistryClient(const Config& config, RegistryOptions options)
    : impl_(new Impl(config, std::move(options))) {}

RegistryClient::~RegistryClient() {
    delete impl_;
}

int RegistryClient::max_connections() const {
    if (impl_->options.max_connections > 0) return impl_->options.max_connections;
    if (impl_->config.max_connections > 0) return impl_->config.max_connections;
    return default_max_connections();
}

Result<std::string> RegistryClient::resolve_digest(const ImageReference& ref, const Platform& platform) {
    GANTRY_TRY(impl_->settings_status);
    if (!ref.digest.empty()) GANTRY_TRY(validate_digest(ref.digest));
    const std::string what = "resolving " + ref.str();
    // HEAD first: registries do not count it against pull limits, and for a single-platform
    // image the Docker-Content-Digest header is the whole answer.
    {
        auto conn = impl_->lease();
        net::Request req;
        req.method = "HEAD";
        req.url = impl_->repository_url(ref) + "/manifests/" + ref.manifest_ref();
        req.headers.push_back(std::string("Accept: ") + kManifestAccept);
        req.timeout_s = 120;
        auto resp = impl_->send_with_retry(*conn, ref, req, what);
        if (!resp) return resp.error();
        if (resp->status == 200) {
            std::string dcd = resp->header("docker-content-digest");
            if (!ref.digest.empty() && starts_with(dcd, "sha256:") && dcd != ref.digest)
                return make_error(what + ": the registry answers for digest " + dcd);
            if (is_manifest_type(bare_type(resp->header("content-type"))) && validate_digest(dcd).ok()) return dcd;
        }
        // An index, a registry without the header, or an error: the GET below says what is what.
    }
    auto top = impl_->fetch_manifest(ref, ref.manifest_ref(), ref.digest);
    if (!top) return top.error();
    if (top->parsed.kind == ParsedManifest::Kind::manifest) return top->digest;
    auto chosen = select_platform(top->parsed, platform);
    if (!chosen) return chosen.error().wrap(what);
    return chosen->digest;
}

Result<ResolvedImage> RegistryClient::resolve(const ImageReference& ref, const Platform& platform) {
    GANTRY_TRY(impl_->settings_status);
    if (!ref.digest.empty()) GANTRY_TRY(validate_digest(ref.digest));
    auto top = impl_->fetch_manifest(ref, ref.manifest_ref(), ref.digest);
    if (!top) return top.error();

    ResolvedImage image;
    image.reference = ref;
    FetchedManifest chosen;
    if (top->parsed.kind == ParsedManifest::Kind::index) {
        auto entry = select_platform(top->parsed, platform);
        if (!entry) return entry.error().wrap("resolving " + ref.str());
        auto m = impl_->fetch_manifest(ref, entry->digest, entry->digest);
        if (!m) return m.error();
        if (m->bytes.size() != entry->size)
            return make_error("fetching manifest " + ref.registry + "/" + ref.repository + "@" + entry->digest + ": " +
                              std::to_string(m->bytes.size()) + " bytes, the index says " +
                              std::to_string(entry->size));
        if (m->parsed.kind != ParsedManifest::Kind::manifest)
            return make_error("resolving " + ref.str() + ": the index entry for " + platform.str() +
                              " is another index; nested indexes are not supported");
        image.index_digest = top->digest;
        chosen = std::move(*m);
    } else {
        chosen = std::move(*top);
    }
    image.manifest_digest = chosen.digest;
    image.manifest_media_type = chosen.parsed.media_type;
    image.manifest_json = std::move(chosen.bytes);
    image.config = chosen.parsed.config;
    image.layers = std::move(chosen.parsed.layers);

    // The config is small: fetched into memory and checked here.
    const std::string what = "fetching config " + image.config.digest + " of " + ref.registry + "/" + ref.repository;
    constexpr uint64_t kMaxConfig = 64u << 20;
    if (image.config.size > kMaxConfig)
        return make_error(what + ": " + std::to_string(image.config.size) + " bytes is too large for an image config");
    auto conn = impl_->lease();
    net::Request req;
    req.url = impl_->repository_url(ref) + "/blobs/" + image.config.digest;
    req.max_body = static_cast<size_t>(image.config.size) + 1;
    req.timeout_s = 300;
    auto resp = impl_->send_with_retry(*conn, ref, req, what);
    if (!resp) return resp.error();
    if (resp->body_too_large)
        return make_error(what + ": larger than the " + std::to_string(image.config.size) + " bytes the manifest says");
    if (resp->status != 200 || resp->curl_code != 0) return Impl::failure(what, *resp);
    if (resp->body.size() != image.config.size)
        return make_error(what + ": " + std::to_string(resp->body.size()) + " bytes, the manifest says " +
                          std::to_string(image.config.size));
    std::string got = Sha256::of(resp->body);
    if (got != image.config.digest) return make_error(what + ": content does not match its digest (got " + got + ")");
    image.config_json = std::move(resp->body);
    return image;
}

}  // namespace gantry
