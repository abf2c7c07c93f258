// Unit tests for the image store: atomic publication, tag records, one producer per digest across
// processes (including a producer killed with SIGKILL), in-use protection and LRU garbage collection.
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/pull_report.hpp"
#include "gantry/store.hpp"

using namespace gantry;
using namespace std::chrono_literals;

namespace {

struct TempStore {
    std::string dir;
    TempStore() {
        char tmpl[] = "/tmp/gantry-store-test.XXXXXX";
        dir = ::mkdtemp(tmpl);
    }
    ~TempStore() { (void)remove_tree(dir); }
    ImageStore open() {
        auto s = ImageStore::open(dir, true);
        REQUIRE(s.ok());
        return *s;
    }
};

std::string fake_digest(const std::string& seed) { return Sha256::of(seed); }

void publish_fake(const ImageStore& store, const std::string& digest, size_t bytes, const std::string& ref = "") {
    std::string tmp = store.staging_dir(digest) + ".sqsh";
    REQUIRE(make_directories(store.root() + "/staging").ok());
    std::ofstream(tmp) << std::string(bytes, 'x');
    ImageMetadata meta;
    meta.config_json = R"({"config":{"Env":["A=1"]}})";
    if (!ref.empty()) meta.references.push_back(ref);
    REQUIRE(store.publish(digest, tmp, meta).ok());
}

}  // namespace

TEST_CASE("publish makes an image visible only when complete") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("one");
    CHECK_FALSE(store.find(d).has_value());
    publish_fake(store, d, 1000, "reg/repo:tag");
    auto img = store.find(d);
    REQUIRE(img.has_value());
    CHECK(img->metadata.image_bytes == 1000);
    CHECK(img->metadata.manifest_digest == d);
    CHECK(img->metadata.references == std::vector<std::string>{"reg/repo:tag"});
    CHECK(img->squashfs_path == t.dir + "/images/" + digest_hex(d) + ".sqsh");
    // The published file is read-only: nothing rewrites an image in place.
    CHECK(((::access(img->squashfs_path.c_str(), W_OK) != 0) || (::geteuid() == 0)));
    auto all = store.list();
    REQUIRE(all.ok());
    CHECK(all->size() == 1);
}

TEST_CASE("a .sqsh without metadata, or a leftover temporary file, is not an image") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("partial");
    std::ofstream(t.dir + "/images/" + digest_hex(d) + ".json.tmp.1.2") << "{";
    std::ofstream(t.dir + "/staging/" + digest_hex(d) + ".partial") << "junk";
    CHECK_FALSE(store.find(d).has_value());
    auto all = store.list();
    REQUIRE(all.ok());
    CHECK(all->empty());
}

TEST_CASE("tag records map a reference to its digest") {
    TempStore t;
    auto store = t.open();
    ImageReference ref{"alice", "127.0.0.1:5000", "team/img", "v1", ""};
    auto d = fake_digest("tagged");
    REQUIRE(store.record_tag(ref, d).ok());
    ImageReference same = ref;
    same.user.clear();  // the credential selector does not change what the tag names
    auto rec = store.lookup_tag(same);
    REQUIRE(rec.has_value());
    CHECK(rec->digest == d);
    CHECK(rec->reference == "127.0.0.1:5000/team/img:v1");
    CHECK(rec->resolved_at > 0);
    ImageReference other = ref;
    other.tag = "v2";
    CHECK_FALSE(store.lookup_tag(other).has_value());
}

TEST_CASE("one producer per digest across processes; a killed producer is replaced") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("contended");
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_t child = ::fork();
    if (child == 0) {
        auto lock = store.lock_producer(d, 10s);
        char c = lock.ok() ? 'y' : 'n';
        (void)!::write(ready[1], &c, 1);
        ::pause();  // hold the lock until killed
        ::_exit(0);
    }
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    REQUIRE(c == 'y');
    // While the child holds it, we time out, and the message names the holder.
    auto busy = store.lock_producer(d, 1s);
    REQUIRE_FALSE(busy.ok());
    CHECK(busy.error().message.find(":" + std::to_string(child)) != std::string::npos);
    // SIGKILL the producer: the kernel drops its lock and we take over without any cleanup step.
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    auto mine = store.lock_producer(d, 5s);
    CHECK(mine.ok());
    ::close(ready[0]);
    ::close(ready[1]);
}

TEST_CASE("images in use are neither removed nor collected") {
    TempStore t;
    auto store = t.open();
    auto used = fake_digest("used");
    auto idle = fake_digest("idle");
    publish_fake(store, used, 100);
    publish_fake(store, idle, 100);
    {
        auto fd = store.open_in_use(used);
        REQUIRE(fd.ok());
        CHECK(store.in_use(used));
        CHECK_FALSE(store.in_use(idle));
        auto rm = store.remove(used);
        REQUIRE_FALSE(rm.ok());
        CHECK(rm.error().message.find("in use") != std::string::npos);
        auto gc = store.gc(1, 0s);  // wants everything gone
        REQUIRE(gc.ok());
        CHECK(gc->removed == std::vector<std::string>{idle});
        CHECK(gc->kept_in_use == std::vector<std::string>{used});
    }
    CHECK_FALSE(store.in_use(used));
    CHECK(store.remove(used).ok());
    CHECK_FALSE(store.find(used).has_value());
}

