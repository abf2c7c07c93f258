// Unit tests for the local image sources of `gantry import` (runtime/local): source names, archive
// member names, the streaming archive reader (content-addressed members, links, traversal refused),
// docker-archive and OCI layout reading with every digest checked. The archives are written with
// libarchive's tar writer and the digests computed independently with OpenSSL through Sha256.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/local_image.hpp"

using namespace gantry;
using nlohmann::json;

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/gantry-local-test.XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() { (void)remove_tree(path); }
};

struct Member {
    std::string name;
    std::string content;        // regular file data
    std::string symlink = {};   // non-empty: a symlink to this
    std::string hardlink = {};  // non-empty: a hard link to this member
};

// A ustar/pax archive of `members`, written by libarchive.
std::string make_tar(const std::vector<Member>& members) {
    archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    std::vector<char> buf(1 << 22);
    size_t used = 0;
    REQUIRE(archive_write_open_memory(a, buf.data(), buf.size(), &used) == ARCHIVE_OK);
    for (const auto& m : members) {
        archive_entry* e = archive_entry_new();
        archive_entry_set_pathname(e, m.name.c_str());
        archive_entry_set_perm(e, 0644);
        if (!m.symlink.empty()) {
            archive_entry_set_filetype(e, AE_IFLNK);
            archive_entry_set_symlink(e, m.symlink.c_str());
        } else if (!m.hardlink.empty()) {
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_hardlink(e, m.hardlink.c_str());
        } else {
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_size(e, static_cast<la_int64_t>(m.content.size()));
        }
        REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
        if (m.symlink.empty() && m.hardlink.empty() && !m.content.empty())
            REQUIRE(archive_write_data(a, m.content.data(), m.content.size()) ==
                    static_cast<la_ssize_t>(m.content.size()));
        archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return std::string(buf.data(), used);
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary);
    f << bytes;
}

Result<ExtractedArchive> extract(const TempDir& t, const std::string& tar_bytes) {
    write_bytes(t.path + "/in.tar", tar_bytes);
    (void)make_directories(t.path + "/out", 0700);
    int fd = ::open((t.path + "/in.tar").c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    auto r = extract_archive(fd, "test.tar", t.path + "/out", uint64_t{1} << 30);
    ::close(fd);
    return r;
}

// A one-file layer and a config naming it: the pieces both archive kinds are made of.
struct TinyImage {
    std::string layer = make_tar({{"hello.txt", "hello\n"}});
    std::string diff_id = Sha256::of(layer);
    std::string config = json{{"architecture", "amd64"},
                              {"os", "linux"},
                              {"config", {{"Env", {"PATH=/bin"}}}},
                              {"rootfs", {{"type", "layers"}, {"diff_ids", {Sha256::of(layer)}}}}}
                             .dump();
};

}  // namespace

TEST_CASE("local sources: the five forms and the errors for the rest", "[local]") {
    auto s = parse_local_source("oci:/data/layout:v1");
    REQUIRE(s.ok());
    CHECK(s->kind == LocalSource::Kind::oci_dir);
    CHECK(s->path == "/data/layout");
    CHECK(s->tag == "v1");
    s = parse_local_source("docker-archive:/x/img.tar:team/app:2.0");
    REQUIRE(s.ok());
    CHECK(s->kind == LocalSource::Kind::docker_archive);
    CHECK(s->path == "/x/img.tar");
    CHECK(s->tag == "team/app:2.0");
    s = parse_local_source("oci-archive:rel.tar");
    REQUIRE(s.ok());
    CHECK(s->path.front() == '/');  // made absolute
    CHECK(s->tag.empty());
    s = parse_local_source("dockerd://nvcr.io/nvidia/pytorch:24.05");
    REQUIRE(s.ok());
    CHECK(s->kind == LocalSource::Kind::dockerd);
    CHECK(s->path == "nvcr.io/nvidia/pytorch:24.05");
    CHECK(parse_local_source("podman://app").ok());
    for (const char* bad : {"tar:/x", "oci:", "oci:/x:", "dockerd://", "/plain/path.tar", "docker://x"}) {
        auto r = parse_local_source(bad);
        INFO(bad);
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("import:") == 0);
    }
}

