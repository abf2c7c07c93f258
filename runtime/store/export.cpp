// `gantry export`: a stored image as the squashfs file Enroot imports produce -- the root file system
// plus /etc/environment (the image's Env) and /etc/rc (WorkingDir, entrypoint, command) -- because an
// Enroot image carries its settings inside the file, while the store keeps them in images/<hex>.json.
#include <sys/stat.h>
#include <unistd.h>

#include "gantry/import.hpp"
#include "gantry/pull.hpp"

namespace gantry {
namespace {

// 'text' for sh, with ' written as '\''.
std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::string quoted_words(const std::vector<std::string>& words) {
    std::string out;
    for (const auto& w : words) out += (out.empty() ? "" : " ") + shell_quote(w);
    return out;
}

}  // namespace

std::string enroot_environment(const ImageConfig& config) {
    std::string out;
    for (const auto& e : config.env) {
        // A value spanning lines cannot be one line of the file: left out rather than cut in two.
        if (e.find('\n') != std::string::npos || e.find('=') == std::string::npos) continue;
        out += e + "\n";
    }
    return out;
}

std::string enroot_rc(const ImageConfig& config) {
    std::string out = "# The image's start-up, written by gantry export from its config (Enroot's /etc/rc).\n";
    if (!config.working_dir.empty()) out += "cd " + shell_quote(config.working_dir) + " || exit 1\n";
    const std::string entrypoint = quoted_words(config.entrypoint);
    std::string fallback = quoted_words(config.cmd);
    if (entrypoint.empty() && fallback.empty()) fallback = "/bin/sh";
    out += "if [ $# -gt 0 ]; then\n";
    out += "    exec " + (entrypoint.empty() ? std::string() : entrypoint + " ") + "\"$@\"\n";
    out += "else\n";
    out += "    exec " + entrypoint + (entrypoint.empty() || fallback.empty() ? "" : " ") + fallback + "\n";
    out += "fi\n";
    return out;
}

Result<ConversionStats> export_image(const Config& config, const ImageStore& store, const StoredImage& image,
                                     const std::string& output, bool force) {
    const std::string what = "exporting " + image.digest + " to " + output;
    struct stat st {};
    if (::lstat(output.c_str(), &st) == 0) {
        if (!force) return make_error(what + ": the file exists; add --force to replace it");
        if (!S_ISREG(st.st_mode)) return make_error(what + ": it exists and is not a regular file");
    }
    auto cfg = parse_image_config(image.metadata.config_json);
    if (!cfg) return cfg.error().wrap(what);
    std::vector<AddedFile> files = {{"/etc/environment", enroot_environment(*cfg), 0644},
                                    {"/etc/rc", enroot_rc(*cfg), 0755}};
    // Beside the output, so the finished file appears by rename; never half-written under its name.
    auto slash = output.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : output.substr(0, slash == 0 ? 1 : slash);
    const std::string base = slash == std::string::npos ? output : output.substr(slash + 1);
    const std::string tmp = dir + "/." + base + ".tmp." + std::to_string(::getpid());
    ::unlink(tmp.c_str());
    SquashfsOptions options = squashfs_options(config);
    // The image's own compression: the export is as quick to start as the stored image.
    if (!image.metadata.compressor.empty()) options.compressor = image.metadata.compressor;
    if (image.metadata.block_size != 0) options.block_size = image.metadata.block_size;
    // In use while it is read: gc removes neither the image nor (its record's lock) its layers.
    auto held = store.open_in_use(image.digest);
    if (!held) return held.error().wrap(what);
    auto write = [&]() -> Result<ConversionStats> {
        if (!image.layered()) return add_files_to_image(image.squashfs_path, tmp, files, options);
        std::vector<std::string> layers;
        for (const auto& chain : image.metadata.layer_chain) {
            auto layer = store.find_layer(chain);
            if (!layer) return make_error("its layer " + chain + " is not in the store");
            layers.push_back(layer->squashfs_path);
        }
        return compose_layers_to_image(layers, tmp, files, options, kOverlayOpaqueXattr);
    };
    auto stats = write();
    if (!stats) return stats.error().wrap(what);
    if (::chmod(tmp.c_str(), 0644) != 0 || ::rename(tmp.c_str(), output.c_str()) != 0) {
        auto err = system_error(what);
        ::unlink(tmp.c_str());
        return err;
    }
    return stats;
}

}  // namespace gantry
