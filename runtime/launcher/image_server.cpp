// The fuse backend's image servers: one FUSE server (gantry-imagefs, or squashfuse_ll: gantry.conf's
// fuse_server) per (user, image, inner ids, cgroup, server program) on a node,
// shared by all of that user's containers of the image, so that what one container read stays in
// the kernel's caches for the next one. A FUSE mount keeps its dentries, inodes and pages for as
// long as it lives (the server answers with long timeouts and keeps pages cached); a mount per
// container threw them away at every start and made one daemon decompress every block again.
//
// The server is `gantry-holder --serve-image`, started by the first container's holder and run with
// the user's rights only. It makes a user + mount namespace of its own (the container's id map),
// mounts the image there with FUSE and starts the FUSE server on it, then listens on a socket. Each
// container's holder connects (as the user, before its own namespaces exist) and gets two
// descriptors: the server's user namespace, which it joins before unsharing its mount namespace
// (FUSE's allow_other admits only processes in the mounting user namespace or below it), and a
// detached clone of the mount, which it attaches at its image directory. The connection stays open
// for the container's life: it is the reference. The kernel closes it however the holder ends, so a
// SIGKILLed container never leaks one; the server exits when it has had no connection for
// gantry.conf's mount_idle_seconds (at once, once unused, when the image file was deleted or
// rebuilt), and its mount namespace, the mount and the daemon go with it.
//
// A layered image (ContainerSpec::image_layers) gets one server for its whole stack: the server
// mounts each layer with a FUSE daemon of its own and stacks them with a read-only overlayfs
// (`userxattr`, as a container's own stack) in its namespace, and hands out that overlay mount: a
// container joins one user namespace only, so the layers' mounts must all be the server's, and the
// stack's dentries and the layers' pages then stay warm for the next container as a whole image's do.
//
// Layout, all the user's own (nothing here is root's; every step runs with the user's rights):
//   <base>                 /run/user/UID/gantry-fuse when /run/user/UID is the user's, else
//                          /tmp/gantry-fuse-UID: a 0700 directory the user owns, or it is refused
//   <base>/<key>/lock      exclusive flock while a holder looks for or starts the server, and while
//                          the server decides to exit (so no holder connects to a server that leaves)
//   <base>/<key>/socket    the server's listening socket; the server checks each peer's uid, and the
//                          holder checks the server's
//   <base>/<key>/root      the mount point, used only inside the server's mount namespace
//   <base>/<key>/layer.N   a layered image's layer N (bottom 0), and an empty directory `empty` below
// <key> = image_key (path, device, inode, size, mtime; a layered image: a hash of its layers' keys, in
// order) + 16 hex digits of sha256 of the inner ids
// and of /proc/self/cgroup: never shared across users (the directory is the user's), across id maps
// (--remap-root sees the image's root-owned files as root, others as nobody) or across cgroups (a
// server lives in the cgroup of the holder that started it; Slurm kills a step's cgroup at its end,
// so a server shared across cgroups could vanish under a container of another step). For a holder
// root started for a job user, the plugin's scope (its job on this node) replaces the cgroups: the
// plugin moves the server into the job's cgroups and its epilog ends it (cgroups.cpp).
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/mounts.hpp"
#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry::launcher {
namespace {

// Opens (making it if needed) a directory that must be the caller's alone: whoever else could write
// there could put a socket of theirs where our containers look for the image.
Result<UniqueFd> open_own_dir(int parent, const std::string& name, const std::string& path) {
    if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) return system_error("creating " + path);
    UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return system_error("opening " + path + " (not a directory, or a symlink)");
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("checking " + path);
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
        return make_error("refusing to use " + path + ": not a 0700 directory of uid " + std::to_string(::geteuid()) +
                          " (owned by uid " + std::to_string(st.st_uid) + "; remove it)");
    return fd;
}

std::string servers_base(uid_t uid) {
    std::string run = "/run/user/" + std::to_string(uid);
    struct stat st {};
    if (::lstat(run.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 077) == 0)
        return run + "/gantry-fuse";
    return "/tmp/gantry-fuse-" + std::to_string(uid);
}

