// fuse_uring_probe: what one FUSE round trip costs on this machine, over /dev/fuse (read + write, as
// libfuse and gantry-imagefs talk today) and over io_uring (FUSE_IO_URING_CMD_REGISTER /
// COMMIT_AND_FETCH, Linux 6.14+, fuse module parameter enable_uring=1). Issue #20's cold Python-import
// case is bound by LOOKUP round trips (misses on a search path), so this measures exactly that: a
// file system whose root answers every LOOKUP of a missing name, and a client process that stats N
// distinct missing names. Run by bench/fuse_uring.sh, as root, inside `unshare -m` (the mount vanishes
// with the process).
//
//   fuse_uring_probe dev|uring [--lookups N] [OPTIONS]   its own server, and a client process
//   fuse_uring_probe client DIR N                        the client alone, against another server
//
// Options: --pin (the client on CPU 0; in uring mode each ring thread on its queue's CPU, the kernel
// picking the queue by the client's CPU; in dev mode the /dev/fuse thread on CPU 0 too),
// --negative-entries (answer a miss as gantry-imagefs does: node 0 with a timeout, instead of
// ENOENT), --same-process (the client a thread of the server's process: no address-space switch),
// --queue-depth D (ring entries per queue, default 2).
// Prints one line: "mode=... lookups=N total_ms=... us_per_lookup=..." and how many requests each
// path answered (a uring run whose requests all went over /dev/fuse is not a uring measurement).
// Not part of Gantry: a measurement, so that #20's io_uring route is decided by a number.
#include <fcntl.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// The io_uring transport's structures (include/uapi/linux/fuse.h of Linux 6.14+; Debian 12's headers
// predate them).
constexpr uint64_t kOverIoUring = 1ULL << 41;  // FUSE_OVER_IO_URING, an init flag (flags2 bit 9)
constexpr uint32_t kCmdRegister = 1;           // FUSE_IO_URING_CMD_REGISTER
constexpr uint32_t kCmdCommitAndFetch = 2;     // FUSE_IO_URING_CMD_COMMIT_AND_FETCH
struct RingEntInOut {
    uint64_t flags;
    uint64_t commit_id;
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};
struct RingReqHeader {
    char in_out[128];  // fuse_in_header in, fuse_out_header out
    char op_in[128];   // the opcode's own header (fuse_*_in)
    RingEntInOut ring_ent_in_out;
};
struct RingCmdReq {
    uint64_t flags;
    uint64_t commit_id;
    uint16_t qid;
    uint8_t padding[6];
};

[[noreturn]] void die(const char* what, int err) {
    std::fprintf(stderr, "fuse_uring_probe: %s: %s\n", what, std::strerror(err));
    std::exit(1);
}

void pin_to(unsigned cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set); e != 0) die("pthread_setaffinity_np", e);
}

fuse_attr root_attr() {
    fuse_attr a{};
    a.ino = FUSE_ROOT_ID;
    a.mode = S_IFDIR | 0755;
    a.nlink = 2;
    a.blksize = 4096;
    return a;
}

int g_fuse = -1;
bool g_uring = false;
std::atomic<bool> g_init_done{false};
bool g_negative_entries = false;
std::atomic<long> g_by_dev{0}, g_by_ring{0};  // requests answered on each path

// Answers one request; returns the reply's body size (written to `body`) and sets `error`.
// LOOKUP: always ENOENT (no entry, nothing cached); GETATTR: the root; the rest: ENOSYS.
size_t answer(const fuse_in_header& in, char* body, int& error) {
    error = 0;
    switch (in.opcode) {
        case FUSE_LOOKUP:
            if (g_negative_entries) {
                // As gantry-imagefs answers a miss: node 0 with a timeout, a negative dentry the
                // kernel keeps (the names are distinct, so each one still costs a LOOKUP).
                fuse_entry_out out{};
                out.entry_valid = 1000000;
                std::memcpy(body, &out, sizeof out);
                return sizeof out;
            }
            error = -ENOENT;
            return 0;
        case FUSE_GETATTR: {
            fuse_attr_out out{};
            out.attr_valid = 3600;
            out.attr = root_attr();
            std::memcpy(body, &out, sizeof out);
            return sizeof out;
        }
        default:
            error = -ENOSYS;
            return 0;
    }
}

void reply_dev(uint64_t unique, int error, const void* body, size_t size) {
    fuse_out_header h{};
    h.len = static_cast<uint32_t>(sizeof h + size);
    h.error = error;
    h.unique = unique;
    iovec iov[2] = {{&h, sizeof h}, {const_cast<void*>(body), size}};
    if (writev(g_fuse, iov, size != 0 ? 2 : 1) < 0 && errno != ENOENT) die("writev /dev/fuse", errno);
}

