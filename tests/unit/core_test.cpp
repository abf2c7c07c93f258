// Unit tests for the core module: configuration parsing, digests, image config, strings, spawning.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "gantry/config.hpp"
#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/image_config.hpp"
#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"
#include "gantry/telemetry.hpp"
#include "gantry/trace.hpp"

TEST_CASE("gantry.conf: values, comments and defaults") {
    auto c = gantry::parse_config(
        "# comment\nstore_path = /fsx/gantry  # trailing\n\nmount_backend=fuse\nblock_size = 262144\n"
        "insecure_registries = reg.local:5000, other:80\nhost_dev = yes\n",
        "test.conf");
    REQUIRE(c.ok());
    CHECK(c->store_path == "/fsx/gantry");
    CHECK(c->mount_backend == "fuse");
    CHECK(c->block_size == 262144);
    CHECK(c->insecure_registries == std::vector<std::string>{"reg.local:5000", "other:80"});
    CHECK(c->host_dev);
    CHECK(c->runtime_path == "/run/gantry");  // default kept
    CHECK(c->fuse_shared);                    // the fuse backend's image servers: on by default
    auto unshared = gantry::parse_config("fuse_shared = no\n", "c");
    REQUIRE(unshared.ok());
    CHECK_FALSE(unshared->fuse_shared);
    CHECK_FALSE(gantry::parse_config("fuse_shared = sometimes\n", "c").ok());
    CHECK(c->layered_images);  // images stored as layers by default (issue #19)
    auto whole = gantry::parse_config("layered_images = no\n", "c");
    REQUIRE(whole.ok());
    CHECK_FALSE(whole->layered_images);
    CHECK(c->fuse_poll_us == 0);  // gantry-imagefs sleeps at once by default (libfuse's loop)
    auto poll = gantry::parse_config("fuse_poll_us = 50\n", "c");
    REQUIRE(poll.ok());
    CHECK(poll->fuse_poll_us == 50);
    CHECK(gantry::parse_config("fuse_poll_us = 1000000\n", "c").ok());
    CHECK_FALSE(gantry::parse_config("fuse_poll_us = 1000001\n", "c").ok());
    CHECK_FALSE(gantry::parse_config("fuse_poll_us = -1\n", "c").ok());
    CHECK(c->fuse_server == "gantry");  // gantry-imagefs unless the admin falls back
    auto fallback = gantry::parse_config("fuse_server = squashfuse_ll\n", "c");
    REQUIRE(fallback.ok());
    CHECK(fallback->fuse_server == "squashfuse_ll");
    CHECK_FALSE(gantry::parse_config("fuse_server = squashfuse\n", "c").ok());
    // Root's deadlines on what a user influences (issue #34): a few seconds for checks by default.
    CHECK(c->check_timeout_seconds == 5);
    CHECK(c->setup_timeout_seconds == 300);
    auto waits = gantry::parse_config("check_timeout_seconds = 2\nsetup_timeout_seconds = 900\n", "c");
    REQUIRE(waits.ok());
    CHECK(waits->check_timeout_seconds == 2);
    CHECK(waits->setup_timeout_seconds == 900);
    CHECK_FALSE(gantry::parse_config("check_timeout_seconds = 0\n", "c").ok());  // no wait without an end
}

TEST_CASE("gantry.conf: stage_at_submit is auto by default, and one of auto, yes, no") {
    auto c = gantry::parse_config("", "c");
    REQUIRE(c.ok());
    CHECK(c->stage_at_submit == "auto");
    for (const char* v : {"auto", "yes", "no"}) {
        auto set = gantry::parse_config(std::string("stage_at_submit = ") + v + "\n", "c");
        REQUIRE(set.ok());
        CHECK(set->stage_at_submit == v);
    }
    auto bad = gantry::parse_config("stage_at_submit = sometimes\n", "c");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("stage_at_submit") != std::string::npos);
}

TEST_CASE("gantry.conf: stage_socket is off (empty) by default, and an absolute path that fits a socket address") {
    auto c = gantry::parse_config("", "c");
    REQUIRE(c.ok());
    CHECK(c->stage_socket.empty());
    auto set = gantry::parse_config("stage_socket = /run/gantry-stage/stage.sock\n", "c");
    REQUIRE(set.ok());
    CHECK(set->stage_socket == "/run/gantry-stage/stage.sock");
    CHECK_FALSE(gantry::parse_config("stage_socket = run/stage.sock\n", "c").ok());
    CHECK_FALSE(gantry::parse_config("stage_socket = /" + std::string(120, 'x') + "\n", "c").ok());
}

