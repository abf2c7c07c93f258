// The AWS credential chain, in the order the AWS SDKs use: environment variables, the shared
// ~/.aws/credentials and ~/.aws/config files (AWS_PROFILE: static keys, credential_process, and
// role_arn with source_profile through a SigV4-signed sts:AssumeRole, cached), a web identity token file (EKS IRSA, via
// STS AssumeRoleWithWebIdentity), the container credentials endpoint (ECS, EKS Pod Identity) and EC2
// instance metadata with IMDSv2 session tokens (ParallelCluster compute nodes). Secrets never appear
// in messages; errors name the source and what went wrong.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "auth/internal.hpp"
#include "gantry/auth.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry::auth {
namespace {

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.pop_back();
    size_t b = 0;
    while (b < s.size() && (s[b] == ' ' || s[b] == '\t')) ++b;
    return s.substr(b);
}

std::string aws_file(const EnvironmentVariable& var, const char* name) {
    std::string p = var.value;
    if (!p.empty()) return p;
    std::string home = home_dir();
    return home.empty() ? std::string() : home + "/.aws/" + name;
}

std::string sts_endpoint(const std::string& region) {
    const Environment& env = environment();
    for (const auto* var : {&env.gantry_sts_endpoint, &env.aws_endpoint_url_sts, &env.aws_endpoint_url}) {
        std::string v = var->value;
        if (!v.empty()) return v;
    }
    std::string r = region.empty() ? "us-east-1" : region;
    return "https://sts." + r + ".amazonaws.com" + (r.rfind("cn-", 0) == 0 ? ".cn" : "");
}

Result<AwsCredentials> web_identity(const std::string& token_file, const std::string& role_arn,
                                    const std::string& session, const std::string& region, const std::string& what) {
    auto token = read_config_file(token_file, "the token file " + token_file);
    if (!token) return token.error().wrap(what);
    std::string url = sts_endpoint(region);
    if (url.rfind("https://", 0) != 0 && !net::is_local_http(url))
        return make_error(what + ": refusing the STS endpoint " + net::redact_url(url) + " (not https)");
    net::Request req = endpoint_request("POST", url + "/");
    req.headers = {"Content-Type: application/x-www-form-urlencoded", "Accept: application/xml"};
    req.body = "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=" + net::escape(role_arn) +
               "&RoleSessionName=" + net::escape(session.empty() ? "gantry-" + std::to_string(::getuid()) : session) +
               "&WebIdentityToken=" + net::escape(trim(*token));
    auto resp = net::fetch(req, aws_tls());
    if (!resp) return resp.error().wrap(what + ": STS AssumeRoleWithWebIdentity");
    StsAnswer answer = parse_sts_answer(resp->body);
    if (resp->status != 200) {
        const std::string& msg = answer.message;
        return make_error(what + ": STS AssumeRoleWithWebIdentity at " + net::redact_url(url) + " answered HTTP " +
                          std::to_string(resp->status) + (msg.empty() ? "" : ": " + msg));
    }
    AwsCredentials c = std::move(answer.creds);
    c.source = what + " (STS AssumeRoleWithWebIdentity for " + role_arn + ")";
    if (c.key.access_key_id.empty() || c.key.secret_access_key.empty())
        return make_error(what + ": the STS answer holds no credentials" +
                          (answer.message.empty() ? "" : " (" + answer.message + ")"));
    return c;
}

// credential_process from a profile: runs the user's own command (their config file names it), as the
// AWS CLI does; argv through /bin/sh -c because the setting is a command line by definition.
Result<AwsCredentials> credential_process(const std::string& command, const std::string& what) {
    auto out = run_command({"/bin/sh", "-c", command}, "", 60);
    if (!out) return out.error().wrap(what + ": credential_process");
    if (out->exit_status != 0)
        return make_error(what + ": credential_process exited with status " + std::to_string(out->exit_status));
    return parse_credentials_json(out->out, what + " (credential_process)", "SessionToken");
}

