# The deployment builds of issue #16, each run in a root that stands in for the real target, with
# packages from Debian's mirror (tests/harness/deploy_roots.sh):
# - ParallelCluster: packaging/parallelcluster/gantry-node.sh --source, as a head node's
#   OnNodeConfigured action, in a Debian 12 root whose Slurm 22.05 lives only under /opt/slurm (no
#   /usr/include/slurm, no Slurm package): it installs the build dependencies with
#   `install-deps --build-only --without-slurm-dev`, builds the .deb against /opt/slurm/include,
#   installs it, disables Pyxis and writes the plugstack line under /opt/slurm/etc.
# - Slinky: packaging/slinky/Dockerfile's build stage and then its image stage, instruction by
#   instruction (tests/integration/dockerfile_stage.py), in overlays of the Debian 13 root of
#   tests/harness/slurm2411.sh (Slurm 24.11) with libslurm-dev removed, as Slinky's images have no
#   Slurm headers; the Slurm source comes from Debian's mirror (SLURM_SOURCE) instead of SchedMD's.
# Both roots are cached under $GANTRY_HARNESS_DIR/cache; the changes of a run go to overlays in
# $GANTRY_HARNESS_DIR/deploy, removed at the start of the next run.

bats_require_minimum_version 1.5.0

setup_file() {
  export SRC=${GANTRY_SOURCE_DIR:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
  export GANTRY_HARNESS_DIR=${GANTRY_HARNESS_DIR:-/tmp/gantry-harness}
  export ROOTS=$SRC/tests/harness/deploy_roots.sh
  export WORK=$GANTRY_HARNESS_DIR/deploy
  rm -rf --one-file-system "$WORK"
  mkdir -p "$WORK"
  PC_ROOT=$("$ROOTS" pcluster)
  TRIXIE_ROOT=$(GANTRY_HARNESS_DIR=$GANTRY_HARNESS_DIR "$SRC/tests/harness/slurm2411.sh" root)
  export PC_ROOT TRIXIE_ROOT
  # The source as an admin ships it (and Docker's build context): the tree without what
  # .dockerignore names (.git, build trees).
  context_tar "$WORK/gantry-src.tar.gz"

  # ParallelCluster: the node script, the source tree (the build context, unpacked) and a Pyxis line as
  # ParallelCluster's own image carries one. The tree lies at the path harness.packages.build compiled
  # it from ($SRC) and the node script builds in that build's directory (--build-dir), with a copy of
  # its compiler cache (tests/harness/packages.sh): the same tree, GCC 12 and flags, so only what
  # differs here (the plugin, against /opt/slurm/include) is compiled again. ccache hashes this root's
  # own preprocessed sources and its compiler's version, so a hit is the object this root's GCC makes.
  # (Unpacking a --source tarball is checked in "refuses bad arguments".)
  . "$SRC/tests/harness/lib.sh"
  PKG_BUILD=$(gantry_package_build_dir)
  export PC=$WORK/pcluster PKG_BUILD
  mkdir -p "$PC/upper/srv" "$PC/upper/opt/slurm/etc/plugstack.conf.d" "$PC/upper$SRC" "$PC/upper/var/cache"
  cp "$SRC/packaging/parallelcluster/gantry-node.sh" "$PC/upper/srv/"
  tar -C "$PC/upper$SRC" -xzf "$WORK/gantry-src.tar.gz"
  echo "required /opt/slurm/lib/slurm/spank_pyxis.so" >"$PC/upper/opt/slurm/etc/plugstack.conf.d/pyxis.conf"
  local cache_env
  if [ -d "$PKG_BUILD.ccache" ]; then
    cp -a "$PKG_BUILD.ccache" "$PC/upper/var/cache/gantry-ccache"
    CCACHE_DIR=$PC/upper/var/cache/gantry-ccache ccache --zero-stats >/dev/null
  else
    echo "# no $PKG_BUILD.ccache (harness.packages.build): the ParallelCluster build compiles everything" >&3
  fi
  mapfile -t cache_env < <(gantry_package_ccache_env /var/cache/gantry-ccache)
  local t0=$SECONDS
  "$ROOTS" run "$PC_ROOT" "$PC" -- env "${cache_env[@]}" bash /srv/gantry-node.sh --source "$SRC" --build-dir "$PKG_BUILD" \
    --publish /opt/parallelcluster/shared/gantry >"$WORK/pcluster.log" 2>&1 && echo 0 >"$WORK/pcluster.rc" ||
    echo $? >"$WORK/pcluster.rc"
  echo "# TIMING gantry-node.sh --source: $((SECONDS - t0)) s" >&3
  local stats
  stats=$("$ROOTS" run "$PC_ROOT" "$PC" -- env CCACHE_DIR=/var/cache/gantry-ccache ccache --print-stats 2>/dev/null |
    awk '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 } $1 == "cache_miss" { m = $2 } END { print h + 0, "hits,", m + 0, "misses" }') || true
  echo "# ccache in the ParallelCluster build: $stats" >&3
  # Misses come from headers that differ: a -dev package here at another version than in the root (the
  # root has the mirror's current ones; install-deps does not upgrade what a machine already has).
  local q='${Package} ${Version}\n' differ
  differ=$(comm -13 <(dpkg-query -W -f="$q" 2>/dev/null | sort) \
    <("$ROOTS" run "$PC_ROOT" "$PC" -- dpkg-query -W -f="$q" 2>/dev/null | grep -- '-dev ' | sort) |
    paste -sd' ') || true
  echo "# -dev packages at other versions than on this machine: ${differ:-none}" >&3
}

# context_tar OUT: Docker's build context of the source tree as a tarball (top-level .dockerignore
# patterns; enough for this tree's .dockerignore).
context_tar() {
  local names=() name pat skip
  shopt -s dotglob nullglob
  for name in "$SRC"/*; do
    name=${name##*/} skip=0
    while read -r pat; do
      [ -n "$pat" ] && [[ $pat != \#* ]] || continue
      # shellcheck disable=SC2053  # a .dockerignore pattern is a glob
      [[ $name == $pat ]] && skip=1
    done <"$SRC/.dockerignore"
    [ $skip -eq 1 ] || names+=("$name")
  done
  shopt -u dotglob nullglob
  tar -C "$SRC" -czf "$1" "${names[@]}"
}

in_pc() { "$ROOTS" run "$PC_ROOT" "$PC" -- "$@"; }

@test "ParallelCluster: gantry-node.sh --source builds, installs and enables Gantry on a head node" {
  cat "$WORK/pcluster.log"
  [ "$(cat "$WORK/pcluster.rc")" -eq 0 ]
  grep -q '^gantry-node: installed gantry [0-9]' "$WORK/pcluster.log"
  grep -q '^gantry-node: enabled: required /usr/lib/gantry/spank_gantry.so config=/etc/gantry/gantry.conf$' "$WORK/pcluster.log"
}

@test "ParallelCluster: the plugin was built against /opt/slurm/include (the only Slurm headers there)" {
  [ ! -e "$PC_ROOT/usr/include/slurm" ]
  [ ! -e "$PC/upper/usr/include/slurm" ]
  run grep '^SLURM_INCLUDE_DIR:' "$PC/upper$PKG_BUILD/CMakeCache.txt"
  [ "$output" = "SLURM_INCLUDE_DIR:PATH=/opt/slurm/include" ]
  # The release recorded in the installed plugin is the one of /opt/slurm's slurm_version.h.
  num=$(sed -n 's/^#define SLURM_VERSION_NUMBER[[:space:]]*\(0x[0-9a-fA-F]*\).*/\1/p' "$PC_ROOT/opt/slurm/include/slurm/slurm_version.h")
  release=$(printf '%d.%02d' $(( (num >> 16) & 0xff )) $(( (num >> 8) & 0xff )))
  grep -aq "gantry-built-for-slurm=$release" "$PC/upper/usr/lib/gantry/spank_gantry.so"
  # No package names a Slurm (GANTRY_PACKAGE_SLURM_DEPENDS=OFF): the node has no Slurm package.
  run dpkg-deb -f "$PC/upper/opt/parallelcluster/shared/gantry/gantry.deb" Depends
  [ "$status" -eq 0 ]
  [[ $output != *slurm* ]]
}

@test "ParallelCluster: install-deps --build-only --without-slurm-dev installed the build tools, no daemons, no libslurm-dev" {
  for p in build-essential cmake pkg-config libsquashfs-dev libcurl4-openssl-dev libyaml-dev nlohmann-json3-dev libcli11-dev; do
    run in_pc dpkg-query -W -f='${Status}' "$p"
    [ "$output" = "install ok installed" ] || { echo "$p: $output"; false; }
  done
  for p in slurmctld slurmd munge docker-registry libslurm-dev slurm-client; do
    run in_pc dpkg-query -W -f='${Status}' "$p"
    [ "$output" != "install ok installed" ] || { echo "$p is installed"; false; }
  done
}

@test "ParallelCluster: plugstack under /opt/slurm/etc, Pyxis moved out, srun from /opt/slurm loads the plugin" {
  [ "$(cat "$PC/upper/opt/slurm/etc/plugstack.conf.d/gantry.conf")" = "required /usr/lib/gantry/spank_gantry.so config=/etc/gantry/gantry.conf" ]
  grep -qx 'include /opt/slurm/etc/plugstack.conf.d/\*.conf' "$PC/upper/opt/slurm/etc/plugstack.conf"
  [ ! -e "$PC/upper/opt/slurm/etc/plugstack.conf.d/pyxis.conf" ]
  [ -f "$PC/upper/opt/slurm/etc/pyxis.conf.disabled-by-gantry" ]
  run in_pc env SLURM_CONF=/opt/slurm/etc/slurm.conf /opt/slurm/bin/srun --help
  [[ $output == *--container-image* ]]
  # Head-node settings: the trusted store owned by the store account, gc as that account.
  [ "$(stat -c %u "$PC/upper/fsx/gantry")" = 3939 ]
  grep -q '^store_owner = gantry$' "$PC/upper/etc/gantry/gantry.conf"
  grep -q ' gantry /usr/bin/gantry gc --store /fsx/gantry ' "$PC/upper/etc/cron.d/gantry-gc"
}

@test "ParallelCluster: gantry doctor finds the plugin through /opt/slurm/etc/slurm.conf and matches its Slurm" {
  [ ! -e "$PC_ROOT/etc/slurm/slurm.conf" ]
  [ ! -e "$PC/upper/etc/slurm/slurm.conf" ]
  run in_pc gantry doctor
  echo "$output"
  echo "$output" | grep -qx '✓ Slurm plugin in plugstack.conf  */opt/slurm/etc/plugstack.conf.d/gantry.conf: required /usr/lib/gantry/spank_gantry.so'
  echo "$output" | grep -q '^✓ Slurm version '
}

@test "ParallelCluster: a compute node installs the head node's published package" {
  # Same root, now a compute node: only the package and the node settings, no plugstack edits.
  mkdir -p "$PC/upper/etc/parallelcluster"
  echo "cfn_node_type=ComputeFleet" >"$PC/upper/etc/parallelcluster/cfnconfig"
  rm "$PC/upper/opt/slurm/etc/plugstack.conf.d/gantry.conf"
  run in_pc bash /srv/gantry-node.sh --deb /opt/parallelcluster/shared/gantry/gantry.deb
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output == *"(ComputeFleet)"* ]]
  [ ! -e "$PC/upper/opt/slurm/etc/plugstack.conf.d/gantry.conf" ]
}

