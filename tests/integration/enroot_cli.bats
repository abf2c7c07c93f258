# fixtures: registry images slurm
# The `enroot` command (runtime/cli/enroot.cpp; docs/user.md, "The enroot command"): Enroot's verbs
# over Gantry's store and runtime, run as the job user the way scripts written for Enroot run them,
# and the seed guides' flow end to end: import-container.sh into a shared directory, `enroot list`,
# then the file as --container-image on the 3 nodes of the harness cluster.

load helpers

setup() {
  gantry_step_suite enroot-cli
  # The cluster's own build (22.05: the build tree; 24.11: the one made in its root, whose libraries
  # the login node has), and the login node's PATH: the caller's on 22.05, the root's own on 24.11 (the
  # caller's PATH there starts with slurm2411/bin, wrappers that only root on the host may run).
  RUNTIME=$(dirname "$GANTRY_TEST_GANTRY")
  ENROOT=$RUNTIME/enroot
  if [ -n "${GANTRY_SLURM_LOGIN_EXEC:-}" ]; then LOGIN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; else LOGIN_PATH=$PATH; fi
  mkdir -m 0700 "$WORK/xdg"  # the user's runtime directory, this test's alone (running containers)
  chown "$U" "$WORK/xdg"
  chmod 0755 "$WORK"
  # The harness's gantry.conf (its store, the registry allowed over HTTP) with a runtime_path of this
  # test's: other harness clusters on this host share /run/gantry, and `enroot list` shows what is there.
  { cat "$GANTRY_TEST_GANTRY_CONF"; echo "runtime_path = $WORK/run"; } >"$WORK/gantry.conf"
}

teardown() {
  [ -z "${KILL_PIDS:-}" ] || kill $KILL_PIDS 2>/dev/null || true
  [ -z "${KILL_JOB:-}" ] || scancel "$KILL_JOB" 2>/dev/null || true
  rm -rf "$WORK"
}

# as_user CMD...: CMD as the test user in WORK, with WORK's gantry.conf, the build tree's enroot first
# on PATH and created containers in WORK.
as_user() {
  gantry_as_user "$U" "$WORK" env GANTRY_CONFIG="${CONF:-$WORK/gantry.conf}" PATH="$RUNTIME:$LOGIN_PATH" \
    ENROOT_DATA_PATH="${DATA:-$WORK/data}" XDG_RUNTIME_DIR="$WORK/xdg" "$@"
}

@test "enroot is gantry under Enroot's name: version, usage, unknown command and option are one [ERROR] line, status 1" {
  [ "$(readlink "$ENROOT")" = gantry ]
  run as_user enroot version
  [ "$status" -eq 0 ]
  [[ "$output" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]
  run as_user enroot
  [ "$status" -eq 1 ]
  [[ "$output" == *"Usage: enroot COMMAND"* ]]
  run as_user enroot frobnicate
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] Unknown command: frobnicate" ]
  run as_user enroot import --bogus docker://x
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] Invalid option: --bogus" ]
  run as_user enroot import -o
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] Missing argument for option: -o" ]
  run as_user enroot import http://example.org/x
  [ "$status" -eq 1 ]
  [[ "$output" == "[ERROR] Invalid argument: http://example.org/x"* ]]
  run as_user enroot start no-such-container true
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] No such container: no-such-container" ]
  run as_user enroot bundle x.sqsh
  [ "$status" -eq 1 ]
  [[ "$output" == "[ERROR] Unsupported command: bundle"* ]]
  # gantry itself is unchanged by the name.
  run as_user gantry version
  [[ "$output" == "gantry "* ]]
}

