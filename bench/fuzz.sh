#!/usr/bin/env bash
# A longer fuzzing campaign for one target: fuzzes for SECONDS (default 600) in a scratch corpus that
# starts from tests/fuzz/corpus/TARGET, then merges what it found that adds coverage back into that
# directory (-merge=1: only inputs with new features are kept), so the next CI run replays them.
# A crash leaves its input in build-fuzz/artifacts/; fix the bug, then copy the input into the corpus
# as regression-<what> (see docs/testing.md, "Fuzzing").
# Usage: bench/fuzz.sh TARGET [SECONDS] [extra libFuzzer flags, e.g. -jobs=2 -workers=2]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: bench/fuzz.sh TARGET [SECONDS] [libFuzzer flags]}
seconds=${2:-600}
shift $(( $# >= 2 ? 2 : 1 ))
build=${GANTRY_FUZZ_BUILD_DIR:-$here/build-fuzz}
seeds=$here/tests/fuzz/corpus/$target
# Builds (and checks the corpus replays) through run.sh with no fuzzing time.
"$here/tests/fuzz/run.sh" 0 "$target" >/dev/null
bin=$build/tests/fuzz/fuzz_$target
mkdir -p "$seeds" "$build/artifacts"
work=$(mktemp -d "${TMPDIR:-/tmp}/gantry-fuzz-campaign-$target-XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$seeds/." "$work/"
maxlen=16384; [ "$target" = layer ] && maxlen=131072
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
log=$build/artifacts/$target-campaign.log
rc=0
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=$maxlen -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/$target-" "$@" "$work" >"$log" 2>&1 || rc=$?
grep -E '^#[0-9]+ *DONE|ERROR|runtime error|invariant|Test unit written|stat::' "$log" || true
before=$(ls "$seeds" | wc -l)
"$bin" -merge=1 -max_len=$maxlen "$seeds" "$work" >/dev/null 2>&1
echo "bench/fuzz.sh: $target: corpus $before -> $(ls "$seeds" | wc -l) files (rc $rc)"
exit "$rc"
