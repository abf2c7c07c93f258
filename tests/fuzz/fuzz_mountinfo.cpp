// /proc/self/mountinfo lines (a user can name mount points, so their octal escapes are the user's
// bytes): parse_mountinfo, then the longest-prefix lookup over the result.
#include "fuzz.hpp"
#include "gantry/store_fs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto mounts = gantry::parse_mountinfo(gantry::fuzz::text_of(data, size));
    for (const auto& m : mounts) (void)gantry::flock_scope(m.fstype, m.mount_options + "," + m.super_options);
    for (const char* path : {"/", "/home/user/.local/share/gantry", "/fsx/store"}) {
        auto hit = gantry::mount_containing(mounts, path);
        if (hit) FUZZ_CHECK(std::string_view(path).substr(0, hit->mount_point.size()) == hit->mount_point);
    }
    return 0;
}
