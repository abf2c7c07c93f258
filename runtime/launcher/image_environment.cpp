// The settings of an Enroot-made image (its /etc/environment and /etc/rc), read from the squashfs file
// without mounting it. This is the libsquashfs side, run only inside `gantry-holder --enroot-settings`
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
constexpr size_t kMaxRcBytes = 64 << 10;           // Enroot's /etc/rc: labels as comments, then ~12 lines

void put(const std::string& entry) {
    std::fwrite(entry.c_str(), 1, entry.size() + 1, stdout);
}  // NUL-terminated

}  // namespace

int print_enroot_settings(const std::string& image) {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
    auto settings = [&]() -> Result<EnrootImageSettings> {
        GANTRY_TRY(launcher::check_squashfs(image));  // a regular squashfs file, with the usual messages
        EnrootImageSettings out;
        auto text = read_image_file(image, "/etc/environment", kMaxEnvironmentBytes);
        if (!text) return text.error();
        if (*text) {
            auto vars = parse_environment_file(**text, env, image + ":/etc/environment", true);
            if (!vars) return vars.error();
            out.env = std::move(*vars);
        }
        auto rc = read_image_file(image, "/etc/rc", kMaxRcBytes);
        if (!rc) return rc.error();
        if (*rc) {
            auto parsed = parse_enroot_rc(**rc);
            out.workdir = std::move(parsed.workdir);
            out.entrypoint = std::move(parsed.entrypoint);
            out.cmd = std::move(parsed.cmd);
        }
        return out;
    }();
    if (!settings) {
        std::fprintf(stderr, "%s\n", settings.error().message.c_str());
        return 1;
    }
    for (const auto& v : settings->env) put(v);
    if (!settings->workdir.empty()) put("@workdir=" + settings->workdir);
    for (const auto& w : settings->entrypoint) put("@entrypoint=" + w);
    for (const auto& w : settings->cmd) put("@cmd=" + w);
    return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace gantry
