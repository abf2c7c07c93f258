# fixtures: registry images slurm
# The root side of a step, tried as a hostile cluster user would (issues 13 and 14): the shipped default
# configuration (no store_path) uses the job user's own store from the account database, never a store
# in /tmp or root's home that another user could have planted; a pull that prints without end cannot
# grow slurmstepd; a FIFO named as the image fails at once; another user's named container can be
# neither joined, replaced nor stopped.

load helpers

ATTACKER=gantry-attacker

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  TINY="$REG#gantry-test/tiny"
  U=$GANTRY_TEST_USER
  GANTRY_TEST_USER=$ATTACKER GANTRY_TEST_UID=4243 "$BATS_TEST_DIRNAME/../harness/user.sh" >/dev/null
  UHOME=$(getent passwd "$U" | cut -d: -f6)
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/step-trust.XXXXXX")
  chmod 0755 "$WORK"
  PLUGSTACK=$GANTRY_HARNESS_DIR/slurm/plugstack.conf
  cp "$PLUGSTACK" "$WORK/plugstack.conf.orig"
}

teardown() {
  cp "$WORK/plugstack.conf.orig" "$PLUGSTACK"
  for who in "$U" "$ATTACKER"; do pkill -u "$who" -f 'sleep 300' 2>/dev/null || true; done
  # A global named container outlives its job (no epilog removes it): stop it on its node.
  if [ -s "$WORK/global-container" ]; then
    read -r node cname <"$WORK/global-container"
    "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" exec "$node" -- "$GANTRY_BUILD_DIR/runtime/gantry" stop "$cname" || true
    "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" exec "$node" -- rm -f "/run/gantry/containers/$cname.json" || true
  fi
  rm -rf "$WORK" /tmp/.cache/gantry-step-trust
  # The per-user store of the default configuration test.
  rm -rf "$UHOME/.cache/gantry"
}

# as USER CMD...: a command as USER from the shared directory.
as() {
  local who=$1
  shift
  runuser -u "$who" -- env -C "$WORK" "$@"
}

# preload NAME C-SOURCE: builds $WORK/NAME.so from the C source (the user's LD_PRELOAD library).
preload() {
  printf '%s\n' "$2" >"$WORK/$1.c"
  gcc -shared -fPIC -o "$WORK/$1.so" "$WORK/$1.c"
  chmod 0755 "$WORK/$1.so"
}

nodes_idle() {
  for i in $(seq 100); do [ -z "$(sinfo -h -o '%t' | grep -v '^idle$')" ] && return 0; sleep 0.2; done
  sinfo -h -o '%t'
  return 1
}

