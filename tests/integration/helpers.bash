# Shared bats helpers for integration tests that use the registry harness and the test images:
# load the env files that tests/harness/registry.sh and tests/images/build.sh write, and fetch
# manifests and blobs the way a registry client must (full Accept list, TLS through the test CA).
# Use: `load helpers` then `gantry_load_env registry images` in setup(). A missing env file fails
# the test with the command to run; nothing is skipped silently.

GANTRY_HARNESS_DIR=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}

# Same list as tests/harness/lib.sh: registry 2.8 hides OCI manifests from clients that omit them.
GANTRY_MANIFEST_ACCEPT="application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json"

# gantry_load_env registry|images...: source $GANTRY_HARNESS_DIR/<name>.env for each name.
# `slurm` is the cluster a suite runs on: the 22.05 harness (slurm.env), or with GANTRY_TEST_SLURM=24.11
# or 26.05 (CTest's integration.<suite>@24.11, @26.05) that release's (slurm2411.env, slurm2605.env,
# tests/harness/slurmroot.sh), which exports the same GANTRY_TEST_*
# names, GANTRY_SLURM_LOGIN_EXEC for gantry_as_user, and a PATH whose Slurm commands reach its cluster.
gantry_load_env() {
  local what file hint
  for what in "$@"; do
    file=$GANTRY_HARNESS_DIR/$what.env
    case $what in
      registry) hint="tests/harness/registry.sh start" ;;
      images) hint="tests/images/build.sh" ;;
      slurm)
        hint="tests/harness/slurm.sh start"
        case ${GANTRY_TEST_SLURM:-22.05} in
          22.05) ;;
          24.11 | 26.05)
            file=$GANTRY_HARNESS_DIR/slurm${GANTRY_TEST_SLURM/./}.env
            hint="tests/harness/slurm${GANTRY_TEST_SLURM/./}.sh start" ;;
          *) echo "GANTRY_TEST_SLURM=$GANTRY_TEST_SLURM: the harness has Slurm 22.05, 24.11 and 26.05" >&2; return 1 ;;
        esac ;;
      slurm2411 | slurm2605) hint="tests/harness/$what.sh start" ;;
      *) hint="the harness script that writes it" ;;
    esac
    if [ ! -r "$file" ]; then
      echo "missing $file (GANTRY_HARNESS_DIR=$GANTRY_HARNESS_DIR): run $hint first" >&2
      return 1
    fi
    # shellcheck disable=SC1090
    . "$file"
    if [ "$what" = slurm ]; then
      # The 22.05 cluster's plugin reads the gantry.conf CTest names in GANTRY_PLUGSTACK_ARGS; its
      # login node is the host, where the build tree's CLI runs (slurm2411.env and slurm2605.env set both).
      : "${GANTRY_TEST_GANTRY_CONF:=$GANTRY_HARNESS_DIR/gantry.conf}" "${GANTRY_TEST_GANTRY:=$GANTRY_BUILD_DIR/runtime/gantry}"
      export GANTRY_TEST_GANTRY_CONF GANTRY_TEST_GANTRY
    fi
  done
}

# gantry_registry_url http|tls: base URL of one harness registry.
gantry_registry_url() {
  case $1 in
    http) echo "http://$GANTRY_TEST_REGISTRY_HTTP" ;;
    tls) echo "https://$GANTRY_TEST_REGISTRY_TLS" ;;
    *) echo "gantry_registry_url: unknown registry '$1'" >&2; return 1 ;;
  esac
}

# gantry_curl http|tls [CURL ARGS...]: curl against one registry, with the test CA and credentials
# for the TLS one. Paths are relative to the registry root, e.g. /v2/.
gantry_curl() {
  local kind=$1 path=$2 base
  shift 2
  base=$(gantry_registry_url "$kind") || return 1
  if [ "$kind" = tls ]; then
    curl -sS --cacert "$GANTRY_TEST_REGISTRY_CA" \
      -u "$GANTRY_TEST_REGISTRY_USER:$GANTRY_TEST_REGISTRY_PASSWORD" "$@" "$base$path"
  else
    curl -sS "$@" "$base$path"
  fi
}

