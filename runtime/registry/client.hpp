// Internal: the state of one RegistryClient shared by resolve (registry_client.cpp) and the blob
// downloads (blob_fetch.cpp): settings, the connection pool, authentication, the retry policy.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gantry/registry.hpp"
#include "net/http.hpp"
#include "registry/auth.hpp"

namespace gantry {

// A manifest or index as fetched: exact bytes, their sha256, and what they say.
struct FetchedManifest {
    std::string bytes;
    std::string digest;
    ParsedManifest parsed;
};

// Shared by the download workers of one fetch_blobs call.
struct BlobProgress {
    std::atomic<uint64_t> bytes{0};  // on disk across all blobs of the call
    std::mutex report_mutex;
    std::function<void(uint64_t)> report;  // serialised calls of RegistryOptions::on_progress
    void add(int64_t delta);
};

struct RegistryClient::Impl {
    Impl(const Config& config, RegistryOptions options);

    Config config;
    RegistryOptions options;
    Status settings_status;  // a problem with the settings (e.g. unreadable CA bundle), reported per call
    std::shared_ptr<net::Transport> transport;
    Authenticator auth;

    // Connections are reused across calls (keep-alive, TLS sessions); each is used by one thread at a time.
    class Lease {
    public:
        Lease(Impl& impl, std::unique_ptr<net::Connection> c) : impl_(impl), c_(std::move(c)) {}
        Lease(const Lease&) = delete;
        Lease& operator=(const Lease&) = delete;
        ~Lease() { impl_.give_back(std::move(c_)); }
        net::Connection& operator*() { return *c_; }

    private:
        Impl& impl_;
        std::unique_ptr<net::Connection> c_;
    };
    Lease lease();
    void give_back(std::unique_ptr<net::Connection> c);

    // True for loopback hosts and those listed in insecure_registries (host or host:port).
    [[nodiscard]] bool plain_http_ok(const std::string& host) const;
    // scheme://registry/v2/repository: https, except for a registry that may use plain HTTP and
    // turned out not to speak TLS (see send).
    [[nodiscard]] std::string repository_url(const ImageReference& ref) const;

    // One request with authentication: anonymous (or with what is already known), then answering
    // 401 challenges at most twice. An error only when the request could not be made or is still
    // refused after authenticating; other answers come back as they are.
    Result<net::Response> send(net::Connection& conn, const ImageReference& ref, net::Request& req);

    // `send` with retries (connection errors, 408, 429, 5xx) and backoff; for small bodies.
    Result<net::Response> send_with_retry(net::Connection& conn, const ImageReference& ref, net::Request& req,
                                          const std::string& what);

    // Waits before retry number `attempt` (1 = the first retry); false when cancelled meanwhile.
    bool backoff(int attempt, const net::Response& last, const std::atomic<bool>* stop) const;
    [[nodiscard]] bool cancelled(const std::atomic<bool>* stop = nullptr) const;

    // GET one manifest by tag or digest, verified against `expect` (when pulling by digest) and the
    // Docker-Content-Digest header, then parsed.
    Result<FetchedManifest> fetch_manifest(const ImageReference& ref, const std::string& reference,
                                           const std::string& expect);

    // Downloads one blob into dir/<hex> (blob_fetch.cpp).
    Status fetch_blob(net::Connection& conn, const ImageReference& ref, const Descriptor& blob, const std::string& dir,
                      BlobProgress& progress, const std::atomic<bool>* stop);

    // Connection error or HTTP 408/429/5xx: worth another try.
    static bool retryable(const net::Response& r);
    // "<what>: HTTP 404 BLOB_UNKNOWN (blob unknown to registry)" or "<what>: <curl message>".
    static Error failure(const std::string& what, const net::Response& r);

private:
    mutable std::mutex plain_mutex_;
    std::vector<std::string> plain_registries_;  // allowed plain HTTP and found without TLS
    std::mutex pool_mutex_;
    std::vector<std::unique_ptr<net::Connection>> idle_;
};

}  // namespace gantry