TEST_CASE("gantry.conf: errors name file, line and key") {
    auto unknown = gantry::parse_config("store_path=/x\nstorepath=/y\n", "/etc/gantry/gantry.conf");
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.error().message.find("/etc/gantry/gantry.conf:2") != std::string::npos);
    CHECK(unknown.error().message.find("'storepath'") != std::string::npos);
    CHECK_FALSE(gantry::parse_config("block_size = 1000\n", "c").ok());    // not a power of two
    CHECK_FALSE(gantry::parse_config("mount_backend = nfs\n", "c").ok());  // not a backend
    CHECK_FALSE(gantry::parse_config("host_dev = maybe\n", "c").ok());
    // store_owner: an account name; root is the default and "root" itself is refused as redundant.
    auto owner = gantry::parse_config("store_owner = gantry\n", "c");
    REQUIRE(owner.ok());
    CHECK(owner->store_owner == "gantry");
    CHECK(gantry::Config{}.store_owner.empty());
    CHECK_FALSE(gantry::parse_config("store_owner = root\n", "c").ok());
    CHECK_FALSE(gantry::parse_config("store_owner = a:b\n", "c").ok());
    CHECK_FALSE(gantry::parse_config("just a line\n", "c").ok());
}

TEST_CASE("gantry.conf: pull limits") {
    gantry::PullLimits defaults;
    CHECK(defaults.max_layer_bytes == 64ULL << 30);
    CHECK(defaults.max_image_bytes == 256ULL << 30);
    CHECK(defaults.max_layer_entries == 10000000);
    CHECK(defaults.max_layer_ratio == 1000);
    CHECK(defaults.ratio_floor_bytes == 1ULL << 30);
    auto c = gantry::parse_config(
        "max_layer_bytes = 1\nmax_image_bytes = 1099511627776\nmax_layer_entries = 9223372036854775807\n"
        "max_layer_ratio = 20\n",
        "c");
    REQUIRE(c.ok());
    CHECK(c->limits.max_layer_ratio == 20);
    CHECK(c->limits.max_layer_bytes == 1);
    CHECK(c->limits.max_image_bytes == 1ULL << 40);
    CHECK(c->limits.max_layer_entries == 9223372036854775807ULL);
    for (const char* bad :
         {"max_layer_bytes = 0\n", "max_image_bytes = -5\n", "max_layer_entries = 10M\n",
          "max_image_bytes = 9223372036854775808\n", "max_layer_bytes =\n", "max_layer_ratio = 0\n"}) {
        auto r = gantry::parse_config(bad, "c");
        INFO(bad);
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("c:1: max_") != std::string::npos);
    }
}

TEST_CASE("sha256 digests") {
    CHECK(gantry::Sha256::of("") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    gantry::Sha256 h;
    h.update("ab");
    h.update("c");
    CHECK(h.finish() == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(gantry::validate_digest(gantry::Sha256::of("x")).ok());
    CHECK_FALSE(gantry::validate_digest("sha512:abc").ok());
    CHECK_FALSE(gantry::validate_digest("sha256:ABC").ok());
    CHECK(gantry::digest_hex("sha256:abcd") == "abcd");
}

TEST_CASE("image config parsing") {
    auto c = gantry::parse_image_config(R"({"architecture":"amd64","os":"linux",
        "config":{"Env":["PATH=/usr/bin","A=1","A=2"],"Entrypoint":["/bin/sh","-c"],"Cmd":null,
                  "WorkingDir":"/work","Volumes":{"/data":{}},"Labels":{"k":"v"}},
        "rootfs":{"type":"layers","diff_ids":["sha256:1","sha256:2"]}})");
    REQUIRE(c.ok());
    CHECK(c->architecture == "amd64");
    CHECK(c->entrypoint == std::vector<std::string>{"/bin/sh", "-c"});
    CHECK(c->cmd.empty());
    CHECK(c->working_dir == "/work");
    CHECK(c->volumes == std::vector<std::string>{"/data"});
    CHECK(c->labels.at("k") == "v");
    CHECK(c->diff_ids.size() == 2);
    CHECK(gantry::find_env(c->env, "A").value() == "2");
    CHECK_FALSE(gantry::find_env(c->env, "PAT").has_value());
    CHECK_FALSE(gantry::parse_image_config("[1]").ok());
    CHECK_FALSE(gantry::parse_image_config(R"({"config":{"Env":"x"}})").ok());
}

TEST_CASE("string helpers") {
    CHECK(gantry::split_list(" a, ,b ,", ',') == std::vector<std::string>{"a", "b"});
    CHECK(gantry::format_bytes(1536) == "1.5 KiB");
}

// --- spawn(): the one way helpers are run from the plugin -------------------------------------------

namespace {
gantry::ProcessRequest shell(const std::string& script) {
    gantry::ProcessRequest rq;
    rq.argv = {"/bin/sh", "-c", script};
    rq.env = {"PATH=/usr/bin:/bin"};
    return rq;
}
}  // namespace

TEST_CASE("spawn: exit status, stdout and stderr", "[spawn]") {
    auto r = gantry::spawn(shell("echo out; echo err >&2; exit 3"));
    REQUIRE(r);
    CHECK(r->status == 3);
    CHECK(r->signal == 0);
    CHECK(r->out == "out\n");
    CHECK(r->err == "err\n");
    CHECK_FALSE(gantry::spawn(shell("true")).value().stopped);
    gantry::ProcessRequest nothing;
    nothing.argv = {"/nonexistent/program"};
    auto missing = gantry::spawn(nothing);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().message.find("could not run /nonexistent/program") != std::string::npos);
    CHECK_FALSE(gantry::spawn(shell("true")).value().stopped);
    auto relative = shell("true");
    relative.argv[0] = "sh";
    CHECK_FALSE(gantry::spawn(relative));
}