# gantry_fetch_manifest http|tls REPO REF: GET the manifest with the full Accept list into
# $BATS_TEST_TMPDIR/manifest.body and .headers (header names lower-cased, CRs removed); prints the
# HTTP status code.
gantry_fetch_manifest() {
  local kind=$1 repo=$2 ref=$3 dir=${BATS_TEST_TMPDIR:-/tmp} code
  code=$(gantry_curl "$kind" "/v2/$repo/manifests/$ref" -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
    -D "$dir/manifest.rawheaders" -o "$dir/manifest.body" -w '%{http_code}') || return 1
  tr -d '\r' <"$dir/manifest.rawheaders" | awk -F': ' 'NF > 1 { $1 = tolower($1) } 1' OFS=': ' \
    >"$dir/manifest.headers"
  echo "$code"
}

# gantry_header NAME: value of a header of the last gantry_fetch_manifest (NAME in lower case).
gantry_header() {
  sed -n "s/^$1: //p" "${BATS_TEST_TMPDIR:-/tmp}/manifest.headers" | tail -1
}

# gantry_sha256 FILE: "sha256:<hex>" of a file.
gantry_sha256() {
  echo "sha256:$(sha256sum "$1" | cut -d' ' -f1)"
}

# gantry_layer_chain RECORD: the lower files an image record (images/<hex>.json of an image stored as
# layers) names, by key, bottom first, one per line: each a layer, or a group of layers of a deep
# image (images/layer-<key hex>.sqsh; docs/store.md "Deep images"). Nothing for a whole image's.
gantry_layer_chain() {
  python3 -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1])).get("layer_chain", [])))' "$1"
}

