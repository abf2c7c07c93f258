// acquire_image: the one place that decides whether a stored image's files may be used, and the
// descriptors it hands on (include/gantry/acquire.hpp). Compiled into gantry_store (it reads the
// store's directories), kept in a folder of its own because it is a step of its own: between the
// store, which finds an image, and everything that reads one (the launcher, compositions).
//
// Why this is safe in a store other users can write (an open 1777 store, whose subdirectories belong
// to whoever made them first, and whose owner may rename any entry despite the sticky bit):
//  - Each file is opened exactly once, relative to the images/ directory the store opened, one name
//    component, with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS and O_NOFOLLOW:
//    a symlink under the name is refused, not followed. O_NONBLOCK: a FIFO or a device under the name
//    fails the checks below at once instead of blocking (slurmstepd may be waiting on us).
//  - Owner, mode and type are checked with fstat on that descriptor, the magic with pread on it: what
//    was checked is what is open. A rename over the name after this changes nothing we hold.
//  - The descriptor, never the name, goes on: to the user-side path check, to the FUSE server or the
//    loop device, to the overlay stack and to a composition, as /proc/self/fd/N in processes that
//    received it under the same number (pass_image_descriptors). Opening /proc/self/fd/N opens the
//    same inode with the opener's own rights checked, so a helper running as the user still cannot
//    read what the user may not.
//  - Nothing is done with privilege here: root (the plugin) acquires only from a trusted store
//    (ImageStore::trusted), where no user can rename anything; the kernel backend's further check
//    (launcher::is_trusted_path) runs on the same descriptor.
#include "gantry/acquire.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/pull_report.hpp"
#include "gantry/reference.hpp"

namespace gantry {

namespace {

constexpr std::string_view kDescriptorPrefix = "/proc/self/fd/";
// One SCM_RIGHTS message carries at most 253 descriptors (SCM_MAX_FD); a store image has fewer layers
// (layer groups keep a stack near a hundred).
constexpr size_t kMaxSentFiles = 253;

// A regular file beginning with the squashfs magic, checked on the descriptor.
Status check_squashfs_descriptor(int fd, const std::string& shown) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return system_error("checking " + shown);
    if (!S_ISREG(st.st_mode)) return make_error("refusing " + shown + ": not a regular file");
    char magic[4] = {};
    if (::pread(fd, magic, 4, 0) != 4 || std::memcmp(magic, "hsqs", 4) != 0)
        return make_error("refusing " + shown + ": not a squashfs file");
    return {};
}

}  // namespace

// A friend of ImageStore: it reads the store's images/ descriptor and its owner rules.
Result<AcquiredImage> acquire_image(const ImageStore& store, const std::string& digest) {
    GANTRY_TRY(validate_digest(digest));
    auto img = store.load(digest);
    if (!img) return img.error();
    AcquiredImage out;
    out.digest = digest;
    out.layered = img->layered();
    std::vector<std::string> names;
    if (img->layered()) {
        for (const auto& chain : img->metadata.layer_chain) {
            std::string path = store.layer_squashfs_path(chain);
            names.push_back(path.substr(path.rfind('/') + 1));
        }
    } else {
        names.push_back(digest_hex(digest) + ".sqsh");
    }
    const Directory& images = store.images_dir();
    for (const auto& name : names) {
        const std::string shown = images.path_of(name);
        struct open_how how {};
        how.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
        how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
        int raw = openat2_retrying(images.fd(), name, how);
        if (raw < 0 && errno == ENOSYS)  // Linux < 5.6: one component and O_NOFOLLOW say the same
            raw = ::openat(images.fd(), name.c_str(), static_cast<int>(how.flags));
        if (raw < 0) return system_error("opening " + shown);
        UniqueFd opened(raw);
        UniqueFd fd(::fcntl(opened.get(), F_DUPFD_CLOEXEC, kFirstImageDescriptor));
        if (!fd) return system_error("opening " + shown);
        opened.reset();
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) return system_error("checking " + shown);
        if (!store.accepted_file(st))
            return make_error("refusing " + shown + ": " +
                              (S_ISREG(st.st_mode) ? "owned by uid " + std::to_string(st.st_uid) +
                                                         " or writable by others, which this store does not trust"
                                                   : std::string("not a regular file")) +
                              " (it changed after the store listed it: somebody replaced it; pull the image again)");
        // Blocking reads from here on: it is a regular file.
        int flags = ::fcntl(fd.get(), F_GETFL);
        if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) return system_error("opening " + shown);
        GANTRY_TRY(check_squashfs_descriptor(fd.get(), shown));
        out.files.push_back(std::move(fd));
    }
    out.metadata = std::move(img->metadata);
    // Best effort, as before acquisition existed: an account that cannot mark the image used still runs it.
    if (auto lease = store.open_in_use(digest)) out.in_use = std::move(*lease);
    return out;
}