TEST_CASE("spawn: stdin is /dev/null unless a descriptor is passed as 0; find_program", "[spawn]") {
    auto empty = gantry::spawn(shell("cat"));
    REQUIRE(empty);
    CHECK(empty->out.empty());
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    REQUIRE(::write(fds[1], "fed\n", 4) == 4);
    ::close(fds[1]);
    auto fed = shell("cat");
    fed.inputs = {{fds[0], 0}};
    auto r = gantry::spawn(fed);
    ::close(fds[0]);
    REQUIRE(r);
    CHECK(r->out == "fed\n");
    CHECK(gantry::find_program("sh").find("/sh") != std::string::npos);
    CHECK(gantry::find_program("/bin/sh") == "/bin/sh");
    CHECK(gantry::find_program("no-such-program-gantry").empty());
}

TEST_CASE("spawn: a program writing without end is stopped at the cap", "[spawn]") {
    auto rq = shell("while :; do echo AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA; done");
    rq.stdout_cap = 4096;
    auto t0 = std::chrono::steady_clock::now();
    auto r = gantry::spawn(rq);
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("wrote too much to its stdout (more than 4096 bytes)") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    // Exactly at the cap is fine.
    auto exact = shell("head -c 4096 /dev/zero");
    exact.stdout_cap = 4096;
    auto ok = gantry::spawn(exact);
    REQUIRE(ok);
    CHECK(ok->out.size() == 4096);
    exact.stdout_cap = 4095;
    CHECK_FALSE(gantry::spawn(exact));
    // Over the cap on stdout while stderr ends in the same poll round (the program exits at once):
    // once hung the reader, which went on counting streams after it had stopped them all.
    for (int i = 0; i < 50; ++i) CHECK_FALSE(gantry::spawn(exact));
}

namespace {
// A program that closes stdout, stderr and its report descriptor, then sleeps: the pull child of
// issue #34, which once held spawn() in waitpid past its stop request. Its pid comes back in `pidfile`.
gantry::ProcessRequest closing_sleeper(const std::string& pidfile, std::string& report) {
    auto rq = shell("echo $$ > " + pidfile + "; exec >&- 2>&- 4>&-; exec sleep 30");
    rq.outputs.push_back({4, &report, 100, "report"});
    return rq;
}
pid_t read_pid(const std::string& path) {
    std::ifstream in(path);
    pid_t pid = 0;
    in >> pid;
    return pid;
}
}  // namespace

TEST_CASE("spawn: a stop request and the deadline end a child that closed its pipes; it is reaped", "[spawn]") {
    using namespace std::chrono;
    char dir[] = "/tmp/gantry-spawn-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string pidfile = std::string(dir) + "/pid";
    std::string report;
    SECTION("stop request") {
        auto rq = closing_sleeper(pidfile, report);
        auto t0 = steady_clock::now();
        rq.should_stop = [&] { return steady_clock::now() - t0 > seconds(1); };
        auto r = gantry::spawn(rq);
        auto took = steady_clock::now() - t0;
        REQUIRE(r);
        CHECK(r->stopped);
        CHECK_FALSE(r->timed_out);
        CHECK(r->signal == SIGKILL);
        CHECK(took >= seconds(1));
        CHECK(took < milliseconds(2500));
    }
    SECTION("deadline") {
        auto rq = closing_sleeper(pidfile, report);
        rq.timeout = milliseconds(1000);
        auto t0 = steady_clock::now();
        auto r = gantry::spawn(rq);
        auto took = steady_clock::now() - t0;
        REQUIRE(r);
        CHECK(r->timed_out);
        CHECK_FALSE(r->stopped);
        CHECK(r->signal == SIGKILL);
        CHECK(took >= milliseconds(1000));
        CHECK(took < milliseconds(2500));
    }
    // Reaped: no zombie of ours and nothing running under that pid (kill(pid, 0) finds a zombie too).
    pid_t pid = read_pid(pidfile);
    REQUIRE(pid > 1);
    errno = 0;
    CHECK(::kill(pid, 0) != 0);
    CHECK(errno == ESRCH);
    ::unlink(pidfile.c_str());
    ::rmdir(dir);
}

