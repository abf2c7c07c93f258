#!/usr/bin/env bash
# bench/incremental: what a new tag of an image costs when most of its layers are stored already
# (issue #19). In one run, each pull from the harness registry with the page cache dropped:
#   base    a cold pull of an image of LAYERS layers, BASE_MB MiB of file data in all
#   +top    a tag adding one NEW_MB MiB layer on top of base, into the store that holds base
#   middle  a tag whose middle layer is replaced by another NEW_MB MiB one (the layers above it are
#           the same blobs), into that store too
#   alone   the +top layer alone, as a one-layer image, into a store of its own: what a per-layer store
#           would pay for +top at best (download and convert that layer, nothing else)
#   above   the middle tag's layers from the replaced one up, into a store of its own: what a per-layer
#           store would pay for the middle tag
# base, +top and middle are pulled twice: as whole images (what Gantry stores by default) and with
# `gantry pull --layered` into a store of their own (one squashfs per layer, docs/store.md "Layers").
# Prints each pull's time, the registry blob GETs it made (layers and the config), how much its store
# grew, and the ratios of issue #19's targets for both: +top <= 1.5 x alone + 0.5 s, its store growth
# <= 1.1 x alone's squashfs; the middle tag converts only the replaced layer and those above it (vs `above`).
# Run as root with the registry up:
#   tests/harness/registry.sh start && bench/incremental.sh [BASE_MB] [NEW_MB] [LAYERS]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
harness=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}
build=${GANTRY_BUILD_DIR:-$here/build}
gantry=$build/runtime/gantry
ocipy=$here/tests/images/oci.py
# shellcheck disable=SC1091
. "$harness/registry.env"
# shellcheck disable=SC1091
. "$here/tests/harness/lib.sh"
base_mb=${1:-800}
new_mb=${2:-50}
nlayers=${3:-8}
[ "$nlayers" -ge 3 ] || { echo "bench/incremental: LAYERS must be at least 3" >&2; exit 2; }
reg=$GANTRY_TEST_REGISTRY_HTTP
repo="gantry-bench/incremental"
work=$(mktemp -d /var/tmp/gantry-bench-incremental.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The whole-image rows store Enroot's form (layered_images = no); the layered rows ask with --layered.
printf 'layered_images = no\n' >"$work/whole.conf"
export GANTRY_CONFIG=$work/whole.conf
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$work/policy.json"

now() { date +%s.%N; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

# layer_tar NAME MB: a layer of MB MiB in 8 MiB files, half random bytes, half base64 text of them
# (gzip/zstd get about 4:3 from it, lz4 nothing), owned by root, mtime 0.
layer_tar() {
  local name=$1 mb=$2 dir="$work/src/$1" i
  mkdir -p "$dir/$name"
  for ((i = 0; i * 8 < mb; i++)); do
    local size=$(( mb - i * 8 < 8 ? mb - i * 8 : 8 ))
    if ((i % 2)); then
      head -c $(( (size << 20) * 3 / 4 )) /dev/urandom | base64 -w 0 >"$dir/$name/f$i.txt"
    else
      head -c $((size << 20)) /dev/urandom >"$dir/$name/f$i.bin"
    fi
  done
  tar -C "$dir" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/$name.tar" "$name"
  rm -rf "$dir"
}

# image TAG LAYER...: an image of those layer tars (zstd, as a recent `docker push` may send them),
# pushed to the registry. The same tar gives the same blob in every image.
image() {
  local tag=$1 l
  shift
  umoci new --image "$work/oci:$tag"
  for l in "$@"; do
    python3 "$ocipy" add-layer "$work/oci" "$tag" "$work/$l.tar" --compress zstd >/dev/null
  done
  skopeo --policy "$work/policy.json" copy -q --dest-tls-verify=false "oci:$work/oci:$tag" \
    "docker://$reg/$repo:$tag"
}

echo "bench/incremental: base $base_mb MiB in $nlayers layers, new layers $new_mb MiB, $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(now)
base=()
for ((i = 0; i < nlayers; i++)); do
  layer_tar "base$i" $(( base_mb / nlayers ))
  base+=("base$i")
done
layer_tar top "$new_mb"
layer_tar mid "$new_mb"
middle_at=$(( nlayers / 2 ))
middle=("${base[@]}")
middle[middle_at]=mid
umoci init --layout "$work/oci"
image base "${base[@]}"
image top "${base[@]}" top
image middle "${middle[@]}"
image alone top
image above "${middle[@]:$middle_at}"
printf 'images made and pushed in %.0f s\n\n' "$(echo "$(now) - $t0" | bc -l)"

# pull TAG STORE [--layered]: prints "seconds blob-GETs store-growth-bytes squashfs-bytes" (a layered
# pull: the size of its record, not of a squashfs).
pull() {
  local tag=$1 store=$2 before gets_before t1 out
  shift 2
  mkdir -p "$store"
  before=$(du -sb "$store" | cut -f1)
  gets_before=$(gantry_registry_blob_gets "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')
  drop_caches
  t1=$(now)
  out=$("$gantry" pull --quiet "$@" --store "$store" "$reg/$repo:$tag")
  local secs
  secs=$(echo "$(now) - $t1" | bc -l)
  printf '%.2f %d %d %d\n' "$secs" \
    $(( $(gantry_registry_blob_gets "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+') - gets_before )) \
    $(( $(du -sb "$store" | cut -f1) - before )) "$(stat -c %s "$(awk '{print $2}' <<<"$out")")"
}

read -r t_base g_base grow_base sq_base < <(pull base "$work/store")
read -r t_top g_top grow_top sq_top < <(pull top "$work/store")
read -r t_mid g_mid grow_mid sq_mid < <(pull middle "$work/store")
read -r t_alone g_alone grow_alone sq_alone < <(pull alone "$work/store-alone")
read -r t_above g_above grow_above sq_above < <(pull above "$work/store-above")
read -r lt_base lg_base lgrow_base _ < <(pull base "$work/store-layered" --layered)
read -r lt_top lg_top lgrow_top _ < <(pull top "$work/store-layered" --layered)
read -r lt_mid lg_mid lgrow_mid _ < <(pull middle "$work/store-layered" --layered)

mib() { echo $(( $1 >> 20 )); }
printf '%-46s %8s %6s %12s %14s\n' pull seconds GETs "store +MiB" "squashfs MiB"
row() { printf '%-46s %8.2f %6d %12d %14d\n' "$1" "$2" "$3" "$(mib "$4")" "$(mib "$5")"; }
row "base: cold, $nlayers layers" "$t_base" "$g_base" "$grow_base" "$sq_base"
row "+top: base + 1 layer (base stored)" "$t_top" "$g_top" "$grow_top" "$sq_top"
row "middle: layer $middle_at replaced (both stored)" "$t_mid" "$g_mid" "$grow_mid" "$sq_mid"
row "alone: the +top layer only (own store)" "$t_alone" "$g_alone" "$grow_alone" "$sq_alone"
row "above: layers $middle_at.. of middle (own store)" "$t_above" "$g_above" "$grow_above" "$sq_above"
row "layered base: cold, $nlayers layers" "$lt_base" "$lg_base" "$lgrow_base" 0
row "layered +top (base stored as layers)" "$lt_top" "$lg_top" "$lgrow_top" 0
row "layered middle (both stored as layers)" "$lt_mid" "$lg_mid" "$lgrow_mid" 0

verdict() { if [ "$(echo "$1 <= $2" | bc -l)" = 1 ]; then echo met; else echo "not met"; fi; }
limit_top=$(echo "1.5 * $t_alone + 0.5" | bc -l)
# targets LABEL T_TOP GROW_TOP T_MID GROW_MID GETS_TOP GETS_MID
targets() {
  printf '\n%s\n' "$1"
  printf '  +top time / (1.5 x alone + 0.5 s):     %.2fx  (%.2f s of %.2f s: %s)\n' \
    "$(echo "$2 / $limit_top" | bc -l)" "$2" "$limit_top" "$(verdict "$2" "$limit_top")"
  printf '  +top store growth / alone squashfs:     %.2fx  (target <= 1.1x: %s)\n' \
    "$(echo "$3 / $sq_alone" | bc -l)" "$(verdict "$3" "$(echo "1.1 * $sq_alone" | bc -l)")"
  printf '  middle time / above time:               %.2fx  (a per-layer store converts only those: about 1x)\n' \
    "$(echo "$4 / $t_above" | bc -l)"
  printf '  middle store growth / above squashfs:   %.2fx  (target <= 1.1x: %s)\n' \
    "$(echo "$5 / $sq_above" | bc -l)" "$(verdict "$5" "$(echo "1.1 * $sq_above" | bc -l)")"
  printf '  blob GETs: +top %d, middle %d (only new layers and the config: 2 and %d)\n' "$6" "$7" $(( nlayers - middle_at + 1 ))
}
targets "whole images (the default):" "$t_top" "$grow_top" "$t_mid" "$grow_mid" "$g_top" "$g_mid"
targets "layered (gantry pull --layered):" "$lt_top" "$lgrow_top" "$lt_mid" "$lgrow_mid" "$lg_top" "$lg_mid"
printf '\nlayered cold base / whole cold base:    %.2fx\n' "$(echo "$lt_base / $t_base" | bc -l)"
