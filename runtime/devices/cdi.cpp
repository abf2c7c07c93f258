// Container Device Interface (CDI) specs, the vendor-neutral way a host describes its devices
// (`nvidia-ctk cdi generate`, and other vendors' tools): for each requested fully qualified device
// name `vendor/class=name`, the spec's container-wide edits and the device's own edits (device
// nodes, mounts, env) are applied. Specs are read from /etc/cdi and /var/run/cdi under the host
// root, in JSON (.json) or YAML (.yaml/.yml, what nvidia-ctk writes by default); a YAML document is
// turned into the same JSON value first, so both formats have one set of rules and messages.
//
// Hooks are not run (they are host programs such as `nvidia-ctk hook update-ldcache`). Their
// effects that GPU specs rely on are provided: the directories of mounted shared libraries are
// listed for the container's ldconfig, each mounted library gets the soname link the host's ld.so
// cache names for it (what ldconfig in update-ldcache would create), and nvidia-ctk's
// `create-symlinks --link TARGET::LINK` arguments become symlinks. Other hooks are counted in the
// summary line.
#include <yaml.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "gantry/files.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry::devices {
namespace {

using nlohmann::json;

struct Spec {
    std::string file;
    json doc;
};

// A YAML document as the JSON value it denotes, through libyaml's document loader. Scalars stay
// strings (the fields we read are strings; numbers such as major/minor are not used), plain `~`,
// `null` and empty scalars become null. Aliases can make a node its own descendant, or expand a small
// file into a huge tree: depth and node count are bounded.
class YamlToJson {
public:
    explicit YamlToJson(yaml_document_t* doc) : doc_(doc) {}
    Result<json> convert(yaml_node_t* node, int depth = 0) {
        if (!node) return json(nullptr);
        if (depth > 64 || ++nodes_ > 100000) return make_error("nested or aliased too deeply");
        switch (node->type) {
            case YAML_SCALAR_NODE: {
                std::string v(reinterpret_cast<const char*>(node->data.scalar.value), node->data.scalar.length);
                if (node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && (v.empty() || v == "~" || v == "null"))
                    return json(nullptr);
                return json(v);
            }
            case YAML_SEQUENCE_NODE: {
                json a = json::array();
                for (auto* i = node->data.sequence.items.start; i < node->data.sequence.items.top; ++i) {
                    auto item = convert(yaml_document_get_node(doc_, *i), depth + 1);
                    if (!item) return item.error();
                    a.push_back(std::move(*item));
                }
                return a;
            }
            case YAML_MAPPING_NODE: {
                json o = json::object();
                for (auto* p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; ++p) {
                    yaml_node_t* key = yaml_document_get_node(doc_, p->key);
                    if (!key || key->type != YAML_SCALAR_NODE) return make_error("a mapping key is not a string");
                    auto value = convert(yaml_document_get_node(doc_, p->value), depth + 1);
                    if (!value) return value.error();
                    o[std::string(reinterpret_cast<const char*>(key->data.scalar.value), key->data.scalar.length)] =
                        std::move(*value);
                }
                return o;
            }
            default:
                return json(nullptr);
        }
    }

private:
    yaml_document_t* doc_;
    size_t nodes_ = 0;
};

Result<json> parse_yaml(const std::string& text) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return make_error("libyaml: out of memory");
    yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()), text.size());
    yaml_document_t doc;
    if (!yaml_parser_load(&parser, &doc)) {
        // Marks are 0-based; people count lines from 1.
        std::string why = "line " + std::to_string(parser.problem_mark.line + 1) + ": " +
                          (parser.problem ? parser.problem : "syntax error");
        if (parser.context) why += std::string(" ") + parser.context;
        yaml_parser_delete(&parser);
        return make_error(why);
    }
    auto out = YamlToJson(&doc).convert(yaml_document_get_root_node(&doc));
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return out;
}

