// gantry-imagefs: Gantry's FUSE server for squashfs images (runtime/imagefs/). The launcher mounts
// the image itself and starts this with the /dev/fuse descriptor as "/dev/fd/N"; run by hand in a
// user namespace it can also mount a directory (libfuse mounts it). The options are for measuring.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuse_server.hpp"

namespace {

int usage() {
    std::fputs(
        "usage: gantry-imagefs [OPTIONS] IMAGE MOUNTPOINT\n"
        "  --multithreaded        libfuse's worker pool (default: one thread answers everything)\n"
        "  --no-clone-fd          multithreaded: workers share one /dev/fuse descriptor\n"
        "  --max-threads=N        at most N worker threads\n"
        "  --max-readahead=BYTES  lower the kernel's readahead for this mount\n"
        "  --max-read=BYTES       limit each READ (a mount libfuse makes, by hand)\n"
        "  --readdirplus-auto     let the kernel choose readdir or readdirplus\n"
        "  --splice               reply to reads with splice\n"
        "  --timeout=SECONDS      entry and attribute timeout (default 1000000)\n"
        "  --poll-us=N            keep polling for the next request N microseconds before sleeping (default 0)\n"
        "  --report-requests      print request counts on stderr when unmounted\n"
        "  --debug                trace every request on stderr\n",
        stderr);
    return 2;
}

bool numeric_option(const char* arg, const char* name, unsigned long& out) {
    size_t len = std::strlen(name);
    if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
    char* end = nullptr;
    out = std::strtoul(arg + len + 1, &end, 10);
    return end != arg + len + 1 && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
    gantry::imagefs::ServerOptions options;
    int i = 1;
    for (; i < argc && std::strncmp(argv[i], "--", 2) == 0; ++i) {
        const char* a = argv[i];
        unsigned long n = 0;
        if (std::strcmp(a, "--multithreaded") == 0) {
            options.multithreaded = true;
        } else if (std::strcmp(a, "--no-clone-fd") == 0) {
            options.clone_fd = false;
        } else if (numeric_option(a, "--max-threads", n)) {
            options.max_threads = static_cast<unsigned>(n);
        } else if (numeric_option(a, "--max-readahead", n)) {
            options.max_readahead = static_cast<unsigned>(n);
        } else if (numeric_option(a, "--max-read", n)) {
            options.max_read = static_cast<unsigned>(n);
        } else if (std::strcmp(a, "--readdirplus-auto") == 0) {
            options.readdirplus_auto = true;
        } else if (std::strcmp(a, "--splice") == 0) {
            options.splice = true;
        } else if (numeric_option(a, "--poll-us", n)) {
            options.poll_us = static_cast<unsigned>(n);
        } else if (numeric_option(a, "--timeout", n)) {
            options.timeout = static_cast<double>(n);
        } else if (std::strcmp(a, "--report-requests") == 0) {
            options.report_requests = true;
        } else if (std::strcmp(a, "--debug") == 0) {
            options.debug = true;
        } else {
            return usage();
        }
    }
    if (argc - i != 2) return usage();
    return gantry::imagefs::serve_image(argv[i], argv[i + 1], options);
}
