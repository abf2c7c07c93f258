// Unit tests of the one HTTP client (runtime/net): its URL helpers, and requests against small real
// HTTP servers on loopback sockets (each answers from a script and records what it was sent): the
// Authorization value kept on a same-origin redirect and dropped on a cross-origin one (ECR -> S3),
// POST bodies, a POST's 3xx returned rather than followed, the header size limit, fetch's errors, and
// the system CA store trusted by its directory first (a real TLS server: openssl s_server).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../../runtime/net/http.hpp"
#include "gantry/fd.hpp"

using namespace gantry;

namespace {

// A loopback HTTP server that answers its connections, one request each, with `answers` in turn, and
// keeps the requests it read (head and body). It waits at most 10 s for each connection and read, so
// that a client that never comes fails the test instead of hanging it.
class ScriptedServer {
public:
    explicit ScriptedServer(std::vector<std::string> answers) : answers_(std::move(answers)) {
        listener_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        REQUIRE(listener_.valid());
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
        socklen_t len = sizeof(addr);
        REQUIRE(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
        port_ = ntohs(addr.sin_port);
        REQUIRE(::listen(listener_.get(), 8) == 0);
        REQUIRE(::setsockopt(listener_.get(), SOL_SOCKET, SO_RCVTIMEO, &kPatience, sizeof(kPatience)) == 0);
        thread_ = std::thread([this] { serve(); });
    }
    ~ScriptedServer() {
        if (thread_.joinable()) thread_.join();
    }
    ScriptedServer(const ScriptedServer&) = delete;
    ScriptedServer& operator=(const ScriptedServer&) = delete;

    [[nodiscard]] std::string url(const std::string& path = "/") const {
        return "http://127.0.0.1:" + std::to_string(port_) + path;
    }
    // The requests received: waits until every answer was given (or the server gave up).
    const std::vector<std::string>& requests() {
        if (thread_.joinable()) thread_.join();
        return requests_;
    }

private:
    void serve() {
        for (const auto& answer : answers_) {
            UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
            if (!conn.valid()) return;
            (void)::setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &kPatience, sizeof(kPatience));
            std::string request;
            char buf[4096];
            size_t body_left = std::string::npos;
            while (body_left != 0) {
                ssize_t n = ::read(conn.get(), buf, sizeof(buf));
                if (n <= 0) break;
                request.append(buf, static_cast<size_t>(n));
                auto end = request.find("\r\n\r\n");
                if (end == std::string::npos) continue;
                auto cl = request.find("Content-Length: ");
                size_t length = cl != std::string::npos && cl < end ? std::stoul(request.substr(cl + 16)) : 0;
                body_left = request.size() >= end + 4 + length ? 0 : 1;
            }
            requests_.push_back(request);
            for (size_t off = 0; off < answer.size();) {
                // MSG_NOSIGNAL: a client that stops reading (the header limit) must not kill the test with SIGPIPE.
                ssize_t n = ::send(conn.get(), answer.data() + off, answer.size() - off, MSG_NOSIGNAL);
                if (n <= 0) break;
                off += static_cast<size_t>(n);
            }
        }
    }

    static constexpr timeval kPatience{10, 0};
    std::vector<std::string> answers_;
    std::vector<std::string> requests_;
    UniqueFd listener_;
    uint16_t port_ = 0;
    std::thread thread_;
};

std::string answer(const std::string& status_line, const std::string& headers, const std::string& body = {}) {
    return "HTTP/1.1 " + status_line + "\r\n" + headers + "Content-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
}

bool has_authorization(const std::string& request) {
    return request.find("Authorization:") != std::string::npos;
}

}  // namespace

TEST_CASE("URL helpers: origin, host, Host header, local plain HTTP, redaction, escaping", "[net][url]") {
    CHECK(net::origin_of("HTTPS://Registry.Example.COM/v2/x") == "https://registry.example.com:443");
    CHECK(net::origin_of("http://127.0.0.1:5000/v2/") == "http://127.0.0.1:5000");
    CHECK(net::origin_of("not a url").empty());
    CHECK(net::host_of("http://[::1]:5000/v2/") == "::1");
    CHECK(net::host_of("https://user@S3.amazonaws.com/bucket?x=1") == "s3.amazonaws.com");
    CHECK(net::host_header("https://sts.amazonaws.com:443/") == "sts.amazonaws.com");
    CHECK(net::host_header("http://127.0.0.1:8080/x?y") == "127.0.0.1:8080");
    CHECK(net::host_header("https://api.ecr.us-east-1.amazonaws.com") == "api.ecr.us-east-1.amazonaws.com");
    CHECK(net::is_local_http("http://169.254.169.254/latest/api/token"));
    CHECK(net::is_local_http("http://LOCALHOST:9000/"));
    CHECK(net::is_local_http("http://[fd00:ec2::254]/"));
    CHECK_FALSE(net::is_local_http("http://example.com/"));
    CHECK_FALSE(net::is_local_http("https://127.0.0.1/"));
    CHECK(net::redact_url("https://s3.example/blob?X-Amz-Signature=secret") == "https://s3.example/blob?…");
    CHECK(net::redact_url("https://s3.example/blob") == "https://s3.example/blob");
    CHECK(net::escape("a b/c~d+e=") == "a%20b%2Fc~d%2Be%3D");
}

