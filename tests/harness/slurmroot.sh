#!/usr/bin/env bash
# Gantry's newer Slurms, each run from a Debian root of its own beside the host's Slurm 22.05 cluster
# (tests/harness/slurm.sh), with Gantry built inside that root against that release. RELEASE is
#   24.11  Debian 13 (trixie):      state slurm2411/, login node gantry-trixie, nodes tnode1..N
#   26.05  Debian forky (testing):  state slurm2605/, login node gantry-forky,  nodes fnode1..N
# slurm2411.sh and slurm2605.sh are this script with RELEASE filled in.
#
#   slurmroot.sh RELEASE root    make sure the release's root exists: debootstrap --variant=minbase of
#                          its suite plus apt-get install of the build and runtime packages, cached
#                          under $GANTRY_HARNESS_DIR/cache/ keyed by a hash of the recipe below
#   ... build              root, then configure and build spank_gantry.so, gantry-imagefs and
#                          gantry-entry in the root against its libslurm-dev and libfuse (build dir:
#                          <state>/build), with the runtime's libraries and the programs gantry and
#                          gantry-holder from the main build ($GANTRY_BUILD_DIR, GANTRY_RUNTIME_FROM);
#                          GANTRY_ROOT_FULL_BUILD=1 (or no main build) builds them all in the root
#   ... start              build, then start munged and slurmctld on the login node and one slurmd per
#                          node (default 3, or $GANTRY_SLURM2411_NODES / $GANTRY_SLURM2605_NODES, at
#                          least 2), all from the root with spank_gantry.so in its plugstack; writes
#                          $GANTRY_HARNESS_DIR/slurm2411.env (slurm2605.env) for the tests
#   ... stop               stop every daemon and process of the cluster, remove its network
#                          namespaces and link; logs stay in the state dir
#   ... status             the daemons and sinfo; exit 1 unless all are up
#   ... exec [--] CMD...   run CMD as root on the login node inside the root (srun, sinfo, gantry ...)
#   ... node-exec NODE [--] CMD...   run CMD as root on node NODE (its hostname and network)
#   ... crash-node NODE    SIGKILL NODE's slurmd and every process in its network namespace at once,
#                          like a node that loses power; start-node NODE boots its slurmd again
#   ... slurmd-parameters [VALUE]   restart every node's slurmd with SlurmdParameters=VALUE (after the
#                          harness's config_overrides) in slurm.conf, e.g. contain_spank; no job may run
#   ... namespace off|mnt|pid|pid,user   (25.11+) restart slurmctld and every slurmd with
#                          NamespaceType=namespace/linux, PrologFlags=Contain and a namespace.yaml whose
#                          clone_ns_flags add nothing (mnt), the job's pid namespace (pid) and a user
#                          namespace too (pid,user); off removes them; no job may run
#
# Not a chroot: the kernel refuses unshare(CLONE_NEWUSER) to a chrooted process, and the plugin makes
# user namespaces. The root is entered with a mount namespace of its own and pivot_root, so that it is
# the real root of everything the cluster runs. A "holder" process keeps that namespace (and a UTS
# namespace with the login node's hostname) alive; daemons and commands join it with nsenter. The
# login node (munged, slurmctld, srun, sbatch) uses the host's network. Each node is a network
# namespace of its own on a bridge (the way tests/harness/slurm.sh wires the 22.05 nodes, with names,
# link and subnet of its own) plus a UTS namespace with the node's hostname, held by a sleeping process
# that has joined the root's mount namespace; the node's slurmd is started inside those. The nodes
# reach the login node, and the harness registry, at the host's end of the bridge. $GANTRY_HARNESS_DIR
# and the source tree appear at their own paths inside, so paths in env files and gantry.conf mean the
# same on both sides.
#
# State, logs and the build: $GANTRY_HARNESS_DIR/slurm2411 or slurm2605 (never the 22.05 cluster's
# slurm/ or /etc/slurm of the host: the daemons' -f /etc/slurm/slurm.conf and the clients' SLURM_CONF
# name the root's /etc/slurm, over which the holder binds the state dir's etc/slurm; the host's
# /etc/hosts is not touched either). Harness dirs and releases run side by side: free loopback ports,
# names and subnets of each release's own, state and pid files in the harness dir, and a signal only
# ever goes to a process in this harness's namespaces. Mirror: $GANTRY_TEST_DEBIAN_MIRROR, default
# http://deb.debian.org/debian. See docs/testing.md, "Slurm 24.11 (trixie root)", "Slurm 26.05 (forky root)".
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
here=$(dirname "$self")
# shellcheck source=lib.sh
. "$here/lib.sh"

release=${1:-}
shift || true
# Per release: Debian suite, debootstrap's script for it (Debian 12's debootstrap has none named
# forky: sid's fits), and the names that keep the two clusters apart.
case $release in
  24.11) suite=trixie bootstrap_script=trixie login=gantry-trixie node_prefix=tnode subnet_base=10.214 link_tag=gt ;;
  26.05) suite=forky bootstrap_script=sid login=gantry-forky node_prefix=fnode subnet_base=10.215 link_tag=gf ;;
  *) echo "usage: $0 24.11|26.05 COMMAND... (see the head of this file)" >&2; exit 2 ;;
esac
tag=${release/./}          # 2411, 2605: in file, variable and namespace names
partition=$suite
invoke=$here/slurm$tag.sh  # this script for this release, as the env file and client wrappers call it
envp=GANTRY_T$tag          # prefix of the release's own variables in its env file

