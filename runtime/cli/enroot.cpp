// The `enroot` command (see enroot.hpp): Enroot's verbs parsed here, the work done by the library the
// gantry verbs call (pull/import into the store, export, the launcher) or by a gantry verb itself.
//
// What an Enroot "container" is here: `enroot create -n NAME FILE.sqsh` records the image file as
// $ENROOT_DATA_PATH/NAME.sqsh (a hard link where it can, else a copy): Gantry never unpacks an image,
// so the named container is the squashfs that `enroot start NAME` mounts. A running `enroot start` is
// a Gantry container named NAME.PID, which `enroot list -f` shows and `enroot exec PID` joins. The
// Slurm plugin's named containers (`--container-name`, Pyxis's pyxis_<jobid>_<name> names) are listed
// beside them while their job runs.
#include "enroot.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/import.hpp"
#include "gantry/launcher.hpp"
#include "gantry/local_image.hpp"
#include "gantry/log.hpp"
#include "gantry/pull.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"
#include "progress.hpp"

namespace gantry::cli {
namespace {

// The Enroot release whose command line this follows; `gantry version` gives Gantry's own.
constexpr const char* kEnrootInterfaceVersion = "3.5.0";
// Enroot has one failure status.
constexpr int kEnrootFailed = 1;

// Enroot's message style: "[ERROR] ..." on stderr, one line.
int enroot_error(const std::string& message) {
    std::fprintf(stderr, "[ERROR] %s\n", message.c_str());
    return kEnrootFailed;
}

void enroot_info(const std::string& message) {
    std::fprintf(stderr, "[INFO] %s\n", message.c_str());
}

const char* const kUsage =
    "Usage: enroot COMMAND [ARG...]\n"
    "\n"
    "Enroot's command line over Gantry's image store and runtime (docs/user.md, \"The enroot command\").\n"
    "\n"
    " Commands:\n"
    "   create  [-f] [-n NAME] [--] IMAGE.sqsh\n"
    "   exec    [--] PID COMMAND [ARG...]\n"
    "   export  [-f] [-o FILE] [--] NAME\n"
    "   import  [-a ARCH] [-o FILE] [--] URI\n"
    "   list    [-f]\n"
    "   remove  [-f] [--] NAME...\n"
    "   start   [-e NAME[=VALUE]] [-m SRC:DST[:FLAGS]] [-r] [-w] [--] NAME|IMAGE.sqsh [COMMAND] [ARG...]\n"
    "   version\n";

// The options of one verb, Enroot's way: short and long forms, `--opt=value` and `--opt value`, options
// before the operands, `--` ends them. A word that is not an option ends them too (start's command).
struct OptionSpec {
    char short_name;
    const char* long_name;
    bool takes_value;
};

struct ParsedOptions {
    std::multimap<std::string, std::string> values;  // by long name; flags map to ""
    std::vector<std::string> operands;
    std::string error;
    [[nodiscard]] bool has(const std::string& name) const { return values.count(name) > 0; }
    [[nodiscard]] std::string last(const std::string& name) const {
        std::string v;
        for (auto [it, end] = values.equal_range(name); it != end; ++it) v = it->second;
        return v;
    }
    [[nodiscard]] std::vector<std::string> all(const std::string& name) const {
        std::vector<std::string> out;
        for (auto [it, end] = values.equal_range(name); it != end; ++it) out.push_back(it->second);
        return out;
    }
};

ParsedOptions parse_options(const std::vector<std::string>& words, size_t from, const std::vector<OptionSpec>& specs) {
    ParsedOptions p;
    size_t i = from;
    for (; i < words.size(); ++i) {
        const std::string& w = words[i];
        if (w == "--") {
            ++i;
            break;
        }
        if (w.size() < 2 || w[0] != '-') break;
        const OptionSpec* spec = nullptr;
        std::optional<std::string> inline_value;
        if (w[1] == '-') {
            std::string name = w.substr(2);
            if (auto eq = name.find('='); eq != std::string::npos) {
                inline_value = name.substr(eq + 1);
                name = name.substr(0, eq);
            }
            for (const auto& s : specs)
                if (name == s.long_name) spec = &s;
        } else {
            for (const auto& s : specs)
                if (w[1] == s.short_name) spec = &s;
            if (spec != nullptr && w.size() > 2) {
                if (!spec->takes_value)
                    spec = nullptr;  // -fx: Enroot takes no bundled flags either
                else
                    inline_value = w.substr(2);
            }
        }
        if (spec == nullptr) {
            p.error = "Invalid option: " + w;
            return p;
        }
        if (!spec->takes_value) {
            if (inline_value) {
                p.error = "Invalid option: " + w;
                return p;
            }
            p.values.emplace(spec->long_name, "");
            continue;
        }
        if (!inline_value) {
            if (i + 1 >= words.size()) {
                p.error = "Missing argument for option: " + w;
                return p;
            }
            inline_value = words[++i];
        }
        p.values.emplace(spec->long_name, *inline_value);
    }
    p.operands.assign(words.begin() + static_cast<long>(i), words.end());
    return p;
}

// ENROOT_DATA_PATH, else Enroot's default ($XDG_DATA_HOME/enroot, ~/.local/share/enroot).
std::string data_path() {
    const Environment& env = environment();
    if (!env.enroot_data_path.empty()) return env.enroot_data_path.value;
    if (!env.xdg_data_home.empty() && env.xdg_data_home.value[0] == '/') return env.xdg_data_home.value + "/enroot";
    return env.home.value + "/.local/share/enroot";
}

// Names Enroot and the launcher both accept (the launcher's rule: letters, digits, _ - .).
bool valid_container_name(const std::string& n) {
    if (n.empty() || n.size() > 180 || n[0] == '.' || n[0] == '-') return false;
    return std::all_of(n.begin(), n.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.';
    });
}

std::string created_path(const std::string& name) {
    return data_path() + "/" + name + ".sqsh";
}

bool exists(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
}

// Copies `from` to `to` through a temporary file beside it, renamed when complete (the file appears
// whole or not at all); the copy is the kernel's (copy_file_range: reflinks where the filesystem can).
Status copy_file(const std::string& from, const std::string& to) {
    UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) return system_error("opening " + from);
    struct stat st {};
    if (::fstat(in.get(), &st) != 0) return system_error("reading " + from);
    if (!S_ISREG(st.st_mode)) return make_error(from + ": not a regular file");
    std::string tmp = to + ".tmp." + std::to_string(::getpid());
    UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!out) return system_error("creating " + tmp);
    Defer remove_tmp([&] { ::unlink(tmp.c_str()); });
    for (off_t left = st.st_size; left > 0;) {
        ssize_t n = ::copy_file_range(in.get(), nullptr, out.get(), nullptr, static_cast<size_t>(left), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return system_error("copying " + from + " to " + tmp);
        if (n == 0) return make_error("copying " + from + ": the file shrank while it was read");
        left -= n;
    }
    if (::fsync(out.get()) != 0) return system_error("writing " + tmp);
    if (::rename(tmp.c_str(), to.c_str()) != 0) return system_error("renaming " + tmp + " to " + to);
    remove_tmp.dismiss();
    return {};
}

