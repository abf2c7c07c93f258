// Unit tests for the squashfs module: layer tars are built here with libarchive (plain, gzip, zstd),
// converted with convert_layers, and read back with squashfs-tools' unsquashfs (an independent reader),
// plus the kernel where the test may mount. Also: the merge rules and path checks on their own, and a
// hidden "[.driver]" test case that converts layers named in the environment, for the bats tests.
#include "gantry/squashfs.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <catch2/catch.hpp>
#include <clocale>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../../runtime/squashfs/image_tree.hpp"
#include "gantry/digest.hpp"
#include "gantry/fd.hpp"

namespace fs = std::filesystem;
using gantry::LayerBlob;
using gantry::SquashfsOptions;

namespace {

constexpr int64_t kTime = 1700000000;

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/gantry-sqfs-test-XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

struct Member {
    std::string name;
    unsigned type = AE_IFREG;
    unsigned mode = 0644;
    int64_t uid = 0, gid = 0, mtime = kTime;
    std::string data;
    std::string link;  // symlink target, or hard link target
    bool hardlink = false;
    std::vector<std::pair<std::string, std::string>> xattrs;
};

enum class Comp { plain, gzip, zstd };

// One layer tar, written with libarchive (pax, as most image builders do).
struct Layer {
    std::vector<Member> members;

    Layer& file(const std::string& name, const std::string& data = "", unsigned mode = 0644) {
        members.push_back(Member{name, AE_IFREG, mode, 0, 0, kTime, data, "", false, {}});
        return *this;
    }
    Layer& dir(const std::string& name, unsigned mode = 0755) {
        members.push_back(Member{name, AE_IFDIR, mode, 0, 0, kTime, "", "", false, {}});
        return *this;
    }
    Layer& symlink(const std::string& name, const std::string& target) {
        members.push_back(Member{name, AE_IFLNK, 0777, 0, 0, kTime, "", target, false, {}});
        return *this;
    }
    Layer& hardlink(const std::string& name, const std::string& target) {
        members.push_back(Member{name, AE_IFREG, 0644, 0, 0, kTime, "", target, true, {}});
        return *this;
    }
    Layer& node(const std::string& name, unsigned type) {
        members.push_back(Member{name, type, 0644, 0, 0, kTime, "", "", false, {}});
        return *this;
    }
    Member& last() { return members.back(); }

