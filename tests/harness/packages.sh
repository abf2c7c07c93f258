#!/usr/bin/env bash
# harness.packages.build: the .deb and .rpm that integration.packaging checks and
# integration.packaged_plugin installs (packaging/build-packages.sh into gantry_package_build_dir),
# compiled through ccache with the cache in DIR.ccache beside it. integration.deploy_builds builds the
# ParallelCluster package from the same tree with the same GCC 12 and flags, at the same paths in its
# root, with a copy of that cache: only what differs there (the plugin, against /opt/slurm/include) is
# compiled again. Without ccache the packages are built all the same (and deploy_builds compiles all).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
build=$(gantry_package_build_dir)
if ! command -v ccache >/dev/null; then
  gantry_note "no ccache (scripts/install-deps installs it): the packages are built without it"
  exec "$here/../../packaging/build-packages.sh" --build-dir "$build"
fi
mapfile -t cache_env < <(gantry_package_ccache_env "$build.ccache")
# The launcher on cmake's command line too: the environment's is read only on a directory's first
# configure.
exec env "${cache_env[@]}" "$here/../../packaging/build-packages.sh" --build-dir "$build" -- \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