TEST_CASE("spawn: without stop or deadline, a child that closed its pipes is waited for", "[spawn]") {
    auto rq = shell("exec >&- 2>&-; sleep 0.5; exit 4");
    auto t0 = std::chrono::steady_clock::now();
    auto r = gantry::spawn(rq);
    REQUIRE(r);
    CHECK(r->status == 4);
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(500));
    // And output written by something it left behind is still read to its end.
    auto left = gantry::spawn(shell("(sleep 0.3; echo late) & echo early"));
    REQUIRE(left);
    CHECK(left->out == "early\nlate\n");
}

TEST_CASE("spawn: descriptors in and out, and nothing else of ours", "[spawn]") {
    int in[2];
    REQUIRE(::pipe(in) == 0);  // no close-on-exec: would leak without the explicit closing
    REQUIRE(::write(in[1], "hello", 5) == 5);
    ::close(in[1]);
    int null = ::open("/dev/null", O_RDONLY);
    int leak = ::fcntl(null, F_DUPFD, 50);  // no close-on-exec either, far from the targets
    ::close(null);
    REQUIRE(leak >= 50);
    std::string report;
    auto rq = shell("cat <&3 >&4; ls /proc/self/fd");
    rq.inputs.push_back({in[0], 3});
    rq.outputs.push_back({4, &report, 100, "report"});
    auto r = gantry::spawn(rq);
    ::close(in[0]);
    REQUIRE(r);
    CHECK(r->status == 0);
    CHECK(report == "hello");
    // ls's own view: 0 1 2 3 4 and the directory it reads; never our leak.
    CHECK(r->out.find("\n" + std::to_string(leak) + "\n") == std::string::npos);
    CHECK(r->out.find("\n4\n") != std::string::npos);
    ::close(leak);
    // The output cap holds for side pipes too.
    std::string small;
    auto big = shell("head -c 200 /dev/zero >&4");
    big.outputs.push_back({4, &small, 100, "report"});
    auto over = gantry::spawn(big);
    REQUIRE_FALSE(over);
    CHECK(over.error().message.find("wrote too much to its report") != std::string::npos);
}

TEST_CASE("start_process: returns at once; only the passed descriptors; a daemonized program is no child", "[spawn]") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    gantry::UniqueFd rd(p[0]), wr(p[1]);
    int null = ::open("/dev/null", O_RDONLY);
    int stray = ::fcntl(null, F_DUPFD, 40);  // not close-on-exec: must not reach the program all the same
    ::close(null);
    REQUIRE(stray >= 40);
    for (bool daemonize : {false, true}) {
        auto rq =
            shell("echo \"$$ $PPID $(ls /proc/self/fd | tr '\\n' ' ')\" >&5; readlink /proc/self/fd/2 >&5; sleep 0.3");
        rq.inputs = {{wr.get(), 5}};
        rq.daemonize = daemonize;
        rq.own_session = true;
        auto t0 = std::chrono::steady_clock::now();
        auto pid = gantry::start_process(rq);
        REQUIRE(pid);
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(250));  // did not wait for it
        std::string text;
        char buf[256];
        while (text.find("\n", text.find('\n') + 1) == std::string::npos) {
            ssize_t n = ::read(rd.get(), buf, sizeof buf);
            REQUIRE(n > 0);
            text.append(buf, static_cast<size_t>(n));
        }
        std::istringstream in(text);
        pid_t self = 0, parent = 0;
        in >> self >> parent;
        INFO(text);
        // fds: 0 1 2 5 and the one ls opened for the listing.
        CHECK(text.find(" " + std::to_string(stray) + " ") == std::string::npos);
        CHECK(text.find("/dev/null") != std::string::npos);  // stderr: /dev/null, nothing of ours
        if (daemonize) {
            CHECK(*pid == 0);
            CHECK(parent != ::getpid());
        } else {
            CHECK(*pid == self);
            CHECK(parent == ::getpid());
            int status = 0;
            REQUIRE(::waitpid(*pid, &status, 0) == *pid);
            CHECK(WIFEXITED(status));
        }
    }
    ::close(stray);
}

