#!/usr/bin/env bash
# Builds Gantry's test images with Debian tools only (busybox-static, umoci, skopeo, debootstrap,
# GNU tar, gzip/zstd and tests/images/oci.py for what umoci cannot express), so that they never depend
# on Gantry's own code; pushes each to both harness registries; unpacks each with umoci into a
# reference root filesystem; and writes $GANTRY_HARNESS_DIR/images.env.
#
#   tests/images/build.sh [--big] [--only NAME]...
#
# Images: tiny layers debian multiarch tiny-docker zstd, and big with --big (see docs/testing.md).
# Needs the registries (tests/harness/registry.sh start) and root (debootstrap; umoci keeps owners).
# Built OCI layouts are cached in $GANTRY_HARNESS_DIR/cache/oci; a rerun with an unchanged recipe
# only pushes. The debootstrap result is cached in $GANTRY_HARNESS_DIR/cache/ as a tarball.
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../harness/lib.sh
. "$here/../harness/lib.sh"
ocipy="$here/oci.py"

all_images=(tiny layers debian multiarch tiny-docker zstd)
want_big=0
only=()
while [ $# -gt 0 ]; do
  case $1 in
    --big) want_big=1 ;;
    --only) [ $# -ge 2 ] || gantry_die "--only needs an image name"; only+=("$2"); shift ;;
    --only=*) only+=("${1#--only=}") ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) gantry_die "build.sh: unknown argument $1 (try --help)" ;;
  esac
  shift
done
if [ ${#only[@]} -gt 0 ]; then
  for n in "${only[@]}"; do
    case " ${all_images[*]} big " in *" $n "*) ;; *) gantry_die "unknown image '$n'; known: ${all_images[*]} big" ;; esac
  done
  images=("${only[@]}")
else
  images=("${all_images[@]}")
  [ $want_big -eq 1 ] && images+=(big)
fi

gantry_require_root "building the test images (debootstrap, and umoci keeping file owners)"
for tool in umoci:umoci skopeo:skopeo debootstrap:debootstrap setfattr:attr zstd:zstd gzip:gzip \
  tar:tar curl:curl python3:python3 mkfifo:coreutils; do
  gantry_require_cmd "${tool%%:*}" "${tool#*:}"
done
[ -x /bin/busybox ] || gantry_die "/bin/busybox not found (Debian package busybox-static); run scripts/install-deps"

H=$GANTRY_HARNESS_DIR
regenv="$H/registry.env"
[ -r "$regenv" ] || gantry_die "$regenv not found; start the registries first: tests/harness/registry.sh start"
# shellcheck disable=SC1090
. "$regenv"
for k in HTTP TLS; do
  pidvar=GANTRY_TEST_REGISTRY_${k}_PID
  gantry_pid_alive "${!pidvar}" ||
    gantry_die "the ${k,,} registry from $regenv is not running; run tests/harness/registry.sh start"
done

cache="$H/cache"
ocidir="$cache/oci"
refdir="$H/ref"
fragdir="$H/images.d"
work="$H/images-work"
mkdir -p "$ocidir" "$refdir" "$fragdir"
chmod 755 "$H" "$cache" "$ocidir" "$refdir" "$fragdir"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# Any change to the recipe rebuilds the cached layouts.
recipe=$(cat "$0" "$ocipy" | sha256sum | cut -c1-16)

policy="$work/policy.json"
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$policy"

# ---------------------------------------------------------------- building blocks

# A busybox userland: the static binary plus one absolute symlink per applet, and the few files a
# shell expects. $1 is the root directory to fill.
populate_busybox() {
  local root=$1 applet
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,root,proc,sys,dev,run,var/tmp,tmp}
  chmod 1777 "$root/tmp" "$root/var/tmp"
  chmod 700 "$root/root"
  cp /bin/busybox "$root/bin/busybox"
  while read -r applet; do
    [ "$applet" = bin/busybox ] || [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
  done < <(/bin/busybox --list-full)
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' \
    >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
}

