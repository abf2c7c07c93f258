// Native Amazon ECR: recognises <acct>.dkr.ecr[-fips].<region>.amazonaws.com[.cn], signs
// GetAuthorizationToken with SigV4 (sigv4.cpp) using the AWS credential chain (aws_credentials.cpp),
// and caches the token in memory and on disk per user (0600, for its lifetime minus a margin) behind
// a file lock, so that many ranks or nodes starting at once make one request to the token service.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>

#include "auth/internal.hpp"
#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace auth {
namespace {

// <12-digit account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn], parsed by hand: a plugin must run no
// non-trivial code when Slurm loads it, and a namespace-scope std::regex compiled in a static
// initializer crashed slurmd 24.11 inside dlopen (the statically linked libstdc++'s locale was not set
// up yet).
std::optional<EcrRegistry> parse_host(const std::string& host) {
    auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
    auto region_char = [&](char c) { return (c >= 'a' && c <= 'z') || is_digit(c) || c == '-'; };
    std::string_view rest = host;
    if (rest.size() < 12 || !std::all_of(rest.begin(), rest.begin() + 12, is_digit)) return std::nullopt;
    EcrRegistry r;
    r.account = std::string(rest.substr(0, 12));
    rest.remove_prefix(12);
    auto take = [&](std::string_view word) {
        if (rest.substr(0, word.size()) != word) return false;
        rest.remove_prefix(word.size());
        return true;
    };
    if (!take(".dkr.ecr")) return std::nullopt;
    r.fips = take("-fips");
    if (!take(".")) return std::nullopt;
    r.china = rest.size() >= 3 && rest.substr(rest.size() - 3) == ".cn";
    if (r.china) rest.remove_suffix(3);
    constexpr std::string_view kSuffix = ".amazonaws.com";
    if (rest.size() <= kSuffix.size() || rest.substr(rest.size() - kSuffix.size()) != kSuffix) return std::nullopt;
    rest.remove_suffix(kSuffix.size());
    if (!std::all_of(rest.begin(), rest.end(), region_char)) return std::nullopt;
    r.region = std::string(rest);
    r.registry = host;
    r.ecr_host = host;
    return r;
}

// Stop using a token this long before it expires: half its lifetime, at most 10 minutes (ECR's are
// valid for 12 hours), so that a pull never starts with a token about to run out.
std::time_t margin_for(std::time_t lifetime) {
    return std::min<std::time_t>(600, std::max<std::time_t>(lifetime / 2, 0));
}

struct CachedToken {
    EcrToken token;
    std::time_t use_until = 0;
};

std::mutex g_mutex;
std::map<std::string, CachedToken> g_tokens;  // in-process cache, by cache key

// Who asks and how: a different profile, key or role may see a different registry policy.
std::string cache_key(const EcrRegistry& reg) {
    return reg.ecr_host + "\n" + reg.api_endpoint() + "\n" + environment().aws_profile.value + "\n" +
           environment().aws_access_key_id.value + "\n" + environment().aws_role_arn.value + "\n" +
           std::to_string(::geteuid());
}

std::string json_of(const CachedToken& t) {
    nlohmann::json j;
    j["username"] = t.token.username;
    j["password"] = t.token.password;
    j["expires_at"] = t.token.expires_at;
    j["use_until"] = t.use_until;
    return j.dump();
}

// The cached token, if the file is ours, private, parsable and still usable.
std::optional<CachedToken> read_cache(const std::string& path) {
    auto text = read_private_file(path);
    if (!text) return std::nullopt;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    CachedToken t;
    t.token.username = j.value("username", "");
    t.token.password = j.value("password", "");
    t.token.expires_at = j.value("expires_at", std::time_t{0});
    t.use_until = j.value("use_until", std::time_t{0});
    if (t.token.password.empty() || t.use_until <= std::time(nullptr)) return std::nullopt;
    return t;
}

// ECR's JSON error answer: {"__type": "...#InvalidSignatureException", "message": "..."}.
Error ecr_error(const EcrRegistry& reg, const net::Response& resp, const std::string& creds_source) {
    auto j = nlohmann::json::parse(resp.body, nullptr, false);
    std::string type, message;
    if (j.is_object()) {
        type = j.value("__type", "");
        message = j.value("message", j.value("Message", ""));
    }
    if (auto hash = type.rfind('#'); hash != std::string::npos) type = type.substr(hash + 1);
    const std::string where =
        "ECR GetAuthorizationToken at " + net::redact_url(reg.api_endpoint()) + " for " + reg.registry;
    // Clock skew: AWS refuses signatures more than 5 minutes away from its clock. Its Date header
    // tells how far off we are.
    long skew = 0;
    std::string date = resp.header("date");
    if (!date.empty()) {
        struct tm tm {};
        if (::strptime(date.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) != nullptr)
            skew = static_cast<long>(::timegm(&tm) - std::time(nullptr));
    }
    bool expired = message.find("Signature expired") != std::string::npos ||
                   message.find("Signature not yet current") != std::string::npos || type == "RequestExpired" ||
                   (type == "InvalidSignatureException" && std::labs(skew) > 300);
    if (expired)
        return make_error(where + ": the request signature was refused as expired: this host's clock is off" +
                          (skew != 0 ? " by " + std::to_string(skew) + " s against AWS's" : std::string()) +
                          " (SigV4 signatures are valid for 5 minutes); synchronize the clock (chrony/NTP)" +
                          (message.empty() ? "" : " [AWS: " + message + "]"));
    std::string what = type.empty() ? "HTTP " + std::to_string(resp.status) : type;
    return make_error(where + " failed: " + what + (message.empty() ? "" : ": " + message) + " (AWS credentials from " +
                      creds_source + ")");
}

Result<CachedToken> fetch_token(const EcrRegistry& reg) {
    std::string endpoint = reg.api_endpoint();
    if (endpoint.rfind("https://", 0) != 0 && !net::is_local_http(endpoint))
        return make_error("refusing the ECR endpoint " + net::redact_url(endpoint) +
                          ": not https (plain HTTP only on loopback)");
    auto creds = aws_credentials(reg.region);
    if (!creds) return creds.error().wrap("native ECR for " + reg.registry);
    auto req = ecr_token_request(reg, creds->key, sigv4::amz_date_now());
    net::Request hr = endpoint_request("POST", req.url);
    hr.body = req.body;
    for (const auto& [n, v] : req.headers) {
        if (lower(n) == "authorization")
            hr.authorization = v;
        else
            hr.headers.push_back(n + ": " + v);
    }
    log::debug("asking " + net::redact_url(endpoint) + " for an ECR token for " + reg.registry +
               " (AWS credentials from " + creds->source + ")");
    auto resp = net::fetch(hr, aws_tls());
    if (!resp) return resp.error().wrap("ECR GetAuthorizationToken for " + reg.registry);
    if (resp->status != 200) return ecr_error(reg, *resp, creds->source);
    std::time_t now = std::time(nullptr);
    auto token = parse_ecr_token_answer(resp->body, now, "ECR GetAuthorizationToken for " + reg.registry);
    if (!token) return token.error();
    CachedToken t;
    t.token = std::move(*token);
    t.use_until = t.token.expires_at - margin_for(t.token.expires_at - now);
    log::debug("got an ECR token for " + reg.registry + " valid for " + std::to_string(t.token.expires_at - now) +
               " s");
    return t;
}

}  // namespace

