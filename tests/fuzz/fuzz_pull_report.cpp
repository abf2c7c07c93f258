// The pull report a user-run `gantry` child writes back to the plugin: decode_pull_report, and what
// it accepts must survive encode -> decode unchanged.
#include "fuzz.hpp"
#include "gantry/pull_report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    auto r = decode_pull_report(fuzz::text_of(data, size));
    if (!r) return 0;
    auto again = decode_pull_report(encode_pull_report(*r));
    FUZZ_CHECK(static_cast<bool>(again));
    FUZZ_CHECK(again->digest == r->digest && again->squashfs_path == r->squashfs_path);
    FUZZ_CHECK(again->config_json == r->config_json && again->error == r->error && again->message == r->message);
    return 0;
}