busybox_env=(--config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

# new_layout DIR: an empty OCI layout with an empty image tagged "base".
new_layout() {
  rm -rf "$1"
  umoci init --layout "$1"
  umoci new --image "$1:base"
}

# unpack_bundle LAYOUT:TAG BUNDLE
unpack_bundle() {
  rm -rf "$2"
  umoci unpack --image "$1" "$2" >/dev/null
}

# layer_blobs LAYOUT TAG: print the blob paths of the image's layers, lowest first.
layer_blobs() {
  python3 "$ocipy" layers "$1" "$2" | while read -r _ digest; do
    echo "$1/blobs/sha256/${digest#sha256:}"
  done
}

expect() { # expect DESCRIPTION COMMAND...: a recipe self-check
  "${@:2}" || gantry_die "image check failed: $1"
}

# ---------------------------------------------------------------- recipes (each builds $1 = layout)

build_tiny() {
  local L=$1 b="$work/tiny"
  new_layout "$L"
  unpack_bundle "$L:base" "$b"
  populate_busybox "$b/rootfs"
  mkdir -p "$b/rootfs/work"
  echo "tiny work dir" >"$b/rootfs/work/README"
  # The entrypoint marks the environment and runs its arguments, like a typical image entrypoint.
  cat >"$b/rootfs/usr/local/bin/gantry-entrypoint" <<'EOF'
#!/bin/sh
# Entrypoint of the gantry-test/tiny image: mark the environment, then run the arguments.
export GANTRY_ENTRYPOINT_RAN=1
exec "$@"
EOF
  chmod 755 "$b/rootfs/usr/local/bin/gantry-entrypoint"
  umoci repack --image "$L:latest" "$b"
  # shellcheck disable=SC2016  # $(pwd) is for the container's shell
  umoci config --image "$L:latest" "${busybox_env[@]}" \
    --config.env GANTRY_TINY=1 --config.env "GANTRY_TINY_SPACES=a b  c" \
    --config.workingdir /work \
    --config.entrypoint /usr/local/bin/gantry-entrypoint \
    --config.cmd /bin/sh --config.cmd -c --config.cmd 'echo "tiny: hello from $(pwd)"' \
    --config.label org.gantry.test=tiny
  [ "$(layer_blobs "$L" latest | wc -l)" -eq 1 ] || gantry_die "image check failed: tiny must have one layer"
}

# layers: busybox, then a layer of unusual files, then a layer of deletions and replacements made by
# umoci's diff, then a hand-made layer with an opaque directory and whiteout-free replacements.
build_layers() {
  local L=$1 b="$work/layers" r="$work/layers/rootfs" d
  new_layout "$L"
  unpack_bundle "$L:base" "$b"
  populate_busybox "$r"
  umoci repack --refresh-bundle --image "$L:latest" "$b"

  # Layer 2: additions.
  d="$r/data"
  mkdir -p "$d"
  echo keep >"$d/keep.txt"
  echo "to be deleted by a .wh. file" >"$d/delete-me.txt"
  echo v1 >"$d/changed.txt"
  mkdir -p "$d/dir-to-file/sub" "$d/opaque/sub" "$d/whole-dir-gone/deeper" "$d/dir-to-file-clean"
  echo a >"$d/dir-to-file/a"; echo b >"$d/dir-to-file/sub/b"
  echo "file, becomes a directory" >"$d/file-to-dir"
  echo "file, becomes a directory (no whiteout)" >"$d/file-to-dir-clean"
  echo x >"$d/dir-to-file-clean/x"
  echo old1 >"$d/opaque/old1"; echo old2 >"$d/opaque/sub/old2"
  echo gone >"$d/whole-dir-gone/deeper/f"
  echo "hard linked" >"$d/hardlink-a"
  ln "$d/hardlink-a" "$d/hardlink-b"
  ln -s keep.txt "$d/symlink-rel"
  ln -s /data/keep.txt "$d/symlink-abs"
  ln -s ../../../../etc/passwd "$d/symlink-escape-rel"
  ln -s /etc/shadow-outside "$d/symlink-escape-abs"
  ln -s does-not-exist "$d/symlink-dangling"
  ln -s /bin "$d/symlink-dir"
  printf '#!/bin/sh\nid\n' >"$d/setuid-file"; chmod 4755 "$d/setuid-file"
  mkdir "$d/setgid-dir"; chmod 2775 "$d/setgid-dir"
  mkdir "$d/sticky-dir"; chmod 1777 "$d/sticky-dir"
  echo private >"$d/mode-0600"; chmod 600 "$d/mode-0600"
  echo mode >"$d/mode-change"
  mkfifo "$d/fifo"
  echo xattrs >"$d/xattr-file"
  setfattr -n user.gantry.test -v hello "$d/xattr-file"
  setfattr -n user.gantry.second -v "second value" "$d/xattr-file"
  mkdir "$d/xattr-dir"; setfattr -n user.gantry.dir -v on-a-dir "$d/xattr-dir"
  : >"$d/empty"
  echo owned >"$d/owned-1234"; chown 1234:5678 "$d/owned-1234"
  mkdir "$d/owned-dir-1000"; chown 1000:1000 "$d/owned-dir-1000"
  # Sparse: 8 MiB apparent size, 3 MiB of data in three extents that straddle block boundaries.
  truncate -s 8M "$d/sparse.bin"
  head -c 1M /dev/urandom | dd of="$d/sparse.bin" conv=notrunc status=none
  head -c 1M /dev/urandom | dd of="$d/sparse.bin" oflag=seek_bytes seek=$((4 * 1048576 - 100)) conv=notrunc status=none
  head -c 1M /dev/urandom | dd of="$d/sparse.bin" oflag=seek_bytes seek=$((7 * 1048576 - 333)) conv=notrunc status=none
  truncate -s 8M "$d/sparse.bin"
  local long150 long255 deep
  long150=$(printf 'long-name-%0140d' 0)
  long255=$(printf 'n%0254d' 0)
  echo "150-character name" >"$d/$long150"
  echo "255-character name" >"$d/$long255"
  deep="$d/deep/$(printf 'a%.0s' {1..60})/$(printf 'b%.0s' {1..60})/$(printf 'c%.0s' {1..60})/$(printf 'd%.0s' {1..60})"
  mkdir -p "$deep"
  echo "path longer than 255 bytes" >"$deep/$(printf 'e%.0s' {1..40}).txt"
  mkdir -p "$d/unicode"
  echo utf8 >"$d/unicode/héllo wörld.txt"
  echo utf8 >"$d/unicode/日本語のファイル.txt"
  echo utf8 >"$d/unicode/emoji-🙂.txt"
  umoci repack --refresh-bundle --image "$L:latest" "$b"

  # Layer 3: deletions and replacements, expressed by umoci's diff as whiteouts.
  rm "$d/delete-me.txt"
  rm -rf "$d/whole-dir-gone"
  rm -rf "$d/dir-to-file"; echo "was a directory" >"$d/dir-to-file"
  rm "$d/file-to-dir"; mkdir "$d/file-to-dir"; echo inside >"$d/file-to-dir/inside"
  echo v2 >"$d/changed.txt"
  chmod 640 "$d/mode-change"
  setfattr -n user.gantry.test -v changed "$d/xattr-file"
  umoci repack --refresh-bundle --image "$L:latest" "$b"

  # Layer 4, made by hand: umoci never writes opaque whiteouts, and it adds .wh. entries when a type
  # changes; a Docker-built layer just writes the new entry over the old one.
  local s="$work/layers-l4"
  mkdir -p "$s/data/opaque/fresh" "$s/data/file-to-dir-clean"
  : >"$s/data/opaque/.wh..wh..opq"
  echo new >"$s/data/opaque/new-file"
  echo fresh >"$s/data/opaque/fresh/inner"
  echo "was a directory (no whiteout)" >"$s/data/dir-to-file-clean"
  echo inside >"$s/data/file-to-dir-clean/inside"
  chmod 755 "$s/data" "$s/data/opaque" "$s/data/opaque/fresh" "$s/data/file-to-dir-clean"
  tar -C "$s" --numeric-owner --owner=0 --group=0 --sort=name --format=pax -cf "$work/layer4.tar" data
  python3 "$ocipy" add-layer "$L" latest "$work/layer4.tar" --compress gzip \
    --created-by "hand-made: opaque directory, type changes without whiteouts" >/dev/null
  umoci config --image "$L:latest" "${busybox_env[@]}" --config.workingdir /data \
    --config.cmd /bin/sh --config.cmd -c --config.cmd 'ls -la /data'

  check_layers_blobs "$L"
}

# The layer tars must really carry what the recipe meant; read them back with GNU tar and oci.py.
check_layers_blobs() {
  local L=$1 blobs list2 list3 list4
  mapfile -t blobs < <(layer_blobs "$L" latest)
  [ ${#blobs[@]} -eq 4 ] || gantry_die "image check failed: layers has ${#blobs[@]} layers, expected 4"
  list3=$(tar -tzf "${blobs[2]}")
  list4=$(tar -tzf "${blobs[3]}")
  expect "layer 3 whiteout of a file" grep -qx 'data/.wh.delete-me.txt' <<<"$list3"
  expect "layer 3 whiteout of a directory" grep -qx 'data/.wh.whole-dir-gone' <<<"$list3"
  expect "layer 3 directory replaced by a file" grep -qx 'data/dir-to-file' <<<"$list3"
  expect "layer 3 file replaced by a directory" grep -qx 'data/file-to-dir/inside' <<<"$list3"
  expect "layer 4 opaque whiteout" grep -qx 'data/opaque/.wh..wh..opq' <<<"$list4"
  list2=$(python3 "$ocipy" list-layer "${blobs[1]}")
  expect "layer 2 fifo" grep -q '^p .* data/fifo$' <<<"$list2"
  expect "layer 2 hard link" grep -qE '^h .* data/hardlink-[ab] -> data/hardlink-[ab]$' <<<"$list2"
  expect "layer 2 setuid file" grep -q '^f 4755 .* data/setuid-file$' <<<"$list2"
  expect "layer 2 escaping symlink" grep -q ' data/symlink-escape-rel -> ../../../../etc/passwd$' <<<"$list2"
  expect "layer 2 xattrs" grep -q 'data/xattr-file xattrs=user.gantry.second,user.gantry.test$' <<<"$list2"
  expect "layer 2 owner 1234:5678" grep -q '^f 0644 1234:5678 .* data/owned-1234$' <<<"$list2"
  expect "layer 2 long path" grep -qE ' data/deep/a{60}/b{60}/c{60}/d{60}/e{40}\.txt$' <<<"$list2"
  expect "layer 2 UTF-8 name" grep -q 'data/unicode/日本語のファイル.txt$' <<<"$list2"
}

# The reference must show every whiteout applied (umoci unpacked it; this checks recipe and umoci).
check_layers_ref() {
  local r=$1/data
  expect "ref: deleted file absent" test ! -e "$r/delete-me.txt"
  expect "ref: deleted directory absent" test ! -e "$r/whole-dir-gone"
  expect "ref: opaque directory lost old1" test ! -e "$r/opaque/old1"
  expect "ref: opaque directory lost sub/" test ! -e "$r/opaque/sub"
  expect "ref: opaque directory has new-file" test -f "$r/opaque/new-file"
  expect "ref: dir-to-file is a file" test -f "$r/dir-to-file"
  expect "ref: dir-to-file-clean is a file" test -f "$r/dir-to-file-clean"
  expect "ref: file-to-dir is a directory" test -f "$r/file-to-dir/inside"
  expect "ref: file-to-dir-clean is a directory" test -f "$r/file-to-dir-clean/inside"
  expect "ref: changed.txt is v2" grep -qx v2 "$r/changed.txt"
  expect "ref: hard link" test "$r/hardlink-a" -ef "$r/hardlink-b"
  expect "ref: fifo" test -p "$r/fifo"
  expect "ref: setuid" test -u "$r/setuid-file"
  expect "ref: owner" test "$(stat -c %u:%g "$r/owned-1234")" = 1234:5678
  expect "ref: xattr" test "$(getfattr --only-values -n user.gantry.test "$r/xattr-file" 2>/dev/null)" = changed
}

build_zstd() {
  local L=$1 s="$work/zstd-layer"
  ensure_layout tiny
  rm -rf "$L"
  cp -a "$ocidir/tiny" "$L"
  mkdir -p "$s/zstd"
  echo "this file came from a zstd-compressed layer" >"$s/zstd/marker"
  python3 "$ocipy" tar-gen text 2 text >"$work/text.tar"
  tar -C "$s/zstd" -xf "$work/text.tar"
  tar -C "$s" --numeric-owner --owner=0 --group=0 --sort=name -cf "$work/zstd.tar" zstd
  python3 "$ocipy" add-layer "$L" latest "$work/zstd.tar" --compress zstd \
    --created-by "hand-made: zstd-compressed layer" >/dev/null
  python3 "$ocipy" layers "$L" latest | grep -q '+zstd ' || gantry_die "image check failed: zstd has no zstd layer"
}

build_multiarch() {
  local L=$1 arch
  new_layout "$L"
  unpack_bundle "$L:base" "$work/ma-base"
  populate_busybox "$work/ma-base/rootfs"
  umoci repack --image "$L:busybox" "$work/ma-base"
  for arch in amd64 arm64; do
    unpack_bundle "$L:busybox" "$work/ma-$arch"
    echo "$arch" >"$work/ma-$arch/rootfs/arch"
    umoci repack --image "$L:$arch" "$work/ma-$arch"
    # The arm64 entry carries amd64 busybox: it is only ever unpacked, never run, on this machine.
    umoci config --image "$L:$arch" --architecture "$arch" "${busybox_env[@]}" --config.cmd cat --config.cmd /arch
  done
  python3 "$ocipy" make-index "$L" latest amd64=linux/amd64 arm64=linux/arm64/v8 >/dev/null
}

build_debian() {
  local L=$1 b="$work/debian" tarball
  tarball=$(gantry_bookworm_minbase_tar)
  new_layout "$L"
  unpack_bundle "$L:base" "$b"
  tar -C "$b/rootfs" --numeric-owner --xattrs --xattrs-include='*' -xpf "$tarball"
  umoci repack --image "$L:latest" "$b"
  umoci config --image "$L:latest" \
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --config.cmd /bin/bash
}

build_big() {
  local L=$1
  ensure_layout tiny
  rm -rf "$L"
  cp -a "$ocidir/tiny" "$L"
  # Layer sizes in MiB; gzip for the ECR-typical case, zstd for the rest. 2100 MiB of file data.
  local spec
  for spec in "small 20000 gzip" "random 700 gzip" "text 600 gzip" "random 500 zstd" "zeros 300 zstd"; do
    # shellcheck disable=SC2086  # split "kind amount compression" on purpose
    set -- $spec
    gantry_note "big: layer $1 $2 ($3)"
    python3 "$ocipy" tar-gen "$1" "$2" "big-$1-$3" |
      python3 "$ocipy" add-layer "$L" latest - --compress "$3" --created-by "tar-gen $spec" >/dev/null
  done
  umoci config --image "$L:latest" "${busybox_env[@]}" --config.cmd du --config.cmd -sh --config.cmd /
}

# ---------------------------------------------------------------- cache, references, push

# ensure_layout NAME: make sure $ocidir/NAME holds the current recipe's layout and its reference.
ensure_layout() {
  local name=$1 layout="$ocidir/$1" stamp="$ocidir/$1.recipe" t0=$SECONDS
  case $name in tiny-docker) ensure_layout tiny; return ;; esac
  if [ -d "$layout" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$recipe" ] && ref_present "$name"; then
    return 0
  fi
  gantry_note "building image $name"
  rm -f "$stamp"
  "build_${name}" "$layout.tmp"
  # Keep only the tags the images are known by (latest; amd64/arm64 for multiarch).
  local tag
  for tag in $(umoci ls --layout "$layout.tmp"); do
    case $tag in base | busybox) umoci rm --image "$layout.tmp:$tag" ;; esac
  done
  umoci gc --layout "$layout.tmp"
  # umoci writes blobs 0600; tests running as the unprivileged user read the layouts too.
  chmod -R a+rX "$layout.tmp"
  rm -rf "$layout"
  mv "$layout.tmp" "$layout"
  make_refs "$name"
  echo "$recipe" >"$stamp"
  gantry_note "built image $name in $((SECONDS - t0)) s"
}

ref_present() {
  case $1 in
    multiarch) [ -d "$refdir/multiarch-amd64/rootfs" ] && [ -d "$refdir/multiarch-arm64/rootfs" ] ;;
    *) [ -d "$refdir/$1/rootfs" ] ;;
  esac
}

