// The unprivileged image backends: a FUSE server (gantry-imagefs, runtime/imagefs; or squashfuse_ll,
// gantry.conf's fuse_server) serving the squashfs inside the container's user namespace (`fuse`), and
// unpacking to node-local scratch (`extract`). The kernel backend is in privileged.cpp. Each leaves
// the image as a directory at Setup::image_dir.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

#ifndef GANTRY_IMAGEFS_INSTALL_PATH
#define GANTRY_IMAGEFS_INSTALL_PATH "/usr/libexec/gantry/gantry-imagefs"
#endif

namespace gantry {

std::string program_of_this_tree(const std::string& name, const char* installed) {
    // Where this code was loaded from: the program (gantry, gantry-holder, a test binary), and, inside
    // slurmstepd, spank_gantry.so (the plugin links the runtime in; its backend choice must find the
    // server of its own tree, as the holder later does: plugin/ -> runtime/ in a build tree).
    std::vector<std::string> paths;
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) paths.emplace_back(self, static_cast<size_t>(n));
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&program_of_this_tree), &info) != 0 && info.dli_fname != nullptr &&
        info.dli_fname[0] == '/')
        paths.emplace_back(info.dli_fname);
    for (const auto& path : paths) {
        std::string dir = path.substr(0, path.rfind('/'));
        // Beside gantry-holder (libexec/gantry, or runtime/ in the build tree), from the CLI in a
        // bindir or the build tree, and from a test binary or the plugin (tests/, plugin/ -> runtime/).
        for (const std::string& candidate :
             {dir + "/" + name, dir + "/../runtime/" + name, dir + "/../libexec/gantry/" + name})
            if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return installed;
}

std::string default_imagefs_program() {
    return program_of_this_tree("gantry-imagefs", GANTRY_IMAGEFS_INSTALL_PATH);
}

namespace launcher {

Status check_squashfs(const std::string& path) {
    // Non-blocking: a FIFO or a device named as the image must fail at once, not hang the caller
    // (slurmstepd waits for it); only a regular file can be an image.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!fd) return system_error("opening image " + path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("opening image " + path);
    if (!S_ISREG(st.st_mode))
        return make_error("opening image " + path + ": not a regular file (give a squashfs file)");
    char magic[4] = {};
    if (::read(fd.get(), magic, 4) != 4 || std::memcmp(magic, "hsqs", 4) != 0)
        return make_error("opening image " + path + ": not a squashfs file");
    return {};
}

Result<std::string> fuse_server_program(const Config& config) {
    if (config.fuse_server == "squashfuse_ll") {
        std::string daemon = find_program("squashfuse_ll");
        if (daemon.empty())
            return make_error(
                "squashfuse_ll not found (Debian package squashfuse; gantry.conf fuse_server = squashfuse_ll; or "
                "use --backend extract)");
        return daemon;
    }
    std::string daemon = default_imagefs_program();
    if (::access(daemon.c_str(), X_OK) != 0)
        return system_error("the fuse image server " + daemon +
                            " is not usable (reinstall gantry; or use --backend extract)");
    return daemon;
}

Status fuse_accessible(const Config& config) {
    if (::access("/dev/fuse", R_OK | W_OK) != 0)
        return make_error(std::string("/dev/fuse not accessible: ") + std::strerror(errno) +
                          " (use the kernel backend from Slurm, or ask the admin for fuse access)");
    auto daemon = fuse_server_program(config);
    if (!daemon) return daemon.error();
    return {};
}

// The backend a container gets: the one asked for, else gantry.conf's mount_backend, else kernel where
// privileged, fuse where it can run, extract otherwise. Shared by choose_backend and can_stack_layers,
// which asks before a pull what the launcher will pick after it.
MountBackend resolve_backend(const Config& config, MountBackend b, bool privileged_ok) {
    if (b == MountBackend::auto_) {
        auto conf = parse_mount_backend(config.mount_backend);
        b = conf ? *conf : MountBackend::auto_;
    }
    if (b != MountBackend::auto_) return b;
    if (privileged_ok) return MountBackend::kernel;
    if (fuse_accessible(config)) return MountBackend::fuse;
    return MountBackend::extract;
}

Result<MountBackend> choose_backend(const ContainerSpec& spec, bool privileged_ok) {
    MountBackend b = resolve_backend(spec.config, spec.backend, privileged_ok);
    if (b == MountBackend::kernel && !privileged_ok)
        return make_error("the kernel backend needs root and an image in the trusted store (" + spec.image_path +
                          " is not); use --backend fuse");
    return b;
}

}  // namespace launcher

