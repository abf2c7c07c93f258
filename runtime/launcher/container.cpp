// Container lifecycle: create (the launch sequence, run by the holder process), the holder's wait
// loop, state files for named containers, open and stop.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"
#include "gantry/trace.hpp"
#include "gantry/workdir.hpp"
#include "holder_reply.hpp"
#include "internal.hpp"

namespace gantry {

using launcher::Setup;

Result<MountBackend> parse_mount_backend(std::string_view name) {
    if (name == "auto") return MountBackend::auto_;
    if (name == "kernel") return MountBackend::kernel;
    if (name == "fuse") return MountBackend::fuse;
    if (name == "extract") return MountBackend::extract;
    return make_error("unknown mount backend '" + std::string(name) + "' (valid: auto, kernel, fuse, extract)");
}

const char* to_string(MountBackend b) {
    switch (b) {
        case MountBackend::kernel:
            return "kernel";
        case MountBackend::fuse:
            return "fuse";
        case MountBackend::extract:
            return "extract";
        case MountBackend::auto_:
            break;
    }
    return "auto";
}

Result<ExtraNamespaces> parse_unshare(std::string_view list) {
    ExtraNamespaces ns;
    for (const auto& n : split_list(list, ',')) {
        if (n == "net")
            ns.net = true;
        else if (n == "ipc")
            ns.ipc = true;
        else if (n == "uts")
            ns.uts = true;
        else
            return make_error("unknown namespace '" + n + "' (valid: net, ipc, uts)");
    }
    return ns;
}

std::string runtime_dir(const Config& config) {
    if (::geteuid() == 0) return config.runtime_path;
    const std::string& xdg = environment().xdg_runtime_dir.value;
    if (!xdg.empty() && xdg[0] == '/' && ::access(xdg.c_str(), W_OK) == 0) return xdg + "/gantry";
    return "/tmp/gantry-" + std::to_string(::geteuid());
}

namespace launcher {

Status ensure_own_dir(const std::string& dir, mode_t mode, bool closed, const std::string& what) {
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) return system_error("creating " + what + " " + dir);
    struct stat st {};
    // In a shared /tmp somebody else could have made the directory first: it must be ours.
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        (closed && (st.st_mode & 022) != 0))
        return make_error(what + " " + dir + " is not a directory owned by uid " + std::to_string(::geteuid()) +
                          (closed ? " that only it can write" : ""));
    return {};
}

}  // namespace launcher

namespace {

Status ensure_private_dir(const std::string& dir) {
    return launcher::ensure_own_dir(dir, ::geteuid() == 0 ? 0755 : 0700, false, "runtime directory");
}

bool valid_name(const std::string& n) {
    if (n.empty() || n.size() > 200 || n[0] == '.') return false;
    for (char c : n)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return true;
}

std::string state_path(const Config& config, const std::string& name) {
    return runtime_dir(config) + "/containers/" + name + ".json";
}

Status write_state(const std::string& path, const ContainerState& st) {
    nlohmann::json j = {
        {"name", st.name},
        {"holder_pid", st.holder_pid},
        {"holder_start_time", st.holder_start_time},
        {"pid_namespace", st.pid_namespace},
        {"uid", st.uid},
        {"unshare", {{"net", st.unshare.net}, {"ipc", st.unshare.ipc}, {"uts", st.unshare.uts}}},
        {"backend", st.backend},
        {"image_env", st.defaults.image_env},
        {"device_env", st.defaults.device_env},
        {"env_names", st.defaults.env_names},
        {"env_values", st.defaults.env_values},
        {"workdir", st.defaults.workdir},
        {"image_workdir", st.defaults.image_workdir},
        {"home", st.defaults.home},
        {"remap_root", st.defaults.remap_root},
    };
    // A name of this process's own: where emulated nodes share one runtime_path (the test harness),
    // two slurmstepds publish the same step's state at once, and a shared ".tmp" was renamed away
    // under the second (ENOENT).
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        std::ofstream f(tmp);
        f << j.dump(2) << "\n";
        if (!f) return system_error("writing container state " + tmp);
    }
    ::chmod(tmp.c_str(), 0644);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return system_error("publishing container state " + path);
    return {};
}

