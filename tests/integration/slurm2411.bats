# fixtures: registry images slurm2411
# The plugin on a second Slurm: 24.11 from Debian 13 (trixie), built and run inside a trixie root
# (tests/harness/slurm2411.sh) beside the host's 22.05 cluster. srun, slurmctld and slurmd here are
# 24.11's own binaries; spank_gantry.so was built against 24.11's headers in that root. The harness's
# own checks and the release checks; the plugin suites run on this cluster as integration.<suite>@24.11.

load helpers

setup() {
  gantry_load_env registry images slurm2411
  # The nodes have networks of their own: the harness registry at the login node's bridge address.
  gantry_cluster_registry
  TINY="$REG#gantry-test/tiny"
  U=gantry-test
  # The default backend: fuse (trixie's squashfuse_ll 0.5 on libfuse 3.17, whose clean exit used to
  # hang the step; docs/testing.md, "Slurm 24.11").
  # import_messages = 0: the cases compare srun's output with the tasks' (pyxis_compat.bats covers them).
  printf 'store_path = %s\ninsecure_registries = %s\nimport_messages = 0\n' "$GANTRY_T2411_FSX/store" "$REG" >"$GANTRY_T2411_GANTRY_CONF"
  mkdir -p "$GANTRY_T2411_FSX/store" && chmod 1777 "$GANTRY_T2411_FSX/store"
  WORK=$(mktemp -d "$GANTRY_T2411_FSX/t.XXXXXX")
  chown "$U" "$WORK"
}

teardown() {
  rm -rf "$WORK" "${ALT:-}"
}

# in_trixie CMD...: CMD as root inside the trixie root. as_user CMD...: as the test user, from WORK.
in_trixie() { $GANTRY_T2411_EXEC "$@"; }
as_user() { gantry_as_user "$U" "$WORK" "$@"; }

# slurmd_alive: every node's slurmd runs, and the controller answers.
slurmd_alive() {
  local node pid
  for node in $GANTRY_TEST_NODES; do
    pid=$(cat "${GANTRY_T2411_SLURMD_PID_PATTERN//%n/$node}")
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ] || { echo "slurmd of $node (pid $pid) is gone"; return 1; }
  done
  in_trixie scontrol ping | grep -q UP
}

@test "24.11: three nodes, each slurmd in a network and UTS namespace of its own inside the root" {
  [ "$GANTRY_TEST_NODE_COUNT" -ge 2 ]
  run in_trixie sinfo -h -N -o '%N %t'
  echo "$output"
  [ "$(echo "$output" | awk '{print $1}' | tr '\n' ' ')" = "$GANTRY_TEST_NODES " ]
  local node pid nets=() root_mnt
  root_mnt=$(readlink "/proc/$(cat "$GANTRY_T2411_STATE/holder.pid")/ns/mnt")
  for node in $GANTRY_TEST_NODES; do
    pid=$(cat "${GANTRY_T2411_SLURMD_PID_PATTERN//%n/$node}")
    # The root's file systems, the node's own network and hostname (none of them the host's).
    [ "$(readlink "/proc/$pid/ns/mnt")" = "$root_mnt" ]
    [ "$(readlink "/proc/$pid/ns/net")" != "$(readlink /proc/1/ns/net)" ]
    nets+=("$(readlink "/proc/$pid/ns/net")")
    [ "$($GANTRY_SLURM_EXEC "$node" -- hostname)" = "$node" ]
  done
  [ "$(printf '%s\n' "${nets[@]}" | sort -u | wc -l)" -eq "$GANTRY_TEST_NODE_COUNT" ]
  # One step across all nodes, as the job user, in the image: every node's rank sees its hostname.
  run as_user srun -N"$GANTRY_TEST_NODE_COUNT" --ntasks-per-node=1 --container-image="$TINY" sh -c 'echo "$(hostname) $(cat /work/README)"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort | tr '\n' ',')" = "$(for n in $GANTRY_TEST_NODES; do printf '%s tiny work dir,' "$n"; done)" ]
  # The host's resolver knows nothing of the cluster (its hosts file is the harness's, inside the root).
  ! grep -q "tnode\|gantry-trixie" /etc/hosts || false
  ! grep -qs "$GANTRY_T2411_STATE" /etc/slurm/slurm.conf || false
}

@test "24.11: the root runs Slurm 24.11, the plugin was built for it, and srun --help lists its options" {
  run in_trixie slurmd -V
  echo "$output"
  [[ $output == *" 24.11."* ]]
  grep -qa "gantry-built-for-slurm=24.11" "$GANTRY_T2411_PLUGIN"
  # The 22.05 host is not what runs here.
  [[ $(slurmd -V) != *" 24.11."* ]]
  slurmd_alive
  run as_user srun --help
  [ "$status" -eq 0 ]
  echo "$output" | grep -q -- '--container-image'
  echo "$output" | grep -q -- '--container-mounts'
}