int send_acquired_image(int channel, const std::string& store_root, const std::string& digest,
                        const std::string& resolved_tag, AcquiredImage* keep) {
    auto answer = [&](const std::string& line, const std::vector<int>& fds) {
        msghdr msg{};
        iovec iov{const_cast<char*>(line.data()), line.size()};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxSentFiles), 0);
        if (!fds.empty()) {
            msg.msg_control = control.data();
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
            cmsghdr* c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
            std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
        }
        return ::sendmsg(channel, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(line.size()) ? 0 : 1;
    };
    auto store = ImageStore::open(store_root, false);  // as the user: root, the user's own files count
    auto acquired = store ? acquire_image(*store, digest) : Result<AcquiredImage>(store.error());
    if (acquired && acquired->files.size() > kMaxSentFiles)
        acquired = make_error("image " + digest + " has more than " + std::to_string(kMaxSentFiles) + " layers");
    if (!acquired) {
        answer("error " + acquired.error().message + "\n", {});
        return 1;
    }
    // What a pull of the pinned digest would have done besides (runtime/store/pull.cpp): mark the image
    // used (gc is least-recently-used first) and record the tag srun resolved as this user's resolution
    // of it. Both best effort, as there, and both as the user: their own records in their own store.
    store->touch(digest);
    if (!resolved_tag.empty())
        if (auto tag = parse_reference(resolved_tag)) (void)store->record_tag(*tag, digest);
    std::vector<int> fds;
    for (const auto& f : acquired->files) fds.push_back(f.get());
    if (answer(std::string(acquired->layered ? "layered " : "whole ") + std::to_string(fds.size()) + "\n", fds) != 0)
        return 1;
    // Then the image's config as the store records it, in a pull's report (include/gantry/pull_report.hpp)
    // after a line with its size (the holder's channel stays open after it): what a pull would have
    // reported for the digest, so that a stored image needs no pull at all (acquire_image_as).
    PullReport report;
    report.digest = digest;
    report.config_json = acquired->metadata.config_json;
    const std::string text = encode_pull_report(report);
    if (!write_all(channel, std::to_string(text.size()) + "\n" + text, "the image's report")) return 1;
    if (keep != nullptr) *keep = std::move(*acquired);
    return 0;
}

Result<AcquiredImage> acquire_image_as(const ProcessIdentity& who, const std::string& holder,
                                       const std::string& store_root, const std::string& digest,
                                       std::chrono::milliseconds limit, const std::function<bool()>& should_stop,
                                       const std::string& resolved_tag) {
    GANTRY_TRY(validate_digest(digest));
    const std::string what = "opening image " + digest + " in " + store_root + " as uid " + std::to_string(who.uid);
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return system_error(what);
    UniqueFd ours(sv[0]), theirs(sv[1]);
    ProcessRequest rq;
    rq.argv = {holder, "--acquire", store_root, digest};
    if (!resolved_tag.empty()) rq.argv.push_back(resolved_tag);
    rq.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    rq.identity = who;  // the store is the user's: only the user's rights open anything in it
    rq.inputs = {{theirs.get(), 3}};
    rq.death_signal = SIGKILL;
    auto pid = start_process(rq);
    if (!pid) return pid.error().wrap(what);
    theirs.reset();
    // Our unreaped child, so the pid names it; by pidfd it is killed and reaped within a bound even
    // when the kernel keeps it (a read on a FUSE mount the user stopped: then it is left, reported).
    UniqueFd child(static_cast<int>(::syscall(SYS_pidfd_open, *pid, 0)));
    Defer reap([&] {
        if (!child || ::syscall(SYS_pidfd_send_signal, child.get(), SIGKILL, nullptr, 0) != 0) ::kill(*pid, SIGKILL);
        struct pollfd p {
            child.get(), POLLIN, 0
        };
        if (child && ::poll(&p, 1, 5000) == 0) {
            log::warning(what + ": the helper did not end within 5 s of SIGKILL");
            return;
        }
        ::waitpid(*pid, nullptr, 0);
    });
    return receive_acquired_image(ours.get(), digest, std::chrono::steady_clock::now() + limit, should_stop, what,
                                  "the helper " + holder);
}