std::string str(const json& o, const char* key) {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

json list(const json& o, const char* key) {
    auto it = o.find(key);
    return it != o.end() && it->is_array() ? *it : json::array();
}

// Soname links for mounted libraries, from the host's ld.so cache: the entries whose path resolves
// to the mounted file ("libcuda.so.1" for libcuda.so.550.54.15).
struct SonameIndex {
    std::multimap<std::string, std::string> by_file;  // resolved host path (unprefixed) -> soname
    explicit SonameIndex(const std::string& root) {
        auto text = try_read_file(host_path(root, "/etc/ld.so.cache"));
        if (!text) return;
        auto entries = parse_ld_cache(*text);
        if (!entries) return;
        for (const auto& e : *entries)
            if (auto real = resolve_in_host(root, e.path)) by_file.emplace(*real, e.soname);
    }
};

void apply_edits(const json& e, const std::string& root, const SonameIndex& sonames, ContainerEdits& out,
                 size_t& hooks_skipped) {
    if (!e.is_object()) return;
    for (const auto& v : list(e, "env"))
        if (v.is_string()) out.env.push_back(v.get<std::string>());
    for (const auto& d : list(e, "deviceNodes")) {
        if (!d.is_object()) continue;
        std::string path = str(d, "path");
        if (path.empty() || path[0] != '/') continue;
        std::string host = str(d, "hostPath");
        out.devices.push_back({host_path(root, host.empty() ? path : host), path});
    }
    std::set<std::string> lib_dirs;
    for (const auto& m : list(e, "mounts")) {
        if (!m.is_object()) continue;
        std::string host = str(m, "hostPath"), dst = str(m, "containerPath");
        if (host.empty() || dst.empty() || dst[0] != '/') continue;
        bool ro = false;
        for (const auto& o : list(m, "options"))
            if (o.is_string() && o.get<std::string>() == "ro") ro = true;
        out.mounts.push_back({host_path(root, host), dst, ro});
        auto slash = dst.rfind('/');
        std::string name = dst.substr(slash + 1), dir = dst.substr(0, slash);
        if (name.find(".so") == std::string::npos || slash == 0) continue;
        lib_dirs.insert(dir);
        if (auto real = resolve_in_host(root, host)) {
            auto [from, to] = sonames.by_file.equal_range(*real);
            std::set<std::string> done;
            for (auto it = from; it != to; ++it)
                if (it->second != name && done.insert(it->second).second)
                    out.symlinks.push_back({dir + "/" + it->second, name});
        }
    }
    for (const auto& d : lib_dirs) out.ld_library_dirs.push_back(d);
    for (const auto& h : list(e, "hooks")) {
        // nvidia-ctk's create-symlinks hook: "--link TARGET::LINK" pairs, LINK absolute in the container.
        std::vector<std::string> args;
        for (const auto& a : list(h, "args"))
            if (a.is_string()) args.push_back(a.get<std::string>());
        bool symlinks = std::find(args.begin(), args.end(), "create-symlinks") != args.end();
        for (size_t i = 0; symlinks && i < args.size(); ++i) {
            std::string spec;
            if (args[i] == "--link" && i + 1 < args.size())
                spec = args[++i];
            else if (starts_with(args[i], "--link="))
                spec = args[i].substr(7);
            auto sep = spec.find("::");
            if (sep == std::string::npos || sep == 0 || spec.size() < sep + 3 || spec[sep + 2] != '/') continue;
            out.symlinks.push_back({spec.substr(sep + 2), spec.substr(0, sep)});
        }
        if (!symlinks) ++hooks_skipped;
    }
}

}  // namespace

Result<json> parse_cdi_spec(const std::string& file, const std::string& text, bool yaml) {
    if (!yaml) {
        json doc = json::parse(text, nullptr, false);
        if (doc.is_discarded()) return make_error("CDI spec " + file + ": not valid JSON");
        return doc;
    }
    auto doc = parse_yaml(text);
    if (!doc) return make_error("CDI spec " + file + ": not valid YAML (" + doc.error().message + ")");
    return doc;
}

