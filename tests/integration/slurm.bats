# fixtures: slurm
# The Slurm harness itself (tests/harness/slurm.sh): real munged, slurmctld and slurmd, jobs submitted
# from the host ("login node") as the unprivileged test user. Proves that the nodes are separate
# machines as far as a job can tell (hostname, network, mount namespace, node-local scratch), that
# the shared FSx stand-in is shared, that srun/sbatch/salloc work, and that our SPANK plugin loads.

setup_file() {
  local env=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}/slurm.env
  if [ ! -r "$env" ]; then
    echo "no $env: start the cluster first: tests/harness/slurm.sh start" >&2
    return 1
  fi
}

setup() {
  # shellcheck disable=SC1090
  . "${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}/slurm.env"
  read -r -a nodes <<<"$GANTRY_TEST_NODES"
  # Each test gets its own directory on the shared file system, owned by the test user.
  work=$GANTRY_TEST_FSX/slurm-bats.$BATS_TEST_NUMBER.$$
  rm -rf "$work"
  mkdir -p "$work"
  chown "$GANTRY_TEST_USER:" "$work"
}

teardown() {
  rm -rf "$work"
}

# as_user CMD...: run CMD as the test user from the test's shared directory, as a user on a login
# node would. Slurm's stderr (e.g. "queued and waiting for resources" when the previous job's nodes
# are still COMPLETING) goes to a file, so that $output holds only what the tasks print.
as_user() {
  (cd "$work" && runuser -u "$GANTRY_TEST_USER" -- "$@") 2>"$BATS_TEST_TMPDIR/stderr"
}

# show: what the last `run as_user` printed, for a failure message.
show() {
  echo "stdout: $output"
  echo "stderr: $(cat "$BATS_TEST_TMPDIR/stderr" 2>/dev/null)"
}

need_multi() {
  [ "$GANTRY_TEST_MODE" = multi ] && [ "$GANTRY_TEST_NODE_COUNT" -ge "${1:-2}" ] ||
    skip "needs the multi-node harness with at least ${1:-2} nodes (this one: $GANTRY_TEST_MODE, $GANTRY_TEST_NODE_COUNT)"
}

@test "sinfo lists every harness node as idle in the default partition" {
  run sinfo -h -N -p "$GANTRY_TEST_PARTITION" -o '%N %t'
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq "${#nodes[@]}" ]
  for n in "${nodes[@]}"; do
    grep -qx "$n idle" <<<"$output" || { echo "node $n not idle: $output"; false; }
  done
}

@test "srun -N3 hostname prints three different hostnames, the node names" {
  need_multi 3
  run as_user srun -N3 hostname
  [ "$status" -eq 0 ] || { show; false; }
  [ "${#lines[@]}" -eq 3 ]
  [ "$(printf '%s\n' "${lines[@]}" | sort -u | wc -l)" -eq 3 ]
  expected=$(printf '%s\n' "${nodes[@]:0:3}" | sort)
  [ "$(printf '%s\n' "${lines[@]}" | sort)" = "$expected" ] || { echo "got: ${lines[*]}, expected: $expected"; false; }
}

@test "srun over all nodes runs one task per node, each on its own node" {
  run as_user srun -N "${#nodes[@]}" sh -c 'echo "$(hostname) $SLURMD_NODENAME"'
  [ "$status" -eq 0 ] || { show; false; }
  [ "${#lines[@]}" -eq "${#nodes[@]}" ]
  for line in "${lines[@]}"; do
    set -- $line
    [ "$1" = "$2" ] || { echo "hostname $1 but SLURMD_NODENAME $2"; false; }
  done
}

@test "srun -N3 -n12 runs 12 tasks with ranks 0..11 spread over three nodes" {
  need_multi 3
  run as_user srun -N3 -n12 sh -c 'echo "$SLURM_PROCID $(hostname)"'
  [ "$status" -eq 0 ] || { show; false; }
  [ "${#lines[@]}" -eq 12 ]
  [ "$(printf '%s\n' "${lines[@]}" | awk '{print $1}' | sort -n | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 8 9 10 11 " ]
  [ "$(printf '%s\n' "${lines[@]}" | awk '{print $2}' | sort -u | wc -l)" -eq 3 ]
}

