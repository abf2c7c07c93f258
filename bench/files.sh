#!/usr/bin/env bash
# Reading many small files: every file of a 20,000-file tree read inside a container per backend
# (kernel, fuse, extract) vs the same tree on the host disk, cold (page cache dropped) and warm.
# Usage (root, for the kernel backend and drop_caches): bench/files.sh [FILES] [RUNS]
# BACKENDS="kernel fuse" limits the backends (default: kernel fuse extract; extract is slow: it
# unpacks and deletes the tree on every run); MODES="warm" limits the modes (default: cold warm).
# The tree and its squashfs (lz4, Gantry's default) are generated under $BENCH_DIR; the reader is
# the same busybox `find -exec cat` on the host and in the container. Extract's "cold" read follows
# its own unpacking, so it finds the tree in the page cache. Prints medians in ms and the
# ratio to the host; "read" = the run minus `gantry run ... true` with the same backend (set-up).
set -euo pipefail
gantry=$(realpath "${GANTRY:-${GANTRY_BUILD_DIR:-build}/runtime/gantry}")
files=${1:-20000}
runs=${2:-5}
dir=${BENCH_DIR:-/var/tmp/gantry-bench-files}
[ "$(id -u)" -eq 0 ] || { echo "bench/files.sh: run as root (kernel backend, drop_caches)" >&2; exit 1; }
busybox=$(command -v busybox)

# The image: busybox for the reader, /data with FILES files of 1-8 KiB in directories of 100.
if [ ! -f "$dir/files-$files.sqsh" ]; then
  rm -rf "$dir/tree"
  mkdir -p "$dir/tree/bin"
  cp "$busybox" "$dir/tree/bin/busybox"
  for c in sh find cat true; do ln -s busybox "$dir/tree/bin/$c"; done
  python3 - "$dir/tree/data" "$files" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(42)
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 100))
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(rng.randbytes(rng.randint(1024, 8192)))
PY
  mksquashfs "$dir/tree" "$dir/files-$files.sqsh.tmp" -comp lz4 -noappend -quiet -all-root >/dev/null
  mv "$dir/files-$files.sqsh.tmp" "$dir/files-$files.sqsh"
fi
chmod 0755 "$dir"  # root-owned, not writable by others: a trusted image for the kernel backend
image=$dir/files-$files.sqsh
read_cmd=(find /data -type f -exec cat '{}' +)

ms() {  # ms CMD...: wall time of one run in ms (output discarded)
  local s e
  s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N)
  echo $(( (e - s) / 1000000 ))
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
measure() {  # measure cold|warm CMD...: median over RUNS
  local mode=$1 t=()
  shift
  [ "$mode" = warm ] && "$@" >/dev/null 2>&1  # warm-up
  for _ in $(seq "$runs"); do
    [ "$mode" = cold ] && cold
    t+=("$(ms "$@")")
  done
  printf '%s\n' "${t[@]}" | median
}
host_read() { "$busybox" find "$dir/tree/data" -type f -exec "$busybox" cat '{}' + ; }

echo "bench/files: $files files ($(du -sh --apparent-size "$dir/tree/data" | cut -f1) in the tree, squashfs $(du -h "$image" | cut -f1)), median of $runs runs"
printf '%-10s %6s %10s %10s %10s %8s\n' "" mode "total ms" "set-up ms" "read ms" "x host"
for mode in ${MODES:-cold warm}; do
  host=$(measure "$mode" host_read)
  printf '%-10s %6s %10s %10s %10s %8s\n' host "$mode" "$host" 0 "$host" 1.00
  for b in ${BACKENDS:-kernel fuse extract}; do
    total=$(measure "$mode" "$gantry" run --backend "$b" "$image" "${read_cmd[@]}")
    setup=$(measure "$mode" "$gantry" run --backend "$b" "$image" true)
    read=$(( total > setup ? total - setup : 0 ))
    printf '%-10s %6s %10s %10s %10s %8s\n' "$b" "$mode" "$total" "$setup" "$read" \
      "$(awk -v a="$read" -v b="$host" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}')"
  done
done
