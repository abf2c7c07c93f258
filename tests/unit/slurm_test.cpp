// Unit tests of runtime/slurm, the code only the Slurm side uses: slurm.conf and plugstack.conf as
// Slurm reads them and the Slurm release (gantry doctor), the store's file system and its flock scope
// (gantry doctor), and the watch on slurmstepd's new blocked threads (the plugin).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "gantry/slurm_conf.hpp"
#include "gantry/store_fs.hpp"
#include "gantry/threads.hpp"

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

TEST_CASE("store file system: Lustre needs the flock mount option, NFS no local_lock of flock") {
    using gantry::flock_scope;
    using gantry::FlockScope;
    CHECK(flock_scope("lustre", "rw,relatime,flock,lazystatfs") == FlockScope::cluster);
    CHECK(flock_scope("lustre", "rw,localflock,lazystatfs") == FlockScope::node);
    CHECK(flock_scope("lustre", "rw,noflock") == FlockScope::disabled);
    CHECK(flock_scope("lustre", "rw,relatime,lazystatfs") == FlockScope::disabled);  // Lustre's default
    // The statfs magic decides where mountinfo names the type otherwise.
    CHECK(flock_scope("?", "rw,localflock", true) == FlockScope::node);
    CHECK(flock_scope("?", "rw,flock", true) == FlockScope::cluster);
    // Substrings are not options: "noflock" does not contain the option "flock".
    CHECK(flock_scope("lustre", "rw,noflock,user_xattr") == FlockScope::disabled);
    CHECK(flock_scope("nfs4", "rw,vers=4.1,local_lock=none") == FlockScope::cluster);
    CHECK(flock_scope("nfs", "rw,local_lock=flock") == FlockScope::node);
    CHECK(flock_scope("nfs4", "rw,local_lock=all") == FlockScope::node);
    CHECK(flock_scope("nfs4", "rw,local_lock=posix") == FlockScope::cluster);
    CHECK(flock_scope("ext4", "rw,relatime") == FlockScope::unchecked);
    CHECK(std::string(gantry::to_string(FlockScope::node)) == "local to each node");
}

TEST_CASE("store file system: mountinfo lines and the mount a path lies on") {
    auto mounts = gantry::parse_mountinfo(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "90 22 0:50 / /fsx rw,relatime shared:40 - lustre 172.31.0.5@tcp:/abcd rw,flock,lazystatfs\n"
        "91 90 0:51 / /fsx/my\\040dir rw - tmpfs tmpfs rw,size=1024k\n"
        "92 22 0:52 / /fsxother rw - nfs4 srv:/x rw,local_lock=flock\n");
    REQUIRE(mounts.size() == 4);
    CHECK(mounts[1].fstype == "lustre");
    CHECK(mounts[1].source == "172.31.0.5@tcp:/abcd");
    CHECK(mounts[1].super_options == "rw,flock,lazystatfs");
    CHECK(mounts[2].mount_point == "/fsx/my dir");
    CHECK(gantry::mount_containing(mounts, "/fsx/gantry/images")->mount_point == "/fsx");
    CHECK(gantry::mount_containing(mounts, "/fsx")->mount_point == "/fsx");
    CHECK(gantry::mount_containing(mounts, "/fsxother/s")->fstype == "nfs4");  // not /fsx: a prefix only
    CHECK(gantry::mount_containing(mounts, "/fsx/my dir/a")->fstype == "tmpfs");
    CHECK(gantry::mount_containing(mounts, "/home/u")->mount_point == "/");
    // Mounted over: the later line wins.
    auto over = gantry::parse_mountinfo(
        "1 0 8:1 / /fsx rw - ext4 /dev/sdb rw\n2 0 0:9 / /fsx rw - lustre a@tcp:/b rw,localflock\n");
    CHECK(gantry::mount_containing(over, "/fsx/x")->fstype == "lustre");
}

TEST_CASE("slurm.conf and plugstack.conf: PlugStackConfig, includes relative to their file, globs") {
    namespace fs = std::filesystem;
    auto root = fs::temp_directory_path() / ("gantry-core-slurm-" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root / "etc/plugstack.d");
    auto write = [&](const std::string& rel, const std::string& text) { std::ofstream(root / rel) << text; };
    write("etc/slurm.conf", "ClusterName=c\nplugstackconfig=" + (root / "etc/stack.conf").string() + "\n");
    write("etc/stack.conf", "# Slurm's plugins\noptional /x/other.so\ninclude plugstack.d/*.conf\n");
    write("etc/plugstack.d/10-a.conf", "include nothing-here/*.conf\n");
    write("etc/plugstack.d/20-gantry.conf",
          "\n#required /old/spank_gantry.so\n  required\t/usr/lib/spank_gantry.so config=/etc/g.conf # on\n");

    std::string conf = (root / "etc/slurm.conf").string();
    CHECK(gantry::slurm_conf::value(conf, "PlugStackConfig") == (root / "etc/stack.conf").string());
    CHECK(gantry::slurm_conf::plugstack_path(conf) == (root / "etc/stack.conf").string());
    auto scan = gantry::slurm_conf::find_plugin(gantry::slurm_conf::plugstack_path(conf), "spank_gantry.so");
    REQUIRE(scan.found);
    CHECK(scan.found->file == (root / "etc/plugstack.d/20-gantry.conf").string());
    CHECK(scan.found->line == 3);
    CHECK(scan.found->kind == "required");
    CHECK(scan.found->plugin == "/usr/lib/spank_gantry.so");
    CHECK(scan.found->args == std::vector<std::string>{"config=/etc/g.conf"});
    CHECK(scan.files.size() == 3);
    CHECK(scan.empty_globs == std::vector<std::string>{(root / "etc/plugstack.d/nothing-here/*.conf").string()});

    // Without PlugStackConfig: plugstack.conf beside slurm.conf.
    write("etc/slurm.conf", "ClusterName=c\n");
    CHECK(gantry::slurm_conf::plugstack_path(conf) == (root / "etc/plugstack.conf").string());
    auto none = gantry::slurm_conf::find_plugin((root / "etc/plugstack.conf").string(), "spank_gantry.so");
    CHECK(none.files.empty());
    CHECK(none.unreadable.size() == 1);
    // SLURM_CONF is used as given.
    CHECK(gantry::slurm_conf::locate(conf) == conf);
    fs::remove_all(root);
}

TEST_CASE("slurm release from slurmd -V and scontrol --version") {
    CHECK(gantry::slurm_conf::release_of("slurm-wlm 22.05.8\n") == "22.05");
    CHECK(gantry::slurm_conf::release_of("slurm 24.11.5") == "24.11");
    CHECK(gantry::slurm_conf::release_of("slurm 25.05.0-0rc1") == "25.05");
    CHECK_FALSE(gantry::slurm_conf::release_of("scontrol: fatal: Unable to process configuration file"));
    CHECK(gantry::slurm_conf::line_words("  include a/*.conf # x") == std::vector<std::string>{"include", "a/*.conf"});
    CHECK(gantry::slurm_conf::line_words("# only a comment").empty());
}
