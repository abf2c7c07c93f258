# fixtures:
# The fuse backend's shared image server (runtime/launcher/image_server.cpp): one gantry-imagefs per
# user and image, shared by that user's `gantry run` containers, surviving a SIGKILLed container,
# never shared across users, unreachable for another user, gone after mount_idle_seconds.
# Driven as the test user (gantry-test), as root, and with gantry-attacker as the hostile user.

bats_require_minimum_version 1.5.0

load helpers

ATTACKER=gantry-attacker

setup_file() {
  export GANTRY="${GANTRY_BUILD_DIR:-/tmp/build-run}/runtime/gantry"
  [ -x "$GANTRY" ] || { echo "gantry not built at $GANTRY" >&2; return 1; }
  export TUSER TUID AUID
  TUSER=$("${GANTRY_SOURCE_DIR:-$BATS_TEST_DIRNAME/../..}/tests/harness/user.sh")
  TUID=$(id -u "$TUSER")
  # The hostile user, made here as store_attack.bats makes it (this suite may run first).
  GANTRY_TEST_USER=$ATTACKER GANTRY_TEST_UID=4243 "${GANTRY_SOURCE_DIR:-$BATS_TEST_DIRNAME/../..}/tests/harness/user.sh" >/dev/null
  AUID=$(id -u "$ATTACKER")
  gantry_open_fuse
  export IMGDIR
  IMGDIR=$(mktemp -d /tmp/gantry-fuse-shared-bats.XXXXXX)
  chmod 0755 "$IMGDIR"
  mkdir -p "$IMGDIR/tree/bin" "$IMGDIR/tree/data"
  cp /bin/busybox "$IMGDIR/tree/bin/"
  for c in sh cat stat sleep; do ln -s busybox "$IMGDIR/tree/bin/$c"; done
  echo served-once > "$IMGDIR/tree/data/marker"
  mksquashfs "$IMGDIR/tree" "$IMGDIR/img.sqsh" -noappend -quiet -all-root >/dev/null
  chmod -R a+rX "$IMGDIR"
  # Short idle time, so that the release is seen within the test.
  printf 'mount_idle_seconds = 3\n' > "$IMGDIR/gantry.conf"
  chmod 0644 "$IMGDIR/gantry.conf"
  export GANTRY_CONFIG=$IMGDIR/gantry.conf
}

teardown() {
  runuser -u "$TUSER" -- "$GANTRY" stop fuse-shared-a >/dev/null 2>&1 || true
  wait_servers_gone
  # What the planting test left: the attacker's directory or symlink where the user's servers live.
  local base=/tmp/gantry-fuse-$TUID
  if [ -L "$base" ] || [ "$(stat -c %u "$base" 2>/dev/null)" = "$AUID" ]; then rm -rf "$base"; fi
  rm -rf /tmp/gantry-fuse-bats-planted
}

teardown_file() {
  rm -rf "$IMGDIR"
  gantry_restore_fuse
}

as() { local u=$1; shift; runuser -u "$u" -- env GANTRY_CONFIG="$GANTRY_CONFIG" "$@"; }
# servers USER: the pids of USER's image servers for this suite's image.
servers() { pgrep -u "$1" -f -- "--serve-image $IMGDIR/img.sqsh" || true; }
daemons() { local p; for p in $(servers "$1"); do echo $(cat "/proc/$p/task/$p/children"); done; }
wait_servers_gone() {
  local i
  for i in $(seq 50); do
    [ -z "$(servers "$TUSER")$(servers "$ATTACKER")$(servers root)" ] && return 0
    sleep 0.2
  done
  return 1
}
# has_conn MINOR: the FUSE connection exists (fusectl, mounted in a private mount namespace where
# the host has not mounted it: the host's mounts stay as they are).
has_conn() {
  unshare -m sh -c 'mountpoint -q /sys/fs/fuse/connections || mount -t fusectl fusectl /sys/fs/fuse/connections
    [ -d "/sys/fs/fuse/connections/$1" ]' sh "$1"
}
# dev USER: st_dev of the image's /data as a new container of USER sees it (one FUSE connection each).
dev() { as "$1" "$GANTRY" run --backend fuse "$IMGDIR/img.sqsh" stat -c %d /data; }

