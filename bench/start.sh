#!/usr/bin/env bash
# Container start-up cost: `gantry run IMAGE true` per backend vs `true` on the host, and vs
# unsquashfs-then-run (Enroot's create+start). Usage: bench/start.sh [IMAGE.sqsh] [RUNS]
# Runs as the caller (root: kernel, fuse, extract; user: fuse, extract). Prints medians in ms.
# kernel: the first run makes the node-wide image mount, the others reuse it (docs/runtime.md), as
# every step after the first on a Slurm node does.
set -euo pipefail
gantry=${GANTRY:-${GANTRY_BUILD_DIR:-build}/runtime/gantry}
image=${1:?usage: bench/start.sh IMAGE.sqsh [RUNS]}
runs=${2:-20}

median_ms() {  # median_ms CMD...: median wall time of RUNS executions
  local t=()
  for _ in $(seq "$runs"); do
    local s e
    s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N)
    t+=($(( (e - s) / 1000 )))
  done
  printf '%s\n' "${t[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1000}'
}

host=$(median_ms /bin/true)
echo "host true:            ${host} ms"
backends=(fuse extract)
[ "$(id -u)" -eq 0 ] && backends=(kernel fuse extract)
for b in "${backends[@]}"; do
  m=$(median_ms "$gantry" run --backend "$b" "$image" true)
  echo "gantry run ($b): $(printf '%7s' "$m") ms  (+$(awk -v a="$m" -v b="$host" 'BEGIN{printf "%.1f", a-b}') ms over host)"
done
unsq() { d=$(mktemp -d); unsquashfs -q -no-progress -d "$d/r" "$image" >/dev/null; "$d/r/bin/true" 2>/dev/null || true; rm -rf "$d"; }
echo "unsquashfs + run:     $(median_ms unsq) ms"
