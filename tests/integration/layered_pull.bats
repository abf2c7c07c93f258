# fixtures: registry images
# `gantry pull --layered` (issue #19, docs/store.md "Layers") against the real harness registry: one
# squashfs per layer in overlay form, named by chain ID; the kernel's overlayfs stacking them (with
# `userxattr`, the one form both backends use) must show exactly umoci's tree of the image; a new tag
# on a stored base downloads and converts only its new layer; gc counts layers per reference. Needs
# root (loop mounts, overlayfs).

load helpers

bats_require_minimum_version 1.5.0  # run --separate-stderr

setup() {
  gantry_load_env registry images
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  REG=$GANTRY_TEST_REGISTRY_HTTP
  T=$(mktemp -d /tmp/gantry-layered-test.XXXXXX)
  STORE=$T/store
  TREECMP=$GANTRY_SOURCE_DIR/tests/integration/treecmp.py
  COUNT=$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh
  GANTRY_MOUNTS=()
}

teardown() {
  for pid in ${KILL_PIDS:-}; do kill -9 "$pid" 2>/dev/null || true; done
  gantry_unmount_all
  rm -rf "$T"
}

# layer_chain DIGEST: the image record's chain IDs, bottom first, one per line.
layer_chain() {
  gantry_layer_chain "$STORE/images/${1#sha256:}.json"
}

# mount_stack DIGEST DIR: the image's layers stacked at DIR (gantry_image_tree of its record).
mount_stack() {
  gantry_image_tree "$STORE/images/${1#sha256:}.json" "$2"
}

# tiny_and_new_tag KIND: tiny, then a new tag on it (tiny + one layer, gantry_fresh_image), both
# pulled --layered into STORE; sets name and digest (the new tag's).
tiny_and_new_tag() {
  run "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  [ "$status" -eq 0 ]
  name=layered-$1-$RANDOM$RANDOM
  digest=$(gantry_fresh_image "$T" "$name")
  run "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/gantry-test/$name:latest"
  [ "$status" -eq 0 ]
}