hdir=$(readlink -m "${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}")
src=$(readlink -f "${GANTRY_SOURCE_DIR:-$here/../..}")
state=$hdir/slurm$tag
run=$state/run            # per start: configs, logs, spool, pid files (wiped by start)
bdir=$state/build         # kept between starts: the build is incremental
envfile=$hdir/slurm$tag.env
holder_pid_file=$state/holder.pid
mirror=${GANTRY_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The harness dir's id (as in slurm.sh) in every host-global name: the network namespaces (prefix
# g2411- / g2605-, never the 22.05 harness's gantry-<id>-), the host's end of the bridge and the subnet.
hid=$(printf '%s' "$hdir" | sha256sum | cut -c1-8)
netns_prefix=g$tag-$hid-
br_ns=${netns_prefix}br
host_link=$link_tag$hid
# Written by start: the subnet and the node list of the running cluster.
cluster_state=$state/cluster.state

# The root's recipe. Any change here (suite, packages) makes a new cache entry.
packages=(
  # building Gantry (scripts/install-deps --build-only, with trixie's and forky's names)
  build-essential cmake pkg-config libslurm-dev libsquashfs-dev libfuse3-dev libarchive-dev libxml2-dev libcurl4-openssl-dev
  libssl-dev libzstd-dev zlib1g-dev nlohmann-json3-dev libyaml-dev libisal-dev libseccomp-dev libcli11-dev
  # the cluster and what the plugin runs on a node
  slurmd slurmctld slurm-client munge squashfs-tools squashfuse fuse3 util-linux procps ca-certificates
)
# 24.11's root also lends its apparmor_parser 4 (it knows the userns rule) to the parse check of
# packaging/apparmor/gantry (tests/integration/packaging.bats): bookworm's 3.0 parser predates that rule.
if [ "$release" = 24.11 ]; then packages+=(apparmor); fi
recipe_version=1  # bump when the steps in make_root change
recipe=$(printf '%s\n' "$recipe_version" "$suite" minbase "${packages[@]}" | sha256sum | cut -c1-16)
cache=$hdir/cache
root=$cache/$suite-slurm$tag-$recipe

note() { gantry_note "slurm$tag: $*"; }
die() { gantry_die "slurm$tag: $*"; }

# ---------------------------------------------------------------------------------------------------
# The root

# make_root: the cached root, built once. Callers may run at once (.ci/run prepares the roots in the
# background while the main tree builds, and the harness start or deploy_builds.bats may ask before
# that has finished): one builds under a lock on the cache entry, the others wait for it and find the
# root complete. A failed or killed build leaves no complete root, so the next caller tries again.
make_root() {
  [ -f "$root/.gantry-complete" ] && return 0
  gantry_require_root "building the $suite root (debootstrap)"
  mkdir -p "$cache"
  chmod 755 "$hdir" "$cache"
  local lock_fd
  exec {lock_fd}>"$cache/$suite-slurm$tag.lock"
  # A deadline on the wait: another builder (debootstrap and apt, ~4-6 minutes here) may hang on the mirror.
  flock -w 1800 "$lock_fd" ||
    die "another process has been building the $suite root for 30 minutes (lock $cache/$suite-slurm$tag.lock; see $cache/slurm$tag-debootstrap.log, $cache/slurm$tag-apt.log)"
  if [ ! -f "$root/.gantry-complete" ]; then
    make_root_locked
  fi
  exec {lock_fd}>&-
}

make_root_locked() {
  gantry_require_cmd debootstrap debootstrap
  [ -e /usr/share/debootstrap/scripts/$bootstrap_script ] ||
    die "this debootstrap does not know Debian $suite (/usr/share/debootstrap/scripts/$bootstrap_script missing); install a newer debootstrap"
  local tmp=$root.partial t0=$SECONDS t1
  rm -rf "$tmp"
  note "debootstrap --variant=minbase $suite from $mirror (about a minute; cached as $root)"
  if ! debootstrap --variant=minbase "$suite" "$tmp" "$mirror" "/usr/share/debootstrap/scripts/$bootstrap_script" >"$cache/slurm$tag-debootstrap.log" 2>&1; then
    rm -rf --one-file-system "$tmp"
    die "debootstrap $suite from $mirror failed (mirror unreachable? set GANTRY_TEST_DEBIAN_MIRROR); see $cache/slurm$tag-debootstrap.log: $(tail -2 "$cache/slurm$tag-debootstrap.log" | tr '\n' ' ')"
  fi
  t1=$SECONDS
  note "TIMING debootstrap: $((t1 - t0)) s"
  # Package scripts must not start services: the harness starts its own daemons.
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 755 "$tmp/usr/sbin/policy-rc.d"
  # apt in a chroot is fine (no user namespaces there); /proc for the maintainer scripts.
  mount -t proc proc "$tmp/proc"
  local rc=0
  chroot "$tmp" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 sh -ec '
    # A testing suite'"'"'s Release file on a mirror or snapshot may be past its Valid-Until date.
    apt-get -o Acquire::Check-Valid-Until=false update -q
    apt-get install -y -q --no-install-recommends "$@"
    apt-get clean' apt "${packages[@]}" >"$cache/slurm$tag-apt.log" 2>&1 || rc=$?
  # A maintainer script's last child may still hold /proc for a moment (seen with forky's ca-certificates).
  umount "$tmp/proc" 2>/dev/null || { sleep 2; umount "$tmp/proc"; }
  [ $rc -eq 0 ] || die "apt-get install in the $suite root failed (rc $rc); see $cache/slurm$tag-apt.log: $(tail -3 "$cache/slurm$tag-apt.log" | tr '\n' ' ')"
  note "TIMING apt-get install (${#packages[@]} packages): $((SECONDS - t1)) s"
  touch "$tmp/.gantry-complete"
  mv "$tmp" "$root"
  # Older recipes' roots are of no further use.
  local old
  for old in "$cache/$suite-slurm$tag"-*; do
    [ "$old" = "$root" ] || { note "removing the outdated root $old"; rm -rf --one-file-system "$old"; }
  done
}

# ---------------------------------------------------------------------------------------------------
# The namespace around the root

holder_alive() {
  local pid
  [ -s "$holder_pid_file" ] && pid=$(cat "$holder_pid_file") && [ -n "$pid" ] &&
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ] &&
    [ "$(readlink "/proc/$pid/ns/uts")" != "$(readlink /proc/1/ns/uts)" ]
}