TEST_CASE("spawn: no_new_privs reaches the program", "[spawn]") {
    auto rq = shell("grep NoNewPrivs: /proc/self/status");
    auto plain = gantry::spawn(rq);
    REQUIRE(plain);
    CHECK(plain->out == "NoNewPrivs:\t0\n");
    rq.no_new_privs = true;
    auto locked = gantry::spawn(rq);
    REQUIRE(locked);
    CHECK(locked->out == "NoNewPrivs:\t1\n");
}

TEST_CASE("spawn: should_stop kills the program and its process group", "[spawn]") {
    auto rq = shell("sleep 30 & sleep 30; wait");
    auto t0 = std::chrono::steady_clock::now();
    rq.should_stop = [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300); };
    auto r = gantry::spawn(rq);
    REQUIRE(r);
    CHECK(r->stopped);
    CHECK(r->signal == SIGKILL);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("spawn: the program runs with the identity asked for, for good", "[spawn][root]") {
    REQUIRE(::geteuid() == 0);
    auto rq = shell("id -u; id -g; id -G; cat /proc/self/status | grep -E '^(Uid|Gid):'");
    rq.identity = gantry::ProcessIdentity{65534, 65534, {65534}};
    auto r = gantry::spawn(rq);
    REQUIRE(r);
    CHECK(r->status == 0);
    CHECK(r->out.rfind("65534\n65534\n65534\n", 0) == 0);
    CHECK(r->out.find("Uid:\t65534\t65534\t65534\t65534") != std::string::npos);
}

TEST_CASE("Error::wrap keeps the registry's HTTP status and errno under the added context", "[core][result]") {
    using gantry::Error;
    Error e = gantry::make_error("resolving r/x:missing: HTTP 404 MANIFEST_UNKNOWN (manifest unknown)");
    e.http_status = 404;
    Error w = e.wrap("failed to import docker image r/x:missing").wrap("outer");
    CHECK(w.http_status == 404);
    CHECK(w.message == "outer: failed to import docker image r/x:missing: " + e.message);
    CHECK(gantry::make_error("no status").wrap("x").http_status == 0);
    CHECK(gantry::system_error("opening f", ENOENT).wrap("y").errnum == ENOENT);
}

TEST_CASE("gantry.conf: container defaults, drop-in directories and enroot.conf") {
    auto plain = gantry::parse_config("", "empty.conf");
    REQUIRE(plain.ok());
    auto d = gantry::container_defaults(*plain);
    CHECK_FALSE(d.writable);
    CHECK_FALSE(d.remap_root);
    CHECK(d.mount_home);
    CHECK(plain->environ_dir == "/etc/gantry/environ.d");
    CHECK(plain->mounts_dir == "/etc/gantry/mounts.d");

    auto c = gantry::parse_config(
        "container_writable = yes\ncontainer_mount_home = no\nenviron_dir = /etc/enroot/environ.d\nmounts_dir =\n"
        "enroot_conf = /etc/enroot/enroot.conf\n",
        "t.conf");
    REQUIRE(c.ok());
    CHECK(c->environ_dir == "/etc/enroot/environ.d");
    CHECK(c->mounts_dir.empty());
    CHECK(c->enroot_conf == "/etc/enroot/enroot.conf");
    // enroot.conf fills only what gantry.conf left unset.
    auto st = gantry::apply_enroot_conf(*c,
                                        "# site\nENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\n"
                                        "ENROOT_ROOTFS_WRITABLE no\nENROOT_REMAP_ROOT  y\nENROOT_MOUNT_HOME=yes\n",
                                        "enroot.conf");
    REQUIRE(st.ok());
    d = gantry::container_defaults(*c);
    CHECK(d.writable);          // gantry.conf said yes; enroot.conf's no loses
    CHECK(d.remap_root);        // only enroot.conf set it
    CHECK_FALSE(d.mount_home);  // gantry.conf said no

    auto bad = gantry::apply_enroot_conf(*plain, "\nENROOT_REMAP_ROOT maybe\n", "/etc/enroot/enroot.conf");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message == "/etc/enroot/enroot.conf:2: ENROOT_REMAP_ROOT: expected yes or no, got 'maybe'");
    auto rel = gantry::parse_config("environ_dir = environ.d\n", "t.conf");
    REQUIRE_FALSE(rel.ok());
    CHECK(rel.error().message.find("t.conf:1: environ_dir") == 0);
    CHECK_FALSE(gantry::parse_config("container_writable = sometimes\n", "t.conf").ok());
}

