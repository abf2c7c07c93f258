// The environment of an Enroot-made image (its /etc/environment), read from the squashfs file without
// mounting it. This is the libsquashfs side, run only inside `gantry-holder --image-environment`
// (as the user, include/gantry/dropins.hpp): the plugin never links it, so an `srun` inside a container
// loads spank_gantry.so without libsquashfs, and root never parses the user's bytes.
#include <unistd.h>

#include <cstdio>

#include "gantry/dropins.hpp"
#include "gantry/squashfs.hpp"
#include "internal.hpp"

extern char** environ;

namespace gantry {
namespace {

constexpr size_t kMaxEnvironmentBytes = 64 << 10;  // an image's /etc/environment: a few lines in practice

}  // namespace

int print_image_environment(const std::string& image) {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
    auto vars = [&]() -> Result<std::vector<std::string>> {
        GANTRY_TRY(launcher::check_squashfs(image));  // a regular squashfs file, with the usual messages
        auto text = read_image_file(image, "/etc/environment", kMaxEnvironmentBytes);
        if (!text) return text.error();
        if (!*text) return std::vector<std::string>{};
        return parse_environment_file(**text, env, image + ":/etc/environment", true);
    }();
    if (!vars) {
        std::fprintf(stderr, "%s\n", vars.error().message.c_str());
        return 1;
    }
    for (const auto& v : *vars) std::fwrite(v.c_str(), 1, v.size() + 1, stdout);  // NUL-terminated
    return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace gantry
