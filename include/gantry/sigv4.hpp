// AWS Signature Version 4 (request signing for AWS APIs such as ECR's GetAuthorizationToken and STS),
// implemented with OpenSSL's SHA-256 and HMAC. Owner: runtime/auth/. The steps follow the published
// algorithm (canonical request -> string to sign -> signing key -> signature) and are exposed one by
// one so that tests can compare each against the AWS test-suite vectors and botocore.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gantry::sigv4 {

struct Request {
    std::string method = "GET";
    std::string path = "/";  // the request path as sent (not yet URI-encoded for signing)
    std::vector<std::pair<std::string, std::string>> query;    // decoded name/value pairs, any order
    std::vector<std::pair<std::string, std::string>> headers;  // every header to sign, incl. host, x-amz-date
    std::string payload;
};

struct Key {
    std::string access_key_id;
    std::string secret_access_key;
    std::string session_token;  // empty: long-term keys
};

struct Signed {
    std::string canonical_request;
    std::string string_to_sign;
    std::string signature;       // lower-case hex
    std::string signed_headers;  // "host;x-amz-date"
    std::string authorization;   // the Authorization header value
};

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters kept, everything else %XX
// (upper case); '/' kept only when `keep_slash`.
std::string uri_encode(const std::string& s, bool keep_slash);
std::string sha256_hex(const std::string& data);
std::string hmac_sha256(const std::string& key, const std::string& data);  // raw bytes

// Signs `request` at `amz_date` ("YYYYMMDDTHHMMSSZ", which must equal the request's X-Amz-Date header)
// for `region` and `service`. The request's headers must already hold everything that is sent and
// signed (host, x-amz-date, x-amz-security-token when there is a session token).
Signed sign(const Request& request, const Key& key, const std::string& region, const std::string& service,
            const std::string& amz_date);

// The current UTC time as "YYYYMMDDTHHMMSSZ".
std::string amz_date_now();

}  // namespace gantry::sigv4
