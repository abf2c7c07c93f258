// Parser for gantry.conf (see include/gantry/config.hpp for the format).
#include "gantry/config.hpp"

#include <pwd.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

Result<bool> parse_bool(const std::string& v) {
    if (v == "1" || v == "yes" || v == "true" || v == "on") return true;
    if (v == "0" || v == "no" || v == "false" || v == "off") return false;
    return make_error("expected a boolean (1/0, yes/no, true/false, on/off), got '" + v + "'");
}

Result<long long> parse_int(const std::string& v, long long lo, long long hi) {
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0) return make_error("expected an integer, got '" + v + "'");
    if (n < lo || n > hi)
        return make_error("value " + v + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return n;
}

Status one_of(const std::string& v, std::initializer_list<const char*> allowed) {
    std::string list;
    for (const char* a : allowed) {
        if (v == a) return {};
        list += list.empty() ? a : std::string(", ") + a;
    }
    return make_error("'" + v + "' is not one of: " + list);
}

using Setter = std::function<Status(Config&, const std::string&)>;

Setter string_key(std::string Config::*field) {
    return [field](Config& c, const std::string& v) -> Status {
        c.*field = v;
        return {};
    };
}

Setter bool_key(bool Config::*field) {
    return [field](Config& c, const std::string& v) -> Status {
        auto b = parse_bool(v);
        if (!b) return b.error();
        c.*field = *b;
        return {};
    };
}

// A whole number within [lo, hi].
Setter int_key(int Config::*field, long long lo, long long hi) {
    return [field, lo, hi](Config& c, const std::string& v) -> Status {
        auto n = parse_int(v, lo, hi);
        if (!n) return n.error();
        c.*field = static_cast<int>(*n);
        return {};
    };
}

Setter optional_bool_key(std::optional<bool> Config::*field) {
    return [field](Config& c, const std::string& v) -> Status {
        auto b = parse_bool(v);
        if (!b) return b.error();
        c.*field = *b;
        return {};
    };
}

// A drop-in directory: an absolute path, or empty for none.
Setter directory_key(std::string Config::*field) {
    return [field](Config& c, const std::string& v) -> Status {
        if (!v.empty() && v[0] != '/')
            return make_error("expected an absolute directory (or nothing, for none), got '" + v + "'");
        c.*field = v;
        return {};
    };
}

// A pull limit: a plain count (bytes or entries, like block_size), at least 1.
Setter limit_key(uint64_t PullLimits::*field) {
    return [field](Config& c, const std::string& v) -> Status {
        auto n = parse_int(v, 1, std::numeric_limits<long long>::max());
        if (!n) return n.error();
        c.limits.*field = static_cast<uint64_t>(*n);
        return {};
    };
}

