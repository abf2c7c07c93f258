#!/bin/bash
# AWS ParallelCluster OnNodeConfigured custom action: installs Gantry on a head or compute node and
# configures it for the cluster (store on FSx for Lustre, scratch on local NVMe). See docs/admin.md,
# "AWS ParallelCluster", and cluster-snippet.yaml beside this file.
#
#   gantry-node.sh (--deb URL|PATH --rpm URL|PATH | --source DIR|URL [--publish DIR] [--build-dir DIR])
#                  [--store DIR] [--store-owner NAME] [--store-uid UID] [--gc-max-bytes SIZE]
#                  [--gc-unused-for AGE] [--slurm-prefix DIR]
#
# URLs may be s3:// (aws cli, the node's instance role), https:// or a local path. Only the package
# matching the node's distribution is fetched. The packages must be built against the cluster's Slurm
# (/opt/slurm/include) with -DGANTRY_PACKAGE_SLURM_DEPENDS=OFF (docs/admin.md).
# --source builds that package here instead (Ubuntu/Debian nodes): DIR is Gantry's source tree, a URL
# or path a tarball of it (`git archive`). The build dependencies come from apt
# (scripts/install-deps --build-only --without-slurm-dev: no distribution Slurm), Slurm's headers
# from SLURM_PREFIX/include (default /opt/slurm), the build directory is /var/tmp/gantry-build
# (--build-dir DIR: elsewhere, e.g. on a larger disk; its logs are DIR.*.log).
# --publish DIR copies the built .deb to DIR as gantry.deb (shared storage, e.g.
# /opt/parallelcluster/shared/gantry), so the compute nodes install the head node's build with --deb.
#
# The store is a trusted shared store (docs/store.md): owned by an unprivileged system account
# (--store-owner, default gantry) with the same uid on every node (--store-uid, default 3939: the store's
# files belong to that uid on the shared file system), writable by nobody else. Jobs pull into it through
# the plugin as that account after the registry authorised the job user; the kernel mounts its images.
# Every node: install the package, create the store account, write /etc/gantry/gantry.conf, create the
# NVMe scratch directory.
# Head node only (/opt/slurm/etc is NFS-shared with the compute nodes, so it is written once): create
# the store, disable Pyxis, write the plugstack line, install the gc cron entry (run as the store's
# owner, never as root), and check that srun
# loads the plugin; on failure the plugstack line is removed again and the script fails, so cluster
# creation stops with a message instead of every job failing.
set -euo pipefail

deb="" rpm="" source="" publish="" slurm_prefix=/opt/slurm build_dir=/var/tmp/gantry-build build_dir_given=0
store=/fsx/gantry owner=gantry owner_uid=3939 gc_max=2T gc_age=30d
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "gantry-node: $1 needs a value" >&2; exit 2; }
  case $1 in
    --deb) deb=$2; shift 2 ;;
    --rpm) rpm=$2; shift 2 ;;
    --source) source=$2; shift 2 ;;
    --publish) publish=$2; shift 2 ;;
    --build-dir) build_dir=$2 build_dir_given=1; shift 2 ;;
    --slurm-prefix) slurm_prefix=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --store-owner) owner=$2; shift 2 ;;
    --store-uid) owner_uid=$2; shift 2 ;;
    --gc-max-bytes) gc_max=$2; shift 2 ;;
    --gc-unused-for) gc_age=$2; shift 2 ;;
    *) echo "gantry-node: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