std::string EcrRegistry::api_endpoint() const {
    const Environment& env = environment();
    for (const auto* var : {&env.gantry_ecr_endpoint, &env.aws_endpoint_url_ecr, &env.aws_endpoint_url}) {
        std::string v = var->value;
        while (!v.empty() && v.back() == '/') v.pop_back();
        if (!v.empty()) return v;
    }
    return std::string("https://") + (fips ? "ecr-fips." : "api.ecr.") + region + ".amazonaws.com" +
           (china ? ".cn" : "");
}

std::optional<EcrRegistry> parse_ecr_registry(const std::string& registry) {
    const std::string host = lower(registry);
    // Test-only: "HOST[:PORT]=<ECR host>[,...]" makes a local registry stand in for an ECR one.
    for (const auto& item : split_list(environment().gantry_test_ecr_registries.value, ',')) {
        auto eq = item.find('=');
        if (eq == std::string::npos || lower(item.substr(0, eq)) != host) continue;
        auto r = parse_host(lower(item.substr(eq + 1)));
        if (!r) {
            log::warning("ignoring GANTRY_TEST_ECR_REGISTRIES entry " + item + ": not an ECR host name");
            continue;
        }
        r->registry = registry;
        return r;
    }
    auto r = parse_host(host);
    if (r) r->registry = registry;
    return r;
}

