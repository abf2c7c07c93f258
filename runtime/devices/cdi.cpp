// Container Device Interface (CDI) specs, the vendor-neutral way a host describes its devices
// (`nvidia-ctk cdi generate`, and other vendors' tools): for each requested fully qualified device
// name `vendor/class=name`, the spec's container-wide edits and the device's own edits (device
// nodes, mounts, env) are applied. Specs are read from /etc/cdi and /var/run/cdi under the host
// root. Hooks are not run (they are host programs such as `nvidia-ctk hook update-ldcache`); the one
// effect every GPU spec relies on, libraries resolving through the ld.so cache, is provided by
// listing the directories of mounted shared libraries for the container's ldconfig.
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

void apply_edits(const json& e, const std::string& root, ContainerEdits& out) {
    if (!e.is_object()) return;
    for (const auto& v : e.value("env", json::array()))
        if (v.is_string()) out.env.push_back(v.get<std::string>());
    for (const auto& d : e.value("deviceNodes", json::array())) {
        std::string path = d.value("path", "");
        if (path.empty() || path[0] != '/') continue;
        std::string host = d.value("hostPath", path);
        out.devices.push_back({host_path(root, host), path});
    }
    std::set<std::string> lib_dirs;
    for (const auto& m : e.value("mounts", json::array())) {
        std::string host = m.value("hostPath", ""), dst = m.value("containerPath", "");
        if (host.empty() || dst.empty() || dst[0] != '/') continue;
        bool ro = false;
        for (const auto& o : m.value("options", json::array()))
            if (o.is_string() && o.get<std::string>() == "ro") ro = true;
        out.mounts.push_back({host_path(root, host), dst, ro});
        std::string name = dst.substr(dst.rfind('/') + 1);
        if (name.find(".so") != std::string::npos && dst.rfind('/') > 0) lib_dirs.insert(dst.substr(0, dst.rfind('/')));
    }
    for (const auto& d : lib_dirs) out.ld_library_dirs.push_back(d);
}

}  // namespace

Result<ContainerEdits> cdi_edits(const Config& config, const std::vector<std::string>& requested) {
    ContainerEdits edits;
    if (requested.empty()) return edits;
    const std::string& root = config.host_root;
    std::vector<Spec> specs;
    std::vector<std::string> skipped;
    for (const char* dir : {"/etc/cdi", "/var/run/cdi"}) {
        std::string d = host_path(root, dir);
        for (const auto& name : list_dir(d)) {
            std::string file = d + "/" + name;
            if (ends_with(name, ".yaml") || ends_with(name, ".yml")) {
                skipped.push_back(file);  // no YAML parser in Debian's C++ set we use; see docs/devices.md
                continue;
            }
            if (!ends_with(name, ".json")) continue;
            auto text = try_read_file(file);
            if (!text) return make_error("reading CDI spec " + file + ": cannot read");
            json doc = json::parse(*text, nullptr, false);
            if (doc.is_discarded() || !doc.is_object()) return make_error("CDI spec " + file + ": not valid JSON");
            specs.push_back({file, std::move(doc)});
        }
    }
    std::set<std::string> applied_specs;
    std::string names;
    for (const auto& req : requested) {
        auto eq = req.find('=');
        std::string kind = req.substr(0, eq), dev = req.substr(eq + 1);
        bool found = false;
        for (const auto& s : specs) {
            if (s.doc.value("kind", "") != kind) continue;
            for (const auto& d : s.doc.value("devices", json::array())) {
                if (d.value("name", "") != dev) continue;
                if (applied_specs.insert(s.file).second)
                    apply_edits(s.doc.value("containerEdits", json::object()), root, edits);
                apply_edits(d.value("containerEdits", json::object()), root, edits);
                found = true;
                break;
            }
            if (found) break;
        }
        if (!found) {
            std::string why = "CDI device " + req + " is not defined by any spec in /etc/cdi or /var/run/cdi";
            if (!skipped.empty()) why += " (YAML specs are not read: convert " + skipped.front() + " to JSON)";
            return make_error(why);
        }
        names += (names.empty() ? "" : ",") + req;
    }
    edits.summary = "cdi " + names;
    return edits;
}

}  // namespace gantry::devices
