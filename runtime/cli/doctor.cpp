// `gantry doctor`: checks a node the way an admin would before the first job — kernel features,
// AppArmor's user namespace restriction, fuse, the image store and its file system's flock, GPUs and
// driver, EFA, memlock, the Slurm plugin and the Slurm release it was built for — and prints one line
// per check with ✓ or ✗ and, for ✗, what to do about it. Exit status 1 when any check fails.
//
//   gantry doctor [--plugstack FILE]
//
// Without --plugstack, the plugstack.conf that Slurm reads: slurm.conf's PlugStackConfig, or
// plugstack.conf beside slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf, else
// /opt/slurm/etc/slurm.conf), with the files its `include` lines name.
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common.hpp"
#include "gantry/auth.hpp"
#include "gantry/devices.hpp"
#include "gantry/environment.hpp"
#include "gantry/launcher.hpp"
#include "gantry/slurm_conf.hpp"
#include "gantry/spawn.hpp"
#include "gantry/store.hpp"
#include "gantry/store_fs.hpp"
#include "gantry/strings.hpp"
#include "gantry/version.hpp"

extern char** environ;

namespace gantry::cli {
namespace {

struct Check {
    std::string name;
    bool ok = false;
    std::string detail;  // what was found
    std::string fix;     // what to do when !ok
};

std::string read_all(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// A user namespace really created, in a child (a sysctl can allow it while a LSM or seccomp denies).
Check user_namespaces() {
    Check c{"user namespaces", false, "", ""};
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(::unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0 ? 0 : 1);
    int status = 0;
    if (pid > 0) ::waitpid(pid, &status, 0);
    std::string max = trim(read_all("/proc/sys/user/max_user_namespaces"));
    // Debian's kernels carry a switch of their own (0 by default before Debian 11).
    std::string clone = trim(read_all("/proc/sys/kernel/unprivileged_userns_clone"));
    c.ok = pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::string sysctls = "max_user_namespaces " + (max.empty() ? "?" : max) +
                          (clone.empty() ? "" : ", unprivileged_userns_clone " + clone);
    c.detail = (c.ok ? "unshare(CLONE_NEWUSER) works (" : "unshare(CLONE_NEWUSER) fails (") + sysctls + ")";
    c.fix = clone == "0" ? "sysctl -w kernel.unprivileged_userns_clone=1" : "sysctl -w user.max_user_namespaces=65536";
    return c;
}

// Ubuntu 24.04's AppArmor restriction: with kernel.apparmor_restrict_unprivileged_userns=1 an
// unprivileged program may still create a user namespace, but without capabilities in it unless a
// profile with a `userns` rule covers it, so the probe above passes while the holder's first mount
// fails. The gantry package's profile (packaging/apparmor/gantry) covers gantry-holder. The /proc and
// /sys files are read under host_root, where the tests put fake ones.
Check apparmor_userns(const Config& config) {
    Check c{"AppArmor user namespaces", true, "", ""};
    const std::string sysctl = "kernel.apparmor_restrict_unprivileged_userns";
    std::string restrict_value =
        trim(read_all(devices::host_path(config.host_root, "/proc/sys/kernel/apparmor_restrict_unprivileged_userns")));
    if (restrict_value.empty() || restrict_value == "0") {
        c.detail =
            restrict_value.empty() ? "no " + sysctl + " here (nothing to check)" : sysctl + " = 0 (not restricted)";
        return c;
    }
    const std::string profile_file = "/etc/apparmor.d/gantry";
    const std::string profiles_path = devices::host_path(config.host_root, "/sys/kernel/security/apparmor/profiles");
    std::ifstream profiles(profiles_path);
    c.detail = sysctl + " = " + restrict_value;
    c.fix = "apparmor_parser -r " + profile_file +
            " (the gantry package installs it; docs/admin.md, \"Ubuntu 24.04 and AppArmor\"), or sysctl -w " + sysctl +
            "=0 (lifts the restriction for every program)";
    if (!profiles) {
        // Only root may read the list of loaded profiles: an ordinary user learns whether the file is there.
        bool installed = ::access(devices::host_path(config.host_root, profile_file).c_str(), R_OK) == 0;
        c.ok = installed;
        c.detail += installed ? "; " + profile_file + " installed (whether it is loaded, only root can see)"
                              : "; no gantry-holder profile in " + profile_file + ": containers get no capabilities";
        return c;
    }
    // One line per loaded profile: "NAME (MODE)". The package's profile is named gantry-holder; a
    // site's own may be named by the holder's path.
    std::string line, found;
    while (std::getline(profiles, line)) {
        std::string name = line.substr(0, line.rfind(" ("));
        if (name == "gantry-holder" || name == default_holder_program()) found = line;
    }
    c.ok = !found.empty();
    c.detail += found.empty()
                    ? "; no gantry-holder profile loaded: containers get no capabilities in their user namespace"
                    : "; profile " + found + " loaded";
    return c;
}

Check fuse(const Config& config) {
    Check c{"fuse", false, "", ""};
    struct stat st {};
    bool dev = ::stat("/dev/fuse", &st) == 0 && S_ISCHR(st.st_mode);
    bool usable = dev && (st.st_mode & 0006) == 0006;
    // The server gantry.conf's fuse_server names: gantry-imagefs (installed with gantry) or
    // Debian's squashfuse_ll.
    bool squashfuse = config.fuse_server == "squashfuse_ll";
    std::string server = squashfuse ? "/usr/bin/squashfuse_ll" : default_imagefs_program();
    bool tool = ::access(server.c_str(), X_OK) == 0;
    c.ok = usable && tool;
    c.detail = !dev      ? "/dev/fuse missing"
               : !usable ? "/dev/fuse not usable by users (mode " + std::to_string(st.st_mode & 0777) + ")"
               : !tool   ? server + " not installed (fuse_server = " + config.fuse_server + ")"
                         : "/dev/fuse 0666, fuse server " + server;
    c.fix = !dev         ? "modprobe fuse"
            : !usable    ? "chmod 0666 /dev/fuse (Debian's udev rule does this)"
            : squashfuse ? "apt-get install squashfuse fuse3"
                         : "reinstall gantry (gantry-imagefs is part of it)";
    return c;
}

Check filesystems() {
    Check c{"squashfs, overlay, fuse in /proc/filesystems", false, "", ""};
    std::string fs = read_all("/proc/filesystems");
    std::vector<std::string> missing;
    for (const char* want : {"squashfs", "overlay", "fuse"}) {
        bool found = false;
        for (const auto& line : split_list(fs, '\n'))
            if (trim(line.substr(line.find('\t') == std::string::npos ? 0 : line.find('\t'))) == want) found = true;
        if (!found) missing.push_back(want);
    }
    c.ok = missing.empty();
    std::string m;
    for (const auto& x : missing) m += (m.empty() ? "" : ", ") + x;
    c.detail = c.ok ? "all three" : "missing: " + m;
    c.fix = "modprobe " + (missing.empty() ? std::string("squashfs overlay fuse") : m);
    return c;
}

Check store(const Config& config) {
    Check c{"image store", false, "", ""};
    std::string path = ImageStore::resolve_path(config, "");
    if (path.empty()) {
        c.detail = "no store: HOME is not set and gantry.conf names no store_path";
        c.fix = "set store_path in gantry.conf (docs/admin.md) or GANTRY_STORE";
        return c;
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        c.detail = path + " not reachable";
        c.fix = "mount the shared file system, or create the store: mkdir -p " + path + " (see docs/store.md)";
        return c;
    }
    auto opened = ImageStore::open(path, false, config);
    bool writable = ::access(path.c_str(), W_OK) == 0;
    bool trusted = opened && opened->trusted(config);
    // A trusted store is written only by root or the store owner (the plugin pulls into it as that
    // account), so a user who cannot write it is the expected state there.
    c.ok = opened.ok() && (writable || trusted);
    c.detail = path +
               (opened ? (trusted ? (config.store_owner.empty() ? " (trusted: root-owned, kernel mounts allowed)"
                                                                : " (trusted: owned by root or " + config.store_owner +
                                                                      ", kernel mounts allowed)")
                                  : " (user-writable)")
                       : "") +
               (writable ? ", writable by uid " : ", NOT writable by uid ") + std::to_string(::geteuid());
    c.fix = opened ? "give the pulling account write access (docs/store.md: permissions)" : opened.error().message;
    return c;
}

Check gpus(const Config& config) {
    Check c{"NVIDIA GPUs and driver", true, "", ""};
    auto list = host_gpus(config.host_root);
    std::string version = driver_version(config.host_root);
    if (list.empty()) {
        c.detail = "no NVIDIA GPU (nothing to check)";
        return c;
    }
    c.ok = !version.empty();
    c.detail = std::to_string(list.size()) + " GPU(s), driver " + (version.empty() ? "unknown" : version);
    // The libraries the containers will get must be in the host's ld.so cache.
    if (c.ok) {
        auto cache = parse_ld_cache(read_all(devices::host_path(config.host_root, "/etc/ld.so.cache")));
        bool cuda = false;
        if (cache)
            for (const auto& e : *cache) cuda = cuda || e.soname == "libcuda.so.1";
        if (!cuda) {
            c.ok = false;
            c.detail += ", libcuda.so.1 not in the ld.so cache";
        }
    }
    c.fix = "install the NVIDIA driver's user-space libraries and run ldconfig";
    return c;
}

Check efa(const Config& config) {
    Check c{"EFA devices", true, "", ""};
    auto all = rdma_devices(config.host_root);
    auto chosen = select_rdma(all, true, std::nullopt);
    if (all.empty()) {
        c.detail = "no RDMA device (nothing to check)";
        return c;
    }
    std::string names;
    for (const auto& d : chosen) names += (names.empty() ? "" : " ") + d.uverbs;
    c.detail = std::to_string(chosen.size()) + " efa of " + std::to_string(all.size()) + " RDMA device(s)" +
               (names.empty() ? "" : ": " + names);
    if (!chosen.empty() && !config.efa) {
        c.ok = false;
        c.detail += "; efa = 0 in gantry.conf: containers get none";
        c.fix = "set efa = 1 in gantry.conf";
    }
    return c;
}

Check memlock(const Config& config) {
    Check c{"memlock limit", false, "", ""};
    struct rlimit rl {};
    ::getrlimit(RLIMIT_MEMLOCK, &rl);
    bool rdma = !rdma_devices(config.host_root).empty();
    c.ok = rl.rlim_cur == RLIM_INFINITY || !rdma;
    c.detail = rl.rlim_cur == RLIM_INFINITY
                   ? "unlimited"
                   : std::to_string(rl.rlim_cur / 1024) + " KiB" +
                         (rdma ? " (EFA and RDMA need unlimited)" : " (fine: no RDMA device here)");
    c.fix =
        "LimitMEMLOCK=infinity for slurmd, '* - memlock unlimited' in /etc/security/limits.d, PropagateResourceLimits";
    return c;
}

// Where Slurm will look for plugins: what `gantry doctor` found, for the version check after it.
struct SlurmSetup {
    std::string slurm_conf;
    std::string plugstack;
    std::string plugin;  // spank_gantry.so as its plugstack line names it, resolved; empty: no line
};

// The plugstack.conf Slurm reads (slurm.conf's PlugStackConfig, or plugstack.conf beside slurm.conf;
// --plugstack overrides), and in it or the files it includes, spank_gantry.so's line.
Check plugin(const std::string& plugstack_option, const std::optional<std::string>& slurm_conf_env, SlurmSetup& setup) {
    Check c{"Slurm plugin in plugstack.conf", false, "", ""};
    setup.slurm_conf = slurm_conf::locate(slurm_conf_env);
    setup.plugstack = plugstack_option.empty() ? slurm_conf::plugstack_path(setup.slurm_conf) : plugstack_option;
    auto scan = slurm_conf::find_plugin(setup.plugstack, "spank_gantry.so");
    const std::string add_line =
        "add 'required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so' to " + setup.plugstack + " (docs/admin.md)";
    if (scan.files.empty()) {
        c.detail = "cannot read " + setup.plugstack +
                   (plugstack_option.empty() ? " (PlugStackConfig of " + setup.slurm_conf + ", or beside it)" : "");
        c.fix = add_line + "; SLURM_CONF names another slurm.conf";
        return c;
    }
    if (!scan.found) {
        c.detail = "no spank_gantry.so line in " + setup.plugstack;
        if (scan.files.size() > 1)
            c.detail += " or the " + std::to_string(scan.files.size() - 1) + " file(s) it includes";
        for (const auto& glob : scan.empty_globs) c.detail += "; 'include " + glob + "' matches no file";
        c.fix = add_line;
        if (!scan.empty_globs.empty()) c.fix += ", or create the file its include line names";
        return c;
    }
    const auto& line = *scan.found;
    std::string so = line.plugin;
    // A relative plugin path is looked up in slurm.conf's PluginDir (a colon-separated list).
    if (so[0] != '/')
        if (auto dirs = slurm_conf::value(setup.slurm_conf, "PluginDir"))
            for (const auto& dir : split_list(*dirs, ':'))
                if (::access((dir + "/" + so).c_str(), F_OK) == 0) {
                    so = dir + "/" + so;
                    break;
                }
    bool present = so[0] != '/' || ::access(so.c_str(), R_OK) == 0;
    setup.plugin = so[0] == '/' ? so : "";
    c.ok = (line.kind == "required" || line.kind == "optional") && present;
    c.detail = line.file + ": " + line.kind + " " + so + (present ? "" : " (file missing)");
    c.fix = present ? "use 'required' (or 'optional') in " + line.file + " line " + std::to_string(line.line)
                    : "install the plugin at " + so;
    return c;
}

// The release in the marker spank_gantry.so carries (GANTRY_SLURM_MARKER), empty when it has none.
std::string plugin_slurm_release(const std::string& so) {
    std::string bytes = read_all(so);
    auto at = bytes.find(GANTRY_SLURM_MARKER);
    if (at == std::string::npos) return "";
    at += std::strlen(GANTRY_SLURM_MARKER);
    auto end = bytes.find('\0', at);
    return end == std::string::npos || end - at > 8 ? "" : bytes.substr(at, end - at);
}

// SPANK's ABI follows Slurm's release: the plugin must be built against the Slurm that runs here
// (the plugin refuses to load otherwise; this says so before a job does).
Check slurm_version(const SlurmSetup& setup) {
    Check c{"Slurm version", false, "", ""};
    std::string built = setup.plugin.empty() ? "" : plugin_slurm_release(setup.plugin);
    std::string built_what = "spank_gantry.so";
    if (built.empty()) {
        built = GANTRY_SLURM_RELEASE;
        built_what = "this gantry";
    }
    // slurmd -V needs no configuration (compute nodes, where slurmstepd loads the plugin); the client
    // commands need a readable slurm.conf, so scontrol gets the one found above.
    std::vector<std::vector<std::string>> commands;
    for (const char* slurmd : {"slurmd", "/usr/sbin/slurmd", "/opt/slurm/sbin/slurmd"})
        commands.push_back({slurmd, "-V"});
    for (const char* scontrol : {"scontrol", "/opt/slurm/bin/scontrol"})
        commands.push_back({"env", "SLURM_CONF=" + setup.slurm_conf, scontrol, "--version"});
    std::string running;
    std::string failure = "neither slurmd nor scontrol found";
    for (const auto& argv : commands) {
        auto out = auth::run_command(argv, "", 10.0);
        if (!out || out->exit_status == 127) continue;  // not installed (env exits 127)
        std::string what = argv[0] == "env" ? argv[2] + " --version" : argv[0] + " -V";
        if (auto r = slurm_conf::release_of(out->out); r && out->exit_status == 0) {
            running = trim(out->out) + " (" + what + ")";
            c.ok = *r == built;
            break;
        }
        auto err = split_list(out->err, '\n');
        failure = what + " failed" + (err.empty() ? "" : ": " + err.back());
    }
    if (running.empty()) {
        c.ok = true;  // nothing runs here to compare with: the plugin check above says what is missing
        c.detail = built_what + " built for Slurm " + built + "; " + failure + " (nothing to compare)";
        return c;
    }
    c.detail = built_what + " built for Slurm " + built + ", running " + running;
    c.fix =
        "rebuild Gantry against this Slurm's headers (libslurm-dev, slurm-devel or /opt/slurm/include; "
        "docs/admin.md, \"The Slurm version trap\")";
    return c;
}

// The store's one-producer lock is a flock on the store's file system: on Lustre or NFS it must
// reach every node (include/gantry/store_fs.hpp).
Check store_filesystem(const Config& config) {
    Check c{"store file system (flock)", true, "", ""};
    std::string path = ImageStore::resolve_path(config, "");
    char real[PATH_MAX];
    struct statfs sfs {};
    if (::realpath(path.c_str(), real) == nullptr || ::statfs(real, &sfs) != 0) {
        c.detail = path + " not reachable (see the image store check)";
        return c;
    }
    auto mount = mount_containing(parse_mountinfo(read_all("/proc/self/mountinfo")), real);
    bool lustre_magic = static_cast<long>(sfs.f_type) == kLustreSuperMagic;
    std::string fstype = mount ? mount->fstype : (lustre_magic ? "lustre" : "?");
    std::string options = mount ? mount->mount_options + "," + mount->super_options : "";
    FlockScope scope = flock_scope(fstype, options, lustre_magic);
    std::string where = mount ? " (" + mount->source + " at " + mount->mount_point + ")" : "";
    c.detail = std::string(real) + " on " + fstype + where + ": flock " + to_string(scope);
    if (scope == FlockScope::unchecked) c.detail += " (only Lustre and NFS mounts are)";
    if (scope == FlockScope::cluster || scope == FlockScope::unchecked) return c;
    c.ok = false;
    std::string mp = mount ? mount->mount_point : std::string(real);
    if (fstype == "nfs" || fstype == "nfs4") {
        c.detail += " (mounted with local_lock)";
        c.fix = "remount " + mp +
                " without local_lock=flock/all (local_lock=none): pulls on different nodes "
                "would convert the same image at once";
    } else {
        c.detail += scope == FlockScope::node ? " (mounted with localflock)" : " (mounted without flock)";
        c.fix = "mount -o remount,flock " + mp +
                " (FSx for Lustre: mount with -o relatime,flock, in /etc/fstab "
                "too): the store's one-producer lock needs flock coherent across nodes";
    }
    return c;
}

// The EFA check of an image on this node (issue 37): `gantry run --fabric-check IMAGE`, the same check
// and the same container as `gantry run` and the plugin's steps (the node's devices, efa_host_libs).
Check fabric(const std::string& image) {
    Check c{"EFA fabric in " + image, false, "", ""};
    char self[4096];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    ProcessRequest req;
    req.argv = {n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string("/usr/bin/gantry"), "run",
                "--fabric-check", image};
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) req.env.emplace_back(*e);
    req.timeout = std::chrono::minutes(30);  // a cold pull of a big image comes first
    auto out = spawn(req);
    if (!out) {
        c.detail = out.error().message;
        c.fix = "see the message";
        return c;
    }
    auto lines = split_list(out->out, '\n');
    if (out->status <= 1 && !lines.empty() && (lines[0] == "ok" || lines[0] == "problem")) {
        c.ok = lines[0] == "ok";
        c.detail = lines.size() > 1 ? lines[1] : "";
        c.fix = lines.size() > 2 ? lines[2] : "";
    } else {
        c.detail = "gantry run --fabric-check " + image + " failed: " + last_line(out->err);
        c.fix = "run it by hand to see why";
    }
    return c;
}

int doctor_verb(const std::optional<std::string>& plugstack, const std::optional<std::string>& image) {
    const EnvironmentVariable& slurm_conf_env = environment().slurm_conf;
    auto config = load_config();
    if (!config) return fail(config.error());

    SlurmSetup slurm;
    std::vector<Check> checks = {
        user_namespaces(),
        apparmor_userns(*config),
        fuse(*config),
        filesystems(),
        store(*config),
        store_filesystem(*config),
        gpus(*config),
        efa(*config),
        memlock(*config),
        plugin(plugstack.value_or(""),
               slurm_conf_env.set ? std::optional<std::string>(slurm_conf_env.value) : std::nullopt, slurm)};
    checks.push_back(slurm_version(slurm));
    if (image) checks.push_back(fabric(*image));
    size_t width = 0;
    for (const auto& c : checks) width = std::max(width, c.name.size());
    int failed = 0;
    for (const auto& c : checks) {
        std::printf("%s %-*s  %s\n", c.ok ? "\u2713" : "\u2717", static_cast<int>(width), c.name.c_str(),
                    c.detail.c_str());
        if (!c.ok) {
            std::printf("  %-*s  fix: %s\n", static_cast<int>(width), "", c.fix.c_str());
            ++failed;
        }
    }
    std::printf("%d of %zu checks passed\n", static_cast<int>(checks.size()) - failed, checks.size());
    return failed == 0 ? 0 : 1;
}

VerbRunner define_doctor(CLI::App& app) {
    auto plugstack = std::make_shared<std::string>();
    CLI::Option* opt =
        app.add_option("--plugstack", *plugstack, "the plugstack.conf to check (default: the one slurm.conf names)")
            ->type_name("FILE");
    auto image = std::make_shared<std::string>();
    CLI::Option* image_opt =
        app.add_option("--image", *image,
                       "also check this image's EFA fabric here: devices, libfabric's efa provider, the NCCL plugin")
            ->type_name("IMAGE");
    return {
        [plugstack, opt, image, image_opt] { return doctor_verb(given(opt, *plugstack), given(image_opt, *image)); },
        {}};
}

const Registration doctor_registration(
    {{"doctor",
      "doctor [--plugstack FILE] [--image IMAGE]   check this node: namespaces, AppArmor, fuse, store, flock, "
      "GPUs, EFA, memlock, plugin, Slurm version; an image's EFA fabric",
      "[--plugstack FILE] [--image IMAGE]",
      "Checks this node and prints one line per check (\u2713 or \u2717 with the fix).",
      "exit status: 0 every check passed, 1 a check failed, 2 a usage error\n"},
     define_doctor});

}  // namespace
}  // namespace gantry::cli
