// Unit tests for the image store: atomic publication, tag records, one producer per digest across
// processes (including a producer killed with SIGKILL), in-use protection and LRU garbage collection,
// and the trust model: what a hostile user of a shared store can plant (symlinks, FIFOs, huge files,
// images and lock files of their own) never makes the store follow, hang, overwrite or use it.
// Tests tagged [root] need root (chown, mount) and run as their own ctest, unit.store.root.
#include "gantry/store.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gantry/acquire.hpp"
#include "gantry/authorization_cache.hpp"
#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/import_watch.hpp"
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
    ImageStore open(const Config& config = Config{}, std::optional<uid_t> acting_for = std::nullopt) {
        auto s = ImageStore::open(dir, true, config, acting_for);
        REQUIRE(s.ok());
        return *s;
    }
};

// A regression must fail the test, not hang the suite: SIGALRM ends the process after `seconds`.
struct Watchdog {
    explicit Watchdog(unsigned seconds) { ::alarm(seconds); }
    ~Watchdog() { ::alarm(0); }
};

std::string slurp(const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// An unprivileged account for the [root] tests' planted files (nobody on Debian).
constexpr uid_t kOtherUid = 65534;

// Runs `body` in a child process (for identity changes) and returns its exit status.
template <typename F>
int in_child(F body) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(body());
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void require_root() {
    if (::geteuid() != 0) FAIL("needs root (chown, mount, identity changes): run `ctest -L root` as root");
}

std::string fake_digest(const std::string& seed) {
    return Sha256::of(seed);
}

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

TEST_CASE(
    "acquire_image: the image's file opened once and checked on the descriptor; a rename over its name later "
    "changes nothing held") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("acquired");
    REQUIRE(make_directories(t.dir + "/staging").ok());
    std::string tmp = store.staging_dir(d) + ".sqsh";
    std::ofstream(tmp) << "hsqs genuine";
    ImageMetadata meta;
    meta.config_json = "{}";
    REQUIRE(store.publish(d, tmp, meta).ok());
    auto acquired = acquire_image(store, d);
    REQUIRE(acquired.ok());
    REQUIRE(acquired->files.size() == 1);
    CHECK_FALSE(acquired->layered);
    CHECK(acquired->files[0].get() >= kFirstImageDescriptor);
    CHECK((::fcntl(acquired->files[0].get(), F_GETFD) & FD_CLOEXEC) != 0);
    auto paths = acquired->paths();
    REQUIRE(paths.size() == 1);
    CHECK(descriptor_of_path(paths[0]) == acquired->files[0].get());
    // Another file renamed over the name: what was acquired still reads the genuine bytes.
    const std::string name = t.dir + "/images/" + digest_hex(d) + ".sqsh";
    std::ofstream(t.dir + "/staging/evil") << "hsqs evil";
    REQUIRE(::rename((t.dir + "/staging/evil").c_str(), name.c_str()) == 0);
    CHECK(slurp(paths[0]) == "hsqs genuine");
    CHECK(slurp(name) == "hsqs evil");
    // A file that is not a squashfs is refused on the descriptor.
    std::ofstream(t.dir + "/staging/junk") << "not a squashfs";
    REQUIRE(::rename((t.dir + "/staging/junk").c_str(), name.c_str()) == 0);
    auto refused = acquire_image(store, d);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message.find("not a squashfs file") != std::string::npos);
}

