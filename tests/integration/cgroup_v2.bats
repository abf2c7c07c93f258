# fixtures:
# A containerized step's life under Slurm's cgroup/v2 (25.05 and later), on the kernel's real cgroup2
# hierarchy. Slurm's own cgroup/v2 plugin cannot run on this host (it refuses a hybrid v1+v2 host), so
# the test builds the directories Slurm makes, in a scratch cgroup of the cgroup2 mount:
#   SCOPE/JOB/step_0/{slurm,user/task_0}   (SCOPE plays system.slice/slurmstepd.scope)
# with JOB named job_ID (22.05 to 25.11) or a SLUID (26.05), puts a task of the job user in
# user/task_0 and the stand-in for slurmstepd in slurm/ (where slurmstepd sits during the SPANK
# callbacks, so what it forks starts there), and has Gantry's real code (tests/drivers/step_driver.cpp:
# the calls plugin/stepd.cpp and plugin/epilog.cpp make) create the container and place it. Then it
# does what slurmstepd 25.05+ does at the step's end: cgroup.kill on step_0/user, and a count of what
# is left anywhere under step_0 (proctrack waits UnkillableStepTimeout for those, then drains the
# node). Nothing of the host's own cgroups is touched: everything lives under the scratch directory.

load helpers

setup_file() {
  export CG2 TUSER TUID TGID IMGDIR DRIVER
  CG2=$(findmnt -n -t cgroup2 -o TARGET | head -n1)
  if [ -z "$CG2" ] || [ ! -w "$CG2/cgroup.procs" ]; then
    skip "no writable cgroup2 hierarchy on this machine"
  fi
  DRIVER=$GANTRY_BUILD_DIR/tests/gantry-step-driver
  [ -x "$DRIVER" ] || { echo "not built: $DRIVER" >&2; return 1; }
  TUSER=$("$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  TUID=$(id -u "$TUSER")
  TGID=$(id -g "$TUSER")
  gantry_open_fuse
  IMGDIR=$(mktemp -d /tmp/gantry-cgroup-v2.XXXXXX)
  chmod 0755 "$IMGDIR"
  mkdir -p "$IMGDIR/tree/bin"
  cp /bin/busybox "$IMGDIR/tree/bin/"
  for c in sh sleep cat; do ln -s busybox "$IMGDIR/tree/bin/$c"; done
  mksquashfs "$IMGDIR/tree" "$IMGDIR/img.sqsh" -noappend -quiet -all-root >/dev/null
  chown "$TUSER" "$IMGDIR/img.sqsh"
}

teardown_file() {
  [ -n "${IMGDIR:-}" ] && rm -rf "$IMGDIR"
  gantry_restore_fuse
}

setup() {
  RUN=$(mktemp -d /tmp/gantry-cgroup-v2-run.XXXXXX)
  chmod 0755 "$RUN"  # as /run/gantry: the holders, the job user's, pass through it
  SCRATCH=$CG2/gantry-test-$$-$BATS_TEST_NUMBER
  SCOPE=$SCRATCH/slurmstepd.scope
  TASK_PID=
}

teardown() {
  # Whatever a failed test left: end every process under the scratch cgroup, then remove it.
  if [ -d "$SCRATCH" ]; then
    echo 1 >"$SCRATCH/cgroup.kill" 2>/dev/null || true
    for _ in $(seq 50); do grep -q 'populated 0' "$SCRATCH/cgroup.events" && break; sleep 0.1; done
    find "$SCRATCH" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  fi
  # Named containers' state of this run (their holders died with the scratch cgroup).
  rm -rf "$RUN"
}

# make_step JOBDIR: Slurm's step layout under SCOPE, a task of the job user in user/task_0.
make_step() {
  JOB=$SCOPE/$1
  STEP=$JOB/step_0
  mkdir -p "$STEP/slurm" "$STEP/user/task_0"
  # Placed before it runs the user's program, as Slurm places a task: the process itself becomes it.
  sh -c 'echo $$ >"$1/cgroup.procs" && exec setpriv --reuid="$2" --regid="$3" --init-groups sleep 1000' \
    sh "$STEP/user/task_0" "$TUID" "$TGID" &
  TASK_PID=$!
  for _ in $(seq 50); do grep -qx "$TASK_PID" "$STEP/user/task_0/cgroup.procs" && break; sleep 0.1; done
}

# run_step JOBID [--name NAME [--scope job|global]]: the step's slurmstepd stand-in, in step_0/slurm,
# creates the container and places it (task_forked), as the plugin does, and stays until end_step.
run_step() {
  local jobid=$1 i
  shift
  # Emptied here, not by the background job's redirection: the loop below must never read the
  # previous step's "ready" before that job has opened the file.
  : >"$RUN/driver.out"
  sh -c 'echo $$ >"$1/slurm/cgroup.procs" && shift && exec "$@"' sh "$STEP" \
    "$DRIVER" step --runtime "$RUN" --image "$IMGDIR/img.sqsh" --uid "$TUID" --gid "$TGID" \
    --job "$jobid" --task "$TASK_PID" "$@" >"$RUN/driver.out" 2>&1 &
  STEPD=$!
  for ((i = 0; i < 600; i++)); do
    grep -qx ready "$RUN/driver.out" && break
    [ -d "/proc/$STEPD" ] || break
    sleep 0.1
  done
  cat "$RUN/driver.out"
  grep -qx ready "$RUN/driver.out"
  HOLDER=$(awk '$1 == "holder" {print $2}' "$RUN/driver.out")
  SERVER=$(awk '$1 == "server" {print $2}' "$RUN/driver.out")
  [ "$HOLDER" -gt 1 ]
}

# end_step: what slurmstepd 25.05+ does when the step ends: cgroup.kill on step_0/user, then a wait
# for every other process under step_0 (slurmstepd's own excepted). Prints how many are left there;
# then slurmstepd (the stand-in) ends.
end_step() {
  echo 1 >"$STEP/user/cgroup.kill"
  for _ in $(seq 50); do grep -q 'populated 0' "$STEP/user/cgroup.events" && break; sleep 0.1; done
  sleep 0.2
  find "$STEP" -name cgroup.procs -exec cat {} + | grep -vx "$STEPD" | wc -l
  kill -TERM "$STEPD"
  wait "$STEPD" || true
}

# finish_step: notes where the holder and the server are (HOLDER_CG, SERVER_CG), then ends the step
# (end_step) and sets LEFT to what was left under it.
finish_step() {
  HOLDER_CG=$(cgroup_of "$HOLDER")
  SERVER_CG=
  if [ "$SERVER" -gt 1 ]; then SERVER_CG=$(cgroup_of "$SERVER"); fi
  LEFT=$(end_step)
  echo "holder in $HOLDER_CG, server in $SERVER_CG; left under the step: $LEFT"
}

remove_step_dirs() {
  rmdir "$STEP/user/task_0" "$STEP/user" "$STEP/slurm" "$STEP"
}

# cgroup_of PID: the process's cgroup2 directory.
cgroup_of() {
  echo "$CG2$(sed -n 's/^0:://p' "/proc/$1/cgroup")"
}

# is_leaf DIR: no child cgroups (the only place a v2 cgroup with controllers can hold processes).
is_leaf() {
  [ -z "$(find "$1" -mindepth 1 -maxdepth 1 -type d)" ]
}

alive() {
  [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

@test "cgroup v2, 25.05 layout (job_ID): an unnamed container's holder is in the task's leaf and dies with the step" {
  make_step job_7
  run_step 7
  [ "$SERVER" -gt 1 ]
  finish_step
  [ "$LEFT" -eq 0 ]
  [ "$HOLDER_CG" = "$STEP/user/task_0" ]
  # The job's image server serves the job's later steps: in the job's own leaf, outside every step.
  [ "$SERVER_CG" = "$JOB/gantry" ]
  is_leaf "$SERVER_CG"
  ! alive "$HOLDER" || false
  ! alive "$TASK_PID" || false
  alive "$SERVER"
  remove_step_dirs
  # The job epilog: the server and its leaf go, and the job directory Slurm could not remove.
  run "$DRIVER" epilog --runtime "$RUN" --job 7
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx 'leaves 1'
  ! alive "$SERVER" || false
  [ ! -d "$JOB/gantry" ]
  [ ! -d "$JOB" ]
}

@test "cgroup v2, 26.05 layout (SLUID job directory): the same, found by place, not by name" {
  make_step sEKNKTV3WPV500
  run_step 31
  finish_step
  [ "$LEFT" -eq 0 ]
  [ "$HOLDER_CG" = "$STEP/user/task_0" ]
  [ "$SERVER_CG" = "$JOB/gantry" ]
  ! alive "$HOLDER" || false
  remove_step_dirs
  run "$DRIVER" epilog --runtime "$RUN" --job 31
  [ "$status" -eq 0 ]
  ! alive "$SERVER" || false
  [ ! -d "$JOB" ]
}

@test "cgroup v2: a named container (container_scope=job) outlives the step's kill in the job's leaf; the epilog ends it" {
  for jobdir in job_8 sEKNKTV3WPV501; do
    make_step "$jobdir"
    run_step 8 --name keep
    finish_step
    [ "$LEFT" -eq 0 ]
    [ "$HOLDER_CG" = "$JOB/gantry" ]
    [ "$SERVER_CG" = "$JOB/gantry" ]
    is_leaf "$JOB/gantry"
    alive "$HOLDER"
    alive "$SERVER"
    ls "$RUN/containers" | grep -qx pyxis_8_keep.json
    remove_step_dirs
    run "$DRIVER" epilog --runtime "$RUN" --job 8
    echo "$output"
    [ "$status" -eq 0 ]
    ! alive "$HOLDER" || false
    ! alive "$SERVER" || false
    [ ! -d "$JOB" ]
    [ -z "$(ls "$RUN/containers" 2>/dev/null)" ]
  done
}

@test "cgroup v2: a node-wide named container (container_scope=global) leaves the step for a leaf beside the jobs" {
  make_step job_9
  run_step 9 --name shared --scope global
  finish_step
  [ "$LEFT" -eq 0 ]
  [ "$HOLDER_CG" = "$SCOPE/gantry" ]
  is_leaf "$SCOPE/gantry"
  alive "$HOLDER"
  remove_step_dirs
  # Not the job's: its epilog leaves it running.
  run "$DRIVER" epilog --runtime "$RUN" --job 9
  [ "$status" -eq 0 ]
  alive "$HOLDER"
  kill -TERM "$HOLDER"
}
