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
# (Not the job's image server, also a gantry-holder: its command line goes on after the program.)
grep freezer /proc/\$(pgrep -u $U -n -f 'gantry-holder\$')/cgroup > $WORK/holder.cgroup
# The job's image server, which the epilog ends.
for p in \$(pgrep -u $U -f -- ' --serve-image '); do
  grep -q "freezer:.*/job_\$SLURM_JOB_ID\$" /proc/\$p/cgroup && echo \$p
done > $WORK/servers
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
  # The job is over: once its epilog has finished (the event, not a time window: a busy node, e.g.
  # beside CI's build lane, may start the epilog late), the named container is gone (container_scope=job).
  jobid=$(echo "$output" | sed -n 's/^salloc: Granted job allocation \([0-9]*\).*/\1/p')
  [ -n "$jobid" ]
  epilog_done "$jobid" gnode1
  [ "$(containers_on gnode1)" -eq 0 ]
  # Its holder and its image server are gone too (not counting a `gantry run` server another suite
  # may have left, which waits for mount_idle_seconds: not this job's).
  servers=$(cat "$WORK/servers")
  echo "the job's image servers: $servers"
  [ "$(echo "$servers" | wc -w)" -eq 1 ]
  for i in $(seq 1 100); do
    pgrep -u "$U" -f 'gantry-holder$' >/dev/null || [ -d "/proc/$servers" ] || break
    sleep 0.2
  done
  ! pgrep -u "$U" -f 'gantry-holder$' || false
  [ ! -d "/proc/$servers" ]
}

# servers_in CGROUP_LINE: the pids of the job user's image servers whose freezer line is CGROUP_LINE.
servers_in() {
  local p
  for p in $(pgrep -u "$U" -f -- ' --serve-image '); do
    [ "$(grep freezer "/proc/$p/cgroup" 2>/dev/null)" = "$1" ] && echo "$p"
  done
  return 0
}

@test "proctrack/cgroup: the holder is in the step's freezer cgroup, the job's image server and its daemon in the job's, all gone after the job" {
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
  dir=/sys/fs/cgroup/freezer${holder_cg#*:freezer:}
  listed=$(grep -cx "$holder" "$dir/cgroup.procs" || true)
  job_cg=${rank_cg%/step_0}
  servers=$(servers_in "$job_cg")
  server_kids=$(for s in $servers; do cat "/proc/$s/task/$s/children"; done)
  kid_cgs=$(for k in $server_kids; do grep freezer "/proc/$k/cgroup"; done)
  daemons=$(for k in $server_kids; do cat "/proc/$k/comm"; done)
  pkill -u "$U" -f '^sleep 3019' || true
  wait "$step" || true
  echo "rank: $rank_cg; holder $holder: $holder_cg, children: '$kids'; listed in $dir: $listed"
  echo "servers in $job_cg: $servers; their children $server_kids ($daemons): $kid_cgs"
  [[ "$rank_cg" =~ :freezer:/slurm_gnode1/uid_[0-9]+/job_[0-9]+/step_0$ ]]
  [ "$holder_cg" = "$rank_cg" ]
  [ "$listed" -eq 1 ]
  # The image comes from the job's server: the holder runs no fuse daemon of its own.
  [ -z "$kids" ]
  [ "$(echo "$servers" | wc -w)" -eq 1 ]
  [ "$daemons" = gantry-imagefs ]
  [ "$kid_cgs" = "$job_cg" ]
  # The step (srun's own job) is over: the holder goes with the step, the server with the job (epilog).
  for i in $(seq 50); do [ -d "/proc/$holder" ] || [ -d "/proc/$servers" ] || break; sleep 0.2; done
  [ ! -d "/proc/$holder" ]
  [ ! -d "/proc/$servers" ]
  [ ! -d "/proc/$server_kids" ]
}

@test "proctrack/cgroup: a job's steps on a node share one image server; another job has its own" {
  cat > "$WORK/job.sh" <<JOB
#!/bin/sh
srun -n1 --container-image=$TINY sh -c 'echo "dev \$(stat -c %d /work/README)"'
# Between the steps: the job's server lives on, in the job's freezer cgroup.
for p in \$(pgrep -u $U -f -- ' --serve-image '); do
  grep -q "freezer:.*/job_\$SLURM_JOB_ID\$" /proc/\$p/cgroup && echo "server \$p"
done
srun -n1 --container-image=$TINY sh -c 'echo "dev \$(stat -c %d /work/README)"; sleep 3023'
JOB
  chown "$U" "$WORK/job.sh"
  as_user sbatch -N1 -w gnode1 -o "$WORK/job.out" "$WORK/job.sh" >/dev/null
  # The second step runs (it printed its line and sleeps).
  for i in $(seq 300); do [ "$(grep -c '^dev ' "$WORK/job.out" 2>/dev/null)" = 2 ] && break; sleep 0.2; done
  # Another job on the same node, while the first one runs: a server of its own.
  run as_user srun -N1 -n1 -w gnode1 --container-image="$TINY" sh -c 'echo "dev $(stat -c %d /work/README)"'
  other=$output
  sleep 1
  cat "$WORK/job.out"
  job_servers=$(awk '$1 == "server" { print $2 }' "$WORK/job.out")
  live=$(for p in $job_servers; do [ -d "/proc/$p" ] && echo "$p"; done)
  pkill -u "$U" -f '^sleep 3023' || true
  for i in $(seq 100); do squeue -h -u "$U" | grep -q . || break; sleep 0.2; done
  echo "other job: $other; servers $job_servers, live before the job ended: $live"
  [ "$(grep -c '^dev ' "$WORK/job.out")" -eq 2 ]
  # One FUSE connection (its device number) for both steps, another for the other job.
  [ "$(grep '^dev ' "$WORK/job.out" | sort -u | wc -l)" -eq 1 ]
  [[ "$other" =~ ^dev\ [0-9]+$ ]]
  ! grep -qx "$other" "$WORK/job.out" || false
  [ "$(echo "$job_servers" | wc -w)" -eq 1 ]
  [ "$live" = "$job_servers" ]
  # The job is over: its epilog ended the server.
  for i in $(seq 50); do [ -d "/proc/$job_servers" ] || break; sleep 0.2; done
  [ ! -d "/proc/$job_servers" ]
}