Result<void> check_cdi_spec(const std::string& file, const json& doc) {
    auto bad = [&](const std::string& what) { return make_error("CDI spec " + file + ": " + what); };
    if (!doc.is_object()) return bad("not a mapping of cdiVersion, kind, devices");
    if (!doc.contains("cdiVersion") || !doc["cdiVersion"].is_string() || doc["cdiVersion"].get<std::string>().empty())
        return bad("no cdiVersion");
    std::string kind = doc.value("kind", json()).is_string() ? doc["kind"].get<std::string>() : "";
    auto slash = kind.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == kind.size() || kind.find('=') != std::string::npos)
        return bad("kind '" + kind + "' is not vendor/class");
    if (!doc.contains("devices") || !doc["devices"].is_array()) return bad("no devices list");
    size_t i = 0;
    for (const auto& d : doc["devices"]) {
        if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || d["name"].get<std::string>().empty())
            return bad("device " + std::to_string(i) + " has no name");
        if (d.contains("containerEdits") && !d["containerEdits"].is_object())
            return bad("device " + d["name"].get<std::string>() + ": containerEdits is not a mapping");
        ++i;
    }
    if (doc.contains("containerEdits") && !doc["containerEdits"].is_object() && !doc["containerEdits"].is_null())
        return bad("containerEdits is not a mapping");
    return {};
}

Result<ContainerEdits> cdi_edits(const Config& config, const std::vector<std::string>& requested) {
    ContainerEdits edits;
    if (requested.empty()) return edits;
    const std::string& root = config.host_root;
    std::vector<Spec> specs;
    std::vector<std::string> broken;  // "CDI spec FILE: problem"
    for (const char* dir : {"/etc/cdi", "/var/run/cdi"}) {
        std::string d = host_path(root, dir);
        for (const auto& name : list_dir(d)) {
            bool yaml = ends_with(name, ".yaml") || ends_with(name, ".yml");
            if (!yaml && !ends_with(name, ".json")) continue;
            std::string file = d + "/" + name;
            auto text = read_config_file(file, "CDI spec " + file);
            if (!text) {
                broken.push_back(text.error().message);
                continue;
            }
            auto doc = parse_cdi_spec(file, *text, yaml);
            // A broken spec must not take the other vendors' devices down with it: it is skipped, and
            // named when the device asked for is not found (it may be the one that defines it).
            Status ok = doc ? check_cdi_spec(file, *doc) : Status(doc.error());
            if (!ok) {
                broken.push_back(ok.error().message);
                continue;
            }
            specs.push_back({file, std::move(*doc)});
        }
    }
    SonameIndex sonames(root);
    std::set<std::string> applied_specs;
    std::string names;
    size_t hooks_skipped = 0;
    for (const auto& req : requested) {
        auto eq = req.find('=');
        std::string kind = req.substr(0, eq), dev = eq == std::string::npos ? "" : req.substr(eq + 1);
        bool found = false;
        for (const auto& s : specs) {
            if (str(s.doc, "kind") != kind) continue;
            for (const auto& d : s.doc["devices"]) {
                if (str(d, "name") != dev) continue;
                if (applied_specs.insert(s.file).second)
                    apply_edits(s.doc.value("containerEdits", json::object()), root, sonames, edits, hooks_skipped);
                apply_edits(d.value("containerEdits", json::object()), root, sonames, edits, hooks_skipped);
                found = true;
                break;
            }
            if (found) break;
        }
        if (!found) {
            std::string why = "CDI device " + req + " is not defined by any spec in /etc/cdi or /var/run/cdi";
            if (!broken.empty()) why += " (skipped " + broken.front() + ")";
            return make_error(why);
        }
        names += (names.empty() ? "" : ",") + req;
    }
    for (const auto& b : broken) edits.warnings.push_back(b + " (skipped)");
    edits.summary = "cdi " + names;
    if (hooks_skipped > 0) edits.summary += " (" + std::to_string(hooks_skipped) + " hooks not run)";
    return edits;
}

}  // namespace gantry::devices
