#!/usr/bin/env bash
# low-priority.sh CMD...: runs CMD at a low CPU priority, for the long builds that CTest runs beside
# the other tests (tests/CMakeLists.txt, the "build" lane): in a session of its own (on kernels with
# autogroup scheduling, nice only ranks the processes of one session against each other, so CMD gets
# a session whose autogroup is niced) and with nice 10 for kernels without autogroup. The tests beside
# it wait on daemons, srun and sleeps; they keep the CPU when they need it and the build has the rest.
# A signal to this script (CTest's timeout, Ctrl-C) is passed on to CMD's whole session.
set -u
[ $# -gt 0 ] || { echo "usage: low-priority.sh CMD..." >&2; exit 2; }
# shellcheck disable=SC2016  # expanded by the inner shell
setsid bash -c 'echo 10 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 10 "$@"' low-priority "$@" &
child=$!
trap 'kill -TERM -- "-$child" 2>/dev/null; wait "$child"; exit 143' INT TERM HUP
wait "$child"
