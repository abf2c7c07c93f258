# fixtures: registry images slurm
# Start-up telemetry (issue #37; docs/admin.md, "Start-up telemetry"): with telemetry_dir set, every
# node of a containerized step writes one JSON line (resolve, pull or hit, mount, first exec, image and
# digest) into a root-owned directory on the shared file system; `gantry stats JOBID` summarises them.
# And, as gantry-attacker: a telemetry_dir others may write is refused, and a symlink planted there
# under a record's name is never followed by root.

load helpers

ATTACKER=gantry-attacker

setup() {
  gantry_step_suite telemetry
  TDIR=$GANTRY_TEST_FSX/telemetry-$BATS_TEST_NUMBER-$RANDOM
  install -d -o root -g root -m 0755 "$TDIR"
  gantry_plugin_conf "layered_images = no" "telemetry_dir = $TDIR"
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
}

teardown() {
  rm -rf "$WORK" "$TDIR"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# step IMAGE: a 3-node step of IMAGE; JOB is its job id.
step() {
  run as_user timeout 240 srun -N3 -n3 --container-image="$1" sh -c 'echo "job $SLURM_JOB_ID"'
  echo "$output"
  [ "$status" -eq 0 ]
  JOB=$(echo "$output" | awk '$1 == "job" {print $2; exit}')
  [ -n "$JOB" ]
}

# records JOB COUNT: waits (up to 20 s: the nodes write at their first exec, while srun may already be
# returning) until COUNT records of JOB's step 0 are there; prints them, one a line.
records() {
  local i
  for ((i = 0; i < 100; i++)); do
    [ "$(find "$TDIR" -name "$1.0.*.json" | wc -l)" -ge "$2" ] && break
    sleep 0.2
  done
  cat "$TDIR/$1".0.*.json
}

# p50 JOB FIELD: the nearest-rank median of FIELD over JOB's records, rounded as gantry stats prints it.
p50() {
  cat "$TDIR/$1".0.*.json | jq -s --arg f "$2" '[.[][$f]] | sort | .[((length + 1) / 2 | floor) - 1]' |
    xargs printf '%.0f\n'
}

@test "a cold then a warm 3-node step: one record per node with every phase, pull then hit; gantry stats JOBID" {
  name="telemetry-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  image="$REG#gantry-test/$name"

  step "$image"
  cold=$JOB
  run records "$cold" 3
  echo "$output"
  [ "$(echo "$output" | wc -l)" -eq 3 ]
  # One line per node, each node once; every phase measured; the step's image and digest, job and user.
  [ "$(echo "$output" | jq -r .node | sort -u | wc -l)" -eq 3 ]
  [ "$(echo "$output" | jq -r "select(.job == $cold and .step == 0 and .user == \"$U\" and .image == \"$image\"
        and .digest == \"$digest\") | .node" | wc -l)" -eq 3 ]
  for f in resolve_ms pull_ms mount_ms exec_ms total_ms since_srun_ms; do
    [ "$(echo "$output" | jq "select(.$f | type == \"number\" and . >= 0) | .node" | wc -l)" -eq 3 ]
  done
  # pull + mount + exec = total (to the microsecond the file keeps).
  [ "$(echo "$output" | jq 'select((.pull_ms + .mount_ms + .exec_ms - .total_ms) | fabs < 0.01) | .node' | wc -l)" -eq 3 ]
  # Cold: one node pulled the image, the others waited for it (or found it published).
  [ "$(echo "$output" | jq -r .image_from | grep -c '^pulled$')" -eq 1 ]
  [ "$(echo "$output" | jq -r .image_from | grep -Ec '^(waited|stored)$')" -eq 2 ]
  # Files root wrote: root's, one line each, readable.
  [ "$(stat -c %U "$TDIR/$cold".0.*.json | sort -u)" = root ]

  step "$image"
  warm=$JOB
  [ "$warm" != "$cold" ]
  run records "$warm" 3
  echo "$output"
  [ "$(echo "$output" | jq -r .image_from | grep -c '^stored$')" -eq 3 ]

  # gantry stats JOBID, as the user, from gantry.conf's telemetry_dir.
  run as_user env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY" stats "$cold"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -F "job $cold step 0: $image ($digest) on 3 nodes; image pulled on 1,"
  for phase in resolve pull mount exec total; do
    field=${phase}_ms
    echo "$output" | grep -E "^  $phase +3 +$(p50 "$cold" "$field") "
  done
  echo "$output" | grep -E "^  stragglers .*: (none|[0-9]+)$"
  # The newest job by default, and each node's line with --nodes.
  run as_user env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY" stats --nodes
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -F "job $warm step 0:"
  echo "$output" | grep -F "image pulled on 0, waited for on 0, stored on 3"
  [ "$(echo "$output" | grep -cE '^  [^ ]+ +stored ')" -eq 3 ]
  # No records: one line and status 1; a malformed JOBID: status 2.
  run "$GANTRY" stats --dir "$TDIR" 999999
  [ "$status" -eq 1 ]
  [ "$output" = "gantry: stats: no start-up records of job 999999 in $TDIR" ]
  run "$GANTRY" stats --dir "$TDIR" 12x
  [ "$status" -eq 2 ]
  [ "$output" = "gantry: stats: JOBID must be a Slurm job id (a number), got '12x'" ]
  run "$GANTRY" stats --no-such-option
  [ "$status" -eq 2 ]
  [ "$output" = "gantry: stats: unknown option '--no-such-option' (see gantry stats --help)" ]
  run "$GANTRY" stats --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "usage: gantry stats"* ]]
  # Without a telemetry_dir: one line saying so.
  run env GANTRY_CONFIG=/dev/null "$GANTRY" stats "$cold"
  [ "$status" -eq 1 ]
  [[ "$output" == "gantry: stats: no telemetry_dir in "*"(start-up telemetry is off); set it, or give --dir DIR" ]]
}

@test "gantry-attacker cannot make root write elsewhere: a user-writable telemetry_dir is refused, planted symlinks are not followed" {
  GANTRY_TEST_USER=$ATTACKER GANTRY_TEST_UID=4243 "$BATS_TEST_DIRNAME/../harness/user.sh" >/dev/null
  # The victim: a file of root's the attacker cannot write.
  victim=$WORK/victim
  echo untouched >"$victim"
  chown root:root "$victim"
  chmod 0644 "$victim"
  # A misconfigured directory: anyone may create names in it.
  chmod 1777 "$TDIR"
  # The next jobs' record names, planted as links to the victim by the attacker.
  run as_user timeout 60 srun -N1 sh -c 'echo "$SLURM_JOB_ID"'
  [ "$status" -eq 0 ]
  last=$(echo "$output" | tail -1)
  for ((j = last + 1; j <= last + 3; j++)); do
    for node in $GANTRY_TEST_NODES; do
      runuser -u "$ATTACKER" -- ln -s "$victim" "$TDIR/$j.0.$node.json"
    done
  done
  step "$TINY"
  [ "$JOB" -le $((last + 3)) ]
  # The step ran; root neither wrote through the links nor wrote any record in that directory.
  [ "$(cat "$victim")" = untouched ]
  [ -z "$(find "$TDIR" -type f)" ]
  # The refusal is in the nodes' slurmd logs, with the reason.
  for ((i = 0; i < 50; i++)); do
    refused=$(cat "$GANTRY_HARNESS_DIR"/slurm/nodes/*/slurmd.log | grep -c "start-up telemetry not written: telemetry_dir $TDIR: refused: it must be owned by uid 0 and writable by nobody else (it is uid 0, mode 1777)" || true)
    [ "$refused" -ge 3 ] && break
    sleep 0.2
  done
  [ "$refused" -eq 3 ]
  # Fixed (root-owned, 0755, the attacker's links removed): the next step's records appear.
  find "$TDIR" -type l -delete
  chmod 0755 "$TDIR"
  step "$TINY"
  run records "$JOB" 3
  [ "$(echo "$output" | wc -l)" -eq 3 ]
}
