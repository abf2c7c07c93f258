# fixtures: registry images slurm
# The SPANK plugin's failure cases on the real 3-node Slurm harness (issue 5): a bad image name, a 401,
# a registry that dies mid-pull and a producer killed mid-download. Each must end with a clear error or
# a successful takeover in bounded time, never a hung step, a drained node or a corrupt store. The
# time each step took is printed (TAP comments) so that regressions in retry/backoff show up.

load helpers

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  gantry_plugin_conf
  U=$GANTRY_TEST_USER
  STORE=$GANTRY_TEST_FSX/store
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/plugin-fail.XXXXXX")
  chown "$U" "$WORK"
  PRIVATE_PIDS=()
  SHAPED_DEV=
}

teardown() {
  local pid
  for pid in "${PRIVATE_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  unshape_link
  rm -rf "$WORK"
}

# as_user CMD...: run as the test user from the shared directory (a cwd every node has).
as_user() {
  runuser -u "$U" -- env -C "$WORK" "$@"
}

# timed NAME CMD...: runs CMD like bats' `run`, and sets ELAPSED (seconds, 0.1 s resolution); prints it
# for the report. Every srun here also runs under `timeout`, so a hung step fails the test, not the run.
timed() {
  local name=$1 t0 t1
  shift
  t0=$(date +%s%N)
  run "$@"
  t1=$(date +%s%N)
  ELAPSED=$(( (t1 - t0) / 100000000 ))
  ELAPSED=$((ELAPSED / 10)).$((ELAPSED % 10))
  echo "# $name: step ended after ${ELAPSED} s (exit $status)" >&3
}

# less_than SECONDS: ELAPSED (from timed) is below the bound.
less_than() {
  awk -v e="$ELAPSED" -v b="$1" 'BEGIN { exit !(e < b) }'
}

# nodes_healthy: every node idle again (no drain, down or fail state) within 30 s of the step's end.
nodes_healthy() {
  local states i
  for ((i = 0; i < 60; i++)); do
    states=$(sinfo -h -N -o '%N %T' | sort -u)
    if echo "$states" | grep -Eqi 'drain|down|fail'; then
      echo "unhealthy nodes: $states"
      return 1
    fi
    [ "$(echo "$states" | awk '$2 != "idle"' | wc -l)" -eq 0 ] && return 0
    sleep 0.5
  done
  echo "nodes not idle after 30 s: $states"
  return 1
}

# free_port: a TCP port nobody listens on now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("0.0.0.0", 0)); print(s.getsockname()[1])'
}

# private_registry DIR PORT [tls]: a registry of this test's own on 0.0.0.0:PORT (the nodes reach it
# as gantry-login:PORT); `tls` adds the certificate from DIR/ca and htpasswd Basic auth. Own instances,
# so killing one leaves the harness's registries alone for later tests.
private_registry() {
  local dir=$1 port=$2
  if [ "${3:-}" = tls ]; then
    gantry_private_registry "$dir" "0.0.0.0:$port" tls "$dir/ca/server.pem" "$dir/ca/server.key" \
      auth "$(printf 'auth:\n  htpasswd:\n    realm: gantry-fail\n    path: %s/htpasswd' "$dir")" || return 1
  else
    gantry_private_registry "$dir" "0.0.0.0:$port" || return 1
  fi
  PRIVATE_PIDS+=("$(cat "$dir/pid")")
}

# make_tls DIR: a CA and a server certificate for gantry-login (the name the nodes use) and 127.0.0.1.
make_tls() {
  local ca=$1/ca
  mkdir -p "$ca"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$ca/ca.key" \
    -out "$ca/ca.pem" -days 1 -subj "/CN=gantry failure-test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$ca/server.key" \
    -out "$ca/server.csr" -subj "/CN=gantry-login" 2>/dev/null
  printf '%s\n' "subjectAltName=DNS:gantry-login,IP:127.0.0.1" "extendedKeyUsage=serverAuth" > "$ca/server.ext"
  openssl x509 -req -in "$ca/server.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" -CAcreateserial \
    -out "$ca/server.pem" -days 1 -extfile "$ca/server.ext" 2>/dev/null
  chmod 644 "$ca/ca.pem"
}

# shape_link RATE: slows the host's traffic towards the nodes (the link the route to gnode1 uses) to
# RATE, so that a pull of a few MB takes seconds and a kill lands mid-download. Run as root on the
# harness's own veth (the nodes' only way out); unshape_link (teardown) removes it.
shape_link() {
  local ip
  ip=$(getent ahostsv4 gnode1 | awk 'NR == 1 { print $1 }')
  SHAPED_DEV=$(ip -o route get "$ip" | sed -n 's/.* dev \([^ ]*\).*/\1/p')
  [ -n "$SHAPED_DEV" ]
  tc qdisc replace dev "$SHAPED_DEV" root tbf rate "$1" burst 32kb latency 500ms
}

