# Shared shell helpers for Gantry's test harness scripts (registry, images, Slurm): error reporting,
# loopback port handling, background daemons tracked by pid files, and small preconditions.
# Source it; it defines functions only and changes no shell options of the caller.
# shellcheck shell=bash

# Where the harness keeps state, logs and data. CTest sets it to <build>/harness.
GANTRY_HARNESS_DIR="${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}"

# gantry_die MESSAGE...: print "gantry-harness: MESSAGE" on stderr and exit 1.
gantry_die() {
  echo "gantry-harness: $*" >&2
  exit 1
}

# gantry_note MESSAGE...: progress line on stderr (stdout stays free for values a caller captures).
gantry_note() {
  echo "gantry-harness: $*" >&2
}

# gantry_require_cmd CMD [PACKAGE]: die with an install hint when CMD is not on PATH.
gantry_require_cmd() {
  local cmd=$1 pkg=${2:-}
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [ -n "$pkg" ]; then
    gantry_die "$cmd not found (Debian package $pkg); run scripts/install-deps"
  fi
  gantry_die "$cmd not found; run scripts/install-deps"
}

# gantry_require_root WHAT: die unless running as uid 0, naming what needs root.
gantry_require_root() {
  [ "$(id -u)" -eq 0 ] && return 0
  gantry_die "$1 needs root (running as uid $(id -u)); rerun with sudo"
}

# gantry_port_in_use PORT: true when something listens on 127.0.0.1:PORT (or on the wildcard address).
gantry_port_in_use() {
  local port=$1
  # ss prints a header line and then one line per listening socket that matches the filter.
  [ "$(ss -Htln "sport = :$port" 2>/dev/null | wc -l)" -gt 0 ]
}

# gantry_free_port: print a TCP port on 127.0.0.1 that nothing listens on right now. The kernel picks
# it (bind to port 0), so parallel harnesses do not collide on a fixed list; the small race between
# closing the probe socket and the daemon binding is caught by gantry_wait_* and the daemon's own log.
gantry_free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

