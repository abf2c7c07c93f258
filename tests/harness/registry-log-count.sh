#!/usr/bin/env bash
# Prints how many GET requests for a blob a harness registry has served, read from its access log:
#   tests/harness/registry-log-count.sh LOGFILE DIGEST_OR_PATTERN
# DIGEST_OR_PATTERN is a full digest ("sha256:abc...") or an extended regex for the digest part
# (e.g. 'sha256:[0-9a-f]+' for all blob GETs). LOGFILE is $GANTRY_TEST_REGISTRY_HTTP_LOG or _TLS_LOG.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
[ $# -eq 2 ] || { echo "usage: $0 LOGFILE DIGEST_OR_PATTERN" >&2; exit 2; }
gantry_registry_blob_gets "$1" "$2"
