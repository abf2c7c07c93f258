// Enroot's .credentials (netrc): parse_netrc only. The "$(cmd)" password form is run by
// enroot_credentials() after ownership checks; parse_netrc never runs anything, so fuzz input is
// only ever parsed here.
#include "fuzz.hpp"
#include "gantry/auth.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto entries = gantry::auth::parse_netrc(gantry::fuzz::text_of(data, size));
    for (const auto& e : entries) {
        FUZZ_CHECK(e.machine.find_first_of(" \t\n") == std::string::npos);
        FUZZ_CHECK(e.login.find('\n') == std::string::npos && e.password.find('\n') == std::string::npos);
    }
    return 0;
}
