// The Pyxis-compatible `--container-*` options (see options.hpp).
#include "options.hpp"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "options_internal.hpp"

namespace gantry::plugin {
namespace {

struct Names {
    const char* option;
    const char* env;  // suffix after PYXIS_CONTAINER_ / GANTRY_CONTAINER_
};

// An option refused while Slurm parses the command line: srun (or sbatch) prints the line and stops
// before any step starts. In slurmstepd the message is kept for task_init as well.
int refuse(const std::string& message) {
    record_error(message);
    slurm_error("%s", message.c_str());
    return -1;
}

// What each option wants, for "argument required" (Pyxis refuses every empty value).
const char* expected_value(int id) {
    switch (id) {
        case kImage:
            return "an image such as ubuntu:24.04, or a squashfs file path";
        case kMounts:
            return "SRC[:DST[:FLAGS]][,...]";
        case kWorkdir:
            return "a directory inside the container";
        case kName:
            return "NAME[:auto|create|exec|no_exec]";
        case kSave:
            return "the path of the squashfs file to write";
        case kEnv:
            return "NAME[,NAME...]";
        case kUnshare:
            return "NAMESPACE[,NAMESPACE...] (net, ipc, uts)";
        default:
            return "a value";
    }
}

bool has_empty_element(std::string_view list) {
    size_t start = 0;
    for (;;) {
        size_t comma = list.find(',', start);
        if (comma == start || (comma == std::string_view::npos && start == list.size())) return true;
        if (comma == std::string_view::npos) return false;
        start = comma + 1;
    }
}

// Slurm may call a callback twice with the same value (sbatch options forwarded through the
// environment, then the command line): the same value is fine. A different value is an error, except
// that a value given on an inner srun's command line overrides one inherited from sbatch.
int set_string(std::optional<std::string>& slot, const char* option, const char* value) {
    std::string v = value != nullptr ? value : "";
    if (slot && *slot != v) {
        std::string inherited_var = std::string(kInheritedOptionPrefix) + option;
        for (char& c : inherited_var)
            if (c == '-') c = '_';
        const auto& inherited_options = environment().inherited_options;
        auto inherited = inherited_options.find(inherited_var);
        if (inherited != inherited_options.end() && *slot == inherited->second) {
            slot = v;
            return 0;
        }
        // Pyxis wording, which scripts grep for.
        std::string msg = std::string("gantry: --") + option + " specified multiple times";
        record_error(msg);
        slurm_error("%s", msg.c_str());
        return -1;
    }
    slot = v;
    return 0;
}

int set_bool(std::optional<bool>& slot, const char* option, bool value) {
    if (slot && *slot != value) {
        std::string msg = std::string("gantry: conflicting options around --") + option;
        record_error(msg);
        slurm_error("%s", msg.c_str());
        return -1;
    }
    slot = value;
    return 0;
}

// The name of an option that takes a value, for messages; nullptr for flags.
const char* option_name(int id) {
    switch (id) {
        case kImage:
            return "container-image";
        case kMounts:
            return "container-mounts";
        case kWorkdir:
            return "container-workdir";
        case kName:
            return "container-name";
        case kSave:
            return "container-save";
        case kEnv:
            return "container-env";
        case kUnshare:
            return "container-unshare";
        default:
            return nullptr;
    }
}

int on_option(int val, const char* optarg, int remote) {
    JobOptions& o = options();
    if (const char* name = option_name(val); name != nullptr) {
        auto problem = value_problem(val, std::string("--") + name, optarg != nullptr ? optarg : "", remote == 0);
        if (!problem.empty()) return refuse(problem);
    }
    switch (val) {
        case kImage:
            return set_string(o.image, "container-image", optarg);
        case kMounts: {
            // Several --container-mounts accumulate, like Pyxis.
            std::string v = optarg != nullptr ? optarg : "";
            if (!o.mounts)
                o.mounts = v;
            else if (o.mounts->find(v) == std::string::npos)
                *o.mounts += "," + v;
            return 0;
        }
        case kWorkdir:
            return set_string(o.workdir, "container-workdir", optarg);
        case kName:
            return set_string(o.name, "container-name", optarg);
        case kSave:
            return set_string(o.save, "container-save", optarg);
        case kEnv:
            return set_string(o.env, "container-env", optarg);
        case kUnshare:
            return set_string(o.unshare, "container-unshare", optarg);
        case kMountHome:
            return set_bool(o.mount_home, "container-mount-home", true);
        case kNoMountHome:
            return set_bool(o.mount_home, "no-container-mount-home", false);
        case kRemapRoot:
            return set_bool(o.remap_root, "container-remap-root", true);
        case kNoRemapRoot:
            return set_bool(o.remap_root, "no-container-remap-root", false);
        case kEntrypoint:
            return set_bool(o.entrypoint, "container-entrypoint", true);
        case kNoEntrypoint:
            return set_bool(o.entrypoint, "no-container-entrypoint", false);
        case kEntrypointLog:
            return set_bool(o.entrypoint_log, "container-entrypoint-log", true);
        case kWritable:
            return set_bool(o.writable, "container-writable", true);
        case kReadonly:
            return set_bool(o.writable, "container-readonly", false);
        default:
            return -1;
    }
}

char* s(const char* text) {
    return const_cast<char*>(text);
}

struct spank_option g_table[] = {
    {s("container-image"), s("[USER@][REGISTRY#]IMAGE[:TAG]|PATH"),
     s("[gantry] the image to run in: a registry image or a squashfs file"), 1, kImage, on_option},
    {s("container-mounts"), s("SRC:DST[:FLAGS][,SRC:DST...]"),
     s("[gantry] bind mount[s] inside the container; flags joined by '+' (ro, rbind, private, ...)"), 1, kMounts,
     on_option},
    {s("container-workdir"), s("PATH"), s("[gantry] working directory inside the container"), 1, kWorkdir, on_option},
    {s("container-name"), s("NAME[:auto|create|exec|no_exec]"),
     s("[gantry] name the container so that later steps of the job can reuse it"), 1, kName, on_option},
    {s("container-save"), s("PATH"), s("[gantry] save the container's root file system as squashfs after the step"), 1,
     kSave, on_option},
    {s("container-mount-home"), nullptr, s("[gantry] bind mount the user's home directory (default)"), 0, kMountHome,
     on_option},
    {s("no-container-mount-home"), nullptr, s("[gantry] do not bind mount the user's home directory"), 0, kNoMountHome,
     on_option},
    {s("container-remap-root"), nullptr, s("[gantry] be root (uid 0) inside the container"), 0, kRemapRoot, on_option},
    {s("no-container-remap-root"), nullptr, s("[gantry] keep your own uid inside the container (default)"), 0,
     kNoRemapRoot, on_option},
    {s("container-entrypoint"), nullptr, s("[gantry] run the image's entrypoint"), 0, kEntrypoint, on_option},
    {s("no-container-entrypoint"), nullptr, s("[gantry] do not run the image's entrypoint (default)"), 0, kNoEntrypoint,
     on_option},
    {s("container-entrypoint-log"), nullptr, s("[gantry] print the entrypoint's output"), 0, kEntrypointLog, on_option},
    {s("container-writable"), nullptr,
     s("[gantry] make the container's root file system writable (changes are discarded)"), 0, kWritable, on_option},
    {s("container-readonly"), nullptr, s("[gantry] make the container's root file system read-only (default)"), 0,
     kReadonly, on_option},
    {s("container-env"), s("NAME[,NAME...]"),
     s("[gantry] names of environment variables whose host value overrides the image's"), 1, kEnv, on_option},
    {s("container-unshare"), s("NAMESPACE[,NAMESPACE...]"), s("[gantry] extra namespaces to unshare: net, ipc, uts"), 1,
     kUnshare, on_option},
    SPANK_OPTIONS_TABLE_END,
};

}  // namespace

void record_error(const std::string& message) {
    if (option_error().empty()) option_error() = message;
}

// The checks Pyxis makes while it parses an option, so that a bad value stops srun before any step
// starts. `label` names the option as the user gave it (--container-env, PYXIS_CONTAINER_ENV).
// `as_user`: we run as the user (srun, sbatch, salloc), who may be told whether their path is a
// directory; slurmstepd (root) leaves that to user_init (resolve_save_path). An empty result: the value is fine.
std::string value_problem(int id, const std::string& label, std::string_view value, bool as_user) {
    if (value.empty())
        return "gantry: " + label + ": argument required (give " + expected_value(id) + ", or leave the option out)";
    std::string v(value);
    if ((id == kEnv || id == kMounts || id == kUnshare) && has_empty_element(value))
        return "gantry: " + label + ": invalid format '" + v + "': an empty element; remove the extra comma";
    if (id == kSave) {
        bool directory = v.back() == '/';
        struct stat sb {};
        // Only an absolute path: a relative one is the step's to resolve (srun --chdir), in user_init.
        if (!directory && as_user && v[0] == '/' && ::stat(v.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode))
            directory = true;
        if (directory) {
            std::string dir = v.back() == '/' ? v : v + "/";
            return "gantry: " + label + "=" + v + ": target is a directory (give a file path, e.g. " + dir +
                   "image.sqsh)";
        }
    }
    return {};
}

bool JobOptions::any() const {
    return image || mounts || workdir || name || save || mount_home || remap_root || entrypoint || writable || env ||
           unshare;
}

JobOptions& options() {
    static JobOptions o;
    return o;
}

std::string& option_error() {
    static std::string e;
    return e;
}

struct spank_option* option_table() {
    return g_table;
}

}  // namespace gantry::plugin