TEST_CASE("descriptor paths: /proc/self/fd/N names N, and programs get each under its own number") {
    CHECK(descriptor_of_path("/proc/self/fd/64") == 64);
    CHECK(descriptor_path(70) == "/proc/self/fd/70");
    CHECK(descriptor_of_path("/proc/self/fd/") == -1);
    CHECK(descriptor_of_path("/proc/self/fd/6x") == -1);
    CHECK(descriptor_of_path("/store/images/a.sqsh") == -1);
    ProcessRequest rq;
    rq.inputs = {{5, 3}};
    pass_image_descriptors(rq, {"/proc/self/fd/64", "/x.sqsh", "/proc/self/fd/65", "/proc/self/fd/64"});
    REQUIRE(rq.inputs.size() == 3);
    CHECK((rq.inputs[1].fd == 64 && rq.inputs[1].as == 64));
    CHECK((rq.inputs[2].fd == 65 && rq.inputs[2].as == 65));
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

TEST_CASE("a recent tag record naming the same digest is not written again; another digest or an old one is") {
    TempStore t;
    auto store = t.open();
    ImageReference ref{"", "127.0.0.1:5000", "team/img", "v1", ""};
    auto d = fake_digest("tagged");
    REQUIRE(store.record_tag(ref, d).ok());
    auto first = store.lookup_tag(ref);
    REQUIRE(first.has_value());
    // The record's file by its inode: a write replaces it (a new file renamed over it).
    std::string path;
    for (const auto& e : std::filesystem::directory_iterator(t.dir + "/refs")) path = e.path().string();
    REQUIRE(!path.empty());
    struct stat before {};
    REQUIRE(::stat(path.c_str(), &before) == 0);
    REQUIRE(store.record_tag(ref, d).ok());
    struct stat after {};
    REQUIRE(::stat(path.c_str(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);
    CHECK(store.lookup_tag(ref)->resolved_at == first->resolved_at);
    // Another digest: written.
    auto d2 = fake_digest("moved");
    REQUIRE(store.record_tag(ref, d2).ok());
    REQUIRE(::stat(path.c_str(), &after) == 0);
    CHECK(after.st_ino != before.st_ino);
    CHECK(store.lookup_tag(ref)->digest == d2);
    // A record older than kTagRecordRefreshSeconds: written again, with the time now.
    const int64_t old = first->resolved_at - kTagRecordRefreshSeconds - 5;
    std::ofstream(path) << "{\"reference\":\"127.0.0.1:5000/team/img:v1\",\"digest\":\"" << d2
                        << "\",\"resolved_at\":" << old << "}\n";
    REQUIRE(store.lookup_tag(ref)->resolved_at == old);
    REQUIRE(store.record_tag(ref, d2).ok());
    CHECK(store.lookup_tag(ref)->resolved_at > old + kTagRecordRefreshSeconds);
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

TEST_CASE("the producer's progress is readable from its lock file while it holds the lock, and only then") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("progress");
    CHECK_FALSE(store.producer_progress(d).has_value());  // no lock file at all
    int ready[2], go[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(go) == 0);
    pid_t child = ::fork();
    if (child == 0) {
        auto lock = store.lock_producer(d, 10s);
        if (lock) lock->record_progress(1536ULL << 20, 4096ULL << 20, 3, 12);
        char c = lock.ok() ? 'y' : 'n';
        (void)!::write(ready[1], &c, 1);
        (void)!::read(go[0], &c, 1);  // hold the lock until told
        ::_exit(0);
    }
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    REQUIRE(c == 'y');
    auto p = store.producer_progress(d);
    REQUIRE(p.has_value());
    CHECK(p->holder.find(":" + std::to_string(child)) != std::string::npos);
    CHECK(p->bytes_done == (1536ULL << 20));
    CHECK(p->bytes_total == (4096ULL << 20));
    CHECK(p->layers_done == 3);
    CHECK(p->layers_total == 12);
    CHECK(p->updated_at > 0);
    CHECK(format_import_progress("team/pytorch:24.05", *p, 110.0 * (1 << 20)) ==
          "team/pytorch:24.05: 1.5 GiB / 4.0 GiB (37%), 3/12 layers, 110.0 MiB/s");
    // Waiters still name the holder by its first line alone.
    auto busy = store.lock_producer(d, 1s);
    REQUIRE_FALSE(busy.ok());
    CHECK(busy.error().message.find("progress") == std::string::npos);
    // The producer is gone: its last text stays in the file, but nobody holds the lock, so no progress.
    (void)!::write(go[1], "x", 1);
    ::waitpid(child, nullptr, 0);
    CHECK_FALSE(store.producer_progress(d).has_value());
    for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
}

TEST_CASE("import progress lines: without a total or a rate, parts are left out") {
    ProducerProgress p;
    p.bytes_done = 2048;
    CHECK(format_import_progress("img", p, 0) == "img: 2.0 KiB");
    p.bytes_total = 4096;
    p.layers_total = 2;
    p.layers_done = 1;
    CHECK(format_import_progress("img", p, 0) == "img: 2.0 KiB / 4.0 KiB (50%), 1/2 layers");
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
    reread_environment();  // the library reads the environment once (environment.hpp)
    CHECK(ImageStore::resolve_path(cfg, "/cli/store") == "/cli/store");
    CHECK(ImageStore::resolve_path(cfg, "") == "/env/store");
    ::unsetenv("GANTRY_STORE");
    reread_environment();
    CHECK(ImageStore::resolve_path(cfg, "") == "/fsx/gantry");
    cfg.store_path.clear();
    ::setenv("XDG_CACHE_HOME", "/xdg", 1);
    reread_environment();
    CHECK(ImageStore::resolve_path(cfg, "") == "/xdg/gantry");
    CHECK_FALSE(ImageStore::open("relative/path", true).ok());
}

TEST_CASE("no HOME: no store path, and open names the settings instead of using a shared directory") {
    Config cfg;
    ::unsetenv("GANTRY_STORE");
    ::unsetenv("XDG_CACHE_HOME");
    const char* saved = std::getenv("HOME");
    std::string home = saved != nullptr ? saved : "";
    ::unsetenv("HOME");
    reread_environment();  // the library reads the environment once (environment.hpp)
    CHECK(ImageStore::resolve_path(cfg, "").empty());
    ::setenv("HOME", "relative", 1);
    reread_environment();
    CHECK(ImageStore::resolve_path(cfg, "").empty());
    auto opened = ImageStore::open(ImageStore::resolve_path(cfg, ""), true, cfg);
    REQUIRE_FALSE(opened.ok());
    CHECK(opened.error().message.find("store_path") != std::string::npos);
    CHECK(opened.error().message.find("--store") != std::string::npos);
    if (saved != nullptr)
        ::setenv("HOME", home.c_str(), 1);
    else
        ::unsetenv("HOME");
    reread_environment();
}

TEST_CASE("trusted store: owned by root or the configured store_owner, writable by nobody else", "[root]") {
    require_root();  // chown
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
    PullReport ok{"sha256:" + std::string(64, 'a'),
                  "/fsx/gantry/images/" + std::string(64, 'a') + ".sqsh",
                  {},
                  R"({"config":{"Env":["PATH=/bin"]}})",
                  PullErrorKind::none,
                  {},
                  "pulled"};
    auto back = decode_pull_report(encode_pull_report(ok));
    REQUIRE(back);
    CHECK(back->digest == ok.digest);
    CHECK(back->squashfs_path == ok.squashfs_path);
    CHECK(back->layer_paths.empty());
    CHECK(back->config_json == ok.config_json);
    CHECK(back->error == PullErrorKind::none);
    CHECK(back->outcome == "pulled");
    // A layered image: its layers' files, bottom first; a report without the field has none.
    ok.layer_paths = {"/fsx/gantry/images/layer-a.sqsh", "/fsx/gantry/images/layer-b.sqsh"};
    back = decode_pull_report(encode_pull_report(ok));
    REQUIRE(back);
    CHECK(back->layer_paths == ok.layer_paths);

    PullReport failed{{}, {}, {}, {}, PullErrorKind::pull, "failed to import docker image x: 401", {}};
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

TEST_CASE("the safe remover follows no symlink: links are removed, their targets stay") {
    TempStore t;
    std::string victim = t.dir + "/victim";
    REQUIRE(make_directories(victim + "/sub").ok());
    std::ofstream(victim + "/precious") << "keep";
    std::ofstream(victim + "/sub/precious") << "keep";
    std::string tree = t.dir + "/tree";
    REQUIRE(make_directories(tree + "/a/b").ok());
    std::ofstream(tree + "/a/b/file") << "x";
    REQUIRE(::symlink(victim.c_str(), (tree + "/a/to-victim").c_str()) == 0);
    REQUIRE(::symlink((victim + "/precious").c_str(), (tree + "/a/b/to-file").c_str()) == 0);
    CHECK(tree_size(tree) == 1);  // the one regular file; links are not followed
    REQUIRE(remove_tree(tree).ok());
    CHECK(::access(tree.c_str(), F_OK) != 0);
    CHECK(slurp(victim + "/precious") == "keep");
    CHECK(slurp(victim + "/sub/precious") == "keep");
    // The path itself a symlink: the link goes, not the directory it names.
    REQUIRE(::symlink(victim.c_str(), (t.dir + "/link").c_str()) == 0);
    REQUIRE(remove_tree(t.dir + "/link").ok());
    CHECK(slurp(victim + "/precious") == "keep");
    CHECK(remove_tree(t.dir + "/missing").ok());
}

TEST_CASE("the safe remover does not cross into another file system", "[root]") {
    require_root();  // mount
    TempStore t;
    std::string mnt = t.dir + "/tree/mnt";
    REQUIRE(make_directories(mnt).ok());
    REQUIRE(::mount("gantry-test", mnt.c_str(), "tmpfs", 0, "size=1m") == 0);
    std::ofstream(mnt + "/precious") << "keep";
    auto st = remove_tree(t.dir + "/tree");
    CHECK_FALSE(st.ok());
    if (!st) CHECK(st.error().message.find("another file system") != std::string::npos);
    CHECK(slurp(mnt + "/precious") == "keep");
    REQUIRE(::umount(mnt.c_str()) == 0);
    CHECK(remove_tree(t.dir + "/tree").ok());
}

TEST_CASE("a symlinked staging/ is refused with a clear error; gc never reaches its target") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("victim");
    std::string victim = t.dir + "/victim";
    REQUIRE(make_directories(victim + "/" + digest_hex(d)).ok());
    std::ofstream(victim + "/" + digest_hex(d) + "/precious") << "keep";
    // Replaced after the store was opened: the open descriptor still names the real staging/.
    REQUIRE(::rename((t.dir + "/staging").c_str(), (t.dir + "/staging.old").c_str()) == 0);
    REQUIRE(::symlink(victim.c_str(), (t.dir + "/staging").c_str()) == 0);
    auto r = store.gc(0, 0s);
    REQUIRE(r.ok());
    CHECK(slurp(victim + "/" + digest_hex(d) + "/precious") == "keep");
    // Opened afterwards: refused, naming the path and what to do.
    for (bool create : {false, true}) {
        auto reopened = ImageStore::open(t.dir, create);
        REQUIRE_FALSE(reopened.ok());
        CHECK(reopened.error().message.find(t.dir + "/staging: is a symbolic link") != std::string::npos);
        CHECK(reopened.error().message.find("remove it") != std::string::npos);
    }
    CHECK(slurp(victim + "/" + digest_hex(d) + "/precious") == "keep");
}

TEST_CASE("a symlinked staging/<hex> is removed by gc as a link; the tree it names stays") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("staged");
    std::string victim = t.dir + "/victim";
    REQUIRE(make_directories(victim + "/blobs").ok());
    std::ofstream(victim + "/blobs/precious") << "keep";
    REQUIRE(::symlink(victim.c_str(), store.staging_dir(d).c_str()) == 0);
    auto r = store.gc(0, 0s);
    REQUIRE(r.ok());
    CHECK(r->failed.empty());
    struct stat st {};
    CHECK(::lstat(store.staging_dir(d).c_str(), &st) != 0);
    CHECK(slurp(victim + "/blobs/precious") == "keep");
    // A producer never works through such a link either: it makes a directory of its own.
    REQUIRE(::symlink(victim.c_str(), store.staging_dir(d).c_str()) == 0);
    auto staging = store.prepare_staging(d);
    REQUIRE(staging.ok());
    REQUIRE(::lstat(staging->c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK(slurp(victim + "/blobs/precious") == "keep");
}

TEST_CASE("a FIFO planted as image metadata or a tag record never hangs find, list, gc or lookup") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("fifo");
    publish_fake(store, d, 100, "reg/repo:fifo");
    std::string meta = t.dir + "/images/" + digest_hex(d) + ".json";
    REQUIRE(::unlink(meta.c_str()) == 0);
    REQUIRE(::mkfifo(meta.c_str(), 0644) == 0);
    Watchdog watchdog(20);
    CHECK_FALSE(store.find(d).has_value());
    std::vector<std::string> ignored;
    auto all = store.list(&ignored);
    REQUIRE(all.ok());
    CHECK(all->empty());
    REQUIRE(ignored.size() == 1);
    CHECK(ignored[0].find(meta + ": not a regular file") != std::string::npos);
    CHECK(store.gc(1, 0s).ok());
    ImageReference ref{"", "reg", "repo", "fifo", ""};
    REQUIRE(store.record_tag(ref, d).ok());
    auto refs = Directory::open(t.dir + "/refs");
    REQUIRE(refs.ok());
    auto names = list_directory(*refs);
    REQUIRE(names.ok());
    REQUIRE(names->size() == 1);
    for (const auto& name : *names) {
        REQUIRE(::unlink((t.dir + "/refs/" + name).c_str()) == 0);
        REQUIRE(::mkfifo((t.dir + "/refs/" + name).c_str(), 0644) == 0);
    }
    CHECK_FALSE(store.lookup_tag(ref).has_value());
}

TEST_CASE("image metadata over the size cap is refused") {
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("huge");
    publish_fake(store, d, 100);
    std::string meta = t.dir + "/images/" + digest_hex(d) + ".json";
    {
        std::ofstream f(meta, std::ios::trunc);
        f << R"({"manifest_digest":")" << d << R"(","pad":")" << std::string(kMaxImageMetadataBytes, 'x') << "\"}";
    }
    REQUIRE(::chmod(meta.c_str(), 0644) == 0);
    CHECK_FALSE(store.find(d).has_value());
    std::vector<std::string> ignored;
    REQUIRE(store.list(&ignored).ok());
    REQUIRE(ignored.size() == 1);
    CHECK(ignored[0].find("larger than the limit of " + std::to_string(kMaxImageMetadataBytes)) != std::string::npos);
}

TEST_CASE("a symlinked or hard-linked lock file is never written through") {
    TempStore t;
    auto store = t.open();
    std::string target = t.dir + "/precious";
    std::ofstream(target) << "precious\n";
    auto d = fake_digest("locked");
    std::string lock = t.dir + "/locks/" + digest_hex(d) + ".lock";
    REQUIRE(::symlink(target.c_str(), lock.c_str()) == 0);
    auto r = store.lock_producer(d, 1s);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find(lock + ": is a symbolic link") != std::string::npos);
    CHECK(slurp(target) == "precious\n");
    // A hard link to a file of ours: locked (flock works on it), but the holder text is not written.
    auto d2 = fake_digest("linked");
    REQUIRE(::link(target.c_str(), (t.dir + "/locks/" + digest_hex(d2) + ".lock").c_str()) == 0);
    auto held = store.lock_producer(d2, 1s);
    CHECK(held.ok());
    CHECK(slurp(target) == "precious\n");
}

TEST_CASE("a lock file another account owns is locked read-only and not written", "[root]") {
    require_root();  // chown
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("theirs");
    std::string lock = t.dir + "/locks/" + digest_hex(d) + ".lock";
    std::ofstream(lock) << "their-host:1\n";
    REQUIRE(::chown(lock.c_str(), kOtherUid, kOtherUid) == 0);
    auto held = store.lock_producer(d, 1s);
    CHECK(held.ok());
    CHECK(slurp(lock) == "their-host:1\n");
}

TEST_CASE("an image planted by another account is ignored; root's, store_owner's and the caller's count", "[root]") {
    require_root();  // chown
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("planted");
    publish_fake(store, d, 100, "reg/repo:planted");
    std::string hex = digest_hex(d);
    REQUIRE(store.find(d).has_value());  // root's own
    for (const char* ext : {".sqsh", ".json"})
        REQUIRE(::chown((t.dir + "/images/" + hex + ext).c_str(), kOtherUid, kOtherUid) == 0);
    CHECK_FALSE(store.find(d).has_value());
    std::vector<std::string> ignored;
    auto all = store.list(&ignored);
    REQUIRE(all.ok());
    CHECK(all->empty());
    REQUIRE(ignored.size() == 1);
    CHECK(ignored[0].find("owned by uid " + std::to_string(kOtherUid)) != std::string::npos);
    CHECK_FALSE(store.open_in_use(d).ok());
    // The same files count for the account the caller acts for, and for the configured store_owner.
    CHECK(t.open(Config{}, kOtherUid).find(d).has_value());
    Config owner;
    owner.store_owner = "nobody";
    REQUIRE(store_owner_uid(owner) == std::optional<unsigned>(kOtherUid));
    CHECK(t.open(owner).find(d).has_value());
    // Writable by group or others: ignored whoever owns it.
    REQUIRE(::chmod((t.dir + "/images/" + hex + ".sqsh").c_str(), 0466) == 0);
    CHECK_FALSE(t.open(owner).find(d).has_value());
    // Publishing over it: the untrusted files are replaced where the caller may remove them.
    REQUIRE(::chmod((t.dir + "/images/" + hex + ".sqsh").c_str(), 0444) == 0);
    publish_fake(store, d, 200);
    auto mine = store.find(d);
    REQUIRE(mine.has_value());
    CHECK(mine->metadata.image_bytes == 200);

    // A failure note from an untrusted account is not honoured.
    store.write_failure_note(d, "1.0\nhost:1\nboom\n");
    CHECK(store.read_failure_note(d, 0).has_value());
    REQUIRE(::chown((t.dir + "/locks/" + hex + ".failed").c_str(), kOtherUid, kOtherUid) == 0);
    CHECK_FALSE(store.read_failure_note(d, 0).has_value());
}

TEST_CASE("root refuses to modify a store others can write; a sole owner is reported", "[root]") {
    require_root();
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("refused");
    publish_fake(store, d, 100);
    CHECK(store.check_root_may_modify().ok());
    CHECK_FALSE(store.sole_owner().has_value());  // root's own
    REQUIRE(::chmod((t.dir + "/images").c_str(), 0775) == 0);
    auto gc = store.gc(1, 0s);
    REQUIRE_FALSE(gc.ok());
    CHECK(gc.error().message.find(t.dir + "/images is writable by its group") != std::string::npos);
    CHECK(gc.error().message.find("docs/store.md") != std::string::npos);
    CHECK_FALSE(store.remove(d).ok());
    CHECK_FALSE(store.lock_producer(d, 1s).ok());
    CHECK_FALSE(store.prepare_staging(d).ok());
    CHECK(store.find(d).has_value());  // reading is fine
    REQUIRE(::chmod((t.dir + "/images").c_str(), 0755) == 0);
    // Owned by one other account: refused to root as well, and that account is the sole owner.
    for (const char* sub : {"", "/images", "/refs", "/used", "/locks", "/staging"})
        REQUIRE(::chown((t.dir + sub).c_str(), kOtherUid, kOtherUid) == 0);
    CHECK_FALSE(store.check_root_may_modify().ok());
    CHECK(store.sole_owner() == std::optional<uid_t>(kOtherUid));
    Config owner;
    owner.store_owner = "nobody";
    CHECK(t.open(owner).check_root_may_modify().ok());  // the store_owner's store
}

TEST_CASE("a legacy world-writable sticky store root gets sticky world-writable subdirectories") {
    TempStore t;
    std::string root = t.dir + "/legacy";
    REQUIRE(::mkdir(root.c_str(), 0700) == 0);
    REQUIRE(::chmod(root.c_str(), 01777) == 0);
    REQUIRE(ImageStore::open(root, true).ok());
    struct stat st {};
    REQUIRE(::stat((root + "/staging").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 01777);
    TempStore plain;
    plain.open();
    REQUIRE(::stat((plain.dir + "/images").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0755);
}

TEST_CASE("gc tells failed removals from images kept in use; become_store_owner drops root for good", "[root]") {
    require_root();  // identity changes
    TempStore t;
    auto store = t.open();
    auto d = fake_digest("not-yours");
    publish_fake(store, d, 100);
    REQUIRE(::chmod(t.dir.c_str(), 0755) == 0);
    int status = in_child([&] {
        if (!become_store_owner(kOtherUid).ok() || ::geteuid() != kOtherUid || ::getegid() != kOtherUid) return 10;
        if (::setuid(0) == 0) return 11;
        auto r = store.gc(1, 0s);  // root's images, listed, but not removable by this account
        if (!r || !r->removed.empty() || !r->kept_in_use.empty() || r->failed.size() != 1) return 12;
        return r->failed[0].errnum == EACCES ? 0 : 13;
    });
    CHECK(status == 0);
    CHECK(store.find(d).has_value());
    CHECK_FALSE(become_store_owner(0).ok());
}

TEST_CASE("private_images publishes owner-only files") {
    TempStore t;
    Config config;
    config.private_images = true;
    auto store = t.open(config);
    auto d = fake_digest("private");
    publish_fake(store, d, 100);
    struct stat st {};
    REQUIRE(::stat(store.squashfs_path(d).c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0400);
    REQUIRE(::stat((t.dir + "/images/" + digest_hex(d) + ".json").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0600);
    CHECK(store.find(d).has_value());
}

// ---------------------------------------------------------------------------------------------------
// The per-layer store (docs/store.md, "Layers").

namespace {

// A stack of fake layers: diff_ids from seeds, their chain IDs, each published with `bytes` bytes.
struct FakeStack {
    std::vector<std::string> diff_ids, chain;
};

FakeStack fake_stack(const std::vector<std::string>& seeds) {
    FakeStack s;
    for (const auto& seed : seeds) s.diff_ids.push_back(Sha256::of("diff " + seed));
    s.chain = chain_ids(s.diff_ids);
    return s;
}

UniqueFd publish_fake_layer(const ImageStore& store, const FakeStack& s, size_t i, size_t bytes) {
    std::string tmp = store.staging_dir(s.chain[i]) + ".layer";
    REQUIRE(make_directories(store.root() + "/staging").ok());
    std::ofstream(tmp) << std::string(bytes, 'l');
    LayerRecord r;
    r.chain_id = s.chain[i];
    r.diff_id = s.diff_ids[i];
    r.parent = i == 0 ? std::string() : s.chain[i - 1];
    r.blob_digest = Sha256::of("blob " + s.diff_ids[i]);
    auto fd = store.publish_layer(tmp, r);
    REQUIRE(fd.ok());
    return std::move(*fd);
}

void publish_layered_image(const ImageStore& store, const std::string& digest, const FakeStack& s) {
    ImageMetadata meta;
    meta.references.push_back("reg/layered:" + digest_hex(digest).substr(0, 8));
    meta.layer_chain = s.chain;
    REQUIRE(store.publish_layered(digest, meta).ok());
}

void set_layer_used(const TempStore& t, const std::string& chain, time_t when) {
    struct timespec ts[2] = {{when, 0}, {when, 0}};
    REQUIRE(::utimensat(AT_FDCWD, (t.dir + "/used/layer-" + digest_hex(chain)).c_str(), ts, 0) == 0);
}

}  // namespace

TEST_CASE("chain IDs follow the OCI image spec") {
    const std::string a = "sha256:" + std::string(64, '1'), b = "sha256:" + std::string(64, '2'),
                      c = "sha256:" + std::string(64, '3');
    // Expected values from Python's hashlib: sha256("<parent chain ID> <diff_id>").
    auto chain = chain_ids({a, b, c});
    REQUIRE(chain.size() == 3);
    CHECK(chain[0] == a);
    CHECK(chain[1] == "sha256:9932074217c35353d2e03a3f5a86549f7c67bfeb0ba53e23d69f4d4c8f7958f5");
    CHECK(chain[2] == "sha256:50127c0d6b338be78246434b4bce23ecf75e505158ea0bbd15effeb162fbf3ec");
    CHECK(chain_id(chain[1], c) == chain[2]);
    CHECK(chain_ids({}).empty());
}

TEST_CASE("a published layer is found by its chain ID, and only a record that matches its name counts") {
    TempStore t;
    auto store = t.open();
    auto s = fake_stack({"base", "top"});
    CHECK_FALSE(store.find_layer(s.chain[1]).has_value());
    { auto fd = publish_fake_layer(store, s, 0, 300); }
    { auto fd = publish_fake_layer(store, s, 1, 50); }
    auto top = store.find_layer(s.chain[1]);
    REQUIRE(top.has_value());
    CHECK(top->record.diff_id == s.diff_ids[1]);
    CHECK(top->record.parent == s.chain[0]);
    CHECK(top->record.layer_bytes == 50);
    CHECK(top->squashfs_path == t.dir + "/images/layer-" + digest_hex(s.chain[1]) + ".sqsh");
    auto layers = store.list_layers();
    REQUIRE(layers.ok());
    CHECK(layers->size() == 2);
    // Layers are not images: `gantry images` and image gc never see them as such.
    CHECK(store.list()->empty());

    // A record whose chain ID is not that of its parent and diff_id is refused at publication...
    LayerRecord bad;
    bad.chain_id = s.chain[1];
    bad.diff_id = s.diff_ids[0];
    bad.parent = s.chain[0];
    std::string tmp = store.staging_dir(s.chain[1]) + ".bad";
    std::ofstream(tmp) << "x";
    auto refused = store.publish_layer(tmp, bad);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message.find("is not the chain ID") != std::string::npos);
    // ...and on reading: metadata rewritten to describe another layer makes the layer not count.
    std::string meta = t.dir + "/images/layer-" + digest_hex(s.chain[1]) + ".json";
    std::string text = slurp(meta);
    auto at = text.find(digest_hex(s.diff_ids[1]));
    REQUIRE(at != std::string::npos);
    text.replace(at, 64, digest_hex(s.diff_ids[0]));
    REQUIRE(write_file_atomic(meta, text, 0644).ok());
    CHECK_FALSE(store.find_layer(s.chain[1]).has_value());
    std::vector<std::string> ignored;
    CHECK(store.list_layers(&ignored)->size() == 1);
    REQUIRE(ignored.size() == 1);
    CHECK(ignored[0].find("is not the chain ID") != std::string::npos);
    // Names that are not chain IDs are never turned into paths.
    CHECK_FALSE(store.find_layer("sha256:../../etc/passwd").has_value());
    CHECK_FALSE(store.open_layer_in_use("../x").ok());
}

TEST_CASE("deep images: at most kMaxLowers lowers, runs of kLayerGroupSize from the bottom, shared by deeper tags") {
    auto count_layers = [](const std::vector<LowerRange>& plan) {
        size_t next = 0;
        for (const auto& r : plan) {
            if (r.first != next || r.end <= r.first) return size_t{0};  // contiguous, bottom up
            next = r.end;
        }
        return next;
    };
    CHECK(plan_lowers(0).empty());
    CHECK(plan_lowers(kMaxLayeredLayers + 1).empty());
    for (size_t n = 1; n <= kMaxLayeredLayers; ++n) {
        INFO(n << " layers");
        auto plan = plan_lowers(n);
        REQUIRE(!plan.empty());
        CHECK(plan.size() <= kMaxLowers);
        CHECK(count_layers(plan) == n);
        for (const auto& r : plan) {
            // A group starts at a multiple of the run length, and where it ends fixes where it starts
            // (layer_group_key names a group by its top layer alone).
            if (r.grouped)
                CHECK(r.first == (r.end - 1) / kLayerGroupSize * kLayerGroupSize);
            else
                CHECK(r.end == r.first + 1);
        }
        if (n <= kMaxLowers) CHECK(plan.size() == n);  // shallow images: every layer its own lower
    }
    // Concrete plans: 20 layers = two runs of 8 and 4 layers; 90 (a deep NGC image) = 11 runs and 2;
    // 127 = 15 runs and one group of the last 7.
    CHECK(plan_lowers(20) ==
          std::vector<LowerRange>{
              {0, 8, true}, {8, 16, true}, {16, 17, false}, {17, 18, false}, {18, 19, false}, {19, 20, false}});
    CHECK(plan_lowers(90).size() == 13);
    CHECK(plan_lowers(90)[10] == LowerRange{80, 88, true});
    CHECK(plan_lowers(127).size() == 16);
    CHECK(plan_lowers(127).back() == LowerRange{120, 127, true});
    // A tag with one more layer on the same base keeps every run of the base.
    auto a = plan_lowers(40), b = plan_lowers(41);
    for (size_t k = 0; k < 5; ++k) CHECK(a[k] == b[k]);
}

TEST_CASE("a layer group is named by its top layer's chain ID, and its record must reach that chain ID") {
    TempStore t;
    auto store = t.open();
    auto s = fake_stack({"l0", "l1", "l2", "l3"});
    const std::string key = layer_group_key(s.chain[3]);
    CHECK(key != s.chain[3]);
    CHECK(validate_digest(key).ok());
    LayerRecord group;
    group.chain_id = key;
    group.parent = s.chain[1];
    group.group_diff_ids = {s.diff_ids[2], s.diff_ids[3]};
    group.uncompressed_bytes = 77;
    std::string tmp = store.staging_dir(key) + ".group";
    std::ofstream(tmp) << "group";
    {
        auto fd = store.publish_layer(tmp, group);
        REQUIRE(fd.ok());
    }
    auto found = store.find_layer(key);
    REQUIRE(found.has_value());
    CHECK(found->record.group_diff_ids == group.group_diff_ids);
    CHECK(found->record.uncompressed_bytes == 77);
    // The layers' order, or a parent the layers do not sit on, gives another chain ID: refused.
    LayerRecord swapped = group;
    swapped.group_diff_ids = {s.diff_ids[3], s.diff_ids[2]};
    std::ofstream(tmp) << "group";
    auto refused = store.publish_layer(tmp, swapped);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message.find("is not the group of its 2 layers") != std::string::npos);
    LayerRecord other_parent = group;
    other_parent.parent = s.chain[0];
    CHECK_FALSE(store.publish_layer(tmp, other_parent).ok());
}

TEST_CASE("gc counts a layer once, keeps layers another image or a container uses, and frees the rest") {
    TempStore t;
    auto store = t.open();
    // Two tags on one base: old = base+mid+a, new = base+mid+b.
    auto old_tag = fake_stack({"base", "mid", "a"});
    auto new_tag = fake_stack({"base", "mid", "b"});
    REQUIRE(old_tag.chain[1] == new_tag.chain[1]);
    for (size_t i = 0; i < 3; ++i) (void)publish_fake_layer(store, old_tag, i, i == 0 ? 1000 : 100);
    (void)publish_fake_layer(store, new_tag, 2, 100);
    auto old_digest = fake_digest("old"), new_digest = fake_digest("new");
    publish_layered_image(store, old_digest, old_tag);
    publish_layered_image(store, new_digest, new_tag);
    time_t now = ::time(nullptr);
    struct timespec old_ts[2] = {{now - 3000, 0}, {now - 3000, 0}};
    REQUIRE(::utimensat(AT_FDCWD, (t.dir + "/used/" + digest_hex(old_digest)).c_str(), old_ts, 0) == 0);

    // A size target the store meets: nothing goes, and the shared layers count once.
    auto r = store.gc(10000, 0s);
    REQUIRE(r.ok());
    CHECK(r->removed.empty());
    CHECK(r->bytes_left == 1300);

    // A target that needs the old tag gone: its image and its own top layer, not the shared base.
    r = store.gc(1250, 0s);
    REQUIRE(r.ok());
    CHECK(r->removed == std::vector<std::string>{old_digest});
    CHECK(r->removed_layers == std::vector<std::string>{old_tag.chain[2]});
    CHECK(r->bytes_left == 1200);
    CHECK(store.find_layer(old_tag.chain[0]).has_value());
    CHECK(store.find_layer(old_tag.chain[1]).has_value());
    CHECK(store.find(new_digest).has_value());

    // A container holding a layer keeps it when its image goes; the others are freed.
    {
        auto held = store.open_layer_in_use(new_tag.chain[0]);
        REQUIRE(held.ok());
        CHECK_FALSE(store.remove_layer(new_tag.chain[0]).ok());
        r = store.gc(1, 0s);
        REQUIRE(r.ok());
        CHECK(r->removed == std::vector<std::string>{new_digest});
        CHECK(r->removed_layers == std::vector<std::string>{new_tag.chain[1], new_tag.chain[2]});
        CHECK(r->kept_in_use == std::vector<std::string>{new_tag.chain[0]});
        CHECK(store.find_layer(new_tag.chain[0]).has_value());
    }
    // Now named by no image: an orphan, collected by the same targets as images.
    set_layer_used(t, new_tag.chain[0], now - 100);
    r = store.gc(0, 3600s);
    REQUIRE(r.ok());
    CHECK(r->removed_layers.empty());
    r = store.gc(0, 10s);
    REQUIRE(r.ok());
    CHECK(r->removed_layers == std::vector<std::string>{new_tag.chain[0]});
    CHECK(store.list_layers()->empty());
    CHECK(r->bytes_left == 0);
}

TEST_CASE("a layer is locked before it appears, so gc never takes one whose image is not yet recorded") {
    TempStore t;
    auto store = t.open();
    auto s = fake_stack({"only"});
    auto producer = publish_fake_layer(store, s, 0, 10);
    REQUIRE(producer.valid());
    auto r = store.gc(1, 1s);  // wants everything gone
    REQUIRE(r.ok());
    CHECK(r->removed_layers.empty());
    CHECK(r->kept_in_use == std::vector<std::string>{s.chain[0]});
    producer.reset();
    CHECK(store.remove_layer(s.chain[0]).ok());
    CHECK_FALSE(store.find_layer(s.chain[0]).has_value());
}

TEST_CASE("a layer planted by another account, or through a symlink, is ignored", "[root]") {
    require_root();  // chown
    TempStore t;
    auto store = t.open();
    auto s = fake_stack({"planted"});
    { auto fd = publish_fake_layer(store, s, 0, 10); }
    const std::string base = t.dir + "/images/layer-" + digest_hex(s.chain[0]);
    REQUIRE(store.find_layer(s.chain[0]).has_value());
    for (const char* ext : {".sqsh", ".json"}) REQUIRE(::chown((base + ext).c_str(), kOtherUid, kOtherUid) == 0);
    CHECK_FALSE(store.find_layer(s.chain[0]).has_value());
    CHECK_FALSE(store.open_layer_in_use(s.chain[0]).ok());
    std::vector<std::string> ignored;
    CHECK(store.list_layers(&ignored)->empty());
    REQUIRE(ignored.size() == 1);
    CHECK(ignored[0].find("owned by uid " + std::to_string(kOtherUid)) != std::string::npos);
    // Publishing over it replaces the untrusted files (the caller may remove them from images/).
    { auto fd = publish_fake_layer(store, s, 0, 20); }
    auto mine = store.find_layer(s.chain[0]);
    REQUIRE(mine.has_value());
    CHECK(mine->record.layer_bytes == 20);
    // A symlink in the layer's place (to a real squashfs elsewhere) is neither found nor opened.
    REQUIRE(::unlink((base + ".sqsh").c_str()) == 0);
    std::ofstream(t.dir + "/elsewhere.sqsh") << "y";
    REQUIRE(::symlink((t.dir + "/elsewhere.sqsh").c_str(), (base + ".sqsh").c_str()) == 0);
    CHECK_FALSE(store.find_layer(s.chain[0]).has_value());
    CHECK_FALSE(store.open_layer_in_use(s.chain[0]).ok());
}

TEST_CASE("a layered image is a record naming its layers, which counts only with all of them") {
    TempStore t;
    auto store = t.open();
    auto s = fake_stack({"base", "app"});
    auto d = fake_digest("layered");
    ImageMetadata meta;
    meta.layer_chain = s.chain;
    // Its layers first: a record naming a layer the store lacks is refused.
    auto early = store.publish_layered(d, meta);
    REQUIRE_FALSE(early.ok());
    CHECK(early.error().message.find("is not in the store") != std::string::npos);
    for (size_t i = 0; i < 2; ++i) (void)publish_fake_layer(store, s, i, 100 * (i + 1));
    REQUIRE(store.publish_layered(d, meta).ok());
    auto img = store.find(d);
    REQUIRE(img.has_value());
    CHECK(img->layered());
    CHECK(img->squashfs_path.empty());
    CHECK(img->metadata.layer_chain == s.chain);
    CHECK(img->metadata.image_bytes == 300);
    CHECK(store.list()->size() == 1);
    // Its users hold the record (open_in_use): then it is in use, and neither it nor its layers are
    // removed or collected.
    {
        auto held = store.open_in_use(d);
        REQUIRE(held.ok());
        CHECK(store.in_use(d));
        auto rm = store.remove(d);
        REQUIRE_FALSE(rm.ok());
        CHECK(rm.error().errnum == EBUSY);
        auto gc = store.gc(1, 0s);
        REQUIRE(gc.ok());
        CHECK(gc->removed.empty());
        CHECK(gc->removed_layers.empty());
        CHECK(gc->kept_in_use == std::vector<std::string>{d});
        CHECK(store.list_layers()->size() == 2);
    }
    CHECK_FALSE(store.in_use(d));
    // A layer gone from under it (removed by hand): the image no longer counts, and says why.
    REQUIRE(store.remove_layer(s.chain[1]).ok());
    CHECK_FALSE(store.find(d).has_value());
    std::vector<std::string> ignored;
    CHECK(store.list(&ignored)->empty());
    REQUIRE(ignored.size() == 1);
    CHECK(ignored[0].find("its layer " + s.chain[1] + " is not usable") != std::string::npos);
}

TEST_CASE("authorization cache: a yes per uid and digest, for a bounded time, in a directory of the caller's own") {
    TempStore t;
    const std::string dir = t.dir + "/authorized";
    const std::string d1 = "sha256:" + std::string(64, 'a');
    const std::string d2 = "sha256:" + std::string(64, 'b');
    auto cache = AuthorizationCache::open(dir);
    REQUIRE(cache);
    struct stat st {};
    REQUIRE(::stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);

    CHECK_FALSE(cache->fresh(1000, d1, 60s));
    cache->remember(1000, d1);
    CHECK(cache->fresh(1000, d1, 60s));
    // Another user, another digest, a ttl of 0: no.
    CHECK_FALSE(cache->fresh(1001, d1, 60s));
    CHECK_FALSE(cache->fresh(1000, d2, 60s));
    CHECK_FALSE(cache->fresh(1000, d1, 0s));
    // Not a digest: never remembered, never fresh (no path built from it).
    cache->remember(1000, "sha256:../../etc");
    CHECK_FALSE(cache->fresh(1000, "sha256:../../etc", 60s));

    // An old answer has expired; one dated in the future (a clock set back) does not count.
    const std::string entry = dir + "/1000-" + std::string(64, 'a');
    timespec old[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 120, 0}};
    REQUIRE(::utimensat(AT_FDCWD, entry.c_str(), old, 0) == 0);
    CHECK_FALSE(cache->fresh(1000, d1, 60s));
    CHECK(cache->fresh(1000, d1, 300s));
    timespec future[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 3600, 0}};
    REQUIRE(::utimensat(AT_FDCWD, entry.c_str(), future, 0) == 0);
    CHECK_FALSE(cache->fresh(1000, d1, 7200s));
    cache->forget(1000, d1);
    CHECK_FALSE(cache->fresh(1000, d1, 60s));

    // A symlink planted as an entry is not one.
    REQUIRE(::symlink("/etc/passwd", (dir + "/1000-" + std::string(64, 'b')).c_str()) == 0);
    CHECK_FALSE(cache->fresh(1000, d2, 60s));

    // A directory others can write, or a symlink in its place, is refused.
    REQUIRE(::chmod(dir.c_str(), 0733) == 0);
    CHECK_FALSE(AuthorizationCache::open(dir));
    REQUIRE(::chmod(dir.c_str(), 0700) == 0);
    REQUIRE(::symlink(dir.c_str(), (t.dir + "/link").c_str()) == 0);
    CHECK_FALSE(AuthorizationCache::open(t.dir + "/link"));
}
