# fixtures: registry images slurm
# The SPANK plugin on the real Slurm harness, driven as an ordinary user through srun/sbatch/salloc:
# Pyxis-compatible options, one container per node per step, one pull per cluster, clean failures.

load helpers

setup() {
  gantry_step_suite plugin-test
}

teardown() {
  fake_ib_devices_done
  rm -rf "$WORK"
}

# as_user CMD...: run as the test user from the shared directory (a cwd every node has).
as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

@test "srun -n4 runs every rank in the image" {
  run as_user srun -n4 --container-image="$TINY" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^tiny work dir$')" -eq 4 ]
}

@test "the executable on the srun line may exist only in the image (bare name via the image's PATH, or absolute)" {
  # tiny's /usr/local/bin/gantry-entrypoint is on no node: slurmstepd looks the command up in the task
  # after the plugin's task_init put it in the container (Pyxis #104).
  [ ! -e /usr/local/bin/gantry-entrypoint ]
  run as_user srun -N3 -n3 --container-image="$TINY" gantry-entrypoint sh -c 'echo "found $GANTRY_ENTRYPOINT_RAN"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^found 1$')" -eq 3 ]
  run as_user srun -n1 --container-image="$TINY" /usr/local/bin/gantry-entrypoint sh -c 'echo "found $GANTRY_ENTRYPOINT_RAN"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(gantry_without_queue_lines <<<"$output")" = "found 1" ]
}

@test "the debian image's os-release is what the ranks see" {
  run as_user srun -n2 --container-image="$DEBIAN" bash -c '. /etc/os-release; echo "$ID $VERSION_CODENAME"; test ! -e /usr/bin/cmake && echo no-host-cmake'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^debian bookworm$')" -eq 2 ]
  [ "$(echo "$output" | grep -c '^no-host-cmake$')" -eq 2 ]
}

@test "all local ranks share one container (same mount namespace)" {
  run as_user srun -N1 -n4 --container-image="$TINY" readlink /proc/self/ns/mnt
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort -u | wc -l)" -eq 1 ]
  host_ns=$(readlink /proc/self/ns/mnt)
  ! echo "$output" | grep -qx "$host_ns" || false
}

@test "image environment and WorkingDir apply; --container-workdir overrides" {
  run as_user srun -n1 --container-image="$TINY" sh -c 'echo "$GANTRY_TINY $(pwd)"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "1 /work" ]
  run as_user srun -n1 --container-image="$TINY" --container-workdir=/tmp pwd
  [ "$output" = "/tmp" ]
}

@test "--container-mounts: read-write, read-only and missing source" {
  echo hello > "$WORK/in.txt"
  chown "$U" "$WORK/in.txt"
  run as_user srun -n1 --container-image="$TINY" --container-mounts="$WORK:/data" sh -c 'cat /data/in.txt; echo out > /data/out.txt'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "hello" ]
  [ "$(cat "$WORK/out.txt")" = "out" ]
  run as_user srun -n1 --container-image="$TINY" --container-mounts="$WORK:/data:ro" sh -c 'echo x > /data/ro.txt'
  [ "$status" -ne 0 ]
  [ ! -e "$WORK/ro.txt" ]
  run as_user srun -n1 --container-image="$TINY" --container-mounts=/does/not/exist:/data true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "source path does not exist"
}

@test "--container-writable allows writes to /, the default does not" {
  run as_user srun -n1 --container-image="$TINY" sh -c 'echo x > /written'
  [ "$status" -ne 0 ]
  run as_user srun -n1 --container-image="$TINY" --container-writable sh -c 'echo x > /written && cat /written'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "x" ]
}

@test "--container-remap-root makes the user root inside" {
  run as_user srun -n1 --container-image="$TINY" --container-remap-root id -u
  [ "$status" -eq 0 ]
  [ "$output" = "0" ]
  run as_user srun -n1 --container-image="$TINY" id -u
  [ "$output" = "$(id -u "$U")" ]
}

