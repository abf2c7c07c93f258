# fixtures: registry images slurm
# What changed in SPANK between the Slurm releases the plugin meets (issue 32), on the clusters of
# tests/harness/slurmroot.sh: CTest runs this file as integration.spank_releases@24.11 and @26.05 only
# (it changes their slurm.conf and plugstack.conf, which the 22.05 harness keeps elsewhere).
#  - 25.05 added slurm_spank_init_failure_mode: with ESPANK_JOB_FAILURE a failed slurm_spank_init on a
#    node fails the job instead of draining the node. The plugin sets it where the headers have it.
#  - SlurmdParameters=contain_spank runs user_init, task_post_fork and task_exit in a child of
#    slurmstepd that shares its memory but not its file descriptors.
#  - Remote option callbacks ran twice for one option up to 23.11, once since 24.05: either way an
#    option given once takes effect once.

load helpers

setup() {
  gantry_load_env registry images slurm
  case ${GANTRY_TEST_SLURM_RELEASE:-22.05} in
    24.11 | 26.05) ;;
    *) echo "spank_releases.bats runs on the 24.11 and 26.05 clusters (GANTRY_TEST_SLURM=24.11 or 26.05)" >&2; return 1 ;;
  esac
  gantry_cluster_registry
  gantry_plugin_conf
  DEBIAN="$REG#gantry-test/debian"
  U=$GANTRY_TEST_USER
  CONF_DIR=$GANTRY_TEST_SLURM_CONF_DIR
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/spank-releases.XXXXXX")
  chown "$U" "$WORK"
  RESTORE_PLUGSTACK=
  RESTORE_SLURMD=
}

teardown() {
  if [ -n "$RESTORE_PLUGSTACK" ]; then
    mv -f "$CONF_DIR/plugstack.conf.saved" "$CONF_DIR/plugstack.conf"
    rm -f "$CONF_DIR/plugstack-login.conf" "$CONF_DIR/slurm-login.conf"
  fi
  [ -z "$RESTORE_SLURMD" ] || "$GANTRY_SLURM_HARNESS" slurmd-parameters ""
  # A node a test left drained (the pre-25.05 outcome of a failed init) is of no use to the next suite.
  local node
  for node in $(sinfo -h -N -t drain,drng,fail -o %N 2>/dev/null | sort -u); do
    scontrol update nodename="$node" state=resume || true
  done
  rm -rf "$WORK"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# nodes_idle: every node idle (none drained, down or failing) within 30 s.
nodes_idle() {
  local states i
  for ((i = 0; i < 60; i++)); do
    states=$(sinfo -h -N -o '%N %T' | sort -u)
    if echo "$states" | grep -Eqi 'drain|down|fail'; then
      echo "unhealthy nodes: $states"
      return 1
    fi
    [ "$(echo "$states" | awk '$2 != "idle"' | wc -l)" -eq 0 ] && return 0
    sleep 0.5
  done
  echo "nodes not idle after 30 s: $states"
  return 1
}

release_at_least() {
  [ "$(printf '%s\n%s\n' "$1" "$GANTRY_TEST_SLURM_RELEASE" | sort -V | head -n1)" = "$1" ]
}

@test "slurm_spank_init_failure_mode is defined exactly where the headers have it (25.05 and later)" {
  run nm -D --defined-only "$GANTRY_TEST_PLUGIN"
  [ "$status" -eq 0 ]
  if release_at_least 25.05; then
    echo "$output" | grep -Eq ' [BDGR] slurm_spank_init_failure_mode$'
  else
    ! echo "$output" | grep -q slurm_spank_init_failure_mode || false
  fi
}

@test "a failed slurm_spank_init on the nodes fails the job; from 25.05 on the node stays idle" {
  # srun on the login node reads a plugstack.conf of its own that is fine; the nodes' has a key the
  # plugin refuses, so slurm_spank_init fails in slurmstepd only, the case the failure mode is for.
  cp -p "$CONF_DIR/plugstack.conf" "$CONF_DIR/plugstack.conf.saved"
  RESTORE_PLUGSTACK=1
  cp "$CONF_DIR/plugstack.conf" "$CONF_DIR/plugstack-login.conf"
  sed 's|^PlugStackConfig=.*|PlugStackConfig=/etc/slurm/plugstack-login.conf|' "$CONF_DIR/slurm.conf" >"$CONF_DIR/slurm-login.conf"
  sed -i '/spank_gantry.so/s|$| gantry_test_bad_key=1|' "$CONF_DIR/plugstack.conf"
  chmod 644 "$CONF_DIR"/*.conf
  node=${GANTRY_TEST_NODES%% *}
  run as_user env SLURM_CONF=/etc/slurm/slurm-login.conf timeout 120 srun -w "$node" -N1 -n1 true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  grep -q "gantry_test_bad_key" "${GANTRY_SLURMD_LOG_PATTERN//%n/$node}"
  if release_at_least 25.05; then
    nodes_idle
  else
    echo "# $GANTRY_TEST_SLURM_RELEASE: node state after the failed init: $(sinfo -h -N -n "$node" -o %T | sort -u)" >&3
  fi
  # The plugin's own configuration back: the next step on that node runs in its image.
  mv -f "$CONF_DIR/plugstack.conf.saved" "$CONF_DIR/plugstack.conf"
  RESTORE_PLUGSTACK=
  scontrol update nodename="$node" state=resume 2>/dev/null || true
  nodes_idle
  run as_user timeout 120 srun -w "$node" -N1 -n1 --container-image="$DEBIAN" sh -c '. /etc/os-release; echo "$ID"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1)" = debian ]
}

@test "a bad image fails the job with the error and leaves every node idle" {
  run as_user timeout 120 srun -N3 -n3 --container-image="$REG#gantry-test/no-such-image-$RANDOM" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  nodes_idle
}

@test "SlurmdParameters=contain_spank: a containerized 2-node step runs and leaves nothing behind" {
  "$GANTRY_SLURM_HARNESS" slurmd-parameters contain_spank
  RESTORE_SLURMD=1
  grep -qx 'SlurmdParameters=contain_spank' "$CONF_DIR/slurm.conf"
  run as_user timeout 120 srun -N2 -n4 --container-image="$DEBIAN" sh -c '. /etc/os-release; echo "rank $SLURM_PROCID $ID"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^rank [0-3] debian$')" -eq 4 ]
  # A named container kept between two steps of one job: task_exit, which keeps it, ran in the child.
  cat >"$WORK/job.sh" <<EOF
srun -n1 --container-image="$DEBIAN" --container-name=contained --container-writable sh -c 'echo kept > /state'
srun -n1 --container-name=contained cat /state
EOF
  chown "$U" "$WORK/job.sh"
  run as_user timeout 180 salloc -N1 bash "$WORK/job.sh"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx kept
  nodes_idle
}

@test "an option given once is parsed once: one --container-mounts entry is one bind on every node" {
  mkdir -p "$WORK/a" && chown "$U" "$WORK/a"
  run as_user timeout 120 srun -N2 -n2 --container-image="$DEBIAN" --container-mounts="$WORK/a:/mnt/once" \
    sh -c 'grep -c " /mnt/once " /proc/self/mountinfo'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx 1)" -eq 2 ]
}
