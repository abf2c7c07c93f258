// --container-mounts as a user writes it: parse_mounts (the list) and parse_mount (one entry). Every
// accepted destination must be a normalized absolute container path: it is where a host path gets
// bind-mounted, so ".." or a relative path there would be an escape.
#include "fuzz.hpp"
#include "gantry/mounts.hpp"

namespace {
void check(const gantry::MountSpec& m) {
    FUZZ_CHECK(!m.destination.empty() && m.destination[0] == '/');
    FUZZ_CHECK(m.destination.find("/../") == std::string::npos);
    FUZZ_CHECK(m.destination.size() < 3 || m.destination.compare(m.destination.size() - 3, 3, "/..") != 0);
    FUZZ_CHECK(m.destination.find('\0') == std::string::npos && m.source.find('\0') == std::string::npos);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto text = gantry::fuzz::text_of(data, size);
    std::vector<gantry::MountSpec> mounts;
    if (gantry::parse_mounts(text, mounts))
        for (const auto& m : mounts) check(m);
    if (auto one = gantry::parse_mount(text)) check(*one);
    return 0;
}