const std::map<std::string, Setter>& setters() {
    static const std::map<std::string, Setter> table = {
        {"store_path", string_key(&Config::store_path)},
        {"store_owner",
         [](Config& c, const std::string& v) -> Status {
             // An account name, not a uid: the same name resolves on every node through NSS.
             if (v == "root") return make_error("store_owner = root is the default; leave the key unset");
             if (v.find_first_of(" \t:/") != std::string::npos) return make_error("'" + v + "' is not an account name");
             c.store_owner = v;
             return {};
         }},
        {"runtime_path", string_key(&Config::runtime_path)},
        {"scratch_path", string_key(&Config::scratch_path)},
        {"mount_backend",
         [](Config& c, const std::string& v) -> Status {
             GANTRY_TRY(one_of(v, {"auto", "kernel", "fuse", "extract"}));
             c.mount_backend = v;
             return {};
         }},
        {"pull_policy",
         [](Config& c, const std::string& v) -> Status {
             GANTRY_TRY(one_of(v, {"always", "missing", "never"}));
             c.pull_policy = v;
             return {};
         }},
        {"import_progress_seconds", int_key(&Config::import_progress_seconds, 0, 3600)},
        {"check_timeout_seconds", int_key(&Config::check_timeout_seconds, 1, 3600)},
        {"setup_timeout_seconds", int_key(&Config::setup_timeout_seconds, 1, 24 * 3600)},
        {"mount_idle_seconds", int_key(&Config::mount_idle_seconds, 0, 7 * 24 * 3600)},
        {"fuse_shared", bool_key(&Config::fuse_shared)},
        {"layered_images", bool_key(&Config::layered_images)},
        {"fuse_poll_us", int_key(&Config::fuse_poll_us, 0, 1000000)},
        {"fuse_server",
         [](Config& c, const std::string& v) -> Status {
             GANTRY_TRY(one_of(v, {"gantry", "squashfuse_ll"}));
             c.fuse_server = v;
             return {};
         }},
        {"compressor",
         [](Config& c, const std::string& v) -> Status {
             GANTRY_TRY(one_of(v, {"zstd", "lz4", "gzip", "xz", "lzo", "none"}));
             c.compressor = v;
             return {};
         }},
        {"compression_level", int_key(&Config::compression_level, 0, 22)},
        {"block_size",
         [](Config& c, const std::string& v) -> Status {
             auto n = parse_int(v, 4096, 1048576);
             if (!n) return n.error();
             if ((*n & (*n - 1)) != 0) return make_error("block_size must be a power of two, got " + v);
             c.block_size = static_cast<uint32_t>(*n);
             return {};
         }},
        {"max_connections", int_key(&Config::max_connections, 0, 256)},
        {"max_layer_bytes", limit_key(&PullLimits::max_layer_bytes)},
        {"max_image_bytes", limit_key(&PullLimits::max_image_bytes)},
        {"max_layer_entries", limit_key(&PullLimits::max_layer_entries)},
        {"max_layer_ratio", limit_key(&PullLimits::max_layer_ratio)},
        {"insecure_registries",
         [](Config& c, const std::string& v) -> Status {
             c.insecure_registries = split_list(v, ',');
             return {};
         }},
        {"ca_bundle", string_key(&Config::ca_bundle)},
        {"host_dev", bool_key(&Config::host_dev)},
        {"host_root", string_key(&Config::host_root)},
        {"gpu", bool_key(&Config::gpu)},
        {"efa", bool_key(&Config::efa)},
        {"efa_host_libs", bool_key(&Config::efa_host_libs)},
        {"efa_required", bool_key(&Config::efa_required)},
        {"pmix", bool_key(&Config::pmix)},
        {"import_messages", bool_key(&Config::import_messages)},
        {"batch_srun", bool_key(&Config::batch_srun)},
        {"private_images", bool_key(&Config::private_images)},
        {"authorization_cache_seconds", int_key(&Config::authorization_cache_seconds, 0, 24 * 3600)},
        {"stage_at_submit",
         [](Config& c, const std::string& v) -> Status {
             GANTRY_TRY(one_of(v, {"auto", "yes", "no"}));
             c.stage_at_submit = v;
             return {};
         }},
        {"stage_socket",
         [](Config& c, const std::string& v) -> Status {
             if (!v.empty() && v[0] != '/') return make_error("expected an absolute path, got '" + v + "'");
             if (v.size() > 107) return make_error("a Unix socket's path has at most 107 characters");
             c.stage_socket = v;
             return {};
         }},
        {"pytorch", bool_key(&Config::pytorch)},
        {"container_writable", optional_bool_key(&Config::container_writable)},
        {"container_remap_root", optional_bool_key(&Config::container_remap_root)},
        {"container_mount_home", optional_bool_key(&Config::container_mount_home)},
        {"environ_dir", directory_key(&Config::environ_dir)},
        {"mounts_dir", directory_key(&Config::mounts_dir)},
        {"telemetry_dir", directory_key(&Config::telemetry_dir)},
        {"enroot_conf",
         [](Config& c, const std::string& v) -> Status {
             if (!v.empty() && v[0] != '/') return make_error("expected an absolute path, got '" + v + "'");
             c.enroot_conf = v;
             return {};
         }},
    };
    return table;
}

}  // namespace

