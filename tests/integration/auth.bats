# fixtures: registry images
# Credentials end to end (runtime/auth, docs/auth.md): `gantry pull` from the harness's TLS + htpasswd
# registry with credentials from each source in turn -- Docker config.json auths, a real credential
# helper executable through credHelpers and credsStore, containers auth.json, Enroot's .credentials
# (USER@ selector, $(command) passwords and their ownership rule) -- and native ECR: the registry is
# declared to be an ECR registry (GANTRY_TEST_ECR_REGISTRIES, test-only), tests/integration/
# ecr_endpoint.py stands in for the ECR API on loopback and checks every SigV4 signature with botocore,
# and tests/integration/imds_endpoint.py serves IMDSv2, container-endpoint and STS web-identity
# credentials. Also: token caching (N concurrent pulls -> one token request; expiry -> refresh), Debian's
# docker-credential-ecr-login through an HTTPS proxy, and bad input (malformed config.json, failing and
# hanging helpers, wrong password, clock skew) with clear messages that never print a secret.
# A real token-auth registry (setup_file: CNCF distribution with `auth: token` + token_server.py) for
# identitytoken, Basic-at-the-realm and anonymous pulls; and profiles with role_arn + source_profile
# through sts_endpoint.py (sts:AssumeRole, signature checked with botocore) to ECR.

load helpers

ECR_HOST=123456789012.dkr.ecr.us-east-1.amazonaws.com
AKID=AKIDGANTRYTEST0001
SECRET=gantry/test/secret/key/0001xxxxxxxxxxxxxxxx

setup_file() {
  gantry_load_env registry images
  start_token_registry
}

