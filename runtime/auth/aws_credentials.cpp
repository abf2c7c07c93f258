// The AWS credential chain, in the order the AWS SDKs use: environment variables, the shared
// ~/.aws/credentials and ~/.aws/config files (AWS_PROFILE), a web identity token file (EKS IRSA, via
// STS AssumeRoleWithWebIdentity), the container credentials endpoint (ECS, EKS Pod Identity) and EC2
// instance metadata with IMDSv2 session tokens (ParallelCluster compute nodes). Secrets never appear
// in messages; errors name the source and what went wrong.
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "auth/http_client.hpp"
#include "auth/internal.hpp"
#include "gantry/files.hpp"
#include "gantry/auth.hpp"
#include "gantry/log.hpp"

namespace gantry::auth {
namespace {

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.pop_back();
    size_t b = 0;
    while (b < s.size() && (s[b] == ' ' || s[b] == '\t')) ++b;
    return s.substr(b);
}

// "2024-05-01T12:00:00Z" (also with fractional seconds or "+00:00") -> epoch seconds; 0 if unparsable.
std::time_t parse_iso8601(const std::string& s) {
    struct tm tm {};
    if (s.size() < 19 || ::strptime(s.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
    return ::timegm(&tm);
}

// One XML element's text (STS answers in XML); empty when absent. Only for the simple, known answer.
std::string xml_text(const std::string& xml, const std::string& tag) {
    auto b = xml.find("<" + tag + ">");
    if (b == std::string::npos) return {};
    b += tag.size() + 2;
    auto e = xml.find("</" + tag + ">", b);
    return e == std::string::npos ? std::string() : xml.substr(b, e - b);
}

std::string aws_file(const char* var, const char* name) {
    std::string p = env(var);
    if (!p.empty()) return p;
    std::string home = home_dir();
    return home.empty() ? std::string() : home + "/.aws/" + name;
}

std::string ca_bundle() {
    return env("AWS_CA_BUNDLE");
}

// The credential JSON that the container endpoint, IMDS and credential_process all speak.
Result<AwsCredentials> from_json(const std::string& body, const std::string& source, const char* token_field) {
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error(source + ": the answer is not JSON");
    auto s = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
    if (!s("Code").empty() && s("Code") != "Success") return make_error(source + ": answered Code " + s("Code"));
    AwsCredentials c;
    c.key.access_key_id = s("AccessKeyId");
    c.key.secret_access_key = s("SecretAccessKey");
    c.key.session_token = s(token_field);
    c.expiration = parse_iso8601(s("Expiration"));
    c.source = source;
    if (c.key.access_key_id.empty() || c.key.secret_access_key.empty())
        return make_error(source + ": the answer holds no AccessKeyId/SecretAccessKey");
    return c;
}

std::string sts_endpoint(const std::string& region) {
    for (const char* var : {"GANTRY_STS_ENDPOINT", "AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL"}) {
        std::string v = env(var);
        if (!v.empty()) return v;
    }
    std::string r = region.empty() ? "us-east-1" : region;
    return "https://sts." + r + ".amazonaws.com" + (r.rfind("cn-", 0) == 0 ? ".cn" : "");
}

Result<AwsCredentials> web_identity(const std::string& token_file, const std::string& role_arn,
                                    const std::string& session, const std::string& region, const std::string& what) {
    auto token = try_read_file(token_file);
    if (!token) return system_error(what + ": reading the token file " + token_file);
    std::string url = sts_endpoint(region);
    if (url.rfind("https://", 0) != 0 && !http::is_local_http(url))
        return make_error(what + ": refusing the STS endpoint " + http::redact(url) + " (not https)");
    http::Request req;
    req.method = "POST";
    req.url = url + "/";
    req.ca_file = ca_bundle();
    req.headers = {"Content-Type: application/x-www-form-urlencoded", "Accept: application/xml"};
    req.body =
        "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=" + http::form_escape(role_arn) +
        "&RoleSessionName=" + http::form_escape(session.empty() ? "gantry-" + std::to_string(::getuid()) : session) +
        "&WebIdentityToken=" + http::form_escape(trim(*token));
    auto resp = http::perform(req);
    if (!resp) return resp.error().wrap(what + ": STS AssumeRoleWithWebIdentity");
    if (resp->status != 200) {
        std::string msg = xml_text(resp->body, "Message");
        return make_error(what + ": STS AssumeRoleWithWebIdentity at " + http::redact(url) + " answered HTTP " +
                          std::to_string(resp->status) + (msg.empty() ? "" : ": " + msg));
    }
    AwsCredentials c;
    c.key.access_key_id = xml_text(resp->body, "AccessKeyId");
    c.key.secret_access_key = xml_text(resp->body, "SecretAccessKey");
    c.key.session_token = xml_text(resp->body, "SessionToken");
    c.expiration = parse_iso8601(xml_text(resp->body, "Expiration"));
    c.source = what + " (STS AssumeRoleWithWebIdentity for " + role_arn + ")";
    if (c.key.access_key_id.empty() || c.key.secret_access_key.empty())
        return make_error(what + ": the STS answer holds no credentials");
    return c;
}

// credential_process from a profile: runs the user's own command (their config file names it), as the
// AWS CLI does; argv through /bin/sh -c because the setting is a command line by definition.
Result<AwsCredentials> credential_process(const std::string& command, const std::string& what) {
    auto out = run_command({"/bin/sh", "-c", command}, "", 60);
    if (!out) return out.error().wrap(what + ": credential_process");
    if (out->exit_status != 0)
        return make_error(what + ": credential_process exited with status " + std::to_string(out->exit_status));
    return from_json(out->out, what + " (credential_process)", "SessionToken");
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
    std::string region = env("AWS_REGION");
    if (region.empty()) region = env("AWS_DEFAULT_REGION");
    if (region.empty()) region = ecr_region;

    // 1. Environment.
    if (!env("AWS_ACCESS_KEY_ID").empty() && !env("AWS_SECRET_ACCESS_KEY").empty()) {
        AwsCredentials c;
        c.key = {env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")};
        c.source = "environment (AWS_ACCESS_KEY_ID)";
        return c;
    }
    tried.push_back("environment (AWS_ACCESS_KEY_ID unset)");

    // 2. Shared files, profile AWS_PROFILE (or default).
    std::string profile = env("AWS_PROFILE");
    if (profile.empty()) profile = env("AWS_DEFAULT_PROFILE");
    const bool explicit_profile = !profile.empty();
    if (profile.empty()) profile = "default";
    const std::string cred_path = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    const std::string conf_path = aws_file("AWS_CONFIG_FILE", "config");
    IniFile creds = parse_aws_ini(try_read_file(cred_path).value_or(""), false);
    IniFile conf = parse_aws_ini(try_read_file(conf_path).value_or(""), true);
    const std::string what = "profile " + profile;
    auto find = [&](const std::string& key) -> std::string {
        for (const IniFile* f : {&creds, &conf}) {
            auto s = f->find(profile);
            if (s == f->end()) continue;
            auto v = s->second.find(key);
            if (v != s->second.end() && !v->second.empty()) return v->second;
        }
        return {};
    };
    if (!find("aws_access_key_id").empty() && !find("aws_secret_access_key").empty()) {
        AwsCredentials c;
        c.key = {find("aws_access_key_id"), find("aws_secret_access_key"), find("aws_session_token")};
        c.source = what + " in " + display_path(creds.count(profile) ? cred_path : conf_path);
        return c;
    }
    if (!find("role_arn").empty() && !find("web_identity_token_file").empty())
        return web_identity(find("web_identity_token_file"), find("role_arn"), find("role_session_name"), region, what);
    if (!find("credential_process").empty()) return credential_process(find("credential_process"), what);
    if (!find("role_arn").empty() || !find("sso_start_url").empty() || !find("sso_session").empty())
        return make_error(what +
                          " uses role_arn/source_profile or SSO, which Gantry does not implement; "
                          "export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, or use "
                          "\"credHelpers\": {\"<registry>\": \"ecr-login\"} in ~/.docker/config.json");
    if (explicit_profile && !creds.count(profile) && !conf.count(profile))
        return make_error("AWS_PROFILE=" + profile + " names a profile that is in neither " + display_path(cred_path) +
                          " nor " + display_path(conf_path));
    tried.push_back(what + " (" + display_path(cred_path) + ", " + display_path(conf_path) + ": no keys)");

    // 3. Web identity token file.
    if (!env("AWS_WEB_IDENTITY_TOKEN_FILE").empty() && !env("AWS_ROLE_ARN").empty())
        return web_identity(env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN"), env("AWS_ROLE_SESSION_NAME"),
                            region, "web identity token file");
    tried.push_back("web identity (AWS_WEB_IDENTITY_TOKEN_FILE unset)");

    // 4. Container credentials endpoint.
    std::string url;
    if (!env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").empty())
        url = "http://169.254.170.2" + env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    else if (!env("AWS_CONTAINER_CREDENTIALS_FULL_URI").empty())
        url = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    if (!url.empty()) {
        const std::string src = "container credentials endpoint " + http::redact(url);
        // Plain HTTP only to the link-local ECS/EKS agents or loopback, as the SDKs require.
        if (url.rfind("https://", 0) != 0 && !http::is_local_http(url))
            return make_error(src + ": plain HTTP is allowed only to loopback or the link-local agent");
        http::Request req;
        req.url = url;
        req.ca_file = ca_bundle();
        req.timeout_s = 5;
        req.connect_timeout_ms = 2000;
        std::string token = env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
        if (!env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").empty()) {
            auto t = try_read_file(env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
            if (!t) return system_error(src + ": reading AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
            token = trim(*t);
        }
        if (!token.empty()) req.headers.push_back("Authorization: " + token);
        auto resp = http::perform(req);
        if (!resp) return resp.error().wrap(src);
        if (resp->status != 200) return make_error(src + ": HTTP " + std::to_string(resp->status));
        return from_json(resp->body, src, "Token");
    }
    tried.push_back("container credentials endpoint (AWS_CONTAINER_CREDENTIALS_*_URI unset)");

    // 5. EC2 instance metadata, IMDSv2 only: a session token from PUT, then the role's credentials.
    if (lower(env("AWS_EC2_METADATA_DISABLED")) == "true") {
        tried.push_back("EC2 instance metadata (AWS_EC2_METADATA_DISABLED)");
    } else {
        std::string base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
        if (base.empty()) base = "http://169.254.169.254";
        while (!base.empty() && base.back() == '/') base.pop_back();
        const std::string src = "EC2 instance metadata (IMDSv2 at " + base + ")";
        auto imds = [&]() -> Result<AwsCredentials> {
            if (base.rfind("https://", 0) != 0 && !http::is_local_http(base))
                return make_error("plain HTTP is allowed only to loopback or link-local addresses");
            http::Request put;
            put.method = "PUT";
            put.url = base + "/latest/api/token";
            put.headers = {"X-aws-ec2-metadata-token-ttl-seconds: 21600"};
            put.timeout_s = 3;
            put.connect_timeout_ms = 1000;  // off EC2 nothing answers: give up quickly
            auto tok = http::perform(put);
            if (!tok) return tok.error();
            if (tok->status != 200) return make_error("token PUT answered HTTP " + std::to_string(tok->status));
            http::Request get;
            get.timeout_s = 3;
            get.connect_timeout_ms = 1000;
            get.headers = {"X-aws-ec2-metadata-token: " + trim(tok->body)};
            get.url = base + "/latest/meta-data/iam/security-credentials/";
            auto role = http::perform(get);
            if (!role) return role.error();
            if (role->status == 404) return make_error("the instance has no IAM role");
            if (role->status != 200) return make_error("role lookup answered HTTP " + std::to_string(role->status));
            std::string name = trim(role->body.substr(0, role->body.find('\n')));
            if (name.empty()) return make_error("the instance has no IAM role");
            get.url += name;
            auto cred = http::perform(get);
            if (!cred) return cred.error();
            if (cred->status != 200)
                return make_error("role credentials answered HTTP " + std::to_string(cred->status));
            auto c = from_json(cred->body, src + " role " + name, "Token");
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
