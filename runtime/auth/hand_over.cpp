// The credential hand-over between a user's process and a pull run by the store account (auth.hpp):
// both the nodes' two-halves pull (plugin/pull.cpp) and the login nodes' stage server
// (runtime/stage) carry exactly this JSON, so there is one format and one parser for it.
#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gantry/auth.hpp"

namespace gantry {

std::string encode_credential_hand_over(const std::string& registry, const std::optional<Credentials>& found) {
    if (!found) return "{}";
    nlohmann::json j = {{"registry", registry},
                        {"username", found->username},
                        {"password", found->password},
                        {"identity_token", found->identity_token},
                        {"source", found->source}};
    return j.dump();
}

namespace {

struct HandOver {
    std::string registry;
    std::optional<Credentials> credentials;
};

Result<HandOver> parse_hand_over(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("the handed-over credentials are not a JSON object");
    if (j.empty()) return HandOver{};
    HandOver h;
    Credentials c;
    try {
        h.registry = j.at("registry").get<std::string>();
        c.username = j.value("username", "");
        c.password = j.value("password", "");
        c.identity_token = j.value("identity_token", "");
        c.source = j.value("source", "") + " (the user's, handed over to the store account)";
    } catch (const nlohmann::json::exception&) {
        return make_error("the handed-over credentials name no registry");
    }
    if (h.registry.empty()) return make_error("the handed-over credentials name no registry");
    h.credentials = std::move(c);
    return h;
}

}  // namespace

Result<std::string> credential_hand_over_registry(const std::string& text) {
    auto h = parse_hand_over(text);
    if (!h) return h.error();
    return h->registry;
}

Result<CredentialLookup> decode_credential_hand_over(const std::string& text) {
    auto h = parse_hand_over(text);
    if (!h) return h.error();
    if (!h->credentials) return CredentialLookup([](const ImageReference&) { return std::optional<Credentials>(); });
    // Only for the registry the user's side looked them up for: the pull never goes anywhere else with them.
    return CredentialLookup([c = *h->credentials, registry = h->registry](const ImageReference& r) {
        return r.registry == registry ? std::optional<Credentials>(c) : std::nullopt;
    });
}

}  // namespace gantry

namespace gantry {

std::vector<std::string> store_owner_pull_argv(const std::string& program, const std::string& store,
                                               const std::string& image, bool whole) {
    std::vector<std::string> argv = {program,
                                     "pull",
                                     "--quiet",
                                     "--credentials-fd",
                                     std::to_string(kHandOverCredentialsFd),
                                     "--report-fd",
                                     std::to_string(kHandOverReportFd),
                                     "--store",
                                     store};
    if (whole) argv.push_back("--whole");
    argv.push_back(image);
    return argv;
}

std::vector<std::string> store_owner_pull_environment(const std::string& home, const std::string& user,
                                                      const std::string& config_path,
                                                      const std::map<std::string, std::string>& proxies,
                                                      const std::vector<std::string>& extra) {
    std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home, "USER=" + user,
                                    "LANG=C.UTF-8"};
    if (!config_path.empty()) env.push_back("GANTRY_CONFIG=" + config_path);
    for (const auto& [name, value] : proxies) env.push_back(name + "=" + value);
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
}

Result<UniqueFd> hand_over_pipe(const std::string& hand_over) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) return system_error("creating a pipe for the credentials");
    UniqueFd read_end(pipefd[0]);
    UniqueFd write_end(pipefd[1]);
    (void)::fcntl(write_end.get(), F_SETFL, O_NONBLOCK);
    (void)::fcntl(write_end.get(), F_SETPIPE_SZ, 1 << 20);
    const std::string text = hand_over.empty() ? "{}" : hand_over;
    if (::write(write_end.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return system_error("handing the credentials to the store account's pull");
    return read_end;
}

}  // namespace gantry
