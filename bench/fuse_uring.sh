#!/usr/bin/env bash
# One FUSE round trip over /dev/fuse (how gantry-imagefs talks today, through libfuse) and over
# io_uring (Linux 6.14+), side by side in one run: bench/fuse_uring_probe.cpp answers every LOOKUP of
# a missing name with ENOENT and a client stats it LOOKUPS times, the cost issue #20's cold
# Python-import case is made of (one round trip per miss on a search path). Each case (below) runs
# RUNS times, alternating; prints the medians in microseconds per LOOKUP and the ratio to /dev/fuse.
# Usage (root): bench/fuse_uring.sh [--enable-uring] [LOOKUPS] [RUNS]
#   --enable-uring  set the fuse module's enable_uring parameter for the run and put the old value
#                   back afterwards (without it, a machine whose parameter is N measures /dev/fuse only)
# Needs g++ and liburing-dev (scripts/install-deps).
set -euo pipefail
enable=0
if [ "${1:-}" = --enable-uring ]; then enable=1; shift; fi
lookups=${1:-100000}
runs=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "bench/fuse_uring.sh: run as root (mounts a FUSE file system)" >&2; exit 1; }
out=${GANTRY_BUILD_DIR:-$here/../build}/bench
probe=$out/fuse_uring_probe
mkdir -p "$out"
if [ ! -x "$probe" ] || [ "$here/fuse_uring_probe.cpp" -nt "$probe" ]; then
  [ -f /usr/include/liburing.h ] || { echo "bench/fuse_uring.sh: liburing-dev is missing; run scripts/install-deps" >&2; exit 1; }
  g++ -std=c++20 -O2 -Wall -Wextra -o "$probe" "$here/fuse_uring_probe.cpp" -luring -lpthread
fi

param=/sys/module/fuse/parameters/enable_uring
modes=(dev)
if [ ! -e "$param" ]; then
  echo "# this kernel ($(uname -r)) has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING): /dev/fuse only"
elif [ "$(cat "$param")" = Y ]; then
  modes+=(uring)
elif [ $enable -eq 1 ]; then
  restore=N
  echo Y >"$param"
  modes+=(uring)
else
  echo "# $param is N: /dev/fuse only (--enable-uring sets it for this run)"
fi

# The cases: the probe's own server over each transport, its client a process of its own (as a
# container's programs are) or a thread of the server's process (no address-space switch: what the
# switch costs), and gantry-imagefs itself (libfuse, a process of its own) on a one-file image, also
# with server and client on CPU 0 (taskset).
# Every server answers a miss as gantry-imagefs does: a negative entry.
cases=()
for m in "${modes[@]}"; do cases+=("$m" "$m --pin" "$m --same-process"); done
imagefs=${GANTRY_BUILD_DIR:-$here/../build}/runtime/gantry-imagefs
work=$(mktemp -d /tmp/gantry-bench-fuse-uring-XXXXXX)
trap 'rm -rf "$work"; [ -z "${restore:-}" ] || echo "$restore" >"$param"' EXIT
if [ -x "$imagefs" ] && command -v mksquashfs >/dev/null; then
  mkdir -p "$work/src" "$work/mnt"
  echo hello >"$work/src/file"
  mksquashfs "$work/src" "$work/image.sqsh" -quiet -noappend >/dev/null
  cases+=("gantry-imagefs" "gantry-imagefs --pin")
fi
run_case() {
  if [[ $1 == gantry-imagefs* ]]; then
    local pin=()
    [ "$1" = "gantry-imagefs --pin" ] && pin=(taskset -c 0)  # server and client on CPU 0
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare -m bash -c '
      pin=("${@:6}")
      "${pin[@]}" "$1" "$2" "$3" & server=$!
      for _ in $(seq 100); do mountpoint -q "$3" && break; sleep 0.05; done
      "${pin[@]}" "$4" client "$3" "$5"
      umount "$3"; wait "$server"' run "$imagefs" "$work/image.sqsh" "$work/mnt" "$probe" "$lookups" "${pin[@]}"
  else
    # shellcheck disable=SC2086  # the case's words are the probe's arguments
    unshare -m "$probe" $1 --lookups "$lookups" --negative-entries
  fi
}

declare -A samples
for ((r = 0; r < runs; r++)); do
  for c in "${cases[@]}"; do
    line=$(run_case "$c")
    us=$(sed -n 's/.*us_per_lookup=\([0-9.]*\).*/\1/p' <<<"$line")
    # A uring run must have gone over the ring: the probe counts the requests each path answered.
    if [[ $c == uring* ]] && ! grep -q ' by_ring=[1-9]' <<<"$line"; then
      echo "bench/fuse_uring.sh: the uring run answered nothing over the ring: $line" >&2
      exit 1
    fi
    samples[$c]+="$us "
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "# $lookups LOOKUPs of missing names a run, $runs runs, $(nproc) CPUs, kernel $(uname -r); median us per LOOKUP"
base=$(median <<<"${samples[dev]}")
for c in "${cases[@]}"; do
  m=$(median <<<"${samples[$c]}")
  printf '%-22s %8s us  %5.2fx dev (runs: %s)\n' "$c" "$m" "$(echo "$m / $base" | bc -l)" "${samples[$c]% }"
done