@test "the shipped default (no store_path): the job user's own store from the account database; a store planted in /tmp is never used" {
  # gantry.conf as the package ships it, plus only the test registry's address.
  grep -v '^[[:space:]]*store_path' "$GANTRY_SOURCE_DIR/conf/gantry.conf" >"$GANTRY_HARNESS_DIR/gantry.conf"
  echo "insecure_registries = $REG" >>"$GANTRY_HARNESS_DIR/gantry.conf"
  rm -rf "$UHOME/.cache/gantry"
  # The attacker plants a trojan under tiny's digest where a store resolved from root's environment
  # without HOME would be (/tmp/.cache/gantry) and in the attacker-writable /tmp.
  mkdir -p "$WORK/trojan/work"
  echo "trojan ran" >"$WORK/trojan/work/README"
  mksquashfs "$WORK/trojan" "$WORK/trojan.sqsh" -quiet -noappend -all-root >/dev/null
  hex=${GANTRY_TEST_DIGEST_TINY#sha256:}
  planted_before=$(stat -c %Y /tmp/.cache 2>/dev/null || echo none)
  if [ ! -e /tmp/.cache ]; then
    as "$ATTACKER" mkdir -p /tmp/.cache/gantry/images /tmp/.cache/gantry/refs /tmp/.cache/gantry/used /tmp/.cache/gantry/locks /tmp/.cache/gantry/staging
    as "$ATTACKER" cp "$WORK/trojan.sqsh" "/tmp/.cache/gantry/images/$hex.sqsh"
    PLANTED=1
  fi
  run as "$U" timeout 180 srun -N2 -n2 --container-image="$TINY" cat /work/README
  echo "$output"
  [ -n "${PLANTED:-}" ] && rm -rf /tmp/.cache
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^tiny work dir$')" -eq 2 ]
  ! echo "$output" | grep -q trojan || false
  # The image is in the job user's own store, found through the account database, owned by the user.
  # (Stored whole or as layers: its record and its squashfs files, all the user's.)
  gantry_image_stored "$UHOME/.cache/gantry" "$hex"
  [ "$(stat -c %U "$UHOME/.cache/gantry/images/$hex.json")" = "$U" ]
  [ -z "$(find "$UHOME/.cache/gantry/images" -name '*.sqsh' ! -user "$U")" ]
  # Nothing was created in root's home.
  [ ! -e /root/.cache/gantry/images/$hex.sqsh ]
  [ ! -e /root/.cache/gantry/images/$hex.json ]
  echo "planted /tmp/.cache before: $planted_before"
}

@test "a pull that prints without end (LD_PRELOAD in the job's environment) is stopped; the step fails with a short message" {
  gantry_plugin_conf
  # Only in gantry itself (srun runs with the same environment).
  preload flood '#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void flood(void) {
  static char buf[1 << 20];
  if (strcmp(program_invocation_short_name, "gantry") != 0) return;
  memset(buf, 0x41, sizeof buf);
  for (int i = 0; i < 1024; i++) if (write(1, buf, sizeof buf) < 0) break;
  _exit(0);
}'
  # An image the store lacks, so that the node pulls (a stored one's warm step runs no pull).
  name="flood-$RANDOM$RANDOM"
  gantry_fresh_image "$WORK" "$name" >/dev/null
  # The peak resident size of the node's slurmstepd processes while the step runs.
  ( peak=0; for i in $(seq 300); do
      for r in $(ps -C slurmstepd -o rss= 2>/dev/null); do [ "$r" -gt "$peak" ] && peak=$r; done
      echo "$peak" >"$WORK/peak.tmp" && mv "$WORK/peak.tmp" "$WORK/peak"; sleep 0.05
    done ) 3>&- &
  sampler=$!
  t0=$(date +%s)
  run as "$U" timeout 120 env LD_PRELOAD="$WORK/flood.so" srun -N1 -n1 --container-image="$REG#gantry-test/$name" true
  t1=$(date +%s)
  kill "$sampler" 2>/dev/null || true
  echo "${output:0:2000}"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "wrote too much to its stdout (more than 65536 bytes) and was stopped"
  # Short: no flood reaches the user's terminal.
  [ "${#output}" -lt 20000 ]
  echo "slurmstepd peak RSS: $(cat "$WORK/peak") KiB; step took $((t1 - t0)) s"
  [ "$(cat "$WORK/peak")" -lt 102400 ]
  nodes_idle
}

@test "a FIFO or a device node given as --container-image fails at once with a clear message; nodes return to idle" {
  gantry_plugin_conf
  mkfifo "$WORK/image.fifo"
  chmod 0666 "$WORK/image.fifo"
  t0=$(date +%s%N)
  run as "$U" timeout 60 srun -N1 -n1 --container-image="$WORK/image.fifo" true
  t1=$(date +%s%N)
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "image.fifo: not a regular file"
  run as "$U" timeout 60 srun -N1 -n1 --container-image=/dev/zero true
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "/dev/zero: not a regular file"
  echo "the FIFO step took $(((t1 - t0) / 1000000)) ms"
  nodes_idle
}

@test "--container-image=/proc/self/fd/N is refused: no descriptor of slurmstepd reaches the user's processes" {
  gantry_plugin_conf
  # Acquired store images travel as /proc/self/fd/N and their descriptors are handed on to the user's
  # helpers and holder; a user naming such a path would otherwise be handed slurmstepd's descriptor N.
  for n in 0 3 7 12 03; do
    run as "$U" timeout 60 srun -N1 -n1 --container-image="/proc/self/fd/$n" true
    echo "$output"
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
    echo "$output" | grep -q "/proc/self/fd/$n names an open descriptor of this process, not an image file"
  done
  nodes_idle
}