// ---- sts:AssumeRole for profiles with role_arn + source_profile, as the AWS CLI and SDKs do it.

// Role credentials are cached like ECR tokens (token_cache.cpp): in memory, and on disk per user
// (0600) until a margin before they expire, behind a lock so that many ranks make one STS call.
struct CachedRole {
    AwsCredentials creds;
    std::time_t use_until = 0;
};
std::mutex g_role_mutex;
std::map<std::string, CachedRole> g_roles;

// Stop using role credentials a quarter of an hour before they expire (the AWS CLI's rule), or at
// half their lifetime when that is shorter.
std::time_t role_use_until(std::time_t expiration, std::time_t now) {
    return expiration - std::min<std::time_t>(900, std::max<std::time_t>((expiration - now) / 2, 0));
}

std::optional<CachedRole> read_role_cache(const std::string& path) {
    auto text = read_private_file(path);
    if (!text) return std::nullopt;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    CachedRole r;
    r.creds.key.access_key_id = j.value("AccessKeyId", "");
    r.creds.key.secret_access_key = j.value("SecretAccessKey", "");
    r.creds.key.session_token = j.value("SessionToken", "");
    r.creds.expiration = j.value("Expiration", std::time_t{0});
    r.creds.source = j.value("Source", "");
    r.use_until = j.value("UseUntil", std::time_t{0});
    if (r.creds.key.access_key_id.empty() || r.creds.key.secret_access_key.empty() || r.use_until <= std::time(nullptr))
        return std::nullopt;
    return r;
}

std::string role_cache_json(const CachedRole& r) {
    nlohmann::json j;
    j["AccessKeyId"] = r.creds.key.access_key_id;
    j["SecretAccessKey"] = r.creds.key.secret_access_key;
    j["SessionToken"] = r.creds.key.session_token;
    j["Expiration"] = r.creds.expiration;
    j["Source"] = r.creds.source;
    j["UseUntil"] = r.use_until;
    return j.dump();
}

struct RoleRequest {
    std::string role_arn;
    std::string session_name;  // empty: gantry-<uid>-<time>
    std::string external_id;
    std::string duration_seconds;
    std::string region;  // signing region
    std::string what;    // "profile NAME", for messages
};

