// Parsing of image manifests and indexes (OCI and Docker schema2) and platform selection in an index.
// Only structure is checked here; digests of the bytes are verified by the caller that fetched them.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gantry/digest.hpp"
#include "gantry/registry.hpp"
#include "registry/platform_match.hpp"

namespace gantry {

const char* const kManifestAccept =
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json";

namespace {

using nlohmann::json;

constexpr const char* kMediaDockerSchema1 = "application/vnd.docker.distribution.manifest.v1+json";
constexpr const char* kMediaDockerSchema1Signed = "application/vnd.docker.distribution.manifest.v1+prettyjws";
constexpr const char* kMediaOciConfig = "application/vnd.oci.image.config.v1+json";
constexpr const char* kMediaDockerConfig = "application/vnd.docker.container.image.v1+json";

std::string str_field(const json& j, const char* key) {
    auto it = j.find(key);
    return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

// schemaVersion, or `absent` when missing or not a number.
int64_t schema_version(const json& j, int64_t absent) {
    auto it = j.find("schemaVersion");
    return (it != j.end() && it->is_number_integer()) ? it->get<int64_t>() : absent;
}

// "application/JSON; charset=utf-8" -> "application/json"
std::string bare_media_type(std::string_view content_type) {
    auto semi = content_type.find(';');
    std::string s(content_type.substr(0, semi));
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
    for (char& c : s)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return s;
}

bool is_index_type(const std::string& t) {
    return t == kMediaOciIndex || t == kMediaDockerList;
}
bool is_manifest_type(const std::string& t) {
    return t == kMediaOciManifest || t == kMediaDockerManifest;
}

Error schema1_error() {
    return make_error(
        "the image uses the Docker schema1 manifest format, which Gantry does not support (deprecated since "
        "2017); push it again with a current docker, podman or skopeo");
}

Result<Descriptor> parse_descriptor(const json& j, const std::string& what) {
    if (!j.is_object()) return make_error(what + " is not a JSON object");
    Descriptor d;
    auto mt = j.find("mediaType");
    if (mt != j.end() && mt->is_string()) d.media_type = mt->get<std::string>();
    auto dg = j.find("digest");
    if (dg == j.end() || !dg->is_string()) return make_error(what + " has no digest");
    d.digest = dg->get<std::string>();
    if (auto st = validate_digest(d.digest); !st) return st.error().wrap(what);
    auto sz = j.find("size");
    if (sz == j.end() || !sz->is_number_unsigned()) {
        if (sz != j.end() && sz->is_number_integer() && sz->get<int64_t>() >= 0) {
            d.size = static_cast<uint64_t>(sz->get<int64_t>());
            return d;
        }
        return make_error(what + " (" + d.digest + ") has no valid size");
    }
    d.size = sz->get<uint64_t>();
    return d;
}

// What the document is when neither mediaType nor Content-Type says (a registry serving
// application/json or octet-stream): decided by its shape.
std::string infer_type(const json& j) {
    if (j.contains("manifests")) return kMediaOciIndex;
    if (j.contains("config") && j.contains("layers")) return kMediaOciManifest;
    if (j.contains("fsLayers") || schema_version(j, 0) == 1) return kMediaDockerSchema1;
    return {};
}

}  // namespace

Result<ParsedManifest> parse_manifest(std::string_view body, std::string_view content_type) {
    json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return make_error("manifest is not a JSON object");

    ParsedManifest m;
    auto mt = j.find("mediaType");
    if (mt != j.end() && mt->is_string()) {
        m.media_type = mt->get<std::string>();
    } else {
        m.media_type = bare_media_type(content_type);
        if (!is_index_type(m.media_type) && !is_manifest_type(m.media_type) && m.media_type != kMediaDockerSchema1 &&
            m.media_type != kMediaDockerSchema1Signed)
            m.media_type = infer_type(j);
    }
    if (m.media_type == kMediaDockerSchema1 || m.media_type == kMediaDockerSchema1Signed || schema_version(j, 2) == 1)
        return schema1_error();
    if (schema_version(j, 2) != 2) return make_error("unsupported manifest schemaVersion " + j["schemaVersion"].dump());

    if (is_index_type(m.media_type)) {
        m.kind = ParsedManifest::Kind::index;
        auto ms = j.find("manifests");
        if (ms == j.end() || !ms->is_array()) return make_error("index has no manifests array");
        size_t i = 0;
        for (const auto& e : *ms) {
            auto d = parse_descriptor(e, "index entry " + std::to_string(i++));
            if (!d) return d.error();
            IndexEntry entry{*d, std::nullopt};
            auto p = e.find("platform");
            if (p != e.end() && p->is_object()) {
                Platform pl;
                pl.os = str_field(*p, "os");
                pl.architecture = str_field(*p, "architecture");
                pl.variant = str_field(*p, "variant");
                entry.platform = pl;
            }
            m.entries.push_back(std::move(entry));
        }
        return m;
    }
    if (!is_manifest_type(m.media_type)) {
        if (m.media_type.empty()) return make_error("cannot tell the manifest type (no mediaType, no Content-Type)");
        return make_error("unsupported manifest media type " + m.media_type);
    }

    m.kind = ParsedManifest::Kind::manifest;
    auto cfg = j.find("config");
    if (cfg == j.end()) return make_error("manifest has no config");
    auto c = parse_descriptor(*cfg, "manifest config");
    if (!c) return c.error();
    m.config = *c;
    if (!m.config.media_type.empty() && m.config.media_type != kMediaOciConfig &&
        m.config.media_type != kMediaDockerConfig)
        return make_error("not a container image: config media type is " + m.config.media_type);
    auto ls = j.find("layers");
    if (ls == j.end() || !ls->is_array()) return make_error("manifest has no layers array");
    size_t i = 0;
    for (const auto& l : *ls) {
        auto d = parse_descriptor(l, "layer " + std::to_string(i++));
        if (!d) return d.error();
        m.layers.push_back(*d);
    }
    return m;
}

Result<Descriptor> select_platform(const ParsedManifest& index, const Platform& wanted) {
    const IndexEntry* best = nullptr;
    int best_score = 0;
    std::string available;
    size_t with_platform = 0;
    const IndexEntry* only_manifest = nullptr;
    size_t manifests = 0;
    for (const auto& e : index.entries) {
        // Nested indexes and non-image artifacts are never selected.
        if (!e.descriptor.media_type.empty() && !is_manifest_type(e.descriptor.media_type)) continue;
        ++manifests;
        only_manifest = &e;
        if (!e.platform) continue;
        ++with_platform;
        // BuildKit attestation manifests say "unknown/unknown"; they are not images.
        if (e.platform->os == "unknown" && e.platform->architecture == "unknown") continue;
        std::string name = e.platform->str();
        if (available.find(name) == std::string::npos) available += (available.empty() ? "" : ", ") + name;
        int score = platform_match_score(wanted, *e.platform);
        if (score > best_score) {
            best_score = score;
            best = &e;
        }
    }
    if (best != nullptr) return best->descriptor;
    // An index that names no platforms at all and holds one image: that image.
    if (with_platform == 0 && manifests == 1) return only_manifest->descriptor;
    return make_error("no image for platform " + wanted.str() +
                      " in the index (available: " + (available.empty() ? "none" : available) + ")");
}

}  // namespace gantry
