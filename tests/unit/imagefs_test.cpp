// Unit tests for the imagefs module (gantry-imagefs's reading side, runtime/imagefs/squashfs_image.cpp):
// images are made here with squashfs-tools' mksquashfs (an independent writer) and read back through
// SquashfsImage, without FUSE: inode numbering, hard links, listings, lookups, file bytes, symlinks,
// xattrs, many threads at once, and damaged images (errors, never a crash).
#include <dirent.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "squashfs_image.hpp"

namespace fs = std::filesystem;
using gantry::imagefs::DirEntry;
using gantry::imagefs::SquashfsImage;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/gantry-imagefs-test-XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

void write_file(const fs::path& p, const std::string& data) {
    std::ofstream(p, std::ios::binary) << data;
}

std::string pattern(size_t n, unsigned seed) {
    std::string s(n, '\0');
    std::mt19937 rng(seed);
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
}

// A tree with what the server must get right, packed with mksquashfs (image "" when that failed).
struct TestImage {
    TempDir dir;
    std::string image;
    std::string big = pattern(300000, 1);  // several 128 KiB blocks and a tail in a fragment
    bool xattr = false;
    TestImage() {
        fs::path src = dir.path / "src";
        fs::create_directories(src / "etc");
        fs::create_directories(src / "many");
        write_file(src / "etc" / "hostname", "image\n");
        write_file(src / "big", big);
        fs::create_hard_link(src / "etc" / "hostname", src / "hard");
        fs::create_symlink("etc/hostname", src / "link");
        for (int i = 0; i < 300; ++i) write_file(src / "many" / ("f" + std::to_string(i)), std::to_string(i));
        xattr = ::setxattr((src / "big").c_str(), "user.gantry", "yes", 3, 0) == 0;
        image = (dir.path / "img.sqsh").string();
        std::string cmd = "mksquashfs " + src.string() + " " + image + " -comp lz4 -quiet -no-progress >/dev/null 2>&1";
        if (std::system(cmd.c_str()) != 0) image.clear();
    }
};

std::unique_ptr<SquashfsImage> open_image(const std::string& path) {
    auto img = SquashfsImage::open(path);
    REQUIRE(img.ok());
    return std::move(*img);
}

DirEntry must_find(SquashfsImage& img, uint64_t dir, const std::string& name) {
    auto e = img.lookup(dir, name);
    REQUIRE(e.ok());
    REQUIRE(e->has_value());
    return **e;
}

}  // namespace

TEST_CASE("kernel inode numbers are the image's, with the root at 1") {
    using gantry::imagefs::image_number;
    using gantry::imagefs::kernel_ino;
    CHECK(kernel_ino(40, 40) == 1);
    CHECK(kernel_ino(1, 40) == 40);
    CHECK(kernel_ino(7, 40) == 7);
    for (uint32_t n : {1u, 2u, 7u, 39u, 40u}) CHECK(image_number(kernel_ino(n, 40), 40) == n);
}

