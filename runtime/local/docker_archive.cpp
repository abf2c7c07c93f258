// Reading an image out of a docker-archive (`docker save`, `skopeo copy ... docker-archive:`):
// manifest.json names each image's config file, its layer tars (bottom first) and its RepoTags. There
// is no registry manifest in it, so one is written here -- Docker schema2, naming the blobs as they
// are in the archive -- and its digest identifies the image in the store.
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gantry/digest.hpp"
#include "gantry/image_config.hpp"
#include "gantry/local_image.hpp"
#include "local_internal.hpp"

namespace gantry {
namespace {

using nlohmann::json;

constexpr const char* kDockerConfigType = "application/vnd.docker.container.image.v1+json";
constexpr const char* kDockerLayerTar = "application/vnd.docker.image.rootfs.diff.tar";
constexpr const char* kDockerLayerGzip = "application/vnd.docker.image.rootfs.diff.tar.gzip";
constexpr const char* kOciLayerZstd = "application/vnd.oci.image.layer.v1.tar+zstd";

// A layer file's media type from its first bytes: `docker save` writes plain tars, but an archive
// assembled by other tools may hold compressed ones.
std::string layer_media_type(const std::string& path) {
    char head[4] = {};
    std::ifstream in(path, std::ios::binary);
    in.read(head, sizeof head);
    if (in.gcount() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f && static_cast<unsigned char>(head[1]) == 0x8b)
        return kDockerLayerGzip;
    static const unsigned char zstd_magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (in.gcount() == 4 && std::memcmp(head, zstd_magic, 4) == 0) return kOciLayerZstd;
    return kDockerLayerTar;
}

std::vector<std::string> string_array(const json& j, const char* key) {
    std::vector<std::string> out;
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return out;
    for (const auto& v : *it)
        if (v.is_string()) out.push_back(v.get<std::string>());
    return out;
}

}  // namespace

Result<LocalImage> read_docker_archive(const LocalFileLookup& files, const std::string& what, const std::string& tag) {
    auto manifest_file = files("manifest.json");
    if (!manifest_file) return manifest_file.error().wrap(what + " is not a docker-archive");
    auto text = local::read_local_json(*manifest_file, kMaxLocalIndexBytes, what + "'s manifest.json");
    if (!text) return text.error();
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) return make_error(what + ": manifest.json is not a JSON array");

    const json* entry = nullptr;
    std::string all_tags;
    size_t images = 0;
    for (const auto& e : j) {
        if (!e.is_object()) return make_error(what + ": manifest.json has an entry that is not an object");
        ++images;
        auto tags = string_array(e, "RepoTags");
        for (const auto& t : tags) all_tags += (all_tags.empty() ? "" : ", ") + t;
        if (tag.empty()) {
            entry = &e;
            continue;
        }
        for (const auto& t : tags) {
            // "repo:tag" as written, or with docker's implied "docker.io/" or "docker.io/library/" in front.
            if (t == tag || t == "docker.io/" + tag || t == "docker.io/library/" + tag) entry = &e;
        }
    }
    if (images == 0) return make_error(what + ": manifest.json lists no image");
    if (!tag.empty() && entry == nullptr)
        return make_error(what + ": no image tagged '" + tag +
                          "' (RepoTags: " + (all_tags.empty() ? "none" : all_tags) + ")");
    if (tag.empty() && images > 1)
        return make_error(what + " holds " + std::to_string(images) +
                          " images; name one as docker-archive:FILE:IMAGE (RepoTags: " +
                          (all_tags.empty() ? "none" : all_tags) + ")");

    auto config_it = entry->find("Config");
    if (config_it == entry->end() || !config_it->is_string())
        return make_error(what + ": manifest.json names no Config");
    auto layer_it = entry->find("Layers");
    if (layer_it == entry->end() || !layer_it->is_array()) return make_error(what + ": manifest.json names no Layers");

    LocalImage image;
    image.repo_tags = string_array(*entry, "RepoTags");
    auto config_file = files(config_it->get<std::string>());
    if (!config_file) return config_file.error().wrap(what + ": config");
    auto config =
        local::read_local_json(*config_file, kMaxLocalConfigBytes, what + ": config " + config_it->get<std::string>());
    if (!config) return config.error();
    image.config_json = std::move(*config);
    image.config_digest = config_file->digest;
    auto cfg = parse_image_config(image.config_json);
    if (!cfg) return cfg.error().wrap(what + ": config " + config_it->get<std::string>());
    image.platform = local::config_platform(*cfg);

    json layers = json::array();
    size_t i = 0;
    for (const auto& l : *layer_it) {
        if (!l.is_string()) return make_error(what + ": manifest.json has a layer name that is not a string");
        const std::string name = l.get<std::string>();
        const std::string label = what + ": layer " + std::to_string(i) + " (" + name + ")";
        auto file = files(name);
        if (!file) return file.error().wrap(label);
        std::string type = layer_media_type(file->path);
        if (i >= cfg->diff_ids.size())
            return make_error(what + ": manifest.json lists more layers than the config's " +
                              std::to_string(cfg->diff_ids.size()) + " diff_ids");
        // A plain tar is its own diff_id: checked here, before anything is converted.
        if (type == kDockerLayerTar && file->digest != cfg->diff_ids[i])
            return make_error(label + " has the sha256 " + file->digest + ", but the config's diff_id is " +
                              cfg->diff_ids[i] + ": the archive is corrupt or was altered");
        image.layers.push_back(Descriptor{type, file->digest, file->size});
        image.blobs.push_back(LayerBlob{file->open_path(), type, file->digest, cfg->diff_ids[i], file->fd});
        layers.push_back({{"mediaType", type}, {"size", file->size}, {"digest", file->digest}});
        ++i;
    }
    GANTRY_TRY(local::check_layers(image, *cfg, what));
    json manifest = {
        {"schemaVersion", 2},
        {"mediaType", kMediaDockerManifest},
        {"config",
         {{"mediaType", kDockerConfigType}, {"size", image.config_json.size()}, {"digest", image.config_digest}}},
        {"layers", layers}};
    image.manifest_json = manifest.dump();
    image.manifest_digest = Sha256::of(image.manifest_json);
    return image;
}

}  // namespace gantry