# gantry_image_stored STORE DIGEST: the store holds the image complete, in either form: its whole
# squashfs (images/<hex>.sqsh), or its record as an image stored as layers (gantry.conf's
# layered_images) and the file of every lower it names (gantry_layer_chain).
gantry_image_stored() {
  local images=$1/images hex=${2#sha256:} chain n=0
  [ -f "$images/$hex.sqsh" ] && return 0
  [ -f "$images/$hex.json" ] || return 1
  while read -r chain; do
    [ -n "$chain" ] || continue
    [ -f "$images/layer-${chain#sha256:}.sqsh" ] || return 1
    n=$((n + 1))
  done < <(gantry_layer_chain "$images/$hex.json")
  [ "$n" -gt 0 ]
}

# gantry_image_tree PATH DIR: a stored image's tree at DIR, from the path `gantry pull` or `gantry
# import` printed: a whole squashfs is unpacked there (unsquashfs); for an image record (an image
# stored as layers) each layer is loop-mounted read-only and overlayfs stacks them at DIR (userxattr,
# as Gantry's backends do), the mounts appended to GANTRY_MOUNTS (gantry_unmount_all undoes them).
# Root only; DIR must hold no ':' or ','.
gantry_image_tree() {
  local path=$1 dir=$2 chain lowers="" m n=0
  if [[ $path == *.sqsh ]]; then
    unsquashfs -q -n -d "$dir" "$path" >/dev/null
    return
  fi
  mkdir -p "$dir" "$dir.empty"
  while read -r chain; do
    m=$dir.layer$n
    mkdir -p "$m"
    mount -t squashfs -o loop,ro "${path%/*}/layer-${chain#sha256:}.sqsh" "$m"
    GANTRY_MOUNTS+=("$m")
    lowers="$m${lowers:+:$lowers}"
    n=$((n + 1))
  done < <(gantry_layer_chain "$path")
  mount -t overlay overlay -o "ro,userxattr,lowerdir=$lowers:$dir.empty" "$dir"
  GANTRY_MOUNTS+=("$dir")
}

# gantry_unmount_all [FIRST]: unmounts what gantry_image_tree mounted (from entry FIRST of
# GANTRY_MOUNTS on, default all), the stacks before their layers.
gantry_unmount_all() {
  local first=${1:-0} i
  for ((i = ${#GANTRY_MOUNTS[@]} - 1; i >= first; i--)); do
    mountpoint -q "${GANTRY_MOUNTS[$i]}" && umount "${GANTRY_MOUNTS[$i]}"
  done
  GANTRY_MOUNTS=("${GANTRY_MOUNTS[@]:0:first}")
}

# gantry_fresh_image WORKDIR NAME [PAYLOAD_BYTES]: pushes gantry-test/NAME to the open registry: tiny
# plus one layer with a unique file (and optionally that many random bytes), so its digest is new and
# no store has it yet. Prints the manifest digest.
gantry_fresh_image() {
  local work=$1 name=$2 bytes=${3:-} layout=$1/layout-$2 reg=$GANTRY_TEST_REGISTRY_HTTP
  cp -a "$GANTRY_TEST_OCI_TINY" "$layout"
  mkdir -p "$work/uniq-$name/unique"
  echo "$name $RANDOM $(date +%s%N)" > "$work/uniq-$name/unique/id"
  if [ -n "$bytes" ]; then head -c "$bytes" /dev/urandom > "$work/uniq-$name/unique/payload"; fi
  tar -C "$work/uniq-$name" -cf "$work/uniq-$name.tar" unique
  python3 "$GANTRY_SOURCE_DIR/tests/images/oci.py" add-layer "$layout" latest "$work/uniq-$name.tar" --compress gzip >/dev/null
  skopeo copy -q --dest-tls-verify=false "oci:$layout:latest" "docker://$reg/gantry-test/$name:latest"
  curl -fsS -o /dev/null -w '%header{docker-content-digest}' -H "Accept: $GANTRY_MANIFEST_ACCEPT" \
    "http://$reg/v2/gantry-test/$name/manifests/latest"
}

# gantry_producer_takeover WORKDIR STORE NAME DIGEST [PULL_ARGS...]: one producer per digest, and a
# dead producer is taken over. A pull of gantry-test/NAME goes through a front whose blob GETs fail
# with 500 and Retry-After: 30, so it holds DIGEST's producer lock while it backs off; a second pull
# straight from the registry (same PULL_ARGS) must wait for it ("waiting for" on its stderr), and,
# once the producer is killed with SIGKILL and nobody cleans up, take over and print DIGEST. The
# front's and the producer's pids go to KILL_PIDS (the caller's teardown kills them).
gantry_producer_takeover() {
  local work=$1 store=$2 name=$3 digest=$4 front producer taker
  shift 4
  python3 "$GANTRY_SOURCE_DIR/tests/integration/fake_upstream.py" --upstream "$GANTRY_TEST_REGISTRY_HTTP" \
    --port-file "$work/port" --log "$work/front.log" --fail-status 500 --retry-after 30 &
  KILL_PIDS="${KILL_PIDS:-} $!"
  for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
  front="127.0.0.1:$(awk '{print $1}' "$work/port")"
  "$GANTRY" pull "$@" --quiet --store "$store" "$front/gantry-test/$name" 2> "$work/producer.err" &
  producer=$!
  KILL_PIDS="$KILL_PIDS $producer"
  for _ in $(seq 100); do grep -q ":$producer\$" "$store/locks/${digest#sha256:}.lock" 2>/dev/null && break; sleep 0.1; done
  grep -q ":$producer\$" "$store/locks/${digest#sha256:}.lock"
  "$GANTRY" pull "$@" --store "$store" "$GANTRY_TEST_REGISTRY_HTTP/gantry-test/$name" > "$work/taker.out" 2> "$work/taker.err" &
  taker=$!
  sleep 3
  kill -0 "$taker"
  grep -q "waiting for" "$work/taker.err"
  kill -9 "$producer"
  wait "$taker"
  [ "$(awk '{print $1}' "$work/taker.out")" = "$digest" ]
}

# gantry_cluster_registry: sets REG to the open registry as the Slurm harness's nodes reach it. They live
# in network namespaces of their own (with their own loopback) and reach the host over the harness
# bridge at GANTRY_TEST_LOGIN_ADDR, an address srun on the host reaches too (the harness adds no names
# to the host's /etc/hosts); a single-node harness runs on the host itself.
gantry_cluster_registry() {
  if [ "$GANTRY_TEST_MODE" = multi ]; then REG=$GANTRY_TEST_LOGIN_ADDR:${GANTRY_TEST_REGISTRY_HTTP##*:}; else REG=$GANTRY_TEST_REGISTRY_HTTP; fi
}

# gantry_as_user USER DIR CMD...: CMD as USER with DIR as its working directory on the cluster's login
# node: the host for the 22.05 harness (the caller's environment goes along, as from a user's shell),
# the release's Debian root for 24.11 and 26.05 (a clean environment: pass variables with `env NAME=value CMD`).
gantry_as_user() {
  local user=$1 dir=$2
  shift 2
  ${GANTRY_SLURM_LOGIN_EXEC:-} runuser -u "$user" -- env -C "$dir" "$@"
}

# gantry_blob_digests NAME: the blobs (config and layers) of gantry-test/NAME:latest's current manifest
# in the open registry, one per line.
gantry_blob_digests() {
  curl -fsS -H "Accept: $GANTRY_MANIFEST_ACCEPT" "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/$1/manifests/latest" |
    jq -r '.config.digest, .layers[].digest'
}

# gantry_blob_gets NAME: GETs so far, in the open registry's access log, of those blobs.
gantry_blob_gets() {
  local b n=0
  for b in $(gantry_blob_digests "$1"); do
    n=$((n + $("$GANTRY_SOURCE_DIR/tests/harness/registry-log-count.sh" "$GANTRY_TEST_REGISTRY_HTTP_LOG" "$b")))
  done
  echo "$n"
}

# gantry_without_queue_lines: stdin without srun's "job N queued and waiting for resources" and "job N
# has been allocated resources" lines, which a node still completing an earlier job adds to a step's
# output (Slurm's information, not the behaviour a test looks at).
gantry_without_queue_lines() {
  grep -Ev '^srun: job [0-9]+ (queued and waiting for resources|has been allocated resources)$' || true
}

# gantry_hold_every_node: a job of the test user's (the suite's as_user) holding every node of the
# cluster, exclusive and sleeping, RUNNING when this returns; its id in BLOCKER (the caller cancels it).
# A job submitted meanwhile waits in the queue: what a cluster busy with another job looks like.
gantry_hold_every_node() {
  local nodes i
  nodes=$(sinfo -h -N -o %N | sort -u | wc -l)
  BLOCKER=$(as_user sbatch --parsable -N"$nodes" --exclusive -o /dev/null --wrap 'sleep 600')
  for ((i = 0; i < 100; i++)); do [ "$(squeue -h -j "$BLOCKER" -o %T)" = RUNNING ] && break; sleep 0.2; done
  [ "$(squeue -h -j "$BLOCKER" -o %T)" = RUNNING ]
}

# gantry_next_job_id: the job id slurmctld gives next (it advances with every job, even one that fails),
# to show that a submission was refused before the controller allocated a job.
gantry_next_job_id() {
  scontrol show config | awk -F' *= *' '$1 == "NEXT_JOB_ID" {print $2}'
}

# gantry_plugin_conf [LINE...]: writes the gantry.conf the plugin reads in the harness (the shared store
# in the FSx stand-in, and REG as an insecure registry: gantry allows plain HTTP only to registries
# listed there), plus the given lines; creates the store.
# Pyxis-style import lines on srun's terminal are off here, so that tests compare srun's output with
# the tasks' alone; GANTRY_TEST_IMPORT_MESSAGES= (empty) keeps the default (on), pyxis_compat.bats.
gantry_plugin_conf() {
  { printf 'store_path = %s\ninsecure_registries = %s\n' "$GANTRY_TEST_FSX/store" "$REG"
    if [ -n "${GANTRY_TEST_IMPORT_MESSAGES-0}" ]; then printf 'import_messages = %s\n' "${GANTRY_TEST_IMPORT_MESSAGES-0}"; fi
    for l in "$@"; do echo "$l"; done; } > "${GANTRY_TEST_GANTRY_CONF:-$GANTRY_HARNESS_DIR/gantry.conf}"
  mkdir -p "$GANTRY_TEST_FSX/store" && chmod 1777 "$GANTRY_TEST_FSX/store"
}

# gantry_step_suite NAME: the set-up of a suite of srun steps on the harness cluster: the environments,
# REG (gantry_cluster_registry), the plugin's gantry.conf (gantry_plugin_conf: call it as
# `GANTRY_TEST_IMPORT_MESSAGES= gantry_step_suite NAME` for Gantry's default import lines), TINY and
# DEBIAN (the test images there), U (the test user) and WORK, a new directory of U's on the shared
# file system (a cwd every node has), named after NAME; the suite's teardown removes it.
gantry_step_suite() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  gantry_plugin_conf
  TINY="$REG#gantry-test/tiny"
  DEBIAN="$REG#gantry-test/debian"
  U=$GANTRY_TEST_USER
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/$1.XXXXXX")
  chown "$U" "$WORK"
}

# gantry_private_registry DIR LISTEN [tls CERT KEY] [auth YAML]: a docker-registry of one test's own
# (so a test may kill it, or give it its own auth, without touching the harness's), listening on LISTEN
# (e.g. 127.0.0.1:PORT, or 0.0.0.0:PORT for the cluster's nodes), storage, config and log in DIR
# (storage may be filled beforehand), its pid in DIR/pid. `auth YAML` is the config's `auth:` block,
# as text. Returns once /v2/ answers. Only stdio goes to the daemon: bats waits for every holder of
# its fd 3 to close it.
gantry_private_registry() {
  local dir=$1 listen=$2 cert= key= auth= scheme=http i
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      tls) cert=$2 key=$3 scheme=https; shift 3 ;;
      auth) auth=$2; shift 2 ;;
      *) echo "gantry_private_registry: unknown argument $1" >&2; return 2 ;;
    esac
  done
  mkdir -p "$dir/storage"
  {
    printf 'version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n'
    printf 'storage:\n  filesystem:\n    rootdirectory: %s/storage\n' "$dir"
    printf 'http:\n  addr: %s\n  secret: gantry-test-%s\n' "$listen" "$RANDOM$RANDOM"
    [ -z "$cert" ] || printf '  tls:\n    certificate: %s\n    key: %s\n' "$cert" "$key"
    [ -z "$auth" ] || printf '%s\n' "$auth"
  } >"$dir/config.yml"
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-"; fi
    done
    exec setsid docker-registry serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 </dev/null
  ) &
  echo $! >"$dir/pid"
  disown "$!"  # a test that kills it on purpose wants no job report from bash
  for ((i = 0; i < 200; i++)); do
    curl -sk -o /dev/null "$scheme://127.0.0.1:${listen##*:}/v2/" && return 0
    sleep 0.05
  done
  echo "private registry on $listen did not start:" >&2
  tail -5 "$dir/registry.log" >&2
  return 1
}

