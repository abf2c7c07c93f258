// Applying ContainerSpec::devices (decided by the devices module, include/gantry/devices.hpp) while
// the container's root is assembled: files written into the overlay's upper layer before it is
// mounted (symlinks for driver libraries, the ld.so.conf.d entry), sysfs views, device nodes bound
// into our /dev, driver files bound read-only, and finally the image's own ldconfig run inside.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gantry/log.hpp"
#include "gantry/spawn.hpp"
#include "internal.hpp"

namespace gantry::launcher {
namespace {

// The name of the ld.so.conf.d entry: sorts first, so the driver's libraries are found before any
// stub an image might carry in a later-listed directory.
constexpr const char* kLdConf = "/etc/ld.so.conf.d/000-gantry.conf";

Result<UniqueFd> open_dir_in(int root, const std::string& path) {
    auto fd = ensure_in_root(root, path, NodeType::directory);
    if (!fd) return fd.error();
    UniqueFd dir(::openat(fd->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return system_error("opening " + path + " in the container");
    return dir;
}

std::pair<std::string, std::string> split_path(const std::string& path) {
    auto slash = path.rfind('/');
    return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

}  // namespace

Status write_device_files_in_upper(Setup& s) {
    const ContainerEdits& d = s.spec->devices;
    // The upper layer is our own tmpfs: entries made here merge with the image's directories (whose
    // owners are unmapped in our namespace, so we could not write through the overlay).
    for (const auto& link : d.symlinks) {
        auto [parent, leaf] = split_path(link.path);
        auto dir = open_dir_in(s.upper.get(), parent);
        if (!dir) return dir.error().wrap("creating symlink " + link.path);
        ::unlinkat(dir->get(), leaf.c_str(), 0);
        if (::symlinkat(link.target.c_str(), dir->get(), leaf.c_str()) != 0)
            return system_error("creating symlink " + link.path + " -> " + link.target);
    }
    if (!d.ld_library_dirs.empty()) {
        std::string text = "# Written by gantry: host driver and fabric libraries (see docs/devices.md).\n";
        for (const auto& dir : d.ld_library_dirs) text += dir + "\n";
        auto [parent, leaf] = split_path(kLdConf);
        auto dir = open_dir_in(s.upper.get(), parent);
        if (!dir) return dir.error();
        GANTRY_TRY(write_file_at(dir->get(), leaf, text, kLdConf));
        // ldconfig replaces /etc/ld.so.cache by renaming a new file over it. Over the image's copy the
        // overlay would have to copy up a file whose owner is unmapped here (EOVERFLOW), so the
        // image's cache is copied up by hand, as ours, before the overlay exists.
        if (auto cache = open_in_root(s.image.get(), "/etc/ld.so.cache")) {
            UniqueFd in(::open(fd_path(cache->get()).c_str(), O_RDONLY | O_CLOEXEC));
            std::string bytes;
            char buf[65536];
            ssize_t n;
            while (in && (n = ::read(in.get(), buf, sizeof buf)) > 0) bytes.append(buf, static_cast<size_t>(n));
            auto etc = open_dir_in(s.upper.get(), "/etc");
            if (!etc) return etc.error();
            GANTRY_TRY(write_file_at(etc->get(), "ld.so.cache", bytes, "/etc/ld.so.cache"));
        }
    }
    return {};
}

Status mount_sysfs_views(Setup& s) {
    for (const auto& view : s.spec->devices.sysfs_views) {
        // The host's /sys lacks the class when the kernel has no such devices (and in the fake-hardware
        // tests); then there is nothing inside to disagree with the device nodes.
        if (!open_in_root(s.root.get(), view.path)) {
            log::debug("sysfs view " + view.path + " skipped: not present in /sys");
            continue;
        }
        GANTRY_TRY(tmpfs_into(s, view.path, "mode=0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
        auto fd = open_in_root(s.root.get(), view.path);
        if (!fd) return fd.error();
        UniqueFd dir(::openat(fd->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!dir) return system_error("opening the view " + view.path);
        for (const auto& e : view.entries)
            if (::symlinkat(e.target.c_str(), dir.get(), e.path.c_str()) != 0)
                return system_error("creating " + view.path + "/" + e.path);
        for (const auto& [name, content] : view.files)
            GANTRY_TRY(write_file_at(dir.get(), name, content, view.path + "/" + name));
        struct mount_attr attr {};
        attr.attr_set = MOUNT_ATTR_RDONLY;
        if (::mount_setattr(fd->get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
            return system_error("making the view " + view.path + " read-only");
    }
    return {};
}

Status add_device_nodes(Setup& s) {
    const auto& nodes = s.spec->devices.devices;
    if (nodes.empty()) return {};
    if (s.spec->config.host_dev) {
        log::debug("host_dev: the host's /dev is bound whole; device selection does not hide nodes");
        return {};
    }
    // Bind mounts of the host's nodes: a user namespace cannot mknod, and a bind keeps the device usable
    // because the node lives on a host file system without nodev. Access is still decided by the
    // node's permissions and the job's device cgroup, exactly as for the same user on the host.
    for (const auto& n : nodes)
        GANTRY_TRY(bind_into(s, n.host_path, n.path, false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC));
    return {};
}

Status mount_driver_files(Setup& s) {
    // As the job user (the holder switched before): a path the job's environment named is bound only
    // when this user reaches it, and skipped silently otherwise (DeviceMount::if_reachable).
    for (const auto& m : s.spec->devices.mounts) {
        struct stat st {};
        if (::stat(m.host_path.c_str(), &st) != 0) {
            if (m.if_reachable) continue;
            return system_error("mounting " + m.host_path + " at " + m.path);
        }
        uint64_t attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (m.read_only ? MOUNT_ATTR_RDONLY : 0);
        auto bound = bind_into(s, m.host_path, m.path, S_ISDIR(st.st_mode), attrs);
        if (!bound && !m.if_reachable) return bound;
    }
    return {};
}

Status update_ld_cache(Setup& s) {
    if (s.spec->devices.ld_library_dirs.empty()) return {};
    // The image's own ldconfig, inside the container (we are past pivot_root): it writes the cache
    // format the image's glibc reads, from the image's ld.so.conf plus our entry. -X: it must not try
    // to fix links in the image's directories (not ours to write); ours were made in the upper layer.
    std::string ldconfig;
    for (const char* p : {"/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real"})
        if (::access(p, X_OK) == 0) {
            ldconfig = p;
            break;
        }
    if (ldconfig.empty()) {
        log::debug("the image has no ldconfig (not glibc-based?): ld.so cache not updated");
        return {};
    }
    // A fresh exec of the image's program with nothing of ours but stdio: no descriptor of the holder,
    // a fixed environment, and no way to gain privileges (NO_NEW_PRIVS) from the image's setuid bits.
    ProcessRequest rq;
    rq.argv = {ldconfig, "-X"};
    rq.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    rq.no_new_privs = true;
    auto r = spawn(rq);
    if (!r) return r.error().wrap("updating the container's ld.so cache");
    if (r->status != 0) {
        std::string messages = r->err.empty() ? r->out : r->err;
        auto nl = messages.find('\n');
        return make_error("updating the container's ld.so cache: " + ldconfig + " failed" +
                          (messages.empty() ? "" : ": " + messages.substr(0, nl)));
    }
    return {};
}

}  // namespace gantry::launcher
