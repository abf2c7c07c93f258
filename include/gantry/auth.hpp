// Registry credentials: where a user's username/password (or token) for a registry comes from.
// Owner: runtime/auth/. The sources, in the order the default chain consults them (docs/auth.md):
//   1. Docker's config.json: credHelpers[registry], else credsStore, else auths (auth, username/
//      password, identitytoken) -- helpers run as `docker-credential-<name> get`, exactly as Docker does;
//   2. containers auth.json ($REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json);
//   3. Enroot's netrc-style $ENROOT_CONFIG_PATH/.credentials, with its USER@ selector;
//   4. native ECR for <acct>.dkr.ecr.<region>.amazonaws.com(.cn): GetAuthorizationToken signed with
//      SigV4 using the AWS credential chain, tokens cached in memory and on disk per user.
// Nothing here logs or returns in an error a password, token, secret key or Authorization value.
#pragma once

#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/reference.hpp"
#include "gantry/result.hpp"
#include "gantry/sigv4.hpp"

namespace gantry {

// Username/password (or token) for one registry.
struct Credentials {
    std::string username;
    std::string password;
    // An OAuth2 refresh token (Docker's `identitytoken`, or a helper answering Username "<token>"):
    // traded at the registry's token realm with grant_type=refresh_token instead of Basic credentials.
    std::string identity_token;
    std::string source;  // where they came from, for messages ("~/.docker/config.json"); never the secret
};
using CredentialLookup = std::function<std::optional<Credentials>(const ImageReference&)>;

std::string base64_encode(std::string_view data);
// Standard or URL-safe alphabet, padding optional, whitespace not allowed; nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view text);

// ---- The sources. Each returns nullopt when it has nothing for the registry; problems (a malformed
// file, a failing helper) are reported with a one-line warning that never holds a secret.

// Docker's config.json ($DOCKER_CONFIG/config.json, else ~/.docker/config.json).
std::optional<Credentials> docker_config_credentials(const ImageReference& ref);
std::string docker_config_source();  // as messages name it: "~/.docker/config.json" or the path

// Podman/containers auth.json: $REGISTRY_AUTH_FILE, else $XDG_RUNTIME_DIR/containers/auth.json.
std::optional<Credentials> containers_auth_credentials(const ImageReference& ref);
std::string containers_auth_source();

// Enroot's $ENROOT_CONFIG_PATH/.credentials (default ${XDG_CONFIG_HOME:-~/.config}/enroot).
std::optional<Credentials> enroot_credentials(const ImageReference& ref);
std::string enroot_credentials_source();

// Native ECR (nullopt for registries that are not private ECR, and on errors, which are warned).
std::optional<Credentials> ecr_credentials(const ImageReference& ref);

// The full chain above, first match wins; what RegistryClient uses when RegistryOptions::credentials
// is empty. `default_credential_sources()` names the sources for "no credentials found" messages.
CredentialLookup default_credential_lookup();
// What the default chain falls back to when the credentials it found are refused: native ECR for an
// ECR registry (an expired `docker login` token in config.json), nothing elsewhere.
CredentialLookup default_credential_fallback();
std::string default_credential_sources();

// The credential hand-over (docs/store.md, "Trusted shared store"): a user's credentials for one
// registry, as one JSON object ({} when there are none), from a process of the user's to a pull run by
// the store account (a node's plugin, the login nodes' stage server). One format for every hand-over;
// the receiving pull uses exactly these credentials, for that registry only, and nothing of its own.
std::string encode_credential_hand_over(const std::string& registry, const std::optional<Credentials>& found);
// The registry a hand-over is for ("" for {}), or why it is no hand-over.
Result<std::string> credential_hand_over_registry(const std::string& text);
// The lookup a receiving pull uses: the handed-over credentials for their registry, nothing elsewhere.
Result<CredentialLookup> decode_credential_hand_over(const std::string& text);

// The store account's pull that receives a hand-over (a node's pull_into_trusted_store, the stage
// server's), one recipe for both: `PROGRAM pull --quiet --credentials-fd 3 --report-fd 4 --store STORE
// [--whole] IMAGE`, run with store_owner_pull_environment, the hand-over on a pipe whose read end
// (hand_over_pipe) the pull gets as kHandOverCredentialsFd and its report on kHandOverReportFd.
inline constexpr int kHandOverCredentialsFd = 3;
inline constexpr int kHandOverReportFd = 4;
std::vector<std::string> store_owner_pull_argv(const std::string& program, const std::string& store,
                                               const std::string& image, bool whole);
// The account's basics (PATH, HOME, USER, LANG), GANTRY_CONFIG when `config_path` is set, the site's
// proxies as given (their network path, not code), and `extra` ("NAME=VALUE"); nothing else of anyone's.
std::vector<std::string> store_owner_pull_environment(const std::string& home, const std::string& user,
                                                      const std::string& config_path,
                                                      const std::map<std::string, std::string>& proxies,
                                                      const std::vector<std::string>& extra = {});
// A pipe holding `hand_over` ({} when empty), its read end returned. The hand-over fits the pipe's
// buffer (it is a few KiB at most: the user's half is capped), and the write end is non-blocking, so
// the writer never waits on a reader that has not started: anything larger fails here instead.
Result<UniqueFd> hand_over_pipe(const std::string& hand_over);

namespace auth {

// ---- Building blocks, public for the registry client and the unit tests.

// Seconds a credential helper or an Enroot password command may run (GANTRY_CREDENTIAL_TIMEOUT, default 10).
double helper_timeout_s();

struct CommandOutput {
    int exit_status = 0;  // exit code, or 128 + signal
    std::string out;
    std::string err;
};
// Runs argv[0] (looked up in PATH) with `input` on stdin, in its own process group, capturing stdout
// and stderr (1 MiB each at most). Past `timeout_s` the whole group is killed and an error returned.
Result<CommandOutput> run_command(const std::vector<std::string>& argv, const std::string& input, double timeout_s);

// `docker-credential-<helper> get` for `server`; nullopt when the helper says it has nothing.
Result<std::optional<Credentials>> credential_helper_get(const std::string& helper, const std::string& server);

// What one Docker-format file (config.json, auth.json) says for `ref`, parsed without running
// anything: the credential helpers to ask, in Docker's order (credHelpers[registry], credsStore), each
// with how messages name it, then the file's own "auths" entry. `namespaces`: auth.json semantics (keys
// may carry a repository path). `problem`: why the file or its entry is ignored, a warning that never
// holds a secret. docker_config_credentials() runs the helpers; tests and the fuzzer only parse.
struct DockerConfigAnswer {
    std::vector<std::pair<std::string, std::string>> helpers;  // helper name, description
    std::optional<Credentials> credentials;
    std::string problem;
};
DockerConfigAnswer parse_docker_config(std::string_view text, const ImageReference& ref, bool namespaces,
                                       const std::string& source);

// netrc as Enroot writes it: "machine H login U password P" tokens, in any layout.
struct NetrcEntry {
    std::string machine;
    std::string login;
    std::string password;
};
std::vector<NetrcEntry> parse_netrc(std::string_view text);

// The INI dialect of ~/.aws/credentials and ~/.aws/config: section -> key -> value. In the config
// file, "[profile NAME]" is returned under "NAME".
using IniFile = std::map<std::string, std::map<std::string, std::string>>;
IniFile parse_aws_ini(std::string_view text, bool config_file);

// A private ECR registry, from its host name or from the test-only GANTRY_TEST_ECR_REGISTRIES
// declaration "HOST[:PORT]=<acct>.dkr.ecr.<region>.amazonaws.com[,...]" (docs/auth.md).
struct EcrRegistry {
    std::string registry;  // as the image reference names it
    std::string ecr_host;  // <acct>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]
    std::string account;
    std::string region;
    bool fips = false;
    bool china = false;
    // https://api.ecr[-fips].<region>.amazonaws.com[.cn], or the GANTRY_ECR_ENDPOINT /
    // AWS_ENDPOINT_URL_ECR / AWS_ENDPOINT_URL override.
    [[nodiscard]] std::string api_endpoint() const;
};
std::optional<EcrRegistry> parse_ecr_registry(const std::string& registry);

// AWS credentials and where they came from ("environment", "profile default in ~/.aws/credentials",
// "web identity token file", "container credentials endpoint", "EC2 instance metadata (IMDSv2)").
struct AwsCredentials {
    sigv4::Key key;
    std::string source;
    std::time_t expiration = 0;  // 0: long-term
};
// The standard chain: environment, AWS_PROFILE's shared files (keys, credential_process, role_arn with
// web_identity_token_file, or with source_profile through a SigV4-signed sts:AssumeRole whose answer
// is cached like ECR tokens), web identity token file, container credentials endpoint, EC2 instance
// metadata (IMDSv2). `region` is used for STS. The error lists what was tried.
Result<AwsCredentials> aws_credentials(const std::string& region);

// The answers of the AWS services, parsed by unprivileged code (the CLI, or the pull the plugin runs
// as the user); each is bounded by the HTTP client's body cap.
//
// An STS answer (AssumeRole, AssumeRoleWithWebIdentity; XML, through libxml2: entities decoded,
// no DTD, no network): the credentials of a success, or the Code and Message of an error answer.
struct StsAnswer {
    AwsCredentials creds;       // source left empty; expiration 0 when absent or unparsable
    std::string code, message;  // an <Error>'s
    bool xml = false;           // the body was well-formed XML
};
StsAnswer parse_sts_answer(std::string_view body);
// The credential JSON of the container endpoint, IMDS and credential_process; `token_field` names the
// session token ("Token" or "SessionToken"). Errors name `source`.
Result<AwsCredentials> parse_credentials_json(std::string_view body, const std::string& source,
                                              const char* token_field);
// "2024-05-01T12:00:00Z" (fractional seconds and an offset after the seconds are ignored) -> epoch
// seconds; 0 when unparsable.
std::time_t parse_iso8601(const std::string& text);

struct EcrToken {
    std::string username;  // "AWS"
    std::string password;
    std::time_t expires_at = 0;
};
// ECR GetAuthorizationToken's JSON answer: the first authorizationData's base64 user:password and
// expiresAt (epoch seconds; `now` + 12 h when absent). Errors name `what`.
Result<EcrToken> parse_ecr_token_answer(std::string_view body, std::time_t now, const std::string& what);
// GetAuthorizationToken for `reg`, through the in-memory and on-disk token caches; at most one
// process per user and cache key asks the service at a time (a file lock), the others read its answer.
Result<EcrToken> ecr_authorization_token(const EcrRegistry& reg);

// Builds the ECR GetAuthorizationToken request signed at `amz_date`; for the botocore cross-check.
struct SignedHttpRequest {
    std::string url;
    std::vector<std::pair<std::string, std::string>> headers;  // as sent, incl. Authorization
    std::string body;
    sigv4::Signed sig;
};
SignedHttpRequest ecr_token_request(const EcrRegistry& reg, const sigv4::Key& key, const std::string& amz_date);

// The directory of the on-disk token cache (ECR tokens, AssumeRole credentials):
// ${XDG_CACHE_HOME:-~/.cache}/gantry/tokens.
std::string token_cache_dir();

// OAuth2 refresh-token grant at a registry's token realm (Docker's identitytoken flow): POST
// grant_type=refresh_token; returns the access token and its lifetime in seconds.
struct OAuthToken {
    std::string token;
    long expires_in = 60;
};
Result<OAuthToken> oauth2_refresh(const std::string& realm, const std::string& service, const std::string& scope,
                                  const std::string& refresh_token, const std::string& extra_ca_file);

}  // namespace auth
}  // namespace gantry
