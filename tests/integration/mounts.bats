# fixtures:
# Node-wide kernel mounts (runtime/launcher/shared_mounts.cpp), as root: containers of one image share
# one loop mount in the host mount namespace, another image gets its own, the mount outlives its
# containers for later starts, and idle release unmounts it after mount_idle_seconds, never while a
# container still uses it. Images are squashfs files built here from busybox-static.

bats_require_minimum_version 1.5.0

setup_file() {
  export GANTRY="${GANTRY_BUILD_DIR:-/tmp/build-run}/runtime/gantry"
  [ -x "$GANTRY" ] || { echo "gantry not built at $GANTRY" >&2; return 1; }
  [ "$(id -u)" -eq 0 ] || { echo "mounts.bats needs root (kernel backend)" >&2; return 1; }
  # Root-owned and not writable by others all the way down: trusted for the kernel backend.
  export WORK
  WORK=$(mktemp -d /var/tmp/gantry-mounts-bats.XXXXXX)
  chmod 0755 "$WORK"
  for img in a b; do
    local tree=$WORK/tree-$img
    mkdir -p "$tree/bin"
    cp /bin/busybox "$tree/bin/"
    for c in sh cat sleep true; do ln -s busybox "$tree/bin/$c"; done
    echo "image-$img" > "$tree/marker"
    mksquashfs "$tree" "$WORK/$img.sqsh" -noappend -quiet -all-root >/dev/null
  done
  export RUNDIR=$WORK/run
  # A private runtime_path, so the test sees only its own mounts; one config per idle time.
  for idle in 0 1 300; do
    printf 'runtime_path = %s\nmount_backend = kernel\nmount_idle_seconds = %s\n' "$RUNDIR" "$idle" > "$WORK/idle$idle.conf"
  done
}

teardown_file() {
  # Release what is left (idle 0 releases every unused mount), then make sure nothing stays mounted.
  GANTRY_CONFIG=$WORK/idle0.conf "$GANTRY" run "$WORK/a.sqsh" true || true
  for n in m1 m2 m3; do GANTRY_CONFIG=$WORK/idle0.conf "$GANTRY" stop "$n" 2>/dev/null || true; done
  grep -o " $RUNDIR/images/[^ ]*" /proc/self/mountinfo | while read -r m; do umount -l "$m"; done
  rm -rf "$WORK"
}

teardown() {
  for n in m1 m2 m3; do GANTRY_CONFIG=$WORK/idle0.conf "$GANTRY" stop "$n" 2>/dev/null || true; done
  GANTRY_CONFIG=$WORK/idle0.conf "$GANTRY" run "$WORK/a.sqsh" true || true
}

g() { local idle=$1; shift; GANTRY_CONFIG=$WORK/idle$idle.conf "$GANTRY" "$@"; }
# Host mounts below our images directory, and the loop devices backing one image file.
node_mounts() { grep -c " $RUNDIR/images/[0-9a-f]*/root " /proc/self/mountinfo || true; }
loops_of() { losetup -j "$WORK/$1.sqsh" | grep -c . || true; }
# The mount ID (first field of mountinfo) of the one node-wide mount of image $1 ("" if none).
mount_id_of() {
  local dev
  dev=$(losetup -j "$WORK/$1.sqsh" | cut -d: -f1)
  [ -n "$dev" ] || return 0
  awk -v d="$dev" -v p="$RUNDIR/images/" 'index($5, p) == 1 && $0 ~ (" " d " ") {print $1}' /proc/self/mountinfo
}

