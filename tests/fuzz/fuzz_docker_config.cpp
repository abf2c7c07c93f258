// Docker's config.json and containers' auth.json: parse_docker_config, which only parses (the
// credential helpers it names are run by docker_config_credentials, never here), for a few
// references, with Docker's and auth.json's key semantics; and base64_decode of "auth" values.
#include "fuzz.hpp"
#include "gantry/auth.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    auto text = fuzz::text_of(data, size);
    static const ImageReference refs[] = {
        {"", kDockerHubRegistry, "library/ubuntu", "latest", ""},
        {"", "127.0.0.1:5000", "team/app", "v1", ""},
        {"", "123456789012.dkr.ecr.us-east-1.amazonaws.com", "ns/deep/repo", "latest", ""},
    };
    for (const auto& ref : refs) {
        for (bool namespaces : {false, true}) {
            auto a = auth::parse_docker_config(text, ref, namespaces, "config.json");
            // A problem message must never carry the secret it could not decode.
            if (a.credentials && !a.credentials->password.empty())
                FUZZ_CHECK(a.problem.find(a.credentials->password) == std::string::npos);
        }
    }
    if (size < 4096) (void)base64_decode(text);
    return 0;
}