// Enroot's yes/no settings (ENROOT_FORCE_OVERRIDE, ENROOT_ROOTFS_WRITABLE...): y, yes, true, 1.
bool truthy(const char* v) {
    if (v == nullptr) return false;
    std::string s(v);
    return s == "y" || s == "yes" || s == "true" || s == "1";
}

bool force_override() {
    return truthy(environment().enroot_force_override.value.c_str());
}

// The names in a directory; none when it cannot be read (no such directory yet).
std::vector<std::string> names_in(const std::string& path) {
    auto dir = Directory::open(path);
    if (!dir) return {};
    auto names = list_directory(*dir);
    return names ? *names : std::vector<std::string>{};
}

// Process PID's start time (/proc/PID/stat field 22), 0 when it is gone: with the pid, what tells the
// holder a record names from a process that reused its pid.
unsigned long long start_time_of(pid_t pid) {
    auto stat = try_read_file("/proc/" + std::to_string(pid) + "/stat");
    if (!stat) return 0;
    auto close = stat->rfind(')');
    if (close == std::string::npos) return 0;
    std::vector<std::string> fields = split_list(stat->substr(close + 2), ' ');
    // After "pid (comm) ", field 3 (state) is fields[0]; field 22 is fields[19].
    return fields.size() > 19 ? std::strtoull(fields[19].c_str(), nullptr, 10) : 0;
}

