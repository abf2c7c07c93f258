#!/usr/bin/env bash
# Gantry's Slurm test cluster: Debian's munged, slurmctld and slurmd started without systemd, with
# PlugStackConfig pointing at the freshly built spank_gantry.so, and everything stopped by PID again.
#
#   slurm.sh start [--nodes N]   N>=2: one slurmd per node, each in its own network, UTS and mount
#                                namespace with hostname gnode1..gnodeN, wired to a bridge that lives in
#                                a namespace of its own (no uplink); slurmctld, srun and sbatch stay on
#                                the host ("login node"). N=1: one slurmd on the host itself.
#                                Default N=3 (or $GANTRY_SLURM_NODES).
#   slurm.sh stop                stop every daemon this harness dir started (by recorded PID and start
#                                time), remove its namespaces and links. Logs stay in the state dir.
#   slurm.sh status              print the daemons and sinfo; exit 1 unless all are up.
#   slurm.sh exec NODE -- CMD    run CMD inside NODE's namespaces (hostname, mounts, network).
#   slurm.sh stop-node NODE      stop NODE's slurmd only (node-failure tests); start-node NODE restarts it.
#   slurm.sh crash-node NODE     SIGKILL NODE's slurmd and every process in its namespaces at once, like
#                                a node that loses power; start-node NODE boots it again.
#   GANTRY_SLURM_PROCTRACK=proctrack/cgroup slurm.sh start: track steps with cgroups (v1) like
#                                production clusters, instead of proctrack/linuxproc.
#
# State, logs and data: ${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}/slurm; the variables tests need are
# written to $GANTRY_HARNESS_DIR/slurm.env. See docs/testing.md, section "Slurm cluster".
#
# The host's configuration is never touched: daemons read $state/etc/slurm.conf (-f), every client the
# SLURM_CONF that slurm.env exports, nodes resolve names through their own bind-mounted hosts file and
# the host reaches them by address. Everything host-global (run dir, lock, namespace and link names,
# subnet) carries an id derived from the harness dir, so harnesses of two dirs run side by side.
# GANTRY_SLURM_SUBNET (a /24 prefix such as 10.213.78) and GANTRY_SLURM_NODE_PREFIX (default gnode)
# pick the subnet and the node names by hand.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
here=$(dirname "$self")
# shellcheck source=lib.sh
. "$here/lib.sh"

hdir=$(readlink -m "${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}")
state=$hdir/slurm
fsx=$hdir/fsx
# Same path on every node; each node's mount namespace binds its own directory over it.
scratch=$hdir/scratch
envfile=$hdir/slurm.env

# A directory of its own, like /etc/slurm: the plugin binds the directory of SLURM_CONF into the
# containers of batch jobs (for their inner srun), and $state also holds the nodes' spool directories.
conf=$state/etc/slurm.conf
# Every Slurm command this script runs (sinfo, squeue, scancel) talks to this harness's cluster only.
export SLURM_CONF=$conf
conf_marker="# Written by Gantry's tests/harness/slurm.sh"

# The harness dir's id: 8 hex digits of its path's hash, in every host-global name below.
hid=$(printf '%s' "$hdir" | sha256sum | cut -c1-8)
# PIDs live outside the harness dir, so that `stop` still finds every daemon when the build dir holding
# the harness dir was deleted under a running cluster. The owner file names the harness dir (an id
# clash between two dirs is refused, not shared).
run_root=/run/gantry-harness-slurm
run_dir=$run_root/$hid
owner_file=$run_dir/owner
lock_file=$run_dir/lock

# Names of the network plumbing. Interface names must stay within 15 characters.
br_ns=gantry-$hid-br
node_ns_prefix=gantry-$hid-n-
host_link=gs$hid
node_prefix=${GANTRY_SLURM_NODE_PREFIX:-gnode}
[[ $node_prefix =~ ^[a-z][a-z0-9-]{0,19}$ ]] ||
  gantry_die "GANTRY_SLURM_NODE_PREFIX='$node_prefix': must be 1-20 lower-case letters, digits or '-', starting with a letter"
partition=gantry

# What an older version of this script wrote into the host's files; removed once, see cleanup_legacy.
legacy_hosts_begin="# BEGIN gantry-harness slurm nodes (tests/harness/slurm.sh; removed by 'slurm.sh stop')"
legacy_hosts_end="# END gantry-harness slurm nodes"

munge_dir=$state/munge
munge_socket=$munge_dir/munge.socket

# ---------------------------------------------------------------------------------------------------
# Small helpers

note() { gantry_note "$*"; }
die() { gantry_die "$*"; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "slurm.sh must run as root (it starts munged/slurmctld/slurmd)"
}

