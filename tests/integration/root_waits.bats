# fixtures: slurm
# Root's waits on what a job user influences (issue #34), tried as a hostile user on the real Slurm
# harness: an image path inside a FUSE mount the user stopped, and a pull child that closes its pipes
# and sleeps. Each step must end within 10 s of its own deadline or of `scancel`, with one line naming
# what was wrong, the node idle again and nothing of the step left behind.

load helpers

ATTACKER=gantry-attacker

setup() {
  gantry_load_env slurm
  REG=127.0.0.1:9  # no registry: nothing here pulls for real
  GANTRY_TEST_USER=$ATTACKER GANTRY_TEST_UID=4243 "$BATS_TEST_DIRNAME/../harness/user.sh" >/dev/null
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/root-waits.XXXXXX")
  chmod 0755 "$WORK"
  NODE=${GANTRY_TEST_NODES%% *}
  PLUGSTACK=$GANTRY_HARNESS_DIR/slurm/plugstack.conf
  cp "$PLUGSTACK" "$WORK/plugstack.conf.orig"
  FUSE_PID=
}

teardown() {
  cp "$WORK/plugstack.conf.orig" "$PLUGSTACK"
  if [ -n "$FUSE_PID" ]; then
    kill -CONT "$FUSE_PID" 2>/dev/null || true
    "$GANTRY_SLURM_HARNESS" exec "$NODE" -- fusermount3 -u -z "$WORK/mnt" 2>/dev/null || true
    kill -9 "$FUSE_PID" 2>/dev/null || true
  fi
  pkill -9 -u "$ATTACKER" 2>/dev/null || true
  scancel -u "$ATTACKER" 2>/dev/null || true
  rm -rf "$WORK"
}

# as CMD...: CMD as the attacker from the shared directory.
as_attacker() {
  runuser -u "$ATTACKER" -- env -C "$WORK" "$@"
}

nodes_idle() {
  for _ in $(seq 100); do [ -z "$(sinfo -h -o '%t' | grep -v '^idle$')" ] && return 0; sleep 0.2; done
  sinfo -h -o '%t'
  return 1
}

# seconds_since T0: seconds (0.1 s resolution) from T0 (`date +%s%N`) to now.
seconds_since() {
  local tenths=$((($(date +%s%N) - $1) / 100000000))
  echo "$((tenths / 10)).$((tenths % 10))"
}

# below SECONDS BOUND: true when SECONDS (as printed by seconds_since) is below BOUND (an integer).
below() { [ "${1%.*}" -lt "$2" ]; }

# stopped_fuse_image: the attacker mounts a squashfs of their own with squashfuse on $NODE, then stops
# the daemon (SIGSTOP): every look at a path inside it now waits for ever. Sets IMAGE to such a path.
stopped_fuse_image() {
  mkdir -p "$WORK/tree" "$WORK/mnt"
  echo hsqs >"$WORK/tree/image.sqsh"
  mksquashfs "$WORK/tree" "$WORK/outer.sqsh" -quiet -noappend >/dev/null
  chown -R "$ATTACKER" "$WORK/mnt" "$WORK/outer.sqsh"
  "$GANTRY_SLURM_HARNESS" exec "$NODE" -- runuser -u "$ATTACKER" -- squashfuse "$WORK/outer.sqsh" "$WORK/mnt"
  FUSE_PID=$(pgrep -u "$ATTACKER" -f "squashfuse $WORK/outer.sqsh" | head -1)
  [ -n "$FUSE_PID" ]
  "$GANTRY_SLURM_HARNESS" exec "$NODE" -- runuser -u "$ATTACKER" -- test -s "$WORK/mnt/image.sqsh"
  kill -STOP "$FUSE_PID"
  IMAGE=$WORK/mnt/image.sqsh
}

