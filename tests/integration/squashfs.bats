# fixtures: registry images
# Layers -> squashfs conversion (runtime/squashfs) against the reference: the tree Gantry writes must
# equal `umoci unpack` of the same OCI image (names, types, modes, owners, link targets, contents,
# xattrs, hard links), read back with unsquashfs, through gantry-imagefs and through a kernel loop mount.
# Until `gantry pull` exists, the converter is driven through the unit test binary's hidden
# "[.driver]" case (see tests/unit/squashfs_test.cpp). Needs root (owners, trusted.* xattrs, mount).

setup_file() {
  export BUILD=${GANTRY_BUILD_DIR:-/tmp/build-sqfs}
  export DRIVER=$BUILD/tests/unit_squashfs
  export TREECMP=$BATS_TEST_DIRNAME/treecmp.py
  [ -x "$DRIVER" ] || { echo "build unit_squashfs first ($DRIVER missing)" >&2; return 1; }
  export WORK=$BATS_FILE_TMPDIR/w
  mkdir -p "$WORK"
}

# layers_of LAYOUT TAG: "blobpath|mediatype|diffid,..." bottom layer first (linux/amd64 from an index).
layers_of() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
layout, tag = sys.argv[1], sys.argv[2]
def blob(d): return f"{layout}/blobs/{d.replace(':', '/')}"
def load(d): return json.load(open(blob(d)))
idx = json.load(open(f"{layout}/index.json"))
desc = next(m for m in idx["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
man = load(desc["digest"])
if "manifests" in man:  # an index: take the host's platform
    man = load(next(m for m in man["manifests"] if m.get("platform", {}).get("architecture") == "amd64")["digest"])
diff_ids = load(man["config"]["digest"])["rootfs"]["diff_ids"]
print(",".join(f"{blob(l['digest'])}|{l['mediaType']}|{d}" for l, d in zip(man["layers"], diff_ids)))
EOF
}

# convert LAYOUT TAG OUT [VAR=VALUE...]: run convert_layers on the image's layers.
convert() {
  local layout=$1 tag=$2 out=$3
  shift 3
  env GANTRY_SQFS_LAYERS="$(layers_of "$layout" "$tag")" GANTRY_SQFS_OUT="$out" "$@" "$DRIVER" "[.driver]"
}

# compare_with_reference REF_ROOTFS IMAGE: unsquashfs and kernel views both equal the reference.
compare_with_reference() {
  local ref=$1 img=$2 x=$WORK/x.$RANDOM m=$WORK/m.$RANDOM
  unsquashfs -n -q -d "$x" "$img" >/dev/null
  python3 "$TREECMP" --ignore-dir-mtime "$ref" "$x"
  rm -rf "$x"
  mkdir -p "$m"
  # gantry-imagefs, the fuse backend's server, serves the same tree.
  local imagefs=$BUILD/runtime/gantry-imagefs pid i rc=0
  "$imagefs" "$img" "$m" &
  pid=$!
  for i in $(seq 50); do mountpoint -q "$m" && break; sleep 0.1; done
  python3 "$TREECMP" --ignore-dir-mtime "$ref" "$m" || rc=$?
  umount "$m"
  wait "$pid"
  [ "$rc" -eq 0 ] || return $rc
  if mount -t squashfs -o loop,ro "$img" "$m" 2>/dev/null; then
    python3 "$TREECMP" --ignore-dir-mtime "$ref" "$m" || rc=$?
    umount "$m"
    return $rc
  fi
  echo "# kernel loop mount unavailable: compared unsquashfs and gantry-imagefs only" >&3
}

# An image made here with umoci, covering what the unit tests cover with hand-made tars: whiteouts
# and opaque directories written by umoci itself, setuid, hard links, fifos, xattrs, owners.
build_umoci_image() {
  local L=$WORK/oci B=$WORK/bundle R
  rm -rf "$L" "$B"
  umoci init --layout "$L"
  umoci new --image "$L:t"
  umoci unpack --image "$L:t" "$B" >/dev/null
  R=$B/rootfs
  mkdir -p "$R"/{etc,opq/sub,d2f,bin,home/u,tmp,"ünï 日本"}
  chmod 1777 "$R/tmp"
  echo keep >"$R/etc/keep"
  echo gone >"$R/etc/gone"
  echo lower >"$R/opq/lower"
  echo deep >"$R/opq/sub/deep"
  echo c >"$R/d2f/child"
  echo f >"$R/f2d"
  printf 'tool' >"$R/bin/tool"
  chmod 4755 "$R/bin/tool"
  ln "$R/bin/tool" "$R/bin/tool-link"
  ln -s /bin/tool "$R/abs"
  ln -s ../../../../etc/shadow "$R/outside"
  mkfifo "$R/fifo"
  echo owned >"$R/home/u/f"
  chown 1000:100000 "$R/home/u/f"
  chown 1000:1000 "$R/home/u"
  setfattr -n user.gantry -v hello "$R/etc/keep"
  setfattr -n trusted.gantry -v x "$R/bin/tool"
  echo utf8 >"$R/ünï 日本/$(printf 'n%.0s' {1..200})"
  head -c 3000000 /dev/urandom >"$R/random.bin"
  : >"$R/empty"
  umoci repack --image "$L:t" "$B"

  rm "$R/etc/gone"
  rm -rf "$R/d2f" "$R/f2d"
  echo file >"$R/d2f"
  mkdir "$R/f2d"
  echo inside >"$R/f2d/inside"
  echo new >"$R/random.bin"
  umoci repack --refresh-bundle --image "$L:t" "$B"

  # An opaque directory, which umoci's repack does not generate: a hand-made layer.
  python3 - "$WORK/opaque.tar" <<'EOF'
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT) as t:
    d = tarfile.TarInfo("opq"); d.type = tarfile.DIRTYPE; d.mode = 0o750; d.mtime = 1700000000; t.addfile(d)
    t.addfile(tarfile.TarInfo("opq/.wh..wh..opq"), io.BytesIO(b""))
    f = tarfile.TarInfo("opq/upper"); f.size = 6; f.mtime = 1700000000; t.addfile(f, io.BytesIO(b"upper\n"))
EOF
  umoci raw add-layer --image "$L:t" "$WORK/opaque.tar"
  rm -rf "$B"
}

