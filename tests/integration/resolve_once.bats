# fixtures: registry images slurm
# The tag is resolved once per step, not once per node (issue #36): srun asks the registry with the
# user's credentials and hands the digest to every node (GANTRY_RESOLVED_IMAGE); counted in the open
# registry's access log on the 3-node harness. The trusted store's side (the registry's per-user
# authorisation, remembered per node for authorization_cache_seconds) is in trusted_store.bats.

load helpers

setup() {
  gantry_step_suite resolve-once
}

teardown() {
  rm -rf "$WORK"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# manifests NAME: manifest requests (GET or HEAD, by tag or digest) for gantry-test/NAME in the open
# registry's access log so far. The registry writes a line after answering: callers wait a moment.
manifests() {
  grep -cE "\"(GET|HEAD) /v2/gantry-test/$1/manifests/[^ \"]+ HTTP/[0-9.]+\"" "$GANTRY_TEST_REGISTRY_HTTP_LOG" || true
}

# step NAME: a 3-node step of gantry-test/NAME:latest printing each node's name and digest; its output
# in $output, and the manifest requests it made in $asked.
step() {
  local before
  before=$(manifests "$1")
  run as_user timeout 240 srun -N3 -n3 --container-image="$REG#gantry-test/$1" sh -c 'echo "ran $(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  sleep 1
  asked=$(($(manifests "$1") - before))
  echo "manifest requests: $asked"
}

@test "pull_policy = always: a warm 3-node step makes one manifest request; a cold one downloads each blob once" {
  # Whole images: a cold pull downloads every blob (a layered one only the layers the store lacks).
  gantry_plugin_conf "layered_images = no"
  name="once-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  nblobs=$(gantry_blob_digests "$name" | wc -l)
  # tiny's layers are shared with other images of the registry: count from here on.
  gets=$(gantry_blob_gets "$name")
  step "$name"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $digest$")" -eq 3 ]
  echo "blob GETs: $(($(gantry_blob_gets "$name") - gets)) for $nblobs blobs"
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
  # Cold: srun's HEAD of the tag, then the producer's HEAD and GET of the manifest by digest; the
  # other nodes wait for the producer under the digest's lock and ask nothing (per node, it was 5).
  [ "$asked" -le 3 ]
  for _ in 1 2; do
    step "$name"
    [ "$status" -eq 0 ]
    [ "$(echo "$output" | grep -c "^ran .* $digest$")" -eq 3 ]
    [ "$asked" -eq 1 ]
  done
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
  # srun asks nothing for a pinned digest, nor under GANTRY_PULL_POLICY=missing (the nodes answer from
  # the store), and a stale GANTRY_RESOLVED_IMAGE in srun's environment never reaches the nodes.
  before=$(manifests "$name")
  run as_user env GANTRY_PULL_POLICY=missing GANTRY_RESOLVED_IMAGE="$REG#gantry-test/$name@sha256:$(printf '0%.0s' {1..64})" \
    timeout 120 srun -N3 -n3 --container-image="$REG#gantry-test/$name" sh -c 'echo "ran $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran $digest$")" -eq 3 ]
  run as_user timeout 120 srun -N3 -n3 --container-image="$REG#gantry-test/$name@$digest" true
  [ "$status" -eq 0 ]
  sleep 1
  [ "$(manifests "$name")" -eq "$before" ]
}

@test "a tag moved between two steps: the next step runs what it names now, on every node" {
  name="moved-$RANDOM$RANDOM"
  first=$(gantry_fresh_image "$WORK" "$name")
  step "$name"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $first$")" -eq 3 ]
  rm -rf "$WORK/layout-$name" "$WORK/uniq-$name" "$WORK/uniq-$name.tar"
  second=$(gantry_fresh_image "$WORK" "$name")
  [ "$second" != "$first" ]
  step "$name"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c "^ran .* $second$")" -eq 3 ]
  [ "$asked" -le 3 ]
}