@test "pull --layered: one squashfs per layer, and their overlay stack is umoci's tree of each test image" {
  local name var ref digest n layers
  for name in tiny layers debian zstd tiny-docker; do
    var=$(echo "$name" | tr 'a-z-' 'A-Z_')
    ref=GANTRY_TEST_REF_$var image=GANTRY_TEST_IMAGE_$var digest=GANTRY_TEST_DIGEST_$var
    [ -n "${!image:-}" ] && [ -d "${!ref:-}" ] || { echo "no test image $name" >&2; false; }
    echo "# $name" >&3
    run "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/${!image}"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(echo "$output" | tail -n1)" = "${!digest} $STORE/images/${!digest#sha256:}.json" ]
    # No whole-image squashfs; one layer file per layer of the manifest.
    [ ! -e "$STORE/images/${!digest#sha256:}.sqsh" ]
    layers=$(python3 -c 'import json, sys; print(len(json.loads(json.load(open(sys.argv[1]))["manifest"])["layers"]))' \
      "$STORE/images/${!digest#sha256:}.json")
    n=$(layer_chain "${!digest}" | wc -l)
    [ "$n" -eq "$layers" ]
    while read -r chain; do [ -f "$STORE/images/layer-${chain#sha256:}.sqsh" ]; done < <(layer_chain "${!digest}")
    run "$GANTRY" images --store "$STORE" --format json
    python3 -c 'import json, sys; d = {i["digest"]: i for i in json.loads(sys.argv[1])}; assert d[sys.argv[2]]["layers"] == int(sys.argv[3]), d' \
      "$output" "${!digest}" "$layers"
    mount_stack "${!digest}" "$T/merged-$name"
    python3 "$TREECMP" --ignore-dir-mtime "${!ref}" "$T/merged-$name"
  done
}

@test "export of a layered image: one Enroot squashfs whose tree is umoci's, made from the layer files alone" {
  local name var ref image digest
  for name in layers tiny debian; do
    var=$(echo "$name" | tr 'a-z-' 'A-Z_')
    ref=GANTRY_TEST_REF_$var image=GANTRY_TEST_IMAGE_$var digest=GANTRY_TEST_DIGEST_$var
    run "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/${!image}"
    [ "$status" -eq 0 ]
    [ ! -e "$STORE/images/${!digest#sha256:}.sqsh" ]
    run "$GANTRY" export --store "$STORE" "${!digest}" -o "$T/$name.sqsh"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$output" = "$T/$name.sqsh" ]
    # Nothing was added to the store: the composition reads the layer files.
    [ ! -e "$STORE/images/${!digest#sha256:}.sqsh" ]
    # One file; no overlay markers left in it (no 0/0 devices, no opaque xattrs).
    rm -rf "$T/x-$name"
    unsquashfs -q -n -d "$T/x-$name" "$T/$name.sqsh" >/dev/null
    [ -z "$(find "$T/x-$name" -type c)" ]
    [ -z "$(getfattr -R -d -m 'overlay' --absolute-names "$T/x-$name" 2>/dev/null)" ]
    grep -q '^PATH=' "$T/x-$name/etc/environment"
    [ -x "$T/x-$name/etc/rc" ]
    if [ -e "${!ref}/etc/rc" ]; then cp -a "${!ref}/etc/rc" "$T/x-$name/etc/rc"; else rm "$T/x-$name/etc/rc"; fi
    if [ -e "${!ref}/etc/environment" ]; then cp -a "${!ref}/etc/environment" "$T/x-$name/etc/environment"; else rm "$T/x-$name/etc/environment"; fi
    python3 "$TREECMP" --ignore-dir-mtime "${!ref}" "$T/x-$name"
  done
  # The exported file runs as any Enroot image does.
  run "$GANTRY" run --image-file "$T/layers.sqsh" -- cat /etc/environment
  echo "$output"
  [ "$status" -eq 0 ]
  grep -q '^PATH=' <<< "$output"
}

# top_blob LAYOUT: the digest of the top layer's blob of the image tagged latest.
top_blob() {
  python3 - "$1" <<'PY'
import json, sys
layout = sys.argv[1]
def load(d): return json.load(open(f"{layout}/blobs/{d.replace(':', '/')}"))
idx = json.load(open(f"{layout}/index.json"))
desc = next(m for m in idx["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == "latest")
print(load(desc["digest"])["layers"][-1]["digest"])
PY
}

@test "pull --layered of a new tag on a stored base downloads and converts only its new layer" {
  run "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  [ "$status" -eq 0 ]
  base_layers=$(ls "$STORE"/images/layer-*.sqsh | wc -l)
  base_bytes=$(du -sb "$STORE/images" | cut -f1)
  name=layered-$RANDOM$RANDOM
  digest=$(gantry_fresh_image "$T" "$name" 200000)
  top=$(top_blob "$T/layout-$name")
  base_blobs=$(python3 -c 'import json, sys; print(" ".join(l["digest"] for l in json.loads(json.load(open(sys.argv[1]))["manifest"])["layers"]))' \
    "$STORE/images/${GANTRY_TEST_DIGEST_TINY#sha256:}.json")
  declare -A before
  for b in $base_blobs; do before[$b]=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b"); done
  run "$GANTRY" pull --layered --store "$STORE" "$REG/gantry-test/$name:latest"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"as layers in "*": 1 layers converted ("*"), $base_layers reused"* ]]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$digest" ]
  # One GET of the new layer's blob; none of the base's, which came from the store (their blobs are
  # the same in both repositories of this registry).
  [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$top")" -eq 1 ]
  for b in $base_blobs; do [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")" -eq "${before[$b]}" ]; done
  [ "$(ls "$STORE"/images/layer-*.sqsh | wc -l)" -eq $((base_layers + 1)) ]
  # The store grew by the new layer's squashfs and a few small records, nothing more.
  top_chain=$(layer_chain "$digest" | tail -n1)
  top_sqsh=$(stat -c %s "$STORE/images/layer-${top_chain#sha256:}.sqsh")
  grown=$(($(du -sb "$STORE/images" | cut -f1) - base_bytes))
  echo "# store grew $grown bytes; the new layer's squashfs is $top_sqsh" >&3
  [ "$grown" -le $((top_sqsh * 11 / 10 + 65536)) ]
  # The two images share the base's chain IDs.
  [ "$(layer_chain "$digest" | head -n "$base_layers")" = "$(layer_chain "$GANTRY_TEST_DIGEST_TINY")" ]
  mount_stack "$digest" "$T/merged"
  [ -f "$T/merged/unique/id" ]
  [ "$(stat -c %s "$T/merged/unique/payload")" -eq 200000 ]
  [ -d "$T/merged/bin" ]
}

@test "an image stored as layers: a pull with layered_images = no makes its whole squashfs from the layers, downloading nothing; under --pull=never with no request to the registry at all" {
  run "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_LAYERS"
  [ "$status" -eq 0 ]
  hex=${GANTRY_TEST_DIGEST_LAYERS#sha256:}
  [ ! -e "$STORE/images/$hex.sqsh" ]
  printf 'layered_images = no\n' >"$T/whole.conf"
  repo=${GANTRY_TEST_IMAGE_LAYERS%:*}
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/$repo/manifests/latest" | jq -r '.layers[].digest')
  declare -A before
  for b in $blobs; do before[$b]=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b"); done
  requests() { grep -c "/v2/$repo/" "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true; }
  requests_before=$(requests)
  # --pull=never: the store answers for the tag, and the file is made from the layers and the record's
  # own manifest and config; the registry is not asked for anything.
  run env GANTRY_CONFIG="$T/whole.conf" "$GANTRY" pull --quiet --pull never --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_LAYERS"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1)" = "$GANTRY_TEST_DIGEST_LAYERS $STORE/images/$hex.sqsh" ]
  [ -f "$STORE/images/$hex.sqsh" ]
  [ "$(requests)" -eq "$requests_before" ]
  # The record is a whole image's now; a plain pull (tag resolved at the registry) is served by it.
  ! jq -e '.layer_chain | length > 0' "$STORE/images/$hex.json" >/dev/null || false
  run env GANTRY_CONFIG="$T/whole.conf" "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_LAYERS"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1)" = "$GANTRY_TEST_DIGEST_LAYERS $STORE/images/$hex.sqsh" ]
  # Made from the stored layers: no layer blob was asked for again, and the file is umoci's tree
  # (whiteouts and opaque directories applied, no overlay markers left).
  for b in $blobs; do [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")" -eq "${before[$b]}" ]; done
  rm -rf "$T/whole"
  unsquashfs -q -n -d "$T/whole" "$STORE/images/$hex.sqsh" >/dev/null
  [ -z "$(find "$T/whole" -type c)" ]
  python3 "$TREECMP" --ignore-dir-mtime "$GANTRY_TEST_REF_LAYERS" "$T/whole"
  # It serves the extract backend.
  run "$GANTRY" run --store "$STORE" --pull never --backend extract "$REG/$GANTRY_TEST_IMAGE_LAYERS" true
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "layered_images = yes: a plain pull stores layers, and the plugin's report names them bottom first" {
  printf 'layered_images = yes\n' >"$T/gantry.conf"
  export GANTRY_CONFIG=$T/gantry.conf
  run "$GANTRY" pull --quiet --store "$STORE" --report-fd 3 "$REG/$GANTRY_TEST_IMAGE_TINY" 3>"$T/report"
  echo "$output"
  [ "$status" -eq 0 ]
  hex=${GANTRY_TEST_DIGEST_TINY#sha256:}
  [ ! -e "$STORE/images/$hex.sqsh" ]
  python3 - "$T/report" "$STORE" "$(layer_chain "$GANTRY_TEST_DIGEST_TINY" | tr '\n' ' ')" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
chain = sys.argv[3].split()
want = [f"{sys.argv[2]}/images/layer-{c.split(':')[1]}.sqsh" for c in chain]
assert r["error"]["kind"] == "none", r
assert r["layers"] == want, (r["layers"], want)
assert r["squashfs"] == want[-1], r["squashfs"]
PY
  # mount_backend = extract needs whole images: then the pull makes one.
  printf 'layered_images = yes\nmount_backend = extract\n' >"$T/gantry.conf"
  run "$GANTRY" pull --quiet --store "$T/store2" "$REG/$GANTRY_TEST_IMAGE_TINY"
  [ "$status" -eq 0 ]
  [ -f "$T/store2/images/$hex.sqsh" ]
  # A store that held the image whole before layered_images was set keeps serving that file: no
  # blob fetched, no layer made (docs/store.md, whole images in a layered store).
  printf 'layered_images = yes\n' >"$T/gantry.conf"
  gets=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')
  run "$GANTRY" pull --quiet --store "$T/store2" --report-fd 3 "$REG/$GANTRY_TEST_IMAGE_TINY" 3>"$T/report2"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1)" = "$GANTRY_TEST_DIGEST_TINY $T/store2/images/$hex.sqsh" ]
  [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')" -eq "$gets" ]
  ! ls "$T"/store2/images/layer-* 2>/dev/null
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["layers"] == [] and r["squashfs"].endswith(".sqsh"), r' "$T/report2"
}

@test "gc: removing a layered image frees its own layers and keeps those another image names" {
  tiny_and_new_tag gc
  total=$(ls "$STORE"/images/layer-*.sqsh | wc -l)
  top_chain=$(layer_chain "$digest" | tail -n1)
  # By age: the fresh image unused for two hours, tiny just used.
  touch -d '2 hours ago' "$STORE/used/${digest#sha256:}"
  run "$GANTRY" gc --store "$STORE" --unused-for 1h
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"removed $digest"* ]]
  [[ $output == *"removed layer $top_chain"* ]]
  [ "$(ls "$STORE"/images/layer-*.sqsh | wc -l)" -eq $((total - 1)) ]
  # Tiny's layers stay, and its stack still mounts.
  mount_stack "$GANTRY_TEST_DIGEST_TINY" "$T/merged"
  python3 "$TREECMP" --ignore-dir-mtime "$GANTRY_TEST_REF_TINY" "$T/merged"
}

@test "gantry run as root stacks a layered image's layers with the kernel backend, read-only and --writable" {
  tiny_and_new_tag run
  id=$(cat "$T/uniq-$name/unique/id")
  # No network: the stored layers serve it, and no whole squashfs is made.
  run "$GANTRY" run --store "$STORE" --pull never --backend kernel "$REG/gantry-test/$name:latest" \
    sh -c 'cat /unique/id; test -x /bin/busybox && echo has-busybox; grep " /bin " /proc/self/mountinfo'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"$id"* ]]
  [[ $output == *has-busybox* ]]
  [[ $output == *" - overlay "* ]]
  [ ! -e "$STORE/images/${digest#sha256:}.sqsh" ]
  # The stack itself is a node-wide mount too (/run/gantry/images/<key>, source "overlay" and the
  # layer files bottom first), which the next container reuses: the same mount, not a new one.
  src=$(grep -lx overlay /run/gantry/images/*/source | xargs grep -l "^$STORE/images/layer-" | head -n1)
  [ -n "$src" ]
  stack=$(dirname "$src")
  [ "$(tail -n +2 "$src" | sed 's|.*/layer-|sha256:|; s|\.sqsh$||')" = "$(layer_chain "$digest")" ]
  mount_id() { awk -v d="$1" '$5 == d {print $1}' /proc/self/mountinfo; }
  first=$(mount_id "$stack/root")
  [ -n "$first" ]
  [ "$(findmnt -n -o FSTYPE "$stack/root")" = overlay ]
  # Each layer is mounted once on the node, shared: tiny's layer mount serves both images' stacks.
  run "$GANTRY" run --store "$STORE" --pull never --backend kernel --writable "$REG/gantry-test/$name:latest" \
    sh -c 'echo written > /unique/new && cat /unique/new /unique/id'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *written* ]]
  [ "$(mount_id "$stack/root")" = "$first" ]
  [ "$(grep -lx overlay /run/gantry/images/*/source | xargs grep -l "^$STORE/images/layer-" | wc -l)" -eq 1 ]
  # The extract backend cannot stack layers: under --pull=never the whole file is made from them
  # (no registry), and the extract backend runs it.
  [ ! -e "$STORE/images/${digest#sha256:}.sqsh" ]
  run "$GANTRY" run --store "$STORE" --pull never --backend extract "$REG/gantry-test/$name:latest" cat /unique/id
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"$(cat "$T/uniq-$name/unique/id")"* ]]
  [ -f "$STORE/images/${digest#sha256:}.sqsh" ]
}

