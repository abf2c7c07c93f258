// Content digests ("sha256:<64 hex>") as used by OCI for blobs, manifests and diff_ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gantry/result.hpp"

namespace gantry {

// Incremental SHA-256 over streamed bytes (OpenSSL EVP).
class Sha256 {
public:
    Sha256();
    ~Sha256();
    Sha256(Sha256&&) noexcept;
    Sha256& operator=(Sha256&&) noexcept;
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;

    void update(const void* data, size_t size);
    void update(std::string_view s) { update(s.data(), s.size()); }
    // "sha256:<hex>"; the object must not be updated afterwards.
    std::string finish();

    static std::string of(std::string_view data);

private:
    struct State;
    std::unique_ptr<State> s_;
};

// Checks "sha256:<64 lowercase hex>" (the only algorithm registries use in practice).
Status validate_digest(std::string_view digest);

// The hex part of a digest, for file names: "sha256:ab.." -> "ab..".
std::string digest_hex(std::string_view digest);

}  // namespace gantry