# start_holder: a process in a new mount and UTS namespace whose root is the release's root (pivot_root),
# with /proc, /sys, /dev, the harness dir and the source tree mounted, and passwd/group/hosts/slurm
# configuration of this harness bound over the root's own (the cached root itself is not changed,
# except for the empty directories the binds need).
start_holder() {
  holder_alive && return 0
  local etc=$state/etc
  mkdir -p "$etc/slurm" "$state/tmp"
  chmod 1777 "$state/tmp"
  # The root's accounts plus the harness users (same uids as on the host: files in the shared dirs
  # keep their owners), so srun runs as gantry-test inside too.
  cp "$root/etc/passwd" "$etc/passwd"
  cp "$root/etc/group" "$etc/group"
  # Their home directories are the host's, bound at the same paths: a home shared by the login node
  # and every node, as on a cluster with home on NFS (a test writes a file there from the host).
  local u home homes=()
  for u in gantry-test gantry-attacker; do
    if getent passwd "$u" >/dev/null; then
      getent passwd "$u" >>"$etc/passwd"
      getent group "$u" >>"$etc/group" || true
      home=$(getent passwd "$u" | cut -d: -f6)
      if [ -d "$home" ] && [ "$home" != / ]; then homes+=("$home"); fi
    fi
  done
  [ -e "$etc/hosts" ] || printf '127.0.0.1 localhost %s\n::1 localhost ip6-localhost ip6-loopback\n' "$login" >"$etc/hosts"
  [ -e "$etc/slurm/slurm.conf" ] || : >"$etc/slurm/slurm.conf"
  # Mount points for the binds (minbase has no /etc/hosts).
  mkdir -p "$root$hdir" "$root$src" "$root/etc/slurm"
  [ -e "$root/etc/hosts" ] || : >"$root/etc/hosts"
  rm -f "$holder_pid_file" "$state/holder.log"
  # Everything runs in a namespace this script creates: the mounts below touch nothing of the host.
  ( for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done
    exec setsid unshare --mount --uts --propagation private -- /bin/sh -ec '
      R=$1 H=$2 SRC=$3 ETC=$4 TMP=$5 PIDF=$6 NODE=$7
      shift 7
      hostname "$NODE"
      mount --bind "$R" "$R"
      mount -t proc proc "$R/proc"
      mount --rbind /sys "$R/sys"
      mount --rbind /dev "$R/dev"
      mount -t tmpfs -o mode=0755 tmpfs "$R/run"
      mount --bind "$TMP" "$R/tmp"
      # A source tree or harness dir below /tmp (a clone in /tmp) needs its mount point in the private
      # /tmp just bound, not in the root'"'"'s own (now hidden) one.
      mkdir -p "$R$SRC" "$R$H"
      mount --bind "$SRC" "$R$SRC"
      mount -o remount,bind,ro "$R$SRC"
      mount --bind "$H" "$R$H"
      for f in passwd group hosts; do mount --bind "$ETC/$f" "$R/etc/$f"; done
      mount --bind "$ETC/slurm" "$R/etc/slurm"
      for home in "$@"; do mkdir -p "$R$home" && mount --bind "$home" "$R$home"; done
      cd "$R"
      pivot_root . .
      umount -l .
      cd /
      echo $$ > "$PIDF"
      exec sleep infinity' holder "$root" "$hdir" "$src" "$etc" "$state/tmp" "$holder_pid_file" "$login" "${homes[@]}" \
      >>"$state/holder.log" 2>&1 </dev/null
  ) &
  local i spawned=$!
  for ((i = 0; i < 100; i++)); do
    holder_alive && return 0
    kill -0 "$spawned" 2>/dev/null || break
    sleep 0.1
  done
  die "the namespace around the $suite root could not be set up; see $state/holder.log: $(tail -3 "$state/holder.log" 2>/dev/null | tr '\n' ' ')"
}

# in_root CMD...: run CMD as root inside the release's root (the holder's mount and UTS namespaces).
in_root() {
  nsenter --target "$(cat "$holder_pid_file")" --mount --uts --root --wd -- \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 HOME=/root \
    SLURM_CONF=/etc/slurm/slurm.conf "$@"
}

# ---------------------------------------------------------------------------------------------------
# Building Gantry in the root

# main_build_for_root: prints the main build tree whose runtime the root's build takes
# (GANTRY_RUNTIME_FROM), brought up to date first (a no-op in CI, where CTest starts after the build),
# or nothing when the root builds everything itself: GANTRY_ROOT_FULL_BUILD=1 or no main build.
main_build_for_root() {
  local main=${GANTRY_BUILD_DIR:-}
  [ "${GANTRY_ROOT_FULL_BUILD:-0}" != 1 ] && [ -n "$main" ] && [ -f "$main/CMakeCache.txt" ] || return 0
  if ! "$src/tests/harness/low-priority.sh" cmake --build "$main" -j"$(nproc)" --target gantry gantry-holder \
      >"$state/main-build.log" 2>&1; then
    note "the main build ($main) failed to update (log: $state/main-build.log): building the whole runtime in the root"
    return 0
  fi
  echo "$main"
}