teardown_file() {
  local f
  for f in "$BATS_FILE_TMPDIR"/tokreg/*.pid; do
    [ -e "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
  done
}

# A private CNCF registry in token mode (`auth: token:`) on its own 127.0.0.1 port, whose token service
# is tests/integration/token_server.py over TLS (both use the harness's server certificate for
# 127.0.0.1): the registry trusts JWTs signed by a key made here (rootcertbundle), and the token server
# signs with it. The tiny image is pushed into it by skopeo with its own Basic credentials (the token
# server's GET flow, push scope). Exports TOKREG (HOST:PORT), TOKREG_REALM, TOKREG_LOG (the token
# server's request log), TOKREG_SERVICE and TOKREG_REFRESH (the one refresh token it accepts).
start_token_registry() {
  local d=$BATS_FILE_TMPDIR/tokreg certs port i
  certs=$(dirname "$GANTRY_TEST_REGISTRY_CA")
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/jwt.key" -out "$d/jwt.pem" \
    -days 1 -subj "/CN=gantry test token issuer" 2>/dev/null
  export TOKREG_LOG=$d/token.log TOKREG_SERVICE=gantry-token-registry TOKREG_REFRESH=refresh-$RANDOM$RANDOM$RANDOM
  python3 "$BATS_TEST_DIRNAME/token_server.py" --port-file "$d/token.port" --log "$TOKREG_LOG" --key "$d/jwt.key" \
    --issuer gantry-test-issuer --user "$GANTRY_TEST_REGISTRY_USER" --password-file "$GANTRY_TEST_REGISTRY_PASSWORD_FILE" \
    --refresh-token "$TOKREG_REFRESH" --tls-cert "$certs/server.pem" --tls-key "$certs/server.key" \
    >"$d/token.out" 2>&1 3>&- &
  echo $! >"$d/token.pid"
  for i in $(seq 300); do [ -s "$d/token.port" ] && break; sleep 0.05; done
  [ -s "$d/token.port" ] || { cat "$d/token.out" >&2; echo "token_server.py did not start" >&2; return 1; }
  export TOKREG_REALM=https://127.0.0.1:$(tr -d '\n' <"$d/token.port")/token
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  gantry_private_registry "$d" "127.0.0.1:$port" tls "$certs/server.pem" "$certs/server.key" auth "auth:
  token:
    realm: $TOKREG_REALM
    service: $TOKREG_SERVICE
    issuer: gantry-test-issuer
    rootcertbundle: $d/jwt.pem" || return 1
  mv "$d/pid" "$d/registry.pid"
  export TOKREG=127.0.0.1:$port
  skopeo copy -q --dest-cert-dir "$GANTRY_TEST_REGISTRY_CERT_DIR" \
    --dest-creds "$GANTRY_TEST_REGISTRY_USER:$GANTRY_TEST_REGISTRY_PASSWORD" \
    "oci:$GANTRY_TEST_OCI_TINY:latest" "docker://$TOKREG/gantry-test/tiny:latest" || {
    tail -5 "$d/registry.log" >&2
    return 1
  }
}

# tok_lines: how many requests the token server has logged; tok_requests_since N: those after line N.
tok_lines() { wc -l <"$TOKREG_LOG"; }
tok_requests_since() { tail -n +"$(($1 + 1))" "$TOKREG_LOG"; }

setup() {
  gantry_load_env registry images
  GANTRY=${GANTRY_BUILD_DIR:-$GANTRY_SOURCE_DIR/build}/runtime/gantry
  DRIVER=${GANTRY_BUILD_DIR:-$GANTRY_SOURCE_DIR/build}/tests/unit_auth
  [ -x "$GANTRY" ] || { echo "missing $GANTRY: build the gantry target" >&2; return 1; }
  REF=$GANTRY_TEST_REGISTRY_TLS/$GANTRY_TEST_IMAGE_TINY
  # A user with no credentials anywhere, unless a test writes some; no real AWS or instance metadata.
  export HOME=$BATS_TEST_TMPDIR/home XDG_RUNTIME_DIR=$BATS_TEST_TMPDIR/run
  mkdir -p "$HOME" "$XDG_RUNTIME_DIR"
  unset DOCKER_CONFIG REGISTRY_AUTH_FILE ENROOT_CONFIG_PATH XDG_CONFIG_HOME XDG_CACHE_HOME SSL_CERT_FILE
  unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE AWS_REGION
  unset AWS_WEB_IDENTITY_TOKEN_FILE AWS_ROLE_ARN AWS_CONTAINER_CREDENTIALS_FULL_URI AWS_CONTAINER_CREDENTIALS_RELATIVE_URI
  unset AWS_CONTAINER_AUTHORIZATION_TOKEN AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE GANTRY_ECR_ENDPOINT GANTRY_TEST_ECR_REGISTRIES
  unset https_proxy HTTPS_PROXY http_proxy HTTP_PROXY no_proxy NO_PROXY GANTRY_DEBUG
  export AWS_EC2_METADATA_DISABLED=true
  printf 'ca_bundle = %s\n' "$GANTRY_TEST_REGISTRY_CA" >"$BATS_TEST_TMPDIR/gantry.conf"
  export GANTRY_CONFIG=$BATS_TEST_TMPDIR/gantry.conf
  STORE=$BATS_TEST_TMPDIR/store
  PIDS=()
}

teardown() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# pull [IMAGE]: gantry pull into this test's store; $output and $status as bats sets them.
pull() { run "$GANTRY" pull --store "$STORE" "${1:-$REF}"; }
pulled_ok() {
  [ "$status" -eq 0 ] || { echo "$output" >&2; return 1; }
  [[ "$output" == *"$GANTRY_TEST_DIGEST_TINY"* ]]
}
# No line of $output holds the registry password, nor the test AWS secret.
no_secret() {
  ! echo "$output" | grep -qF "${GANTRY_TEST_REGISTRY_PASSWORD:0:40}" || false
  ! echo "$output" | grep -qF "$SECRET" || false
}

b64() { printf '%s' "$1" | base64 -w0; }

write_helper() { # NAME SCRIPT-BODY: a docker-credential-NAME in a private PATH directory
  mkdir -p "$BATS_TEST_TMPDIR/bin"
  printf '#!/bin/sh\n%s\n' "$2" >"$BATS_TEST_TMPDIR/bin/docker-credential-$1"
  chmod 755 "$BATS_TEST_TMPDIR/bin/docker-credential-$1"
  export PATH=$BATS_TEST_TMPDIR/bin:$PATH
}

wait_port() { # FILE -> prints the port once the file exists
  local i
  for i in $(seq 300); do [ -s "$1" ] && { cat "$1"; return 0; }; sleep 0.05; done
  echo "no port in $1" >&2
  return 1
}

# start_ecr [ecr_endpoint.py options]: sets ECR_PORT, ECR_LOG, ECR_COUNT and declares the TLS registry
# to be $ECR_HOST with the API at the endpoint.
start_ecr() {
  ECR_LOG=$BATS_TEST_TMPDIR/ecr.log ECR_COUNT=$BATS_TEST_TMPDIR/ecr.count
  python3 "$BATS_TEST_DIRNAME/ecr_endpoint.py" --port-file "$BATS_TEST_TMPDIR/ecr.port" --log "$ECR_LOG" \
    --count-file "$ECR_COUNT" --password-file "$GANTRY_TEST_REGISTRY_PASSWORD_FILE" --key "$AKID:$SECRET" "$@" \
    3>&- &
  PIDS+=($!)
  ECR_PORT=$(wait_port "$BATS_TEST_TMPDIR/ecr.port")
  export GANTRY_TEST_ECR_REGISTRIES="$GANTRY_TEST_REGISTRY_TLS=$ECR_HOST"
  export GANTRY_ECR_ENDPOINT=http://127.0.0.1:$ECR_PORT
}
tokens_issued() { tr -d '\n' <"$ECR_COUNT"; }

start_aws_peers() { # imds_endpoint.py: sets AWS_PEER (http://127.0.0.1:PORT) and AWS_PEER_LOG
  AWS_PEER_LOG=$BATS_TEST_TMPDIR/aws-peers.log
  python3 "$BATS_TEST_DIRNAME/imds_endpoint.py" --port-file "$BATS_TEST_TMPDIR/peer.port" --log "$AWS_PEER_LOG" \
    --access-key ASIAGANTRYROLE --secret-key "$SECRET-role" --session-token "session-$RANDOM" \
    --container-path /v2/credentials/gantry --container-token "container-token-$$" \
    --web-identity-token "jwt-$$" "$@" 3>&- &
  PIDS+=($!)
  AWS_PEER=http://127.0.0.1:$(wait_port "$BATS_TEST_TMPDIR/peer.port")
}

# container_endpoint_pull [TOKEN]: a pull whose AWS credentials come from the container endpoint.
container_endpoint_pull() {
  AWS_CONTAINER_CREDENTIALS_FULL_URI=$AWS_PEER/v2/credentials/gantry \
    AWS_CONTAINER_AUTHORIZATION_TOKEN=${1:-container-token-$$} pull
}

@test "no credentials: the 401 message names the registry and every source tried" {
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"no credentials found for $GANTRY_TEST_REGISTRY_TLS; tried ~/.docker/config.json (auths, credHelpers, credsStore), $XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json, ~/.config/enroot/.credentials, native ECR"* ]]
}

@test "docker config.json auths (and DOCKER_CONFIG)" {
  mkdir -p "$HOME/.docker"
  printf '{"auths":{"https://%s":{"auth":"%s"}}}\n' "$GANTRY_TEST_REGISTRY_TLS" \
    "$(b64 "AWS:$GANTRY_TEST_REGISTRY_PASSWORD")" >"$HOME/.docker/config.json"
  pull
  pulled_ok
  no_secret
  mkdir -p "$BATS_TEST_TMPDIR/dc"
  mv "$HOME/.docker/config.json" "$BATS_TEST_TMPDIR/dc/"
  rm -rf "$STORE"
  DOCKER_CONFIG=$BATS_TEST_TMPDIR/dc pull
  pulled_ok
}

@test "credHelpers and credsStore: a real docker-credential-<name> executable" {
  # The helper protocol: "get" argument, server name on stdin, JSON on stdout.
  write_helper gantrytest "[ \"\$1\" = get ] || exit 2
read -r server
echo \"\$server\" >>\"$BATS_TEST_TMPDIR/asked\"
[ \"\$server\" = \"$GANTRY_TEST_REGISTRY_TLS\" ] || { echo 'credentials not found in native keychain'; exit 1; }
printf '{\"ServerURL\":\"%s\",\"Username\":\"AWS\",\"Secret\":\"%s\"}\n' \"\$server\" \"\$(cat $GANTRY_TEST_REGISTRY_PASSWORD_FILE)\""
  mkdir -p "$HOME/.docker"
  printf '{"credHelpers":{"%s":"gantrytest"}}\n' "$GANTRY_TEST_REGISTRY_TLS" >"$HOME/.docker/config.json"
  pull
  pulled_ok
  no_secret
  [ "$(cat "$BATS_TEST_TMPDIR/asked")" = "$GANTRY_TEST_REGISTRY_TLS" ]
  rm -rf "$STORE" "$BATS_TEST_TMPDIR/asked"
  printf '{"credsStore":"gantrytest","auths":{"%s":{}}}\n' "$GANTRY_TEST_REGISTRY_TLS" >"$HOME/.docker/config.json"
  GANTRY_DEBUG=1 pull
  pulled_ok
  no_secret
  [[ "$output" == *"from docker-credential-gantrytest"* ]]
  [ "$(cat "$BATS_TEST_TMPDIR/asked")" = "$GANTRY_TEST_REGISTRY_TLS" ]
}

@test "containers auth.json: REGISTRY_AUTH_FILE and XDG_RUNTIME_DIR/containers/auth.json" {
  mkdir -p "$XDG_RUNTIME_DIR/containers"
  printf '{"auths":{"%s/gantry-test":{"auth":"%s"}}}\n' "$GANTRY_TEST_REGISTRY_TLS" \
    "$(b64 "AWS:$GANTRY_TEST_REGISTRY_PASSWORD")" >"$XDG_RUNTIME_DIR/containers/auth.json"
  pull
  pulled_ok
  mv "$XDG_RUNTIME_DIR/containers/auth.json" "$BATS_TEST_TMPDIR/auth.json"
  rm -rf "$STORE"
  REGISTRY_AUTH_FILE=$BATS_TEST_TMPDIR/auth.json pull
  pulled_ok
}

@test "Enroot .credentials: USER@ selector and a \$(command) password from a private file" {
  export ENROOT_CONFIG_PATH=$HOME/enroot
  mkdir -p "$ENROOT_CONFIG_PATH"
  {
    echo "machine $GANTRY_TEST_REGISTRY_TLS login nobody password wrong-password"
    echo "machine $GANTRY_TEST_REGISTRY_TLS login AWS password \$(cat $GANTRY_TEST_REGISTRY_PASSWORD_FILE)"
  } >"$ENROOT_CONFIG_PATH/.credentials"
  chmod 600 "$ENROOT_CONFIG_PATH/.credentials"
  # Pyxis/Enroot spelling with the USER@ selector: the AWS entry, whose password is a command.
  pull "AWS@$GANTRY_TEST_REGISTRY_TLS#gantry-test/tiny"
  pulled_ok
  no_secret
  # Group-writable file: the command is refused, clearly, and nothing else is tried in its place.
  chmod 664 "$ENROOT_CONFIG_PATH/.credentials"
  rm -rf "$STORE"
  pull "AWS@$GANTRY_TEST_REGISTRY_TLS#gantry-test/tiny"
  [ "$status" -ne 0 ]
  [[ "$output" == *"refusing to run the password command for $GANTRY_TEST_REGISTRY_TLS in ~/enroot/.credentials: the file must be a regular file owned by you and not writable by group or others"* ]]
  # Without the selector the first entry is used: its wrong password fails authentication.
  chmod 600 "$ENROOT_CONFIG_PATH/.credentials"
  pull "$GANTRY_TEST_REGISTRY_TLS#gantry-test/tiny"
  [ "$status" -ne 0 ]
  [[ "$output" == *"authentication to $GANTRY_TEST_REGISTRY_TLS failed (tried: ~/enroot/.credentials)"* ]]
}

@test "bad input: malformed config.json, failing helper, hanging helper (timeout), wrong password" {
  mkdir -p "$HOME/.docker"
  printf '{"auths": {"%s": {"auth": "x"},}}\n' "$GANTRY_TEST_REGISTRY_TLS" >"$HOME/.docker/config.json"
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"ignoring ~/.docker/config.json: not valid JSON (syntax error at byte "*"); fix or remove the file"* ]]
  [[ "$output" == *"no credentials found for $GANTRY_TEST_REGISTRY_TLS"* ]]

  write_helper failing 'echo "helper broke: keychain locked" >&2; exit 7'
  printf '{"credHelpers":{"%s":"failing"}}\n' "$GANTRY_TEST_REGISTRY_TLS" >"$HOME/.docker/config.json"
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"docker-credential-failing get exited with status 7: helper broke: keychain locked"* ]]

  write_helper hanging 'sleep 60'
  printf '{"credHelpers":{"%s":"hanging"}}\n' "$GANTRY_TEST_REGISTRY_TLS" >"$HOME/.docker/config.json"
  local t0=$SECONDS
  GANTRY_CREDENTIAL_TIMEOUT=2 pull
  [ "$status" -ne 0 ]
  [ $((SECONDS - t0)) -lt 15 ]
  [[ "$output" == *"docker-credential-hanging: no answer after 2 s (killed; GANTRY_CREDENTIAL_TIMEOUT)"* ]]
  ! pgrep -f "docker-credential-hanging" >/dev/null || false

  local wrong="x${GANTRY_TEST_REGISTRY_PASSWORD:1}"
  printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$GANTRY_TEST_REGISTRY_TLS" "$(b64 "AWS:$wrong")" >"$HOME/.docker/config.json"
  GANTRY_DEBUG=1 pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"authentication to $GANTRY_TEST_REGISTRY_TLS failed (tried: ~/.docker/config.json)"* ]]
  ! echo "$output" | grep -qF "${wrong:0:40}" || false
  ! echo "$output" | grep -qi "authorization:" || false
}

@test "SigV4: our ECR GetAuthorizationToken request is signed exactly as botocore signs it" {
  [ -x "$DRIVER" ] || { echo "missing $DRIVER: build the unit_auth target" >&2; return 1; }
  local d
  for d in 20150830T123600Z "$(date -u +%Y%m%dT%H%M%SZ)"; do
    run env GANTRY_AUTH_REGISTRY=$ECR_HOST GANTRY_AUTH_DATE=$d AWS_ACCESS_KEY_ID=$AKID AWS_SECRET_ACCESS_KEY=$SECRET \
      AWS_SESSION_TOKEN=session-token-value "$DRIVER" "[.driver]"
    [ "$status" -eq 0 ]
    echo "$output" >"$BATS_TEST_TMPDIR/ours"
    # botocore signs the same request (same headers but Authorization) at the same instant.
    run python3 - "$BATS_TEST_TMPDIR/ours" "$AKID" "$SECRET" <<'PY'
import sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
lines = open(sys.argv[1]).read().splitlines()
url = next(l[4:] for l in lines if l.startswith("url "))
body = next(l[5:] for l in lines if l.startswith("body "))
headers = dict(l[7:].split(": ", 1) for l in lines if l.startswith("header "))
ours = headers.pop("Authorization")
req = AWSRequest(method="POST", url=url, data=body.encode(), headers={k: v for k, v in headers.items() if k != "X-Amz-Security-Token"})
signer = SigV4Auth(Credentials(sys.argv[2], sys.argv[3], headers["X-Amz-Security-Token"]), "ecr", "us-east-1")
req.context["timestamp"] = headers["X-Amz-Date"]
req.headers["X-Amz-Security-Token"] = headers["X-Amz-Security-Token"]
canonical = signer.canonical_request(req)
sig = signer.signature(signer.string_to_sign(req, canonical), req)
theirs = "AWS4-HMAC-SHA256 Credential=%s, SignedHeaders=%s, Signature=%s" % (
    signer.scope(req), signer.signed_headers(signer.headers_to_sign(req)), sig)
print(ours)
print(theirs)
sys.exit(0 if ours == theirs else 1)
PY
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target"* ]]
  done
}

@test "native ECR: environment credentials, signature checked by botocore, token cached on disk (0600)" {
  start_ecr
  export AWS_ACCESS_KEY_ID=$AKID AWS_SECRET_ACCESS_KEY=$SECRET
  pull
  pulled_ok
  no_secret
  [ "$(tokens_issued)" = 1 ]
  grep -q "signature verified by botocore" "$ECR_LOG"
  local cache
  cache=$(ls "$HOME"/.cache/gantry/tokens/ecr-*.json)
  [ "$(stat -c %a "$cache")" = 600 ]
  [ "$(stat -c %a "$HOME/.cache/gantry/tokens")" = 700 ]
  # A second process uses the cached token: no new request.
  rm -rf "$STORE"
  GANTRY_DEBUG=1 pull
  pulled_ok
  [ "$(tokens_issued)" = 1 ]
  [[ "$output" == *"using the cached ECR token for $GANTRY_TEST_REGISTRY_TLS"* ]]
  no_secret
  # A cache file others could read is not trusted.
  chmod 644 "$cache"
  rm -rf "$STORE"
  pull
  pulled_ok
  [[ "$output" == *"ignoring the token cache file"*"not private to you"* ]]
  [ "$(tokens_issued)" = 2 ]
}

@test "token caching: 8 concurrent pulls make exactly one token request; an expired token is refreshed" {
  start_ecr --lifetime 6
  export AWS_ACCESS_KEY_ID=$AKID AWS_SECRET_ACCESS_KEY=$SECRET
  local i pids=()
  for i in 1 2 3 4 5 6 7 8; do
    "$GANTRY" pull --store "$BATS_TEST_TMPDIR/store$i" "$REF" >"$BATS_TEST_TMPDIR/pull$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  for i in 1 2 3 4 5 6 7 8; do grep -q "$GANTRY_TEST_DIGEST_TINY" "$BATS_TEST_TMPDIR/pull$i.out"; done
  [ "$(tokens_issued)" = 1 ]
  # The token lives 6 s and is used for half of that: after 4 s a pull asks again.
  sleep 4
  pull
  pulled_ok
  [ "$(tokens_issued)" = 2 ]
}

@test "native ECR: AWS_PROFILE from ~/.aws/credentials; wrong secret and clock skew give clear messages" {
  start_ecr --key AKIDPROFILE:profile-secret
  mkdir -p "$HOME/.aws"
  printf '[default]\naws_access_key_id = AKIDNOPE\naws_secret_access_key = nope\n[ci]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = profile-secret\n' \
    >"$HOME/.aws/credentials"
  AWS_PROFILE=ci pull
  pulled_ok
  [ "$(tokens_issued)" = 1 ]
  # The default profile's key is unknown to the service.
  rm -rf "$STORE" "$HOME/.cache"
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"ECR GetAuthorizationToken at http://127.0.0.1:$ECR_PORT for $GANTRY_TEST_REGISTRY_TLS failed: UnrecognizedClientException"*"(AWS credentials from profile default in ~/.aws/credentials)"* ]]
  [[ "$output" == *"no credentials found for $GANTRY_TEST_REGISTRY_TLS"* ]]
  # A known key with the wrong secret: the signature does not match.
  printf '[default]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = not-the-secret\n' >"$HOME/.aws/credentials"
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"failed: InvalidSignatureException: The request signature we calculated does not match"* ]]
  ! echo "$output" | grep -q "not-the-secret" || false
}

@test "native ECR: an expired docker-login token in config.json gives way to native ECR, in one line" {
  start_ecr
  # What `aws ecr get-login-password | docker login` leaves behind: a token ECR stopped accepting.
  mkdir -p "$HOME/.docker"
  printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$GANTRY_TEST_REGISTRY_TLS" "$(b64 "AWS:expired-docker-login-token")" \
    >"$HOME/.docker/config.json"
  # Without AWS credentials there is nothing to fall back to: the message names the refused source.
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"authentication to $GANTRY_TEST_REGISTRY_TLS failed (tried: ~/.docker/config.json)"* ]]
  [ "$(tokens_issued)" = 0 ]
  # With them, the refused token gives way to native ECR and the pull succeeds.
  export AWS_ACCESS_KEY_ID=$AKID AWS_SECRET_ACCESS_KEY=$SECRET
  pull
  pulled_ok
  [[ "$output" == *"the credentials for $GANTRY_TEST_REGISTRY_TLS from ~/.docker/config.json were refused (an expired \`docker login\` token?); using native ECR (GetAuthorizationToken) instead"* ]]
  [ "$(echo "$output" | grep -c "were refused")" = 1 ]
  [ "$(tokens_issued)" = 1 ]
  no_secret
  # A non-ECR registry never falls through: the same refused entry for the plain registry stays an error.
  unset GANTRY_TEST_ECR_REGISTRIES
  rm -rf "$STORE" "$HOME/.cache"
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"authentication to $GANTRY_TEST_REGISTRY_TLS failed (tried: ~/.docker/config.json)"* ]]
  [ "$(tokens_issued)" = 1 ]
}

@test "native ECR: clock skew is reported as such" {
  start_ecr --clock-offset 3600
  export AWS_ACCESS_KEY_ID=$AKID AWS_SECRET_ACCESS_KEY=$SECRET
  pull
  [ "$status" -ne 0 ]
  # The service's Date header has one-second resolution and the answer may cross a second boundary
  # before we read our clock: the reported skew is 3600 s give or take one.
  [[ "$output" =~ "the request signature was refused as expired: this host's clock is off by "(3599|3600|3601)" s against AWS's (SigV4 signatures are valid for 5 minutes); synchronize the clock (chrony/NTP) [AWS: Signature expired:" ]]
  [ "$(tokens_issued)" = 0 ]
}

@test "native ECR: EC2 instance metadata (IMDSv2) role credentials with a session token" {
  start_aws_peers
  start_ecr --key "ASIAGANTRYROLE:$SECRET-role"
  export AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=$AWS_PEER
  GANTRY_DEBUG=1 pull
  pulled_ok
  no_secret
  [ "$(tokens_issued)" = 1 ]
  grep -q "^imds-token 200" "$AWS_PEER_LOG"
  grep -q "^imds-creds 200" "$AWS_PEER_LOG"
  ! grep -q "^imds-v1" "$AWS_PEER_LOG" || false        # never without the IMDSv2 session token
  grep -q "x-amz-security-token" "$ECR_LOG"   # the role's session token was signed and sent
}

@test "native ECR: container credentials endpoint (full URI + token file) and web identity (STS)" {
  start_aws_peers
  start_ecr --key "ASIAGANTRYROLE:$SECRET-role"
  printf 'container-token-%s' "$$" >"$BATS_TEST_TMPDIR/ctoken"
  AWS_CONTAINER_CREDENTIALS_FULL_URI=$AWS_PEER/v2/credentials/gantry \
    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$BATS_TEST_TMPDIR/ctoken pull
  pulled_ok
  grep -q "^container 200" "$AWS_PEER_LOG"
  [ "$(tokens_issued)" = 1 ]
  # A wrong container token: refused, and the message says where.
  rm -rf "$STORE" "$HOME/.cache"
  container_endpoint_pull wrong
  [ "$status" -ne 0 ]
  [[ "$output" == *"container credentials endpoint $AWS_PEER/v2/credentials/gantry: HTTP 403"* ]]
  # Web identity: the token file is traded at STS for role credentials.
  printf 'jwt-%s\n' "$$" >"$BATS_TEST_TMPDIR/jwt"
  AWS_WEB_IDENTITY_TOKEN_FILE=$BATS_TEST_TMPDIR/jwt AWS_ROLE_ARN=arn:aws:iam::123456789012:role/gantry \
    GANTRY_STS_ENDPOINT=$AWS_PEER pull
  pulled_ok
  grep -q "^sts 200" "$AWS_PEER_LOG"
  [ "$(tokens_issued)" = 2 ]
}

@test "Debian's docker-credential-ecr-login through credHelpers, talking to the loopback ECR endpoint" {
  command -v docker-credential-ecr-login >/dev/null || { echo "amazon-ecr-credential-helper is not installed (scripts/install-deps)" >&2; return 1; }
  # The helper talks HTTPS to api.ecr.us-east-1.amazonaws.com; HTTPS_PROXY sends it to the test endpoint,
  # which terminates the tunnel with a certificate for that name from a CA made here (AWS_CA_BUNDLE).
  local pki=$BATS_TEST_TMPDIR/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/ca.key" -out "$pki/ca.pem" \
    -days 1 -subj "/CN=gantry auth test CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/api.key" -out "$pki/api.csr" \
    -subj "/CN=api.ecr.us-east-1.amazonaws.com" 2>/dev/null
  printf 'subjectAltName=DNS:api.ecr.us-east-1.amazonaws.com\nextendedKeyUsage=serverAuth\n' >"$pki/ext"
  openssl x509 -req -in "$pki/api.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" -CAcreateserial -days 1 \
    -extfile "$pki/ext" -out "$pki/api.pem" 2>/dev/null
  start_ecr --tls-cert "$pki/api.pem" --tls-key "$pki/api.key"
  unset GANTRY_ECR_ENDPOINT   # Gantry's own ECR source is not what is tested here: the helper is
  mkdir -p "$HOME/.docker"
  printf '{"credHelpers":{"%s":"ecr-login"}}\n' "$GANTRY_TEST_REGISTRY_TLS" >"$HOME/.docker/config.json"
  HTTPS_PROXY=http://127.0.0.1:$ECR_PORT NO_PROXY=127.0.0.1,localhost AWS_CA_BUNDLE=$pki/ca.pem \
    AWS_ECR_DISABLE_CACHE=true AWS_ACCESS_KEY_ID=$AKID AWS_SECRET_ACCESS_KEY=$SECRET GANTRY_DEBUG=1 pull
  pulled_ok
  no_secret
  [[ "$output" == *"from docker-credential-ecr-login"* ]]
  [ "$(tokens_issued)" = 1 ]
  grep -q "signature verified by botocore" "$ECR_LOG"
}

@test "token-auth registry: identitytoken (refresh-token grant) pulls, one token request per pull, spec scope/service" {
  # docker login's flow: grant_type=password with access_type=offline yields the refresh token that
  # Docker stores as "identitytoken".
  local rt n0
  rt=$(curl -fsS --cacert "$GANTRY_TEST_REGISTRY_CA" "$TOKREG_REALM" --data-urlencode grant_type=password \
    --data-urlencode access_type=offline --data-urlencode client_id=gantry-test \
    --data-urlencode "username=$GANTRY_TEST_REGISTRY_USER" --data-urlencode "password@$GANTRY_TEST_REGISTRY_PASSWORD_FILE" \
    --data-urlencode "service=$TOKREG_SERVICE" | python3 -c 'import json, sys; print(json.load(sys.stdin)["refresh_token"])')
  [ "$rt" = "$TOKREG_REFRESH" ]
  mkdir -p "$HOME/.docker"
  printf '{"auths":{"%s":{"identitytoken":"%s"}}}\n' "$TOKREG" "$rt" >"$HOME/.docker/config.json"
  n0=$(tok_lines)
  GANTRY_DEBUG=1 pull "$TOKREG/gantry-test/tiny:latest"
  pulled_ok
  ! echo "$output" | grep -qF "$rt" || false
  tok_requests_since "$n0" >"$BATS_TEST_TMPDIR/asked"
  cat "$BATS_TEST_TMPDIR/asked"
  # Manifest, config and layer blobs all rode on one token: exactly one request, the refresh-token
  # grant (POST), for the spec's service and repository:NAME:pull scope; never Basic at the realm.
  [ "$(wc -l <"$BATS_TEST_TMPDIR/asked")" -eq 1 ]
  grep -qx "POST grant=refresh_token service=$TOKREG_SERVICE scope=repository:gantry-test/tiny:pull account=$GANTRY_TEST_REGISTRY_USER status=200" "$BATS_TEST_TMPDIR/asked"
  # The registry authorised the blob GETs: the image really came from it.
  grep -q 'msg="authorized request".*uri=/v2/gantry-test/tiny/blobs/' "$BATS_FILE_TMPDIR/tokreg/registry.log"
}

@test "token-auth registry: a wrong identitytoken names the registry and the source; anonymous pull is refused" {
  mkdir -p "$HOME/.docker"
  printf '{"auths":{"%s":{"identitytoken":"not-%s"}}}\n' "$TOKREG" "$TOKREG_REFRESH" >"$HOME/.docker/config.json"
  local n0
  n0=$(tok_lines)
  pull "$TOKREG/gantry-test/tiny:latest"
  [ "$status" -ne 0 ]
  [[ "$output" == *"authentication to $TOKREG (tried: ~/.docker/config.json): exchanging the identity token at $TOKREG_REALM: refused (HTTP 401)"* ]]
  ! echo "$output" | grep -qF "not-$TOKREG_REFRESH" || false
  tok_requests_since "$n0" | grep -q "^POST grant=refresh_token .* status=401$"
  # No credentials at all: the token server hands out a token that grants nothing, the registry
  # refuses it, and the message says no credentials were found for this registry.
  rm "$HOME/.docker/config.json"
  n0=$(tok_lines)
  pull "$TOKREG/gantry-test/tiny:latest"
  [ "$status" -ne 0 ]
  [[ "$output" == *"no credentials found for $TOKREG; tried ~/.docker/config.json"* ]]
  tok_requests_since "$n0" | grep -q "^GET grant=anonymous service=$TOKREG_SERVICE scope=repository:gantry-test/tiny:pull account=- status=200$"
}

@test "token-auth registry: username/password from config.json go to the realm as Basic (GET), once per pull" {
  mkdir -p "$HOME/.docker"
  printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$TOKREG" "$(b64 "$GANTRY_TEST_REGISTRY_USER:$GANTRY_TEST_REGISTRY_PASSWORD")" \
    >"$HOME/.docker/config.json"
  local n0
  n0=$(tok_lines)
  pull "$TOKREG/gantry-test/tiny:latest"
  pulled_ok
  no_secret
  [ "$(tok_requests_since "$n0" | wc -l)" -eq 1 ]
  tok_requests_since "$n0" | grep -qx "GET grant=basic service=$TOKREG_SERVICE scope=repository:gantry-test/tiny:pull account=$GANTRY_TEST_REGISTRY_USER status=200"
}

@test "native ECR: role_arn + source_profile assumes the role at STS (SigV4 checked by botocore), cached and refreshed" {
  local role=arn:aws:iam::123456789012:role/gantry-ecr-pull
  STS_LOG=$BATS_TEST_TMPDIR/sts.log STS_COUNT=$BATS_TEST_TMPDIR/sts.count
  python3 "$BATS_TEST_DIRNAME/sts_endpoint.py" --port-file "$BATS_TEST_TMPDIR/sts.port" --log "$STS_LOG" \
    --count-file "$STS_COUNT" --key "$AKID:$SECRET" --role-arn "$role" --access-key ASIAGANTRYASSUMED \
    --secret-key "$SECRET-assumed" --session-token "assumed-session-$$" --lifetime 16 3>&- &
  PIDS+=($!)
  export GANTRY_STS_ENDPOINT=http://127.0.0.1:$(wait_port "$BATS_TEST_TMPDIR/sts.port")
  # ECR accepts only the assumed role's key and session token.
  start_ecr --key "ASIAGANTRYASSUMED:$SECRET-assumed" --session-token "assumed-session-$$"
  mkdir -p "$HOME/.aws"
  printf '[base]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$AKID" "$SECRET" >"$HOME/.aws/credentials"
  printf '[profile ecr-role]\nrole_arn = %s\nsource_profile = base\nrole_session_name = gantry-test\nregion = us-east-1\n' \
    "$role" >"$HOME/.aws/config"
  export AWS_PROFILE=ecr-role
  pull
  pulled_ok
  no_secret
  [ "$(tr -d '\n' <"$STS_COUNT")" = 1 ]
  [ "$(tokens_issued)" = 1 ]
  grep -q "^assume-role 200 $role gantry-test (signature verified by botocore, signed headers content-type;host;x-amz-date)" "$STS_LOG"
  [ "$(stat -c %a "$(ls "$HOME"/.cache/gantry/tokens/sts-*.json)")" = 600 ]
  # Another process, without the cached ECR token: the role's credentials come from the disk cache.
  rm -f "$HOME"/.cache/gantry/tokens/ecr-*.json
  rm -rf "$STORE"
  GANTRY_DEBUG=1 pull
  pulled_ok
  [[ "$output" == *"profile ecr-role: using cached credentials for $role"* ]]
  [ "$(tr -d '\n' <"$STS_COUNT")" = 1 ]
  [ "$(tokens_issued)" = 2 ]
  # The credentials live 16 s and are used for half of that: after 9 s more STS is asked again.
  sleep 9
  rm -f "$HOME"/.cache/gantry/tokens/ecr-*.json
  rm -rf "$STORE"
  pull
  pulled_ok
  [ "$(tr -d '\n' <"$STS_COUNT")" = 2 ]
  # A wrong source secret: STS refuses the signature; the message names profile, role and source.
  rm -rf "$HOME/.cache" "$STORE"
  printf '[base]\naws_access_key_id = %s\naws_secret_access_key = not-the-secret\n' "$AKID" >"$HOME/.aws/credentials"
  pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"profile ecr-role: STS AssumeRole for $role at $GANTRY_STS_ENDPOINT failed: SignatureDoesNotMatch: The request signature we calculated does not match the signature you provided. (source credentials from profile base in ~/.aws/credentials)"* ]]
  ! echo "$output" | grep -q "not-the-secret" || false
  # SSO profiles are refused with what to do instead.
  printf '[profile sso]\nsso_start_url = https://example.awsapps.com/start\nsso_region = us-east-1\nsso_account_id = 123456789012\nsso_role_name = ReadOnly\n' \
    >>"$HOME/.aws/config"
  AWS_PROFILE=sso pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"profile sso uses AWS IAM Identity Center (SSO), which Gantry does not implement"* ]]
  [ "$(tr -d '\n' <"$STS_COUNT")" = 2 ]
}

@test "native ECR: an AWS endpoint's response headers: 256 KiB are read, one byte more stops the request" {
  start_aws_peers --header-bytes 262144
  start_ecr --key "ASIAGANTRYROLE:$SECRET-role"
  container_endpoint_pull
  pulled_ok
  [ "$(tokens_issued)" = 1 ]
  kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true
  rm -f "$BATS_TEST_TMPDIR/peer.port" "$AWS_PEER_LOG"
  rm -rf "$STORE" "$HOME/.cache"
  start_aws_peers --header-bytes 262145
  container_endpoint_pull
  [ "$status" -ne 0 ]
  [[ "$output" == *"container credentials endpoint $AWS_PEER/v2/credentials/gantry: GET $AWS_PEER/v2/credentials/gantry: the server's response headers passed 256 KiB and were not read further (a misbehaving server or proxy); "* ]]
  [ "$(grep -c '^container' "$AWS_PEER_LOG")" -eq 1 ]   # asked once, not retried
  [ "$(tokens_issued)" = 1 ]                              # no credentials from that answer reached ECR
}

@test "a FIFO or /dev/zero in a credential file's place: warned about, skipped, no hang" {
  mkdir -p "$HOME/.docker" "$HOME/.config/enroot" "$HOME/.aws"
  mkfifo "$HOME/.docker/config.json" "$HOME/.aws/credentials"
  ln -s /dev/zero "$HOME/.config/enroot/.credentials"
  ln -s /dev/zero "$HOME/.aws/config"
  run timeout 60 "$GANTRY" pull --store "$STORE" "$REF"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]   # no open or read waited for a writer that never comes
  [[ "$output" == *"reading ~/.docker/config.json: not a regular file"*"; ignoring it"* ]]
  [[ "$output" == *"reading ~/.config/enroot/.credentials: not a regular file"*"; ignoring it"* ]]
  [[ "$output" == *"no credentials found for $GANTRY_TEST_REGISTRY_TLS"* ]]
  # The AWS shared files are read when the registry is an ECR one.
  start_ecr
  run timeout 60 "$GANTRY" pull --store "$STORE" "$REF"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  [[ "$output" == *"reading ~/.aws/credentials: not a regular file"*"; ignoring it"* ]]
  [[ "$output" == *"reading ~/.aws/config: not a regular file"*"; ignoring it"* ]]
  [ "$(tokens_issued)" = 0 ]
}