require_tools() {
  local pair cmd pkg
  for pair in munged:munge munge:munge unmunge:munge slurmctld:slurmctld slurmd:slurmd \
    srun:slurm-client sinfo:slurm-client scontrol:slurm-client squeue:slurm-client \
    scancel:slurm-client ip:iproute2 ss:iproute2 nsenter:util-linux unshare:util-linux \
    setsid:util-linux runuser:util-linux flock:util-linux python3:python3; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || die "$cmd not found (Debian package $pkg); run scripts/install-deps"
  done
  getent passwd munge >/dev/null || die "user munge not found (Debian package munge); run scripts/install-deps"
  # Slurm's mpi/pmix dlopens the unversioned libpmix.so, which only the -dev package ships.
  dpkg-query -W -f='${Status}' libpmix-dev 2>/dev/null | grep -q 'install ok installed' ||
    note "WARNING: libpmix-dev not installed: srun --mpi=pmix will fail; run scripts/install-deps"
}

# start_time PID: the process's start time in clock ticks since boot (field 22 of /proc/PID/stat); with
# the pid it names one process for the life of the machine, unlike the pid alone, which is reused.
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  # shellcheck disable=SC2086 # split the fields
  set -- $stat
  echo "${20}"
}

# record_pid NAME PID: remember PID (and its start time) as the process NAME this harness started.
record_pid() {
  local t
  t=$(start_time "$2") || die "$1 (pid $2) exited right after it started"
  echo "$2 $t" >"$run_dir/$1.pid"
}

# pid_of NAME: the pid recorded for NAME (munged, slurmctld, <node>.slurmd, <node>.holder), or nothing
# when that process is gone: a pid whose start time differs is another process that reuses the number.
pid_of() {
  local f=$run_dir/$1.pid pid t
  [ -s "$f" ] || return 0
  read -r pid t <"$f" || true
  [ -n "$pid" ] && [ -n "$t" ] && [ "$(start_time "$pid" 2>/dev/null)" = "$t" ] && echo "$pid"
  return 0
}