@test "an unprivileged user runs a layered image from a store of their own with the fuse backend, its stack from a shared server" {
  TUSER=$("$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  gantry_open_fuse
  chmod 0755 "$T"
  USTORE=$T/ustore
  mkdir "$USTORE"
  chown "$TUSER" "$USTORE"
  name=layered-fuse-$RANDOM$RANDOM
  digest=$(gantry_fresh_image "$T" "$name")
  id=$(cat "$T/uniq-$name/unique/id")
  run runuser -u "$TUSER" -- "$GANTRY" pull --layered --quiet --store "$USTORE" "$REG/gantry-test/$name:latest"
  echo "$output"
  [ "$status" -eq 0 ]
  run runuser -u "$TUSER" -- "$GANTRY" run --store "$USTORE" --pull never "$REG/gantry-test/$name:latest" \
    sh -c 'cat /unique/id; id -u; grep " /bin " /proc/self/mountinfo; test -x /bin/busybox && echo has-busybox'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"$id"* ]]
  [[ $output == *has-busybox* ]]
  [[ $output == *" - overlay "* ]]
  [ ! -e "$USTORE/images/${digest#sha256:}.sqsh" ]
  # The stack comes from the user's shared server (image_server.cpp): one `gantry-holder
  # --serve-image` for the image with one gantry-imagefs per layer, which stays for the next
  # container; a second container is served by the same server and daemons.
  server=$(pgrep -u "$TUSER" -f 'serve-image /proc/self/fd/')
  [ "$(echo "$server" | wc -l)" -eq 1 ]
  daemons=$(pgrep -u "$TUSER" -f "gantry-imagefs.*/proc/self/fd/" | sort)
  [ "$(echo "$daemons" | wc -l)" -eq "$(ls "$USTORE"/images/layer-*.sqsh | wc -l)" ]
  [ "$(echo "$daemons" | wc -l)" -eq 2 ]  # tiny's layer and the new one
  run runuser -u "$TUSER" -- "$GANTRY" run --store "$USTORE" --pull never "$REG/gantry-test/$name:latest" \
    sh -c 'cat /unique/id; grep " / " /proc/self/mountinfo'
  echo "$output"
  gantry_restore_fuse
  [ "$status" -eq 0 ]
  [[ $output == *"$id"* ]]
  [ "$(pgrep -u "$TUSER" -f 'serve-image /proc/self/fd/')" = "$server" ]
  [ "$(pgrep -u "$TUSER" -f "gantry-imagefs.*/proc/self/fd/" | sort)" = "$daemons" ]
  # Its daemons go with it (no gantry-imagefs of the user's is left serving a layer).
  kill "$server"
  for _ in $(seq 50); do pgrep -u "$TUSER" -f "gantry-imagefs.*/proc/self/fd/" >/dev/null || break; sleep 0.1; done
  ! pgrep -u "$TUSER" -f "gantry-imagefs.*/proc/self/fd/" || false
}

