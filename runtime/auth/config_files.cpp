// Credentials from JSON config files in Docker's format: Docker's config.json (credHelpers, credsStore,
// auths with auth / username+password / identitytoken) and Podman/containers auth.json (same format;
// keys may name a repository namespace, the most specific match wins), and the credential-helper
// protocol (`docker-credential-<name> get`, registry on stdin, JSON on stdout) that both use.
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "auth/internal.hpp"
#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace auth {

net::Request endpoint_request(std::string method, std::string url) {
    net::Request req;
    req.method = std::move(method);
    req.url = std::move(url);
    req.timeout_s = 30;
    req.connect_timeout_ms = 10000;
    req.max_redirects = 0;
    req.max_body = size_t{4} << 20;  // no credential answer is this big
    return req;
}

net::TransportSettings aws_tls() {
    net::TransportSettings tls = net::settings_from_environment();
    if (std::string bundle = environment().aws_ca_bundle.value; !bundle.empty()) tls.ca_file = bundle;
    return tls;
}

std::string home_dir() {
    std::string home = environment().home.value;
    if (!home.empty()) return home;
    struct passwd* pw = ::getpwuid(::geteuid());
    return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "";
}

std::string display_path(const std::string& path) {
    std::string home = home_dir();
    if (!home.empty() && path.rfind(home + "/", 0) == 0) return "~" + path.substr(home.size());
    return path;
}

namespace {

bool is_hub(const std::string& h) {
    return h == "index.docker.io" || h == "docker.io" || h == "registry-1.docker.io" || h == "registry.hub.docker.com";
}

// A key as Docker or Podman writes it ("https://index.docker.io/v1/", "http://host:5000",
// "host:5000/team") split into lower-case host[:port] and the path after it (no slashes around).
std::pair<std::string, std::string> split_key(std::string key) {
    for (const char* scheme : {"https://", "http://"})
        if (key.rfind(scheme, 0) == 0) key = key.substr(std::string(scheme).size());
    std::string path;
    auto slash = key.find('/');
    if (slash != std::string::npos) {
        path = key.substr(slash + 1);
        key = key.substr(0, slash);
    }
    while (!path.empty() && path.back() == '/') path.pop_back();
    if (path == "v1" || path == "v2") path.clear();  // Docker's legacy URL forms
    return {lower(key), path};
}

bool same_host(const std::string& a, const std::string& b) {
    return a == b || (is_hub(a) && is_hub(b));
}

// How well `key` matches ref: -1 no match, else the length of its namespace (longer is more specific).
// Docker ignores namespaces (`namespaces` false): every key of the right host matches equally.
int key_match(const std::string& key, const ImageReference& ref, bool namespaces) {
    auto [host, path] = split_key(key);
    if (!same_host(host, lower(ref.registry))) return -1;
    if (!namespaces || path.empty()) return 0;
    if (ref.repository == path || ref.repository.rfind(path + "/", 0) == 0) return static_cast<int>(path.size());
    return -1;
}

// The name a credential helper is asked about: Docker Hub under its v1 URL as `docker login` stores
// it; a registry declared as ECR in tests under its ECR name (docs/auth.md).
std::string helper_server_name(const ImageReference& ref) {
    if (auto ecr = parse_ecr_registry(ref.registry); ecr && ecr->ecr_host != ref.registry) return ecr->ecr_host;
    if (is_hub(lower(ref.registry))) return "https://index.docker.io/v1/";
    return ref.registry;
}

std::optional<Credentials> from_helper(const std::string& helper, const ImageReference& ref, const std::string& how) {
    auto got = credential_helper_get(helper, helper_server_name(ref));
    if (!got) {
        log::warning("no credentials for " + ref.registry + " from " + how + ": " + got.error().message);
        return std::nullopt;
    }
    return *got;
}

}  // namespace

DockerConfigAnswer parse_docker_config(std::string_view text, const ImageReference& ref, bool namespaces,
                                       const std::string& source) {
    DockerConfigAnswer out;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        out.problem = "ignoring " + source + ": not valid JSON (syntax error at byte " + std::to_string(e.byte) +
                      "); fix or remove the file";
        return out;
    } catch (const nlohmann::json::exception&) {
        // A number too large for a double ("1e99999") is out_of_range, not parse_error; uncaught, it
        // ended the process (found by tests/fuzz/fuzz_docker_config).
        out.problem = "ignoring " + source + ": not usable JSON (a number out of range); fix or remove the file";
        return out;
    }
    if (!j.is_object()) {
        out.problem = "ignoring " + source + ": not a JSON object";
        return out;
    }
    // credHelpers for this registry first, then the default store, then the file itself: Docker's order.
    auto helpers = j.find("credHelpers");
    if (helpers != j.end() && helpers->is_object()) {
        int best = -1;
        std::string helper;
        for (auto it = helpers->begin(); it != helpers->end(); ++it) {
            int m = key_match(it.key(), ref, namespaces);
            if (m > best && it->is_string() && !it->get<std::string>().empty()) {
                best = m;
                helper = it->get<std::string>();
            }
        }
        if (!helper.empty())
            out.helpers.emplace_back(helper, "docker-credential-" + helper + " (credHelpers in " + source + ")");
    }
    auto store = j.find("credsStore");
    if (store != j.end() && store->is_string() && !store->get<std::string>().empty()) {
        const std::string helper = store->get<std::string>();
        out.helpers.emplace_back(helper, "docker-credential-" + helper + " (credsStore in " + source + ")");
    }
    auto auths = j.find("auths");
    if (auths == j.end() || !auths->is_object()) return out;
    const nlohmann::json* entry = nullptr;
    int best = -1;
    for (auto it = auths->begin(); it != auths->end(); ++it) {
        int m = key_match(it.key(), ref, namespaces);
        if (m > best && it->is_object()) {
            best = m;
            entry = &*it;
        }
    }
    if (entry == nullptr) return out;
    Credentials c;
    c.source = source;
    auto str = [&](const char* name) {
        auto it = entry->find(name);
        return it != entry->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (!str("identitytoken").empty()) {
        c.identity_token = str("identitytoken");
        c.username = "<token>";
        out.credentials = std::move(c);
        return out;
    }
    if (!str("auth").empty()) {
        auto decoded = base64_decode(str("auth"));
        auto colon = decoded ? decoded->find(':') : std::string::npos;
        if (!decoded || colon == std::string::npos) {
            out.problem = "ignoring the entry for " + ref.registry + " in " + source +
                          ": its \"auth\" is not base64 of user:password";
            return out;
        }
        c.username = decoded->substr(0, colon);
        c.password = decoded->substr(colon + 1);
        out.credentials = std::move(c);
        return out;
    }
    if (!str("username").empty() && !str("password").empty()) {
        c.username = str("username");
        c.password = str("password");
        out.credentials = std::move(c);
    }
    return out;  // else an empty entry (credsStore placeholder)
}