    [[nodiscard]] std::string tar(bool gnu = false) const {
        // Write names as UTF-8 pax records, as Go's archive/tar (docker, buildkit) does; the library
        // under test reads them back in the process's "C" locale.
        const std::string saved_locale = std::setlocale(LC_CTYPE, nullptr);
        std::setlocale(LC_CTYPE, "C.UTF-8");
        archive* a = archive_write_new();
        if (gnu) {
            archive_write_set_format_gnutar(a);
        } else {
            archive_write_set_format_pax(a);
        }
        std::string out(64 << 20, '\0');
        size_t used = 0;
        archive_write_open_memory(a, out.data(), out.size(), &used);
        for (const auto& m : members) {
            archive_entry* e = archive_entry_new();
            archive_entry_copy_pathname(e, m.name.c_str());
            archive_entry_set_uid(e, m.uid);
            archive_entry_set_gid(e, m.gid);
            archive_entry_set_mtime(e, m.mtime, 0);
            if (m.hardlink) {
                archive_entry_copy_hardlink(e, m.link.c_str());
                archive_entry_set_filetype(e, AE_IFREG);
                archive_entry_set_perm(e, m.mode);
                archive_entry_set_size(e, 0);
            } else {
                archive_entry_set_filetype(e, m.type);
                archive_entry_set_perm(e, m.mode);
                if (m.type == AE_IFLNK) archive_entry_copy_symlink(e, m.link.c_str());
                if (m.type == AE_IFCHR || m.type == AE_IFBLK) archive_entry_set_rdev(e, makedev(1, 3));
                archive_entry_set_size(e, m.type == AE_IFREG ? static_cast<la_int64_t>(m.data.size()) : 0);
            }
            for (const auto& [k, v] : m.xattrs) archive_entry_xattr_add_entry(e, k.c_str(), v.data(), v.size());
            int rc = archive_write_header(a, e);
            INFO(m.name << ": " << (archive_error_string(a) != nullptr ? archive_error_string(a) : ""));
            REQUIRE(rc >= ARCHIVE_WARN);  // WARN: a name not representable in the C locale, written raw
            if (!m.hardlink && m.type == AE_IFREG && !m.data.empty())
                REQUIRE(archive_write_data(a, m.data.data(), m.data.size()) == static_cast<la_ssize_t>(m.data.size()));
            archive_entry_free(e);
        }
        archive_write_close(a);
        archive_write_free(a);
        std::setlocale(LC_CTYPE, saved_locale.c_str());
        out.resize(used);
        return out;
    }
};

std::string gzip(const std::string& in) {
    z_stream z{};
    REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    std::string out(deflateBound(&z, in.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z.avail_in = static_cast<uInt>(in.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string zstd(const std::string& in) {
    std::string out(ZSTD_compressBound(in.size()), '\0');
    size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3);
    REQUIRE_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
}

void write_file(const fs::path& p, const std::string& data) {
    std::ofstream f(p, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    REQUIRE(f.good());
}

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Writes the layer blob (the tar bytes as given, compressed) into `dir` and describes it the way the
// registry client will.
LayerBlob blob_of_tar(const fs::path& dir, const std::string& tar, Comp comp) {
    static int counter = 0;
    LayerBlob b;
    b.diff_id = gantry::Sha256::of(tar);
    std::string bytes = tar;
    switch (comp) {
        case Comp::plain:
            b.media_type = "application/vnd.oci.image.layer.v1.tar";
            break;
        case Comp::gzip:
            bytes = gzip(tar);
            b.media_type = "application/vnd.docker.image.rootfs.diff.tar.gzip";
            break;
        case Comp::zstd:
            bytes = zstd(tar);
            b.media_type = "application/vnd.oci.image.layer.v1.tar+zstd";
            break;
    }
    b.digest = gantry::Sha256::of(bytes);
    b.path = (dir / ("layer" + std::to_string(++counter))).string();
    write_file(b.path, bytes);
    return b;
}

LayerBlob blob(const fs::path& dir, const Layer& layer, Comp comp = Comp::gzip, bool gnu = false) {
    return blob_of_tar(dir, layer.tar(gnu), comp);
}

int run(const std::string& cmd) {
    return std::system(cmd.c_str());
}

struct Entry {
    char type = '?';    // f d l p s c b
    unsigned mode = 0;  // permission bits incl. setuid/setgid/sticky
    unsigned uid = 0, gid = 0;
    int64_t mtime = 0;
    std::string content, target;
    nlink_t nlink = 0;
    ino_t ino = 0;
    dev_t rdev = 0;  // c and b
    std::map<std::string, std::string> xattrs;
};
using Tree = std::map<std::string, Entry>;

Tree read_tree(const fs::path& root) {
    Tree tree;
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
        const std::string p = it->path().string();
        struct stat st {};
        REQUIRE(::lstat(p.c_str(), &st) == 0);
        Entry e;
        e.type = S_ISREG(st.st_mode)    ? 'f'
                 : S_ISDIR(st.st_mode)  ? 'd'
                 : S_ISLNK(st.st_mode)  ? 'l'
                 : S_ISFIFO(st.st_mode) ? 'p'
                 : S_ISCHR(st.st_mode)  ? 'c'
                 : S_ISBLK(st.st_mode)  ? 'b'
                                        : 's';
        e.rdev = st.st_rdev;
        e.mode = st.st_mode & 07777;
        e.uid = st.st_uid;
        e.gid = st.st_gid;
        e.mtime = st.st_mtime;
        e.nlink = st.st_nlink;
        e.ino = st.st_ino;
        if (e.type == 'f') e.content = read_file(p);
        if (e.type == 'l') e.target = fs::read_symlink(p).string();
        char names[4096];
        ssize_t n = ::llistxattr(p.c_str(), names, sizeof(names));
        for (ssize_t i = 0; i < n;) {
            std::string key(names + i);
            char value[4096];
            ssize_t vn = ::lgetxattr(p.c_str(), key.c_str(), value, sizeof(value));
            if (vn >= 0 && key.rfind("security.selinux", 0) != 0)
                e.xattrs[key] = std::string(value, static_cast<size_t>(vn));
            i += static_cast<ssize_t>(key.size()) + 1;
        }
        tree[it->path().lexically_relative(root).string()] = e;  // fs::relative would follow symlinks
    }
    return tree;
}

// unsquashfs (squashfs-tools, not the library we write with) extracts the image; run as root it
// keeps owners, modes, xattrs and hard links.
Tree unsquash(const fs::path& image, const fs::path& dir) {
    REQUIRE(run("unsquashfs -n -q -d '" + dir.string() + "' '" + image.string() + "' >/dev/null") == 0);
    return read_tree(dir);
}

struct Image {
    TempDir tmp;
    std::vector<LayerBlob> layers;  // bottom first
    fs::path out() const { return tmp.path / "image.sqfs"; }
    std::optional<gantry::LimitBreach> breach;  // of the last convert()
    gantry::Result<gantry::ConversionStats> convert(const SquashfsOptions& opt = {}) {
        breach.reset();
        return gantry::convert_layers(layers, out().string(), opt, {}, &breach);
    }
    Image& add(const Layer& l, Comp c = Comp::gzip, bool gnu = false) {
        layers.push_back(blob(tmp.path, l, c, gnu));
        return *this;
    }
    Tree tree() { return unsquash(out(), tmp.path / "x"); }
};

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("entry paths: ./ prefixes are dropped, escapes are rejected") {
    using gantry::squashfs::split_entry_path;
    CHECK(*split_entry_path("./a/b/") == std::vector<std::string>{"a", "b"});
    CHECK(*split_entry_path("a/./b") == std::vector<std::string>{"a", "b"});
    CHECK(split_entry_path("./")->empty());
    CHECK(split_entry_path(".")->empty());
    CHECK(*split_entry_path("..a/b..") == std::vector<std::string>{"..a", "b.."});  // dots inside names are fine
    CHECK(contains(split_entry_path("../x").error().message, "escapes the image root"));
    CHECK(contains(split_entry_path("a/../../x").error().message, "escapes the image root"));
    CHECK(contains(split_entry_path("/etc/passwd").error().message, "absolute path"));
    CHECK_FALSE(split_entry_path("a//b").ok());
    // A whiteout name is a marker, never a directory on the way to another entry (found by fuzzing).
    CHECK(*split_entry_path("a/.wh.b") == std::vector<std::string>{"a", ".wh.b"});
    CHECK(*split_entry_path("a/.wh..wh..opq") == std::vector<std::string>{"a", ".wh..wh..opq"});
    CHECK(contains(split_entry_path(".wh.a/b").error().message, "whiteout name (.wh.*) used as a directory"));
    CHECK(contains(split_entry_path("x/.wh..wh..opq/y").error().message, "used as a directory"));
    CHECK(*split_entry_path("a.wh./b") == std::vector<std::string>{"a.wh.", "b"});
    CHECK_FALSE(split_entry_path("").ok());
}

TEST_CASE("merge rules: whiteouts and opaque directories only hide lower layers") {
    using gantry::squashfs::ImageTree;
    ImageTree t;
    // Layer 2 (top) is walked first.
    CHECK(t.whiteout({"etc", "gone"}, 2));
    CHECK(t.make_opaque({"opq"}, 2));
    REQUIRE(t.place({"opq", "new"}, 2, false) != nullptr);  // same layer: kept
    CHECK(t.place({"opq", "old"}, 1, false) == nullptr);    // lower: hidden by the opaque dir
    REQUIRE(t.place({"opq"}, 1, true) != nullptr);          // ...but the directory itself comes through
    CHECK(t.place({"etc", "gone"}, 1, false) == nullptr);   // whited out
    CHECK(t.place({"etc", "gone", "deeper"}, 1, false) == nullptr);
    REQUIRE(t.place({"etc", "kept"}, 1, false) != nullptr);
    REQUIRE(t.place({"f"}, 2, false) != nullptr);         // a file in the top layer...
    CHECK(t.place({"f", "child"}, 1, false) == nullptr);  // ...replaces a lower directory
    CHECK(t.place({"f"}, 1, true) == nullptr);
    REQUIRE(t.place({"d", "x"}, 2, false) != nullptr);  // a directory in the top layer...
    CHECK(t.place({"d"}, 1, false) == nullptr);         // ...replaces a lower file
    CHECK(t.place({"f"}, 2, false) != nullptr);         // same layer again: the later entry wins
    CHECK(t.whiteout({"f"}, 2));                        // a whiteout never hides its own layer
    CHECK(t.place({"f"}, 2, false) != nullptr);
}

// A lower layer with something for each kind of change above it to act on (the whiteout tests).
static Layer changes_lower() {
    Layer l;
    l.dir("etc").file("etc/keep", "keep").file("etc/gone", "gone");
    l.dir("opq").file("opq/lower", "lower").dir("opq/sub").file("opq/sub/deep", "deep");
    l.dir("d2f").file("d2f/child", "c");
    l.file("f2d", "was a file");
    l.dir("wd").file("wd/old", "old");
    return l;
}

TEST_CASE("whiteouts, opaque directories and replacements across layers") {
    Image img;
    img.add(changes_lower(), Comp::plain)
        .add(Layer()
                 .file("etc/.wh.gone")
                 .dir("opq")
                 .file("opq/.wh..wh..opq")
                 .file("opq/upper", "upper")
                 .file("d2f", "now a file")
                 .dir("f2d")
                 .file("f2d/inside", "now a dir")
                 .file(".wh.wd")
                 .dir("wd")
                 .file("wd/new", "new"),
             Comp::zstd);
    auto r = img.convert();
    REQUIRE(r.ok());
    Tree t = img.tree();
    CHECK(t.count("etc/keep") == 1);
    CHECK(t.count("etc/gone") == 0);
    CHECK(t.count("etc/.wh.gone") == 0);  // whiteout markers are not files of the image
    CHECK(t.count("opq") == 1);
    CHECK(t.count("opq/lower") == 0);
    CHECK(t.count("opq/sub") == 0);
    CHECK(t.count("opq/.wh..wh..opq") == 0);
    CHECK(t["opq/upper"].content == "upper");
    CHECK(t["d2f"].type == 'f');
    CHECK(t["d2f"].content == "now a file");
    CHECK(t.count("d2f/child") == 0);
    CHECK(t["f2d"].type == 'd');
    CHECK(t["f2d/inside"].content == "now a dir");
    CHECK(t["wd"].type == 'd');  // deleted and recreated in one layer: only the new content
    CHECK(t.count("wd/old") == 0);
    CHECK(t["wd/new"].content == "new");
    CHECK(r->shadowed_entries >= 6);
}

TEST_CASE("a later entry of the same layer wins; whiteouts leave their own layer alone") {
    Image img;
    img.add(Layer().file("a", "lowest"), Comp::plain)
        .add(Layer().file("a", "first").file("a", "second").file("b", "b").file(".wh.b").file("c", "c"), Comp::gzip)
        .add(Layer().file(".wh.c"), Comp::gzip);
    REQUIRE(img.convert().ok());
    Tree t = img.tree();
    CHECK(t["a"].content == "second");
    CHECK(t["b"].content == "b");
    CHECK(t.count("c") == 0);
}

TEST_CASE("metadata survives: owners, modes, times, symlinks, fifos, xattrs, odd names") {
    const std::string long_name = std::string(150, 'L') + "/" + std::string(200, 'n');
    Layer l;
    l.dir("bin").file("bin/su", "#!", 04755).last().uid = 0;
    l.file("bin/wall", "w", 02755).last().gid = 5;
    l.dir("tmp", 01777);
    l.file("home/user/owned", "x", 0600);
    l.last().uid = 1000;
    l.last().gid = 100000;  // ids beyond 16 bits
    l.last().mtime = 1234567890;
    l.symlink("abs", "/usr/bin/env").symlink("rel", "../lib/x").symlink("outside", "../../../../etc/shadow");
    l.symlink("dangling", "does/not/exist");
    l.node("fifo", AE_IFIFO);
    l.file("xattr", "x").last().xattrs = {{"user.test", std::string("v\0bin", 5)}, {"trusted.gantry", "t"}};
    l.dir("xdir").last().xattrs = {{"user.dir", "d"}};
    l.file(long_name, "long");
    l.file("ünïcødé/日本語.txt", "utf8");
    l.file("empty");
    Image img;
    img.add(l, Comp::gzip);
    auto r = img.convert();
    REQUIRE(r.ok());
    Tree t = img.tree();
    CHECK(t["bin/su"].mode == 04755);
    CHECK(t["bin/wall"].mode == 02755);
    CHECK(t["bin/wall"].gid == 5);
    CHECK(t["tmp"].mode == 01777);
    CHECK(t["home/user/owned"].uid == 1000);
    CHECK(t["home/user/owned"].gid == 100000);
    CHECK(t["home/user/owned"].mode == 0600);
    CHECK(t["home/user/owned"].mtime == 1234567890);
    CHECK(t["bin/su"].mtime == kTime);
    CHECK(t["abs"].target == "/usr/bin/env");
    CHECK(t["rel"].target == "../lib/x");
    CHECK(t["outside"].target == "../../../../etc/shadow");
    CHECK(t["dangling"].type == 'l');
    CHECK(t["fifo"].type == 'p');
    CHECK(t["xattr"].xattrs["user.test"] == std::string("v\0bin", 5));
    CHECK(t["xattr"].xattrs["trusted.gantry"] == "t");
    CHECK(t["xdir"].xattrs["user.dir"] == "d");
    CHECK(t[long_name].content == "long");
    CHECK(t["ünïcødé/日本語.txt"].content == "utf8");
    CHECK(t["empty"].type == 'f');
    CHECK(t["empty"].content.empty());
    // Parents no layer listed: root-owned 0755 directories.
    CHECK(t["home"].type == 'd');
    CHECK(t["home"].mode == 0755);
    CHECK(t["home"].uid == 0);
    CHECK(r->symlinks == 4);
    CHECK(r->others == 1);
}

TEST_CASE("GNU tar long names and uncompressed layers without a media type") {
    const std::string long_name = "gnu/" + std::string(180, 'g');
    Image img;
    img.add(Layer().file(long_name, "gnu long"), Comp::plain, true);
    img.add(Layer().file("zst", "zstd by magic"), Comp::zstd);
    img.layers[0].media_type.clear();
    img.layers[1].media_type.clear();
    REQUIRE(img.convert().ok());
    Tree t = img.tree();
    CHECK(t[long_name].content == "gnu long");
    CHECK(t["zst"].content == "zstd by magic");
}

TEST_CASE("file data: several blocks plus a tail fragment, duplicates, sparse-looking zeros") {
    std::string big;
    uint32_t x = 12345;
    for (size_t i = 0; i < 3 * 131072 + 777; ++i) {
        x = x * 1103515245u + 12345u;
        big.push_back(static_cast<char>(x >> 24));
    }
    std::string zeros(5 * 131072, '\0');
    Image img;
    img.add(Layer().file("big", big).file("copy", big).file("zeros", zeros).file("small", "tail"), Comp::zstd);
    SquashfsOptions opt;
    opt.threads = 2;
    auto r = img.convert(opt);
    REQUIRE(r.ok());
    Tree t = img.tree();
    CHECK(t["big"].content == big);
    CHECK(t["copy"].content == big);
    CHECK(t["zeros"].content == zeros);
    CHECK(t["small"].content == "tail");
    // Deduplication: the copy costs no data blocks, so the image is well under twice the random data.
    CHECK(r->image_bytes < big.size() + big.size() / 2);
    CHECK(r->files == 4);
    CHECK(r->uncompressed_bytes >= big.size() * 2 + zeros.size());
}

TEST_CASE("hard links share one inode, also when the target's own name is hidden by a higher layer") {
    Image img;
    img.add(Layer()
                .file("bin/data", "shared data", 0750)
                .hardlink("bin/link1", "bin/data")
                .hardlink("bin/link2", "bin/link1")  // a link to a link means the same file
                .file("hidden/target", "only reachable through the link")
                .hardlink("visible", "hidden/target")
                .file("gone/empty")
                .hardlink("empty-link", "gone/empty"),
            Comp::gzip)
        .add(Layer().file(".wh.hidden").file(".wh.gone"), Comp::plain);
    auto r = img.convert();
    REQUIRE(r.ok());
    Tree t = img.tree();
    CHECK(t["bin/data"].nlink == 3);
    CHECK(t["bin/link1"].ino == t["bin/data"].ino);
    CHECK(t["bin/link2"].ino == t["bin/data"].ino);
    CHECK(t["bin/link2"].content == "shared data");
    CHECK(t["bin/link2"].mode == 0750);
    CHECK(t.count("hidden/target") == 0);
    CHECK(t["visible"].content == "only reachable through the link");
    CHECK(t["visible"].nlink == 1);
    CHECK(t["empty-link"].type == 'f');
    CHECK(r->hardlinks == 2);

    Image bad;
    bad.add(Layer().hardlink("x", "nowhere"));
    auto b = bad.convert();
    REQUIRE_FALSE(b.ok());
    CHECK(contains(b.error().message, "hard link to 'nowhere'"));
    CHECK_FALSE(fs::exists(bad.out()));
}

TEST_CASE("devices are skipped and still hide lower versions of their path") {
    Image img;
    img.add(Layer().file("dev/null", "a lower file").file("keep", "k"), Comp::plain)
        .add(Layer().dir("dev").node("dev/null", AE_IFCHR).node("dev/sda", AE_IFBLK), Comp::plain);
    REQUIRE(img.convert().ok());
    Tree t = img.tree();
    CHECK(t["dev"].type == 'd');
    CHECK(t.count("dev/null") == 0);
    CHECK(t.count("dev/sda") == 0);
    CHECK(t["keep"].content == "k");
}

TEST_CASE("the root directory takes the attributes of the top-most ./ entry") {
    Image img;
    Layer low;
    low.dir("./", 0700);
    low.last().uid = 7;
    Layer high;
    high.dir("./", 0751).file("./x", "x");
    high.last().mtime = kTime;
    img.add(low, Comp::plain).add(high, Comp::plain);
    REQUIRE(img.convert().ok());
    TempDir out;
    REQUIRE(run("unsquashfs -n -q -d '" + (out.path / "r").string() + "' '" + img.out().string() + "' >/dev/null") ==
            0);
    struct stat st {};
    REQUIRE(::stat((out.path / "r").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0751);
    CHECK(st.st_uid == 0);
}

TEST_CASE("a diff_id mismatch fails, names the layer and leaves no output") {
    Image img;
    img.add(Layer().file("a", "a"));
    img.layers[0].diff_id = gantry::Sha256::of("something else");
    auto r = img.convert();
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "converting layer " + img.layers[0].digest));
    CHECK(contains(r.error().message, "image config says"));
    CHECK_FALSE(fs::exists(img.out()));
}

TEST_CASE("entries escaping the root are rejected with the entry named") {
    for (const std::string bad : {"../escape", "/etc/passwd", "a/../../b"}) {
        Image img;
        img.add(Layer().file("ok", "fine").file(bad, "evil"));
        auto r = img.convert();
        REQUIRE_FALSE(r.ok());
        INFO(r.error().message);
        CHECK(contains(r.error().message, "converting layer sha256:"));
        CHECK(contains(r.error().message, "entry '" + bad + "'"));
        CHECK(contains(r.error().message, "escapes the image root"));
        CHECK_FALSE(fs::exists(img.out()));
    }
}

TEST_CASE("truncated or corrupt compressed layers fail cleanly") {
    Layer l;
    std::string data(300000, 'a');
    for (size_t i = 0; i < data.size(); i += 7) data[i] = static_cast<char>(i);
    l.file("f", data);
    SECTION("truncated gzip") {
        Image img;
        img.add(l, Comp::gzip);
        fs::resize_file(img.layers[0].path, fs::file_size(img.layers[0].path) / 2);
        auto r = img.convert();
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.error().message, "gzip"));
        CHECK_FALSE(fs::exists(img.out()));
    }
    SECTION("gzip with a bad CRC") {
        Image img;
        img.add(l, Comp::gzip);
        std::string bytes = read_file(img.layers[0].path);
        bytes[bytes.size() - 6] ^= 0x55;  // inside the CRC32 trailer
        write_file(img.layers[0].path, bytes);
        auto r = img.convert();
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.error().message, "corrupt gzip data"));
        CHECK_FALSE(fs::exists(img.out()));
    }
    SECTION("truncated zstd") {
        Image img;
        img.add(l, Comp::zstd);
        fs::resize_file(img.layers[0].path, fs::file_size(img.layers[0].path) - 3);
        auto r = img.convert();
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.error().message, "zstd"));
        CHECK_FALSE(fs::exists(img.out()));
    }
    SECTION("gzip media type on a plain tar") {
        Image img;
        img.add(l, Comp::plain);
        img.layers[0].media_type = "application/vnd.oci.image.layer.v1.tar+gzip";
        auto r = img.convert();
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.error().message, "no gzip header"));
    }
}

