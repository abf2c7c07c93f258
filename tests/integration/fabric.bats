# fixtures: registry images slurm
# Proving the fabric before training (issue 37): the EFA check inside the container, on fake hardware.
# tests/harness/fakehw.sh builds a host root with real EFA device nodes (mknod, the real uverbs
# numbers) and efa driver links; this suite then builds, with cc, the libraries the check reads: a
# libefa.so.1, libfabric.so.1 with the efa provider built in (it needs libefa.so.1, as the real one)
# or without it (plus, when asked, the DSO provider libfabric/libefa-fi.so exporting fi_prov_ini),
# aws-ofi-nccl's plugin as libnccl-net-ofi.so (ncclNetPlugin_v8/v7, needing libfabric.so.1) or an old
# one as libnccl-net.so (ncclNetPlugin_v4), and NCCL as libnccl.so.2.23.4 (asks for
# ncclNetPlugin_v9..v6, takes NCCL_NET_PLUGIN as a file name too) or libnccl.so.2.18.3 (v6..v4, a
# suffix only), each carrying the strings the real releases carry. They go where efa_host_libs = 1
# binds them from: /opt/amazon/efa/lib, /opt/amazon/ofi-nccl/lib and (for NCCL, standing in for the
# image's own) /opt/aws-ofi-nccl/lib. Everything else is the real code path: srun -> plugin -> device
# selection -> the container -> the first task's check; `gantry run` and `gantry doctor --image`.

load helpers

setup_file() {
  gantry_load_env registry images slurm
  local hw=$GANTRY_HARNESS_DIR/fabric-hw src=$GANTRY_HARNESS_DIR/fabric-src
  "$GANTRY_SOURCE_DIR/tests/harness/fakehw.sh" "$hw" >/dev/null
  rm -rf "$src" && mkdir -p "$src"
  cd "$src"
  echo 'int efadv_query_device(void) { return 0; }' > efa.c
  echo 'int fi_getinfo(void) { return 0; } unsigned fi_version(void) { return 0x10015; }' > fabric.c
  echo 'void* fi_prov_ini(void) { return 0; }' > prov.c
  printf '%s\n' 'struct ncclNet { const char* name; };' \
    'const struct ncclNet ncclNetPlugin_v8 = {"AWS Libfabric"}, ncclNetPlugin_v7 = {"AWS Libfabric"};' \
    'const struct ncclNet ncclCollNetPlugin_v8 = {"AWS Libfabric"};' > plugin-new.c
  printf '%s\n' 'struct ncclNet { const char* name; };' \
    'const struct ncclNet ncclNetPlugin_v4 = {"AWS Libfabric"};' > plugin-old.c
  # The strings NCCL asks dlsym for and its lookup's format strings (NVIDIA/nccl src/plugin/, src/net.cc).
  printf '%s\n' 'const char* const nccl_strings[] = {"ncclNetPlugin_v9", "ncclNetPlugin_v8", "ncclNetPlugin_v7",' \
    '"ncclNetPlugin_v6", "%s-%s.so", "NET/Plugin: Plugin name set by env to %s", "libnccl-net-%s.so"};' \
    'int ncclGetVersion(int* v) { *v = 22304; return 0; }' > nccl-new.c
  printf '%s\n' 'const char* const nccl_strings[] = {"ncclNetPlugin_v6", "ncclNetPlugin_v5", "ncclNetPlugin_v4",' \
    '"Plugin name set by env to %s", "libnccl-net-%s.so", "libnccl-net.so"};' \
    'int ncclGetVersion(int* v) { *v = 21803; return 0; }' > nccl-old.c
  local so="cc -shared -fPIC -Wl,--no-as-needed"
  $so -Wl,-soname,libefa.so.1 -o libefa.so.1 efa.c
  $so -Wl,-soname,libfabric.so.1 -o libfabric-builtin.so fabric.c "$src/libefa.so.1"
  $so -Wl,-soname,libfabric.so.1 -o libfabric-core.so fabric.c
  $so -o libefa-fi.so prov.c "$src/libefa.so.1"
  $so -o libnccl-net-ofi.so plugin-new.c "$src/libfabric-builtin.so"
  $so -o libnccl-net.so plugin-old.c
  $so -Wl,-soname,libnccl.so.2 -o libnccl.so.2.23.4 nccl-new.c
  $so -Wl,-soname,libnccl.so.2 -o libnccl.so.2.18.3 nccl-old.c
}

setup() {
  gantry_step_suite fabric
  HW=$GANTRY_HARNESS_DIR/fabric-hw
  SRC=$GANTRY_HARNESS_DIR/fabric-src
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  CONF=$GANTRY_HARNESS_DIR/gantry.conf
  fabric_host
}