Result<ContainerState> read_state(const std::string& path) {
    std::ifstream f(path);
    if (!f) return system_error("reading container state " + path);
    try {
        auto j = nlohmann::json::parse(f);
        ContainerState st;
        st.name = j.at("name").get<std::string>();
        st.holder_pid = j.at("holder_pid").get<pid_t>();
        st.holder_start_time = j.at("holder_start_time").get<unsigned long long>();
        st.pid_namespace = j.value("pid_namespace", 0ULL);  // 0: a state written before it was kept
        st.uid = j.at("uid").get<uid_t>();
        st.unshare.net = j.at("unshare").at("net").get<bool>();
        st.unshare.ipc = j.at("unshare").at("ipc").get<bool>();
        st.unshare.uts = j.at("unshare").at("uts").get<bool>();
        st.backend = j.at("backend").get<std::string>();
        st.defaults.image_env = j.at("image_env").get<std::vector<std::string>>();
        st.defaults.device_env = j.value("device_env", std::vector<std::string>{});
        st.defaults.env_names = j.at("env_names").get<std::vector<std::string>>();
        st.defaults.env_values = j.value("env_values", std::vector<std::string>{});
        st.defaults.workdir = j.at("workdir").get<std::string>();
        st.defaults.image_workdir = j.value("image_workdir", st.defaults.workdir);
        st.defaults.home = j.at("home").get<std::string>();
        st.defaults.remap_root = j.at("remap_root").get<bool>();
        return st;
    } catch (const std::exception& e) {
        return make_error("reading container state " + path + ": " + e.what());
    }
}

Status resolve_identity(const ContainerSpec& spec, launcher::Identity& id) {
    id.uid = spec.uid == static_cast<uid_t>(-1) ? ::getuid() : spec.uid;
    id.gid = spec.gid == static_cast<gid_t>(-1) ? ::getgid() : spec.gid;
    if (::getuid() != 0 && (id.uid != ::getuid() || id.gid != ::getgid()))
        return make_error("only root may start a container for another user");
    id.inner_uid = spec.remap_root ? 0 : id.uid;
    id.inner_gid = spec.remap_root ? 0 : id.gid;
    if (struct passwd* pw = ::getpwuid(id.uid)) {
        id.name = pw->pw_name;
        id.home = pw->pw_dir;
    } else {
        id.name = "user" + std::to_string(id.uid);
    }
    if (struct group* gr = ::getgrgid(id.gid))
        id.group_name = gr->gr_name;
    else
        id.group_name = id.name;
    // With remap_root too: the user's own names go with their own ids into the container's passwd and
    // group files (write_identity_files), beside root's.
    return {};
}

}  // namespace

namespace launcher {
Status check_paths_here(const ContainerSpec& spec) {
    // No image path: an acquired store image, checked on its descriptors when acquired (check_user_paths).
    if (!spec.image_path.empty()) GANTRY_TRY(check_squashfs(spec.image_path));
    // Every layer of a layered image like the top one: a FIFO or a file on a stalled mount below it
    // must fail here, in the user's helper, not in root's mount later (issue #34).
    for (const auto& layer : spec.image_layers) GANTRY_TRY(check_squashfs(layer));
    return check_mount_sources(spec.mounts);
}
}  // namespace launcher

int check_container_paths(int fd) {
    std::string text;
    char chunk[65536];
    ssize_t n;
    while ((n = ::read(fd, chunk, sizeof chunk)) > 0 || (n < 0 && errno == EINTR)) {
        if (n > 0) text.append(chunk, static_cast<size_t>(n));
        if (text.size() > kMaxContainerSpecBytes) break;  // container_spec_from_json refuses it
    }
    auto spec = container_spec_from_json(text);
    Status st = spec ? launcher::check_paths_here(*spec) : Status(spec.error());
    if (st) return 0;
    std::fprintf(stderr, "%s\n", st.error().message.c_str());
    return 1;
}

