// WWW-Authenticate headers from a registry (RFC 9110 challenges): parse_www_authenticate.
#include "fuzz.hpp"
#include "gantry/registry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto challenges = gantry::parse_www_authenticate(gantry::fuzz::text_of(data, size));
    for (const auto& c : challenges) {
        for (char ch : c.scheme) FUZZ_CHECK(!(ch >= 'A' && ch <= 'Z'));  // schemes come back lower case
    }
    return 0;
}
