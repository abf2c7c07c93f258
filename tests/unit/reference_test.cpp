// Unit tests for image reference parsing: both spellings, Docker Hub defaults, and bad input.
#include "gantry/reference.hpp"

#include <catch2/catch.hpp>

using gantry::parse_reference;

namespace {
gantry::ImageReference ok(const char* text) {
    auto r = parse_reference(text);
    INFO(text << ": " << (r ? "" : r.error().message));
    REQUIRE(r.ok());
    return *r;
}
const std::string kDigest = "sha256:" + std::string(64, 'a');
}  // namespace

TEST_CASE("Docker Hub short names get library/ and latest") {
    auto r = ok("ubuntu");
    CHECK(r.registry == "registry-1.docker.io");
    CHECK(r.repository == "library/ubuntu");
    CHECK(r.tag == "latest");
    CHECK(r.digest.empty());
    CHECK(r.str() == "registry-1.docker.io/library/ubuntu:latest");
    CHECK(ok("nvidia/cuda:12.4").repository == "nvidia/cuda");
    CHECK(ok("docker.io/ubuntu:22.04").registry == "registry-1.docker.io");
    CHECK(ok("index.docker.io/library/ubuntu").repository == "library/ubuntu");
    CHECK(ok("docker://ubuntu:24.04").tag == "24.04");
}

TEST_CASE("Pyxis/Enroot form with registry#, user@ and digest") {
    auto r = ok("alice@123456789012.dkr.ecr.us-west-2.amazonaws.com#team/pytorch:24.05");
    CHECK(r.user == "alice");
    CHECK(r.registry == "123456789012.dkr.ecr.us-west-2.amazonaws.com");
    CHECK(r.repository == "team/pytorch");
    CHECK(r.tag == "24.05");
    auto d = ok(("nvcr.io#nvidia/pytorch@" + kDigest).c_str());
    CHECK(d.registry == "nvcr.io");
    CHECK(d.digest == kDigest);
    CHECK(d.tag.empty());
    CHECK(d.manifest_ref() == kDigest);
    auto both = ok(("nvcr.io#nvidia/pytorch:24.01-py3@" + kDigest).c_str());
    CHECK(both.tag == "24.01-py3");
    CHECK(both.digest == kDigest);
}

TEST_CASE("Docker form with host:port registry") {
    auto r = ok("127.0.0.1:5000/gantry-test/tiny:v1");
    CHECK(r.registry == "127.0.0.1:5000");
    CHECK(r.repository == "gantry-test/tiny");
    CHECK(r.tag == "v1");
    CHECK(r.registry_is_loopback());
    auto l = ok("localhost/foo");
    CHECK(l.registry == "localhost");
    CHECK(l.registry_is_loopback());
    CHECK_FALSE(ok("ghcr.io/org/img").registry_is_loopback());
    // A first component without '.' or ':' is part of the repository, not a registry.
    CHECK(ok("myorg/myimage").registry == "registry-1.docker.io");
    CHECK(ok("127.0.0.1:5000#gantry-test/tiny").tag == "latest");
}

TEST_CASE("pinned() names the manifest digest") {
    auto r = ok("127.0.0.1:5000/a/b:t");
    CHECK(r.pinned(kDigest) == "127.0.0.1:5000/a/b@" + kDigest);
}

TEST_CASE("local squashfs paths are recognised and refused as references") {
    CHECK(gantry::is_local_image_path("./image.sqsh"));
    CHECK(gantry::is_local_image_path("/fsx/images/x.sqsh"));
    CHECK_FALSE(gantry::is_local_image_path("ubuntu"));
    CHECK_FALSE(parse_reference("/fsx/x.sqsh").ok());
}

TEST_CASE("bad references give one clear line") {
    for (const char* text : {"", "UPPER/case", "ubuntu:", "ubuntu:bad/tag", "repo@sha256:short", "a b", "#repo", "reg#",
                             "@reg#repo", "foo//bar", "-lead", "ubuntu:tag with space"}) {
        auto r = parse_reference(text);
        INFO(text);
        CHECK_FALSE(r.ok());
        if (!r.ok()) {
            CHECK(r.error().message.find("invalid image reference") != std::string::npos);
            CHECK(r.error().message.find('\n') == std::string::npos);
        }
    }
}

// Found by tests/fuzz/fuzz_reference: "nvnci#o.rvidia/pytorch" printed as "nvnci/o.rvidia/pytorch", which
// reads back as a Docker Hub repository; messages that say "gantry pull <str()>" would name another image.
TEST_CASE("str() and pinned() read back to the same registry, also for a single-label host") {
    auto r = ok("myreg#team/app:v1");
    CHECK(r.registry == "myreg");
    CHECK(r.str() == "myreg#team/app:v1");
    CHECK(r.pinned(kDigest) == "myreg#team/app@" + kDigest);
    auto back = ok(r.str().c_str());
    CHECK(back.registry == "myreg");
    CHECK(back.repository == "team/app");
    CHECK(ok("localhost/a:b").str() == "localhost/a:b");
    // ".1:5000" printed as ".1:5000/a", a file path when read back.
    CHECK_FALSE(gantry::parse_reference("u@.1:5000/a/b").ok());
    CHECK_FALSE(gantry::parse_reference("-reg#a/b").ok());
}

TEST_CASE("local/ names an imported image, never Docker Hub; docker.io/local/ still does") {
    auto l = ok("local/team/app:1");
    CHECK(l.registry == "local");
    CHECK(l.repository == "team/app");
    CHECK(l.tag == "1");
    CHECK(l.names_imported_image());
    CHECK(l.str() == "local/team/app:1");
    CHECK(ok(l.str().c_str()).names_imported_image());
    CHECK(ok("local/app").str() == "local/app:latest");
    CHECK(ok("local#app:2").names_imported_image());
    auto hub = ok("docker.io/local/app:1");
    CHECK(hub.registry == "registry-1.docker.io");
    CHECK(hub.repository == "local/app");
    CHECK_FALSE(hub.names_imported_image());
    CHECK_FALSE(ok("app:1").names_imported_image());
    CHECK_FALSE(ok("local.example.org/app:1").names_imported_image());
}
