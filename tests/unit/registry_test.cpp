// Unit tests of the registry client's building blocks: WWW-Authenticate parsing, manifest and index
// parsing, platform parsing and selection, media-type fallback, schema1 rejection. The hidden
// "[.driver]" case lets tests/integration/registry_client.bats drive the real client from a script.
#include "gantry/registry.hpp"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "gantry/config.hpp"
#include "gantry/environment.hpp"
#include "gantry/reference.hpp"

using namespace gantry;

namespace {

const std::string kDigestA = "sha256:" + std::string(64, 'a');
const std::string kDigestB = "sha256:" + std::string(64, 'b');
const std::string kDigestC = "sha256:" + std::string(64, 'c');
const std::string kDigestD = "sha256:" + std::string(64, 'd');

std::string index_json(const std::string& platforms_json) {
    return R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[)" +
           platforms_json + "]}";
}

std::string entry(const std::string& digest, const std::string& platform) {
    return R"({"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":")" + digest +
           R"(","size":500,"platform":)" + platform + "}";
}

Platform plat(const std::string& text) {
    auto p = Platform::parse(text);
    REQUIRE(p.ok());
    return *p;
}

}  // namespace

TEST_CASE("WWW-Authenticate: Bearer with quoted values and commas", "[registry][auth]") {
    auto c = parse_www_authenticate(
        R"(Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push")");
    REQUIRE(c.size() == 1);
    CHECK(c[0].scheme == "bearer");
    CHECK(c[0].params.at("realm") == "https://auth.example.com/token");
    CHECK(c[0].params.at("service") == "registry.example.com");
    CHECK(c[0].params.at("scope") == "repository:a/b:pull,push");
}

TEST_CASE("WWW-Authenticate: Basic, case, spaces, escapes, several challenges", "[registry][auth]") {
    auto c = parse_www_authenticate(R"(basic REALM = "gantry \"test\"" , Bearer realm=https://x/t, service=svc)");
    REQUIRE(c.size() == 2);
    CHECK(c[0].scheme == "basic");
    CHECK(c[0].params.at("realm") == R"(gantry "test")");
    CHECK(c[1].scheme == "bearer");
    CHECK(c[1].params.at("realm") == "https://x/t");
    CHECK(c[1].params.at("service") == "svc");

    auto bare = parse_www_authenticate("Negotiate, Basic realm=\"r\"");
    REQUIRE(bare.size() == 2);
    CHECK(bare[0].scheme == "negotiate");
    CHECK(bare[0].params.empty());
    CHECK(bare[1].params.at("realm") == "r");

    auto t68 = parse_www_authenticate("Negotiate abc+/de==");
    REQUIRE(t68.size() == 1);
    CHECK(t68[0].token68 == "abc+/de==");

    CHECK(parse_www_authenticate("").empty());
    auto unterminated = parse_www_authenticate(R"(Bearer realm="https://x/t)");
    REQUIRE(unterminated.size() == 1);
    CHECK(unterminated[0].params.at("realm") == "https://x/t");
}

TEST_CASE("Platform parsing and printing", "[registry][platform]") {
    CHECK(plat("linux/amd64").str() == "linux/amd64");
    CHECK(plat("linux/arm64/v8").str() == "linux/arm64/v8");
    CHECK(plat("Linux/x86_64").str() == "linux/amd64");
    CHECK(plat("linux/aarch64").architecture == "arm64");
    CHECK(plat("linux/armhf").str() == "linux/arm/v7");
    for (const char* bad : {"linux", "", "linux/", "/amd64", "linux/amd64/v8/x", "linux/am d64"}) {
        auto p = Platform::parse(bad);
        REQUIRE_FALSE(p.ok());
        CHECK(p.error().message.find("expected OS/ARCH[/VARIANT]") != std::string::npos);
    }
    Platform h = Platform::host();
    CHECK(h.os == "linux");
    CHECK_FALSE(h.architecture.empty());
    if (h.architecture == "arm64") CHECK(h.variant == "v8");
}

TEST_CASE("OCI manifest: parsed; mediaType absent -> Content-Type decides", "[registry][manifest]") {
    std::string body =
        R"({"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":")" + kDigestA +
        R"(","size":123},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":")" + kDigestB +
        R"(","size":4567},{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":")" + kDigestC +
        R"(","size":89}]})";
    auto m = parse_manifest(body, "application/vnd.oci.image.manifest.v1+json; charset=utf-8");
    REQUIRE(m.ok());
    CHECK(m->kind == ParsedManifest::Kind::manifest);
    CHECK(m->media_type == kMediaOciManifest);
    CHECK(m->config.digest == kDigestA);
    CHECK(m->config.size == 123);
    REQUIRE(m->layers.size() == 2);
    CHECK(m->layers[0].digest == kDigestB);
    CHECK(m->layers[0].size == 4567);
    CHECK(m->layers[1].media_type == "application/vnd.oci.image.layer.v1.tar+zstd");

    // A registry that answers application/json: the shape decides.
    auto j = parse_manifest(body, "application/json");
    REQUIRE(j.ok());
    CHECK(j->media_type == kMediaOciManifest);

    // Content-Type says index: an index is expected, and the document has no manifests array.
    auto wrong = parse_manifest(body, kMediaOciIndex);
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.error().message.find("no manifests array") != std::string::npos);
}