TEST_CASE("gantry.conf: load_config reads the enroot.conf it names") {
    std::string dir = std::filesystem::temp_directory_path() / ("gantry-enroot-conf-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/enroot.conf") << "ENROOT_ROOTFS_WRITABLE yes\n";
    std::ofstream(dir + "/gantry.conf") << "enroot_conf = " + dir + "/enroot.conf\n";
    auto c = gantry::load_config(dir + "/gantry.conf", false);
    REQUIRE(c.ok());
    CHECK(gantry::container_defaults(*c).writable);
    std::ofstream(dir + "/gantry.conf") << "enroot_conf = " + dir + "/missing.conf\n";
    auto missing = gantry::load_config(dir + "/gantry.conf", false);
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message.find(dir + "/missing.conf (enroot_conf in " + dir + "/gantry.conf)") !=
          std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST_CASE("configuration files: size limit at its boundary, FIFOs, devices and directories refused, /dev/null empty") {
    std::string dir = std::filesystem::temp_directory_path() / ("gantry-config-files-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const size_t max = gantry::kMaxConfigFileBytes;
    CHECK(max == size_t{4} << 20);

    std::ofstream(dir + "/full") << std::string(max, '#');
    auto full = gantry::read_config_file(dir + "/full", "full");
    REQUIRE(full.ok());
    CHECK(full->size() == max);

    std::ofstream(dir + "/over") << std::string(max + 1, '#');
    auto over = gantry::read_config_file(dir + "/over", "the file over");
    REQUIRE_FALSE(over.ok());
    CHECK(over.error().message == "reading the file over: larger than the limit of 4194304 bytes");

    // A FIFO with no writer: a blocking open would wait for ever; this one returns at once.
    REQUIRE(::mkfifo((dir + "/fifo").c_str(), 0600) == 0);
    auto fifo = gantry::read_config_file(dir + "/fifo", "fifo");
    REQUIRE_FALSE(fifo.ok());
    CHECK(fifo.error().message.find("reading fifo: not a regular file") == 0);

    auto zero = gantry::read_config_file("/dev/zero", "/dev/zero");
    REQUIRE_FALSE(zero.ok());
    CHECK(zero.error().message.find("not a regular file") != std::string::npos);
    auto directory = gantry::read_config_file(dir, "a directory");
    REQUIRE_FALSE(directory.ok());
    CHECK(directory.error().message.find("not a regular file") != std::string::npos);

    auto null = gantry::read_config_file("/dev/null", "/dev/null");
    REQUIRE(null.ok());
    CHECK(null->empty());

    auto missing = gantry::read_config_file(dir + "/missing", "missing");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().errnum == ENOENT);

    // gantry.conf and the enroot.conf it names go through it: a FIFO in either place is an error, not a hang.
    auto conf = gantry::load_config(dir + "/fifo", false);
    REQUIRE_FALSE(conf.ok());
    CHECK(conf.error().message.find("reading configuration " + dir + "/fifo: not a regular file") == 0);
    std::ofstream(dir + "/gantry.conf") << "enroot_conf = " + dir + "/fifo\n";
    auto enroot = gantry::load_config(dir + "/gantry.conf", false);
    REQUIRE_FALSE(enroot.ok());
    CHECK(enroot.error().message.find("(enroot_conf in " + dir + "/gantry.conf): not a regular file") !=
          std::string::npos);
    CHECK(gantry::load_config("/dev/null", false).ok());
    CHECK(gantry::load_config(dir + "/missing", true).ok());
    std::filesystem::remove_all(dir);
}

// --- start-up telemetry (include/gantry/telemetry.hpp) ---------------------------------------------

namespace {
gantry::telemetry::StartRecord sample_record(const std::string& node, double total) {
    gantry::telemetry::StartRecord r;
    r.job = 42;
    r.step = 0;
    r.node = node;
    r.user = "alice";
    r.uid = 1000;
    r.image = "registry#team/model:v1";
    r.digest = "sha256:" + std::string(64, 'a');
    r.outcome = gantry::telemetry::ImageOutcome::stored;
    r.start_unix_ms = 1764660000000;
    r.resolve_ms = 12.5;
    r.pull_ms = total / 2;
    r.mount_ms = total / 4;
    r.exec_ms = total / 4;
    r.total_ms = total;
    return r;
}
}  // namespace

TEST_CASE("telemetry: a record is one JSON line that reads back; phases that did not happen are null", "[telemetry]") {
    using namespace gantry::telemetry;
    auto r = sample_record("node-1", 800);
    r.since_srun_ms.reset();
    std::string line = to_json_line(r);
    CHECK(line.back() == '\n');
    CHECK(std::count(line.begin(), line.end(), '\n') == 1);
    CHECK(line.find("\"since_srun_ms\":null") != std::string::npos);
    CHECK(line.find("\"image_from\":\"stored\"") != std::string::npos);
    auto back = parse_line(line);
    REQUIRE(back);
    CHECK(back->node == "node-1");
    CHECK(back->digest == r.digest);
    CHECK(back->outcome == ImageOutcome::stored);
    CHECK(back->total_ms == 800);
    CHECK_FALSE(back->since_srun_ms);
    // A name far too long is cut: the line stays below PIPE_BUF.
    r.image = std::string(100000, 'x');
    CHECK(to_json_line(r).size() < kMaxLineBytes);
    CHECK_FALSE(parse_line("{\"job\": \"x\"}"));
    CHECK_FALSE(parse_line("not json"));
    CHECK(file_name(42, 3, "gnode1/../x y") == "42.3.gnode1_.._x_y.json");
}

TEST_CASE("telemetry: trace points are remembered for the record", "[telemetry]") {
    using namespace gantry::telemetry;
    record();
    { gantry::trace::Phase p("telemetry-unit-phase"); }
    auto from = first_point("telemetry-unit-phase +");
    auto to = last_point("telemetry-unit-phase -");
    REQUIRE(from);
    REQUIRE(to);
    CHECK(*to >= *from);
    CHECK(gantry::trace::descriptor() < 0);  // recording opens no trace file (the holder gets none)
}

TEST_CASE("telemetry: written only as a new file in a directory nobody else can write", "[telemetry]") {
    using namespace gantry::telemetry;
    char dir[] = "/tmp/gantry-telemetry-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string d = dir;
    REQUIRE(::chmod(dir, 0755) == 0);
    auto r = sample_record("n1", 100);
    REQUIRE(write_record(d, r));
    // The same node and step again: the file exists, nothing is overwritten.
    auto again = write_record(d, r);
    CHECK_FALSE(again);
    // A symlink under the next record's name is never followed.
    const std::string target = d + "/target";
    { std::ofstream(target) << "untouched"; }
    REQUIRE(::symlink(target.c_str(), (d + "/" + file_name(42, 0, "n2")).c_str()) == 0);
    CHECK_FALSE(write_record(d, sample_record("n2", 100)));
    CHECK(gantry::try_read_file(target).value_or("") == "untouched");
    // A directory others may write is refused outright.
    REQUIRE(::chmod(dir, 01777) == 0);
    auto refused = write_record(d, sample_record("n3", 100));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().message.find("writable by nobody else") != std::string::npos);
    CHECK(::access((d + "/" + file_name(42, 0, "n3")).c_str(), F_OK) != 0);
    REQUIRE(::chmod(dir, 0755) == 0);
    // The directory reached through a symlink is refused too.
    const std::string link = d + "-link";
    REQUIRE(::symlink(dir, link.c_str()) == 0);
    CHECK_FALSE(write_record(link, sample_record("n4", 100)));
    ::unlink(link.c_str());
    // What was written reads back; the planted link and the target file are not records.
    size_t skipped = 0;
    auto read = read_records(d, 42, &skipped);
    REQUIRE(read);
    REQUIRE(read->size() == 1);
    CHECK(read->front().node == "n1");
    auto latest = latest_job(d);
    REQUIRE(latest);
    CHECK(*latest == 42);
    std::filesystem::remove_all(d);
}

