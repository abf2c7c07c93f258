# fixtures: registry images
# `gantry pull` end to end against the real harness registries: every test image compared with the
# umoci reference tree, platform selection, one producer per digest (16 concurrent pulls, a producer
# killed with SIGKILL), and failures that publish nothing: corrupt blob, 404, 500s, disk full, a layer
# beyond max_layer_bytes, layers declared beyond max_image_bytes.

load helpers

setup() {
  gantry_load_env registry images
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  REG=$GANTRY_TEST_REGISTRY_HTTP
  T=$(mktemp -d /tmp/gantry-pull-test.XXXXXX)
  STORE=$T/store
  TREECMP=$GANTRY_SOURCE_DIR/tests/integration/treecmp.py
  OCI=$GANTRY_SOURCE_DIR/tests/images/oci.py
  COUNT=$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh
  GANTRY_MOUNTS=()
}

teardown() {
  for pid in ${KILL_PIDS:-}; do kill -9 "$pid" 2>/dev/null || true; done
  mountpoint -q "$T/small" 2>/dev/null && umount "$T/small"
  gantry_unmount_all
  rm -rf "$T"
}

fresh_image() { gantry_fresh_image "$T" "$@"; }

# pull_fails_in_one_line CONF NAME: a pull of gantry-test/NAME under GANTRY_CONFIG=CONF fails, saying
# why in exactly one line ($output).
pull_fails_in_one_line() {
  run env GANTRY_CONFIG="$1" "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$2"
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$(echo "$output" | wc -l)" -eq 1 ]
}

# compare_with_reference PATH REF_ROOTFS: the image pull printed (its squashfs, or its record when
# it is stored as layers: the stack of them) has the reference tree.
compare_with_reference() {
  local ours=$T/ours.$RANDOM$RANDOM
  gantry_image_tree "$1" "$ours"
  python3 "$TREECMP" --ignore-dir-mtime "$2" "$ours"
}

# image_file PATH FILE: FILE's contents in the image pull printed. Called as $(image_file ...), in a
# subshell: the mounts it makes are undone here, not in teardown.
image_file() {
  local tree=$T/tree.$RANDOM$RANDOM before=${#GANTRY_MOUNTS[@]} rc=0
  gantry_image_tree "$1" "$tree"
  cat "$tree/$2" || rc=$?
  gantry_unmount_all "$before"
  return $rc
}

@test "pull prints '<digest> <path>' and the image equals umoci's tree: tiny" {
  run "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$GANTRY_TEST_DIGEST_TINY" ]
  sqsh=$(echo "$output" | tail -n1 | awk '{print $2}')
  [ -f "$sqsh" ]
  compare_with_reference "$sqsh" "$GANTRY_TEST_REF_TINY"
}

@test "layers image: whiteouts, opaque dirs, links, xattrs, owners, long and UTF-8 names match umoci" {
  run "$GANTRY" pull --quiet --store "$STORE" "$REG#$GANTRY_TEST_IMAGE_LAYERS"
  echo "$output"
  [ "$status" -eq 0 ]
  compare_with_reference "$(echo "$output" | tail -n1 | awk '{print $2}')" "$GANTRY_TEST_REF_LAYERS"
}

@test "zstd layers, Docker schema2 and the debian image match their references" {
  for img in ZSTD TINY_DOCKER DEBIAN; do
    ref_var=GANTRY_TEST_IMAGE_$img; tree_var=GANTRY_TEST_REF_$img; digest_var=GANTRY_TEST_DIGEST_$img
    run "$GANTRY" pull --quiet --store "$STORE" "$REG/${!ref_var}"
    echo "$img: $output"
    [ "$status" -eq 0 ]
    [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "${!digest_var}" ]
    compare_with_reference "$(echo "$output" | tail -n1 | awk '{print $2}')" "${!tree_var}"
  done
}

