// The holder: the gantry-holder program that Container::create execs. It reads its set-up from the
// creator's socket (descriptor 3), builds the container (the launch sequence, set_up_container),
// reports ready or failed (launcher::HolderReply, one JSON line), then keeps the namespaces alive until SIGTERM (or
// its creator's death when attached), reaping the fuse daemon.
//
// A fresh exec, not a fork of the creator: in the plugin the creator is root's multi-threaded
// slurmstepd, whose memory, descriptors and environment a fork would carry into a process that ends
// up as the job user's. Exec'd as root, the holder stays non-dumpable after it switches to the user,
// and its memory belongs to the initial user namespace: the user can neither ptrace it nor open its
// /proc/PID/fd, environ or mem, even once inside the user namespace it owns (docs/admin.md).
#include <fcntl.h>
#include <limits.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "gantry/environment.hpp"
#include "gantry/trace.hpp"
#include "holder_reply.hpp"
#include "internal.hpp"

#ifndef GANTRY_HOLDER_INSTALL_PATH
#define GANTRY_HOLDER_INSTALL_PATH "/usr/libexec/gantry/gantry-holder"
#endif

namespace gantry {

using launcher::Setup;

std::string default_holder_program() {
    return program_of_this_tree("gantry-holder", GANTRY_HOLDER_INSTALL_PATH);
}

namespace launcher {

namespace {

// The fuse backend's image comes from the user's shared image server (image_server.cpp) when
// gantry.conf's fuse_shared allows it: for a holder acting for itself, one server per cgroup; for a
// holder root started for a job user (the plugin), only where the creator named a scope (its job on
// this node), since a server outside the step must be placed in the job and ended with it by root.
// Such a holder then joins the server's user namespace, which the user made (as the one root
// writes maps for is the user's), and stays non-dumpable itself. A server that cannot be used is
// said on stderr (/dev/null for root's holders), and the container gets a daemon of its own.
void share_fuse_image(Setup& s) {
    if (!s.spec->config.fuse_shared || (s.creator_writes_maps && s.spec->fuse_server_scope.empty())) return;
    // The admin's word on /dev/fuse holds for every container, even where a live server could serve
    // it without opening the device again: without access, mount_image_fuse says why.
    if (!fuse_accessible(s.spec->config)) return;
    auto st = attach_image_server(s);
    if (st) return;
    s.image_lease.reset();
    s.server_userns.reset();
    s.image_tree.reset();
    std::string line = "gantry: warning: " + st.error().message + "; serving the image to this container alone\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace

// The launch sequence, run by the holder. Each step is one verb; see rootfs.cpp for the mounts. Each
// is a trace phase (include/gantry/trace.hpp) named by its call, for bench/srun.sh --breakdown.
#define TRACED(call)                 \
    do {                             \
        trace::Phase traced_(#call); \
        GANTRY_TRY(call);            \
    } while (0)
Status set_up_container(Setup& s) {
    const ContainerSpec& spec = *s.spec;
    if (s.backend == MountBackend::kernel) TRACED(mount_image_kernel(s));  // privileged: see privileged.cpp
    TRACED(switch_to_user(s.id.uid, s.id.gid));
    if (s.backend == MountBackend::extract) TRACED(extract_image(s));
    // image_server.cpp (a layered image: a server of its whole stack); else daemons of our own
    if (s.backend == MountBackend::fuse) {
        trace::Phase p("share_fuse_image");
        share_fuse_image(s);
    }
    if (s.image_tree)
        TRACED(enter_server_user_namespace(s));
    else
        TRACED(enter_user_namespace(s.id, spec.unshare, s.creator_writes_maps ? s.channel : -1));
    if (spec.unshare.net) TRACED(bring_up_loopback());
    TRACED(make_mounts_private());
    TRACED(mount_staging_area(s));
    if (s.backend == MountBackend::fuse) TRACED(s.image_tree ? attach_served_image(s) : mount_image_fuse(s));
    if (s.backend == MountBackend::extract) TRACED(bind_extracted_image(s));
    TRACED(prepare_writable_layer(s));
    TRACED(write_identity_files(s));
    TRACED(mount_container_root(s));
    TRACED(mount_proc_and_sys(s));
    TRACED(mount_sysfs_views(s));
    TRACED(set_up_dev(s));
    TRACED(add_device_nodes(s));
    TRACED(mount_tmp_and_run(s));
    TRACED(bind_host_network_files(s));
    TRACED(mount_home(s));
    TRACED(mount_driver_files(s));
    TRACED(perform_user_mounts(s));
    TRACED(check_workdir(s));
    TRACED(pivot_into_root(s));
    TRACED(update_ld_cache(s));
    TRACED(finish_root_flags(s));
    return {};
}
#undef TRACED

}  // namespace launcher

namespace {

void send_reply(int fd, const launcher::HolderReply& reply) {
    std::string line = launcher::holder_reply_to_line(reply);
    (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
}

// Before the set-up, a holder that acquires its image (--acquire-and-hold) speaks the --acquire
// helper's protocol (receive_acquired_image: text, "error MESSAGE"), not HolderReply.
void send_acquire_error(int fd, const std::string& message) {
    std::string line = "error " + message + "\n";
    (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
}

void send_failure(int fd, const std::string& message) {
    launcher::HolderReply failed;
    failed.kind = launcher::HolderReply::Kind::failed;
    failed.message = message;
    send_reply(fd, failed);
}

[[noreturn]] void holder_main(Setup& s, int channel, pid_t parent) {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGQUIT}) {
        sigaddset(&set, sig);
        ::signal(sig, SIG_DFL);  // an ignored disposition survives exec; we wait for these
    }
    ::sigprocmask(SIG_SETMASK, &set, nullptr);
    auto watch_parent = [&] {
        if (s.spec->detach) return;
        ::prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);  // reset by every credential change: set again
        if (::getppid() != parent) ::kill(::getpid(), SIGTERM);
    };
    watch_parent();
    // Descriptors: the exec (start_process) left only stdio, the channel and the image's acquired files
    // (acquire_image; the spec names them /proc/self/fd/N); stdout/stderr are the caller's only for an
    // attached holder of an ordinary user (see Container::create).
    auto st = launcher::set_up_container(s);
    watch_parent();
    // The image is mounted or served now, and its servers hold their own copies: the holder, which
    // the user's processes later join, keeps no descriptor of the store's files (a private_images
    // file opened for root's loop device must not stay reachable through the holder).
    for (const auto& file : launcher::image_files(*s.spec))
        if (int fd = descriptor_of_path(file); fd > STDERR_FILENO && fd != channel) ::close(fd);
    if (!st) {
        send_failure(channel, st.error().message);
        if (s.fuse_daemon > 0) ::kill(s.fuse_daemon, SIGKILL);
        for (pid_t d : s.layer_daemons) ::kill(d, SIGKILL);
        if (s.scratch_dir) launcher::remove_tree(s.scratch_dir.get(), s.scratch_name);
        if (s.rw_scratch_dir) launcher::remove_tree(s.rw_scratch_dir.get(), s.rw_scratch_name);
        ::_exit(1);
    }
    // Our pid and the server's are numbers of our pid namespace, named with it: the creator may see
    // another one (a job's namespace under Slurm's namespace/linux), and so may whoever later reads the
    // state it records (the job epilog).
    launcher::HolderReply ready;
    ready.kind = launcher::HolderReply::Kind::ready;
    ready.pid = ::getpid();
    ready.start_time = launcher::process_start_time(::getpid());
    ready.pid_namespace = launcher::own_pid_namespace();
    if (s.server_pid > 0) {
        ready.server_pid = s.server_pid;
        ready.server_start_time = s.server_start_time;
    }
    send_reply(channel, ready);
    ::close(channel);
    while (true) {
        siginfo_t info{};
        if (::sigwaitinfo(&set, &info) < 0) continue;
        if (info.si_signo != SIGCHLD) break;
        bool daemon_gone = false;
        pid_t p;
        while ((p = ::waitpid(-1, nullptr, WNOHANG)) > 0) {
            auto reaped = [&](pid_t& d) {
                if (d <= 0 || p != d) return;
                d = -1;  // reaped: never signalled again
                daemon_gone = true;
            };
            reaped(s.fuse_daemon);
            for (pid_t& d : s.layer_daemons) reaped(d);
        }
        if (daemon_gone) break;  // (a layer of) the image is gone: the container is of no use any more
    }
    for (pid_t d : s.layer_daemons)
        if (d > 0) {
            ::kill(d, SIGKILL);  // as the whole image's daemon below
            ::waitpid(d, nullptr, 0);
        }
    if (s.fuse_daemon > 0) {
        // SIGKILL, not SIGTERM: a squashfuse_ll that exits cleanly unmounts its image itself, and with
        // libfuse 3.17 (Debian 13's squashfuse 0.5) that unmount looks the mount point up through the
        // file system it no longer serves and blocks for good, and so does the holder waiting for it
        // (integration.slurm2411). A read-only image has nothing to flush; killed, the daemon's
        // /dev/fuse connection closes and the mounts go with this mount namespace.
        ::kill(s.fuse_daemon, SIGKILL);
        ::waitpid(s.fuse_daemon, nullptr, 0);
    }
    if (s.scratch_dir) launcher::remove_tree(s.scratch_dir.get(), s.scratch_name);
    if (s.rw_scratch_dir) launcher::remove_tree(s.rw_scratch_dir.get(), s.rw_scratch_name);
    ::_exit(0);
}

// Reads "<size>\n<document>" from the creator.
Result<std::string> read_request(int channel) {
    std::string header;
    char c = 0;
    while (header.size() < 16) {
        ssize_t n = ::recv(channel, &c, 1, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return make_error("the creator closed the channel before sending the set-up");
        if (c == '\n') break;
        header.push_back(c);
    }
    char* end = nullptr;
    unsigned long long size = std::strtoull(header.c_str(), &end, 10);
    if (header.empty() || *end != '\0' || c != '\n' || size > kMaxContainerSpecBytes)
        return make_error("bad set-up header from the creator");
    std::string doc(size, '\0');
    size_t got = 0;
    while (got < size) {
        ssize_t n = ::recv(channel, doc.data() + got, size - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return make_error("the creator closed the channel in the middle of the set-up");
        got += static_cast<size_t>(n);
    }
    return doc;
}

// Moves the image's files this holder acquired itself to the descriptor numbers the creator's spec
// names them by (its image_layers bottom first, else its image_path): the same files in the same order,
// or an error. Every target is one of the acquired range (kFirstImageDescriptor up), so nothing of
// ours is there but the acquired files themselves, which first move above every target.
Status place_acquired_files(AcquiredImage& acquired, const ContainerSpec& spec, int channel) {
    const std::vector<std::string> named =
        spec.image_layers.empty() ? std::vector<std::string>{spec.image_path} : spec.image_layers;
    if (named.size() != acquired.files.size() || acquired.layered == spec.image_layers.empty())
        return make_error("the set-up names another image than the one this holder acquired");
    std::vector<int> targets;
    int above = kFirstImageDescriptor;
    for (const auto& path : named) {
        const int n = descriptor_of_path(path);
        if (n < kFirstImageDescriptor || n == channel)
            return make_error("the set-up names " + path + ", not an acquired image descriptor");
        targets.push_back(n);
        above = std::max(above, n + 1);
    }
    for (const auto& f : acquired.files) above = std::max(above, f.get() + 1);
    std::vector<UniqueFd> moved;
    for (auto& f : acquired.files) {
        UniqueFd high(::fcntl(f.get(), F_DUPFD_CLOEXEC, above));
        if (!high) return system_error("placing the image's descriptors");
        f.reset();
        moved.push_back(std::move(high));
    }
    acquired.files.clear();
    for (size_t i = 0; i < moved.size(); ++i) {
        if (::dup3(moved[i].get(), targets[i], O_CLOEXEC) < 0) return system_error("placing the image's descriptors");
        acquired.files.emplace_back(targets[i]);
    }
    return {};
}

}  // namespace

[[noreturn]] void run_container_holder(int channel, const HolderAcquisition* acquisition) {
    ::fcntl(channel, F_SETFD, FD_CLOEXEC);  // the fuse daemon and ldconfig must not inherit it
    // The creator's trace descriptor (start_holder, only when it traces): kept from exec'd programs too.
    // (GANTRY_TRACE_FD, launcher::kTraceFdVariable: read in environment.cpp with the rest.)
    if (const auto& fd = environment().gantry_trace_fd; fd.set && std::atoi(fd.value.c_str()) == launcher::kTraceFd &&
                                                        ::fcntl(launcher::kTraceFd, F_SETFD, FD_CLOEXEC) == 0)
        trace::enable(launcher::kTraceFd);
    trace::point("holder main");
    AcquiredImage acquired;
    if (acquisition != nullptr) {
        trace::Phase phase("acquire_in_holder");
        const pid_t creator = ::getppid();
        // The job user, for good, before the user's store is touched: the image is opened with that
        // user's rights only, exactly as the --acquire helper opens it (uid and primary gid, the
        // identity set_up_container switches to anyway; nothing privileged is left for a container of
        // such a store's image, which is never kernel-mounted). Exec'd as root, the holder stays
        // non-dumpable through the switch: the user can neither ptrace it nor read its /proc files.
        auto st = launcher::switch_to_user(acquisition->uid, acquisition->gid);
        if (!st) {
            send_acquire_error(channel, "gantry-holder: " + st.error().message);
            ::_exit(1);
        }
        // The switch reset the parent-death signal: a holder whose creator is gone has no set-up coming.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if (::getppid() != creator) ::_exit(1);
        if (send_acquired_image(channel, acquisition->store_root, acquisition->digest, acquisition->resolved_tag,
                                &acquired) != 0)
            ::_exit(1);
        acquired.in_use.reset();  // as the helper: no lease in a store the user collects
    }
    auto doc = read_request(channel);
    auto rq = doc ? launcher::holder_request_from_json(*doc) : Result<launcher::HolderRequest>(doc.error());
    if (rq && acquisition != nullptr) {
        // Our own copies of the files we sent go under the numbers the spec names (the creator's
        // copies of the same open files): every step below and the image server use those names.
        auto placed = place_acquired_files(acquired, rq->spec, channel);
        if (!placed) rq = placed.error();
    }
    if (!rq) {
        send_failure(channel, "gantry-holder: " + rq.error().message);
        ::_exit(1);
    }
    // The image's files were passed without close-on-exec; nothing but the programs we start on
    // purpose (pass_image_descriptors) may inherit them.
    for (const auto& file : launcher::image_files(rq->spec))
        if (int fd = descriptor_of_path(file); fd > STDERR_FILENO && fd != channel) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    Setup s;
    s.spec = &rq->spec;
    s.id = rq->id;
    s.backend = rq->backend;
    s.staging = rq->staging;
    s.image_dir = rq->image_dir;
    s.workdir = rq->workdir;
    s.home = rq->home;
    s.channel = channel;
    s.creator_writes_maps = rq->creator_writes_maps;
    holder_main(s, channel, rq->parent);
}

}  // namespace gantry