TEST_CASE("limits: a layer of zeros expanding past max_layer_bytes stops the conversion; at the limit it passes") {
    // 8 MiB of zeros: a few KiB of gzip or zstd.
    const std::string tar = Layer().file("zeros", std::string(8 << 20, '\0')).tar();
    for (Comp comp : {Comp::gzip, Comp::zstd}) {
        INFO((comp == Comp::gzip ? "gzip" : "zstd"));
        Image img;
        img.layers.push_back(blob_of_tar(img.tmp.path, tar, comp));
        CHECK(fs::file_size(img.layers[0].path) < 100000);
        SquashfsOptions opt;
        opt.limits.max_layer_bytes = 1 << 20;
        auto r = img.convert(opt);
        REQUIRE_FALSE(r.ok());
        INFO(r.error().message);
        // The decoder or, when it is not that far ahead yet, the file's header stops it.
        CHECK(contains(r.error().message, "converting layer " + img.layers[0].digest + ": "));
        CHECK(contains(r.error().message,
                       "expands beyond max_layer_bytes = 1048576 (1.0 MiB) uncompressed; raise "
                       "max_layer_bytes in gantry.conf if the image is genuine"));
        CHECK(r.error().message.find('\n') == std::string::npos);
        REQUIRE(img.breach);
        CHECK(img.breach->layer == 0);
        CHECK(img.breach->limit == "max_layer_bytes");
        CHECK_FALSE(fs::exists(img.out()));

        // The boundary: the whole uncompressed stream (tar with its record padding) counts.
        opt.limits.max_layer_bytes = tar.size() - 1;
        r = img.convert(opt);
        REQUIRE_FALSE(r.ok());
        CHECK(img.breach);
        CHECK_FALSE(fs::exists(img.out()));
        opt.limits.max_layer_bytes = tar.size();
        r = img.convert(opt);
        INFO((r.ok() ? std::string() : r.error().message));
        REQUIRE(r.ok());
        CHECK(r->uncompressed_bytes == tar.size());
        CHECK_FALSE(img.breach);
        CHECK(fs::exists(img.out()));
    }
}