# unpack_ref LAYOUT TAG NAME: umoci (not Gantry) applies the layers; as root it keeps owners,
# modes, xattrs and whiteout semantics, which is what our squashfs trees are compared with.
unpack_ref() {
  local layout=$1 tag=$2 name=$3
  rm -rf "${refdir:?}/$name"
  mkdir -p "$refdir/$name"
  umoci raw unpack --image "$layout:$tag" "$refdir/$name/rootfs" 2>"$work/unpack.log" ||
    { cat "$work/unpack.log" >&2; gantry_die "umoci could not unpack $layout:$tag"; }
  chmod 755 "$refdir/$name"
}

make_refs() {
  local name=$1 layout="$ocidir/$1"
  case $name in
    multiarch)
      unpack_ref "$layout" amd64 multiarch-amd64
      unpack_ref "$layout" arm64 multiarch-arm64 ;;
    zstd | big)
      # umoci 0.4 cannot read zstd layers: unpack a twin whose zstd layers are recompressed to gzip
      # (identical tar streams, so identical diff_ids), then drop the twin's tag.
      python3 "$ocipy" to-gzip "$layout" latest ref-gzip >/dev/null
      unpack_ref "$layout" ref-gzip "$name"
      umoci rm --image "$layout:ref-gzip"
      umoci gc --layout "$layout" ;;
    *)
      unpack_ref "$layout" latest "$name" ;;
  esac
  [ "$name" = layers ] && check_layers_ref "$refdir/layers/rootfs"
  return 0
}

