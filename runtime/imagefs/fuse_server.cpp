// The libfuse3 low-level glue of gantry-imagefs: each request is one call into SquashfsImage and one
// reply. What makes it fast for many small files is what it does not answer:
// - OPEN and OPENDIR get ENOSYS once; the kernel then stops sending them (no_open, no_opendir) and
//   treats every file as FOPEN_KEEP_CACHE and every directory as FOPEN_CACHE_DIR, so a warm open,
//   read or listing never leaves the kernel. No RELEASE, RELEASEDIR or FLUSH follow either.
// - Lookups of missing names are answered with inode 0 and the long timeout: the kernel keeps the
//   negative dentry (a Python import's search path misses far more often than it hits).
// - READDIRPLUS returns the attributes with the names, so `find` and `ls -l` need no LOOKUP each.
// - Symlink targets are cached by the kernel (FUSE_CAP_CACHE_SYMLINKS).
#include "fuse_server.hpp"

#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "squashfs_image.hpp"

namespace gantry::imagefs {

namespace {

// Requests by kind, for --report-requests: what the kernel still asks once the caches are warm.
enum Counter {
    lookup_n,
    getattr_n,
    readlink_n,
    open_n,
    opendir_n,
    read_n,
    readdir_n,
    readdirplus_n,
    statfs_n,
    getxattr_n,
    listxattr_n,
    forget_n,
    counter_count
};
constexpr const char* counter_names[counter_count] = {"LOOKUP",  "GETATTR",  "READLINK",  "OPEN",
                                                      "OPENDIR", "READ",     "READDIR",   "READDIRPLUS",
                                                      "STATFS",  "GETXATTR", "LISTXATTR", "FORGET"};

struct Server {
    SquashfsImage* image = nullptr;
    ServerOptions options;
    std::atomic<unsigned long> counts[counter_count] = {};
};

Server& server_of(fuse_req_t req) {
    return *static_cast<Server*>(fuse_req_userdata(req));
}

void count(Server& s, Counter c) {
    s.counts[c].fetch_add(1, std::memory_order_relaxed);
}

void reply_error(fuse_req_t req, const Error& e) {
    fuse_reply_err(req, e.errnum != 0 ? e.errnum : EIO);
}

void on_init(void* userdata, fuse_conn_info* conn) {
    auto& s = *static_cast<Server*>(userdata);
    auto want = [conn](unsigned cap) {
        if ((conn->capable & cap) != 0) conn->want |= cap;
    };
    want(FUSE_CAP_NO_OPEN_SUPPORT);
    want(FUSE_CAP_NO_OPENDIR_SUPPORT);
    want(FUSE_CAP_CACHE_SYMLINKS);
    want(FUSE_CAP_READDIRPLUS);
    if (s.options.readdirplus_auto)
        want(FUSE_CAP_READDIRPLUS_AUTO);
    else
        conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    if (s.options.splice) want(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
    // libfuse wants the max_read of the mount options repeated here.
    if (s.options.max_read != 0) conn->max_read = s.options.max_read;
    if (s.options.max_readahead != 0 && s.options.max_readahead < conn->max_readahead)
        conn->max_readahead = s.options.max_readahead;
}

fuse_entry_param entry_of(const Server& s, const struct stat& st) {
    fuse_entry_param e{};
    e.ino = st.st_ino;
    e.attr = st;
    e.attr_timeout = s.options.timeout;
    e.entry_timeout = s.options.timeout;
    return e;
}

void on_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    Server& s = server_of(req);
    count(s, lookup_n);
    auto found = s.image->lookup(parent, name);
    if (!found) return reply_error(req, found.error());
    if (!*found) {
        // Negative entry: inode 0 with a timeout, which the kernel caches like a positive one.
        fuse_entry_param e{};
        e.entry_timeout = s.options.timeout;
        fuse_reply_entry(req, &e);
        return;
    }
    auto st = s.image->attributes((*found)->ino);
    if (!st) return reply_error(req, st.error());
    fuse_entry_param e = entry_of(s, *st);
    fuse_reply_entry(req, &e);
}

void on_forget(fuse_req_t req, fuse_ino_t, uint64_t) {
    // Nothing is held per lookup: an inode's location stays known for the server's life.
    count(server_of(req), forget_n);
    fuse_reply_none(req);
}

void on_forget_multi(fuse_req_t req, size_t, fuse_forget_data*) {
    count(server_of(req), forget_n);
    fuse_reply_none(req);
}

void on_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
    Server& s = server_of(req);
    count(s, getattr_n);
    auto st = s.image->attributes(ino);
    if (!st) return reply_error(req, st.error());
    fuse_reply_attr(req, &*st, s.options.timeout);
}

void on_readlink(fuse_req_t req, fuse_ino_t ino) {
    Server& s = server_of(req);
    count(s, readlink_n);
    auto target = s.image->read_link(ino);
    if (!target) return reply_error(req, target.error());
    fuse_reply_readlink(req, target->c_str());
}

// Answered so that the count shows the kernel asked (once per mount at most); ENOSYS is what
// switches the round trips off.
void on_open(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
    count(server_of(req), open_n);
    fuse_reply_err(req, ENOSYS);
}

void on_opendir(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
    count(server_of(req), opendir_n);
    fuse_reply_err(req, ENOSYS);
}

void on_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    Server& s = server_of(req);
    count(s, read_n);
    thread_local std::vector<char> buffer;
    if (buffer.size() < size) buffer.resize(size);
    auto n = s.image->read(ino, static_cast<uint64_t>(off), std::span<char>(buffer.data(), size));
    if (!n) return reply_error(req, n.error());
    if (s.options.splice) {
        fuse_bufvec bv = FUSE_BUFVEC_INIT(*n);
        bv.buf[0].mem = buffer.data();
        fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
        return;
    }
    fuse_reply_buf(req, buffer.data(), *n);
}

