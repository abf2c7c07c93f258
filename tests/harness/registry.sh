#!/usr/bin/env bash
# Starts and stops the two container registries the tests pull from: Debian's docker-registry (CNCF
# distribution 2.8) on free 127.0.0.1 ports, once open over plain HTTP and once with TLS (a CA made
# per run with openssl) plus htpasswd Basic auth for user AWS with an ECR-length random token.
#
#   tests/harness/registry.sh start|stop|status
#
# State lives in ${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}/registry/; the values tests need are
# written to $GANTRY_HARNESS_DIR/registry.env (shell-sourceable). See docs/testing.md.
# Optional fixed ports: GANTRY_TEST_REGISTRY_PORT (HTTP) and GANTRY_TEST_REGISTRY_TLS_PORT (TLS).
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

state="$GANTRY_HARNESS_DIR/registry"
envfile="$GANTRY_HARNESS_DIR/registry.env"
kinds=(http tls)

usage() {
  echo "usage: $0 start|stop|status" >&2
  exit 2
}

check_tools() {
  command -v docker-registry >/dev/null 2>&1 ||
    gantry_die "docker-registry not found; run scripts/install-deps"
  gantry_require_cmd openssl openssl
  gantry_require_cmd htpasswd apache2-utils
  gantry_require_cmd curl curl
  gantry_require_cmd ss iproute2
  gantry_require_cmd python3 python3
}

# The registry is configured through one YAML file per instance. Access logs (combined log format,
# one line per request) go to stdout, the registry's own messages to stderr; both land in the log.
write_config() {
  local kind=$1 port=$2 dir="$state/$1"
  {
    cat <<EOF
# docker-registry configuration written by tests/harness/registry.sh ($kind instance)
version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
  fields:
    service: gantry-test-registry-$kind
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: $(listen_addr "$kind"):$port
  secret: gantry-test-$(openssl rand -hex 16)
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    if [ "$kind" = tls ]; then
      cat <<EOF
  tls:
    certificate: $state/ca/server.pem
    key: $state/ca/server.key
auth:
  htpasswd:
    realm: gantry-test
    path: $state/htpasswd
EOF
    fi
  } >"$dir/config.yml"
}

# The open registry also listens beyond loopback: the Slurm harness's nodes live in network namespaces
# of their own and reach it over the harness bridge at the host's bridge address (GANTRY_TEST_LOGIN_ADDR).
# Nothing outside this machine can route to those addresses. The TLS registry stays on 127.0.0.1.
listen_addr() {
  if [ "$1" = http ]; then echo 0.0.0.0; else echo 127.0.0.1; fi
}

# A CA per run, and a server certificate for 127.0.0.1 and localhost signed by it.
make_tls_material() {
  local ca="$state/ca"
  rm -rf "$ca" "$state/certs.d"
  mkdir -p "$ca" "$state/certs.d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$ca/ca.key" -out "$ca/ca.pem" -days 7 \
    -subj "/CN=Gantry test CA $(date -u +%Y%m%dT%H%M%SZ)-$$" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null ||
    gantry_die "openssl could not create the test CA in $ca"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$ca/server.key" -out "$ca/server.csr" -subj "/CN=localhost" 2>/dev/null ||
    gantry_die "openssl could not create the server key in $ca"
  printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "extendedKeyUsage=serverAuth" \
    "basicConstraints=CA:FALSE" >"$ca/server.ext"
  openssl x509 -req -in "$ca/server.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" -CAcreateserial \
    -out "$ca/server.pem" -days 7 -extfile "$ca/server.ext" 2>/dev/null ||
    gantry_die "openssl could not sign the server certificate in $ca"
  chmod 600 "$ca/ca.key" "$ca/server.key"
  # skopeo/containers-image read every *.crt in --cert-dir as a trusted CA.
  cp "$ca/ca.pem" "$state/certs.d/ca.crt"
}

# ECR hands out ~2000-character base64 tokens as the password of user AWS; do the same. htpasswd
# refuses passwords over 255 characters and bcrypt only ever reads the first 72 bytes, so the hash
# is made from the first 72 bytes: the registry accepts the full token (and, as a consequence, any
# password that shares those 72 bytes).
make_credentials() {
  local token
  token=$(openssl rand -base64 1500 | tr -d '\n')
  printf '%s' "$token" >"$state/token"
  chmod 644 "$state/token"
  printf '%s\n' "${token:0:72}" | htpasswd -iBc "$state/htpasswd" AWS 2>/dev/null ||
    gantry_die "htpasswd could not write $state/htpasswd"
}

