// ~/.aws/credentials and ~/.aws/config (INI): parse_aws_ini in both dialects; the first byte picks.
#include "fuzz.hpp"
#include "gantry/auth.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    (void)gantry::auth::parse_aws_ini(gantry::fuzz::text_of(data + 1, size - 1), (data[0] & 1) != 0);
    return 0;
}
