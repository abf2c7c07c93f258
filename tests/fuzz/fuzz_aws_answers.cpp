// What AWS services answer over the network: an STS answer (XML through libxml2), the credential
// JSON of IMDS / the container endpoint / credential_process, and ECR's GetAuthorizationToken JSON
// (with the base64 user:password inside). Also base64 both ways. The first byte picks.
#include "fuzz.hpp"
#include "gantry/auth.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    if (size == 0) return 0;
    auto text = fuzz::text_of(data + 1, size - 1);
    switch (data[0] % 4) {
        case 0: {
            auto a = auth::parse_sts_answer(text);
            // Nothing is read out of a document that failed to parse.
            if (!a.xml) FUZZ_CHECK(a.creds.key.access_key_id.empty() && a.code.empty());
            break;
        }
        case 1:
            if (auto c = auth::parse_credentials_json(text, "fuzz", "Token"))
                FUZZ_CHECK(!c->key.access_key_id.empty() && !c->key.secret_access_key.empty());
            break;
        case 2:
            if (auto t = auth::parse_ecr_token_answer(text, 1700000000, "fuzz")) FUZZ_CHECK(t->expires_at > 0);
            break;
        default: {
            auto decoded = base64_decode(text);
            if (decoded) FUZZ_CHECK(base64_decode(base64_encode(*decoded)) == decoded);
            auto encoded = base64_encode(text);
            FUZZ_CHECK(encoded.size() % 4 == 0);
            FUZZ_CHECK(base64_decode(encoded) == std::optional<std::string>(std::string(text)));
        }
    }
    return 0;
}