// What a server serves, as a key: the image's, or for a layered image the hash of its layers' keys in
// order (bottom first). A layer file deleted or rebuilt changes it.
Result<std::string> served_key(const std::string& image, const std::vector<std::string>& layers) {
    if (layers.empty()) return image_key(image);
    std::string id = "fuse layer stack";
    for (const auto& layer : layers) {
        auto key = image_key(layer);
        if (!key) return key.error();
        id += '\0' + *key;
    }
    return digest_hex(Sha256::of(id)).substr(0, 32);
}

Result<std::string> server_key(const Setup& s) {
    auto image = served_key(s.spec->image_path, s.spec->image_layers);
    if (!image) return image.error();
    // The server program is part of the key: changing gantry.conf's fuse_server takes effect at the
    // next container, not when an old server happens to go.
    // A holder root started for a job user shares within the scope the plugin named (its job on this
    // node), any other within its cgroups.
    std::string where = s.spec->fuse_server_scope.empty() ? try_read_file("/proc/self/cgroup").value_or("")
                                                          : "scope " + s.spec->fuse_server_scope;
    std::string scope = s.spec->config.fuse_server + "\n" + std::to_string(s.id.inner_uid) + ":" +
                        std::to_string(s.id.inner_gid) + "\n" + where;
    return *image + "-" + digest_hex(Sha256::of(scope)).substr(0, 16);
}

Status lock(int fd, int how, const std::string& what) {
    while (::flock(fd, how) != 0)
        if (errno != EINTR) return system_error("locking " + what);
    return {};
}

// The socket's address through the directory's descriptor: short whatever the directory's path.
sockaddr_un socket_address(int dir) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string path = fd_path(dir) + "/socket";
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return addr;
}

ucred peer_of(int sock) {
    const ucred none{-1, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
    ucred cred = none;
    socklen_t len = sizeof cred;
    return ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred : none;
}

uid_t peer_uid(int sock) {
    return peer_of(sock).uid;
}

Result<UniqueFd> connect_server(int dir, const std::string& path) {
    UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sock) return system_error("creating a socket");
    sockaddr_un addr = socket_address(dir);
    if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
        return system_error("connecting to the image server at " + path);
    // Only a server of our own: the directory is ours alone, and the peer must run as us too.
    if (uid_t peer = peer_uid(sock.get()); peer != ::geteuid())
        return make_error("refusing the image server at " + path + ": it runs as uid " + std::to_string(peer));
    timeval limit{30, 0};  // a server that stopped answering must not hang the container's start
    ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    return sock;
}

// Reads the server's answer: one byte and two descriptors (its user namespace, a clone of its mount).
Status receive_image(int sock, Setup& s, const std::string& path) {
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n;
    while ((n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    if (n < 0) return system_error("reading the image server's answer at " + path);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (n != 1 || byte != 'k' || c == nullptr || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int)))
        return make_error("the image server at " + path + " sent no image");
    int fds[2];
    std::memcpy(fds, CMSG_DATA(c), sizeof fds);
    s.server_userns = UniqueFd(fds[0]);
    s.image_tree = UniqueFd(fds[1]);
    return {};
}

