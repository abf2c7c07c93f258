# fixtures: registry images slurm
# Pyxis's environment rule through srun/sbatch on the real Slurm harness (docs/user.md, "Environment
# inside"): the job's exported variables reach every rank, the image's Env wins for a name it defines,
# --container-env gives the job's value back, srun --export decides what the job environment is.

load helpers

setup() {
  gantry_step_suite pyxis-env-test
}

teardown() {
  rm -rf "$WORK"
}

# as_user CMD...: run as the test user from the shared directory (a cwd every node has).
as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# efa_checked TEXT: the jobs below export FI_PROVIDER=efa, as the seed guides' do, on nodes without EFA
# devices: each step's fabric check (docs/devices.md, "Proving the fabric") prints exactly one line
# saying so. Checks that, and prints TEXT without it.
efa_checked() {
  [ "$(printf '%s\n' "$1" | grep -c '^gantry: warning: EFA check: no EFA device is visible')" -eq 1 ] || return 1
  printf '%s\n' "$1" | grep -v '^gantry: warning: EFA check: '
}

@test "exported job variables reach every rank on every node" {
  run as_user bash -c 'export NCCL_DEBUG=INFO FI_PROVIDER=efa FI_EFA_USE_DEVICE_RDMA=1 HF_TOKEN=hf_test
    srun -N2 -n2 --container-image="$0" printenv NCCL_DEBUG FI_PROVIDER FI_EFA_USE_DEVICE_RDMA HF_TOKEN' "$DEBIAN"
  echo "$output"
  [ "$status" -eq 0 ]
  output=$(efa_checked "$output")
  [ "$(echo "$output" | wc -l)" -eq 8 ]
  for v in INFO efa 1 hf_test; do [ "$(echo "$output" | grep -cx "$v")" -eq 2 ]; done
  # Every rank of the step, on both nodes.
  run as_user bash -c 'export NCCL_DEBUG=INFO FI_PROVIDER=efa
    srun -N2 -n4 --container-image="$0" sh -c "echo \$SLURM_NODEID \$NCCL_DEBUG \$FI_PROVIDER"' "$TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  output=$(efa_checked "$output")
  [ "$(echo "$output" | wc -l)" -eq 4 ]
  [ "$(echo "$output" | grep -c '^[01] INFO efa$')" -eq 4 ]
  [ "$(echo "$output" | awk '{print $1}' | sort -u | wc -l)" -eq 2 ]
}

@test "the image's Env wins for a name it defines; --container-env gives the job's value" {
  # tiny's config sets GANTRY_TINY=1 and PATH; JOB_ONLY is not in the image. The job's PATH is spelt out
  # (srun in /usr/bin on either login node), not taken from the test's own, which is the host's.
  run as_user env GANTRY_TINY=job JOB_ONLY=job PATH=/job/bin:/usr/bin:/bin \
    srun -n1 --container-image="$TINY" sh -c 'echo "$GANTRY_TINY $JOB_ONLY $PATH"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "1 job /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" ]
  run as_user env GANTRY_TINY=job JOB_ONLY=job srun -n1 --container-image="$TINY" --container-env=GANTRY_TINY \
    sh -c 'echo "$GANTRY_TINY $JOB_ONLY"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "job job" ]
}

@test "variables that describe the host stay outside: LD_PRELOAD, LD_LIBRARY_PATH, LC_*, PWD" {
  # A real host library for LD_PRELOAD, so that srun itself (on the host) loads it silently.
  libm=$(ldconfig -p | awk '/libm\.so\.6 .*x86-64/ {print $NF; exit}')
  [ -n "$libm" ]
  run as_user env LD_PRELOAD="$libm" LD_LIBRARY_PATH=/host/lib LC_ALL=C.UTF-8 KEEP=1 \
    srun -n1 --container-image="$TINY" sh -c 'echo "${LD_PRELOAD-unset} ${LD_LIBRARY_PATH-unset} ${LC_ALL-unset} $KEEP $PWD"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "unset unset unset 1 /work" ]
}

@test "srun --export limits what arrives, as Slurm does" {
  # The same --export without a container is the reference (Slurm 22.05 ignores NAME=value after NONE,
  # for instance); /bin/sh by absolute path, since with NONE the task has no PATH on the host.
  local e host inside
  for e in NONE FOO FOO=1 NONE,FOO=1 ALL; do
    host=$(as_user env FOO=3 BAR=2 srun -n1 --export="$e" /bin/sh -c 'echo "${FOO-unset} ${BAR-unset} ${SLURM_PROCID-unset}"')
    inside=$(as_user env FOO=3 BAR=2 srun -n1 --export="$e" --container-image="$TINY" \
      sh -c 'echo "${FOO-unset} ${BAR-unset} ${SLURM_PROCID-unset}"')
    echo "--export=$e: host '$host', container '$inside'"
    [ "$inside" = "$host" ]
    case $e in
      NONE) [ "$inside" = "unset unset 0" ] ;;
      FOO) [ "$inside" = "3 unset 0" ] ;;
      FOO=1) [ "$inside" = "1 unset 0" ] ;;
      ALL) [ "$inside" = "3 2 0" ] ;;
    esac
  done
}

@test "a users' sbatch job: the NCCL/FI variables it exports are seen by the ranks in the container" {
  # After /work/shared/user-jobs/train-distributed.sbatch: exports on the host, srun --container-image,
  # and the escaped \${SLURM_PROCID} expanded inside, per rank.
  cat > "$WORK/train.sbatch" <<'JOB'
#!/bin/bash
#SBATCH --job-name=distributed-training
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen-wikitext-default}
export CONTAINER_IMAGE="@IMAGE@"
export MASTER_ADDR=$(scontrol show hostname $SLURM_NODELIST | head -n 1)
export MASTER_PORT=29500
export NCCL_DEBUG=INFO
export FI_PROVIDER=efa
export NCCL_PROTO=simple
export NCCL_SOCKET_IFNAME=ens5
export NCCL_IB_DISABLE=1
srun --container-image=${CONTAINER_IMAGE} \
     sh -c "
     echo rank \${SLURM_PROCID} of ${SLURM_JOB_NUM_NODES}: \$NCCL_DEBUG \$FI_PROVIDER \$NCCL_PROTO \$NCCL_SOCKET_IFNAME \$NCCL_IB_DISABLE \$MASTER_ADDR:\$MASTER_PORT \$EXPERIMENT_NAME \$GANTRY_TINY
     " | sort
JOB
  sed -i "s|@IMAGE@|$TINY|" "$WORK/train.sbatch"
  chown "$U" "$WORK/train.sbatch"
  run as_user sbatch --wait -o "$WORK/train.out" "$WORK/train.sbatch"
  echo "$output"; cat "$WORK/train.out" || true
  [ "$status" -eq 0 ]
  master=$(sed -n 's/^rank 0 of 2: .* \([^ ]*\):29500 .*/\1/p' "$WORK/train.out")
  [ -n "$master" ]
  [ "$(efa_checked "$(cat "$WORK/train.out")")" = "$(printf 'rank 0 of 2: INFO efa simple ens5 1 %s:29500 qwen-wikitext-default 1\nrank 1 of 2: INFO efa simple ens5 1 %s:29500 qwen-wikitext-default 1' "$master" "$master")" ]
}
