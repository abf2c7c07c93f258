# fixtures: registry images slurm
# Staged while the job waits (issue #37): sbatch --container-image resolves the tag with the user's
# credentials and pulls the image into the shared store in the background, so that a job held behind
# another finds it stored when it starts; a tag that does not exist fails sbatch itself. srun outside
# any job, which asks for an allocation of its own, stages the digest it resolved for its step the same
# way; srun inside a job does not. And the `gantry stage` verb behind it. Blob requests are counted in
# the open registry's access log.

load helpers

setup() {
  gantry_step_suite stage
}

teardown() {
  [ -z "${BLOCKER:-}" ] || scancel "$BLOCKER" 2>/dev/null || true
  [ -z "${SRUN:-}" ] || kill "$SRUN" 2>/dev/null || true
  [ -z "${SRUN2:-}" ] || kill "$SRUN2" 2>/dev/null || true
  [ -z "${JOB:-}" ] || scancel "$JOB" 2>/dev/null || true
  rm -rf "$WORK"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# stored DIGEST: whether the shared store lists DIGEST (as the test user sees it).
# A store not made yet (no images/ in a fresh harness) holds nothing: `gantry images` fails there, and
# jq -e on no input would say yes.
stored() {
  local json
  json=$(as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" "$GANTRY_TEST_GANTRY" images --format json) || return 1
  echo "$json" | jq -e --arg d "$1" 'any(.[]; .digest == $d)' >/dev/null
}

@test "sbatch with a cold image, held behind a job that holds every node: the image is stored before the job starts, whose step fetches no blob" {
  gantry_plugin_conf "layered_images = no"
  name="staged-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  nblobs=$(gantry_blob_digests "$name" | wc -l)
  gets=$(gantry_blob_gets "$name")   # tiny's layers are shared with other images: count from here on
  ! stored "$digest" || false
  # Every node busy: the job below waits in the queue until the blocker is cancelled.
  gantry_hold_every_node
  cat > "$WORK/job.sh" <<JOB
#!/bin/sh
#SBATCH --container-image=$REG/gantry-test/$name
#SBATCH -N1
echo "ran \$GANTRY_CONTAINER_IMAGE_DIGEST \$(cat /unique/id | cut -d' ' -f1)"
JOB
  chown "$U" "$WORK/job.sh"
  JOB=$(as_user sbatch --parsable -o "$WORK/job.out" "$WORK/job.sh")
  [ -n "$JOB" ]
  # The submission's background stage stores the image while the job is pending.
  for ((i = 0; i < 600; i++)); do stored "$digest" && break; sleep 0.2; done
  stored "$digest"
  [ "$(squeue -h -j "$JOB" -o %T)" = PENDING ]
  sleep 1   # the registry logs a request after answering it
  echo "blob GETs at submit: $(($(gantry_blob_gets "$name") - gets)) for $nblobs blobs"
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
  # The job runs the digest resolved at submit, from the store: no blob is fetched again.
  scancel "$BLOCKER"
  for ((i = 0; i < 600; i++)); do [ -z "$(squeue -h -j "$JOB")" ] && break; sleep 0.2; done
  cat "$WORK/job.out"
  [ "$(cat "$WORK/job.out")" = "ran $digest $name" ]
  sleep 1
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
}

# blob_gets_from ADDR NAME: blob GETs so far in repository gantry-test/NAME (a test's own, so no other
# image's requests count: its blobs are shared with tiny) in the open registry's access log that came
# from ADDR (the first field of each access-log line). In the multi-node harness the login node reaches
# the registry from GANTRY_TEST_LOGIN_ADDR and each node from an address of its own.
blob_gets_from() {
  grep -cE "^${1//./\\.} .*\"GET /v2/gantry-test/$2/blobs/sha256:[0-9a-f]{64}(\\?[^ \"]*)? HTTP/[0-9.]+\"" \
    "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true
}

# repo_blob_gets NAME: blob GETs so far in repository gantry-test/NAME, from any address (the test's own
# repository: the blobs it shares with tiny are counted only when fetched through it).
repo_blob_gets() {
  grep -cE "\"GET /v2/gantry-test/$1/blobs/sha256:[0-9a-f]{64}(\\?[^ \"]*)? HTTP/[0-9.]+\"" "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true
}

# wait_pending_jobs N: the test user's pending jobs (sruns' own allocations), once the controller has N.
wait_pending_jobs() {
  local i jobs
  for ((i = 0; i < 300; i++)); do
    jobs=$(squeue -h -u "$U" -t PENDING -o %i)
    [ "$(echo "$jobs" | grep -c .)" -lt "$1" ] || break
    sleep 0.2
  done
  echo $jobs
}

# wait_srun PID: sets RC to the exit status of srun (a child of this shell), once it has ended.
wait_srun() {
  local i
  for ((i = 0; i < 600; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
  RC=0
  wait "$1" || RC=$?
}

@test "srun outside any job with a cold image (a tag, or IMAGE@DIGEST), held behind a job that holds every node: the image is stored while srun waits, and its step fetches no blob" {
  [ "$GANTRY_TEST_MODE" = multi ] || skip "needs the multi-node harness: the registry log tells the login node from the nodes by address"
  gantry_plugin_conf "layered_images = no"
  name="srun-staged-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  nblobs=$(gantry_blob_digests "$name" | wc -l)
  ! stored "$digest" || false
  # A second cold image, named by digest: srun resolves nothing, and stages that digest.
  name2="srun-pinned-$RANDOM$RANDOM"
  digest2=$(gantry_fresh_image "$WORK" "$name2")
  nblobs2=$(gantry_blob_digests "$name2" | wc -l)
  ! stored "$digest2" || false
  gantry_hold_every_node
  # No SLURM_JOB_ID: srun asks for an allocation of its own and waits in the queue behind the blocker.
  # In the background (its fd 3 closed: bats waits for every holder of it).
  as_user env -u SLURM_JOB_ID -u SLURM_JOBID srun -v -N1 --container-image="$REG#gantry-test/$name" \
    sh -c 'echo "ran $GANTRY_CONTAINER_IMAGE_DIGEST $(cut -d" " -f1 /unique/id)"' \
    >"$WORK/srun.out" 2>"$WORK/srun.err" 3>&- &
  SRUN=$!
  as_user env -u SLURM_JOB_ID -u SLURM_JOBID srun -N1 --container-image="$REG#gantry-test/$name2@$digest2" \
    sh -c 'echo "ran $GANTRY_CONTAINER_IMAGE_DIGEST $(cut -d" " -f1 /unique/id)"' \
    >"$WORK/srun2.out" 2>"$WORK/srun2.err" 3>&- &
  SRUN2=$!
  jobs=$(wait_pending_jobs 2)
  echo "pending: $jobs"
  [ "$(echo $jobs | wc -w)" -eq 2 ]
  # The sruns' stages (from the login node) store the images while their jobs are pending.
  for ((i = 0; i < 600; i++)); do stored "$digest" && stored "$digest2" && break; sleep 0.2; done
  stored "$digest"
  stored "$digest2"
  [ "$(squeue -h -u "$U" -t PENDING -o %i | sort | xargs)" = "$(echo $jobs | xargs -n1 | sort | xargs)" ]
  sleep 1   # the registry logs a request after answering it
  echo "blob GETs while pending: $(repo_blob_gets "$name") for $nblobs blobs, $(blob_gets_from "$GANTRY_TEST_LOGIN_ADDR" "$name") from the login node"
  [ "$(repo_blob_gets "$name")" -eq "$nblobs" ]
  [ "$(blob_gets_from "$GANTRY_TEST_LOGIN_ADDR" "$name")" -eq "$nblobs" ]
  [ "$(blob_gets_from "$GANTRY_TEST_LOGIN_ADDR" "$name2")" -eq "$nblobs2" ]
  # The blocker ends: each step runs its digest (srun's resolution; the one written), from the store,
  # fetching no blob.
  scancel "$BLOCKER"
  wait_srun "$SRUN"
  rc=$RC SRUN=
  wait_srun "$SRUN2"
  rc2=$RC SRUN2=
  grep gantry "$WORK/srun.err" || true
  cat "$WORK/srun.out" "$WORK/srun2.err" "$WORK/srun2.out"
  [ "$rc" -eq 0 ]
  [ "$rc2" -eq 0 ]
  [ "$(cat "$WORK/srun.out")" = "ran $digest $name" ]
  [ "$(cat "$WORK/srun2.out")" = "ran $digest2 $name2" ]
  grep -q "gantry: while the job waited for its nodes: staged" "$WORK/srun.err"
  sleep 1
  [ "$(repo_blob_gets "$name")" -eq "$nblobs" ]
  [ "$(repo_blob_gets "$name2")" -eq "$nblobs2" ]
}

# node_pull_only NAME DIGEST CMD...: runs CMD (an srun of gantry-test/NAME, cold) as the test user and
# checks that the step ran DIGEST and that its node fetched every blob, the login node none.
node_pull_only() {
  local name=$1 digest=$2 nblobs gets
  shift 2
  nblobs=$(gantry_blob_digests "$name" | wc -l)
  gets=$(gantry_blob_gets "$name")
  ! stored "$digest" || false
  run as_user timeout 300 "$@"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "ran $digest"
  sleep 1   # the registry logs a request after answering it
  echo "blob GETs: $(($(gantry_blob_gets "$name") - gets)) for $nblobs blobs, $(blob_gets_from "$GANTRY_TEST_LOGIN_ADDR" "$name") from the login node"
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
  [ "$(blob_gets_from "$GANTRY_TEST_LOGIN_ADDR" "$name")" -eq 0 ]
}

@test "srun inside a job, or outside one with free nodes, stages nothing: its node pulls the cold image, the login node fetches no blob" {
  [ "$GANTRY_TEST_MODE" = multi ] || skip "needs the multi-node harness: the registry log tells the login node from the nodes by address"
  gantry_plugin_conf "layered_images = no"
  # salloc (no image of its own: nothing staged at submit) runs srun on the login node, inside the job.
  name="srun-in-job-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  node_pull_only "$name" "$digest" salloc -N1 srun --container-image="$REG#gantry-test/$name" \
    sh -c 'echo "ran $GANTRY_CONTAINER_IMAGE_DIGEST"'
  # Outside any job with every node idle: the allocation comes before the stage would start.
  name="srun-free-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  node_pull_only "$name" "$digest" env -u SLURM_JOB_ID -u SLURM_JOBID srun -v -N1 \
    --container-image="$REG#gantry-test/$name" sh -c 'echo "ran $GANTRY_CONTAINER_IMAGE_DIGEST"'
  ! echo "$output" | grep -q "while the job waited" || false
}

@test "sbatch with a tag that does not exist, or credentials the registry refuses, fails at once with Pyxis's words and allocates no job id" {
  before=$(gantry_next_job_id)
  [ -n "$before" ]
  run as_user timeout 60 sbatch -N1 --container-image="$REG#gantry-test/tiny:no-such-tag-$RANDOM" --wrap true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "^gantry: failed to import docker image: $REG#gantry-test/tiny:no-such-tag-[0-9]*: "
  [ "$(gantry_next_job_id)" = "$before" ]
  [ -z "$(squeue -h -u "$U")" ]
  # Credentials the registry refuses (the harness's TLS registry, Basic auth): the same, at once.
  gantry_plugin_conf "ca_bundle = $GANTRY_TEST_REGISTRY_CA"
  mkdir -m 700 "$WORK/wrong" && chown "$U" "$WORK/wrong"
  printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$GANTRY_TEST_REGISTRY_TLS" "$(printf 'AWS:wrong-%s' "$RANDOM" | base64 -w0)" >"$WORK/wrong/config.json"
  chown "$U" "$WORK/wrong/config.json"
  run as_user timeout 60 env DOCKER_CONFIG="$WORK/wrong" sbatch -N1 --container-image="$GANTRY_TEST_REGISTRY_TLS#gantry-test/tiny" --wrap true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -q "^gantry: failed to import docker image: $GANTRY_TEST_REGISTRY_TLS#gantry-test/tiny: "
  [ "$(gantry_next_job_id)" = "$before" ]
  # stage_at_submit = no: sbatch asks nothing, and the job fails on its node instead.
  gantry_plugin_conf "stage_at_submit = no"
  run as_user timeout 60 sbatch --parsable -N1 -o /dev/null --container-image="$REG#gantry-test/tiny:no-such-tag-$RANDOM" --wrap true
  echo "$output"
  [ "$status" -eq 0 ]
  JOB=$output
  [ "$(gantry_next_job_id)" != "$before" ]
}

@test "gantry stage: stores the image and prints it as gantry pull does; --background returns the digest; a missing tag fails" {
  store="$WORK/own-store"
  name="stage-cli-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  run as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" "$GANTRY_TEST_GANTRY" stage --quiet --store "$store" "$REG#gantry-test/$name"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${output%% *}" = "$digest" ]
  # Already stored: --background resolves, prints the digest and returns; the detached pull finds it.
  run as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" "$GANTRY_TEST_GANTRY" stage --background --store "$store" "$REG#gantry-test/$name"
  [ "$status" -eq 0 ]
  [ "$output" = "$digest" ]
  run as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" "$GANTRY_TEST_GANTRY" stage --store "$store" "$REG#gantry-test/$name:nope"
  echo "$output"
  [ "$status" -eq 1 ]
  echo "$output" | grep -q "^gantry: failed to import docker image: $REG#gantry-test/$name:nope: "
  [ "$(echo "$output" | wc -l)" -eq 1 ]
}