TEST_CASE("archive member names: canonical form; absolute names and '..' leave the archive", "[local]") {
    CHECK(*normalize_member_name("./a//b/") == "a/b");
    CHECK(*normalize_member_name("manifest.json") == "manifest.json");
    CHECK(*normalize_member_name("a/./b") == "a/b");
    for (const char* bad : {"/etc/passwd", "../x", "a/../../x", "a/..", "", "./"}) {
        auto r = normalize_member_name(bad);
        INFO(bad);
        REQUIRE_FALSE(r.ok());
    }
    CHECK(normalize_member_name("../x").error().message.find("leaves the archive") != std::string::npos);
    CHECK_FALSE(normalize_member_name(std::string(5000, 'a')).ok());
}

TEST_CASE("extract_archive: members stored under their sha256, links resolved", "[local]") {
    TempDir t;
    auto r = extract(t, make_tar({{"./dir/a.txt", "alpha"},
                                  {"b.txt", "beta"},
                                  {"dir/link", "", "a.txt"},
                                  {"hard", "", "", "b.txt"},
                                  {"dir/up", "", "../b.txt"}}));
    REQUIRE(r.ok());
    auto a = r->find("dir/a.txt");
    REQUIRE(a.ok());
    CHECK(a->digest == Sha256::of("alpha"));
    CHECK(a->path == t.path + "/out/" + digest_hex(Sha256::of("alpha")));
    CHECK(*read_file(a->path) == "alpha");
    CHECK(r->find("dir/link")->digest == Sha256::of("alpha"));
    CHECK(r->find("./dir/up")->digest == Sha256::of("beta"));
    CHECK(r->find("hard")->digest == Sha256::of("beta"));
    CHECK(r->bytes == 9);
    auto missing = r->find("nope");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message == "the archive has no file nope");
    // Nothing but the two blobs was written: member names never became paths.
    auto names = list_directory(*Directory::open(t.path + "/out"));
    REQUIRE(names.ok());
    CHECK(names->size() == 2);
}

TEST_CASE("extract_archive refuses traversal, links out of the archive, garbage and too many bytes", "[local]") {
    {
        TempDir t;
        auto r = extract(t, make_tar({{"ok", "x"}, {"../../etc/evil", "boom"}}));
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("leaves the archive") != std::string::npos);
        CHECK(r.error().message.find("test.tar") != std::string::npos);
        CHECK_FALSE(std::ifstream(t.path + "/etc/evil").good());
    }
    {
        TempDir t;
        auto r = extract(t, make_tar({{"/abs", "x"}}));
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("absolute") != std::string::npos);
    }
    {
        TempDir t;
        auto r = extract(t, make_tar({{"a/link", "", "../../outside"}}));
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("outside the archive") != std::string::npos);
    }
    {
        TempDir t;
        auto r = extract(t, make_tar({{"l", "", "/etc/passwd"}}));
        REQUIRE_FALSE(r.ok());
    }
    {
        TempDir t;
        auto r = extract(t, std::string(4096, 'z'));
        REQUIRE_FALSE(r.ok());
        INFO(r.error().message);
        CHECK(r.error().message.find("not a valid tar archive") != std::string::npos);
    }
    {
        TempDir t;
        write_bytes(t.path + "/in.tar", make_tar({{"big", std::string(1000, 'b')}}));
        (void)make_directories(t.path + "/out", 0700);
        int fd = ::open((t.path + "/in.tar").c_str(), O_RDONLY | O_CLOEXEC);
        auto r = extract_archive(fd, "test.tar", t.path + "/out", 999);
        ::close(fd);
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find("max_image_bytes") != std::string::npos);
        CHECK(list_directory(*Directory::open(t.path + "/out"))->empty());  // the partial member is gone
    }
}

