#!/usr/bin/env bash
# Installs the gantry .deb into a clean Debian 12 root made by debootstrap, the way an admin would
# (apt-get install with Debian's mirror, so every dependency comes from Debian), and checks the result:
# files in place, conffiles registered, `gantry --version` runs, installing enabled nothing, Debian's
# own srun loads the packaged plugin once the admin uncomments its line, and a locally edited
# gantry.conf survives a reinstall.
#
#   packaging/test-install.sh [--deb PATH] [--keep]
#
# Without --deb the package is built first (packaging/build-packages.sh --deb-only). The debootstrap
# result is cached as $GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar, the same file (same
# recipe) tests/images/build.sh makes, so either reuses the other's. --keep leaves the root in place.
# Needs root (debootstrap, chroot) and the apt mirror of /etc/apt/sources.list*.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=/dev/null  # tests/harness/lib.sh, found at run time
. "$src/tests/harness/lib.sh"

deb=""
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --deb) deb=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) gantry_die "test-install: unknown argument '$1' (see --help)" ;;
  esac
done

gantry_require_root "installing a package into a debootstrap root (chroot, mounts)"
for t in debootstrap:debootstrap dpkg-deb:dpkg unshare:util-linux; do gantry_require_cmd "${t%%:*}" "${t#*:}"; done

start=$(date +%s)
H=$GANTRY_HARNESS_DIR
cache=$H/cache
mkdir -p "$cache"

if [ -z "$deb" ]; then
  gantry_note "building the .deb (packaging/build-packages.sh --deb-only)"
  deb=$("$src/packaging/build-packages.sh" --deb-only | sed -n 's/^deb: //p')
fi
[ -f "$deb" ] || gantry_die "test-install: no package at '$deb'"
deb=$(readlink -f "$deb")

# Same file as tests/images/build.sh and the deployment builds use (tests/harness/lib.sh).
tarball=$(gantry_bookworm_minbase_tar)

root=$(mktemp -d "${TMPDIR:-/tmp}/gantry-install-root.XXXXXX")
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { if [ "$keep" -eq 0 ]; then rm -rf "$root"; else gantry_note "root kept at $root"; fi; }
trap cleanup EXIT
tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' -xpf "$tarball"

# apt inside the root uses this machine's mirror configuration; no service may start in a chroot.
mkdir -p "$root/etc/apt/sources.list.d"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && cp "$f" "$root$f"
done
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
cp "$deb" "$root/tmp/gantry.deb"

# root_run COMMAND...: COMMAND in the root, from a private mount namespace with /proc and /dev mounted
# for apt and dpkg; they vanish with the namespace, whatever happens. Safe: the host's mount table is
# never changed, and the root holds only Debian's packages and ours.
root_run() {
  # shellcheck disable=SC2016  # expanded by the inner shell
  ROOT=$root unshare --mount --propagation private bash -euc '
    mount -t proc proc "$ROOT/proc"
    mount --rbind /dev "$ROOT/dev"
    exec chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"
  ' root_run "$@"
}

log=$H/test-install.log
gantry_note "installing $(basename "$deb") with apt in $root (log: $log)"
{ root_run apt-get update -q && root_run apt-get install -y -q --no-install-recommends /tmp/gantry.deb; } >"$log" 2>&1 ||
  { tail -n 30 "$log" >&2; gantry_die "test-install: apt-get install of the .deb failed (log: $log)"; }

fail=0
check() {  # check DESCRIPTION COMMAND...: run the command, report, remember failures.
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }

libdir=usr/lib/x86_64-linux-gnu
check "dpkg: gantry installed" bash -c "[ \"\$(chroot '$root' dpkg-query -W -f='\${Status}' gantry)\" = 'install ok installed' ]"
for f in usr/bin/gantry $libdir/slurm-wlm/spank_gantry.so etc/gantry/gantry.conf \
  etc/slurm/plugstack.conf.d/gantry.conf usr/lib/tmpfiles.d/gantry.conf usr/share/man/man1/gantry.1.gz \
  usr/share/man/man5/gantry.conf.5.gz usr/share/doc/gantry/copyright usr/share/doc/gantry/admin.md; do
  check "file /$f" test -s "$root/$f"