@test "--container-env: the host value wins for named variables" {
  run as_user env GANTRY_TINY=host srun -n1 --container-image="$TINY" sh -c 'echo $GANTRY_TINY'
  [ "$output" = "1" ]
  run as_user env GANTRY_TINY=host srun -n1 --container-image="$TINY" --container-env=GANTRY_TINY sh -c 'echo $GANTRY_TINY'
  [ "$output" = "host" ]
}

@test "PYXIS_CONTAINER_IMAGE in the environment selects the image; the command line wins" {
  run as_user env PYXIS_CONTAINER_IMAGE="$TINY" srun -n1 cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "tiny work dir" ]
}

@test "--container-name keeps the container for later steps of the job" {
  cat > "$WORK/job.sh" <<JOB
#!/bin/bash
srun -n1 --container-image="$TINY" --container-name=keep --container-writable sh -c 'echo first > /state'
srun -n1 --container-name=keep cat /state
JOB
  chown "$U" "$WORK/job.sh"
  run as_user salloc -N1 bash "$WORK/job.sh"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx first
}

@test "a requeued job starts cleanly: its named container from the first run is gone" {
  # The job id (and so the container's name, pyxis_<jobid>_keep) stays the same across a requeue: the
  # job epilog of the first run must have removed that container, or the second run would see its state.
  cat > "$WORK/job.sh" <<JOB
#!/bin/bash
srun -n1 --container-image="$TINY" --container-name=keep --container-writable \
  sh -c 'cat /state 2>/dev/null || echo "run \${SLURM_RESTART_COUNT:-0}: fresh container"; echo "written in run \${SLURM_RESTART_COUNT:-0}" > /state'
echo "run \${SLURM_RESTART_COUNT:-0} done"
[ "\${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 300
JOB
  chmod 755 "$WORK/job.sh"
  jobid=$(as_user sbatch --parsable --requeue -N1 --open-mode=append -o "$WORK/job.out" "$WORK/job.sh")
  for ((i = 0; i < 300; i++)); do grep -q "^run 0 done" "$WORK/job.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "^run 0 done" "$WORK/job.out"
  scontrol requeue "$jobid"
  # Slurm holds a requeued job back for two minutes (BeginTime) once it is pending again; let it start.
  for ((i = 0; i < 300; i++)); do
    [ "$(squeue -h -j "$jobid" -o %T 2>/dev/null)" = PENDING ] && scontrol update jobid="$jobid" starttime=now && break
    sleep 0.1
  done
  for ((i = 0; i < 600; i++)); do grep -q "^run 1 done" "$WORK/job.out" 2>/dev/null && break; sleep 0.1; done
  cat "$WORK/job.out"
  grep -qx "run 0: fresh container" "$WORK/job.out"
  grep -qx "run 1: fresh container" "$WORK/job.out"
  ! grep -q "^written in run" "$WORK/job.out" || false
  for ((i = 0; i < 300; i++)); do [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && break; sleep 0.1; done
  [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ]
}

@test "a bad image name fails the step with one clear line and the node stays up" {
  run as_user srun -n1 --container-image="$REG#gantry-test/no-such-image" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "failed to import docker image"
  run sinfo -h -o '%t' 
  ! echo "$output" | grep -Eq 'drain|down' || false
}

@test "--container-image specified twice with different values is refused" {
  run as_user srun -n1 --container-image="$TINY" --container-image="$DEBIAN" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q -- "--container-image specified multiple times"
}

@test "multi-node: srun -N3 -n12 on a new image pulls each blob once and every rank runs one digest" {
  # A new image (tiny plus a unique layer): nobody has pulled it yet.
  fresh="fresh-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$fresh" 1000000)
  fresh=gantry-test/$fresh
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/$fresh/manifests/latest" | jq -r '.config.digest, .layers[-1].digest')
  blob=$(echo "$blobs" | tail -n1)
  before=$("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$blob")
  run as_user srun -N3 -n12 --container-image="$REG#$fresh" sh -c 'echo "$(hostname) $GANTRY_CONTAINER_IMAGE_DIGEST"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | wc -l)" -eq 12 ]
  [ "$(echo "$output" | awk '{print $1}' | sort -u | wc -l)" -eq 3 ]
  after=$("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$blob")
  [ $((after - before)) -eq 1 ]
  # The new blobs (config and unique layer) crossed the network once for the whole cluster.
  for b in $blobs; do
    [ "$("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")" -eq 1 ]
  done
  [ "$(echo "$output" | awk '{print $2}' | sort -u)" = "$digest" ]
}

@test "layered_images = yes: srun -N3 stores new tags as layers, pulls each blob once, and a second tag reuses the base's layer" {
  gantry_plugin_conf "layered_images = yes"
  count() { "$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$1"; }
  one="layered-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$one")
  layers=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$one/manifests/latest" | jq -r '.layers[].digest')
  base_blob=$(echo "$layers" | head -n1)
  top_one=$(echo "$layers" | tail -n1)
  run as_user srun -N3 -n3 --container-image="$REG#gantry-test/$one" \
    sh -c 'cat /unique/id >/dev/null && awk '\''$5 == "/bin" { for (i = 7; $i != "-"; i++); print $(i + 1) }'\'' /proc/self/mountinfo'
  echo "$output"
  [ "$status" -eq 0 ]
  # Every node stacks the layers (the job user's 1777 store: the fuse backend, one server per layer).
  [ "$(echo "$output" | grep -cx overlay)" -eq 3 ]
  [ ! -e "$GANTRY_TEST_FSX/store/images/${digest#sha256:}.sqsh" ]
  [ -f "$GANTRY_TEST_FSX/store/images/${digest#sha256:}.json" ]
  # One producer for the three nodes: the new layer crossed the network once.
  [ "$(count "$top_one")" -eq 1 ]
  # A second tag on the same base: only its own layer is fetched; the base's came from the store.
  base_before=$(count "$base_blob")
  two="layered-$RANDOM$RANDOM"
  gantry_fresh_image "$WORK" "$two" >/dev/null
  top=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$two/manifests/latest" | jq -r '.layers[-1].digest')
  run as_user srun -N3 -n3 --container-image="$REG#gantry-test/$two" cat /unique/id
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | wc -l)" -eq 3 ]
  [ "$(count "$top")" -eq 1 ]
  [ "$(count "$base_blob")" -eq "$base_before" ]
  id_two=$(echo "$output" | head -n1)
  # --container-save of a layered image's container: one squashfs file of the stack plus the step's
  # writes, which runs again as an image.
  run as_user srun -n1 --container-image="$REG#gantry-test/$two" --container-writable \
    --container-save="$WORK/layered-saved.sqsh" sh -c 'echo layered-save > /marker'
  echo "$output"
  [ "$status" -eq 0 ]
  run as_user srun -n1 --container-image="$WORK/layered-saved.sqsh" sh -c 'cat /marker /unique/id'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'layered-save\n%s' "$id_two")" ]
  ! unsquashfs -lls "$WORK/layered-saved.sqsh" | grep -q '^c.* 0, *0 ' || false  # no whiteout devices
}