TEST_CASE("docker-archive: config digest of its bytes, layers checked against diff_ids, one manifest per archive",
          "[local]") {
    TinyImage img;
    const std::string layer_name = digest_hex(img.diff_id) + ".tar";
    const std::string config_name = digest_hex(Sha256::of(img.config)) + ".json";
    json manifest =
        json::array({{{"Config", config_name}, {"RepoTags", {"example.com/team/tiny:1"}}, {"Layers", {layer_name}}}});
    TempDir t;
    auto ar =
        extract(t, make_tar({{layer_name, img.layer}, {config_name, img.config}, {"manifest.json", manifest.dump()}}));
    REQUIRE(ar.ok());
    auto image = read_docker_archive(ar->lookup(), "docker-archive:x", "");
    REQUIRE(image.ok());
    CHECK(image->config_digest == Sha256::of(img.config));
    CHECK(image->config_json == img.config);
    REQUIRE(image->blobs.size() == 1);
    CHECK(image->blobs[0].diff_id == img.diff_id);
    CHECK(image->layers[0].media_type == "application/vnd.docker.image.rootfs.diff.tar");
    CHECK(image->repo_tags == std::vector<std::string>{"example.com/team/tiny:1"});
    CHECK(image->platform == "linux/amd64");
    CHECK(image->manifest_digest == Sha256::of(image->manifest_json));
    auto parsed = parse_manifest(image->manifest_json, "");
    REQUIRE(parsed.ok());
    CHECK(parsed->config.digest == image->config_digest);
    CHECK(parsed->layers[0].digest == img.diff_id);
    // The same archive always gives the same digest.
    CHECK(read_docker_archive(ar->lookup(), "docker-archive:x", "")->manifest_digest == image->manifest_digest);
    // Picking by RepoTags.
    CHECK(read_docker_archive(ar->lookup(), "docker-archive:x", "example.com/team/tiny:1").ok());
    auto wrong = read_docker_archive(ar->lookup(), "docker-archive:x", "other:2");
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.error().message.find("example.com/team/tiny:1") != std::string::npos);
}

TEST_CASE("docker-archive: a layer that does not hash to its diff_id is refused before conversion", "[local]") {
    TinyImage img;
    std::string corrupt = img.layer;
    corrupt[600] ^= 0x01;  // a byte of the file's data
    json manifest = json::array({{{"Config", "c.json"}, {"Layers", {"l.tar"}}}});
    TempDir t;
    auto ar = extract(t, make_tar({{"l.tar", corrupt}, {"c.json", img.config}, {"manifest.json", manifest.dump()}}));
    REQUIRE(ar.ok());
    auto image = read_docker_archive(ar->lookup(), "docker-archive:x", "");
    REQUIRE_FALSE(image.ok());
    CHECK(image.error().message.find("diff_id") != std::string::npos);
    CHECK(image.error().message.find(img.diff_id) != std::string::npos);
}