// One signed STS AssumeRole call (POST, form body), not cached.
Result<CachedRole> call_assume_role(const AwsCredentials& source, const RoleRequest& rr) {
    const std::string region = rr.region.empty() ? "us-east-1" : rr.region;
    const std::string url = sts_endpoint(region);
    const std::string where = rr.what + ": STS AssumeRole for " + rr.role_arn + " at " + net::redact_url(url);
    if (url.rfind("https://", 0) != 0 && !net::is_local_http(url))
        return make_error(where + ": refusing the endpoint (not https; plain HTTP only on loopback)");
    std::string session = rr.session_name;
    if (session.empty()) session = "gantry-" + std::to_string(::getuid()) + "-" + std::to_string(std::time(nullptr));
    std::string body = "Action=AssumeRole&RoleArn=" + net::escape(rr.role_arn) +
                       "&RoleSessionName=" + net::escape(session) + "&Version=2011-06-15";
    if (!rr.duration_seconds.empty()) body += "&DurationSeconds=" + net::escape(rr.duration_seconds);
    if (!rr.external_id.empty()) body += "&ExternalId=" + net::escape(rr.external_id);

    const std::string amz_date = sigv4::amz_date_now();
    sigv4::Request sr;
    sr.method = "POST";
    sr.path = "/";
    sr.payload = body;
    sr.headers = {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"},
                  {"Host", net::host_header(url)},
                  {"X-Amz-Date", amz_date}};
    if (!source.key.session_token.empty()) sr.headers.emplace_back("X-Amz-Security-Token", source.key.session_token);
    auto sig = sigv4::sign(sr, source.key, region, "sts", amz_date);

    net::Request req = endpoint_request("POST", url + "/");
    req.body = body;
    for (const auto& [n, v] : sr.headers)
        if (n != "Host") req.headers.push_back(n + ": " + v);
    req.authorization = sig.authorization;
    req.headers.push_back("Accept: application/xml");
    log::debug(rr.what + ": asking " + net::redact_url(url) + " to assume " + rr.role_arn +
               " (source credentials from " + source.source + ")");
    auto resp = net::fetch(req, aws_tls());
    if (!resp) return resp.error().wrap(where);
    StsAnswer answer = parse_sts_answer(resp->body);
    if (resp->status != 200) {
        const std::string &code = answer.code, &msg = answer.message;
        std::string hint;
        // SigV4 signatures are valid for 5 minutes around AWS's clock.
        if (msg.find("Signature expired") != std::string::npos || code == "RequestExpired")
            hint = " (this host's clock is off; synchronize it with chrony/NTP)";
        return make_error(where + " failed: " + (code.empty() ? "HTTP " + std::to_string(resp->status) : code) +
                          (msg.empty() ? "" : ": " + msg) + hint + " (source credentials from " + source.source + ")");
    }
    CachedRole r;
    r.creds = std::move(answer.creds);
    r.creds.source = rr.what + " (STS AssumeRole for " + rr.role_arn + ")";
    if (r.creds.key.access_key_id.empty() || r.creds.key.secret_access_key.empty())
        return make_error(where + ": the answer holds no credentials" +
                          (answer.message.empty() ? "" : " (" + answer.message + ")"));
    const std::time_t now = std::time(nullptr);
    if (r.creds.expiration == 0) r.creds.expiration = now + 900;  // STS's shortest lifetime
    r.use_until = role_use_until(r.creds.expiration, now);
    return r;
}

// AssumeRole through the caches: memory, then the per-user disk cache, then STS (one caller at a time).
Result<AwsCredentials> assume_role(const AwsCredentials& source, const RoleRequest& rr) {
    // Who asks for what: another source key, session name or external id may get other permissions.
    const std::string key = sts_endpoint(rr.region) + "\n" + rr.role_arn + "\n" + rr.session_name + "\n" +
                            rr.external_id + "\n" + rr.duration_seconds + "\n" + source.key.access_key_id + "\n" +
                            std::to_string(::geteuid());
    std::lock_guard<std::mutex> lock(g_role_mutex);
    const std::time_t now = std::time(nullptr);
    if (auto m = g_roles.find(key); m != g_roles.end() && m->second.use_until > now) return m->second.creds;
    const std::string file = token_cache_file("sts", key);
    UniqueFd held;
    if (!file.empty()) {
        if (auto c = read_role_cache(file + ".json")) {
            log::debug(rr.what + ": using cached credentials for " + rr.role_arn);
            g_roles[key] = *c;
            return c->creds;
        }
        // Whoever holds the lock is asking STS now; wait for it and use its answer.
        held = lock_file(file + ".lock", 60);
        if (!held) log::warning("could not lock " + display_path(file + ".lock") + "; asking STS without it");
        if (auto c = read_role_cache(file + ".json")) {
            g_roles[key] = *c;
            return c->creds;
        }
    }
    auto r = call_assume_role(source, rr);
    if (!r) return r.error();
    g_roles[key] = *r;
    if (!file.empty()) {
        if (auto st = write_file_atomic(file + ".json", role_cache_json(*r), 0600); !st)
            log::warning("not caching role credentials: " + st.error().message);
    }
    return r->creds;
}

// The shared ~/.aws/credentials and ~/.aws/config files, read once per lookup.
struct SharedFiles {
    IniFile creds, conf;
    std::string cred_path, conf_path;
    // A profile's setting, the credentials file first (as the SDKs merge them).
    [[nodiscard]] std::string get(const std::string& profile, const std::string& key) const {
        for (const IniFile* f : {&creds, &conf}) {
            auto s = f->find(profile);
            if (s == f->end()) continue;
            auto v = s->second.find(key);
            if (v != s->second.end() && !v->second.empty()) return v->second;
        }
        return {};
    }
    [[nodiscard]] bool has(const std::string& profile) const { return creds.count(profile) || conf.count(profile); }
};

