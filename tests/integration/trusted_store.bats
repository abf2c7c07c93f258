# fixtures: registry images slurm
# A trusted shared store through the SPANK plugin (issue 4, docs/store.md "Trusted shared store"): the
# store belongs to a system account named by gantry.conf's store_owner, so the job user cannot write
# it; the plugin pulls into it as that account after the registry authorised the job user, and the
# kernel backend serves its images, one loop mount per image per node shared by concurrent steps.
# Steps run on the first node only: the kernel mounts live in that node's mount namespace, and
# teardown releases them there.

load helpers

OWNER=gantry-store
ATTACKER=gantry-attacker

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  U=$GANTRY_TEST_USER
  NODE=${GANTRY_TEST_NODES%% *}
  [ "$GANTRY_TEST_MODE" = multi ] || NODE=$(hostname -s)
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/trusted-test.XXXXXX")
  chown "$U" "$WORK"
  REG_PID=
  SERVER_PID=
  # A dedicated unprivileged system account owns the store, as an admin would set it up.
  id -u "$OWNER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$OWNER"
  # Below /var/lib: every ancestor is root-owned and not writable by others, which the kernel
  # backend's path check demands (a harness dir below /srv or /check need not be).
  TSTORE=/var/lib/gantry-test-store-$$
  rm -rf "$TSTORE"
  for d in "" images refs used locks staging; do install -d -o "$OWNER" -g "$OWNER" -m 0755 "$TSTORE/$d"; done
  write_conf "$REG"
}

teardown() {
  [ -z "$REG_PID" ] || { kill "$REG_PID" 2>/dev/null || true; }
  [ -z "${BLOCKER:-}" ] || scancel "$BLOCKER" 2>/dev/null || true
  [ -z "${JOB:-}" ] || scancel "$JOB" 2>/dev/null || true
  [ -z "$SERVER_PID" ] || { kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; }
  [ -z "${SOCKDIR:-}" ] || rm -rf "$SOCKDIR"
  [ -z "${ATTACK:-}" ] || rm -rf "$ATTACK"
  release_kernel_mounts
  # The node's remembered registry answers for this test's image (gantry.conf authorization_cache_seconds).
  [ -z "${digest:-}" ] || in_node sh -c "rm -f /run/gantry/authorized/*-${digest#sha256:}" || true
  rm -rf "$WORK" "$TSTORE"
}

# write_conf REGISTRY [LINE...]: the plugin's gantry.conf: the trusted store, its owner, REGISTRY as an
# insecure one, node-wide mounts released as soon as no container uses them.
write_conf() {
  local reg=$1
  shift
  { printf 'store_path = %s\nstore_owner = %s\ninsecure_registries = %s\nmount_idle_seconds = 0\n' "$TSTORE" "$OWNER" "$reg"
    for l in "$@"; do echo "$l"; done; } >"$GANTRY_HARNESS_DIR/gantry.conf"
}

# in_node CMD...: a command in the node's mount namespace (where its kernel image mounts are).
in_node() {
  if [ "$GANTRY_TEST_MODE" = multi ]; then "$BATS_TEST_DIRNAME/../harness/slurm.sh" exec "$NODE" -- "$@"; else "$@"; fi
}