Result<AcquiredImage> receive_acquired_image(int channel, const std::string& digest,
                                             std::chrono::steady_clock::time_point deadline,
                                             const std::function<bool()>& should_stop, const std::string& what,
                                             const std::string& sender) {
    // Every wait has an end: the answer comes by `deadline` and before the step's stop request, or
    // the caller kills the sender.
    const auto limit_s =
        std::chrono::duration_cast<std::chrono::seconds>(deadline - std::chrono::steady_clock::now()).count();
    while (true) {
        if (should_stop && should_stop()) return make_error(what + ": the step is being stopped");
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0)
            return make_error(what + ": no answer within " + std::to_string(limit_s) +
                              " s (check_timeout_seconds in gantry.conf; is the store on a stalled file system?)");
        struct pollfd p {
            channel, POLLIN, 0
        };
        if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 200))) > 0) break;
    }
    char text[4096] = {};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxSentFiles), 0);
    msghdr msg{};
    iovec iov{text, sizeof text - 1};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    ssize_t n;
    do n = ::recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) return system_error(what);
    // Every descriptor that arrived is ours to close, whatever the text says.
    std::vector<UniqueFd> received;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            received.emplace_back(fd);
        }
    }
    std::string reply(text, static_cast<size_t>(n));
    if (reply.rfind("error ", 0) == 0) return make_error(reply.substr(6, reply.find('\n') - 6));
    // The first line answers; what follows it is the image's config in a pull report after a line with
    // its size (send_acquired_image): read with the deadline above and a size cap, parsed by the same
    // decoder as a pull's report (the user's word either way), and kept only for this digest. Never to
    // the end of the stream: a holder that acquired the image keeps the channel open for its set-up.
    std::string rest;
    if (const auto eol = reply.find('\n'); eol != std::string::npos) {
        rest = reply.substr(eol + 1);
        reply.resize(eol + 1);
    }
    auto report_complete = [&] {
        const auto eol = rest.find('\n');
        if (eol == std::string::npos) return false;
        const unsigned long long size = std::strtoull(rest.c_str(), nullptr, 10);
        return size > kMaxPullReportBytes || rest.size() >= eol + 1 + size;
    };
    for (char buf[16384]; !report_complete() && rest.size() <= kMaxPullReportBytes + 32;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pollfd p{channel, POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
        ssize_t got = ::read(channel, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        rest.append(buf, static_cast<size_t>(got));
    }
    if (report_complete()) {
        const auto eol = rest.find('\n');
        const unsigned long long size = std::strtoull(rest.c_str(), nullptr, 10);
        rest = size > kMaxPullReportBytes ? std::string() : rest.substr(eol + 1, size);
    } else {
        rest.clear();
    }
    if ((msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0 || received.empty())
        return make_error(what + ": " + sender + " sent no usable answer");
    AcquiredImage out;
    out.digest = digest;
    out.layered = reply.rfind("layered ", 0) == 0;
    if (reply != (out.layered ? "layered " : "whole ") + std::to_string(received.size()) + "\n" ||
        (!out.layered && received.size() != 1))
        return make_error(what + ": " + sender + " sent no usable answer");
    for (auto& fd : received) {
        // Renumbered clear of the helpers' fixed descriptors, and otherwise not touched by root: the
        // user chose what to send (a file on a FUSE file system of theirs could stall a read or even
        // an fstat), so every check of it, type and magic included, runs as the user
        // (Container::create's check_user_paths), and only processes of the user ever read it.
        UniqueFd high(::fcntl(fd.get(), F_DUPFD_CLOEXEC, kFirstImageDescriptor));
        if (!high) return system_error(what);
        out.files.push_back(std::move(high));
    }
    if (auto report = decode_pull_report(rest);
        report && report->error == PullErrorKind::none && report->digest == digest) {
        out.metadata.manifest_digest = digest;
        out.metadata.config_json = std::move(report->config_json);
        out.reported = true;
    }
    return out;
}

std::vector<std::string> AcquiredImage::paths() const {
    std::vector<std::string> out;
    for (const auto& f : files) out.push_back(descriptor_path(f.get()));
    return out;
}

std::string descriptor_path(int fd) {
    return std::string(kDescriptorPrefix) + std::to_string(fd);
}

int descriptor_of_path(const std::string& path) {
    if (path.compare(0, kDescriptorPrefix.size(), kDescriptorPrefix) != 0) return -1;
    const char* digits = path.c_str() + kDescriptorPrefix.size();
    if (*digits < '0' || *digits > '9') return -1;
    char* end = nullptr;
    long n = std::strtol(digits, &end, 10);
    if (*end != '\0' || n < 0 || n > 1 << 20) return -1;
    return static_cast<int>(n);
}

void pass_image_descriptors(ProcessRequest& rq, const std::vector<std::string>& paths) {
    for (const auto& p : paths) {
        int n = descriptor_of_path(p);
        if (n < 0) continue;
        bool already = false;
        for (const auto& in : rq.inputs) already = already || in.as == n;
        if (!already) rq.inputs.push_back({n, n});
    }
}

}  // namespace gantry
