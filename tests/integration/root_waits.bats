# fixtures: registry images slurm
# Root's waits on what a job user influences (issue #34), tried as a hostile user on the real Slurm
# harness: an image path inside a FUSE mount the user stopped, a FIFO as a lower layer of a layered
# image, a pull child that closes its pipes and sleeps, a named container's holder that never answers.
# Each step must end within 10 s of its own deadline or of `scancel`, with one line naming what was
# wrong, the node idle again and nothing of the step left behind. And root's answers about paths the
# job's environment names (PMIX_SERVER_TMPDIR, ${USER} in mounts.d, %n) must be the same
# for a path only root reaches and for a missing one: no existence oracle.

load helpers

ATTACKER=gantry-attacker

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  TINY="$REG#gantry-test/tiny"
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
  rm -rf "$WORK" "${SPOOL_SECRET:-}"
  if [ -n "${GPU_CLUSTER:-}" ]; then  # the harness cluster as the other suites expect it
    "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" stop >/dev/null
    "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" start >/dev/null
  fi
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
  as_attacker timeout 120 srun -N1 -n1 -w "$NODE" -J "pipes-$$" --container-image="127.0.0.1:9#gantry-test/none" true \
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
  while read -r child; do ! kill -0 "$child" 2>/dev/null || false; done <"$WORK/children"
  [ -z "$(pgrep -u "$ATTACKER" -f 'sleep 60')" ]
}

# attacker_conf STORE [LINE...]: gantry_plugin_conf with STORE (made, mode 1777) as the store: the
# harness's shared store holds the test user's layers, which the attacker's pulls may not replace.
attacker_conf() {
  local store=$1
  shift
  gantry_plugin_conf "$@"
  sed -i "s|^store_path = .*|store_path = $store|" "${GANTRY_TEST_GANTRY_CONF:-$GANTRY_HARNESS_DIR/gantry.conf}"
  mkdir -p "$store" && chmod 1777 "$store"
}

# oracle_conf [LINE...]: attacker_conf with a store the oracle cases share (tiny is pulled once).
oracle_conf() { attacker_conf "$GANTRY_TEST_FSX/root-waits-store" "$@"; }