# running PID: PID exists and is not a zombie. Daemons we started in an earlier call are reparented
# to pid 1, which may take seconds to reap them; an exited daemon must not look alive meanwhile.
running() {
  local stat
  [ -n "$1" ] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# pid_is PID COMM: true when PID runs and its command name is COMM (with pid_of's start time check, what
# makes sure that a signal only ever reaches a process this harness started).
pid_is() {
  local pid=$1 comm=$2
  running "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}

# alive NAME COMM: the recorded pid of NAME runs as COMM.
alive() { pid_is "$(pid_of "$1")" "$2"; }

# stop_pid NAME COMM: SIGTERM the recorded pid, SIGKILL after 10 s, wait until it is gone. Every check
# goes through pid_of (pid and start time), so a number reused meanwhile is never signalled.
stop_pid() {
  local name=$1 comm=$2 pid i
  pid=$(pid_of "$name")
  if pid_is "$pid" "$comm"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      alive "$name" "$comm" || break
      sleep 0.1
    done
    if alive "$name" "$comm"; then
      note "$name (pid $pid) ignored SIGTERM for 10s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        alive "$name" "$comm" || break
        sleep 0.1
      done
    fi
    alive "$name" "$comm" && die "$name (pid $pid) does not exit"
    note "stopped $name (pid $pid)"
  fi
  rm -f "$run_dir/$name.pid"
}

# wait_for_pidfile FILE TIMEOUT_S [WATCH_PID]: wait until a daemon has written FILE; print the pid.
# Gives up early when WATCH_PID (the foreground daemon we spawned) has already exited.
wait_for_pidfile() {
  local f=$1 timeout=$2 watch=${3:-} i
  for ((i = 0; i < timeout * 10; i++)); do
    if [ -s "$f" ]; then
      cat "$f"
      return 0
    fi
    if [ -n "$watch" ] && ! running "$watch"; then
      return 1
    fi
    sleep 0.1
  done
  return 1
}

# spawn CMD...: start a daemon detached from us: own session, no stdio of ours (CTest waits for its
# child's pipes to close, so a daemon holding them would hang the run) and no other inherited
# descriptor: a lock our caller holds (`flock LOCK -c "slurm.sh start"`, our own lock on fd 9) must
# not outlive the caller inside munged or a node's holder. Sets spawned_pid (the subshell execs the
# command, so it is the daemon's pid).
spawn() {
  (
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done
    exec setsid "$@" </dev/null
  ) &
  spawned_pid=$!
}

# last_errors FILE...: the last few error lines of daemon logs, on one line, for a failure message.
last_errors() {
  cat "$@" 2>/dev/null | grep -iE 'error|fatal' | tail -4 | tr '\n' ' '
}

node_names() {
  local i
  for ((i = 1; i <= nodes; i++)); do printf '%s%d ' "$node_prefix" "$i"; done
}

node_addr() { echo "$subnet.$((10 + ${1#"$node_prefix"}))"; }

# owned: the cluster recorded in $run_dir is the one of this harness dir.
owned() { [ -f "$owner_file" ] && [ "$(cat "$owner_file")" = "$state" ]; }

# take_lock: this harness dir's lock (start, stop and node actions of other harness dirs run freely).
# An id that another harness dir already uses is refused: the two would share every name.
take_lock() {
  mkdir -p "$run_dir"
  if [ -f "$owner_file" ] && ! owned; then
    die "the harness id $hid of $hdir is also that of $(dirname "$(cat "$owner_file")"), which runs a cluster; use another GANTRY_HARNESS_DIR or stop that one first"
  fi
  exec 9>"$lock_file"
  flock -w 120 9 || die "another slurm.sh start/stop of $hdir holds $lock_file"
}

load_cluster_state() {
  local st=$run_dir/cluster.state
  owned && [ -r "$st" ] || return 1
  # shellcheck disable=SC1090
  . "$st"
}

# ---------------------------------------------------------------------------------------------------
# Stopping (also used to clean up after a failed start or a crashed earlier run)

# kill_in_node_namespaces HOLDER_PID: kill every process that shares the holder's UTS namespace
# (slurmstepd, job tasks), except the holder itself. The holder is one this harness started (pid_of);
# the namespace is one it created, never the host's.
kill_in_node_namespaces() {
  local holder=$1 uts sig i pids
  uts=$(readlink "/proc/$holder/ns/uts" 2>/dev/null) || return 0
  [ "$uts" != "$(readlink /proc/1/ns/uts)" ] || return 0
  in_ns() {
    local p
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$p" != "$holder" ] && [ "$(readlink "/proc/$p/ns/uts" 2>/dev/null)" = "$uts" ] && echo "$p"
    done
    return 0
  }
  for sig in TERM KILL; do
    pids=$(in_ns)
    [ -n "$pids" ] || return 0
    note "sending SIG$sig to leftover process(es) in a node namespace: $(echo $pids)"
    kill -"$sig" $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      [ -n "$(in_ns)" ] || return 0
      sleep 0.1
    done
  done
}

cancel_all_jobs() {
  local i
  alive slurmctld slurmctld && [ -r "$conf" ] || return 0
  [ -n "$(squeue -h -o %i 2>/dev/null)" ] || return 0
  note "cancelling the jobs that are still in the queue"
  squeue -h -o %i | xargs -r scancel --quiet 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    [ -n "$(squeue -h -o %i 2>/dev/null)" ] || return 0
    sleep 0.1
  done
  note "jobs still listed after 10s: $(squeue -h -o '%i %T' | tr '\n' ' ')"
}

# remove_network: this harness dir's link and namespaces (their names carry its id), nothing else.
remove_network() {
  local ns
  # The host end first: deleting the bridge namespace also removes it, but asynchronously.
  if ip link show "$host_link" >/dev/null 2>&1; then
    ip link delete "$host_link" 2>/dev/null || note "could not delete link $host_link"
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case $ns in
      "$br_ns" | "$node_ns_prefix"*) ip netns delete "$ns" 2>/dev/null || note "could not delete network namespace $ns" ;;
    esac
  done
}

# cleanup_legacy: an older version of this script appended a marked block to /etc/hosts and wrote
# /etc/slurm/slurm.conf; a cluster of that version that was never stopped left them behind. The block
# (ours by its marker) is dropped once no such cluster runs; the file is only named, it may be in use.
# Rewritten in place (not renamed over), because /etc/hosts is often a bind mount.
cleanup_legacy() {
  local f kept
  for f in "$run_root"/*.pid; do
    [ -e "$f" ] || continue
    case $f in */slurmctld.pid | */munged.pid) ;; *) continue ;; esac
    pid_is "$(cat "$f" 2>/dev/null)" "$(basename "$f" .pid)" && return 0
  done
  if grep -qxF "$legacy_hosts_begin" /etc/hosts 2>/dev/null; then
    kept=$(awk -v b="$legacy_hosts_begin" -v e="$legacy_hosts_end" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
    note "removed the node names an older harness version had added to /etc/hosts"
  fi
  if grep -qF "$conf_marker" /etc/slurm/slurm.conf 2>/dev/null; then
    note "NOTE: /etc/slurm/slurm.conf was written by an older harness version; this one does not read it (remove it, and restore /etc/slurm/slurm.conf.gantry-orig if there is one)"
  fi
  return 0
}