cmd_build() {
  gantry_require_root "slurm$tag.sh"
  make_root
  start_holder
  mkdir -p "$bdir"
  local t0=$SECONDS main from=$state/runtime-from targets
  main=$(main_build_for_root)
  if [ -n "$main" ]; then
    # The runtime does not depend on Slurm: its libraries and the two programs built from it come from
    # the main build (Debian 12's GCC), and the root compiles what does depend on the root: the plugin
    # against this release's spank.h, gantry-imagefs against its libfuse (trixie and forky have
    # libfuse3.so.4, Debian 12 .so.3) and the static gantry-entry. The programs' other libraries have
    # the same sonames in all three Debian releases. GCC 14 at -O2 over the whole tree is
    # deploy_builds' Slinky stage (its log is checked for warnings); GANTRY_ROOT_FULL_BUILD=1 builds
    # everything here. Copied into the state dir, which the root's namespace sees (the main build may
    # live anywhere on the host).
    rm -rf "$from" && mkdir -p "$from/runtime"
    cp "$main"/runtime/libgantry_*.a "$main/runtime/gantry" "$main/runtime/gantry-holder" "$from/runtime/"
    targets="spank_gantry gantry-imagefs gantry-entry"
    note "building spank_gantry.so, gantry-imagefs and gantry-entry against $suite's Slurm in $bdir, the runtime from $main (log: $state/build.log)"
  else
    from=""
    targets="gantry gantry-entry spank_gantry"
    note "building gantry, gantry-entry and spank_gantry.so against $suite's Slurm in $bdir (log: $state/build.log)"
  fi
  # At low priority: CTest runs this beside other tests (tests/CMakeLists.txt, the build lane). -O2 as
  # RelWithDebInfo (gcc 14's -Werror warnings depend on it) but without debug information, which
  # costs a third of this build's CPU time in CI and serves no test here.
  # shellcheck disable=SC2086  # $5: the target list
  if ! in_root "$src/tests/harness/low-priority.sh" sh -ec '
      cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
        "-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG" -DGANTRY_WERROR=ON -DGANTRY_BUILD_TESTS=OFF "-DGANTRY_RUNTIME_FROM=$4"
      cmake --build "$2" -j"$3" --target $5' build "$src" "$bdir" "$(nproc)" "$from" "$targets" \
      >"$state/build.log" 2>&1; then
    die "building Gantry in the $suite root failed; see $state/build.log: $(grep -m3 -E 'error|Error' "$state/build.log" | tr '\n' ' ')"
  fi
  grep -q "gantry-built-for-slurm=$release" "$bdir/plugin/spank_gantry.so" ||
    die "$bdir/plugin/spank_gantry.so carries no gantry-built-for-slurm=$release marker; see $state/build.log"
  # The main build's programs must run in the root (the sonames above): a missing library fails here,
  # not in the first test.
  if [ -n "$from" ] && ! in_root "$bdir/runtime/gantry" version >/dev/null 2>>"$state/build.log"; then
    die "the main build's gantry does not run in the $suite root; see $state/build.log (GANTRY_ROOT_FULL_BUILD=1 builds it there)"
  fi
  note "TIMING build: $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------------
# The cluster

pid_in() { [ -s "$1" ] && cat "$1"; return 0; }

# daemon_alive PIDFILE COMM: the pid in PIDFILE runs as COMM inside the holder's mount namespace, the
# one this script made around the root (the login node's daemons and the nodes' slurmds all run in
# it). A pid the host reused for one of its own processes (a daemon of the host's Slurm among them)
# fails the namespace check, so stop never signals it.
daemon_alive() {
  local pid mnt
  pid=$(pid_in "$1")
  holder_alive && mnt=$(readlink "/proc/$(cat "$holder_pid_file")/ns/mnt" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] &&
    [ "$(readlink "/proc/$pid/ns/mnt" 2>/dev/null)" = "$mnt" ] &&
    ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}

stop_daemon() {
  local pidfile=$1 comm=$2 pid i
  daemon_alive "$pidfile" "$comm" || return 0
  pid=$(pid_in "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    daemon_alive "$pidfile" "$comm" || { note "stopped $comm (pid $pid)"; return 0; }
    sleep 0.1
  done
  note "$comm (pid $pid) ignored SIGTERM for 10s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

wait_pidfile() {
  local f=$1 timeout=$2 i
  for ((i = 0; i < timeout * 10; i++)); do
    [ -s "$f" ] && return 0
    sleep 0.1
  done
  return 1
}

load_cluster_state() {
  [ -r "$cluster_state" ] || return 1
  # shellcheck disable=SC1090
  . "$cluster_state"
}

node_addr() { echo "$subnet.$((10 + ${1#"$node_prefix"}))"; }

# node_holder_alive NODE: NODE's holder runs (a sleep) inside the network namespace this harness made
# for NODE: a reused pid of anything else is never taken for it.
node_holder_alive() {
  local pid ns=/run/netns/$netns_prefix$1
  pid=$(pid_in "$run/nodes/$1/holder.pid")
  [ -n "$pid" ] && [ -e "$ns" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ] &&
    [ "$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null)" = "$(stat -c %i "$ns")" ]
}

# holders: the pids of the root's holder and of every node's holder that still run.
holders() {
  local node
  holder_alive && cat "$holder_pid_file"
  load_cluster_state 2>/dev/null || return 0
  for node in $node_list; do node_holder_alive "$node" && pid_in "$run/nodes/$node/holder.pid"; done
  return 0
}

# in_uts: the pids (other than the holders) in the holders' UTS namespaces, i.e. everything the
# cluster started: daemons, slurmstepd, job tasks (containers keep the node's UTS namespace).
in_uts() {
  local h p u hs host_uts utss=" "
  host_uts=$(readlink /proc/1/ns/uts)
  hs=" $(holders | tr '\n' ' ') "
  for h in $hs; do
    u=$(readlink "/proc/$h/ns/uts" 2>/dev/null) || continue
    [ "$u" != "$host_uts" ] && utss+="$u "
  done
  [ "$utss" != " " ] || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    case $hs in *" $p "*) continue ;; esac
    u=$(readlink "/proc/$p/ns/uts" 2>/dev/null) || continue
    case $utss in *" $u "*) echo "$p" ;; esac
  done
  return 0
}

# setup_network: bridge, host link ($subnet.1, the login node as the nodes see it) and one network
# namespace per node, under this harness's names (lib.sh). The subnet is the first 10.214.X.0/24 (24.11) or
# 10.215.X.0/24 (26.05) that no host route covers (the 22.05 harness takes 10.213/16).
setup_network() {
  ip route show | grep -q "^$subnet\.0/24" && die "subnet $subnet.0/24 is already routed on this host"
  # shellcheck disable=SC2086 # one argument per node
  gantry_bridge_network "$br_ns" "$host_link" "$subnet" "$netns_prefix" "$node_prefix" $node_list
}

# remove_network: this harness dir's link and namespaces (their names carry its id and g2411- or g2605-).
remove_network() {
  local ns
  if ip link show "$host_link" >/dev/null 2>&1; then
    ip link delete "$host_link" 2>/dev/null || note "could not delete link $host_link"
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case $ns in
      "$netns_prefix"*) ip netns delete "$ns" 2>/dev/null || note "could not delete network namespace $ns" ;;
    esac
  done
}