@test "two containers of one user share one gantry-imagefs, which outlives a SIGKILLed container" {
  as "$TUSER" "$GANTRY" run --name fuse-shared-a --detach --backend fuse "$IMGDIR/img.sqsh"
  server=$(servers "$TUSER")
  [ "$(echo "$server" | wc -w)" -eq 1 ]
  daemon=$(daemons "$TUSER")
  [ "$(echo "$daemon" | wc -w)" -eq 1 ]
  [ "$(ps -o comm= -p "$daemon")" = gantry-imagefs ]
  [ "$(stat -c %u "/proc/$server")" = "$TUID" ]
  [ "$(stat -c %u "/proc/$daemon")" = "$TUID" ]  # the daemon runs as the user, never as root
  in_a=$(as "$TUSER" "$GANTRY" exec fuse-shared-a stat -c %d /data)
  run as "$TUSER" "$GANTRY" run --backend fuse "$IMGDIR/img.sqsh" sh -c 'cat /data/marker; stat -c %d /data'
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = served-once ]
  [ "${lines[1]}" = "$in_a" ]         # the same FUSE connection: one mount, one daemon
  [ "$(servers "$TUSER")" = "$server" ]
  [ "$(daemons "$TUSER")" = "$daemon" ]

  # SIGKILL the detached container's holder: the server and its daemon stay, the next container uses them.
  holder=
  for p in $(pgrep -u "$TUSER" -x gantry-holder); do
    [ "$p" = "$server" ] || holder=$p
  done
  [ -n "$holder" ]
  kill -KILL "$holder"
  for i in $(seq 50); do [ -d "/proc/$holder" ] || break; sleep 0.1; done
  [ ! -d "/proc/$holder" ]
  [ "$(servers "$TUSER")" = "$server" ]
  [ "$(daemons "$TUSER")" = "$daemon" ]
  [ "$(dev "$TUSER")" = "$in_a" ]
  [ "$(servers "$TUSER")" = "$server" ]
}

# cpu_ticks PID: user + system CPU time of a process, in clock ticks (/proc/PID/stat fields 14, 15).
cpu_ticks() { cut -d')' -f2- "/proc/$1/stat" | awk '{print $12 + $13}'; }

@test "fuse_poll_us reaches gantry-imagefs (default 0); a polling server idles without using CPU" {
  as "$TUSER" "$GANTRY" run --name fuse-shared-a --detach --backend fuse "$IMGDIR/img.sqsh"
  daemon=$(daemons "$TUSER")
  [ "$(echo "$daemon" | wc -w)" -eq 1 ]
  tr '\0' ' ' < "/proc/$daemon/cmdline" | grep -q -- '--poll-us=0 '   # the default: sleep at once
  as "$TUSER" "$GANTRY" stop fuse-shared-a
  wait_servers_gone

  printf 'mount_idle_seconds = 3\nfuse_poll_us = 50\n' > "$IMGDIR/poll.conf"
  chmod 0644 "$IMGDIR/poll.conf"
  GANTRY_CONFIG=$IMGDIR/poll.conf as "$TUSER" "$GANTRY" run --name fuse-shared-a --detach --backend fuse "$IMGDIR/img.sqsh"
  daemon=$(daemons "$TUSER")
  tr '\0' ' ' < "/proc/$daemon/cmdline" | grep -q -- '--poll-us=50 '
  # Requests, then quiet: over two idle seconds a server still polling would use ~200 ticks.
  run as "$TUSER" "$GANTRY" exec fuse-shared-a sh -c 'for i in 1 2 3 4 5 6 7 8; do cat /data/marker; cat /data/none-$i 2>/dev/null; done'
  [ "${lines[0]}" = served-once ]
  sleep 0.5
  before=$(cpu_ticks "$daemon")
  sleep 2
  after=$(cpu_ticks "$daemon")
  echo "daemon CPU ticks while idle: $((after - before))"
  [ $((after - before)) -le 10 ]
}

@test "after mount_idle_seconds without a container the server, its daemon and its mount are gone" {
  d=$(dev "$TUSER")
  # The FUSE connection of that mount: /sys/fs/fuse/connections/<minor of st_dev>.
  conn=$(( (d & 0xff) | ((d >> 12) & ~0xff) ))
  has_conn "$conn"
  server=$(servers "$TUSER")
  [ -n "$server" ]
  daemon=$(daemons "$TUSER")
  sleep 1
  [ -d "/proc/$server" ]              # still within the idle time
  has_conn "$conn"
  for i in $(seq 60); do [ -d "/proc/$server" ] || break; sleep 0.2; done
  [ ! -d "/proc/$server" ]
  [ ! -d "/proc/$daemon" ]
  for i in $(seq 20); do has_conn "$conn" || break; sleep 0.1; done
  ! has_conn "$conn" || false
  # The next container starts a new one.
  dev "$TUSER" >/dev/null
  [ -n "$(servers "$TUSER")" ]
  [ "$(servers "$TUSER")" != "$server" ]
}