log() { echo "gantry-node: $*"; }
die() { echo "gantry-node: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (ParallelCluster runs custom actions as root)"

# ParallelCluster writes the node's role here (HeadNode, ComputeFleet, LoginNode).
node_type=unknown
if [ -r /etc/parallelcluster/cfnconfig ]; then
  # shellcheck disable=SC1091  # written by ParallelCluster at boot
  . /etc/parallelcluster/cfnconfig
  node_type=${cfn_node_type:-unknown}
fi
slurm_etc=$slurm_prefix/etc
srun_bin=$slurm_prefix/bin/srun
# srun (the check below) and gantry doctor read this slurm.conf; on ParallelCluster it is also the
# default compiled into Slurm, elsewhere it may not be.
if [ -z "${SLURM_CONF:-}" ] && [ -e "$slurm_etc/slurm.conf" ]; then export SLURM_CONF=$slurm_etc/slurm.conf; fi
if [ -n "$source" ] && { [ -n "$deb" ] || [ -n "$rpm" ]; }; then
  die "--source builds the package here; give it or --deb/--rpm, not both"
fi
[ -z "$publish" ] || [ -n "$source" ] || die "--publish copies the package --source built; it needs --source"
[ $build_dir_given -eq 0 ] || [ -n "$source" ] || die "--build-dir is where --source builds the package; it needs --source"
[[ $build_dir == /* ]] || die "--build-dir $build_dir: give an absolute path"

# fetch SRC DEST: copy a package from S3, HTTPS or a local path.
fetch() {
  case $1 in
    s3://*) aws s3 cp --only-show-errors "$1" "$2" ;;
    http://*|https://*) curl -fsSL --retry 5 -o "$2" "$1" ;;
    *) cp "$1" "$2" ;;
  esac
}

# build_deb SOURCE: build the .deb from Gantry's source against $slurm_prefix/include; prints its path.
build_deb() {
  local tree=$1 build=$build_dir
  [ -f "$slurm_prefix/include/slurm/spank.h" ] ||
    die "no $slurm_prefix/include/slurm/spank.h: --source needs the cluster's Slurm headers (pass --slurm-prefix if Slurm is not under /opt/slurm)"
  if [ ! -d "$tree" ]; then
    case $tree in
      s3://*|http://*|https://*) ;;
      *) [ -f "$tree" ] || die "--source $tree: no such directory or file (give Gantry's source tree or a tarball of it)" ;;
    esac
    fetch "$tree" "$work/gantry-src.tar"
    mkdir "$work/src"
    tar -C "$work/src" -xf "$work/gantry-src.tar" ||
      die "--source $tree is neither a directory nor a tarball of Gantry's source"
    tree=$work/src
    # A tarball of a directory (gantry-0.1.0/...) rather than of the tree's contents.
    if [ ! -e "$tree/CMakeLists.txt" ] && [ "$(find "$tree" -mindepth 1 -maxdepth 1 | wc -l)" -eq 1 ]; then
      tree=$(find "$tree" -mindepth 1 -maxdepth 1)
    fi
  fi
  if [ ! -f "$tree/CMakeLists.txt" ] || [ ! -x "$tree/packaging/build-packages.sh" ] || [ ! -x "$tree/scripts/install-deps" ]; then
    die "--source $tree is not Gantry's source tree (no CMakeLists.txt, packaging/build-packages.sh or scripts/install-deps)"
  fi
  log "installing the build dependencies (scripts/install-deps --build-only --without-slurm-dev)" >&2
  "$tree/scripts/install-deps" --build-only --without-slurm-dev >&2 || die "installing the build dependencies failed (message above)"
  log "building the .deb against $slurm_prefix/include in $build (logs: $build.*.log)" >&2
  # The plugin outside Slurm's tree (/usr/lib/gantry): /opt/slurm is NFS-exported from the head node,
  # the package's files are node-local.
  GANTRY_PACKAGE_BUILD_DIR=$build "$tree/packaging/build-packages.sh" --deb-only -- \
    -DGANTRY_PACKAGE_SLURM_DEPENDS=OFF "-DSLURM_INCLUDE_DIR=$slurm_prefix/include" -DGANTRY_SLURM_PLUGIN_DIR=lib/gantry \
    | sed -n 's/^deb: //p'
}

# ---------------------------------------------------------------- install the package

# shellcheck disable=SC1091  # the distribution's own file
. /etc/os-release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "${ID}:${VERSION_ID%%.*}" in
  ubuntu:*|debian:*)
    if [ -n "$source" ]; then
      built=$(build_deb "$source")
      [ -f "$built" ] || die "building the .deb from $source failed (logs: $build_dir.*.log)"
      cp "$built" "$work/gantry.deb"
      if [ -n "$publish" ]; then
        install -d -m 0755 "$publish"
        install -m 0644 "$built" "$publish/gantry.deb"
        log "published the package as $publish/gantry.deb (compute nodes: --deb $publish/gantry.deb)"
      fi
    else
      [ -n "$deb" ] || die "$PRETTY_NAME needs the .deb (--deb) or Gantry's source to build it (--source)"
      fetch "$deb" "$work/gantry.deb"
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # apt resolves squashfuse, fuse3 and the libraries from the distribution (universe on Ubuntu).
    apt-get install -y -q "$work/gantry.deb"
    plugin=$(dpkg -L gantry | grep '/spank_gantry\.so$' | head -1)
    ;;
  amzn:2)
    [ -z "$source" ] || die "--source builds with apt (Ubuntu, Debian); on $PRETTY_NAME build the .rpm on a build host and pass --rpm"
    [ -n "$rpm" ] || die "$PRETTY_NAME needs the .rpm (--rpm)"
    fetch "$rpm" "$work/gantry.rpm"
    yum install -y "$work/gantry.rpm"
    plugin=$(rpm -ql gantry | grep '/spank_gantry\.so$' | head -1)
    ;;
  amzn:*|rhel:*|rocky:*|almalinux:*|centos:*)
    [ -z "$source" ] || die "--source builds with apt (Ubuntu, Debian); on $PRETTY_NAME build the .rpm on a build host and pass --rpm"
    [ -n "$rpm" ] || die "$PRETTY_NAME needs the .rpm (--rpm)"
    fetch "$rpm" "$work/gantry.rpm"
    # squashfuse: EPEL on RHEL-likes; Amazon Linux 2023 has no EPEL, see docs/admin.md.
    dnf install -y "$work/gantry.rpm" ||
      die "installing the .rpm failed; if squashfuse is missing, install it first (EPEL, or a local build)"
    plugin=$(rpm -ql gantry | grep '/spank_gantry\.so$' | head -1)
    ;;
  *) die "unsupported distribution ${PRETTY_NAME:-$ID} (Ubuntu, Amazon Linux 2/2023 and RHEL-likes are)" ;;
esac
[ -n "$plugin" ] || die "the installed package holds no spank_gantry.so"
log "installed $(gantry --version) on $PRETTY_NAME ($node_type), plugin $plugin"

# ---------------------------------------------------------------- node configuration

# Local NVMe for the bulk data of running containers: DLAMI mounts instance store at /opt/dlami/nvme,
# ParallelCluster's EphemeralVolume defaults to /scratch. runtime_path stays on /run/gantry: it holds
# only small records and locks, which must not survive a reboot.
scratch=/tmp
for d in /opt/dlami/nvme /scratch; do
  if mountpoint -q "$d"; then scratch=$d/gantry; break; fi
done
# Mode 1777 like /tmp: every user's writable layers and extracted images live here.
install -d -m 1777 "$scratch"
if ! mountpoint -q "$(dirname "$store")"; then
  log "warning: $(dirname "$store") is not mounted here; the store must be on shared storage (SharedStorage in the cluster config)"
fi
# The store's account: the same name and uid on every node, no login, no home.
if id -u "$owner" >/dev/null 2>&1; then
  [ "$(id -u "$owner")" = "$owner_uid" ] ||
    die "account $owner exists with uid $(id -u "$owner"), expected $owner_uid (--store-uid): the store's files need one uid on every node"
else
  getent passwd "$owner_uid" >/dev/null && die "uid $owner_uid is taken by $(getent passwd "$owner_uid" | cut -d: -f1); pick another --store-uid"
  getent group "$owner_uid" >/dev/null || groupadd --system --gid "$owner_uid" "$owner"
  useradd --system --uid "$owner_uid" --gid "$owner_uid" --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "Gantry image store" "$owner"
  log "created the store account $owner (uid $owner_uid)"
fi
install -d -m 0755 /etc/gantry
cat >/etc/gantry/gantry.conf <<EOF
# Written by gantry-node.sh (ParallelCluster OnNodeConfigured); see gantry.conf(5).
store_path = $store
store_owner = $owner
runtime_path = /run/gantry
scratch_path = $scratch
EOF
install -d -m 0755 /run/gantry
log "wrote /etc/gantry/gantry.conf: store $store, scratch $scratch"

[ "$node_type" = HeadNode ] || exit 0

# ---------------------------------------------------------------- head node: cluster-wide settings

# The trusted store: the account owns it, nobody else may write it (not a 1777 directory: there any
# user could plant files under a digest others use, docs/store.md).
if [ -e "$store" ] && [ "$(stat -c %u "$store")" != "$owner_uid" ]; then
  die "$store exists and is owned by uid $(stat -c %u "$store"), not $owner ($owner_uid); move it away (an old world-writable store is not safe to keep) or pass --store"
fi
for d in "" images refs used locks staging; do install -d -o "$owner" -g "$owner" -m 0755 "$store/$d"; done

install -d -m 0755 "$slurm_etc/plugstack.conf.d"
# Pyxis and Gantry both register --container-image; only one may be loaded. Older ParallelCluster
# releases put Pyxis's line into plugstack.conf itself, newer ones into plugstack.conf.d/.
shopt -s nullglob
for f in "$slurm_etc"/plugstack.conf.d/*.conf; do
  if [ -e "$f" ] && grep -q 'spank_pyxis\.so' "$f"; then
    # Out of the directory: an include of plugstack.conf.d/* would still read a renamed file there.
    mv "$f" "$slurm_etc/$(basename "$f").disabled-by-gantry"
    log "disabled Pyxis: moved $f to $slurm_etc/$(basename "$f").disabled-by-gantry"
  fi
done
if [ -e "$slurm_etc/plugstack.conf" ] && grep -Eq '^[[:space:]]*(required|optional).*spank_pyxis\.so' "$slurm_etc/plugstack.conf"; then
  sed -i.gantry-orig -E 's/^([[:space:]]*(required|optional).*spank_pyxis\.so.*)$/# disabled by gantry-node.sh: \1/' "$slurm_etc/plugstack.conf"
  log "disabled Pyxis in $slurm_etc/plugstack.conf (original kept as plugstack.conf.gantry-orig)"
fi
line="required $plugin config=/etc/gantry/gantry.conf"
echo "$line" >"$slurm_etc/plugstack.conf.d/gantry.conf"
# Slurm's default PlugStackConfig is plugstack.conf beside slurm.conf: make it include the directory.
include="include $slurm_etc/plugstack.conf.d/*.conf"
if [ ! -e "$slurm_etc/plugstack.conf" ] || ! grep -Eq "^[[:space:]]*include[[:space:]]+$slurm_etc/plugstack.conf.d/" "$slurm_etc/plugstack.conf"; then
  echo "$include" >>"$slurm_etc/plugstack.conf"
  log "added '$include' to $slurm_etc/plugstack.conf"
fi

# The plugin refuses to load into another Slurm release than it was built for; catch that here.
if ! "$srun_bin" --help 2>"$work/srun.err" | grep -q -- '--container-image'; then
  rm -f "$slurm_etc/plugstack.conf.d/gantry.conf"
  cat "$work/srun.err" >&2
  die "srun does not load $plugin (message above); plugstack line removed. Rebuild Gantry against this Slurm (docs/admin.md)"
fi
log "enabled: $line"

# Least recently used images go first; images in use are never removed (docs/admin.md). Run as the
# store's owner, not root: gc removes files, and only the owner may write the store anyway.
install -m 0644 -o "$owner" -g "$owner" /dev/null /var/log/gantry-gc.log
install -d -m 0755 /etc/cron.d
cat >/etc/cron.d/gantry-gc <<EOF
# Written by gantry-node.sh: daily cleanup of the shared Gantry store, on the head node only.
17 3 * * * $owner /usr/bin/gantry gc --store $store --max-bytes $gc_max --unused-for $gc_age >>/var/log/gantry-gc.log 2>&1
EOF
log "gc: daily, --max-bytes $gc_max --unused-for $gc_age"