# gantry_apt_image DIR KEY EXTRA PACKAGE...: a squashfs test image DIR/image.sqsh made of the harness's
# debian rootfs (images fixture) plus PACKAGEs installed with apt in a chroot, then the shell command
# EXTRA run with the root directory as $1 (":" for nothing). Cached: rebuilt only when KEY (the
# caller's recipe: bump it when EXTRA or its inputs change) or the package list changes.
gantry_apt_image() {
  local dir=$1 key=$2 extra=$3
  shift 3
  local recipe="$key $*"
  if [ -f "$dir/image.sqsh" ] && [ "$(cat "$dir/recipe" 2>/dev/null)" = "$recipe" ]; then return 0; fi
  rm -rf "$dir" && mkdir -p "$dir/root"
  tar -C "$dir/root" -xf "$GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar"
  cp /etc/resolv.conf "$dir/root/etc/resolv.conf"
  # A private mount namespace: /proc and /dev for dpkg's scripts vanish with it.
  unshare --mount --fork sh -c "mount -t proc proc '$dir/root/proc' && mount --rbind /dev '$dir/root/dev' &&
    chroot '$dir/root' sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends $* && apt-get clean'" > "$dir/apt.log" 2>&1 ||
    { tail -20 "$dir/apt.log" >&2; return 1; }
  rm -rf "$dir/root/var/lib/apt/lists/"*
  sh -c "$extra" sh "$dir/root"
  mksquashfs "$dir/root" "$dir/image.sqsh" -comp lz4 -noappend -quiet -no-progress
  chmod 644 "$dir/image.sqsh"
  echo "$recipe" > "$dir/recipe"
}