@test "ParallelCluster: gantry-node.sh refuses bad arguments with one clear line" {
  run in_pc bash /srv/gantry-node.sh --source /srv/nothing-here
  [ "$status" -ne 0 ]
  [ "${lines[-1]}" = "gantry-node: --source /srv/nothing-here: no such directory or file (give Gantry's source tree or a tarball of it)" ]
  run in_pc bash /srv/gantry-node.sh --source /srv/gantry-src.tar.gz --deb /srv/x.deb
  [ "$status" -ne 0 ]
  [ "${lines[-1]}" = "gantry-node: --source builds the package here; give it or --deb/--rpm, not both" ]
  run in_pc bash /srv/gantry-node.sh --store
  [ "$status" -eq 2 ]
  [ "$output" = "gantry-node: --store needs a value" ]
  run in_pc bash /srv/gantry-node.sh --deb /srv/x.deb --build-dir /var/tmp/b
  [ "$status" -ne 0 ]
  [ "${lines[-1]}" = "gantry-node: --build-dir is where --source builds the package; it needs --source" ]
  run in_pc bash /srv/gantry-node.sh --source /srv/gantry-src.tar.gz --build-dir var/tmp/b
  [ "$status" -ne 0 ]
  [ "${lines[-1]}" = "gantry-node: --build-dir var/tmp/b: give an absolute path" ]
  # A --source tarball (S3's download) is unpacked, a tarball of one directory entered, and the tree in it
  # checked: this one has no CMakeLists.txt.
  mkdir -p "$BATS_TEST_TMPDIR/t/gantry-0.1.0/packaging"
  tar -C "$BATS_TEST_TMPDIR/t" -czf "$PC/upper/srv/notree.tar.gz" gantry-0.1.0
  run in_pc bash /srv/gantry-node.sh --source /srv/notree.tar.gz
  [ "$status" -ne 0 ]
  [[ ${lines[-1]} =~ ^"gantry-node: --source /tmp/tmp."[A-Za-z0-9]+"/src/gantry-0.1.0 is not Gantry's source tree (no CMakeLists.txt" ]]
}

