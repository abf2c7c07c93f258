// Namespace plumbing: entering a fresh user + mount namespace with a single-id map, switching a root
// caller to the job user, and dropping capabilities before the user's command runs.
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <string>

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

Status enter_user_namespace(const Identity& id, const ExtraNamespaces& extra) {
    // slurmstepd's tasks are non-dumpable after the uid switch, which makes /proc/self/* root-owned
    // and uid_map unwritable (EACCES) — BRIEF §6. Being dumpable costs nothing here: same uid only.
    if (::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return system_error("setting the process dumpable");
    if (::unshare(namespace_flags(extra)) != 0) {
        if (errno == EPERM || errno == ENOSPC || errno == EINVAL)
            return system_error("creating a user namespace (are unprivileged user namespaces enabled? "
                                "see /proc/sys/user/max_user_namespaces)");
        return system_error("creating the container namespaces");
    }
    GANTRY_TRY(write_proc_file("/proc/self/setgroups", "deny"));
    GANTRY_TRY(write_proc_file("/proc/self/uid_map",
                               std::to_string(id.inner_uid) + " " + std::to_string(id.uid) + " 1\n"));
    GANTRY_TRY(write_proc_file("/proc/self/gid_map",
                               std::to_string(id.inner_gid) + " " + std::to_string(id.gid) + " 1\n"));
    return {};
}

Status make_mounts_private() {
    // Slave, not private: host unmounts (e.g. an admin unmounting /fsx) still propagate in, while
    // nothing we mount leaks out.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
        return system_error("making the mount namespace private");
    return {};
}

Status drop_capabilities() {
    // The bounding set caps what any later exec can gain; the exec of a non-root uid then clears the
    // rest. Needs CAP_SETPCAP, which the process holds in the container's user namespace.
    for (int cap = 0; cap <= 63; ++cap) {
        if (::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0) break;  // past the kernel's last capability
        if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return system_error("dropping capabilities");
    }
    return {};
}

}  // namespace gantry::launcher