TEST_CASE("an image reads back as mksquashfs wrote it") {
    TestImage t;
    REQUIRE_FALSE(t.image.empty());  // mksquashfs (squashfs-tools, scripts/install-deps) made the image
    auto img = open_image(t.image);

    auto root = img->attributes(1);
    REQUIRE(root.ok());
    CHECK(S_ISDIR(root->st_mode));
    CHECK(root->st_ino == 1);

    // Lookups, and a miss that is no error.
    DirEntry etc = must_find(*img, 1, "etc");
    CHECK(etc.d_type == DT_DIR);
    auto missing = img->lookup(1, "nothere");
    REQUIRE(missing.ok());
    CHECK_FALSE(missing->has_value());
    auto parent = img->parent(etc.ino);
    REQUIRE(parent.ok());
    CHECK(*parent == 1);

    // A hard link is one inode, with two links.
    DirEntry host = must_find(*img, etc.ino, "hostname");
    DirEntry hard = must_find(*img, 1, "hard");
    CHECK(host.ino == hard.ino);
    auto st = img->attributes(hard.ino);
    REQUIRE(st.ok());
    CHECK(st->st_nlink == 2);
    CHECK(st->st_size == 6);
    CHECK(S_ISREG(st->st_mode));

    // Symlink target.
    DirEntry link = must_find(*img, 1, "link");
    CHECK(link.d_type == DT_LNK);
    auto target = img->read_link(link.ino);
    REQUIRE(target.ok());
    CHECK(*target == "etc/hostname");
    CHECK(img->read_link(host.ino).error().errnum == EINVAL);

    // A directory of 300 entries: all there, sorted, without "." and "..", distinct inodes.
    DirEntry many = must_find(*img, 1, "many");
    auto listing = img->list(many.ino);
    REQUIRE(listing.ok());
    REQUIRE((*listing)->size() == 300);
    std::set<uint64_t> inos;
    for (size_t i = 0; i < (*listing)->size(); ++i) {
        const DirEntry& e = (**listing)[i];
        if (i > 0) CHECK((**listing)[i - 1].name < e.name);
        CHECK(e.d_type == DT_REG);
        inos.insert(e.ino);
    }
    CHECK(inos.size() == 300);
    DirEntry f123 = must_find(*img, many.ino, "f123");
    char small[16] = {};
    auto n = img->read(f123.ino, 0, std::span<char>(small, sizeof small));
    REQUIRE(n.ok());
    CHECK(std::string(small, *n) == "123");
    CHECK(img->list(f123.ino).error().errnum == ENOTDIR);

    // File bytes across block boundaries and into the fragment; nothing past the end.
    DirEntry big = must_find(*img, 1, "big");
    std::string back(t.big.size(), '\0');
    size_t done = 0;
    while (done < back.size()) {
        auto got =
            img->read(big.ino, done, std::span<char>(back.data() + done, std::min<size_t>(70000, back.size() - done)));
        REQUIRE(got.ok());
        REQUIRE(*got > 0);
        done += *got;
    }
    CHECK(back == t.big);
    auto past = img->read(big.ino, t.big.size(), std::span<char>(small, sizeof small));
    REQUIRE(past.ok());
    CHECK(*past == 0);

    // Extended attributes, full names.
    if (t.xattr) {
        auto xs = img->xattrs(big.ino);
        REQUIRE(xs.ok());
        REQUIRE(xs->size() == 1);
        CHECK((*xs)[0].first == "user.gantry");
        CHECK((*xs)[0].second == "yes");
    }

    // Inode numbers the kernel never got from us are refused, not guessed.
    CHECK(img->attributes(0).error().errnum == ENOENT);
    CHECK(img->attributes(1u << 30).error().errnum == ENOENT);

    struct statvfs v = img->filesystem();
    CHECK(v.f_namemax == 255);
    CHECK(v.f_files >= 306);
}

TEST_CASE("many threads read one image at once") {
    TestImage t;
    REQUIRE_FALSE(t.image.empty());  // mksquashfs (squashfs-tools, scripts/install-deps) made the image
    auto img = open_image(t.image);
    DirEntry many = must_find(*img, 1, "many");
    DirEntry big = must_find(*img, 1, "big");
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k)
        threads.emplace_back([&, k] {
            for (int round = 0; round < 50; ++round) {
                int i = (k * 50 + round) % 300;
                auto e = img->lookup(many.ino, "f" + std::to_string(i));
                char buf[16];
                if (!e.ok() || !e->has_value()) {
                    ++wrong;
                    continue;
                }
                auto n = img->read((*e)->ino, 0, std::span<char>(buf, sizeof buf));
                if (!n.ok() || std::string(buf, *n) != std::to_string(i)) ++wrong;
                std::string part(4096, '\0');
                size_t off = static_cast<size_t>(round) * 5000;
                auto m = img->read(big.ino, off, std::span<char>(part.data(), part.size()));
                if (!m.ok() || part.substr(0, *m) != t.big.substr(off, *m)) ++wrong;
            }
        });
    for (auto& th : threads) th.join();
    CHECK(wrong == 0);
}

TEST_CASE("a directory larger than the limit is refused") {
    TestImage t;
    REQUIRE_FALSE(t.image.empty());  // mksquashfs (squashfs-tools, scripts/install-deps) made the image
    gantry::imagefs::ImageLimits limits;
    limits.max_listing_bytes = 1024;
    auto img = SquashfsImage::open(t.image, limits);
    REQUIRE(img.ok());
    DirEntry many = must_find(**img, 1, "many");
    auto listing = (*img)->list(many.ino);
    REQUIRE_FALSE(listing.ok());
    CHECK(listing.error().errnum == EIO);
}

