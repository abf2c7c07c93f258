// Internal: registry authentication for one client: anonymous first, then what the registry's
// WWW-Authenticate challenge asks for: a Bearer token from its realm (reused for its lifetime; traded
// for an identity token by OAuth2 POST when the credentials are one) or Basic credentials. Where the
// credentials come from is runtime/auth's business (gantry/auth.hpp). Thread-safe: blob workers share one
// Authenticator.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "gantry/auth.hpp"
#include "gantry/registry.hpp"
#include "net/http.hpp"

namespace gantry {

class Authenticator {
public:
    // `plain_http_ok(host)`: whether a token realm on that host may be reached without TLS.
    // `extra_ca_file`: gantry.conf's ca_bundle, for the identity-token POST to the realm.
    // `fallback`: asked once per user@registry when the credentials `lookup` found are refused (the
    // default chain's: native ECR for an ECR registry, after an expired `docker login` token).
    Authenticator(CredentialLookup lookup, std::string sources, std::function<bool(const std::string&)> plain_http_ok,
                  std::string extra_ca_file = {}, CredentialLookup fallback = {});

    // The Authorization value to send for ref's repository now; empty: anonymous.
    std::string authorization(const ImageReference& ref);

    // After a 401 to a request that carried `sent` (empty: anonymous): gets a token or credentials
    // so the request can be repeated, or says why that is impossible.
    Status on_unauthorized(net::Connection& conn, const ImageReference& ref, const net::Response& response,
                           const std::string& sent);

    // The error for a request that is still refused after authenticating.
    Error failure(const ImageReference& ref);

private:
    struct Token {
        std::string value;  // "Bearer ..."
        std::chrono::steady_clock::time_point expires;
    };
    struct RegistryState {
        enum class Scheme { none, basic, bearer } scheme = Scheme::none;
    };

    const std::optional<Credentials>& credentials_locked(const ImageReference& ref);
    Status fetch_token_locked(net::Connection& conn, const ImageReference& ref, const AuthChallenge& c);
    Error no_credentials(const ImageReference& ref) const;
    bool fall_back_locked(const ImageReference& ref);
    static std::string scope_of(const ImageReference& ref);

    std::mutex mutex_;
    CredentialLookup lookup_;
    std::string sources_;
    std::function<bool(const std::string&)> plain_http_ok_;
    std::string extra_ca_file_;
    std::map<std::string, RegistryState> registries_;
    std::map<std::string, Token> tokens_;                            // by registry + " " + scope
    std::map<std::string, std::optional<Credentials>> credentials_;  // by user@registry
    CredentialLookup fallback_;
    std::map<std::string, std::string> fell_back_;  // user@registry -> the refused source
};

}  // namespace gantry