void list_directory(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
    Server& s = server_of(req);
    count(s, plus ? readdirplus_n : readdir_n);
    auto listing = s.image->list(ino);
    if (!listing) return reply_error(req, listing.error());
    const Listing& entries = **listing;
    thread_local std::vector<char> buffer;
    if (buffer.size() < size) buffer.resize(size);
    size_t used = 0;
    // Offsets: 0 ".", 1 "..", 2 + i the listing's entry i; each entry carries the next one's.
    size_t total = entries.size() + 2;
    for (size_t i = off < 0 ? 0 : static_cast<size_t>(off); i < total; ++i) {
        const char* name = nullptr;
        struct stat st {};
        if (i < 2) {
            name = i == 0 ? "." : "..";
            st.st_mode = S_IFDIR;
            if (i == 0) {
                st.st_ino = ino;
            } else {
                auto parent = s.image->parent(ino);
                if (!parent) return reply_error(req, parent.error());
                st.st_ino = *parent;
            }
        } else {
            const DirEntry& e = entries[i - 2];
            name = e.name.c_str();
            st.st_ino = e.ino;
            st.st_mode = DTTOIF(e.d_type);
        }
        size_t room = size - used;
        size_t need = 0;
        if (plus) {
            // "." and ".." go without a node id: the kernel takes no reference for them.
            fuse_entry_param e{};
            e.attr = st;
            if (i >= 2) {
                auto attrs = s.image->attributes(st.st_ino);
                if (!attrs) {
                    if (used == 0) return reply_error(req, attrs.error());
                    break;
                }
                e = entry_of(s, *attrs);
            }
            need = fuse_add_direntry_plus(req, buffer.data() + used, room, name, &e, static_cast<off_t>(i + 1));
        } else {
            need = fuse_add_direntry(req, buffer.data() + used, room, name, &st, static_cast<off_t>(i + 1));
        }
        if (need > room) break;
        used += need;
    }
    fuse_reply_buf(req, buffer.data(), used);
}

void on_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    list_directory(req, ino, size, off, false);
}

void on_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    list_directory(req, ino, size, off, true);
}

void on_statfs(fuse_req_t req, fuse_ino_t) {
    Server& s = server_of(req);
    count(s, statfs_n);
    struct statvfs v = s.image->filesystem();
    fuse_reply_statfs(req, &v);
}

void on_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    Server& s = server_of(req);
    count(s, getxattr_n);
    // An image without xattrs: ENOSYS once, and the kernel stops asking (no_getxattr).
    if (!s.image->has_xattrs()) return (void)fuse_reply_err(req, ENOSYS);
    auto all = s.image->xattrs(ino);
    if (!all) return reply_error(req, all.error());
    for (const auto& [key, value] : *all) {
        if (key != name) continue;
        if (size == 0) return (void)fuse_reply_xattr(req, value.size());
        if (value.size() > size) return (void)fuse_reply_err(req, ERANGE);
        return (void)fuse_reply_buf(req, value.data(), value.size());
    }
    fuse_reply_err(req, ENODATA);
}

void on_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    Server& s = server_of(req);
    count(s, listxattr_n);
    if (!s.image->has_xattrs()) return (void)fuse_reply_err(req, ENOSYS);
    auto all = s.image->xattrs(ino);
    if (!all) return reply_error(req, all.error());
    std::string names;
    for (const auto& kv : *all) names.append(kv.first).push_back('\0');
    if (size == 0) return (void)fuse_reply_xattr(req, names.size());
    if (names.size() > size) return (void)fuse_reply_err(req, ERANGE);
    fuse_reply_buf(req, names.data(), names.size());
}