@test "--container-entrypoint runs the image's entrypoint in front of the command; off by default" {
  run as_user srun -n2 --container-image="$TINY" --container-entrypoint sh -c 'echo "ep=$GANTRY_ENTRYPOINT_RAN"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c '^ep=1$')" -eq 2 ]
  run as_user srun -n1 --container-image="$TINY" sh -c 'echo "ep=$GANTRY_ENTRYPOINT_RAN"'
  [ "$output" = "ep=" ]
}

@test "--container-save writes the container's root file system, which runs again as an image" {
  run as_user srun -N1 -n2 --container-image="$TINY" --container-writable --container-save="$WORK/saved.sqsh" \
    sh -c 'echo "saved by $SLURM_PROCID" > /marker-$SLURM_PROCID'
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$WORK/saved.sqsh" ]
  [ "$(stat -c %U "$WORK/saved.sqsh")" = "$U" ]
  run as_user srun -n1 --container-image="$WORK/saved.sqsh" sh -c 'cat /marker-0 /marker-1 /work/README'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'saved by 0\nsaved by 1\ntiny work dir')" ]
  # A read-only container (its "/" assembled from the image's directories) saves the whole image too,
  # with a user mount of the step left out.
  mkdir "$WORK/data" && chown "$U" "$WORK/data"
  run as_user srun -n1 --container-image="$TINY" --container-mounts="$WORK/data:/data" --container-save="$WORK/ro.sqsh" true
  [ "$status" -eq 0 ]
  unsquashfs -l "$WORK/ro.sqsh" > "$WORK/ro.list"
  grep -qx 'squashfs-root/work/README' "$WORK/ro.list"
  grep -qx 'squashfs-root/bin/busybox' "$WORK/ro.list" || grep -qx 'squashfs-root/bin/sh' "$WORK/ro.list"
  ! grep -q '^squashfs-root/data/' "$WORK/ro.list" || false
  ! grep -q '^squashfs-root/proc/.' "$WORK/ro.list" || false
}