teardown() {
  rm -rf "$WORK"
}

# fabric_host [builtin|dso|none] [new|old|none] [2.23.4|2.18.3] [GANTRY.CONF LINE...]: the host's /opt/amazon libraries
# (libfabric with the provider built in, as a DSO, or without; aws-ofi-nccl's plugin under its new
# name, its old name, or none; NCCL's version). Default: everything there, the current names.
fabric_host() {
  local provider=${1:-builtin} plugin=${2:-new} nccl=${3:-2.23.4}
  shift $(($# < 3 ? $# : 3))
  local efa=$HW/opt/amazon/efa/lib ofi=$HW/opt/amazon/ofi-nccl/lib stand_in=$HW/opt/aws-ofi-nccl/lib
  rm -rf "$efa" "$ofi" "$stand_in" && mkdir -p "$efa" "$ofi" "$stand_in"
  cp "$SRC/libefa.so.1" "$efa/"
  case $provider in
    builtin) cp "$SRC/libfabric-builtin.so" "$efa/libfabric.so.1" ;;
    dso) cp "$SRC/libfabric-core.so" "$efa/libfabric.so.1"; mkdir "$efa/libfabric"; cp "$SRC/libefa-fi.so" "$efa/libfabric/" ;;
    none) cp "$SRC/libfabric-core.so" "$efa/libfabric.so.1" ;;
  esac
  case $plugin in
    new) cp "$SRC/libnccl-net-ofi.so" "$ofi/" ;;
    old) cp "$SRC/libnccl-net.so" "$ofi/" ;;
  esac
  cp "$SRC/libnccl.so.$nccl" "$stand_in/" && ln -s "libnccl.so.$nccl" "$stand_in/libnccl.so.2"
  gantry_plugin_conf "host_root = $HW" "efa = 1" "efa_host_libs = 1" "$@"
}

# run_user CMD...: `run` as the test user; the check's line and the other warnings (node 0's memlock
# warning: the harness limits memlock) apart: $check holds the check's lines, $output the tasks'.
run_user() {
  run runuser -u "$U" -- env -C "$WORK" "$@"
  echo "$output"
  check=$(echo "$output" | grep 'EFA check:' || true)
  output=$(echo "$output" | grep -v '^gantry: warning:' || true)
}

# gantry_run ARGS...: `gantry run` as the test user with this suite's gantry.conf.
gantry_run() {
  run runuser -u "$U" -- env -C "$WORK" GANTRY_CONFIG="$CONF" "$GANTRY" run "$@"
  echo "$output"
  check=$(echo "$output" | grep 'EFA check:' || true)
}

@test "fabric: everything present, 3 nodes: no line, the tasks run; doctor --image says what it found" {
  run_user srun -N3 -n3 --container-image="$DEBIAN" sh -c 'echo "ran $NCCL_NET_PLUGIN"'
  [ "$status" -eq 0 ]
  [ -z "$check" ]
  [ "$(echo "$output" | grep -c '^ran ofi$')" -eq 3 ]
  # The DSO provider (libfabric/libefa-fi.so beside libfabric.so.1) counts as well.
  fabric_host dso
  gantry_run "$REG/gantry-test/debian" true
  [ "$status" -eq 0 ]
  [ -z "$check" ]
  run runuser -u "$U" -- env -C "$WORK" GANTRY_CONFIG="$CONF" "$GANTRY" doctor --image "$REG/gantry-test/debian"
  echo "$output"
  echo "$output" | grep -q "^✓ EFA fabric in $REG/gantry-test/debian .* 2 EFA device(s); libfabric /opt/amazon/efa/lib/libfabric.so.1 (efa provider /opt/amazon/efa/lib/libfabric/libefa-fi.so); NCCL 2.23.4 (.*); NCCL opens /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so (ncclNetPlugin_v8)$"
}

@test "fabric: no plugin NCCL would load, 3 nodes: exactly one line on srun's terminal, the tasks still run" {
  fabric_host builtin none
  run_user srun -N3 -n3 --container-image="$DEBIAN" true
  [ "$status" -eq 0 ]
  [ "$check" = "gantry: warning: EFA check: no NCCL net plugin in the container (NCCL 2.23.4 looks for libnccl-net.so): NCCL would fall back to TCP sockets; install aws-ofi-nccl in the image, or set efa_host_libs = 1 in gantry.conf to bind the host's" ]
}