# spawn_node_holder NODE: a sleeping process in NODE's network namespace, a new UTS namespace with the
# node's hostname, and the root's mount namespace (joined last, with the root's / as its root): the
# node's slurmd and `node-exec` join all three. Its pid file is written before it joins the root;
# await_node_holder waits until it is there.
spawn_node_holder() {
  local node=$1 dir=$run/nodes/$1
  gantry_pid_start "$dir/holder.spawn" "$dir/holder.log" \
    nsenter --net="/run/netns/$netns_prefix$node" -- unshare --uts -- /bin/sh -ec '
      hostname "$1"
      echo $$ > "$2"
      exec nsenter --target "$3" --mount --root --wd -- sleep infinity' holder "$node" "$dir/holder.pid" "$(cat "$holder_pid_file")"
}

await_node_holder() {
  local node=$1 i mnt
  mnt=$(readlink "/proc/$(cat "$holder_pid_file")/ns/mnt")
  for ((i = 0; i < 100; i++)); do
    if node_holder_alive "$node" && [ "$(readlink "/proc/$(cat "$run/nodes/$node/holder.pid")/ns/mnt")" = "$mnt" ]; then return 0; fi
    sleep 0.1
  done
  die "the namespaces of node $node could not be set up; see $run/nodes/$node/holder.log: $(tail -3 "$run/nodes/$node/holder.log" 2>/dev/null | tr '\n' ' ')"
}

in_node() {
  local node=$1
  shift
  nsenter --target "$(cat "$run/nodes/$node/holder.pid")" --net --uts --mount --root --wd -- \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 HOME=/root \
    SLURM_CONF=/etc/slurm/slurm.conf "$@"
}

# spawn_slurmd NODE: NODE's slurmd inside its holder's namespaces; await_slurmd NODE waits for its pid.
spawn_slurmd() {
  local node=$1
  rm -f "$run/nodes/$node/slurmd.pid"
  gantry_pid_start "$run/nodes/$node/slurmd.spawn" "$run/nodes/$node/slurmd.out" \
    nsenter --target "$(cat "$run/nodes/$node/holder.pid")" --net --uts --mount --root --wd -- \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 slurmd -D -f /etc/slurm/slurm.conf -N "$node"
}

# A slurmd that has not written its pid file by the deadline is stopped before this fails: left to
# finish starting on its own, it would register later, unseen by the caller (a restart nobody made, in
# the middle of the next test), or be started a second time by a retry.
await_slurmd() {
  local node=$1 spawned
  wait_pidfile "$run/nodes/$node/slurmd.pid" 30 && return 0
  spawned=$(pid_in "$run/nodes/$node/slurmd.spawn")
  if [ -n "$spawned" ] && [ "$(readlink "/proc/$spawned/ns/net" 2>/dev/null)" = "$(readlink "/proc/$(cat "$run/nodes/$node/holder.pid")/ns/net" 2>/dev/null)" ]; then
    kill -KILL "$spawned" 2>/dev/null || true
  fi
  die "slurmd $release of $node did not start within 30 s (stopped); see $run/nodes/$node/slurmd.log: $(grep -iE 'error|fatal' "$run/nodes/$node/slurmd.out" "$run/nodes/$node/slurmd.log" 2>/dev/null | tail -3 | tr '\n' ' ')"
}

# spawn_slurmctld: slurmctld on the login node, inside the root; returns once it wrote its pid file.
spawn_slurmctld() {
  rm -f "$run/slurmctld.pid"
  gantry_pid_start "$run/slurmctld.spawn" "$run/slurmctld.out" \
    nsenter --target "$(cat "$holder_pid_file")" --mount --uts --root --wd -- \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 slurmctld -D -i -f /etc/slurm/slurm.conf
  wait_pidfile "$run/slurmctld.pid" 20 ||
    die "slurmctld $release did not start; see $run/slurmctld.log: $(grep -iE 'error|fatal' "$run/slurmctld.out" "$run/slurmctld.log" 2>/dev/null | tail -3 | tr '\n' ' ')"
}

cmd_stop() {
  gantry_require_root "slurm$tag.sh"
  local node
  if load_cluster_state; then
    for node in $node_list; do stop_daemon "$run/nodes/$node/slurmd.pid" slurmd; done
  fi
  stop_daemon "$run/slurmctld.pid" slurmctld
  stop_daemon "$run/munged.pid" munged
  # Only processes in the UTS namespaces this harness created: nothing of the host's.
  local sig pids i
  for sig in TERM KILL; do
    pids=$(in_uts)
    [ -n "$pids" ] || break
    note "sending SIG$sig to leftover process(es) of the cluster: $(tr "\n" " " <<<"$pids")"
    # shellcheck disable=SC2086
    kill -"$sig" $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      [ -n "$(in_uts)" ] || break
      sleep 0.1
    done
  done
  # The holders last: the root's (checked by holder_alive) and the nodes' (by their namespace).
  pids=$(holders)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  remove_network
  rm -f "$holder_pid_file" "$envfile" "$cluster_state"
  note "Slurm $release harness stopped (logs kept in $run)"
}

start_failed() {
  local rc=$?
  [ "$rc" -ne 0 ] || return 0
  note "start failed; stopping what was started (logs: $run)"
  cmd_stop || true
  exit "$rc"
}

