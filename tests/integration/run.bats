# fixtures:
# `gantry run` / `exec` / `stop`: the container launcher, driven as the unprivileged test user (fuse
# backend) and as root (kernel and extract backends), against squashfs images built here from
# busybox-static with mksquashfs.

bats_require_minimum_version 1.5.0

load helpers

setup_file() {
  export GANTRY="${GANTRY_BUILD_DIR:-/tmp/build-run}/runtime/gantry"
  [ -x "$GANTRY" ] || { echo "gantry not built at $GANTRY" >&2; return 1; }
  export TUSER
  TUSER=$("${GANTRY_SOURCE_DIR:-$BATS_TEST_DIRNAME/../..}/tests/harness/user.sh")
  gantry_open_fuse

  # Root-owned, world-readable: readable by the test user, trusted for the kernel backend.
  export IMGDIR
  IMGDIR=$(mktemp -d /tmp/gantry-run-bats.XXXXXX)
  chmod 0755 "$IMGDIR"
  local tree=$IMGDIR/tree
  mkdir -p "$tree"/{bin,etc,usr/local/bin,work,data/in-image}
  cp /bin/busybox "$tree/bin/"
  for c in $(/bin/busybox --list); do [ "$c" = busybox ] || ln -s busybox "$tree/bin/$c"; done
  printf 'root:x:0:0:root:/root:/bin/sh\n' > "$tree/etc/passwd"
  printf 'root:x:0:\n' > "$tree/etc/group"
  printf '#!/bin/sh\necho only-in-image "$@"\n' > "$tree/usr/local/bin/only-in-image"
  printf '#!/bin/sh\necho "entry:$*"\nexec "$@"\n' > "$tree/entry.sh"
  chmod 0755 "$tree/usr/local/bin/only-in-image" "$tree/entry.sh"
  mkdir -m 0700 "$tree/root" && echo image-root > "$tree/root/marker"
  ln -s /etc "$tree/evil"                      # absolute symlink: must resolve inside the image
  ln -s ../../../../etc "$tree/data/climb"     # relative climb: clamped at the image root
  mksquashfs "$tree" "$IMGDIR/img.sqsh" -noappend -quiet -all-root >/dev/null
  cat > "$IMGDIR/config.json" <<'JSON'
{"architecture":"amd64","os":"linux","config":{
 "Env":["PATH=/usr/local/bin:/bin","LANG=C.UTF-8","IMGVAR=from-image","SHARED=image"],
 "Entrypoint":["/entry.sh"],"Cmd":["echo","from-cmd"],"WorkingDir":"/work"}}
JSON
  chmod -R a+rX "$IMGDIR"
  export SHARE
  SHARE=$(mktemp -d /tmp/gantry-run-share.XXXXXX)
  chown "$TUSER" "$SHARE"
  chmod 0755 "$SHARE"
}

# A test that stops half-way must not leave its detached container to the suites after it.
teardown() {
  as_user "$GANTRY" stop bats-rw >/dev/null 2>&1 || true
}

teardown_file() {
  gantry_restore_fuse
  rm -rf "$IMGDIR" "$SHARE"
}

as_user() { runuser -u "$TUSER" -- "$@"; }
grun() { as_user "$GANTRY" run "$@"; }

@test "exit status is the command's" {
  run grun "$IMGDIR/img.sqsh" true
  [ "$status" -eq 0 ]
  run grun "$IMGDIR/img.sqsh" sh -c 'exit 3'
  [ "$status" -eq 3 ]
  run grun "$IMGDIR/img.sqsh" sh -c 'kill -KILL $$'
  [ "$status" -eq 137 ]
  run -127 grun "$IMGDIR/img.sqsh" no-such-command
  [ "$status" -eq 127 ]
}

@test "a command that exists only in the image runs (PATH lookup inside)" {
  run grun "$IMGDIR/img.sqsh" only-in-image hello
  [ "$status" -eq 0 ]
  [ "$output" = "only-in-image hello" ]
}

