// Node-wide kernel mounts of trusted store images (the `kernel` backend): one read-only loop mount per
// image per node, in the host mount namespace, shared by every container, step and job on the node;
// reference-counted with file locks (no daemon) and released after an idle time.
//
// Layout below <runtime_path>/images (0700 root: no user can reach anything in it):
//   <key>/lock    exclusive flock while a mount is checked, made or removed (held for milliseconds)
//   <key>/users   each container's holder keeps a shared flock on it for its whole life. The kernel
//                 drops that lock when the holder exits for any reason, so a crashed holder never
//                 leaks a reference; "unused" = an exclusive lock can be taken.
//   <key>/idle    made when the mount was first seen unused (its mtime says when), removed on reuse
//   <key>/source  the image path: a mount whose file was deleted or rebuilt is released once unused
//   <key>/root    the mount point (squashfs, ro,nosuid,nodev)
// <key> = 32 hex digits of sha256(real path, device, inode, size, mtime): the same file always maps
// to the same mount, and a file rebuilt in place gets a new one instead of a stale view.
//
// A layered image (docs/store.md, "Layers") gets one more such directory for its whole stack: <key>
// from its layers' keys in order, `source` = "overlay" and the layer paths bottom first, `root` a
// read-only overlayfs whose lower layers are the layers' own shared mounts (and `empty` below them).
// Shared like a whole image's mount, the stack keeps what one container looked up (overlayfs's own
// dentries and inodes, the merged directory lists) for the next: a container that stacked the
// layers itself would look every path up again through every layer. The overlay holds private
// clones of its lower mounts, so a layer's own mount may be released meanwhile.
//
// A container never uses <key>/root directly: its holder takes a detached clone of the mount
// (open_tree OPEN_TREE_CLONE) and attaches it in its own mount namespace. The clone pins the
// superblock, so even an administrator's `umount` of <key>/root cannot pull the image from under a
// running container; the loop device (LO_FLAGS_AUTOCLEAR) goes when the last reference does.
//
// Every step here runs as real root (the SPANK plugin's privileged hook, the job epilog, or root
// running `gantry`). Why each is safe is said where it happens.
#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry::launcher {

Result<std::string> image_key(const std::string& image) {
    char real[PATH_MAX];
    struct stat st {};
    if (int fd = descriptor_of_path(image); fd >= 0) {
        // An acquired file (acquire_image): the file we hold, even when its name is gone or was
        // renamed over since; such a key matches no later lookup, and its mount is released when unused.
        if (::fstat(fd, &st) != 0) return system_error("checking image " + image);
        if (::realpath(image.c_str(), real) == nullptr) std::snprintf(real, sizeof real, "%s", image.c_str());
    } else {
        if (::realpath(image.c_str(), real) == nullptr) return system_error("resolving image " + image);
        if (::stat(real, &st) != 0) return system_error("checking image " + image);
    }
    std::string id = std::string(real) + '\0' + std::to_string(st.st_dev) + ':' + std::to_string(st.st_ino) + ':' +
                     std::to_string(st.st_size) + ':' + std::to_string(st.st_mtim.tv_sec) + '.' +
                     std::to_string(st.st_mtim.tv_nsec);
    return digest_hex(Sha256::of(id)).substr(0, 32);
}

namespace {

// A stack's key from its layers' own keys, in order.
std::string stack_key_of(const std::vector<std::string>& layer_keys) {
    std::string id = "overlay stack";
    for (const auto& key : layer_keys) id += '\0' + key;
    return digest_hex(Sha256::of(id)).substr(0, 32);
}

Result<std::vector<std::string>> layer_keys(const std::vector<std::string>& layers) {
    std::vector<std::string> keys;
    for (const auto& layer : layers) {
        auto key = image_key(layer);
        if (!key) return key.error();
        keys.push_back(*key);
    }
    return keys;
}

}  // namespace

Result<std::string> stack_key(const std::vector<std::string>& layers) {
    auto keys = layer_keys(layers);
    if (!keys) return keys.error();
    return stack_key_of(*keys);
}