TEST_CASE("Docker schema2 manifest and manifest list", "[registry][manifest]") {
    std::string body = R"({"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
        "config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":")" +
                       kDigestA + R"(","size":10},
        "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":")" +
                       kDigestB + R"(","size":20}]})";
    auto m = parse_manifest(body, "text/plain");
    REQUIRE(m.ok());
    CHECK(m->media_type == kMediaDockerManifest);
    CHECK(m->layers.size() == 1);

    std::string list = R"({"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests":[{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":")" +
                       kDigestC + R"(","size":1,"platform":{"architecture":"amd64","os":"linux"}}]})";
    auto l = parse_manifest(list, "");
    REQUIRE(l.ok());
    CHECK(l->kind == ParsedManifest::Kind::index);
    REQUIRE(l->entries.size() == 1);
    CHECK(l->entries[0].platform->architecture == "amd64");
}

TEST_CASE("schema1 and malformed manifests are rejected with a clear message", "[registry][manifest]") {
    auto s1 = parse_manifest(R"({"schemaVersion":1,"name":"x","tag":"latest","fsLayers":[]})",
                             "application/vnd.docker.distribution.manifest.v1+prettyjws");
    REQUIRE_FALSE(s1.ok());
    CHECK(s1.error().message.find("schema1") != std::string::npos);
    auto s1b = parse_manifest(R"({"schemaVersion":1,"fsLayers":[]})", "application/json");
    REQUIRE_FALSE(s1b.ok());
    CHECK(s1b.error().message.find("schema1") != std::string::npos);

    CHECK_FALSE(parse_manifest("not json", kMediaOciManifest).ok());
    CHECK_FALSE(parse_manifest(R"({"schemaVersion":"2"})", kMediaOciManifest).ok());
    auto bad_digest =
        parse_manifest(R"({"schemaVersion":2,"config":{"digest":"md5:x","size":1},"layers":[]})", kMediaOciManifest);
    REQUIRE_FALSE(bad_digest.ok());
    CHECK(bad_digest.error().message.find("config") != std::string::npos);
    auto no_size = parse_manifest(R"({"schemaVersion":2,"config":{"digest":")" + kDigestA + R"("},"layers":[]})",
                                  kMediaOciManifest);
    REQUIRE_FALSE(no_size.ok());
    auto helm = parse_manifest(
        R"({"schemaVersion":2,"config":{"mediaType":"application/vnd.cncf.helm.config.v1+json","digest":")" + kDigestA +
            R"(","size":1},"layers":[]})",
        kMediaOciManifest);
    REQUIRE_FALSE(helm.ok());
    CHECK(helm.error().message.find("not a container image") != std::string::npos);
}