@test "the default gantry.conf where the fuse backend cannot run (no /dev/fuse access, not root): gantry run stores the image whole for extract, and makes stored layers whole without a download" {
  TUSER=$("$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  chmod 0755 "$T"
  USTORE=$T/ustore
  mkdir "$USTORE"
  chown "$TUSER" "$USTORE"
  : >"$T/default.conf"  # every key at its default: layered_images = yes, mount_backend = auto
  # /dev/fuse unusable for the user in a mount namespace of this test only (a mode-000 node bound
  # over it); the host's /dev/fuse is not touched.
  mknod "$T/nofuse" c 10 229
  chmod 000 "$T/nofuse"
  no_fuse() {
    unshare -m sh -c 'mount --bind "$1" /dev/fuse && shift && exec "$@"' sh "$T/nofuse" \
      runuser -u "$TUSER" -- env GANTRY_CONFIG="$T/default.conf" "$@"
  }
  # 1. A new image: stored whole (the extract backend, which auto falls back to, cannot stack layers).
  name=nofuse-$RANDOM$RANDOM
  digest=$(gantry_fresh_image "$T" "$name")
  id=$(cat "$T/uniq-$name/unique/id")
  run no_fuse "$GANTRY" run --store "$USTORE" "$REG/gantry-test/$name:latest" cat /unique/id
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"$id"* ]]
  [[ $output == *"the fuse backend cannot run here"* ]]
  [ -f "$USTORE/images/${digest#sha256:}.sqsh" ]
  [ -z "$(ls "$USTORE/images" | grep '^layer-')" ]
  # 2. An image the store holds as layers (pulled where fuse works): made whole from them, no blob GET.
  name2=nofuse2-$RANDOM$RANDOM
  digest2=$(gantry_fresh_image "$T" "$name2")
  id2=$(cat "$T/uniq-$name2/unique/id")
  run runuser -u "$TUSER" -- env GANTRY_CONFIG="$T/default.conf" "$GANTRY" pull --quiet --store "$USTORE" "$REG/gantry-test/$name2:latest"
  [ "$status" -eq 0 ]
  [ ! -e "$USTORE/images/${digest2#sha256:}.sqsh" ]
  [ -n "$(ls "$USTORE/images" | grep '^layer-')" ]
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name2/manifests/latest" | jq -r '.layers[].digest')
  declare -A before
  for b in $blobs; do before[$b]=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b"); done
  run no_fuse "$GANTRY" run --store "$USTORE" --pull never "$REG/gantry-test/$name2:latest" cat /unique/id
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"$id2"* ]]
  [ -f "$USTORE/images/${digest2#sha256:}.sqsh" ]
  for b in $blobs; do [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")" -eq "${before[$b]}" ]; done
}