SignedHttpRequest ecr_token_request(const EcrRegistry& reg, const sigv4::Key& key, const std::string& amz_date) {
    SignedHttpRequest out;
    out.url = reg.api_endpoint() + "/";
    out.body = "{}";
    const std::string host = net::host_header(out.url);
    sigv4::Request r;
    r.method = "POST";
    r.path = "/";
    r.payload = out.body;
    r.headers = {{"Content-Type", "application/x-amz-json-1.1"},
                 {"Host", host},
                 {"X-Amz-Date", amz_date},
                 {"X-Amz-Target", "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"}};
    if (!key.session_token.empty()) r.headers.emplace_back("X-Amz-Security-Token", key.session_token);
    out.sig = sigv4::sign(r, key, reg.region, "ecr", amz_date);
    out.headers = r.headers;
    out.headers.emplace_back("Authorization", out.sig.authorization);
    return out;
}

Result<EcrToken> ecr_authorization_token(const EcrRegistry& reg) {
    const std::string key = cache_key(reg);
    const std::time_t now = std::time(nullptr);
    std::lock_guard<std::mutex> lock(g_mutex);  // one fetch per process at a time
    auto mem = g_tokens.find(key);
    if (mem != g_tokens.end() && mem->second.use_until > now) return mem->second.token;

    const std::string file = token_cache_file("ecr", key);
    UniqueFd held;
    if (!file.empty()) {
        if (auto c = read_cache(file + ".json")) {
            g_tokens[key] = *c;
            log::debug("using the cached ECR token for " + reg.registry);
            return c->token;
        }
        // Whoever holds the lock is asking ECR now; wait for it and use its answer.
        held = lock_file(file + ".lock", 60);
        if (!held) log::warning("could not lock " + display_path(file + ".lock") + "; asking ECR without it");
        if (auto c = read_cache(file + ".json")) {
            g_tokens[key] = *c;
            log::debug("using the ECR token another process just cached for " + reg.registry);
            return c->token;
        }
    }
    auto t = fetch_token(reg);
    if (!t) return t.error();
    g_tokens[key] = *t;
    if (!file.empty()) {
        if (auto st = write_file_atomic(file + ".json", json_of(*t), 0600); !st)
            log::warning("not caching the ECR token: " + st.error().message);
    }
    return t->token;
}

}  // namespace auth

std::optional<Credentials> ecr_credentials(const ImageReference& ref) {
    auto reg = auth::parse_ecr_registry(ref.registry);
    if (!reg) return std::nullopt;
    auto t = auth::ecr_authorization_token(*reg);
    if (!t) {
        log::warning(t.error().message);
        return std::nullopt;
    }
    Credentials c;
    c.username = t->username;
    c.password = t->password;
    c.source = "native ECR (GetAuthorizationToken)";
    return c;
}

}  // namespace gantry
