#!/usr/bin/env bash
# bench/rehearsal: the seed's scale, rehearsed on one machine (issue #16). An N-node harness cluster
# (one slurmd per network namespace, tests/harness/slurm.sh) runs, side by side in one run:
#   baseline   srun -N$N -n$((N*T)) true                                  (no container)
#   cold       srun -N$N --ntasks-per-node=$T --container-image=IMAGE ... (fresh, empty shared store)
#   warm       the same step again (image in the store)
#   takeover   a cold step on another fresh store whose producer node is crashed mid-pull
# and prints wall times, the ratios to the baseline, per-node container start p50/p99, the registry's
# blob GETs against the image's blob count, and how long the takeover took. The container steps run
# with start-up telemetry on (gantry.conf telemetry_dir, issue #37): `gantry stats` of the cold and
# warm steps is printed beside the bench's own per-node start.
#
#   bench/rehearsal.sh [N] [TASKS_PER_NODE]      defaults 80 and 8; run as root
#
# It starts what is missing in $GANTRY_HARNESS_DIR (default /tmp/gantry-rehearsal): the registries,
# the image (tests/images/build.sh --only, cached) and an N-node cluster loading $GANTRY_BUILD_DIR's
# plugin (default ./build); REHEARSAL_KEEP=1 leaves the cluster (and registries it started) running afterwards. Hold the machine's
# integration-test lock around it (flock /tmp/gantry-itest.lock bench/rehearsal.sh).
# Settings: REHEARSAL_IMAGE (default debian, a test image name), REHEARSAL_RUNS (baseline and warm
# repetitions, default 3), REHEARSAL_RATE (the host link's rate during the takeover, default 40mbit,
# so that the crash lands mid-download), REHEARSAL_STORE: `open` (default: a 1777 store every user
# fills, images served by squashfuse_ll per container) or `trusted` (owned by the system account
# gantry-store, named as store_owner: pulls run as that account, the kernel backend loop-mounts each
# image once per node; docs/store.md, "Trusted shared store").
#
# Per-node container start: every rank's command prints `date +%s%N` first thing; a node's start is
# its earliest rank's stamp minus the moment srun was started on the login node. That covers the
# allocation, the launch fan-out, the pull (cold) and the container set-up. The same command without a
# container gives the baseline's per-node start. Exits 1 if a check fails (blob GETs not equal to the
# blob count on the cold step, more than one manifest request per warm step, a rank outside the image,
# a takeover that does not complete, a container step without one complete telemetry record per node).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# Before lib.sh, which defaults it to the shared /tmp/gantry-harness.
export GANTRY_HARNESS_DIR=${GANTRY_HARNESS_DIR:-/tmp/gantry-rehearsal}
# shellcheck source=../tests/harness/lib.sh
. "$here/tests/harness/lib.sh"

N=${1:-80}
T=${2:-8}
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 2 ] && [ "$N" -le 200 ] || gantry_die "rehearsal: N must be a number from 2 to 200, got '$N'"
[[ $T =~ ^[0-9]+$ ]] && [ "$T" -ge 1 ] && [ "$T" -le 32 ] || gantry_die "rehearsal: TASKS_PER_NODE must be a number from 1 to 32, got '$T'"
gantry_require_root "bench/rehearsal.sh (it starts the Slurm harness)"
image_name=${REHEARSAL_IMAGE:-debian}
runs=${REHEARSAL_RUNS:-3}
rate=${REHEARSAL_RATE:-40mbit}
store_kind=${REHEARSAL_STORE:-open}
case $store_kind in open | trusted) ;; *) gantry_die "rehearsal: REHEARSAL_STORE must be open or trusted, got '$store_kind'" ;; esac
owner=gantry-store
export GANTRY_BUILD_DIR=${GANTRY_BUILD_DIR:-$here/build}
export GANTRY_SOURCE_DIR=$here
export GANTRY_PLUGSTACK_ARGS=config=$GANTRY_HARNESS_DIR/gantry.conf
H=$GANTRY_HARNESS_DIR
[ -f "$GANTRY_BUILD_DIR/plugin/spank_gantry.so" ] ||
  gantry_die "rehearsal: $GANTRY_BUILD_DIR/plugin/spank_gantry.so not found; build first (cmake --build build) or set GANTRY_BUILD_DIR"
mkdir -p "$H"
chmod 755 "$H"