@test "a umoci-built image converts to the same tree umoci unpacks" {
  build_umoci_image
  umoci unpack --image "$WORK/oci:t" "$WORK/ref" >/dev/null
  run convert "$WORK/oci" t "$WORK/img.sqfs" GANTRY_SQFS_THREADS=2
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"hardlinks=1"* ]]
  # The whiteouts really were there to apply.
  [ ! -e "$WORK/ref/rootfs/etc/gone" ]
  [ ! -e "$WORK/ref/rootfs/opq/lower" ]
  [ -f "$WORK/ref/rootfs/opq/upper" ]
  compare_with_reference "$WORK/ref/rootfs" "$WORK/img.sqfs"
}

@test "every compressor gives a valid image with the same tree" {
  [ -d "$WORK/oci" ] || build_umoci_image
  [ -d "$WORK/ref" ] || umoci unpack --image "$WORK/oci:t" "$WORK/ref" >/dev/null
  for c in zstd lz4 gzip xz none; do
    rm -f "$WORK/c.sqfs"
    convert "$WORK/oci" t "$WORK/c.sqfs" GANTRY_SQFS_COMPRESSOR=$c GANTRY_SQFS_BLOCK_SIZE=262144 >/dev/null
    unsquashfs -s "$WORK/c.sqfs" | grep -q "Block size 262144"
    compare_with_reference "$WORK/ref/rootfs" "$WORK/c.sqfs"
  done
}

@test "sqfsdiff finds no difference between our image and tar2sqfs of the same layer" {
  [ -d "$WORK/oci" ] || build_umoci_image
  # A single-layer image: tar2sqfs (squashfs-tools-ng) reads the same tar with no merging to do.
  local blob
  blob=$(layers_of "$WORK/oci" t | cut -d, -f1 | cut -d'|' -f1)
  rm -f "$WORK/one.sqfs" "$WORK/t2s.sqfs"
  gzip -dc "$blob" | tar2sqfs -q -c zstd "$WORK/t2s.sqfs"
  GANTRY_SQFS_LAYERS="$blob||" GANTRY_SQFS_OUT="$WORK/one.sqfs" "$DRIVER" "[.driver]" >/dev/null
  # -O: compare owners too; -t would compare times, which for the root inode differ by design.
  run sqfsdiff -O --old "$WORK/t2s.sqfs" --new "$WORK/one.sqfs"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "harness images convert to their umoci reference trees" {
  local env=${GANTRY_HARNESS_DIR:-/nonexistent}/images.env
  if [ ! -r "$env" ]; then
    skip "no $env (run tests/images/build.sh)"
  fi
  # shellcheck disable=SC1090
  . "$env"
  local name var layout ref n=0
  for name in $GANTRY_TEST_IMAGES; do
    var=$(echo "$name" | tr 'a-z-' 'A-Z_')
    layout=GANTRY_TEST_OCI_$var
    ref=GANTRY_TEST_REF_$var
    [ "$name" = multiarch ] && ref=GANTRY_TEST_REF_MULTIARCH_AMD64
    layout=${!layout:-}
    ref=${!ref:-}
    [ -n "$layout" ] && [ -d "$ref" ] || continue
    rm -f "$WORK/$name.sqfs"
    echo "# $name" >&3
    convert "$layout" latest "$WORK/$name.sqfs" >/dev/null
    compare_with_reference "$ref" "$WORK/$name.sqfs"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ]
}

@test "a corrupted layer blob fails, names the layer and leaves no image" {
  [ -d "$WORK/oci" ] || build_umoci_image
  cp -r "$WORK/oci" "$WORK/bad"
  local blob
  blob=$(layers_of "$WORK/bad" t | cut -d, -f1 | cut -d'|' -f1)
  chmod u+w "$blob"
  truncate -s $(($(stat -c %s "$blob") / 2)) "$blob"
  rm -f "$WORK/bad.sqfs"
  run convert "$WORK/bad" t "$WORK/bad.sqfs"
  echo "$output"
  [ "$status" -ne 0 ]
  [[ "$output" == *"converting layer $(basename "$blob")"* ]]
  [[ "$output" == *"gzip"* ]]
  [ ! -e "$WORK/bad.sqfs" ]
}