# gantry_wait_for_port PORT [TIMEOUT_S]: wait until 127.0.0.1:PORT accepts TCP connections.
gantry_wait_for_port() {
  local port=$1 timeout=${2:-20} i
  for ((i = 0; i < timeout * 10; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# gantry_wait_for_url URL [TIMEOUT_S] [CURL_ARGS...]: wait until curl gets any HTTP answer from URL
# (a 401 counts: the server is up). Prints nothing; returns 1 on timeout.
gantry_wait_for_url() {
  local url=$1 timeout=${2:-20} i code
  shift 2 || shift $#
  for ((i = 0; i < timeout * 10; i++)); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$@" "$url" 2>/dev/null) || code=000
    if [ "$code" != 000 ]; then return 0; fi
    sleep 0.1
  done
  return 1
}

# gantry_pid_alive PIDFILE: true when PIDFILE names a running process.
gantry_pid_alive() {
  local pidfile=$1 pid
  [ -s "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# gantry_pid_start PIDFILE LOGFILE CMD [ARGS...]: start CMD in the background in its own session,
# stdout and stderr appended to LOGFILE, and record its pid in PIDFILE.
gantry_pid_start() {
  local pidfile=$1 logfile=$2
  shift 2
  # Only stdin/stdout/stderr go to the daemon: an inherited descriptor (a caller's `flock` on fd 3,
  # say) would otherwise be held for the daemon's whole life.
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
    done
    exec setsid "$@" >>"$logfile" 2>&1 </dev/null
  ) &
  echo $! >"$pidfile"
}

# gantry_pid_stop PIDFILE [NAME] [TIMEOUT_S]: stop the process named in PIDFILE with SIGTERM, then
# SIGKILL after TIMEOUT_S, wait for it to be gone and remove PIDFILE. Succeeds when nothing runs.
gantry_pid_stop() {
  local pidfile=$1 name=${2:-process} timeout=${3:-10} pid i
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      gantry_note "$name (pid $pid) ignored SIGTERM for ${timeout}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
    fi
    if kill -0 "$pid" 2>/dev/null; then
      gantry_note "$name (pid $pid) is still running"
      return 1
    fi
  fi
  rm -f "$pidfile"
}

# gantry_registry_blob_gets LOGFILE DIGEST_OR_PATTERN: print how many GET requests for
# /v2/<repo>/blobs/<digest> the registry's access log (LOGFILE) records. The second argument is an
# extended regular expression matched against the digest part, so a full "sha256:..." digest counts
# one blob and e.g. "sha256:[0-9a-f]+" counts every blob GET. Only access-log lines (combined log
# format, `"GET /v2/... HTTP/x"`) are counted, not the registry's own debug/info lines about them.
gantry_registry_blob_gets() {
  local logfile=$1 pattern=$2
  [ -r "$logfile" ] || gantry_die "registry log $logfile not readable"
  grep -cE "\"GET /v2/[^ \"]+/blobs/(${pattern})(\\?[^ \"]*)? HTTP/[0-9.]+\"" "$logfile" || true
}

# The Accept header every manifest request to the harness registries must send: registry 2.8 hides
# OCI manifests from clients that do not list the OCI types, and downgrades manifest lists to schema1
# when no Accept header is sent (docs/testing.md).
# shellcheck disable=SC2034  # used by the scripts that source this file
GANTRY_MANIFEST_ACCEPT="application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json"

# gantry_debian_mirror: print the Debian bookworm mirror apt on this machine uses ($GANTRY_TEST_DEBIAN_MIRROR
# first; deb822 .sources files, then one-line sources.list entries); fails when there is none.
gantry_debian_mirror() {
  if [ -n "${GANTRY_TEST_DEBIAN_MIRROR:-}" ]; then echo "$GANTRY_TEST_DEBIAN_MIRROR"; return; fi
  python3 - <<'PY'
import glob, re, sys
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields = {}
        for line in stanza.splitlines():
            m = re.match(r"([A-Za-z-]+):\s*(.*)", line)
            if m:
                fields[m.group(1).lower()] = m.group(2)
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" in fields.get("types", "").split() and "bookworm" in fields.get("suites", "").split():
            print(fields["uris"].split()[0]); sys.exit(0)
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
        if m:
            print(m.group(2)); sys.exit(0)
sys.exit(1)
PY
}

# gantry_bookworm_minbase_tar: make sure $GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar exists
# (debootstrap --variant=minbase bookworm; /dev and apt caches emptied, like Debian's container images)
# and print its path. Shared by the test images, packaging/test-install.sh and the deployment builds.
gantry_bookworm_minbase_tar() {
  local cache=$GANTRY_HARNESS_DIR/cache tarball mirror tmp lock_fd
  tarball=$cache/debian-bookworm-minbase.tar
  mkdir -p "$cache"
  # One debootstrap at a time (CTest's two lanes may both ask first); the others wait and reuse it.
  exec {lock_fd}>"$cache/debian-bookworm-minbase.lock"
  flock "$lock_fd"
  if [ ! -s "$tarball" ]; then
    gantry_require_cmd debootstrap debootstrap
    mirror=$(gantry_debian_mirror) || gantry_die "no bookworm mirror in /etc/apt/sources.list*; set GANTRY_TEST_DEBIAN_MIRROR"
    gantry_note "debootstrap --variant=minbase bookworm from $mirror (about a minute; cached as $tarball)"
    tmp=$(mktemp -d "$cache/debootstrap.XXXXXX")
    if ! debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
      tail -n 20 "$tmp/debootstrap.log" >&2
      rm -rf --one-file-system "$tmp"
      gantry_die "debootstrap from $mirror failed (log above; is the mirror reachable? set GANTRY_TEST_DEBIAN_MIRROR)"
    fi
    rm -rf "$tmp/root"/dev/* "$tmp/root"/var/cache/apt/archives/*.deb "$tmp/root"/var/lib/apt/lists/* \
      "$tmp/root"/var/log/*.log
    tar -C "$tmp/root" --numeric-owner --xattrs --xattrs-include='*' -cf "$tarball.tmp" .
    mv -f "$tarball.tmp" "$tarball"
    rm -rf --one-file-system "$tmp"
  fi
  exec {lock_fd}>&-
  echo "$tarball"
}

# gantry_slurm_conf_policy: the slurm.conf lines every harness cluster shares (slurm.sh for 22.05,
# slurm2411.sh for 24.11): daemons and jobs as root with munge, no accounting or task binding,
# consumable CPUs with backfill, nodes back in service on their own. Paths, ports, names, debug level
# and timeouts are each harness's own.
gantry_slurm_conf_policy() {
  cat <<'EOF'
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# The VM has fewer cores than the nodes claim; make slurmd report the configured resources.
SlurmdParameters=config_overrides
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=300
EOF
}

# The network of a multi-node harness cluster (slurm.sh for 22.05, slurm2411.sh for 24.11): nodes are
# network namespaces on a bridge that lives in a namespace of its own, without uplink; the host joins
# it through a veth of its own. Each harness passes names that carry its id, so two never share one.

# gantry_choose_subnet BASE ID: the first BASE.X.0/24 (BASE: two octets, e.g. 10.213), X counting up
# from the first byte of the hex ID, that no route of the host covers; prints BASE.X. Fails when every
# one is routed.
gantry_choose_subnet() {
  local base=$1 id=$2 i octet routes
  routes=$(ip -4 route show)
  for ((i = 0; i < 256; i++)); do
    octet=$(((16#${id:0:2} + i) % 256))
    grep -q "^${base//./\\.}\\.$octet\\.0/24" <<<"$routes" || { echo "$base.$octet"; return 0; }
  done
  gantry_note "every /24 in $base.0.0/16 is routed on this host"
  return 1
}

# gantry_bridge_network BR_NS HOST_LINK SUBNET NS_PREFIX NODE_PREFIX NODE...: bridge br0 in the new
# namespace BR_NS, the host's end HOST_LINK at SUBNET.1/24, and for each NODE (NODE_PREFIX followed by
# its number I) a new namespace NS_PREFIX<NODE> whose eth0 is at SUBNET.(10+I). The caller checks that
# SUBNET is free, and removes all of it again by those names.
gantry_bridge_network() {
  local br_ns=$1 host_link=$2 subnet=$3 ns_prefix=$4 node_prefix=$5 node ns i
  shift 5
  ip netns add "$br_ns"
  ip -n "$br_ns" link set lo up
  ip -n "$br_ns" link add br0 type bridge
  ip -n "$br_ns" link set br0 up
  # The host (the login node: slurmctld, srun, sbatch) joins the bridge through its own veth.
  ip link add "$host_link" type veth peer name host netns "$br_ns"
  ip -n "$br_ns" link set host master br0 up
  ip addr add "$subnet.1/24" dev "$host_link"
  ip link set "$host_link" up
  for node in "$@"; do
    i=${node#"$node_prefix"}
    ns=$ns_prefix$node
    ip netns add "$ns"
    # Named by the node's number: a node name with a long prefix would not fit in 15 characters.
    ip -n "$br_ns" link add "vn$i" type veth peer name eth0 netns "$ns"
    ip -n "$br_ns" link set "vn$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

# gantry_crash_netns HOLDER NAME: SIGKILL every process in the network namespace of HOLDER (a node's
# namespace holder, which survives) at once, like a node that loses power: only that node's daemons
# and jobs live there, so nothing of the host or another node is hit. Refuses the host's namespace;
# fails naming NAME when a process survives.
gantry_crash_netns() {
  local holder=$1 name=$2 net p pids i
  net=$(readlink "/proc/$holder/ns/net") || gantry_die "$name: its holder (pid $holder) is gone"
  [ "$net" != "$(readlink /proc/1/ns/net)" ] || gantry_die "$name shares the host's network namespace; refusing to kill"
  # find compares every process's namespace link in one process (a loop of readlinks in bash takes
  # seconds on a loaded machine, long enough for the "crashed" node to finish what it was doing);
  # -lname takes a pattern, so the brackets of "net:[N]" are escaped.
  local pattern=${net//[/\\[}
  pattern=${pattern//]/\\]}
  # Repeated: a slurmstepd may fork between the scan and the kill; what it forked is found next round.
  for ((i = 0; i < 50; i++)); do
    pids=
    for p in $(find /proc/[0-9]*/ns/net -maxdepth 0 -lname "$pattern" 2>/dev/null | cut -d/ -f3); do
      [ "$p" != "$holder" ] && pids+=" $p"
    done
    [ -n "$pids" ] || return 0
    [ "$i" -gt 0 ] || gantry_note "crashing $name: SIGKILL to$pids"
    # shellcheck disable=SC2086 # one argument per pid
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  gantry_die "processes of $name survive SIGKILL:$pids"
}

# gantry_package_build_dir: where harness.packages.build builds the packages (tests/harness/packages.sh);
# deploy_builds.bats builds the ParallelCluster package at the same path inside its root.
gantry_package_build_dir() {
  echo "${GANTRY_PACKAGE_BUILD_DIR:-${GANTRY_BUILD_DIR:-$GANTRY_HARNESS_DIR}/package}"
}

# gantry_package_ccache_env CACHE_DIR: the environment (one NAME=VALUE a line) under which the package
# builds of the tests go through ccache with CACHE_DIR. A hit needs the same compiler, flags, paths and
# preprocessed input, and the compiler is told apart by its `-v` (GCC's version with Debian's
# revision), not by the mtime of its driver, since the two builds that share the cache run different
# installations of it (the host's and a root's). Depend mode: a miss costs one compile, not a
# preprocessor run and then the compile (the first build misses every object); a hit is found by the
# source's and its headers' contents, which the compiler's own -MD list names.
gantry_package_ccache_env() {
  printf '%s\n' "CCACHE_DIR=$1" "CCACHE_COMPILERCHECK=%compiler% -v" CCACHE_DEPEND=1 CCACHE_MAXSIZE=1G \
    CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
}