# Whatever is left of this test's kernel mounts (a failed test): unmounted in the node, loops detached.
release_kernel_mounts() {
  local f
  for f in "$TSTORE"/images/*.sqsh; do
    [ -e "$f" ] || continue
    in_node sh -c 'grep -o " /run/gantry/images/[^ ]*" /proc/self/mountinfo | while read -r m; do umount -l "$m" 2>/dev/null; done' || true
    losetup -j "$f" | cut -d: -f1 | while read -r l; do losetup -d "$l" 2>/dev/null || true; done
  done
}

# loops_of_store: loop devices (machine-wide) backed by an image of the trusted store.
loops_of_store() {
  local f n=0
  for f in "$TSTORE"/images/*.sqsh; do
    [ -e "$f" ] || continue
    n=$((n + $(losetup -j "$f" | grep -c . || true)))
  done
  echo "$n"
}

# as_user CMD...: run as the test user from the shared directory, with a home of this test's own.
as_user() {
  # The test harness's own secrets are not part of the job's environment (the job exports everything
  # it has into the container, as Pyxis does).
  runuser -u "$U" -- env -u GANTRY_TEST_REGISTRY_PASSWORD -C "$WORK" HOME="$WORK/home" "$@"
}

# node_registry: the test's own TLS registry the nodes reach (gantry_node_tls_registry; TREG, REG_PID).
node_registry() {
  gantry_node_tls_registry "$WORK/registry" gantry-trusted || return 1
  write_conf "$REG" "ca_bundle = $GANTRY_TEST_REGISTRY_CA"
}

# docker_config PASSWORD: the test user's ~/.docker/config.json for TREG with that password.
docker_config() {
  mkdir -p "$WORK/home/.docker"
  printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$TREG" \
    "$(printf '%s:%s' "$GANTRY_TEST_REGISTRY_USER" "$1" | base64 -w0)" >"$WORK/home/.docker/config.json"
  chmod 600 "$WORK/home/.docker/config.json"
  chown -R "$U" "$WORK/home"
}

# start_stage_server [OPTION...]: the login node's stage server (gantry stage-server, docs/admin.md
# "Staging into a trusted store") as the store account, never root, on a socket in a directory of the
# account's in this harness's own dir (never a host service); gantry.conf names the socket (written
# before the server reads it). SOCK, SOCKDIR, SERVER_PID; its log in $WORK/server.log.
start_stage_server() {
  SOCKDIR="$GANTRY_HARNESS_DIR/stage-$$"
  SOCK="$SOCKDIR/stage.sock"
  rm -rf "$SOCKDIR"
  install -d -o "$OWNER" -g "$OWNER" -m 0755 "$SOCKDIR"
  write_conf "$REG" "stage_socket = $SOCK" "${STAGE_CONF[@]}"
  # setpriv execs the server itself (SERVER_PID is the server); fd 3 closed: bats waits for its holders.
  setpriv --reuid "$OWNER" --regid "$OWNER" --init-groups env -i PATH=/usr/bin:/bin HOME=/ \
    GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY_TEST_GANTRY" stage-server --socket "$SOCK" "$@" \
    >"$WORK/server.log" 2>&1 3>&- &
  SERVER_PID=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
  cat "$WORK/server.log"
  [ -S "$SOCK" ]
  [ "$(stat -c '%U %a' "$SOCK")" = "$OWNER 666" ]
  [ "$(ps -o uid= -p "$SERVER_PID" | tr -d " ")" = "$(id -u "$OWNER")" ]
}

# stored_record DIGEST: the trusted store's record of DIGEST, when it is there.
stored_record() {
  [ -f "$TSTORE/images/${1#sha256:}.json" ]
}

@test "srun into a trusted store (whole images, layered_images = no): pulled as the store account, kernel-mounted, one loop mount shared by concurrent steps" {
  write_conf "$REG" "layered_images = no"
  # The job user cannot write the store: the old behaviour (pull as the user) could not fill it.
  ! runuser -u "$U" -- touch "$TSTORE/images/probe" 2>/dev/null || false
  run as_user timeout 180 srun -w "$NODE" -N1 -n1 --container-image="$REG#gantry-test/tiny" \
    sh -c 'cat /work/README; awk '\''$5 == "/bin" { for (i = 7; $i != "-"; i++); print $(i + 1) }'\'' /proc/self/mountinfo'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
  # /bin (a top-level image directory, bound into the container's tmpfs skeleton root; not /work, which
  # gains an overlay when the checkout lies below /work) is the kernel's
  # squashfs (a loop mount), not squashfuse.
  echo "$output" | grep -qx squashfs
  ! echo "$output" | grep -q "fuse" || false
  # The image was written by the store account, read-only, in the store's images/.
  sqsh=$(ls "$TSTORE"/images/*.sqsh)
  [ "$(echo "$sqsh" | wc -l)" -eq 1 ]
  [ "$(stat -c %U "$sqsh")" = "$OWNER" ]
  [ "$(stat -c %a "$sqsh")" = 444 ]
  [ "$(stat -c %U "$TSTORE/images/$(basename "$sqsh" .sqsh).json")" = "$OWNER" ]

  # Two steps at once on one node: both see the image on the same squashfs mount (same device), and the
  # machine has exactly one loop device backed by the image while they run.
  as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$REG#gantry-test/tiny" \
    sh -c 'awk '\''$5 == "/bin" { print $3 }'\'' /proc/self/mountinfo; sleep 6' >"$WORK/dev1" &
  p1=$!
  as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$REG#gantry-test/tiny" \
    sh -c 'awk '\''$5 == "/bin" { print $3 }'\'' /proc/self/mountinfo; sleep 6' >"$WORK/dev2" &
  p2=$!
  for i in $(seq 100); do [ -s "$WORK/dev1" ] && [ -s "$WORK/dev2" ] && break; sleep 0.1; done
  loops_while_running=$(loops_of_store)
  wait "$p1"
  wait "$p2"
  cat "$WORK/dev1" "$WORK/dev2"
  [ -s "$WORK/dev1" ]
  [ "$(cat "$WORK/dev1")" = "$(cat "$WORK/dev2")" ]
  echo "loop devices while both ran: $loops_while_running"
  [ "$loops_while_running" -eq 1 ]
  # Still one image, not pulled again; with mount_idle_seconds = 0 the mount went with the last step.
  [ "$(ls "$TSTORE"/images/*.sqsh | wc -l)" -eq 1 ]
  # slurmstepd stops the holders after srun returned; on a loaded machine that takes seconds.
  for i in $(seq 200); do [ "$(loops_of_store)" -eq 0 ] && break; sleep 0.1; done
  [ "$(loops_of_store)" -eq 0 ]
}

@test "the default gantry.conf (layered_images = yes): srun pulls the image as layers into the trusted store, and the kernel backend stacks them" {
  run as_user timeout 180 srun -w "$NODE" -N1 -n2 --container-image="$REG#gantry-test/tiny" \
    sh -c 'cat /work/README; awk '\''$5 == "/bin" { for (i = 7; $i != "-"; i++); print $(i + 1) }'\'' /proc/self/mountinfo'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx "tiny work dir")" -eq 2 ]
  # /bin comes from the overlayfs stack of the layers (whole images: squashfs, above).
  echo "$output" | grep -qx overlay
  hex=${GANTRY_TEST_DIGEST_TINY#sha256:}
  # The image is a record and its layers, written by the store account; no whole squashfs.
  [ ! -e "$TSTORE/images/$hex.sqsh" ]
  [ "$(stat -c %U "$TSTORE/images/$hex.json")" = "$OWNER" ]
  layers=$(ls "$TSTORE"/images/layer-*.sqsh)
  [ -n "$layers" ]
  for l in $layers; do [ "$(stat -c %U:%a "$l")" = "$OWNER:444" ]; done
  # With mount_idle_seconds = 0 every layer's loop mount went with the step.
  for i in $(seq 200); do [ "$(loops_of_store)" -eq 0 ] && break; sleep 0.1; done
  [ "$(loops_of_store)" -eq 0 ]
}

@test "trusted store and a private registry: the job user's credentials authorise the pull; others are refused although the image is stored" {
  node_registry
  PASSWORD=$GANTRY_TEST_REGISTRY_PASSWORD
  # 1. No credentials: refused before anything is pulled.
  mkdir -p "$WORK/home" && chown "$U" "$WORK/home"
  run as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" true
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "no credentials found for $TREG"
  [ -z "$(ls "$TSTORE/images/")" ]

  # 2. The user's own valid credentials: the store account pulls with them (it has none of its own).
  docker_config "$PASSWORD"
  run as_user timeout 180 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" sh -c 'cat /work/README; env'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
  # The image's record (and its files, whole or layers) written by the store account.
  rec=$(ls "$TSTORE"/images/*.json | grep -v '/layer-')
  [ "$(echo "$rec" | wc -l)" -eq 1 ]
  [ "$(stat -c %U "$rec")" = "$OWNER" ]
  for f in "$TSTORE"/images/*.sqsh; do [ "$(stat -c %U "$f")" = "$OWNER" ]; done
  # The blobs came from the registry with authentication (the store account's pull, with the user's credentials).
  grep -q 'GET /v2/gantry-test/tiny/blobs/.*" 200 ' "$WORK/registry/registry.log" ||
    grep -q 'uri=/v2/gantry-test/tiny/blobs/' "$WORK/registry/registry.log"
  ! echo "$output" | grep -qF "${PASSWORD:0:40}" || false

  # 3. Wrong credentials: refused by the registry although the image is in the trusted store.
  docker_config "wrong-$RANDOM-password"
  run as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "authentication to $TREG failed"
  ! echo "$output" | grep -qx "tiny work dir" || false

  # 4. Forged answers from the user's own side: an LD_PRELOAD in the job's environment makes the user's
  #    half of the pull print the stored image's digest and hand over no credentials. The registry, asked
  #    by the store account's half, still refuses: the user's side decides nothing but the credentials.
  rm -f "$WORK/home/.docker/config.json"
  digest=sha256:$(basename "$rec" .json)
  # Only in gantry itself (srun runs with the same environment).
  printf '%s\n' '#define _GNU_SOURCE' '#include <errno.h>' '#include <stdio.h>' '#include <stdlib.h>' '#include <string.h>' \
    '#include <unistd.h>' '__attribute__((constructor)) static void forge(void) {' \
    '  const char* d = getenv("FORGED_DIGEST"); if (!d || strcmp(program_invocation_short_name, "gantry") != 0) return;' \
    '  (void)!write(3, "{}", 2); printf("%s %s\n", d, getenv("FORGED_PATH")); fflush(stdout); _exit(0); }' \
    >"$WORK/forge.c"
  gcc -shared -fPIC -o "$WORK/forge.so" "$WORK/forge.c"
  chmod 0755 "$WORK/forge.so"
  run as_user timeout 120 env LD_PRELOAD="$WORK/forge.so" FORGED_DIGEST="$digest" FORGED_PATH="$rec" \
    srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "no credentials found for $TREG"
  ! echo "$output" | grep -qx "tiny work dir" || false

  # The secret is in no log of the node and nowhere under the store (argv and environment never held
  # it: the plugin hands it over on a pipe, which the slurmd log would show if it were on a command line).
  log=${GANTRY_SLURMD_LOG_PATTERN//%n/$NODE}
  [ -f "$log" ]
  ! grep -rqF "${PASSWORD:0:40}" "$log" "$TSTORE" || false
}

@test "private_images: the store's files are owner-only, and a step with a bind mount runs from them (no image descriptor reaches the user's check helper)" {
  node_registry
  write_conf "$REG" "ca_bundle = $GANTRY_TEST_REGISTRY_CA" "private_images = yes"
  docker_config "$GANTRY_TEST_REGISTRY_PASSWORD"
  mkdir -p "$WORK/data" && echo "bound" >"$WORK/data/probe" && chown -R "$U" "$WORK/data"
  # Cold, then warm, each with a bind source (the user's check helper runs for it).
  for pass in cold warm; do
    run as_user timeout 180 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" \
      --container-mounts="$WORK/data:/data" sh -c 'cat /work/README /data/probe'
    echo "$pass: $output"
    [ "$status" -eq 0 ]
    echo "$output" | grep -qx "tiny work dir"
    echo "$output" | grep -qx "bound"
  done
  # Every image file is the store account's, 0400: the user cannot read it on the host.
  for f in "$TSTORE"/images/*.sqsh; do
    [ "$(stat -c '%U %a' "$f")" = "$OWNER 400" ]
    ! runuser -u "$U" -- head -c4 "$f" >/dev/null 2>&1 || false
  done
}

# manifests_granted: manifest requests (by tag or digest) the test's own registry answered with 200.
manifests_granted() {
  grep -cE '"(GET|HEAD) /v2/gantry-test/tiny/manifests/[^ "]+ HTTP/[0-9.]+" 200 ' "$WORK/registry/registry.log" || true
}

@test "trusted store: srun's digest and the node's remembered yes spare the registry; a forged digest gets nothing and skips nothing" {
  node_registry
  write_conf "$REG" "ca_bundle = $GANTRY_TEST_REGISTRY_CA" "authorization_cache_seconds = 3600"
  docker_config "$GANTRY_TEST_REGISTRY_PASSWORD"
  run as_user timeout 180 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
  digest=sha256:$(basename "$(ls "$TSTORE"/images/*.json | grep -v '/layer-')" .json)
  # Warm: srun resolved the tag once with the user's credentials; the node had the registry's yes for
  # this user and digest already, so nobody else asked.
  sleep 1
  before=$(manifests_granted)
  run as_user timeout 180 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
  sleep 1
  echo "manifest requests granted: $(($(manifests_granted) - before))"
  [ "$(($(manifests_granted) - before))" -eq 1 ]

  # Another user, without credentials, hands the nodes the stored digest themselves: srun's own half
  # is theirs, so an LD_PRELOAD keeps it from clearing GANTRY_RESOLVED_IMAGE. The node treats it as
  # that user's IMAGE@DIGEST: the registry's yes was for the first user, so it asks, and refuses.
  GANTRY_TEST_USER=$ATTACKER GANTRY_TEST_UID=4243 "$BATS_TEST_DIRNAME/../harness/user.sh" >/dev/null
  chmod 0755 "$WORK"
  printf '%s\n' '#define _GNU_SOURCE' '#include <dlfcn.h>' '#include <string.h>' \
    'int unsetenv(const char* n) { if (strcmp(n, "GANTRY_RESOLVED_IMAGE") == 0) return 0;' \
    '  int (*real)(const char*) = (int (*)(const char*))dlsym(RTLD_NEXT, "unsetenv"); return real(n); }' >"$WORK/keep.c"
  gcc -shared -fPIC -o "$WORK/keep.so" "$WORK/keep.c" -ldl
  chmod 0755 "$WORK/keep.so"
  mkdir -p "$WORK/ahome" && chown "$ATTACKER" "$WORK/ahome"
  run runuser -u "$ATTACKER" -- env -u GANTRY_TEST_REGISTRY_PASSWORD -C "$WORK" HOME="$WORK/ahome" LD_PRELOAD="$WORK/keep.so" \
    GANTRY_RESOLVED_IMAGE="$TREG#gantry-test/tiny@$digest" \
    timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "no credentials found for $TREG"
  ! echo "$output" | grep -qx "tiny work dir" || false

  # The first user's yes is remembered for authorization_cache_seconds: within it, their own pinned
  # digest runs with credentials gone bad; with 0, the registry is asked and refuses.
  docker_config "wrong-$RANDOM-password"
  run as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny@$digest" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
  write_conf "$REG" "ca_bundle = $GANTRY_TEST_REGISTRY_CA" "authorization_cache_seconds = 0"
  run as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$TREG#gantry-test/tiny@$digest" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "authentication to $TREG failed"
  ! echo "$output" | grep -qx "tiny work dir" || false
}

@test "without store_owner the store owned by another account is not trusted: the plugin pulls as the user, who cannot write it" {
  write_conf "$REG"
  sed -i '/^store_owner/d' "$GANTRY_HARNESS_DIR/gantry.conf"
  run as_user timeout 120 srun -w "$NODE" -N1 -n1 --container-image="$REG#gantry-test/tiny" true
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  [ -z "$(ls "$TSTORE/images/")" ]
  # Nodes end idle.
  for i in $(seq 50); do [ -z "$(sinfo -h -o '%t' | grep -v '^idle$')" ] && break; sleep 0.2; done
  sinfo -h -o '%t'
  [ -z "$(sinfo -h -o '%t' | grep -v '^idle$')" ]
}

@test "stage server: sbatch with a cold image, held behind a job that holds every node, finds it in the trusted store before it starts; its step fetches no blob" {
  STAGE_CONF=()
  start_stage_server
  name="tstaged-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  nblobs=$(gantry_blob_digests "$name" | wc -l)
  gets=$(gantry_blob_gets "$name")
  ! stored_record "$digest" || false
  # The submitting user cannot write the store: only the server (the store account) can fill it.
  ! runuser -u "$U" -- touch "$TSTORE/images/probe" 2>/dev/null || false
  gantry_hold_every_node
  cat > "$WORK/job.sh" <<JOB
#!/bin/sh
#SBATCH --container-image=$REG/gantry-test/$name
#SBATCH -N1
#SBATCH -w $NODE
echo "ran \$GANTRY_CONTAINER_IMAGE_DIGEST \$(cut -d' ' -f1 /unique/id)"
JOB
  chown "$U" "$WORK/job.sh"
  JOB=$(as_user sbatch --parsable -o "$WORK/job.out" "$WORK/job.sh")
  [ -n "$JOB" ]
  # The server stores the image while the job is pending: complete, the store account's, read-only.
  for ((i = 0; i < 600; i++)); do stored_record "$digest" && break; sleep 0.2; done
  cat "$WORK/server.log"
  stored_record "$digest"
  [ "$(squeue -h -j "$JOB" -o %T)" = PENDING ]
  [ "$(stat -c %U "$TSTORE/images/${digest#sha256:}.json")" = "$OWNER" ]
  sleep 1   # the registry logs a request after answering it
  echo "blob GETs at submit: $(($(gantry_blob_gets "$name") - gets)) for $nblobs blobs"
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
  scancel "$BLOCKER"
  for ((i = 0; i < 900; i++)); do [ -z "$(squeue -h -j "$JOB")" ] && break; sleep 0.2; done
  cat "$WORK/job.out"
  grep -qx "ran $digest $name" "$WORK/job.out"
  sleep 1
  # The job's step found it stored: not one blob more.
  [ "$(($(gantry_blob_gets "$name") - gets))" -eq "$nblobs" ]
  # The server's log names the submitting user by the uid the kernel gave it, and the digest pulled.
  cat "$WORK/server.log"
  grep -q "stage-server: uid $(id -u "$U") (pid [0-9]*): $REG/gantry-test/$name@$digest: ok $digest" "$WORK/server.log"
}

@test "stage server as an attacker sees it: silent, oversized and forged requests stall nobody, the registry's no holds, the store gains only complete images" {
  STAGE_CONF=("ca_bundle = $GANTRY_TEST_REGISTRY_CA")
  # A read deadline longer than the victim's whole wait: a server that served one client at a time
  # could not answer the victim while the attacker's silent connections are open.
  start_stage_server --read-timeout 300 --max-per-user 3
  name="tattack-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  tiny=$(curl -fsS -o /dev/null -w '%header{docker-content-digest}' -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
    "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/tiny/manifests/latest")
  # The attacker's own directory ($WORK is the test user's, 0700).
  ATTACK=$(mktemp -d "$GANTRY_TEST_FSX/stage-attack.XXXXXX")
  cp "$BATS_TEST_DIRNAME/stage_attacker.py" "$ATTACK/attack.py"
  chown -R "$ATTACKER" "$ATTACK"
  runuser -u "$ATTACKER" -- python3 "$ATTACK/attack.py" "$SOCK" "$ATTACK" \
    "$REG/gantry-test/tiny@sha256:$(printf '0%.0s' $(seq 64))" \
    "$GANTRY_TEST_REGISTRY_TLS/gantry-test/tiny@$tiny" "$GANTRY_TEST_REGISTRY_TLS" 3 3>&- &
  attacker=$!
  for _ in $(seq 600); do [ -s "$ATTACK/holding" ] && break; sleep 0.1; done
  for f in huge forged refused holding over; do echo "$f: $(cat "$ATTACK/$f" 2>/dev/null)"; done
  [ -s "$ATTACK/holding" ]
  # A line over the limit: one error line, the connection closed.
  grep -q '^error reading the request: longer than 65536 bytes$' "$ATTACK/huge"
  # A forged uid is not who the server thinks asked: the log has the attacker's uid, never 0.
  grep -q '^error ' "$ATTACK/forged"
  grep -q "stage-server: uid $(id -u "$ATTACKER") (pid [0-9]*): $REG/gantry-test/tiny@sha256:0000" "$WORK/server.log"
  ! grep -q "stage-server: uid 0 " "$WORK/server.log" || false
  # A private image with credentials the registry refuses: the registry's answer, and nothing stored.
  grep -q '^error .*: authentication to .* failed' "$ATTACK/refused"
  ! stored_record "$tiny" || false
  # The attacker holds as many silent connections as one uid may: one more is refused at once.
  grep -q '^error the stage server is busy (too many requests of yours at once)' "$ATTACK/over"

  # Meanwhile another user's request is read, pulled as the store account and answered.
  run as_user timeout 120 env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY_TEST_GANTRY" stage "$REG/gantry-test/$name"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "$digest" ]
  stored_record "$digest"
  # ... while the attacker's silent connections were still open (the server had not given up on them).
  touch "$ATTACK/release"
  wait "$attacker"
  cat "$ATTACK/held"
  [ "$(cat "$ATTACK/held")" -eq 3 ]
  cat "$WORK/server.log"
  # images/ holds only published entries (record, layers), every one the store account's and
  # writable by nobody else: the pulls write in staging/ and rename into images/.
  ls -la "$TSTORE/images"
  for f in "$TSTORE"/images/*; do
    basename "$f" | grep -Eq '^(layer-)?[0-9a-f]{64}\.(json|sqsh)$'
    [ "$(stat -c %U "$f")" = "$OWNER" ]
    [ "$(( 0$(stat -c %a "$f") & 022 ))" -eq 0 ]
  done
  [ "$(ls "$TSTORE/images" | grep -c '\.json$')" -ge 2 ]
}

# refuses_to_serve [AS-ACCOUNT] SOCKET MESSAGE: `gantry stage-server --socket SOCKET`, as root or (with
# an account) as that account, exits 1 with MESSAGE at the start of its line and makes no socket.
refuses_to_serve() {
  local as=()
  [ $# -eq 3 ] && { as=(setpriv --reuid "$1" --regid "$1" --init-groups); shift; }
  run "${as[@]}" env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY_TEST_GANTRY" stage-server --socket "$1"
  echo "$output"
  [ "$status" -eq 1 ]
  echo "$output" | grep -q "^gantry: stage-server: $2"
  [ ! -e "$1" ]
}

@test "stage-server refuses root, an account other than store_owner, and a missing store_owner" {
  refuses_to_serve "$WORK/s.sock" "runs as the store account (gantry.conf store_owner), never as root"
  refuses_to_serve "$ATTACKER" "$WORK/s.sock" "runs as store_owner '$OWNER', not as '$ATTACKER'"
  # Without store_owner there is no trusted store for it to fill.
  sed -i '/^store_owner/d' "$GANTRY_HARNESS_DIR/gantry.conf"
  refuses_to_serve "$OWNER" "$GANTRY_HARNESS_DIR/no-owner.sock" "gantry.conf sets no store_path and store_owner"
}

@test "stage server under socket activation (as the packaged gantry-stage.socket starts it) serves the socket it was handed" {
  command -v systemd-socket-activate >/dev/null || skip "systemd-socket-activate (systemd) is not installed"
  SOCKDIR="$GANTRY_HARNESS_DIR/stage-$$"
  SOCK="$SOCKDIR/stage.sock"
  rm -rf "$SOCKDIR"
  install -d -o "$OWNER" -g "$OWNER" -m 0755 "$SOCKDIR"
  write_conf "$REG" "stage_socket = $SOCK"
  # systemd's stand-in: it listens, and on the first connection execs the server (as the account) with
  # the socket as descriptor 3 (LISTEN_FDS); the server is given no --socket.
  # (env without -i: LISTEN_PID and LISTEN_FDS must reach it.)
  systemd-socket-activate -l "$SOCK" setpriv --reuid "$OWNER" --regid "$OWNER" --init-groups \
    env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY_TEST_GANTRY" stage-server \
    >"$WORK/server.log" 2>&1 3>&- &
  SERVER_PID=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
  [ -S "$SOCK" ]
  chmod 0666 "$SOCK"   # the unit's SocketMode
  name="tactivated-$RANDOM$RANDOM"
  digest=$(gantry_fresh_image "$WORK" "$name")
  run as_user timeout 120 env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$GANTRY_TEST_GANTRY" stage "$REG/gantry-test/$name"
  echo "$output"
  cat "$WORK/server.log"
  [ "$status" -eq 0 ]
  [ "$output" = "$digest" ]
  stored_record "$digest"
  [ "$(stat -c %U "$TSTORE/images/${digest#sha256:}.json")" = "$OWNER" ]
  [ "$(ps -o uid= -p "$SERVER_PID" | tr -d ' ')" = "$(id -u "$OWNER")" ]
}
