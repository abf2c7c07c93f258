// Pieces shared by the CLI verbs (see common.hpp).
#include "common.hpp"

#include <unistd.h>

#include <climits>
#include <cstdio>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/pull.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"
#include "progress.hpp"

namespace gantry::cli {

Result<long long> parse_duration(const std::string& text) {
    if (text.empty()) return make_error("empty duration");
    size_t pos = 0;
    long long n = 0;
    try {
        n = std::stoll(text, &pos);
    } catch (...) {
        return make_error("invalid duration '" + text + "' (use e.g. 90s, 15m, 12h, 30d)");
    }
    std::string unit = text.substr(pos);
    long long mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 0;
    if (mult == 0 || n < 0) return make_error("invalid duration '" + text + "' (use e.g. 90s, 15m, 12h, 30d)");
    return n * mult;
}

Result<unsigned long long> parse_size(const std::string& text) {
    size_t pos = 0;
    unsigned long long n = 0;
    try {
        n = std::stoull(text, &pos);
    } catch (...) {
        return make_error("invalid size '" + text + "' (use e.g. 500G, 2T, 4096)");
    }
    std::string unit = text.substr(pos);
    if (ends_with(unit, "iB"))
        unit = unit.substr(0, unit.size() - 2);
    else if (unit.size() == 2 && unit[1] == 'B')
        unit = unit.substr(0, 1);
    int shift = unit.empty() || unit == "B" ? 0
                : unit == "K"               ? 10
                : unit == "M"               ? 20
                : unit == "G"               ? 30
                : unit == "T"               ? 40
                                            : -1;
    if (shift < 0) return make_error("invalid size '" + text + "' (use e.g. 500G, 2T, 4096)");
    return n << shift;
}

Result<Config> load_config() {
    return load_default_config();
}

std::string self_program() {
    std::string path(PATH_MAX, '\0');
    ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
    if (n <= 0) return {};
    path.resize(static_cast<size_t>(n));
    return path;
}

Result<ImageStore> open_store(const Config& config, const std::string& store_option, bool create) {
    return ImageStore::open(ImageStore::resolve_path(config, store_option), create, config);
}

Result<PullPolicy> pull_policy(const Config& config, const std::optional<std::string>& option) {
    if (option) {
        auto p = parse_pull_policy(*option);
        if (!p) return p.error().wrap("--pull");
        return p;
    }
    if (const std::string& env = environment().gantry_pull_policy.value; !env.empty()) {
        auto p = parse_pull_policy(env);
        if (!p) return p.error().wrap("GANTRY_PULL_POLICY");
        return p;
    }
    return parse_pull_policy(config.pull_policy);
}

Result<RunnableImage> resolve_runnable_image(const Config& config, const std::string& store_option,
                                             const std::string& image, bool quiet, PullPolicy policy, bool layers_ok) {
    RunnableImage out;
    if (is_local_image_path(image)) {
        if (::access(image.c_str(), R_OK) != 0) return system_error("opening image file " + image);
        out.squashfs_path = image;
        return out;
    }
    auto ref = parse_reference(image);
    if (!ref) return ref.error();
    auto store = open_store(config, store_option, true);
    if (!store) return store.error();
    PullOptions opts;
    opts.policy = policy;
    opts.accept_layered = layers_ok;
    opts.layered = layers_ok && config.layered_images;
    ProgressPrinter printer(quiet);
    opts.on_progress = [&](const PullProgress& p) { printer.show(p); };
    auto pulled = pull_image(config, *store, *ref, opts);
    printer.finish();
    if (!pulled) return pulled.error();
    // From here on the image is its open files, never its names (acquire_image says why).
    auto acquired = acquire_image(*store, pulled->digest);
    if (!acquired) return acquired.error().wrap("image " + pulled->digest + " in the store " + store->root());
    auto cfg = parse_image_config(acquired->metadata.config_json);
    if (!cfg) return cfg.error();
    auto paths = acquired->paths();
    out.squashfs_path = paths.back();
    if (acquired->layered) out.layer_paths = std::move(paths);
    out.acquired = std::move(*acquired);
    out.config = std::move(*cfg);
    out.digest = pulled->digest;
    out.in_trusted_store = store->trusted(config);
    return out;
}

Result<StoredImage> find_stored(const ImageStore& store, const std::string& image) {
    std::string hex = starts_with(image, "sha256:") ? image.substr(7) : image;
    bool hexlike = hex.size() >= 12 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (hexlike) {
        auto all = store.list();
        if (!all) return all.error();
        std::vector<StoredImage> matches;
        for (auto& img : *all)
            if (starts_with(digest_hex(img.digest), hex)) matches.push_back(img);
        if (matches.size() == 1) return matches.front();
        if (matches.size() > 1) return make_error("digest prefix " + image + " is ambiguous; give more digits");
    }
    auto ref = parse_reference(image);
    if (!ref) return ref.error();
    if (!ref->digest.empty()) {
        if (auto img = store.find(ref->digest)) return *img;
    } else if (auto tag = store.lookup_tag(*ref)) {
        if (auto img = store.find(tag->digest)) return *img;
    }
    return make_error("image " + image + " is not in the store " + store.root() + " (see gantry images)");
}

int fail(const Error& error) {
    log::error(error.message);
    return kFailed;
}

int usage_error(const Error& error) {
    log::error(error.message);
    return kUsageError;
}

}  // namespace gantry::cli