@test "SIGTERM to gantry run reaches the container process" {
  as_user "$GANTRY" run "$IMGDIR/img.sqsh" sh -c 'trap "echo got-TERM >&2; exit 7" TERM; echo ready; sleep 10 & wait' \
    > "$SHARE/sig.out" 2> "$SHARE/sig.err" &
  local bg=$!
  for _ in $(seq 50); do grep -q ready "$SHARE/sig.out" 2>/dev/null && break; sleep 0.1; done
  kill -TERM "$(pgrep -u "$TUSER" -x gantry -n)"
  local rc=0
  wait "$bg" || rc=$?
  [ "$rc" -eq 7 ]
  grep -q got-TERM "$SHARE/sig.err"
}

@test "user, groups, passwd and HOME" {
  run grun "$IMGDIR/img.sqsh" sh -c 'id -un; id -u; echo $HOME; grep "^$(id -un):" /etc/passwd | cut -d: -f3'
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "$TUSER" ]
  [ "${lines[1]}" = "$(id -u "$TUSER")" ]
  [ "${lines[2]}" = "$(getent passwd "$TUSER" | cut -d: -f6)" ]
  [ "${lines[3]}" = "$(id -u "$TUSER")" ]
}

@test "environment: image Env, --env host wins, LANG from image, Slurm variables pass" {
  run env IMGVAR=host SHARED=host LANG=de_DE.UTF-8 SLURM_PROCID=5 runuser -u "$TUSER" --preserve-environment -- \
    "$GANTRY" run --config-file "$IMGDIR/config.json" --env SHARED --image-file "$IMGDIR/img.sqsh" \
    sh -c 'echo "$IMGVAR $SHARED $LANG $SLURM_PROCID $PATH"'
  [ "$status" -eq 0 ]
  [ "$output" = "from-image host C.UTF-8 5 /usr/local/bin:/bin" ]
  run env LANG=de_DE.UTF-8 runuser -u "$TUSER" --preserve-environment -- \
    "$GANTRY" run --config-file "$IMGDIR/config.json" --env LANG --image-file "$IMGDIR/img.sqsh" sh -c 'echo $LANG'
  [ "$output" = "de_DE.UTF-8" ]
}

@test "entrypoint off by default, OCI rules when on; WorkingDir and --workdir" {
  run grun --config-file "$IMGDIR/config.json" --image-file "$IMGDIR/img.sqsh"
  [ "$output" = "from-cmd" ]
  run grun --config-file "$IMGDIR/config.json" --entrypoint --image-file "$IMGDIR/img.sqsh"
  [ "${lines[0]}" = "entry:echo from-cmd" ]
  [ "${lines[1]}" = "from-cmd" ]
  run grun --config-file "$IMGDIR/config.json" --entrypoint --image-file "$IMGDIR/img.sqsh" echo args
  [ "${lines[0]}" = "entry:echo args" ]
  run grun --config-file "$IMGDIR/config.json" --image-file "$IMGDIR/img.sqsh" pwd
  [ "$output" = "/work" ]
  run grun --config-file "$IMGDIR/config.json" --workdir /etc --image-file "$IMGDIR/img.sqsh" pwd
  [ "$output" = "/etc" ]
  run grun --workdir /nonexistent "$IMGDIR/img.sqsh" pwd
  [ "$status" -ne 0 ]
  [[ "$output" == *"working directory /nonexistent"* ]]
}

@test "mounts: rw, ro, tmpfs, umount, flags" {
  run grun --mount "$SHARE:/share" "$IMGDIR/img.sqsh" sh -c 'echo rw > /share/rw-file && cat /share/rw-file'
  [ "$output" = "rw" ]
  [ -f "$SHARE/rw-file" ]
  run grun --mount "$SHARE:/share:ro" "$IMGDIR/img.sqsh" sh -c 'touch /share/x'
  [ "$status" -ne 0 ]
  [[ "$output" == *"Read-only file system"* ]]
  run grun --mount "tmpfs:/scratch:size=1M" "$IMGDIR/img.sqsh" sh -c 'grep " /scratch " /proc/self/mountinfo'
  [[ "$output" == *"tmpfs"*"size=1024k"* ]]
  run grun --mount umount:/dev/shm "$IMGDIR/img.sqsh" sh -c 'grep -c " /dev/shm " /proc/self/mountinfo'
  [ "$output" = "0" ]
  run grun --mount "$SHARE:/share:ro+nosuid+nodev+noexec+bind+slave" "$IMGDIR/img.sqsh" sh -c 'grep " /share " /proc/self/mountinfo'
  [[ "$output" == *"ro,nosuid,nodev,noexec"* ]]
  run grun --mount "$SHARE:/a/new/place,$SHARE:./rel" "$IMGDIR/img.sqsh" sh -c 'ls -d /a/new/place /rel'
  [ "$status" -eq 0 ]
  run grun --mount /dev/null:/dev/infiniband-fake "$IMGDIR/img.sqsh" sh -c 'echo x > /dev/infiniband-fake && echo ok'
  [ "$output" = "ok" ]
}

