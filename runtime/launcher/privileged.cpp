// The one privileged step of the launcher: attaching the read-only kernel mount of a squashfs image
// from the trusted store, done as real root (the SPANK plugin's privileged hook, or root running
// `gantry`). The mount itself is node-wide and shared (shared_mounts.cpp).
//
// Why this is safe:
//  - The kernel parses only images our own writer produced into a store that only a trusted account
//    can write (BRIEF §5): `ContainerSpec::image_trusted` is set by the store, and we re-check that
//    every directory on the way to the file and the file itself are owned by root or by the
//    configured store owner and not writable by anybody else. The store owner (gantry.conf
//    `store_owner`) is an unprivileged account the admin trusts to run only our converter; users
//    cannot write what it owns, and the plugin runs pulls as it only after the user's own
//    credentials authorised the image. A file a user supplied never gets here (squashfuse_ll serves it).
//  - The node-wide mount is read-only, nosuid, nodev, below a directory only root can enter; the
//    container gets a detached clone of it, attached in a private mount namespace of the holder.
//  - Right after this step the holder switches to the job user and enters an unprivileged user
//    namespace; no user-controlled path is touched while privileged. The one thing the holder keeps
//    is a read-only descriptor of a root-owned, empty lock file (its reference on the mount).
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "internal.hpp"

namespace gantry::launcher {

bool running_as_real_root() {
    return ::getuid() == 0 && ::geteuid() == 0;
}

bool is_trusted_path(const std::string& path, const std::string& store_owner) {
    Config owner_only;
    owner_only.store_owner = store_owner;
    auto owner = store_owner_uid(owner_only);  // nullopt when unset or unknown: root only
    auto trusted_owner = [&](uid_t uid) { return uid == 0 || (owner && uid == *owner); };
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr) return false;
    std::string p = real;
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || !trusted_owner(st.st_uid) || (st.st_mode & 022) != 0)
        return false;
    // An acquired file (acquire_image, "/proc/self/fd/N"): the open file itself is what the loop device
    // gets, so it must be the very file found at its name in the trusted directories checked below.
    if (int fd = descriptor_of_path(path); fd >= 0) {
        struct stat held {};
        if (::fstat(fd, &held) != 0 || held.st_dev != st.st_dev || held.st_ino != st.st_ino) return false;
    }
    // Each ancestor: owned by root or the store owner and not writable by others; a directory others
    // may write must be root-owned and sticky (like /tmp: others cannot rename or replace an entry
    // they do not own in it).
    for (auto slash = p.rfind('/'); slash != std::string::npos; slash = p.rfind('/', slash - 1)) {
        std::string dir = slash == 0 ? "/" : p.substr(0, slash);
        if (::stat(dir.c_str(), &st) != 0 || !trusted_owner(st.st_uid)) return false;
        if ((st.st_mode & 022) != 0 && ((st.st_mode & S_ISVTX) == 0 || st.st_uid != 0)) return false;
        if (slash == 0) break;
    }
    return true;
}

namespace {

// A layered image (ContainerSpec::image_layers): the node-wide shared overlayfs of its layers' shared
// mounts (acquire_shared_stack: one per image per node, so one container's lookups serve the next),
// attached at image_dir like a whole image's mount. Safe for the same reasons as a whole image: every
// layer file passed the trusted-path check (our writer's bytes, in a store only a trusted account
// writes), and overlayfs reads only what those bytes say: whiteouts and `user.overlay.opaque`
// (`userxattr`), which the converter writes and never copies from a layer (docs/squashfs.md,
// "Overlay form"). The overlay is ro,nosuid,nodev.
//
// A stack too deep for one mount's options (about a hundred layers) is stacked per container instead:
// each layer's shared mount attached below the staging tmpfs, and the container's own overlayfs of
// them (relative names keep overlayfs's own limit of 500 within a page). It keeps private clones of
// its lower mounts, so the container's namespace needs none of the attach points once it has pivoted.
// A node-wide mount (a whole image's or a layer stack's) as the container's image: its reference held
// for the container's life, a private mount namespace (still in the initial user namespace), the
// staging tmpfs, and the mount's clone attached at image_dir.
Status attach_shared_mount(Setup& s, SharedImageMount& shared, const std::string& what) {
    s.image_lease = std::move(shared.lease);
    if (::unshare(CLONE_NEWNS) != 0) return system_error("creating a private mount namespace");
    GANTRY_TRY(make_mounts_private());
    GANTRY_TRY(mount_staging_area(s));
    if (::move_mount(shared.tree.get(), "", AT_FDCWD, s.image_dir.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
        return system_error("attaching the mount of " + what + " (" + shared.mount_point + ") at " + s.image_dir);
    return {};
}

Status mount_layers_kernel(Setup& s) {
    const auto& layers = s.spec->image_layers;
    for (const auto& layer : layers)
        if (!is_trusted_path(layer, s.spec->config.store_owner))
            return make_error("refusing to kernel-mount the layer " + layer + ": not a trusted store file");
    auto stack = acquire_shared_stack(layers, s.spec->config);
    if (stack) return attach_shared_mount(s, *stack, "the layer stack of " + s.spec->image_path);
    if (stack.error().errnum != E2BIG) return stack.error();
    std::vector<SharedImageMount> shared;
    for (const auto& layer : layers) {
        auto mount = acquire_shared_mount(layer, s.spec->config);
        if (!mount) return mount.error();
        s.layer_leases.push_back(std::move(mount->lease));
        shared.push_back(std::move(*mount));
    }
    if (::unshare(CLONE_NEWNS) != 0) return system_error("creating a private mount namespace");
    GANTRY_TRY(make_mounts_private());
    GANTRY_TRY(mount_staging_area(s));
    auto dirs = make_layer_dirs(s);
    if (!dirs) return dirs.error();
    for (size_t i = 0; i < shared.size(); ++i)
        if (::move_mount(shared[i].tree.get(), "", AT_FDCWD, (*dirs)[i].c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
            return system_error("attaching the mount of " + layers[i] + " (" + shared[i].mount_point + ") at " +
                                (*dirs)[i]);
    return mount_layer_stack(s, *dirs);
}

}  // namespace

Status mount_image_kernel(Setup& s) {
    const std::string& image = s.spec->image_path;
    if (!s.spec->image_layers.empty()) {
        if (!running_as_real_root() || !s.spec->image_trusted)
            return make_error("refusing to kernel-mount the layers of " + image +
                              ": not a trusted store image or not root");
        return mount_layers_kernel(s);
    }
    if (!running_as_real_root() || !s.spec->image_trusted || !is_trusted_path(image, s.spec->config.store_owner))
        return make_error("refusing to kernel-mount " + image + ": not a trusted store image or not root");
    // Still in the host mount namespace: find or make the node-wide mount and take a reference.
    auto shared = acquire_shared_mount(image, s.spec->config);
    if (!shared) return shared.error();
    return attach_shared_mount(s, *shared, image);
}

}  // namespace gantry::launcher