# Slinky: the image's stages as dockerfile_stage.py translates them; the build stage's changes are
# the image stage's `COPY --from=build` source.
slinky_stage() {  # slinky_stage STAGE CHANGES [--stage ...]: run one stage of the Dockerfile
  local stage=$1 changes=$2
  shift 2
  mkdir -p "$changes/upper/.context"
  tar -C "$changes/upper/.context" -xzf "$WORK/gantry-src.tar.gz"
  python3 "$SRC/tests/integration/dockerfile_stage.py" "$SRC/packaging/slinky/Dockerfile" "$stage" >"$changes/upper/.stage.sh"
  "$ROOTS" run "$TRIXIE_ROOT" "$changes" "$@" -- env DOCKER_CONTEXT=/.context DOCKER_STAGES=/.stages \
    "SLURM_SOURCE=$SLURM_SOURCE" bash /.stage.sh
}

@test "Slinky: the Dockerfile's build stage builds the .deb against the image's Slurm from its source" {
  export SB=$WORK/slinky-build
  # The Slinky images have Slurm but no headers: neither may this root.
  run "$ROOTS" run "$TRIXIE_ROOT" "$SB" -- dpkg --purge libslurm-dev
  [ "$status" -eq 0 ]
  version=$("$ROOTS" run "$TRIXIE_ROOT" "$SB" -- dpkg-query -W -f='${Version}' slurmd)
  version=${version%%-*}
  mirror=$(awk '$1 == "deb" { print $2; exit }' "$TRIXIE_ROOT/etc/apt/sources.list")
  # Debian's copy of the Slurm release the root runs (SchedMD's server is not reachable from CI).
  export SLURM_SOURCE=$mirror/pool/main/s/slurm-wlm/slurm-wlm_$version.orig.tar.gz
  local t0=$SECONDS
  run slinky_stage build "$SB"
  echo "# TIMING Slinky build stage: $((SECONDS - t0)) s" >&3
  echo "$output" | tail -n 40
  [ "$status" -eq 0 ]
  # GCC 14 at -O2 over the whole tree, with Debian's hardening flags, and not one warning: the Slurm
  # roots compile only the plugin and its two root-bound programs (tests/harness/slurmroot.sh), so
  # this build is where trixie's compiler sees all of the runtime.
  run grep -c 'warning:' "$SB/upper/build/out/build.build.log"
  [ "$output" = 0 ] || { grep -m5 'warning:' "$SB/upper/build/out/build.build.log"; false; }
  run "$ROOTS" run "$TRIXIE_ROOT" "$SB" -- test -e /usr/include/slurm/spank.h
  [ "$status" -eq 1 ]
  run grep '^SLURM_INCLUDE_DIR:' "$SB/upper/build/out/build/CMakeCache.txt"
  [ "$output" = "SLURM_INCLUDE_DIR:PATH=/build/slurm-$version" ]
  debs=("$SB"/upper/build/out/gantry_*.deb)
  [ -f "${debs[0]}" ]
  run dpkg-deb -c "${debs[0]}"
  [[ $output == *./usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so* ]]
  [[ $output == *./usr/bin/gantry* ]]
  mkdir -p "$WORK/slinky-deb"
  dpkg-deb -x "${debs[0]}" "$WORK/slinky-deb"
  grep -aq "gantry-built-for-slurm=${version%.*}" "$WORK/slinky-deb/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so"
}