// Enroot's default file name for an import: the image as written (after USER@ and REGISTRY#), with
// '/' and ':' turned into '+': docker://nvcr.io#nvidia/pytorch:24.05-py3 -> nvidia+pytorch+24.05-py3.sqsh.
std::string default_import_name(std::string image) {
    std::replace(image.begin(), image.end(), '/', '+');
    std::replace(image.begin(), image.end(), ':', '+');
    return image + ".sqsh";
}

// Enroot's -a ARCH (its names or the OCI ones) as a platform.
Result<Platform> arch_platform(const std::string& arch) {
    std::string oci = arch == "x86_64" ? "amd64" : arch == "aarch64" ? "arm64" : arch;
    if (oci != "amd64" && oci != "arm64" && oci != "ppc64le") return make_error("Unsupported architecture: " + arch);
    Platform p;
    p.architecture = oci;
    if (oci == "arm64") p.variant = "v8";
    return p;
}

// import: docker://[USER@][REGISTRY#]IMAGE[:TAG] is pulled into the store (nothing when the store has
// it and the registry still names the same digest), dockerd:// and podman:// are imported from the
// daemon's `save`; then the stored image is exported as an Enroot image file.
int enroot_import(const std::vector<std::string>& words) {
    auto p = parse_options(words, 1, {{'a', "arch", true}, {'o', "output", true}});
    if (!p.error.empty()) return enroot_error(p.error);
    if (p.operands.size() != 1) return enroot_error("Invalid argument: import takes one URI (see enroot --help)");
    const std::string& uri = p.operands[0];
    auto sep = uri.find("://");
    if (sep == std::string::npos) return enroot_error("Invalid argument: " + uri);
    std::string scheme = uri.substr(0, sep), rest = uri.substr(sep + 3);
    if (scheme != "docker" && scheme != "dockerd" && scheme != "podman")
        return enroot_error("Invalid argument: " + uri + " (docker://, dockerd:// or podman://)");
    if (rest.empty()) return enroot_error("Invalid argument: " + uri);
    // USER@ names the account Enroot looks credentials up for; Gantry finds them by registry
    // (docs/auth.md), so it is dropped.
    std::string reference = rest;
    if (scheme == "docker")
        if (auto at = rest.find('@'); at != std::string::npos && at < rest.find('#')) reference = rest.substr(at + 1);
    std::string image = reference.substr(reference.find('#') == std::string::npos ? 0 : reference.find('#') + 1);
    std::string output = p.has("output") ? p.last("output") : default_import_name(image);
    if (output.empty()) return enroot_error("Invalid argument: empty output file name");
    if (exists(output)) return enroot_error("File already exists: " + output);
    std::optional<Platform> platform;
    if (p.has("arch")) {
        auto pl = arch_platform(p.last("arch"));
        if (!pl) return enroot_error(pl.error().message);
        platform = *pl;
    }

    auto config = load_config();
    if (!config) return enroot_error(config.error().message);
    auto store = open_store(*config, "", true);
    if (!store) return enroot_error(store.error().message);
    auto t0 = std::chrono::steady_clock::now();
    std::string digest;
    if (scheme == "docker") {
        auto ref = parse_reference(reference);
        if (!ref) return enroot_error(ref.error().wrap("failed to import docker image " + reference).message);
        PullOptions opts;
        auto policy = pull_policy(*config, std::nullopt);
        if (!policy) return enroot_error(policy.error().message);
        opts.policy = *policy;
        if (platform) opts.platform = *platform;
        // As `gantry pull` stores it (layers, unless gantry.conf says otherwise): export composes them.
        opts.layered = config->layered_images && config->mount_backend != "extract";
        opts.accept_layered = true;
        ProgressPrinter printer(false);
        opts.on_progress = [&](const PullProgress& pr) { printer.show(pr); };
        enroot_info("Pulling " + ref->str() + " into the store " + store->root());
        auto pulled = pull_image(*config, *store, *ref, opts);
        printer.finish();
        if (!pulled) return enroot_error(pulled.error().wrap("failed to import docker image " + reference).message);
        if (!pulled->produced) enroot_info("The store has " + ref->str() + " already (" + pulled->digest + ")");
        digest = pulled->digest;
    } else {
        auto source = parse_local_source(scheme + "://" + rest);
        if (!source) return enroot_error(source.error().message);
        ImportOptions opts;
        if (platform) opts.platform = *platform;
        opts.layered = config->layered_images;
        enroot_info("Importing " + source->str() + " into the store " + store->root());
        auto imported = import_image(*config, *store, *source, opts);
        if (!imported) return enroot_error(imported.error().message);
        digest = imported->digest;
    }
    auto stored = store->find(digest);
    if (!stored) return enroot_error("image " + digest + " is not in the store " + store->root() + " after the import");
    auto t1 = std::chrono::steady_clock::now();
    enroot_info("Writing " + output);
    auto stats = export_image(*config, *store, *stored, output, false);
    if (!stats) return enroot_error(stats.error().message);
    char buf[200];
    std::snprintf(buf, sizeof buf, "Wrote %s (%s) in %.1f s: store %.1f s, export %.1f s", output.c_str(),
                  format_bytes(stats->image_bytes).c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  std::chrono::duration<double>(t1 - t0).count(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
    enroot_info(buf);
    return 0;
}

std::string basename_without_sqsh(const std::string& path) {
    std::string base = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
    for (const char* ext : {".sqsh", ".squashfs"})
        if (ends_with(base, ext)) return base.substr(0, base.size() - std::strlen(ext));
    return base;
}

// create: the image file becomes $ENROOT_DATA_PATH/NAME.sqsh, a hard link (instant; an import replaces
// its file by rename, so the container keeps its image) or, across filesystems, a copy.
int enroot_create(const std::vector<std::string>& words) {
    auto p = parse_options(words, 1, {{'f', "force", false}, {'n', "name", true}});
    if (!p.error.empty()) return enroot_error(p.error);
    if (p.operands.size() != 1)
        return enroot_error("Invalid argument: create takes one image file (see enroot --help)");
    const std::string& file = p.operands[0];
    std::string name = p.has("name") ? p.last("name") : basename_without_sqsh(file);
    if (!valid_container_name(name))
        return enroot_error("Invalid container name: " + name + " (letters, digits, _ - .)");
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) return enroot_error(std::string(std::strerror(errno)) + ": " + file);
    if (!S_ISREG(st.st_mode)) return enroot_error("Invalid image: " + file + " is not a file");
    std::string dest = created_path(name);
    bool force = p.has("force") || force_override();
    if (exists(dest) && !force) return enroot_error("Container already exists: " + name);
    if (auto made = make_directories(data_path(), 0700); !made) return enroot_error(made.error().message);
    std::string tmp = dest + ".link." + std::to_string(::getpid());
    if (::link(file.c_str(), tmp.c_str()) == 0) {
        if (::rename(tmp.c_str(), dest.c_str()) != 0) {
            int e = errno;
            ::unlink(tmp.c_str());
            return enroot_error("renaming " + tmp + " to " + dest + ": " + std::strerror(e));
        }
    } else if (auto copied = copy_file(file, dest); !copied) {
        return enroot_error(copied.error().message);
    }
    return 0;
}

// Whether ENROOT_ROOTFS_WRITABLE-style settings are on (Enroot accepts y, yes, true, 1).
std::optional<bool> env_switch(const EnvironmentVariable& v) {
    if (v.empty()) return std::nullopt;
    return truthy(v.value.c_str());
}

// start: `gantry run` of the created container's file (or the file given), named NAME.PID so that
// `enroot list -f` shows it and `enroot exec PID` finds it.
EnrootOutcome enroot_start(const std::vector<std::string>& words) {
    auto p = parse_options(
        words, 1,
        {{'c', "conf", true}, {'e', "env", true}, {'m', "mount", true}, {'r', "root", false}, {'w', "rw", false}});
    if (!p.error.empty()) return {enroot_error(p.error), {}};
    if (p.has("conf"))
        return {enroot_error("Unsupported option: --conf (Enroot's start-up scripts; use --mount, --env and the "
                             "image's /etc/rc, docs/user.md)"),
                {}};
    if (p.operands.empty())
        return {enroot_error("Invalid argument: start needs a container name or an image file"), {}};
    std::string target = p.operands[0], image, name;
    if (target.find('/') != std::string::npos || (ends_with(target, ".sqsh") && exists(target))) {
        image = target;
        name = basename_without_sqsh(target);
    } else {
        image = created_path(target);
        name = target;
        if (!exists(image)) return {enroot_error("No such container: " + target), {}};
    }
    if (image[0] != '/') {
        char cwd[4096];
        if (::getcwd(cwd, sizeof cwd) == nullptr) return {enroot_error("reading the working directory"), {}};
        image = std::string(cwd) + "/" + image;
    }
    // Enroot's /etc/rc runs the command through the image's entrypoint: so does start.
    std::vector<std::string> run = {"run", "--entrypoint"};
    if (p.has("rw") || env_switch(environment().enroot_rootfs_writable).value_or(false)) run.emplace_back("--writable");
    if (p.has("root") || env_switch(environment().enroot_remap_root).value_or(false)) run.emplace_back("--remap-root");
    if (auto home = env_switch(environment().enroot_mount_home))
        run.emplace_back(*home ? "--mount-home" : "--no-mount-home");
    for (const auto& m : p.all("mount")) run.insert(run.end(), {"--mount", m});
    for (const auto& e : p.all("env")) run.insert(run.end(), {"--env", e});
    if (valid_container_name(name)) run.insert(run.end(), {"--name", name + "." + std::to_string(::getpid())});
    run.push_back(image);
    run.emplace_back("--");
    run.insert(run.end(), p.operands.begin() + 1, p.operands.end());
    return {0, run};
}

// One running container as `enroot list` shows it.
struct Running {
    std::string name;    // the Enroot name: NAME for an `enroot start` instance, the plugin's name as is
    std::string gantry;  // its Gantry name (NAME.PID), empty for the plugin's
    pid_t pid = -1;      // the holder, the container's first process
};

std::string ns_of(pid_t pid, const char* ns) {
    char buf[128];
    std::string link = "/proc/" + std::to_string(pid) + "/ns/" + ns;
    ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The caller's `enroot start` containers (the launcher's state in the caller's runtime directory) and,
// read-only, the Slurm plugin's named containers of the caller (root: everyone's) in gantry.conf's
// runtime_path; a stale record (its holder gone) is not shown.
std::vector<Running> running_containers(const Config& config) {
    std::vector<Running> out;
    for (const auto& gname : list_containers(config)) {
        auto c = Container::open(gname, config);
        if (!c) continue;
        Running r{gname, gname, c->pid()};
        auto dot = gname.rfind('.');
        if (dot != std::string::npos && dot + 1 < gname.size() &&
            gname.find_first_not_of("0123456789", dot + 1) == std::string::npos)
            r.name = gname.substr(0, dot);
        out.push_back(r);
    }
    if (::geteuid() == 0) return out;  // root's own runtime directory is runtime_path: listed above
    std::string dir = config.runtime_path + "/containers";
    for (const auto& file : names_in(dir)) {
        if (!ends_with(file, ".json")) continue;
        auto text = try_read_file(dir + "/" + file);
        if (!text || text->size() > (1u << 20)) continue;
        auto j = nlohmann::json::parse(*text, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        uid_t uid = j.value("uid", static_cast<uid_t>(-1));
        if (uid != ::getuid()) continue;
        pid_t pid = j.value("holder_pid", -1);
        long long start = j.value("holder_start_time", -1LL);
        if (pid <= 0 || start_time_of(pid) != static_cast<unsigned long long>(start)) continue;
        out.push_back({file.substr(0, file.size() - 5), "", pid});
    }
    return out;
}

std::string proc_text(pid_t pid, const char* file) {
    auto t = try_read_file("/proc/" + std::to_string(pid) + "/" + file);
    std::string s = t.value_or("");
    std::replace(s.begin(), s.end(), '\0', ' ');
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s.empty() ? "-" : s;
}

std::string proc_state(pid_t pid) {
    std::string stat = proc_text(pid, "stat");
    auto close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() ? stat.substr(close + 2, 1) : "-";
}

std::string ns_inode(const std::string& link) {
    auto open = link.find('['), close = link.find(']');
    return open != std::string::npos && close > open ? link.substr(open + 1, close - open - 1) : "-";
}

// list: the created containers' names, one a line, and the running ones; -f: a table with a row per
// running instance (its PID is what `enroot exec` takes).
int enroot_list(const std::vector<std::string>& words) {
    auto p = parse_options(words, 1, {{'f', "fancy", false}});
    if (!p.error.empty()) return enroot_error(p.error);
    if (!p.operands.empty()) return enroot_error("Invalid argument: " + p.operands[0]);
    std::set<std::string> created;
    for (const auto& n : names_in(data_path()))
        if (ends_with(n, ".sqsh") && n.size() > 5) created.insert(n.substr(0, n.size() - 5));
    auto config = load_config();
    std::vector<Running> running = config ? running_containers(*config) : std::vector<Running>{};
    if (!p.has("fancy")) {
        std::set<std::string> names = created;
        for (const auto& r : running) names.insert(r.name);
        for (const auto& n : names) std::printf("%s\n", n.c_str());
        return 0;
    }
    std::vector<std::vector<std::string>> rows = {{"NAME", "PID", "COMM", "STATE", "MNTNS", "USERNS", "COMMAND"}};
    std::set<std::string> shown;
    for (const auto& r : running) {
        shown.insert(r.name);
        rows.push_back({r.name, std::to_string(r.pid), proc_text(r.pid, "comm"), proc_state(r.pid),
                        ns_inode(ns_of(r.pid, "mnt")), ns_inode(ns_of(r.pid, "user")), proc_text(r.pid, "cmdline")});
    }
    for (const auto& n : created)
        if (shown.count(n) == 0) rows.push_back({n});
    std::vector<size_t> width(rows[0].size(), 0);
    for (const auto& row : rows)
        for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    for (const auto& row : rows) {
        std::string line;
        for (size_t i = 0; i < row.size(); ++i) {
            line += row[i];
            if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        std::printf("%s\n", line.c_str());
    }
    return 0;
}

bool confirmed(const std::string& question) {
    std::fprintf(stderr, "%s [y/N] ", question.c_str());
    std::fflush(stderr);
    std::string answer;
    if (!std::getline(std::cin, answer)) return false;
    return answer == "y" || answer == "Y" || answer == "yes";
}

// remove: a created container's file; a running `enroot start` or plugin container is not removed,
// and the error says when it ends.
int enroot_remove(const std::vector<std::string>& words) {
    auto p = parse_options(words, 1, {{'f', "force", false}});
    if (!p.error.empty()) return enroot_error(p.error);
    if (p.operands.empty()) return enroot_error("Invalid argument: remove needs a container name");
    bool force = p.has("force") || force_override();
    auto config = load_config();
    int status = 0;
    for (const auto& name : p.operands) {
        if (!valid_container_name(name)) {
            status = enroot_error("No such container: " + name);
            continue;
        }
        std::string file = created_path(name);
        if (exists(file)) {
            if (!force && !confirmed("Do you really want to delete " + name + "?")) continue;
            if (::unlink(file.c_str()) != 0) status = enroot_error(std::string(std::strerror(errno)) + ": " + file);
            continue;
        }
        std::vector<Running> running = config ? running_containers(*config) : std::vector<Running>{};
        auto r = std::find_if(running.begin(), running.end(), [&](const Running& x) { return x.name == name; });
        if (r == running.end()) {
            status = enroot_error("No such container: " + name);
            continue;
        }
        if (r->gantry.empty()) {
            status = enroot_error("Container " + name +
                                  " belongs to a running Slurm job: it is removed when the job ends (scancel the job, "
                                  "or run in it with srun --overlap --container-name)");
            continue;
        }
        // Stopping the holder would not end the command `enroot start` runs (it is not the container's
        // init): the container ends with that command, which its caller stops.
        status = enroot_error("Container " + name + " is running (pid " + std::to_string(r->pid) +
                              "): it ends when its command does");
    }
    return status;
}

// exec PID: the running `enroot start` container PID belongs to (its first process, or any process
// in its mount namespace) is joined by `gantry exec`.
EnrootOutcome enroot_exec(const std::vector<std::string>& words) {
    auto p = parse_options(words, 1, {});
    if (!p.error.empty()) return {enroot_error(p.error), {}};
    if (p.operands.size() < 2) return {enroot_error("Invalid argument: exec needs a PID and a command"), {}};
    const std::string& pid_text = p.operands[0];
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos)
        return {enroot_error("Invalid argument: " + pid_text + " is not a PID"), {}};
    pid_t pid = static_cast<pid_t>(std::strtol(pid_text.c_str(), nullptr, 10));
    auto config = load_config();
    if (!config) return {enroot_error(config.error().message), {}};
    std::string mnt = ns_of(pid, "mnt");
    if (mnt.empty()) return {enroot_error("No such process: " + pid_text), {}};
    for (const auto& r : running_containers(*config)) {
        if (r.pid != pid && ns_of(r.pid, "mnt") != mnt) continue;
        if (r.gantry.empty())
            return {enroot_error("Process " + pid_text + " is in " + r.name +
                                 ", a Slurm job's container: run in it with srun --overlap --jobid=JOBID "
                                 "--container-name=NAME"),
                    {}};
        std::vector<std::string> exec = {"exec", r.gantry, "--"};
        exec.insert(exec.end(), p.operands.begin() + 1, p.operands.end());
        return {0, exec};
    }
    return {enroot_error("Process " + pid_text + " is in no container of yours (see enroot list -f)"), {}};
}

// export: a created container's image as a file (Enroot's default name: NAME.sqsh in the working
// directory). Gantry's containers are never changed in place, so the file is the image it was made from.
int enroot_export(const std::vector<std::string>& words) {
    auto p = parse_options(words, 1, {{'f', "force", false}, {'o', "output", true}});
    if (!p.error.empty()) return enroot_error(p.error);
    if (p.operands.size() != 1) return enroot_error("Invalid argument: export takes one container name");
    const std::string& name = p.operands[0];
    std::string from = created_path(name);
    if (!valid_container_name(name) || !exists(from)) return enroot_error("No such container: " + name);
    std::string output = p.has("output") ? p.last("output") : name + ".sqsh";
    bool force = p.has("force") || force_override();
    if (exists(output) && !force) return enroot_error("File already exists: " + output);
    if (auto copied = copy_file(from, output); !copied) return enroot_error(copied.error().message);
    return 0;
}

}  // namespace

bool invoked_as_enroot(const char* argv0) {
    if (argv0 == nullptr) return false;
    std::string_view name(argv0);
    if (auto slash = name.rfind('/'); slash != std::string_view::npos) name.remove_prefix(slash + 1);
    return name == "enroot";
}

EnrootOutcome enroot_command(const std::vector<std::string>& args) {
    if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
        std::fputs(kUsage, args.empty() ? stderr : stdout);
        return {args.empty() ? kEnrootFailed : 0, {}};
    }
    const std::string& verb = args[0];
    try {
        if (verb == "version" || verb == "--version" || verb == "-v") {
            std::printf("%s\n", kEnrootInterfaceVersion);
            return {0, {}};
        }
        if (verb == "import") return {enroot_import(args), {}};
        if (verb == "create") return {enroot_create(args), {}};
        if (verb == "start") return enroot_start(args);
        if (verb == "list") return {enroot_list(args), {}};
        if (verb == "remove") return {enroot_remove(args), {}};
        if (verb == "exec") return enroot_exec(args);
        if (verb == "export") return {enroot_export(args), {}};
        if (verb == "batch" || verb == "bundle" || verb == "load")
            return {enroot_error("Unsupported command: " + verb + " (docs/user.md, \"The enroot command\")"), {}};
    } catch (const std::exception& e) {
        return {enroot_error(verb + ": internal error: " + e.what()), {}};
    }
    return {enroot_error("Unknown command: " + verb), {}};
}

}  // namespace gantry::cli