pick_port() {
  local fixed=$1 name=$2 other=${3:-} port
  if [ -n "$fixed" ]; then
    if ! [[ "$fixed" =~ ^[0-9]+$ ]] || [ "$fixed" -lt 1 ] || [ "$fixed" -gt 65535 ]; then
      gantry_die "$name=$fixed is not a TCP port number"
    fi
    if gantry_port_in_use "$fixed"; then
      gantry_die "port $fixed ($name) is already in use on 127.0.0.1: $(ss -Htlnp "sport = :$fixed" | head -1 | tr -s ' ')"
    fi
    echo "$fixed"
    return
  fi
  for _ in 1 2 3 4 5; do
    port=$(gantry_free_port)
    [ "$port" != "$other" ] && ! gantry_port_in_use "$port" && { echo "$port"; return; }
  done
  gantry_die "could not find a free port on 127.0.0.1"
}

running_count() {
  local n=0 k
  for k in "${kinds[@]}"; do gantry_pid_alive "$state/$k/registry.pid" && n=$((n + 1)); done
  echo "$n"
}

stop_all() {
  local k rc=0
  for k in "${kinds[@]}"; do
    gantry_pid_stop "$state/$k/registry.pid" "docker-registry ($k)" || rc=1
  done
  return $rc
}

# Called when start fails half-way: stop what was started, show the log, and fail.
start_failed() {
  local kind=$1 why=$2
  stop_all || true
  rm -f "$envfile"
  if [ -s "$state/$kind/registry.log" ]; then
    echo "---- last lines of $state/$kind/registry.log" >&2
    tail -n 15 "$state/$kind/registry.log" >&2
  fi
  gantry_die "$kind registry: $why"
}

# Waits for the instance to answer /v2/: 200 for the open one; 401 without and 200 with the
# credentials for the TLS one, through the per-run CA (which proves the certificate chain too).
wait_ready() {
  local kind=$1 port=$2 pid code i
  pid=$(cat "$state/$kind/registry.pid")
  for ((i = 0; i < 200; i++)); do
    kill -0 "$pid" 2>/dev/null || start_failed "$kind" "docker-registry exited during start-up"
    if [ "$kind" = http ]; then
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/v2/") || code=000
      [ "$code" = 200 ] && return 0
    else
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$state/ca/ca.pem" \
        "https://127.0.0.1:$port/v2/") || code=000
      if [ "$code" = 401 ]; then
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$state/ca/ca.pem" \
          -u "AWS:$(cat "$state/token")" "https://127.0.0.1:$port/v2/") || code=000
        [ "$code" = 200 ] && return 0
        start_failed "$kind" "/v2/ answered $code with the test credentials (expected 200)"
      fi
    fi
    sleep 0.1
  done
  start_failed "$kind" "no answer on https?://127.0.0.1:$port/v2/ after 20 s (last HTTP code $code)"
}

write_env() {
  local http_port=$1 tls_port=$2 tmp="$envfile.tmp.$$"
  {
    echo "# Written by tests/harness/registry.sh start on $(date -u +%FT%TZ); source it."
    echo "GANTRY_TEST_REGISTRY_HTTP=127.0.0.1:$http_port"
    echo "GANTRY_TEST_REGISTRY_TLS=127.0.0.1:$tls_port"
    echo "GANTRY_TEST_REGISTRY_CA=$state/ca/ca.pem"
    echo "GANTRY_TEST_REGISTRY_CERT_DIR=$state/certs.d"
    echo "GANTRY_TEST_REGISTRY_USER=AWS"
    echo "GANTRY_TEST_REGISTRY_PASSWORD=$(cat "$state/token")"
    echo "GANTRY_TEST_REGISTRY_PASSWORD_FILE=$state/token"
    echo "GANTRY_TEST_REGISTRY_HTTP_LOG=$state/http/registry.log"
    echo "GANTRY_TEST_REGISTRY_TLS_LOG=$state/tls/registry.log"
    echo "GANTRY_TEST_REGISTRY_HTTP_STORAGE=$state/http/storage"
    echo "GANTRY_TEST_REGISTRY_TLS_STORAGE=$state/tls/storage"
    echo "GANTRY_TEST_REGISTRY_HTTP_PID=$state/http/registry.pid"
    echo "GANTRY_TEST_REGISTRY_TLS_PID=$state/tls/registry.pid"
    echo "export GANTRY_TEST_REGISTRY_HTTP GANTRY_TEST_REGISTRY_TLS GANTRY_TEST_REGISTRY_CA"
    echo "export GANTRY_TEST_REGISTRY_CERT_DIR GANTRY_TEST_REGISTRY_USER GANTRY_TEST_REGISTRY_PASSWORD"
    echo "export GANTRY_TEST_REGISTRY_PASSWORD_FILE GANTRY_TEST_REGISTRY_HTTP_LOG GANTRY_TEST_REGISTRY_TLS_LOG"
    echo "export GANTRY_TEST_REGISTRY_HTTP_STORAGE GANTRY_TEST_REGISTRY_TLS_STORAGE"
    echo "export GANTRY_TEST_REGISTRY_HTTP_PID GANTRY_TEST_REGISTRY_TLS_PID"
  } >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$envfile"
}