TEST_CASE("limits: max_layer_ratio bounds what a small compressed layer decompresses to; at the limit it passes") {
    // 8 MiB of zeros: a few KiB of gzip or zstd, a ratio in the thousands.
    const std::string tar = Layer().file("zeros", std::string(8 << 20, '\0')).tar();
    for (Comp comp : {Comp::gzip, Comp::zstd}) {
        INFO((comp == Comp::gzip ? "gzip" : "zstd"));
        Image img;
        img.layers.push_back(blob_of_tar(img.tmp.path, tar, comp));
        const uint64_t compressed = fs::file_size(img.layers[0].path);
        const uint64_t needed = (tar.size() + compressed - 1) / compressed;  // the least ratio that fits
        REQUIRE(needed > 1);
        // The defaults (1000, and 1 GiB for any layer) let it through.
        REQUIRE(img.convert().ok());
        fs::remove(img.out());

        SquashfsOptions opt;
        opt.limits.ratio_floor_bytes = 1;
        opt.limits.max_layer_ratio = needed - 1;
        auto r = img.convert(opt);
        REQUIRE_FALSE(r.ok());
        INFO(r.error().message);
        CHECK(contains(r.error().message, "converting layer " + img.layers[0].digest +
                                              ": expands beyond max_layer_ratio = " + std::to_string(needed - 1) +
                                              " times its compressed size of "));
        CHECK(contains(r.error().message,
                       " uncompressed (a decompression bomb?); raise max_layer_ratio in gantry.conf "
                       "if the image is genuine"));
        REQUIRE(img.breach);
        CHECK(img.breach->limit == "max_layer_ratio");
        CHECK_FALSE(fs::exists(img.out()));
        opt.limits.max_layer_ratio = needed;
        r = img.convert(opt);
        INFO((r.ok() ? std::string() : r.error().message));
        REQUIRE(r.ok());
        CHECK_FALSE(img.breach);
        fs::remove(img.out());

        // The floor every layer may expand to, at its boundary: the whole stream counts.
        opt.limits.max_layer_ratio = 1;
        opt.limits.ratio_floor_bytes = tar.size() - 1;
        r = img.convert(opt);
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.error().message, ", and past the "));
        REQUIRE(img.breach);
        CHECK(img.breach->limit == "max_layer_ratio");
        opt.limits.ratio_floor_bytes = tar.size();
        REQUIRE(img.convert(opt).ok());
    }
    // A plain tar is its own size: ratio 1 with no floor passes.
    Image plain;
    plain.layers.push_back(blob_of_tar(plain.tmp.path, tar, Comp::plain));
    SquashfsOptions opt;
    opt.limits.max_layer_ratio = 1;
    opt.limits.ratio_floor_bytes = 1;
    REQUIRE(plain.convert(opt).ok());
}

TEST_CASE("limits: zeros hidden after the tar's end count too") {
    // libarchive stops at the end-of-archive blocks; the rest of the stream is drained for the
    // diff_id, and a bomb there must not be drained without limit.
    const std::string tar = Layer().file("a", "a").tar();
    const std::string padded = tar + std::string(4 << 20, '\0');
    Image img;
    img.layers.push_back(blob_of_tar(img.tmp.path, padded, Comp::zstd));
    SquashfsOptions opt;
    opt.limits.max_layer_bytes = padded.size() - 1;
    auto r = img.convert(opt);
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "expands beyond max_layer_bytes"));
    CHECK(img.breach);
    CHECK_FALSE(fs::exists(img.out()));
    opt.limits.max_layer_bytes = padded.size();
    REQUIRE(img.convert(opt).ok());
}