// The /dev/fuse loop: INIT, and every request in dev mode (in uring mode: what the ring does not
// carry, FORGETs and INTERRUPTs).
void dev_loop(bool pin) {
    // --pin: on the client's CPU, as the ring threads of that CPU's queue are.
    if (pin) pin_to(0);
    std::vector<char> buf(1 << 20);
    for (;;) {
        ssize_t n = read(g_fuse, buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT) continue;
            if (errno == ENODEV) return;
            die("read /dev/fuse", errno);
        }
        auto* in = reinterpret_cast<fuse_in_header*>(buf.data());
        if (in->opcode == FUSE_INIT) {
            auto* init = reinterpret_cast<fuse_init_in*>(in + 1);
            fuse_init_out out{};
            out.major = FUSE_KERNEL_VERSION;
            out.minor = init->minor;
            out.max_readahead = init->max_readahead;
            out.flags = FUSE_INIT_EXT | FUSE_MAX_PAGES;
            out.flags2 = g_uring ? static_cast<uint32_t>(kOverIoUring >> 32) : 0;
            out.max_background = 16;
            out.congestion_threshold = 12;
            out.max_write = 128 * 1024;
            out.time_gran = 1;
            out.max_pages = 32;
            reply_dev(in->unique, 0, &out, sizeof out);
            g_init_done = true;
            continue;
        }
        if (in->opcode == FUSE_FORGET || in->opcode == FUSE_BATCH_FORGET) continue;
        char body[256];
        int error = 0;
        size_t size = answer(*in, body, error);
        ++g_by_dev;
        reply_dev(in->unique, error, body, size);
    }
}

// One ring per CPU (the kernel makes a queue per possible CPU and routes a request to the queue of
// the CPU its caller runs on), `depth` entries each.
void ring_loop(uint16_t qid, unsigned depth, bool pin) {
    if (pin) pin_to(qid);
    io_uring ring;
    if (int e = io_uring_queue_init(depth * 2, &ring, IORING_SETUP_SQE128); e < 0) die("io_uring_queue_init", -e);
    constexpr size_t kPayload = 128 * 1024;  // >= max(8 KiB, max_write, max_pages * 4 KiB)
    struct Entry {
        RingReqHeader header{};
        std::vector<char> payload = std::vector<char>(kPayload);
        iovec iov[2]{};
    };
    std::vector<Entry> entries(depth);
    auto submit = [&](Entry& e, uint32_t op, uint64_t commit_id) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        if (sqe == nullptr) die("io_uring_get_sqe", EBUSY);
        std::memset(sqe, 0, 128);
        sqe->opcode = IORING_OP_URING_CMD;
        sqe->fd = g_fuse;
        sqe->cmd_op = op;
        e.iov[0] = {&e.header, sizeof e.header};
        e.iov[1] = {e.payload.data(), e.payload.size()};
        sqe->addr = reinterpret_cast<uint64_t>(e.iov);
        sqe->len = 2;
        auto* req = reinterpret_cast<RingCmdReq*>(sqe->cmd);
        req->qid = qid;
        req->commit_id = commit_id;
        io_uring_sqe_set_data(sqe, &e);
    };
    for (auto& e : entries) submit(e, kCmdRegister, 0);
    if (int r = io_uring_submit(&ring); r < 0) die("io_uring_submit (register)", -r);
    for (;;) {
        io_uring_cqe* cqe = nullptr;
        int r = io_uring_wait_cqe(&ring, &cqe);
        if (r == -EINTR) continue;
        if (r < 0) die("io_uring_wait_cqe", -r);
        auto* e = static_cast<Entry*>(io_uring_cqe_get_data(cqe));
        int res = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        if (res == -ENOTCONN || res == -ECANCELED) return;  // unmounted
        if (res < 0) die("FUSE_IO_URING command", -res);
        fuse_in_header in{};
        std::memcpy(&in, e->header.in_out, sizeof in);
        int error = 0;
        size_t size = answer(in, e->payload.data(), error);
        ++g_by_ring;
        fuse_out_header out{};
        out.len = static_cast<uint32_t>(sizeof out + size);
        out.error = error;
        out.unique = in.unique;
        std::memcpy(e->header.in_out, &out, sizeof out);
        e->header.ring_ent_in_out.payload_sz = static_cast<uint32_t>(size);
        submit(*e, kCmdCommitAndFetch, e->header.ring_ent_in_out.commit_id);
        if (r = io_uring_submit(&ring); r < 0) die("io_uring_submit (commit)", -r);
    }
}