TEST_CASE("platform selection in an index", "[registry][platform]") {
    auto idx =
        parse_manifest(index_json(entry(kDigestA, R"({"os":"linux","architecture":"amd64"})") + "," +
                                  entry(kDigestB, R"({"os":"linux","architecture":"arm64","variant":"v8"})") + "," +
                                  entry(kDigestC, R"({"os":"linux","architecture":"arm","variant":"v6"})") + "," +
                                  entry(kDigestD, R"({"os":"unknown","architecture":"unknown"})")),
                       "");
    REQUIRE(idx.ok());
    REQUIRE(idx->kind == ParsedManifest::Kind::index);
    CHECK(select_platform(*idx, plat("linux/amd64"))->digest == kDigestA);
    CHECK(select_platform(*idx, plat("linux/arm64"))->digest == kDigestB);  // no variant = v8
    CHECK(select_platform(*idx, plat("linux/arm64/v8"))->digest == kDigestB);
    CHECK(select_platform(*idx, plat("linux/arm/v7"))->digest == kDigestC);  // v6 runs on v7
    auto none = select_platform(*idx, plat("linux/riscv64"));
    REQUIRE_FALSE(none.ok());
    CHECK(none.error().message ==
          "no image for platform linux/riscv64 in the index (available: linux/amd64, "
          "linux/arm64/v8, linux/arm/v6)");
    CHECK_FALSE(select_platform(*idx, plat("windows/amd64")).ok());
    CHECK_FALSE(select_platform(*idx, plat("linux/arm/v5")).ok());  // v6 does not run on v5

    // arm64 entry without a variant matches an arm64/v8 host; the exact match wins over it.
    auto idx2 = parse_manifest(index_json(entry(kDigestA, R"({"os":"linux","architecture":"arm64"})") + "," +
                                          entry(kDigestB, R"({"os":"linux","architecture":"arm64","variant":"v8"})")),
                               "");
    REQUIRE(idx2.ok());
    Platform host_arm{"linux", "arm64", "v8"};
    CHECK(select_platform(*idx2, host_arm)->digest == kDigestA);  // both normalise to v8: first wins
    auto idx3 = parse_manifest(index_json(entry(kDigestA, R"({"os":"linux","architecture":"arm64"})")), "");
    CHECK(select_platform(*idx3, host_arm)->digest == kDigestA);
    CHECK(select_platform(*idx3, plat("linux/arm64/v8"))->digest == kDigestA);

    // Ties: the first entry, as Docker and Enroot do; an exact variant beats an unrequested one.
    auto idx4 = parse_manifest(index_json(entry(kDigestA, R"({"os":"linux","architecture":"amd64","variant":"v3"})") +
                                          "," + entry(kDigestB, R"({"os":"linux","architecture":"amd64"})") + "," +
                                          entry(kDigestC, R"({"os":"linux","architecture":"amd64"})")),
                               "");
    CHECK(select_platform(*idx4, plat("linux/amd64"))->digest == kDigestB);
    CHECK(select_platform(*idx4, plat("linux/amd64/v3"))->digest == kDigestA);
}

TEST_CASE("default connection count is within 4..8", "[registry]") {
    int n = default_max_connections();
    CHECK(n >= 4);
    CHECK(n <= 8);
    Config c;
    c.max_connections = 3;
    RegistryClient from_config(c, {});
    CHECK(from_config.max_connections() == 3);
    RegistryOptions o;
    o.max_connections = 5;
    RegistryClient from_options(c, std::move(o));
    CHECK(from_options.max_connections() == 5);
}

