// Unit tests of runtime/auth: SigV4 against the AWS Signature Version 4 test-suite vectors, the
// credential file formats (Docker config.json, containers auth.json, Enroot .credentials, AWS shared
// files), credential helpers run as real executables, the Enroot $(command) policy, the helper
// timeout, ECR host recognition and request signing. The hidden "[.driver]" case prints a signed ECR
// request for tests/integration/auth.bats to check against botocore.
#include "gantry/auth.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/sigv4.hpp"

using namespace gantry;

namespace {

// Sets (or unsets, for nullptr) environment variables for one scope and restores them after.
class EnvGuard {
public:
    void set(const std::string& name, const char* value) {
        if (saved_.find(name) == saved_.end()) {
            const char* old = std::getenv(name.c_str());
            saved_[name] = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
        }
        if (value != nullptr)
            ::setenv(name.c_str(), value, 1);
        else
            ::unsetenv(name.c_str());
        gantry::reread_environment();  // the library reads the environment once (environment.hpp)
    }
    void set(const std::string& name, const std::string& value) { set(name, value.c_str()); }
    ~EnvGuard() {
        for (const auto& [n, v] : saved_) {
            if (v)
                ::setenv(n.c_str(), v->c_str(), 1);
            else
                ::unsetenv(n.c_str());
        }
        gantry::reread_environment();
    }

private:
    std::map<std::string, std::optional<std::string>> saved_;
};

// A fresh directory that is removed at the end of the test, and a HOME with nothing in it.
struct Sandbox {
    std::string dir;
    EnvGuard env;
    Sandbox() {
        char tmpl[] = "/tmp/gantry-auth-test-XXXXXX";
        REQUIRE(::mkdtemp(tmpl) != nullptr);
        dir = tmpl;
        env.set("HOME", dir);
        for (const char* v : {"DOCKER_CONFIG",
                              "REGISTRY_AUTH_FILE",
                              "XDG_CONFIG_HOME",
                              "XDG_CACHE_HOME",
                              "ENROOT_CONFIG_PATH",
                              "AWS_ACCESS_KEY_ID",
                              "AWS_SECRET_ACCESS_KEY",
                              "AWS_SESSION_TOKEN",
                              "AWS_PROFILE",
                              "AWS_DEFAULT_PROFILE",
                              "AWS_SHARED_CREDENTIALS_FILE",
                              "AWS_CONFIG_FILE",
                              "AWS_WEB_IDENTITY_TOKEN_FILE",
                              "AWS_ROLE_ARN",
                              "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                              "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                              "GANTRY_TEST_ECR_REGISTRIES",
                              "GANTRY_ECR_ENDPOINT",
                              "GANTRY_STS_ENDPOINT",
                              "AWS_ENDPOINT_URL_ECR",
                              "AWS_ENDPOINT_URL"})
            env.set(v, nullptr);
        env.set("XDG_RUNTIME_DIR", dir + "/run");
        env.set("AWS_EC2_METADATA_DISABLED", "true");
    }
    ~Sandbox() { (void)remove_tree(dir); }
    std::string write(const std::string& rel, const std::string& text, mode_t mode = 0600) {
        std::string path = dir + "/" + rel;
        REQUIRE(make_directories(path.substr(0, path.rfind('/')), 0700).ok());
        REQUIRE(write_file_atomic(path, text, mode).ok());
        return path;
    }
};

// Collects warnings so tests can assert on them (and on the absence of secrets in them).
struct LogCapture {
    std::string text;
    LogCapture() {
        log::set_sink([this](log::Level, const std::string& m) { text += m + "\n"; });
    }
    ~LogCapture() { log::set_sink(nullptr); }
};

ImageReference ref_of(const std::string& registry, const std::string& repo = "team/app", const std::string& user = "") {
    ImageReference r;
    r.registry = registry;
    r.repository = repo;
    r.tag = "latest";
    r.user = user;
    return r;
}

const sigv4::Key kExampleKey{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};

}  // namespace

// ---- SigV4: vectors of the AWS Signature Version 4 test suite (aws-sig-v4-test-suite, 2015-08-30),
// credential scope 20150830/us-east-1/service/aws4_request.