TEST_CASE("limits: a sparse file counts at its full size") {
    // pax sparse: 64 MiB declared, one 4 KiB data region, so the tar stays small.
    constexpr int64_t kSize = 64 << 20;
    archive* a = archive_write_new();
    archive_write_set_format_pax(a);
    std::string tar(1 << 20, '\0');
    size_t used = 0;
    archive_write_open_memory(a, tar.data(), tar.size(), &used);
    archive_entry* e = archive_entry_new();
    archive_entry_copy_pathname(e, "sparse");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, kSize);
    archive_entry_sparse_add_entry(e, 0, 4096);
    REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
    const std::string chunk(1 << 20, 'x');
    for (int64_t done = 0; done < kSize; done += static_cast<int64_t>(chunk.size()))
        REQUIRE(archive_write_data(a, chunk.data(), chunk.size()) == static_cast<la_ssize_t>(chunk.size()));
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
    tar.resize(used);
    REQUIRE(tar.size() < 100000);

    Image img;
    img.layers.push_back(blob_of_tar(img.tmp.path, tar, Comp::gzip));
    SquashfsOptions opt;
    opt.limits.max_layer_bytes = kSize - 1;
    auto r = img.convert(opt);
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message);
    CHECK(contains(r.error().message, "entry 'sparse': expands beyond max_layer_bytes = " + std::to_string(kSize - 1)));
    REQUIRE(img.breach);
    CHECK(img.breach->limit == "max_layer_bytes");
    CHECK_FALSE(fs::exists(img.out()));
    opt.limits.max_layer_bytes = kSize;
    REQUIRE(img.convert(opt).ok());
    Tree t = img.tree();
    CHECK(t["sparse"].content.size() == static_cast<size_t>(kSize));
    CHECK(t["sparse"].content.substr(0, 4096) == std::string(4096, 'x'));
    CHECK(t["sparse"].content[4096] == '\0');
}

TEST_CASE("limits: max_image_bytes counts all layers together") {
    const std::string bottom = Layer().file("b", std::string(100000, 'b')).tar();
    const std::string top = Layer().file("t", std::string(200000, 't')).tar();
    Image img;
    img.layers.push_back(blob_of_tar(img.tmp.path, bottom, Comp::gzip));
    img.layers.push_back(blob_of_tar(img.tmp.path, top, Comp::zstd));
    SquashfsOptions opt;
    opt.limits.max_layer_bytes = top.size();  // each layer alone fits
    opt.limits.max_image_bytes = bottom.size() + top.size() - 1;
    auto r = img.convert(opt);
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message);
    // Layers convert top-down: the bottom one is where the total runs over.
    CHECK(contains(r.error().message,
                   "converting layer " + img.layers[0].digest +
                       ": the image expands beyond max_image_bytes = " + std::to_string(opt.limits.max_image_bytes)));
    CHECK(contains(r.error().message, "raise max_image_bytes in gantry.conf"));
    REQUIRE(img.breach);
    CHECK(img.breach->layer == 0);
    CHECK(img.breach->limit == "max_image_bytes");
    CHECK_FALSE(fs::exists(img.out()));
    opt.limits.max_image_bytes = bottom.size() + top.size();
    auto ok = img.convert(opt);
    REQUIRE(ok.ok());
    CHECK(ok->uncompressed_bytes == bottom.size() + top.size());
}

TEST_CASE("limits: max_layer_entries counts every tar entry of a layer") {
    Image img;
    img.add(Layer().dir("d").file("d/a", "a").file("d/.wh.gone").symlink("l", "d/a").file("d/b", "b"), Comp::plain);
    SquashfsOptions opt;
    opt.limits.max_layer_entries = 4;
    auto r = img.convert(opt);
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message);
    CHECK(contains(r.error().message,
                   "converting layer " + img.layers[0].digest +
                       ": more tar entries than max_layer_entries = 4 allows; raise max_layer_entries"));
    REQUIRE(img.breach);
    CHECK(img.breach->limit == "max_layer_entries");
    CHECK_FALSE(fs::exists(img.out()));
    opt.limits.max_layer_entries = 5;
    REQUIRE(img.convert(opt).ok());
    CHECK(img.tree().count("d/b") == 1);
}

TEST_CASE("limits: path depth, name length and path length at their boundaries") {
    using gantry::kMaxNameBytes;
    using gantry::kMaxPathBytes;
    using gantry::kMaxPathDepth;
    using gantry::squashfs::split_entry_path;
    auto deep = [](size_t depth) {
        std::string p = "d";
        for (size_t i = 1; i < depth; ++i) p += "/d";
        return p;
    };
    std::string broken;
    CHECK(split_entry_path("./" + deep(kMaxPathDepth) + "/", &broken).ok());
    CHECK(split_entry_path(deep(kMaxPathDepth) + "/.wh..wh..opq", &broken).ok());  // the marker is not a level
    CHECK(broken.empty());
    auto too_deep = split_entry_path(deep(kMaxPathDepth + 1), &broken);
    REQUIRE_FALSE(too_deep.ok());
    CHECK(contains(too_deep.error().message, "deeper than 256 components"));
    CHECK(broken == "kMaxPathDepth");

    const std::string name(kMaxNameBytes, 'n');
    broken.clear();
    CHECK(split_entry_path("a/" + name, &broken).ok());
    CHECK(split_entry_path("a/.wh." + name, &broken).ok());  // the whiteout of a name of the limit
    CHECK(broken.empty());
    auto too_long_name = split_entry_path("a/" + name + "x", &broken);
    REQUIRE_FALSE(too_long_name.ok());
    CHECK(contains(too_long_name.error().message, "component of 256 bytes"));
    CHECK(broken == "kMaxNameBytes");

    // "/" + 20 x 200 bytes + 74 = 4095 bytes as the container sees it: fits PATH_MAX with its NUL.
    std::string path;
    for (int i = 0; i < 20; ++i) path += std::string(200, 'p') + "/";
    broken.clear();
    CHECK(split_entry_path(path + std::string(74, 'x'), &broken).ok());
    CHECK(broken.empty());
    CHECK(1 + path.size() + 74 + 1 == kMaxPathBytes);
    auto too_long_path = split_entry_path(path + std::string(75, 'x'), &broken);
    REQUIRE_FALSE(too_long_path.ok());
    CHECK(contains(too_long_path.error().message, "longer than 4095 bytes"));
    CHECK(broken == "kMaxPathBytes");

    // Through the converter: at the limits the image has the paths, past them the layer and the
    // (shortened) path are named.
    Image ok;
    ok.add(Layer().file(deep(kMaxPathDepth), "deep").file("a/" + name, "long").file(path + std::string(74, 'x'), "p"));
    REQUIRE(ok.convert().ok());
    for (const auto& [bad, limit] :
         std::vector<std::pair<std::string, std::string>>{{deep(kMaxPathDepth + 1), "kMaxPathDepth"},
                                                          {"a/" + name + "x", "kMaxNameBytes"},
                                                          {path + std::string(75, 'x'), "kMaxPathBytes"}}) {
        Image img;
        img.add(Layer().file("fine", "f").file(bad, "x"));
        auto r = img.convert();
        REQUIRE_FALSE(r.ok());
        INFO(r.error().message);
        CHECK(contains(r.error().message, "converting layer " + img.layers[0].digest + ": entry '" +
                                              bad.substr(0, 120) + "... (" + std::to_string(bad.size()) +
                                              " bytes)': "));
        CHECK(contains(r.error().message, limit));
        CHECK(r.error().message.size() < 500);
        REQUIRE(img.breach);
        CHECK(img.breach->limit == limit);
        CHECK_FALSE(fs::exists(img.out()));
    }
}

TEST_CASE("limits: a symlink target must fit PATH_MAX") {
    const std::string target(gantry::kMaxPathBytes - 1, 't');
    Image ok;
    ok.add(Layer().symlink("l", target));
    REQUIRE(ok.convert().ok());
    Image bad;
    bad.add(Layer().symlink("l", target + "t"));
    auto r = bad.convert();
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "entry 'l': a symlink target longer than 4095 bytes (kMaxPathBytes)"));
    REQUIRE(bad.breach);
    CHECK(bad.breach->limit == "kMaxPathBytes");
}

TEST_CASE("an existing output file is an error and is left alone") {
    Image img;
    img.add(Layer().file("a", "a"));
    write_file(img.out(), "precious");
    auto r = img.convert();
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "File exists"));
    CHECK(read_file(img.out()) == "precious");
}