@test "mount errors: missing source, unreadable source, '..', unknown flag, unknown namespace" {
  run grun --mount /nonexistent-src:/x "$IMGDIR/img.sqsh" true
  [ "$status" -eq 125 ]
  [ "$output" = "gantry: mounting /nonexistent-src at /x: source path does not exist" ]
  # A source only has to exist for the user (Pyxis): a directory they cannot read is bound and stays
  # unreadable inside; one below a directory they cannot search does not exist for them.
  mkdir -p "$SHARE/../gantry-run-secret.$$/inner" && chmod 0700 "$SHARE/../gantry-run-secret.$$"
  run grun --mount "/tmp/gantry-run-secret.$$:/s" "$IMGDIR/img.sqsh" sh -c 'ls /s || echo unreadable'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"Permission denied"*"unreadable" ]]
  run grun --mount "/tmp/gantry-run-secret.$$/inner:/s" "$IMGDIR/img.sqsh" true
  rm -rf "/tmp/gantry-run-secret.$$"
  echo "$output"
  [ "$status" -eq 125 ]
  [[ "$output" == *"/tmp/gantry-run-secret.$$/inner"*"Permission denied"* ]]
  run grun --mount "$SHARE:/x/../../etc" "$IMGDIR/img.sqsh" true
  [[ "$output" == *"'..' is not allowed"* ]]
  run grun --mount "$SHARE:/x:bogus" "$IMGDIR/img.sqsh" true
  [[ "$output" == *"unknown mount flag 'bogus'"* ]]
  run grun --unshare net,pid "$IMGDIR/img.sqsh" true
  [[ "$output" == *"unknown namespace 'pid'"* ]]
}

@test "destination symlinks in the image are resolved inside it, never onto the host" {
  # Counted by the share's name: a read-only root has its own overlay mounted at /etc as well.
  run grun --mount "$SHARE:/evil" "$IMGDIR/img.sqsh" sh -c "grep ' /etc ' /proc/self/mountinfo | grep -c '${SHARE##*/}'"
  [ "$output" = "1" ]   # /evil -> /etc landed on the image's /etc
  run grun --mount "$SHARE:/data/climb" "$IMGDIR/img.sqsh" sh -c "grep ' /etc ' /proc/self/mountinfo | grep -c '${SHARE##*/}'"
  [ "$output" = "1" ]
  run grun --mount "$SHARE:/evil/pwned" "$IMGDIR/img.sqsh" true
  [ "$status" -ne 0 ]
  [ ! -e /etc/pwned ]
}

@test "read-only by default; --writable writes do not persist" {
  run grun "$IMGDIR/img.sqsh" touch /newfile
  [ "$status" -ne 0 ]
  [[ "$output" == *"Read-only file system"* ]]
  run grun --writable "$IMGDIR/img.sqsh" sh -c 'touch /newfile && echo hi > /etc/motd-gantry-test 2>/dev/null; ls /newfile'
  [ "$output" = "/newfile" ]
  run grun --writable "$IMGDIR/img.sqsh" ls /newfile
  [ "$status" -ne 0 ]
}