# gantry_slurm_client_image: prints the path of a squashfs test image that holds the Slurm client of
# the cluster the suite runs on (an srun inside a containerized batch script must speak its release and
# load its build of the plugin) plus the libraries the plugin needs, and /etc/gantry-marker reading
# "slurm-client image". 22.05: Debian 12's debian image plus apt (gantry_apt_image). 24.11 and 26.05:
# the release's root of tests/harness/slurmroot.sh (trixie, forky) without its compilers, headers and
# documentation (its packages are the plugin's runtime dependencies), the marker added as a pseudo
# file; cached beside it.
gantry_slurm_client_image() {
  local dir
  local release=${GANTRY_TEST_SLURM_RELEASE:-22.05}
  if [ "$release" != 22.05 ]; then
    dir=$GANTRY_HARNESS_DIR/cache/slurmclient-${release/./}
    if [ ! -f "$dir/image.sqsh" ] || [ "$(cat "$dir/recipe" 2>/dev/null)" != "v2 $GANTRY_TEST_SLURM_ROOT" ]; then
      rm -rf "$dir" && mkdir -p "$dir"
      # -e takes every argument after it: it comes last.
      mksquashfs "$GANTRY_TEST_SLURM_ROOT" "$dir/image.sqsh" -comp lz4 -noappend -quiet -no-progress -no-xattrs \
        -p 'etc/gantry-marker f 644 0 0 echo slurm-client image' -wildcards \
        -e usr/libexec/gcc usr/lib/gcc usr/include usr/share/doc usr/share/man usr/share/locale 'usr/share/cmake-*' \
        'var/cache/*' 'var/lib/apt/lists/*' 'proc/*' 'sys/*' 'dev/*' 'tmp/*' >&2 || return 1
      chmod 644 "$dir/image.sqsh"
      echo "v2 $GANTRY_TEST_SLURM_ROOT" >"$dir/recipe"
    fi
  else
    dir=$GANTRY_HARNESS_DIR/cache/plugin-slurmclient
    gantry_apt_image "$dir" v1 'echo slurm-client image > "$1/etc/gantry-marker"' slurm-client libcurl4 libyaml-0-2 >&2 || return 1
  fi
  echo "$dir/image.sqsh"
}