@test "pull --layered of an image that lists one blob twice: both layers are converted and stacked" {
  local layout=$T/layout-dup reg=$GANTRY_TEST_REGISTRY_HTTP name=layered-dup-$RANDOM$RANDOM
  cp -a "$GANTRY_TEST_OCI_TINY" "$layout"
  mkdir -p "$T/dup/dup"
  echo "$name" >"$T/dup/dup/id"
  tar -C "$T/dup" -cf "$T/dup.tar" dup
  for i in 1 2; do
    python3 "$GANTRY_SOURCE_DIR/tests/images/oci.py" add-layer "$layout" latest "$T/dup.tar" --compress gzip >/dev/null
  done
  skopeo copy -q --dest-tls-verify=false "oci:$layout:latest" "docker://$reg/gantry-test/$name:latest"
  run "$GANTRY" pull --layered --store "$STORE" "$REG/gantry-test/$name:latest"
  echo "$output"
  [ "$status" -eq 0 ]
  digest=$(echo "$output" | tail -n1 | awk '{print $1}')
  # Two layers of one blob: two chain IDs, both converted.
  [ "$(python3 -c 'import json, sys; l = json.loads(json.load(open(sys.argv[1]))["manifest"])["layers"]; print(l[-1]["digest"] == l[-2]["digest"])' \
    "$STORE/images/${digest#sha256:}.json")" = True ]
  [ "$(layer_chain "$digest" | sort -u | wc -l)" -eq "$(layer_chain "$digest" | wc -l)" ]
  mount_stack "$digest" "$T/merged"
  [ "$(cat "$T/merged/dup/id")" = "$name" ]
}

# deep_layout LAYOUT N: tiny plus N-1 gzip layers (so N layers in all); layer i adds /deep/i, and
# some delete or hide what layers in other groups (runs of 8, docs/store.md "Deep images") made.
deep_layout() {
  local layout=$1 n=$2 i d
  cp -a "$GANTRY_TEST_OCI_TINY" "$layout"
  for i in $(seq 1 $((n - 1))); do
    d=$T/deep$i
    mkdir -p "$d/deep"
    echo "$i" >"$d/deep/$i"
    case $i in
      3) mkdir -p "$d/deep/d" && echo x >"$d/deep/d/x" ;;
      5) mkdir -p "$d/deep/gone" && echo a >"$d/deep/gone/a" ;;
      9) : >"$d/deep/.wh.3" && mkdir -p "$d/deep/d" && : >"$d/deep/d/.wh..wh..opq" && echo y >"$d/deep/d/y" ;;
      12) : >"$d/deep/.wh.gone" && mkdir -p "$d/deep/gone2" ;;
      13) : >"$d/deep/.wh.10" ;;
      17) : >"$d/deep/.wh.9" && echo "file now" >"$d/deep/gone" ;;
      19) mkdir -p "$d/deep/d" && : >"$d/deep/d/.wh.y" ;;
    esac
    tar -C "$d" -cf "$d.tar" deep
    python3 "$GANTRY_SOURCE_DIR/tests/images/oci.py" add-layer "$layout" latest "$d.tar" >/dev/null
  done
}

