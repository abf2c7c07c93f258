# fixtures: registry images
# The seed's scale, in CI (issue #16): a cluster of its own with more nodes than the shared CTest one
# (default 10, GANTRY_TEST_SCALE_NODES; 4 ranks per node, GANTRY_TEST_SCALE_TASKS), started in a second
# harness dir beside it, runs a cold multi-node step from a fresh shared store and a step whose
# producer node crashes mid-pull. bench/rehearsal.sh runs the same at 80 nodes and times it; here only
# what must hold at any N is asserted: one download per blob, every rank in the image, one container per
# node shared by its ranks, and a takeover that completes the image for the surviving nodes.

load helpers

setup_file() {
  SCALE_DIR=$(mktemp -d /tmp/gantry-scale.XXXXXX)
  chmod 755 "$SCALE_DIR"
  export SCALE_DIR
  export SCALE_NODES=${GANTRY_TEST_SCALE_NODES:-10}
  export SCALE_TASKS=${GANTRY_TEST_SCALE_TASKS:-4}
  local t0
  t0=$(date +%s%N)
  # stdio off bats' fd 3: the daemons must not hold it (bats waits for every holder to close it).
  GANTRY_HARNESS_DIR=$SCALE_DIR GANTRY_PLUGSTACK_ARGS=config=$SCALE_DIR/gantry.conf \
    "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" start --nodes "$SCALE_NODES" 3>&-
  echo "# $SCALE_NODES-node cluster started in $((($(date +%s%N) - t0) / 1000000)) ms" >&3
}

teardown_file() {
  GANTRY_HARNESS_DIR=$SCALE_DIR "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" stop 3>&- || true
  rm -rf "$SCALE_DIR"
}

setup() {
  # The registry and images of the CTest harness; then this file's own cluster (its slurm.env points
  # GANTRY_HARNESS_DIR, SLURM_CONF and the node addresses at $SCALE_DIR).
  gantry_load_env registry images
  # shellcheck disable=SC1091
  . "$SCALE_DIR/slurm.env"
  gantry_cluster_registry
  U=$GANTRY_TEST_USER
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/scale.XXXXXX")
  chmod 755 "$WORK"
  # A fresh shared store per test: every step here starts cold.
  STORE=$WORK/store
  install -d -m 1777 "$STORE"
  printf 'store_path = %s\ninsecure_registries = %s\nimport_messages = 0\n' "$STORE" "$REG" >"$SCALE_DIR/gantry.conf"
  CRASHED_NODE=
  # shellcheck disable=SC2034 # read by shape_link/unshape_link (helpers.bash)
  SHAPED_DEV=
}

teardown() {
  unshape_link
  if [ -n "$CRASHED_NODE" ]; then
    local since=${NODE_STARTED_AT:-$(date +%s)}
    "$GANTRY_SLURM_HARNESS" start-node "$CRASHED_NODE" 3>&- || true
    scontrol update nodename="$CRASHED_NODE" state=resume 2>/dev/null || true
    gantry_nodes_restored "$CRASHED_NODE" "$since" 3>&-
  fi
  rm -rf "$WORK"
}

as_user() { runuser -u "$U" -- env -C "$WORK" "$@"; }

# What each rank reports: its node, its mount and user namespaces, the image it runs and whether the
# image's own file is what it sees at /work/README.
RANK_CMD='m=host; [ "$(cat /work/README 2>/dev/null)" = "tiny work dir" ] && m=image
echo "ran $SLURMD_NODENAME $(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/user) ${GANTRY_CONTAINER_IMAGE_DIGEST:-none} $m"'

# image_blobs NAME: the config and layer digests of gantry-test/NAME in the harness registry.
image_blobs() {
  curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$1/manifests/latest" |
    jq -r '.config.digest, .layers[].digest'
}

# blob_gets DIGEST: GETs of one blob in the open registry's access log.
blob_gets() { "$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$1"; }

@test "a cold multi-node step: one GET per blob, every rank in the image, one container per node" {
  local name digest blobs b n ranks node ns node_ns
  name="scale-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  blobs=$(image_blobs "$name")
  declare -A gets_before
  for b in $blobs; do gets_before[$b]=$(blob_gets "$b"); done

  run as_user timeout 300 srun -N"$SCALE_NODES" --ntasks-per-node="$SCALE_TASKS" \
    --container-image="$REG#gantry-test/$name" sh -c "$RANK_CMD"
  echo "$output"
  [ "$status" -eq 0 ]
  ranks=$(echo "$output" | grep '^ran ')
  # Every rank ran, in the image (its digest, its file), and the nodes are the whole cluster.
  [ "$(echo "$ranks" | wc -l)" -eq $((SCALE_NODES * SCALE_TASKS)) ]
  [ "$(echo "$ranks" | awk -v d="$digest" '$5 == d && $6 == "image"' | wc -l)" -eq $((SCALE_NODES * SCALE_TASKS)) ]
  [ "$(echo "$ranks" | awk '{print $2}' | sort -u | wc -l)" -eq "$SCALE_NODES" ]
  # Each blob crossed the network once for the whole cluster (one producer, the others waited).
  n=0
  for b in $blobs; do
    echo "GETs of $b: $(($(blob_gets "$b") - ${gets_before[$b]}))"
    [ "$(($(blob_gets "$b") - ${gets_before[$b]}))" -eq 1 ]
    n=$((n + 1))
  done
  echo "# cold step on $SCALE_NODES nodes: $n blob GETs for $n blobs" >&3
  # One container per node: its ranks share one mount and one user namespace, not the node's own.
  # (Namespace inode numbers are reused once a container has gone, so two nodes whose containers did
  # not overlap in time may show the same number: only the per-node view is checked.)
  [ "$(echo "$ranks" | awk '{print $2, $3, $4}' | sort -u | wc -l)" -eq "$SCALE_NODES" ]
  for node in $GANTRY_TEST_NODES; do
    ns=$(echo "$ranks" | awk -v n="$node" '$2 == n {print $3}' | sort -u)
    node_ns=$("$GANTRY_SLURM_HARNESS" exec "$node" -- readlink /proc/self/ns/mnt 3>&-)
    [ -n "$ns" ]
    [ "$ns" != "$node_ns" ]
  done
}

