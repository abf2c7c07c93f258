#!/usr/bin/env bash
# The "done when" of the packaging issue, on this host: the single-node Slurm harness (Debian's
# slurmctld/slurmd) loads spank_gantry.so and runs the gantry CLI as extracted from the .deb — nothing
# from a build tree — and `srun --container-image=...` runs ranks in the test registry's tiny image.
#
#   packaging/test-harness-srun.sh --deb PATH
#
# Needs root, the registry and the tiny image in $GANTRY_HARNESS_DIR (tests/harness/registry.sh start;
# tests/images/build.sh --only tiny), and the single-node cluster of that harness dir (slurm.sh start
# --nodes 1; it reads only its own slurm.conf, through slurm.env's SLURM_CONF, which runuser keeps for
# the job user): it holds /tmp/gantry-slurm.lock from `slurm.sh start` to `stop` (waiting for another
# holder first).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=/dev/null  # tests/harness/lib.sh, found at run time
. "$src/tests/harness/lib.sh"
deb=""
while [ $# -gt 0 ]; do
  case $1 in
    --deb) deb=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) gantry_die "test-harness-srun: unknown argument '$1' (see --help)" ;;
  esac
done
[ -f "$deb" ] || gantry_die "test-harness-srun: --deb PATH is required"
gantry_require_root "starting the Slurm harness"
H=$GANTRY_HARNESS_DIR
for f in registry images; do
  [ -r "$H/$f.env" ] || gantry_die "test-harness-srun: missing $H/$f.env; start the registry and build the tiny image first"
  # shellcheck disable=SC1090
  . "$H/$f.env"
done

# The package's files, readable by the job user (the plugin runs the CLI as that user).
pkg=$H/pkgroot
rm -rf "$pkg"
dpkg-deb -x "$deb" "$pkg"
chmod 755 "$H" "$pkg"
plugin=$pkg/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so
cli=$pkg/usr/bin/gantry
conf=$H/gantry-packaged.conf

fail=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}

exec 9>/tmp/gantry-slurm.lock
gantry_note "waiting for /tmp/gantry-slurm.lock (one harness cluster per machine)"
flock -w 1800 9 || gantry_die "test-harness-srun: another harness cluster held the lock for 30 minutes"
trap '"$src/tests/harness/slurm.sh" stop >/dev/null 2>&1 || true' EXIT
GANTRY_PLUGIN=$plugin GANTRY_PLUGSTACK_ARGS="config=$conf gantry=$cli" \
  "$src/tests/harness/slurm.sh" start --nodes 1 >"$H/test-harness-srun.log" 2>&1 ||
  { tail -n 20 "$H/test-harness-srun.log" >&2; gantry_die "test-harness-srun: slurm.sh start failed"; }
# shellcheck disable=SC1091
. "$H/slurm.env"
# The configuration exactly as the package ships it (no store_path: each user's own store below the
# home directory in the account database): the default must work out of the box.
cp "$pkg/etc/gantry/gantry.conf" "$conf"
user_store=$(getent passwd "$GANTRY_TEST_USER" | cut -d: -f6)/.cache/gantry
rm -rf "$user_store"
work=$(mktemp -d "$GANTRY_TEST_FSX/pkg-srun.XXXXXX")
chown "$GANTRY_TEST_USER" "$work"
as_user() { runuser -u "$GANTRY_TEST_USER" -- env -C "$work" "$@"; }

check "plugstack.conf names the plugin from the .deb" grep -q "^required $plugin " "$H/slurm/plugstack.conf"
help=$(as_user srun --help 2>&1 || true)
check "srun --help lists --container-image" grep -q -- '--container-image' <<<"$help"
image="$GANTRY_TEST_REGISTRY_HTTP#gantry-test/tiny"
t0=$(date +%s.%N)
# shellcheck disable=SC2016  # expanded by the rank's shell
out=$(as_user srun -n2 --container-image="$image" sh -c 'cat /work/README; echo "digest=$GANTRY_CONTAINER_IMAGE_DIGEST"' 2>&1) || true
t1=$(date +%s.%N)
while IFS= read -r line; do echo "     srun: $line"; done <<<"$out"
check "srun -n2 --container-image: both ranks read the image's /work/README" \
  test "$(grep -c '^tiny work dir$' <<<"$out")" -eq 2
check "both ranks run the registry's digest" test "$(grep -c "^digest=$GANTRY_TEST_DIGEST_TINY\$" <<<"$out")" -eq 2
out2=$(as_user srun -n2 --container-image="$image" cat /work/README 2>&1) || true
t2=$(date +%s.%N)
check "a second step reuses the stored image" test "$(grep -c '^tiny work dir$' <<<"$out2")" -eq 2
# Stored whole (<hex>.sqsh) or as layers (its record and layer files), as the shipped gantry.conf says.
stored() {
  local images=$user_store/images hex=${GANTRY_TEST_DIGEST_TINY#sha256:}
  test -f "$images/$hex.json" && { test -f "$images/$hex.sqsh" || compgen -G "$images/layer-*.sqsh" >/dev/null; }
}
check "the user's own store holds the image the CLI from the .deb pulled" stored
check "the shipped gantry.conf was used unchanged" cmp -s "$pkg/etc/gantry/gantry.conf" "$conf"
rm -rf "$work" "$user_store"
printf 'test-harness-srun: first srun (pull + convert + run) %.2f s, second srun %.2f s; %s\n' \
  "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$([ $fail -eq 0 ] && echo 'all checks passed' || echo 'FAILURES above')"
exit $fail