@test "import docker://REGISTRY#IMAGE: Enroot's file name, an Enroot image (unsquashfs -l), never overwritten; stored images export at once" {
  as_user enroot import "docker://$TINY" 2>"$WORK/err1"
  cat "$WORK/err1"
  # Enroot's name: the image with / and : made +, in the working directory.
  f=$WORK/gantry-test+tiny.sqsh
  [ -f "$f" ]
  # An Enroot image, read by squashfs-tools: the image's tree plus /etc/environment and /etc/rc.
  unsquashfs -l "$f" >"$WORK/list"
  grep -qx 'squashfs-root/work/README' "$WORK/list"
  grep -qx 'squashfs-root/usr/local/bin/gantry-entrypoint' "$WORK/list"
  grep -qx 'squashfs-root/etc/environment' "$WORK/list"
  grep -qx 'squashfs-root/etc/rc' "$WORK/list"
  unsquashfs -cat "$f" etc/environment | grep -qx 'GANTRY_TINY=1'
  unsquashfs -cat "$f" etc/rc | grep -qx "cd '/work' || exit 1"
  # The image went into Gantry's store, where the plugin finds it too.
  as_user gantry images | grep -q "gantry-test/tiny"
  # An existing file is never replaced.
  ino=$(stat -c %i "$f")
  run as_user enroot import "docker://$TINY"
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] File already exists: gantry-test+tiny.sqsh" ]
  [ "$(stat -c %i "$f")" = "$ino" ]
  # A tagged image with a user name and -o: the user is accepted; the stored image is not converted
  # again, only exported.
  as_user enroot import -o "$WORK/again.sqsh" "docker://someone@$TINY:latest" 2>"$WORK/err2"
  cat "$WORK/err2"
  grep -q "^\[INFO\] The store has .*gantry-test/tiny:latest already" "$WORK/err2"
  ! grep -q "pulled\|converted" "$WORK/err2" || false
  cmp <(unsquashfs -l "$f" | sort) <(unsquashfs -l "$WORK/again.sqsh" | sort)
  # The default name keeps the tag: tiny:latest -> gantry-test+tiny+latest.sqsh.
  as_user enroot import "docker://$TINY:latest" 2>/dev/null
  [ -f "$WORK/gantry-test+tiny+latest.sqsh" ]
  # -a picks the architecture (the multi-arch test image has amd64 and arm64).
  as_user enroot import -a aarch64 -o "$WORK/arm.sqsh" "docker://$REG#gantry-test/multiarch" 2>/dev/null
  as_user enroot import -a x86_64 -o "$WORK/amd.sqsh" "docker://$REG#gantry-test/multiarch" 2>/dev/null
  ! cmp -s "$WORK/arm.sqsh" "$WORK/amd.sqsh" || false
  run as_user enroot import -a sparc -o "$WORK/sparc.sqsh" "docker://$TINY"
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] Unsupported architecture: sparc" ]
  [ ! -e "$WORK/sparc.sqsh" ]
  # A missing image: Pyxis's phrase, and no file.
  run as_user enroot import -o "$WORK/none.sqsh" "docker://$REG#gantry-test/no-such-image"
  [ "$status" -eq 1 ]
  [[ "$output" == *"failed to import docker image $REG#gantry-test/no-such-image"* ]]
  [ ! -e "$WORK/none.sqsh" ]
}

@test "import dockerd://IMAGE: the daemon's save, imported into the store and written as an Enroot image" {
  # A stand-in `docker` whose `save` writes the docker-archive skopeo makes of the test image (Docker
  # is not installed here); the import reads it from the pipe as it would read docker's own output.
  skopeo copy -q --src-tls-verify=false "docker://$GANTRY_TEST_REGISTRY_HTTP/gantry-test/tiny:latest" \
    "docker-archive:$WORK/saved.tar:gantry-test/tiny:latest"
  mkdir -p "$WORK/bin"
  cat >"$WORK/bin/docker" <<EOF
#!/bin/sh
[ "\$1" = save ] && [ "\$2" = gantry-test/tiny:latest ] || { echo "stand-in docker: unexpected \$*" >&2; exit 3; }
exec cat "$WORK/saved.tar"
EOF
  chmod 0755 "$WORK/bin/docker"
  chmod 0644 "$WORK/saved.tar"
  gantry_as_user "$U" "$WORK" env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" PATH="$WORK/bin:$RUNTIME:$LOGIN_PATH" \
    enroot import dockerd://gantry-test/tiny:latest
  unsquashfs -l "$WORK/gantry-test+tiny+latest.sqsh" | grep -qx 'squashfs-root/work/README'
}

