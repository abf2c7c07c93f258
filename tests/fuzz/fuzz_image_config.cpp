// The image config blob (JSON written by the image's author): parse_image_config.
#include "fuzz.hpp"
#include "gantry/image_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    (void)gantry::parse_image_config(std::string(gantry::fuzz::text_of(data, size)));
    return 0;
}