@test "--writable: the upper layer lives in scratch_path (not in memory) and is removed with the container" {
  as_user "$GANTRY" stop bats-rw >/dev/null 2>&1 || true
  mkdir -p "$SHARE/scratch" && chown "$TUSER" "$SHARE/scratch"
  printf 'scratch_path = %s\n' "$SHARE/scratch" >"$SHARE/scratch.conf"
  chmod 644 "$SHARE/scratch.conf"
  cfg=(env GANTRY_CONFIG="$SHARE/scratch.conf")
  run as_user "${cfg[@]}" "$GANTRY" run --name bats-rw --detach --writable "$IMGDIR/img.sqsh"
  echo "$output"
  [ "$status" -eq 0 ]
  run as_user "${cfg[@]}" "$GANTRY" exec bats-rw sh -c 'head -c 3000000 /dev/zero > /big && mkdir -p /opt/new && echo x > /opt/new/file && ls -l /big'
  echo "$output"
  [ "$status" -eq 0 ]
  # On the host: the user's own directory in scratch_path holds the writes (3 MB, a new directory).
  layer=$(ls -d "$SHARE/scratch"/gantry-rw-*)
  [ "$(echo "$layer" | wc -l)" -eq 1 ]
  [ "$(stat -c %U "$layer")" = "$TUSER" ]
  [ "$(stat -c %s "$layer/upper/big")" -eq 3000000 ]
  [ "$(cat "$layer/upper/opt/new/file")" = x ]
  # The container's memory holds none of it: no tmpfs under its root.
  run as_user "${cfg[@]}" "$GANTRY" exec bats-rw sh -c 'grep " / " /proc/self/mountinfo'
  echo "$output"
  [[ "$output" == *overlay* ]]
  run as_user "${cfg[@]}" "$GANTRY" stop bats-rw
  [ "$status" -eq 0 ]
  sleep 0.5
  [ -z "$(ls -A "$SHARE/scratch")" ]
  # A scratch_path the user cannot create in is a clear error.
  printf 'scratch_path = /proc\n' >"$SHARE/scratch.conf"
  run as_user "${cfg[@]}" "$GANTRY" run --writable "$IMGDIR/img.sqsh" true
  echo "$output"
  [ "$status" -ne 0 ]
  [[ "$output" == *"creating the writable layer in scratch_path /proc"* ]]
}

@test "--remap-root: uid 0 inside, files on a bind mount belong to the user outside" {
  run grun --remap-root --mount "$SHARE:/share" "$IMGDIR/img.sqsh" sh -c 'id -u; echo x > /share/by-root'
  [ "${lines[0]}" = "0" ]
  [ "$(stat -c %U "$SHARE/by-root")" = "$TUSER" ]
}

@test "the system call filter: Seccomp 2 with and without --remap-root; chown to another id is a no-op success" {
  run grun "$IMGDIR/img.sqsh" grep Seccomp: /proc/self/status
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
  run grun --remap-root "$IMGDIR/img.sqsh" grep Seccomp: /proc/self/status
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
  # The namespace maps one id: without the filter chown to 1234 fails (Invalid argument).
  run grun --remap-root --writable "$IMGDIR/img.sqsh" sh -c 'touch /tmp/x /x && chown 1234:1234 /tmp/x /x && stat -c %u:%g /tmp/x /x'
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf '0:0\n0:0')" ]
  # gantry exec joins through the same path: it gets the filter too.
  as_user "$GANTRY" run --name seccomp-test --detach --remap-root "$IMGDIR/img.sqsh"
  run as_user "$GANTRY" exec seccomp-test grep Seccomp: /proc/self/status
  as_user "$GANTRY" stop seccomp-test
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
}

@test "--remap-root --no-mount-home: HOME is the image's /root, the user's home is not mounted anywhere" {
  home=$(getent passwd "$TUSER" | cut -d: -f6)
  run grun --remap-root --no-mount-home "$IMGDIR/img.sqsh" sh -c \
    "echo \$HOME; cat /root/marker; grep -c ' $home ' /proc/self/mountinfo; grep ^root: /etc/passwd | cut -d: -f6"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "/root" ]
  [ "${lines[1]}" = "image-root" ]  # the image's /root, not the user's home
  [ "${lines[2]}" = "0" ]
  [ "${lines[3]}" = "/root" ]
  # With the home (the default) it is mounted at /root, where the user is root (Enroot's home hook):
  # the last mount at /root (over the image's) is the home directory, which has no mount of its own.
  run grun --remap-root "$IMGDIR/img.sqsh" sh -c "echo \$HOME; cat /root/marker 2>/dev/null || echo no-marker; awk '\$5 == \"/root\" {r = \$4} END {print r}' /proc/self/mountinfo; awk '\$5 == \"$home\"' /proc/self/mountinfo | wc -l"
  echo "$output"
  [ "${lines[0]}" = "/root" ]
  [ "${lines[1]}" = "no-marker" ]  # the user's home, not the image's /root
  [ "${lines[2]}" = "$home" ]
  [ "${lines[3]}" = "0" ]
}

