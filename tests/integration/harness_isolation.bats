# fixtures: slurm
# The Slurm harness keeps off the host's configuration and processes (issue #16). As an admin who
# already runs a cluster on this machine would check it: with a "host cluster" in place (its
# /etc/slurm/slurm.conf, /etc/hosts, and processes named slurmctld, slurmd and munged that no harness
# started), a second harness with another GANTRY_HARNESS_DIR starts beside the CTest one, both run
# jobs, the second stops, and the host cluster's files are byte-identical, its processes alive, the
# first harness still healthy, and nothing of the second is left in the host's network namespaces.

bats_require_minimum_version 1.5.0  # run --separate-stderr

# run_srun CMD...: runs CMD (an srun, or what starts one) with $output holding its stdout only: srun's
# own notes under load (a job waiting for resources, a step retried) go to stderr, and both are shown.
run_srun() {
  run --separate-stderr "$@"
  echo "$output"
  echo "$stderr" >&2
}

setup() {
  # The CTest cluster ("A").
  # shellcheck disable=SC1091
  . "$GANTRY_HARNESS_DIR/slurm.env"
  A_HDIR=$GANTRY_HARNESS_DIR
  A_CONF=$SLURM_CONF
  SLURM_SH=$GANTRY_SOURCE_DIR/tests/harness/slurm.sh
  # The second harness dir ("B"): short, below /tmp, reachable by the test user.
  B=$(mktemp -d /tmp/gantry-iso.XXXXXX)
  chmod 755 "$B"
  PLANTED=()
  DECOYS=()
}

teardown() {
  GANTRY_HARNESS_DIR=$B "$SLURM_SH" stop >/dev/null 2>&1 || true
  local pid f
  for pid in "${DECOYS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  # What this test planted goes again, but only while it is still this test's file.
  for f in "${PLANTED[@]}"; do
    if [ "$(sha256sum <"$f" 2>/dev/null)" = "$(sha256sum <"$B.planted/$(basename "$f")" 2>/dev/null)" ]; then rm -f "$f"; fi
  done
  rm -rf "$B" "$B.planted" "$B.decoys"
}

# plant FILE CONTENT: a host cluster's file where there is none; an existing one is only checksummed.
plant() {
  local f=$1
  [ -e "$f" ] && return 0
  mkdir -p "$B.planted" "$(dirname "$f")"
  printf '%s\n' "$2" >"$B.planted/$(basename "$f")"
  cp "$B.planted/$(basename "$f")" "$f"
  PLANTED+=("$f")
}

# host_snapshot: what the host's own cluster and resolver consist of, byte for byte.
host_snapshot() {
  sha256sum /etc/hosts /etc/slurm/slurm.conf /etc/slurm/cgroup.conf 2>&1
  # No file appears beside them either (an older harness saved a "foreign" slurm.conf there).
  find /etc/slurm -maxdepth 1 -printf '%p %s %T@\n' | sort
}

# decoy NAME: a process named NAME (a copy of sleep) that no harness started; prints its pid.
decoy() {
  mkdir -p "$B.decoys"
  cp "$(command -v sleep)" "$B.decoys/$1"
  setsid "$B.decoys/$1" 900 </dev/null >/dev/null 2>&1 3>&- &
  echo $!
}

# lives PID: PID runs and is not a zombie (kill -0 succeeds on a killed process nobody reaped yet).
lives() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# in_b CMD...: CMD with the second harness's environment only.
in_b() { (set -e; . "$B/slurm.env"; "$@"); }
in_a() { (set -e; . "$A_HDIR/slurm.env"; "$@"); }