TEST_CASE("a damaged image gives errors, never a crash") {
    TestImage t;
    REQUIRE_FALSE(t.image.empty());  // mksquashfs (squashfs-tools, scripts/install-deps) made the image
    std::ifstream in(t.image, std::ios::binary);
    std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(good.size() > 1000);
    std::string bad_path = t.image + ".bad";

    // Cut short: refused at open (the tables are at the end).
    write_file(bad_path, good.substr(0, good.size() / 2));
    CHECK_FALSE(SquashfsImage::open(bad_path).ok());
    write_file(bad_path, "hsqs");
    CHECK_FALSE(SquashfsImage::open(bad_path).ok());

    // Random bytes changed anywhere past the super block: whatever opens must answer every call.
    std::mt19937 rng(7);
    int opened = 0;
    for (int round = 0; round < 200; ++round) {
        std::string bad = good;
        for (int k = 0; k < 8; ++k) bad[96 + rng() % (bad.size() - 96)] = static_cast<char>(rng());
        write_file(bad_path, bad);
        auto img = SquashfsImage::open(bad_path);
        if (!img.ok()) continue;
        ++opened;
        std::vector<uint64_t> dirs = {1};
        for (size_t d = 0; d < dirs.size() && d < 8; ++d) {
            auto listing = (*img)->list(dirs[d]);
            if (!listing.ok()) continue;
            for (const auto& e : **listing) {
                (void)(*img)->lookup(dirs[d], e.name);
                auto st = (*img)->attributes(e.ino);
                if (!st.ok()) continue;
                if (S_ISDIR(st->st_mode)) dirs.push_back(e.ino);
                char buf[4096];
                if (S_ISREG(st->st_mode)) (void)(*img)->read(e.ino, 0, std::span<char>(buf, sizeof buf));
                if (S_ISLNK(st->st_mode)) (void)(*img)->read_link(e.ino);
                (void)(*img)->xattrs(e.ino);
            }
        }
    }
    CHECK(opened > 0);  // the loop above really read damaged images
}

namespace {

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A tree of files with user xattrs, packed with mksquashfs with uncompressed metadata (-noI -noX: the
// tests below find and change bytes in it); "" when xattrs or mksquashfs are unavailable here.
struct XattrImage {
    TempDir dir;
    std::string image;
    std::string shared = std::string(100, 's');  // the same value on two files: stored once, out of line
    std::string large = pattern(4000, 3);        // at a limit the test sets
    XattrImage() {
        fs::path src = dir.path / "src";
        fs::create_directories(src);
        for (const char* name : {"a", "b", "c"}) write_file(src / name, name);
        auto set = [&](const char* file, const char* key, const std::string& value) {
            return ::setxattr((src / file).c_str(), key, value.data(), value.size(), 0) == 0;
        };
        if (!set("a", "user.shared", shared) || !set("b", "user.shared", shared) || !set("b", "user.one", "1") ||
            !set("c", "user.large", large))
            return;
        image = (dir.path / "x.sqsh").string();
        std::string cmd = "mksquashfs " + src.string() + " " + image + " -noI -noX -quiet -no-progress >/dev/null 2>&1";
        if (std::system(cmd.c_str()) != 0) image.clear();
    }
};

// Little-endian 32-bit store at `at` (squashfs is little-endian on disk).
void put_le32(std::string& bytes, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

}  // namespace

TEST_CASE("xattrs read back, values stored once included, bounded by the limits") {
    XattrImage t;
    if (t.image.empty())
        FAIL("user xattrs or mksquashfs unavailable under /tmp: the image this test reads was not made");
    auto xattrs_of = [](SquashfsImage& img, const char* name) {
        auto xs = img.xattrs(must_find(img, 1, name).ino);
        REQUIRE(xs.ok());
        return std::map<std::string, std::string>(xs->begin(), xs->end());
    };
    {
        auto img = open_image(t.image);
        CHECK(img->has_xattrs());
        CHECK(xattrs_of(*img, "a") == std::map<std::string, std::string>{{"user.shared", t.shared}});
        CHECK(xattrs_of(*img, "b") == std::map<std::string, std::string>{{"user.one", "1"}, {"user.shared", t.shared}});
        CHECK(xattrs_of(*img, "c") == std::map<std::string, std::string>{{"user.large", t.large}});
    }
    // At its boundary: a value of exactly max_xattr_value bytes is served; one byte less of limit and
    // the inode's xattrs are refused (EIO), as are more pairs than max_xattrs.
    gantry::imagefs::ImageLimits limits;
    limits.max_xattr_value = t.large.size();
    auto at_limit = SquashfsImage::open(t.image, limits);
    REQUIRE(at_limit.ok());
    CHECK(xattrs_of(**at_limit, "c").at("user.large") == t.large);
    limits.max_xattr_value = t.large.size() - 1;
    auto below = SquashfsImage::open(t.image, limits);
    REQUIRE(below.ok());
    auto refused = (*below)->xattrs(must_find(**below, 1, "c").ino);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().errnum == EIO);
    limits = {};
    limits.max_xattrs = 1;
    auto few = SquashfsImage::open(t.image, limits);
    REQUIRE(few.ok());
    CHECK(xattrs_of(**few, "a").size() == 1);
    auto two = (*few)->xattrs(must_find(**few, 1, "b").ino);
    REQUIRE_FALSE(two.ok());
    CHECK(two.error().errnum == EIO);
}

TEST_CASE("sizes an image declares are checked before they are held") {
    XattrImage t;
    if (t.image.empty())
        FAIL("user xattrs or mksquashfs unavailable under /tmp: the image this test reads was not made");
    const std::string good = read_all(t.image);
    const std::string bad_path = t.image + ".bad";

    // A value's size field claiming 4 GiB (the fuzz finding imagefs-xattr-value-4gb): an error, not a
    // 4 GiB allocation. The large value is stored inline, its size just before its bytes.
    size_t at = good.find(t.large);
    REQUIRE(at != std::string::npos);
    REQUIRE(at >= 4);
    std::string bad = good;
    put_le32(bad, at - 4, 0xFFFFFFF0u);
    write_file(bad_path, bad);
    auto img = SquashfsImage::open(bad_path);
    REQUIRE(img.ok());
    auto xs = (*img)->xattrs(must_find(**img, 1, "c").ino);
    REQUIRE_FALSE(xs.ok());
    CHECK(xs.error().errnum == EIO);

    // The super block's fragment count (offset 16) beyond the image's inodes, or beyond what the file
    // could list (the fuzz finding imagefs-fragment-table-2gb): refused at open. The image itself has
    // fragments (three small files), so its own count passes.
    REQUIRE(SquashfsImage::open(t.image).ok());
    for (uint32_t count : {0x08000000u, 1000u}) {
        bad = good;
        put_le32(bad, 16, count);
        write_file(bad_path, bad);
        auto opened = SquashfsImage::open(bad_path);
        REQUIRE_FALSE(opened.ok());
        CHECK(opened.error().errnum == EIO);
        CHECK(opened.error().message.find("fragment table") != std::string::npos);
    }
    // The limit, at its boundary: max_fragments below the image's own count refuses it.
    gantry::imagefs::ImageLimits limits;
    limits.max_fragments = 0;
    CHECK_FALSE(SquashfsImage::open(t.image, limits).ok());
}

TEST_CASE("a file's block list is bounded before it is held") {
    TestImage t;
    REQUIRE_FALSE(t.image.empty());  // mksquashfs (squashfs-tools, scripts/install-deps) made the image
    // At the limit: "big" (300,000 bytes in 128 KiB blocks) has a list of at most 3 blocks.
    gantry::imagefs::ImageLimits limits;
    limits.max_file_blocks = 3;
    auto at = SquashfsImage::open(t.image, limits);
    REQUIRE(at.ok());
    CHECK((*at)->attributes(must_find(**at, 1, "big").ino).ok());
    limits.max_file_blocks = 2;
    auto below = SquashfsImage::open(t.image, limits);
    REQUIRE(below.ok());
    auto refused = (*below)->attributes(must_find(**below, 1, "big").ino);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().errnum == EIO);