@test "/dev holds the standard nodes; /proc, /sys ro, /tmp and /run tmpfs, host network files" {
  run grun "$IMGDIR/img.sqsh" sh -c 'ls /dev | tr "\n" " "; echo; echo x > /dev/null && head -c1 /dev/zero | wc -c; touch /sys/x 2>&1 | grep -c Read-only; grep -E " /(tmp|run) " /proc/self/mountinfo | grep -c tmpfs; cat /etc/hostname'
  [ "$status" -eq 0 ]
  for n in null zero full random urandom tty pts shm ptmx fd; do [[ "${lines[0]}" == *"$n"* ]]; done
  [ "${lines[1]}" = "1" ]
  [ "${lines[2]}" = "1" ]
  [ "${lines[3]}" = "2" ]
  [ "${lines[4]}" = "$(cat /etc/hostname)" ]
}

@test "--mount-home is the default; --no-mount-home leaves it out" {
  home=$(getent passwd "$TUSER" | cut -d: -f6)
  run grun "$IMGDIR/img.sqsh" sh -c "grep -c ' $home ' /proc/self/mountinfo"
  [ "$output" = "1" ]
  run grun --no-mount-home "$IMGDIR/img.sqsh" sh -c "grep -c ' $home ' /proc/self/mountinfo"
  [ "$output" = "0" ]
}

@test "join: gantry exec shares the mount namespace and /tmp; stop cleans up" {
  run as_user "$GANTRY" run --name bats-join --detach "$IMGDIR/img.sqsh"
  [ "$status" -eq 0 ]
  run as_user "$GANTRY" exec bats-join sh -c 'echo shared > /tmp/marker; readlink /proc/self/ns/mnt'
  first=$output
  run as_user "$GANTRY" exec bats-join sh -c 'cat /tmp/marker; readlink /proc/self/ns/mnt'
  [ "${lines[0]}" = "shared" ]
  [ "${lines[1]}" = "$first" ]
  run as_user "$GANTRY" exec --workdir /etc bats-join pwd
  [ "$output" = "/etc" ]
  run as_user "$GANTRY" ps
  [[ "$output" == *"bats-join"* ]]
  run as_user "$GANTRY" run --name bats-join --detach "$IMGDIR/img.sqsh"
  [[ "$output" == *"already exists"* ]]
  run as_user "$GANTRY" stop bats-join
  [ "$status" -eq 0 ]
  run as_user "$GANTRY" exec bats-join true
  [ "$status" -ne 0 ]
}

@test "backends: kernel and extract as root, fuse as root and user; kernel refused for users" {
  for b in kernel extract fuse; do
    run "$GANTRY" run --backend "$b" "$IMGDIR/img.sqsh" only-in-image "$b"
    [ "$status" -eq 0 ]
    [ "$output" = "only-in-image $b" ]
  done
  run grun --backend extract "$IMGDIR/img.sqsh" only-in-image x
  [ "$output" = "only-in-image x" ]
  ! ls -d /tmp/gantry-extract-* 2>/dev/null || false
  run grun --backend kernel "$IMGDIR/img.sqsh" true
  [ "$status" -eq 125 ]
  [[ "$output" == *"kernel backend needs root"* ]]
  # A user-owned file is never kernel-mounted, even by root.
  cp "$IMGDIR/img.sqsh" "$SHARE/user.sqsh"
  chown "$TUSER" "$SHARE/user.sqsh"
  run "$GANTRY" run --backend kernel "$SHARE/user.sqsh" true
  [ "$status" -eq 125 ]
}

