// `gantry doctor`: checks a node the way an admin would before the first job — kernel features,
// fuse, the image store, GPUs and driver, EFA, memlock, the Slurm plugin — and prints one line per
// check with ✓ or ✗ and, for ✗, what to do about it. Exit status 1 when any check fails.
//
//   gantry doctor [--plugstack FILE]     (default: /etc/slurm/plugstack.conf and plugstack.conf.d/)
#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common.hpp"
#include "gantry/devices.hpp"
#include "gantry/store.hpp"
#include "gantry/strings.hpp"

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
    c.ok = pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    c.detail = c.ok ? "unshare(CLONE_NEWUSER) works (max_user_namespaces " + max + ")"
                    : "unshare(CLONE_NEWUSER) fails (max_user_namespaces " + (max.empty() ? "?" : max) + ")";
    c.fix = "sysctl -w user.max_user_namespaces=65536 (and kernel.apparmor_restrict_unprivileged_userns=0 where set)";
    return c;
}

Check fuse() {
    Check c{"fuse", false, "", ""};
    struct stat st {};
    bool dev = ::stat("/dev/fuse", &st) == 0 && S_ISCHR(st.st_mode);
    bool usable = dev && (st.st_mode & 0006) == 0006;
    bool tool = ::access("/usr/bin/squashfuse_ll", X_OK) == 0 || ::access("/usr/bin/squashfuse", X_OK) == 0;
    c.ok = usable && tool;
    c.detail = !dev      ? "/dev/fuse missing"
               : !usable ? "/dev/fuse not usable by users (mode " + std::to_string(st.st_mode & 0777) + ")"
               : !tool   ? "squashfuse not installed"
                         : "/dev/fuse 0666, squashfuse present";
    c.fix = !dev      ? "modprobe fuse"
            : !usable ? "chmod 0666 /dev/fuse (Debian's udev rule does this)"
                      : "apt-get install squashfuse fuse3";
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
    c.detail =
        path +
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
        auto cache = parse_ld_cache(
            read_all(devices::host_path(config.host_root, "/etc/ld.so.cache")));
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

Check plugin(const std::string& plugstack) {
    Check c{"Slurm plugin in plugstack.conf", false, "", ""};
    std::vector<std::string> files;
    if (!plugstack.empty()) {
        files.push_back(plugstack);
    } else {
        files.push_back("/etc/slurm/plugstack.conf");
        std::string dir = "/etc/slurm/plugstack.conf.d";
        if (DIR* d = ::opendir(dir.c_str())) {
            while (dirent* e = ::readdir(d))
                if (e->d_name[0] != '.') files.push_back(dir + "/" + e->d_name);
            ::closedir(d);
        }
    }
    for (const auto& f : files) {
        for (const auto& line : split_list(read_all(f), '\n')) {
            if (line[0] == '#' || line.find("spank_gantry.so") == std::string::npos) continue;
            auto words = split_list(line, ' ');
            std::string so = words.size() > 1 ? words[1] : "";
            bool present = !so.empty() && (so[0] != '/' || ::access(so.c_str(), R_OK) == 0);
            c.ok = (words[0] == "required" || words[0] == "optional") && present;
            c.detail = f + ": " + words[0] + " " + so + (present ? "" : " (file missing)");
            c.fix = present ? "use 'required' (or 'optional')" : "install the plugin at " + so;
            return c;
        }
    }
    c.detail = "no spank_gantry.so line in " + files.front();
    c.fix = "add 'required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so' to plugstack.conf (docs/admin.md)";
    return c;
}

int doctor_verb(const std::vector<std::string>& args_in) {
    std::vector<std::string> args = args_in;
    auto plugstack = take_option(args, "--plugstack");
    if (auto st = reject_unknown_options(args); !st) return fail(st.error());
    if (!args.empty()) return fail(make_error("doctor takes no operands (gantry doctor [--plugstack FILE])"));
    auto config = load_config();
    if (!config) return fail(config.error());

    std::vector<Check> checks = {user_namespaces(), fuse(),       filesystems(),    store(*config),
                                 gpus(*config),     efa(*config), memlock(*config), plugin(plugstack.value_or(""))};
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

const Registration doctor_registration(
    {"doctor", "doctor [--plugstack FILE]   check this node: namespaces, fuse, store, GPUs, EFA, memlock, plugin",
     doctor_verb});

}  // namespace
}  // namespace gantry::cli
