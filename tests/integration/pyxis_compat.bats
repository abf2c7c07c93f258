# fixtures: registry images slurm
# What a Pyxis user sees and relies on, through srun on the 3-node harness: the import announced once
# per step on srun's terminal, a missing tag tried once per step, and named containers attached from
# another step (--overlap) and cleaned up when a step holding one is cancelled.

load helpers

setup() {
  GANTRY_TEST_IMPORT_MESSAGES= gantry_step_suite pyxis-compat  # Gantry's default: import lines on
}

teardown() {
  unshape_link
  rm -rf "$WORK"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# manifest_requests METHOD REPO REF: how many METHOD requests for REPO's manifest REF the open
# registry's access log holds.
manifest_requests() {
  grep -cE "\"$1 /v2/$2/manifests/$3 HTTP/[0-9.]+\"" "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true
}

@test "a cold pull with -N2 -n4 shows 'importing' and 'imported' exactly once on srun's terminal" {
  name="compat-cold-$RANDOM$RANDOM"
  gantry_fresh_image "$WORK" "$name" >/dev/null
  image="$REG#gantry-test/$name"
  as_user srun -N2 -n4 --container-image="$image" cat /unique/id >"$WORK/out" 2>"$WORK/err"
  echo "--- stdout"; cat "$WORK/out"; echo "--- stderr"; cat "$WORK/err"
  [ "$(grep -c "^$name " "$WORK/out")" -eq 4 ]
  [ "$(grep -cx "gantry: importing docker image: $image" "$WORK/err")" -eq 1 ]
  [ "$(grep -cx "gantry: imported docker image: $image" "$WORK/err")" -eq 1 ]
  # In that order, and nothing is printed on stdout for the import.
  [ "$(grep -n "importing docker image" "$WORK/err" | cut -d: -f1)" -lt "$(grep -n "imported docker image" "$WORK/err" | cut -d: -f1)" ]
  ! grep -q "docker image" "$WORK/out" || false
}

@test "a slow cold pull: srun prints the nodes' import progress (bytes, layers) while they pull, once per step" {
  GANTRY_TEST_IMPORT_MESSAGES= gantry_plugin_conf "import_progress_seconds = 1"
  name="compat-slow-$RANDOM$RANDOM"
  gantry_fresh_image "$WORK" "$name" 8000000 >/dev/null   # 8 MB of random bytes: gzip keeps them
  image="$REG#gantry-test/$name"
  shape_link 16mbit   # ~2 MB/s towards the nodes: the download takes seconds
  as_user srun -N2 -n2 --container-image="$image" cat /unique/id >"$WORK/out" 2>"$WORK/err"
  unshape_link
  echo "--- stdout"; cat "$WORK/out"; echo "--- stderr"; cat "$WORK/err"
  [ "$(grep -c "^$name " "$WORK/out")" -eq 2 ]
  # Progress lines come from srun alone: "IMAGE: DONE / TOTAL (P%), L/N layers[, RATE/s]".
  progress=$(grep -E "^gantry: importing docker image: $image: [0-9.]+ [KMG]?i?B / [0-9.]+ [KMG]iB \([0-9]+%\), [0-9]+/[0-9]+ layers" "$WORK/err" | wc -l)
  echo "progress lines: $progress"
  [ "$progress" -ge 1 ]
  # They come between the two announcements, which are still printed once each.
  [ "$(grep -cx "gantry: importing docker image: $image" "$WORK/err")" -eq 1 ]
  [ "$(grep -cx "gantry: imported docker image: $image" "$WORK/err")" -eq 1 ]
  first_progress=$(grep -n "importing docker image: $image: " "$WORK/err" | head -n1 | cut -d: -f1)
  [ "$(grep -n "importing docker image: $image\$" "$WORK/err" | cut -d: -f1)" -lt "$first_progress" ]
  # With import_progress_seconds = 0 nothing but the announcements is printed.
  GANTRY_TEST_IMPORT_MESSAGES= gantry_plugin_conf "import_progress_seconds = 0"
  name2="compat-quiet-$RANDOM$RANDOM"
  gantry_fresh_image "$WORK" "$name2" 8000000 >/dev/null
  shape_link 16mbit
  as_user srun -N1 -n1 --container-image="$REG#gantry-test/$name2" true 2>"$WORK/err2"
  unshape_link
  cat "$WORK/err2"
  ! grep -q "importing docker image: $REG#gantry-test/$name2: " "$WORK/err2" || false
}

@test "a missing tag with -N2 -n4: one manifest request to the registry and one error on the terminal" {
  tag="no-such-tag-$RANDOM$RANDOM"
  image="$REG#gantry-test/tiny:$tag"
  run as_user timeout 120 srun -N2 -n4 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  [ "$(echo "$output" | grep -c "gantry: failed to import docker image")" -eq 1 ]
  echo "$output" | grep "gantry: failed to import docker image" | grep -q "$tag"
  echo "$output" | grep -Eqi "manifest unknown|404"
  sleep 1  # the registry writes its access log line after answering
  gets=$(manifest_requests GET gantry-test/tiny "$tag")
  heads=$(manifest_requests HEAD gantry-test/tiny "$tag")
  echo "manifest GETs: $gets, HEADs: $heads"
  [ "$gets" -eq 1 ]
  [ "$heads" -le 1 ]
  # No node was asked to start anything: the step never launched.
  ! echo "$output" | grep -q "task_init\|slurmstepd" || false
}

# Job script for the named-container tests: step 0 creates container "att" and keeps running; a second
# step attaches with --overlap (with a --container-mounts that must be ignored); the test cancels step
# 0 while the job goes on; a last step finds the container still there (named containers live until
# the job ends, container_scope=job).
write_attach_job() {
  cat >"$WORK/job.sh" <<JOB
#!/bin/bash
srun -n1 --container-image="$TINY" --container-name=att --container-writable --container-mounts="$WORK:$WORK" \
  --container-workdir=/etc sh -c 'echo "written by step \$SLURM_STEP_ID" > /state; touch "$WORK/up"; exec sleep 600' &
for ((i = 0; i < 600; i++)); do [ -e "$WORK/up" ] && break; sleep 0.1; done
srun --overlap -n1 --container-name=att --container-mounts=/tmp:/mnt/gantry-ignored \
  sh -c 'cat /state; [ -d /mnt/gantry-ignored ] && echo mounted || echo not-mounted; echo "cwd \$(pwd)"' >"$WORK/attach.out" 2>"$WORK/attach.err"
echo "attach status \$?" >>"$WORK/attach.out"
srun --overlap -n1 --container-name=att --container-workdir=/bin pwd >"$WORK/attach-workdir.out" 2>&1
touch "$WORK/attached"
for ((i = 0; i < 600; i++)); do [ -e "$WORK/cancelled" ] && break; sleep 0.1; done
srun --overlap -n1 --container-name=att cat /state >"$WORK/after.out" 2>&1
echo "after status \$?" >>"$WORK/after.out"
JOB
  chmod 755 "$WORK/job.sh"
  chown "$U" "$WORK/job.sh"
}

wait_for() {
  local i
  for ((i = 0; i < 600; i++)); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}

@test "--overlap --container-name attaches to a running step's container; --container-mounts is ignored with a warning; the cwd rules" {
  write_attach_job
  jobid=$(as_user sbatch --parsable -N1 -o "$WORK/job.out" "$WORK/job.sh")
  wait_for "$WORK/attached"
  cat "$WORK/attach.out" "$WORK/attach.err"
  grep -qx "written by step 0" "$WORK/attach.out"
  grep -qx "not-mounted" "$WORK/attach.out"
  grep -qx "attach status 0" "$WORK/attach.out"
  [ "$(grep -c "ignoring --container-mounts" "$WORK/attach.err")" -eq 1 ]
  # Each step starts in its own --container-workdir, else, attached to a running container, in its /
  # (as Pyxis; not the image's WorkingDir, tiny's /work), never in the creating step's
  # --container-workdir=/etc.
  grep -qx "cwd /" "$WORK/attach.out"
  cat "$WORK/attach-workdir.out"
  [ "$(cat "$WORK/attach-workdir.out")" = /bin ]
  touch "$WORK/cancelled"
  scancel "$jobid"
}

@test "scancel of the step holding a named container: the container lives until the job ends, then no holder or state file is left" {
  write_attach_job
  jobid=$(as_user sbatch --parsable -N1 -o "$WORK/job.out" "$WORK/job.sh")
  wait_for "$WORK/attached"
  node=$(squeue -h -j "$jobid" -o %N)
  state_file=/run/gantry/containers/pyxis_${jobid}_att.json
  holder=$($GANTRY_SLURM_EXEC "$node" -- cat "$state_file" | grep -o '"holder_pid": *[0-9]*' | grep -o '[0-9]*$')
  echo "job $jobid on $node, holder $holder"
  [ -n "$holder" ]
  kill -0 "$holder"

  scancel "$jobid.0"
  for ((i = 0; i < 300; i++)); do [ -z "$(squeue -h -s -j "$jobid" -o %i | grep "^$jobid\.0$")" ] && break; sleep 0.1; done
  [ -z "$(squeue -h -s -j "$jobid" -o %i | grep "^$jobid\.0$")" ]
  touch "$WORK/cancelled"
  for ((i = 0; i < 600; i++)); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.1; done
  cat "$WORK/after.out" "$WORK/job.out"
  # The container outlived its step: a later step of the job still found its file.
  grep -qx "written by step 0" "$WORK/after.out"
  grep -qx "after status 0" "$WORK/after.out"

  # The job is over: its epilog stopped the holder and removed the state file.
  for ((i = 0; i < 300; i++)); do kill -0 "$holder" 2>/dev/null || break; sleep 0.1; done
  ! kill -0 "$holder" 2>/dev/null || false
  run $GANTRY_SLURM_EXEC "$node" -- test -e "$state_file"
  [ "$status" -ne 0 ]
}
