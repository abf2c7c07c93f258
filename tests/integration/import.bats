# fixtures: registry images
# `gantry import` and `gantry export` end to end. skopeo (an independent implementation) copies the
# test images from the harness registry into every local format -- oci:DIR:TAG, oci-archive,
# docker-archive -- and each import must give the same config digest and the same tree as
# `gantry pull` of the image into another store (and as umoci's reference tree). A corrupted layer is
# refused with nothing left in the store. The export is read back with unsquashfs and run with
# `gantry run FILE.sqsh` as the unprivileged test user.

bats_require_minimum_version 1.5.0

load helpers

setup_file() {
  export TUSER
  TUSER=$("$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  gantry_open_fuse
}

teardown_file() {
  gantry_restore_fuse
}

setup() {
  gantry_load_env registry images
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  REG=$GANTRY_TEST_REGISTRY_HTTP
  TREECMP=$GANTRY_SOURCE_DIR/tests/integration/treecmp.py
  T=$(mktemp -d /tmp/gantry-import-test.XXXXXX)
  chmod 0755 "$T"
  printf 'insecure_registries = %s\n' "$REG" > "$T/gantry.conf"
  chmod 0644 "$T/gantry.conf"
  export GANTRY_CONFIG=$T/gantry.conf
  GANTRY_MOUNTS=()
}

teardown() {
  gantry_unmount_all
  rm -rf "$T"
}

# flip_byte_in_largest_member TAR: inverts one byte in the middle of the largest file member's data
# (member offsets from Python's tarfile), so that its digest no longer matches.
flip_byte_in_largest_member() {
  python3 - "$1" <<'PY'
import sys, tarfile
path = sys.argv[1]
with tarfile.open(path) as t:
    m = max((m for m in t.getmembers() if m.isfile()), key=lambda m: m.size)
    off = m.offset_data + m.size // 2
with open(path, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0xff]))
PY
}

# skopeo_to DEST: the image $1 from the open registry into skopeo's destination $2.
skopeo_to() { skopeo copy -q --src-tls-verify=false "docker://$REG/$1" "$2"; }

# config_digest STORE DIGEST: sha256 of the config bytes the store recorded for the image.
config_digest() {
  python3 -c 'import hashlib, json, sys
m = json.load(open(sys.argv[1] + "/images/" + sys.argv[2].split(":")[1] + ".json"))
print("sha256:" + hashlib.sha256(m["config"].encode()).hexdigest())' "$1" "$2"
}

# registry_config IMAGE: the config digest the registry's manifest names (read by skopeo).
registry_config() {
  skopeo inspect --raw --tls-verify=false "docker://$REG/$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])'
}

# pulled IMAGE: pulls it into $T/pulled; sets PULLED_DIGEST and PULLED_SQSH (the path pull printed:
# the image's squashfs, or its record when it is stored as layers).
pulled() {
  run "$GANTRY" pull --quiet --store "$T/pulled" "$REG/$1"
  echo "$output"
  [ "$status" -eq 0 ]
  PULLED_DIGEST=$(echo "$output" | tail -n1 | awk '{print $1}')
  PULLED_SQSH=$(echo "$output" | tail -n1 | awk '{print $2}')
}

# same_tree PATH_A PATH_B: the two stored images' trees (gantry_image_tree) are identical (treecmp,
# mtimes included).
same_tree() {
  local a=$T/a.$RANDOM$RANDOM b=$T/b.$RANDOM$RANDOM
  gantry_image_tree "$1" "$a"
  gantry_image_tree "$2" "$b"
  python3 "$TREECMP" "$a" "$b"
}

# imported SOURCE [OPTIONS...]: imports into $T/imported; sets DIGEST and SQSH (as PULLED_SQSH).
imported() {
  local source=$1
  shift
  run --separate-stderr "$GANTRY" import --store "$T/imported" "$@" "$source"
  echo "$output / $stderr"
  [ "$status" -eq 0 ]
  DIGEST=$(echo "$output" | tail -n1 | awk '{print $1}')
  SQSH=$(echo "$output" | tail -n1 | awk '{print $2}')
  [ -f "$SQSH" ]
}