@test "two containers of one image share one loop mount; another image gets its own" {
  run g 300 run --name m1 --detach "$WORK/a.sqsh"
  [ "$status" -eq 0 ]
  run g 300 run --name m2 --detach "$WORK/a.sqsh"
  [ "$status" -eq 0 ]
  [ "$(node_mounts)" -eq 1 ]
  [ "$(loops_of a)" -eq 1 ]
  run g 300 run --name m3 --detach "$WORK/b.sqsh"
  [ "$status" -eq 0 ]
  [ "$(node_mounts)" -eq 2 ]
  [ "$(loops_of a)" -eq 1 ]
  [ "$(loops_of b)" -eq 1 ]
  # Each container sees its own image through the shared mount.
  run g 300 exec m1 cat /marker
  [ "$output" = image-a ]
  run g 300 exec m2 cat /marker
  [ "$output" = image-a ]
  run g 300 exec m3 cat /marker
  [ "$output" = image-b ]
  # The mount directory is root's alone, and the mount is read-only, nosuid, nodev.
  [ "$(stat -c '%a %u' "$RUNDIR/images")" = "700 0" ]
  grep " $RUNDIR/images/[0-9a-f]*/root " /proc/self/mountinfo | grep -q " ro,nosuid,nodev"
}

@test "the mount outlives its containers and a later start reuses it" {
  run g 300 run "$WORK/a.sqsh" cat /marker
  [ "$status" -eq 0 ]
  [ "$output" = image-a ]
  [ "$(node_mounts)" -eq 1 ]
  local id
  id=$(mount_id_of a)
  [ -n "$id" ]
  run g 300 run "$WORK/a.sqsh" cat /marker
  [ "$output" = image-a ]
  # Same mount (same mount ID), still one loop device.
  [ "$(mount_id_of a)" = "$id" ]
  [ "$(loops_of a)" -eq 1 ]
}

@test "idle release: never while a container uses the mount, after the idle time once unused" {
  run g 1 run --name m1 --detach "$WORK/a.sqsh"
  [ "$status" -eq 0 ]
  sleep 2
  # A privileged start sweeps idle mounts: a is in use and stays.
  run g 1 run "$WORK/b.sqsh" true
  [ "$status" -eq 0 ]
  [ "$(loops_of a)" -eq 1 ]
  run g 1 exec m1 cat /marker
  [ "$output" = image-a ]
  # Stopping the last user starts a's idle clock; it is not released at once.
  run g 1 stop m1
  [ "$status" -eq 0 ]
  [ "$(loops_of a)" -eq 1 ]
  sleep 1.5
  run g 1 run "$WORK/b.sqsh" true
  [ "$status" -eq 0 ]
  [ "$(loops_of a)" -eq 0 ]
  [ -z "$(mount_id_of a)" ]
  # b was just used: it stays.
  [ "$(loops_of b)" -eq 1 ]
  # A later start of a mounts it again.
  run g 1 run "$WORK/a.sqsh" cat /marker
  [ "$output" = image-a ]
  [ "$(loops_of a)" -eq 1 ]
}

@test "a crashed holder does not leak its reference" {
  run g 1 run --name m1 --detach "$WORK/a.sqsh"
  [ "$status" -eq 0 ]
  local pid
  pid=$(grep -o '"holder_pid": [0-9]*' "$RUNDIR/containers/m1.json" | grep -o '[0-9]*$')
  [ -n "$pid" ]
  kill -KILL "$pid"
  sleep 1.5
  # First sweep after the crash sees a unused and starts its clock; the next one after 1 s releases it.
  run g 1 run "$WORK/b.sqsh" true
  sleep 1.5
  run g 1 run "$WORK/b.sqsh" true
  [ "$(loops_of a)" -eq 0 ]
}

@test "an image deleted while mounted is released at the next sweep once unused" {
  cp "$WORK/a.sqsh" "$WORK/c.sqsh"
  run g 300 run "$WORK/c.sqsh" cat /marker
  [ "$output" = image-a ]
  [ "$(loops_of c)" -eq 1 ]
  [ "$(node_mounts)" -eq 1 ]
  rm "$WORK/c.sqsh"
  run g 300 run "$WORK/b.sqsh" true
  [ "$status" -eq 0 ]
  [ "$(node_mounts)" -eq 1 ]
  [ "$(losetup -a | grep -c "$WORK/c.sqsh")" -eq 0 ]
}
