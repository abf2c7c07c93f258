// Registry authentication: WWW-Authenticate parsing, Bearer tokens from the challenge's realm
// (fetched with Basic credentials, or by OAuth2 POST for an identity token, reused until they
// expire), and Basic auth. The credentials themselves come from runtime/auth.
// Nothing here logs a credential, a token or an Authorization value.
#include "registry/auth.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

bool is_tchar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}
bool is_token68_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("-._~+/").find(c) != std::string_view::npos;
}

// A cursor over one header value.
struct Cursor {
    std::string_view s;
    size_t i = 0;
    [[nodiscard]] bool done() const { return i >= s.size(); }
    [[nodiscard]] char peek() const { return done() ? '\0' : s[i]; }
    void skip_ws() {
        while (!done() && (s[i] == ' ' || s[i] == '\t')) ++i;
    }
    void skip_ws_commas() {
        while (!done() && (s[i] == ' ' || s[i] == '\t' || s[i] == ',')) ++i;
    }
    std::string token() {
        size_t b = i;
        while (!done() && is_tchar(s[i])) ++i;
        return std::string(s.substr(b, i - b));
    }
    // A quoted-string with backslash escapes; tolerates a missing closing quote.
    std::string quoted() {
        std::string out;
        ++i;  // opening quote
        while (!done() && s[i] != '"') {
            if (s[i] == '\\' && i + 1 < s.size()) ++i;
            out.push_back(s[i++]);
        }
        if (!done()) ++i;  // closing quote
        return out;
    }
};

}  // namespace

std::vector<AuthChallenge> parse_www_authenticate(std::string_view header) {
    std::vector<AuthChallenge> out;
    Cursor c{header};
    c.skip_ws_commas();
    while (!c.done()) {
        std::string scheme = c.token();
        if (scheme.empty()) {  // garbage: skip one character and look for the next challenge
            ++c.i;
            c.skip_ws_commas();
            continue;
        }
        AuthChallenge ch;
        ch.scheme = lower(scheme);
        c.skip_ws();
        // token68 ("Negotiate abc==") is a run of token68 characters ending in '='* and then ',' or the end.
        {
            size_t save = c.i;
            while (!c.done() && is_token68_char(c.peek())) ++c.i;
            size_t body_end = c.i;
            while (!c.done() && c.peek() == '=') ++c.i;
            size_t after = c.i;
            c.skip_ws();
            if (body_end > save && (c.done() || c.peek() == ',')) {
                ch.token68 = std::string(header.substr(save, after - save));
                out.push_back(std::move(ch));
                c.skip_ws_commas();
                continue;
            }
            c.i = save;
        }
        // auth-params: name = (token | quoted-string), separated by commas. A name that is not followed
        // by '=' starts the next challenge.
        while (!c.done()) {
            c.skip_ws_commas();
            size_t save = c.i;
            std::string name = c.token();
            c.skip_ws();
            if (name.empty() || c.peek() != '=') {
                c.i = save;
                break;
            }
            ++c.i;  // '='
            c.skip_ws();
            std::string value;
            if (c.peek() == '"') {
                value = c.quoted();
            } else {
                size_t b = c.i;
                while (!c.done() && c.peek() != ',' && c.peek() != ' ' && c.peek() != '\t') ++c.i;
                value = std::string(header.substr(b, c.i - b));
            }
            ch.params[lower(name)] = value;
            c.skip_ws();
            if (!c.done() && c.peek() != ',') break;  // malformed; stop this challenge here
        }
        out.push_back(std::move(ch));
        c.skip_ws_commas();
    }
    return out;
}

Authenticator::Authenticator(CredentialLookup lookup, std::string sources,
                             std::function<bool(const std::string&)> plain_http_ok, std::string extra_ca_file,
                             CredentialLookup fallback)
    : lookup_(std::move(lookup)),
      sources_(std::move(sources)),
      plain_http_ok_(std::move(plain_http_ok)),
      extra_ca_file_(std::move(extra_ca_file)),
      fallback_(std::move(fallback)) {}

std::string Authenticator::scope_of(const ImageReference& ref) {
    return "repository:" + ref.repository + ":pull";
}

const std::optional<Credentials>& Authenticator::credentials_locked(const ImageReference& ref) {
    std::string key = ref.user + "@" + ref.registry;
    auto it = credentials_.find(key);
    if (it == credentials_.end()) {
        std::optional<Credentials> found;
        if (lookup_) found = lookup_(ref);
        if (found) log::debug("using credentials for " + ref.registry + " from " + found->source);
        it = credentials_.emplace(key, std::move(found)).first;
    }
    return it->second;
}

