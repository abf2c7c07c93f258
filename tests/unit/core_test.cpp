// Unit tests for the core module: configuration parsing, digests, image config, strings, thread watch.
#include <csignal>
#include <unistd.h>
#include <fcntl.h>
#include <catch2/catch.hpp>

#include "gantry/spawn.hpp"
#include "gantry/config.hpp"
#include "gantry/digest.hpp"
#include "gantry/image_config.hpp"
#include "gantry/strings.hpp"
#include "gantry/threads.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

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
    auto c = gantry::parse_config(
        "max_layer_bytes = 1\nmax_image_bytes = 1099511627776\nmax_layer_entries = 9223372036854775807\n", "c");
    REQUIRE(c.ok());
    CHECK(c->limits.max_layer_bytes == 1);
    CHECK(c->limits.max_image_bytes == 1ULL << 40);
    CHECK(c->limits.max_layer_entries == 9223372036854775807ULL);
    for (const char* bad : {"max_layer_bytes = 0\n", "max_image_bytes = -5\n", "max_layer_entries = 10M\n",
                            "max_image_bytes = 9223372036854775808\n", "max_layer_bytes =\n"}) {
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

TEST_CASE("new threads blocked in a futex wait are found; old, sleeping and short-lived ones are not") {
    using namespace std::chrono_literals;
    std::mutex m;
    std::condition_variable cv;
    bool release = false;
    auto wait_for_release = [&] {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return release; });
    };
    // A thread that already waits when the watch starts is slurmstepd's own: never reported.
    std::thread old_waiter(wait_for_release);
    std::this_thread::sleep_for(50ms);
    gantry::NewBlockedThreads watch;
    CHECK_FALSE(watch.check(0ms));

    // New, but sleeping (not a futex) or gone quickly: not reported.
    std::thread sleeper([] { std::this_thread::sleep_for(600ms); });
    std::thread quick([] {});
    quick.join();
    std::this_thread::sleep_for(100ms);
    CHECK_FALSE(watch.check(0ms));

    // New and waiting: reported once it has waited long enough across observations, not before.
    std::thread waiter(wait_for_release);
    std::this_thread::sleep_for(100ms);
    std::string which;
    CHECK_FALSE(watch.check(300ms, &which));
    std::this_thread::sleep_for(400ms);
    CHECK(watch.check(300ms, &which));
    CHECK(which.rfind("tid ", 0) == 0);

    {
        std::lock_guard lock(m);
        release = true;
    }
    cv.notify_all();
    waiter.join();
    old_waiter.join();
    sleeper.join();
    CHECK_FALSE(watch.check(0ms));
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
    auto missing = gantry::spawn({{"/nonexistent/program"}, {}, {}, -1, {}, 200, {}, {}, 1024, 1024, {}});
    REQUIRE_FALSE(missing);
    CHECK(missing.error().message.find("could not run /nonexistent/program") != std::string::npos);
    CHECK_FALSE(gantry::spawn(shell("true")).value().stopped);
    auto relative = shell("true");
    relative.argv[0] = "sh";
    CHECK_FALSE(gantry::spawn(relative));
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