@test "a 20-layer image is stacked from groups: 6 lowers, umoci's tree; a tag with one more layer converts only it" {
  local layout=$T/layout-deep name=layered-deep-$RANDOM$RANDOM n
  deep_layout "$layout" 20
  skopeo copy -q --dest-tls-verify=false "oci:$layout:latest" "docker://$REG/gantry-test/$name:latest"
  run "$GANTRY" pull --layered --store "$STORE" "$REG/gantry-test/$name:latest"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *": 20 layers converted ("*"), 0 reused"* ]]
  digest=$(echo "$output" | tail -n1 | awk '{print $1}')
  # Layers 1-8 and 9-16 as two groups, 17-20 one by one: six lowers, six files; the grouped layers
  # are not stored on their own.
  [ "$(layer_chain "$digest" | wc -l)" -eq 6 ]
  [ "$(ls "$STORE"/images/layer-*.sqsh | wc -l)" -eq 6 ]
  run "$GANTRY" images --store "$STORE" --format json
  python3 -c 'import json, sys; d = {i["digest"]: i for i in json.loads(sys.argv[1])}[sys.argv[2]]; assert (d["layers"], d["lowers"]) == (20, 6), d' \
    "$output" "$digest"
  for n in 1 2; do
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert len(r["group_diff_ids"]) == 8, r'       "$STORE/images/layer-$(layer_chain "$digest" | sed -n "${n}p" | cut -d: -f2).json"
  done
  # The kernel's overlayfs over the six shows umoci's tree (whiteouts and an opaque directory of one
  # group hide what another made; a loose layer deletes from a group and replaces a directory).
  umoci raw unpack --image "$layout:latest" "$T/ref" 2>/dev/null
  [ ! -e "$T/ref/deep/3" ] && [ ! -e "$T/ref/deep/d/x" ] && [ ! -e "$T/ref/deep/d/y" ] && [ -f "$T/ref/deep/gone" ]
  mount_stack "$digest" "$T/merged"
  python3 "$TREECMP" --ignore-dir-mtime "$T/ref" "$T/merged"
  # The fuse backend stacks the same six.
  run "$GANTRY" run --store "$STORE" --pull never --backend fuse "$REG/gantry-test/$name:latest" \
    sh -c 'ls /deep | sort -n | tr "\n" " "; cat /deep/gone; ls -A /deep/d | wc -l'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"1 2 4 5 6 7 8 11 12 13 14 15 16 17 18 19 d gone gone2 "* ]] || [[ $output == *"d gone gone2 1 2 4 5 6 7 8 11 12 13 14 15 16 17 18 19 "* ]]
  [[ $output == *"file now"* ]]
  [ "$(echo "$output" | tail -n1)" = 0 ]

  # One more layer on top: the groups and loose layers are the stored ones; one blob downloaded.
  cp -a "$layout" "$T/layout-deep2"
  mkdir -p "$T/top/deep" && echo top >"$T/top/deep/top" && tar -C "$T/top" -cf "$T/top.tar" deep
  python3 "$GANTRY_SOURCE_DIR/tests/images/oci.py" add-layer "$T/layout-deep2" latest "$T/top.tar" >/dev/null
  skopeo copy -q --dest-tls-verify=false "oci:$T/layout-deep2:latest" "docker://$REG/gantry-test/$name-2:latest"
  top=$(top_blob "$T/layout-deep2")
  all_before=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')
  run "$GANTRY" pull --layered --store "$STORE" "$REG/gantry-test/$name-2:latest"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *": 1 layers converted ("*"), 20 reused"* ]]
  digest2=$(echo "$output" | tail -n1 | awk '{print $1}')
  [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$top")" -eq 1 ]
  # Two blob GETs in all: the new layer and the new image config.
  [ "$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')" -eq $((all_before + 2)) ]
  [ "$(layer_chain "$digest2" | wc -l)" -eq 7 ]
  [ "$(layer_chain "$digest2" | head -n6)" = "$(layer_chain "$digest")" ]
  # The whole image made from the groups and layers (extract, export) is umoci's tree too.
  run "$GANTRY" export --store "$STORE" "$REG/gantry-test/$name:latest" -o "$T/deep.sqsh"
  [ "$status" -eq 0 ]
  unsquashfs -q -n -d "$T/exported" "$T/deep.sqsh" >/dev/null
  [ -z "$(find "$T/exported" -type c)" ]  # no whiteout left in the one file
  [ -x "$T/exported/etc/rc" ] && rm "$T/exported/etc/rc" "$T/exported/etc/environment"  # Enroot's, added
  python3 "$TREECMP" --ignore-dir-mtime "$T/ref" "$T/exported"
}

