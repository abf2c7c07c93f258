# fixtures: registry images slurm
# The SPANK plugin's failure cases on the real 3-node Slurm harness (issue 5): a bad image name, a 401,
# a registry that dies mid-pull, a producer killed mid-download and a producer node that crashes. Each
# must end with a clear error or a successful takeover in bounded time, never a hung step, a drained
# node or a corrupt store. The time each step took is printed (TAP comments) so that regressions in
# retry/backoff show up.

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
  CRASHED_NODE=
  NODE_STARTED_AT=
}

teardown() {
  local pid
  for pid in "${PRIVATE_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  unshape_link
  # A test that crashed a node and failed before booting it again must not leave the cluster short, nor
  # end before the controller has the node back (gantry_nodes_restored): the next suite would meet it
  # down or not responding.
  if [ -n "$CRASHED_NODE" ]; then
    local since=${NODE_STARTED_AT:-$(date +%s)}
    "$GANTRY_SLURM_HARNESS" start-node "$CRASHED_NODE" || true
    scontrol update nodename="$CRASHED_NODE" state=resume 2>/dev/null || true
    gantry_nodes_restored "$CRASHED_NODE" "$since"
  fi
  rm -rf "$WORK"
}

# as_user CMD...: run as the test user from the shared directory (a cwd every node has).
as_user() {
  # The test harness's own secrets are not part of the job's environment (the job exports everything
  # it has into the container, as Pyxis does).
  gantry_as_user "$U" "$WORK" env -u GANTRY_TEST_REGISTRY_PASSWORD "$@"
}

# timed NAME CMD...: runs CMD like bats' `run`, and sets ELAPSED (seconds, 0.1 s resolution); prints it
# for the report. Every srun here also runs under `timeout`, so a hung step fails the test, not the run.
timed() {
  local name=$1 t0 t1
  shift
  t0=$(date +%s%N)
  run "$@"
  t1=$(date +%s%N)
  set_elapsed "$t0" "$t1"
  echo "# $name: step ended after ${ELAPSED} s (exit $status)" >&3
}

# set_elapsed T0 [T1]: ELAPSED = seconds from T0 to T1 (default: now), both `date +%s%N`, 0.1 s resolution.
set_elapsed() {
  local tenths=$(( (${2:-$(date +%s%N)} - $1) / 100000000 ))
  ELAPSED=$((tenths / 10)).$((tenths % 10))
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
# at $GANTRY_TEST_LOGIN_ADDR:PORT); `tls` adds the certificate from DIR/ca and htpasswd Basic auth. Own instances,
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

# image_on_own_registry PREFIX DIR [BYTES]: a fresh image (BYTES of payload) pushed to a registry of the
# test's own in WORK/DIR, which the plugin may use; sets name, digest, port and image (as the nodes name it).
image_on_own_registry() {
  name="$1-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name" ${3:+"$3"})
  port=$(free_port)
  private_registry "$WORK/$2" "$port"
  skopeo copy -q --src-tls-verify=false --dest-tls-verify=false \
    "docker://$GANTRY_TEST_REGISTRY_HTTP/gantry-test/$name:latest" "docker://127.0.0.1:$port/gantry-test/$name:latest"
  gantry_plugin_conf "insecure_registries = $GANTRY_TEST_LOGIN_ADDR:$port"
  image="$GANTRY_TEST_LOGIN_ADDR:$port#gantry-test/$name"
}

# make_tls DIR: a CA and a server certificate for the login address (the one the nodes use) and 127.0.0.1.
make_tls() {
  local ca=$1/ca
  mkdir -p "$ca"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$ca/ca.key" \
    -out "$ca/ca.pem" -days 1 -subj "/CN=gantry failure-test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$ca/server.key" \
    -out "$ca/server.csr" -subj "/CN=$GANTRY_TEST_LOGIN_ADDR" 2>/dev/null
  printf '%s\n' "subjectAltName=IP:$GANTRY_TEST_LOGIN_ADDR,IP:127.0.0.1" "extendedKeyUsage=serverAuth" > "$ca/server.ext"
  openssl x509 -req -in "$ca/server.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" -CAcreateserial \
    -out "$ca/server.pem" -days 1 -extfile "$ca/server.ext" 2>/dev/null
  chmod 644 "$ca/ca.pem"
}

