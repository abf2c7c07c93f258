// OCI image configuration parsing (image-spec config.md; Docker's v1 image JSON is the same shape).
#include "gantry/image_config.hpp"

#include <nlohmann/json.hpp>

namespace gantry {
namespace {

using nlohmann::json;

Result<std::vector<std::string>> string_array(const json& j, const char* field) {
    std::vector<std::string> out;
    if (!j.contains(field) || j[field].is_null()) return out;
    if (!j[field].is_array()) return make_error(std::string("image config: '") + field + "' is not an array");
    for (const auto& v : j[field]) {
        if (!v.is_string()) return make_error(std::string("image config: '") + field + "' holds a non-string");
        out.push_back(v.get<std::string>());
    }
    return out;
}

}  // namespace

Result<ImageConfig> parse_image_config(const std::string& text) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("image config is not a JSON object");
    ImageConfig c;
    if (j.contains("architecture") && j["architecture"].is_string()) c.architecture = j["architecture"];
    if (j.contains("os") && j["os"].is_string()) c.os = j["os"];
    if (j.contains("config") && j["config"].is_object()) {
        const json& cfg = j["config"];
        auto env = string_array(cfg, "Env");
        if (!env) return env.error();
        c.env = std::move(*env);
        auto ep = string_array(cfg, "Entrypoint");
        if (!ep) return ep.error();
        c.entrypoint = std::move(*ep);
        auto cmd = string_array(cfg, "Cmd");
        if (!cmd) return cmd.error();
        c.cmd = std::move(*cmd);
        if (cfg.contains("WorkingDir") && cfg["WorkingDir"].is_string()) c.working_dir = cfg["WorkingDir"];
        if (cfg.contains("User") && cfg["User"].is_string()) c.user = cfg["User"];
        if (cfg.contains("Volumes") && cfg["Volumes"].is_object())
            for (const auto& [k, v] : cfg["Volumes"].items()) c.volumes.push_back(k);
        if (cfg.contains("Labels") && cfg["Labels"].is_object())
            for (const auto& [k, v] : cfg["Labels"].items())
                if (v.is_string()) c.labels[k] = v.get<std::string>();
    }
    if (j.contains("rootfs") && j["rootfs"].is_object()) {
        auto ids = string_array(j["rootfs"], "diff_ids");
        if (!ids) return ids.error();
        c.diff_ids = std::move(*ids);
    }
    return c;
}

std::optional<std::string> find_env(const std::vector<std::string>& env, const std::string& name) {
    std::optional<std::string> found;
    for (const auto& e : env)
        if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=')
            found = e.substr(name.size() + 1);
    return found;
}

}  // namespace gantry