@test "a 130-layer image, deeper than a layered image stacks (128), is stored whole and says so" {
  local layout=$T/layout-deep reg=$GANTRY_TEST_REGISTRY_HTTP name=layered-deep-$RANDOM$RANDOM i
  cp -a "$GANTRY_TEST_OCI_TINY" "$layout"
  for i in $(seq 1 129); do
    mkdir -p "$T/deep$i/deep"
    echo "$i" >"$T/deep$i/deep/$i"
    tar -C "$T/deep$i" -cf "$T/deep$i.tar" deep
    python3 "$GANTRY_SOURCE_DIR/tests/images/oci.py" add-layer "$layout" latest "$T/deep$i.tar" --compress none >/dev/null
  done
  skopeo copy -q --dest-tls-verify=false "oci:$layout:latest" "docker://$reg/gantry-test/$name:latest"
  run --separate-stderr "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/gantry-test/$name:latest"
  [ "$status" -eq 0 ]
  echo "$stderr"
  [ "$(echo "$stderr" | grep -c 'it has 130 layers, more than the 128 a layered image stacks; storing it as one whole squashfs')" -eq 1 ]
  digest=$(echo "$output" | tail -n1 | awk '{print $1}')
  [ -f "$STORE/images/${digest#sha256:}.sqsh" ]
  ! ls "$STORE"/images/layer-* 2>/dev/null
  run "$GANTRY" run --store "$STORE" --pull never --backend fuse "$REG/gantry-test/$name:latest" \
    sh -c 'ls /deep | wc -l; cat /deep/1 /deep/129; test -x /bin/busybox && echo has-busybox'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx 129
  [[ $output == *has-busybox* ]]
}