@test "Slinky: the image stage installs the .deb, the store account and gantry.conf; srun loads the plugin" {
  SB=$WORK/slinky-build SI=$WORK/slinky-image
  debs=("$SB"/upper/build/out/gantry_*.deb)
  [ -f "${debs[0]}" ] || { echo "the build stage made no .deb (test above)"; false; }
  run slinky_stage final "$SI" --stage "build=$TRIXIE_ROOT:$SB"
  echo "$output" | tail -n 20
  [ "$status" -eq 0 ]
  run "$ROOTS" run "$TRIXIE_ROOT" "$SI" -- dpkg-query -W -f='${Status}' gantry
  [ "$output" = "install ok installed" ]
  grep -qx 'store_path = /fsx/gantry' "$SI/upper/etc/gantry/gantry.conf"
  grep -qx 'store_owner = gantry' "$SI/upper/etc/gantry/gantry.conf"
  run "$ROOTS" run "$TRIXIE_ROOT" "$SI" -- id -u gantry
  [ "$output" = 3939 ]
  # plugstack.conf as the Helm values give it, with the plugin path of this root's Slurm layout
  # (Debian's slurm-wlm; Slinky's Ubuntu images use .../slurm).
  line=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["configFiles"]["plugstack.conf"].strip())' \
    "$SRC/packaging/slinky/values-gantry.yaml")
  [ "$line" = "required /usr/lib/x86_64-linux-gnu/slurm/spank_gantry.so config=/etc/gantry/gantry.conf" ]
  mkdir -p "$SI/upper/etc/slurm"
  sed 's|/usr/lib/x86_64-linux-gnu/slurm/|/usr/lib/x86_64-linux-gnu/slurm-wlm/|' <<<"$line" >"$SI/upper/etc/slurm/plugstack.conf"
  printf '%s\n' ClusterName=slinky SlurmctldHost=localhost AuthType=auth/munge \
    'NodeName=localhost CPUs=1 State=UNKNOWN' 'PartitionName=all Nodes=localhost Default=YES' >"$SI/upper/etc/slurm/slurm.conf"
  run "$ROOTS" run "$TRIXIE_ROOT" "$SI" -- srun --help
  [[ $output == *--container-image* ]]
}