write_conf() {
  local plugin=$bdir/plugin/spank_gantry.so node
  cat >"$state/etc/slurm/plugstack.conf" <<EOF
# SPANK plugins of the Gantry Slurm $release harness (tests/harness/slurmroot.sh $release start).
required $plugin config=$run/gantry.conf
EOF
  [ -e "$run/gantry.conf" ] || printf '# the %s suites write this\n' "$release" >"$run/gantry.conf"
  {
    cat <<EOF
# Written by Gantry's tests/harness/slurmroot.sh $release for $state.
ClusterName=gantry$tag
SlurmctldHost=$login($subnet.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthInfo=socket=$run/munge/munge.socket
StateSaveLocation=$run/ctld
SlurmctldPidFile=$run/slurmctld.pid
SlurmctldLogFile=$run/slurmctld.log
SlurmctldDebug=verbose
SlurmdSpoolDir=$run/nodes/%n/spool
SlurmdPidFile=$run/nodes/%n/slurmd.pid
SlurmdLogFile=$run/nodes/%n/slurmd.log
SlurmdDebug=verbose
ProctrackType=proctrack/linuxproc
# How long a dead node goes unnoticed: 20 s, as in slurm.sh (plugin_failures.bats crashes a node).
SlurmdTimeout=20
PlugStackConfig=/etc/slurm/plugstack.conf
EOF
    for node in $node_list; do
      echo "NodeName=$node NodeAddr=$(node_addr "$node") NodeHostname=$node CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1024 State=UNKNOWN"
    done
    echo "PartitionName=$partition Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    gantry_slurm_conf_policy
  } >"$state/etc/slurm/slurm.conf"
  chmod 0644 "$state/etc/slurm/slurm.conf" "$state/etc/slurm/plugstack.conf"
  # One /etc/hosts for the login node and every node (they share the root's mount namespace); written
  # in place, since the holder has it bind-mounted.
  {
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n%s.1 %s\n' "$subnet" "$login"
    for node in $node_list; do echo "$(node_addr "$node") $node"; done
  } >"$state/etc/hosts"
}

# write_client_bin: $state/bin, put first on PATH by the env file: Slurm's client commands for root
# on the host, each run on the login node inside the root (as `exec`, without the caller's
# environment), so that a suite written for the 22.05 harness (sinfo, squeue, scontrol, scancel as
# root) talks to this cluster.
write_client_bin() {
  local c
  rm -rf "${state:?}/bin"
  mkdir -p "$state/bin"
  for c in srun sbatch salloc squeue sinfo scontrol scancel sacct; do
    printf '#!/bin/sh\n# Written by tests/harness/slurmroot.sh %s start: %s of the Slurm %s harness.\nexec env GANTRY_HARNESS_DIR=%s %s exec -- %s "$@"\n' \
      "$release" "$c" "$release" "$hdir" "$invoke" "$c" >"$state/bin/$c"
    chmod 0755 "$state/bin/$c"
  done
}

cmd_start() {
  gantry_require_root "slurm$tag.sh"
  gantry_require_cmd nsenter util-linux
  gantry_require_cmd unshare util-linux
  gantry_require_cmd ip iproute2
  local nodes_var=GANTRY_SLURM${tag}_NODES node test_user i
  local nodes=${!nodes_var:-3}
  if ! [[ $nodes =~ ^[1-9][0-9]?$ ]] || [ "$nodes" -lt 2 ]; then
    die "$nodes_var must be a number from 2 to 99, got '$nodes'"
  fi
  test_user=$("$here/user.sh")
  cmd_build
  cmd_stop >/dev/null 2>&1 || true
  trap start_failed EXIT
  rm -rf "$run"
  mkdir -p "$run/ctld" "$run/munge" "$run/fsx"
  chmod 0755 "$hdir" "$state" "$run"
  chmod 1777 "$run/fsx"
  node_list=
  for ((i = 1; i <= nodes; i++)); do node_list+="$node_prefix$i "; done
  subnet=$(gantry_choose_subnet "$subnet_base" "$hid") || die "no free /24 for the nodes"
  cpus=32
  ctld_port=$(gantry_free_port)
  # Each slurmd listens inside its own network namespace, where nothing else runs.
  slurmd_port=6818
  for node in $node_list; do mkdir -p "$run/nodes/$node/spool"; done
  printf 'node_list="%s"\nsubnet=%s\n' "${node_list% }" "$subnet" >"$cluster_state"
  start_holder
  write_conf
  write_client_bin
  setup_network
  for node in $node_list; do spawn_node_holder "$node"; done
  for node in $node_list; do await_node_holder "$node"; done

  # munged: its key and socket in the run dir, owned by the root's munge account.
  dd if=/dev/urandom of="$run/munge/munge.key" bs=1024 count=1 status=none
  in_root chown -R munge:munge "$run/munge"
  chmod 0755 "$run/munge"
  chmod 0400 "$run/munge/munge.key"
  in_root runuser -u munge -- munged --key-file="$run/munge/munge.key" --socket="$run/munge/munge.socket" \
    --pid-file="$run/munge/munged.pid" --log-file="$run/munge/munged.log" \
    --seed-file="$run/munge/munged.seed" --num-threads=4 >>"$run/munged.out" 2>&1 ||
    die "munged did not start: $(tail -3 "$run/munged.out" "$run/munge/munged.log" 2>/dev/null | tr '\n' ' ')"
  wait_pidfile "$run/munge/munged.pid" 10 || die "munged wrote no pid file; see $run/munge/munged.log"
  cp "$run/munge/munged.pid" "$run/munged.pid"

  spawn_slurmctld
  for node in $node_list; do spawn_slurmd "$node"; done
  for node in $node_list; do await_slurmd "$node"; done
  local st=
  for ((i = 0; i < 300; i++)); do
    st=$(in_root sinfo -h -N -o %t 2>/dev/null | sort | uniq -c | awk '{print $1, $2}' || true)
    [ "$st" = "$nodes idle" ] && break
    sleep 0.2
  done
  [ "$st" = "$nodes idle" ] || die "the $nodes nodes are not idle after 60 s (sinfo: ${st:-nothing}); see $run/slurmctld.log and $run/nodes/*/slurmd.log"
  cat >"$envfile" <<EOF
# Written by tests/harness/slurmroot.sh $release start; source it to talk to the Slurm $release cluster.
export ${envp}_HARNESS=$invoke
# Run a command as root on the login node in the $suite root: \$${envp}_EXEC srun ...
export ${envp}_EXEC="env GANTRY_HARNESS_DIR=$hdir $invoke exec --"
export ${envp}_ROOT=$root
export ${envp}_STATE=$state
export ${envp}_RUN=$run
export ${envp}_BUILD=$bdir
export ${envp}_PLUGIN=$bdir/plugin/spank_gantry.so
export ${envp}_GANTRY=$bdir/runtime/gantry
export ${envp}_CONF_DIR=$state/etc/slurm
export ${envp}_GANTRY_CONF=$run/gantry.conf
export ${envp}_LOGIN=$login
export ${envp}_PARTITION=$partition
export ${envp}_FSX=$run/fsx
export ${envp}_SLURMD_PID_PATTERN=$run/nodes/%n/slurmd.pid
export ${envp}_SLURMCTLD_PID=$run/slurmctld.pid
export ${envp}_SLURMCTLD_LOG=$run/slurmctld.log
# The interface slurm.env gives the suites written for the 22.05 harness (tests/integration/helpers.bash,
# gantry_load_env slurm with GANTRY_TEST_SLURM=$release): the same names, this cluster's values.
export GANTRY_TEST_SLURM_RELEASE=$release
export GANTRY_TEST_SLURM_ROOT=$root
# Its slurm.conf and plugstack.conf (the root's /etc/slurm): spank_releases.bats changes them.
export GANTRY_TEST_SLURM_CONF_DIR=$state/etc/slurm
export GANTRY_SLURM_HARNESS=$invoke
# Slurm's clients for root on the host run on this cluster's login node (write_client_bin).
export PATH=$state/bin:\$PATH
# Prefix for a command on the login node, as root: \$GANTRY_SLURM_LOGIN_EXEC runuser -u USER -- srun ...
export GANTRY_SLURM_LOGIN_EXEC="env GANTRY_HARNESS_DIR=$hdir $invoke exec --"
export GANTRY_SLURM_EXEC="env GANTRY_HARNESS_DIR=$hdir $invoke node-exec"
export GANTRY_SLURM_HOST_LINK=$host_link
export GANTRY_SLURM_NETNS_PREFIX=$netns_prefix
export GANTRY_TEST_LOGIN_ADDR=$subnet.1
export GANTRY_TEST_MODE=multi
export GANTRY_TEST_USER=$test_user
export GANTRY_TEST_NODES="${node_list% }"
export GANTRY_TEST_NODE_COUNT=$nodes
export GANTRY_TEST_CPUS_PER_NODE=$cpus
export GANTRY_TEST_PARTITION=$partition
export GANTRY_TEST_PLUGIN=$bdir/plugin/spank_gantry.so
export GANTRY_TEST_GANTRY_CONF=$run/gantry.conf
# The gantry CLI built for this cluster's root (tests that run \`gantry\` on its login node).
export GANTRY_TEST_GANTRY=$bdir/runtime/gantry
export GANTRY_TEST_FSX=$run/fsx
export GANTRY_SLURMCTLD_LOG=$run/slurmctld.log
export GANTRY_SLURMD_LOG_PATTERN=$run/nodes/%n/slurmd.log
EOF
  trap - EXIT
  note "Slurm $(in_root slurmd -V | awk '{print $2}') harness up in the $suite root: login $login ($subnet.1, slurmctld port $ctld_port), nodes ${node_list% } on $subnet.0/24 (link $host_link); env in $envfile"
}

cmd_status() {
  local rc=0 node d
  holder_alive || { echo "no Slurm $release harness of $state is running"; return 1; }
  load_cluster_state || { echo "no Slurm $release cluster recorded in $cluster_state"; return 1; }
  for d in munged:munged slurmctld:slurmctld; do
    if daemon_alive "$run/${d%%:*}.pid" "${d#*:}"; then echo "${d%%:*}: running (pid $(cat "$run/${d%%:*}.pid"))"
    else echo "${d%%:*}: NOT running"; rc=1; fi
  done
  for node in $node_list; do
    if node_holder_alive "$node" && daemon_alive "$run/nodes/$node/slurmd.pid" slurmd; then
      echo "$node slurmd: running (pid $(cat "$run/nodes/$node/slurmd.pid"))"
    else echo "$node slurmd: NOT running"; rc=1; fi
  done
  in_root sinfo -N -o '%N %t %c %P' || rc=1
  return $rc
}

cmd_exec() {
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "usage: slurm$tag.sh exec [--] CMD [ARGS...]"
  gantry_require_root "slurm$tag.sh exec"
  holder_alive || die "the Slurm $release harness is not running; start it: $invoke start"
  in_root "$@"
}

cmd_node_exec() {
  local node=${1:-}
  shift || true
  [ "${1:-}" = -- ] && shift
  if [ -z "$node" ] || [ $# -eq 0 ]; then die "usage: slurm$tag.sh node-exec NODE [--] CMD [ARGS...]"; fi
  gantry_require_root "slurm$tag.sh node-exec"
  load_cluster_state || die "the Slurm $release harness is not running; start it: $invoke start"
  case " $node_list " in *" $node "*) ;; *) die "unknown node '$node' (nodes: $node_list)" ;; esac
  node_holder_alive "$node" || die "the namespaces of $node are gone (holder not running)"
  in_node "$node" "$@"
}

