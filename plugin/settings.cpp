// plugstack.conf argument parsing (see settings.hpp).
#include "settings.hpp"

#include <cstring>
#include <string>

namespace gantry::plugin {
namespace {

Result<bool> flag(const std::string& key, const std::string& v) {
    if (v == "1" || v == "true" || v == "yes") return true;
    if (v == "0" || v == "false" || v == "no") return false;
    return make_error("plugstack.conf: " + key + "=" + v + ": expected 0 or 1");
}

}  // namespace

Result<Settings> parse_settings(int argc, char** argv) {
    Settings s;
    for (int i = 0; i < argc; ++i) {
        std::string arg = argv[i];
        auto eq = arg.find('=');
        if (eq == std::string::npos) return make_error("plugstack.conf: argument '" + arg + "' is not KEY=VALUE");
        std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
        if (key == "runtime_path") {
            s.runtime_path = value;
        } else if (key == "execute_entrypoint") {
            auto b = flag(key, value);
            if (!b) return b.error();
            s.execute_entrypoint = *b;
        } else if (key == "container_scope") {
            if (value != "job" && value != "global")
                return make_error("plugstack.conf: container_scope=" + value + ": expected job or global");
            s.container_scope = value;
        } else if (key == "sbatch_support") {
            auto b = flag(key, value);
            if (!b) return b.error();
            s.sbatch_support = *b;
        } else if (key == "config") {
            s.config = value;
        } else if (key == "store") {
            s.store = value;
        } else if (key == "mount_backend") {
            if (value != "auto" && value != "kernel" && value != "fuse" && value != "extract")
                return make_error("plugstack.conf: mount_backend=" + value +
                                  ": expected auto, kernel, fuse or extract");
            s.mount_backend = value;
        } else if (key == "gantry") {
            s.gantry = value;
        } else if (key == "trace") {
            if (value.empty() || value[0] != '/')
                return make_error("plugstack.conf: trace=" + value + ": expected an absolute path");
            s.trace = value;
        } else if (key == "use_enroot_load" || key == "importer" || key == "use_squashfuse") {
            return make_error("plugstack.conf: '" + key +
                              "' is a Pyxis/Enroot setting with no meaning in Gantry; remove it (see docs/admin.md)");
        } else {
            return make_error("plugstack.conf: unknown key '" + key +
                              "' (valid: runtime_path, execute_entrypoint, container_scope, sbatch_support, config, "
                              "store, mount_backend, gantry, trace)");
        }
    }
    return s;
}

}  // namespace gantry::plugin
