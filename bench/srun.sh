#!/usr/bin/env bash
# bench/srun: the latency a container adds to a Slurm step, side by side in one run:
#   srun -N3 -n12 --container-image=<cached image> true   vs   srun -N3 -n12 true
# and the cold start (image not yet in the store) with the number of registry blob requests.
# Run as root with the harness up (tests/harness/registry.sh start; tests/images/build.sh [--big];
# tests/harness/slurm.sh start). Usage: bench/srun.sh [IMAGE] [RUNS]   (IMAGE default gantry-test/tiny)
# LAYERED=1 measures more in the same run (issue #19: the image stored as layers, a store of its own,
# each node stacking the layers with overlayfs): plain srun, the whole image, the layered image and
# the layered image with fuse_shared = no, one run of each in turn; then a cold layered start.
set -euo pipefail
harness=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}
# shellcheck disable=SC1091
. "$harness/registry.env"; . "$harness/slurm.env"
image=${1:-gantry-test/tiny}
runs=${2:-10}
# The nodes reach the open registry over the cluster's bridge (tests/harness/slurm.sh start must have
# been given GANTRY_PLUGSTACK_ARGS=config=$GANTRY_HARNESS_DIR/gantry.conf, which this script writes).
reg=$GANTRY_TEST_LOGIN_ADDR:${GANTRY_TEST_REGISTRY_HTTP##*:}
here=$(cd "$(dirname "$0")/.." && pwd)
store=$GANTRY_TEST_FSX/store
install -d -m 1777 "$store"
# The image stored whole (Enroot's form, as before issue #19); LAYERED=1 adds the default, layers.
printf 'store_path = %s\ninsecure_registries = %s\nlayered_images = no\n' "$store" "$reg" > "$harness/gantry.conf"
as_user() { runuser -u "$GANTRY_TEST_USER" -- env -C "$GANTRY_TEST_FSX" "$@"; }
now() { date +%s%N; }

median() { sort -n | awk '{a[NR]=$1} END {printf "%d\n", (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

time_runs() {
  local t0
  for _ in $(seq "$runs"); do
    t0=$(now); "$@" > /dev/null; echo $(( ($(now) - t0) / 1000000 ))
  done
}

echo "bench/srun: $runs runs each, image $reg/$image, nodes: $GANTRY_TEST_NODES"
as_user srun -N3 -n12 --container-image="$reg#$image" true  # make sure it is cached
plain=$(time_runs as_user srun -N3 -n12 true | median)
cont=$(time_runs as_user srun -N3 -n12 --container-image="$reg#$image" true | median)
printf '%-52s %8s ms\n' "srun -N3 -n12 true (median)" "$plain"
printf '%-52s %8s ms\n' "srun -N3 -n12 --container-image=... true (median)" "$cont"
printf '%-52s %8s ms (target < 150)\n' "added per step" "$((cont - plain))"
printf 'ratio container/plain: %.2fx\n' "$(echo "$cont / $plain" | bc -l)"
if [ "${LAYERED:-0}" = 1 ]; then
  lstore=$GANTRY_TEST_FSX/store-layered
  rm -rf "$lstore"
  install -d -m 1777 "$lstore"
  printf 'store_path = %s\ninsecure_registries = %s\nlayered_images = yes\n' "$lstore" "$reg" > "$harness/gantry.conf"
  as_user srun -N3 -n12 --container-image="$reg#$image" true
  nlayers=$(find "$lstore/images" -name 'layer-*.sqsh' | wc -l)
  # Interleaved, one run of each in turn, so that a change of the machine's load hits all alike:
  # plain srun, the whole image, the layered one (its stack from the job's shared image server), and
  # the layered one with fuse_shared = no (each container its own daemon per layer).
  conf() { printf 'store_path = %s\ninsecure_registries = %s\n%s' "$1" "$reg" "$2" > "$harness/gantry.conf"; }
  : >"$harness/bench-p" && : >"$harness/bench-w" && : >"$harness/bench-l" && : >"$harness/bench-lp"
  for _ in $(seq "$runs"); do
    runs=1 time_runs as_user srun -N3 -n12 true >>"$harness/bench-p"
    conf "$store" $'layered_images = no\n'
    runs=1 time_runs as_user srun -N3 -n12 --container-image="$reg#$image" true >>"$harness/bench-w"
    conf "$lstore" $'layered_images = yes\n'
    runs=1 time_runs as_user srun -N3 -n12 --container-image="$reg#$image" true >>"$harness/bench-l"
    conf "$lstore" $'layered_images = yes\nfuse_shared = no\n'
    runs=1 time_runs as_user srun -N3 -n12 --container-image="$reg#$image" true >>"$harness/bench-lp"
  done
  conf "$lstore" $'layered_images = yes\n'
  plain2=$(median <"$harness/bench-p") whole2=$(median <"$harness/bench-w")
  lcont=$(median <"$harness/bench-l") lpriv=$(median <"$harness/bench-lp")
  printf '%-52s %8s ms\n' "interleaved: srun -N3 -n12 true" "$plain2"
  printf '%-52s %8s ms (+%s)\n' "... --container-image, whole" "$whole2" "$((whole2 - plain2))"
  printf '%-52s %8s ms (+%s)\n' "... --container-image, layered ($nlayers layers)" "$lcont" "$((lcont - plain2))"
  printf '%-52s %8s ms (+%s)\n' "... layered, fuse_shared = no" "$lpriv" "$((lpriv - plain2))"
  printf 'layered per-step overhead minus the whole image'"'"'s: %s ms (target: within +150)\n' "$((lcont - whole2))"
  # Cold, layered: a store of its own, emptied; one GET per blob for the three nodes.
  rm -rf "$lstore"
  install -d -m 1777 "$lstore"
  before=$(grep -c '"GET /v2/.*/blobs/' "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true)
  t0=$(now)
  as_user srun -N3 -n12 --container-image="$reg#$image" true
  lcold=$(( ($(now) - t0) / 1000000 ))
  after=$(grep -c '"GET /v2/.*/blobs/' "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true)
  printf '%-52s %8s ms, %d blob GETs for %d layers and the config\n' "cold start, layered (3 nodes)" "$lcold" \
    "$((after - before))" "$nlayers"
  # Back to whole images for the cold start below.
  printf 'store_path = %s\ninsecure_registries = %s\n' "$store" "$reg" > "$harness/gantry.conf"
fi

# Cold start: the image removed from the store first, then pulled by the step, with the registry's
# blob GETs counted over the whole step (3 nodes: one pull for the cluster).
digest=$(curl -fsS -o /dev/null -w '%header{docker-content-digest}' \
  -H 'Accept: application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json' \
  "http://$GANTRY_TEST_REGISTRY_HTTP/v2/$image/manifests/latest")
# As the user whose pulls filled it: root does not modify a store every user may write (docs/store.md).
as_user "$here/build/runtime/gantry" rm --store "$store" "$digest" > /dev/null 2>&1 || true
before=$(grep -c '"GET /v2/.*/blobs/' "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true)
t0=$(now)
as_user srun -N3 -n12 --container-image="$reg#$image" true
cold=$(( ($(now) - t0) / 1000000 ))
after=$(grep -c '"GET /v2/.*/blobs/' "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true)
layers=$(curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json' \
  "http://$GANTRY_TEST_REGISTRY_HTTP/v2/$image/manifests/latest" | jq '.layers | length')
printf '%-52s %8s ms, %d blob GETs for %d blobs (config + %d layers)\n' "cold start (3 nodes)" "$cold" \
  "$((after - before))" "$((layers + 1))" "$layers"