# push LAYOUT:TAG REPO [skopeo copy options]: to the open registry and to the TLS one.
push() {
  local src=$1 repo=$2
  shift 2
  skopeo --policy "$policy" copy -q "$@" --dest-tls-verify=false \
    "oci:$src" "docker://$GANTRY_TEST_REGISTRY_HTTP/$repo" ||
    gantry_die "skopeo could not push $src to $GANTRY_TEST_REGISTRY_HTTP/$repo"
  skopeo --policy "$policy" copy -q "$@" --dest-cert-dir "$GANTRY_TEST_REGISTRY_CERT_DIR" \
    --dest-creds "$GANTRY_TEST_REGISTRY_USER:$GANTRY_TEST_REGISTRY_PASSWORD" \
    "oci:$src" "docker://$GANTRY_TEST_REGISTRY_TLS/$repo" ||
    gantry_die "skopeo could not push $src to $GANTRY_TEST_REGISTRY_TLS/$repo"
}

# registry_manifest_digest https://HOST/REPO/TAG-less: read the manifest back as a client would and
# print its digest after checking that the registry's Docker-Content-Digest header agrees.
registry_manifest_digest() {
  local scheme_host=$1 repo=$2 tag=$3 hdr="$work/hdr" body="$work/body" said computed
  shift 3
  curl -sS --fail -D "$hdr" -o "$body" -H "Accept: $GANTRY_MANIFEST_ACCEPT" "$@" \
    "$scheme_host/v2/$repo/manifests/$tag" || gantry_die "could not read back $scheme_host/$repo:$tag"
  said=$(tr -d '\r' <"$hdr" | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: *//p' | tail -1)
  computed="sha256:$(sha256sum "$body" | cut -d' ' -f1)"
  [ "$said" = "$computed" ] || gantry_die "$scheme_host/$repo:$tag: Docker-Content-Digest $said but body hashes to $computed"
  echo "$computed"
}

# publish NAME: push the image and write its images.d fragment with the digests read back.
publish() {
  local name=$1 var repo="gantry-test/$1" layout src d_http d_tls
  var=$(echo "$name" | tr 'a-z-' 'A-Z_')
  layout="$ocidir/$name"
  local extra=()
  case $name in
    tiny-docker) layout="$ocidir/tiny"; extra=(--format v2s2) ;;
    multiarch) extra=(--all) ;;
  esac
  src="$layout:latest"
  push "$src" "$repo:latest" "${extra[@]}"
  d_http=$(registry_manifest_digest "http://$GANTRY_TEST_REGISTRY_HTTP" "$repo" latest)
  d_tls=$(registry_manifest_digest "https://$GANTRY_TEST_REGISTRY_TLS" "$repo" latest \
    --cacert "$GANTRY_TEST_REGISTRY_CA" -u "$GANTRY_TEST_REGISTRY_USER:$GANTRY_TEST_REGISTRY_PASSWORD")
  [ "$d_http" = "$d_tls" ] || gantry_die "$repo: the two registries hold different manifests ($d_http vs $d_tls)"
  {
    echo "GANTRY_TEST_IMAGE_$var=$repo:latest"
    echo "GANTRY_TEST_DIGEST_$var=$d_http"
    echo "GANTRY_TEST_OCI_$var=$layout"
    case $name in
      multiarch)
        local a
        for a in amd64 arm64; do
          echo "GANTRY_TEST_DIGEST_MULTIARCH_${a^^}=$(jq -r --arg a "$a" \
            '.manifests[] | select(.platform.architecture == $a) | .digest' "$work/body")"
          echo "GANTRY_TEST_REF_MULTIARCH_${a^^}=$refdir/multiarch-$a/rootfs"
        done ;;
      tiny-docker) echo "GANTRY_TEST_REF_$var=$refdir/tiny/rootfs" ;;
      *) echo "GANTRY_TEST_REF_$var=$refdir/$name/rootfs" ;;
    esac
  } >"$fragdir/$name.env"
  gantry_note "pushed $repo:latest ($d_http) to both registries"
}

write_images_env() {
  local tmp="$H/images.env.tmp.$$" f names=()
  for f in "$fragdir"/*.env; do [ -e "$f" ] && names+=("$(basename "$f" .env)"); done
  {
    echo "# Written by tests/images/build.sh on $(date -u +%FT%TZ); source it after registry.env."
    echo "GANTRY_TEST_IMAGES=\"${names[*]}\""
    echo "GANTRY_TEST_REF_DIR=$refdir"
    echo "GANTRY_TEST_OCI_DIR=$ocidir"
    cat "$fragdir"/*.env
  } >"$tmp"
  echo "export $(sed -n 's/^\(GANTRY_[A-Z0-9_]*\)=.*/\1/p' "$tmp" | tr '\n' ' ')" >>"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$H/images.env"
}

t_start=$SECONDS
for name in "${images[@]}"; do
  ensure_layout "$name"
done
for name in "${images[@]}"; do
  publish "$name"
done
write_images_env
gantry_note "images ready in $((SECONDS - t_start)) s: ${images[*]}; env in $H/images.env"