# cmd_node crash|start NODE: crash: SIGKILL slurmd, slurmstepd and every task of NODE in one go, so
# that none of them can clean up or tell the controller; the processes are those in NODE's network
# namespace, which this harness created and where only that node's daemons and jobs live (the holder
# survives, keeping the node's namespaces for start). start: NODE's slurmd again, if it is not running.
cmd_node() {
  local action=$1 node=${2:-} holder
  gantry_require_root "slurm$tag.sh $action-node"
  load_cluster_state || die "the Slurm $release harness is not running; start it: $invoke start"
  case " $node_list " in *" $node "*) ;; *) die "unknown node '$node' (nodes: $node_list)" ;; esac
  node_holder_alive "$node" || die "the namespaces of $node are gone (holder not running)"
  holder=$(cat "$run/nodes/$node/holder.pid")
  if [ "$action" = start ]; then
    daemon_alive "$run/nodes/$node/slurmd.pid" slurmd && { note "slurmd of $node already running"; return 0; }
    spawn_slurmd "$node"
    await_slurmd "$node"
    note "slurmd of $node running (pid $(cat "$run/nodes/$node/slurmd.pid"))"
    return 0
  fi
  gantry_crash_netns "$holder" "$node"
  rm -f "$run/nodes/$node/slurmd.pid"
}