@test "the producer node crashes mid-pull at scale: another takes over, the rest run, GETs bounded" {
  local name digest hex blobs b n partial holder t0 t_crash t_image i new_holder ranks total=0
  name="scalecrash-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name" 12000000)
  hex=${digest#sha256:}
  blobs=$(image_blobs "$name")
  declare -A gets_before
  for b in $blobs; do gets_before[$b]=$(blob_gets "$b"); done

  # 20 Mbit/s towards the nodes: the 12 MB layer takes ~5 s, long enough to crash its producer
  # mid-download. --no-kill: the step goes on on the surviving nodes after the controller has declared
  # the crashed one dead.
  shape_link 20mbit
  t0=$(date +%s%N)
  as_user timeout 300 srun --no-kill -N"$SCALE_NODES" --ntasks-per-node="$SCALE_TASKS" \
    --container-image="$REG#gantry-test/$name" sh -c "$RANK_CMD" >"$WORK/crash.out" 2>&1 3>&- &
  srun_pid=$!
  for ((i = 0; i < 600; i++)); do
    partial=$(find "$STORE/staging/$hex/blobs" -name '*.partial' -size +2000k 2>/dev/null | head -1)
    [ -n "$partial" ] && break
    sleep 0.1
  done
  [ -n "$partial" ]
  # The store's lock file names its producer as HOST:PID on its first line.
  holder=$(head -n1 "$STORE/locks/$hex.lock")
  CRASHED_NODE=${holder%%:*}
  echo "producer $holder, $(stat -c %s "$partial") bytes: crashing $CRASHED_NODE"
  "$GANTRY_SLURM_HARNESS" crash-node "$CRASHED_NODE" 3>&-
  t_crash=$(date +%s%N)
  new_holder=
  for ((i = 0; i < 1200; i++)); do
    [ -n "$new_holder" ] || { new_holder=$(head -n1 "$STORE/locks/$hex.lock" 2>/dev/null || true); [ "$new_holder" != "$holder" ] || new_holder=; }
    gantry_image_stored "$STORE" "$hex" && break
    sleep 0.1
  done
  t_image=$(date +%s%N)
  unshape_link
  status=0
  wait "$srun_pid" || status=$?
  cat "$WORK/crash.out"
  echo "# producer $CRASHED_NODE crashed $(((t_crash - t0) / 1000000)) ms into the step; ${new_holder%%:*} took over, image published $(((t_image - t_crash) / 1000000)) ms after the crash; srun exit $status" >&3
  [ "$status" -ne 124 ]
  # Another node took the lock and published the image.
  [ -n "$new_holder" ]
  [ "${new_holder%%:*}" != "$CRASHED_NODE" ]
  gantry_image_stored "$STORE" "$hex"
  # Every rank on the surviving nodes ran in the image; none on the crashed node.
  ranks=$(grep '^ran ' "$WORK/crash.out" || true)
  [ "$(echo "$ranks" | awk -v d="$digest" '$5 == d && $6 == "image"' | wc -l)" -eq $(((SCALE_NODES - 1) * SCALE_TASKS)) ]
  [ "$(echo "$ranks" | awk -v n="$CRASHED_NODE" '$2 == n' | wc -l)" -eq 0 ]
  # No blob crossed the network more than twice: the crashed producer's part and the resumed rest.
  for b in $blobs; do
    n=$(($(blob_gets "$b") - ${gets_before[$b]}))
    total=$((total + n))
    echo "GETs of $b: $n"
    [ "$n" -le 2 ]
  done
  echo "# blob GETs in the crashed step: $total for $(echo "$blobs" | wc -l) blobs" >&3
  # Nobody holds the producer lock afterwards.
  flock -n "$STORE/locks/$hex.lock" true

  # The node boots again and the whole cluster runs a step from the stored image.
  NODE_STARTED_AT=$(date +%s)
  "$GANTRY_SLURM_HARNESS" start-node "$CRASHED_NODE" 3>&-
  for ((i = 0; i < 120; i++)); do
    [ "$(sinfo -h -N -n "$CRASHED_NODE" -o %t | head -1)" = idle ] && break
    sleep 0.5
  done
  [ "$(sinfo -h -N -n "$CRASHED_NODE" -o %t | head -1)" = idle ] || scontrol update nodename="$CRASHED_NODE" state=resume
  gantry_nodes_restored "$CRASHED_NODE" "$NODE_STARTED_AT"
  CRASHED_NODE=
  run as_user timeout 300 srun -N"$SCALE_NODES" --ntasks-per-node="$SCALE_TASKS" \
    --container-image="$REG#gantry-test/$name" sh -c "$RANK_CMD"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | awk -v d="$digest" '$1 == "ran" && $5 == d' | wc -l)" -eq $((SCALE_NODES * SCALE_TASKS)) ]
}