TEST_CASE("wait_for is called top layer first and its error stops the conversion") {
    Image img;
    img.add(Layer().file("a", "a")).add(Layer().file("b", "b")).add(Layer().file("c", "c"));
    std::vector<size_t> order;
    auto ok = gantry::convert_layers(img.layers, img.out().string(), {}, [&](size_t i) -> gantry::Status {
        order.push_back(i);
        return {};
    });
    REQUIRE(ok.ok());
    CHECK(order == std::vector<size_t>{2, 1, 0});
    fs::remove(img.out());
    auto failed = gantry::convert_layers(img.layers, img.out().string(), {}, [&](size_t i) -> gantry::Status {
        if (i == 1) return gantry::make_error("download of blob 1 failed");
        return {};
    });
    REQUIRE_FALSE(failed.ok());
    CHECK(contains(failed.error().message, "download of blob 1 failed"));
    CHECK_FALSE(fs::exists(img.out()));
}

TEST_CASE("every compressor gives the same tree; output is reproducible") {
    Image img;
    std::string text;
    for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + "\n";
    img.add(Layer().dir("d").file("d/text", text).symlink("d/s", "text").file("d/small", "s"));
    Tree reference;
    for (const char* comp : {"zstd", "lz4", "gzip", "xz", "none"}) {
        INFO(comp);
        SquashfsOptions opt;
        opt.compressor = comp;
        opt.block_size = 65536;
        fs::remove(img.out());
        auto r = img.convert(opt);
        REQUIRE(r.ok());
        TempDir x;
        Tree t = unsquash(img.out(), x.path / "x");
        if (reference.empty()) reference = t;
        CHECK(t.size() == reference.size());
        CHECK(t["d/text"].content == text);
        CHECK(t["d/s"].target == "text");
        if (std::string(comp) == "none") CHECK(r->image_bytes > text.size());
        if (std::string(comp) == "zstd") CHECK(r->image_bytes < text.size() / 3);
    }
    SquashfsOptions opt;
    opt.threads = 2;
    fs::remove(img.out());
    REQUIRE(img.convert(opt).ok());
    const std::string first = read_file(img.out());
    fs::remove(img.out());
    REQUIRE(img.convert(opt).ok());
    CHECK(read_file(img.out()) == first);

    SquashfsOptions bad;
    bad.compressor = "brotli";
    fs::remove(img.out());
    CHECK_FALSE(img.convert(bad).ok());
    bad.compressor = "zstd";
    bad.block_size = 1000;
    CHECK_FALSE(img.convert(bad).ok());
}

TEST_CASE("the kernel mounts the image and sees the same tree", "[root]") {
    if (::geteuid() != 0) FAIL("needs root: a kernel (loop) mount; run `ctest -L root` as root");
    Image img;
    img.add(Layer()
                .dir("etc")
                .file("etc/a", "a", 04711)
                .hardlink("etc/b", "etc/a")
                .symlink("s", "/etc/a")
                .node("p", AE_IFIFO))
        .add(Layer().file("etc/.wh.zzz").file("etc/c", "c"));
    REQUIRE(img.convert().ok());
    fs::create_directory(img.tmp.path / "mnt");
    const std::string mnt = (img.tmp.path / "mnt").string();
    if (run("mount -t squashfs -o loop,ro '" + img.out().string() + "' '" + mnt + "' 2>/dev/null") != 0)
        FAIL("mount -t squashfs -o loop failed as root (no loop devices or no squashfs module here?)");
    Tree mounted = read_tree(mnt);
    run("umount '" + mnt + "'");
    Tree extracted = img.tree();
    REQUIRE(mounted.size() == extracted.size());
    for (auto& [path, e] : extracted) {
        INFO(path);
        REQUIRE(mounted.count(path) == 1);
        CHECK(mounted[path].type == e.type);
        CHECK(mounted[path].mode == e.mode);
        CHECK(mounted[path].content == e.content);
        CHECK(mounted[path].target == e.target);
    }
    CHECK(mounted["etc/a"].nlink == 2);
    CHECK(mounted["etc/a"].ino == mounted["etc/b"].ino);
    CHECK(mounted["etc/a"].mode == 04711);
}

TEST_CASE("overlay form: whiteouts become 0/0 character devices, hidden lower directories get the opaque xattr",
          "[root]") {
    REQUIRE(::geteuid() == 0);  // unsquashfs makes the device nodes and reads trusted.* xattrs
    TempDir tmp;
    Layer l;
    l.dir("etc").file("etc/.wh.gone");
    l.dir("opq").file("opq/.wh..wh..opq").file("opq/new", "n");
    l.file(".wh.wd").dir("wd").file("wd/x", "x");  // deleted and recreated in one layer
    l.file("a/b/.wh.c");                           // below directories the layer does not list
    l.node("dev", AE_IFCHR);                       // devices are never carried: deleted
    l.file("keep", "k").last().xattrs = {
        {"user.overlay.opaque", "y"}, {"trusted.overlay.redirect", "/x"}, {"user.note", "kept"}};
    const fs::path out = tmp.path / "layer.sqfs";
    auto r = gantry::convert_layer_for_overlay(blob(tmp.path, l), out.string(), {});
    REQUIRE(r.ok());
    CHECK(r->others == 3);
    Tree t = unsquash(out, tmp.path / "x");
    for (const char* w : {"etc/gone", "a/b/c", "dev"}) {
        INFO(w);
        CHECK(t[w].type == 'c');
        CHECK(t[w].rdev == 0);
    }
    CHECK(t["etc"].xattrs.empty());
    CHECK(t["opq"].xattrs == std::map<std::string, std::string>{{"trusted.overlay.opaque", "y"}});
    CHECK(t["opq/new"].content == "n");
    CHECK(t["wd"].xattrs.count("trusted.overlay.opaque") == 1);
    CHECK(t["wd/x"].content == "x");
    CHECK(t["a"].type == 'd');
    CHECK(t["a"].xattrs.empty());
    CHECK(t["a/b"].type == 'd');
    CHECK(t.count("etc/.wh.gone") == 0);
    CHECK(t.count("opq/.wh..wh..opq") == 0);
    // The layer's own overlay xattrs would be markers of its author's choosing: dropped.
    CHECK(t["keep"].xattrs == std::map<std::string, std::string>{{"user.note", "kept"}});

    // For an overlay mounted with userxattr (a user namespace): the user.* name.
    const fs::path out_user = tmp.path / "layer-user.sqfs";
    REQUIRE(gantry::convert_layer_for_overlay(blob(tmp.path, l), out_user.string(), {}, "user.overlay.opaque").ok());
    Tree u = unsquash(out_user, tmp.path / "y");
    CHECK(u["opq"].xattrs == std::map<std::string, std::string>{{"user.overlay.opaque", "y"}});
}

namespace {

// Three layers with every kind of change (whiteouts, an opaque directory, type changes both ways,
// a whited-out and recreated directory, a deleted subtree, a device, hard links, xattrs).
void add_overlay_test_layers(Image& img) {
    // Every layer lists the directories it changes (as image builders do): a directory the layer
    // has no entry for would show root-owned 0755 in place of the lower one (see squashfs.hpp).
    Layer lower = changes_lower();
    lower.dir("deep").dir("deep/a").dir("deep/a/b").file("deep/a/b/f", "f");
    lower.file("linked", "one inode", 0600).hardlink("linked2", "linked");
    lower.symlink("sym", "etc/keep").node("fifo", AE_IFIFO);
    img.add(lower, Comp::plain)
        .add(Layer()
                 .dir("etc")
                 .file("etc/.wh.gone")
                 .file("etc/new", "new", 0640)
                 .dir("opq")
                 .file("opq/.wh..wh..opq")
                 .file("opq/upper", "upper")
                 .file("d2f", "now a file")
                 .dir("f2d")
                 .file("f2d/inside", "now a dir")
                 .file(".wh.wd")
                 .dir("wd")
                 .file("wd/new", "new")
                 .dir("deep")
                 .dir("deep/a")
                 .file("deep/a/.wh.b"),
             Comp::zstd);
    Layer top;
    top.dir("etc").file("etc/keep", "replaced", 0600).node("etc/tty", AE_IFCHR);
    top.file(".wh.sym").file(".wh.fifo");
    top.dir("xa").file("xa/f", "x").last().xattrs = {{"user.comment", "kept"}};
    img.add(top, Comp::gzip);
}

// `got` must be `want` entry for entry.
void check_same_tree(Tree& want, Tree& got) {
    CHECK(got.size() == want.size());
    for (auto& [path, e] : want) {
        INFO(path);
        REQUIRE(got.count(path) == 1);
        const Entry& o = got[path];
        CHECK(o.type == e.type);
        CHECK(o.mode == e.mode);
        CHECK(o.uid == e.uid);
        CHECK(o.gid == e.gid);
        CHECK(o.mtime == e.mtime);
        CHECK(o.content == e.content);
        CHECK(o.target == e.target);
        CHECK(o.xattrs == e.xattrs);
        if (e.type == 'f') CHECK(o.nlink == e.nlink);
    }
    for (auto& [path, o] : got) {
        INFO(path);
        CHECK(want.count(path) == 1);
    }
}

}  // namespace

