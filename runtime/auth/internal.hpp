// Internal: small helpers shared by the auth module's source files.
#pragma once

#include <optional>
#include <string>

#include "gantry/fd.hpp"
#include "net/http.hpp"

namespace gantry::auth {

std::string home_dir();
// `path` with the home directory written as "~", for messages.
std::string display_path(const std::string& path);

// A request to a token or credential endpoint (OAuth2, ECR, STS, the metadata and container
// credentials endpoints): 30 s in all, 10 s to connect, its redirects returned rather than followed
// (these endpoints do not redirect), answers up to 4 MiB.
net::Request endpoint_request(std::string method, std::string url);
// The TLS settings for the AWS endpoints: AWS_CA_BUNDLE, when set, replaces the CA store.
net::TransportSettings aws_tls();

// A credential source's file (Docker config.json / auth.json, Enroot .credentials, the AWS shared
// files), read through read_config_file. A missing file is no source (nullopt, silently); one that
// exists but cannot be used (not readable by the job user, a FIFO, a device, over the size limit) is
// skipped with a warning naming `source`, since its owner may expect it to be used.
std::optional<std::string> read_source_file(const std::string& path, const std::string& source);

// ---- The on-disk token cache (token_cache.cpp).
// "<token_cache_dir()>/<prefix>-<hash of key>" (append ".json" / ".lock"), the directory made 0700;
// empty when there is no home or the directory cannot be made (warned).
std::string token_cache_file(const std::string& prefix, const std::string& key);
// The file's text if it is a regular file owned by the caller and private (0600); else nullopt, with a
// warning when it exists but others could read or write it.
std::optional<std::string> read_private_file(const std::string& path);
// An exclusive flock on `path` (created 0600), waiting at most `timeout_s`; invalid when not had.
UniqueFd lock_file(const std::string& path, double timeout_s);

}  // namespace gantry::auth
