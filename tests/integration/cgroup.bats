# fixtures: registry images slurm
# The plugin under proctrack/cgroup, the process tracking production clusters run (ParallelCluster
# among them): slurmd puts each step's tasks into a freezer cgroup and kills whatever is left in it
# when the step ends. Containers must live exactly as long as they should: an unnamed one with its
# step (a rank's background process inside it dies too), a named one (--container-name) across the
# job's steps, its writes kept, until the job ends.
# The file restarts the harness cluster with GANTRY_SLURM_PROCTRACK=proctrack/cgroup (cgroup v1, each
# slurmd under /sys/fs/cgroup/freezer/slurm_<node>) and restores the default cluster afterwards.

load helpers

setup_file() {
  if [ ! -d /sys/fs/cgroup/freezer ]; then
    skip "no cgroup v1 freezer hierarchy on this machine"
  fi
  "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" stop >/dev/null
  GANTRY_SLURM_PROCTRACK=proctrack/cgroup "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" start >/dev/null
}

teardown_file() {
  "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" stop >/dev/null
  "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" start >/dev/null
}

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  gantry_plugin_conf
  TINY="$REG#gantry-test/tiny"
  U=$GANTRY_TEST_USER
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/cgroup-test.XXXXXX")
  chown "$U" "$WORK"
}

teardown() {
  rm -rf "$WORK"
}

as_user() {
  runuser -u "$U" -- env -C "$WORK" "$@"
}

# containers_on NODE: how many named containers NODE's runtime directory records.
containers_on() {
  "$GANTRY_SOURCE_DIR/tests/harness/slurm.sh" exec "$1" -- sh -c 'ls /run/gantry/containers 2>/dev/null | wc -l'
}

@test "proctrack/cgroup: the ranks run in the step's freezer cgroup inside the container" {
  grep -q '^ProctrackType=proctrack/cgroup' "$SLURM_CONF"
  run as_user srun -N3 -n3 --container-image="$TINY" sh -c 'grep freezer /proc/self/cgroup; cat /work/README'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^[0-9]*:freezer:/slurm_gnode[0-9]/uid_[0-9]*/job_[0-9]*/step_0$')" -eq 3 ]
  [ "$(echo "$output" | grep -c '^tiny work dir$')" -eq 3 ]
}

@test "proctrack/cgroup: a named container keeps its writes across steps; a rank's leftover process dies with its step" {
  cat > "$WORK/job.sh" <<JOB
#!/bin/sh
srun -n1 --container-image=$TINY --container-name=keep --container-writable sh -c 'echo kept > /data; sleep 3017 >/dev/null 2>&1 & echo started'
# The step is over: proctrack/cgroup kills the sleep left behind in its cgroup (slurmstepd does it
# while it finishes the step, which may be just after srun returned: up to 10 s allowed).
for i in \$(seq 1 50); do pgrep -u $U -f "^sleep 3017" >/dev/null || break; sleep 0.2; done
pgrep -u $U -f "^sleep 3017" >/dev/null && echo "sleep survived" || echo "sleep gone"
srun -n1 --container-name=keep sh -c 'cat /data'
srun -n1 --container-name=keep sh -c 'echo again >> /data; cat /data'
# The named container's holder lives in the job's freezer cgroup (not a step's), after two more steps.
grep freezer /proc/\$(pgrep -u $U -x -n gantry-holder)/cgroup > $WORK/holder.cgroup
JOB
  chown "$U" "$WORK/job.sh"
  run as_user salloc -N1 -w gnode1 sh "$WORK/job.sh"
  echo "$output"
  [ "$status" -eq 0 ]
  # srun may have to wait for the previous step's cleanup on the node ("step creation temporarily
  # disabled ... Step created"): Slurm's own lines, not the job's output.
  [ "$(echo "$output" | grep -Ev '^(salloc:|srun: Job [0-9]+ step creation temporarily disabled|srun: Step created for job)')" = "$(printf 'started\nsleep gone\nkept\nkept\nagain')" ]
  cat "$WORK/holder.cgroup"
  grep -Eq ':freezer:/slurm_gnode1/uid_[0-9]+/job_[0-9]+$' "$WORK/holder.cgroup"
  # The job is over: the epilog removed the named container (container_scope=job).
  for i in $(seq 1 50); do [ "$(containers_on gnode1)" -eq 0 ] && break; sleep 0.2; done
  [ "$(containers_on gnode1)" -eq 0 ]
  for i in $(seq 1 50); do pgrep -u "$U" -x gantry-holder >/dev/null || break; sleep 0.2; done
  ! pgrep -u "$U" -x gantry-holder || false
}

@test "proctrack/cgroup: the holder and its fuse daemon are in the step's freezer cgroup and gone after the step" {
  as_user srun -N1 -n1 -w gnode1 --container-image="$TINY" sh -c 'echo "started $(readlink /proc/self/ns/mnt) $(grep freezer /proc/self/cgroup)"; sleep 3019' >"$WORK/step.out" 2>&1 &
  step=$!
  for i in $(seq 300); do grep -q started "$WORK/step.out" && break; sleep 0.2; done
  cat "$WORK/step.out"
  grep -q started "$WORK/step.out"
  read -r _ ns rank_cg <"$WORK/step.out"
  holder=
  for p in $(pgrep -u "$U" -x gantry-holder); do
    [ "$(readlink "/proc/$p/ns/mnt")" = "$ns" ] && holder=$p
  done
  [ -n "$holder" ]
  holder_cg=$(grep freezer "/proc/$holder/cgroup")
  kids=$(cat "/proc/$holder/task/$holder/children")
  kid_cgs=$(for k in $kids; do grep freezer "/proc/$k/cgroup"; done)
  dir=/sys/fs/cgroup/freezer${holder_cg#*:freezer:}
  listed=$(grep -cx "$holder" "$dir/cgroup.procs" || true)
  pkill -u "$U" -f '^sleep 3019' || true
  wait "$step" || true
  echo "rank: $rank_cg; holder $holder: $holder_cg; children $kids: $kid_cgs; listed in $dir: $listed"
  [[ "$rank_cg" =~ :freezer:/slurm_gnode1/uid_[0-9]+/job_[0-9]+/step_0$ ]]
  [ "$holder_cg" = "$rank_cg" ]
  while read -r line; do [ -z "$line" ] || [ "$line" = "$rank_cg" ]; done <<<"$kid_cgs"
  [ "$listed" -eq 1 ]
  for i in $(seq 50); do [ -d "/proc/$holder" ] || break; sleep 0.2; done
  [ ! -d "/proc/$holder" ]
}
