# fixtures: registry images slurm
# The fake root of --remap-root / --container-remap-root installs packages: every container process runs
# under the system call filter (runtime/launcher/seccomp.cpp) that answers the chown and set*id
# families with success, so dpkg and apt work although the user namespace maps one id. Offline: a
# tiny .deb built here (owned by a foreign uid, as real packages' files often are) and a file:
# repository bound into the harness's debian image, through `gantry run` and through srun.

load helpers

setup_file() {
  gantry_load_env registry images slurm
  export GANTRY="$GANTRY_BUILD_DIR/runtime/gantry"
  [ -x "$GANTRY" ] || { echo "gantry not built at $GANTRY" >&2; return 1; }
  export U=$GANTRY_TEST_USER
  # The debian image as a squashfs file for `gantry run` (from the images fixture's debootstrap),
  # readable by the test user; rebuilt when that tarball changes.
  local tarball=$GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar dir=$GANTRY_HARNESS_DIR/cache/remap-root
  export DEBIAN_SQSH=$dir/debian.sqsh
  if [ ! -s "$DEBIAN_SQSH" ] || [ "$tarball" -nt "$DEBIAN_SQSH" ]; then
    rm -rf "$dir" && mkdir -p "$dir/root"
    tar -C "$dir/root" --numeric-owner -xpf "$tarball"
    mksquashfs "$dir/root" "$DEBIAN_SQSH" -comp lz4 -noappend -quiet -no-progress
    rm -rf "$dir/root"
  fi
  chmod 755 "$GANTRY_HARNESS_DIR/cache" "$dir"
  chmod 644 "$DEBIAN_SQSH"
  # A file: repository with one package whose file belongs to uid/gid 1234 (dpkg chowns it on unpack).
  export REPO
  REPO=$(mktemp -d "$GANTRY_TEST_FSX/remap-root-repo.XXXXXX")
  local pkg=$BATS_FILE_TMPDIR/pkg
  mkdir -p "$pkg/DEBIAN" "$pkg/opt/gantry-hello"
  printf '%s\n' 'Package: gantry-hello' 'Version: 1.0' 'Architecture: all' \
    'Maintainer: Gantry tests <tests@gantry.invalid>' 'Description: a tiny package for the remap-root tests' \
    > "$pkg/DEBIAN/control"
  echo hello > "$pkg/opt/gantry-hello/hello"
  chown -R 1234:1234 "$pkg/opt/gantry-hello"
  dpkg-deb --build "$pkg" "$REPO/gantry-hello_1.0_all.deb" >/dev/null
  (cd "$REPO" && dpkg-scanpackages . /dev/null > Packages 2>/dev/null)
  echo 'deb [trusted=yes] file:/repo ./' > "$REPO/sources.list"
  chmod -R a+rX "$REPO"
}

teardown_file() {
  rm -rf "$REPO"
}

grun() { runuser -u "$U" -- "$GANTRY" run "$@"; }

# apt-get with the bound file: repository as its only source (the test sandbox has no network).
APT="apt-get -q -o Dir::Etc::SourceList=/repo/sources.list -o Dir::Etc::SourceParts=/nonexistent"

@test "gantry run: Seccomp 2 in every container, with and without --remap-root" {
  run grun "$DEBIAN_SQSH" grep Seccomp: /proc/self/status
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
  run grun --remap-root "$DEBIAN_SQSH" grep Seccomp: /proc/self/status
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
}

@test "gantry run --remap-root --writable: dpkg -i of a package with foreign-owned files succeeds" {
  run grun --remap-root --writable --mount "$REPO:/repo:ro" "$DEBIAN_SQSH" sh -c \
    'dpkg -i /repo/gantry-hello_1.0_all.deb && dpkg -s gantry-hello | grep ^Status && cat /opt/gantry-hello/hello &&
     stat -c %u:%g /opt/gantry-hello/hello'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-3]}" = "Status: install ok installed" ]
  [ "${lines[-2]}" = "hello" ]
  [ "${lines[-1]}" = "0:0" ]  # the chown was a no-op: the file belongs to the fake root (the user)
}

@test "gantry run --remap-root --writable: apt-get update and install from a file: repository" {
  run grun --remap-root --writable --mount "$REPO:/repo:ro" "$DEBIAN_SQSH" sh -c \
    "$APT update && DEBIAN_FRONTEND=noninteractive $APT install -y gantry-hello && cat /opt/gantry-hello/hello"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "hello" ]
}

@test "srun --container-remap-root --container-writable: Seccomp 2, uid 0, dpkg -i and apt-get install work" {
  gantry_cluster_registry
  gantry_plugin_conf
  local debian="$REG#gantry-test/debian"
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$debian" --container-remap-root \
    --container-writable sh -c 'grep Seccomp: /proc/self/status; id -u'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "$(printf 'Seccomp:\t2')" ]
  [ "${lines[1]}" = "0" ]
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$debian" sh -c 'grep Seccomp: /proc/self/status; id -u'
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "$(printf 'Seccomp:\t2')" ]
  [ "${lines[1]}" = "$(id -u "$U")" ]
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$debian" --container-remap-root \
    --container-writable --container-mounts="$REPO:/repo:ro" sh -c \
    "dpkg -i /repo/gantry-hello_1.0_all.deb >/dev/null && dpkg -r gantry-hello >/dev/null &&
     $APT update >/dev/null && DEBIAN_FRONTEND=noninteractive $APT install -y gantry-hello >/dev/null &&
     cat /opt/gantry-hello/hello"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "hello" ]
}