TEST_CASE("overlay form refuses every hostile layer convert_layers refuses, with the same words, writing nothing") {
    // The layered pull converts each layer with convert_layer_for_overlay: it must stop the same
    // attacks as the whole-image converter (issue #19: "every hostile-layer case stays refused").
    struct Case {
        std::string name, words;
        std::function<void(Image&, SquashfsOptions&)> make;
    };
    std::string zeros_data(300000, 'a');
    for (size_t i = 0; i < zeros_data.size(); i += 7) zeros_data[i] = static_cast<char>(i);
    const std::vector<Case> cases = {
        {"../ escape", "escapes the image root",
         [](Image& img, SquashfsOptions&) { img.add(Layer().file("ok", "fine").file("../escape", "evil")); }},
        {"absolute name", "escapes the image root",
         [](Image& img, SquashfsOptions&) { img.add(Layer().file("/etc/passwd", "evil")); }},
        {"a/../../b", "escapes the image root",
         [](Image& img, SquashfsOptions&) { img.add(Layer().file("a/../../b", "evil")); }},
        {"a whiteout name as a directory", "a whiteout name (.wh.*) used as a directory",
         [](Image& img, SquashfsOptions&) { img.add(Layer().file(".wh.x/y", "evil")); }},
        {"diff_id mismatch", "image config says",
         [](Image& img, SquashfsOptions&) {
             img.add(Layer().file("a", "a"));
             img.layers[0].diff_id = gantry::Sha256::of("something else");
         }},
        {"truncated gzip", "gzip",
         [&](Image& img, SquashfsOptions&) {
             img.add(Layer().file("f", zeros_data), Comp::gzip);
             fs::resize_file(img.layers[0].path, fs::file_size(img.layers[0].path) / 2);
         }},
        {"truncated zstd", "zstd",
         [&](Image& img, SquashfsOptions&) {
             img.add(Layer().file("f", zeros_data), Comp::zstd);
             fs::resize_file(img.layers[0].path, fs::file_size(img.layers[0].path) - 3);
         }},
        {"a decompression bomb", "expands beyond max_layer_bytes = 1048576",
         [](Image& img, SquashfsOptions& opt) {
             img.layers.push_back(
                 blob_of_tar(img.tmp.path, Layer().file("zeros", std::string(8 << 20, '\0')).tar(), Comp::zstd));
             opt.limits.max_layer_bytes = 1 << 20;
         }},
        {"too many entries", "more tar entries than max_layer_entries = 2 allows",
         [](Image& img, SquashfsOptions& opt) {
             img.add(Layer().file("a", "a").file("b", "b").file("c", "c"), Comp::plain);
             opt.limits.max_layer_entries = 2;
         }},
        {"a symlink target beyond PATH_MAX", "a symlink target longer than 4095 bytes",
         [](Image& img, SquashfsOptions&) { img.add(Layer().symlink("l", std::string(gantry::kMaxPathBytes, 't'))); }},
    };
    for (const auto& c : cases) {
        INFO(c.name);
        Image img;
        SquashfsOptions opt;
        c.make(img, opt);
        auto whole = img.convert(opt);
        REQUIRE_FALSE(whole.ok());
        CHECK(contains(whole.error().message, c.words));
        const fs::path out = img.tmp.path / "overlay.sqfs";
        auto layer = gantry::convert_layer_for_overlay(img.layers[0], out.string(), opt, gantry::kOverlayOpaqueXattr);
        REQUIRE_FALSE(layer.ok());
        INFO(layer.error().message);
        CHECK(contains(layer.error().message, c.words));
        CHECK(contains(layer.error().message, "converting layer " + img.layers[0].digest));
        CHECK(layer.error().message.find('\n') == std::string::npos);
        CHECK_FALSE(fs::exists(out));
    }
}

TEST_CASE("compose: the layers in overlay form, composed into one file, give the tree convert_layers merges") {
    Image img;
    add_overlay_test_layers(img);
    REQUIRE(img.convert().ok());
    Tree whole = img.tree();
    std::vector<std::string> layer_files;
    for (size_t i = 0; i < img.layers.size(); ++i) {
        const fs::path file = img.tmp.path / ("layer" + std::to_string(i) + ".sqfs");
        REQUIRE(gantry::convert_layer_for_overlay(img.layers[i], file.string(), {}, gantry::kOverlayOpaqueXattr).ok());
        layer_files.push_back(file.string());
    }
    const fs::path composed = img.tmp.path / "composed.sqfs";
    auto r = gantry::compose_layers_to_image(layer_files, composed.string(), {}, {}, gantry::kOverlayOpaqueXattr);
    REQUIRE(r.ok());
    Tree got = unsquash(composed, img.tmp.path / "composed");
    check_same_tree(whole, got);

    // Added files win their paths; one layer alone is that layer without its markers.
    const fs::path with_rc = img.tmp.path / "with-rc.sqfs";
    REQUIRE(gantry::compose_layers_to_image(layer_files, with_rc.string(), {{"/etc/keep", "exported", 0755}}, {},
                                            gantry::kOverlayOpaqueXattr)
                .ok());
    Tree rc = unsquash(with_rc, img.tmp.path / "with-rc");
    CHECK(rc["etc/keep"].content == "exported");
    CHECK(rc["etc/keep"].mode == 0755);
    const fs::path bottom = img.tmp.path / "bottom.sqfs";
    REQUIRE(
        gantry::compose_layers_to_image({layer_files[0]}, bottom.string(), {}, {}, gantry::kOverlayOpaqueXattr).ok());
    Tree lone = unsquash(bottom, img.tmp.path / "bottom");
    for (auto& [path, e] : lone) {
        INFO(path);
        CHECK(e.type != 'c');
        for (auto& [key, value] : e.xattrs) CHECK(key != gantry::kOverlayOpaqueXattr);
    }
    CHECK_FALSE(
        gantry::compose_layers_to_image({}, (img.tmp.path / "none.sqfs").string(), {}, {}, gantry::kOverlayOpaqueXattr)
            .ok());
}

