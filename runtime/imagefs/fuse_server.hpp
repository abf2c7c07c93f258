// Gantry's FUSE server for squashfs images (the `gantry-imagefs` program): serves one image,
// read-only, over the libfuse3 low-level API. Built for many small files: no OPEN/OPENDIR round
// trips (the kernel then keeps pages and listings: FOPEN_KEEP_CACHE, FOPEN_CACHE_DIR), readdirplus,
// cached negative lookups and long timeouts (the image never changes under a mount).
#pragma once

#include <string>

namespace gantry::imagefs {

struct ServerOptions {
    // One thread answers every request: measured faster on a shared 2-core VM, cold (docs/runtime.md);
    // and a clone_fd worker opens /dev/fuse by path, which is gone once the container has pivoted.
    bool multithreaded = false;
    bool clone_fd = true;           // multithreaded: each worker reads its own /dev/fuse clone
    unsigned max_threads = 0;       // 0: libfuse's default
    unsigned max_readahead = 0;     // bytes; 0: the kernel's (it can only be lowered)
    unsigned max_read = 0;          // bytes, for a mount libfuse makes (by hand); 0: no limit
    bool readdirplus_auto = false;  // let the kernel choose readdir or readdirplus per call
    bool splice = false;            // hand read replies to the kernel with splice
    double timeout = 1e6;           // seconds for entries, attributes and negative entries
    bool debug = false;             // libfuse's request trace on stderr
    bool report_requests = false;   // one line of request counts on stderr when the mount goes
    // Single-threaded: after each request, keep asking /dev/fuse for the next one (non-blocking)
    // for this many microseconds before sleeping in poll(); 0: block in read() as libfuse does.
    unsigned poll_us = 0;
};

// Serves `image` at `mountpoint` ("/dev/fd/N": an already mounted /dev/fuse descriptor) until the
// mount goes or a signal ends it. Returns the exit status for main().
int serve_image(const std::string& image, const std::string& mountpoint, const ServerOptions& options);

}  // namespace gantry::imagefs
