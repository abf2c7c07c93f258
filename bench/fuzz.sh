#!/usr/bin/env bash
# A longer fuzzing campaign for one target: fuzzes for SECONDS (default 600) in a scratch corpus that
# starts from tests/fuzz/corpus/TARGET, then merges what it found that adds coverage back into that
# directory (-merge=1: only inputs with new features are kept), so the next CI run replays them.
# A crash leaves its input in build-fuzz/artifacts/; fix the bug, then copy the input into the corpus
# as regression-<what> (see docs/testing.md, "Fuzzing").
# SECONDS is wall-clock time; with GANTRY_FUZZ_CLOCK=cpu it is the fuzzer's own CPU time (user+sys,
# read from /proc), so a campaign run niced beside other work still gets its full share: the fuzzer is
# stopped with SIGINT (libFuzzer prints its final stats) once it has used that much CPU.
# Prints a summary line: execs, execs/s (of the last piece), cov, ft, CPU and wall seconds, corpus
# growth, and how many timeouts were found to be starvation (below).
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
maxlen=16384; [ "$target" = layer ] && maxlen=131072; [ "$target" = imagefs ] && maxlen=65536
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
log=$build/artifacts/$target-campaign.log
clock=${GANTRY_FUZZ_CLOCK:-wall}
limit=$seconds
# Under the CPU clock the wall limit is only a backstop; the watcher below stops the run.
[ "$clock" = cpu ] && limit=$((seconds * 50))
tick=$(getconf CLK_TCK)
cpu_of() {  # user+sys seconds of a running process (fields 14 and 15 of /proc/PID/stat)
  local f; f=$(cut -d')' -f2- "/proc/$1/stat" 2>/dev/null) || return 1
  set -- $f
  echo $(( (${12} + ${13}) / tick ))
}
# A niced fuzzer can be starved (a build, CI) for longer than libFuzzer's -timeout, which is wall
# time: it then reports a timeout on an input that takes milliseconds. Under the CPU clock such a
# timeout is checked: its input runs again alone, and if that takes under a CPU second the artifact
# is set aside as starved-<name> and the campaign goes on from its corpus for the CPU time left
# (each piece's libFuzzer log is kept as $log.N). A real timeout (or any other finding) ends it.
rc=0
t0=$SECONDS
used=0 piece=0 starved=0 execs=0
while :; do
  piece=$((piece + 1))
  "$bin" -max_total_time="$limit" -timeout=10 -rss_limit_mb=2048 -max_len=$maxlen -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target-" "$@" "$work" >"$log.$piece" 2>&1 &
  pid=$!
  cpu=0
  while kill -0 "$pid" 2>/dev/null; do
    now=$(cpu_of "$pid") || break
    cpu=$now
    if [ "$clock" = cpu ] && [ $((used + cpu)) -ge "$seconds" ]; then kill -INT "$pid"; break; fi
    sleep 5
  done
  rc=0
  wait "$pid" || rc=$?
  used=$((used + cpu))
  cp "$log.$piece" "$log"
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=$((execs + ${n:-0}))
  # libFuzzer exits 72 after a SIGINT it asked for; that is the end of a CPU-clock run, not a finding.
  if [ "$clock" = cpu ] && [ "$rc" -eq 72 ] && ! grep -qE 'ERROR: |runtime error|invariant' "$log"; then rc=0; fi
  if [ "$clock" != cpu ] || [ "$rc" -eq 0 ] || ! grep -q 'ERROR: libFuzzer: timeout' "$log"; then break; fi
  art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  [ -f "$art" ] || break
  TIMEFORMAT='%U %S'
  took=$({ time "$bin" "$art" >/dev/null 2>&1; } 2>&1 | tail -1) || break
  [ "$(echo "$took" | awk '{ print ($1 + $2 < 1) }')" = 1 ] || break
  echo "bench/fuzz.sh: $target: a timeout after $((used)) CPU s on an input that runs in $took s (user, sys) alone: starved, going on"
  mv "$art" "$(dirname "$art")/starved-$(basename "$art")"
  starved=$((starved + 1))
  [ "$used" -lt "$seconds" ] || break
done
cpu=$used
wall=$((SECONDS - t0))
grep -E '^#[0-9]+ *DONE|ERROR|runtime error|invariant|Test unit written|stat::' "$log" || true
speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
before=$(ls "$seeds" | wc -l)
"$bin" -merge=1 -max_len=$maxlen "$seeds" "$work" >/dev/null 2>&1
echo "bench/fuzz.sh: $target: execs $execs execs/s ${speed:-?} cov ${cov:-?} ft ${ft:-?}" \
  "cpu ${cpu}s wall ${wall}s corpus $before -> $(ls "$seeds" | wc -l) files, $starved starved timeouts (rc $rc)"
exit "$rc"