namespace {

constexpr long kSquashfsMagic = 0x73717368;
constexpr long kOverlayMagic = 0x794c7630;
constexpr const char* kStackSource = "overlay";

// The key that what a `source` file names has now: a file's image_key, or a stack's stack_key.
Result<std::string> key_of_source(const std::string& text) {
    auto lines = split_list(trim(text), '\n');
    if (lines.empty()) return make_error("no source");
    if (lines[0] != kStackSource) return image_key(lines[0]);
    lines.erase(lines.begin());
    if (lines.empty()) return make_error("a stack without layers");
    return stack_key(lines);
}

std::string images_dir(const Config& config) {
    return config.runtime_path + "/images";
}

// Opens (making it if needed) a directory that must be root's alone. Refuses a symlink or a directory
// somebody else owns or may write: whoever could write there could swap the mount point.
Result<UniqueFd> open_root_dir(int parent, const std::string& name, const std::string& path) {
    // Safe: root makes a 0700 directory; an existing one is only used after the ownership check.
    if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) return system_error("creating " + path);
    UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return system_error("opening " + path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("checking " + path);
    if (st.st_uid != 0 || (st.st_mode & 077) != 0)
        return make_error("refusing to use " + path + ": not a 0700 directory owned by root");
    return fd;
}

Result<UniqueFd> open_images_dir(const Config& config) {
    // runtime_path itself is made by the launcher (root: 0755, root-owned); we only add images/.
    UniqueFd base(::open(config.runtime_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!base) {
        if (::mkdir(config.runtime_path.c_str(), 0755) != 0 && errno != EEXIST)
            return system_error("creating runtime directory " + config.runtime_path);
        base = UniqueFd(::open(config.runtime_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!base) return system_error("opening runtime directory " + config.runtime_path);
    }
    return open_root_dir(base.get(), "images", images_dir(config));
}

// The squashfs is mounted on <key>/root when that directory sits on another filesystem than <key>/.
bool is_mounted(int key_dir) {
    struct stat dir {
    }, mnt{};
    if (::fstat(key_dir, &dir) != 0 || ::fstatat(key_dir, "root", &mnt, AT_SYMLINK_NOFOLLOW) != 0) return false;
    return dir.st_dev != mnt.st_dev;
}

Status lock(int fd, int how, const std::string& what) {
    while (::flock(fd, how) != 0) {
        if (errno != EINTR) return system_error("locking " + what);
    }
    return {};
}

// Loop-mounts `image` read-only on `target`. Safe: the caller checked that `image` is a trusted store
// file (root-owned, in root-owned non-writable directories), so the kernel parses bytes our own writer
// produced; the mount is ro,nosuid,nodev and lies in a directory only root can enter.
Status loop_mount(const std::string& image, const std::string& target) {
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
        // Buffered, not LO_FLAGS_DIRECT_IO: squashfs submits its block reads to the loop device one
        // by one, and only the backing file's page cache gives them readahead. Reading 20,000 small
        // files cold took 3.5-4.4 s with direct I/O and 1.5-1.8 s buffered (docs/runtime.md); the
        // price, compressed pages cached beside the decompressed ones, is reclaimable memory.
        cfg.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
        std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
        if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) != 0) {
            if (errno == EBUSY) continue;  // another process took it between GET_FREE and CONFIGURE
            return system_error("configuring " + dev);
        }
        if (::mount(dev.c_str(), target.c_str(), "squashfs", MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
            int err = errno;
            ::ioctl(loop.get(), LOOP_CLR_FD, 0);
            return system_error("mounting " + image + " (" + dev + ")", err);
        }
        return {};  // AUTOCLEAR: the device is released with the last reference to the mount
    }
    return make_error("mounting " + image + ": no free loop device");
}

// One image's directory: decides, under its lock, whether the mount has been idle long enough and
// unmounts it. Returns true when it released the mount.
bool release_if_idle(int images, const std::string& key, const Config& config, time_t now) {
    std::string path = images_dir(config) + "/" + key;
    UniqueFd dir(::openat(images, key.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir) return false;
    UniqueFd mutex(::openat(dir.get(), "lock", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    // Busy: somebody is mounting or releasing right now; the next sweep looks again.
    if (!mutex || ::flock(mutex.get(), LOCK_EX | LOCK_NB) != 0) return false;
    if (!is_mounted(dir.get())) {
        ::unlinkat(dir.get(), "idle", 0);
        return false;
    }
    UniqueFd users(::openat(dir.get(), "users", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (users && ::flock(users.get(), LOCK_EX | LOCK_NB) != 0) {
        ::unlinkat(dir.get(), "idle", 0);  // in use: the idle clock starts again when it is not
        return false;
    }
    // An image deleted (gantry rm, gc) or rebuilt since it was mounted can never be asked for again
    // under this key: release it now instead of after the idle time.
    auto source = try_read_file(path + "/source");
    auto current = source ? key_of_source(*source) : Result<std::string>(make_error("no source"));
    bool stale = !current || *current != key;
    struct stat idle {};
    if (stale) {
        // fall through to the release
    } else if (::fstatat(dir.get(), "idle", &idle, AT_SYMLINK_NOFOLLOW) != 0) {
        // First time seen unused: start the clock now. Without a daemon nobody saw the last holder
        // leave, so this is the earliest safe start (a holder that stops normally is followed by a
        // sweep at once: Container::stop).
        UniqueFd mark(::openat(dir.get(), "idle", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (config.mount_idle_seconds > 0) return false;
    } else if (now - idle.st_mtim.tv_sec < config.mount_idle_seconds) {
        return false;
    }
    // Safe: nobody holds a reference (the users lock is ours) and nobody can take one while we hold
    // the mutex. MNT_DETACH so a root shell sitting in the directory cannot wedge the release; the
    // loop device clears itself with the last reference.
    std::string mnt = path + "/root";
    if (::umount2(mnt.c_str(), MNT_DETACH) != 0) {
        log::warning("releasing the image mount " + mnt + ": " + std::strerror(errno));
        return false;
    }
    ::unlinkat(dir.get(), "idle", 0);
    log::debug("released idle image mount " + mnt);
    return true;
}

}  // namespace

namespace {

// The protocol both kinds share: under <key>/lock, take a reference, make the mount with `make` when
// it is not there (writing `source`), check its file system type, and clone it for the container.
Result<SharedImageMount> acquire(const std::string& key, const std::string& what, const std::string& source, long magic,
                                 const std::function<Status(int dir, const std::string& mnt)>& make,
                                 const Config& config) {
    auto images = open_images_dir(config);
    if (!images) return images.error();
    std::string path = images_dir(config) + "/" + key;
    auto dir = open_root_dir(images->get(), key, path);
    if (!dir) return dir.error();

    // Safe: files root creates in a root-only directory, never following a symlink.
    UniqueFd mutex(::openat(dir->get(), "lock", O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!mutex) return system_error("opening " + path + "/lock");
    GANTRY_TRY(lock(mutex.get(), LOCK_EX, path + "/lock"));
    SharedImageMount out;
    out.lease = UniqueFd(::openat(dir->get(), "users", O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.lease) return system_error("opening " + path + "/users");
    // A releaser takes `users` exclusively only while holding the mutex, which we hold: a refusal
    // here means a process holds it outside the protocol; fail instead of waiting for it forever.
    if (::flock(out.lease.get(), LOCK_SH | LOCK_NB) != 0) return system_error("taking a reference on " + path);

    std::string mnt = path + "/root";
    if (!is_mounted(dir->get())) {
        if (::mkdirat(dir->get(), "root", 0700) != 0 && errno != EEXIST) return system_error("creating " + mnt);
        GANTRY_TRY(make(dir->get(), mnt));
        ::unlinkat(dir->get(), "source", 0);
        UniqueFd f(::openat(dir->get(), "source", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (f) (void)!::write(f.get(), source.data(), source.size());
        log::debug("mounted " + what + " at " + mnt);
    }
    struct statfs fs {};
    if (::statfs(mnt.c_str(), &fs) != 0 || fs.f_type != magic)
        return make_error("the shared mount " + mnt + " of " + what + " is not the file system expected");
    ::unlinkat(dir->get(), "idle", 0);
    // The container's own copy of the mount; detached, so it lives exactly as long as somebody uses it.
    out.tree = UniqueFd(static_cast<int>(::open_tree(AT_FDCWD, mnt.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
    if (!out.tree) return system_error("cloning the mount " + mnt);
    out.mount_point = mnt;
    return out;
}

}  // namespace

Result<SharedImageMount> acquire_shared_mount(const std::string& image, const Config& config) {
    if (!running_as_real_root()) return make_error("sharing a kernel mount of " + image + " needs root");
    auto key = image_key(image);
    if (!key) return key.error();
    char real[PATH_MAX];
    const std::string source = std::string(::realpath(image.c_str(), real) != nullptr ? real : image.c_str()) + "\n";
    return acquire(
        *key, image, source, kSquashfsMagic, [&](int, const std::string& mnt) { return loop_mount(image, mnt); },
        config);
}

Result<SharedImageMount> acquire_shared_stack(const std::vector<std::string>& layers, const Config& config) {
    const std::string what = "the " + std::to_string(layers.size()) + "-layer stack of " +
                             (layers.empty() ? std::string("no layers") : layers.back());
    if (!running_as_real_root()) return make_error("sharing a kernel mount of " + what + " needs root");
    if (layers.empty()) return make_error("sharing " + what);
    // The lower layers by their names relative to images/ ("<key>/root"), which the kernel resolves
    // against our working directory: the options are one page, which full paths would fill sooner.
    auto keys = layer_keys(layers);
    if (!keys) return keys.error();
    std::string lowers;
    for (const auto& key : *keys) lowers = key + "/root:" + lowers;  // top layer first
    if (lowers.size() + 64 + 40 > 4000) {
        Error e{"sharing " + what + ": too many layers for one mount's options", E2BIG, 0};
        return e;
    }
    const std::string key = stack_key_of(*keys);
    std::string source = std::string(kStackSource) + "\n";
    for (const auto& layer : layers) {
        char real[PATH_MAX];
        source += std::string(::realpath(layer.c_str(), real) != nullptr ? real : layer.c_str()) + "\n";
    }
    auto make = [&](int dir, const std::string& mnt) -> Status {
        // Each layer's own shared mount, held until the overlay has its private clones of them.
        std::vector<SharedImageMount> parts;
        for (const auto& layer : layers) {
            auto part = acquire_shared_mount(layer, config);
            if (!part) return part.error();
            parts.push_back(std::move(*part));
        }
        // An empty directory at the bottom: overlayfs needs two lower layers without an upper one.
        if (::mkdirat(dir, "empty", 0755) != 0 && errno != EEXIST)
            return system_error("creating the stack's empty layer");
        const std::string opts = "lowerdir=" + lowers + key + "/empty,userxattr";
        // Safe: every layer passed the trusted-path check (our writer's bytes in a store only a trusted
        // account writes; the caller checked), they are mounted ro,nosuid,nodev in root's 0700
        // directory, and overlayfs reads only whiteouts and `user.overlay.opaque` from them, which
        // the converter writes and never copies from a layer (docs/squashfs.md, "Overlay form").
        UniqueFd here(::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!here || ::chdir(images_dir(config).c_str()) != 0) return system_error("entering " + images_dir(config));
        int rc = ::mount("overlay", mnt.c_str(), "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, opts.c_str());
        int err = errno;
        if (::fchdir(here.get()) != 0) return system_error("returning from " + images_dir(config));
        if (rc != 0) return system_error("stacking " + what + " with overlayfs at " + mnt, err);
        return {};
    };
    return acquire(key, what, source, kOverlayMagic, make, config);
}

}  // namespace gantry::launcher

namespace gantry {

Result<int> release_idle_mounts(const Config& config) {
    if (!launcher::running_as_real_root()) return 0;
    UniqueFd images(::open(launcher::images_dir(config).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!images) return errno == ENOENT ? Result<int>(0) : system_error("opening " + launcher::images_dir(config));
    std::vector<std::string> keys;
    if (DIR* d = ::fdopendir(::dup(images.get()))) {
        while (dirent* e = ::readdir(d))
            if (e->d_name[0] != '.') keys.emplace_back(e->d_name);
        ::closedir(d);
    }
    time_t now = ::time(nullptr);
    int released = 0;
    for (const auto& key : keys)
        if (launcher::release_if_idle(images.get(), key, config, now)) ++released;
    return released;
}

}  // namespace gantry
