// Namespace plumbing: entering a fresh user + mount namespace with a single-id map, switching a root
// caller to the job user, and dropping capabilities before the user's command runs.
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "holder_reply.hpp"
#include "internal.hpp"

namespace gantry::launcher {
namespace {

Status write_proc_file(const std::string& path, const std::string& text) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return system_error("writing " + path);
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return system_error("writing " + path);
    return {};
}

}  // namespace

int namespace_flags(const ExtraNamespaces& extra) {
    int flags = CLONE_NEWUSER | CLONE_NEWNS;
    if (extra.net) flags |= CLONE_NEWNET;
    if (extra.ipc) flags |= CLONE_NEWIPC;
    if (extra.uts) flags |= CLONE_NEWUTS;
    return flags;
}

Status switch_to_user(uid_t uid, gid_t gid) {
    if (::getuid() == uid && ::geteuid() == uid && ::getgid() == gid) return {};
    // Called by a root holder (the plugin's privileged hook) once the privileged image mount is done:
    // from here on it acts with the job user's credentials only.
    if (::setgroups(1, &gid) != 0) return system_error("dropping supplementary groups");
    if (::setresgid(gid, gid, gid) != 0) return system_error("switching to gid " + std::to_string(gid));
    if (::setresuid(uid, uid, uid) != 0) return system_error("switching to uid " + std::to_string(uid));
    return {};
}

static std::string uid_map_line(const Identity& id) {
    return std::to_string(id.inner_uid) + " " + std::to_string(id.uid) + " 1\n";
}
static std::string gid_map_line(const Identity& id) {
    return std::to_string(id.inner_gid) + " " + std::to_string(id.gid) + " 1\n";
}

Status enter_user_namespace(const Identity& id, const ExtraNamespaces& extra, int creator) {
    // A holder started by an ordinary user writes its own maps; it must be dumpable for that, since
    // slurmstepd-like callers leave a process non-dumpable after a uid switch, which makes
    // /proc/self/* root-owned and uid_map unwritable (EACCES) — BRIEF §6. Same uid only: nothing to
    // protect. A holder root started for a user stays non-dumpable (the job user can neither ptrace
    // it nor open its /proc entries) and its creator writes the maps instead.
    if (creator < 0 && ::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return system_error("setting the process dumpable");
    if (::unshare(namespace_flags(extra)) != 0) {
        if (errno == EPERM || errno == ENOSPC || errno == EINVAL)
            return system_error(
                "creating a user namespace (are unprivileged user namespaces enabled? "
                "see /proc/sys/user/max_user_namespaces)");
        return system_error("creating the container namespaces");
    }
    if (creator >= 0) {
        launcher::HolderReply userns;
        userns.kind = launcher::HolderReply::Kind::userns;
        userns.pid = ::getpid();
        std::string ask = launcher::holder_reply_to_line(userns);
        if (::send(creator, ask.data(), ask.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ask.size()))
            return system_error("asking the creator for the id maps");
        char reply[3] = {};
        size_t got = 0;
        while (got < sizeof reply) {
            ssize_t n = ::recv(creator, reply + got, sizeof reply - got, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += static_cast<size_t>(n);
        }
        if (got != sizeof reply || std::string_view(reply, 3) != launcher::kHolderGo)
            return make_error("the creator did not write the container's id maps");
        return {};
    }
    GANTRY_TRY(write_proc_file("/proc/self/setgroups", "deny"));
    GANTRY_TRY(write_proc_file("/proc/self/uid_map", uid_map_line(id)));
    GANTRY_TRY(write_proc_file("/proc/self/gid_map", gid_map_line(id)));
    return {};
}

Status write_id_maps(int pidfd, pid_t pid, const Identity& id) {
    // Privileged (root, the creator): writes the single-id maps of the user namespace that holder PID
    // (our own holder, which asked for them on its private socket) has just made. Safe: the maps name
    // only the job user's own uid and gid, exactly what the user could map unprivileged, and
    // setgroups is denied; a map can be written once, so no later write changes it. The process is
    // pinned: /proc/PID is opened first, then the pidfd (taken before) must still name a live process,
    // so the directory is that process's and not one that reused the pid (the job user may kill the
    // holder, which runs as them).
    UniqueFd proc(::open(("/proc/" + std::to_string(pid)).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!proc) return system_error("opening /proc/" + std::to_string(pid));
    if (signal_pidfd(pidfd, 0) != 0)
        return make_error("the container holder (pid " + std::to_string(pid) + ") is gone");
    std::string dir = "/proc/self/fd/" + std::to_string(proc.get());
    GANTRY_TRY(write_proc_file(dir + "/setgroups", "deny"));
    GANTRY_TRY(write_proc_file(dir + "/uid_map", uid_map_line(id)));
    GANTRY_TRY(write_proc_file(dir + "/gid_map", gid_map_line(id)));
    return {};
}

Status make_mounts_private() {
    // Slave, not private: host unmounts (e.g. an admin unmounting /fsx) still propagate in, while
    // nothing we mount leaks out.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
        // The first step that needs a capability in a new user namespace: where AppArmor withholds
        // them (Ubuntu 24.04 without gantry-holder's profile, docs/admin.md), the failure is here.
        if (errno == EPERM)
            return system_error(
                "making the mount namespace private (kernel.apparmor_restrict_unprivileged_userns "
                "without Gantry's AppArmor profile? see gantry doctor)");
        return system_error("making the mount namespace private");
    }
    return {};
}

Status bring_up_loopback() {
    // A new network namespace starts with `lo` down: a connect to 127.0.0.1 would get "Network is
    // unreachable" instead of reaching a server in the container (Enroot and Pyxis bring it up).
    // The holder holds CAP_NET_ADMIN in the user namespace that owns this network namespace, and
    // nothing else: the host's interfaces are not in it.
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock) return system_error("bringing up the loopback interface");
    struct ifreq req {};
    std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
    if (::ioctl(sock.get(), SIOCGIFFLAGS, &req) != 0) return system_error("bringing up the loopback interface");
    req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP | IFF_RUNNING);
    if (::ioctl(sock.get(), SIOCSIFFLAGS, &req) != 0) return system_error("bringing up the loopback interface");
    return {};
}

Status drop_capabilities(int keep) {
    // The bounding set caps what any later exec can gain; the exec of a non-root uid then clears the
    // rest. Needs CAP_SETPCAP, which the process holds in the container's user namespace.
    for (int cap = 0; cap <= 63; ++cap) {
        if (cap == keep) continue;
        if (::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0) break;  // past the kernel's last capability
        if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return system_error("dropping capabilities");
    }
    if (keep < 0) return {};
    // KEEP survives the exec of the user's command as an ambient capability: it must be inheritable
    // first. It is a capability of the container's user namespace only (the process just entered it
    // with setns), so it acts on the namespaces that user namespace owns and on nothing of the host.
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (::syscall(SYS_capget, &header, data) != 0) return system_error("reading capabilities");
    data[keep / 32].inheritable |= 1u << (keep % 32);
    if (::syscall(SYS_capset, &header, data) != 0) return system_error("keeping a capability");
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, keep, 0, 0) != 0) return system_error("keeping a capability");
    return {};
}

}  // namespace gantry::launcher