@test "Slinky: the Helm values use the slurm chart's current layout and pass yamllint" {
  run yamllint -d '{extends: default, rules: {line-length: {max: 110}}}' "$SRC/packaging/slinky/values-gantry.yaml"
  echo "$output"
  [ "$status" -eq 0 ]
  # slurm chart 1.0: top-level configFiles and epilogScripts, nodesets.<name>.slurmd.image,
  # loginsets.<name>.login.image, volumes in podSpec; the 0.3 keys (slurm:, compute:, login:) are gone.
  run python3 - "$SRC/packaging/slinky/values-gantry.yaml" <<'PY'
import sys, yaml
v = yaml.safe_load(open(sys.argv[1]))
for old in ("slurm", "compute", "login"):
    assert old not in v, f"0.3-layout key {old}"
assert "plugstack.conf" in v["configFiles"]
assert "90-gantry-gc.sh" in v["epilogScripts"]
for name, ns in v["nodesets"].items():
    if not ns.get("enabled", True):
        continue
    assert ns["slurmd"]["image"]["repository"].endswith("slurmd-gantry"), name
    mounts = {m["mountPath"] for m in ns["slurmd"]["volumeMounts"]}
    assert {"/fsx", "/scratch"} <= mounts, mounts
    vols = {x["name"] for x in ns["podSpec"]["volumes"]}
    assert {m["name"] for m in ns["slurmd"]["volumeMounts"]} <= vols
for name, ls in v["loginsets"].items():
    if not ls.get("enabled", True):
        continue
    assert ls["login"]["image"]["repository"].endswith("login-gantry"), name
print("ok")
PY
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "dockerfile_stage.py: an instruction it cannot translate fails instead of being skipped" {
  printf 'FROM scratch AS build\nSHELL ["/bin/bash", "-c"]\nRUN true\n' >"$BATS_TEST_TMPDIR/Dockerfile"
  run python3 "$SRC/tests/integration/dockerfile_stage.py" "$BATS_TEST_TMPDIR/Dockerfile" build
  [ "$status" -ne 0 ]
  [ "$output" = "dockerfile_stage: unknown instruction 'SHELL': SHELL [\"/bin/bash\", \"-c\"]" ]
  run python3 "$SRC/tests/integration/dockerfile_stage.py" "$BATS_TEST_TMPDIR/Dockerfile" nosuchstage
  [ "$status" -ne 0 ]
  [ "$output" = "dockerfile_stage: no stage 'nosuchstage' in $BATS_TEST_TMPDIR/Dockerfile (stages: build)" ]
}
