// AWS Signature Version 4 with OpenSSL: canonical request, string to sign, derived signing key and
// signature, as the published algorithm defines them. Used for ECR's GetAuthorizationToken; checked
// against the AWS test-suite vectors and botocore (tests/unit/auth_test.cpp, tests/integration/auth.bats).
#include "gantry/sigv4.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <ctime>
#include <map>

#include "gantry/strings.hpp"

namespace gantry::sigv4 {
namespace {

std::string hex(const unsigned char* data, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    out.reserve(n * 2);
    for (size_t i = 0; i < n; ++i) {
        out += digits[data[i] >> 4];
        out += digits[data[i] & 15];
    }
    return out;
}

// Header values are trimmed and runs of spaces collapsed to one, as the algorithm requires.
std::string canonical_value(const std::string& v) {
    std::string out;
    bool space = false;
    for (char c : v) {
        if (c == ' ' || c == '\t') {
            space = !out.empty();
            continue;
        }
        if (space) out += ' ';
        space = false;
        out += c;
    }
    return out;
}

// Path segments are encoded once; empty and "." segments dropped and ".." resolved (non-S3 rules).
std::string canonical_path(const std::string& path) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i <= path.size()) {
        size_t j = path.find('/', i);
        if (j == std::string::npos) j = path.size();
        std::string seg = path.substr(i, j - i);
        if (seg == "..") {
            if (!parts.empty()) parts.pop_back();
        } else if (!seg.empty() && seg != ".") {
            parts.push_back(seg);
        }
        i = j + 1;
    }
    std::string out;
    for (const auto& p : parts) out += "/" + uri_encode(p, false);
    if (out.empty() || (path.size() > 1 && path.back() == '/')) out += "/";
    return out;
}

}  // namespace

std::string uri_encode(const std::string& s, bool keep_slash) {
    static const char* digits = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                          c == '_' || c == '.' || c == '~';
        if (unreserved || (keep_slash && c == '/')) {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += digits[c >> 4];
            out += digits[c & 15];
        }
    }
    return out;
}

std::string sha256_hex(const std::string& data) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
    return hex(md, sizeof(md));
}

std::string hmac_sha256(const std::string& key, const std::string& data) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
         data.size(), md, &len);
    return std::string(reinterpret_cast<const char*>(md), len);
}

Signed sign(const Request& request, const Key& key, const std::string& region, const std::string& service,
            const std::string& amz_date) {
    Signed out;
    // Query: encoded names and values, sorted by name then value.
    std::vector<std::pair<std::string, std::string>> q;
    for (const auto& [n, v] : request.query) q.emplace_back(uri_encode(n, false), uri_encode(v, false));
    std::sort(q.begin(), q.end());
    std::string query;
    for (const auto& [n, v] : q) query += (query.empty() ? "" : "&") + n + "=" + v;
    // Headers: lower-case names, sorted; repeated names joined with ','.
    std::map<std::string, std::string> headers;
    for (const auto& [n, v] : request.headers) {
        std::string name = lower(n);
        auto it = headers.find(name);
        if (it == headers.end())
            headers[name] = canonical_value(v);
        else
            it->second += "," + canonical_value(v);
    }
    std::string canonical_headers;
    for (const auto& [n, v] : headers) {
        canonical_headers += n + ":" + v + "\n";
        out.signed_headers += (out.signed_headers.empty() ? "" : ";") + n;
    }
    out.canonical_request = request.method + "\n" + canonical_path(request.path) + "\n" + query + "\n" +
                            canonical_headers + "\n" + out.signed_headers + "\n" + sha256_hex(request.payload);
    const std::string date = amz_date.substr(0, 8);
    const std::string scope = date + "/" + region + "/" + service + "/aws4_request";
    out.string_to_sign = "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + sha256_hex(out.canonical_request);
    std::string k = hmac_sha256("AWS4" + key.secret_access_key, date);
    k = hmac_sha256(k, region);
    k = hmac_sha256(k, service);
    k = hmac_sha256(k, "aws4_request");
    std::string raw = hmac_sha256(k, out.string_to_sign);
    out.signature = hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
    out.authorization = "AWS4-HMAC-SHA256 Credential=" + key.access_key_id + "/" + scope +
                        ", SignedHeaders=" + out.signed_headers + ", Signature=" + out.signature;
    return out;
}

std::string amz_date_now() {
    std::time_t now = std::time(nullptr);
    struct tm tm {};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
    return buf;
}

}  // namespace gantry::sigv4