@test "srun --mpi=pmix and --mpi=pmi2 give every rank its PMI rank, on every node" {
  n=$((2 * ${#nodes[@]}))
  for mpi in pmix:PMIX_RANK pmi2:PMI_RANK; do
    run as_user srun -N "${#nodes[@]}" -n "$n" --mpi="${mpi%%:*}" sh -c "echo \$${mpi#*:} \$(hostname)"
    [ "$status" -eq 0 ] || { echo "--mpi=${mpi%%:*}"; show; false; }
    [ "$(printf '%s\n' "${lines[@]}" | awk '{print $1}' | sort -n | tr '\n' ' ')" = "$(seq -s ' ' 0 $((n - 1))) " ]
    [ "$(printf '%s\n' "${lines[@]}" | awk '{print $2}' | sort -u | wc -l)" -eq "${#nodes[@]}" ]
  done
}

@test "tasks run as the unprivileged test user, not root" {
  run as_user srun -n1 sh -c 'echo "$(id -un) $(id -u)"'
  [ "$status" -eq 0 ] || { show; false; }
  [ "$output" = "$GANTRY_TEST_USER $(id -u "$GANTRY_TEST_USER")" ]
}

@test "each node has its own network, UTS and mount namespace, none of them the host's" {
  need_multi 2
  run as_user srun -N "${#nodes[@]}" sh -c \
    'echo "$(readlink /proc/self/ns/net) $(readlink /proc/self/ns/uts) $(readlink /proc/self/ns/mnt)"'
  [ "$status" -eq 0 ] || { show; false; }
  [ "${#lines[@]}" -eq "${#nodes[@]}" ]
  for col in 1 2 3; do
    [ "$(printf '%s\n' "${lines[@]}" | awk -v c=$col '{print $c}' | sort -u | wc -l)" -eq "${#nodes[@]}" ]
  done
  host="$(readlink /proc/self/ns/net) $(readlink /proc/self/ns/uts) $(readlink /proc/self/ns/mnt)"
  for line in "${lines[@]}"; do
    for ns in $host; do
      [[ " $line " != *" $ns "* ]] || { echo "a node shares the host's $ns"; false; }
    done
  done
}

@test "an sbatch job on all nodes writes into the shared FSx directory, visible from the host" {
  cat >"$work/job.sh" <<'EOF'
#!/bin/bash
srun sh -c 'echo "written by $(hostname) in job $SLURM_JOB_ID" > "$1/from-$(hostname)"' sh "$PWD"
EOF
  chmod 755 "$work/job.sh"
  run as_user sbatch --wait -N "${#nodes[@]}" --ntasks-per-node=1 -o "$work/job.out" "$work/job.sh"
  [ "$status" -eq 0 ] || { show; cat "$work/job.out"; false; }
  for n in "${nodes[@]}"; do
    [ -f "$work/from-$n" ] || { ls -l "$work"; cat "$work/job.out"; false; }
    grep -q "^written by $n in job [0-9]" "$work/from-$n"
    [ "$(stat -c %U "$work/from-$n")" = "$GANTRY_TEST_USER" ]
  done
}

@test "every node sees its own hostname and the shared FSx directory" {
  echo "seen from the host" >"$work/marker"
  for n in "${nodes[@]}"; do
    run as_user srun -w "$n" -N1 sh -c 'hostname; cat "$1/marker"' sh "$work"
    [ "$status" -eq 0 ] || { show; false; }
    [ "${lines[0]}" = "$n" ]
    [ "${lines[1]}" = "seen from the host" ]
  done
}

@test "slurm.sh exec runs a command inside a node's namespaces" {
  for n in "${nodes[@]}"; do
    run $GANTRY_SLURM_EXEC "$n" -- hostname
    [ "$status" -eq 0 ] || { show; false; }
    [ "$output" = "$n" ]
  done
  # Nodes resolve each other's names (their own /etc/hosts).
  run $GANTRY_SLURM_EXEC "${nodes[-1]}" -- getent hosts "${nodes[0]}"
  [ "$status" -eq 0 ]
  [[ $output == *" ${nodes[0]}" ]]
}

@test "a file in one node's local scratch is not visible on another node" {
  need_multi 2
  a=${nodes[0]} b=${nodes[1]} name=only-on-$a.$$
  run as_user srun -w "$a" -N1 sh -c 'echo local > "$1/$2" && cat "$1/$2"' sh "$GANTRY_TEST_SCRATCH" "$name"
  [ "$status" -eq 0 ] || { show; false; }
  [ "$output" = local ]
  run as_user srun -w "$b" -N1 sh -c 'test -d "$1" && test -w "$1" && ! test -e "$1/$2"' sh "$GANTRY_TEST_SCRATCH" "$name"
  [ "$status" -eq 0 ] || { echo "node $b sees $GANTRY_TEST_SCRATCH/$name or cannot write its scratch"; show; false; }
  # From the host, the file is in node a's directory only.
  [ -f "${GANTRY_TEST_SCRATCH_PATTERN//%n/$a}/$name" ]
  [ ! -e "${GANTRY_TEST_SCRATCH_PATTERN//%n/$b}/$name" ]
  [ ! -e "$GANTRY_TEST_SCRATCH/$name" ]
  rm -f "${GANTRY_TEST_SCRATCH_PATTERN//%n/$a}/$name"
}

@test "salloc gives an allocation in which srun runs" {
  run as_user salloc -N "${#nodes[@]}" srun hostname
  [ "$status" -eq 0 ] || { show; false; }
  for n in "${nodes[@]}"; do
    grep -qx "$n" <<<"$output" || { echo "no $n in: $output"; false; }
  done
}

@test "a node whose slurmd is stopped and started again runs jobs" {
  n=${nodes[-1]}
  "$GANTRY_SLURM_HARNESS" stop-node "$n"
  run "$GANTRY_SLURM_HARNESS" status
  [ "$status" -ne 0 ]
  grep -q "^$n.slurmd: NOT running" <<<"$output"
  "$GANTRY_SLURM_HARNESS" start-node "$n"
  run as_user srun -w "$n" -N1 --immediate=30 hostname
  [ "$status" -eq 0 ] || { show; false; }
  [ "$output" = "$n" ]
}

@test "the Gantry SPANK plugin is loaded: srun --help lists --container-image" {
  if [ -z "$GANTRY_TEST_PLUGIN" ]; then
    # Under CTest the build always produces the plugin, so a cluster without it is a failure there.
    if [ -n "${GANTRY_BUILD_DIR:-}" ]; then
      echo "the harness runs without a plugin: $GANTRY_BUILD_DIR/plugin/spank_gantry.so missing (build target spank_gantry)"
      false
    fi
    skip "the harness was started without spank_gantry.so (set GANTRY_BUILD_DIR or GANTRY_PLUGIN)"
  fi
  grep -q "^required $GANTRY_TEST_PLUGIN" "$GANTRY_SLURM_STATE/plugstack.conf"
  run as_user srun --help
  [ "$status" -eq 0 ] || { show; false; }
  grep -q -- '--container-image' <<<"$output" || { echo "srun --help has no --container-image: $output"; false; }
}