# gantry_node_tls_registry DIR REALM: a TLS + htpasswd registry of one test's own in DIR, serving a
# copy of the harness TLS registry (storage + htpasswd) on 0.0.0.0:PORT with a certificate for
# the login address (GANTRY_TEST_LOGIN_ADDR) and 127.0.0.1 signed by the harness CA. Sets TREG to the
# address the nodes use (GANTRY_TEST_LOGIN_ADDR:PORT: the bridge, or 127.0.0.1 for a single-node
# harness on the host) and REG_PID.
gantry_node_tls_registry() {
  local d=$1 realm=$2 ca_dir port
  ca_dir=$(dirname "$GANTRY_TEST_REGISTRY_CA")
  mkdir -p "$d"
  cp -a "$GANTRY_TEST_REGISTRY_TLS_STORAGE" "$d/storage"
  cp "$ca_dir/../htpasswd" "$d/htpasswd"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/server.key" -out "$d/server.csr" \
    -subj "/CN=$GANTRY_TEST_LOGIN_ADDR" 2>/dev/null
  printf '%s\n' "subjectAltName=IP:$GANTRY_TEST_LOGIN_ADDR,IP:127.0.0.1" "extendedKeyUsage=serverAuth" >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$GANTRY_TEST_REGISTRY_CA" -CAkey "$ca_dir/ca.key" -CAcreateserial \
    -CAserial "$d/ca.srl" -out "$d/server.pem" -days 1 -extfile "$d/server.ext" 2>/dev/null
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("0.0.0.0", 0)); print(s.getsockname()[1])')
  gantry_private_registry "$d" "0.0.0.0:$port" tls "$d/server.pem" "$d/server.key" \
    auth "$(printf 'auth:\n  htpasswd: {realm: %s, path: %s/htpasswd}' "$realm" "$d")" || return 1
  REG_PID=$(cat "$d/pid")
  TREG=$GANTRY_TEST_LOGIN_ADDR:$port
}

# shape_link RATE: slows the host's traffic towards the nodes to RATE, so that a pull of a few MB takes
# seconds and a kill lands mid-download. Run as root on the harness's own veth (the nodes' only way
# out, GANTRY_SLURM_HOST_LINK in slurm.env); unshape_link (teardown) removes it.
shape_link() {
  SHAPED_DEV=$GANTRY_SLURM_HOST_LINK
  [ -n "$SHAPED_DEV" ] || { echo "shape_link: no GANTRY_SLURM_HOST_LINK (a multi-node harness has one)" >&2; return 1; }
  tc qdisc replace dev "$SHAPED_DEV" root tbf rate "$1" burst 32kb latency 500ms
}

unshape_link() {
  if [ -n "$SHAPED_DEV" ]; then tc qdisc del dev "$SHAPED_DEV" root 2>/dev/null || true; fi
  SHAPED_DEV=
}