@test "an image file the user cannot read is refused with the user's own rights (root's view is not an oracle)" {
  gantry_plugin_conf
  secret=$(mktemp -d /var/tmp/gantry-secret.XXXXXX)
  chmod 0700 "$secret"
  mksquashfs "$GANTRY_SOURCE_DIR/docs" "$secret/root-only.sqsh" -quiet -noappend >/dev/null
  run as "$U" timeout 60 srun -N1 -n1 --container-image="$secret/root-only.sqsh" true
  echo "$output"
  rm -rf "$secret"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  # The user's view: permission denied on the directory, as `cat` would say, not "not a squashfs".
  echo "$output" | grep -q "Permission denied"
  nodes_idle
}

@test "container_scope=global: another user can neither join, replace nor stop a named container" {
  gantry_plugin_conf
  sed -i 's|spank_gantry.so|& container_scope=global|' "$PLUGSTACK"
  grep -q 'container_scope=global' "$PLUGSTACK"
  name=shared-$RANDOM
  # The owner keeps a named container alive with a long step.
  node=$(sinfo -h -N -o '%N' | head -1)
  echo "$node pyxis_$name" >"$WORK/global-container"
  as "$U" srun -N1 -n1 -w "$node" --container-image="$TINY" --container-name="$name" \
    sh -c 'echo mine > /tmp/owner-mark; echo started; sleep 300' >"$WORK/owner.out" 2>&1 &
  owner=$!
  for i in $(seq 300); do grep -q started "$WORK/owner.out" && break; sleep 0.2; done
  cat "$WORK/owner.out"
  grep -q started "$WORK/owner.out"
  for mode in "" ":exec" ":create" ":auto" ":no_exec"; do
    run as "$ATTACKER" timeout 60 srun -N1 -n1 -w "$node" --container-image="$TINY" --container-name="$name$mode" cat /tmp/owner-mark
    echo "mode '$mode': $output"
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
    echo "$output" | grep -q "belongs to another user"
    ! echo "$output" | grep -qx mine || false
  done
  # The owner's step is still running in its container.
  kill -0 "$owner"
  pkill -u "$U" -f 'sleep 300' || true
  wait "$owner" || true
}

