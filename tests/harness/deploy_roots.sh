#!/usr/bin/env bash
# Roots for the deployment builds (tests/integration/deploy_builds.bats): a ParallelCluster-like
# Debian 12 node whose Slurm lives under /opt/slurm, and a way to run commands in a throwaway copy of
# a cached root (an overlay whose changes go to a directory the caller names and removes).
#
#   deploy_roots.sh pcluster     make sure the ParallelCluster-like root exists; print its path
#   deploy_roots.sh run ROOT CHANGES [--stage NAME=ROOT2:CHANGES2]... -- CMD...
#                                run CMD as root in ROOT overlaid with CHANGES (created if missing);
#                                each --stage is mounted read-only at /.stages/NAME (Dockerfile
#                                `COPY --from=NAME`). ROOT itself is never written.
#
# The ParallelCluster root: debootstrap minbase bookworm (the shared tarball, tests/harness/lib.sh),
# with Debian's Slurm 22.05 client, plugins, libraries and headers unpacked and moved to /opt/slurm/
# {bin,lib,lib/slurm,include} the way ParallelCluster installs Slurm built from source: no Slurm
# package is known to dpkg, /usr/include/slurm does not exist, ld.so finds /opt/slurm/lib through
# /etc/ld.so.conf.d, and /opt/slurm/etc/slurm.conf names PluginDir=/opt/slurm/lib/slurm. The runtime
# libraries Slurm needs are installed with apt (no munge daemon: ParallelCluster builds its own), and
# the packages `install-deps --build-only --without-slurm-dev` installs are downloaded into apt's cache
# (not installed), so the test's install-deps run installs them without a long download. ccache is
# installed (a tool of the test, not of the node): deploy_builds.bats gives the node script's build the
# cache of harness.packages.build, the same tree with the same GCC 12 and flags, so that only what differs
# (the plugin, against /opt/slurm/include) is compiled again. Cached as
# $GANTRY_HARNESS_DIR/cache/pcluster-bookworm-<recipe hash>.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
cache=$GANTRY_HARNESS_DIR/cache

# Slurm's runtime libraries (Debian 12 names): what srun, scontrol and the plugins link.
slurm_runtime=(liblz4-1 libreadline8 libdbus-1-3 libhwloc15 libjson-c5 liblua5.1-0 libmunge2 libnuma1 libyaml-0-2)
slurm_debs=(slurm-client slurm-wlm-basic-plugins libslurm38 libslurm-dev)
# The build packages of scripts/install-deps (its build_packages list), for apt's download cache.
mapfile -t build_packages < <(sed -n '/^build_packages=(/,/^)/p' "$src/scripts/install-deps" | sed '1d;$d' | tr ' ' '\n' | grep -v '^$')
recipe_version=2  # bump when the steps in make_pcluster change
recipe=$(printf '%s\n' "$recipe_version" "${slurm_runtime[@]}" "${slurm_debs[@]}" "${build_packages[@]}" | sha256sum | cut -c1-16)
pcluster_root=$cache/pcluster-bookworm-$recipe

# chroot_run ROOT CMD...: CMD in ROOT from a private mount namespace with /proc and /dev mounted and
# this machine's resolver (apt reaches the mirror); the mounts vanish with the namespace.
chroot_run() {
  # shellcheck disable=SC2016  # expanded by the inner shell
  unshare --mount --propagation private bash -euc '
    R=$1; shift
    mount -t proc proc "$R/proc"
    mount --rbind /dev "$R/dev"
    cp -L /etc/resolv.conf "$R/etc/resolv.conf"
    exec chroot "$R" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 HOME=/root "$@"
  ' chroot_run "$@"
}

# make_pcluster: the cached root, built once; a caller that finds another building it (.ci/run prepares
# it in the background) waits for that on the lock and then finds it complete.
make_pcluster() {
  [ -f "$pcluster_root/.gantry-complete" ] && return 0
  gantry_require_root "building the ParallelCluster-like root (chroot, apt)"
  mkdir -p "$cache"
  local lock_fd
  exec {lock_fd}>"$cache/pcluster-bookworm.lock"
  # A deadline on the wait: another builder (apt, under a minute here) may hang on the mirror.
  flock -w 900 "$lock_fd" ||
    gantry_die "another process has been building the ParallelCluster-like root for 15 minutes (lock $cache/pcluster-bookworm.lock; see $cache/pcluster-root.log)"
  [ -f "$pcluster_root/.gantry-complete" ] || make_pcluster_locked
  exec {lock_fd}>&-
}

