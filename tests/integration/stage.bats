# fixtures: registry images slurm
# Staged while the job waits (issue #37): sbatch --container-image resolves the tag with the user's
# credentials and pulls the image into the shared store in the background, so that a job held behind
# another finds it stored when it starts; a tag that does not exist fails sbatch itself. And the
# `gantry stage` verb behind it. Blob requests are counted in the open registry's access log.

load helpers

setup() {
  gantry_step_suite stage
}

teardown() {
  [ -z "${BLOCKER:-}" ] || scancel "$BLOCKER" 2>/dev/null || true
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
  nodes=$(sinfo -h -N -o %N | sort -u | wc -l)
  BLOCKER=$(as_user sbatch --parsable -N"$nodes" --exclusive -o /dev/null --wrap 'sleep 600')
  for ((i = 0; i < 100; i++)); do [ "$(squeue -h -j "$BLOCKER" -o %T)" = RUNNING ] && break; sleep 0.1; done
  [ "$(squeue -h -j "$BLOCKER" -o %T)" = RUNNING ]
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
