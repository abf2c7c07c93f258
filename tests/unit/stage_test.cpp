// Unit tests of runtime/stage (include/gantry/stage_service.hpp): the request's checks, and the accept
// loop on a real Unix socket in a forked server: a silent client does not delay another's answer, the
// per-uid limit refuses at once, an oversized line is answered with an error. The store-account pull
// behind it is integration.trusted_store's.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>

#include "gantry/auth.hpp"
#include "gantry/fd.hpp"
#include "gantry/stage_service.hpp"

using namespace gantry;

namespace {

const std::string kDigest = "sha256:" + std::string(64, 'a');

// A server in a child process on a fresh socket; killed when the scope ends.
struct ForkedServer {
    std::string dir, path;
    pid_t pid = -1;
    explicit ForkedServer(unsigned per_uid) {
        char tmpl[] = "/tmp/gantry-stage-test.XXXXXX";
        dir = ::mkdtemp(tmpl);
        path = dir + "/s.sock";
        auto fd = listen_on_stage_socket(path);
        REQUIRE(fd);
        pid = ::fork();
        if (pid == 0) {
            StageServerOptions o;
            o.listen_fd = *fd;
            o.read_deadline = std::chrono::seconds(30);
            o.max_requests_per_uid = per_uid;
            o.handle = [](const StagePeer& peer, const StageRequest& r) {
                return "ok " + r.image.substr(r.image.find('@') + 1) + " uid=" + std::to_string(peer.uid);
            };
            (void)serve_stage_requests(o);
            ::_exit(0);
        }
        ::close(*fd);
    }
    ~ForkedServer() {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        ::unlink(path.c_str());
        ::rmdir(dir.c_str());
    }
};

UniqueFd connect_to(const std::string& path) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    path.copy(a.sun_path, path.size());
    REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    return fd;
}

std::string read_answer(int fd) {
    std::string out;
    char c;
    while (::read(fd, &c, 1) == 1 && c != '\n') out += c;
    return out;
}

}  // namespace

TEST_CASE("a stage request is IMAGE@DIGEST with credentials for its registry; other members are ignored") {
    StageRequest r{"reg.example:5000/team/app:1@" + kDigest,
                   encode_credential_hand_over("reg.example:5000", Credentials{"u", "p", "", "test"})};
    auto line = encode_stage_request(r);
    REQUIRE(line.back() == '\n');
    auto back = decode_stage_request(line.substr(0, line.size() - 1));
    REQUIRE(back);
    CHECK(back->image == r.image);
    CHECK(credential_hand_over_registry(back->credentials).value() == "reg.example:5000");

    // A forged identity in the message is just an unknown member.
    auto forged =
        decode_stage_request(R"({"image":"reg.example:5000/app@)" + kDigest + R"(","credentials":{},"uid":0})");
    REQUIRE(forged);
    CHECK(forged->credentials == "{}");

    CHECK_FALSE(decode_stage_request(R"({"image":"reg.example:5000/app:1","credentials":{}})"));  // no digest
    CHECK_FALSE(decode_stage_request(R"({"image":"local/app@)" + kDigest + R"("})"));             // imported
    CHECK_FALSE(decode_stage_request("not json"));
    CHECK_FALSE(decode_stage_request(R"({"credentials":{}})"));
    auto elsewhere = decode_stage_request(R"({"image":"reg.example:5000/app@)" + kDigest +
                                          R"(","credentials":{"registry":"other.example","username":"u"}})");
    REQUIRE_FALSE(elsewhere);
    CHECK(elsewhere.error().message.find("not for the image's registry") != std::string::npos);
    CHECK_FALSE(decode_stage_request(std::string(kMaxStageRequestBytes + 1, ' ')));
}

TEST_CASE(
    "the stage server: a silent client stalls nobody, the per-uid limit refuses at once, a huge line is refused") {
    ForkedServer server(2);
    // One silent connection (holds one child until the 30 s deadline).
    UniqueFd silent = connect_to(server.path);
    // Another request is answered meanwhile.
    StageRequest r{"reg.example/app@" + kDigest, "{}"};
    auto said = send_stage_request(server.path, r, true, std::chrono::seconds(10));
    REQUIRE(said);
    CHECK(*said == "ok " + kDigest + " uid=" + std::to_string(::getuid()));
    ::usleep(300 * 1000);  // its child has exited and no longer counts against this uid's limit

    // A line over the limit, without a newline: one error line.
    UniqueFd huge = connect_to(server.path);
    std::string big(kMaxStageRequestBytes + 4096, 'x');
    (void)!::send(huge.get(), big.data(), big.size(), MSG_NOSIGNAL);
    CHECK(read_answer(huge.get()) == "error reading the request: longer than 65536 bytes");
    char rest;
    while (::read(huge.get(), &rest, 1) == 1) {
    }                      // the server's child closed it: it is exiting
    ::usleep(300 * 1000);  // and has exited, so it no longer counts against this uid's limit

    // Two silent connections of this uid: a third is refused without waiting for either.
    UniqueFd silent2 = connect_to(server.path);
    ::usleep(500 * 1000);  // the server accepted both (it polls every 200 ms)
    auto refused = send_stage_request(server.path, r, true, std::chrono::seconds(10));
    REQUIRE(refused);
    CHECK(refused->rfind("error the stage server is busy (too many requests of yours at once)", 0) == 0);
}