TEST_CASE("telemetry: p50/p99 by nearest rank, stragglers over 2x the median", "[telemetry]") {
    using namespace gantry::telemetry;
    CHECK(percentile({}, 50) == 0);
    CHECK(percentile({5}, 99) == 5);
    CHECK(percentile({4, 1, 3, 2}, 50) == 2);
    std::vector<double> hundred;
    for (int i = 1; i <= 100; ++i) hundred.push_back(i);
    CHECK(percentile(hundred, 99) == 99);
    CHECK(percentile(hundred, 50) == 50);

    std::vector<StartRecord> records;
    for (int i = 0; i < 9; ++i) records.push_back(sample_record("n" + std::to_string(i), 1000 + i));
    auto slow = sample_record("slow", 5000);
    slow.pull_ms = 4000;
    slow.mount_ms = 500;
    slow.exec_ms = 500;
    slow.outcome = ImageOutcome::pulled;
    records.push_back(slow);
    // 1.9x the median is no straggler; neither is 3x a median of 100 ms (under median + 500 ms).
    records.push_back(sample_record("near", 1900));
    auto steps = summarize(records);
    REQUIRE(steps.size() == 1);
    const auto& s = steps.front();
    CHECK(s.pulled == 1);
    CHECK(s.stored == 10);
    REQUIRE(s.stragglers.size() == 1);
    CHECK(s.stragglers[0].node == "slow");
    CHECK(s.stragglers[0].worst == "pull");
    auto total =
        std::find_if(s.phases.begin(), s.phases.end(), [](const PhaseSummary& p) { return p.phase == "total"; });
    REQUIRE(total != s.phases.end());
    CHECK(total->nodes == 11);
    CHECK(total->p50 == 1005);
    CHECK(total->max == 5000);

    std::vector<StartRecord> fast;
    for (int i = 0; i < 5; ++i) fast.push_back(sample_record("f" + std::to_string(i), 100));
    fast.push_back(sample_record("f-slow", 300));
    CHECK(summarize(fast).front().stragglers.empty());
}