# stop_cluster: stop whatever $run_dir records as running, in reverse start order. $state and
# $envfile name the cluster's harness dir (maybe gone by now).
stop_cluster() {
  local node pid
  cancel_all_jobs
  for pid in "$run_dir"/*.slurmd.pid; do
    [ -e "$pid" ] || continue
    node=$(basename "$pid" .slurmd.pid)
    stop_pid "$node.slurmd" slurmd
  done
  for pid in "$run_dir"/*.holder.pid; do
    [ -e "$pid" ] || continue
    node=$(basename "$pid" .holder.pid)
    if alive "$node.holder" sleep; then
      kill_in_node_namespaces "$(pid_of "$node.holder")"
    fi
    stop_pid "$node.holder" sleep
  done
  stop_pid slurmctld slurmctld
  stop_pid munged munged
  remove_network
  rm -f "$owner_file" "$run_dir/cluster.state" "$envfile"
}

# recorded: $run_dir records a cluster (running or not) of this harness dir.
recorded() { [ -f "$owner_file" ] || [ -n "$(ls "$run_dir"/*.pid 2>/dev/null)" ]; }

cmd_stop() {
  require_root
  if [ ! -d "$run_dir" ]; then
    note "no Slurm harness of $hdir running; nothing to stop"
    cleanup_legacy
    return 0
  fi
  take_lock
  cleanup_legacy
  if ! recorded; then
    note "no Slurm harness of $hdir running; nothing to stop"
    return 0
  fi
  stop_cluster
  if [ -d "$state" ]; then note "Slurm harness stopped (logs kept in $state)"; else note "Slurm harness stopped"; fi
}

# ---------------------------------------------------------------------------------------------------
# Starting

# healthy: every recorded daemon of the cluster in $state runs and all nodes are idle or in use.
healthy() {
  local node bad
  load_cluster_state || return 1
  alive munged munged && alive slurmctld slurmctld || return 1
  for node in $node_list; do
    alive "$node.slurmd" slurmd || return 1
    [ "$mode" = single ] || alive "$node.holder" sleep || return 1
  done
  bad=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 !~ /^(idle|mix|alloc|comp)$/' | head -1)
  [ -z "$bad" ] && [ -n "$(sinfo -h -N -o %N 2>/dev/null)" ]
}

# healthy_pids: any daemon recorded in $run_dir still runs.
healthy_pids() {
  local f name comm
  for f in "$run_dir"/*.pid; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .pid)
    case $name in
      *.slurmd) comm=slurmd ;; *.holder) comm="sleep" ;; munged) comm=munged ;;
      slurmctld) comm=slurmctld ;; *) continue ;;
    esac
    alive "$name" "$comm" && return 0
  done
  return 1
}

# choose_subnet: a /24 below 10.213/16 that no route of the host covers, starting from one the harness
# id picks, so that harnesses of two dirs (and anything else on 10.213) stay apart.
choose_subnet() {
  gantry_choose_subnet 10.213 "$hid" || die "set GANTRY_SLURM_SUBNET to a free private /24 prefix"
}

choose_port() {
  local var=$1 default=$2 explicit=${!1:-} port
  if [ -n "$explicit" ]; then
    gantry_port_in_use "$explicit" && die "$var=$explicit: port $explicit is in use ($(ss -Htlnp "sport = :$explicit" | awk '{print $NF}' | head -1)); pick another or stop that service"
    echo "$explicit"
    return 0
  fi
  port=$default
  if gantry_port_in_use "$port"; then
    port=$(gantry_free_port)
    note "port $default is in use ($(ss -Htlnp "sport = :$default" | awk '{print $NF}' | head -1)); using $port instead (set $var to choose)"
  fi
  echo "$port"
}

start_munged() {
  mkdir -p "$munge_dir"
  chown munge:munge "$munge_dir"
  # munged insists on a socket/key directory nobody else can write; clients need to traverse it.
  chmod 0755 "$munge_dir"
  if [ ! -s "$munge_dir/munge.key" ]; then
    dd if=/dev/urandom of="$munge_dir/munge.key" bs=1024 count=1 status=none
  fi
  chown munge:munge "$munge_dir/munge.key"
  chmod 0400 "$munge_dir/munge.key"
  rm -f "$munge_socket" "$munge_socket.lock" "$munge_dir/munged.pid"
  [ ${#munge_socket} -lt 100 ] || die "munge socket path $munge_socket is too long for a unix socket; use a shorter GANTRY_HARNESS_DIR"
  spawn runuser -u munge -- munged --key-file="$munge_dir/munge.key" --socket="$munge_socket" \
    --pid-file="$munge_dir/munged.pid" --log-file="$munge_dir/munged.log" \
    --seed-file="$munge_dir/munged.seed" --num-threads=4 >>"$munge_dir/munged.out" 2>&1
  local pid
  pid=$(wait_for_pidfile "$munge_dir/munged.pid" 10) ||
    die "munged did not start; see $munge_dir/munged.out and $munge_dir/munged.log: $(tail -3 "$munge_dir/munged.out" "$munge_dir/munged.log" 2>/dev/null | tr '\n' ' ')"
  record_pid munged "$pid"
  munge -n --socket="$munge_socket" | unmunge --socket="$munge_socket" >/dev/null ||
    die "munged runs (pid $pid) but a credential round trip failed; see $munge_dir/munged.log"
  note "munged running (pid $pid, socket $munge_socket)"
}

# write_hosts_files: each node's /etc/hosts (bind-mounted in its namespace): the nodes and the login
# node, also as gantry-login. The host's own /etc/hosts is left alone; on the host, tests use the
# addresses slurm.env exports (GANTRY_TEST_LOGIN_ADDR), which mean the same on every node.
write_hosts_files() {
  local node block
  block="$subnet.1 $ctl_host gantry-login"$'\n'
  for node in $node_list; do block+="$(node_addr "$node") $node"$'\n'; done
  for node in $node_list; do
    printf '# /etc/hosts of harness node %s (bind-mounted in its mount namespace)\n127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n%s' \
      "$node" "$block" >"$state/nodes/$node/hosts"
  done
}

setup_network() {
  ip route show | grep -q "^$subnet\.0/24" &&
    die "subnet $subnet.0/24 is already routed on this host ($(ip route show | grep "^$subnet\.0/24")); set GANTRY_SLURM_SUBNET to another private /24 prefix, e.g. 10.213.78"
  # shellcheck disable=SC2086 # one argument per node
  gantry_bridge_network "$br_ns" "$host_link" "$subnet" "$node_ns_prefix" "$node_prefix" $node_list
}

# spawn_holder NODE: start a sleeping process that owns NODE's UTS and mount namespace (its network
# namespace is the named one); await_holder NODE waits for it. slurmd is started inside it, so a test
# can kill and restart slurmd without losing the node. Not `ip netns exec`: that remounts /sys and
# hides the cgroup tree. Split in two so that all nodes' holders start at once (80 nodes: 80 waits).
declare -A spawned_of=()
spawn_holder() {
  local node=$1 dir=$state/nodes/$1
  rm -f "$dir/holder.pid"
  spawn nsenter --net="/run/netns/$node_ns_prefix$node" -- \
    unshare --uts --mount --propagation slave -- /bin/sh -ec '
      hostname "$1"
      mount --bind "$2/hosts" /etc/hosts
      mount --bind "$2/scratch" "$3"
      echo $$ > "$2/holder.pid"
      exec sleep infinity' holder "$node" "$dir" "$scratch" >>"$dir/holder.log" 2>&1
  spawned_of[$node.holder]=$spawned_pid
}

await_holder() {
  local node=$1 dir=$state/nodes/$1 pid
  pid=$(wait_for_pidfile "$dir/holder.pid" 30 "${spawned_of[$node.holder]}") || die "namespaces of $node could not be set up; see $dir/holder.log: $(tail -3 "$dir/holder.log" | tr '\n' ' ')"
  record_pid "$node.holder" "$pid"
}

# spawn_slurmd NODE: start NODE's slurmd (inside its namespaces unless single-node); await_slurmd NODE
# waits for its pid file. start_slurmd NODE does both (start-node); cmd_start spawns every node's
# slurmd before waiting for the first, so that 80 nodes start in the time of a few.
spawn_slurmd() {
  local node=$1 dir=$state/nodes/$1
  rm -f "$dir/slurmd.pid"
  if [ "$mode" = single ]; then
    spawn slurmd -D -f "$conf" -N "$node" >>"$dir/slurmd.out" 2>&1
  else
    spawn nsenter --target "$(pid_of "$node.holder")" --net --uts --mount -- \
      slurmd -D -f "$conf" -N "$node" >>"$dir/slurmd.out" 2>&1
  fi
  spawned_of[$node.slurmd]=$spawned_pid
}

await_slurmd() {
  local node=$1 dir=$state/nodes/$1 pid
  # 60 s: on 2 cores, 80 slurmds initialising at once take a while before the last writes its pid.
  pid=$(wait_for_pidfile "$dir/slurmd.pid" 60 "${spawned_of[$node.slurmd]}") ||
    die "slurmd of $node did not start; see $dir/slurmd.log and $dir/slurmd.out. Last errors: $(last_errors "$dir/slurmd.out" "$dir/slurmd.log")"
  record_pid "$node.slurmd" "$pid"
}

start_slurmd() {
  spawn_slurmd "$1"
  await_slurmd "$1"
}

write_plugstack() {
  plugin=${GANTRY_PLUGIN:-${GANTRY_BUILD_DIR:+$GANTRY_BUILD_DIR/plugin/spank_gantry.so}}
  {
    echo "# SPANK plugins of the Gantry Slurm harness (written by tests/harness/slurm.sh start)."
    if [ -n "$plugin" ] && [ -f "$plugin" ]; then
      plugin=$(readlink -f "$plugin")
      echo "required $plugin ${GANTRY_PLUGSTACK_ARGS:-}"
    else
      echo "# no plugin: ${plugin:-GANTRY_PLUGIN and GANTRY_BUILD_DIR unset} not found; build target spank_gantry"
    fi
  } >"$state/plugstack.conf"
  if [ -n "$plugin" ] && [ -f "$plugin" ]; then
    note "plugstack: required $plugin ${GANTRY_PLUGSTACK_ARGS:-}"
  else
    note "WARNING: no SPANK plugin loaded (${plugin:-set GANTRY_BUILD_DIR or GANTRY_PLUGIN}: not found); build the spank_gantry target"
    plugin=
  fi
}

write_slurm_conf() {
  local node mem
  # Memory is not a consumable here (CR_CPU), so each node simply claims an equal share.
  mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
  mem=$(((${mem:-4096} / nodes) > 256 ? ${mem:-4096} / nodes : 256))
  {
    echo "$conf_marker for $state; 'slurm.sh stop' removes it."
    cat <<EOF
ClusterName=gantry
SlurmctldHost=$ctl_host($ctl_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthInfo=socket=$munge_socket
StateSaveLocation=$state/ctld
SlurmctldPidFile=$state/ctld/slurmctld.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmctldDebug=$debug
SlurmdSpoolDir=$state/nodes/%n/spool
SlurmdPidFile=$state/nodes/%n/slurmd.pid
SlurmdLogFile=$state/nodes/%n/slurmd.log
SlurmdDebug=$debug
ProctrackType=$proctrack
SwitchType=switch/none
# How long a dead node goes unnoticed (a crash test waits for it; the controller pings every third of
# it): 20 s keeps that test short, and a live slurmd answers a ping in milliseconds even on a busy VM.
SlurmdTimeout=20
PlugStackConfig=$state/plugstack.conf
EOF
    gantry_slurm_conf_policy
    # Node-local temporary storage: the scratch path, private to each node in multi-node mode.
    # PMIx puts its per-step client directories there; a /tmp shared by all nodes makes them clash.
    [ "$mode" = single ] || echo "TmpFS=$scratch"
    # Fake GPUs as Slurm gres (GANTRY_SLURM_GPU_FILES, e.g. FAKEHW/dev/nvidia[0-3] from fakehw.sh):
    # slurmd reads only the device files' numbers, so --gpus allocations and SLURM_STEP_GPUS /
    # CUDA_VISIBLE_DEVICES are Slurm's own, as on a GPU node.
    local gres=
    if [ -n "$gpu_files" ]; then
      echo "GresTypes=gpu"
      gres=" Gres=gpu:$gpu_count"
    fi
    for node in $node_list; do
      echo "NodeName=$node NodeAddr=$(node_addr "$node") NodeHostname=$node CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem$gres State=UNKNOWN"
    done
    echo "PartitionName=$partition Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$conf"
  chmod 0644 "$conf"
  # Nothing goes to /etc/slurm: daemons get -f and, like every command this script runs, SLURM_CONF
  # (exported above; slurmstepd inherits it); clients get SLURM_CONF from slurm.env (also as another
  # user, through runuser, and inside jobs, whose environment sbatch and srun pass on).
  # proctrack/cgroup (what production clusters run) needs cgroup.conf, which Slurm looks for in the
  # directory of SLURM_CONF; the harness uses the cgroup v1 hierarchies (each slurmd gets
  # /sys/fs/cgroup/<ctrl>/slurm_<node>).
  rm -f "$state/etc/cgroup.conf" "$state/etc/gres.conf"
  if [ -n "$gpu_files" ]; then
    printf 'AutoDetect=off\nName=gpu File=%s\n' "$gpu_files" >"$state/etc/gres.conf"
    chmod 0644 "$state/etc/gres.conf"
  fi
  if [ "$proctrack" = proctrack/cgroup ]; then
    printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n' >"$state/etc/cgroup.conf"
  fi
}

wait_for_idle() {
  local timeout=$1 i out idle
  for ((i = 0; i < timeout * 5; i++)); do
    out=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
    idle=$(awk '$2 == "idle"' <<<"$out" | wc -l)
    [ "$idle" -eq "$nodes" ] && return 0
    sleep 0.2
  done
  die "nodes not idle after ${timeout}s (sinfo: $(tr '\n' ' ' <<<"$out")); see $state/slurmctld.log and $state/nodes/*/slurmd.log"
}

