// Unit tests for the launcher module: mount-spec parsing, container paths, environment assembly,
// entrypoint/cmd resolution, fd-relative resolution inside a root full of hostile symlinks, the
// plan of a read-only container's top-level entries, the fake-root system call filter, and the
// Enroot-format drop-ins and image environment; joining a holder as a new instance (NAME:no_exec).
#include "gantry/launcher.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../runtime/launcher/holder_reply.hpp"
#include "../../runtime/launcher/internal.hpp"
#include "gantry/dropins.hpp"
#include "gantry/environment.hpp"
#include "gantry/mounts.hpp"
#include "gantry/squashfs.hpp"
#include "gantry/workdir.hpp"

using namespace gantry;

TEST_CASE("mounts: SRC, SRC:DST and flags") {
    auto m = parse_mount("/fsx");
    REQUIRE(m.ok());
    CHECK(m->kind == MountKind::bind);
    CHECK(m->source == "/fsx");
    CHECK(m->destination == "/fsx");
    CHECK(m->recursive);
    CHECK_FALSE(m->read_only);
    CHECK(m->propagation == Propagation::private_);

    m = parse_mount("/data:/mnt/data:ro+nosuid+nodev+noexec+bind+slave");
    REQUIRE(m.ok());
    CHECK(m->destination == "/mnt/data");
    CHECK(m->read_only);
    CHECK(m->nosuid);
    CHECK(m->nodev);
    CHECK(m->noexec);
    CHECK_FALSE(m->recursive);
    CHECK(m->propagation == Propagation::slave);
    CHECK_FALSE(m->propagation_recursive);

    m = parse_mount("/a:/b:ro+rw+rshared");
    REQUIRE(m.ok());
    CHECK_FALSE(m->read_only);  // the last of ro/rw wins
    CHECK(m->propagation == Propagation::shared);
    CHECK(m->propagation_recursive);

    m = parse_mount("/dev/infiniband:/dev/infiniband");
    REQUIRE(m.ok());
    CHECK(m->destination == "/dev/infiniband");
}

TEST_CASE("mounts: tmpfs, umount and relative destinations") {
    auto m = parse_mount("tmpfs:/scratch:size=1G+mode=1777+nosuid");
    REQUIRE(m.ok());
    CHECK(m->kind == MountKind::tmpfs);
    CHECK(m->destination == "/scratch");
    CHECK(m->data == "size=1G,mode=1777");
    CHECK(m->nosuid);

    m = parse_mount("umount:/dev/shm");
    REQUIRE(m.ok());
    CHECK(m->kind == MountKind::umount);
    CHECK(m->destination == "/dev/shm");

    m = parse_mount("/data:./work//sub/");
    REQUIRE(m.ok());
    CHECK(m->destination == "/work/sub");

    m = parse_mount("./relative-src:/x");
    REQUIRE(m.ok());
    CHECK(m->source == "./relative-src");
}

TEST_CASE("mounts: malformed entries are errors that name the entry") {
    CHECK_FALSE(parse_mount("").ok());
    CHECK_FALSE(parse_mount("tmpfs").ok());  // tmpfs needs a destination
    CHECK_FALSE(parse_mount("umount").ok());
    CHECK_FALSE(parse_mount("relative:/x").ok());  // source neither absolute nor ./
    CHECK_FALSE(parse_mount("/a:relative").ok());  // destination neither absolute nor ./
    CHECK_FALSE(parse_mount("/a:/b:c:d").ok());
    CHECK_FALSE(parse_mount("/a:/b:").ok());
    CHECK_FALSE(parse_mount("/a:/").ok());  // over the root
    CHECK_FALSE(parse_mount("umount:/x:ro").ok());
    auto bad = parse_mount("/a:/b:ro+frobnicate");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("unknown mount flag 'frobnicate'") != std::string::npos);
    auto bind_opt = parse_mount("/a:/b:size=1G");  // key=value only for tmpfs
    CHECK_FALSE(bind_opt.ok());
    auto esc = parse_mount("/a:/x/../../etc");
    REQUIRE_FALSE(esc.ok());
    CHECK(esc.error().message == "mount destination /x/../../etc: '..' is not allowed");
    // Found by tests/fuzz/fuzz_container_mounts: the kernel stops at a NUL, so "/\0x" was the root.
    using namespace std::string_view_literals;
    CHECK_FALSE(parse_mount("/a:/\0x"sv).ok());
    CHECK_FALSE(parse_mount("/a\0/etc:/b"sv).ok());
    CHECK_FALSE(gantry::normalize_container_path("/etc\0/x"sv, "path").ok());
}

TEST_CASE("mounts: lists, duplicates dropped") {
    std::vector<MountSpec> out;
    REQUIRE(parse_mounts("/a:/a, /b:/c:ro,/a:/a", out).ok());
    REQUIRE(out.size() == 2);
    REQUIRE(parse_mounts("/b:/c:ro,/a", out).ok());  // the option given twice: no new entries
    CHECK(out.size() == 2);
    REQUIRE(parse_mounts("/b:/c", out).ok());  // same paths, other flags: kept
    CHECK(out.size() == 3);
    CHECK_FALSE(parse_mounts("/a,bad", out).ok());
}

TEST_CASE("mounts: missing sources") {
    std::vector<MountSpec> out;
    REQUIRE(parse_mounts("/nonexistent-gantry-src:/x,tmpfs:/t", out).ok());
    auto st = check_mount_sources(out);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().message == "mounting /nonexistent-gantry-src at /x: source path does not exist");
    out.clear();
    REQUIRE(parse_mounts("/tmp:/x,tmpfs:/t,umount:/u", out).ok());
    CHECK(check_mount_sources(out).ok());
}

TEST_CASE("container paths are normalized and confined") {
    CHECK(*normalize_container_path("/", "p") == "/");
    CHECK(*normalize_container_path(".", "p") == "/");
    CHECK(*normalize_container_path("./a/./b//", "p") == "/a/b");
    CHECK_FALSE(normalize_container_path("a/b", "p").ok());
    CHECK_FALSE(normalize_container_path("", "p").ok());
    CHECK_FALSE(normalize_container_path("/a/..", "mount destination").ok());
}

TEST_CASE("a working directory's .. stays inside the container (Pyxis: --container-workdir=../ is /)") {
    CHECK(*normalize_container_workdir("../") == "/");
    CHECK(*normalize_container_workdir("/..") == "/");
    CHECK(*normalize_container_workdir("/a/../b/") == "/b");
    CHECK(*normalize_container_workdir("./a/../../../c") == "/c");
    CHECK(*normalize_container_workdir("/usr/local/bin") == "/usr/local/bin");
    CHECK_FALSE(normalize_container_workdir("a/b").ok());
    CHECK_FALSE(normalize_container_workdir("").ok());
    CHECK_FALSE(normalize_container_workdir(std::string_view("/a\0b", 4)).ok());
}

TEST_CASE("unshare and backend names") {
    auto ns = parse_unshare("net, uts");
    REQUIRE(ns.ok());
    CHECK(ns->net);
    CHECK(ns->uts);
    CHECK_FALSE(ns->ipc);
    auto bad = parse_unshare("net,pid");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("unknown namespace 'pid'") != std::string::npos);
    CHECK(*parse_mount_backend("fuse") == MountBackend::fuse);
    CHECK_FALSE(parse_mount_backend("loop").ok());
}

TEST_CASE("environment, docker rule (gantry run): image env, Slurm wiring, --env names, LANG, HOME") {
    ProcessDefaults d;
    d.image_env = {"PATH=/opt/bin:/usr/bin", "LANG=C.UTF-8", "FOO=image", "BAR=image", "HOME=/image-home"};
    d.env_names = {"BAR", "MISSING"};
    d.home = "/home/u";
    std::vector<std::string> host = {"PATH=/host/bin", "LANG=de_DE.UTF-8", "LC_ALL=de_DE.UTF-8", "FOO=host",
                                     "BAR=host",       "SLURM_PROCID=3",   "PMIX_RANK=3",        "PMI_FD=7",
                                     "SECRET=x",       "TERM=xterm"};
    auto env = container_environment(d, host, EnvironmentRule::docker);
    auto has = [&](const std::string& e) { return std::find(env.begin(), env.end(), e) != env.end(); };
    CHECK(has("PATH=/opt/bin:/usr/bin"));  // PATH from the image
    CHECK(has("LANG=C.UTF-8"));            // LANG from the image, not the host
    CHECK_FALSE(has("LC_ALL=de_DE.UTF-8"));
    CHECK(has("FOO=image"));  // not named: image wins
    CHECK(has("BAR=host"));   // named: host wins
    CHECK(has("SLURM_PROCID=3"));
    CHECK(has("PMIX_RANK=3"));
    CHECK(has("PMI_FD=7"));
    CHECK(has("HOME=/home/u"));
    CHECK(has("TERM=xterm"));
    CHECK_FALSE(has("SECRET=x"));  // the caller's shell stays outside
    CHECK(std::none_of(env.begin(), env.end(), [](const std::string& e) { return e.rfind("MISSING=", 0) == 0; }));

    d.env_names = {"LANG", "PATH"};
    env = container_environment(d, host, EnvironmentRule::docker);
    CHECK(has("LANG=de_DE.UTF-8"));
    CHECK(has("PATH=/host/bin"));

    ProcessDefaults bare;
    env = container_environment(bare, {}, EnvironmentRule::docker);
    CHECK(has("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
    CHECK(has("HOME=/"));
}

TEST_CASE("environment: --env NAME=VALUE sets the value over the image, the host, the wiring and HOME") {
    ProcessDefaults d;
    d.image_env = {"FOO=image", "KEEP=image"};
    d.env_names = {"BAR"};
    d.home = "/home/u";
    d.env_values = {"FOO=bar", "BAR=given", "SLURM_PROCID=9", "HOME=/elsewhere", "EMPTY=", "EQ=a=b", "FOO=last"};
    std::vector<std::string> host = {"FOO=host", "BAR=host", "SLURM_PROCID=3"};
    for (auto rule : {EnvironmentRule::docker, EnvironmentRule::pyxis}) {
        auto env = container_environment(d, host, rule);
        auto has = [&](const std::string& e) { return std::find(env.begin(), env.end(), e) != env.end(); };
        CHECK(has("FOO=last"));  // later entries win
        CHECK_FALSE(has("FOO=bar"));
        CHECK(has("BAR=given"));
        CHECK(has("SLURM_PROCID=9"));
        CHECK(has("HOME=/elsewhere"));
        CHECK(has("EMPTY="));
        CHECK(has("EQ=a=b"));
        CHECK(has("KEEP=image"));
    }
}

namespace {

bool has_entry(const std::vector<std::string>& env, const std::string& entry) {
    return std::find(env.begin(), env.end(), entry) != env.end();
}

bool has_name(const std::vector<std::string>& env, const std::string& name) {
    return std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(name + "=", 0) == 0; });
}

}  // namespace