TEST_CASE("blobs declared beyond max_image_bytes are refused before any request", "[registry][limits]") {
    char tmpl[] = "/tmp/gantry-regtest-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    const std::string dir = tmpl;
    Config config;
    config.limits.max_image_bytes = 1000;
    RegistryOptions options;
    options.max_attempts = 1;
    options.credentials = [](const ImageReference&) { return std::optional<Credentials>(); };
    RegistryClient client(config, std::move(options));
    // Nothing listens on port 1: a request would fail with a connection error, not with the limit.
    auto ref = parse_reference("127.0.0.1:1/limits/test:latest");
    REQUIRE(ref.ok());
    const std::string type = "application/vnd.oci.image.layer.v1.tar+gzip";
    auto over = client.fetch_blobs(*ref, {{type, kDigestA, 600}, {type, kDigestB, 401}}, dir, {});
    REQUIRE_FALSE(over.ok());
    INFO(over.error().message);
    CHECK(over.error().message.find("more than max_image_bytes = 1000 (1000 B) allows uncompressed; raise "
                                    "max_image_bytes in gantry.conf") != std::string::npos);
    CHECK(over.error().message.find(kDigestA) != std::string::npos);  // the largest blob
    // At the limit (a blob listed twice is downloaded once) the fetch goes ahead, and fails to connect.
    auto at = client.fetch_blobs(*ref, {{type, kDigestA, 600}, {type, kDigestB, 400}, {type, kDigestA, 600}}, dir, {});
    REQUIRE_FALSE(at.ok());
    INFO(at.error().message);
    CHECK(at.error().message.find("max_image_bytes") == std::string::npos);
    CHECK(at.error().message.find("127.0.0.1:1") != std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST_CASE("docker config.json credentials", "[registry][credentials]") {
    char tmpl[] = "/tmp/gantry-regtest-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    std::string dir = tmpl;
    auto write = [&](const std::string& text) {
        FILE* f = std::fopen((dir + "/config.json").c_str(), "w");
        REQUIRE(f != nullptr);
        std::fputs(text.c_str(), f);
        std::fclose(f);
    };
    const char* old = std::getenv("DOCKER_CONFIG");
    std::string saved = old != nullptr ? old : "";
    setenv("DOCKER_CONFIG", dir.c_str(), 1);
    reread_environment();  // the library reads the environment once (environment.hpp)
    ImageReference ref;
    ref.registry = "127.0.0.1:5000";
    ref.repository = "a/b";

    CHECK_FALSE(docker_config_credentials(ref).has_value());  // no file
    // "auth" is base64("AWS:pa:ss") -- the password may contain ':'.
    write(
        R"({"auths":{"https://127.0.0.1:5000/v2/":{"auth":"QVdTOnBhOnNz"},"other:1":{"username":"u","password":"p"}}})");
    auto c = docker_config_credentials(ref);
    REQUIRE(c.has_value());
    CHECK(c->username == "AWS");
    CHECK(c->password == "pa:ss");
    CHECK(c->source == dir + "/config.json");
    ref.registry = "other:1";
    c = docker_config_credentials(ref);
    REQUIRE(c.has_value());
    CHECK(c->username == "u");
    // Docker Hub is stored under its v1 URL.
    write(R"({"auths":{"https://index.docker.io/v1/":{"auth":"dXNlcjpwdw=="}}})");
    ref.registry = kDockerHubRegistry;
    c = docker_config_credentials(ref);
    REQUIRE(c.has_value());
    CHECK(c->password == "pw");
    write("{not json");
    CHECK_FALSE(docker_config_credentials(ref).has_value());

    if (old != nullptr)
        setenv("DOCKER_CONFIG", saved.c_str(), 1);
    else
        unsetenv("DOCKER_CONFIG");
    reread_environment();
    std::remove((dir + "/config.json").c_str());
    rmdir(dir.c_str());
}

// Driven by tests/integration/registry_client.bats, never by a plain run (the tag starts with '.'):
//   GANTRY_REG_REF        image reference (required)
//   GANTRY_REG_PLATFORM   os/arch[/variant] (default: the host's)
//   GANTRY_REG_DIR        where blobs go (default: resolve only)
//   GANTRY_REG_MODE       "digest": print only resolve_digest's answer
//   GANTRY_REG_CA_BUNDLE, GANTRY_REG_INSECURE (comma list), GANTRY_REG_MAX_CONNECTIONS,
//   GANTRY_REG_ATTEMPTS, GANTRY_REG_RETRY_BASE_S: settings
// Prints "<manifest-digest> <layer count>" (then "index <digest>" and "layer <digest>" lines) on
// stdout; on failure "error: <message>" and the case fails.
TEST_CASE("registry driver", "[.driver]") {
    auto env = [](const char* n) -> std::string {
        const char* v = std::getenv(n);
        return v != nullptr ? v : "";
    };
    auto ref = parse_reference(env("GANTRY_REG_REF"));
    if (!ref) {
        std::cout << "error: " << ref.error().message << std::endl;
        FAIL(ref.error().message);
    }
    Platform platform = Platform::host();
    if (!env("GANTRY_REG_PLATFORM").empty()) platform = plat(env("GANTRY_REG_PLATFORM"));
    Config config;
    config.ca_bundle = env("GANTRY_REG_CA_BUNDLE");
    if (!env("GANTRY_REG_INSECURE").empty()) config.insecure_registries = {env("GANTRY_REG_INSECURE")};
    RegistryOptions options;
    if (!env("GANTRY_REG_MAX_CONNECTIONS").empty())
        options.max_connections = std::stoi(env("GANTRY_REG_MAX_CONNECTIONS"));
    if (!env("GANTRY_REG_ATTEMPTS").empty()) options.max_attempts = std::stoi(env("GANTRY_REG_ATTEMPTS"));
    if (!env("GANTRY_REG_RETRY_BASE_S").empty()) options.retry_base_s = std::stod(env("GANTRY_REG_RETRY_BASE_S"));
    uint64_t last_progress = 0;
    options.on_progress = [&](uint64_t b) { last_progress = b; };
    RegistryClient client(config, std::move(options));

    if (env("GANTRY_REG_MODE") == "digest") {
        auto d = client.resolve_digest(*ref, platform);
        if (!d) {
            std::cout << "error: " << d.error().message << std::endl;
            FAIL(d.error().message);
        }
        std::cout << *d << std::endl;
        return;
    }
    auto image = client.resolve(*ref, platform);
    if (!image) {
        std::cout << "error: " << image.error().message << std::endl;
        FAIL(image.error().message);
    }
    std::cout << image->manifest_digest << " " << image->layers.size() << std::endl;
    if (!image->index_digest.empty()) std::cout << "index " << image->index_digest << std::endl;
    std::cout << "mediatype " << image->manifest_media_type << std::endl;
    for (const auto& l : image->layers) std::cout << "layer " << l.digest << " " << l.size << std::endl;
    std::string dir = env("GANTRY_REG_DIR");
    if (dir.empty()) return;
    size_t done = 0;
    auto st = client.fetch_blobs(*ref, image->layers, dir, [&](size_t) { ++done; });
    if (!st) {
        std::cout << "error: " << st.error().message << std::endl;
        FAIL(st.error().message);
    }
    uint64_t total = 0;
    for (const auto& l : image->layers) total += l.size;
    std::cout << "fetched " << done << " progress " << last_progress << "/" << total << std::endl;
}
