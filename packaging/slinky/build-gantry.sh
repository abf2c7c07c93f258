#!/usr/bin/env bash
# The build stage of packaging/slinky/Dockerfile: builds Gantry's .deb inside a Slinky slurmd or login
# image against that image's own Slurm release. The images carry no Slurm headers, so they come from
# the source release of the version the image runs (`slurmd -V`, else `srun --version`), configured
# just far enough to generate slurm/slurm_version.h. tests/integration/deploy_builds.bats runs the
# Dockerfile's build stage, and so this script, in a Debian trixie root with Slurm 24.11.
#
#   build-gantry.sh deps              the build dependencies, from apt (install-deps --build-only
#                                     --without-slurm-dev beside this script, plus curl and bzip2)
#   build-gantry.sh package SRC OUT   fetch and configure the Slurm source, build the .deb into OUT
#
# Environment: SLURM_SOURCE, a URL or path of the Slurm source tarball (default: SchedMD's release
# https://download.schedmd.com/slurm/slurm-VERSION.tar.bz2); GANTRY_SLURM_PLUGIN_DIR, the plugin
# directory below /usr (default: the directory of the image's Slurm plugins).
set -euo pipefail

die() { echo "build-gantry: $*" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)

# The release of the Slurm installed in this image: "slurm 25.11.0" (SchedMD) or "slurm-wlm 24.11.5"
# (Debian) -> 25.11.0 / 24.11.5.
slurm_version() {
  local out
  out=$(slurmd -V 2>/dev/null || srun --version 2>/dev/null || sinfo --version 2>/dev/null) ||
    die "no slurmd, srun or sinfo in this image: build from a Slinky slurmd or login image (BASE_IMAGE)"
  out=${out##* }
  [[ $out =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "cannot read a Slurm release from '$out' (slurmd -V)"
  echo "${BASH_REMATCH[0]}"
}

# The plugin directory of the image's Slurm, relative to /usr: where spank_gantry.so must go so that a
# plugstack.conf line by its full path matches what the image's other plugins use.
slurm_plugin_dir() {
  local d
  for d in /usr/lib/x86_64-linux-gnu/slurm /usr/lib/aarch64-linux-gnu/slurm /usr/lib/x86_64-linux-gnu/slurm-wlm \
    /usr/lib/aarch64-linux-gnu/slurm-wlm /usr/lib64/slurm /usr/lib/slurm; do
    if compgen -G "$d/proctrack_*.so" >/dev/null; then echo "${d#/usr/}"; return 0; fi
  done
  die "no Slurm plugin directory (proctrack_*.so) under /usr/lib; set GANTRY_SLURM_PLUGIN_DIR"
}

cmd_deps() {
  [ -x "$here/install-deps" ] || die "$here/install-deps missing: the Dockerfile copies scripts/install-deps beside this script"
  "$here/install-deps" --build-only --without-slurm-dev
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends curl ca-certificates bzip2 xz-utils
  rm -rf /var/lib/apt/lists/*
}

cmd_package() {
  [ $# -eq 2 ] || die "usage: build-gantry.sh package SRC OUT"
  local src=$1 out=$2 version url slurm plugin_dir built major minor micro
  [ -x "$src/packaging/build-packages.sh" ] || die "$src is not Gantry's source tree (no packaging/build-packages.sh)"
  version=$(slurm_version)
  url=${SLURM_SOURCE:-https://download.schedmd.com/slurm/slurm-$version.tar.bz2}
  slurm=$(dirname "$out")/slurm-$version
  mkdir -p "$out"
  rm -rf "$slurm" && mkdir -p "$slurm"
  echo "build-gantry: Slurm $version in this image; its headers from $url"
  case $url in
    http://*|https://*) curl -fsSL --retry 5 -o "$slurm.tar" "$url" || die "downloading $url failed (set SLURM_SOURCE to a reachable copy)" ;;
    *) cp "$url" "$slurm.tar" ;;
  esac
  tar -C "$slurm" --strip-components=1 -xf "$slurm.tar" || die "$url is not a Slurm source tarball"
  rm -f "$slurm.tar"
  # Only configure's generated slurm/slurm_version.h is needed besides the static headers; the
  # headers do not depend on munge, whose headers the images lack (configure would stop there).
  (cd "$slurm" && ./configure --prefix=/usr --without-munge >"$out/slurm-configure.log" 2>&1) ||
    die "configuring the Slurm source failed; see $out/slurm-configure.log"
  local number
  IFS=. read -r major minor micro <<<"$version"
  number=$(printf '0x%02x%02x%02x' "$major" "$minor" "$micro")
  grep -Eq "^#define SLURM_VERSION_NUMBER $number\b" "$slurm/slurm/slurm_version.h" ||
    die "the source at $url is not Slurm $version ($number), which this image runs: $(grep -m1 SLURM_VERSION_NUMBER "$slurm/slurm/slurm_version.h")"
  plugin_dir=${GANTRY_SLURM_PLUGIN_DIR:-$(slurm_plugin_dir)}
  # No package names the image's Slurm (SchedMD's slurm-smd debs): the plugin checks the release itself.
  built=$(GANTRY_PACKAGE_BUILD_DIR=$out/build "$src/packaging/build-packages.sh" --deb-only -- \
    "-DSLURM_INCLUDE_DIR=$slurm" "-DGANTRY_SLURM_PLUGIN_DIR=$plugin_dir" -DGANTRY_PACKAGE_SLURM_DEPENDS=OFF |
    sed -n 's/^deb: //p')
  [ -f "$built" ] || die "no .deb was built (logs: $out/build.*.log)"
  mv "$built" "$out/"
  echo "build-gantry: $out/$(basename "$built"): plugin in /usr/$plugin_dir, built for Slurm $version"
}

case ${1:-} in
  deps) cmd_deps ;;
  package) shift; cmd_package "$@" ;;
  *) die "usage: build-gantry.sh deps | package SRC OUT" ;;
esac
