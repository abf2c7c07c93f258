#!/usr/bin/env bash
# sanitize-units.sh BUILD_DIR: the Catch2 suites built with AddressSanitizer and UBSan in a build tree
# of their own, then run there (`ctest -R '^unit\.'`: the [root] cases too when run as root).
# The tree is the libFuzzer targets' one (clang; tests/fuzz/run.sh, GANTRY_FUZZ=ON: ASan, UBSan with
# -fno-sanitize-recover, coverage instrumentation), built once for both: CTest's `sanitizer.units`
# (tests/CMakeLists.txt) builds the unit suites and the fuzz targets in it, and `fuzz.targets` after it
# finds them built. One clang build instead of a GCC Debug one plus a clang one was ~7 minutes of CI's
# build lane (docs/testing.md, "CI time"). GANTRY_SANITIZE=0 skips it (exit 77, shown as skipped).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: sanitize-units.sh BUILD_DIR" >&2; exit 2; }
if [ "${GANTRY_SANITIZE:-1}" = 0 ]; then
  echo "sanitize-units: skipped (GANTRY_SANITIZE=0)"
  exit 77
fi
here=$(cd "$(dirname "$0")/../.." && pwd)
sbuild=$1
jobs=${GANTRY_JOBS:-$(nproc)}
t0=$SECONDS
# The same configuration as tests/fuzz/run.sh with GANTRY_FUZZ_BUILD_TESTS=ON, so that neither run
# reconfigures the other's tree.
CC=${CC_FUZZ:-clang} CXX=${CXX_FUZZ:-clang++} cmake -S "$here" -B "$sbuild" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGANTRY_FUZZ=ON -DGANTRY_BUILD_TESTS=ON -DGANTRY_WERROR=ON >/dev/null
targets=(fuzz)
for f in "$here"/tests/unit/*_test.cpp; do t=${f##*/}; targets+=("unit_${t%_test.cpp}"); done
cmake --build "$sbuild" -j"$jobs" --target "${targets[@]}" >"$sbuild/sanitize-build.log" 2>&1 ||
  { tail -n 40 "$sbuild/sanitize-build.log"; echo "sanitize-units: the build failed (log: $sbuild/sanitize-build.log)" >&2; exit 1; }
echo "sanitize-units: built in $((SECONDS - t0)) s (log: $sbuild/sanitize-build.log)"
cd "$sbuild"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -R '^unit\.'