// Stats `lookups` distinct missing names in `dir` (each one LOOKUP, also where the server's answer
// is a cached negative entry), after 1000 of warm-up; returns the milliseconds the measured ones took.
double stat_missing(const std::string& dir, long lookups) {
    struct stat st {};
    char name[64];
    auto miss = [&](const char* prefix, long i) {
        std::snprintf(name, sizeof name, "/%s%ld", prefix, i);
        if (stat((dir + name).c_str(), &st) == 0 || errno != ENOENT)
            die("stat of a missing name did not give ENOENT", errno);
    };
    // The warm-up's first call also waits until the ring is ready (all queues registered).
    for (long i = 0; i < 1000; ++i) miss("warm-", i);
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < lookups; ++i) miss("m-", i);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void report(const std::string& mode, long lookups, double ms, bool pin, unsigned depth, const char* client) {
    std::printf(
        "mode=%s client=%s lookups=%ld total_ms=%.1f us_per_lookup=%.2f pin=%d depth=%u answered_by_dev=%ld "
        "by_ring=%ld\n",
        mode.c_str(), client, lookups, ms, ms * 1000.0 / static_cast<double>(lookups), pin ? 1 : 0, depth,
        g_by_dev.load(), g_by_ring.load());
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr,
                     "usage: fuse_uring_probe dev|uring [--lookups N] [--pin] [--queue-depth D] [--negative-entries] "
                     "[--same-process]\n");
        return 2;
    }
    std::string mode = argv[1];
    g_uring = mode == "uring";
    if (mode == "client") {
        // The client alone, against a mount someone else serves (gantry-imagefs): client DIR N.
        if (argc < 4) die("usage: fuse_uring_probe client DIR LOOKUPS", EINVAL);
        long n = std::atol(argv[3]);
        double ms = stat_missing(argv[2], n);
        std::printf("mode=client lookups=%ld total_ms=%.1f us_per_lookup=%.2f\n", n, ms,
                    ms * 1000.0 / static_cast<double>(n));
        return 0;
    }
    if (!g_uring && mode != "dev") die("mode must be dev, uring or client", EINVAL);
    long lookups = 100000;
    unsigned depth = 2;
    bool pin = false;
    bool same_process = false;
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--lookups" && i + 1 < argc)
            lookups = std::atol(argv[++i]);
        else if (a == "--queue-depth" && i + 1 < argc)
            depth = static_cast<unsigned>(std::atoi(argv[++i]));
        else if (a == "--pin")
            pin = true;
        else if (a == "--negative-entries")
            g_negative_entries = true;
        else if (a == "--same-process")
            same_process = true;
        else
            die(("unknown argument " + a).c_str(), EINVAL);
    }

    char dir[] = "/tmp/fuse-uring-probe-XXXXXX";
    if (mkdtemp(dir) == nullptr) die("mkdtemp", errno);
    g_fuse = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (g_fuse < 0) die("open /dev/fuse", errno);
    std::string opts = "fd=" + std::to_string(g_fuse) + ",rootmode=40000,user_id=0,group_id=0";
    if (mount("probe", dir, "fuse.probe", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) die("mount", errno);

    std::thread(dev_loop, pin && !g_uring).detach();
    while (!g_init_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (g_uring) {
        long cpus = sysconf(_SC_NPROCESSORS_CONF);  // the kernel's queues: one per possible CPU
        for (long q = 0; q < cpus; ++q) std::thread(ring_loop, static_cast<uint16_t>(q), depth, pin).detach();
    }
    // The client runs in a process of its own, as a container's programs do: a round trip between
    // two processes costs two address-space switches, which on some virtual machines (shadow page
    // tables) is most of it; threads of one process would hide that.
    if (!same_process) {
        int pipefd[2];
        if (pipe(pipefd) != 0) die("pipe", errno);
        pid_t child = fork();
        if (child < 0) die("fork", errno);
        if (child == 0) {
            if (pin) pin_to(0);
            double ms = stat_missing(dir, lookups);
            if (write(pipefd[1], &ms, sizeof ms) != sizeof ms) _exit(1);
            _exit(0);
        }
        double ms = 0;
        if (read(pipefd[0], &ms, sizeof ms) != sizeof ms) die("the client process failed", EIO);
        report(mode, lookups, ms, pin, depth, "process");
    } else {
        if (pin) pin_to(0);
        report(mode, lookups, stat_missing(dir, lookups), pin, depth, "thread");
    }
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    _exit(0);
}
