// Content digests ("sha256:<64 hex>") as used by OCI for blobs, manifests and diff_ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

// The chain ID of a layer on top of the stack `parent_chain_id` names (the OCI image spec's
// ChainID): the bottom layer's (empty parent) is its own diff_id, each next one is
// sha256("<parent chain ID> <diff_id>"). It names a layer together with everything below it.
std::string chain_id(std::string_view parent_chain_id, std::string_view diff_id);
// The chain IDs of a whole stack of diff_ids, bottom first.
std::vector<std::string> chain_ids(const std::vector<std::string>& diff_ids);

}  // namespace gantry
