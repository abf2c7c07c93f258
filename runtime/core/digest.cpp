// SHA-256 digests with OpenSSL's EVP interface.
#include "gantry/digest.hpp"

#include <openssl/evp.h>

#include <stdexcept>

namespace gantry {

struct Sha256::State {
    EVP_MD_CTX* ctx = nullptr;
    ~State() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : s_(std::make_unique<State>()) {
    s_->ctx = EVP_MD_CTX_new();
    if (s_->ctx == nullptr || EVP_DigestInit_ex(s_->ctx, EVP_sha256(), nullptr) != 1)
        throw std::runtime_error("OpenSSL could not initialise SHA-256");
}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, size_t size) {
    EVP_DigestUpdate(s_->ctx, data, size);
}

std::string Sha256::finish() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(s_->ctx, md, &len);
    static const char* hex = "0123456789abcdef";
    std::string out = "sha256:";
    for (unsigned i = 0; i < len; ++i) {
        out.push_back(hex[md[i] >> 4]);
        out.push_back(hex[md[i] & 0xf]);
    }
    return out;
}

std::string Sha256::of(std::string_view data) {
    Sha256 h;
    h.update(data);
    return h.finish();
}

Status validate_digest(std::string_view digest) {
    constexpr std::string_view prefix = "sha256:";
    if (digest.substr(0, prefix.size()) != prefix)
        return make_error("unsupported digest '" + std::string(digest) + "' (expected sha256:<64 hex digits>)");
    auto hex = digest.substr(prefix.size());
    if (hex.size() != 64) return make_error("malformed digest '" + std::string(digest) + "' (expected 64 hex digits)");
    for (char c : hex)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return make_error("malformed digest '" + std::string(digest) + "' (expected lowercase hex)");
    return {};
}

std::string digest_hex(std::string_view digest) {
    auto colon = digest.find(':');
    return std::string(colon == std::string_view::npos ? digest : digest.substr(colon + 1));
}

std::string chain_id(std::string_view parent_chain_id, std::string_view diff_id) {
    if (parent_chain_id.empty()) return std::string(diff_id);
    return Sha256::of(std::string(parent_chain_id) + " " + std::string(diff_id));
}

std::vector<std::string> chain_ids(const std::vector<std::string>& diff_ids) {
    std::vector<std::string> out;
    out.reserve(diff_ids.size());
    for (const auto& diff_id : diff_ids)
        out.push_back(chain_id(out.empty() ? std::string_view{} : out.back(), diff_id));
    return out;
}

}  // namespace gantry