std::optional<std::string> read_source_file(const std::string& path, const std::string& source) {
    auto text = read_config_file(path, source);
    if (text) return std::move(*text);
    const Error& e = text.error();
    if (e.errnum == ENOENT || e.errnum == ENOTDIR) return std::nullopt;
    // The lookup runs with the job user's identity (also under slurmstepd): a file they cannot read
    // is theirs to fix.
    if (e.errnum == EACCES)
        log::warning("ignoring " + source + ": not readable by you (permission denied)");
    else
        log::warning(e.message + "; ignoring it");
    return std::nullopt;
}

namespace {

// One file in Docker's format. `namespaces`: auth.json semantics (keys may carry a repository path).
std::optional<Credentials> lookup_file(const std::string& path, const std::string& source, const ImageReference& ref,
                                       bool namespaces) {
    auto text = read_source_file(path, source);
    if (!text) return std::nullopt;
    // Parsing runs nothing; the helpers the file names run here, in Docker's order, before its auths.
    auto answer = parse_docker_config(*text, ref, namespaces, source);
    for (const auto& [helper, how] : answer.helpers) {
        auto c = from_helper(helper, ref, how);
        if (c) return c;
    }
    if (!answer.problem.empty()) log::warning(answer.problem);
    return answer.credentials;
}

std::vector<std::string> containers_auth_paths() {
    std::string file = environment().registry_auth_file.value;
    if (!file.empty()) return {file};
    std::vector<std::string> out;
    std::string run = environment().xdg_runtime_dir.value;
    if (run.empty()) run = "/run/user/" + std::to_string(::geteuid());
    out.push_back(run + "/containers/auth.json");
    std::string cfg = environment().xdg_config_home.value;
    if (cfg.empty() && !home_dir().empty()) cfg = home_dir() + "/.config";
    if (!cfg.empty()) out.push_back(cfg + "/containers/auth.json");
    return out;
}

}  // namespace

Result<std::optional<Credentials>> credential_helper_get(const std::string& helper, const std::string& server) {
    // The helper name comes from the user's own config file; it is one argv element and names a
    // program looked up in PATH, never a shell command line.
    if (helper.find('/') != std::string::npos || helper.find_first_of(" \t\n") != std::string::npos)
        return make_error("credential helper name \"" + helper + "\" is not a plain name");
    const std::string prog = "docker-credential-" + helper;
    auto out = run_command({prog, "get"}, server, helper_timeout_s());
    if (!out) return out.error();
    if (out->exit_status != 0) {
        // The protocol's "not found" answer, on stdout or stderr depending on the helper.
        std::string said = out->out + out->err;
        if (said.find("credentials not found") != std::string::npos) return std::optional<Credentials>();
        std::string first = said.substr(0, said.find('\n'));
        if (first.size() > 200) first = first.substr(0, 200) + "...";
        return make_error(prog + " get exited with status " + std::to_string(out->exit_status) +
                          (first.empty() ? "" : ": " + first));
    }
    auto j = nlohmann::json::parse(out->out, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("Secret") || !j["Secret"].is_string())
        return make_error(prog + " get: its answer is not the credential-helper JSON (Username, Secret)");
    Credentials c;
    c.source = prog;
    c.username = j.value("Username", "");
    if (c.username == "<token>")
        c.identity_token = j["Secret"].get<std::string>();
    else
        c.password = j["Secret"].get<std::string>();
    if (c.password.empty() && c.identity_token.empty()) return std::optional<Credentials>();
    return std::optional<Credentials>(std::move(c));
}

}  // namespace auth

std::string docker_config_source() {
    std::string dir = environment().docker_config.value;
    if (!dir.empty()) return dir + "/config.json";
    return "~/.docker/config.json";
}

std::optional<Credentials> docker_config_credentials(const ImageReference& ref) {
    std::string dir = environment().docker_config.value;
    if (dir.empty()) {
        std::string home = auth::home_dir();
        if (home.empty()) return std::nullopt;
        dir = home + "/.docker";
    }
    return auth::lookup_file(dir + "/config.json", docker_config_source(), ref, false);
}

std::string containers_auth_source() {
    std::string out;
    for (const auto& p : auth::containers_auth_paths()) out += (out.empty() ? "" : ", ") + auth::display_path(p);
    return out;
}

std::optional<Credentials> containers_auth_credentials(const ImageReference& ref) {
    for (const auto& p : auth::containers_auth_paths()) {
        auto c = auth::lookup_file(p, auth::display_path(p), ref, true);
        if (c) return c;
    }
    return std::nullopt;
}

}  // namespace gantry