TEST_CASE("Redirects: Authorization kept on the same origin, dropped on another (ECR -> S3)", "[net][redirect]") {
    ScriptedServer s3({answer("200 OK", "", "layer bytes")});
    ScriptedServer registry({answer("307 Temporary Redirect", "Location: /v2/blobs/moved\r\n"),
                             answer("307 Temporary Redirect", "Location: " + s3.url("/bucket/blob?sig=1") + "\r\n")});
    net::Connection conn(net::make_transport(net::settings_from_environment()));
    net::Request req;
    req.url = registry.url("/v2/blobs/sha256:1");
    req.authorization = "Bearer registry-token";
    auto resp = conn.perform(req);
    REQUIRE(resp.ok());
    CHECK(resp->status == 200);
    CHECK(resp->body == "layer bytes");
    CHECK(resp->url == s3.url("/bucket/blob?sig=1"));
    REQUIRE(registry.requests().size() == 2);
    CHECK(registry.requests()[0].find("Authorization: Bearer registry-token") != std::string::npos);
    CHECK(registry.requests()[1].find("Authorization: Bearer registry-token") != std::string::npos);
    REQUIRE(s3.requests().size() == 1);
    CHECK_FALSE(has_authorization(s3.requests()[0]));
}

TEST_CASE("Redirects: none followed with max_redirects 0, nor for a POST", "[net][redirect]") {
    ScriptedServer server(
        {answer("302 Found", "Location: /elsewhere\r\n"), answer("303 See Other", "Location: /x\r\n")});
    net::Request get;
    get.url = server.url("/latest/api/token");
    get.max_redirects = 0;
    auto first = net::fetch(get, net::settings_from_environment());
    REQUIRE(first.ok());
    CHECK(first->status == 302);
    net::Request post;
    post.method = "POST";
    post.url = server.url("/token");
    post.body = "grant_type=refresh_token&refresh_token=" + net::escape("r/t");
    auto second = net::fetch(post, net::settings_from_environment());
    REQUIRE(second.ok());
    CHECK(second->status == 303);
    REQUIRE(server.requests().size() == 2);
    const std::string& sent = server.requests()[1];
    CHECK(sent.rfind("POST /token HTTP/1.1\r\n", 0) == 0);
    CHECK(sent.find("Expect:") == std::string::npos);
    CHECK(sent.substr(sent.find("\r\n\r\n") + 4) == "grant_type=refresh_token&refresh_token=r%2Ft");
}

TEST_CASE("fetch: an answer whose headers pass the limit, and no answer at all, are errors", "[net][limits]") {
    const std::string padding = "X-Padding: " + std::string(1000, 'p') + "\r\n";
    std::string huge;
    while (huge.size() <= net::kMaxResponseHeaderBytes) huge += padding;
    std::string refused_url;
    {
        ScriptedServer server({answer("200 OK", huge, "{}")});
        net::Request req;
        req.url = server.url("/v2/credentials?token=secret");
        auto resp = net::fetch(req, net::settings_from_environment());
        REQUIRE_FALSE(resp.ok());
        CHECK(resp.error().message.rfind(
                  "GET " + server.url("/v2/credentials?…") + ": the server's response headers passed 256 KiB", 0) == 0);
        refused_url = server.url();
    }
    // The server is gone: nothing listens on its port any more.
    net::Request req;
    req.url = refused_url;
    req.connect_timeout_ms = 2000;
    auto resp = net::fetch(req, net::settings_from_environment());
    REQUIRE_FALSE(resp.ok());
    CHECK(resp.error().message.rfind("GET " + refused_url + ": ", 0) == 0);
}