std::string Authenticator::authorization(const ImageReference& ref) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto reg = registries_.find(ref.registry);
    if (reg == registries_.end()) return {};
    if (reg->second.scheme == RegistryState::Scheme::basic) {
        const auto& creds = credentials_locked(ref);
        return creds && creds->identity_token.empty()
                   ? "Basic " + base64_encode(creds->username + ":" + creds->password)
                   : std::string();
    }
    if (reg->second.scheme == RegistryState::Scheme::bearer) {
        auto t = tokens_.find(ref.registry + " " + scope_of(ref));
        if (t != tokens_.end() && std::chrono::steady_clock::now() < t->second.expires) return t->second.value;
    }
    return {};
}

// The registry's final word on the credentials it was given (HTTP 401/403, in http_status): what a
// submission that resolves the tag at submit reports at once (runtime/cli/stage.cpp), and what a
// stored tag does not change (runtime/store/pull.cpp, with_stored_tag_hint).
namespace {
Error refused(const std::string& message, int status = 401) {
    Error e = make_error(message);
    e.http_status = status;
    return e;
}
}  // namespace

// Not the registry's word on this user: the nodes may find credentials this host lacks (an instance
// role of theirs), so a submission that found none leaves the pull to them.
Error Authenticator::no_credentials(const ImageReference& ref) const {
    return make_error("no credentials found for " + ref.registry + "; tried " + sources_);
}

Error Authenticator::failure(const ImageReference& ref) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& creds = credentials_locked(ref);
    if (!creds) return no_credentials(ref);
    auto tried = fell_back_.find(ref.user + "@" + ref.registry);
    return refused("authentication to " + ref.registry + " failed (tried: " +
                   (tried != fell_back_.end() && !tried->second.empty() ? tried->second + ", then " : "") +
                   creds->source + ")");
}

// Credentials that were refused give way, once, to the fallback's: a `docker login` token for ECR in
// config.json lives 12 hours, after which native ECR (the node's IAM role) is what still works.
bool Authenticator::fall_back_locked(const ImageReference& ref) {
    const std::string key = ref.user + "@" + ref.registry;
    if (!fallback_ || fell_back_.count(key) != 0) return false;
    const auto& refused = credentials_locked(ref);
    std::string refused_source = refused ? refused->source : std::string();
    fell_back_[key] = refused_source;
    auto next = fallback_(ref);
    if (!next || (refused && next->source == refused->source)) return false;
    log::warning("the credentials for " + ref.registry + " from " + refused_source +
                 " were refused (an expired `docker login` token?); using " + next->source + " instead");
    credentials_[key] = std::move(next);
    return true;
}