# fake_holder: the plugin's programs from $WORK (plugstack gantry=$WORK/gantry, the real CLI; beside it
# the holder, helper_path): a gantry-holder that does what the real one does for its checks, but as a
# container's holder (no arguments) notes its pid in $WORK/children and sleeps, the set-up socket
# open and never answered: what a holder on a file system the user stalls looks like to root.
fake_holder() {
  ln -s "$GANTRY_BUILD_DIR/runtime/gantry" "$WORK/gantry"
  cat >"$WORK/gantry-holder" <<EOF
#!/bin/sh
[ \$# -gt 0 ] && exec "$GANTRY_BUILD_DIR/runtime/gantry-holder" "\$@"
echo \$\$ >>"$WORK/children"
exec sleep 60
EOF
  chmod 0755 "$WORK/gantry-holder"
  touch "$WORK/children" && chmod 0666 "$WORK/children"
  sed -i "s|spank_gantry.so|& gantry=$WORK/gantry|" "$PLUGSTACK"
  grep -q "gantry=$WORK/gantry" "$PLUGSTACK"
}

# no_holder_left: every holder the plugin started (fake_holder's record) is gone, and no process of
# the attacker's is left.
no_holder_left() {
  [ -s "$WORK/children" ]
  attacker_gone
  while read -r child; do ! kill -0 "$child" 2>/dev/null || false; done <"$WORK/children"
}

# attacker_gone: no process of the attacker's is left once the job has ended (its epilog ends the
# job's image server): waited for with a generous bound, then asserted.
attacker_gone() {
  for _ in $(seq 100); do [ -z "$(pgrep -u "$ATTACKER")" ] && break; sleep 0.2; done
  pgrep -a -u "$ATTACKER" || true
  [ -z "$(pgrep -u "$ATTACKER")" ]
}

@test "a FIFO as a lower layer of a layered image: no wait; the step fails with one line or the pull replaces it" {
  # The attacker's own open store: pulled there by their step, then a lower layer replaced by a FIFO
  # (the top layer stays a regular squashfs file). Opening a FIFO for reading waits for a writer.
  attacker_conf "$WORK/store" "check_timeout_seconds = 3"
  run as_attacker timeout 120 srun -N1 -n1 -w "$NODE" --container-image="$REG#gantry-test/layers" true
  echo "$output"
  [ "$status" -eq 0 ]
  # The record's layer_chain is bottom first: its first entry is a lower layer.
  lower=$(python3 -c 'import json,sys
for f in sys.argv[1:]:
    chain = json.load(open(f)).get("layer_chain")
    if chain: print("layer-" + chain[0].split(":")[1] + ".sqsh")' "$WORK"/store/images/[0-9a-f]*.json)
  lower=$WORK/store/images/$lower
  [ -f "$lower" ]
  as_attacker sh -c "rm -f '$lower' && mkfifo '$lower'"
  [ -p "$lower" ]
  # Nothing may be pulled: the store's check (as the user, without blocking) finds no usable layer.
  run as_attacker env GANTRY_PULL_POLICY=never timeout 60 srun -N1 -n1 -w "$NODE" --container-image="$REG#gantry-test/layers" true
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  [ "$(echo "$output" | grep -c 'error: gantry: .*gantry-test/layers:latest is not in the store')" -eq 1 ]
  [ -p "$lower" ]
  nodes_idle
  # The default policy: the user's pull converts the layer again over the FIFO, and the step runs.
  run as_attacker timeout 60 srun -N1 -n1 -w "$NODE" --container-image="$REG#gantry-test/layers" cat /data/keep.txt
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$lower" ] && [ ! -p "$lower" ]
  nodes_idle
  attacker_gone
}

@test "a named container's holder that never answers: killed at setup_timeout_seconds by pidfd, nothing left" {
  gantry_plugin_conf "setup_timeout_seconds = 3"
  fake_holder
  mkdir -p "$WORK/tree" && echo x >"$WORK/tree/file"
  mksquashfs "$WORK/tree" "$WORK/image.sqsh" -quiet -noappend >/dev/null
  chmod 0644 "$WORK/image.sqsh"
  run as_attacker timeout 60 srun -N1 -n1 -w "$NODE" --container-name="never-$$" --container-image="$WORK/image.sqsh" true
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  [ "$(echo "$output" | grep -c 'gantry: .*no answer within 3 s (setup_timeout_seconds in gantry.conf')" -eq 1 ]
  nodes_idle
  # The holder (detached: no child of slurmstepd's) was killed through its pidfd, not left to sleep.
  no_holder_left
}

# answers_alike FUNCTION: FUNCTION PATH is run as the attacker with a path below a directory only root
# may search, once naming a file there and once a missing one; exit status and output (the name
# replaced) must be the same, as a set of lines: srun's own lines and slurmstepd's reach the terminal
# in either order, and srun's "job N queued and waiting" / "has been allocated" lines (a node still
# completing the last test's job) are not part of the answer. Prints both; sets ANSWER_STATUS and ANSWER.
answers_alike() {
  mkdir -m 0700 "$WORK/secret"
  mkdir -p "$WORK/secret/there/spool" && touch "$WORK/secret/there/slurm.conf"
  run "$1" "$WORK/secret/there"
  local s1=$status o1
  o1=$(gantry_without_queue_lines <<<"${output//there/NAME}")
  run "$1" "$WORK/secret/missing"
  local s2=$status o2
  o2=$(gantry_without_queue_lines <<<"${output//missing/NAME}")
  printf 'root-only (%s):\n%s\nmissing (%s):\n%s\n' "$s1" "$o1" "$s2" "$o2"
  [ "$s1" = "$s2" ] && [ "$(sort <<<"$o1")" = "$(sort <<<"$o2")" ]
  ANSWER_STATUS=$s1 ANSWER=$o1
}

# look_inside PATH: shell code printing whether PATH is there inside the container, then "ran".
look_inside() { echo "ls -d '$1' >/dev/null 2>&1 && echo '$1 bound' || echo '$1 not bound'; echo ran"; }

pmix_tmpdir() {
  as_attacker env PMIX_SERVER_TMPDIR="$1" timeout 60 srun -N1 -n1 -w "$NODE" --container-image="$TINY" \
    sh -c "echo \$PMIX_SERVER_TMPDIR; $(look_inside "$1")"
}

@test "no oracle: PMIX_SERVER_TMPDIR naming a root-only path and a missing one answers alike" {
  oracle_conf "pmix = yes"
  answers_alike pmix_tmpdir
  [ "$ANSWER_STATUS" -eq 0 ]
  echo "$ANSWER" | grep -qx "$WORK/secret/NAME"  # the job's own value reached the step
  echo "$ANSWER" | grep -qx "$WORK/secret/NAME not bound"
}

user_in_mounts_d() {
  as_attacker env USER="${1##*/}" timeout 60 srun -N1 -n1 -w "$NODE" --container-image="$TINY" sh -c "$(look_inside /mnt/site)"
}

@test "no oracle: \${USER} in a mounts.d source naming a root-only path and a missing one answers alike" {
  mkdir -p "$WORK/mounts.d"
  echo "$WORK/secret/\${USER} /mnt/site none x-create=dir,bind" >"$WORK/mounts.d/10-user.fstab"
  oracle_conf "mounts_dir = $WORK/mounts.d"
  answers_alike user_in_mounts_d
  # Checked as the user: neither is reached, so both fail with the user's own answer.
  [ "$ANSWER_STATUS" -ne 0 ]
  [ "$(echo "$ANSWER" | grep -c "error: gantry: .*mounting $WORK/secret/NAME at /mnt/site: Permission denied")" -eq 1 ]
  # nofail: left out alike, the step runs.
  echo "$WORK/secret/\${USER} /mnt/site none x-create=dir,bind,nofail" >"$WORK/mounts.d/10-user.fstab"
  rm -rf "$WORK/secret"
  answers_alike user_in_mounts_d
  [ "$ANSWER_STATUS" -eq 0 ]
  echo "$ANSWER" | grep -qx "/mnt/site not bound"
}

nodename_of_named() {
  local name=secret-${1##*/}
  as_attacker env SLURMD_NODENAME="$name" timeout 60 srun -N1 -n1 -w "$NODE" --container-name="oracle-${1##*/}" \
    --container-image="$TINY" sh -c "$(look_inside "$GANTRY_SLURM_STATE/nodes/$name/spool")"
}

@test "no oracle: SLURMD_NODENAME (%n of SlurmdSpoolDir) naming a root-only path and a missing one answers alike" {
  # A named container binds the node's spool directory, SlurmdSpoolDir=.../nodes/%n/spool; the job's
  # SLURMD_NODENAME names one only root may search (a 0700 directory beside the nodes') or a missing one.
  oracle_conf
  SPOOL_SECRET=$GANTRY_SLURM_STATE/nodes/secret-there
  mkdir -m 0700 "$SPOOL_SECRET" && mkdir "$SPOOL_SECRET/spool"
  answers_alike nodename_of_named
  [ "$ANSWER_STATUS" -eq 0 ]
  echo "$ANSWER" | grep -qx "$GANTRY_SLURM_STATE/nodes/secret-NAME/spool not bound"
}

@test "NVIDIA_VISIBLE_DEVICES=all in a step Slurm allocated one (fake) GPU sees that one; naming another is refused" {
  # The cluster restarted with the fake driver's four GPUs as Slurm gres (slurm.sh GANTRY_SLURM_GPU_FILES):
  # --gpus allocations, SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES are Slurm's own.
  # A cluster started that way already (GANTRY_SLURM_GPU_FILES set for the CTest fixture) is used as
  # it is; otherwise it is restarted with them and restored by teardown (slow: slurm.sh stop).
  local fake=$GANTRY_HARNESS_DIR/fakehw
  if ! scontrol show node "$NODE" | grep -q 'Gres=gpu:'; then
    "$GANTRY_SOURCE_DIR/tests/harness/fakehw.sh" "$fake" >/dev/null
    GPU_CLUSTER=1
    "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" stop >/dev/null
    GANTRY_SLURM_GPU_FILES="$fake/dev/nvidia[0-3]" "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" start >/dev/null
  fi
  oracle_conf "host_root = $fake" "efa = 0"
  run as_attacker env NVIDIA_VISIBLE_DEVICES=all timeout 60 srun -N1 -n1 -w "$NODE" --gpus=1 --container-image="$TINY" \
    sh -c 'ls /dev | grep "^nvidia[0-9]"; echo "step $SLURM_STEP_GPUS"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^nvidia[0-9]')" -eq 1 ]
  allocated=$(echo "$output" | sed -n 's/^step //p')
  [ "$(echo "$output" | grep '^nvidia[0-9]')" = "nvidia$allocated" ]
  # Two allocated: two seen.
  run as_attacker env NVIDIA_VISIBLE_DEVICES=all timeout 60 srun -N1 -n1 -w "$NODE" --gpus=2 --container-image="$TINY" \
    sh -c 'ls /dev | grep "^nvidia[0-9]"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^nvidia[0-9]')" -eq 2 ]
  # GPUs the step was not allocated (of four named, three are not): refused with one line, never widened to.
  run as_attacker env NVIDIA_VISIBLE_DEVICES=0,1,2,3 timeout 60 srun -N1 -n1 -w "$NODE" --gpus=1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$(echo "$output" | grep -c 'error: gantry: .*GPU [0-3] is not allocated to this step')" -eq 1 ]
  nodes_idle
}