@test "a second harness runs beside the first and leaves the host's cluster, files and processes alone" {
  [ "$GANTRY_TEST_MODE" = multi ] || skip "needs the multi-node CTest harness (this one: $GANTRY_TEST_MODE)"
  plant /etc/slurm/slurm.conf "# A host cluster planted by tests/integration/harness_isolation.bats
ClusterName=hostcluster
SlurmctldHost=hostctl(127.0.0.2)
SlurmctldPort=1
NodeName=hostnode NodeAddr=127.0.0.2 CPUs=1 State=UNKNOWN
PartitionName=host Nodes=ALL Default=YES"
  plant /etc/slurm/cgroup.conf "# planted by harness_isolation.bats
CgroupPlugin=cgroup/v1"
  before=$(host_snapshot)
  for name in slurmctld slurmd munged; do
    pid=$(decoy "$name")
    DECOYS+=("$pid")
  done
  sleep 0.2
  for pid in "${DECOYS[@]}"; do lives "$pid"; done

  # A's controller as it runs now (pid and start time): the very same process must outlive B.
  a_ctld=$(cat "$GANTRY_SLURM_RUN_DIR/slurmctld.pid")
  # B: started with A's variables still in the environment (SLURM_CONF among them), as from a shell
  # that sourced A's env. A harness that let its daemons inherit SLURM_CONF would start B's slurmctld
  # with A's config, and slurmctld stops the controller named in its pid file.
  t0=$SECONDS
  run env GANTRY_HARNESS_DIR="$B" GANTRY_SLURM_NODE_PREFIX=bnode GANTRY_BUILD_DIR= GANTRY_PLUGIN= \
    GANTRY_PLUGSTACK_ARGS= "$SLURM_SH" start --nodes 2
  echo "$output"
  [ "$status" -eq 0 ]
  echo "# second harness started in $((SECONDS - t0)) s" >&3
  [ -r "$B/slurm.env" ]
  B_ID=$(in_b sh -c 'echo $GANTRY_SLURM_ID')
  B_RUN=$(in_b sh -c 'echo $GANTRY_SLURM_RUN_DIR')
  B_NS=$(in_b sh -c 'echo $GANTRY_SLURM_NETNS_PREFIX')
  B_LINK=$(in_b sh -c 'echo $GANTRY_SLURM_HOST_LINK')
  [ "$B_ID" != "$GANTRY_SLURM_ID" ]
  [ "$B_LINK" != "$GANTRY_SLURM_HOST_LINK" ]
  [ "$(in_b sh -c 'echo $GANTRY_TEST_LOGIN_ADDR')" != "$GANTRY_TEST_LOGIN_ADDR" ]
  [ "$(in_b sh -c 'echo $SLURM_CONF')" = "$B/slurm/etc/slurm.conf" ]
  # B's daemons read B's config, given on their command line.
  ctld=$(cut -d' ' -f1 "$B_RUN/slurmctld.pid")
  tr '\0' ' ' <"/proc/$ctld/cmdline" | grep -q -- "-f $B/slurm/etc/slurm.conf"
  # Its bridge namespace and two nodes, by their own names.
  [ "$(ip netns list | awk '{print $1}' | grep -c "^$B_NS")" -eq 3 ]
  ip link show "$B_LINK" >/dev/null

  # Both clusters run jobs, as root and as the test user; each one sees only its own nodes.
  run_srun in_b srun -N2 hostname
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort | tr '\n' ' ')" = "bnode1 bnode2 " ]
  run_srun in_b env -C "$B/fsx" runuser -u "$GANTRY_TEST_USER" -- srun -N2 hostname
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort | tr '\n' ' ')" = "bnode1 bnode2 " ]
  # A batch job's own srun reaches B too (the job's environment carries SLURM_CONF).
  run in_b env -C "$B/fsx" runuser -u "$GANTRY_TEST_USER" -- \
    sbatch --wait -N2 -o "$B/fsx/job.out" --wrap 'srun hostname'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(sort "$B/fsx/job.out" | tr '\n' ' ')" = "bnode1 bnode2 " ]
  run_srun in_a srun -N3 hostname
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort | tr '\n' ' ')" = "gnode1 gnode2 gnode3 " ]
  run in_b sinfo -h -o %N
  [ "$output" = "bnode[1-2]" ]

  # The host's files did not change while both ran.
  [ "$(host_snapshot)" = "$before" ]

  run env GANTRY_HARNESS_DIR="$B" "$SLURM_SH" stop
  echo "$output"
  [ "$status" -eq 0 ]

  # A stale pid file that names another process (a pid reused after a reboot, or planted) is never
  # signalled: only a pid whose start time matches the one recorded is.
  for name in slurmctld munged; do
    echo "${DECOYS[0]} 1" >"$B_RUN/$name.pid"
  done
  echo "${DECOYS[1]} 1" >"$B_RUN/bnode1.slurmd.pid"
  run env GANTRY_HARNESS_DIR="$B" "$SLURM_SH" stop
  echo "$output"
  [ "$status" -eq 0 ]

  # Afterwards: host files byte-identical, every decoy alive, nothing of B left, A healthy.
  [ "$(host_snapshot)" = "$before" ]
  for pid in "${DECOYS[@]}"; do lives "$pid"; done
  [ "$(ip netns list | awk '{print $1}' | grep -c "^$B_NS" || true)" -eq 0 ]
  ! ip link show "$B_LINK" >/dev/null 2>&1 || false
  [ -z "$(ls "$B_RUN"/*.pid 2>/dev/null)" ]
  [ ! -e "$B/slurm.env" ]
  [ "$(cat "$GANTRY_SLURM_RUN_DIR/slurmctld.pid")" = "$a_ctld" ]
  lives "${a_ctld%% *}"
  [ "$(cut -d' ' -f22 "/proc/${a_ctld%% *}/stat")" = "${a_ctld#* }" ]
  run env GANTRY_HARNESS_DIR="$A_HDIR" "$SLURM_SH" status
  echo "$output"
  [ "$status" -eq 0 ]
  run_srun in_a srun -N3 hostname
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort | tr '\n' ' ')" = "gnode1 gnode2 gnode3 " ]
  echo "# isolation test body: $((SECONDS - t0)) s" >&3
}

@test "slurm.env points every client at the harness's own slurm.conf, never the host's" {
  [ "$SLURM_CONF" = "$GANTRY_SLURM_STATE/etc/slurm.conf" ]
  [ "$A_CONF" != /etc/slurm/slurm.conf ]
  # runuser keeps SLURM_CONF for the test user: the same config as root's.
  run runuser -u "$GANTRY_TEST_USER" -- sh -c 'echo "$SLURM_CONF"'
  [ "$output" = "$SLURM_CONF" ]
  # The daemons were given the harness's file on their command line.
  for f in "$GANTRY_SLURM_RUN_DIR"/slurmctld.pid "$GANTRY_SLURM_RUN_DIR"/*.slurmd.pid; do
    pid=$(cut -d' ' -f1 "$f")
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "-f $SLURM_CONF"
  done
  # No host file mentions the harness: neither its config nor its node names.
  ! grep -qs "$GANTRY_SLURM_STATE" /etc/slurm/slurm.conf || false
  ! grep -q "gantry-harness\|gantry-login" /etc/hosts || false
}