@test "24.11: srun -n2 runs both ranks in the image as the job user, and slurmd survives the step" {
  run as_user srun -n2 --container-image="$TINY" sh -c 'echo "rank $SLURM_PROCID uid $(id -u) $(cat /work/README)"'
  echo "$output"
  [ "$status" -eq 0 ]
  # /work/README exists only in the image; uid 4242 is gantry-test, not root.
  [ "$(echo "$output" | grep -c "^rank [01] uid $(id -u "$U") tiny work dir$")" -eq 2 ]
  [ "$(echo "$output" | grep -c '^rank 0 ')" -eq 1 ]
  [ ! -e "$GANTRY_T2411_ROOT/work/README" ]
  slurmd_alive
  # The default backend for a store users can write: the image is served by gantry-imagefs (on
  # trixie's libfuse 3.17), and the step ends cleanly: its holder and fuse daemons are gone. /bin is
  # gantry-imagefs's mount (an image stored whole) or the overlayfs stack of the layers' (the default);
  # while the step runs, the user's gantry-imagefs serves it.
  as_user timeout 120 srun -n1 --container-image="$TINY" sh -c \
    'awk '\''$5 == "/bin" { for (i = 7; $i != "-"; i++); print $(i + 1) }'\'' /proc/self/mountinfo; sleep 6' \
    >"$WORK/fstype" 2>&1 &
  step=$!
  served=
  for i in $(seq 100); do
    pgrep -u "$U" -x gantry-imagefs >/dev/null && served=1 && break
    sleep 0.1
  done
  wait "$step"
  cat "$WORK/fstype"
  [ -n "$served" ]
  grep -qxE 'fuse\.gantry-imagefs|overlay' "$WORK/fstype"
  sleep 1
  # Any fuse daemon left is an image server's (the job's, until its epilog ends it, or a gantry run's
  # in another suite, until mount_idle_seconds), never one the step's holder ran itself.
  # The job's server may be ending just now (the epilog SIGKILLs it; its daemon follows, orphaned for
  # a moment): a daemon counts as left only if it outlives 5 s without a server as its parent.
  for p in $(pgrep -x 'gantry-imagefs|squashfuse_ll'); do
    for i in $(seq 25); do
      parent=$(ps -o ppid= -p "$p" | tr -d ' ')
      [ -n "$parent" ] || break
      tr '\0' ' ' <"/proc/$parent/cmdline" 2>/dev/null | grep -q -- ' --serve-image ' && break
      sleep 0.2
    done
    [ -z "$parent" ] || tr '\0' ' ' <"/proc/$parent/cmdline" 2>/dev/null | grep -q -- ' --serve-image ' ||
      { echo "step daemon $p left (parent $parent)"; false; }
  done
  slurmd_alive
}

@test "24.11: a --container-mounts bind is visible and writable in the container" {
  echo "from the host" >"$WORK/in.txt"
  chown "$U" "$WORK/in.txt"
  run as_user srun -n1 --container-image="$TINY" --container-mounts="$WORK:/data" sh -c 'cat /data/in.txt; echo out > /data/out.txt'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "from the host" ]
  [ "$(cat "$WORK/out.txt")" = out ]
  [ "$(stat -c %u "$WORK/out.txt")" = "$(id -u "$U")" ]
}

@test "24.11: a bad image fails the step with pyxis's 'failed to import docker image' line; the node stays up" {
  run as_user srun -n1 --container-image="$REG#gantry-test/no-such-image" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  slurmd_alive
  run in_trixie sinfo -h -N -o %t
  [ -z "$(echo "$output" | grep -vE '^(idle|mix)$')" ]
}