TEST_CASE("SigV4 test suite: get-vanilla", "[auth][sigv4]") {
    sigv4::Request r;
    r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
    auto s = sigv4::sign(r, kExampleKey, "us-east-1", "service", "20150830T123600Z");
    CHECK(s.canonical_request ==
          "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(s.string_to_sign ==
          "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
          "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
    CHECK(s.signature == "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    CHECK(s.authorization ==
          "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
          "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST_CASE("SigV4 test suite: get-vanilla-query-order-key-case", "[auth][sigv4]") {
    sigv4::Request r;
    r.query = {{"Param2", "value2"}, {"Param1", "value1"}};
    r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
    auto s = sigv4::sign(r, kExampleKey, "us-east-1", "service", "20150830T123600Z");
    CHECK(s.canonical_request ==
          "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
          "host;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(s.string_to_sign ==
          "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
          "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0");
    CHECK(s.signature == "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST_CASE("SigV4 test suite: post-x-www-form-urlencoded", "[auth][sigv4]") {
    sigv4::Request r;
    r.method = "POST";
    r.payload = "Param1=value1";
    r.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                 {"Host", "example.amazonaws.com"},
                 {"X-Amz-Date", "20150830T123600Z"}};
    auto s = sigv4::sign(r, kExampleKey, "us-east-1", "service", "20150830T123600Z");
    CHECK(s.canonical_request ==
          "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
          "x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n"
          "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
    CHECK(s.string_to_sign ==
          "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
          "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281");
    CHECK(s.signature == "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a");
}

TEST_CASE("SigV4 test suite: get-header-value-trim", "[auth][sigv4]") {
    sigv4::Request r;
    r.headers = {{"Host", "example.amazonaws.com"},
                 {"My-Header1", " value1"},
                 {"My-Header2", " \"a   b   c\""},
                 {"X-Amz-Date", "20150830T123600Z"}};
    auto s = sigv4::sign(r, kExampleKey, "us-east-1", "service", "20150830T123600Z");
    CHECK(
        s.canonical_request ==
        "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\n"
        "host;my-header1;my-header2;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(s.signature == "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736");
}

TEST_CASE("SigV4: a different secret, date or region changes the signature", "[auth][sigv4]") {
    sigv4::Request r;
    r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
    auto base = sigv4::sign(r, kExampleKey, "us-east-1", "service", "20150830T123600Z").signature;
    sigv4::Key other = kExampleKey;
    other.secret_access_key += "x";
    CHECK(sigv4::sign(r, other, "us-east-1", "service", "20150830T123600Z").signature != base);
    CHECK(sigv4::sign(r, kExampleKey, "us-west-2", "service", "20150830T123600Z").signature != base);
    CHECK(sigv4::sign(r, kExampleKey, "us-east-1", "service", "20150831T123600Z").signature != base);
    CHECK(sigv4::uri_encode("a b/c~", false) == "a%20b%2Fc~");
    CHECK(sigv4::amz_date_now().size() == 16);
}

// ---- ECR

TEST_CASE("ECR registry names and API endpoints", "[auth][ecr]") {
    Sandbox sb;
    auto r = auth::parse_ecr_registry("123456789012.dkr.ecr.us-west-2.amazonaws.com");
    REQUIRE(r.has_value());
    CHECK(r->account == "123456789012");
    CHECK(r->region == "us-west-2");
    CHECK(r->api_endpoint() == "https://api.ecr.us-west-2.amazonaws.com");
    r = auth::parse_ecr_registry("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn");
    REQUIRE(r.has_value());
    CHECK(r->china);
    CHECK(r->api_endpoint() == "https://api.ecr.cn-north-1.amazonaws.com.cn");
    r = auth::parse_ecr_registry("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com");
    REQUIRE(r.has_value());
    CHECK(r->api_endpoint() == "https://ecr-fips.us-gov-west-1.amazonaws.com");
    CHECK_FALSE(auth::parse_ecr_registry("public.ecr.aws").has_value());  // anonymous, Bearer
    CHECK_FALSE(auth::parse_ecr_registry("12345.dkr.ecr.us-east-1.amazonaws.com").has_value());
    CHECK_FALSE(auth::parse_ecr_registry("123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.example").has_value());
    CHECK_FALSE(auth::parse_ecr_registry("127.0.0.1:5000").has_value());
    CHECK_FALSE(auth::parse_ecr_registry("1234567890123.dkr.ecr.us-east-1.amazonaws.com").has_value());
    CHECK_FALSE(auth::parse_ecr_registry("123456789012.dkr.ecr..amazonaws.com").has_value());
    CHECK_FALSE(auth::parse_ecr_registry("123456789012.dkr.ecr.us_east-1.amazonaws.com").has_value());
    CHECK_FALSE(auth::parse_ecr_registry("123456789012.dkr.ecrus-east-1.amazonaws.com").has_value());
    // public.ecr.aws: no source has anything, so the registry client goes anonymous.
    CHECK_FALSE(default_credential_lookup()(ref_of("public.ecr.aws", "docker/library/busybox")).has_value());

    sb.env.set("GANTRY_TEST_ECR_REGISTRIES", "127.0.0.1:5000=111122223333.dkr.ecr.eu-west-1.amazonaws.com");
    sb.env.set("GANTRY_ECR_ENDPOINT", "http://127.0.0.1:9/");
    r = auth::parse_ecr_registry("127.0.0.1:5000");
    REQUIRE(r.has_value());
    CHECK(r->registry == "127.0.0.1:5000");
    CHECK(r->ecr_host == "111122223333.dkr.ecr.eu-west-1.amazonaws.com");
    CHECK(r->region == "eu-west-1");
    CHECK(r->api_endpoint() == "http://127.0.0.1:9");
}

TEST_CASE("ECR GetAuthorizationToken request: headers, session token, signature scope", "[auth][ecr]") {
    Sandbox sb;
    auto reg = auth::parse_ecr_registry("123456789012.dkr.ecr.us-east-1.amazonaws.com");
    REQUIRE(reg.has_value());
    sigv4::Key key{"AKIDEXAMPLE", "secret", "SESSIONTOKEN"};
    auto req = auth::ecr_token_request(*reg, key, "20240102T030405Z");
    CHECK(req.url == "https://api.ecr.us-east-1.amazonaws.com/");
    CHECK(req.body == "{}");
    CHECK(req.sig.signed_headers == "content-type;host;x-amz-date;x-amz-security-token;x-amz-target");
    CHECK(req.sig.canonical_request.find("host:api.ecr.us-east-1.amazonaws.com\n") != std::string::npos);
    CHECK(req.sig.string_to_sign.find("20240102/us-east-1/ecr/aws4_request") != std::string::npos);
    std::map<std::string, std::string> h(req.headers.begin(), req.headers.end());
    CHECK(h["X-Amz-Target"] == "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken");
    CHECK(h["X-Amz-Security-Token"] == "SESSIONTOKEN");
    CHECK(h["Authorization"].rfind("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240102/us-east-1/ecr/aws4_request", 0) ==
          0);
    // A loopback endpoint with a port: the Host header (and what is signed) carries the port.
    sb.env.set("GANTRY_ECR_ENDPOINT", "http://127.0.0.1:8080");
    req = auth::ecr_token_request(*reg, key, "20240102T030405Z");
    CHECK(req.sig.canonical_request.find("host:127.0.0.1:8080\n") != std::string::npos);
}

TEST_CASE("ECR without AWS credentials: the error lists the chain", "[auth][ecr]") {
    Sandbox sb;
    auto r = auth::aws_credentials("us-east-1");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("environment (AWS_ACCESS_KEY_ID unset)") != std::string::npos);
    CHECK(r.error().message.find("profile default") != std::string::npos);
    CHECK(r.error().message.find("web identity") != std::string::npos);
    CHECK(r.error().message.find("container credentials endpoint") != std::string::npos);
    CHECK(r.error().message.find("EC2 instance metadata (AWS_EC2_METADATA_DISABLED)") != std::string::npos);
}

// ---- AWS shared files

TEST_CASE("AWS credentials: environment, then profiles from ~/.aws/credentials and ~/.aws/config", "[auth][aws]") {
    Sandbox sb;
    sb.write(".aws/credentials",
             "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n\n"
             "[dev]\naws_access_key_id=AKIDDEV\naws_secret_access_key=s2\naws_session_token=t2\n");
    sb.write(".aws/config",
             "[default]\nregion = us-east-1\n[profile cfg]\naws_access_key_id = AKIDCFG\n"
             "aws_secret_access_key = s3\ns3 =\n  max_concurrent_requests = 5\n");
    auto c = auth::aws_credentials("us-east-1");
    REQUIRE(c.ok());
    CHECK(c->key.access_key_id == "AKIDDEFAULT");
    CHECK(c->source == "profile default in ~/.aws/credentials");
    sb.env.set("AWS_PROFILE", "dev");
    c = auth::aws_credentials("us-east-1");
    REQUIRE(c.ok());
    CHECK(c->key.session_token == "t2");
    sb.env.set("AWS_PROFILE", "cfg");
    c = auth::aws_credentials("us-east-1");
    REQUIRE(c.ok());
    CHECK(c->key.access_key_id == "AKIDCFG");
    CHECK(c->source == "profile cfg in ~/.aws/config");
    sb.env.set("AWS_PROFILE", "nope");
    c = auth::aws_credentials("us-east-1");
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().message.find("AWS_PROFILE=nope names a profile") != std::string::npos);
    // The environment comes first.
    sb.env.set("AWS_ACCESS_KEY_ID", "AKIDENV");
    sb.env.set("AWS_SECRET_ACCESS_KEY", "s4");
    sb.env.set("AWS_SESSION_TOKEN", "t4");
    c = auth::aws_credentials("us-east-1");
    REQUIRE(c.ok());
    CHECK(c->key.access_key_id == "AKIDENV");
    CHECK(c->key.session_token == "t4");
    auto ini = auth::parse_aws_ini("[profile x]\nKey = v\n", true);
    CHECK(ini["x"]["key"] == "v");
}

TEST_CASE("AWS profiles: role_arn chains are checked before STS; SSO and MFA are refused clearly", "[auth][aws]") {
    Sandbox sb;
    sb.env.set("GANTRY_STS_ENDPOINT", "http://127.0.0.1:9");  // nothing may be asked: every case fails earlier
    sb.write(
        ".aws/config",
        "[profile a]\nrole_arn = arn:aws:iam::1:role/a\nsource_profile = b\n"
        "[profile b]\nrole_arn = arn:aws:iam::1:role/b\nsource_profile = a\n"
        "[profile self]\nrole_arn = arn:aws:iam::1:role/s\nsource_profile = self\n"
        "[profile missing]\nrole_arn = arn:aws:iam::1:role/m\nsource_profile = nowhere\n"
        "[profile mfa]\nrole_arn = arn:aws:iam::1:role/m\nsource_profile = self\nmfa_serial = arn:aws:iam::1:mfa/u\n"
        "[profile bare]\nrole_arn = arn:aws:iam::1:role/x\n"
        "[profile ec2]\nrole_arn = arn:aws:iam::1:role/x\ncredential_source = Ec2InstanceMetadata\n"
        "[profile sso]\nsso_session = corp\nsso_account_id = 1\nsso_role_name = R\n");
    auto message = [&](const char* profile) {
        sb.env.set("AWS_PROFILE", profile);
        auto r = auth::aws_credentials("us-east-1");
        REQUIRE_FALSE(r.ok());
        return r.error().message;
    };
    CHECK(message("a") == "profile b: source_profile a makes a cycle");
    CHECK(message("self") ==
          "profile self: source_profile self holds no credentials to assume arn:aws:iam::1:role/s with");
    CHECK(message("missing").find(
              "profile missing: source_profile nowhere is in neither ~/.aws/credentials nor ~/.aws/config") == 0);
    CHECK(message("mfa").find("with mfa_serial, which needs an MFA code typed in") != std::string::npos);
    CHECK(message("bare") == "profile bare names role_arn arn:aws:iam::1:role/x without source_profile");
    CHECK(message("ec2").find("credential_source (Ec2InstanceMetadata) is not implemented") != std::string::npos);
    CHECK(message("sso").find("profile sso uses AWS IAM Identity Center (SSO), which Gantry does not implement") == 0);
    // A source profile with keys reaches STS: here a closed port, so the error names the call.
    sb.write(".aws/credentials", "[b]\naws_access_key_id = AKIDB\naws_secret_access_key = secret-b\n");
    sb.write(".aws/config", "[profile a]\nrole_arn = arn:aws:iam::1:role/a\nsource_profile = b\n");
    std::string m = message("a");
    CHECK(m.find("profile a: STS AssumeRole for arn:aws:iam::1:role/a at http://127.0.0.1:9") == 0);
    CHECK(m.find("secret-b") == std::string::npos);
}

// ---- Docker config.json, helpers, auth.json

TEST_CASE("docker config.json: auths, identitytoken, Docker Hub names, malformed file", "[auth][docker]") {
    Sandbox sb;
    LogCapture logs;
    CHECK_FALSE(docker_config_credentials(ref_of("127.0.0.1:5000")).has_value());  // no file
    sb.write(
        ".docker/config.json",
        R"({"auths":{"https://127.0.0.1:5000/v2/":{"auth":"QVdTOnBhOnNz"},"other:1":{"username":"u","password":"p"},)"
        R"("idp.example":{"identitytoken":"refresh-123"},"https://index.docker.io/v1/":{"auth":"dXNlcjpwdw=="}}})");
    auto c = docker_config_credentials(ref_of("127.0.0.1:5000"));
    REQUIRE(c.has_value());
    CHECK(c->username == "AWS");
    CHECK(c->password == "pa:ss");
    CHECK(c->source == "~/.docker/config.json");
    c = docker_config_credentials(ref_of("other:1"));
    REQUIRE(c.has_value());
    CHECK(c->password == "p");
    c = docker_config_credentials(ref_of("idp.example"));
    REQUIRE(c.has_value());
    CHECK(c->identity_token == "refresh-123");
    CHECK(c->password.empty());
    c = docker_config_credentials(ref_of(kDockerHubRegistry, "library/ubuntu"));
    REQUIRE(c.has_value());
    CHECK(c->password == "pw");
    sb.write(".docker/config.json", "{\"auths\": {\"x\": }");
    CHECK_FALSE(docker_config_credentials(ref_of("x")).has_value());
    INFO(logs.text);
    CHECK(logs.text.find("ignoring ~/.docker/config.json: not valid JSON (syntax error at byte 17)") !=
          std::string::npos);
}

TEST_CASE("credential helpers: credHelpers and credsStore run docker-credential-<name> get", "[auth][docker]") {
    Sandbox sb;
    LogCapture logs;
    // A real helper executable in a private PATH: it records what it was asked and answers per registry.
    sb.write(
        "bin/docker-credential-unittest",
        "#!/bin/sh\n[ \"$1\" = get ] || exit 3\nread -r server\necho \"$server\" >> \"$0.asked\"\n"
        "case $server in\n"
        "  reg.example) echo "
        "'{\"ServerURL\":\"reg.example\",\"Username\":\"helper-user\",\"Secret\":\"helper-secret\"}' ;;\n"
        "  tok.example) echo '{\"ServerURL\":\"tok.example\",\"Username\":\"<token>\",\"Secret\":\"refresh\"}' ;;\n"
        "  broken.example) echo 'the keychain is locked' >&2; exit 1 ;;\n"
        "  *) echo 'credentials not found in native keychain'; exit 1 ;;\n"
        "esac\n",
        0755);
    sb.write("bin/docker-credential-sleepy", "#!/bin/sh\nsleep 30\n", 0755);
    sb.env.set("PATH", sb.dir + "/bin:/usr/bin:/bin");
    sb.write(".docker/config.json",
             R"({"credHelpers":{"reg.example":"unittest","tok.example":"unittest","broken.example":"unittest",)"
             R"("hang.example":"sleepy"},"auths":{"none.example":{"auth":"dTpw"}}})");
    auto c = docker_config_credentials(ref_of("reg.example"));
    REQUIRE(c.has_value());
    CHECK(c->username == "helper-user");
    CHECK(c->password == "helper-secret");
    CHECK(c->source == "docker-credential-unittest");
    c = docker_config_credentials(ref_of("tok.example"));
    REQUIRE(c.has_value());
    CHECK(c->identity_token == "refresh");
    // A failing helper: a warning naming it and its message, then the file's own entries.
    CHECK_FALSE(docker_config_credentials(ref_of("broken.example")).has_value());
    CHECK(logs.text.find("docker-credential-unittest get exited with status 1: the keychain is locked") !=
          std::string::npos);
    // A helper that hangs is killed after GANTRY_CREDENTIAL_TIMEOUT.
    sb.env.set("GANTRY_CREDENTIAL_TIMEOUT", "0.5");
    auto t0 = std::chrono::steady_clock::now();
    CHECK_FALSE(docker_config_credentials(ref_of("hang.example")).has_value());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    CHECK(logs.text.find("docker-credential-sleepy: no answer after 0.5 s (killed") != std::string::npos);
    // credsStore for everything else; "not found" falls through to auths.
    sb.write(".docker/config.json", R"({"credsStore":"unittest","auths":{"none.example":{"auth":"dTpw"}}})");
    c = docker_config_credentials(ref_of("reg.example"));
    REQUIRE(c.has_value());
    CHECK(c->username == "helper-user");
    c = docker_config_credentials(ref_of("none.example"));
    REQUIRE(c.has_value());
    CHECK(c->password == "p");
    std::ifstream asked(sb.dir + "/bin/docker-credential-unittest.asked");
    std::string all((std::istreambuf_iterator<char>(asked)), std::istreambuf_iterator<char>());
    CHECK(all.find("none.example") != std::string::npos);
    // Nothing secret in any warning.
    CHECK(logs.text.find("helper-secret") == std::string::npos);
    CHECK(logs.text.find("refresh") == std::string::npos);
}

TEST_CASE("containers auth.json: REGISTRY_AUTH_FILE, XDG_RUNTIME_DIR, namespaced keys", "[auth][containers]") {
    Sandbox sb;
    sb.write("run/containers/auth.json",
             R"({"auths":{"reg.example":{"auth":"aG9zdDpob3N0cHc="},"reg.example/team":{"auth":"dGVhbTp0ZWFtcHc="}}})");
    auto c = containers_auth_credentials(ref_of("reg.example", "team/app"));
    REQUIRE(c.has_value());
    CHECK(c->username == "team");  // the most specific key wins
    c = containers_auth_credentials(ref_of("reg.example", "other/app"));
    REQUIRE(c.has_value());
    CHECK(c->username == "host");
    std::string file = sb.write("elsewhere.json", R"({"auths":{"reg.example":{"username":"f","password":"fp"}}})");
    sb.env.set("REGISTRY_AUTH_FILE", file);
    c = containers_auth_credentials(ref_of("reg.example", "team/app"));
    REQUIRE(c.has_value());
    CHECK(c->username == "f");
    CHECK(containers_auth_source() == "~/elsewhere.json");
}

// ---- Enroot

TEST_CASE("Enroot .credentials: netrc entries and the USER@ selector", "[auth][enroot]") {
    auto e = auth::parse_netrc(
        "machine nvcr.io login $oauthtoken password abc\n# comment\n"
        "machine a.example\n  login x\n  password $(echo one two)\ndefault login d password dd\n");
    REQUIRE(e.size() == 2);
    CHECK(e[0].login == "$oauthtoken");
    CHECK(e[0].password == "abc");
    CHECK(e[1].password == "$(echo one two)");

    Sandbox sb;
    sb.env.set("ENROOT_CONFIG_PATH", sb.dir + "/enroot");
    sb.write("enroot/.credentials",
             "machine reg.example login alice password pa\n"
             "machine reg.example login bob password pb\n"
             "machine auth.docker.io login hubuser password hubpw\n");
    auto c = enroot_credentials(ref_of("reg.example"));
    REQUIRE(c.has_value());
    CHECK(c->username == "alice");
    c = enroot_credentials(ref_of("reg.example", "team/app", "bob"));
    REQUIRE(c.has_value());
    CHECK(c->password == "pb");
    CHECK_FALSE(enroot_credentials(ref_of("reg.example", "team/app", "carol")).has_value());
    c = enroot_credentials(ref_of(kDockerHubRegistry, "library/ubuntu"));
    REQUIRE(c.has_value());
    CHECK(c->username == "hubuser");
    CHECK(enroot_credentials_source() == "~/enroot/.credentials");
}

TEST_CASE("Enroot .credentials: $(command) passwords run only from a private file", "[auth][enroot]") {
    Sandbox sb;
    LogCapture logs;
    sb.env.set("ENROOT_CONFIG_PATH", sb.dir + "/enroot");
    // The registry name in the reference must never reach the shell: it is not interpolated anywhere.
    sb.write("enroot/.credentials",
             "machine reg.example login AWS password $(printf '%s' \"tok-$((6*7))\"; echo ' ')\n"
             "machine fail.example login AWS password $(echo nope >&2; exit 4)\n");
    auto c = enroot_credentials(ref_of("reg.example"));
    REQUIRE(c.has_value());
    CHECK(c->password == "tok-42");
    CHECK(c->source == "~/enroot/.credentials (password command)");
    CHECK_FALSE(enroot_credentials(ref_of("fail.example")).has_value());
    CHECK(logs.text.find("exited with status 4: nope") != std::string::npos);
    // Group-writable: someone else could have put the command there; refused.
    REQUIRE(::chmod((sb.dir + "/enroot/.credentials").c_str(), 0664) == 0);
    CHECK_FALSE(enroot_credentials(ref_of("reg.example")).has_value());
    CHECK(logs.text.find("refusing to run the password command for reg.example") != std::string::npos);
}

TEST_CASE("run_command: output, exit status, and the whole process group killed on timeout", "[auth][process]") {
    auto r = auth::run_command({"/bin/sh", "-c", "read x; echo \"got $x\"; echo err >&2; exit 3"}, "input\n", 5);
    REQUIRE(r.ok());
    CHECK(r->out == "got input\n");
    CHECK(r->err == "err\n");
    CHECK(r->exit_status == 3);
    std::string marker = "/tmp/gantry-auth-test-grandchild-" + std::to_string(::getpid());
    auto t0 = std::chrono::steady_clock::now();
    r = auth::run_command({"/bin/sh", "-c", "(sleep 2; touch " + marker + ") & sleep 30"}, "", 0.3);
    REQUIRE_FALSE(r.ok());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    ::sleep(3);
    CHECK(::access(marker.c_str(), F_OK) != 0);  // the grandchild died with the group
    ::unlink(marker.c_str());
    CHECK_FALSE(auth::run_command({"/nonexistent/helper"}, "", 1).ok());
}

TEST_CASE("the default chain: order and sources named", "[auth][chain]") {
    Sandbox sb;
    sb.env.set("ENROOT_CONFIG_PATH", sb.dir + "/enroot");
    sb.write("enroot/.credentials", "machine reg.example login enroot password e\n");
    sb.write("run/containers/auth.json", R"({"auths":{"reg.example":{"username":"podman","password":"p"}}})");
    auto lookup = default_credential_lookup();
    CHECK(lookup(ref_of("reg.example"))->username == "podman");
    sb.write(".docker/config.json", R"({"auths":{"reg.example":{"username":"docker","password":"d"}}})");
    CHECK(lookup(ref_of("reg.example"))->username == "docker");
    CHECK_FALSE(lookup(ref_of("nothing.example")).has_value());
    auto s = default_credential_sources();
    CHECK(s.find("~/.docker/config.json") == 0);
    CHECK(s.find("containers/auth.json") != std::string::npos);
    CHECK(s.find("~/enroot/.credentials") != std::string::npos);
    CHECK(s.find("native ECR") != std::string::npos);
    CHECK(base64_decode(base64_encode("AWS:x")) == std::optional<std::string>("AWS:x"));
}

TEST_CASE("base64: RFC 4648 vectors, unpadded and URL-safe input, bad input refused") {
    const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                           {"f", "Zg=="},
                                                           {"fo", "Zm8="},
                                                           {"foo", "Zm9v"},
                                                           {"foob", "Zm9vYg=="},
                                                           {"fooba", "Zm9vYmE="},
                                                           {"foobar", "Zm9vYmFy"}};
    for (const auto& [plain, coded] : vectors) {
        CHECK(base64_encode(plain) == coded);
        CHECK(base64_decode(coded) == std::optional<std::string>(plain));
    }
    CHECK(base64_decode("Zm9vYg") == std::optional<std::string>("foob"));  // padding left out
    CHECK(base64_decode("Zm9vYmE") == std::optional<std::string>("fooba"));
    CHECK(base64_decode("-_8=") == base64_decode("+/8="));  // URL-safe alphabet
    CHECK(base64_decode(base64_encode(std::string("\0\xff\x10", 3))) ==
          std::optional<std::string>(std::string("\0\xff\x10", 3)));
    CHECK_FALSE(base64_decode("Zm9vY").has_value());  // a lone trailing character
    CHECK_FALSE(base64_decode("Zm 9v").has_value());
    CHECK_FALSE(base64_decode("Zm9v!").has_value());
    CHECK_FALSE(base64_decode("Zm=9v").has_value());  // padding inside
}

TEST_CASE("STS answers: credentials with entities decoded, error answers, a DTD refused") {
    auto ok = auth::parse_sts_answer(R"(<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser><Arn>arn:aws:sts::123:assumed-role/r/s</Arn></AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIAEXAMPLE</AccessKeyId>
      <SecretAccessKey>se&amp;cr&#x65;t/+=</SecretAccessKey>
      <SessionToken><![CDATA[tok<en>]]></SessionToken>
      <Expiration>2030-01-02T03:04:05.123Z</Expiration>
    </Credentials>
  </AssumeRoleResult>
</AssumeRoleResponse>)");
    CHECK(ok.xml);
    CHECK(ok.creds.key.access_key_id == "ASIAEXAMPLE");
    CHECK(ok.creds.key.secret_access_key == "se&cret/+=");
    CHECK(ok.creds.key.session_token == "tok<en>");
    CHECK(ok.creds.expiration == 1893553445);
    CHECK(ok.code.empty());

    auto err = auth::parse_sts_answer(R"(<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>Sender</Type><Code>AccessDenied</Code><Message>User &quot;x&quot; is not authorized</Message></Error>
  <RequestId>1</RequestId></ErrorResponse>)");
    CHECK(err.xml);
    CHECK(err.code == "AccessDenied");
    CHECK(err.message == "User \"x\" is not authorized");
    CHECK(err.creds.key.access_key_id.empty());

    // What STS never sends: a DTD (entity tricks), broken XML, an HTML error page.
    auto dtd = auth::parse_sts_answer(R"(<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "ASIA">]>
<r><Credentials><AccessKeyId>&a;</AccessKeyId></Credentials></r>)");
    CHECK_FALSE(dtd.xml);
    CHECK(dtd.creds.key.access_key_id.empty());
    CHECK_FALSE(auth::parse_sts_answer("<r><Credentials><AccessKeyId>x</AccessKeyId>").xml);
    CHECK_FALSE(auth::parse_sts_answer("").xml);
    auto html = auth::parse_sts_answer("<html><body>502 Bad Gateway</body></html>");
    CHECK(html.xml);
    CHECK(html.code.empty());
    CHECK(html.creds.key.access_key_id.empty());
}

TEST_CASE("credential JSON (IMDS, container endpoint, credential_process) and ECR token answers") {
    auto c = auth::parse_credentials_json(
        R"({"Code":"Success","AccessKeyId":"A","SecretAccessKey":"S","Token":"T","Expiration":"2030-01-02T03:04:05Z"})",
        "imds", "Token");
    REQUIRE(c.ok());
    CHECK(c->key.session_token == "T");
    CHECK(c->expiration == 1893553445);
    CHECK(c->source == "imds");
    CHECK(auth::parse_credentials_json(R"({"Code":"Throttled"})", "imds", "Token").error().message ==
          "imds: answered Code Throttled");
    CHECK(auth::parse_credentials_json("[1]", "imds", "Token").error().message == "imds: the answer is not JSON");
    CHECK(auth::parse_credentials_json(R"({"AccessKeyId":7})", "imds", "Token").error().message ==
          "imds: the answer holds no AccessKeyId/SecretAccessKey");

    const std::time_t now = 1700000000;
    auto t =
        auth::parse_ecr_token_answer(R"({"authorizationData":[{"authorizationToken":")" + base64_encode("AWS:pa:ss") +
                                         R"(","expiresAt":1700003600.5,"proxyEndpoint":"https://x"}]})",
                                     now, "ecr");
    REQUIRE(t.ok());
    CHECK(t->username == "AWS");
    CHECK(t->password == "pa:ss");
    CHECK(t->expires_at == 1700003600);
    auto no_expiry = auth::parse_ecr_token_answer(
        R"({"authorizationData":[{"authorizationToken":")" + base64_encode("AWS:p") + R"(","expiresAt":1e300}]})", now,
        "ecr");
    REQUIRE(no_expiry.ok());
    CHECK(no_expiry->expires_at == now + 12 * 3600);
    // Below one second after the epoch (it would floor to 0, "unknown"): the default too; 1 is a time.
    auto expiry_at = [&](const std::string& value) {
        return auth::parse_ecr_token_answer(R"({"authorizationData":[{"authorizationToken":")" +
                                                base64_encode("AWS:p") + R"(","expiresAt":)" + value + "}]}",
                                            now, "ecr")
            ->expires_at;
    };
    CHECK(expiry_at("0.5") == now + 12 * 3600);
    CHECK(expiry_at("0") == now + 12 * 3600);
    CHECK(expiry_at("-3") == now + 12 * 3600);
    CHECK(expiry_at("1") == 1);
    CHECK(expiry_at("1.9") == 1);
    CHECK(auth::parse_ecr_token_answer(R"({"authorizationData":[]})", now, "ecr").error().message ==
          "ecr: unexpected answer");
    CHECK(auth::parse_ecr_token_answer(R"({"authorizationData":[{"authorizationToken":7}]})", now, "ecr")
              .error()
              .message.find("not base64 of user:password") != std::string::npos);
    CHECK_FALSE(auth::parse_ecr_token_answer(R"({"authorizationData":[{"authorizationToken":"bm9jb2xvbg=="}]})", now,
                                             "ecr")
                    .ok());  // "nocolon"
}