cmd_start() {
  check_tools
  if ! mkdir -p "$state" 2>/dev/null || [ ! -w "$state" ]; then
    gantry_die "cannot write the harness state directory $state (GANTRY_HARNESS_DIR=$GANTRY_HARNESS_DIR); run as root or pick a writable GANTRY_HARNESS_DIR"
  fi
  chmod 755 "$GANTRY_HARNESS_DIR" "$state"

  case $(running_count) in
    2)
      if [ -s "$envfile" ]; then
        gantry_note "registries already running ($(grep -E '^GANTRY_TEST_REGISTRY_(HTTP|TLS)=' "$envfile" | tr '\n' ' '))"
        return 0
      fi
      gantry_note "registries running but $envfile is missing; restarting them"
      stop_all ;;
    1)
      gantry_note "only one of the two registries is running; restarting both"
      stop_all ;;
  esac

  local http_port tls_port k
  http_port=$(pick_port "${GANTRY_TEST_REGISTRY_PORT:-}" GANTRY_TEST_REGISTRY_PORT)
  tls_port=$(pick_port "${GANTRY_TEST_REGISTRY_TLS_PORT:-}" GANTRY_TEST_REGISTRY_TLS_PORT "$http_port")
  [ "$http_port" != "$tls_port" ] || gantry_die "GANTRY_TEST_REGISTRY_PORT and GANTRY_TEST_REGISTRY_TLS_PORT are both $http_port"

  make_tls_material
  make_credentials
  for k in "${kinds[@]}"; do
    mkdir -p "$state/$k/storage"
    chmod 755 "$state/$k" "$state/$k/storage"
  done
  write_config http "$http_port"
  write_config tls "$tls_port"

  for k in "${kinds[@]}"; do
    local port=$http_port
    [ "$k" = tls ] && port=$tls_port
    : >"$state/$k/registry.log"
    chmod 644 "$state/$k/registry.log"
    echo "==== gantry-harness: starting $k registry on 127.0.0.1:$port at $(date -u +%FT%TZ)" >>"$state/$k/registry.log"
    gantry_pid_start "$state/$k/registry.pid" "$state/$k/registry.log" \
      docker-registry serve "$state/$k/config.yml"
  done
  wait_ready http "$http_port"
  wait_ready tls "$tls_port"
  write_env "$http_port" "$tls_port"
  gantry_note "registries up: http://127.0.0.1:$http_port (open), https://127.0.0.1:$tls_port (TLS + Basic AWS); env in $envfile"
}

cmd_stop() {
  if stop_all; then
    rm -f "$envfile"
    gantry_note "registries stopped (storage and logs kept in $state)"
  else
    gantry_die "could not stop every registry; see $state/*/registry.pid"
  fi
}

cmd_status() {
  local k rc=0 port
  for k in "${kinds[@]}"; do
    if gantry_pid_alive "$state/$k/registry.pid"; then
      port=$(sed -n 's/^  addr: 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$state/$k/config.yml" 2>/dev/null)
      echo "$k registry: running, pid $(cat "$state/$k/registry.pid"), 127.0.0.1:$port, log $state/$k/registry.log"
    else
      echo "$k registry: not running"
      rc=3
    fi
  done
  return $rc
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