    // Extended file inodes (these files have xattrs) whose 64-bit size claims 2^40 bytes: 2^23
    // blocks, more than a few hundred bytes of inode table could list. Refused, never allocated.
    XattrImage x;
    if (x.image.empty())
        FAIL("user xattrs or mksquashfs unavailable under /tmp: the image this test reads was not made");
    std::string bytes = read_all(x.image);
    auto le = [&](size_t at, int n) {
        uint64_t v = 0;
        for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
        return v;
    };
    const size_t table = le(64, 8), table_end = le(72, 8);  // inode and directory table starts
    int patched = 0;
    // -noI: the inode table's bytes are as written. An extended file inode: type 9, then 16 bytes of
    // the common header, blocks_start (8), file_size (8) = 1 for these one-byte files.
    for (size_t i = table; i + 32 <= table_end; ++i) {
        if (le(i, 2) != 9u || le(i + 24, 8) != 1) continue;
        for (int k = 0; k < 8; ++k) bytes[i + 24 + k] = k == 5 ? 1 : 0;  // 2^40
        ++patched;
    }
    REQUIRE(patched == 3);
    const std::string bad_path = x.image + ".bad";
    write_file(bad_path, bytes);
    auto img = SquashfsImage::open(bad_path);
    REQUIRE(img.ok());
    for (const char* name : {"a", "b", "c"}) {
        auto st = (*img)->attributes(must_find(**img, 1, name).ino);
        REQUIRE_FALSE(st.ok());
        CHECK(st.error().errnum == EIO);
    }
}
