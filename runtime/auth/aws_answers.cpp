// The answers of STS, the credential endpoints and ECR, parsed into what the credential chain needs.
// They arrive over the network, so each parser is total: any input gives an answer or an error, never
// a crash (tests/fuzz/fuzz_aws_answers.cpp). STS speaks XML: libxml2 reads it, so entities and
// character references come out decoded; a document with a DTD is refused, as STS never sends one.
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <climits>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

#include "gantry/auth.hpp"

namespace gantry::auth {
namespace {

constexpr size_t kMaxXmlBytes = 1 << 20;  // an STS answer is about 2 KiB

// The text of the first element named `name` (any namespace) below `node`, depth first; nullptr when
// there is none.
const xmlNode* find_element(const xmlNode* node, const char* name) {
    for (const xmlNode* n = node; n != nullptr; n = n->next) {
        if (n->type != XML_ELEMENT_NODE) continue;
        if (xmlStrcmp(n->name, reinterpret_cast<const xmlChar*>(name)) == 0) return n;
        if (const xmlNode* inner = find_element(n->children, name)) return inner;
    }
    return nullptr;
}

std::string element_text(const xmlNode* root, const char* name) {
    const xmlNode* e = find_element(root, name);
    if (e == nullptr) return {};
    xmlChar* text = xmlNodeGetContent(e);
    if (text == nullptr) return {};
    std::string out(reinterpret_cast<const char*>(text));
    xmlFree(text);
    return out;
}

}  // namespace

std::time_t parse_iso8601(const std::string& text) {
    struct tm tm {};
    if (text.size() < 19 || ::strptime(text.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
    return ::timegm(&tm);
}

StsAnswer parse_sts_answer(std::string_view body) {
    StsAnswer out;
    if (body.empty() || body.size() > kMaxXmlBytes) return out;
    // No network, no entity substitution from a DTD, no messages on stderr.
    xmlDocPtr doc = xmlReadMemory(body.data(), static_cast<int>(body.size()), "sts-answer.xml", nullptr,
                                  XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (doc == nullptr) return out;
    if (doc->intSubset == nullptr && doc->extSubset == nullptr) {
        const xmlNode* root = xmlDocGetRootElement(doc);
        out.xml = root != nullptr;
        if (const xmlNode* creds = find_element(root, "Credentials")) {
            out.creds.key.access_key_id = element_text(creds->children, "AccessKeyId");
            out.creds.key.secret_access_key = element_text(creds->children, "SecretAccessKey");
            out.creds.key.session_token = element_text(creds->children, "SessionToken");
            out.creds.expiration = parse_iso8601(element_text(creds->children, "Expiration"));
        }
        if (const xmlNode* error = find_element(root, "Error")) {
            out.code = element_text(error->children, "Code");
            out.message = element_text(error->children, "Message");
        }
    }
    xmlFreeDoc(doc);
    return out;
}

Result<AwsCredentials> parse_credentials_json(std::string_view body, const std::string& source,
                                              const char* token_field) {
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

Result<EcrToken> parse_ecr_token_answer(std::string_view body, std::time_t now, const std::string& what) {
    auto j = nlohmann::json::parse(body, nullptr, false);
    const std::string bad = what + ": unexpected answer";
    if (j.is_discarded() || !j.is_object() || !j.contains("authorizationData") || !j["authorizationData"].is_array() ||
        j["authorizationData"].empty() || !j["authorizationData"][0].is_object())
        return make_error(bad);
    const auto& d = j["authorizationData"][0];
    const auto& token = d.contains("authorizationToken") ? d["authorizationToken"] : nlohmann::json();
    auto decoded = token.is_string() ? base64_decode(token.get<std::string>()) : std::nullopt;
    auto colon = decoded ? decoded->find(':') : std::string::npos;
    if (!decoded || colon == std::string::npos)
        return make_error(bad + " (authorizationToken is not base64 of user:password)");
    EcrToken t;
    t.username = decoded->substr(0, colon);
    t.password = decoded->substr(colon + 1);
    t.expires_at = now + 12 * 3600;
    if (d.contains("expiresAt") && d["expiresAt"].is_number()) {
        double at = d["expiresAt"].get<double>();
        // A time in range; anything else (NaN, ±inf, beyond time_t) keeps the 12-hour default.
        if (std::isfinite(at) && at > 0 && at < 1e15) t.expires_at = static_cast<std::time_t>(std::floor(at));
    }
    return t;
}

}  // namespace gantry::auth