// The one reader of the process environment (include/gantry/environment.hpp).
TEST_CASE("environment: read once, read again on request; set and unset keep the snapshot current") {
    using namespace gantry;
    ::setenv("GANTRY_PULL_GROUP", "first", 1);
    ::unsetenv("GANTRY_STORE");
    const Environment& before = reread_environment();
    CHECK(before.gantry_pull_group.set);
    CHECK(before.gantry_pull_group.value == "first");
    CHECK_FALSE(before.gantry_store.set);

    // Read once: a change behind the library's back is not seen until the next read ...
    ::setenv("GANTRY_PULL_GROUP", "second", 1);
    CHECK(environment().gantry_pull_group.value == "first");
    // ... and a snapshot handed out earlier stays valid and unchanged after it.
    const Environment& after = reread_environment();
    CHECK(after.gantry_pull_group.value == "second");
    CHECK(before.gantry_pull_group.value == "first");
    CHECK(&environment() == &after);
    CHECK(&reread_environment() == &after);  // nothing changed: no new snapshot

    // Set to the empty string is not unset (PATH, SLURM_CONF and the plugin's hand-over care).
    set_environment_variable("GANTRY_STORE", "");
    CHECK(environment().gantry_store.set);
    CHECK(environment().gantry_store.empty());
    set_environment_variable("GANTRY_RESOLVED_IMAGE", "img@sha256:00");
    CHECK(environment().gantry_resolved_image.value == "img@sha256:00");
    CHECK(std::string(std::getenv("GANTRY_RESOLVED_IMAGE")) == "img@sha256:00");  // the process's too
    unset_environment_variable("GANTRY_RESOLVED_IMAGE");
    CHECK_FALSE(environment().gantry_resolved_image.set);
    CHECK(std::getenv("GANTRY_RESOLVED_IMAGE") == nullptr);
    unset_environment_variable("GANTRY_STORE");
    unset_environment_variable("GANTRY_PULL_GROUP");
}

TEST_CASE("environment: the options' environment forms and inherited options are read by prefix") {
    using namespace gantry;
    ::setenv("PYXIS_CONTAINER_IMAGE", "ubuntu", 1);
    ::setenv("GANTRY_CONTAINER_MOUNTS", "", 1);
    ::setenv("SLURM_SPANK__SLURM_SPANK_OPTION_gantry_container_image", "alpine", 1);
    ::setenv("NOT_PYXIS_CONTAINER_IMAGE", "x", 1);
    const Environment& env = reread_environment();
    CHECK(env.container_forms.at("PYXIS_CONTAINER_IMAGE") == "ubuntu");
    CHECK(env.container_forms.at("GANTRY_CONTAINER_MOUNTS").empty());
    CHECK(env.container_forms.count("NOT_PYXIS_CONTAINER_IMAGE") == 0);
    CHECK(env.inherited_options.at("SLURM_SPANK__SLURM_SPANK_OPTION_gantry_container_image") == "alpine");
    for (const char* n : {"PYXIS_CONTAINER_IMAGE", "GANTRY_CONTAINER_MOUNTS",
                          "SLURM_SPANK__SLURM_SPANK_OPTION_gantry_container_image", "NOT_PYXIS_CONTAINER_IMAGE"})
        ::unsetenv(n);
    CHECK(reread_environment().container_forms.count("PYXIS_CONTAINER_IMAGE") == 0);
}