Status start_server(const Setup& s, int dir, const std::string& path) {
    ::unlinkat(dir, "socket", 0);  // a dead server's: we hold the lock, no live server owns it
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return system_error("creating a socket pair");
    UniqueFd ours(sv[0]), theirs(sv[1]);
    ProcessRequest serve;
    serve.argv = {s.spec->holder_program.empty() ? default_holder_program() : s.spec->holder_program,
                  "--serve-image",
                  s.spec->image_path,
                  std::to_string(s.id.inner_uid),
                  std::to_string(s.id.inner_gid),
                  std::to_string(s.spec->config.mount_idle_seconds),
                  s.spec->config.fuse_server,
                  std::to_string(s.spec->config.fuse_poll_us)};
    serve.argv.insert(serve.argv.end(), s.spec->image_layers.begin(), s.spec->image_layers.end());
    serve.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    // stdout/stderr /dev/null: a server outlives the `gantry run` that started it and must not keep
    // its caller's output open; its errors come back on the socket pair.
    serve.inputs = {{theirs.get(), 3}, {dir, 4}};
    pass_image_descriptors(serve, image_files(*s.spec));  // acquire_image's files, under their numbers
    serve.own_session = true;
    serve.daemonize = true;  // no child of the holder: a SIGKILLed container leaves it running
    auto started = start_process(serve);
    if (!started) return started.error().wrap("starting the image server for " + path);
    theirs.reset();
    timeval limit{30, 0};
    ::setsockopt(ours.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    std::string reply;
    char chunk[256];
    ssize_t n;
    while (reply.find('\n') == std::string::npos && reply.size() < 4096 &&
           ((n = ::recv(ours.get(), chunk, sizeof chunk, 0)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0) reply.append(chunk, static_cast<size_t>(n));
    if (reply == "ready\n") return {};
    if (starts_with(reply, "error ")) return make_error(trim(reply.substr(6)));
    return make_error("the image server for " + path + " exited without a report");
}

}  // namespace

Status attach_image_server(Setup& s) {
    // Runs as the user, in the host namespaces: every path below is the user's own.
    uid_t uid = ::geteuid();
    std::string base = servers_base(uid);
    std::string parent_path = base.substr(0, base.rfind('/'));
    UniqueFd parent(::open(parent_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent) return system_error("opening " + parent_path);
    auto top = open_own_dir(parent.get(), base.substr(base.rfind('/') + 1), base);
    if (!top) return top.error();
    auto key = server_key(s);
    if (!key) return key.error();
    std::string path = base + "/" + *key;
    auto dir = open_own_dir(top->get(), *key, path);
    if (!dir) return dir.error();
    UniqueFd mutex(::openat(dir->get(), "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!mutex) return system_error("opening " + path + "/lock");
    GANTRY_TRY(lock(mutex.get(), LOCK_EX, path + "/lock"));
    auto conn = connect_server(dir->get(), path);
    // Nobody listening (no socket yet, or a dead server's): start one. Anything else is an error.
    bool absent = !conn && (conn.error().errnum == ENOENT || conn.error().errnum == ECONNREFUSED);
    if (!conn && !absent) return conn.error();
    if (!conn) {
        GANTRY_TRY(start_server(s, dir->get(), path));
        conn = connect_server(dir->get(), path);
        if (!conn) return conn.error();
    }
    GANTRY_TRY(receive_image(conn->get(), s, path));
    // Who serves us, for a root creator that places the server in the job's cgroups and ends it with
    // the job (the plugin): the process that listens, a process of ours (connect_server checked).
    s.server_pid = peer_of(conn->get()).pid;
    s.server_start_time = s.server_pid > 0 ? process_start_time(s.server_pid) : 0;
    s.image_lease = std::move(*conn);
    return {};
}

Status enter_server_user_namespace(Setup& s) {
    // The server's user namespace is the user's own (they made it, through the server): joining it
    // gives this holder no right the user lacks.
    if (::setns(s.server_userns.get(), CLONE_NEWUSER) != 0)
        return system_error("joining the image server's user namespace");
    s.server_userns.reset();
    if (::unshare(namespace_flags(s.spec->unshare) & ~CLONE_NEWUSER) != 0)
        return system_error("creating the container namespaces");
    return {};
}

Status attach_served_image(Setup& s) {
    if (::move_mount(s.image_tree.get(), "", AT_FDCWD, s.image_dir.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
        return system_error("attaching the image server's mount of " + s.spec->image_path + " at " + s.image_dir);
    s.image_tree.reset();
    return {};
}

}  // namespace gantry::launcher

namespace gantry {

namespace {

// `ready` is closed (and set to -1) once the server listens: a later error has nobody to go to.
Status serve_image(const std::string& image, const std::vector<std::string>& layers, uid_t inner_uid, gid_t inner_gid,
                   int idle_seconds, const Config& config, int dir, int& ready) {
    using namespace launcher;
    ::umask(077);
    auto served = served_key(image, layers);
    if (!served) return served.error();
    // A layered image: a mount point per layer, and the empty bottom layer overlayfs needs (two lower
    // layers at least, no upper one).
    for (size_t i = 0; i < layers.size(); ++i)
        if (::mkdirat(dir, ("layer." + std::to_string(i)).c_str(), 0700) != 0 && errno != EEXIST)
            return system_error("creating a layer's mount point");
    if (!layers.empty() && ::mkdirat(dir, "empty", 0700) != 0 && errno != EEXIST)
        return system_error("creating the stack's empty layer");
    Identity id;
    id.uid = ::getuid();
    id.gid = ::getgid();
    id.inner_uid = inner_uid;
    id.inner_gid = inner_gid;
    if (::mkdirat(dir, "root", 0700) != 0 && errno != EEXIST) return system_error("creating the mount point");
    UniqueFd point(::openat(dir, "root", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!point) return system_error("opening the mount point");
    char where[PATH_MAX];
    ssize_t len = ::readlink(fd_path(point.get()).c_str(), where, sizeof where - 1);
    if (len <= 0) return system_error("finding the mount point");
    std::string target(where, static_cast<size_t>(len));
    struct stat before {};
    ::fstat(point.get(), &before);
    GANTRY_TRY(enter_user_namespace(id, {}, -1));
    GANTRY_TRY(make_mounts_private());
    // The kernel mounts only on a mount of our own (new) mount namespace: the descriptors we were
    // given name the old one's, so the mount point is looked up again by path, and must be the same
    // directory (the whole path is the user's own: nobody else can swap a component).
    struct stat after {};
    if (::stat(target.c_str(), &after) != 0 || after.st_dev != before.st_dev || after.st_ino != before.st_ino)
        return make_error("the mount point " + target + " moved while the image server started");
    std::vector<pid_t> daemons;
    // However we leave (below, or an error on the way): SIGKILL, as in the holder, since a daemon
    // (squashfuse_ll) that exits cleanly unmounts through the file system it no longer serves. The
    // mounts go with our mount namespace.
    Defer end_daemons([&] {
        for (pid_t d : daemons) ::kill(d, SIGKILL);
        for (pid_t d : daemons) ::waitpid(d, nullptr, 0);
    });
    if (layers.empty()) {
        auto daemon = serve_image_with_fuse(image, target, inner_uid, inner_gid, config);
        if (!daemon) return daemon.error();
        daemons.push_back(*daemon);
    } else {
        // Every layer's server (side by side), then the stack of them, named relative to the server's
        // directory: read-only, nosuid, nodev, `userxattr` (Linux >= 5.11, in a user namespace).
        const std::string base = target.substr(0, target.rfind('/'));
        std::vector<std::string> names, dirs;
        for (size_t i = 0; i < layers.size(); ++i) {
            names.push_back("layer." + std::to_string(i));
            dirs.push_back(base + "/" + names.back());
        }
        GANTRY_TRY(serve_layers_with_fuse(layers, dirs, inner_uid, inner_gid, config, daemons));
        GANTRY_TRY(stack_layers(base, names, target, image));
    }
    UniqueFd root(::open(target.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    UniqueFd userns(::open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC));
    std::vector<UniqueFd> watch;  // the daemons: any that dies leaves the mount (or the stack) of no use
    for (pid_t d : daemons) {
        watch.emplace_back(open_pidfd(d));
        if (!watch.back()) return system_error("watching the image server's daemons");
    }
    UniqueFd mutex(::openat(dir, "lock", O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!root || !userns || !mutex || !listener) return system_error("preparing the image server");
    sockaddr_un addr = socket_address(dir);
    if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener.get(), 64) != 0)
        return system_error("listening on the image server's socket");
    (void)!::write(ready, "ready\n", 6);
    ::close(ready);
    ready = -1;

    std::vector<UniqueFd> clients;
    time_t idle_since = ::time(nullptr);
    while (true) {
        std::vector<pollfd> polled = {{listener.get(), POLLIN, 0}};
        for (const auto& w : watch) polled.push_back({w.get(), POLLIN, 0});
        const size_t first_client = polled.size();
        for (const auto& c : clients) polled.push_back({c.get(), POLLIN, 0});
        int timeout = -1;
        // Idle, look again every 2 s whether the image file is still the one we serve.
        if (clients.empty())
            timeout = static_cast<int>(
                          std::min<time_t>(2, std::max<time_t>(0, idle_since + idle_seconds - ::time(nullptr)))) *
                      1000;
        if (::poll(polled.data(), polled.size(), timeout) < 0 && errno != EINTR) break;
        bool was_used = !clients.empty();
        // A daemon died: the mount is of no use any more.
        if (std::any_of(polled.begin() + 1, polled.begin() + static_cast<long>(first_client),
                        [](const pollfd& p) { return p.revents != 0; }))
            break;
        for (size_t i = polled.size(); i-- > first_client;) {
            if (polled[i].revents == 0) continue;
            char b;
            if (::recv(clients[i - first_client].get(), &b, 1, MSG_DONTWAIT) <= 0)
                clients.erase(clients.begin() + static_cast<long>(i - first_client));
        }
        if (polled[0].revents != 0) {
            UniqueFd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
            // The peer's uid as our namespace sees it: ours only (another user's shows as unmapped).
            if (c && peer_uid(c.get()) == ::getuid()) {
                UniqueFd clone(
                    static_cast<int>(::open_tree(root.get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH)));
                char byte = 'k';
                iovec iov{&byte, 1};
                alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
                msghdr msg{};
                msg.msg_iov = &iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control;
                msg.msg_controllen = sizeof control;
                cmsghdr* cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
                int fds[2] = {userns.get(), clone.get()};
                std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
                if (clone && ::sendmsg(c.get(), &msg, MSG_NOSIGNAL) == 1) clients.push_back(std::move(c));
            }
        }
        if (!clients.empty()) continue;
        if (was_used) idle_since = ::time(nullptr);  // the last container just left: the clock starts
        // An image deleted (gantry rm, a test's clean-up) or rebuilt since we started can never be asked
        // for again under our key: leave at once instead of after the idle time.
        auto current = served_key(image, layers);
        bool stale = !current || *current != *served;
        if (!stale && ::time(nullptr) < idle_since + idle_seconds) continue;
        // Idle long enough. Leave only under the lock: a holder looking for us holds it from before
        // it connects until it has our answer, so nobody is left connecting to a server that exits.
        if (::flock(mutex.get(), LOCK_EX | LOCK_NB) != 0) continue;
        pollfd pending{listener.get(), POLLIN, 0};
        if (::poll(&pending, 1, 0) > 0) {
            ::flock(mutex.get(), LOCK_UN);
            continue;
        }
        ::unlinkat(dir, "socket", 0);
        break;
    }
    return {};  // the daemons end (end_daemons)
}

}  // namespace

int run_image_server(const std::string& image, const std::string& inner_uid, const std::string& inner_gid,
                     const std::string& idle_seconds, const std::string& fuse_server, const std::string& poll_us,
                     const std::vector<std::string>& layers) {
    int ready = 3;
    constexpr int dir = 4;
    if (::fcntl(ready, F_SETFD, FD_CLOEXEC) != 0 || ::fcntl(dir, F_SETFD, FD_CLOEXEC) != 0) {
        std::fputs("gantry: gantry-holder --serve-image is started by gantry, not by hand\n", stderr);
        return 2;
    }
    auto number = [](const std::string& text) { return std::strtol(text.c_str(), nullptr, 10); };
    Config config;
    config.fuse_server = fuse_server == "squashfuse_ll" ? "squashfuse_ll" : "gantry";
    config.fuse_poll_us = static_cast<int>(std::clamp<long>(number(poll_us), 0, 1000000));
    auto st = serve_image(image, layers, static_cast<uid_t>(number(inner_uid)), static_cast<gid_t>(number(inner_gid)),
                          static_cast<int>(number(idle_seconds)), config, dir, ready);
    if (!st && ready >= 0) {
        std::string line = "error " + st.error().message + "\n";
        (void)!::write(ready, line.data(), line.size());
    }
    return st ? 0 : 1;
}

}  // namespace gantry