done
contents=$(dpkg-deb -c "$deb")
if grep -q 'libexec/gantry/gantry-entry' <<<"$contents"; then
  check "file /usr/libexec/gantry/gantry-entry executable" test -x "$root/usr/libexec/gantry/gantry-entry"
fi
check "file /usr/libexec/gantry/gantry-holder executable" test -x "$root/usr/libexec/gantry/gantry-holder"
check "file /usr/libexec/gantry/gantry-imagefs executable" test -x "$root/usr/libexec/gantry/gantry-imagefs"
version=$(in_root gantry --version 2>&1 || true)
echo "     chroot: gantry --version -> $version"
check "gantry --version runs in the root" bash -c "[[ '$version' =~ ^gantry\ [0-9]+\.[0-9]+\.[0-9]+ ]]"
check "no library of gantry or the plugin is missing" bash -c "! chroot '$root' ldd /usr/bin/gantry /usr/libexec/gantry/gantry-holder /usr/libexec/gantry/gantry-imagefs /$libdir/slurm-wlm/spank_gantry.so | grep -q 'not found'"
check "conffiles: /etc/gantry/gantry.conf and plugstack.conf.d/gantry.conf" bash -c \
  "c=\$(chroot '$root' dpkg-query -W -f='\${Conffiles}' gantry); grep -q '/etc/gantry/gantry.conf ' <<<\"\$c\" && grep -q '/etc/slurm/plugstack.conf.d/gantry.conf ' <<<\"\$c\""
check "plugstack.conf.d/gantry.conf enables nothing (every line commented)" bash -c \
  "! grep -Evq '^[[:space:]]*(#|\$)' '$root/etc/slurm/plugstack.conf.d/gantry.conf'"
check "Debian's plugstack.conf unchanged (no postinst edits)" bash -c \
  "chroot '$root' dpkg --verify slurm-wlm-basic-plugins | { ! grep -q plugstack; }"
check "tmpfiles entry declares /run/gantry (root, 0755)" grep -q '^d /run/gantry 0755 root root' "$root/usr/lib/tmpfiles.d/gantry.conf"
slurm=$(in_root dpkg-query -W -f="\${Version}" slurm-wlm-basic-plugins 2>/dev/null || true)
echo "     chroot: slurm-wlm-basic-plugins $slurm (pulled in by the .deb's dependencies)"

# Debian's own srun from the root's packages: before the admin enables the plugin, srun knows no
# --container-image; after uncommenting the line it does (srun --help lists SPANK options).
cat >"$root/etc/slurm/slurm.conf" <<'EOF'
ClusterName=pkgtest
SlurmctldHost=localhost
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES
EOF
root_run apt-get install -y -q --no-install-recommends slurm-client >>"$log" 2>&1 || { tail -n 20 "$log" >&2; gantry_die "test-install: installing slurm-client in the root failed (log: $log)"; }
before=$(in_root srun --help 2>&1 || true)
check "installing did not enable the plugin (srun --help lacks --container-image)" bash -c "! grep -q -- '--container-image' <<<\"\$1\"" _ "$before"
sed -i 's|^#required |required |' "$root/etc/slurm/plugstack.conf.d/gantry.conf"
after=$(in_root srun --help 2>&1 || true)
check "Debian's srun loads the packaged plugin once enabled (--container-image listed)" bash -c "grep -q -- '--container-image' <<<\"\$1\"" _ "$after"
if ! grep -q -- '--container-image' <<<"$after"; then echo "$after" | tail -n 5 | sed 's/^/     srun: /'; fi

# A reinstall keeps the admin's edits of a conffile.
echo 'store_path = /fsx/gantry-local-edit' >>"$root/etc/gantry/gantry.conf"
root_run dpkg -i /tmp/gantry.deb >>"$log" 2>&1 || { tail -n 20 "$log" >&2; gantry_die "test-install: reinstalling the .deb failed (log: $log)"; }
check "reinstall keeps the locally edited /etc/gantry/gantry.conf" grep -q gantry-local-edit "$root/etc/gantry/gantry.conf"

echo "test-install: $(basename "$deb") in a debootstrap root, $(( $(date +%s) - start )) s; $([ $fail -eq 0 ] && echo 'all checks passed' || echo 'FAILURES above')"
exit $fail
