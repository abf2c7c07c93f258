// OCI distribution client: resolves a reference to a manifest digest, fetches and verifies the
// manifest and config, and downloads layer blobs in parallel (libcurl). Owner: runtime/registry/.
//
// Contract used by the pull pipeline (runtime/store/pull.cpp):
//   RegistryClient client(config, options);
//   auto image = client.resolve(ref, platform);          // manifest + config fetched and verified
//   client.fetch_blobs(ref, image->layers, dir, on_done); // each blob lands as dir/<hex> when verified
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/auth.hpp"
#include "gantry/config.hpp"
#include "gantry/reference.hpp"
#include "gantry/result.hpp"

namespace gantry {

struct Platform {
    std::string os = "linux";
    std::string architecture;  // OCI names: amd64, arm64, ppc64le, ...
    std::string variant;       // e.g. v8 for arm64; empty when unspecified

    static Platform host();
    // "os/arch[/variant]"
    static Result<Platform> parse(const std::string& text);
    [[nodiscard]] std::string str() const;
};

struct Descriptor {
    std::string media_type;
    std::string digest;
    uint64_t size = 0;
};

// What `resolve` returns: everything needed to build the image, all of it verified.
struct ResolvedImage {
    ImageReference reference;
    std::string manifest_digest;  // digest of the platform manifest (not of an index)
    std::string index_digest;     // digest of the index/list it was selected from, if any
    std::string manifest_media_type;
    std::string manifest_json;  // exact bytes as served
    Descriptor config;
    std::string config_json;         // exact bytes as served
    std::vector<Descriptor> layers;  // bottom layer first
};

// Credentials, CredentialLookup and the credential sources (Docker config.json, credential helpers,
// containers auth.json, Enroot's .credentials, native ECR) live in gantry/auth.hpp; see docs/auth.md.

struct RegistryOptions {
    int max_connections = 0;       // 0: from Config, else sized for the host
    CredentialLookup credentials;  // empty: default_credential_lookup(), the full chain of docs/auth.md
    // Names the sources `credentials` consults, for "no credentials found for X; tried ..." messages.
    // Empty: default_credential_sources() when `credentials` is empty, else "the configured credential lookup".
    std::string credential_sources;
    // Progress: bytes received so far across all blobs of the current fetch_blobs call.
    std::function<void(uint64_t bytes_done)> on_progress;
    // Cancellation: when set to true, transfers stop and calls return an error.
    std::atomic<bool>* cancel = nullptr;
    // Retries of one request on connection errors, HTTP 5xx/408/429: at most `max_attempts` tries,
    // waiting retry_base_s, 2x, 4x ... capped at retry_max_s (or Retry-After, capped at 60 s) between.
    int max_attempts = 6;
    double retry_base_s = 0.5;
    double retry_max_s = 8.0;
};

class RegistryClient {
public:
    RegistryClient(const Config& config, RegistryOptions options);
    ~RegistryClient();
    RegistryClient(const RegistryClient&) = delete;
    RegistryClient& operator=(const RegistryClient&) = delete;

    // The digest the registry currently serves for ref's tag (or ref.digest checked against it),
    // after platform selection: the cheap "resolve once per step" call.
    Result<std::string> resolve_digest(const ImageReference& ref, const Platform& platform);

    // Manifest (selected from an index for `platform`) and config, both verified by sha256.
    Result<ResolvedImage> resolve(const ImageReference& ref, const Platform& platform);

    // Downloads the blobs in parallel into `dir`, each verified against its digest and size, then
    // renamed to dir/<hex of digest>; partial downloads live in dir/<hex>.partial and are resumed
    // with Range when present. `on_done(i)` is called (from a worker thread) as soon as blob i is
    // complete, so a consumer can start on it while others still download. Returns the first error;
    // blobs already complete stay in place.
    Status fetch_blobs(const ImageReference& ref, const std::vector<Descriptor>& blobs, const std::string& dir,
                       const std::function<void(size_t index)>& on_done);

    // The number of parallel connections fetch_blobs uses (options, else Config, else the host default).
    [[nodiscard]] int max_connections() const;

private:
    struct Impl;
    Impl* impl_;
};

// ---- Building blocks of the client, public for the store and for unit tests ----

// min(8, max(4, 2 x usable CPUs)): enough streams to fill a link, few enough not to upset registries.
int default_max_connections();

// One challenge of a WWW-Authenticate header (RFC 9110 §11.6.1); several may share one header.
struct AuthChallenge {
    std::string scheme;                         // lower case: "bearer", "basic"
    std::map<std::string, std::string> params;  // lower-case names, unquoted values
    std::string token68;                        // the rare token68 form, else empty
};
std::vector<AuthChallenge> parse_www_authenticate(std::string_view header);

// Media types Gantry understands.
inline constexpr const char* kMediaOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr const char* kMediaOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr const char* kMediaDockerList = "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr const char* kMediaDockerManifest = "application/vnd.docker.distribution.manifest.v2+json";
// The Accept list sent with every manifest GET and HEAD (registry 2.8 needs all four, see docs).
extern const char* const kManifestAccept;

struct IndexEntry {
    Descriptor descriptor;
    std::optional<Platform> platform;  // absent when the index does not say
};

// A parsed manifest or index. `kind` decides which half is filled.
struct ParsedManifest {
    enum class Kind { manifest, index } kind = Kind::manifest;
    std::string media_type;           // from the body's mediaType, else the Content-Type header
    Descriptor config;                // manifest only
    std::vector<Descriptor> layers;   // manifest only, bottom layer first
    std::vector<IndexEntry> entries;  // index only, in the index's order
};

// Parses manifest bytes. `content_type` is the response's Content-Type header (parameters allowed);
// it decides the type when the body has no mediaType (umoci writes none). Docker schema1 is rejected.
Result<ParsedManifest> parse_manifest(std::string_view body, std::string_view content_type);

// Picks the index entry for `wanted`: same os and architecture; variant exact, else compatible
// (arm64 without a variant means v8, arm means v7; an older arm variant runs on a newer one). Ties go
// to the first entry, as Docker and Enroot do. No match: an error listing the platforms available.
Result<Descriptor> select_platform(const ParsedManifest& index, const Platform& wanted);

}  // namespace gantry
