# fixtures:
# gantry-imagefs, the fuse backend's server (runtime/imagefs), mounted by hand as root: the tree it
# serves equals `umoci unpack` of the same one-layer image (hard links, symlinks, xattrs, device
# nodes, fifos, owners, modes, mtimes, contents), and what the kernel still asks it for: no OPEN or
# OPENDIR after the first, no second READ of a cached file, no second LOOKUP of a missing name.

bats_require_minimum_version 1.5.0

setup_file() {
  export BUILD=${GANTRY_BUILD_DIR:-/tmp/build-imagefs}
  export IMAGEFS=$BUILD/runtime/gantry-imagefs
  export TREECMP=$BATS_TEST_DIRNAME/treecmp.py
  [ -x "$IMAGEFS" ] || { echo "build gantry-imagefs first ($IMAGEFS missing)" >&2; return 1; }
  export WORK=$BATS_FILE_TMPDIR/w
  mkdir -p "$WORK"
}

teardown() {
  mountpoint -q "$WORK/m" && umount "$WORK/m"
  true
}

# serve IMAGE [OPTIONS...]: gantry-imagefs on $WORK/m, in the background, stderr to $WORK/serve.err.
serve() {
  local img=$1
  shift
  mkdir -p "$WORK/m"
  "$IMAGEFS" "$@" "$img" "$WORK/m" 2>"$WORK/serve.err" &
  SERVER=$!
  local i
  for i in $(seq 50); do
    mountpoint -q "$WORK/m" && return 0
    sleep 0.1
  done
  cat "$WORK/serve.err" >&2
  return 1
}

# unserve: unmount and wait for the server to leave (it reports on the way out).
unserve() {
  umount "$WORK/m"
  wait "$SERVER"
}

# One layer, no whiteouts: everything a root file system holds, as umoci writes and unpacks it.
build_image() {
  local L=$WORK/oci B=$WORK/bundle R
  rm -rf "$L" "$B"
  umoci init --layout "$L"
  umoci new --image "$L:t"
  umoci unpack --image "$L:t" "$B" >/dev/null
  R=$B/rootfs
  mkdir -p "$R"/{etc,bin,dev,home/u,tmp,lib/deep/er/still,"ünï 日本"}
  chmod 1777 "$R/tmp"
  echo keep >"$R/etc/keep"
  printf 'tool' >"$R/bin/tool"
  chmod 4755 "$R/bin/tool"
  ln "$R/bin/tool" "$R/bin/tool-link"
  ln "$R/bin/tool" "$R/lib/deep/er/still/third-link"
  ln -s /bin/tool "$R/abs"
  ln -s ../../../../etc/shadow "$R/outside"
  ln -s "$(printf 'x%.0s' {1..1000})" "$R/long-target"
  mkfifo "$R/fifo"
  mknod "$R/dev/null" c 1 3
  mknod "$R/dev/loop9" b 7 9
  mknod "$R/dev/big" c 300 70000
  echo owned >"$R/home/u/f"
  chown 1000:100000 "$R/home/u/f"
  chown 1000:1000 "$R/home/u"
  setfattr -n user.gantry -v hello "$R/etc/keep"
  setfattr -n trusted.gantry -v x "$R/bin/tool"
  setfattr -n user.second -v "$(printf 'v%.0s' {1..3000})" "$R/etc/keep"
  echo utf8 >"$R/ünï 日本/$(printf 'n%.0s' {1..200})"
  for i in $(seq 500); do echo "$i" >"$R/lib/f$i"; done
  head -c 3000000 /dev/urandom >"$R/random.bin"
  : >"$R/empty"
  umoci repack --image "$L:t" "$B"
  rm -rf "$B"
  umoci unpack --image "$L:t" "$WORK/ref" >/dev/null
  # The layer as a squashfs written by tar2sqfs (squashfs-tools-ng): device nodes and xattrs kept.
  local blob
  blob=$(python3 -c 'import json,sys; L=sys.argv[1]; i=json.load(open(L+"/index.json")); m=json.load(open(L+"/blobs/"+i["manifests"][0]["digest"].replace(":","/"))); print(L+"/blobs/"+m["layers"][0]["digest"].replace(":","/"))' "$L")
  gzip -dc "$blob" | tar2sqfs -q -c lz4 "$WORK/img.sqfs"
}

@test "gantry-imagefs serves the tree umoci unpacks: hard links, symlinks, xattrs, device nodes" {
  build_image
  serve "$WORK/img.sqfs"
  run python3 "$TREECMP" --devices --ignore-dir-mtime "$WORK/ref/rootfs" "$WORK/m"
  echo "$output"
  [ "$status" -eq 0 ]
  # The comparison covered what it claims (treecmp compares these only where both trees have them).
  [ "$(stat -c %i "$WORK/m/bin/tool")" = "$(stat -c %i "$WORK/m/lib/deep/er/still/third-link")" ]
  [ "$(stat -c %h "$WORK/m/bin/tool")" = 3 ]
  [ "$(stat -c '%t:%T' "$WORK/m/dev/big")" = "12c:11170" ]
  [ "$(getfattr --only-values -n user.gantry "$WORK/m/etc/keep")" = hello ]
  [ "$(stat -c %i "$WORK/m")" = 1 ]
  # A missing name.
  run stat "$WORK/m/nothere"
  [ "$status" -ne 0 ]
  [[ "$output" == *"No such file or directory"* ]]
  unserve
}

@test "the kernel sends no OPEN per file, no second READ, and no second LOOKUP of a missing name" {
  [ -f "$WORK/img.sqfs" ] || build_image
  serve "$WORK/img.sqfs" --report-requests
  local pass
  for pass in 1 2 3; do
    cat "$WORK"/m/lib/f* >/dev/null
    find "$WORK/m" -type f >/dev/null
    for i in $(seq 20); do stat "$WORK/m/lib/missing.py" 2>/dev/null || true; done
  done
  unserve
  local report
  report=$(grep '^gantry-imagefs: requests:' "$WORK/serve.err")
  echo "$report"
  count() { echo "$report" | grep -o " $1=[0-9]*" | cut -d= -f2; }
  # ENOSYS once each, and the kernel stops asking.
  [ "$(count OPEN)" -le 1 ]
  [ "$(count OPENDIR)" -le 1 ]
  # 500 small files, each read once over three passes: the pages stayed cached.
  [ "$(count READ)" -ge 500 ]
  [ "$(count READ)" -lt 600 ]
  # 60 stats of one missing name: one LOOKUP for it (the negative entry is cached); the rest of the
  # LOOKUPs are the few names readdirplus did not bring first.
  [ "$(count LOOKUP)" -lt 20 ]
  [ "$(count READDIRPLUS)" -ge 1 ]
}

@test "gantry-imagefs refuses a file that is not a squashfs image, with a message" {
  head -c 8192 /dev/urandom >"$WORK/junk"
  mkdir -p "$WORK/m"
  run "$IMAGEFS" "$WORK/junk" "$WORK/m"
  [ "$status" -eq 1 ]
  [[ "$output" == *"not a squashfs image"* ]]
  ! mountpoint -q "$WORK/m" || false
}