@test "16 concurrent layered pulls of a new image: all succeed, each blob is downloaded once, one record and one file per layer" {
  local name=layered-conc-$RANDOM$RANDOM digest b fails=0 job after
  digest=$(gantry_fresh_image "$T" "$name" 3000000)
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$REG/v2/gantry-test/$name/manifests/latest" | jq -r '.config.digest, .layers[].digest')
  declare -A before
  for b in $blobs; do before[$b]=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b"); done
  for i in $(seq 16); do
    "$GANTRY" pull --layered --quiet --store "$STORE" "$REG/gantry-test/$name" > "$T/out.$i" 2> "$T/err.$i" &
  done
  for job in $(jobs -p); do wait "$job" || fails=$((fails + 1)); done
  cat "$T"/err.* || true
  [ "$fails" -eq 0 ]
  [ "$(cat "$T"/out.* | sort -u)" = "$digest $STORE/images/${digest#sha256:}.json" ]
  for b in $blobs; do
    after=$("$COUNT" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")
    echo "blob $b: $((after - ${before[$b]})) GETs"
    [ $((after - ${before[$b]})) -eq 1 ]
  done
  [ "$(ls "$STORE"/images/layer-*.sqsh | wc -l)" -eq "$(layer_chain "$digest" | wc -l)" ]
  [ ! -e "$STORE/images/${digest#sha256:}.sqsh" ]
}

@test "a layered producer killed with SIGKILL is taken over by a waiting layered pull" {
  local name=layered-kill-$RANDOM$RANDOM digest
  digest=$(gantry_fresh_image "$T" "$name" 2000000)
  gantry_producer_takeover "$T" "$STORE" "$name" "$digest" --layered
  [ -f "$STORE/images/${digest#sha256:}.json" ]
  [ ! -e "$STORE/images/${digest#sha256:}.sqsh" ]
  while read -r chain; do [ -f "$STORE/images/layer-${chain#sha256:}.sqsh" ]; done < <(layer_chain "$digest")
  # The stack is the image: its unique file is there.
  mount_stack "$digest" "$T/merged-kill"
  cmp "$T/merged-kill/unique/id" "$T/uniq-$name/unique/id"
}