TEST_CASE("environment, pyxis rule (Slurm task): every job variable the image does not define") {
    ProcessDefaults d;
    d.image_env = {"PATH=/opt/conda/bin:/usr/bin", "NCCL_DEBUG=WARN", "CUDA_VERSION=12.4"};
    d.home = "/home/u";
    std::vector<std::string> job = {"NCCL_DEBUG=INFO", "FI_PROVIDER=efa",   "FI_EFA_USE_DEVICE_RDMA=1",
                                    "HF_TOKEN=hf_x",   "MASTER_PORT=29500", "CUDA_VERSION=11.8",
                                    "EMPTY=",          "TERM=xterm",        "USER=u"};
    auto env = container_environment(d, job, EnvironmentRule::pyxis);
    // Job variables pass, with the job's value (an empty one included).
    CHECK(has_entry(env, "FI_PROVIDER=efa"));
    CHECK(has_entry(env, "FI_EFA_USE_DEVICE_RDMA=1"));
    CHECK(has_entry(env, "HF_TOKEN=hf_x"));
    CHECK(has_entry(env, "MASTER_PORT=29500"));
    CHECK(has_entry(env, "EMPTY="));
    CHECK(has_entry(env, "TERM=xterm"));
    CHECK(has_entry(env, "USER=u"));
    // The image's value wins for a name it defines...
    CHECK(has_entry(env, "NCCL_DEBUG=WARN"));
    CHECK(has_entry(env, "CUDA_VERSION=12.4"));
    CHECK_FALSE(has_entry(env, "NCCL_DEBUG=INFO"));
    // ...unless --container-env names it: then the job's value wins.
    d.env_names = {"NCCL_DEBUG"};
    env = container_environment(d, job, EnvironmentRule::pyxis);
    CHECK(has_entry(env, "NCCL_DEBUG=INFO"));
    CHECK(has_entry(env, "CUDA_VERSION=12.4"));
    // The same job under the docker rule (gantry run) keeps all of them out.
    d.env_names.clear();
    env = container_environment(d, job, EnvironmentRule::docker);
    CHECK_FALSE(has_name(env, "FI_PROVIDER"));
    CHECK_FALSE(has_name(env, "HF_TOKEN"));
}

