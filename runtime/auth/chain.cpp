// The default credential chain (docs/auth.md): Docker config.json, containers auth.json, Enroot's
// .credentials, native ECR -- first match wins -- and the OAuth2 refresh-token exchange that Docker's
// identitytoken needs at a registry's token realm.
#include <nlohmann/json.hpp>

#include "auth/internal.hpp"
#include "gantry/auth.hpp"
#include "gantry/log.hpp"

namespace gantry {

CredentialLookup default_credential_lookup() {
    return [](const ImageReference& ref) -> std::optional<Credentials> {
        for (auto* source :
             {&docker_config_credentials, &containers_auth_credentials, &enroot_credentials, &ecr_credentials}) {
            if (auto c = source(ref)) return c;
        }
        return std::nullopt;
    };
}

CredentialLookup default_credential_fallback() {
    return [](const ImageReference& ref) -> std::optional<Credentials> { return ecr_credentials(ref); };
}

std::string default_credential_sources() {
    return docker_config_source() + " (auths, credHelpers, credsStore), " + containers_auth_source() + ", " +
           enroot_credentials_source() + ", native ECR (<acct>.dkr.ecr.<region>.amazonaws.com only)";
}

namespace auth {

Result<OAuthToken> oauth2_refresh(const std::string& realm, const std::string& service, const std::string& scope,
                                  const std::string& refresh_token, const std::string& extra_ca_file) {
    net::Request req = endpoint_request("POST", realm);
    req.timeout_s = 60;
    req.headers = {"Content-Type: application/x-www-form-urlencoded", "Accept: application/json"};
    req.body = "grant_type=refresh_token&client_id=gantry&refresh_token=" + net::escape(refresh_token) +
               "&service=" + net::escape(service) + "&scope=" + net::escape(scope);
    const std::string what = "exchanging the identity token at " + net::redact_url(realm);
    auto resp = net::fetch(req, net::settings_from_environment(extra_ca_file));
    if (!resp) return resp.error().wrap(what);
    if (resp->status == 401 || resp->status == 403)
        return make_error(what + ": refused (HTTP " + std::to_string(resp->status) + ")");
    if (resp->status != 200) return make_error(what + ": HTTP " + std::to_string(resp->status));
    auto j = nlohmann::json::parse(resp->body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error(what + ": the answer is not JSON");
    OAuthToken t;
    for (const char* key : {"access_token", "token"})
        if (j.contains(key) && j[key].is_string() && !j[key].get<std::string>().empty()) {
            t.token = j[key].get<std::string>();
            break;
        }
    if (t.token.empty()) return make_error(what + ": the answer holds no access_token");
    if (j.contains("expires_in") && j["expires_in"].is_number() && j["expires_in"].get<double>() > 0)
        t.expires_in = static_cast<long>(j["expires_in"].get<double>());
    return t;
}

}  // namespace auth
}  // namespace gantry