# cmd_slurmd_parameters VALUE: SlurmdParameters=config_overrides,VALUE in slurm.conf (config_overrides
# alone when VALUE is empty), then every node's slurmd stopped and started again, as a site does after changing it; waits
# until all nodes are idle. slurmctld keeps its own copy of the old file and logs a hash mismatch.
cmd_slurmd_parameters() {
  local value=${1:-} conf=$state/etc/slurm/slurm.conf node
  gantry_require_root "slurm$tag.sh slurmd-parameters"
  load_cluster_state || die "the Slurm $release harness is not running; start it: $invoke start"
  [[ $value =~ ^[a-z_,=0-9]*$ ]] || die "slurmd-parameters: '$value' is not a SlurmdParameters value (letters, digits, _ , =)"
  # config_overrides stays (gantry_slurm_conf_policy: the nodes claim more CPUs than the VM has); a
  # slurmctld started later with the line gone would set every node INVAL ("Low CPUs").
  sed -i '/^SlurmdParameters=/d' "$conf"
  echo "SlurmdParameters=config_overrides${value:+,$value}" >>"$conf"
  for node in $node_list; do stop_daemon "$run/nodes/$node/slurmd.pid" slurmd; done
  for node in $node_list; do spawn_slurmd "$node"; done
  for node in $node_list; do await_slurmd "$node"; done
  await_all_idle "restarting slurmd" "$run/nodes/*/slurmd.log"
  note "slurmd restarted on ${node_list% } with SlurmdParameters=${value:-(none)}"
}

# await_all_idle WHAT LOGS: waits (at most 60 s, a bound, not a timing) until sinfo reports every node
# of the cluster idle after WHAT; dies naming LOGS otherwise.
await_all_idle() {
  local nodes st i
  nodes=$(wc -w <<<"$node_list")
  for ((i = 0; i < 300; i++)); do
    st=$(in_root sinfo -h -N -o %t 2>/dev/null | sort | uniq -c | awk '{print $1, $2}' || true)
    [ "$st" = "$nodes idle" ] && return 0
    sleep 0.2
  done
  die "the nodes are not idle 60 s after $1 (sinfo: ${st:-nothing}); see $2"
}

# cmd_namespace off|mnt|pid|pid,user: Slurm's namespace/linux (25.11 and later) on every node, as a
# site turns it on: NamespaceType=namespace/linux and PrologFlags=Contain in slurm.conf, namespace.yaml
# beside it (a base_path of each node's own under the run dir, since the emulated nodes share the
# root's file systems; the default private /tmp and /dev/shm; clone_ns_flags: none for mnt, the job's
# own pid namespace for pid, and a user namespace too for pid,user), then slurmctld and every slurmd
# restarted; waits until all nodes are idle. off takes it all out again. No job may run.
cmd_namespace() {
  local mode=${1:-} conf=$state/etc/slurm/slurm.conf yaml=$state/etc/slurm/namespace.yaml flags node
  gantry_require_root "slurm$tag.sh namespace"
  load_cluster_state || die "the Slurm $release harness is not running; start it: $invoke start"
  case $mode in
    off) flags= ;;
    mnt) flags="[]" ;;
    pid) flags="[CLONE_NEWPID]" ;;
    pid,user) flags="[CLONE_NEWPID, CLONE_NEWUSER]" ;;
    *) die "namespace: '$mode' is not one of off, mnt, pid, pid,user" ;;
  esac
  [ "$release" != 24.11 ] || [ "$mode" = off ] || die "namespace/linux is in Slurm 25.11 and later, not $release"
  sed -i '/^NamespaceType=/d; /^PrologFlags=/d' "$conf"
  rm -f "$yaml"
  if [ "$mode" != off ]; then
    printf 'NamespaceType=namespace/linux\nPrologFlags=Contain\n' >>"$conf"
    printf '# Written by tests/harness/slurmroot.sh %s namespace %s.\ndefaults:\n  auto_base_path: true\n  base_path: "%s/namespace/%%n"\n  clone_ns_flags: %s\n' \
      "$release" "$mode" "$run" "$flags" >"$yaml"
    chmod 0644 "$yaml"
  fi
  for node in $node_list; do stop_daemon "$run/nodes/$node/slurmd.pid" slurmd; done
  stop_daemon "$run/slurmctld.pid" slurmctld
  spawn_slurmctld
  for node in $node_list; do spawn_slurmd "$node"; done
  for node in $node_list; do await_slurmd "$node"; done
  await_all_idle "restarting Slurm with namespace $mode" "$run/slurmctld.log and $run/nodes/*/slurmd.log"
  note "Slurm restarted with namespace/linux ${mode}"
}

case ${1:-} in
  root) gantry_require_root "slurm$tag.sh"; make_root; echo "$root" ;;
  build) cmd_build ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  exec) shift; cmd_exec "$@" ;;
  node-exec) shift; cmd_node_exec "$@" ;;
  crash-node) cmd_node crash "${2:-}" ;;
  start-node) cmd_node start "${2:-}" ;;
  slurmd-parameters) cmd_slurmd_parameters "${2:-}" ;;
  namespace) cmd_namespace "${2:-}" ;;
  *) echo "usage: $0 $release root | build | start | stop | status | exec [--] CMD... | node-exec NODE [--] CMD... | crash-node NODE | start-node NODE | slurmd-parameters [VALUE] | namespace off|mnt|pid|pid,user" >&2; exit 2 ;;
esac