make_pcluster_locked() {
  local tarball tmp=$pcluster_root.partial log=$cache/pcluster-root.log t0=$SECONDS
  tarball=$(gantry_bookworm_minbase_tar)
  rm -rf --one-file-system "$tmp"
  mkdir -p "$tmp"
  tar -C "$tmp" --numeric-owner --xattrs --xattrs-include='*' -xpf "$tarball"
  mkdir -p "$tmp/etc/apt/sources.list.d"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && cp "$f" "$tmp$f"
  done
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 755 "$tmp/usr/sbin/policy-rc.d"
  gantry_note "building the ParallelCluster-like root $pcluster_root (apt from Debian's mirror; log: $log)"
  # shellcheck disable=SC2016  # expanded in the root
  if ! chroot_run "$tmp" bash -euc '
      n_runtime=$1; shift
      runtime=("${@:1:$n_runtime}"); shift "$n_runtime"
      n_debs=$1; shift
      debs=("${@:1:$n_debs}"); shift "$n_debs"
      build=("$@")
      apt-get update -q
      apt-get install -y -q --no-install-recommends "${runtime[@]}" ccache
      apt-get install -y -q --no-install-recommends --download-only "${build[@]}" squashfuse fuse3
      mkdir -p /tmp/slurm-debs /tmp/slurm-tree && cd /tmp/slurm-debs
      apt-get download "${debs[@]}"
      for d in *.deb; do dpkg-deb -x "$d" /tmp/slurm-tree; done
      t=/tmp/slurm-tree/usr
      arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
      mkdir -p /opt/slurm/bin /opt/slurm/lib/slurm /opt/slurm/include /opt/slurm/etc
      cp -a "$t"/bin/. /opt/slurm/bin/
      cp -a "$t/lib/$arch/slurm-wlm"/. /opt/slurm/lib/slurm/
      cp -a "$t/lib/$arch"/libslurm* /opt/slurm/lib/
      cp -a "$t/include/slurm" /opt/slurm/include/
      printf "%s\n" /opt/slurm/lib /opt/slurm/lib/slurm >/etc/ld.so.conf.d/slurm.conf
      ldconfig
      rm -rf /tmp/slurm-debs /tmp/slurm-tree
      cat >/opt/slurm/etc/slurm.conf <<EOC
# A ParallelCluster-like slurm.conf (tests/harness/deploy_roots.sh): Slurm under /opt/slurm.
ClusterName=pcluster
SlurmctldHost=localhost
AuthType=auth/munge
PluginDir=/opt/slurm/lib/slurm
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=compute Nodes=localhost Default=YES
EOC
      # ParallelCluster writes the node role here; this root is a head node.
      mkdir -p /etc/parallelcluster
      echo "cfn_node_type=HeadNode" >/etc/parallelcluster/cfnconfig
    ' root "${#slurm_runtime[@]}" "${slurm_runtime[@]}" "${#slurm_debs[@]}" "${slurm_debs[@]}" \
      "${build_packages[@]}" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -rf --one-file-system "$tmp"
    gantry_die "building the ParallelCluster-like root failed (log: $log)"
  fi
  [ ! -e "$tmp/usr/include/slurm" ] || gantry_die "the ParallelCluster-like root has /usr/include/slurm; it must only have /opt/slurm/include"
  touch "$tmp/.gantry-complete"
  mv "$tmp" "$pcluster_root"
  gantry_note "TIMING ParallelCluster-like root: $((SECONDS - t0)) s"
  local old
  for old in "$cache"/pcluster-bookworm-*; do
    [ "$old" = "$pcluster_root" ] || [ "$old" = "$pcluster_root.partial" ] || rm -rf --one-file-system "$old"
  done
}

# cmd_run ROOT CHANGES [--stage NAME=ROOT2:CHANGES2]... -- CMD...
cmd_run() {
  gantry_require_root "running a command in an overlay root (mounts, chroot)"
  [ $# -ge 2 ] || gantry_die "usage: deploy_roots.sh run ROOT CHANGES [--stage NAME=ROOT2:CHANGES2]... -- CMD..."
  local root=$1 changes=$2 stages=()
  shift 2
  [ -f "$root/.gantry-complete" ] || gantry_die "$root is not a complete cached root"
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    if [ "$1" != --stage ] || [ $# -lt 2 ]; then
      gantry_die "deploy_roots.sh run: unexpected '$1' (--stage NAME=ROOT:CHANGES or --)"
    fi
    stages+=("$2")
    shift 2
  done
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || gantry_die "deploy_roots.sh run: no command"
  mkdir -p "$changes"/{upper,work,merged}
  local s
  for s in "${stages[@]}"; do mkdir -p "${s#*:}"/{upper,work,merged}; done
  # Everything is mounted in a namespace of its own: nothing of the host's mount table changes, and
  # the overlays vanish with the command.
  # shellcheck disable=SC2016  # expanded by the inner shell
  unshare --mount --propagation private bash -euc '
    root=$1 changes=$2 n=$3; shift 3
    stages=("${@:1:$n}"); shift "$n"
    m=$changes/merged
    mount -t overlay overlay -o "lowerdir=$root,upperdir=$changes/upper,workdir=$changes/work" "$m"
    for s in "${stages[@]}"; do
      name=${s%%=*} rest=${s#*=}
      sroot=${rest%%:*} schanges=${rest#*:}
      mount -t overlay overlay -o "lowerdir=$schanges/upper:$sroot" "$schanges/merged"
      mkdir -p "$m/.stages/$name"
      mount --bind "$schanges/merged" "$m/.stages/$name"
    done
    mount -t proc proc "$m/proc"
    mount --rbind /dev "$m/dev"
    cp -L /etc/resolv.conf "$m/etc/resolv.conf"
    exec chroot "$m" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 HOME=/root "$@"
  ' run "$root" "$changes" "${#stages[@]}" "${stages[@]}" "$@"
}

case ${1:-} in
  pcluster) make_pcluster; echo "$pcluster_root" ;;
  run) shift; cmd_run "$@" ;;
  *) echo "usage: $0 pcluster | run ROOT CHANGES [--stage NAME=ROOT2:CHANGES2]... -- CMD..." >&2; exit 2 ;;
esac