std::optional<AwsCredentials> static_keys(const SharedFiles& f, const std::string& profile) {
    if (f.get(profile, "aws_access_key_id").empty() || f.get(profile, "aws_secret_access_key").empty())
        return std::nullopt;
    AwsCredentials c;
    c.key = {f.get(profile, "aws_access_key_id"), f.get(profile, "aws_secret_access_key"),
             f.get(profile, "aws_session_token")};
    c.source = "profile " + profile + " in " + display_path(f.creds.count(profile) ? f.cred_path : f.conf_path);
    return c;
}

// A profile's credentials, following role_arn/source_profile chains (`visited` stops cycles).
// nullopt: the profile holds nothing usable, and the chain goes on to the next source.
Result<std::optional<AwsCredentials>> profile_credentials(const SharedFiles& f, const std::string& profile,
                                                          const std::string& region,
                                                          std::vector<std::string>& visited) {
    const std::string what = "profile " + profile;
    visited.push_back(profile);
    const std::string role_arn = f.get(profile, "role_arn");
    if (!f.get(profile, "sso_start_url").empty() || !f.get(profile, "sso_session").empty() ||
        !f.get(profile, "sso_account_id").empty())
        return make_error(what +
                          " uses AWS IAM Identity Center (SSO), which Gantry does not implement (it needs a browser "
                          "login); export the session's keys (aws configure export-credentials --profile " +
                          profile +
                          " --format env), or use \"credHelpers\": {\"<registry>\": \"ecr-login\"} in "
                          "~/.docker/config.json");
    // role_arn comes before static keys in the same profile, as in botocore.
    if (!role_arn.empty() && !f.get(profile, "web_identity_token_file").empty()) {
        auto c = web_identity(f.get(profile, "web_identity_token_file"), role_arn, f.get(profile, "role_session_name"),
                              region, what);
        if (!c) return c.error();
        return std::optional<AwsCredentials>(*c);
    }
    if (!role_arn.empty()) {
        if (!f.get(profile, "mfa_serial").empty())
            return make_error(what + " assumes " + role_arn +
                              " with mfa_serial, which needs an MFA code typed in; a batch job cannot prompt");
        const std::string source_profile = f.get(profile, "source_profile");
        if (source_profile.empty()) {
            if (!f.get(profile, "credential_source").empty())
                return make_error(what + ": credential_source (" + f.get(profile, "credential_source") +
                                  ") is not implemented; use source_profile");
            return make_error(what + " names role_arn " + role_arn + " without source_profile");
        }
        std::optional<AwsCredentials> source;
        if (source_profile == profile) {
            // A profile may name itself as its source: its own static keys assume the role.
            source = static_keys(f, profile);
        } else {
            if (std::find(visited.begin(), visited.end(), source_profile) != visited.end())
                return make_error(what + ": source_profile " + source_profile + " makes a cycle");
            if (!f.has(source_profile))
                return make_error(what + ": source_profile " + source_profile + " is in neither " +
                                  display_path(f.cred_path) + " nor " + display_path(f.conf_path));
            auto s = profile_credentials(f, source_profile, region, visited);
            if (!s) return s.error();
            source = *s;
        }
        if (!source)
            return make_error(what + ": source_profile " + source_profile + " holds no credentials to assume " +
                              role_arn + " with");
        RoleRequest rr;
        rr.role_arn = role_arn;
        rr.session_name = f.get(profile, "role_session_name");
        rr.external_id = f.get(profile, "external_id");
        rr.duration_seconds = f.get(profile, "duration_seconds");
        rr.region = f.get(profile, "region").empty() ? region : f.get(profile, "region");
        rr.what = what;
        auto c = assume_role(*source, rr);
        if (!c) return c.error();
        return std::optional<AwsCredentials>(*c);
    }
    if (auto k = static_keys(f, profile)) return k;
    if (!f.get(profile, "credential_process").empty()) {
        auto c = credential_process(f.get(profile, "credential_process"), what);
        if (!c) return c.error();
        return std::optional<AwsCredentials>(*c);
    }
    return std::optional<AwsCredentials>();
}

}  // namespace