@test "oci:DIR:TAG imports with the registry's manifest digest, config digest and tree" {
  pulled "$GANTRY_TEST_IMAGE_LAYERS"
  skopeo_to "$GANTRY_TEST_IMAGE_LAYERS" "oci:$T/layout:v1"
  imported "oci:$T/layout:v1"
  [ "$DIGEST" = "$PULLED_DIGEST" ]
  [ "$DIGEST" = "$GANTRY_TEST_DIGEST_LAYERS" ]
  want=$(registry_config "$GANTRY_TEST_IMAGE_LAYERS")
  got=$(config_digest "$T/imported" "$DIGEST")
  [ "$got" = "$want" ]
  [ "$(config_digest "$T/pulled" "$PULLED_DIGEST")" = "$want" ]
  same_tree "$PULLED_SQSH" "$SQSH"
  rm -rf "$T/a"
  gantry_image_tree "$SQSH" "$T/a"
  python3 "$TREECMP" --ignore-dir-mtime "$GANTRY_TEST_REF_LAYERS" "$T/a"
  # The work area is gone; importing again finds the image stored.
  [ -z "$(ls -A "$T/imported/staging")" ]
  run --separate-stderr "$GANTRY" import --store "$T/imported" "oci:$T/layout:v1"
  [ "$status" -eq 0 ]
  [[ "$stderr" == *"in the store already"* ]]
  # A tag the layout does not have: one line naming the tags it has.
  run "$GANTRY" import --store "$T/imported" "oci:$T/layout:v2"
  [ "$status" -eq 1 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ "$output" == "gantry: importing oci:$T/layout:v2: "*"no image tagged 'v2' (tags: v1)" ]]
}