@test "the kernel mounts the image and reads the same files" {
  run "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_LAYERS"
  [ "$status" -eq 0 ]
  sqsh=$(echo "$output" | tail -n1 | awk '{print $2}')
  mkdir -p "$T/mnt"
  if [[ $sqsh == *.sqsh ]]; then
    mount -t squashfs -o loop,ro "$sqsh" "$T/mnt"
    GANTRY_MOUNTS+=("$T/mnt")
  else
    gantry_image_tree "$sqsh" "$T/mnt"  # the kernel's stack of its layers
  fi
  run python3 "$TREECMP" --ignore-dir-mtime "$GANTRY_TEST_REF_LAYERS" "$T/mnt"
  gantry_unmount_all
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "platform selection from an OCI index" {
  run "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_MULTIARCH"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$GANTRY_TEST_DIGEST_MULTIARCH_AMD64" ]
  [ "$(image_file "$(echo "$output" | tail -n1 | awk '{print $2}')" arch)" = "amd64" ]
  run "$GANTRY" pull --quiet --store "$STORE" --platform linux/arm64 "$REG/$GANTRY_TEST_IMAGE_MULTIARCH"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$GANTRY_TEST_DIGEST_MULTIARCH_ARM64" ]
  [ "$(image_file "$(echo "$output" | tail -n1 | awk '{print $2}')" arch)" = "arm64" ]
  run "$GANTRY" pull --quiet --store "$STORE" --platform linux/s390x "$REG/$GANTRY_TEST_IMAGE_MULTIARCH"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "s390x"
}

@test "images, inspect, rm and gc" {
  "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  run "$GANTRY" images --store "$STORE"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "gantry-test/tiny"
  run "$GANTRY" inspect --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | jq -r .digest)" = "$GANTRY_TEST_DIGEST_TINY" ]
  [ "$(echo "$output" | jq -r '.config.WorkingDir')" = "/work" ]
  [ "$(echo "$output" | jq -r '.layers | length')" -eq 1 ]
  run "$GANTRY" rm --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  [ "$status" -eq 0 ]
  run "$GANTRY" inspect --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "not in the store"
  "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  run "$GANTRY" gc --store "$STORE" --max-bytes 1
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "removed $GANTRY_TEST_DIGEST_TINY"
  [ -z "$(ls "$STORE/images")" ]
}

@test "16 concurrent pulls of a new image: all succeed and each blob (config too) is downloaded once" {
  digest=$(fresh_image "conc-$RANDOM$RANDOM" 3000000)
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name/manifests/latest" | jq -r '.config.digest, .layers[].digest')
  declare -A before
  for b in $blobs; do before[$b]=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b"); done
  for i in $(seq 16); do
    "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$name" > "$T/out.$i" 2> "$T/err.$i" &
  done
  fails=0
  for job in $(jobs -p); do wait "$job" || fails=$((fails + 1)); done
  cat "$T"/err.* || true
  [ "$fails" -eq 0 ]
  [ "$(cat "$T"/out.* | sort -u | wc -l)" -eq 1 ]
  [ "$(cat "$T"/out.* | sort -u | awk '{print $1}')" = "$digest" ]
  for b in $blobs; do
    after=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")
    echo "blob $b: $((after - ${before[$b]})) GETs"
    [ $((after - ${before[$b]})) -eq 1 ]
  done
}

@test "a producer killed with SIGKILL is taken over by a waiting pull" {
  digest=$(fresh_image "kill-$RANDOM$RANDOM" 2000000)
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  gantry_producer_takeover "$T" "$STORE" "$name" "$digest"
  # One image (a whole squashfs, or a record and its layers), complete.
  [ "$(ls "$STORE/images" | grep -v '^layer-' | grep -c '\.json$')" -eq 1 ]
  gantry_image_stored "$STORE" "$digest"
}

