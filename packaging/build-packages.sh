#!/usr/bin/env bash
# Builds Gantry's .deb and .rpm with CPack from a Release build installed under /usr, and prints
# "deb: PATH" and "rpm: PATH". The prefix matters: the plugin finds the gantry CLI at the path compiled
# into it, so packages must be built for the prefix they install to.
#
#   packaging/build-packages.sh [--build-dir DIR] [--deb-only] [-- EXTRA CMAKE ARGS...]
#
# Examples of extra arguments: -DGANTRY_PACKAGE_SLURM_DEPENDS=OFF (Slurm not from Debian's packages),
# -DSLURM_INCLUDE_DIR=/opt/slurm/include -DGANTRY_SLURM_PLUGIN_DIR=lib/gantry (ParallelCluster).
# Needs: cmake, the build dependencies (scripts/install-deps), dpkg-dev (dpkg-shlibdeps) and, for the
# .rpm, rpmbuild (Debian package rpm).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=${GANTRY_PACKAGE_BUILD_DIR:-${TMPDIR:-/tmp}/gantry-package-build}
generators="DEB;RPM"
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --deb-only) generators="DEB"; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-packages: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "build-packages: $*" >&2; exit 1; }
command -v cmake >/dev/null || die "cmake not found; run scripts/install-deps"
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps not found (Debian package dpkg-dev)"
if [[ $generators == *RPM* ]] && ! command -v rpmbuild >/dev/null; then
  die "rpmbuild not found (Debian package rpm); or pass --deb-only"
fi

jobs=${GANTRY_JOBS:-$(nproc)}
# Debian's hardening flags (fortify, stack protector, relro, bind-now), as a Debian package build
# uses them. Warnings are not fatal here (as in distribution builds): fortify adds warnings (unused
# results) that CI's -Werror build, without fortify, does not see; they are printed in the build log.
# The optimization level is dpkg-buildflags' (-O2, as in Debian's own packages; CMake's Release would
# add -O3 after it), without -g: the packages are stripped (CPACK_STRIP_FILES), so debug info would
# only cost compile time (about a third of it). The compiler flags are given on cmake's command line
# too, so a build directory configured before takes them (CMake reads CFLAGS/CXXFLAGS/LDFLAGS from
# the environment only on a directory's first configure).
# dpkg-buildflags is asked from the source tree, as dpkg-buildpackage does: its -ffile-prefix-map maps
# the directory it runs in to ".", so from wherever the caller stood the flags (and so every object)
# would depend on the caller's directory, and two builds of one tree could not share a compiler cache
# (tests/harness/packages.sh).
export DEB_BUILD_MAINT_OPTIONS=hardening=+all DEB_CFLAGS_MAINT_STRIP=-g DEB_CXXFLAGS_MAINT_STRIP=-g
buildflags() { (cd "$src" && dpkg-buildflags --get "$1"); }
CFLAGS="$(buildflags CFLAGS) $(buildflags CPPFLAGS)"
CXXFLAGS="$(buildflags CXXFLAGS) $(buildflags CPPFLAGS)"
LDFLAGS=$(buildflags LDFLAGS)
export CFLAGS CXXFLAGS LDFLAGS
# The logs go beside the build dir (DIR.cmake.log ...), so its parent must exist first.
mkdir -p "$build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=$CFLAGS" "-DCMAKE_CXX_FLAGS=$CXXFLAGS" \
  -DCMAKE_C_FLAGS_RELEASE=-DNDEBUG -DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG -DCMAKE_INSTALL_PREFIX=/usr \
  -DGANTRY_BUILD_TESTS=OFF -DGANTRY_WERROR=OFF "-DCPACK_GENERATOR=$generators" "${extra[@]}" >"$build.cmake.log" 2>&1 ||
  { tail -n 30 "$build.cmake.log" >&2; die "cmake configure failed (log: $build.cmake.log)"; }
cmake --build "$build" -j "$jobs" >"$build.build.log" 2>&1 ||
  { tail -n 30 "$build.build.log" >&2; die "build failed (log: $build.build.log)"; }
rm -f "$build"/gantry[-_]*.deb "$build"/gantry-*.rpm
(cd "$build" && cpack -G "$generators") >"$build.cpack.log" 2>&1 ||
  { tail -n 30 "$build.cpack.log" >&2; die "cpack failed (log: $build.cpack.log)"; }

deb=$(find "$build" -maxdepth 1 -name 'gantry_*.deb' | head -1)
[ -n "$deb" ] || die "cpack made no .deb (log: $build.cpack.log)"
echo "deb: $deb"
if [[ $generators == *RPM* ]]; then
  rpm=$(find "$build" -maxdepth 1 -name 'gantry-*.rpm' | head -1)
  [ -n "$rpm" ] || die "cpack made no .rpm (log: $build.cpack.log)"
  echo "rpm: $rpm"
fi
