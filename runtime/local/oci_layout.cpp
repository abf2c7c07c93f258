// Reading an image out of an OCI layout (oci:DIR, or an oci-archive extracted by extract_archive):
// index.json -> the tagged entry -> (a platform from a nested index) -> manifest -> config and layers,
// each document and blob checked against the digest that names it.
#include <nlohmann/json.hpp>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/image_config.hpp"
#include "gantry/local_image.hpp"
#include "local_internal.hpp"

namespace gantry {
namespace local {

Result<std::string> read_local_json(const LocalFile& file, size_t cap, const std::string& what) {
    if (file.size > cap)
        return make_error(what + " is " + std::to_string(file.size) + " bytes, more than the " + format_bytes(cap) +
                          " a document of this kind may have");
    auto text = read_file(file.open_path());
    if (!text) return text.error().wrap("reading " + what);
    if (text->size() != file.size || Sha256::of(*text) != file.digest)
        return make_error(what + " changed while it was being read");
    return text;
}

Result<LocalFile> blob_file(const LocalFileLookup& files, const std::string& digest, const std::string& what) {
    GANTRY_TRY(validate_digest(digest));
    auto f = files("blobs/sha256/" + digest_hex(digest));
    if (!f) return f.error().wrap(what);
    if (f->digest != digest)
        return make_error(what + ": blob " + digest + " has the sha256 " + f->digest +
                          ": the file is corrupt or was altered; export the image again");
    return f;
}

Status check_layers(const LocalImage& image, const ImageConfig& cfg, const std::string& what) {
    if (cfg.diff_ids.size() != image.layers.size())
        return make_error(what + ": the config lists " + std::to_string(cfg.diff_ids.size()) +
                          " layers but the manifest " + std::to_string(image.layers.size()));
    return {};
}

std::string config_platform(const ImageConfig& cfg) {
    return (cfg.os.empty() ? "linux" : cfg.os) + "/" + cfg.architecture;
}

}  // namespace local

namespace {

using nlohmann::json;
constexpr const char* kRefName = "org.opencontainers.image.ref.name";

// The index.json entry `tag` names ("" = the only one; several untagged entries with platforms: the
// index itself is the platform choice).
Result<Descriptor> pick_entry(const std::string& index_json, const std::string& tag, const Platform& platform,
                              const std::string& what) {
    auto parsed = parse_manifest(index_json, kMediaOciIndex);
    if (!parsed || parsed->kind != ParsedManifest::Kind::index)
        return make_error(what + ": index.json is not an OCI image index" +
                          (parsed ? std::string() : " (" + parsed.error().message + ")"));
    json j = json::parse(index_json, nullptr, false);
    const auto& entries = j["manifests"];
    std::vector<std::string> tags;
    std::vector<size_t> matches;
    for (size_t i = 0; i < entries.size(); ++i) {
        std::string name;
        if (entries[i].contains("annotations") && entries[i]["annotations"].is_object()) {
            auto it = entries[i]["annotations"].find(kRefName);
            if (it != entries[i]["annotations"].end() && it->is_string()) name = it->get<std::string>();
        }
        if (!name.empty()) tags.push_back(name);
        if (tag.empty() || name == tag) matches.push_back(i);
    }
    auto tag_list = [&] {
        std::string s;
        for (const auto& t : tags) s += (s.empty() ? "" : ", ") + t;
        return s.empty() ? std::string("none") : s;
    };
    if (matches.empty()) {
        if (tag.empty()) return make_error(what + ": index.json lists no image");
        return make_error(what + ": no image tagged '" + tag + "' (tags: " + tag_list() + ")");
    }
    if (matches.size() == 1) return parsed->entries[matches.front()].descriptor;
    if (!tag.empty())
        return make_error(what + ": " + std::to_string(matches.size()) + " images are tagged '" + tag + "'");
    // Several entries: a multi-platform layout written without a nested index is a choice of platform;
    // tagged images are the user's to pick.
    if (tags.empty()) return select_platform(*parsed, platform);
    return make_error(what + " holds " + std::to_string(matches.size()) + " images; name one as " +
                      "oci:DIR:TAG or oci-archive:FILE:TAG (tags: " + tag_list() + ")");
}

}  // namespace

Result<LocalImage> read_oci_layout(const LocalFileLookup& files, const std::string& what, const std::string& tag,
                                   const Platform& platform) {
    auto index_file = files("index.json");
    if (!index_file) return index_file.error().wrap(what + " is not an OCI layout");
    auto index_json = local::read_local_json(*index_file, kMaxLocalIndexBytes, what + "'s index.json");
    if (!index_json) return index_json.error();
    auto desc = pick_entry(*index_json, tag, platform, what);
    if (!desc) return desc.error();

    LocalImage image;
    // One nested index at most (skopeo copy --all writes the image's index as the tagged entry).
    for (int depth = 0;; ++depth) {
        if (desc->size > kMaxLocalManifestBytes)
            return make_error(what + ": manifest " + desc->digest + " is " + std::to_string(desc->size) +
                              " bytes, too large");
        auto file = local::blob_file(files, desc->digest, what);
        if (!file) return file.error();
        auto body = local::read_local_json(*file, kMaxLocalManifestBytes, what + ": manifest " + desc->digest);
        if (!body) return body.error();
        auto parsed = parse_manifest(*body, desc->media_type);
        if (!parsed) return parsed.error().wrap(what + ": manifest " + desc->digest);
        if (parsed->kind == ParsedManifest::Kind::index) {
            if (depth > 0) return make_error(what + ": an index inside an index inside index.json is not supported");
            auto chosen = select_platform(*parsed, platform);
            if (!chosen) return chosen.error().wrap(what);
            desc = *chosen;
            continue;
        }
        image.manifest_digest = desc->digest;
        image.manifest_json = std::move(*body);
        image.layers = parsed->layers;
        auto config_file = local::blob_file(files, parsed->config.digest, what + ": config");
        if (!config_file) return config_file.error();
        auto config =
            local::read_local_json(*config_file, kMaxLocalConfigBytes, what + ": config " + parsed->config.digest);
        if (!config) return config.error();
        image.config_digest = parsed->config.digest;
        image.config_json = std::move(*config);
        break;
    }
    auto cfg = parse_image_config(image.config_json);
    if (!cfg) return cfg.error().wrap(what + ": config " + image.config_digest);
    GANTRY_TRY(local::check_layers(image, *cfg, what));
    image.platform = local::config_platform(*cfg);
    for (size_t i = 0; i < image.layers.size(); ++i) {
        const auto& d = image.layers[i];
        auto file = local::blob_file(files, d.digest, what + ": layer " + std::to_string(i));
        if (!file) return file.error();
        if (file->size != d.size)
            return make_error(what + ": layer " + std::to_string(i) + " (" + d.digest + ") is " +
                              std::to_string(file->size) + " bytes, the manifest says " + std::to_string(d.size));
        image.blobs.push_back(LayerBlob{file->open_path(), d.media_type, d.digest, cfg->diff_ids[i], file->fd});
    }
    return image;
}

}  // namespace gantry