Result<Config> parse_config(const std::string& text, const std::string& origin) {
    Config c;
    c.source = origin;
    std::istringstream in(text);
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        auto hash = line.find('#');
        if (hash != std::string::npos) line.resize(hash);
        line = trim(line);
        if (line.empty()) continue;
        std::string where = origin + ":" + std::to_string(lineno);
        auto eq = line.find('=');
        if (eq == std::string::npos) return make_error(where + ": expected 'key = value', got '" + line + "'");
        std::string key = trim(line.substr(0, eq));
        std::string value = trim(line.substr(eq + 1));
        auto it = setters().find(key);
        if (it == setters().end())
            return make_error(where + ": unknown key '" + key + "' (see docs/admin.md for the valid keys)");
        auto st = it->second(c, value);
        if (!st) return st.error().wrap(where + ": " + key);
    }
    return c;
}

Status for_each_config_line(std::string_view text, const std::string& origin,
                            const std::function<Status(std::string& line, const std::string& where)>& each) {
    std::istringstream in{std::string(text)};
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        line = trim(line);
        if (line.empty() || line[0] == '#') continue;
        GANTRY_TRY(each(line, origin + ":" + std::to_string(lineno)));
    }
    return {};
}

Status apply_enroot_conf(Config& config, const std::string& text, const std::string& origin) {
    static const std::map<std::string, std::optional<bool> Config::*> keys = {
        {"ENROOT_ROOTFS_WRITABLE", &Config::container_writable},
        {"ENROOT_REMAP_ROOT", &Config::container_remap_root},
        {"ENROOT_MOUNT_HOME", &Config::container_mount_home},
    };
    return for_each_config_line(text, origin, [&](std::string& line, const std::string& where) -> Status {
        auto sep = line.find_first_of(" \t=");
        std::string key = line.substr(0, sep);
        auto it = keys.find(key);
        if (it == keys.end() || sep == std::string::npos) return {};
        std::string value = trim(line.substr(sep + 1));
        if (!value.empty() && value[0] == '=') value = trim(value.substr(1));
        if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
            value = value.substr(1, value.size() - 2);
        bool on;
        if (value == "y" || value == "yes" || value == "true" || value == "1")
            on = true;
        else if (value == "n" || value == "no" || value == "false" || value == "0")
            on = false;
        else
            return make_error(where + ": " + key + ": expected yes or no, got '" + value + "'");
        if (!(config.*(it->second))) config.*(it->second) = on;  // gantry.conf's own key wins
        return {};
    });
}

ContainerDefaults container_defaults(const Config& config) {
    ContainerDefaults d;
    d.writable = config.container_writable.value_or(d.writable);
    d.remap_root = config.container_remap_root.value_or(d.remap_root);
    d.mount_home = config.container_mount_home.value_or(d.mount_home);
    return d;
}

Result<Config> load_config(const std::string& path, bool missing_ok) {
    // Through read_config_file: the plugin reads this file as root inside slurmstepd, where a FIFO in
    // its place must not hang the step, nor a huge file grow its memory.
    auto text = read_config_file(path, "configuration " + path);
    if (!text) {
        if (missing_ok && text.error().errnum == ENOENT) return Config{};
        return text.error();
    }
    auto config = parse_config(*text, path);
    if (!config || config->enroot_conf.empty()) return config;
    auto enroot = read_config_file(config->enroot_conf, config->enroot_conf + " (enroot_conf in " + path + ")");
    if (!enroot) return enroot.error();
    GANTRY_TRY(apply_enroot_conf(*config, *enroot, config->enroot_conf));
    return config;
}

std::optional<unsigned> store_owner_uid(const Config& config) {
    if (config.store_owner.empty()) return std::nullopt;
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwnam_r(config.store_owner.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
        return std::nullopt;
    if (pw.pw_uid == 0) return std::nullopt;  // root is trusted anyway; nothing to add
    return static_cast<unsigned>(pw.pw_uid);
}

Result<Config> load_default_config() {
    const std::string& env = environment().gantry_config.value;
    if (!env.empty()) return load_config(env, false);
    return load_config("/etc/gantry/gantry.conf", true);
}

}  // namespace gantry