Status Authenticator::fetch_token_locked(net::Connection& conn, const ImageReference& ref, const AuthChallenge& c) {
    auto realm_it = c.params.find("realm");
    if (realm_it == c.params.end() || realm_it->second.empty())
        return make_error(ref.registry + " asked for a Bearer token but named no realm to get it from");
    const std::string& realm = realm_it->second;
    std::string origin = net::origin_of(realm);
    if (origin.rfind("https://", 0) != 0) {
        // Plain HTTP where the registry itself may use it: a loopback or listed realm, or one on the
        // same host as a registry that is.
        std::string realm_host = net::host_of(realm);
        std::string realm_hostport = origin.substr(origin.find("://") + 3);
        std::string registry_host = ref.registry.substr(0, ref.registry.rfind(':'));
        bool plain_ok = plain_http_ok_(realm_host) || plain_http_ok_(realm_hostport) ||
                        (realm_host == registry_host && plain_http_ok_(ref.registry));
        if (origin.rfind("http://", 0) != 0 || !plain_ok)
            return make_error("refusing the token service " + net::redact_url(realm) + " of " + ref.registry +
                              ": not an https URL (plain HTTP only on loopback or insecure_registries)");
    }
    const auto& creds = credentials_locked(ref);
    auto svc = c.params.find("service");
    if (creds && !creds->identity_token.empty()) {
        // Docker's identitytoken: an OAuth2 refresh token, traded by POST (the registry never sees it).
        auto t = auth::oauth2_refresh(realm, svc != c.params.end() ? svc->second : std::string(), scope_of(ref),
                                      creds->identity_token, extra_ca_file_);
        if (!t) return t.error().wrap("authentication to " + ref.registry + " (tried: " + creds->source + ")");
        int64_t margin = std::min<int64_t>(10, t->expires_in / 10);
        tokens_[ref.registry + " " + scope_of(ref)] = Token{
            "Bearer " + t->token, std::chrono::steady_clock::now() + std::chrono::seconds(t->expires_in - margin)};
        log::debug("got a token for " + ref.registry + "/" + ref.repository + " with the identity token from " +
                   creds->source);
        return {};
    }
    std::string url = realm + (realm.find('?') == std::string::npos ? "?" : "&");
    if (svc != c.params.end()) url += "service=" + net::escape(svc->second) + "&";
    url += "scope=" + net::escape(scope_of(ref));

    net::Request req;
    req.url = url;
    req.timeout_s = 60;
    req.headers.push_back("Accept: application/json");
    if (creds) req.authorization = "Basic " + base64_encode(creds->username + ":" + creds->password);
    auto resp = conn.perform(req);
    const std::string what =
        "getting a token for " + ref.registry + "/" + ref.repository + " from " + net::redact_url(realm);
    if (!resp) return resp.error().wrap(what);
    if (resp->curl_code != 0) return make_error(what + ": " + resp->curl_error);
    if (resp->status == 401 || resp->status == 403) {
        if (!creds) return no_credentials(ref);
        return refused("authentication to " + ref.registry + " failed (tried: " + creds->source + ")", resp->status);
    }
    if (resp->status != 200) return make_error(what + ": HTTP " + std::to_string(resp->status));
    auto j = nlohmann::json::parse(resp->body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error(what + ": the answer is not JSON");
    std::string token;
    for (const char* key : {"token", "access_token"}) {
        auto it = j.find(key);
        if (it != j.end() && it->is_string() && !it->get<std::string>().empty()) {
            token = it->get<std::string>();
            break;
        }
    }
    if (token.empty()) return make_error(what + ": the answer holds no token");
    int64_t lifetime = 60;
    auto exp = j.find("expires_in");
    if (exp != j.end() && exp->is_number() && exp->get<double>() > 0)
        lifetime = static_cast<int64_t>(exp->get<double>());
    // Stop using a token a little before it expires, so that it does not run out in flight.
    int64_t margin = std::min<int64_t>(10, lifetime / 10);
    tokens_[ref.registry + " " + scope_of(ref)] =
        Token{"Bearer " + token, std::chrono::steady_clock::now() + std::chrono::seconds(lifetime - margin)};
    log::debug("got a token for " + ref.registry + "/" + ref.repository + " valid for " + std::to_string(lifetime) +
               " s" + (creds ? " (authenticated)" : " (anonymous)"));
    return {};
}

Status Authenticator::on_unauthorized(net::Connection& conn, const ImageReference& ref, const net::Response& response,
                                      const std::string& sent) {
    auto challenges = parse_www_authenticate(response.header("www-authenticate"));
    const AuthChallenge* bearer = nullptr;
    const AuthChallenge* basic = nullptr;
    for (const auto& c : challenges) {
        if (c.scheme == "bearer" && bearer == nullptr) bearer = &c;
        if (c.scheme == "basic" && basic == nullptr) basic = &c;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto& state = registries_[ref.registry];
    if (bearer != nullptr) {
        state.scheme = RegistryState::Scheme::bearer;
        std::string key = ref.registry + " " + scope_of(ref);
        auto t = tokens_.find(key);
        // Another thread may have fetched a fresh token while this request was refused.
        if (t != tokens_.end() && t->second.value != sent && std::chrono::steady_clock::now() < t->second.expires)
            return {};
        tokens_.erase(key);
        return fetch_token_locked(conn, ref, *bearer);
    }
    if (basic != nullptr) {
        const auto& creds = credentials_locked(ref);
        if (!creds) return no_credentials(ref);
        if (!creds->identity_token.empty())
            return make_error(ref.registry + " asks for Basic authentication, but the credentials from " +
                              creds->source + " are an identity token (usable only with a Bearer token service)");
        if (state.scheme == RegistryState::Scheme::basic && !sent.empty()) {
            if (fall_back_locked(ref)) return {};
            const auto& now = credentials_locked(ref);
            auto tried = fell_back_.find(ref.user + "@" + ref.registry);
            bool other = tried != fell_back_.end() && now && tried->second != now->source;
            return refused("authentication to " + ref.registry + " failed (tried: " +
                           (other ? tried->second + ", then " : "") + (now ? now->source : creds->source) + ")");
        }
        state.scheme = RegistryState::Scheme::basic;
        return {};
    }
    return make_error(ref.registry + " answered HTTP 401 without an authentication scheme Gantry supports" +
                      (challenges.empty() ? std::string(" (no WWW-Authenticate header)")
                                          : " (WWW-Authenticate: " + challenges.front().scheme + ")"));
}

}  // namespace gantry
