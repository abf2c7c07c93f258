#!/usr/bin/env bash
# bench/srun: the latency a container adds to a Slurm step, side by side in one run:
#   srun -N3 -n12 --container-image=<cached image> true   vs   srun -N3 -n12 true
# and the cold start (image not yet in the store) with the number of registry blob requests.
# Run as root with the harness up (tests/harness/registry.sh start; tests/images/build.sh [--big];
# tests/harness/slurm.sh start). Usage: bench/srun.sh [IMAGE] [RUNS]   (IMAGE default gantry-test/tiny)
# LAYERED=1 measures more in the same run (issue #19: the image stored as layers, a store of its own,
# each node stacking the layers with overlayfs): plain srun, the whole image, the layered image and
# the layered image with fuse_shared = no, one run of each in turn; then a cold layered start.
#
# bench/srun.sh --breakdown [IMAGE] [RUNS]: where a warm containerized step's added time goes, per
# phase and per process, from trace points (include/gantry/trace.hpp; plugstack.conf's trace=, which
# this adds to the harness's plugstack.conf for the run and removes after). Scenarios, one run of each
# in turn (RUNS rounds, default 5), all `srun -N1 -n2 true` as the user on one node: plain srun; the
# open store (1777, pulled as the user, fuse) whole and layered; the trusted store (store_owner, kernel
# loop mounts) whole and layered; each as a new job and as a step inside an existing job (salloc).
# Medians of each phase; bench/breakdown.py reads the traces (kept in $GANTRY_HARNESS_DIR/breakdown).
set -euo pipefail
harness=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}
# shellcheck disable=SC1091
. "$harness/registry.env"; . "$harness/slurm.env"
breakdown=0
if [ "${1:-}" = --breakdown ]; then breakdown=1; shift; fi
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