write_env() {
  local scratch_value=$scratch
  [ "$mode" = single ] && scratch_value=$state/nodes/$ctl_host/scratch
  cat >"$envfile" <<EOF
# Written by tests/harness/slurm.sh start; source it to talk to the harness cluster.
export SLURM_CONF=$conf
export GANTRY_HARNESS_DIR=$hdir
# This harness dir's id and what carries it on the host: the run dir (pids, lock), the network
# namespaces (names starting with the prefix) and the host's end of the bridge.
export GANTRY_SLURM_ID=$hid
export GANTRY_SLURM_RUN_DIR=$run_dir
export GANTRY_SLURM_NETNS_PREFIX=gantry-$hid-
export GANTRY_SLURM_HOST_LINK=$([ "$mode" = single ] || echo "$host_link")
# The login node (the host) as every node reaches it, e.g. the open registry at \$GANTRY_TEST_LOGIN_ADDR:PORT.
# An address, not a name: the host's /etc/hosts does not know the harness's names.
export GANTRY_TEST_LOGIN_ADDR=$([ "$mode" = single ] && echo 127.0.0.1 || echo "$subnet.1")
export GANTRY_SLURM_HARNESS=$self
export GANTRY_SLURM_STATE=$state
export GANTRY_TEST_MODE=$mode
export GANTRY_TEST_USER=$test_user
export GANTRY_TEST_NODES="${node_list% }"
export GANTRY_TEST_NODE_COUNT=$nodes
export GANTRY_TEST_CPUS_PER_NODE=$cpus
export GANTRY_TEST_PARTITION=$partition
export GANTRY_TEST_PLUGIN=$plugin
# Shared by all nodes and the host (stand-in for FSx for Lustre); world-writable, sticky.
export GANTRY_TEST_FSX=$fsx
# Node-local scratch (stand-in for local NVMe): this path on a node shows only that node's files.
export GANTRY_TEST_SCRATCH=$scratch_value
# Where node %n's scratch lives as seen from the host.
export GANTRY_TEST_SCRATCH_PATTERN=$state/nodes/%n/scratch
export GANTRY_SLURMCTLD_LOG=$state/slurmctld.log
export GANTRY_SLURMD_LOG_PATTERN=$state/nodes/%n/slurmd.log
export GANTRY_MUNGED_LOG=$munge_dir/munged.log
# Run a command inside a node: \$GANTRY_SLURM_EXEC gnode2 -- hostname
export GANTRY_SLURM_EXEC="env GANTRY_HARNESS_DIR=$hdir $self exec"
EOF
}