unshape_link() {
  if [ -n "$SHAPED_DEV" ]; then tc qdisc del dev "$SHAPED_DEV" root 2>/dev/null || true; fi
  SHAPED_DEV=
}

# wait_for_partial HEX: waits (up to 60 s) until the producer of image HEX has downloaded at least
# 1 MB of a blob into the store's staging area; prints the .partial file.
wait_for_partial() {
  local hex=$1 i f
  for ((i = 0; i < 600; i++)); do
    for f in "$STORE/staging/$hex/blobs/"*.partial; do
      [ -f "$f" ] && [ "$(stat -c %s "$f")" -ge 1000000 ] && { echo "$f"; return 0; }
    done
    sleep 0.1
  done
  return 1
}

# blob_gets LOG DIGEST: GETs of one blob in a registry access log.
blob_gets() {
  "$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$1" "$2"
}

@test "bad image names: a clear Pyxis-style error in bounded time, nodes stay idle" {
  # Malformed: an upper-case repository is not a valid reference.
  timed "malformed reference" as_user timeout 120 srun -N3 -n3 --container-image="$REG#gantry-test/Not::Valid" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "Not::Valid"
  less_than 30
  nodes_healthy

  # Well formed, but the registry has no such repository: 404 is final, no retries.
  timed "image the registry lacks" as_user timeout 120 srun -N3 -n3 --container-image="$REG#gantry-test/no-such-image-$RANDOM" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -Eqi "not found|unknown|404"
  less_than 30
  nodes_healthy
}

@test "401: the error names the registry and the credential sources tried, and prints no secret" {
  # A TLS + htpasswd registry the nodes can reach (the harness's one listens on loopback only).
  make_tls "$WORK/auth"
  password="fail-test-secret-$RANDOM$RANDOM"
  printf '%s\n' "$password" | htpasswd -iBc "$WORK/auth/htpasswd" AWS 2>/dev/null
  port=$(free_port)
  private_registry "$WORK/auth" "$port" tls
  gantry_plugin_conf "ca_bundle = $WORK/auth/ca/ca.pem"
  image="gantry-login:$port#gantry-test/tiny"

  # No credentials for this registry anywhere the job user's lookup reads.
  timed "401 without credentials" as_user timeout 120 srun -N3 -n3 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "no credentials found for gantry-login:$port; tried .*config.json"
  less_than 30
  nodes_healthy

  # Wrong credentials from a Docker config.json: the message says which source failed; the password
  # that was sent and the registry's own never appear.
  mkdir -p "$WORK/docker"
  wrong="wrong-secret-$RANDOM$RANDOM"
  printf '{"auths": {"gantry-login:%s": {"auth": "%s"}}}\n' "$port" "$(printf 'AWS:%s' "$wrong" | base64 -w0)" \
    > "$WORK/docker/config.json"
  chown -R "$U" "$WORK/docker"
  timed "401 with wrong credentials" as_user timeout 120 env DOCKER_CONFIG="$WORK/docker" \
    srun -N3 -n3 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "authentication to gantry-login:$port failed (tried: .*config.json"
  # (`! cmd` does not fail a bats test under set -e: counts are compared instead)
  [ "$(echo "$output" | grep -cF "$wrong")" -eq 0 ]
  [ "$(echo "$output" | grep -cF "$(printf 'AWS:%s' "$wrong" | base64 -w0)")" -eq 0 ]
  [ "$(echo "$output" | grep -cF "$password")" -eq 0 ]
  less_than 30
  nodes_healthy
}