if [ "$breakdown" = 1 ]; then
  runs=${2:-5}
  out=$harness/breakdown
  rm -rf "$out"
  mkdir -p "$out"
  # The trace file: every srun (the user) and slurmstepd (root) appends to it; made here, never by them.
  trace=$out/trace
  install -m 0666 /dev/null "$trace"
  plugstack=$(scontrol show config | sed -n "s/^PlugStackConfig *= *//p")
  cp "$plugstack" "$out/plugstack.conf.orig"
  restore() {
    cp "$out/plugstack.conf.orig" "$plugstack"
    [ -z "${alloc:-}" ] || scancel "$alloc" 2>/dev/null || true
  }
  trap restore EXIT
  # One plugstack.conf per build measured: the harness's own, or BREAKDOWN_BUILDS="LABEL=DIR ..."
  # (DIR holding spank_gantry.so, gantry, gantry-holder, gantry-imagefs and gantry-entry, e.g. copies of
  # two builds), run in turn in each round, so that both meet the same load.
  builds=()
  if [ -n "${BREAKDOWN_BUILDS:-}" ]; then
    for b in $BREAKDOWN_BUILDS; do
      label=${b%%=*} dir=${b#*=}
      sed "s|^required [^ ]*spank_gantry.so\(.*\)|required $dir/spank_gantry.so\1 gantry=$dir/gantry trace=$trace|" \
        "$out/plugstack.conf.orig" >"$out/plugstack.$label"
      builds+=("$label")
    done
  else
    sed "s|^required .*spank_gantry.so.*|& trace=$trace|" "$out/plugstack.conf.orig" >"$out/plugstack.this"
    builds=(this)
  fi
  cp "$out/plugstack.${builds[0]}" "$plugstack"
  read -r -a nodes <<<"$GANTRY_TEST_NODES"
  newnode=${nodes[0]}
  jobnode=${nodes[1]:-${nodes[0]}}
  owner=gantry-store
  id -u "$owner" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$owner"
  # Stores of the bench's own: open ones (any user writes) in the FSx stand-in, trusted ones below
  # /var/lib (root-owned ancestors, as the kernel backend's path check demands).
  ostore=$GANTRY_TEST_FSX/store-breakdown
  tstore=/var/lib/gantry-breakdown-store
  rm -rf "$ostore" "$tstore"
  install -d -m 1777 "$ostore"
  for d in "" images refs used locks staging; do install -d -o "$owner" -g "$owner" -m 0755 "$tstore/$d"; done
  conf_of() {
    case $1 in
      open-whole) printf 'store_path = %s\ninsecure_registries = %s\nlayered_images = no\n' "$ostore/whole" "$reg" ;;
      open-layered) printf 'store_path = %s\ninsecure_registries = %s\nlayered_images = yes\n' "$ostore/layered" "$reg" ;;
      trusted-whole) printf 'store_path = %s\nstore_owner = %s\ninsecure_registries = %s\nlayered_images = no\n' "$tstore" "$owner" "$reg" ;;
      trusted-layered) printf 'store_path = %s\nstore_owner = %s\ninsecure_registries = %s\nlayered_images = yes\n' "$tstore" "$owner" "$reg" ;;
      *) printf 'store_path = %s\ninsecure_registries = %s\n' "$ostore/whole" "$reg" ;;
    esac
  }
  install -d -m 1777 "$ostore/whole" "$ostore/layered"
  # BREAKDOWN_STORES="open-whole trusted-whole" measures only those (a quicker look at one change).
  read -r -a stores <<<"${BREAKDOWN_STORES:-open-whole open-layered trusted-whole trusted-layered}"
  # A step inside an existing job: an allocation on its own node, held for the whole bench.
  granted=$(as_user salloc -N1 -n2 -w "$jobnode" --no-shell -t 60 2>&1) || true
  alloc=$(sed -n "s/.*Granted job allocation \([0-9]*\).*/\1/p" <<<"$granted")
  [ -n "$alloc" ] || { echo "bench/srun: salloc gave no allocation: $granted" >&2; exit 1; }
  # Warm: each store holds the image, each node's mounts and servers as a warm step finds them.
  for b in "${builds[@]}"; do
    cp "$out/plugstack.$b" "$plugstack"
    for st in "${stores[@]}"; do
      conf_of "$st" >"$harness/gantry.conf"
      as_user srun -N1 -n2 -w "$newnode" --container-image="$reg#$image" true
      as_user srun --jobid="$alloc" -N1 -n2 --container-image="$reg#$image" true
    done
  done
  scenarios=()
  for b in "${builds[@]}"; do
    for mode in new job; do
      scenarios+=("$b/$mode:plain")
      for st in "${stores[@]}"; do scenarios+=("$b/$mode:$st"); done
    done
  done
  printf '%s\n' "${scenarios[@]}" >"$out/scenarios"
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  for r in $(seq "$runs"); do
    for sc in "${scenarios[@]}"; do
      b=${sc%%/*} mode=${sc#*/} st=${sc#*:}
      mode=${mode%%:*}
      mkdir -p "$out/$sc"
      cp "$out/plugstack.$b" "$plugstack"
      conf_of "$st" >"$harness/gantry.conf"
      args=(-N1 -n2 -w "$newnode")
      [ "$mode" = new ] || args=(--jobid="$alloc" -N1 -n2)
      [ "$st" = plain ] || args+=(--container-image="$reg#$image")
      : >"$trace"
      t0=$(now)
      as_user srun "${args[@]}" true >/dev/null
      echo $(( ($(now) - t0) / 1000000 )) >"$out/$sc/$r.wall"
      cp "$trace" "$out/$sc/$r.trace"
    done
  done
  echo "bench/srun --breakdown: image $reg/$image, $runs rounds, srun -N1 -n2 true; new jobs on $newnode, steps of job $alloc on $jobnode"
  echo "load average before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 "$here/bench/breakdown.py" "$out"
  exit 0
fi

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