TEST_CASE("gc removes least recently used images first, down to the size target") {
    TempStore t;
    auto store = t.open();
    auto a = fake_digest("a"), b = fake_digest("b"), c = fake_digest("c");
    publish_fake(store, a, 1000);
    publish_fake(store, b, 1000);
    publish_fake(store, c, 1000);
    // Make the use order explicit: b oldest, then a, then c.
    auto set_used = [&](const std::string& d, time_t when) {
        struct timespec ts[2] = {{when, 0}, {when, 0}};
        REQUIRE(::utimensat(AT_FDCWD, (t.dir + "/used/" + digest_hex(d)).c_str(), ts, 0) == 0);
    };
    time_t now = ::time(nullptr);
    set_used(b, now - 3000);
    set_used(a, now - 2000);
    set_used(c, now - 10);
    auto r = store.gc(1500, 0s);
    REQUIRE(r.ok());
    CHECK(r->removed == std::vector<std::string>{b, a});
    CHECK(r->bytes_left == 1000);
    CHECK(store.find(c).has_value());
    // Age target: c was used 10 s ago, so "unused for 1 h" keeps it and "unused for 5 s" removes it.
    CHECK(store.gc(0, 3600s)->removed.empty());
    CHECK(store.gc(0, 5s)->removed == std::vector<std::string>{c});
}

TEST_CASE("store path precedence: option, GANTRY_STORE, gantry.conf, XDG cache") {
    Config cfg;
    cfg.store_path = "/fsx/gantry";
    ::setenv("GANTRY_STORE", "/env/store", 1);
    CHECK(ImageStore::resolve_path(cfg, "/cli/store") == "/cli/store");
    CHECK(ImageStore::resolve_path(cfg, "") == "/env/store");
    ::unsetenv("GANTRY_STORE");
    CHECK(ImageStore::resolve_path(cfg, "") == "/fsx/gantry");
    cfg.store_path.clear();
    ::setenv("XDG_CACHE_HOME", "/xdg", 1);
    CHECK(ImageStore::resolve_path(cfg, "") == "/xdg/gantry");
    CHECK_FALSE(ImageStore::open("relative/path", true).ok());
}

TEST_CASE("trusted store: owned by root or the configured store_owner, writable by nobody else") {
    // chown needs root; the suite runs as root in CI (the kernel backend's tests need it anyway).
    if (::geteuid() != 0) {
        WARN("not root: cannot chown the store to another account");
        return;
    }
    TempStore t;
    ImageStore store = t.open();
    ::chmod(t.dir.c_str(), 0755);
    Config root_only;
    Config with_owner;
    with_owner.store_owner = "daemon";  // uid 1 on Debian: an account that is not root
    Config unknown_owner;
    unknown_owner.store_owner = "gantry-no-such-account";
    REQUIRE(store_owner_uid(with_owner).has_value());
    CHECK_FALSE(store_owner_uid(unknown_owner).has_value());
    CHECK_FALSE(store_owner_uid(root_only).has_value());
    CHECK(store.trusted(root_only));  // root-owned 0755
    CHECK(store.trusted(with_owner));

    uid_t daemon_uid = *store_owner_uid(with_owner);
    REQUIRE(::chown(t.dir.c_str(), daemon_uid, 0) == 0);
    REQUIRE(::chown((t.dir + "/images").c_str(), daemon_uid, 0) == 0);
    CHECK_FALSE(store.trusted(root_only));      // owned by an account nobody named
    CHECK(store.trusted(with_owner));           // the store owner's
    CHECK_FALSE(store.trusted(unknown_owner));  // an unknown name never widens trust

    ::chmod((t.dir + "/images").c_str(), 0775);  // the owner's group could write images/
    CHECK_FALSE(store.trusted(with_owner));
    ::chmod((t.dir + "/images").c_str(), 0755);
    ::chmod(t.dir.c_str(), 01777);  // anybody could replace images/
    CHECK_FALSE(store.trusted(with_owner));
}

TEST_CASE("pull report: what the plugin reads back from gantry pull --report-fd", "[store][report]") {
    PullReport ok{"sha256:" + std::string(64, 'a'), "/fsx/gantry/images/" + std::string(64, 'a') + ".sqsh",
                  R"({"config":{"Env":["PATH=/bin"]}})", PullErrorKind::none, {}};
    auto back = decode_pull_report(encode_pull_report(ok));
    REQUIRE(back);
    CHECK(back->digest == ok.digest);
    CHECK(back->squashfs_path == ok.squashfs_path);
    CHECK(back->config_json == ok.config_json);
    CHECK(back->error == PullErrorKind::none);

    PullReport failed{{}, {}, {}, PullErrorKind::pull, "failed to import docker image x: 401"};
    back = decode_pull_report(encode_pull_report(failed));
    REQUIRE(back);
    CHECK(back->error == PullErrorKind::pull);
    CHECK(back->message == failed.message);

    // Invalid UTF-8 from a registry's error text is replaced, not a reason to lose the report.
    failed.message = "bad \xff byte";
    REQUIRE(decode_pull_report(encode_pull_report(failed)));

    CHECK_FALSE(decode_pull_report(""));
    CHECK_FALSE(decode_pull_report("sha256:abc /path"));  // the old one-line output is not a report
    CHECK_FALSE(decode_pull_report(R"({"digest":"sha256:abc","error":{"kind":"none"}})"));  // bad digest
    CHECK_FALSE(decode_pull_report(R"({"digest":"x","error":{"kind":"surprise","message":"m"}})"));
    CHECK_FALSE(decode_pull_report(R"({"digest":"x"})"));
    CHECK_FALSE(decode_pull_report(R"({"digest":7,"error":{"kind":"none"}})"));
    // The cap holds at its boundary: one byte over is refused before parsing.
    std::string big = encode_pull_report(ok);
    big.insert(big.size() - 1, std::string(kMaxPullReportBytes - big.size(), ' '));
    CHECK(big.size() == kMaxPullReportBytes);
    CHECK(decode_pull_report(big));
    big.insert(big.size() - 1, " ");
    CHECK_FALSE(decode_pull_report(big));
}