# refused_quickly MESSAGE SRUN-ARGS...: srun stops while it parses its options, before it asks for
# a job (the controller's next job id has not moved: no timing, which a loaded CI machine stretches),
# prints MESSAGE on one line, and every node stays idle.
refused_quickly() {
  local message=$1 before
  shift
  before=$(gantry_next_job_id)
  [ -n "$before" ]
  run as_user timeout 30 srun -n1 "$@" true
  echo "srun $* -> status $status"
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$status" -ne 124 ]
  echo "$output" | grep -qF -- "$message"
  [ "$(gantry_next_job_id)" = "$before" ]
  [ -z "$(squeue -h -u "$U")" ]
  [ "$(sinfo -h -o '%t' | sort -u)" = "idle" ]
}

@test "Pyxis's argument checks: empty values, an empty list element, a save target that is a directory" {
  mkdir "$WORK/dir" && chown "$U" "$WORK/dir"
  refused_quickly "gantry: --container-workdir: argument required" --container-image="$TINY" --container-workdir=
  refused_quickly "gantry: --container-env: argument required" --container-image="$TINY" --container-env=
  refused_quickly "gantry: --container-env: invalid format 'FOO,': an empty element" --container-image="$TINY" --container-env=FOO,
  refused_quickly "gantry: --container-env: invalid format 'FOO,,BAR'" --container-image="$TINY" --container-env=FOO,,BAR
  refused_quickly "gantry: --container-image: argument required" --container-image=
  refused_quickly "gantry: --container-mounts: argument required" --container-image="$TINY" --container-mounts=
  refused_quickly "gantry: --container-mounts: invalid format '$WORK:/data,'" --container-image="$TINY" --container-mounts="$WORK:/data,"
  refused_quickly "gantry: --container-name: argument required" --container-image="$TINY" --container-name=
  refused_quickly "gantry: --container-save: argument required" --container-image="$TINY" --container-save=
  refused_quickly "gantry: --container-save=$WORK/dir: target is a directory" --container-image="$TINY" --container-save="$WORK/dir"
  refused_quickly "gantry: --container-save=new/: target is a directory" --container-image="$TINY" --container-save=new/
  [ ! -e "$WORK/new" ]
  # A relative path names a directory only once the step knows its working directory (srun --chdir):
  # the step fails before its command runs, and the nodes stay up.
  run as_user srun -n1 --container-image="$TINY" --container-save=dir touch "$WORK/ran"
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -qF "gantry: --container-save=dir: target is a directory (give a file path, e.g. $WORK/dir/image.sqsh)"
  [ ! -e "$WORK/ran" ]
  for ((i = 0; i < 100; i++)); do [ "$(sinfo -h -o '%t' | sort -u)" = "idle" ] && break; sleep 0.1; done
  [ "$(sinfo -h -o '%t' | sort -u)" = "idle" ]
  # The environment forms: Pyxis reports a bad value and runs the job without it; so do we.
  run as_user env PYXIS_CONTAINER_ENV=HOME, srun -n1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qF "gantry: warning: PYXIS_CONTAINER_ENV: invalid format 'HOME,'"
}

