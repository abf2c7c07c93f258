#!/usr/bin/env bash
# bench/pull: cold-store pull of an image from the harness registry, side by side with
#   (a) the Enroot-equivalent pipeline of Debian tools: skopeo copy -> umoci unpack -> mksquashfs
#       (Enroot's own default squash options: -comp lzo -noD), and
#   (b) the physical floor: download every layer and decompress it to /dev/null, in parallel.
# Prints each time, gantry's peak RSS, image sizes and the ratios. Run as root with the harness up:
#   tests/harness/registry.sh start && tests/images/build.sh --big && bench/pull.sh [IMAGE]
# IMAGE defaults to gantry-test/big (built by tests/images/build.sh --big).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
harness=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}
build=${GANTRY_BUILD_DIR:-$here/build}
gantry=$build/runtime/gantry
# shellcheck disable=SC1091
. "$harness/registry.env"
reg=$GANTRY_TEST_REGISTRY_HTTP
repo=${1:-gantry-test/big}
tag=latest
work=$(mktemp -d /var/tmp/gantry-bench-pull.XXXXXX)
trap 'rm -rf "$work"' EXIT
# One whole squashfs, as the Enroot-equivalent pipeline below makes (layered_images = no).
printf 'layered_images = no\n' >"$work/whole.conf"
export GANTRY_CONFIG=$work/whole.conf
accept='application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json'

now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc -l; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

# The load average goes with the figures: on a shared machine it explains most of their spread.
echo "bench/pull: $reg/$repo:$tag, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# (b) floor: every layer downloaded and decompressed to /dev/null, all at once.
manifest=$(curl -fsS -H "Accept: $accept" "http://$reg/v2/$repo/manifests/$tag")
layers=$(echo "$manifest" | jq -r '.layers[] | .digest + " " + .mediaType')
drop_caches
t0=$(now)
while read -r digest media; do
  case "$media" in
    *zstd*) dec="zstd -dc" ;;
    *gzip*) dec="gzip -dc" ;;
    *) dec="cat" ;;
  esac
  (curl -fsS "http://$reg/v2/$repo/blobs/$digest" | $dec > /dev/null) &
done <<< "$layers"
wait  # the loop ran in this shell (a here-string, not a pipe), so its jobs are ours to wait for
t_floor=$(elapsed "$t0" "$(now)")

# gantry pull into a cold store.
drop_caches
t0=$(now)
/usr/bin/time -v -o "$work/gantry.time" "$gantry" pull --quiet --store "$work/store" "$reg/$repo:$tag" > "$work/gantry.out"
t_gantry=$(elapsed "$t0" "$(now)")
rss_kb=$(awk -F: '/Maximum resident/ {gsub(/ /,"",$2); print $2}' "$work/gantry.time")
sqsh=$(awk '{print $2}' "$work/gantry.out")
size_gantry=$(stat -c %s "$sqsh")

# The Enroot-equivalent pipeline.
drop_caches
t0=$(now)
skopeo copy -q --src-tls-verify=false "docker://$reg/$repo:$tag" "oci:$work/oci:$tag"
t1=$(now)
# umoci 0.4 cannot read zstd layers: recompress them to gzip first, untimed (this flatters the baseline).
unpack_tag=$tag
if echo "$layers" | grep -q zstd; then
  python3 "$here/tests/images/oci.py" to-gzip "$work/oci" "$tag" gzip-copy > /dev/null
  unpack_tag=gzip-copy
fi
t1b=$(now)
umoci unpack --rootless --image "$work/oci:$unpack_tag" "$work/bundle" > /dev/null
t2=$(now)
mksquashfs "$work/bundle/rootfs" "$work/enroot.sqsh" -comp lzo -noD -all-root -quiet -no-progress > /dev/null
t3=$(now)
t_ref=$(echo "$(elapsed "$t0" "$t3") - $(elapsed "$t1" "$t1b")" | bc -l)
size_ref=$(stat -c %s "$work/enroot.sqsh")

printf '\n%-44s %10s\n' "step" "seconds"
printf '%-44s %10.2f\n' "floor: download + decompress to /dev/null" "$t_floor"
printf '%-44s %10.2f\n' "gantry pull (cold store)" "$t_gantry"
printf '%-44s %10.2f\n' "skopeo copy" "$(elapsed "$t0" "$t1")"
printf '%-44s %10.2f\n' "(untimed: zstd layers recompressed for umoci)" "$(elapsed "$t1" "$t1b")"
printf '%-44s %10.2f\n' "umoci unpack" "$(elapsed "$t1b" "$t2")"
printf '%-44s %10.2f\n' "mksquashfs -comp lzo -noD" "$(elapsed "$t2" "$t3")"
printf '%-44s %10.2f\n' "Enroot-equivalent total" "$t_ref"
printf '\ngantry peak RSS: %d MiB\n' $((rss_kb / 1024))
printf 'image size: gantry %s MiB, Enroot-equivalent %s MiB\n' $((size_gantry >> 20)) $((size_ref >> 20))
printf 'ratio Enroot-equivalent / gantry: %.2fx (target >= 3x)\n' "$(echo "$t_ref / $t_gantry" | bc -l)"
printf 'ratio gantry / floor:              %.2fx (target <= 1.5x)\n' "$(echo "$t_gantry / $t_floor" | bc -l)"
