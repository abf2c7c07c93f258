#!/usr/bin/env bash
# Reading many small files inside a container per backend (kernel, fuse, fuse-private, extract) vs
# the same tree on the host disk, cold and warm, for two workloads:
#  read    every file of a FILES-file tree (1-8 KiB each), busybox `find -exec cat`
#  import  a Python-import-like lookup (bench/pyimport.c): IMPORT_MODS modules along a search path of
#          IMPORT_DIRS directories, stat NAME.py, NAME/ and NAME.so in each until found (most miss),
#          then open + fstat + read the hit
# Usage (root, for the kernel backend and drop_caches): bench/files.sh [FILES] [RUNS]
# BACKENDS limits the backends (default: kernel fuse fuse-private extract; extract is slow: it
# unpacks and deletes the tree on every run); MODES limits the modes (default: cold warm);
# WORKLOADS limits the workloads (default: read import).
#  kernel-layered, fuse-layered  the same tree as an image of LAYERS (default 10) layers, pulled
#                with `gantry pull --layered` from the harness registry (tests/harness/registry.sh
#                start) into a root-owned store of its own, and stacked by overlayfs (issue #19):
#                layer 0 holds /bin, layer k>0 every (LAYERS-1)th directory of /data and of /lib
#                from k-1 on, so /data and /lib merge across all of them and a module search that
#                misses looks in every layer
#  fuse          the shared image server (gantry.conf fuse_shared = yes, the default): one
#                gantry-imagefs per user and image that outlives each container
#  fuse-private  fuse_shared = no: a gantry-imagefs per container
#  squashfuse    the shared image server with fuse_server = squashfuse_ll (Gantry before gantry-imagefs)
#  squashfuse-private  fuse_shared = no, fuse_server = squashfuse_ll: a squashfuse_ll per container
# cold = page cache, dentries and inodes dropped before each run, and for fuse a fresh daemon
# (mount_idle_seconds = 0: the server leaves with its container); warm = after a warm-up run, the
# fuse server kept between runs (mount_idle_seconds = 10), as for the next container of a user.
# The tree and its squashfs (lz4, Gantry's default) are generated under $BENCH_DIR; the readers are
# the same on the host and in the container. Extract's "cold" read follows its own unpacking, so it
# finds the tree in the page cache. Prints medians in ms and the ratio to the host; "work" = the run
# minus `gantry run ... true` with the same backend and mode (set-up).
set -euo pipefail
gantry=$(realpath "${GANTRY:-${GANTRY_BUILD_DIR:-build}/runtime/gantry}")
files=${1:-20000}
runs=${2:-5}
mods=${IMPORT_MODS:-4000}
ndirs=${IMPORT_DIRS:-16}
dir=${BENCH_DIR:-/var/tmp/gantry-bench-files}
src=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "bench/files.sh: run as root (kernel backend, drop_caches)" >&2; exit 1; }
busybox=$(command -v busybox)
image=$dir/files-$files-$mods-$ndirs.sqsh

# The image: busybox and pyimport for the readers, /data with FILES files of 1-8 KiB in directories
# of 100, /lib/pDD with the modules (1-4 KiB each).
if [ ! -f "$image" ]; then
  rm -rf "$dir/tree"
  mkdir -p "$dir/tree/bin"
  cp "$busybox" "$dir/tree/bin/busybox"
  for c in sh find cat true; do ln -s busybox "$dir/tree/bin/$c"; done
  gcc -O2 -static -o "$dir/tree/bin/pyimport" "$src/pyimport.c"
  python3 - "$dir/tree" "$files" "$mods" "$ndirs" <<'PY'