start_failed() {
  local rc=$?
  [ "$rc" -ne 0 ] || return 0
  note "start failed; stopping what was started (logs: $state/slurmctld.log, $state/nodes/*/slurmd.log, $munge_dir/munged.log)"
  stop_cluster || true
  exit "$rc"
}

cmd_start() {
  nodes=${GANTRY_SLURM_NODES:-3}
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) [ $# -ge 2 ] || die "--nodes needs a number"; nodes=$2; shift 2 ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      *) die "start: unknown argument '$1' (usage: slurm.sh start [--nodes N])" ;;
    esac
  done
  [[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le 200 ] || die "--nodes must be a number from 1 to 200, got '$nodes'"
  require_root
  require_tools
  take_lock

  # shellcheck disable=SC2154 # node_count comes from cluster.state, loaded by healthy
  if [ -d "$state" ] && healthy && [ "$node_count" = "$nodes" ]; then
    # The plugin may have been built since: plugstack.conf is read by every srun and slurmstepd,
    # so refreshing it takes effect without a restart.
    write_plugstack
    write_env
    note "Slurm harness already running in $state with $nodes node(s); plugstack.conf and $envfile refreshed"
    return 0
  fi
  cleanup_legacy
  if recorded; then
    if healthy_pids; then note "restarting: stopping the previous cluster in $state"; fi
    stop_cluster
  fi

  # Everything below is undone by stop_cluster if any step fails.
  trap start_failed EXIT
  mkdir -p "$state/ctld" "$state/etc" "$fsx" "$scratch"
  echo "$state" >"$owner_file"
  chmod 0755 "$hdir" "$state"
  chmod 1777 "$fsx"
  # Fresh state and logs per start: the previous run's logs stay until the next start.
  rm -rf "${state:?}/ctld/"* "$state/nodes" "$state/slurmctld.log" "$state/slurmctld.out"

  debug=${GANTRY_SLURM_DEBUG:-verbose}
  # Far more CPUs than the VM has (slurmd reports the configured ones, see config_overrides), so
  # that several multi-rank jobs fit side by side, as on real many-core nodes.
  cpus=${GANTRY_SLURM_CPUS:-32}
  # How slurmd tracks a step's processes: linuxproc (by process tree) unless asked for cgroup, which
  # needs the cgroup v1 hierarchies (tests/integration/cgroup.bats).
  proctrack=${GANTRY_SLURM_PROCTRACK:-proctrack/linuxproc}
  # Fake GPUs (see the NodeName lines): a bracketed range of device files, e.g. /x/dev/nvidia[0-3].
  # `fake`: the four GPUs of tests/harness/fakehw.sh, built afresh in $hdir/fakehw (the CTest fixture).
  gpu_files=${GANTRY_SLURM_GPU_FILES:-}
  if [ "$gpu_files" = fake ]; then
    "$here/fakehw.sh" "$hdir/fakehw" >/dev/null
    gpu_files="$hdir/fakehw/dev/nvidia[0-3]"
  fi
  gpu_count=0
  if [ -n "$gpu_files" ]; then
    gpu_count=$(compgen -G "$gpu_files" | wc -l)
    [ "$gpu_count" -gt 0 ] || die "GANTRY_SLURM_GPU_FILES=$gpu_files names no file"
  fi
  if [ "$proctrack" = proctrack/cgroup ] && [ ! -d /sys/fs/cgroup/freezer ]; then
    die "GANTRY_SLURM_PROCTRACK=proctrack/cgroup needs the cgroup v1 freezer hierarchy (/sys/fs/cgroup/freezer)"
  fi
  ctl_host=$(hostname -s)
  if [ "$nodes" -eq 1 ]; then
    mode=single
    node_list="$ctl_host "
    subnet=
    ctl_addr=127.0.0.1
    node_addr() { echo 127.0.0.1; }
    ctld_port=$(choose_port GANTRY_SLURMCTLD_PORT 6817)
    slurmd_port=$(choose_port GANTRY_SLURMD_PORT 6818)
    [ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$(gantry_free_port)
  else
    mode=multi
    node_list=$(node_names)
    subnet=${GANTRY_SLURM_SUBNET:-$(choose_subnet)}
    [[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "GANTRY_SLURM_SUBNET must be the first three octets of a /24, e.g. 10.213.77"
    ctl_addr=$subnet.1
    ctld_port=$(choose_port GANTRY_SLURMCTLD_PORT 6817)
    # Each slurmd listens inside its own network namespace, where nothing else runs.
    slurmd_port=${GANTRY_SLURMD_PORT:-6818}
  fi
  test_user=$("$here/user.sh")
  cat >"$run_dir/cluster.state" <<EOF
mode=$mode
node_count=$nodes
node_list="$node_list"
cpus=$cpus
ctl_host=$ctl_host
test_user=$test_user
subnet=$subnet
node_prefix=$node_prefix
EOF
  runuser -u "$test_user" -- test -x "$fsx" -a -w "$fsx" ||
    die "the test user $test_user cannot reach $fsx (a parent directory of $hdir lacks o+x?)"
  local node
  for node in $node_list; do
    mkdir -p "$state/nodes/$node/spool" "$state/nodes/$node/scratch"
    chmod 1777 "$state/nodes/$node/scratch"
  done

  start_munged
  write_plugstack
  if [ "$mode" = multi ]; then
    setup_network
    write_hosts_files
    for node in $node_list; do spawn_holder "$node"; done
    for node in $node_list; do await_holder "$node"; done
  fi
  write_slurm_conf

  rm -f "$state/ctld/slurmctld.pid"
  spawn slurmctld -D -c -f "$conf" >>"$state/slurmctld.out" 2>&1
  local pid
  pid=$(wait_for_pidfile "$state/ctld/slurmctld.pid" 20 "$spawned_pid") ||
    die "slurmctld did not start; see $state/slurmctld.log. Last errors: $(last_errors "$state/slurmctld.out" "$state/slurmctld.log")"
  record_pid slurmctld "$pid"
  note "slurmctld running (pid $pid, $ctl_host $ctl_addr:$ctld_port)"

  for node in $node_list; do spawn_slurmd "$node"; done
  for node in $node_list; do await_slurmd "$node"; done
  wait_for_idle "${GANTRY_SLURM_START_TIMEOUT:-60}"
  write_env
  trap - EXIT
  note "Slurm harness up: $mode, nodes ${node_list% }, partition $partition; env in $envfile"
}

# ---------------------------------------------------------------------------------------------------
# Inspecting

cmd_status() {
  local node rc=0 st
  load_cluster_state || { echo "no Slurm harness of $state is running"; return 1; }
  report() {
    if alive "$1" "$2"; then echo "$1: running (pid $(pid_of "$1"))"; else echo "$1: NOT running"; rc=1; fi
  }
  report munged munged
  report slurmctld slurmctld
  for node in $node_list; do
    [ "$mode" = single ] || report "$node.holder" sleep
    report "$node.slurmd" slurmd
  done
  alive slurmctld slurmctld || return 1
  sinfo -N -o '%N %t %c %P' || return 1
  for st in $(sinfo -h -N -o %t); do
    case $st in idle | mix | alloc | comp) ;; *) rc=1 ;; esac
  done
  return $rc
}

cmd_exec() {
  local node=${1:-}
  [ -n "$node" ] || die "usage: slurm.sh exec NODE -- CMD [ARGS...]"
  shift
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "usage: slurm.sh exec NODE -- CMD [ARGS...]"
  require_root
  load_cluster_state || die "no Slurm harness running in $state"
  case " $node_list " in *" $node "*) ;; *) die "unknown node '$node' (nodes: ${node_list% })" ;; esac
  if [ "$mode" = single ]; then exec "$@"; fi
  alive "$node.holder" sleep || die "the namespaces of $node are gone (holder not running)"
  exec nsenter --target "$(pid_of "$node.holder")" --net --uts --mount --wd=/ -- "$@"
}