# --- the harness: registries, the image, the cluster -------------------------------------------------
t0=$(date +%s%N)
# Registries this run starts are stopped again at the end; ones already running are left alone.
registry_was_up=0
"$here/tests/harness/registry.sh" status >/dev/null 2>&1 && registry_was_up=1
"$here/tests/harness/registry.sh" start >/dev/null
"$here/tests/images/build.sh" --only "$image_name" >/dev/null
t1=$(date +%s%N)
"$here/tests/harness/slurm.sh" start --nodes "$N" >/dev/null
t2=$(date +%s%N)
# shellcheck disable=SC1091
. "$H/registry.env"
# shellcheck disable=SC1091
. "$H/slurm.env"
[ "$GANTRY_TEST_NODE_COUNT" -eq "$N" ] || gantry_die "rehearsal: the cluster in $H has $GANTRY_TEST_NODE_COUNT nodes, not $N"
reg=$GANTRY_TEST_LOGIN_ADDR:${GANTRY_TEST_REGISTRY_HTTP##*:}
image="$reg#gantry-test/$image_name"
log=$GANTRY_TEST_REGISTRY_HTTP_LOG
work=$(mktemp -d "$GANTRY_TEST_FSX/rehearsal.XXXXXX")
# Trusted stores live below /var/lib: the kernel backend wants every directory above an image owned
# by root or the store account and not writable by others (the harness dir need not be).
tstores=/var/lib/gantry-rehearsal.$$
chmod 755 "$work"
# Start-up telemetry: root-owned, writable by nobody else (the nodes refuse any other directory).
tdir=$work/telemetry
install -d -o root -g root -m 0755 "$tdir"
gantry_cli=$GANTRY_BUILD_DIR/runtime/gantry
shaped=
crashed=
cleanup() {
  [ -z "$shaped" ] || tc qdisc del dev "$shaped" root 2>/dev/null || true
  if [ -n "$crashed" ]; then
    "$GANTRY_SLURM_HARNESS" start-node "$crashed" >/dev/null 2>&1 || true
    scontrol update nodename="$crashed" state=resume 2>/dev/null || true
  fi
  release_kernel_mounts
  if [ "${REHEARSAL_KEEP:-0}" != 1 ]; then
    "$here/tests/harness/slurm.sh" stop >/dev/null 2>&1 || true
    [ "$registry_was_up" = 1 ] || "$here/tests/harness/registry.sh" stop >/dev/null 2>&1 || true
  fi
  rm -rf "$work" "$tstores"
}

# release_kernel_mounts: the trusted stores' node-wide image mounts (kernel backend), unmounted in
# every node's mount namespace, and their loop devices detached.
release_kernel_mounts() {
  local node f
  [ "$store_kind" = trusted ] && [ -d "$tstores" ] || return 0
  for node in $GANTRY_TEST_NODES; do
    "$GANTRY_SLURM_HARNESS" exec "$node" -- sh -c 'grep -o " /run/gantry/images/[^ ]*" /proc/self/mountinfo | while read -r m; do umount -l "$m"; done' 2>/dev/null || true
  done
  for f in "$tstores"/*/images/*.sqsh; do
    [ -e "$f" ] || continue
    losetup -j "$f" | cut -d: -f1 | while read -r l; do losetup -d "$l" 2>/dev/null || true; done
  done
}
trap cleanup EXIT

manifest=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$image_name/manifests/latest")
digest=$(curl -fsS -o /dev/null -w '%header{docker-content-digest}' -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
  "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$image_name/manifests/latest")
hex=${digest#sha256:}
mapfile -t blobs < <(jq -r '.config.digest, .layers[].digest' <<<"$manifest")
nblobs=${#blobs[@]}
blob_bytes=$(jq '[.config.size, .layers[].size] | add' <<<"$manifest")
failed=0
check() { # check WHAT CONDITION...: prints FAIL and remembers it when the condition is false.
  local what=$1
  shift
  if "$@"; then echo "  ok: $what"; else echo "  FAIL: $what"; failed=1; fi
}

# gets: blob GETs of this image's blobs in the registry's log so far.
gets() {
  local b n=0
  for b in "${blobs[@]}"; do n=$((n + $(gantry_registry_blob_gets "$log" "$b"))); done
  echo "$n"
}

# manifests: manifest requests (GET and HEAD) for the image in the registry's log so far. With the
# default pull_policy=always srun resolves the tag once per step and hands the digest to every node
# (issue #36): one request per warm step, whatever N (a trusted store: while the nodes remember the
# registry's yes, authorization_cache_seconds).
manifests() { grep -cE "\"(GET|HEAD) /v2/gantry-test/$image_name/manifests/" "$log" || true; }

# fresh_store NAME: a new, empty shared store for the next steps (the plugin rereads gantry.conf on
# every step). Images are stored whole (layered_images = no): the takeover below watches the
# producer's staging/<hex>/blobs and waits for images/<hex>.sqsh.
fresh_store() {
  local d
  if [ "$store_kind" = open ]; then
    store=$work/store-$1
    install -d -m 1777 "$store"
    printf 'store_path = %s\ninsecure_registries = %s\nimport_messages = 0\nlayered_images = no\ntelemetry_dir = %s\n' "$store" "$reg" "$tdir" >"$H/gantry.conf"
  else
    id -u "$owner" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$owner"
    store=$tstores/store-$1
    install -d -m 0755 "$tstores"
    for d in "" images refs used locks staging; do install -d -o "$owner" -g "$owner" -m 0755 "$store/$d"; done
    printf 'store_path = %s\nstore_owner = %s\ninsecure_registries = %s\nimport_messages = 0\nlayered_images = no\ntelemetry_dir = %s\n' "$store" "$owner" "$reg" "$tdir" >"$H/gantry.conf"
  fi
}

as_user() { runuser -u "$GANTRY_TEST_USER" -- env -C "$work" "$@"; }
# The rank's command: a time stamp first, then who it is and which image it runs in.
stamp_cmd=(sh -c 'echo "$(date +%s%N) $SLURMD_NODENAME ${GANTRY_CONTAINER_IMAGE_DIGEST:-host}"')

# settle: wait (up to 60 s) until no node is still completing the previous step, so that no step of
# the rehearsal waits in the queue for the one before.
settle() {
  local i
  for ((i = 0; i < 300; i++)); do
    [ -z "$(sinfo -h -N -o %t | grep -Ev '^idle$')" ] && return 0
    sleep 0.2
  done
}

# step OUT SRUN_ARGS...: one srun of the stamp command, its output in OUT; sets WALL_MS and LAUNCH_NS.
step() {
  local out=$1
  shift
  settle
  LAUNCH_NS=$(date +%s%N)
  as_user timeout 900 srun "$@" "${stamp_cmd[@]}" >"$out" 2>"$out.err" || { echo "  srun $* failed: $(tail -3 "$out.err" | tr '\n' ' ')"; failed=1; }
  WALL_MS=$((($(date +%s%N) - LAUNCH_NS) / 1000000))
}

# newest_job: the job of the newest telemetry record (the step just run), after waiting (up to 20 s)
# for the nodes that write theirs as srun returns.
newest_job() {
  local i before=${1:-0} j
  for ((i = 0; i < 100; i++)); do
    j=$(find "$tdir" -name '*.json' -printf '%f\n' | cut -d. -f1 | sort -n | tail -1)
    [ -n "$j" ] && [ "$j" != "$before" ] && [ "$(find "$tdir" -name "$j.0.*.json" | wc -l)" -ge "$N" ] && break
    sleep 0.2
  done
  echo "${j:-none}"
}

# telemetry JOB: how many of JOB's records (step 0) have every phase; `gantry stats`'s p50 and p99 of
# its since-srun phase (srun's start to a node's first exec: the bench's per-node start, measured by
# the nodes) and of the node's own total (set-up start to first exec).
complete_records() {
  cat "$tdir/$1".0.*.json 2>/dev/null |
    jq -s '[.[] | select([.resolve_ms, .pull_ms, .mount_ms, .exec_ms, .total_ms, .since_srun_ms] | all(type == "number"))] | length'
}
# stats_row LABEL JOB PHASE: a row of LABEL, then p50 and p99 of PHASE as `gantry stats JOB` prints them.
stats_row() {
  local p50 p99
  read -r p50 p99 < <("$gantry_cli" stats --dir "$tdir" "$2" | awk -v ph="$3" '{ line = $0; sub(/^  /, "", line) }
    index(line, ph " ") == 1 { n = split(line, f, / +/); print f[n - 2], f[n - 1]; exit }') || true
  printf '%-58s %10s %10s\n' "$1" "${p50:--}" "${p99:--}"
}

# node_starts OUT LAUNCH_NS: per node, its earliest rank's stamp minus LAUNCH_NS, in ms, one a line.
node_starts() {
  awk -v t0="$2" 'NF >= 2 && $1 ~ /^[0-9]+$/ { if (!($2 in m) || $1 < m[$2]) m[$2] = $1 }
    END { for (n in m) printf "%d\n", (m[n] - t0) / 1000000 }' "$1"
}

# pct P: the P-th percentile (nearest rank) of the numbers on stdin.
pct() { sort -n | awk -v p="$1" '{a[NR] = $1} END { if (!NR) { print "-"; exit } i = int((p * NR + 99) / 100); if (i < 1) i = 1; print a[i] }'; }
median() { pct 50; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

echo "bench/rehearsal: N=$N nodes x $T tasks = $((N * T)) ranks; image $image ($nblobs blobs, $((blob_bytes / 1048576)) MiB compressed); $store_kind store"
echo "  harness: registry+image $(((t1 - t0) / 1000000)) ms, $N-node cluster start $(((t2 - t1) / 1000000)) ms; slurmd RSS total $(ps -o rss= -C slurmd | awk '{s += $1} END {printf "%d MiB", s / 1024}')"
echo "  machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%d GiB", $2 / 1048576}' /proc/meminfo), $(uname -r)"

# --- baseline ----------------------------------------------------------------------------------------
true_ms=()
for ((i = 0; i < runs; i++)); do
  settle
  t=$(date +%s%N)
  as_user srun -N"$N" -n$((N * T)) true || { echo "  FAIL: srun -N$N -n$((N * T)) true"; failed=1; }
  true_ms+=($((($(date +%s%N) - t) / 1000000)))
done
base_true=$(printf '%s\n' "${true_ms[@]}" | median)
base_wall=()
for ((i = 0; i < runs; i++)); do
  step "$work/base.$i" -N"$N" --ntasks-per-node="$T"
  base_wall+=("$WALL_MS")
  node_starts "$work/base.$i" "$LAUNCH_NS" >>"$work/base.starts"
done
base_stamp=$(printf '%s\n' "${base_wall[@]}" | median)
base_p50=$(pct 50 <"$work/base.starts")
base_p99=$(pct 99 <"$work/base.starts")

# --- cold --------------------------------------------------------------------------------------------
fresh_store cold
before=$(gets)
mbefore=$(manifests)
step "$work/cold" -N"$N" --ntasks-per-node="$T" --container-image="$image"
cold_ms=$WALL_MS
cold_job=$(newest_job)
last_job=$cold_job
cold_gets=$(($(gets) - before))
cold_manifests=$(($(manifests) - mbefore))
mapfile -t cold_starts < <(node_starts "$work/cold" "$LAUNCH_NS")
cold_p50=$(printf '%s\n' "${cold_starts[@]}" | pct 50)
cold_p99=$(printf '%s\n' "${cold_starts[@]}" | pct 99)
cold_ranks=$(grep -c " $digest$" "$work/cold" || true)
cold_nodes=$(awk -v d="$digest" '$3 == d {print $2}' "$work/cold" | sort -u | wc -l)

# --- warm --------------------------------------------------------------------------------------------
before=$(gets)
mbefore=$(manifests)
warm_wall=()
warm_jobs=()
warm_ranks=0
for ((i = 0; i < runs; i++)); do
  step "$work/warm.$i" -N"$N" --ntasks-per-node="$T" --container-image="$image"
  warm_wall+=("$WALL_MS")
  warm_jobs+=("$(newest_job "$last_job")")
  last_job=${warm_jobs[-1]}
  node_starts "$work/warm.$i" "$LAUNCH_NS" | tee -a "$work/warm.starts" >"$work/warm.$i.starts"
  warm_ranks=$((warm_ranks + $(grep -c " $digest$" "$work/warm.$i" || true)))
done
warm_gets=$(($(gets) - before))
warm_manifest_total=$(($(manifests) - mbefore))
warm_manifests=$(awk -v a="$warm_manifest_total" -v b="$runs" 'BEGIN { printf "%g", a / b }')
warm_ms=$(printf '%s\n' "${warm_wall[@]}" | median)
warm_p50=$(pct 50 <"$work/warm.starts")
warm_p99=$(pct 99 <"$work/warm.starts")

printf '\n%-58s %10s %10s %10s\n' "step ($N nodes, $((N * T)) ranks)" "wall ms" "node p50" "node p99"
printf '%-58s %10s %10s %10s\n' "srun -n$((N * T)) true (median of $runs)" "$base_true" - -
printf '%-58s %10s %10s %10s\n' "srun stamp, no container (median of $runs)" "$base_stamp" "$base_p50" "$base_p99"
printf '%-58s %10s %10s %10s\n' "srun stamp, --container-image, cold (fresh store)" "$cold_ms" "$cold_p50" "$cold_p99"
printf '%-58s %10s %10s %10s\n' "srun stamp, --container-image, warm (median of $runs)" "$warm_ms" "$warm_p50" "$warm_p99"
echo "ratios to srun true:      cold $(ratio "$cold_ms" "$base_true"), warm $(ratio "$warm_ms" "$base_true")"
echo "ratios to the stamp step: cold $(ratio "$cold_ms" "$base_stamp"), warm $(ratio "$warm_ms" "$base_stamp"); node p50 cold $(ratio "$cold_p50" "$base_p50"), warm $(ratio "$warm_p50" "$base_p50")"
echo "blob GETs: cold $cold_gets for $nblobs blobs; warm $warm_gets over $runs steps. Manifest requests: cold $cold_manifests, warm $warm_manifests per step"
check "cold step: blob GETs ($cold_gets) = the image's blob count ($nblobs)" [ "$cold_gets" -eq "$nblobs" ]
check "cold step: $cold_ranks of $((N * T)) ranks ran in the image, on $cold_nodes of $N nodes" [ "$cold_ranks" -eq $((N * T)) ]
check "warm steps: no blob GETs ($warm_gets), $warm_ranks of $((runs * N * T)) ranks in the image" \
  [ "$warm_gets" -eq 0 -a "$warm_ranks" -eq $((runs * N * T)) ]
check "warm steps: one manifest request per step ($warm_manifest_total over $runs steps)" [ "$warm_manifest_total" -eq "$runs" ]

# --- start-up telemetry, beside the bench's own measurement ---------------------------------------------
# The bench's per-node start runs from its `date` before runuser+srun to a rank's `date` after the
# task's exec; the nodes' "since srun" from srun's plugin init to the first task's exec: the bench's
# figure is larger by srun's own start and the rank's sh+date (tens of ms on an idle machine).
echo
printf '%-58s %10s %10s\n' "per-node start, ms (bench: rank stamp; gantry stats: nodes)" p50 p99
printf '%-58s %10s %10s\n' "cold, bench" "$cold_p50" "$cold_p99"
stats_row "cold, gantry stats $cold_job: since srun" "$cold_job" "since srun"
stats_row "cold, gantry stats $cold_job: node total (set-up to exec)" "$cold_job" total
for ((i = 0; i < runs; i++)); do
  printf '%-58s %10s %10s\n' "warm $((i + 1)), bench" "$(pct 50 <"$work/warm.$i.starts")" "$(pct 99 <"$work/warm.$i.starts")"
  stats_row "warm $((i + 1)), gantry stats ${warm_jobs[$i]}: since srun" "${warm_jobs[$i]}" "since srun"
  stats_row "warm $((i + 1)), gantry stats ${warm_jobs[$i]}: node total (set-up to exec)" "${warm_jobs[$i]}" total
done
echo "gantry stats $cold_job (the cold step):"
"$gantry_cli" stats --dir "$tdir" "$cold_job" | sed 's/^/  /' || true
echo "gantry stats ${warm_jobs[0]} (the first warm step):"
"$gantry_cli" stats --dir "$tdir" "${warm_jobs[0]}" | sed 's/^/  /' || true
check "telemetry: $(complete_records "$cold_job") of $N nodes' records of the cold step have every phase" \
  [ "$(complete_records "$cold_job")" -eq "$N" ]
for j in "${warm_jobs[@]}"; do
  check "telemetry: $(complete_records "$j") of $N nodes' records of warm step $j have every phase" [ "$(complete_records "$j")" -eq "$N" ]
done

# --- takeover ----------------------------------------------------------------------------------------
# A fresh store again; the host's link to the nodes is slowed so that the pull takes seconds. Once the
# producer has part of a layer on disk, its node is crashed (slurm.sh crash-node: slurmd, slurmstepd,
# the pull and the ranks SIGKILLed at once); a waiting node must take the lock over and finish.
# srun --no-kill: the step goes on on the other nodes (without it, the controller ends the whole step
# once it declares the crashed node dead, SlurmdTimeout=20 s in the harness).
echo
fresh_store takeover
before=$(gets)
settle
tc qdisc replace dev "$GANTRY_SLURM_HOST_LINK" root tbf rate "$rate" burst 32kb latency 500ms
shaped=$GANTRY_SLURM_HOST_LINK
LAUNCH_NS=$(date +%s%N)
as_user timeout 900 srun --no-kill -N"$N" --ntasks-per-node="$T" --container-image="$image" "${stamp_cmd[@]}" \
  >"$work/takeover" 2>"$work/takeover.err" &
srun_pid=$!
partial=
for ((i = 0; i < 3000; i++)); do
  for f in "$store/staging/$hex/blobs/"*.partial; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -ge 1000000 ] && partial=$f && break 2
  done
  sleep 0.1
done
[ -n "$partial" ] || gantry_die "rehearsal: no producer wrote 1 MB of a layer within 300 s; see $work/takeover.err"
holder=$(head -n1 "$store/locks/$hex.lock")
crashed=${holder%%:*}
echo "takeover: producer $holder, $(stat -c %s "$partial") bytes of $(basename "$partial" .partial) on disk after $((($(date +%s%N) - LAUNCH_NS) / 1000000)) ms: crash-node $crashed"
"$GANTRY_SLURM_HARNESS" crash-node "$crashed" >/dev/null 2>&1
t_crash=$(date +%s%N)
new_holder=
for ((i = 0; i < 3000; i++)); do
  h=$(head -n1 "$store/locks/$hex.lock" 2>/dev/null || true)
  [ -z "$new_holder" ] && [ -n "$h" ] && [ "$h" != "$holder" ] && new_holder=$h && t_taken=$(date +%s%N)
  [ -e "$store/images/$hex.sqsh" ] && break
  sleep 0.1
done
t_image=$(date +%s%N)
tc qdisc del dev "$shaped" root 2>/dev/null || true
shaped=
status=0
wait "$srun_pid" || status=$?
t_end=$(date +%s%N)
take_gets=$(($(gets) - before))
take_ranks=$(grep -c " $digest$" "$work/takeover" || true)
take_on_crashed=$(awk -v n="$crashed" '$2 == n' "$work/takeover" | wc -l)
mapfile -t take_starts < <(awk -v d="$digest" '$3 == d' "$work/takeover" | node_starts /dev/stdin "$t_crash")
echo "takeover: lock taken by ${new_holder:-nobody seen} $([ -n "$new_holder" ] && echo "$(((t_taken - t_crash) / 1000000)) ms after the crash")," \
  "image published $(((t_image - t_crash) / 1000000)) ms after the crash, srun ended $(((t_end - t_crash) / 1000000)) ms after it (exit $status)"
echo "takeover: survivors' node start after the crash p50 $(printf '%s\n' "${take_starts[@]}" | pct 50) ms, p99 $(printf '%s\n' "${take_starts[@]}" | pct 99) ms; blob GETs $take_gets for $nblobs blobs"
check "takeover: image published in the store" [ -e "$store/images/$hex.sqsh" ]
check "takeover: $take_ranks of $(((N - 1) * T)) survivor ranks ran in the image, none on $crashed" \
  [ "$take_ranks" -eq $(((N - 1) * T)) -a "$take_on_crashed" -eq 0 ]
check "takeover: blob GETs ($take_gets) <= 2 x blob count ($((2 * nblobs)))" [ "$take_gets" -le $((2 * nblobs)) ]
"$GANTRY_SLURM_HARNESS" start-node "$crashed" >/dev/null 2>&1
for ((i = 0; i < 120; i++)); do
  [ "$(sinfo -h -N -n "$crashed" -o %t | head -1)" = idle ] && break
  sleep 0.5
done
[ "$(sinfo -h -N -n "$crashed" -o %t | head -1)" = idle ] || scontrol update nodename="$crashed" state=resume
crashed=
[ "$failed" -eq 0 ] && echo "rehearsal: all checks passed" || echo "rehearsal: FAILED (see above)"
exit "$failed"