@test "create, list, start (--rw, --root, --env, --mount, the image's command), export and remove" {
  as_user enroot import -o "$WORK/tiny.sqsh" "docker://$TINY" 2>/dev/null
  as_user enroot create tiny.sqsh
  as_user enroot create -n web "$WORK/tiny.sqsh"
  run as_user enroot create -n web "$WORK/tiny.sqsh"
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] Container already exists: web" ]
  [ "$(as_user enroot list)" = "$(printf 'tiny\nweb')" ]
  # Recorded in ENROOT_DATA_PATH, nothing unpacked.
  [ "$(ls "$WORK/data")" = "$(printf 'tiny.sqsh\nweb.sqsh')" ]
  # start NAME CMD: the container's tree, its environment, read-only unless --rw.
  [ "$(as_user enroot start web cat /work/README)" = "tiny work dir" ]
  [ "$(as_user enroot start web sh -c 'echo $GANTRY_TINY')" = 1 ]
  # Through the image's entrypoint, as Enroot's /etc/rc runs the command.
  [ "$(as_user enroot start web sh -c 'echo $GANTRY_ENTRYPOINT_RAN')" = 1 ]
  run as_user enroot start web touch /newfile
  [ "$status" -ne 0 ]
  as_user enroot start --rw web sh -c 'touch /newfile && ls /newfile'
  [ "$(as_user enroot start --root web id -u)" = 0 ]
  [ "$(as_user enroot start web id -u)" = "$(id -u "$U")" ]
  [ "$(as_user enroot start --env FOO=bar -e BAZ=qux web sh -c 'echo $FOO $BAZ')" = "bar qux" ]
  mkdir "$WORK/shared" && echo marker >"$WORK/shared/m" && chmod -R a+rX "$WORK/shared"
  [ "$(as_user enroot start --mount "$WORK/shared:/mnt/shared" web cat /mnt/shared/m)" = marker ]
  # ENROOT_ROOTFS_WRITABLE as Enroot reads it.
  as_user env ENROOT_ROOTFS_WRITABLE=yes enroot start web touch /other
  # No command: the image's own, read from its /etc/rc (the entrypoint, then the Cmd), in its
  # WorkingDir (the exported rc's `cd '/work' || exit 1`).
  [[ "$(as_user enroot start web)" == "tiny: hello from /work"* ]]
  # A file works as NAME|IMAGE; the command's exit status is start's.
  run as_user enroot start "$WORK/tiny.sqsh" sh -c 'exit 7'
  [ "$status" -eq 7 ]
  # export: the container's image as a file, Enroot's default name NAME.sqsh, never overwritten.
  as_user enroot export web
  cmp "$WORK/web.sqsh" "$WORK/tiny.sqsh"
  run as_user enroot export web
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] File already exists: web.sqsh" ]
  as_user enroot export -f -o "$WORK/web.sqsh" web
  # remove asks without -f; "n" keeps it.
  run as_user sh -c 'echo n | enroot remove web'
  [ "$status" -eq 0 ]
  [[ "$output" == *"Do you really want to delete web? [y/N]"* ]]
  [ "$(as_user enroot list)" = "$(printf 'tiny\nweb')" ]
  as_user sh -c 'echo y | enroot remove web' 2>/dev/null
  as_user enroot remove -f tiny
  [ -z "$(as_user enroot list)" ]
  run as_user enroot remove -f tiny
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] No such container: tiny" ]
  # The image file the container was made from is untouched.
  [ -f "$WORK/tiny.sqsh" ]
}