@test "never shared across users: the attacker and root get their own, and cannot reach the user's" {
  mine=$(dev "$TUSER")
  theirs=$(dev "$ATTACKER")
  roots=$(dev root)
  [ "$mine" != "$theirs" ]
  [ "$mine" != "$roots" ]
  [ "$(echo "$(servers "$TUSER")" | wc -w)" -eq 1 ]
  [ "$(echo "$(servers "$ATTACKER")" | wc -w)" -eq 1 ]
  [ "$(echo "$(servers root)" | wc -w)" -eq 1 ]
  # root's own runs share root's server too.
  [ "$(dev root)" = "$roots" ]
  # The user's directory is closed to the attacker: no listing, no connecting to the socket, no
  # way into the server's namespaces.
  base=/tmp/gantry-fuse-$TUID
  [ "$(stat -c '%u %a' "$base")" = "$TUID 700" ]
  run runuser -u "$ATTACKER" -- ls "$base"
  [ "$status" -ne 0 ]
  socket=$(ls -d "$base"/*/socket | head -1)
  run runuser -u "$ATTACKER" -- python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$socket"
  [ "$status" -ne 0 ]
  [[ "$output" == *"Permission denied"* ]]
  server=$(servers "$TUSER")
  run runuser -u "$ATTACKER" -- cat "/proc/$server/ns/user"
  [ "$status" -ne 0 ]
  run runuser -u "$ATTACKER" -- nsenter -t "$server" -U -m true
  [ "$status" -ne 0 ]
}

@test "a directory the attacker planted where the user's servers live is refused; the container still runs" {
  base=/tmp/gantry-fuse-$TUID
  wait_servers_gone
  rm -rf "$base"
  # A directory of the attacker's own, open to the user.
  runuser -u "$ATTACKER" -- mkdir -m 0777 "$base"
  run as "$TUSER" "$GANTRY" run --backend fuse "$IMGDIR/img.sqsh" cat /data/marker
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"gantry: warning: refusing to use $base: not a 0700 directory of uid $TUID (owned by uid $AUID; remove it); serving the image to this container alone"* ]]
  [[ "$output" == *served-once* ]]
  [ -z "$(servers "$TUSER")" ]
  [ -z "$(find "$base" -mindepth 1 -print -quit)" ]  # nothing of the user's was made in it
  # A symlink to a directory of the attacker's: never followed.
  rmdir "$base"
  runuser -u "$ATTACKER" -- mkdir -m 0777 /tmp/gantry-fuse-bats-planted
  runuser -u "$ATTACKER" -- ln -s /tmp/gantry-fuse-bats-planted "$base"
  run as "$TUSER" "$GANTRY" run --backend fuse "$IMGDIR/img.sqsh" cat /data/marker
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"gantry: warning: opening $base (not a directory, or a symlink): "* ]]
  [[ "$output" == *served-once* ]]
  [ -z "$(find /tmp/gantry-fuse-bats-planted -mindepth 1 -print -quit)" ]
  [ -z "$(servers "$TUSER")" ]
}

@test "fuse_shared = no: a daemon per container, as before" {
  printf 'mount_idle_seconds = 3\nfuse_shared = no\n' > "$IMGDIR/private.conf"
  chmod 0644 "$IMGDIR/private.conf"
  run runuser -u "$TUSER" -- env GANTRY_CONFIG="$IMGDIR/private.conf" "$GANTRY" run --backend fuse "$IMGDIR/img.sqsh" cat /data/marker
  [ "$status" -eq 0 ]
  [ "$output" = served-once ]
  [ -z "$(servers "$TUSER")" ]
}

@test "fuse_server = squashfuse_ll: the fallback server is shared the same way" {
  printf 'mount_idle_seconds = 3\nfuse_server = squashfuse_ll\n' > "$IMGDIR/squashfuse.conf"
  chmod 0644 "$IMGDIR/squashfuse.conf"
  run runuser -u "$TUSER" -- env GANTRY_CONFIG="$IMGDIR/squashfuse.conf" "$GANTRY" run --backend fuse "$IMGDIR/img.sqsh" sh -c 'cat /data/marker; grep -o "fuse.squashfuse_ll" /proc/self/mountinfo | head -1'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = served-once ]
  [ "${lines[1]}" = fuse.squashfuse_ll ]
  daemon=$(daemons "$TUSER")
  [ "$(echo "$daemon" | wc -w)" -eq 1 ]
  [ "$(ps -o comm= -p "$daemon")" = squashfuse_ll ]
}