# gantry_open_fuse (in setup_file) / gantry_restore_fuse (in teardown_file): /dev/fuse usable by the
# test users for the suite's fuse-backed runs -- Debian's udev makes it 0666, some VMs leave it 0600 --
# and its mode put back afterwards.
gantry_open_fuse() {
  export GANTRY_FUSE_MODE
  GANTRY_FUSE_MODE=$(stat -c %a /dev/fuse)
  chmod 0666 /dev/fuse
}
gantry_restore_fuse() {
  chmod "$GANTRY_FUSE_MODE" /dev/fuse
}

# fake_ib_devices: the seed guides' jobs bind /dev/infiniband; the harness has no EFA, so uverbs nodes
# made with mknod (the real major, 231) stand in, in the host's /dev, which every emulated node (and
# the Slurm roots, through their rbind of /dev) sees. So does every other harness on the machine (a
# second checkout's suite): the stand-ins are made and removed under one lock, held until
# fake_ib_devices_done, so that another suite's test waits instead of removing the directory under a
# running job (a job's bind then failed with "source path does not exist"). A /dev/infiniband that
# was there before is left as it is.
fake_ib_devices() {
  exec {FAKE_IB_LOCK}>/run/lock/gantry-test-fake-ib.lock
  flock -w 600 "$FAKE_IB_LOCK"
  FAKE_IB_MADE=0
  if [ ! -e /dev/infiniband ]; then
    mkdir /dev/infiniband && mknod /dev/infiniband/uverbs0 c 231 192 && mknod /dev/infiniband/uverbs1 c 231 193
    chmod 666 /dev/infiniband/uverbs*
    FAKE_IB_MADE=1
  fi
}

# fake_ib_devices_done: removes what fake_ib_devices made and lets the next suite have the lock.
# Safe to call twice (a test's own call, then its teardown's).
fake_ib_devices_done() {
  if [ "${FAKE_IB_MADE:-0}" -eq 1 ]; then rm -rf /dev/infiniband; fi
  FAKE_IB_MADE=0
  if [ -n "${FAKE_IB_LOCK:-}" ]; then
    exec {FAKE_IB_LOCK}>&-
    FAKE_IB_LOCK=
  fi
}

# gantry_nodes_restored NODE SINCE [SECONDS]: after a test crashed or stopped NODE and started its
# slurmd again, waits until the controller has the registration of a slurmd of NODE started at or after
# SINCE (epoch seconds) and reports every node of the cluster plain IDLE (no DOWN, DRAIN, COMPLETING,
# NOT_RESPONDING or other flag), the state the test found the cluster in; at most SECONDS (default 90).
# Until the new slurmd has registered, `sinfo` may still show the state from before the crash (a
# restart within a ping interval goes unnoticed), and the controller's verdict on the killed slurmd
# (not responding, then DOWN) can land during the next suite. Prints the nodes' states and fails at
# the deadline.
gantry_nodes_restored() {
  local node=$1 since=$2 deadline=$((SECONDS + ${3:-90})) nodes start others
  while :; do
    nodes=$(scontrol -o show node 2>/dev/null || true)
    start=$(awk -v n="NodeName=$node " 'index($0, n) == 1' <<<"$nodes" | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
    others=$(grep -v ' State=IDLE ' <<<"$nodes" | grep -o '^NodeName=[^ ]*\| State=[^ ]*' | paste -sd' ' | tr -s ' ' || true)
    if [ -n "$nodes" ] && [ -z "$others" ] && [ -n "$start" ] && [ "$(date -d "$start" +%s 2>/dev/null || echo 0)" -ge "$since" ]; then
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "gantry_nodes_restored: after ${3:-90} s, $node's slurmd registered at ${start:-never} (restarted at $(date -d "@$since" +%FT%T)); nodes not idle: ${others:-none}"
      return 1
    fi
    sleep 0.5
  done
}

# epilog_done JOBID NODE: waits (at most 300 s, a bound for a hung epilog, not a timing) until the job
# has left COMPLETING and NODE is no longer `completing`: slurmd has run the job's epilog there.
epilog_done() {
  local i state node_state
  for ((i = 0; i < 1500; i++)); do
    state=$(scontrol -o show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' || echo JobState=GONE)
    node_state=$(sinfo -h -N -n "$2" -o '%t' | head -n1)
    [ "$state" != JobState=COMPLETING ] && [[ "$node_state" != *comp* ]] && return 0
    sleep 0.2
  done
  echo "job $1 still $state, node $2 $node_state after 300 s" >&2
  return 1
}
