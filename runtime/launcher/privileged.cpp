// The one privileged step of the launcher: a read-only kernel loop mount of a squashfs image from the
// trusted store, done as real root (the SPANK plugin's privileged hook, or root running `gantry`).
//
// Why this is safe:
//  - The kernel parses only images our own writer produced into a store that only a trusted account
//    can write (BRIEF §5): `ContainerSpec::image_trusted` is set by the store, and we re-check that
//    every directory on the way to the file and the file itself are root-owned and not writable by
//    anybody else. A file a user supplied never gets here (it is served by squashfuse_ll instead).
//  - The mount lives in a private mount namespace of the holder process, read-only, nosuid, nodev;
//    nothing appears on the host, and the loop device auto-clears when the namespace goes away.
//  - Right after this step the holder switches to the job user and enters an unprivileged user
//    namespace; no user-controlled path is touched while privileged.
#include <fcntl.h>
#include <linux/loop.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "internal.hpp"

namespace gantry::launcher {

bool running_as_real_root() { return ::getuid() == 0 && ::geteuid() == 0; }

bool is_trusted_path(const std::string& path) {
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr) return false;
    std::string p = real;
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0)
        return false;
    // Each ancestor: root-owned, and not writable by others unless sticky (like /tmp: others cannot
    // rename or replace a root-owned entry in it).
    for (auto slash = p.rfind('/'); slash != std::string::npos; slash = p.rfind('/', slash - 1)) {
        std::string dir = slash == 0 ? "/" : p.substr(0, slash);
        if (::stat(dir.c_str(), &st) != 0 || st.st_uid != 0) return false;
        if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0) return false;
        if (slash == 0) break;
    }
    return true;
}

Status mount_image_kernel(Setup& s) {
    const std::string& image = s.spec->image_path;
    if (!running_as_real_root() || !s.spec->image_trusted || !is_trusted_path(image))
        return make_error("refusing to kernel-mount " + image + ": not a trusted store image or not root");
    // A private mount namespace (still in the initial user namespace) so the mount is ours alone.
    if (::unshare(CLONE_NEWNS) != 0) return system_error("creating a private mount namespace");
    GANTRY_TRY(make_mounts_private());
    GANTRY_TRY(mount_staging_area(s));

    UniqueFd file(::open(image.c_str(), O_RDONLY | O_CLOEXEC));
    if (!file) return system_error("opening image " + image);
    UniqueFd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
    if (!control) return system_error("opening /dev/loop-control");
    for (int attempt = 0; attempt < 8; ++attempt) {
        int n = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
        if (n < 0) return system_error("finding a free loop device");
        std::string dev = "/dev/loop" + std::to_string(n);
        UniqueFd loop(::open(dev.c_str(), O_RDONLY | O_CLOEXEC));
        if (!loop) return system_error("opening " + dev);
        struct loop_config cfg {};
        cfg.fd = static_cast<unsigned>(file.get());
        cfg.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
        if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) != 0) {
            if (errno == EBUSY) continue;  // another process took it between GET_FREE and CONFIGURE
            if (errno == EINVAL) {         // direct I/O unsupported by the backing filesystem
                cfg.info.lo_flags &= ~LO_FLAGS_DIRECT_IO;
                if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) != 0) return system_error("configuring " + dev);
            } else {
                return system_error("configuring " + dev);
            }
        }
        if (::mount(dev.c_str(), s.image_dir.c_str(), "squashfs", MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
            int err = errno;
            ::ioctl(loop.get(), LOOP_CLR_FD, 0);
            return system_error("mounting " + image + " (" + dev + ")", err);
        }
        return {};  // AUTOCLEAR: the device is released with the last unmount
    }
    return make_error("mounting " + image + ": no free loop device");
}

}  // namespace gantry::launcher