# wait_for_partial HEX [BLOB [BYTES]]: waits (up to 60 s) until the producer of image HEX has
# downloaded at least BYTES (default 1 MB) of BLOB (default: any blob) into the store's staging area;
# prints the .partial file.
wait_for_partial() {
  local hex=$1 pattern='*' bytes=${3:-1000000} i f
  [ -n "${2:-}" ] && pattern=${2#sha256:}
  for ((i = 0; i < 600; i++)); do
    for f in "$STORE/staging/$hex/blobs/"$pattern.partial; do
      [ -f "$f" ] && [ "$(stat -c %s "$f")" -ge "$bytes" ] && { echo "$f"; return 0; }
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
  image="$GANTRY_TEST_LOGIN_ADDR:$port#gantry-test/tiny"

  # No credentials for this registry anywhere the job user's lookup reads.
  timed "401 without credentials" as_user timeout 120 srun -N3 -n3 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "no credentials found for $GANTRY_TEST_LOGIN_ADDR:$port; tried .*config.json"
  less_than 30
  nodes_healthy

  # Wrong credentials from a Docker config.json: the message says which source failed; the password
  # that was sent and the registry's own never appear.
  mkdir -p "$WORK/docker"
  wrong="wrong-secret-$RANDOM$RANDOM"
  printf '{"auths": {"%s:%s": {"auth": "%s"}}}\n' "$GANTRY_TEST_LOGIN_ADDR" "$port" "$(printf 'AWS:%s' "$wrong" | base64 -w0)" \
    > "$WORK/docker/config.json"
  chown -R "$U" "$WORK/docker"
  timed "401 with wrong credentials" as_user timeout 120 env DOCKER_CONFIG="$WORK/docker" \
    srun -N3 -n3 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "authentication to $GANTRY_TEST_LOGIN_ADDR:$port failed (tried: .*config.json"
  # (`! cmd` does not fail a bats test under set -e: counts are compared instead)
  [ "$(echo "$output" | grep -cF "$wrong")" -eq 0 ]
  [ "$(echo "$output" | grep -cF "$(printf 'AWS:%s' "$wrong" | base64 -w0)")" -eq 0 ]
  [ "$(echo "$output" | grep -cF "$password")" -eq 0 ]
  less_than 30
  nodes_healthy
}

@test "a registry that dies mid-pull: clear error in bounded time, no partial image, the retry succeeds" {
  # A fresh image on a registry of our own, so the harness's registry keeps running for later tests.
  image_on_own_registry diemid dying 12000000
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
  set_elapsed "$t0"
  echo "# registry killed mid-pull: step ended after ${ELAPSED} s from its start (exit $status)" >&3
  unshape_link
  cat "$WORK/die.out"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  grep -q "gantry: failed to import docker image" "$WORK/die.out"
  grep -q "$GANTRY_TEST_LOGIN_ADDR:$port" "$WORK/die.out"
  less_than 90
  nodes_healthy
  # No image was published, nothing half-written is left where readers look, and nobody holds the lock.
  ! gantry_image_stored "$STORE" "$hex" || false
  [ ! -e "$STORE/images/$hex.json" ]
  [ "$(find "$STORE/staging" -name '*.sqsh.*' | wc -l)" -eq 0 ]
  flock -n "$STORE/locks/$hex.lock" true

  # The registry comes back (same storage): the same srun now succeeds and publishes the image.
  private_registry "$WORK/dying" "$port"
  timed "same step after the registry is back" as_user timeout 240 srun -N3 -n3 --container-image="$image" \
    sh -c 'echo "$GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^$digest$")" -eq 3 ]
  gantry_image_stored "$STORE" "$hex"
  [ ! -e "$STORE/staging/$hex" ]
  nodes_healthy
}

@test "the registry down: a stored image runs by digest and under GANTRY_PULL_POLICY=missing; the default asks and fails" {
  # A registry of our own that the test stops once the image is stored (the harness's keeps running).
  image_on_own_registry offline gone
  run as_user timeout 120 srun -N3 -n3 --container-image="$image" true
  echo "$output"
  [ "$status" -eq 0 ]
  gantry_image_stored "$STORE" "$digest"

  kill -9 "$(cat "$WORK/gone/pid")"
  # Nothing answers on the port any more: a request would fail, so every success below ran from the store.
  ! curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null || false

  timed "digest-pinned, registry down" as_user timeout 120 srun -N3 -n3 --container-image="$image@$digest" \
    sh -c 'echo "pinned $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^pinned $digest$")" -eq 3 ]

  timed "tag under GANTRY_PULL_POLICY=missing, registry down" as_user env GANTRY_PULL_POLICY=missing \
    timeout 120 srun -N3 -n3 --container-image="$image" sh -c 'echo "missing $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^missing $digest$")" -eq 3 ]

  # The default policy (always) must ask the registry what the tag names now: a Pyxis-style failure.
  timed "tag under the default policy, registry down" as_user timeout 120 srun -N3 -n3 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "$GANTRY_TEST_LOGIN_ADDR:$port"
  # ... and says that the store has what the tag named, and how to run it without the registry.
  echo "$output" | grep -q "the store has the image this tag named at .* (${digest:0:19}...): --pull=missing (for srun: export GANTRY_PULL_POLICY=missing)"

  # never: an image the store lacks is refused without the network, saying what to do.
  run as_user env GANTRY_PULL_POLICY=never timeout 120 srun -N1 -n1 \
    --container-image="$GANTRY_TEST_LOGIN_ADDR:$port#gantry-test/not-stored-$RANDOM" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "the pull policy is 'never'"
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
  holder=$(head -n1 "$STORE/locks/$hex.lock")  # the first line; a progress line may follow
  producer_node=${holder%%:*}
  producer_pid=${holder##*:}
  echo "producer $holder, $partial at $(stat -c %s "$partial") bytes"
  [ "$(cat "/proc/$producer_pid/comm")" = gantry ]
  kill -9 "$producer_pid"
  status=0
  wait "$srun_pid" || status=$?
  set_elapsed "$t0"
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
  gantry_image_stored "$STORE" "$hex"
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

# cancel_mid_pull_image NAME: a fresh 12 MB image (sets DIGEST, HEX, LAYER, IMAGE) pulled by a 3-node
# step over a 2 Mbit/s link (~50 s), started by the caller; helpers for the two cancellation tests.
cancel_mid_pull_image() {
  DIGEST=$(gantry_fresh_image "$WORK" "$1" 12000000)
  HEX=${DIGEST#sha256:}
  LAYER=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
    "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$1/manifests/latest" | jq -r '.layers[-1].digest')
  IMAGE="$REG#gantry-test/$1"
}

# pulls_stopped HEX T0 [NODE]: waits (up to 60 s) until no node (but NODE) is `completing` and nobody
# holds image HEX's producer lock; sets ELAPSED from T0.
pulls_stopped() {
  local i
  for ((i = 0; i < 600; i++)); do
    flock -n "$STORE/locks/$1.lock" true &&
      [ "$(sinfo -h -N -o '%N %t' | awk -v n="${3:-}" '$1 != n && $2 ~ /comp/' | wc -l)" -eq 0 ] && break
    sleep 0.1
  done
  set_elapsed "$2"
  flock -n "$STORE/locks/$1.lock" true
}

# resumed_step: the next 3-node step runs from the image; the layer's rest was fetched with a range
# request (HTTP 206), not from the start.
resumed_step() {
  timed "next step, resuming the stopped pull" as_user timeout 180 srun -N3 -n3 --container-image="$IMAGE" \
    sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $DIGEST$")" -eq 3 ]
  grep -qE "\"GET /v2/gantry-test/[^ ]*/blobs/$LAYER HTTP/[0-9.]+\" 206 " "$GANTRY_TEST_REGISTRY_HTTP_LOG"
  [ ! -e "$STORE/staging/$HEX" ]
  nodes_healthy
}

@test "scancel while the image downloads: the pulls stop, the nodes are idle within seconds, the next step resumes" {
  cancel_mid_pull_image "cancel-$RANDOM$RANDOM"
  shape_link 2mbit
  as_user timeout 240 srun -N3 -n3 -J "cancel-$HEX" --container-image="$IMAGE" sh -c 'echo "ran $(hostname)"' \
    > "$WORK/cancel.out" 2>&1 3>&- &
  srun_pid=$!
  partial=$(wait_for_partial "$HEX" "$LAYER")  # in the big layer: the stopped download has something to resume
  holder=$(head -n1 "$STORE/locks/$HEX.lock")  # the first line; a progress line may follow
  echo "producer $holder, $partial at $(stat -c %s "$partial") bytes: scancel"
  t0=$(date +%s%N)
  scancel -n "cancel-$HEX"
  status=0
  wait "$srun_pid" || status=$?
  set_elapsed "$t0"
  echo "# scancel mid-pull: srun ended ${ELAPSED} s after scancel (exit $status)" >&3
  cat "$WORK/cancel.out"
  [ "$status" -ne 124 ]
  # The pulls in slurmstepd noticed the pending kill and stopped; the nodes left `completing` and the
  # producer lock is free long before the ~50 s the download would have taken (at 2 Mbit/s).
  pulls_stopped "$HEX" "$t0"
  echo "# scancel mid-pull: nodes idle, producer lock free ${ELAPSED} s after scancel" >&3
  less_than 20
  [ "$(cat "/proc/${holder##*:}/comm" 2>/dev/null)" != gantry ]
  ! gantry_image_stored "$STORE" "$HEX" || false
  ! grep -q "^ran " "$WORK/cancel.out" || false
  nodes_healthy
  unshape_link
  resumed_step
}

@test "a step cancelled inside its job while the image downloads: the pulls stop, the job goes on" {
  cancel_mid_pull_image "stepcancel-$RANDOM$RANDOM"
  cat > "$WORK/job.sh" <<EOF_JOB
#!/bin/bash
srun -N3 -n3 --container-image="$IMAGE" sh -c 'echo "ran \$(hostname)"'
echo "step ended: \$?"
srun -N3 -n3 sh -c 'echo "host step \$(hostname)"'
EOF_JOB
  chmod 755 "$WORK/job.sh"
  shape_link 2mbit
  jobid=$(as_user sbatch --parsable -N3 -o "$WORK/job.out" "$WORK/job.sh")
  partial=$(wait_for_partial "$HEX" "$LAYER")
  holder=$(head -n1 "$STORE/locks/$HEX.lock")  # the first line; a progress line may follow
  echo "job $jobid, producer $holder, $partial at $(stat -c %s "$partial") bytes: scancel $jobid.0"
  t0=$(date +%s%N)
  # Only the step, as srun's Ctrl-C does: the controller's job stays RUNNING, so only slurmstepd knows.
  scancel "$jobid.0"
  for ((i = 0; i < 600; i++)); do
    grep -q "^step ended" "$WORK/job.out" 2>/dev/null && break
    sleep 0.1
  done
  set_elapsed "$t0"
  echo "# scancel JOB.0 mid-pull: the batch script went on ${ELAPSED} s after scancel" >&3
  for ((i = 0; i < 300; i++)); do
    [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break
    sleep 0.1
  done
  cat "$WORK/job.out"
  grep -q "^step ended" "$WORK/job.out"
  less_than 20
  pulls_stopped "$HEX" "$t0"
  [ "$(cat "/proc/${holder##*:}/comm" 2>/dev/null)" != gantry ]
  ! grep -q "^ran " "$WORK/job.out" || false
  # The allocation was not harmed: the script's next step ran on all three nodes.
  [ "$(grep -c "^host step " "$WORK/job.out")" -eq 3 ]
  ! gantry_image_stored "$STORE" "$HEX" || false
  nodes_healthy
  unshape_link
  resumed_step
}

# node_state NODE: Slurm's state of one node (idle, down*, drained, ...).
node_state() {
  sinfo -h -N -n "$1" -o %t | head -1
}

# producer_node_crash RATE: a 3-node step pulls a new 12 MB image over a link shaped to RATE; the node
# producing it crashes mid-download (slurm.sh crash-node: slurmd, slurmstepd, pull and tasks SIGKILLed
# at once). Checks that srun ends on its own with Slurm's node-failure message, the crashed node is down
# (not drained), the survivors run a step from the complete image while it is down, the store holds no
# locked or half-written leftovers, no blob crossed the network more often than there were interrupted
# downloads plus one, and the node rejoins and runs a 3-node step after it boots again.
producer_node_crash() {
  local rate=$1 name digest hex blobs b n image srun_pid partial holder t0 t1 t_crash state ran max_gets i layer jobstate
  name="nodecrash-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name" 12000000)
  hex=${digest#sha256:}
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
    "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$name/manifests/latest" | jq -r '.config.digest, .layers[].digest')
  # The base layers are tiny's, which earlier tests fetched too: only this test's GETs count.
  declare -A gets_before
  for b in $blobs; do gets_before[$b]=$(blob_gets "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b"); done
  layer=$(echo "$blobs" | tail -1)
  image="$REG#gantry-test/$name"

  shape_link "$rate"
  t0=$(date +%s%N)
  as_user timeout 240 srun -N3 -n3 -J "$name" --container-image="$image" sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"' \
    > "$WORK/crash.out" 2>&1 3>&- &
  srun_pid=$!
  # The crash lands in the big layer, with 2 MB of it on disk (the downloader writes whole MiBs), so
  # the taker has something to resume and 10 MB still to fetch.
  partial=$(wait_for_partial "$hex" "$layer" 2000000)
  holder=$(head -n1 "$STORE/locks/$hex.lock")  # the first line; a progress line may follow
  CRASHED_NODE=${holder%%:*}
  echo "producer $holder, $partial at $(stat -c %s "$partial") bytes: crashing $CRASHED_NODE"
  # slurmd, slurmstepd, the pull and the tasks of that node, all with SIGKILL at once.
  "$GANTRY_SLURM_HARNESS" crash-node "$CRASHED_NODE"
  t_crash=$(date +%s%N)
  status=0
  wait "$srun_pid" || status=$?
  t1=$(date +%s%N)
  set_elapsed "$t_crash" "$t1"
  echo "# producer node crashed mid-download ($rate): srun ended ${ELAPSED} s after the crash, $(( (t1 - t0) / 1000000000 )) s after its start (exit $status)" >&3
  unshape_link
  cat "$WORK/crash.out"
  [ "$(cat "/proc/${holder##*:}/comm" 2>/dev/null)" != gantry ]
  # No hang: srun ends on its own once the controller has declared the node dead (SlurmdTimeout of the
  # harness: 20 s, plus up to a ping interval), with Slurm's message naming the node. Its exit status
  # is not checked: Slurm 22.05's srun exits 0 when the tasks it still heard from succeeded (measured
  # here; docs/user.md warns about it), so the message is what tells the user.
  [ "$status" -ne 124 ]
  less_than 90
  grep -Eq "[Nn]ode failure on $CRASHED_NODE" "$WORK/crash.out"
  # The controller marks the node down (not responding), never drained: nobody has to clear a drain.
  state=$(node_state "$CRASHED_NODE")
  echo "# state of $CRASHED_NODE after the step: $state" >&3
  [[ $state == down* ]]
  # The two other nodes took the pull over while the crashed node was still being waited for.
  ran=$(grep -c "^ran .* $digest$" "$WORK/crash.out" || true)
  echo "# tasks that ran in the crashed step: $ran of 3" >&3
  [ "$(grep -c "^ran $CRASHED_NODE " "$WORK/crash.out")" -eq 0 ]
  # Either both took over and ran, and the image is there; or Slurm ended the whole step first.
  [ "$ran" -eq 2 ] || [ "$ran" -eq 0 ]
  if [ "$ran" -eq 2 ]; then gantry_image_stored "$STORE" "$hex"; fi
  # Neither way leaves a producer behind. When Slurm ended the step first, a survivor was still pulling
  # in slurmstepd (slurm_spank_init_post_opt, before the tasks exist): the plugin sees slurmstepd hold
  # the kill request and stops that pull, so the survivors leave `completing` within seconds. Measured
  # here and bounded; then nobody holds the lock.
  pulls_stopped "$hex" "$(date +%s%N)" "$CRASHED_NODE"
  echo "# producer lock free, survivors out of completing ${ELAPSED} s after srun ended" >&3
  less_than 20
  # The job's record says what happened, for scripts that only look at srun's exit status.
  for ((i = 0; i < 60; i++)); do
    jobstate=$(scontrol -o show job | awk -v n="JobName=$name " 'index($0, n)' | grep -o 'JobState=[A-Z_]*')
    [ "$jobstate" != JobState=COMPLETING ] && break
    sleep 0.5
  done
  echo "# job of the crashed step: $jobstate" >&3
  [ "$jobstate" = JobState=NODE_FAIL ]

  # The surviving nodes run a step from a complete image while the crashed one is down.
  timed "2-node step on the survivors" as_user timeout 120 srun -N2 -n2 -x "$CRASHED_NODE" --container-image="$image" \
    sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $digest$")" -eq 2 ]
  gantry_image_stored "$STORE" "$hex"
  [ -e "$STORE/images/$hex.json" ]
  # A staging area may only be left if no one holds its lock; `gantry gc` then reclaims it (docs/store.md).
  if [ -e "$STORE/staging/$hex" ]; then
    echo "# staging/$hex left behind; its lock must be free and gc must remove it" >&3
    flock -n "$STORE/locks/$hex.lock" true
    # As the user whose pull left it (root refuses to collect a world-writable store, docs/store.md).
    runuser -u "$U" -- "$GANTRY_BUILD_DIR/runtime/gantry" gc --store "$STORE"
    [ ! -e "$STORE/staging/$hex" ]
  fi
  [ "$(find "$STORE/staging" -name '*.sqsh.*' | wc -l)" -eq 0 ]
  # Every blob of the image crossed the network at most once per interrupted download plus once: twice
  # when the survivors finished (the crashed producer's part, the rest); when Slurm ended the step, up to
  # four: the survivor that had taken over was stopped too, and the other survivor, waiting for the lock,
  # may get it and start its own part in the moment before its own stop (seen once in ~6 CI runs), then
  # the next step fetches the rest. The interrupted layer was resumed (HTTP 206), not restarted.
  max_gets=2
  [ "$ran" -eq 2 ] || max_gets=4
  for b in $blobs; do
    n=$(( $(blob_gets "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b") - ${gets_before[$b]} ))
    echo "# GETs of $b in this test: $n (at most $max_gets)" >&3
    [ "$n" -le "$max_gets" ]
  done
  grep -qE "\"GET /v2/gantry-test/$name/blobs/$layer HTTP/[0-9.]+\" 206 " "$GANTRY_TEST_REGISTRY_HTTP_LOG"

  # The node boots again: slurmd registers, the controller returns it to service (ReturnToService=2)
  # or, on a cluster configured otherwise, the admin resumes it; then all three nodes run a step.
  NODE_STARTED_AT=$(date +%s)
  "$GANTRY_SLURM_HARNESS" start-node "$CRASHED_NODE"
  t0=$(date +%s%N)
  for ((i = 0; i < 60; i++)); do
    [ "$(node_state "$CRASHED_NODE")" = idle ] && break
    sleep 0.5
  done
  state=$(node_state "$CRASHED_NODE")
  echo "# $CRASHED_NODE $state $(( ($(date +%s%N) - t0) / 1000000 )) ms after its slurmd came back" >&3
  if [ "$state" != idle ]; then scontrol update nodename="$CRASHED_NODE" state=resume; fi
  nodes_healthy
  # The controller has the new slurmd's registration and every node idle and responding: the cluster
  # as the test found it, before the next suite runs.
  gantry_nodes_restored "$CRASHED_NODE" "$NODE_STARTED_AT"
  CRASHED_NODE=
  timed "3-node step after the node came back" as_user timeout 120 srun -N3 -n3 --container-image="$image" \
    sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $digest$")" -eq 3 ]
  nodes_healthy
}

@test "the producer NODE crashes mid-download: srun ends, the others take over, the node comes back" {
  # 20 Mbit/s: slow enough to catch the layer half-way under load, fast enough that the survivors
  # finish the pull long before the controller declares the node dead.
  producer_node_crash 20mbit
}

@test "the producer NODE crashes on a slow link: Slurm ends the step first, the survivors' next step runs" {
  # 2 Mbit/s: the rest of the layer takes longer than the harness's SlurmdTimeout, so the node failure
  # ends the step while a survivor is still downloading.
  producer_node_crash 2mbit
}