@test "24.11: the host's 22.05-built spank_gantry.so is refused by name, without a crash; doctor names both releases" {
  old=$GANTRY_BUILD_DIR/plugin/spank_gantry.so
  [ -f "$old" ] || { echo "no host (22.05) build of spank_gantry.so in $GANTRY_BUILD_DIR: build the spank_gantry target" >&2; false; }
  old_release=$(grep -aoE 'gantry-built-for-slurm=[0-9]+\.[0-9]+' "$old" | head -1 | cut -d= -f2)
  [ -n "$old_release" ]
  [ "$old_release" != 24.11 ]
  # A second slurm.conf for the same cluster whose plugstack names the host's plugin: srun (24.11)
  # loads it in its local context, as it would on a node where someone copied the wrong build.
  ALT=$(mktemp -d "$GANTRY_T2411_FSX/alt.XXXXXX")
  sed "s|^PlugStackConfig=.*|PlugStackConfig=$ALT/plugstack.conf|" "$GANTRY_T2411_CONF_DIR/slurm.conf" >"$ALT/slurm.conf"
  echo "required $old config=$GANTRY_T2411_GANTRY_CONF" >"$ALT/plugstack.conf"
  chmod -R a+rX "$ALT"
  run as_user env SLURM_CONF="$ALT/slurm.conf" srun -n1 true
  echo "$output"
  [ "$status" -ne 0 ]
  # Slurm 24.11 itself checks a SPANK plugin's plugin_version (the SLURM_VERSION_NUMBER it was built
  # with) before calling it: the error names the file and its release, and no signal killed srun.
  echo "$output" | grep -q "$old"
  echo "$output" | grep -qiE "incompatible|built for Slurm $old_release"
  echo "$output" | grep -qE "${old_release%.*}\.0?${old_release#*.}"
  [ "$status" -lt 128 ]
  slurmd_alive
  # gantry doctor (24.11's build) reads the marker without loading the plugin: both releases, the fix.
  run in_trixie env SLURM_CONF="$ALT/slurm.conf" GANTRY_CONFIG="$GANTRY_T2411_GANTRY_CONF" "$GANTRY_T2411_GANTRY" doctor
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep "Slurm version" | grep -q "built for Slurm $old_release, running slurm[-a-z]* 24.11"
  echo "$output" | grep -q "rebuild Gantry against this Slurm"
  # And with the matching plugin doctor is content with the release.
  run in_trixie env GANTRY_CONFIG="$GANTRY_T2411_GANTRY_CONF" "$GANTRY_T2411_GANTRY" doctor
  echo "$output"
  echo "$output" | grep "Slurm version" | grep -q "built for Slurm 24.11, running slurm[-a-z]* 24.11"
  ! echo "$output" | grep "Slurm version" | grep -q "✗" || false
}

@test "24.11: crash-node kills that node's processes only (not a host process named slurmd, not another node's); start-node brings it back" {
  local victim=${GANTRY_TEST_NODES##* } other=${GANTRY_TEST_NODES%% *} victim_pid other_pid decoy i since
  victim_pid=$(cat "${GANTRY_T2411_SLURMD_PID_PATTERN//%n/$victim}")
  other_pid=$(cat "${GANTRY_T2411_SLURMD_PID_PATTERN//%n/$other}")
  # A host process named slurmd that no harness started.
  mkdir -p "$WORK/decoy" && cp "$(command -v sleep)" "$WORK/decoy/slurmd"
  setsid "$WORK/decoy/slurmd" 300 </dev/null >/dev/null 2>&1 3>&- &
  decoy=$!
  run "$GANTRY_SLURM_HARNESS" crash-node "$victim"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "crashing $victim: SIGKILL to.* $victim_pid\b"
  # The victim's slurmd is gone (or a zombie until init reaps it); the decoy and the other node live.
  for ((i = 0; i < 50; i++)); do
    grep -q '^State:.*Z' "/proc/$victim_pid/status" 2>/dev/null || [ ! -e "/proc/$victim_pid" ] && break
    sleep 0.1
  done
  grep -q '^State:.*Z' "/proc/$victim_pid/status" 2>/dev/null || [ ! -e "/proc/$victim_pid" ]
  kill -0 "$decoy"
  [ "$(cat "/proc/$other_pid/comm")" = slurmd ]
  kill "$decoy"
  since=$(date +%s)
  run "$GANTRY_SLURM_HARNESS" start-node "$victim"
  echo "$output"
  [ "$status" -eq 0 ]
  # Not `sinfo` alone: restarted within a ping interval, the victim still shows idle from before the
  # crash, and the controller's late verdict on the killed slurmd (not responding, then down) hit the
  # next suite in CI (pyxis_compat@24.11). Wait for the new slurmd's registration and every node idle.
  gantry_nodes_restored "$victim" "$since"
  [ "$(in_trixie sinfo -h -N -n "$victim" -o %t)" = idle ]
  slurmd_alive
  run as_user srun -N"$GANTRY_TEST_NODE_COUNT" --ntasks-per-node=1 hostname
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort | tr '\n' ' ')" = "$GANTRY_TEST_NODES " ]
}

@test "24.11: slurmd and slurmctld are still up after the suite's steps" {
  slurmd_alive
  ctld=$(cat "$GANTRY_T2411_SLURMCTLD_PID")
  [ "$(cat "/proc/$ctld/comm")" = slurmctld ]
  for node in $GANTRY_TEST_NODES; do
    ! grep -qiE 'segfault|signal 11|core dumped' "${GANTRY_SLURMD_LOG_PATTERN//%n/$node}" || false
  done
}