IniFile parse_aws_ini(std::string_view text, bool config_file) {
    IniFile out;
    std::istringstream in{std::string(text)};
    std::string line, section;
    bool have_section = false;
    while (std::getline(in, line)) {
        std::string t = trim(line);
        if (t.empty() || t[0] == '#' || t[0] == ';') continue;
        if (t.front() == '[' && t.back() == ']') {
            section = trim(t.substr(1, t.size() - 2));
            if (config_file && section.rfind("profile ", 0) == 0) section = trim(section.substr(8));
            have_section = true;
            out[section];
            continue;
        }
        auto eq = t.find('=');
        if (!have_section || eq == std::string::npos || line[0] == ' ' || line[0] == '\t') continue;  // nested values
        out[section][lower(trim(t.substr(0, eq)))] = trim(t.substr(eq + 1));
    }
    return out;
}

Result<AwsCredentials> aws_credentials(const std::string& ecr_region) {
    std::vector<std::string> tried;
    const Environment& env = environment();
    std::string region = env.aws_region.value;
    if (region.empty()) region = env.aws_default_region.value;
    if (region.empty()) region = ecr_region;

    // 1. Environment.
    if (!env.aws_access_key_id.value.empty() && !env.aws_secret_access_key.value.empty()) {
        AwsCredentials c;
        c.key = {env.aws_access_key_id.value, env.aws_secret_access_key.value, env.aws_session_token.value};
        c.source = "environment (AWS_ACCESS_KEY_ID)";
        return c;
    }
    tried.push_back("environment (AWS_ACCESS_KEY_ID unset)");

    // 2. Shared files, profile AWS_PROFILE (or default).
    std::string profile = env.aws_profile.value;
    if (profile.empty()) profile = env.aws_default_profile.value;
    const bool explicit_profile = !profile.empty();
    if (profile.empty()) profile = "default";
    SharedFiles files;
    files.cred_path = aws_file(env.aws_shared_credentials_file, "credentials");
    files.conf_path = aws_file(env.aws_config_file, "config");
    files.creds = parse_aws_ini(read_source_file(files.cred_path, display_path(files.cred_path)).value_or(""), false);
    files.conf = parse_aws_ini(read_source_file(files.conf_path, display_path(files.conf_path)).value_or(""), true);
    const std::string& cred_path = files.cred_path;
    const std::string& conf_path = files.conf_path;
    const std::string what = "profile " + profile;
    std::vector<std::string> visited;
    auto from_profile = profile_credentials(files, profile, region, visited);
    if (!from_profile) return from_profile.error();
    if (*from_profile) return **from_profile;
    if (explicit_profile && !files.has(profile))
        return make_error("AWS_PROFILE=" + profile + " names a profile that is in neither " + display_path(cred_path) +
                          " nor " + display_path(conf_path));
    tried.push_back(what + " (" + display_path(cred_path) + ", " + display_path(conf_path) + ": no keys)");

    // 3. Web identity token file.
    if (!env.aws_web_identity_token_file.value.empty() && !env.aws_role_arn.value.empty())
        return web_identity(env.aws_web_identity_token_file.value, env.aws_role_arn.value,
                            env.aws_role_session_name.value, region, "web identity token file");
    tried.push_back("web identity (AWS_WEB_IDENTITY_TOKEN_FILE unset)");

    // 4. Container credentials endpoint.
    std::string url;
    if (!env.aws_container_credentials_relative_uri.value.empty())
        url = "http://169.254.170.2" + env.aws_container_credentials_relative_uri.value;
    else if (!env.aws_container_credentials_full_uri.value.empty())
        url = env.aws_container_credentials_full_uri.value;
    if (!url.empty()) {
        const std::string src = "container credentials endpoint " + net::redact_url(url);
        // Plain HTTP only to the link-local ECS/EKS agents or loopback, as the SDKs require.
        if (url.rfind("https://", 0) != 0 && !net::is_local_http(url))
            return make_error(src + ": plain HTTP is allowed only to loopback or the link-local agent");
        net::Request req = endpoint_request("GET", url);
        req.timeout_s = 5;
        req.connect_timeout_ms = 2000;
        std::string token = env.aws_container_authorization_token.value;
        if (!env.aws_container_authorization_token_file.value.empty()) {
            const std::string file = env.aws_container_authorization_token_file.value;
            auto t = read_config_file(file, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE " + file);
            if (!t) return t.error().wrap(src);
            token = trim(*t);
        }
        if (!token.empty()) req.authorization = token;
        auto resp = net::fetch(req, aws_tls());
        if (!resp) return resp.error().wrap(src);
        if (resp->status != 200) return make_error(src + ": HTTP " + std::to_string(resp->status));
        return parse_credentials_json(resp->body, src, "Token");
    }
    tried.push_back("container credentials endpoint (AWS_CONTAINER_CREDENTIALS_*_URI unset)");

    // 5. EC2 instance metadata, IMDSv2 only: a session token from PUT, then the role's credentials.
    if (lower(env.aws_ec2_metadata_disabled.value) == "true") {
        tried.push_back("EC2 instance metadata (AWS_EC2_METADATA_DISABLED)");
    } else {
        std::string base = env.aws_ec2_metadata_service_endpoint.value;
        if (base.empty()) base = "http://169.254.169.254";
        while (!base.empty() && base.back() == '/') base.pop_back();
        const std::string src = "EC2 instance metadata (IMDSv2 at " + base + ")";
        auto imds = [&]() -> Result<AwsCredentials> {
            if (base.rfind("https://", 0) != 0 && !net::is_local_http(base))
                return make_error("plain HTTP is allowed only to loopback or link-local addresses");
            net::Request put = endpoint_request("PUT", base + "/latest/api/token");
            put.headers = {"X-aws-ec2-metadata-token-ttl-seconds: 21600"};
            put.timeout_s = 3;
            put.connect_timeout_ms = 1000;  // off EC2 nothing answers: give up quickly
            auto tok = net::fetch(put, net::settings_from_environment());
            if (!tok) return tok.error();
            if (tok->status != 200) return make_error("token PUT answered HTTP " + std::to_string(tok->status));
            net::Request get = endpoint_request("GET", "");
            get.timeout_s = 3;
            get.connect_timeout_ms = 1000;
            get.headers = {"X-aws-ec2-metadata-token: " + trim(tok->body)};
            get.url = base + "/latest/meta-data/iam/security-credentials/";
            auto role = net::fetch(get, net::settings_from_environment());
            if (!role) return role.error();
            if (role->status == 404) return make_error("the instance has no IAM role");
            if (role->status != 200) return make_error("role lookup answered HTTP " + std::to_string(role->status));
            std::string name = trim(role->body.substr(0, role->body.find('\n')));
            if (name.empty()) return make_error("the instance has no IAM role");
            get.url += name;
            auto cred = net::fetch(get, net::settings_from_environment());
            if (!cred) return cred.error();
            if (cred->status != 200)
                return make_error("role credentials answered HTTP " + std::to_string(cred->status));
            auto c = parse_credentials_json(cred->body, src + " role " + name, "Token");
            return c;
        }();
        if (imds) return imds;
        tried.push_back(src + ": " + imds.error().message);
    }
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : "; ") + t;
    return make_error("no AWS credentials found (tried " + list + ")");
}

}  // namespace gantry::auth