@test "the container holder keeps none of slurmstepd's descriptors (slurmd's log, its sockets) and no root output" {
  gantry_plugin_conf
  as "$U" srun -N1 -n1 --container-image="$TINY" sh -c 'echo "started $(readlink /proc/self/ns/mnt)"; sleep 300' >"$WORK/step.out" 2>&1 &
  step=$!
  for i in $(seq 300); do grep -q started "$WORK/step.out" && break; sleep 0.2; done
  grep -q started "$WORK/step.out"
  # This step's holder: the one whose mount namespace the rank is in.
  ns=$(awk '/^started/ { print $2 }' "$WORK/step.out")
  holder=
  for p in $(pgrep -u "$U" -x gantry-holder); do
    [ "$(readlink "/proc/$p/ns/mnt")" = "$ns" ] && holder=$p
  done
  echo "holder $holder in $ns"
  [ -n "$holder" ]
  fds=$(for f in /proc/"$holder"/fd/*; do printf '%s -> %s\n' "${f##*/}" "$(readlink "$f")"; done)
  echo "$fds"
  # A socket it may hold: its connection to the job's fuse image server (the fuse backend's lease).
  # Which process is at the other end (ss, in the node's network namespace, where the holder is):
  sockets=$(echo "$fds" | sed -n 's/.* -> socket:\[\([0-9]*\)\]$/\1/p')
  peers=
  for ino in $sockets; do
    table=$(nsenter --net="/proc/$holder/ns/net" ss -xpn)
    peer=$(echo "$table" | awk -v i="$ino" '$6 == i { print $8 }')
    owner=$(echo "$table" | awk -v i="$peer" '$6 == i' | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    peers="$peers $(tr '\0' ' ' <"/proc/${owner:-0}/cmdline" 2>/dev/null | cut -c1-200)|"
  done
  echo "socket peers:$peers"
  pkill -u "$U" -f 'sleep 300' || true
  wait "$step" || true
  # stdio is /dev/null, and nothing is a socket (but the image server's) or a file of the Slurm
  # harness (slurmd.log, spool).
  [ "$(echo "$fds" | awk '$1 <= 2' | grep -vc ' -> /dev/null$')" -eq 0 ]
  [ "$(echo "$sockets" | grep -c .)" -le 1 ]
  [ -z "$sockets" ] || [[ "$peers" == *" --serve-image "* ]]
  ! echo "$fds" | grep -qF "$GANTRY_SLURM_STATE" || false
  ! echo "$fds" | grep -q '\.log$' || false
}

# ptrace_attach PID: PTRACE_ATTACH from python3 (ctypes); prints "attached" or the errno's name.
ptrace_attach() {
  python3 -c '
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
if libc.ptrace(16, pid, None, None) == 0:
    os.waitpid(pid, 0); libc.ptrace(17, pid, None, None); print("attached")
else:
    print(errno.errorcode[ctypes.get_errno()])' "$1"
}

@test "the container holder is a fresh exec of gantry-holder that the job user can neither ptrace nor read through /proc" {
  gantry_plugin_conf
  as "$U" srun -N1 -n1 --container-image="$TINY" sh -c 'echo "started $(readlink /proc/self/ns/mnt)"; sleep 300' >"$WORK/step.out" 2>&1 &
  step=$!
  for i in $(seq 300); do grep -q started "$WORK/step.out" && break; sleep 0.2; done
  grep -q started "$WORK/step.out"
  ns=$(awk '/^started/ { print $2 }' "$WORK/step.out")
  holder=
  for p in $(pgrep -u "$U" -x gantry-holder); do
    [ "$(readlink "/proc/$p/ns/mnt")" = "$ns" ] && holder=$p
  done
  echo "holder $holder in $ns"
  [ -n "$holder" ]
  exe=$(readlink "/proc/$holder/exe")
  status_uid=$(awk '/^Uid:/ { print $2 }' "/proc/$holder/status")
  # As the job user, from the host: /proc/PID/fd, environ and ptrace are refused.
  fd_out=$(as "$U" ls "/proc/$holder/fd" 2>&1 || true)
  env_out=$(as "$U" cat "/proc/$holder/environ" 2>&1 || true)
  attach_holder=$(as "$U" bash -c "$(declare -f ptrace_attach); ptrace_attach $holder")
  # The control: the same user may ptrace a process of its own (so a refusal above is the holder's).
  as "$U" sleep 300 &
  own=$!
  sleep 0.2
  attach_own=$(as "$U" bash -c "$(declare -f ptrace_attach); ptrace_attach \$(pgrep -u $U -x -n sleep)")
  kill "$own" 2>/dev/null || true
  pkill -u "$U" -f 'sleep 300' || true
  wait "$step" || true
  echo "exe: $exe; uid $status_uid; fd: $fd_out; environ: $env_out; ptrace holder: $attach_holder; own: $attach_own"
  [ "$(readlink -f "$exe")" = "$(readlink -f "$GANTRY_BUILD_DIR/runtime/gantry-holder")" ]
  [ "$status_uid" = "$(id -u "$U")" ]
  echo "$fd_out" | grep -q "Permission denied"
  echo "$env_out" | grep -q "Permission denied"
  [ "$attach_holder" = EPERM ]
  [ "$attach_own" = attached ]
}

@test "a store image is not checked again as the user (no --check-paths helper); a bind source the user names still is (trace=)" {
  gantry_plugin_conf
  # plugstack trace= (bench/srun.sh --breakdown's trace points): an existing file, every process appends.
  install -m 0666 /dev/null "$WORK/trace"
  sed -i "s|^required .*spank_gantry.so.*|& trace=$WORK/trace|" "$PLUGSTACK"
  as "$U" srun -N1 -n1 --container-image="$TINY" true
  : >"$WORK/trace"
  as "$U" srun -N1 -n1 --container-image="$TINY" true
  cat "$WORK/trace"
  # The trace has slurmstepd's and the holder's points, and the store image's step ran no path check.
  grep -q ' prepare_step -$' "$WORK/trace"
  grep -q ' holder main$' "$WORK/trace"
  ! grep -q 'gantry-holder --check-paths' "$WORK/trace" || false
  # A bind source: checked as the user, by the helper.
  : >"$WORK/trace"
  as "$U" srun -N1 -n1 --container-mounts="$WORK:/mnt/work" --container-image="$TINY" true
  grep -q ' gantry-holder --check-paths +$' "$WORK/trace"
  run as "$U" srun -N1 -n1 --container-mounts="$WORK/missing:/mnt/x" --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "source path does not exist"
}

@test "a warm step of a stored image runs no gantry pull and one program: the holder acquires the pinned digest as the user and reports its config (trace=)" {
  gantry_plugin_conf
  install -m 0666 /dev/null "$WORK/trace"
  sed -i "s|^required .*spank_gantry.so.*|& trace=$WORK/trace|" "$PLUGSTACK"
  # Cold: the node pulls (nothing stored), then acquires.
  name="nopull-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  as "$U" srun -N1 -n1 --container-image="$REG#gantry-test/$name" true
  grep -q ' gantry pull +$' "$WORK/trace"
  # Warm, srun's digest and the user's own IMAGE@DIGEST: no pull, and of our programs only the holder,
  # once, which acquired the image itself (no --acquire helper, no second holder); the image's config
  # (its Env) came in the holder's first report.
  for image in "$TINY" "$TINY" "$REG#gantry-test/$name@$digest"; do
    : >"$WORK/trace"
    run as "$U" srun -N1 -n1 --container-image="$image" sh -c 'echo "tiny=$GANTRY_TINY digest=$GANTRY_CONTAINER_IMAGE_DIGEST"'
    echo "$output"
    cat "$WORK/trace"
    [ "$status" -eq 0 ]
    echo "$output" | grep -q "^tiny=1 digest=sha256:"
    [ "$(grep -c ' start gantry-holder --acquire-and-hold$' "$WORK/trace")" -eq 1 ]
    [ "$(grep -Ec ' start (gantry|gantry-holder|gantry-holder --acquire|gantry-holder --check-paths)$' "$WORK/trace")" -eq 0 ]
    grep -q ' acquire_in_holder -$' "$WORK/trace"
    grep -q ' holder main$' "$WORK/trace"
    ! grep -q ' gantry pull +$' "$WORK/trace" || false
  done
  echo "$output" | grep -q "digest=$digest$"
  # A step that fails after the holder acquired (a bind source that does not exist, found before the
  # set-up is sent): the waiting holder is killed and reaped with it, none is left behind.
  : >"$WORK/trace"
  run as "$U" srun -N1 -n1 --container-mounts="$WORK/missing:/mnt/x" --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "source path does not exist"
  grep -q ' start gantry-holder --acquire-and-hold$' "$WORK/trace"
  ! pgrep -u "$U" -f 'gantry-holder --acquire-and-hold' || false
  # A named container (it may outlive the step, detached) still gets the image from the user's helper,
  # then its holder: both run, and the container works.
  : >"$WORK/trace"
  run as "$U" srun -N1 -n1 --container-name="named$RANDOM" --container-image="$TINY" sh -c 'echo "tiny=$GANTRY_TINY"'
  echo "$output"
  cat "$WORK/trace"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "^tiny=1$"
  [ "$(grep -c ' start gantry-holder --acquire$' "$WORK/trace")" -eq 1 ]
  ! grep -q ' start gantry-holder --acquire-and-hold$' "$WORK/trace" || false
  # private_images: the registry vouches for every use, so the node's pull runs again.
  gantry_plugin_conf "private_images = yes"
  : >"$WORK/trace"
  as "$U" srun -N1 -n1 --container-image="$TINY" true || true
  grep -q ' gantry pull +$' "$WORK/trace"
}