bool can_stack_layers(const Config& config, MountBackend backend, bool privileged) {
    // A backend named stacks (or fails on its own terms, saying why); auto falls back to extract where
    // neither the kernel backend nor the fuse backend can run.
    return kernel_stacks_layers() && launcher::resolve_backend(config, backend, privileged) != MountBackend::extract;
}

namespace launcher {

// serve_image_with_fuse's first half: the mount and the server started, not yet waited for.
Result<pid_t> start_fuse_server(const std::string& image, const std::string& target, uid_t uid, gid_t gid,
                                const Config& config) {
    GANTRY_TRY(fuse_accessible(config));
    auto program = fuse_server_program(config);
    if (!program) return program.error();
    const std::string& daemon = *program;
    bool squashfuse = config.fuse_server == "squashfuse_ll";
    std::string name = squashfuse ? "squashfuse_ll" : "gantry-imagefs";
    // We mount the FUSE filesystem ourselves (allowed with the user namespace's CAP_SYS_ADMIN) and
    // hand the server the connected /dev/fuse descriptor as "/dev/fd/N" (libfuse3 then serves it
    // without mounting): no fusermount, no setuid helper, and the mount exists before we go on.
    UniqueFd fuse(::open("/dev/fuse", O_RDWR));  // inherited by the daemon: not O_CLOEXEC
    if (!fuse)
        return make_error(std::string("/dev/fuse not accessible: ") + std::strerror(errno) +
                          " (use the kernel backend from Slurm, or ask the admin for fuse access)");
    std::string opts = "fd=" + std::to_string(fuse.get()) + ",rootmode=40000,user_id=" + std::to_string(uid) +
                       ",group_id=" + std::to_string(gid) + ",allow_other";
    if (::mount(image.c_str(), target.c_str(), ("fuse." + name).c_str(), MS_RDONLY | MS_NOSUID | MS_NODEV,
                opts.c_str()) != 0)
        return system_error("mounting " + image + " with fuse");
    // The daemon gets the /dev/fuse descriptor under its own number, our stderr (its errors are the
    // user's to see, or /dev/null), and dies with us. Both servers answer lookups and attributes
    // with long timeouts and let the kernel keep file pages (the image is immutable), so the kernel
    // keeps dentries, inodes and pages for as long as this mount lives; gantry-imagefs also spares
    // the OPEN/OPENDIR round trips and caches negative lookups (runtime/imagefs/fuse_server.cpp).
    ProcessRequest serve;
    std::string mountpoint = "/dev/fd/" + std::to_string(fuse.get());
    serve.argv = squashfuse ? std::vector<std::string>{daemon, "-f", image, mountpoint}
                            : std::vector<std::string>{daemon, "--poll-us=" + std::to_string(config.fuse_poll_us),
                                                       image, mountpoint};
    serve.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    serve.inputs = {{fuse.get(), fuse.get()}, {STDERR_FILENO, STDERR_FILENO}};
    pass_image_descriptors(serve, {image});  // the acquired file itself (acquire_image), not its name
    serve.death_signal = SIGKILL;
    auto pid = start_process(serve);
    if (!pid) return pid.error();
    // Our copy must go: if the daemon dies, the connection then aborts and the probe (await_fuse_server)
    // fails with ENOTCONN instead of hanging.
    fuse.reset();
    return *pid;
}

// The second half: the first stat waits for the daemon's INIT and GETATTR answers; once it returns,
// the daemon has opened the image and serves it, and we may pivot away from the host paths it used.
Status await_fuse_server(const std::string& image, const std::string& target, pid_t pid, const Config& config) {
    struct stat st {};
    if (::stat(target.c_str(), &st) == 0) return {};
    int err = errno;
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::string name = config.fuse_server == "squashfuse_ll" ? "squashfuse_ll" : "gantry-imagefs";
    return make_error("mounting " + image + " with " + name + ": " + std::strerror(err) + " (daemon exit status " +
                      std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) + ")");
}

Result<pid_t> serve_image_with_fuse(const std::string& image, const std::string& target, uid_t uid, gid_t gid,
                                    const Config& config) {
    auto pid = start_fuse_server(image, target, uid, gid, config);
    if (!pid) return pid.error();
    GANTRY_TRY(await_fuse_server(image, target, *pid, config));
    return *pid;
}

