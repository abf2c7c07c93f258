#!/usr/bin/env bash
# Slurm 24.11 in its Debian root: tests/harness/slurmroot.sh 24.11 with the same commands (see there).
exec "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/slurmroot.sh" 24.11 "$@"
