// gantry.conf (parse_config) and Enroot's enroot.conf as a site source (apply_enroot_conf); the first
// byte picks. Both are the admin's files, but a parser must not fall over on any text.
#include "fuzz.hpp"
#include "gantry/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    if (size == 0) return 0;
    std::string text(fuzz::text_of(data + 1, size - 1));
    if ((data[0] & 1) == 0) {
        (void)parse_config(text, "fuzz.conf");
    } else {
        Config c;
        (void)apply_enroot_conf(c, text, "enroot.conf");
    }
    return 0;
}