TEST_CASE("environment, pyxis rule: the device wiring counts as the image's") {
    ProcessDefaults d;
    d.device_env = {"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "CUDA_VISIBLE_DEVICES=0,1", "FI_PROVIDER=efa"};
    std::vector<std::string> job = {"CUDA_VISIBLE_DEVICES=2,3", "FI_PROVIDER=tcp", "NCCL_DEBUG=INFO"};
    auto env = container_environment(d, job, EnvironmentRule::pyxis);
    CHECK(has_entry(env, "CUDA_VISIBLE_DEVICES=0,1"));  // renumbered for the container, not the host's
    CHECK(has_entry(env, "FI_PROVIDER=efa"));
    CHECK(has_entry(env, "NCCL_DEBUG=INFO"));
    d.env_names = {"FI_PROVIDER"};
    env = container_environment(d, job, EnvironmentRule::pyxis);
    CHECK(has_entry(env, "FI_PROVIDER=tcp"));
}

TEST_CASE("environment, pyxis rule: SLURM_* and PMI* from the job win over the image's") {
    ProcessDefaults d;
    d.image_env = {"SLURM_PROCID=0", "SLURM_JOB_ID=1", "PMIX_RANK=0", "SLURM_CONF=/image/slurm.conf"};
    std::vector<std::string> job = {"SLURM_PROCID=5", "SLURM_JOB_ID=42",    "PMIX_RANK=5",
                                    "PMI_FD=9",       "SLURMD_NODENAME=n2", "SLURM_CONF=/etc/slurm/slurm.conf"};
    for (auto rule : {EnvironmentRule::pyxis, EnvironmentRule::docker}) {
        auto env = container_environment(d, job, rule);
        CHECK(has_entry(env, "SLURM_PROCID=5"));
        CHECK(has_entry(env, "SLURM_JOB_ID=42"));
        CHECK(has_entry(env, "PMIX_RANK=5"));
        CHECK(has_entry(env, "PMI_FD=9"));
        CHECK(has_entry(env, "SLURMD_NODENAME=n2"));
        CHECK(has_entry(env, "SLURM_CONF=/etc/slurm/slurm.conf"));
        CHECK_FALSE(has_entry(env, "SLURM_PROCID=0"));
    }
}

TEST_CASE("environment, pyxis rule: PATH, library paths, HOME, PWD and locales describe the host") {
    std::vector<std::string> job = {"PATH=/home/u/bin:/usr/bin",
                                    "LD_LIBRARY_PATH=/opt/slurm/lib",
                                    "LD_PRELOAD=/usr/lib/libhost.so",
                                    "HOME=/home/u",
                                    "PWD=/home/u/project",
                                    "OLDPWD=/home/u",
                                    "LANG=de_DE.UTF-8",
                                    "LANGUAGE=de",
                                    "LC_ALL=de_DE.UTF-8",
                                    "LC_CTYPE=UTF-8",
                                    "NCCL_DEBUG=INFO"};
    ProcessDefaults bare;  // an image without PATH: the default PATH, not the job's
    bare.home = "/root";
    auto env = container_environment(bare, job, EnvironmentRule::pyxis);
    CHECK(has_entry(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
    CHECK(has_entry(env, "HOME=/root"));
    for (const char* name :
         {"LD_LIBRARY_PATH", "LD_PRELOAD", "PWD", "OLDPWD", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE"})
        CHECK_FALSE(has_name(env, name));
    CHECK(has_entry(env, "NCCL_DEBUG=INFO"));

    ProcessDefaults image;  // an image with PATH and LD_LIBRARY_PATH: its values
    image.image_env = {"PATH=/opt/conda/bin:/usr/bin", "LD_LIBRARY_PATH=/usr/local/cuda/lib64", "LANG=C.UTF-8"};
    env = container_environment(image, job, EnvironmentRule::pyxis);
    CHECK(has_entry(env, "PATH=/opt/conda/bin:/usr/bin"));
    CHECK(has_entry(env, "LD_LIBRARY_PATH=/usr/local/cuda/lib64"));
    CHECK(has_entry(env, "LANG=C.UTF-8"));
    CHECK_FALSE(has_name(env, "LC_ALL"));

    // --container-env brings any of them in with the job's value.
    image.env_names = {"PATH", "LD_LIBRARY_PATH", "LC_ALL", "HOME"};
    env = container_environment(image, job, EnvironmentRule::pyxis);
    CHECK(has_entry(env, "PATH=/home/u/bin:/usr/bin"));
    CHECK(has_entry(env, "LD_LIBRARY_PATH=/opt/slurm/lib"));
    CHECK(has_entry(env, "LC_ALL=de_DE.UTF-8"));
    CHECK(has_entry(env, "HOME=/home/u"));
    CHECK_FALSE(has_name(env, "LANGUAGE"));
}

TEST_CASE("command: OCI entrypoint and cmd rules") {
    ProcessSpec p;
    p.entrypoint = {"/entry.sh", "-x"};
    p.cmd = {"serve", "--port=1"};
    CHECK(resolve_command(p) == std::vector<std::string>{"serve", "--port=1"});  // entrypoint off (default)
    p.argv = {"echo", "hi"};
    CHECK(resolve_command(p) == std::vector<std::string>{"echo", "hi"});
    p.use_entrypoint = true;
    CHECK(resolve_command(p) == std::vector<std::string>{"/entry.sh", "-x", "echo", "hi"});  // args replace CMD
    p.argv.clear();
    CHECK(resolve_command(p) == std::vector<std::string>{"/entry.sh", "-x", "serve", "--port=1"});
    p.entrypoint.clear();
    CHECK(resolve_command(p) == std::vector<std::string>{"serve", "--port=1"});
    ProcessSpec none;
    CHECK(resolve_command(none) == std::vector<std::string>{"/bin/sh"});
}

namespace {

struct TempTree {
    std::string dir;
    TempTree() {
        char t[] = "/tmp/gantry-launcher-test-XXXXXX";
        dir = ::mkdtemp(t);
    }
    ~TempTree() { (void)!std::system(("rm -rf '" + dir + "'").c_str()); }
    void mkdir(const std::string& p) const { ::mkdir((dir + p).c_str(), 0755); }
    void link(const std::string& target, const std::string& p) const {
        (void)!::symlink(target.c_str(), (dir + p).c_str());
    }
    [[nodiscard]] std::string where(int fd) const {
        char buf[4096] = {};
        auto n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), buf, sizeof buf - 1);
        return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    }
};

}  // namespace

TEST_CASE("paths: resolution stays inside the root") {
    TempTree t;
    t.mkdir("/etc");
    t.mkdir("/data");
    t.link("/etc", "/abs");               // absolute: the root's /etc, not the host's
    t.link("../../../../../etc", "/up");  // climbing out: clamped at the root
    t.link("/proc/self/root/etc", "/magic");
    UniqueFd root(::open(t.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    REQUIRE(root);

    auto fd = open_in_root(root.get(), "/abs");
    REQUIRE(fd.ok());
    CHECK(t.where(fd->get()) == t.dir + "/etc");
    fd = open_in_root(root.get(), "/up");
    REQUIRE(fd.ok());
    CHECK(t.where(fd->get()) == t.dir + "/etc");
    CHECK_FALSE(open_in_root(root.get(), "/magic").ok());  // magic links refused (or missing in root)
    CHECK_FALSE(open_in_root(root.get(), "/missing").ok());
    CHECK(open_in_root(root.get(), "/missing").error().errnum == ENOENT);

    // Creating below a symlink creates inside the root.
    auto made = ensure_in_root(root.get(), "/abs/new/dir", NodeType::directory);
    REQUIRE(made.ok());
    CHECK(t.where(made->get()) == t.dir + "/etc/new/dir");
    made = ensure_in_root(root.get(), "/data/file", NodeType::file);
    REQUIRE(made.ok());
    struct stat st {};
    REQUIRE(::stat((t.dir + "/data/file").c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK(::access("/etc/new", F_OK) != 0);  // nothing on the host

    // A dangling symlink is not followed to create its target outside.
    t.link("/nowhere-gantry-test", "/dangling");
    auto d = ensure_in_root(root.get(), "/dangling", NodeType::file);
    CHECK(::access("/nowhere-gantry-test", F_OK) != 0);
    (void)d;
}

TEST_CASE("root entries: image entries bound or copied, ours kept, directories in both merged") {
    auto touch = [](const std::string& path) {
        std::FILE* f = std::fopen(path.c_str(), "w");
        REQUIRE(f);
        std::fclose(f);
    };
    TempTree image, upper;
    for (const char* d : {"/etc", "/usr", "/proc", "/tmp", "/home", "/opt"}) image.mkdir(d);
    image.link("usr/bin", "/bin");
    image.link("/nowhere-gantry-test", "/dangling");
    touch(image.dir + "/vmlinuz");
    upper.mkdir("/etc");        // generated passwd, hosts: merged with the image's /etc
    upper.mkdir("/fsx");        // a new top-level mount point: ours alone
    upper.mkdir("/home");       // a home below the image's /home: merged
    touch(upper.dir + "/opt");  // a file of ours over an image directory: ours wins
    UniqueFd img(::open(image.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    UniqueFd up(::open(upper.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    auto plan = launcher::plan_root_entries(img.get(), up.get(), {"proc", "tmp"});
    REQUIRE(plan.ok());
    std::vector<std::string> got;
    for (const auto& e : *plan) got.push_back(e.name + "=" + std::to_string(static_cast<int>(e.kind)));
    using K = launcher::RootEntryKind;
    auto entry = [](const std::string& n, K k) { return n + "=" + std::to_string(static_cast<int>(k)); };
    CHECK(got == std::vector<std::string>{entry("bin", K::image_symlink), entry("dangling", K::image_symlink),
                                          entry("etc", K::merged), entry("fsx", K::ours), entry("home", K::merged),
                                          entry("opt", K::ours), entry("proc", K::mount_point),
                                          entry("tmp", K::mount_point), entry("usr", K::image_dir),
                                          entry("vmlinuz", K::image_other)});
    CHECK(::access("/nowhere-gantry-test", F_OK) != 0);  // the dangling link was looked at, never followed
}

TEST_CASE("syscall filter: the chown and set*id families answer success, everything else is allowed") {
    // One filter, with and without remap-root (as Enroot): it takes no mode.
    auto names = launcher::fake_success_syscalls();
    for (const char* n : {"chown", "fchown", "lchown", "fchownat", "setuid", "setgid", "setreuid", "setregid",
                          "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups"})
        CHECK(std::find(names.begin(), names.end(), n) != names.end());
    auto text = launcher::describe_syscall_filter();
    REQUIRE(text.ok());
    INFO(*text);
    // Every native call of the list has its rule, whose action is "return 0".
    for (const char* n : {"fchown", "fchownat", "setuid", "setresuid", "setresgid", "setfsgid", "setgroups"})
        CHECK(text->find(std::string("\"") + n + "\"") != std::string::npos);
#if defined(__x86_64__)
    for (const char* n : {"chown", "lchown"}) CHECK(text->find(std::string("\"") + n + "\"") != std::string::npos);
    CHECK(text->find("filter for arch x86 ") != std::string::npos);  // 32-bit programs get the same answers
#elif defined(__aarch64__)
    CHECK(text->find("filter for arch arm ") != std::string::npos);
#endif
    CHECK(text->find("action ERRNO(0);") != std::string::npos);
    CHECK(text->find("action ALLOW;") != std::string::npos);  // default, and for other architectures
    CHECK(text->find("KILL") == std::string::npos);
    CHECK(text->find("TRAP") == std::string::npos);
    // Nothing else is touched: no rule for calls outside the list.
    for (const char* n : {"\"open", "\"execve\"", "\"mount\"", "\"setns\"", "\"getuid\""})
        CHECK(text->find(n) == std::string::npos);
}

TEST_CASE("syscall filter: once installed, chown to a foreign id and setresuid return 0 and change nothing") {
    char tmpl[] = "/tmp/gantry-seccomp-test.XXXXXX";
    int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    ::close(fd);
    std::string path = tmpl;
    struct stat before {};
    REQUIRE(::stat(path.c_str(), &before) == 0);
    uid_t uid = ::getuid();
    gid_t gid = ::getgid();
    int pipefd[2];
    REQUIRE(::pipe(pipefd) == 0);
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        // The filter is for good: only a child may install it. It reports one word per check.
        ::close(pipefd[0]);
        std::string r;
        auto st = launcher::install_syscall_filter();
        r += st ? "installed" : "failed:" + st.error().message;
        const uid_t foreign = uid == 1234 ? 1235 : 1234;
        r += ::chown(path.c_str(), foreign, foreign) == 0 ? " chown=0" : " chown=" + std::string(std::strerror(errno));
        r += ::lchown(path.c_str(), foreign, foreign) == 0 ? " lchown=0" : " lchown=err";
        r += ::fchownat(AT_FDCWD, path.c_str(), foreign, foreign, 0) == 0 ? " fchownat=0" : " fchownat=err";
        r += ::setresuid(4321, 4321, 4321) == 0 ? " setresuid=0" : " setresuid=err";
        r += ::setgid(4321) == 0 ? " setgid=0" : " setgid=err";
        gid_t g = 4321;
        r += ::setgroups(1, &g) == 0 ? " setgroups=0" : " setgroups=err";
        r += ::getuid() == uid && ::getgid() == gid ? " ids-unchanged" : " ids-changed";
        // Calls outside the list still fail as they should.
        r += ::rmdir("/nonexistent-gantry-seccomp") != 0 && errno == ENOENT ? " rmdir=ENOENT" : " rmdir=?";
        std::FILE* status = std::fopen("/proc/self/status", "r");
        char line[256];
        while (status != nullptr && std::fgets(line, sizeof line, status) != nullptr)
            if (std::strncmp(line, "Seccomp:", 8) == 0) r += " " + std::string(line, std::strcspn(line, "\n"));
        if (status != nullptr) std::fclose(status);
        (void)!::write(pipefd[1], r.data(), r.size());
        ::_exit(0);
    }
    ::close(pipefd[1]);
    std::string report;
    char buf[512];
    ssize_t n;
    while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(n));
    ::close(pipefd[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(report ==
          "installed chown=0 lchown=0 fchownat=0 setresuid=0 setgid=0 setgroups=0 ids-unchanged "
          "rmdir=ENOENT Seccomp:\t2");
    struct stat after {};
    REQUIRE(::stat(path.c_str(), &after) == 0);
    CHECK(after.st_uid == before.st_uid);  // even for root: the call never ran
    CHECK(after.st_gid == before.st_gid);
    ::unlink(path.c_str());
}

// --- Enroot-format drop-ins and image environment (include/gantry/dropins.hpp) ---

namespace {

// A fresh directory under $TMPDIR, removed with everything in it when the test ends.
struct ScratchDir {
    std::string path;
    ScratchDir() {
        std::string tmpl = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/dropins.XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        REQUIRE(::mkdtemp(buf.data()) != nullptr);
        path = buf.data();
        ::chmod(path.c_str(), 0755);
    }
    ~ScratchDir() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
    void write(const std::string& name, const std::string& text, mode_t mode = 0644) const {
        std::string p = path + "/" + name;
        FILE* f = std::fopen(p.c_str(), "w");
        REQUIRE(f != nullptr);
        std::fputs(text.c_str(), f);
        std::fclose(f);
        ::chmod(p.c_str(), mode);
    }
};

}  // namespace

TEST_CASE("drop-ins: ${NAME} expansion follows Enroot") {
    std::vector<std::string> env = {"HOME=/home/u", "EMPTY=", "A=1", "A=2"};
    CHECK(*expand_variables("${HOME}/x", env) == "/home/u/x");
    CHECK(*expand_variables("a${UNSET}b", env) == "ab");
    CHECK(*expand_variables("${EMPTY}", env) == "");
    CHECK(*expand_variables("${A}", env) == "2");                                         // the last entry wins
    CHECK(*expand_variables("$HOME and $ and $(cmd)", env) == "$HOME and $ and $(cmd)");  // only ${NAME}
    CHECK(*expand_variables("cost: 5$", env) == "cost: 5$");
    auto bad = expand_variables("${HOME:-/tmp}", env);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("${HOME:-/tmp}") != std::string::npos);
    CHECK_FALSE(expand_variables("${HOME", env).ok());
    CHECK_FALSE(expand_variables("${1X}", env).ok());
}

TEST_CASE("drop-ins: .env files") {
    std::vector<std::string> env = {"SLURM_JOB_ID=42", "PATH=/usr/bin"};
    auto vars = parse_environment_file(
        "# NCCL tuning\n\nNCCL_DEBUG=INFO\nexport FI_PROVIDER=efa\nQUOTED=\"a b\"\nSINGLE='x=y'\n"
        "JOB_DIR=/scratch/${SLURM_JOB_ID}\n  SPACED = v  \nEMPTY=\n",
        env, "/etc/gantry/environ.d/10-nccl.env");
    REQUIRE(vars.ok());
    CHECK(*vars == std::vector<std::string>{"NCCL_DEBUG=INFO", "FI_PROVIDER=efa", "QUOTED=a b", "SINGLE=x=y",
                                            "JOB_DIR=/scratch/42", "SPACED=v", "EMPTY="});

    auto bad = parse_environment_file("A=1\nthis is not an assignment\n", env, "/d/20-x.env");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message == "/d/20-x.env:2: expected NAME=VALUE, got 'this is not an assignment'");
    bad = parse_environment_file("1A=x\n", env, "f.env");
    CHECK_FALSE(bad.ok());
    bad = parse_environment_file("A=${B:-c}\n", env, "f.env");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.rfind("f.env:1: A: ", 0) == 0);

    // An image's /etc/environment is the user's: odd lines are skipped, not fatal.
    auto lenient = parse_environment_file("garbage\nPATH=\"/opt/x/bin:/usr/bin\"\nB=${B:-c}\n", env, "img", true);
    REQUIRE(lenient.ok());
    CHECK(*lenient == std::vector<std::string>{"PATH=/opt/x/bin:/usr/bin", "B=${B:-c}"});
}

TEST_CASE("drop-ins: .fstab files") {
    std::vector<std::string> env = {"SITE=/srv/site"};
    auto m = parse_fstab_file(
        "# shared storage\n"
        "/fsx /fsx none x-create=dir,rbind,nofail 0 0\n"
        "${SITE}/tools opt/tools none x-create=dir,bind,ro,nosuid\n"
        "/etc/site.cfg /etc/site.cfg rbind\n"
        "tmpfs /scratch tmpfs size=1G,mode=1777\n"
        "tmpfs /tmp2\n"
        "/data ./data\n",
        env, "/etc/gantry/mounts.d/10-site.fstab");
    REQUIRE(m.ok());
    REQUIRE(m->size() == 6);
    const auto& fsx = (*m)[0];
    CHECK(fsx.mount.kind == MountKind::bind);
    CHECK(fsx.mount.source == "/fsx");
    CHECK(fsx.mount.destination == "/fsx");
    CHECK(fsx.mount.recursive);
    CHECK(fsx.nofail);
    CHECK(fsx.where == "/etc/gantry/mounts.d/10-site.fstab:2");
    const auto& tools = (*m)[1];
    CHECK(tools.mount.source == "/srv/site/tools");
    CHECK(tools.mount.destination == "/opt/tools");  // relative to the container root
    CHECK_FALSE(tools.mount.recursive);
    CHECK(tools.mount.read_only);
    CHECK(tools.mount.nosuid);
    CHECK_FALSE(tools.nofail);
    CHECK((*m)[2].mount.kind == MountKind::bind);  // three fields: the third is the options
    CHECK((*m)[2].mount.recursive);
    CHECK((*m)[3].mount.kind == MountKind::tmpfs);
    CHECK((*m)[3].mount.data == "size=1G,mode=1777");
    CHECK((*m)[4].mount.kind == MountKind::tmpfs);
    CHECK((*m)[4].mount.destination == "/tmp2");
    CHECK((*m)[5].mount.destination == "/data");

    auto err = [&](const std::string& text) {
        auto r = parse_fstab_file("# first\n" + text, env, "f.fstab");
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.rfind("f.fstab:2: ", 0) == 0);
        return r.error().message;
    };
    CHECK(err("server:/export /nfs nfs defaults\n").find("file system type 'nfs'") != std::string::npos);
    CHECK(err("relative/src /dst none bind\n").find("not an absolute host path") != std::string::npos);
    CHECK(err("/a /../etc none bind\n").find("'..'") != std::string::npos);
    CHECK(err("/a /b none bind,x-move\n").find("x-move") != std::string::npos);
    CHECK(err("/a /b none bind,x-create=pipe\n").find("x-create") != std::string::npos);
    CHECK(err("/a /b none bind,frobnicate\n").find("frobnicate") != std::string::npos);
    CHECK(err("/only-one-field\n").find("SOURCE TARGET") != std::string::npos);
    CHECK(err("${UNSET}x /x none bind\n").find("not an absolute host path") != std::string::npos);
}

TEST_CASE("drop-ins: directories in lexical order, owner and mode checked") {
    ScratchDir env_dir, mount_dir, src;
    env_dir.write("20-late.env", "A=late\nC=${JOB}\n");
    env_dir.write("10-early.env", "A=early\nB=b\n");
    env_dir.write("README", "not=read\n");
    mount_dir.write("10-site.fstab", src.path + " /site none x-create=dir\n/nonexistent/x /x none nofail\n");
    Config config;
    config.environ_dir = env_dir.path;
    config.mounts_dir = mount_dir.path;
    auto site = load_site_defaults(config, {"JOB=7"});
    REQUIRE(site.ok());
    CHECK(site->env == std::vector<std::string>{"A=early", "B=b", "A=late", "C=7"});
    // Sources are not looked at here (this runs as root in the plugin, and a source may hold ${USER}):
    // the nofail mount of a missing source stays, marked, and the user-side check leaves it out.
    REQUIRE(site->mounts.size() == 2);
    CHECK(site->mounts[0].source == src.path);
    CHECK(site->mounts[0].destination == "/site");
    CHECK_FALSE(site->mounts[0].nofail);
    CHECK(site->mounts[1].source == "/nonexistent/x");
    CHECK(site->mounts[1].nofail);
    CHECK(check_mount_sources(site->mounts).ok());

    SECTION("a missing source without nofail fails the user-side check") {
        mount_dir.write("20-more.fstab", "/nonexistent/y /y none bind\n");
        auto r = load_site_defaults(config, {});
        REQUIRE(r.ok());
        auto checked = check_mount_sources(r->mounts);
        REQUIRE_FALSE(checked.ok());
        CHECK(checked.error().message.find(
                  mount_dir.path + "/20-more.fstab:1: mounting /nonexistent/y at /y: source path does not exist") == 0);
        CHECK(checked.error().message.find("nofail") != std::string::npos);
    }
    SECTION("a group-writable file is refused before it is parsed") {
        env_dir.write("30-bad.env", "this would not parse\n", 0664);
        auto r = load_site_defaults(config, {});
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("drop-in file " + env_dir.path +
                                     "/30-bad.env is writable by its group or others") == 0);
        CHECK(r.error().message.find("chmod go-w") != std::string::npos);
    }
    SECTION("an other-writable directory is refused") {
        ::chmod(mount_dir.path.c_str(), 0757);
        auto r = load_site_defaults(config, {});
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("drop-in directory " + mount_dir.path) == 0);
    }
    SECTION("missing or disabled directories add nothing") {
        config.environ_dir = env_dir.path + "/absent";
        config.mounts_dir.clear();
        auto r = load_site_defaults(config, {});
        REQUIRE(r.ok());
        CHECK(r->env.empty());
        CHECK(r->mounts.empty());
    }
}

TEST_CASE("drop-ins: a file owned by another user is refused", "[root]") {
    ScratchDir dir;
    dir.write("10-x.env", "A=1\n");
    REQUIRE(::chown((dir.path + "/10-x.env").c_str(), 65534, 65534) == 0);
    Config config;
    config.environ_dir = dir.path;
    config.mounts_dir.clear();
    auto r = load_site_defaults(config, {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("is owned by uid 65534, not root") != std::string::npos);
}

namespace {

// An Enroot-style image: a tree with /etc/environment (and /etc/rc), squashed by mksquashfs
// (squashfs-tools).
std::string make_enroot_image(const ScratchDir& dir, const std::string& environment, const std::string& rc = {}) {
    std::string tree = dir.path + "/tree";
    REQUIRE(::mkdir(tree.c_str(), 0755) == 0);
    REQUIRE(::mkdir((tree + "/etc").c_str(), 0755) == 0);
    if (!environment.empty()) dir.write("tree/etc/environment", environment);
    if (!rc.empty()) dir.write("tree/etc/rc", rc);
    std::string image = dir.path + "/image.sqsh";
    REQUIRE(std::system(
                ("mksquashfs '" + tree + "' '" + image + "' -noappend -quiet -no-progress >/dev/null").c_str()) == 0);
    ::chmod(image.c_str(), 0644);
    return image;
}

}  // namespace

TEST_CASE("image environment: /etc/environment of a squashfs without OCI config") {
    ScratchDir dir;
    std::string image =
        make_enroot_image(dir, "PATH=\"/opt/app/bin:/usr/bin\"\nAPP_HOME=/opt/app\nDISPLAY=${DISPLAY}\n");
    auto text = read_image_file(image, "/etc/environment", 1 << 16);
    REQUIRE(text.ok());
    REQUIRE(text->has_value());
    CHECK(text->value().find("APP_HOME=/opt/app") != std::string::npos);
    CHECK_FALSE(read_image_file(image, "/etc/missing", 1 << 16)->has_value());
    CHECK_FALSE(read_image_file(image, "/etc/environment", 8).ok());  // over the cap

    auto env = read_enroot_settings(image, static_cast<uid_t>(-1), static_cast<gid_t>(-1), {"DISPLAY=:0"});
    REQUIRE(env.ok());
    CHECK(env->env == std::vector<std::string>{"PATH=/opt/app/bin:/usr/bin", "APP_HOME=/opt/app", "DISPLAY=:0"});
    CHECK(env->workdir.empty());
    CHECK(env->entrypoint.empty());

    ScratchDir other;
    std::string bare = make_enroot_image(other, "");
    auto none = read_enroot_settings(bare, static_cast<uid_t>(-1), static_cast<gid_t>(-1), {});
    REQUIRE(none.ok());
    CHECK(none->env.empty());
    CHECK_FALSE(
        read_enroot_settings(dir.path + "/tree/etc/environment", static_cast<uid_t>(-1), static_cast<gid_t>(-1), {})
            .ok());  // not a squashfs image
}

// /etc/rc as `enroot import` writes it (labels as comments, mkdir, cd, rc.local, the two execs).
const char* const kEnrootRc = R"(# org.opencontainers.image.ref.name ubuntu
# org.opencontainers.image.version 22.04

mkdir -p "/usr/src" 2> /dev/null
cd "/usr/src" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec '/opt/entry point.sh' 'it'\''s' "$@"
else
    exec '/opt/entry point.sh' 'it'\''s' 'serve' '--port' '8080'
fi
)";

TEST_CASE("Enroot /etc/rc: working directory, entrypoint and command as enroot import writes them") {
    auto rc = parse_enroot_rc(kEnrootRc);
    CHECK(rc.workdir == "/usr/src");
    CHECK(rc.entrypoint == std::vector<std::string>{"/opt/entry point.sh", "it's"});
    CHECK(rc.cmd == std::vector<std::string>{"serve", "--port", "8080"});

    // No entrypoint (exec  "$@"), a Cmd only; no WorkingDir (cd "/").
    auto plain = parse_enroot_rc(
        "mkdir -p \"/\" 2> /dev/null\ncd \"/\" && unset OLDPWD || exit 1\n"
        "if [ $# -gt 0 ]; then\n    exec  \"$@\"\nelse\n    exec  '/bin/bash'\nfi\n");
    CHECK(plain.workdir == "/");
    CHECK(plain.entrypoint.empty());
    CHECK(plain.cmd == std::vector<std::string>{"/bin/bash"});

    // What Gantry does not take: a cd that is not the first command, a relative or expanded
    // directory, words it cannot read without a shell.
    CHECK(parse_enroot_rc("echo hi\ncd \"/x\"\n").workdir.empty());
    CHECK(parse_enroot_rc("cd \"x/y\" && true\n").workdir.empty());
    CHECK(parse_enroot_rc("cd \"$HOME\" && true\n").workdir.empty());
    CHECK(parse_enroot_rc("cd \"/a\" ; cd /b\n").workdir == "/a");
    CHECK(parse_enroot_rc("cd \"/a\"b\n").workdir.empty());
    // As `gantry export` writes it (enroot_rc): single-quoted, ${DIR@Q}-style.
    CHECK(parse_enroot_rc("# written by gantry export\ncd '/work' || exit 1\n").workdir == "/work");
    CHECK(parse_enroot_rc("cd '/it'\\''s here' || exit 1\n").workdir == "/it's here");
    CHECK(parse_enroot_rc("cd 'rel' || exit 1\n").workdir.empty());
    CHECK(parse_enroot_rc("cd '/a'$x || exit 1\n").workdir.empty());
    CHECK(parse_enroot_rc("cd '/open || exit 1\n").workdir.empty());
    // Quoted, $ and " are plain characters (the fuzz target's find); a NUL byte anywhere: hand-made, left alone.
    CHECK(parse_enroot_rc("cd '/a$b\"c' || exit 1\n").workdir == "/a$b\"c");
    using namespace std::string_view_literals;
    auto nul = parse_enroot_rc("cd '/a\0x' || exit 1\nexec 'e\0LD_PRELOAD=/x' \"$@\"\n"sv);
    CHECK(nul.workdir.empty());
    CHECK(nul.entrypoint.empty());
    auto dollar = parse_enroot_rc("exec $'a\\tb' \"$@\"\nexec $'a\\tb' 'c'\n");
    CHECK(dollar.entrypoint.empty());
    CHECK(dollar.cmd.empty());
    auto unterminated = parse_enroot_rc("exec 'a \"$@\"\n");
    CHECK(unterminated.entrypoint.empty());
    CHECK(parse_enroot_rc("").workdir.empty());
}

TEST_CASE("Enroot image settings: /etc/rc read from the squashfs through the helper") {
    ScratchDir dir;
    std::string image = make_enroot_image(dir, "PATH=/usr/bin\n", kEnrootRc);
    auto s = read_enroot_settings(image, static_cast<uid_t>(-1), static_cast<gid_t>(-1), {});
    REQUIRE(s.ok());
    CHECK(s->env == std::vector<std::string>{"PATH=/usr/bin"});
    CHECK(s->workdir == "/usr/src");
    CHECK(s->entrypoint == std::vector<std::string>{"/opt/entry point.sh", "it's"});
    CHECK(s->cmd == std::vector<std::string>{"serve", "--port", "8080"});
}

TEST_CASE("image environment: root reads a user's image as that user", "[root]") {
    ScratchDir dir;
    std::string image = make_enroot_image(dir, "A=1\n");
    auto env = read_enroot_settings(image, 65534, 65534, {});
    REQUIRE(env.ok());
    CHECK(env->env == std::vector<std::string>{"A=1"});
    // The same image where only root may read it: the user's child cannot open it.
    ::chmod(image.c_str(), 0600);
    auto denied = read_enroot_settings(image, 65534, 65534, {});
    REQUIRE_FALSE(denied.ok());
    CHECK(denied.error().message == "opening image " + image + ": Permission denied");
}

TEST_CASE("Container::create as root for a user: every layer file is checked as the user, a FIFO below fails at once",
          "[root]") {
    // Issue #34: only the top layer was checked, and a FIFO as a lower layer held root's mount for ever.
    ScratchDir dir;
    std::string top = make_enroot_image(dir, "A=1\n");
    std::string fifo = dir.path + "/lower.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0666) == 0);
    ContainerSpec spec;
    spec.image_path = top;
    spec.image_layers = {fifo, top};  // bottom first: the FIFO below a regular top layer
    spec.uid = 65534;
    spec.gid = 65534;
    spec.config.runtime_path = dir.path + "/run";
    auto t0 = std::chrono::steady_clock::now();
    auto c = Container::create(spec);
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().message == "opening image " + fifo + ": not a regular file (give a squashfs file)");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("container spec: JSON round trip keeps every field; bad and oversized documents are refused") {
    ContainerSpec spec;
    spec.image_path = "/store/images/abc.sqsh";
    spec.image_trusted = true;
    spec.image_config.env = {"PATH=/opt/bin:/usr/bin", "A=b c"};
    spec.image_config.entrypoint = {"/entry", "--x"};
    spec.image_config.labels = {{"org.example", "v\n1"}};
    spec.backend = MountBackend::extract;
    REQUIRE(parse_mounts("/fsx:/data:ro+nosuid,tmpfs:/scratch:size=1G", spec.mounts).ok());
    spec.writable = true;
    spec.remap_root = true;
    spec.mount_home = false;
    spec.unshare.net = true;
    spec.workdir = "/work dir";
    spec.env_names = {"HOME"};
    spec.env_values = {"X=1"};
    spec.uid = 4242;
    spec.gid = 4243;
    spec.name = "pyxis_7_c";
    spec.detach = true;
    spec.config.runtime_path = "/run/g";
    spec.config.insecure_registries = {"127.0.0.1:5000"};
    spec.config.limits.max_layer_entries = 17;
    spec.config.fuse_shared = false;  // the holder must see the admin's choice
    spec.config.fuse_server = "squashfuse_ll";
    spec.config.fuse_poll_us = 7;  // and its gantry-imagefs polling (the per-container daemon's argv)
    spec.devices.devices = {{"/host/dev/nvidia0", "/dev/nvidia0"}};
    spec.devices.sysfs_views = {{"/sys/class/x", {{"a", "../../a"}}, {{"dev", "1:2\n"}}}};
    spec.holder_program = "/usr/libexec/gantry/gantry-holder";
    spec.fuse_server_scope = "job 12 on node3";  // the plugin's: which image server the holder may share
    spec.image_layers = {"/store/images/layer-a.sqsh", "/store/images/layer-b.sqsh"};  // a layered image, bottom first
    spec.mounts[0].nofail = true;  // a mounts.d entry: the holder decides as the user (issue #34)
    spec.mounts[0].origin = "/etc/gantry/mounts.d/10-fsx.fstab:1";
    spec.devices.mounts = {{"/var/spool/slurmd/pmix.7.0", "/var/spool/slurmd/pmix.7.0", false, true}};

    std::string text = container_spec_to_json(spec);
    auto back = container_spec_from_json(text);
    REQUIRE(back.ok());
    CHECK(container_spec_to_json(*back) == text);
    CHECK(back->mounts == spec.mounts);
    CHECK(back->backend == MountBackend::extract);
    CHECK(back->uid == 4242);
    CHECK(back->image_config.labels.at("org.example") == "v\n1");
    CHECK(back->config.limits.max_layer_entries == 17);
    CHECK_FALSE(back->config.fuse_shared);
    CHECK(back->config.fuse_server == "squashfuse_ll");
    CHECK(back->config.fuse_poll_us == 7);
    CHECK(back->devices.devices == spec.devices.devices);
    CHECK(back->devices.mounts == spec.devices.mounts);
    CHECK(back->mounts[0].nofail);
    CHECK(back->mounts[0].origin == "/etc/gantry/mounts.d/10-fsx.fstab:1");
    CHECK(back->devices.sysfs_views == spec.devices.sysfs_views);
    CHECK(back->fuse_server_scope == "job 12 on node3");
    CHECK(back->image_layers == spec.image_layers);
    CHECK(back->unshare.net);
    CHECK_FALSE(back->unshare.ipc);

    // A field missing, a wrong type, not JSON, too large: errors, never a default.
    auto missing = container_spec_from_json(R"({"image_path": "/x"})");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message.find("reading a container description") != std::string::npos);
    std::string wrong = text;
    wrong.replace(wrong.find("\"uid\":4242"), 10, "\"uid\":\"42\"");
    CHECK_FALSE(container_spec_from_json(wrong).ok());
    CHECK_FALSE(container_spec_from_json("{").ok());
    auto huge = container_spec_from_json(std::string(kMaxContainerSpecBytes + 1, ' '));
    REQUIRE_FALSE(huge.ok());
    CHECK(huge.error().message.find("at most") != std::string::npos);

    // The holder's request wraps the spec with the resolved identity and set-up paths.
    launcher::HolderRequest rq{
        spec, {}, MountBackend::fuse, "/run/g/staging.1", "/run/g/staging.1/image", "/w", "/home/u", 77, true};
    rq.id.uid = 4242;
    rq.id.name = "gantry-test";
    auto rq_back = launcher::holder_request_from_json(launcher::holder_request_to_json(rq));
    REQUIRE(rq_back.ok());
    CHECK(launcher::holder_request_to_json(*rq_back) == launcher::holder_request_to_json(rq));
    CHECK(rq_back->id.name == "gantry-test");
    CHECK(rq_back->parent == 77);
    CHECK(rq_back->creator_writes_maps);
}

TEST_CASE("holder replies: one typed JSON line each way, strict on the way in") {
    using launcher::HolderReply;
    HolderReply ready;
    ready.kind = HolderReply::Kind::ready;
    ready.pid = 4321;
    ready.start_time = 123456789012ULL;
    ready.server_pid = 99;
    ready.server_start_time = 42;
    std::string line = launcher::holder_reply_to_line(ready);
    CHECK(line.back() == '\n');
    CHECK(std::count(line.begin(), line.end(), '\n') == 1);
    auto back = launcher::holder_reply_from_line(line);
    REQUIRE(back.ok());
    CHECK(back->kind == HolderReply::Kind::ready);
    CHECK(back->pid == 4321);
    CHECK(back->start_time == 123456789012ULL);
    CHECK(back->server_pid == 99);
    CHECK(back->server_start_time == 42);

    // A failure's message may hold newlines and bytes that are not UTF-8: still one line.
    HolderReply failed;
    failed.kind = HolderReply::Kind::failed;
    failed.message = "mounting /fsx:\nNo such file or directory \xff";
    line = launcher::holder_reply_to_line(failed);
    CHECK(std::count(line.begin(), line.end(), '\n') == 1);
    auto failed_back = launcher::holder_reply_from_line(line);
    REQUIRE(failed_back.ok());
    CHECK(failed_back->kind == HolderReply::Kind::failed);
    CHECK(failed_back->message.rfind("mounting /fsx:\nNo such file or directory ", 0) == 0);

    HolderReply userns;
    userns.kind = HolderReply::Kind::userns;
    userns.pid = 777;
    auto userns_back = launcher::holder_reply_from_line(launcher::holder_reply_to_line(userns));
    REQUIRE(userns_back.ok());
    CHECK(userns_back->kind == HolderReply::Kind::userns);
    CHECK(userns_back->pid == 777);

    // Refused: the old text replies, an unknown kind, a missing or mistyped field, a pid that names
    // no holder, two lines, and more than a creator reads.
    std::string good = launcher::holder_reply_to_line(ready);
    CHECK_FALSE(launcher::holder_reply_from_line("ok 4321 1234").ok());
    CHECK_FALSE(launcher::holder_reply_from_line("userns 777").ok());
    CHECK_FALSE(launcher::holder_reply_from_line("").ok());
    std::string unknown = good;
    unknown.replace(unknown.find("\"ready\""), 7, "\"other\"");
    CHECK_FALSE(launcher::holder_reply_from_line(unknown).ok());
    std::string mistyped = good;
    mistyped.replace(mistyped.find("\"pid\":4321"), 10, "\"pid\":\"4321\"");
    CHECK_FALSE(launcher::holder_reply_from_line(mistyped).ok());
    CHECK_FALSE(launcher::holder_reply_from_line(R"({"kind":"ready","pid":4321})").ok());
    HolderReply no_pid = ready;
    no_pid.pid = 1;
    CHECK_FALSE(launcher::holder_reply_from_line(launcher::holder_reply_to_line(no_pid)).ok());
    CHECK_FALSE(launcher::holder_reply_from_line(good + good).ok());
    CHECK_FALSE(launcher::holder_reply_from_line(std::string(launcher::kMaxHolderReplyBytes + 1, ' ')).ok());
}

TEST_CASE("NSpid lines: the pid in the reader's namespace first, the process's own last") {
    using launcher::parse_nspid;
    CHECK(parse_nspid("Name:\tsleep\nPid:\t4711\nNSpid:\t4711\t12\t1\nNSpgid:\t4711\n") ==
          std::vector<pid_t>{4711, 12, 1});
    CHECK(parse_nspid("NSpid:\t9\n") == std::vector<pid_t>{9});
    CHECK(parse_nspid("Name:\tx\nPid:\t9\n").empty());                        // a kernel before 4.1: no NSpid line
    CHECK(parse_nspid("Name:\tx\nNSpid:\t9\tz\n") == std::vector<pid_t>{9});  // stops at the first non-number
    CHECK(parse_nspid("Name:\tx\nNSpid:\t9\t0\n").empty());                   // never a pid 0 or below
    CHECK(parse_nspid("Name:\tx\nNSpgid:\t9\n").empty());                     // another field of the same prefix
}

TEST_CASE(
    "a pid of another pid namespace is translated into ours (namespace/linux: the job's pids, the epilog's view)") {
    // A child in a new pid namespace (a job's under Slurm's namespace/linux) starts the process that
    // is pid 1 there; it reports its own view (pid, namespace) and the child reports our view of it.
    int report[2];
    REQUIRE(::pipe(report) == 0);
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(report[0]);
        int flags = CLONE_NEWPID | (::geteuid() == 0 ? 0 : CLONE_NEWUSER);
        if (::unshare(flags) != 0) ::_exit(3);
        int inner_report[2];
        if (::pipe(inner_report) != 0) ::_exit(4);
        pid_t inner = ::fork();
        if (inner == 0) {
            ::close(inner_report[0]);
            // Its start time is not read here: our /proc is still the parent's, where 1 is another process.
            std::string line = std::to_string(::getpid()) + " " + std::to_string(launcher::own_pid_namespace()) + "\n";
            (void)!::write(inner_report[1], line.data(), line.size());
            ::close(inner_report[1]);
            ::pause();
            ::_exit(0);
        }
        ::close(inner_report[1]);
        char buf[128] = {};
        ssize_t n = ::read(inner_report[0], buf, sizeof buf - 1);
        std::string line = std::to_string(inner) + " " + std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
        (void)!::write(report[1], line.data(), line.size());
        ::close(report[1]);
        int st = 0;
        ::waitpid(inner, &st, 0);
        ::_exit(0);
    }
    ::close(report[1]);
    char buf[256] = {};
    ssize_t n = ::read(report[0], buf, sizeof buf - 1);
    ::close(report[0]);
    long outer = 0, inner = 0;
    unsigned long long pidns = 0;
    bool reported = n > 0 && std::sscanf(buf, "%ld %ld %llu", &outer, &inner, &pidns) == 3;
    if (!reported) {
        int st = 0;
        ::waitpid(child, &st, 0);
        // A missing precondition fails by name (as every unit test here), never passes silently.
        FAIL("could not make a pid namespace here (child exit "
             << WEXITSTATUS(st)
             << ": unshare(CLONE_NEWPID[|CLONE_NEWUSER]) refused); "
                "run as root or where unprivileged user namespaces are allowed");
    }
    CHECK(inner == 1);
    REQUIRE(pidns != 0);
    CHECK(pidns != launcher::own_pid_namespace());
    // The same number in its namespace and in ours: pid 1 there is the process we know as `outer`.
    CHECK(launcher::pid_in_own_view(1, pidns) == outer);
    CHECK(launcher::pid_in_own_view(static_cast<pid_t>(outer), launcher::own_pid_namespace()) == outer);
    CHECK(launcher::pid_in_own_view(static_cast<pid_t>(outer), 0) == outer);  // a record from before: ours
    CHECK(launcher::pid_in_own_view(2, pidns) == -1);                         // nobody else lives there
    unsigned long long start = launcher::process_start_time(static_cast<pid_t>(outer));
    REQUIRE(start != 0);
    if (launcher::own_pid_namespace() == launcher::kInitPidNamespace) CHECK(launcher::sees_every_process_of(pidns));

    // The epilog's path: a server recorded by its number in the job's namespace is found and ended.
    char tmpl[] = "/tmp/gantry-test-pidns-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    std::string dir = tmpl;
    Config config;
    config.runtime_path = dir;
    const char* old_xdg = std::getenv("XDG_RUNTIME_DIR");
    std::string saved_xdg = old_xdg != nullptr ? old_xdg : "";
    if (::geteuid() != 0) ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
    reread_environment();  // the library reads the environment once (environment.hpp)
    ::mkdir(runtime_dir(config).c_str(), 0700);
    ContainerState recorded;
    recorded.server_pid = 1;  // its number in the job's namespace
    recorded.server_start_time = start;
    recorded.uid = ::geteuid();
    recorded.pid_namespace = pidns;
    REQUIRE(record_job_image_server(config, 21, recorded).ok());
    recorded.server_pid = static_cast<pid_t>(outer);  // the same number read as ours: not that process
    recorded.pid_namespace = launcher::own_pid_namespace();
    recorded.server_start_time = start + 1;
    REQUIRE(record_job_image_server(config, 22, recorded).ok());
    CHECK(end_job_image_servers(config, 22) == 0);
    int ended = end_job_image_servers(config, 21);
    CHECK(ended == 1);
    if (ended != 1) ::kill(static_cast<pid_t>(outer), SIGKILL);  // never leave the child waiting
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);  // its pid 1 gone, the child's wait returned
    CHECK(launcher::pid_in_own_view(1, pidns) == -1);
    if (old_xdg != nullptr)
        ::setenv("XDG_RUNTIME_DIR", saved_xdg.c_str(), 1);
    else
        ::unsetenv("XDG_RUNTIME_DIR");
    reread_environment();
    std::string rm = "rm -rf '" + dir + "'";
    CHECK(std::system(rm.c_str()) == 0);
}

TEST_CASE("a job's image servers: recorded, then ended with the job only while they are the recorded processes") {
    char tmpl[] = "/tmp/gantry-test-servers-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    std::string dir = tmpl;
    Config config;
    config.runtime_path = dir;  // root's runtime_dir; another user's is its XDG/tmp one
    const char* old_xdg = std::getenv("XDG_RUNTIME_DIR");
    std::string saved_xdg = old_xdg != nullptr ? old_xdg : "";
    if (::geteuid() != 0) ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
    reread_environment();  // the library reads the environment once (environment.hpp)
    std::string rdir = runtime_dir(config);
    ::mkdir(rdir.c_str(), 0700);
    auto spawn_sleeper = [] {
        pid_t p = ::fork();
        if (p == 0) {
            ::execlp("sleep", "sleep", "300", static_cast<char*>(nullptr));
            ::_exit(127);
        }
        return p;
    };
    pid_t a = spawn_sleeper(), b = spawn_sleeper(), c = spawn_sleeper();
    REQUIRE((a > 0 && b > 0 && c > 0));
    auto state_of = [](pid_t p, unsigned long long start, uid_t uid) {
        ContainerState st;
        st.server_pid = p;
        st.server_start_time = start;
        st.uid = uid;
        return st;
    };
    uid_t me = ::geteuid();
    // a: the real server of job 7; b: recorded with a start time it does not have (its pid since
    // reused); c: recorded as another user's; job 8's record names a too.
    REQUIRE(record_job_image_server(config, 7, state_of(a, launcher::process_start_time(a), me)).ok());
    REQUIRE(record_job_image_server(config, 7, state_of(a, launcher::process_start_time(a), me)).ok());  // steps 2..n
    REQUIRE(record_job_image_server(config, 7, state_of(b, launcher::process_start_time(b) + 1, me)).ok());
    REQUIRE(record_job_image_server(config, 7, state_of(c, launcher::process_start_time(c), me + 1)).ok());
    REQUIRE(record_job_image_server(config, 7, state_of(-1, 0, me)).ok());  // no server: nothing recorded
    REQUIRE(record_job_image_server(config, 8, state_of(a, launcher::process_start_time(a), me)).ok());
    struct stat sb {};
    REQUIRE(::stat((rdir + "/servers").c_str(), &sb) == 0);
    CHECK((sb.st_mode & 077) == 0);

    CHECK(end_job_image_servers(config, 9) == 0);  // nothing recorded for job 9
    CHECK(end_job_image_servers(config, 7) == 1);
    int status = 0;
    REQUIRE(::waitpid(a, &status, 0) == a);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    CHECK(::waitpid(b, &status, WNOHANG) == 0);  // still running: not the recorded process
    CHECK(::waitpid(c, &status, WNOHANG) == 0);
    CHECK(::access((rdir + "/servers/job_7").c_str(), F_OK) != 0);  // forgotten
    CHECK(end_job_image_servers(config, 7) == 0);
    CHECK(end_job_image_servers(config, 8) == 0);  // a is gone (reaped): nothing to kill

    // The record's directory must be ours and closed to others.
    std::string own = rdir + "/servers";
    REQUIRE(::chmod(own.c_str(), 0777) == 0);
    CHECK_FALSE(record_job_image_server(config, 10, state_of(b, launcher::process_start_time(b), me)).ok());

    for (pid_t p : {b, c}) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
    }
    if (old_xdg != nullptr)
        ::setenv("XDG_RUNTIME_DIR", saved_xdg.c_str(), 1);
    else
        ::unsetenv("XDG_RUNTIME_DIR");
    reread_environment();
    std::string rm = "rm -rf '" + dir + "'";
    CHECK(std::system(rm.c_str()) == 0);
}

// Recorded /proc/PID/cgroup lines of a task slurmstepd has placed, per Slurm release and cgroup
// version, with the cgroup mounts of such a node (mountinfo lines).
namespace {
const char* kV1Mounts =
    "31 25 0:27 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,freezer\n"
    "32 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory\n"
    "33 25 0:29 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,devices\n"
    "34 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "35 25 0:31 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup "
    "rw,xattr,name=systemd\n"
    "36 25 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    "37 22 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw\n";
const char* kV2Mounts =
    "25 24 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
// Slurm 22.05, cgroup/v1 (proctrack/cgroup, task/cgroup with memory and devices).
const char* kSlurm2205V1 =
    "12:freezer:/slurm/uid_1000/job_12/step_0\n"
    "11:memory:/slurm/uid_1000/job_12/step_0/task_0\n"
    "10:devices:/slurm/uid_1000/job_12/step_0\n"
    "4:cpu,cpuacct:/system.slice/slurmd.service\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
    "0::/system.slice/slurmd.service\n";
// Slurm 24.11 and 25.05, cgroup/v2: JOB/STEP/user/task_N under slurmstepd.scope.
const char* kSlurm2411V2 = "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n";
const char* kSlurm2505V2Batch = "0::/system.slice/slurmstepd.scope/job_13/step_batch/user/task_0\n";
// Slurm 26.05, cgroup/v2 with the job directory named by the job's SLUID (CgroupJobIdPaths=no).
const char* kSlurm2605V2Sluid = "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_3/user/task_1\n";

std::vector<std::string> target_dirs(const char* task, const char* mounts, CgroupLevel level, bool* leaf = nullptr) {
    std::vector<std::string> out;
    for (const auto& t : launcher::cgroup_targets(task, launcher::parse_cgroup_mounts(mounts), level)) {
        out.push_back(t.dir);
        if (leaf != nullptr) *leaf = t.make_leaf;
    }
    return out;
}
}  // namespace

TEST_CASE("cgroup placement: recorded task cgroups of Slurm 22.05 (v1), 24.11/25.05 and 26.05 (v2, SLUID)") {
    using V = std::vector<std::string>;
    SECTION("22.05 cgroup/v1: a step's holder joins the task's own cgroups; a job's the job_ID cgroups") {
        CHECK(target_dirs(kSlurm2205V1, kV1Mounts, CgroupLevel::step) ==
              V{"/sys/fs/cgroup/freezer/slurm/uid_1000/job_12/step_0",
                "/sys/fs/cgroup/memory/slurm/uid_1000/job_12/step_0/task_0",
                "/sys/fs/cgroup/devices/slurm/uid_1000/job_12/step_0",
                "/sys/fs/cgroup/cpu,cpuacct/system.slice/slurmd.service",
                "/sys/fs/cgroup/systemd/system.slice/slurmd.service",
                "/sys/fs/cgroup/unified/system.slice/slurmd.service"});
        CHECK(target_dirs(kSlurm2205V1, kV1Mounts, CgroupLevel::job) ==
              V{"/sys/fs/cgroup/freezer/slurm/uid_1000/job_12", "/sys/fs/cgroup/memory/slurm/uid_1000/job_12",
                "/sys/fs/cgroup/devices/slurm/uid_1000/job_12"});
        CHECK(target_dirs(kSlurm2205V1, kV1Mounts, CgroupLevel::node).empty());  // v1: left where it started
    }
    SECTION("24.11 cgroup/v2: the task's leaf; the job's own leaf beside the steps; the node's beside the jobs") {
        bool leaf = false;
        CHECK(target_dirs(kSlurm2411V2, kV2Mounts, CgroupLevel::step, &leaf) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_0/user/task_0"});
        CHECK_FALSE(leaf);
        CHECK(target_dirs(kSlurm2411V2, kV2Mounts, CgroupLevel::job, &leaf) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/gantry"});
        CHECK(leaf);
        CHECK(target_dirs(kSlurm2411V2, kV2Mounts, CgroupLevel::node, &leaf) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/gantry"});
        CHECK(leaf);
    }
    SECTION("25.05 cgroup/v2, a batch step: the same shape") {
        CHECK(target_dirs(kSlurm2505V2Batch, kV2Mounts, CgroupLevel::step) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/job_13/step_batch/user/task_0"});
        CHECK(target_dirs(kSlurm2505V2Batch, kV2Mounts, CgroupLevel::job) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/job_13/gantry"});
    }
    SECTION("26.05 cgroup/v2: a job directory named by its SLUID is found by its place, not its name") {
        CHECK(target_dirs(kSlurm2605V2Sluid, kV2Mounts, CgroupLevel::step) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_3/user/task_1"});
        CHECK(target_dirs(kSlurm2605V2Sluid, kV2Mounts, CgroupLevel::job) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/sEKNKTV3WPV500/gantry"});
        CHECK(target_dirs(kSlurm2605V2Sluid, kV2Mounts, CgroupLevel::node) ==
              V{"/sys/fs/cgroup/system.slice/slurmstepd.scope/gantry"});
    }
    SECTION("a hybrid host's cgroup2 at /sys/fs/cgroup/unified, and a v2 task outside Slurm's layout") {
        CHECK(target_dirs("0::/scratch/slurmstepd.scope/job_5/step_0/user/task_0\n", kV1Mounts, CgroupLevel::job) ==
              V{"/sys/fs/cgroup/unified/scratch/slurmstepd.scope/job_5/gantry"});
        // proctrack/linuxproc on a v2 node: the task stays in slurmd's cgroup; nothing for a job.
        CHECK(target_dirs("0::/system.slice/slurmd.service\n", kV2Mounts, CgroupLevel::job).empty());
        CHECK(target_dirs("0::/user/task_0\n", kV2Mounts, CgroupLevel::job).empty());  // no job above the step
        CHECK(target_dirs("0::/\n", kV2Mounts, CgroupLevel::node).empty());
    }
    SECTION("a v1 hierarchy mounted from below its root (a node in a container) and a hierarchy not mounted") {
        const char* mounts = "40 30 0:27 /slurm /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n";
        CHECK(target_dirs("7:freezer:/slurm/uid_1/job_2/step_0\n", mounts, CgroupLevel::job) ==
              V{"/sys/fs/cgroup/freezer/uid_1/job_2"});
        CHECK(target_dirs("7:freezer:/elsewhere/job_2/step_0\n", mounts, CgroupLevel::job).empty());
        CHECK(target_dirs("8:pids:/slurm/uid_1/job_2/step_0\n", mounts, CgroupLevel::step).empty());
    }
}

TEST_CASE("layer stacks: the node-wide key follows the layers and their order; too deep a stack is E2BIG", "[root]") {
    if (!launcher::running_as_real_root())
        FAIL("needs root: the node-wide stack is root's; run `ctest -L root` as root");
    ScratchDir dir;
    std::vector<std::string> layers;
    for (int i = 0; i < 120; ++i) {
        dir.write("l" + std::to_string(i), std::to_string(i));
        layers.push_back(dir.path + "/l" + std::to_string(i));
    }
    auto a = launcher::stack_key({layers[0], layers[1]});
    auto b = launcher::stack_key({layers[1], layers[0]});
    auto c = launcher::stack_key({layers[0], layers[1]});
    REQUIRE((a.ok() && b.ok() && c.ok()));
    CHECK(*a == *c);
    CHECK(*a != *b);
    CHECK(a->size() == 32);
    // One layer's stack is not that layer's own mount.
    CHECK(*launcher::stack_key({layers[0]}) != *launcher::image_key(layers[0]));
    CHECK_FALSE(launcher::stack_key({layers[0], dir.path + "/missing"}).ok());
    // 120 layers' names do not fit one mount's options: refused before anything is mounted, with
    // E2BIG, which sends the caller to the per-container stack.
    Config config;
    config.runtime_path = dir.path + "/run";
    auto deep = launcher::acquire_shared_stack(layers, config);
    REQUIRE_FALSE(deep.ok());
    CHECK(deep.error().errnum == E2BIG);
    CHECK(deep.error().message.find("too many layers for one mount's options") != std::string::npos);
}

TEST_CASE("kernel releases: layers stack from Linux 5.11 on; an unreadable release is too old") {
    CHECK(kernel_release_at_least("5.11.0", 5, 11));
    CHECK(kernel_release_at_least("5.15.0-91-generic", 5, 11));
    CHECK(kernel_release_at_least("6.1.0-18-amd64", 5, 11));
    CHECK(kernel_release_at_least("6.18.44-fc-v657-gpu", 5, 11));
    CHECK(kernel_release_at_least("10.0", 5, 11));
    CHECK_FALSE(kernel_release_at_least("5.10.0-28-amd64", 5, 11));
    CHECK_FALSE(kernel_release_at_least("4.18.0-513.el8.x86_64", 5, 11));
    CHECK_FALSE(kernel_release_at_least("5", 5, 11));
    CHECK_FALSE(kernel_release_at_least("", 5, 11));
    CHECK_FALSE(kernel_release_at_least("linux", 5, 11));
    CHECK_FALSE(kernel_release_at_least("5.x", 5, 11));
    // This machine's kernel, as the CLI and the plugin's pull ask.
    struct utsname u {};
    REQUIRE(::uname(&u) == 0);
    CHECK(kernel_stacks_layers() == kernel_release_at_least(u.release, 5, 11));
}

namespace {
// Creates PATH (a small file); false on failure.
bool write_file_or_create(const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    ::close(fd);
    return true;
}
}  // namespace

TEST_CASE("join as a new instance: the holder's files in a mount namespace of its own; its mounts stay its own") {
    // A stand-in holder: a user + mount namespace with a tmpfs at DIR holding a file, kept until killed.
    char dir_template[] = "/tmp/gantry-instance-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    const std::string dir = dir_template;
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    pid_t holder = ::fork();
    REQUIRE(holder >= 0);
    if (holder == 0) {
        ::close(ready[0]);
        if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) ::_exit(3);
        auto write_file = [](const std::string& path, const std::string& text) {
            int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
            bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
            if (fd >= 0) ::close(fd);
            return ok;
        };
        if (!write_file("/proc/self/setgroups", "deny") ||
            !write_file("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1\n") ||
            !write_file("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1\n"))
            ::_exit(4);
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) ::_exit(5);
        if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) ::_exit(6);
        if (!write_file_or_create(dir + "/from-holder")) ::_exit(7);
        (void)!::write(ready[1], "r", 1);
        ::close(ready[1]);
        ::pause();
        ::_exit(0);
    }
    ::close(ready[1]);
    char c = 0;
    const bool holder_ready = ::read(ready[0], &c, 1) == 1;
    ::close(ready[0]);
    Defer stop_holder([&] {
        ::kill(holder, SIGKILL);
        ::waitpid(holder, nullptr, 0);
        ::rmdir(dir.c_str());
    });
    if (!holder_ready) FAIL("the stand-in holder could not make its namespaces (user namespaces disabled?)");

    ContainerState state;
    state.name = "instance-test";
    state.holder_pid = holder;
    state.holder_start_time = launcher::process_start_time(holder);
    state.defaults.remap_root = true;  // keeps the capabilities of the namespace: the instance mounts below
    const std::string holder_mnt = [&] {
        char buf[64] = {};
        ssize_t n = ::readlink(("/proc/" + std::to_string(holder) + "/ns/mnt").c_str(), buf, sizeof buf - 1);
        return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
    }();
    pid_t instance = ::fork();
    REQUIRE(instance >= 0);
    if (instance == 0) {
        JoinOptions how;
        how.as = JoinAs::new_instance;
        if (!join(state, how)) ::_exit(10);
        struct stat st {};
        if (::stat((dir + "/from-holder").c_str(), &st) != 0) ::_exit(11);  // the holder's files
        char buf[64] = {};
        if (::readlink("/proc/self/ns/mnt", buf, sizeof buf - 1) <= 0 || holder_mnt == buf) ::_exit(12);
        if (!write_file_or_create(dir + "/from-instance")) ::_exit(13);  // seen by the holder
        if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) ::_exit(14);
        if (!write_file_or_create(dir + "/on-instance-mount")) ::_exit(15);  // not seen by the holder
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(instance, &status, 0) == instance);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    const std::string through_holder = "/proc/" + std::to_string(holder) + "/root" + dir;
    struct stat st {};
    CHECK(::stat((through_holder + "/from-instance").c_str(), &st) == 0);
    CHECK(::stat((through_holder + "/on-instance-mount").c_str(), &st) != 0);
}
