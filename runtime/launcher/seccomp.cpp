// The system call filter every process in a container runs under (join installs it last, after
// PR_SET_NO_NEW_PRIVS): the chown family and the set*id/setgroups family return success without
// doing anything; every other call is allowed. /proc/PID/status shows `Seccomp: 2`.
//
// Why: the container's user namespace maps exactly one id (the user's, to 0 with --remap-root). A
// package manager running as that fake root chowns files to other owners and drops to a sandbox user
// (apt's `_apt`): the kernel refuses all of it (EINVAL for an unmapped id, EPERM for setgroups, which
// is denied), and `apt-get install` exits 100. Answering those calls with success lets the tools go
// on as if they had worked; files keep the user's ownership and the process keeps the user's ids.
//
// Why it is safe: the filter grants nothing. It only turns calls into no-ops — no call runs that
// would not have run without it, so no id, capability or file owner can change that could not
// before. The kernel still enforces the single-id mapping: the process stays the user, whatever it
// believes. A program that drops privileges with setuid() and trusts the return value keeps the
// user's own rights, the most it could ever hold here.
//
// The same filter is installed with and without --remap-root, as Enroot does (Pyxis's tests check
// `Seccomp: 2` in both cases): without remap-root the calls it answers would fail for the same
// reason (only the user's own id exists), and a no-op is as harmless there.
#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "internal.hpp"

namespace gantry::launcher {
namespace {

// The 32-bit variants (chown32, setuid32, ...) exist on 32-bit x86 and arm only; libseccomp skips a
// name on the architectures that lack it.
constexpr const char* kFakeSuccess[] = {
    "chown",       "fchown",     "lchown",     "fchownat",    "chown32",    "fchown32",   "lchown32",
    "setuid",      "setgid",     "setreuid",   "setregid",    "setresuid",  "setresgid",  "setfsuid",
    "setfsgid",    "setgroups",  "setuid32",   "setgid32",    "setreuid32", "setregid32", "setresuid32",
    "setresgid32", "setfsuid32", "setfsgid32", "setgroups32",
};

struct FilterRelease {
    void operator()(void* ctx) const { seccomp_release(ctx); }
};
using Filter = std::unique_ptr<void, FilterRelease>;

Error seccomp_error(const std::string& what, int rc) {
    return make_error("building the system call filter: " + what + ": " + std::strerror(-rc));
}

// The 32-bit architectures a 64-bit kernel also runs programs for: a 32-bit program in the image
// (int 0x80 on x86_64, AArch32 on arm64) gets the same answers.
std::vector<uint32_t> compat_arches(uint32_t native) {
    if (native == SCMP_ARCH_X86_64) return {SCMP_ARCH_X86, SCMP_ARCH_X32};
    if (native == SCMP_ARCH_AARCH64) return {SCMP_ARCH_ARM};
    return {};
}

Result<Filter> build_filter() {
    Filter f(seccomp_init(SCMP_ACT_ALLOW));
    if (!f) return make_error("building the system call filter: seccomp_init failed");
    // A call from an architecture the filter does not name (say x32 on a kernel that runs it) is
    // allowed, not killed: this filter only ever adds no-ops.
    if (int rc = seccomp_attr_set(f.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ALLOW); rc != 0)
        return seccomp_error("allowing other architectures", rc);
    for (uint32_t arch : compat_arches(seccomp_arch_native())) {
        int rc = seccomp_arch_add(f.get(), arch);
        if (rc != 0 && rc != -EEXIST) return seccomp_error("adding architecture " + std::to_string(arch), rc);
    }
    for (const char* name : kFakeSuccess) {
        int nr = seccomp_syscall_resolve_name(name);
        if (nr == __NR_SCMP_ERROR) continue;  // unknown to this libseccomp: nothing to answer
        if (int rc = seccomp_rule_add(f.get(), SCMP_ACT_ERRNO(0), nr, 0); rc != 0 && rc != -EDOM)
            return seccomp_error(std::string("answering ") + name, rc);
    }
    return f;
}

}  // namespace

std::vector<std::string> fake_success_syscalls() {
    return {std::begin(kFakeSuccess), std::end(kFakeSuccess)};
}

Result<std::string> describe_syscall_filter() {
    auto f = build_filter();
    if (!f) return f.error();
    // libseccomp writes the text to a descriptor: an anonymous memory file, read back.
    UniqueFd out(::memfd_create("gantry-seccomp-pfc", MFD_CLOEXEC));
    if (!out) return system_error("describing the system call filter");
    if (int rc = seccomp_export_pfc(f->get(), out.get()); rc != 0) return seccomp_error("exporting it", rc);
    std::string text;
    char chunk[4096];
    ssize_t n;
    ::lseek(out.get(), 0, SEEK_SET);
    while ((n = ::read(out.get(), chunk, sizeof chunk)) > 0) text.append(chunk, static_cast<size_t>(n));
    if (n < 0) return system_error("describing the system call filter");
    return text;
}

Status install_syscall_filter() {
    auto f = build_filter();
    if (!f) return f.error();
    if (int rc = seccomp_load(f->get()); rc != 0)
        return make_error("installing the system call filter: " + std::string(std::strerror(-rc)));
    return {};
}

}  // namespace gantry::launcher