namespace {

int run_shell(const std::string& command) {
    int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A loopback TLS server (`openssl s_server -www`, which answers any GET with a status page) with a
// certificate of a CA made for the test, and that CA as a bundle file and as a directory of
// hash-named certificates, as the system keeps its own.
class TlsServer {
public:
    TlsServer() {
        char tmpl[] = "/tmp/gantry-net-tls-XXXXXX";
        REQUIRE(::mkdtemp(tmpl) != nullptr);
        dir_ = tmpl;
        const std::string d = dir_;
        REQUIRE(run_shell("cd " + d +
                          " && mkdir cadir emptydir && "
                          "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gantry-net-test-ca "
                          "-keyout ca.key -out ca.pem >/dev/null 2>&1 && "
                          "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout srv.key -out srv.csr "
                          ">/dev/null 2>&1 && printf 'subjectAltName=IP:127.0.0.1\\n' > ext && "
                          "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
                          "-extfile ext -out srv.pem >/dev/null 2>&1 && "
                          "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gantry-net-test-other "
                          "-keyout other.key -out other.pem >/dev/null 2>&1 && "
                          "cp ca.pem cadir/ && ln -s ca.pem cadir/$(openssl x509 -hash -noout -in ca.pem).0") == 0);
        // A free port (the kernel's pick, released for the server: a race only with other tests).
        UniqueFd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
        socklen_t len = sizeof(addr);
        REQUIRE(::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
        port_ = ntohs(addr.sin_port);
        probe.reset();
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            const std::string accept = "127.0.0.1:" + std::to_string(port_);
            const std::string cert = d + "/srv.pem", key = d + "/srv.key";
            ::execlp("openssl", "openssl", "s_server", "-quiet", "-www", "-accept", accept.c_str(), "-cert",
                     cert.c_str(), "-key", key.c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
        // Up once it accepts a connection (at most 10 s).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (;;) {
            UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
            if (::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
            REQUIRE(std::chrono::steady_clock::now() < deadline);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    ~TlsServer() {
        if (pid_ > 0) {
            ::kill(pid_, SIGTERM);
            ::waitpid(pid_, nullptr, 0);
        }
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    TlsServer(const TlsServer&) = delete;
    TlsServer& operator=(const TlsServer&) = delete;

    [[nodiscard]] std::string url() const { return "https://127.0.0.1:" + std::to_string(port_) + "/"; }
    [[nodiscard]] std::string path(const std::string& name) const { return dir_ + "/" + name; }

private:
    std::string dir_;
    uint16_t port_ = 0;
    pid_t pid_ = -1;
};

}  // namespace

TEST_CASE("System CA store: trusted by its directory alone first, the bundle once the directory cannot verify",
          "[net][tls]") {
    TlsServer server;
    net::Request req;
    req.url = server.url();
    req.connect_timeout_ms = 5000;
    net::TransportSettings base;
    base.user_agent = "gantry-test";

    SECTION("the directory verifies: the bundle is never read (it does not exist)") {
        auto s = base;
        s.system_ca_file = server.path("no-such-bundle.pem");
        s.system_ca_dir = server.path("cadir");
        auto resp = net::fetch(req, s);
        REQUIRE(resp.ok());
        CHECK(resp->status == 200);
        // The same, named by SSL_CERT_FILE / SSL_CERT_DIR equal to the system's.
        s.ca_file = s.system_ca_file;
        s.ca_dir = s.system_ca_dir;
        auto named = net::fetch(req, s);
        REQUIRE(named.ok());
        CHECK(named->status == 200);
    }
    SECTION("the directory lacks the CA: the same request again with the bundle") {
        auto s = base;
        s.system_ca_file = server.path("ca.pem");
        s.system_ca_dir = server.path("emptydir");
        net::Connection conn(net::make_transport(s));
        for (int i = 0; i < 2; ++i) {  // the second on the remembered bundle
            auto resp = conn.perform(req);
            REQUIRE(resp.ok());
            CHECK(resp->curl_code == 0);
            CHECK(resp->status == 200);
        }
    }
    SECTION("neither holds the CA: a verification error, once") {
        auto s = base;
        s.system_ca_file = server.path("other.pem");  // another CA
        s.system_ca_dir = server.path("emptydir");
        auto resp = net::fetch(req, s);
        REQUIRE_FALSE(resp.ok());
        CHECK(resp.error().message.find("SSL certificate problem") != std::string::npos);
    }
    SECTION("SSL_CERT_FILE naming another bundle replaces the system's store") {
        auto s = base;
        s.system_ca_file = server.path("other.pem");
        s.system_ca_dir = server.path("emptydir");
        s.ca_file = server.path("ca.pem");
        auto resp = net::fetch(req, s);
        REQUIRE(resp.ok());
        CHECK(resp->status == 200);
    }
}