@test "a registry that dies mid-pull: clear error in bounded time, no partial image, the retry succeeds" {
  # A fresh image on a registry of our own, so the harness's registry keeps running for later tests.
  name="diemid-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name" 12000000)
  port=$(free_port)
  private_registry "$WORK/dying" "$port"
  skopeo copy -q --src-tls-verify=false --dest-tls-verify=false \
    "docker://$GANTRY_TEST_REGISTRY_HTTP/gantry-test/$name:latest" "docker://127.0.0.1:$port/gantry-test/$name:latest"
  gantry_plugin_conf "insecure_registries = gantry-login:$port"
  image="gantry-login:$port#gantry-test/$name"
  hex=${digest#sha256:}

  shape_link 40mbit   # ~12 MB at 5 MB/s: the download takes seconds
  t0=$(date +%s%N)
  as_user timeout 240 srun -N3 -n3 --container-image="$image" true > "$WORK/die.out" 2>&1 3>&- &
  srun_pid=$!
  partial=$(wait_for_partial "$hex")
  echo "killing the registry while $partial has $(stat -c %s "$partial") bytes"
  kill -9 "$(cat "$WORK/dying/pid")"
  status=0
  wait "$srun_pid" || status=$?
  ELAPSED=$(( ($(date +%s%N) - t0) / 100000000 ))
  ELAPSED=$((ELAPSED / 10)).$((ELAPSED % 10))
  echo "# registry killed mid-pull: step ended after ${ELAPSED} s from its start (exit $status)" >&3
  unshape_link
  cat "$WORK/die.out"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  grep -q "gantry: failed to import docker image" "$WORK/die.out"
  grep -q "gantry-login:$port" "$WORK/die.out"
  less_than 90
  nodes_healthy
  # No image was published, nothing half-written is left where readers look, and nobody holds the lock.
  [ ! -e "$STORE/images/$hex.sqsh" ]
  [ ! -e "$STORE/images/$hex.json" ]
  [ "$(find "$STORE/staging" -name 'image.sqsh.*' | wc -l)" -eq 0 ]
  flock -n "$STORE/locks/$hex.lock" true

  # The registry comes back (same storage): the same srun now succeeds and publishes the image.
  private_registry "$WORK/dying" "$port"
  timed "same step after the registry is back" as_user timeout 240 srun -N3 -n3 --container-image="$image" \
    sh -c 'echo "$GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^$digest$")" -eq 3 ]
  [ -e "$STORE/images/$hex.sqsh" ]
  [ ! -e "$STORE/staging/$hex" ]
  nodes_healthy
}

@test "the producer killed mid-download: another node takes over, the next step runs from the image" {
  name="killprod-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name" 12000000)
  hex=${digest#sha256:}
  layer=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
    "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$name/manifests/latest" | jq -r '.layers[-1].digest')
  image="$REG#gantry-test/$name"

  shape_link 40mbit
  t0=$(date +%s%N)
  as_user timeout 240 srun -N3 -n3 --container-image="$image" sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"' \
    > "$WORK/kill.out" 2>&1 3>&- &
  srun_pid=$!
  partial=$(wait_for_partial "$hex")
  # The store's producer lock file names its holder as HOST:PID (gantry pull on that node; the nodes
  # share the host's PID namespace, so the pid is valid here).
  holder=$(cat "$STORE/locks/$hex.lock")
  producer_node=${holder%%:*}
  producer_pid=${holder##*:}
  echo "producer $holder, $partial at $(stat -c %s "$partial") bytes"
  [ "$(cat "/proc/$producer_pid/comm")" = gantry ]
  kill -9 "$producer_pid"
  status=0
  wait "$srun_pid" || status=$?
  ELAPSED=$(( ($(date +%s%N) - t0) / 100000000 ))
  ELAPSED=$((ELAPSED / 10)).$((ELAPSED % 10))
  echo "# producer killed mid-download: step ended after ${ELAPSED} s from its start (exit $status)" >&3
  unshape_link
  cat "$WORK/kill.out"
  [ "$status" -ne 124 ]
  less_than 90
  # The killed node's tasks fail with a clear message naming what happened ...
  grep -q "gantry: failed to import docker image" "$WORK/kill.out"
  grep -q "killed by signal 9" "$WORK/kill.out"
  # ... and the other two nodes took over the pull without a human and ran their tasks.
  [ "$(grep -c "^ran .* $digest$" "$WORK/kill.out")" -eq 2 ]
  [ "$(grep -c "^ran $producer_node " "$WORK/kill.out")" -eq 0 ]
  [ -e "$STORE/images/$hex.sqsh" ]
  [ ! -e "$STORE/staging/$hex" ]
  nodes_healthy

  # The next step runs everywhere from the stored image without touching the layer again.
  before=$(blob_gets "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$layer")
  timed "next step from the completed image" as_user timeout 120 srun -N3 -n3 --container-image="$image" \
    sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $digest$")" -eq 3 ]
  [ "$(blob_gets "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$layer")" -eq "$before" ]
  # The layer crossed the network at most twice: the killed producer's part, and the resumed rest.
  echo "layer GETs: $before"
  [ "$before" -ge 1 ]
  [ "$before" -le 2 ]
  nodes_healthy
}