// Driven by tests/integration/auth.bats, never by a plain run: prints the ECR token request signed for
//   GANTRY_AUTH_REGISTRY (an ECR host or a GANTRY_TEST_ECR_REGISTRIES alias), GANTRY_AUTH_DATE,
//   AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN
// as "url <url>", "header <Name>: <value>" lines and "body <body>".
TEST_CASE("auth driver", "[.driver]") {
    auto env = [](const char* n) -> std::string {
        const char* v = std::getenv(n);
        return v != nullptr ? v : "";
    };
    auto reg = auth::parse_ecr_registry(env("GANTRY_AUTH_REGISTRY"));
    REQUIRE(reg.has_value());
    sigv4::Key key{env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")};
    auto req = auth::ecr_token_request(*reg, key, env("GANTRY_AUTH_DATE"));
    std::cout << "url " << req.url << "\n";
    for (const auto& [n, v] : req.headers) std::cout << "header " << n << ": " << v << "\n";
    std::cout << "body " << req.body << std::endl;
}

// Found by tests/fuzz/fuzz_docker_config: nlohmann's out_of_range for a huge number escaped the
// parse_error handler and ended the process.
TEST_CASE("config.json: a number out of range is a warning, not a crash; parsing runs no helper", "[auth]") {
    ImageReference ref{"", "127.0.0.1:5000", "team/app", "v1", ""};
    auto huge = auth::parse_docker_config(R"({"auths":{},"x":1e99999})", ref, false, "config.json");
    CHECK_FALSE(huge.credentials);
    CHECK(huge.problem.find("ignoring config.json") == 0);
    auto helpers = auth::parse_docker_config(
        R"({"credHelpers":{"127.0.0.1:5000":"one"},"credsStore":"two","auths":{"127.0.0.1:5000":{"auth":"dTpw"}}})",
        ref, false, "config.json");
    REQUIRE(helpers.helpers.size() == 2);
    CHECK(helpers.helpers[0].first == "one");
    CHECK(helpers.helpers[1].first == "two");
    REQUIRE(helpers.credentials);
    CHECK(helpers.credentials->username == "u");
    CHECK(helpers.credentials->password == "p");
}