@test "errors: /dev/fuse not accessible, not a squashfs file" {
  chmod 0600 /dev/fuse
  run grun --backend fuse "$IMGDIR/img.sqsh" true
  chmod 0666 /dev/fuse
  [ "$status" -eq 125 ]
  [[ "$output" == "gantry: /dev/fuse not accessible: Permission denied (use the kernel backend from Slurm, or ask the admin for fuse access)" ]]
  run grun "$IMGDIR/config.json" true
  [[ "$output" == *"not a squashfs file"* ]]
}

# A shell command printing the file system type mounted last at $1 inside (mountinfo: field 5 is the
# mount point, the type follows " - ").
fstype_cmd() {
  printf 'awk -v p=%s '\''$5 == p {t = $0} END {sub(/.* - /, "", t); split(t, a, " "); print a[1]}'\'' /proc/self/mountinfo' "$1"
}

@test "read-only root: image directories bound, /etc merged and generated, new top-level mount points" {
  run grun --mount "$SHARE:/fsx" "$IMGDIR/img.sqsh" sh -c "
    $(fstype_cmd /); $(fstype_cmd /usr); $(fstype_cmd /etc)
    grep -c '^$TUSER:' /etc/passwd; cat /etc/hostname; grep -c localhost /etc/hosts
    readlink /evil; ls /evil/group; ls /usr/local/bin/only-in-image; echo fsx > /fsx/from-container
    for p in / /usr /usr/local/bin /etc /data/in-image; do touch \$p/gantry-x 2>&1 | grep -c 'Read-only file system'; done"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "tmpfs" ]               # the skeleton
  [ "${lines[1]}" = "fuse.gantry-imagefs" ]  # the image itself, not an overlay
  [ "${lines[2]}" = "overlay" ]
  [ "${lines[3]}" = "1" ]
  [ "${lines[4]}" = "$(cat /etc/hostname)" ]
  [ "${lines[5]}" -ge 1 ]
  [ "${lines[6]}" = "/etc" ]                # a top-level symlink is copied, resolving inside
  [ "${lines[7]}" = "/evil/group" ]
  [ "${lines[8]}" = "/usr/local/bin/only-in-image" ]
  for i in 9 10 11 12 13; do [ "${lines[$i]}" = "1" ]; done
  [ "$(cat "$SHARE/from-container")" = "fsx" ]
  [ ! -e "$SHARE/gantry-x" ]
}

@test "read-only root: a mount point inside an image directory merges that directory only" {
  run grun --mount "$SHARE:/usr/local/new-dir" "$IMGDIR/img.sqsh" sh -c "
    $(fstype_cmd /usr); $(fstype_cmd /data); only-in-image ok; ls /usr/local/new-dir >/dev/null && echo listed
    for p in /usr /usr/local /etc; do touch \$p/gantry-x 2>&1 | grep -c 'Read-only file system'; done"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "overlay" ]
  [ "${lines[1]}" = "fuse.gantry-imagefs" ]
  [ "${lines[2]}" = "only-in-image ok" ]
  [ "${lines[3]}" = "listed" ]
  for i in 4 5 6; do [ "${lines[$i]}" = "1" ]; done
}

@test "read-only root with the kernel and extract backends; --writable keeps one overlay" {
  run "$GANTRY" run --backend kernel "$IMGDIR/img.sqsh" sh -c "$(fstype_cmd /usr); touch /usr/x 2>&1 | grep -c Read-only; id -un"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "squashfs" ]
  [ "${lines[1]}" = "1" ]
  [ "${lines[2]}" = "root" ]
  # extract keeps the single overlay: its tree is per container, and is deleted even under mounts.
  run grun --backend extract --mount "$SHARE:/data/in-image" --mount "$SHARE:/usr" "$IMGDIR/img.sqsh" \
    sh -c "$(fstype_cmd /); touch /bin/x 2>&1 | grep -c Read-only; ls /usr/local/bin/only-in-image 2>&1 | grep -c 'No such'"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "overlay" ]
  [ "${lines[1]}" = "1" ]
  [ "${lines[2]}" = "1" ]
  ! ls -d /tmp/gantry-extract-* 2>/dev/null || false
  # (The image's directories belong to root, unmapped for the user: / itself is the upper layer's.)
  run grun --writable "$IMGDIR/img.sqsh" sh -c "$(fstype_cmd /); touch /x && echo wrote"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "overlay" ]
  [ "${lines[1]}" = "wrote" ]
}