Status serve_layers_with_fuse(const std::vector<std::string>& layers, const std::vector<std::string>& dirs, uid_t uid,
                              gid_t gid, const Config& config, std::vector<pid_t>& daemons) {
    // Every server started first, then each waited for: they open their layers and answer INIT side by
    // side (a step's start-up pays for about one, not one per layer).
    const size_t first = daemons.size();
    for (size_t i = 0; i < layers.size(); ++i) {
        auto pid = start_fuse_server(layers[i], dirs[i], uid, gid, config);
        if (!pid) return pid.error();
        daemons.push_back(*pid);
    }
    for (size_t i = 0; i < layers.size(); ++i)
        GANTRY_TRY(await_fuse_server(layers[i], dirs[i], daemons[first + i], config));
    return {};
}

namespace {

// A layered image (ContainerSpec::image_layers) with the fuse backend: one server of the container's
// own per layer, each mounted below the staging tmpfs, and a read-only overlayfs of them at image_dir,
// all inside the container's user namespace (overlayfs there needs `userxattr`, which is also the form
// the store's layers carry their opaque markers in; kernel >= 5.11). Runs as the user: the servers
// parse the layer files unprivileged, as for a whole image.
Status mount_layers_fuse(Setup& s) {
    const auto& layers = s.spec->image_layers;
    auto dirs = make_layer_dirs(s);
    if (!dirs) return dirs.error();
    GANTRY_TRY(serve_layers_with_fuse(layers, *dirs, s.id.inner_uid, s.id.inner_gid, s.spec->config, s.layer_daemons));
    return mount_layer_stack(s, *dirs);  // in a user namespace: Linux >= 5.11
}

}  // namespace

Status mount_image_fuse(Setup& s) {
    if (!s.spec->image_layers.empty()) return mount_layers_fuse(s);
    auto pid = serve_image_with_fuse(s.spec->image_path, s.image_dir, s.id.inner_uid, s.id.inner_gid, s.spec->config);
    if (!pid) return pid.error();
    s.fuse_daemon = *pid;
    return {};
}

Status extract_image(Setup& s) {
    // Runs on the host side as the user, before the namespaces exist: the tree is the user's files.
    std::string tmpl = s.spec->config.scratch_path + "/gantry-extract-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr)
        return system_error("creating scratch directory in " + s.spec->config.scratch_path);
    std::string dir = buf.data();
    s.scratch_dir = UniqueFd(::open(s.spec->config.scratch_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    s.scratch_name = dir.substr(dir.rfind('/') + 1);
    std::string tool = find_program("unsquashfs");
    if (tool.empty()) return make_error("unsquashfs not found (Debian package squashfs-tools)");
    // Device nodes and ownership cannot be recreated by a user: -ignore-errors keeps the rest.
    ProcessRequest unpack;
    unpack.argv = {tool,     "-no-xattrs", "-ignore-errors", "-no-progress",
                   "-quiet", "-d",         dir + "/root",    s.spec->image_path};
    unpack.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    unpack.inputs = {{STDERR_FILENO, STDERR_FILENO}};
    pass_image_descriptors(unpack, {s.spec->image_path});
    unpack.death_signal = SIGKILL;
    auto pid = start_process(unpack);
    if (!pid) return pid.error();
    int status = 0;
    ::waitpid(*pid, &status, 0);
    if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 2))
        return make_error("extracting " + s.spec->image_path + " to " + dir + ": unsquashfs failed");
    return {};
}

Status bind_extracted_image(Setup& s) {
    std::string src = s.spec->config.scratch_path + "/" + s.scratch_name + "/root";
    if (::mount(src.c_str(), s.image_dir.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
        return system_error("mounting the extracted image " + src);
    return {};
}

void remove_tree(int dirfd, const std::string& name) {
    int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        DIR* d = ::fdopendir(fd);
        if (d != nullptr) {
            std::vector<std::string> entries;
            while (dirent* e = ::readdir(d)) {
                std::string n = e->d_name;
                if (n != "." && n != "..") entries.push_back(n);
            }
            for (const auto& n : entries) {
                // Directories we cannot enter (unsquashfs keeps 0555 modes) are opened up first.
                // Best effort: symlinks refuse it (ENOTSUP) and need nothing.
                (void)!::fchmodat(::dirfd(d), n.c_str(), 0700, AT_SYMLINK_NOFOLLOW);
                if (::unlinkat(::dirfd(d), n.c_str(), 0) != 0) remove_tree(::dirfd(d), n);
            }
            ::closedir(d);
        } else {
            ::close(fd);
        }
    }
    ::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR);
}

}  // namespace launcher
}  // namespace gantry