namespace {

// The image file and the bind sources the user named, checked with the user's own rights. Root (the
// plugin in slurmstepd) must not open or stat them itself: that would read files the user may not
// read, and its different answers ("not a squashfs file" / "No such file or directory") would tell the
// user about files they cannot see.
Status check_user_paths(const ContainerSpec& spec, const launcher::Identity& id) {
    if (::geteuid() != 0 || id.uid == 0) return launcher::check_paths_here(spec);
    // Nothing the user named: a store image's descriptors were checked when acquired (by root in a
    // trusted store; as the user, by the user's own helper, in any other), and there is no bind
    // source. The helper would only repeat that check on the same descriptors with the same rights:
    // no process for it (a warm step's start, docs/runtime.md "Where a warm step's time goes").
    if (spec.image_acquired && spec.mounts.empty()) return {};
    // Root for a job user: `gantry-holder --check-paths` runs as the user (groups, gid, uid: verified
    // before exec) on the spec, handed over in a memfd as its stdin; only its exit status and
    // first stderr line come back. A fresh exec: nothing of slurmstepd's runs in the child.
    // A store image's descriptors are not the helper's to check (see above), nor to hold: in a
    // private_images store they are owner-only files the user may not read (reopening
    // /proc/self/fd/N as the user fails), and the user must not get a descriptor of one. The helper
    // gets the bind sources alone.
    ContainerSpec sources_only;
    const ContainerSpec* asked = &spec;
    if (spec.image_acquired) {
        sources_only = spec;
        sources_only.image_path.clear();
        sources_only.image_layers.clear();
        asked = &sources_only;
    }
    UniqueFd doc(::memfd_create("gantry-spec", MFD_CLOEXEC));
    if (!doc) return system_error("checking the image " + spec.image_path);
    std::string text = container_spec_to_json(*asked);
    if (::write(doc.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::lseek(doc.get(), 0, SEEK_SET) != 0)
        return system_error("checking the image " + spec.image_path);
    ProcessRequest r;
    r.argv = {spec.holder_program.empty() ? default_holder_program() : spec.holder_program, "--check-paths"};
    r.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    r.identity = user_identity(id.uid, id.gid);
    r.inputs = {{doc.get(), 0}};
    if (!spec.image_acquired) pass_image_descriptors(r, launcher::image_files(spec));  // none: a user's file is a path
    r.stdout_cap = 4096;
    r.stderr_cap = 16 << 10;
    // The paths may lie on a file system the user stalls (a SIGSTOPped FUSE server): a deadline and
    // the step's stop request end the helper, which is killed and reaped by pidfd.
    r.timeout = std::chrono::seconds(spec.config.check_timeout_seconds);
    r.should_stop = spec.should_stop;
    auto ran = spawn(r);
    if (!ran) return ran.error().wrap("checking the image " + spec.image_path + " as uid " + std::to_string(id.uid));
    if (std::string why = stop_reason(r, *ran, "check_timeout_seconds"); !why.empty())
        return make_error("checking the image " + spec.image_path + " and the mount sources as uid " +
                          std::to_string(id.uid) + ": " + why);
    if (ran->status == 0) return {};
    std::string why = trim(ran->err);
    if (why.empty())
        return make_error("checking the image " + spec.image_path + " as uid " + std::to_string(id.uid) + " failed (" +
                          r.argv[0] + " exited with status " + std::to_string(ran->status) + ")");
    return make_error(why.substr(0, why.find('\n')));
}

// How the gantry-holder program is started: the creator's socket as its descriptor 3, and the trace
// descriptor when tracing (bench/srun.sh --breakdown: the holder appends its phases to our trace file).
ProcessRequest holder_process(const std::string& program, bool root_for_user, int channel) {
    ProcessRequest run;
    run.argv = {program};
    // Root's holder finds its helpers (squashfuse_ll, unsquashfs) in the system directories only.
    const EnvironmentVariable& path = environment().path;
    run.env = {std::string("PATH=") + (root_for_user || !path.set
                                           ? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                                           : path.value)};
    run.inputs = {{channel, 3}};
    if (trace::descriptor() >= 0) {
        run.inputs.push_back({trace::descriptor(), launcher::kTraceFd});
        run.env.push_back(std::string(launcher::kTraceFdVariable) + "=" + std::to_string(launcher::kTraceFd));
    }
    run.own_session = true;  // out of the terminal's process group: Ctrl-C is for the command, not the holder
    return run;
}

// Execs the gantry-holder program with the set-up on a socket (its descriptor 3), answers its request
// for id maps when root starts it for a user, and returns its last report (launcher::HolderReply, ready;
// failed becomes the error). The holder gets no descriptor of ours but that socket, and stdout/stderr
// only when an ordinary user starts an attached one (a detached holder must not keep the caller's output open;
// root's output may be slurmd's log): its errors come back through the socket.
// A holder already started for the spec (ContainerSpec::started_holder, start_holder_acquiring) gets
// the set-up instead: it holds the image's files already, under its own numbers.
Result<launcher::HolderReply> start_holder(const ContainerSpec& spec, const Setup& s) {
    bool root_for_user = ::geteuid() == 0 && s.id.uid != 0;
    launcher::HolderRequest rq{spec,      s.id,   s.backend,  s.staging,    s.image_dir,
                               s.workdir, s.home, ::getpid(), root_for_user};
    if (rq.spec.holder_program.empty()) rq.spec.holder_program = default_holder_program();
    std::string doc = launcher::holder_request_to_json(rq);
    if (doc.size() > kMaxContainerSpecBytes)
        return make_error("the container's description is too large (" + std::to_string(doc.size()) + " bytes)");
    UniqueFd ours;
    pid_t child = -1;      // 0 when detached: the holder is no child of ours
    UniqueFd child_fd;     // our child by pidfd
    UniqueFd detached_fd;  // a detached holder's pidfd (start_process takes it before its pid can be reused)
    const std::shared_ptr<StartedHolder>& waiting = spec.started_holder;
    if (waiting && waiting->pid > 0 && waiting->channel && root_for_user && !spec.detach) {
        // Its socket has had SO_PASSCRED since before it started (start_holder_acquiring), as below.
        child = std::exchange(waiting->pid, -1);
        child_fd = std::move(waiting->pidfd);
        ours = std::move(waiting->channel);
    } else {
        int sv[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
            return system_error("creating the holder's socket");
        ours = UniqueFd(sv[0]);
        UniqueFd theirs(sv[1]);
        ProcessRequest run = holder_process(rq.spec.holder_program, root_for_user, theirs.get());
        // The image's acquired files (acquire_image): the holder, its FUSE server or the loop device use
        // these descriptors, never the store's names, which another user may have renamed over by now.
        pass_image_descriptors(run, launcher::image_files(spec));
        if (!spec.detach && !root_for_user)
            run.inputs.insert(run.inputs.end(), {{STDOUT_FILENO, STDOUT_FILENO}, {STDERR_FILENO, STDERR_FILENO}});
        run.daemonize = spec.detach;
        // The kernel tells us who sent each message (SO_PASSCRED, set before the holder can say
        // anything): a "userns PID" request is believed only from PID itself, so a detached holder
        // (no child of ours) cannot name another process.
        int one = 1;
        if (root_for_user && ::setsockopt(ours.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0)
            return system_error("setting up the container holder's socket");
        auto started = start_process(run, &detached_fd);
        if (!started) return started.error().wrap("starting the container holder " + run.argv[0]);
        child = *started;
        theirs.reset();
        // Our child by pidfd (its pid cannot be reused before we reap it, so this names it): killed and
        // reaped through it below, within a bound even if the kernel holds it (a stalled FUSE mount).
        child_fd = UniqueFd(child > 0 ? launcher::open_pidfd(child) : -1);
    }
    auto kill_child = [&] {
        // Safe: `child` is our unreaped child (pidfd or not, the pid names it); a detached holder is
        // signalled only through the pidfd taken while it was the intermediate's unreaped child.
        if (child > 0 && (!child_fd || launcher::signal_pidfd(child_fd.get(), SIGKILL) != 0)) ::kill(child, SIGKILL);
        if (child == 0 && detached_fd) (void)launcher::signal_pidfd(detached_fd.get(), SIGKILL);
    };
    // Every way out but success (child = -1 then) ends the holder: killed, then reaped (ours), or
    // waited for until it has ended (a detached one: its new parent reaps it).
    Defer reap([&] {
        if (child < 0) return;
        kill_child();
        const UniqueFd& fd = child > 0 ? child_fd : detached_fd;
        struct pollfd p {
            fd.get(), POLLIN, 0
        };
        if (fd && ::poll(&p, 1, 5000) == 0) {
            log::warning("the container holder did not end within 5 s of SIGKILL");
            return;
        }
        if (child > 0) ::waitpid(child, nullptr, 0);
    });
    // Sending the set-up waits at most setup_timeout_seconds too (a holder that does not read).
    timeval send_limit{spec.config.setup_timeout_seconds, 0};
    (void)::setsockopt(ours.get(), SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
    std::string out = std::to_string(doc.size()) + "\n" + doc;
    for (size_t sent = 0; sent < out.size();) {
        ssize_t n = ::send(ours.get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // the holder is gone: its exit shows below as a missing report
        sent += static_cast<size_t>(n);
    }
    // The set-up mounts the user's image and bind sources, which may lie on a file system the user
    // stalls: root waits at most setup_timeout_seconds, and not past the step's stop request.
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::seconds(spec.config.setup_timeout_seconds);
    std::string reply, gave_up;
    char chunk[512];
    while (true) {
        if (spec.should_stop && spec.should_stop()) {
            gave_up = "the step is being stopped";
            break;
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            gave_up =
                "no answer within " + std::to_string(spec.config.setup_timeout_seconds) +
                " s (setup_timeout_seconds in gantry.conf; is the image or a mount source on a stalled file system?)";
            break;
        }
        struct pollfd p {
            ours.get(), POLLIN, 0
        };
        int ready = ::poll(&p, 1, static_cast<int>(spec.should_stop ? std::min<long long>(left, 200) : left));
        if (ready <= 0) continue;  // EINTR or time to look at the stop request and the deadline
        union {
            cmsghdr align;
            char buf[CMSG_SPACE(sizeof(ucred))];
        } control{};
        iovec iov{chunk, sizeof chunk};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        ssize_t n = ::recvmsg(ours.get(), &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        pid_t sender = -1;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
                ucred cred{};
                std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
                sender = cred.pid;
            }
        reply.append(chunk, static_cast<size_t>(n));
        if (reply.size() > launcher::kMaxHolderReplyBytes) break;
        // The holder made its user namespace: as root, write its maps (write_id_maps says why that is
        // safe) and let it go on; it is still waiting on the socket.
        auto nl = reply.find('\n');
        auto asked = root_for_user && nl != std::string::npos
                         ? launcher::holder_reply_from_line(std::string_view(reply).substr(0, nl))
                         : Result<launcher::HolderReply>(make_error("no request"));
        if (asked && asked->kind == launcher::HolderReply::Kind::userns) {
            pid_t holder = asked->pid;
            reply.erase(0, nl + 1);
            // Only our own holder: the process that sent this (the kernel's word), and our child when
            // attached; pinned by a pidfd from here on.
            bool ours_for_sure = holder > 1 && holder == sender && (child <= 0 || holder == child);
            UniqueFd holder_fd(ours_for_sure ? launcher::open_pidfd(holder) : -1);
            auto maps = holder_fd ? launcher::write_id_maps(holder_fd.get(), holder, s.id)
                                  : Status(make_error("the container holder named a process that is not it"));
            if (!maps) {
                kill_child();
                return maps.error().wrap("setting up the container's user namespace");
            }
            if (::send(ours.get(), launcher::kHolderGo.data(), launcher::kHolderGo.size(), MSG_NOSIGNAL) !=
                static_cast<ssize_t>(launcher::kHolderGo.size()))
                break;
        }
    }
    if (!gave_up.empty()) {
        ours.reset();
        kill_child();  // the Defer above reaps it
        return make_error("setting up the container: " + gave_up);
    }
    // The last report: the first line left (the holder says nothing after it).
    auto report = launcher::holder_reply_from_line(std::string_view(reply).substr(0, reply.find('\n')));
    if (report && report->kind == launcher::HolderReply::Kind::ready) {
        child = -1;  // attached: our child for as long as it runs (Container::stop reaps it)
        return *report;
    }
    ours.reset();
    kill_child();
    if (report && report->kind == launcher::HolderReply::Kind::failed) return make_error(report->message);
    return make_error("container set-up failed (the holder exited without a report)");
}

}  // namespace

Result<Container> Container::create(const ContainerSpec& spec) {
    Setup s;
    s.spec = &spec;
    GANTRY_TRY(resolve_identity(spec, s.id));
    {
        trace::Phase p("check_user_paths");
        GANTRY_TRY(check_user_paths(spec, s.id));
    }
    bool privileged_ok = launcher::running_as_real_root() && spec.image_trusted &&
                         launcher::is_trusted_path(spec.image_path, spec.config.store_owner);
    for (const auto& layer : spec.image_layers)
        privileged_ok = privileged_ok && launcher::is_trusted_path(layer, spec.config.store_owner);
    auto backend = launcher::choose_backend(spec, privileged_ok);
    if (!backend) return backend.error();
    if (!spec.image_layers.empty() && *backend == MountBackend::extract)
        return make_error("the image " + spec.image_path +
                          " is stored as layers, which the extract backend cannot "
                          "stack; use the kernel or fuse backend, or store it whole (gantry.conf layered_images = no)");
    s.backend = *backend;
    // The node-wide image mounts idle for too long are released when a kernel-backed container stops
    // and by the job epilog, not here: the sweep (2-3 ms) is off every step's start (issue #36).

    std::string image_workdir = "/";
    if (!spec.image_config.working_dir.empty()) {
        auto w = normalize_container_path(spec.image_config.working_dir, "image WorkingDir");
        if (w) image_workdir = *w;
    }
    if (!spec.workdir.empty()) {
        auto w = normalize_container_workdir(spec.workdir);
        if (!w) return w.error();
        s.workdir = *w;
    } else {
        s.workdir = image_workdir;
    }
    // Enroot's home hook: with remap-root the user is root inside, whose home is /root; the user's
    // home (mount_home) is mounted there (home_mount_point).
    s.home = spec.remap_root ? "/root" : s.id.home;
    if (s.home.empty()) s.home = "/";

    std::string rdir = runtime_dir(spec.config);
    GANTRY_TRY(ensure_private_dir(rdir));
    std::string state_file;
    if (!spec.name.empty()) {
        if (!valid_name(spec.name))
            return make_error("invalid container name '" + spec.name + "' (letters, digits, _ - .)");
        GANTRY_TRY(ensure_private_dir(rdir + "/containers"));
        state_file = state_path(spec.config, spec.name);
        if (Container::open(spec.name, spec.config)) return make_error("container " + spec.name + " already exists");
    }
    std::string tmpl = rdir + "/staging.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) return system_error("creating a staging directory in " + rdir);
    s.staging = buf.data();
    Defer remove_staging([&] { ::rmdir(s.staging.c_str()); });
    if (::getuid() == 0 && s.id.uid != 0) (void)!::chown(s.staging.c_str(), s.id.uid, s.id.gid);
    s.image_dir = s.staging + "/image";

    auto started = [&] {
        trace::Phase p("start_holder");
        return start_holder(spec, s);
    }();
    if (!started) return started.error();
    Container c;
    c.state_.holder_pid = started->pid;
    c.state_.holder_start_time = started->start_time;
    c.state_.pid_namespace = started->pid_namespace;
    c.state_.server_pid = started->server_pid;  // -1: no shared server
    c.state_.server_start_time = started->server_start_time;
    // The holder's numbers, in our own view when our pid namespace is not the holder's (each looked up
    // by its namespace and number, never taken as ours): what this process does with them (stop,
    // cgroup placement) reads our /proc and signals through our pidfds.
    if (c.state_.pid_namespace != 0 && c.state_.pid_namespace != launcher::own_pid_namespace()) {
        c.state_.holder_pid = launcher::pid_in_own_view(c.state_.holder_pid, c.state_.pid_namespace);
        if (c.state_.server_pid > 0)
            c.state_.server_pid = launcher::pid_in_own_view(c.state_.server_pid, c.state_.pid_namespace);
        c.state_.pid_namespace = launcher::own_pid_namespace();
        if (c.state_.holder_pid <= 0) return make_error("container set-up failed: its holder is not visible from here");
    }
    c.state_.name = spec.name;
    c.state_.uid = s.id.uid;
    c.state_.unshare = spec.unshare;
    c.state_.backend = to_string(s.backend);
    c.state_.defaults = ProcessDefaults{spec.image_config.env, spec.devices.env, spec.env_names, s.workdir, s.home,
                                        spec.remap_root,       spec.env_values,  image_workdir};
    c.owned_ = !spec.detach;
    c.is_child_ = !spec.detach;
    c.kernel_mount_ = s.backend == MountBackend::kernel;
    c.config_ = spec.config;
    if (!state_file.empty()) {
        c.state_file_ = state_file;
        auto w = write_state(state_file, c.state_);
        if (!w) return w.error();
    }
    log::debug("container " + spec.name + " ready: holder pid " + std::to_string(c.state_.holder_pid) + ", backend " +
               c.state_.backend);
    return c;
}

Result<Container> Container::open(const std::string& name, const Config& config) {
    if (!valid_name(name)) return make_error("invalid container name '" + name + "'");
    std::string path = state_path(config, name);
    if (::access(path.c_str(), F_OK) != 0) return make_error("no container named " + name);
    auto st = read_state(path);
    if (!st) return st.error();
    // The recorded pid is a number of the holder's pid namespace: looked up in ours (the job epilog
    // reads what a step recorded in the job's namespace under Slurm's namespace/linux).
    pid_t seen = launcher::pid_in_own_view(st->holder_pid, st->pid_namespace);
    if (seen <= 0 || launcher::process_start_time(seen) != st->holder_start_time) {
        // Stale (node reboot, kill -9) only if we would see the holder: not when it lives in a pid
        // namespace that is neither ours nor below ours.
        if (launcher::sees_every_process_of(st->pid_namespace)) ::unlink(path.c_str());
        return make_error("container " + name + " is not running");
    }
    st->holder_pid = seen;
    st->pid_namespace = launcher::own_pid_namespace();
    Container c;
    c.state_ = *st;
    c.state_file_ = path;
    c.kernel_mount_ = st->backend == "kernel";
    c.config_ = config;
    return c;
}

Container::Container(Container&& o) noexcept
    : state_(std::move(o.state_)),
      state_file_(std::move(o.state_file_)),
      owned_(o.owned_),
      is_child_(o.is_child_),
      kernel_mount_(o.kernel_mount_),
      config_(std::move(o.config_)) {
    o.owned_ = false;
    o.state_.holder_pid = -1;
}

Container& Container::operator=(Container&& o) noexcept {
    if (this != &o) {
        if (owned_) (void)stop();
        state_ = std::move(o.state_);
        state_file_ = std::move(o.state_file_);
        owned_ = o.owned_;
        is_child_ = o.is_child_;
        kernel_mount_ = o.kernel_mount_;
        config_ = std::move(o.config_);
        o.owned_ = false;
        o.state_.holder_pid = -1;
    }
    return *this;
}

Container::~Container() {
    if (owned_) (void)stop();
}

Status Container::stop() {
    owned_ = false;
    pid_t pid = state_.holder_pid;
    if (pid <= 0) return {};
    if (!state_file_.empty()) ::unlink(state_file_.c_str());
    // Once the holder is gone its reference on the node-wide image mount is too: start that mount's
    // idle clock now (or release it, with mount_idle_seconds = 0) rather than at some later sweep.
    Defer sweep([&] {
        if (kernel_mount_ && launcher::running_as_real_root()) (void)release_idle_mounts(config_);
    });
    if (is_child_) {
        // Our unreaped child (the pid names it): SIGTERM, SIGKILL after 10 s, reaped once it has
        // ended; a holder the kernel keeps (a read on a FUSE mount the user stopped) is not waited
        // for past another 5 s. A holder runs as the user, who may keep it from ending on SIGTERM.
        UniqueFd pidfd(launcher::open_pidfd(pid));
        ::kill(pid, SIGTERM);
        struct pollfd p {
            pidfd.get(), POLLIN, 0
        };
        if (pidfd && ::poll(&p, 1, 10000) == 0) {
            ::kill(pid, SIGKILL);
            if (::poll(&p, 1, 5000) == 0) {
                log::warning("container " + state_.name + ": its holder (pid " + std::to_string(pid) +
                             ") did not end within 5 s of SIGKILL");
                state_.holder_pid = -1;
                return {};
            }
        }
        ::waitpid(pid, nullptr, 0);
        state_.holder_pid = -1;
        return {};
    }
    if (launcher::process_start_time(pid) != state_.holder_start_time) return {};
    UniqueFd pidfd(launcher::open_pidfd(pid));
    if (!pidfd) return system_error("stopping container " + state_.name);
    if (launcher::signal_pidfd(pidfd.get(), SIGTERM) != 0 && errno != ESRCH)
        return system_error("stopping container " + state_.name);
    struct pollfd p {
        pidfd.get(), POLLIN, 0
    };
    if (::poll(&p, 1, 10000) == 0) launcher::signal_pidfd(pidfd.get(), SIGKILL);
    state_.holder_pid = -1;
    return {};
}

std::vector<std::string> list_containers(const Config& config) {
    std::vector<std::string> out;
    std::string dir = runtime_dir(config) + "/containers";
    if (DIR* d = ::opendir(dir.c_str())) {
        while (dirent* e = ::readdir(d)) {
            std::string n = e->d_name;
            if (ends_with(n, ".json")) out.push_back(n.substr(0, n.size() - 5));
        }
        ::closedir(d);
    }
    return out;
}

StartedHolder::~StartedHolder() {
    if (pid <= 0) return;
    // Our unreaped child (the pid names it; the pidfd pins it): killed, then reaped within a bound
    // even if the kernel holds it in the user's store (a stalled FUSE file system).
    if (!pidfd || launcher::signal_pidfd(pidfd.get(), SIGKILL) != 0) ::kill(pid, SIGKILL);
    struct pollfd p {
        pidfd.get(), POLLIN, 0
    };
    if (pidfd && ::poll(&p, 1, 5000) == 0) {
        log::warning("the container holder did not end within 5 s of SIGKILL");
        return;
    }
    ::waitpid(pid, nullptr, 0);
}

Result<HolderWithImage> start_holder_acquiring(const std::string& holder_program, const HolderAcquisition& acquisition,
                                               std::chrono::milliseconds limit,
                                               const std::function<bool()>& should_stop) {
    const std::string what = "opening image " + acquisition.digest + " in " + acquisition.store_root + " as uid " +
                             std::to_string(acquisition.uid) + " in the container holder";
    GANTRY_TRY(validate_digest(acquisition.digest));
    if (::geteuid() != 0 || acquisition.uid == 0)
        return make_error(what + ": only root starts a holder for a job user");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return system_error(what);
    auto holder = std::make_shared<StartedHolder>();
    holder->channel = UniqueFd(sv[0]);
    UniqueFd theirs(sv[1]);
    // As start_holder: the kernel says who sent each message, from the holder's first one on.
    int one = 1;
    if (::setsockopt(holder->channel.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0) return system_error(what);
    ProcessRequest run = holder_process(holder_program, true, theirs.get());
    // Root execs it, as every holder (holder.cpp says why); it becomes the user itself, first thing.
    run.argv.insert(run.argv.end(), {"--acquire-and-hold", acquisition.store_root, acquisition.digest,
                                     std::to_string(acquisition.uid), std::to_string(acquisition.gid)});
    if (!acquisition.resolved_tag.empty()) run.argv.push_back(acquisition.resolved_tag);
    auto started = start_process(run);
    if (!started) return started.error().wrap(what);
    trace::point("holder started");
    holder->pid = *started;
    holder->pidfd = UniqueFd(launcher::open_pidfd(holder->pid));
    theirs.reset();
    // Every wait has an end (the limit, the step's stop request); on any failure `holder` goes, and
    // with it the process (killed and reaped).
    auto image =
        receive_acquired_image(holder->channel.get(), acquisition.digest, std::chrono::steady_clock::now() + limit,
                               should_stop, what, "the container holder " + holder_program);
    trace::point("holder's image received");
    if (!image) return image.error();
    return HolderWithImage{std::move(holder), std::move(*image)};
}

}  // namespace gantry