@test "enroot list -f shows a running start with its PID; enroot exec PID joins it; remove leaves it running" {
  as_user enroot import -o "$WORK/tiny.sqsh" "docker://$TINY" 2>/dev/null
  as_user enroot create -n svc tiny.sqsh
  as_user enroot start --rw svc sh -c 'echo inside >/tmp/mark; exec sleep 3017' &
  KILL_PIDS=$!
  for _ in $(seq 100); do as_user enroot list -f | grep -q '^svc  *[0-9]' && break; sleep 0.2; done
  as_user enroot list -f | tee "$WORK/table"
  head -n1 "$WORK/table" | grep -q '^NAME  *PID  *COMM  *STATE'
  pid=$(awk '$1 == "svc" {print $2}' "$WORK/table")
  [ -n "$pid" ]
  for _ in $(seq 50); do as_user enroot exec "$pid" test -e /tmp/mark && break; sleep 0.2; done
  # exec sees the running container's own files (its writable layer), not a fresh one.
  [ "$(as_user enroot exec "$pid" cat /tmp/mark)" = inside ]
  # A PID of a process inside (the sleep) finds the same container.
  inner=$(pgrep --ns "$pid" --nslist mnt -u "$U" -fx 'sleep 3017' | head -n1)
  [ -n "$inner" ]
  [ "$(as_user enroot exec "$inner" cat /tmp/mark)" = inside ]
  # A process of the user's in no container (its own shell).
  run as_user sh -c 'exec enroot exec $$ true'
  [ "$status" -eq 1 ]
  [[ "$output" == "[ERROR] Process "*" is in no container of yours"* ]]
  # list shows the name once; remove -f removes the record, the running one stays (and says so) until
  # its command ends.
  [ "$(as_user enroot list)" = svc ]
  as_user enroot remove -f svc
  [ "$(as_user enroot list)" = svc ]
  run as_user enroot remove -f svc
  [ "$status" -eq 1 ]
  [ "$output" = "[ERROR] Container svc is running (pid $pid): it ends when its command does" ]
  kill "$inner"
  for _ in $(seq 100); do kill -0 "$KILL_PIDS" 2>/dev/null || break; sleep 0.2; done
  ! kill -0 "$KILL_PIDS" 2>/dev/null || false
  [ -z "$(as_user enroot list)" ]
}

@test "enroot list shows a job's named container under Pyxis's name pyxis_JOBID_NAME while the job runs" {
  as_user sbatch -N1 --wrap "srun --container-image=$TINY --container-name=box sleep 120" -o "$WORK/job.out" >"$WORK/sb"
  job=$(awk '{print $NF}' "$WORK/sb")
  KILL_JOB=$job
  for _ in $(seq 150); do
    CONF=$GANTRY_TEST_GANTRY_CONF as_user srun --overlap --jobid="$job" "$ENROOT" list >"$WORK/list" 2>&1 || true
    grep -qx "pyxis_${job}_box" "$WORK/list" && break
    sleep 0.4
  done
  cat "$WORK/list"
  scancel "$job"
  grep -qx "pyxis_${job}_box" "$WORK/list"
}

@test "the seed guides' flow: import-container.sh (docker://REGISTRY#IMAGE), enroot list, then the file on 3 nodes" {
  mkdir -p "$WORK/fsx/containers/images"
  chown -R "$U" "$WORK/fsx"
  # The real helper, with its documented knobs: the output directory and the registry source. Run from
  # a copy in WORK, which the 24.11 login node (a root of its own) sees too.
  cp /work/shared/user-jobs/import-container.sh "$WORK/import-container.sh"
  as_user env OUT_DIR="$WORK/fsx/containers/images" IMPORT_SOURCE=docker \
    bash "$WORK/import-container.sh" "$TINY" x >"$WORK/out" 2>"$WORK/err" || { cat "$WORK/out" "$WORK/err"; false; }
  cat "$WORK/out"
  grep -qx "✓ Import completed!" "$WORK/out"
  [ -f "$WORK/fsx/containers/images/x.sqsh" ]
  [ "$(stat -c %a "$WORK/fsx/containers/images/x.sqsh")" = 644 ]
  unsquashfs -l "$WORK/fsx/containers/images/x.sqsh" | grep -qx 'squashfs-root/etc/rc'
  # The guide's srun line: the file, writable, the shared directory mounted, on 3 nodes.
  as_user srun -N3 --ntasks-per-node=1 --container-image="$WORK/fsx/containers/images/x.sqsh" --container-writable \
    --container-mounts="$WORK/fsx:$WORK/fsx" sh -c 'touch /written && cat /work/README && echo $GANTRY_TINY && ls '"$WORK"'/fsx/containers/images' \
    >"$WORK/srun.out"
  cat "$WORK/srun.out"
  [ "$(grep -cx 'tiny work dir' "$WORK/srun.out")" -eq 3 ]
  [ "$(grep -cx 1 "$WORK/srun.out")" -eq 3 ]
  [ "$(grep -cx x.sqsh "$WORK/srun.out")" -eq 3 ]
}