TEST_CASE("groups: layers composed into one overlay-form layer stack like the layers one by one") {
    Image img;
    add_overlay_test_layers(img);
    REQUIRE(img.convert().ok());
    Tree whole = img.tree();
    REQUIRE(img.layers.size() == 3);
    std::vector<std::string> files;
    for (size_t i = 0; i < img.layers.size(); ++i) {
        const fs::path file = img.tmp.path / ("layer" + std::to_string(i) + ".sqfs");
        REQUIRE(gantry::convert_layer_for_overlay(img.layers[i], file.string(), {}, gantry::kOverlayOpaqueXattr).ok());
        files.push_back(file.string());
    }
    auto group = [&](const std::vector<std::string>& members, const std::string& name) {
        const fs::path out = img.tmp.path / name;
        auto r = gantry::compose_layers_for_overlay(members, out.string(), {}, gantry::kOverlayOpaqueXattr);
        REQUIRE(r.ok());
        return out.string();
    };
    auto stacked = [&](const std::vector<std::string>& lowers, const std::string& name) {
        const fs::path out = img.tmp.path / name;
        REQUIRE(gantry::compose_layers_to_image(lowers, out.string(), {}, {}, gantry::kOverlayOpaqueXattr).ok());
        return unsquash(out, img.tmp.path / (name + ".d"));
    };
    // The top two as a group over the bottom one, the bottom two as a group under the top one, all
    // three as one: each stack composes to the tree the layers one by one give.
    const std::string top2 = group({files[1], files[2]}, "group12.sqfs");
    const std::string bottom2 = group({files[0], files[1]}, "group01.sqfs");
    const std::string all3 = group(files, "group012.sqfs");
    {
        INFO("layer 0 + group(1, 2)");
        Tree got = stacked({files[0], top2}, "s1.sqfs");
        check_same_tree(whole, got);
    }
    {
        INFO("group(0, 1) + layer 2");
        Tree got = stacked({bottom2, files[2]}, "s2.sqfs");
        check_same_tree(whole, got);
    }
    {
        INFO("group(0, 1, 2)");
        Tree got = stacked({all3}, "s3.sqfs");
        check_same_tree(whole, got);
    }
    // The group keeps its markers: the top two layers' whiteouts of lower paths are devices 0/0
    // in it, and the directories they make opaque carry the marker.
    Tree g = unsquash(fs::path(top2), img.tmp.path / "group12.d");
    size_t whiteouts = 0, opaque = 0;
    for (auto& [path, e] : g) {
        if (e.type == 'c') ++whiteouts;
        for (auto& [key, value] : e.xattrs)
            if (key == gantry::kOverlayOpaqueXattr && value == "y") ++opaque;
    }
    CHECK(whiteouts > 0);
    CHECK(opaque > 0);
    CHECK_FALSE(
        gantry::compose_layers_for_overlay({}, (img.tmp.path / "none.sqfs").string(), {}, gantry::kOverlayOpaqueXattr)
            .ok());
}

TEST_CASE("overlay form: overlayfs over each layer's image shows the tree convert_layers merges", "[root]") {
    REQUIRE(::geteuid() == 0);  // loop and overlay mounts
    Image img;
    add_overlay_test_layers(img);
    REQUIRE(img.convert().ok());
    Tree whole = img.tree();
    CHECK(whole.count("etc/tty") == 0);
    CHECK(whole.count("deep/a/b") == 0);

    for (const std::string opaque : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
        INFO(opaque);
        const fs::path dir = img.tmp.path / opaque;
        fs::create_directories(dir / "merged");
        std::vector<std::string> mounts;  // unmounted in reverse order, also when a check fails
        gantry::Defer unmount([&] {
            for (auto it = mounts.rbegin(); it != mounts.rend(); ++it) run("umount '" + *it + "' 2>/dev/null");
        });
        std::string lowerdir;  // top layer first
        for (size_t i = 0; i < img.layers.size(); ++i) {
            const fs::path image = dir / ("layer" + std::to_string(i) + ".sqfs");
            const fs::path mnt = dir / ("layer" + std::to_string(i));
            REQUIRE(gantry::convert_layer_for_overlay(img.layers[i], image.string(), {}, opaque).ok());
            fs::create_directory(mnt);
            REQUIRE(run("mount -t squashfs -o loop,ro '" + image.string() + "' '" + mnt.string() + "'") == 0);
            mounts.push_back(mnt.string());
            lowerdir = mnt.string() + (lowerdir.empty() ? "" : ":" + lowerdir);
        }
        const std::string merged = (dir / "merged").string();
        const std::string options = "ro,lowerdir=" + lowerdir + (opaque.rfind("user.", 0) == 0 ? ",userxattr" : "");
        REQUIRE(run("mount -t overlay overlay -o '" + options + "' '" + merged + "'") == 0);
        mounts.push_back(merged);
        Tree stacked = read_tree(merged);
        check_same_tree(whole, stacked);

        // The top two layers as one group (compose_layers_for_overlay) over the bottom layer: the
        // kernel shows the same tree.
        const fs::path group = dir / "group12.sqfs";
        const fs::path group_mnt = dir / "group12";
        REQUIRE(gantry::compose_layers_for_overlay({(dir / "layer1.sqfs").string(), (dir / "layer2.sqfs").string()},
                                                   group.string(), {}, opaque)
                    .ok());
        fs::create_directories(group_mnt);
        REQUIRE(run("mount -t squashfs -o loop,ro '" + group.string() + "' '" + group_mnt.string() + "'") == 0);
        mounts.push_back(group_mnt.string());
        fs::create_directories(dir / "merged-group");
        const std::string merged_group = (dir / "merged-group").string();
        REQUIRE(run("mount -t overlay overlay -o 'ro,lowerdir=" + group_mnt.string() + ":" + (dir / "layer0").string() +
                    (opaque.rfind("user.", 0) == 0 ? ",userxattr" : "") + "' '" + merged_group + "'") == 0);
        mounts.push_back(merged_group);
        INFO("layer 0 + group(1, 2) under overlayfs");
        Tree got = read_tree(merged_group);
        check_same_tree(whole, got);
    }
}

// Not a test: `unit_squashfs "[.driver]"` converts the layers named in GANTRY_SQFS_LAYERS
// ("path|mediatype|diffid,..." bottom first; diffid may be empty) into GANTRY_SQFS_OUT, with optional
// GANTRY_SQFS_COMPRESSOR, GANTRY_SQFS_LEVEL, GANTRY_SQFS_BLOCK_SIZE, GANTRY_SQFS_THREADS. Used by
// tests/integration/squashfs.bats and the benchmark until `gantry pull` exists.
TEST_CASE("driver", "[.driver]") {
    const char* layers = std::getenv("GANTRY_SQFS_LAYERS");
    const char* out = std::getenv("GANTRY_SQFS_OUT");
    REQUIRE(layers != nullptr);
    REQUIRE(out != nullptr);
    std::vector<LayerBlob> blobs;
    std::stringstream list(layers);
    std::string item;
    while (std::getline(list, item, ',')) {
        if (item.empty()) continue;
        std::stringstream parts(item);
        LayerBlob b;
        std::getline(parts, b.path, '|');
        std::getline(parts, b.media_type, '|');
        std::getline(parts, b.diff_id, '|');
        b.digest = fs::path(b.path).filename().string();
        blobs.push_back(b);
    }
    SquashfsOptions opt;
    if (const char* c = std::getenv("GANTRY_SQFS_COMPRESSOR")) opt.compressor = c;
    if (const char* v = std::getenv("GANTRY_SQFS_LEVEL")) opt.level = std::atoi(v);
    if (const char* v = std::getenv("GANTRY_SQFS_BLOCK_SIZE")) opt.block_size = static_cast<uint32_t>(std::atol(v));
    if (const char* v = std::getenv("GANTRY_SQFS_THREADS")) opt.threads = static_cast<unsigned>(std::atoi(v));
    auto r = gantry::convert_layers(blobs, out, opt);
    if (!r.ok()) {
        std::fprintf(stderr, "gantry: %s\n", r.error().message.c_str());  // one line, for scripts to match
        FAIL(r.error().message);
    }
    std::printf(
        "files=%llu dirs=%llu symlinks=%llu hardlinks=%llu others=%llu shadowed=%llu tar_bytes=%llu image_bytes=%llu\n",
        static_cast<unsigned long long>(r->files), static_cast<unsigned long long>(r->directories),
        static_cast<unsigned long long>(r->symlinks), static_cast<unsigned long long>(r->hardlinks),
        static_cast<unsigned long long>(r->others), static_cast<unsigned long long>(r->shadowed_entries),
        static_cast<unsigned long long>(r->uncompressed_bytes), static_cast<unsigned long long>(r->image_bytes));
}
