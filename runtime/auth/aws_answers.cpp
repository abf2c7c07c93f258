// The answers of STS, the credential endpoints and ECR, parsed into what the credential chain needs.
// They arrive over the network, so each parser is total: any input gives an answer or an error, never
// a crash (tests/fuzz/fuzz_aws_answers.cpp). STS speaks XML: libxml2 reads it, so entities and
// character references come out decoded; a document with a DTD is refused, as STS never sends one.
// libxml2 is opened with dlopen when an STS answer first needs it, not linked: spank_gantry.so is
// loaded by every srun, also inside containers whose images have no libxml2.
#include <dlfcn.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "gantry/auth.hpp"

namespace gantry::auth {
namespace {

constexpr size_t kMaxXmlBytes = 1 << 20;  // an STS answer is about 2 KiB

// The few libxml2 entry points used here, from the library opened at run time; nullptr when it is not
// installed.
struct LibXml {
    decltype(&xmlReadMemory) read_memory = nullptr;
    decltype(&xmlFreeDoc) free_doc = nullptr;
    decltype(&xmlDocGetRootElement) root_element = nullptr;
    decltype(&xmlNodeGetContent) node_content = nullptr;
    xmlFreeFunc* free = nullptr;  // libxml2's xmlFree is a variable holding the function
};

const LibXml* libxml() {
    static const LibXml* lib = []() -> const LibXml* {
        // libxml2 2.14 changed its soname from .so.2 to .so.16 (Debian forky, Ubuntu 25.10 and later); the
        // functions and the xmlNode/xmlDoc fields read here are the same in both.
        void* h = ::dlopen("libxml2.so.2", RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) h = ::dlopen("libxml2.so.16", RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) return nullptr;
        static LibXml l;
        l.read_memory = reinterpret_cast<decltype(&xmlReadMemory)>(::dlsym(h, "xmlReadMemory"));
        l.free_doc = reinterpret_cast<decltype(&xmlFreeDoc)>(::dlsym(h, "xmlFreeDoc"));
        l.root_element = reinterpret_cast<decltype(&xmlDocGetRootElement)>(::dlsym(h, "xmlDocGetRootElement"));
        l.node_content = reinterpret_cast<decltype(&xmlNodeGetContent)>(::dlsym(h, "xmlNodeGetContent"));
        l.free = static_cast<xmlFreeFunc*>(::dlsym(h, "xmlFree"));
        if (!l.read_memory || !l.free_doc || !l.root_element || !l.node_content || !l.free || !*l.free) return nullptr;
        return &l;
    }();
    return lib;
}

// The text of the first element named `name` (any namespace) below `node`, depth first; nullptr when
// there is none.
const xmlNode* find_element(const xmlNode* node, const char* name) {
    for (const xmlNode* n = node; n != nullptr; n = n->next) {
        if (n->type != XML_ELEMENT_NODE) continue;
        if (std::strcmp(reinterpret_cast<const char*>(n->name), name) == 0) return n;
        if (const xmlNode* inner = find_element(n->children, name)) return inner;
    }
    return nullptr;
}

std::string element_text(const LibXml& xml, const xmlNode* root, const char* name) {
    const xmlNode* e = find_element(root, name);
    if (e == nullptr) return {};
    xmlChar* text = xml.node_content(e);
    if (text == nullptr) return {};
    std::string out(reinterpret_cast<const char*>(text));
    (*xml.free)(text);
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
    const LibXml* xml = libxml();
    if (xml == nullptr) {
        out.message = "libxml2 (libxml2.so.2 or .so.16) could not be loaded to read STS's XML answer (install libxml2)";
        return out;
    }
    // No network, no entity substitution from a DTD, no messages on stderr.
    xmlDocPtr doc = xml->read_memory(body.data(), static_cast<int>(body.size()), "sts-answer.xml", nullptr,
                                     XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (doc == nullptr) return out;
    if (doc->intSubset == nullptr && doc->extSubset == nullptr) {
        const xmlNode* root = xml->root_element(doc);
        out.xml = root != nullptr;
        if (const xmlNode* creds = find_element(root, "Credentials")) {
            out.creds.key.access_key_id = element_text(*xml, creds->children, "AccessKeyId");
            out.creds.key.secret_access_key = element_text(*xml, creds->children, "SecretAccessKey");
            out.creds.key.session_token = element_text(*xml, creds->children, "SessionToken");
            out.creds.expiration = parse_iso8601(element_text(*xml, creds->children, "Expiration"));
        }
        if (const xmlNode* error = find_element(root, "Error")) {
            out.code = element_text(*xml, error->children, "Code");
            out.message = element_text(*xml, error->children, "Message");
        }
    }
    xml->free_doc(doc);
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
        // A time in range; anything else (NaN, ±inf, beyond time_t, before 1970-01-01T00:00:01, which
        // would floor to 0: "no expiry known" in the token cache) keeps the 12-hour default.
        if (std::isfinite(at) && at >= 1 && at < 1e15) t.expires_at = static_cast<std::time_t>(std::floor(at));
    }
    return t;
}

}  // namespace gantry::auth