# crash_node NODE: kill slurmd, slurmstepd and every task of NODE with SIGKILL in one go, so that none
# of them can clean up or tell the controller (unlike stop-node). The processes are those in NODE's
# network namespace, where only that node's daemons and jobs live; the holder survives, so the node
# keeps its hostname and mounts for start-node. Killing only what runs inside a namespace this harness
# created is what keeps this root-level kill away from the host and the other nodes.
crash_node() {
  local node=$1
  [ "$mode" != single ] || die "crash-node needs the multi-node harness (one slurmd on the host would take the host's processes with it)"
  alive "$node.holder" sleep || die "the namespaces of $node are gone (holder not running)"
  gantry_crash_netns "$(pid_of "$node.holder")" "$node"
  rm -f "$run_dir/$node.slurmd.pid"
}

cmd_node() {
  local action=$1 node=${2:-}
  require_root
  load_cluster_state || die "no Slurm harness running in $state"
  case " $node_list " in *" $node "*) ;; *) die "unknown node '$node' (nodes: ${node_list% })" ;; esac
  if [ "$action" = stop ]; then
    stop_pid "$node.slurmd" slurmd
  elif [ "$action" = crash ]; then
    crash_node "$node"
  else
    alive "$node.slurmd" slurmd && { note "slurmd of $node already running"; return 0; }
    [ "$mode" = single ] || alive "$node.holder" sleep || die "the namespaces of $node are gone; restart the cluster"
    start_slurmd "$node"
    note "slurmd of $node running (pid $(pid_of "$node.slurmd"))"
  fi
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  exec) shift; cmd_exec "$@" ;;
  stop-node) cmd_node stop "${2:-}" ;;
  start-node) cmd_node start "${2:-}" ;;
  crash-node) cmd_node crash "${2:-}" ;;
  *) echo "usage: $0 start [--nodes N] | stop | status | exec NODE -- CMD | stop-node NODE | crash-node NODE | start-node NODE" >&2; exit 2 ;;
esac