fuse_lowlevel_ops operations() {
    fuse_lowlevel_ops ops{};
    ops.init = on_init;
    ops.lookup = on_lookup;
    ops.forget = on_forget;
    ops.forget_multi = on_forget_multi;
    ops.getattr = on_getattr;
    ops.readlink = on_readlink;
    ops.open = on_open;
    ops.opendir = on_opendir;
    ops.read = on_read;
    ops.readdir = on_readdir;
    ops.readdirplus = on_readdirplus;
    ops.statfs = on_statfs;
    ops.getxattr = on_getxattr;
    ops.listxattr = on_listxattr;
    return ops;
}

// The single-threaded loop with polling (ServerOptions::poll_us): a request that comes while this
// thread is still awake costs no wake-up. Otherwise libfuse's own loop.
int serve_polling(fuse_session* se, unsigned poll_us) {
    const int fd = fuse_session_fd(se);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return -errno;
    fuse_buf buf{};
    int ret = 0;
    auto awake_since = std::chrono::steady_clock::now();
    const auto budget = std::chrono::microseconds(poll_us);
    while (!fuse_session_exited(se)) {
        int n = fuse_session_receive_buf(se, &buf);
        if (n == -EAGAIN) {
            // (Yielding here was measured worse: sched_yield hands the CPU to any other runnable
            // task for its slice; docs/runtime.md.)
            if (std::chrono::steady_clock::now() - awake_since < budget) continue;
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, -1) < 0 && errno != EINTR) {
                ret = -errno;
                break;
            }
            awake_since = std::chrono::steady_clock::now();
            continue;
        }
        if (n == -EINTR) continue;
        if (n <= 0) {
            if (n < 0) ret = n;
            break;
        }
        fuse_session_process_buf(se, &buf);
        awake_since = std::chrono::steady_clock::now();
    }
    std::free(buf.mem);
    fuse_session_reset(se);
    return ret;
}

struct SessionDestroy {
    void operator()(fuse_session* se) const { fuse_session_destroy(se); }
};

}  // namespace

int serve_image(const std::string& image_path, const std::string& mountpoint, const ServerOptions& options) {
    auto image = SquashfsImage::open(image_path);
    if (!image) {
        std::fprintf(stderr, "gantry-imagefs: %s\n", image.error().message.c_str());
        return 1;
    }
    Server server;
    server.image = image->get();
    server.options = options;

    // Read-only also where libfuse mounts a directory itself (by hand): on a writable mount every
    // read would invalidate the cached atime and cost a GETATTR at the next stat.
    std::string mount_options = "ro";
    if (options.max_read != 0) mount_options += ",max_read=" + std::to_string(options.max_read);
    std::vector<const char*> argv = {"gantry-imagefs", "-o", mount_options.c_str()};
    if (options.debug) argv.push_back("-d");
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    fuse_lowlevel_ops ops = operations();
    std::unique_ptr<fuse_session, SessionDestroy> se(fuse_session_new(&args, &ops, sizeof ops, &server));
    if (!se) return 1;
    if (fuse_set_signal_handlers(se.get()) != 0) return 1;
    // "/dev/fd/N": libfuse serves the descriptor our caller mounted (no mount, no fusermount).
    if (fuse_session_mount(se.get(), mountpoint.c_str()) != 0) {
        fuse_remove_signal_handlers(se.get());
        return 1;
    }
    int ret = 0;
    if (options.multithreaded) {
        fuse_loop_config* cfg = fuse_loop_cfg_create();
        fuse_loop_cfg_set_clone_fd(cfg, options.clone_fd ? 1 : 0);
        if (options.max_threads != 0) fuse_loop_cfg_set_max_threads(cfg, options.max_threads);
        ret = fuse_session_loop_mt(se.get(), cfg);
        fuse_loop_cfg_destroy(cfg);
    } else if (options.poll_us != 0) {
        ret = serve_polling(se.get(), options.poll_us);
    } else {
        ret = fuse_session_loop(se.get());
    }
    if (options.report_requests) {
        std::string line = "gantry-imagefs: requests:";
        for (int c = 0; c < counter_count; ++c)
            line += std::string(" ") + counter_names[c] + "=" + std::to_string(server.counts[c].load());
        std::fprintf(stderr, "%s\n", line.c_str());
    }
    fuse_session_unmount(se.get());
    fuse_remove_signal_handlers(se.get());
    return ret == 0 ? 0 : 1;
}

}  // namespace gantry::imagefs
