#!/usr/bin/env bash
# Slurm 26.05 in its Debian root: tests/harness/slurmroot.sh 26.05 with the same commands (see there).
exec "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/slurmroot.sh" 26.05 "$@"