@test "a corrupted blob aborts the pull, names the blob and publishes no image and not its layer" {
  digest=$(fresh_image "corrupt-$RANDOM$RANDOM")
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  blob=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name/manifests/latest" | jq -r '.layers[-1].digest')
  hex=${blob#sha256:}
  data=$GANTRY_TEST_REGISTRY_HTTP_STORAGE/docker/registry/v2/blobs/sha256/${hex:0:2}/$hex/data
  [ -f "$data" ]
  printf 'X' | dd of="$data" bs=1 seek=20 conv=notrunc 2>/dev/null
  run "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$name"
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "$blob"
  [ "$(echo "$output" | wc -l)" -eq 1 ]
  # No image: neither a whole squashfs nor a record. Stored as layers (the default), layers below the
  # corrupt one may have been published meanwhile, each complete and verified (a later pull reuses
  # them, gc collects them unused), never the corrupt blob's.
  [ -z "$(ls "$STORE/images" | grep -v '^layer-')" ]
  for f in "$STORE"/images/layer-*.sqsh; do
    [ -e "$f" ] || continue
    [ -f "${f%.sqsh}.json" ]
    unsquashfs -s "$f" >/dev/null
  done
  ! grep -qs "$blob" "$STORE"/images/layer-*.json || false
}

@test "a missing repository is a clear 404 error" {
  run "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/does-not-exist:latest"
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$(echo "$output" | wc -l)" -eq 1 ]
  echo "$output" | grep -q "gantry-test/does-not-exist"
}

@test "500s and a truncated download are retried and the pull succeeds" {
  digest=$(fresh_image "flaky-$RANDOM$RANDOM" 500000)
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  python3 "$GANTRY_SOURCE_DIR/tests/integration/fake_upstream.py" --upstream "$REG" --port-file "$T/port" \
    --log "$T/front.log" --fail-status 500 --fail-count 2 --truncate-blobs 1 &
  KILL_PIDS="$!"
  for _ in $(seq 50); do [ -s "$T/port" ] && break; sleep 0.1; done
  front="127.0.0.1:$(awk '{print $1}' "$T/port")"
  run "$GANTRY" pull --quiet --store "$STORE" "$front/gantry-test/$name"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$digest" ]
}

@test "a full disk fails cleanly: one error line, no image, and the next pull works" {
  mkdir -p "$T/small"
  mount -t tmpfs -o size=600k tmpfs "$T/small"
  digest=$(fresh_image "full-$RANDOM$RANDOM" 2000000)
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  run "$GANTRY" pull --quiet --store "$T/small/store" "$REG/gantry-test/$name"
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -qi "no space left on device"
  [ -z "$(ls "$T/small/store/images")" ]
  umount "$T/small"
  run "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$name"
  [ "$status" -eq 0 ]
}

@test "a layer beyond max_layer_bytes fails the pull naming layer and key, publishes nothing; the defaults pull it" {
  digest=$(fresh_image "limit-$RANDOM$RANDOM" 3000000)
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  layer=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name/manifests/latest" | jq -r '.layers[-1].digest')
  # The unique layer holds 3 000 000 random bytes: more than 2.5 MiB of tar; tiny's layer below it
  # (2.0 MiB of tar) stays within the limit, so only the unique layer breaks it, whichever order the
  # layers are converted in (a whole image's from the top, an image stored as layers as they arrive).
  printf 'max_layer_bytes = 2621440\n' > "$T/limit.conf"
  pull_fails_in_one_line "$T/limit.conf" "$name"
  echo "$output" | grep -qF "pulling $REG/gantry-test/$name"
  echo "$output" | grep -qF "converting layer $layer: "
  echo "$output" | grep -qF "expands beyond max_layer_bytes = 2621440 (2.5 MiB) uncompressed; raise max_layer_bytes in gantry.conf if the image is genuine"
  # No image. (Stored as layers, those below the one that broke the limit may be published: each is
  # complete and verified, and the next pull of any image having them reuses them.)
  [ -z "$(ls "$STORE/images" | grep -v '^layer-')" ]
  ! gantry_image_stored "$STORE" "$digest" || false
  # No partial squashfs, and not the blob that broke the limit (verified blobs may stay for a resume).
  [ -z "$(find "$STORE/staging" -name 'image.sqsh*')" ]
  [ -z "$(find "$STORE/staging" -name "${layer#sha256:}*")" ]

  : > "$T/default.conf"
  run env GANTRY_CONFIG="$T/default.conf" "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$name"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$digest" ]
}

@test "a decompression bomb under the default gantry.conf: max_layer_ratio stops it after 1 GiB, nothing published" {
  # One zstd layer of 1.2 GiB of zeros: about 40 KB, a ratio near 30,000. max_layer_bytes (64 GiB)
  # would let it expand to the end; the ratio limit (1000, and 1 GiB for any layer) stops it.
  local name=bomb-$RANDOM$RANDOM layout=$T/layout-bomb
  cp -a "$GANTRY_TEST_OCI_TINY" "$layout"
  python3 -c '
import sys, tarfile
class Zeros:
    def read(self, n):
        return bytes(n)
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as t:
    info = tarfile.TarInfo("zeros")
    info.size = 1200 << 20
    t.addfile(info, Zeros())
' | python3 "$GANTRY_SOURCE_DIR/tests/images/oci.py" add-layer "$layout" latest - --compress zstd >/dev/null
  skopeo copy -q --dest-tls-verify=false "oci:$layout:latest" "docker://$REG/gantry-test/$name:latest"
  manifest=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name/manifests/latest")
  layer=$(echo "$manifest" | jq -r '.layers[-1].digest')
  [ "$(echo "$manifest" | jq -r '.layers[-1].size')" -lt 1000000 ]
  : > "$T/default.conf"
  pull_fails_in_one_line "$T/default.conf" "$name"
  echo "$output" | grep -qF "converting layer $layer: expands beyond max_layer_ratio = 1000 times its compressed size of "
  echo "$output" | grep -qF ", and past the 1.0 GiB any layer may expand to, uncompressed (a decompression bomb?); raise max_layer_ratio in gantry.conf if the image is genuine"
  [ -z "$(ls "$STORE/images" | grep -v '^layer-')" ]
  [ -z "$(find "$STORE/staging" -name 'image.sqsh*')" ]
  [ -z "$(find "$STORE/staging" -name "${layer#sha256:}*")" ]
  # An admin who knows the image is genuine raises the key: the ratio then lets it through.
  printf 'max_layer_ratio = 100000\n' > "$T/ratio.conf"
  run env GANTRY_CONFIG="$T/ratio.conf" "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$name"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "layers declared beyond max_image_bytes are refused before a byte is downloaded" {
  digest=$(fresh_image "declared-$RANDOM$RANDOM" 300000)
  name=$(ls "$T" | grep '^layout-' | sed 's/^layout-//')
  layer=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name/manifests/latest" | jq -r '.layers[-1].digest')
  before=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$layer")
  printf 'max_image_bytes = 100000\n' > "$T/limit.conf"
  run env GANTRY_CONFIG="$T/limit.conf" "$GANTRY" pull --quiet --store "$STORE" "$REG/gantry-test/$name"
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$(echo "$output" | wc -l)" -eq 1 ]
  echo "$output" | grep -qF "more than max_image_bytes = 100000 (97.7 KiB) allows uncompressed; raise max_image_bytes in gantry.conf"
  [ -z "$(ls "$STORE/images")" ]
  # The 300 kB layer was never asked for.
  [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$layer")" -eq "$before" ]
}

@test "pull policy: a stored digest and --pull=never/missing run with no network at all; always needs the registry" {
  local tag="$REG/$GANTRY_TEST_IMAGE_TINY" pinned="$REG/${GANTRY_TEST_IMAGE_TINY%:*}@$GANTRY_TEST_DIGEST_TINY"
  run "$GANTRY" pull --quiet --store "$STORE" "$tag"
  [ "$status" -eq 0 ]
  # `unshare -n`: a network namespace with nothing in it, not even loopback: any registry request fails.
  offline() { run unshare -n "$@"; }
  offline "$GANTRY" run --store "$STORE" "$pinned" sh -c 'echo ran-offline'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *ran-offline* ]]
  offline "$GANTRY" run --store "$STORE" --pull=never "$tag" true
  [ "$status" -eq 0 ]
  # Nothing is resolved, so nothing says so: a batch job's stderr stays the command's own.
  [ -z "$output" ]
  GANTRY_PULL_POLICY=missing offline "$GANTRY" run --store "$STORE" "$tag" true
  [ "$status" -eq 0 ]
  [ -z "$output" ]
  offline "$GANTRY" pull --quiet --store "$STORE" --pull=missing "$tag"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$GANTRY_TEST_DIGEST_TINY" ]
  # The default (always) asks the registry what the tag names now: offline, that fails.
  offline "$GANTRY" run --store "$STORE" "$tag" true
  [ "$status" -ne 0 ]
  # ... naming the stored resolution and the way to run it offline.
  [[ "$output" == *"the store has the image this tag named at "*" (${GANTRY_TEST_DIGEST_TINY:0:19}...): --pull=missing"* ]]
  # never: an image the store has not got is an error that says what to do, without trying the network.
  offline "$GANTRY" run --store "$STORE" --pull=never "$REG/gantry-test/not-there:1" true
  [ "$status" -ne 0 ]
  [[ "$output" == *"is not in the store $STORE and the pull policy is 'never'; pull it first (gantry pull $REG/gantry-test/not-there:1)"* ]]
  # A bad policy is a usage error naming the option.
  run "$GANTRY" pull --store "$STORE" --pull=sometimes "$tag"
  [ "$status" -eq 2 ]
  [[ "$output" == *"--pull: unknown pull policy 'sometimes' (valid: always, missing, never)"* ]]
  # private_images: the registry vouches for every pull, so `never` is refused and a stored tag is
  # resolved again (the registry is asked even under `missing`).
  printf 'private_images = 1\n' >"$T/private.conf"
  GANTRY_CONFIG=$T/private.conf offline "$GANTRY" pull --quiet --store "$STORE" --pull=missing "$tag"
  [ "$status" -ne 0 ]
  GANTRY_CONFIG=$T/private.conf offline "$GANTRY" pull --quiet --store "$STORE" --pull=never "$tag"
  [ "$status" -ne 0 ]
  [[ "$output" == *"the pull policy 'never' is not available"* ]]
}