@test "fabric: efa_required = yes fails the step with the cause" {
  fabric_host none new 2.23.4 "efa_required = yes"
  run_user srun -n1 --container-image="$DEBIAN" echo should-not-run
  [ "$status" -ne 0 ]
  ! echo "$output" | grep -q should-not-run || false
  echo "$check" | grep -q "gantry: EFA check: libfabric /opt/amazon/efa/lib/libfabric.so.1 has no efa provider (not built in, no libefa-fi.so in /opt/amazon/efa/lib/libfabric): NCCL would fall back to TCP sockets; use a libfabric built with the efa provider (the EFA installer's), or efa_host_libs = 1 (efa_required = yes in gantry.conf: the step does not run)"
  # gantry run too: the command does not run.
  gantry_run "$REG/gantry-test/debian" echo should-not-run
  [ "$status" -eq 125 ]
  ! echo "$output" | grep -q should-not-run || false
  [ "$(echo "$check" | wc -l)" -eq 1 ]
}

@test "fabric: devices not visible (efa = 0) with FI_PROVIDER=efa: one line" {
  fabric_host builtin new 2.23.4 "efa = 0"
  gantry_run -e FI_PROVIDER=efa "$REG/gantry-test/debian" echo ran
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = ran ]
  [ "$check" = "gantry: warning: EFA check: no EFA device is visible in the container (/dev/infiniband/uverbs*): NCCL would fall back to TCP sockets; run on nodes with EFA, with efa = 1 in gantry.conf (\`gantry doctor\` shows both)" ]
}

@test "fabric: libfabric's efa provider needs libefa.so.1, which is missing" {
  fabric_host
  rm "$HW/opt/amazon/efa/lib/libefa.so.1"
  gantry_run "$REG/gantry-test/debian" true
  [ "$check" = "gantry: warning: EFA check: libfabric /opt/amazon/efa/lib/libfabric.so.1 (efa built in) needs libefa.so.1, which is not in the container: NCCL would fall back to TCP sockets; install rdma-core's libefa.so.1 in the image (or efa_host_libs = 1)" ]
}

@test "fabric: NCCL_NET_PLUGIN naming a missing plugin; the new file name without NCCL_NET_PLUGIN" {
  gantry_run -e NCCL_NET_PLUGIN=aws "$REG/gantry-test/debian" true
  [ "$check" = "gantry: warning: EFA check: NCCL_NET_PLUGIN=aws names a plugin that is not in the container (NCCL 2.23.4 opens aws and libnccl-net-aws.so): NCCL would fall back to TCP sockets; aws-ofi-nccl's plugin is /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so: set NCCL_NET_PLUGIN=ofi" ]
  gantry_run -e NCCL_NET_PLUGIN= "$REG/gantry-test/debian" true
  [ "$check" = "gantry: warning: EFA check: aws-ofi-nccl's /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so is in the container but NCCL 2.23.4 opens it only when NCCL_NET_PLUGIN=ofi (it looks for libnccl-net.so): NCCL would fall back to TCP sockets; set NCCL_NET_PLUGIN=ofi (export it before srun, or in the image's Env)" ]
}

@test "fabric: the old plugin (libnccl-net.so, v4) with a newer NCCL, and a plugin path with an older NCCL" {
  fabric_host builtin old 2.23.4
  gantry_run "$REG/gantry-test/debian" true
  [ "$check" = "gantry: warning: EFA check: /opt/amazon/ofi-nccl/lib/libnccl-net.so exports ncclNetPlugin v4 but NCCL 2.23.4 asks for v6, v7, v8, v9: NCCL would fall back to TCP sockets; install the aws-ofi-nccl release built for NCCL 2.23.4 (a newer plugin for a newer NCCL, an older one for an older NCCL)" ]
  # The same old plugin is what NCCL 2.18 loads: no line.
  fabric_host builtin old 2.18.3
  gantry_run "$REG/gantry-test/debian" true
  [ -z "$check" ]
  # NCCL 2.18 takes NCCL_NET_PLUGIN as a suffix: a path is looked for as libnccl-net-<path>.so.
  fabric_host builtin new 2.18.3
  gantry_run -e NCCL_NET_PLUGIN=/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so "$REG/gantry-test/debian" true
  [ "$check" = "gantry: warning: EFA check: NCCL_NET_PLUGIN=/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so names a plugin that is not in the container (NCCL 2.18.3 opens libnccl-net-/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so.so): NCCL would fall back to TCP sockets; NCCL 2.18.3 takes NCCL_NET_PLUGIN as a name suffix only: set NCCL_NET_PLUGIN=ofi" ]
  # The newer NCCL takes the path as it is.
  fabric_host builtin new 2.23.4
  gantry_run -e NCCL_NET_PLUGIN=/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so "$REG/gantry-test/debian" true
  [ -z "$check" ]
}
