// The default credential source: the `auths` section of Docker's config.json. Issue 6 adds the
// other sources (credHelpers/credsStore, containers auth.json, Enroot's .credentials, native ECR)
// behind the same CredentialLookup; see docs/registry.md.
#include <pwd.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gantry/log.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "registry/auth.hpp"

namespace gantry {
namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
}

std::string home_dir() {
    std::string home = env("HOME");
    if (!home.empty()) return home;
    struct passwd* pw = ::getpwuid(::geteuid());
    return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "";
}

std::string config_path() {
    std::string dir = env("DOCKER_CONFIG");
    if (!dir.empty()) return dir + "/config.json";
    std::string home = home_dir();
    return home.empty() ? std::string() : home + "/.docker/config.json";
}

// An auths key as Docker writes it ("https://index.docker.io/v1/", "http://host:5000", "host:5000/")
// reduced to host[:port].
std::string key_host(std::string key) {
    for (const char* scheme : {"https://", "http://"})
        if (key.rfind(scheme, 0) == 0) key = key.substr(std::string(scheme).size());
    auto slash = key.find('/');
    if (slash != std::string::npos) key = key.substr(0, slash);
    for (char& c : key)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return key;
}

bool same_registry(const std::string& key, const std::string& registry) {
    std::string k = key_host(key);
    std::string r = key_host(registry);
    if (k == r) return true;
    // Docker Hub goes by several names; `docker login` stores it as https://index.docker.io/v1/.
    auto hub = [](const std::string& h) {
        return h == "index.docker.io" || h == "docker.io" || h == "registry-1.docker.io" ||
               h == "registry.hub.docker.com";
    };
    return hub(k) && hub(r);
}

}  // namespace

std::string docker_config_source() {
    std::string dir = env("DOCKER_CONFIG");
    if (!dir.empty()) return dir + "/config.json";
    return "~/.docker/config.json";
}

std::optional<Credentials> docker_config_credentials(const ImageReference& ref) {
    std::string path = config_path();
    if (path.empty()) return std::nullopt;
    std::ifstream in(path);
    if (!in) return std::nullopt;  // no file: no credentials from this source
    std::stringstream text;
    text << in.rdbuf();
    auto j = nlohmann::json::parse(text.str(), nullptr, false);
    const std::string source = docker_config_source();
    if (j.is_discarded() || !j.is_object()) {
        log::warning("ignoring " + source + ": not valid JSON");
        return std::nullopt;
    }
    auto auths = j.find("auths");
    if (auths == j.end() || !auths->is_object()) return std::nullopt;
    for (auto it = auths->begin(); it != auths->end(); ++it) {
        if (!same_registry(it.key(), ref.registry) || !it->is_object()) continue;
        const auto& entry = *it;
        Credentials c;
        c.source = source;
        auto auth = entry.find("auth");
        if (auth != entry.end() && auth->is_string() && !auth->get<std::string>().empty()) {
            auto decoded = base64_decode(auth->get<std::string>());
            auto colon = decoded ? decoded->find(':') : std::string::npos;
            if (!decoded || colon == std::string::npos) {
                log::warning("ignoring the entry for " + ref.registry + " in " + source +
                             ": its \"auth\" is not base64 of user:password");
                continue;
            }
            c.username = decoded->substr(0, colon);
            c.password = decoded->substr(colon + 1);
            return c;
        }
        auto user = entry.find("username");
        auto pass = entry.find("password");
        if (user != entry.end() && user->is_string() && pass != entry.end() && pass->is_string()) {
            c.username = user->get<std::string>();
            c.password = pass->get<std::string>();
            return c;
        }
    }
    return std::nullopt;
}

}  // namespace gantry