TEST_CASE("docker-archive: malformed manifest.json, missing files, several images", "[local]") {
    TinyImage img;
    auto read = [&](const std::vector<Member>& members, const std::string& tag = "") {
        TempDir t;
        auto ar = extract(t, make_tar(members));
        REQUIRE(ar.ok());
        return read_docker_archive(ar->lookup(), "docker-archive:x", tag);
    };
    auto r = read({{"c.json", img.config}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("not a docker-archive") != std::string::npos);
    r = read({{"manifest.json", "{not json"}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("not a JSON array") != std::string::npos);
    r = read({{"manifest.json", R"([{"Config":"c.json","Layers":["missing.tar"]}])"}, {"c.json", img.config}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("missing.tar") != std::string::npos);
    r = read({{"manifest.json", R"([{"Config":"c.json","Layers":[]}])"}, {"c.json", img.config}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("layers") != std::string::npos);
    r = read(
        {{"manifest.json",
          R"([{"Config":"c.json","Layers":["l.tar"],"RepoTags":["a:1"]},{"Config":"c.json","Layers":["l.tar"],"RepoTags":["b:2"]}])"},
         {"c.json", img.config},
         {"l.tar", img.layer}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("holds 2 images") != std::string::npos);
    CHECK(r.error().message.find("a:1, b:2") != std::string::npos);
}

namespace {

// An OCI layout directory with the tiny image tagged `tag`; returns the manifest's digest.
std::string write_layout(const std::string& dir, const TinyImage& img, const std::string& tag) {
    REQUIRE(make_directories(dir + "/blobs/sha256", 0755).ok());
    auto put = [&](const std::string& bytes) {
        std::string d = Sha256::of(bytes);
        write_bytes(dir + "/blobs/sha256/" + digest_hex(d), bytes);
        return d;
    };
    std::string layer = put(img.layer);
    std::string config = put(img.config);
    std::string manifest = json{{"schemaVersion", 2},
                                {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                                {"config",
                                 {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                                  {"digest", config},
                                  {"size", img.config.size()}}},
                                {"layers",
                                 {{{"mediaType", "application/vnd.oci.image.layer.v1.tar"},
                                   {"digest", layer},
                                   {"size", img.layer.size()}}}}}
                               .dump();
    std::string m = put(manifest);
    json index = {{"schemaVersion", 2},
                  {"manifests",
                   {{{"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                     {"digest", m},
                     {"size", manifest.size()},
                     {"annotations", {{"org.opencontainers.image.ref.name", tag}}}}}}};
    write_bytes(dir + "/index.json", index.dump());
    write_bytes(dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
    return m;
}

}  // namespace

TEST_CASE("OCI layout directory: tag selection, digests checked, corruption refused", "[local]") {
    TinyImage img;
    TempDir t;
    const std::string layout = t.path + "/layout";
    std::string manifest_digest = write_layout(layout, img, "v1");
    auto image = read_oci_layout(layout_directory_files(layout), "oci:" + layout, "v1", Platform::host());
    REQUIRE(image.ok());
    CHECK(image->manifest_digest == manifest_digest);
    CHECK(image->config_digest == Sha256::of(img.config));
    REQUIRE(image->blobs.size() == 1);
    CHECK(image->blobs[0].diff_id == img.diff_id);
    CHECK(read_oci_layout(layout_directory_files(layout), "oci:" + layout, "", Platform::host())->manifest_digest ==
          manifest_digest);
    auto wrong = read_oci_layout(layout_directory_files(layout), "oci:" + layout, "v2", Platform::host());
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.error().message.find("no image tagged 'v2' (tags: v1)") != std::string::npos);

    // One flipped byte in the layer blob: its sha256 no longer matches the name the manifest gives.
    const std::string blob = layout + "/blobs/sha256/" + digest_hex(Sha256::of(img.layer));
    std::string bytes = *read_file(blob);
    bytes[700] ^= 0x20;
    write_bytes(blob, bytes);
    auto corrupt = read_oci_layout(layout_directory_files(layout), "oci:" + layout, "v1", Platform::host());
    REQUIRE_FALSE(corrupt.ok());
    CHECK(corrupt.error().message.find("is corrupt") != std::string::npos);

    auto none = read_oci_layout(layout_directory_files(t.path + "/nothing"), "oci:x", "", Platform::host());
    REQUIRE_FALSE(none.ok());
    CHECK(none.error().message.find("not an OCI layout") != std::string::npos);
}

TEST_CASE("oci-archive: the same layout as a tar reads to the same image; member names may not escape", "[local]") {
    TinyImage img;
    TempDir t;
    const std::string layout = t.path + "/layout";
    std::string manifest_digest = write_layout(layout, img, "latest");
    std::vector<Member> members;
    for (const auto& name : {std::string("index.json"), std::string("oci-layout")})
        members.push_back({name, *read_file(layout + "/" + name)});
    auto blob_dir = Directory::open(layout + "/blobs/sha256");
    REQUIRE(blob_dir.ok());
    auto blob_names = list_directory(*blob_dir);
    REQUIRE(blob_names.ok());
    for (const auto& n : blob_names.value())
        members.push_back({"blobs/sha256/" + n, *read_file(layout + "/blobs/sha256/" + n)});
    TempDir x;
    auto ar = extract(x, make_tar(members));
    REQUIRE(ar.ok());
    auto image = read_oci_layout(ar->lookup(), "oci-archive:x", "latest", Platform::host());
    REQUIRE(image.ok());
    CHECK(image->manifest_digest == manifest_digest);
    // A blob stored under another blob's name: refused by digest, whatever the archive claims.
    members[2].content += "tampered";
    TempDir y;
    auto bad = extract(y, make_tar(members));
    REQUIRE(bad.ok());
    auto refused = read_oci_layout(bad->lookup(), "oci-archive:x", "latest", Platform::host());
    REQUIRE_FALSE(refused.ok());
}