import os, random, sys
root, n, mods, ndirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(42)
for i in range(n):
    d = os.path.join(root, "data", "d%03d" % (i // 100))
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(rng.randbytes(rng.randint(1024, 8192)))
for d in range(ndirs):
    os.makedirs(os.path.join(root, "lib", "p%02d" % d), exist_ok=True)
for m in range(mods):
    with open(os.path.join(root, "lib", "p%02d" % (m % ndirs), "m%05d.py" % m), "wb") as f:
        f.write(rng.randbytes(rng.randint(1024, 4096)))
PY
  mksquashfs "$dir/tree" "$image.tmp" -comp lz4 -noappend -quiet -all-root >/dev/null
  mv "$image.tmp" "$image"
fi
chmod 0755 "$dir"  # root-owned, not writable by others: a trusted image for the kernel backend

# The layered image, when a *-layered backend is asked for: pushed once per tree and layer count.
nlayers=${LAYERS:-10}
layered_ref=
if [[ " ${BACKENDS:-} " == *-layered* ]]; then
  [ "$nlayers" -ge 2 ] || { echo "bench/files: LAYERS must be at least 2" >&2; exit 2; }
  harness=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}
  # shellcheck disable=SC1091
  . "$harness/registry.env"
  layered_ref=$GANTRY_TEST_REGISTRY_HTTP/gantry-bench/files:$files-$mods-$ndirs-$nlayers
  store=$dir/store-$files-$mods-$ndirs-$nlayers
  if [ ! -s "$store.digest" ] || [ -z "$(ls "$store/images" 2>/dev/null)" ]; then
    rm -rf "$dir/oci" "$dir/layers" "$store"
    mkdir -p "$dir/layers"
    umoci init --layout "$dir/oci"
    umoci new --image "$dir/oci:files" >/dev/null
    for ((k = 0; k < nlayers; k++)); do
      list=$dir/layers/$k.list
      if [ "$k" -eq 0 ]; then
        echo bin >"$list"
      else
        # Every (nlayers-1)th directory of /data and /lib, starting at k-1, with its parent listed.
        { echo data; echo lib
          (cd "$dir/tree" && ls -d data/* lib/*) | awk -v n=$((nlayers - 1)) -v k=$((k - 1)) 'NR % n == k'
        } >"$list"
      fi
      tar -C "$dir/tree" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --no-recursion \
        -cf "$dir/layers/$k.tar" -T <(while read -r p; do
          if [ "$p" = data ] || [ "$p" = lib ]; then echo "$p"; else (cd "$dir/tree" && find "$p"); fi
        done <"$list")
      python3 "$src/../tests/images/oci.py" add-layer "$dir/oci" files "$dir/layers/$k.tar" --compress gzip >/dev/null
    done
    echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$dir/policy.json"
    skopeo --policy "$dir/policy.json" copy -q --dest-tls-verify=false "oci:$dir/oci:files" "docker://$layered_ref"
    install -d -m 0755 "$store"
    "$gantry" pull --layered --quiet --store "$store" "$layered_ref" | tail -n1 | awk '{print $1}' >"$store.digest"
    rm -rf "$dir/oci" "$dir/layers"
  fi
  # By digest: the store serves it with no registry, whatever port the harness registry has now.
  layered_ref=${layered_ref%:*}@$(cat "$store.digest")
fi
printf 'mount_idle_seconds = 0\n' >"$dir/cold.conf"
printf 'mount_idle_seconds = 10\n' >"$dir/warm.conf"
printf 'mount_idle_seconds = 0\nfuse_shared = no\n' >"$dir/cold-private.conf"
printf 'mount_idle_seconds = 10\nfuse_shared = no\n' >"$dir/warm-private.conf"
for f in cold warm cold-private warm-private; do
  { cat "$dir/$f.conf"; echo 'fuse_server = squashfuse_ll'; } >"$dir/$f-squashfuse.conf"
done
read_cmd=(find /data -type f -exec cat '{}' +)
import_cmd=(/bin/pyimport / "$ndirs" "$mods")

ms() {  # ms CMD...: wall time of one run in ms (output discarded; a failed run stops the bench)
  local s e
  s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N)
  echo $(( (e - s) / 1000000 ))
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
measure() {  # measure cold|warm CMD...: median over RUNS
  local mode=$1 t=()
  shift
  [ "$mode" = warm ] && "$@" >/dev/null  # warm-up
  for _ in $(seq "$runs"); do
    [ "$mode" = cold ] && cold
    t+=("$(ms "$@")")
  done
  printf '%s\n' "${t[@]}" | median
}
host_read() { "$busybox" find "$dir/tree/data" -type f -exec "$busybox" cat '{}' + ; }
host_import() { "$dir/tree/bin/pyimport" "$dir/tree" "$ndirs" "$mods"; }
in_container() {  # in_container BACKEND MODE CMD...
  local b=$1 mode=$2 conf=$dir/$2.conf
  shift 2
  case $b in
    fuse-private) b=fuse conf=$dir/$mode-private.conf ;;
    squashfuse) b=fuse conf=$dir/$mode-squashfuse.conf ;;
    squashfuse-private) b=fuse conf=$dir/$mode-private-squashfuse.conf ;;
    kernel-layered | fuse-layered)
      GANTRY_CONFIG=$conf "$gantry" run --backend "${b%-layered}" --store "$store" --pull never "$layered_ref" "$@"
      return ;;
  esac
  GANTRY_CONFIG=$conf "$gantry" run --backend "$b" "$image" "$@"
}

echo "bench/files: $files files ($(du -sh --apparent-size "$dir/tree/data" | cut -f1)) + $mods modules on a path of $ndirs directories, squashfs $(du -h "$image" | cut -f1), median of $runs runs"
[ -z "$layered_ref" ] || echo "layered: $nlayers layers, $(du -ch "$store"/images/layer-*.sqsh | tail -1 | cut -f1) of layer files"
printf '%-18s %-7s %5s %9s %9s %9s %7s\n' "" work mode "total ms" "set-up" "work ms" "x host"
for mode in ${MODES:-cold warm}; do
  declare -A host=()
  for w in ${WORKLOADS:-read import}; do
    host[$w]=$(measure "$mode" "host_$w")
    printf '%-18s %-7s %5s %9s %9s %9s %7s\n' host "$w" "$mode" "${host[$w]}" 0 "${host[$w]}" 1.00
  done
  for b in ${BACKENDS:-kernel fuse fuse-private extract}; do
    setup=$(measure "$mode" in_container "$b" "$mode" true)
    for w in ${WORKLOADS:-read import}; do
      cmd=("${read_cmd[@]}")
      [ "$w" = import ] && cmd=("${import_cmd[@]}")
      total=$(measure "$mode" in_container "$b" "$mode" "${cmd[@]}")
      work=$(( total > setup ? total - setup : 0 ))
      printf '%-18s %-7s %5s %9s %9s %9s %7s\n' "$b" "$w" "$mode" "$total" "$setup" "$work" \
        "$(awk -v a="$work" -v b="${host[$w]}" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}')"
    done
  done
  unset host
done