@test "--container-save through the user's link into another user's directory: a failed save removes nothing of theirs" {
  # Another account (the victim) keeps results.partial in a directory of its own; the job user makes
  # a link to that directory and names it in --container-save. The user's mksquashfs cannot write
  # there and fails; the partial file is then removed as the user (issue #33), so root never follows
  # the link and the victim's file stays.
  V=$(GANTRY_TEST_USER=gantry-victim GANTRY_TEST_UID=4244 "$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  install -d -o "$V" -g "$V" -m 0755 "$WORK/victim"
  echo precious >"$WORK/victim/results.partial"
  chown "$V:$V" "$WORK/victim/results.partial"
  chmod 0644 "$WORK/victim/results.partial"
  as_user ln -s "$WORK/victim" "$WORK/link"
  run as_user srun -n1 --container-image="$TINY" --container-save="$WORK/link/results" true
  echo "$output"
  # The save comes after the task's own end: its failure is one line on srun's terminal (the step's
  # exit status is the task's).
  [ "$(echo "$output" | grep -c "gantry: --container-save $WORK/link/results: mksquashfs failed")" -eq 1 ]
  [ "$(cat "$WORK/victim/results.partial")" = precious ]
  [ ! -e "$WORK/victim/results" ]
}

@test "a relative --container-save (or PYXIS_CONTAINER_SAVE) is taken against the job's working directory" {
  run as_user srun -n1 --container-image="$TINY" --container-writable --container-save=out.sqsh sh -c 'echo relative > /marker'
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$WORK/out.sqsh" ]
  [ "$(stat -c %U "$WORK/out.sqsh")" = "$U" ]
  run as_user srun -n1 --container-image="$WORK/out.sqsh" cat /marker
  [ "$output" = "relative" ]
  # srun --chdir: the step's working directory, not the one srun started in.
  mkdir "$WORK/sub" && chown "$U" "$WORK/sub"
  run as_user srun -n1 --chdir="$WORK/sub" --container-image="$TINY" --container-save=./chdir.sqsh true
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$WORK/sub/chdir.sqsh" ]
  run as_user env PYXIS_CONTAINER_SAVE=env.sqsh srun -n1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$WORK/env.sqsh" ]
}

@test "sbatch: #SBATCH --container-image runs the batch script itself in the container" {
  # In #SBATCH lines '#' starts a comment, so the Docker spelling REGISTRY/IMAGE is the one to use there.
  cat > "$WORK/batch.sh" <<JOB
#!/bin/sh
#SBATCH --container-image=$REG/gantry-test/tiny
#SBATCH -N1
cat /work/README
JOB
  chown "$U" "$WORK/batch.sh"
  run as_user sbatch --wait -o "$WORK/batch.out" "$WORK/batch.sh"
  echo "$output"; cat "$WORK/batch.out" || true
  [ "$status" -eq 0 ]
  grep -qx "tiny work dir" "$WORK/batch.out"
}

@test "sbatch: an srun inside the containerized batch script inherits the image; its own --container-image overrides" {
  # The image brings the Slurm client (and the libraries our plugin needs, since srun loads the
  # plugstack's plugins); the plugin binds the cluster's configuration, munge and itself (batch_srun).
  local img
  img=$(gantry_slurm_client_image)
  cat > "$WORK/batch.sh" <<JOB
#!/bin/sh
#SBATCH --container-image=$img
#SBATCH -N2 --ntasks-per-node=1
echo "batch \$(cat /etc/gantry-marker)"
srun -N2 -n2 sh -c 'echo "inner \$SLURM_PROCID \$(cat /etc/gantry-marker)"' | sort
srun -N1 -n1 --container-image=$REG/gantry-test/tiny cat /work/README
JOB
  chown "$U" "$WORK/batch.sh"
  run as_user sbatch --wait -o "$WORK/batch.out" "$WORK/batch.sh"
  echo "$output"; cat "$WORK/batch.out" || true
  [ "$status" -eq 0 ]
  # The inner srun that names an image announces it on its stderr (the batch output): srun inside the
  # container reads no harness gantry.conf, so the default import messages are on there.
  [ "$(grep -v '^gantry: importing docker image: ' "$WORK/batch.out")" = "$(printf 'batch slurm-client image\ninner 0 slurm-client image\ninner 1 slurm-client image\ntiny work dir')" ]
  # Switched off in gantry.conf: the batch script still runs in the container, without the
  # cluster's munge socket or our plugin inside.
  local sock
  sock=$(scontrol show config | sed -n 's/^AuthInfo *= *.*socket=\([^,]*\).*/\1/p')
  [ -n "$sock" ] || sock=/run/munge/munge.socket.2
  cat > "$WORK/batch2.sh" <<JOB
#!/bin/sh
#SBATCH --container-image=$img
#SBATCH -N1
cat /etc/gantry-marker
for f in "$sock" "$GANTRY_TEST_PLUGIN"; do [ -e "\$f" ] && echo "\$f visible"; done
true
JOB
  chown "$U" "$WORK/batch2.sh"
  run as_user sbatch --wait -o "$WORK/batch2.out" "$WORK/batch2.sh"
  cat "$WORK/batch2.out" || true
  [ "$status" -eq 0 ]
  [ "$(cat "$WORK/batch2.out")" = "$(printf 'slurm-client image\n%s visible\n%s visible' "$sock" "$GANTRY_TEST_PLUGIN")" ]
  gantry_plugin_conf "batch_srun = 0"
  run as_user sbatch --wait -o "$WORK/batch3.out" "$WORK/batch2.sh"
  cat "$WORK/batch3.out" || true
  [ "$status" -eq 0 ]
  [ "$(cat "$WORK/batch3.out")" = "slurm-client image" ]
}

@test "field-guide job: 2 nodes, #SBATCH options, MASTER_ADDR from scontrol, /dev/infiniband and shared mounts" {
  # The harness has no EFA: uverbs nodes made with mknod (real major 231) stand in for them.
  fake_ib_devices
  cat > "$WORK/train-distributed.sbatch" <<JOB
#!/bin/bash
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --output=$WORK/train.out
set -e
nodes=( \$(scontrol show hostnames \$SLURM_JOB_NODELIST) )
head_node=\${nodes[0]}
srun --container-image=$REG/gantry-test/debian \\
     --container-mounts=/dev/infiniband:/dev/infiniband,$WORK:$WORK \\
     --container-writable \\
     bash -c "test -c /dev/infiniband/uverbs0 && echo \\\$(hostname) \\\$SLURM_PROCID \$head_node > $WORK/rank-\\\$SLURM_PROCID"
JOB
  chown "$U" "$WORK/train-distributed.sbatch"
  run as_user sbatch --wait "$WORK/train-distributed.sbatch"
  fake_ib_devices_done
  echo "$output"; cat "$WORK/train.out" || true
  [ "$status" -eq 0 ]
  [ "$(ls "$WORK"/rank-* | wc -l)" -eq 8 ]
  master=$(cat "$WORK"/rank-0 | awk '{print $3}')
  for r in 0 1 2 3 4 5 6 7; do
    read -r host rank addr < "$WORK/rank-$r"
    [ "$rank" = "$r" ]
    [ "$addr" = "$master" ]
  done
  # Ranks 0-3 on the first node (the MASTER_ADDR), 4-7 on the second.
  [ "$(cat "$WORK"/rank-[0-3] | awk '{print $1}' | sort -u)" = "$master" ]
  [ "$(cat "$WORK"/rank-[4-7] | awk '{print $1}' | sort -u | wc -l)" -eq 1 ]
  [ "$(cat "$WORK"/rank-[4-7] | awk '{print $1}' | sort -u)" != "$master" ]
}

@test "three concurrent jobs on one new image: all succeed, every new blob is fetched once" {
  fresh="conc3-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$fresh" 2000000)
  blobs=$(curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$fresh/manifests/latest" | jq -r '.config.digest, .layers[-1].digest')
  for j in 1 2 3; do
    as_user srun -N3 -n3 --container-image="$REG#gantry-test/$fresh" sh -c 'echo "$GANTRY_CONTAINER_IMAGE_DIGEST"' > "$WORK/job$j.out" 2> "$WORK/job$j.err" &
  done
  fails=0
  for job in $(jobs -p); do wait "$job" || fails=$((fails + 1)); done
  cat "$WORK"/job*.err
  [ "$fails" -eq 0 ]
  [ "$(cat "$WORK"/job*.out | wc -l)" -eq 9 ]
  [ "$(cat "$WORK"/job*.out | sort -u)" = "$digest" ]
  for b in $blobs; do
    [ "$("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")" -eq 1 ]
  done
}