# nothing_left_but_the_mount: of the step, only the attacker's own processes that wait on their own
# stopped mount may remain (a process waiting for an answer the kernel has already sent to a FUSE
# daemon cannot die before the daemon answers or goes, SIGKILL or not; root waits for none of them).
# Once the attacker's daemon is gone, nothing of the attacker's is left.
nothing_left_but_the_mount() {
  pgrep -a -u "$ATTACKER" || true
  kill -9 "$FUSE_PID"
  for _ in $(seq 50); do [ -z "$(pgrep -u "$ATTACKER")" ] && break; sleep 0.2; done
  [ -z "$(pgrep -u "$ATTACKER")" ]
}

@test "an image inside a stopped FUSE mount: the step fails at check_timeout_seconds with one line, the node is idle" {
  gantry_plugin_conf "check_timeout_seconds = 3"
  stopped_fuse_image
  t0=$(date +%s%N)
  run as_attacker timeout 60 srun -N1 -n1 -w "$NODE" --container-image="$IMAGE" true
  took=$(seconds_since "$t0")
  echo "$output"
  echo "# stopped FUSE image: step ended after $took s (exit $status)" >&3
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  below "$took" 13  # 3 s deadline + 10 s
  [ "$(echo "$output" | grep -c 'gantry: .*no answer within 3 s (check_timeout_seconds in gantry.conf')" -eq 1 ]
  nodes_idle
  nothing_left_but_the_mount
}

@test "an image inside a stopped FUSE mount: scancel ends the step within 10 s, long before the deadline" {
  gantry_plugin_conf "check_timeout_seconds = 120"
  stopped_fuse_image
  as_attacker timeout 120 srun -N1 -n1 -w "$NODE" -J "stalled-$$" --container-image="$IMAGE" true \
    >"$WORK/srun.out" 2>&1 3>&- &
  srun_pid=$!
  sleep 3
  squeue -h -n "stalled-$$" -o %T | grep -q RUNNING
  t0=$(date +%s%N)
  scancel -n "stalled-$$"
  rc=0
  wait "$srun_pid" || rc=$?
  took=$(seconds_since "$t0")
  cat "$WORK/srun.out"
  echo "# stopped FUSE image: srun ended $took s after scancel (exit $rc)" >&3
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
  below "$took" 10
  nodes_idle
  nothing_left_but_the_mount
}

@test "a pull child that closes its pipes and sleeps: scancel ends the step within 10 s, the child is reaped" {
  gantry_plugin_conf
  # The plugin's gantry CLI (plugstack gantry=) is a program that closes stdout, stderr and its report
  # descriptor, then sleeps: what a hostile LD_PRELOAD in the job's environment could make a pull do.
  cat >"$WORK/gantry" <<EOF
#!/bin/sh
echo \$\$ >>"$WORK/children"
exec >&- 2>&- 3>&- 4>&-
exec sleep 60
EOF
  chmod 0755 "$WORK/gantry"
  touch "$WORK/children" && chmod 0666 "$WORK/children"
  sed -i "s|spank_gantry.so|& gantry=$WORK/gantry|" "$PLUGSTACK"
  grep -q "gantry=$WORK/gantry" "$PLUGSTACK"
  as_attacker timeout 120 srun -N1 -n1 -w "$NODE" -J "pipes-$$" --container-image="$REG#gantry-test/none" true \
    >"$WORK/srun.out" 2>&1 3>&- &
  srun_pid=$!
  for _ in $(seq 100); do [ -s "$WORK/children" ] && break; sleep 0.1; done
  [ -s "$WORK/children" ]
  sleep 2  # the child has closed its pipes by now
  t0=$(date +%s%N)
  scancel -n "pipes-$$"
  rc=0
  wait "$srun_pid" || rc=$?
  took=$(seconds_since "$t0")
  cat "$WORK/srun.out"
  echo "# pipe-closing pull child: srun ended $took s after scancel (exit $rc)" >&3
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
  below "$took" 10
  nodes_idle
  # The child was killed and reaped: its pid names nothing now (a zombie would still answer kill -0).
  while read -r child; do ! kill -0 "$child" 2>/dev/null; done <"$WORK/children"
  [ -z "$(pgrep -u "$ATTACKER" -f 'sleep 60')" ]
}