@test "import --layered: the layers of a layered pull of the same image, shared with it; the stack is umoci's tree" {
  skopeo_to "$GANTRY_TEST_IMAGE_LAYERS" "oci:$T/layout:v1"
  imported "oci:$T/layout:v1" --layered
  [ "$DIGEST" = "$GANTRY_TEST_DIGEST_LAYERS" ]
  [ "$SQSH" = "$T/imported/images/${DIGEST#sha256:}.json" ]
  [[ $stderr == *"imported oci:$T/layout:v1 as layers in "* ]]
  [ ! -e "$T/imported/images/${DIGEST#sha256:}.sqsh" ]
  chain=$(gantry_layer_chain "$SQSH")
  n=$(python3 -c 'import json, sys; print(len(json.loads(json.load(open(sys.argv[1]))["manifest"])["layers"]))' "$SQSH")
  [ "$(echo $chain | wc -w)" -eq "$n" ]
  # A layered pull of the same image names the same layer files: nothing is downloaded or converted.
  gets=$("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')
  run "$GANTRY" pull --layered --quiet --store "$T/imported" "$REG/$GANTRY_TEST_IMAGE_LAYERS"
  [ "$status" -eq 0 ]
  [ "$("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" 'sha256:[0-9a-f]+')" -eq "$gets" ]
  # The whole image made from the imported layers (export) is umoci's tree.
  run "$GANTRY" export --store "$T/imported" "$DIGEST" -o "$T/exported.sqsh"
  [ "$status" -eq 0 ]
  rm -rf "$T/a"
  unsquashfs -q -n -d "$T/a" "$T/exported.sqsh" >/dev/null
  rm "$T/a/etc/rc" "$T/a/etc/environment"
  python3 "$TREECMP" --ignore-dir-mtime "$GANTRY_TEST_REF_LAYERS" "$T/a"
  # gantry.conf's layered_images = yes makes a plain import store layers too.
  skopeo_to "$GANTRY_TEST_IMAGE_TINY" "oci:$T/tiny:v1"
  printf 'layered_images = yes\n' >>"$T/gantry.conf"
  imported "oci:$T/tiny:v1"
  [ "$SQSH" = "$T/imported/images/${DIGEST#sha256:}.json" ]
  [ ! -e "$T/imported/images/${DIGEST#sha256:}.sqsh" ]
}

@test "docker-archive and oci-archive made by skopeo: same config digest and tree as the pull" {
  for img in LAYERS ZSTD DEBIAN; do
    name_var=GANTRY_TEST_IMAGE_$img
    rm -rf "$T/pulled" "$T/imported" "$T"/*.tar
    t0=$(date +%s.%N)
    pulled "${!name_var}"
    t1=$(date +%s.%N)
    want_config=$(registry_config "${!name_var}")
    [[ "$want_config" == sha256:* ]]
    pulled_config=$(config_digest "$T/pulled" "$PULLED_DIGEST")
    [ "$pulled_config" = "$want_config" ]
    # skopeo writes no zstd layers into a docker-archive (Docker's format has none): oci-archive only.
    if [ "$img" != ZSTD ]; then
      skopeo_to "${!name_var}" "docker-archive:$T/d.tar:gantry-test/import-${img,,}:latest"
      t2=$(date +%s.%N)
      imported "docker-archive:$T/d.tar"
      t3=$(date +%s.%N)
      # The figures for docs and reports: pull from the loopback registry, skopeo's copy to an archive,
      # gantry's import of that archive.
      printf '# %s: pull %.2f s, skopeo copy to docker-archive %.2f s, import %.2f s\n' "$img" \
        "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$(echo "$t3 - $t2" | bc)" >&3
      got=$(config_digest "$T/imported" "$DIGEST")
      echo "$img docker-archive: $got vs $want_config"
      [ "$got" = "$want_config" ]
      same_tree "$PULLED_SQSH" "$SQSH"
      # RepoTags became a name in the importer's local/ namespace, never a registry's tag.
      run "$GANTRY" images --store "$T/imported" --format json
      [[ "$output" == *"\"local/gantry-test/import-${img,,}:latest\""* ]]
    fi
    skopeo_to "${!name_var}" "oci-archive:$T/o.tar:latest"
    imported "oci-archive:$T/o.tar:latest"
    [ "$DIGEST" = "$PULLED_DIGEST" ]
    got=$(config_digest "$T/imported" "$DIGEST")
    [ "$got" = "$want_config" ]
    same_tree "$PULLED_SQSH" "$SQSH"
    [ -z "$(ls -A "$T/imported/staging")" ]
  done
}

@test "a corrupted layer is refused: no image, no work area left in the store" {
  skopeo_to "$GANTRY_TEST_IMAGE_LAYERS" "docker-archive:$T/d.tar"
  # Flip one byte inside the largest layer's data (tar member offsets from Python's tarfile).
  flip_byte_in_largest_member "$T/d.tar"
  run "$GANTRY" import --store "$T/imported" "docker-archive:$T/d.tar"
  echo "$output"
  [ "$status" -eq 1 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ "$output" == "gantry: importing docker-archive:$T/d.tar: "*"diff_id"* ]]
  [ -z "$(ls -A "$T/imported/images")" ]
  [ -z "$(ls -A "$T/imported/staging")" ]

  # An oci-archive whose gzip blob was altered: its sha256 no longer matches the manifest's digest.
  skopeo_to "$GANTRY_TEST_IMAGE_TINY" "oci-archive:$T/o.tar:latest"
  flip_byte_in_largest_member "$T/o.tar"
  run "$GANTRY" import --store "$T/imported" "oci-archive:$T/o.tar:latest"
  echo "$output"
  [ "$status" -eq 1 ]
  [[ "$output" == *"is corrupt or was altered"* ]]
  [ -z "$(ls -A "$T/imported/images")" ]
  [ -z "$(ls -A "$T/imported/staging")" ]

  # Not an archive at all.
  head -c 10000 /dev/urandom > "$T/junk.tar"
  run "$GANTRY" import --store "$T/imported" "docker-archive:$T/junk.tar"
  [ "$status" -eq 1 ]
  [[ "$output" == *"not a valid tar archive"* ]]
  [ -z "$(ls -A "$T/imported/staging")" ]
}

@test "root imports only where root may write: a user's store is refused, a planted staging symlink is never followed" {
  skopeo_to "$GANTRY_TEST_IMAGE_TINY" "docker-archive:$T/t.tar"
  chmod 0644 "$T/t.tar"
  local store=$T/user/store
  mkdir -p "$T/user" && chown "$TUSER" "$T/user"
  # The user's own store takes the user's import.
  runuser -u "$TUSER" -- "$GANTRY" import -q --store "$store" "docker-archive:$T/t.tar"
  [ -n "$(ls -A "$store/images")" ]
  # Root into that store: refused, as gantry pull is (the user could plant what root would act on).
  run "$GANTRY" import --store "$store" "docker-archive:$T/t.tar"
  echo "$output"
  [ "$status" -eq 1 ]
  [[ "$output" == *"modifying image store $store as root: $store is owned by uid $(id -u "$TUSER"), neither root nor store_owner"* ]]
  # The user swaps staging for a symlink to a directory only root may write: never followed.
  mkdir -m 0700 "$T/root-only"
  runuser -u "$TUSER" -- sh -c 'mv "$1/staging" "$1/staging.away" && ln -s "$2" "$1/staging"' sh "$store" "$T/root-only"
  run "$GANTRY" import --store "$store" "docker-archive:$T/t.tar"
  echo "$output"
  [ "$status" -eq 1 ]
  [[ "$output" == *"$store/staging: is a symbolic link, which is never followed here"* ]]
  [ -z "$(ls -A "$T/root-only")" ]
}

@test "dockerd:// and podman:// run the tool's save; a missing tool is a one-line error naming it" {
  # A stand-in `docker` on PATH whose `save` writes a docker-archive that skopeo made: the import
  # reads it from the pipe exactly as it would read docker's own output (Docker is not installed here).
  skopeo_to "$GANTRY_TEST_IMAGE_TINY" "docker-archive:$T/saved.tar:gantry-test/tiny:latest"
  mkdir -p "$T/bin"
  cat > "$T/bin/docker" <<EOF
#!/bin/sh
[ "\$1" = save ] && [ "\$2" = gantry-test/tiny:latest ] || { echo "fake docker: unexpected \$*" >&2; exit 3; }
exec cat "$T/saved.tar"
EOF
  chmod +x "$T/bin/docker"
  pulled "$GANTRY_TEST_IMAGE_TINY"
  PATH="$T/bin:$PATH" imported dockerd://gantry-test/tiny:latest
  got=$(config_digest "$T/imported" "$DIGEST")
  [ "$got" = "$(registry_config "$GANTRY_TEST_IMAGE_TINY")" ]
  same_tree "$PULLED_SQSH" "$SQSH"
  # save failing: its exit status is reported, nothing is stored.
  run env PATH="$T/bin:$PATH" "$GANTRY" import --store "$T/other" dockerd://no/such:image
  echo "$output"
  [ "$status" -eq 1 ]
  [[ "$output" == *"docker save no/such:image failed (exit status 3"* ]]
  [ -z "$(ls -A "$T/other/images")" ]
  [ -z "$(ls -A "$T/other/staging")" ]
  # No podman anywhere on this PATH.
  run env PATH=/nonexistent "$GANTRY" import --store "$T/other" podman://app:1
  echo "$output"
  [ "$status" -eq 1 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ "$output" == "gantry: importing podman://app:1: podman://app:1 needs the podman command, which is not installed"* ]]
}

@test "export writes an Enroot image: /etc/environment and /etc/rc; gantry run FILE.sqsh uses its PATH" {
  pulled "$GANTRY_TEST_IMAGE_TINY"
  run "$GANTRY" export --store "$T/pulled" "$PULLED_DIGEST" -o "$T/tiny.sqsh"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "$T/tiny.sqsh" ]
  run unsquashfs -cat "$T/tiny.sqsh" etc/environment
  echo "$output"
  grep -qx 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' <<< "$output"
  grep -qx 'GANTRY_TINY=1' <<< "$output"
  run unsquashfs -cat "$T/tiny.sqsh" etc/rc
  echo "$output"
  grep -qx "cd '/work' || exit 1" <<< "$output"
  grep -q "exec '/usr/local/bin/gantry-entrypoint' '/bin/sh' '-c'" <<< "$output"
  # Everything else is the stored image's tree, unchanged (owners, modes, mtimes, contents).
  rm -rf "$T/a" "$T/b"
  gantry_image_tree "$PULLED_SQSH" "$T/a"
  unsquashfs -q -n -d "$T/b" "$T/tiny.sqsh" >/dev/null
  rm -f "$T/b/etc/environment" "$T/b/etc/rc"
  python3 "$TREECMP" --ignore-dir-mtime "$T/a" "$T/b"

  # gantry run reads the file's /etc/environment: gantry-entrypoint lies only in /usr/local/bin,
  # which the host PATH given here lacks.
  run runuser -u "$TUSER" -- env -C "$T" HOME="$T" PATH=/usr/bin:/bin XDG_RUNTIME_DIR= \
    "$GANTRY" run "$T/tiny.sqsh" gantry-entrypoint sh -c 'echo "$GANTRY_ENTRYPOINT_RAN|$PATH|$GANTRY_TINY"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "1|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|1" ]

  # An existing file is kept unless --force; no temporary file is left beside it.
  run "$GANTRY" export --store "$T/pulled" "$PULLED_DIGEST" -o "$T/tiny.sqsh"
  [ "$status" -eq 1 ]
  [[ "$output" == *"the file exists; add --force to replace it" ]]
  run "$GANTRY" export --store "$T/pulled" --force "$PULLED_DIGEST" -o "$T/tiny.sqsh"
  [ "$status" -eq 0 ]
  [ -z "$(ls -A "$T" | grep '\.tmp\.')" ]
}

@test "import and export: --help, usage errors exit 2, --tag records a reference" {
  for verb in import export; do
    run --separate-stderr "$GANTRY" "$verb" --help
    [ "$status" -eq 0 ]
    [[ "${lines[0]}" == "usage: gantry $verb"* ]]
    run "$GANTRY" "$verb" --no-such-option
    [ "$status" -eq 2 ]
    [ "$output" = "gantry: $verb: unknown option '--no-such-option' (see gantry $verb --help)" ]
  done
  run "$GANTRY" --help
  echo "$output" | grep -q '^  import'
  echo "$output" | grep -q '^  export'
  run "$GANTRY" import --store "$T/s" tarball:/x
  [ "$status" -eq 2 ]
  [[ "$output" == "gantry: import: unknown image source 'tarball:/x'"* ]]
  run "$GANTRY" export --store "$T/s" sha256:0123456789abcdef
  [ "$status" -eq 2 ]
  [[ "$output" == *"-o FILE.sqsh"* ]]
  skopeo_to "$GANTRY_TEST_IMAGE_TINY" "oci:$T/layout:latest"
  imported "oci:$T/layout:latest" --tag local/site/tiny:v1
  run "$GANTRY" inspect --store "$T/imported" local/site/tiny:v1
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"$DIGEST"* ]]
  run "$GANTRY" images --store "$T/imported"
  [[ "$output" == *"local/site/tiny:v1"* ]]
  # A registry's name is refused: an imported image never stands for a registry's image.
  run "$GANTRY" import --store "$T/imported" --tag example.org/site/tiny:v1 "oci:$T/layout:latest"
  [ "$status" -eq 2 ]
  [[ "$output" == "gantry: import: --tag example.org/site/tiny:v1: an imported image's name is under local/ (e.g. --tag local/site/tiny:v1)"* ]]
}
