# fixtures: registry images slurm
# Devices and wiring inside containers started by the SPANK plugin (issue 7), on the Slurm harness
# with fake hardware: tests/harness/fakehw.sh builds a host root with real device nodes (mknod, real
# major/minor numbers), sysfs-like EFA/mlx5 driver links, a versioned fake driver library set
# with its ld.so cache, a MIG-mode GPU (procfs capabilities, fake NVML) and CDI specs in JSON and
# YAML; gantry.conf points host_root at it. Everything else is the real code path:
# srun -> plugin -> select_devices -> launcher -> the ranks.

load helpers

# The MPI test image: the harness's debian rootfs + openmpi-bin installed with apt in a chroot + the
# allreduce program compiled here with mpicc, as a squashfs file. Cached; rebuilt when the program
# changes (about 10 s).
build_mpi_image() {
  local src=$BATS_TEST_DIRNAME/devices/allreduce.c
  gantry_apt_image "$GANTRY_HARNESS_DIR/cache/devices-mpi" "v2 $(sha256sum "$src" | cut -d' ' -f1)" \
    "mpicc -O2 -o \"\$1/usr/local/bin/allreduce\" '$src'" openmpi-bin libopenmpi3
}

setup_file() {
  gantry_load_env registry images slurm
  "$GANTRY_SOURCE_DIR/tests/harness/fakehw.sh" "$GANTRY_HARNESS_DIR/fakehw" >/dev/null
  build_mpi_image
  # An image that declares PyTorch the way the framework images do (PYTORCH_VERSION in Env).
  local layout=$GANTRY_HARNESS_DIR/cache/devices-torchlike
  rm -rf "$layout" && cp -a "$GANTRY_TEST_OCI_TINY" "$layout"
  umoci config --image "$layout:latest" --config.env PYTORCH_VERSION=2.3.0
  skopeo copy -q --dest-tls-verify=false "oci:$layout:latest" "docker://$GANTRY_TEST_REGISTRY_HTTP/gantry-test/torchlike:latest"
}

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  FAKE=$GANTRY_HARNESS_DIR/fakehw
  MPI=$GANTRY_HARNESS_DIR/cache/devices-mpi/image.sqsh
  write_conf
  TINY="$REG#gantry-test/tiny"
  DEBIAN="$REG#gantry-test/debian"
  TORCH="$REG#gantry-test/torchlike"
  U=$GANTRY_TEST_USER
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/devices-test.XXXXXX")
  chown "$U" "$WORK"
}

teardown() {
  rm -rf "$WORK"
}

# write_conf [EXTRA LINE...]: the gantry.conf the plugin reads, with host_root at the fake hardware.
# EFA is off unless a test turns it on: with it, every step on a node with a limited memlock (this
# harness: 8 MiB) prints the memlock warning, which would mix into the other tests' output.
write_conf() {
  gantry_plugin_conf "host_root = $FAKE" "efa = 0" "$@"
}

# run_user CMD...: `run` as the test user, with the selection's warnings (node 0 prints them, e.g.
# the stale library of the fake driver set) moved from $output/$lines to $warnings.
run_user() {
  run as_user "$@"
  warnings=$(echo "$output" | grep '^gantry: warning:' || true)
  output=$(echo "$output" | grep -v '^gantry: warning:' || true)
  mapfile -t lines <<< "$output"
}

as_user() {
  runuser -u "$U" -- env -C "$WORK" "$@"
}

@test "NVIDIA_VISIBLE_DEVICES=0,2: exactly GPUs 0 and 2 plus the control devices, real numbers" {
  run_user env NVIDIA_VISIBLE_DEVICES=0,2 srun -n1 --container-image="$DEBIAN" bash -c \
    'ls /dev | grep nvidia | tr "\n" " "; echo; stat -c "%n %F %t:%T" /dev/nvidia0 /dev/nvidia2 /dev/nvidiactl /dev/nvidia-uvm; ls /dev/nvidia-caps; echo "CVD=$CUDA_VISIBLE_DEVICES NVD=$NVIDIA_VISIBLE_DEVICES"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia0 nvidia2 nvidiactl " ]
  echo "$output" | grep -qx '/dev/nvidia0 character special file c3:0'
  echo "$output" | grep -qx '/dev/nvidia2 character special file c3:2'
  echo "$output" | grep -qx '/dev/nvidiactl character special file c3:ff'
  echo "$output" | grep -qx '/dev/nvidia-uvm character special file 1ff:0'
  # The host's nvidia-caps are all MIG capabilities (config, monitor, GPU 1's instances): none asked for.
  ! echo "$output" | grep -q '^nvidia-cap' || false
  # Only two device nodes exist inside, so CUDA must number them from 0.
  echo "$output" | grep -qx 'CVD=0,1 NVD=0,2'
}

@test "CUDA_VISIBLE_DEVICES from the job selects, and a GPU UUID selects, on every node" {
  run_user env CUDA_VISIBLE_DEVICES=1 srun -N3 -n3 --container-image="$TINY" sh -c 'ls /dev | grep "^nvidia[0-9]"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort -u)" = "nvidia1" ]
  [ "$(echo "$output" | wc -l)" -eq 3 ]
  run_user env NVIDIA_VISIBLE_DEVICES=GPU-fake0000-0000-0000-0000-000000000003 srun -n1 --container-image="$TINY" sh -c 'ls /dev | grep "^nvidia[0-9]"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "nvidia3" ]
}

@test "no GPU request: no NVIDIA device, library or binary; void and none" {
  run_user srun -n1 --container-image="$DEBIAN" bash -c 'ls /dev | grep -c nvidia || true; ls /usr/local/nvidia 2>&1 | head -1; command -v nvidia-smi || echo no-smi'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "0" ]
  echo "$output" | grep -q 'No such file'
  echo "$output" | grep -qx no-smi
  run_user env NVIDIA_VISIBLE_DEVICES=void srun -n1 --container-image="$DEBIAN" bash -c 'ls /dev | grep -c nvidia || true'
  [ "$output" = "0" ]
  # none: driver files and control devices, but no GPU.
  run_user env NVIDIA_VISIBLE_DEVICES=none srun -n1 --container-image="$DEBIAN" bash -c 'ls /dev | grep nvidia | tr "\n" " "; nvidia-smi | head -1'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidiactl NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 (fake)" ]
}

@test "ldconfig -p inside resolves libcuda.so.1; the loader finds it; nvidia-smi runs; stale and video libraries stay out" {
  run_user env NVIDIA_VISIBLE_DEVICES=all srun -N2 -n2 --container-image="$DEBIAN" --container-mounts="$FAKE/test:/probe:ro" bash -c \
    'ldconfig -p | grep -E "libcuda.so.1 |libnvidia" | sort; /probe/cuda-probe; nvidia-smi -L | wc -l; ls /usr/lib/firmware/nvidia; test -S /run/nvidia-persistenced/socket && echo persistenced-socket'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c 'libcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1')" -eq 2 ]
  [ "$(echo "$output" | grep -c '^cuda driver version 12040 from /usr/local/nvidia/lib64/libcuda.so.1$')" -eq 2 ]
  [ "$(echo "$output" | grep -cx '4')" -eq 2 ]                       # nvidia-smi -L: four GPUs
  [ "$(echo "$output" | grep -cx '550.54.15')" -eq 2 ]               # firmware of the running driver only
  [ "$(echo "$output" | grep -cx 'persistenced-socket')" -eq 2 ]
  ! echo "$output" | grep -q 'libnvidia-cfg' || false               # 535.104.05: stale, skipped
  [ "$(echo "$warnings" | grep -c 'skipping .*libnvidia-cfg.so.535.104.05.*not of the running driver 550.54.15')" -eq 1 ]
  ! echo "$output" | grep -q 'libnvidia-encode' || false            # video not asked for
  ! echo "$output" | grep -qx '535.104.05' || false
  run_user env NVIDIA_VISIBLE_DEVICES=0 NVIDIA_DRIVER_CAPABILITIES=compute,utility,video srun -n1 --container-image="$DEBIAN" bash -c 'ldconfig -p | grep -c libnvidia-encode.so.1'
  echo "$output"
  [ "$output" = "1" ]
}

@test "MIG: <gpu>:<mig> and MIG-<uuid> get the parent GPU and the instance's nvidia-caps nodes only" {
  # GPU 1 of the fake driver is in MIG mode: 1:1 is GI 2 / CI 0, whose caps are 156 and 157 (major
  # 510, nvidia-caps in the fake /proc/devices).
  run_user env NVIDIA_VISIBLE_DEVICES=1:1 srun -n1 --container-image="$TINY" sh -c \
    'ls /dev | grep "^nvidia[0-9]"; stat -c "%n %t:%T" /dev/nvidia-caps/*; echo "CVD=$CUDA_VISIBLE_DEVICES NVD=$NVIDIA_VISIBLE_DEVICES"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'nvidia1\n/dev/nvidia-caps/nvidia-cap156 1fe:9c\n/dev/nvidia-caps/nvidia-cap157 1fe:9d\nCVD=0 NVD=1:1')" ]
  # A MIG UUID (resolved through the driver's NVML, here the fake one) on every node, with the
  # monitor capability (nvidia-cap2) asked for.
  run_user env NVIDIA_VISIBLE_DEVICES=MIG-fake0001-0000-0000-0000-00000000201 NVIDIA_MIG_MONITOR_DEVICES=all \
    srun -N3 -n3 --container-image="$TINY" sh -c 'echo $(ls /dev | grep "^nvidia[0-9]") $(ls /dev/nvidia-caps)'
  echo "$output"
  [ "$status" -eq 0 ]
  # srun's own lines ("job N queued and waiting for resources" while the last step's nodes are freed) are
  # not the tasks' output.
  [ "$(echo "$output" | grep -v '^srun: ' | sort -u)" = "nvidia1 nvidia-cap156 nvidia-cap158 nvidia-cap2" ]
  [ "$(echo "$output" | grep -vc '^srun: ')" -eq 3 ]
  run_user env NVIDIA_VISIBLE_DEVICES=1:5 srun -n1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "NVIDIA_VISIBLE_DEVICES=1:5: no MIG device '1:5' on this node (MIG devices: 1:0, 1:1, 1:2)"
}

@test "CDI in YAML: an nvidia-ctk-shaped spec gives the GPU, the driver library by soname and nvidia-smi" {
  run_user env NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=2 srun -n1 --container-image="$DEBIAN" --container-mounts="$FAKE/test:/probe:ro" bash -c \
    'echo $(ls /dev | grep nvidia); /probe/cuda-probe; readlink /usr/lib/x86_64-linux-gnu/libcuda.so; nvidia-smi | head -1'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia2 nvidiactl" ]
  [ "${lines[1]}" = "cuda driver version 12040 from /usr/lib/x86_64-linux-gnu/libcuda.so.1" ]
  [ "${lines[2]}" = "libcuda.so.1" ]                       # nvidia-ctk's create-symlinks hook, made by Gantry
  [ "${lines[3]}" = "NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 (fake)" ]
  # The MIG device the spec defines: its parent and both capabilities.
  run_user env GANTRY_CDI_DEVICES=nvidia.com/gpu=1:0 srun -n1 --container-image="$TINY" sh -c 'echo $(ls /dev | grep "^nvidia[0-9]") $(ls /dev/nvidia-caps)'
  echo "$output"
  [ "$output" = "nvidia1 nvidia-cap147 nvidia-cap148" ]
}

@test "a GPU the node lacks or an unknown capability fails the step with the reason" {
  run_user env NVIDIA_VISIBLE_DEVICES=7 srun -n1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "NVIDIA_VISIBLE_DEVICES=7: no GPU '7' on this node (GPUs: 0, 1, 2, 3)"
  run_user env NVIDIA_VISIBLE_DEVICES=0 NVIDIA_DRIVER_CAPABILITIES=compute,teleport srun -n1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "unknown capability 'teleport'"
}

@test "EFA: only uverbs devices whose driver is efa, plus rdma_cm; mlx only when asked" {
  write_conf "efa = 1"
  run_user srun -N3 -n3 --container-image="$TINY" sh -c 'ls /dev/infiniband | tr "\n" " "; echo'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | sort -u)" = "rdma_cm uverbs0 uverbs2 " ]
  [ "$(echo "$output" | wc -l)" -eq 3 ]
  # EFA needs unlimited memlock: a limited one is reported on the user's terminal, once (node 0).
  if [ "$(runuser -u "$U" -- sh -c 'ulimit -l')" != unlimited ]; then
    [ "$(echo "$warnings" | grep -c 'gantry: warning: the memlock limit is [0-9]* KiB; EFA needs it unlimited')" -eq 1 ]
  fi
  run_user srun -n1 --container-image="$TINY" stat -c '%n %t:%T' /dev/infiniband/uverbs2 /dev/infiniband/rdma_cm
  [ "$output" = "$(printf '/dev/infiniband/uverbs2 e7:c2\n/dev/infiniband/rdma_cm a:3a')" ]
  run_user env MELLANOX_VISIBLE_DEVICES=1 srun -n1 --container-image="$TINY" sh -c 'ls /dev/infiniband | tr "\n" " "'
  echo "$output"
  [ "$output" = "rdma_cm uverbs0 uverbs2 uverbs3 " ]
  run_user env MELLANOX_VISIBLE_DEVICES=all srun -n1 --container-image="$TINY" sh -c 'ls /dev/infiniband | tr "\n" " "'
  [ "$output" = "rdma_cm uverbs0 uverbs1 uverbs2 uverbs3 " ]
}

@test "efa_host_libs: host libfabric and aws-ofi-nccl mounted, on the library path, FI_PROVIDER and NCCL_NET_PLUGIN set" {
  write_conf "efa = 1" "efa_host_libs = 1"
  run_user srun -n1 --container-image="$DEBIAN" bash -c 'echo "$FI_PROVIDER $NCCL_NET_PLUGIN"; ldconfig -p | grep -o "libfabric.so.1 .*"; /opt/amazon/efa/bin/fi_info; ls /opt/amazon/ofi-nccl/lib'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "efa ofi" ]
  [ "${lines[1]}" = "libfabric.so.1 (libc6,x86-64) => /opt/amazon/efa/lib/libfabric.so.1" ]
  [ "${lines[2]}" = "provider: efa (fake)" ]
  [ "${lines[3]}" = "libnccl-net-ofi.so" ]
  write_conf "efa = 1"
  run_user srun -n1 --container-image="$DEBIAN" bash -c 'echo "[$FI_PROVIDER]"; test -e /opt/amazon || echo no-opt-amazon'
  [ "${lines[0]}" = "[]" ]
  [ "${lines[1]}" = "no-opt-amazon" ]
}

@test "gpu = 0 and efa = 0 in gantry.conf switch the pieces off" {
  write_conf "gpu = 0"
  run_user env NVIDIA_VISIBLE_DEVICES=all srun -n1 --container-image="$TINY" sh -c 'ls /dev | grep -c -e nvidia -e infiniband || true'
  echo "$output"
  [ "$output" = "0" ]
}

@test "CDI: a device named in GANTRY_CDI_DEVICES gets the spec's nodes, mounts and env" {
  run_user env GANTRY_CDI_DEVICES=example.com/fpga=fpga0 srun -n1 --container-image="$TINY" sh -c 'stat -c "%t:%T" /dev/fpga0; cat /opt/fpga/firmware.bin; echo "$FPGA_VISIBLE_DEVICES $FPGA_RUNTIME"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "f0:0" ]
  [ "${lines[1]}" = "fpga bitstream (fake)" ]
  [ "${lines[2]}" = "0 fake" ]
  run_user env GANTRY_CDI_DEVICES=example.com/fpga=fpga9 srun -n1 --container-image="$TINY" true
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "CDI device example.com/fpga=fpga9 is not defined"
}

@test "PyTorch: 2 nodes x 4 ranks get MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE" {
  run_user srun -N2 --ntasks-per-node=4 --container-image="$TORCH" sh -c 'echo "$(hostname) $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $SLURM_JOB_ID"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | wc -l)" -eq 8 ]
  first=$(echo "$output" | awk '{print $1}' | sort | head -1)
  jobid=$(echo "$output" | awk 'NR==1 {print $9}')
  port=$((61000 + jobid % 4536))
  # Every rank: the same rendezvous, world size 8, four local ranks.
  [ "$(echo "$output" | awk '{print $2, $3, $4, $7}' | sort -u)" = "$first $port 8 4" ]
  # Ranks 0..7 exactly once; local ranks 0..3 on each node; node rank 0 on the master.
  [ "$(echo "$output" | awk '{print $5}' | sort -n | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 " ]
  [ "$(echo "$output" | awk '{print $1, $6}' | sort -u | wc -l)" -eq 8 ]
  [ "$(echo "$output" | awk -v m="$first" '$1 == m {print $8}' | sort -u)" = "0" ]
  # The same image without the declaration gets no rendezvous; GANTRY_PYTORCH=1 asks for it.
  run_user srun -n1 --container-image="$TINY" sh -c 'echo "[$MASTER_ADDR]"'
  [ "$output" = "[]" ]
  run_user env GANTRY_PYTORCH=1 srun -n1 --container-image="$TINY" sh -c 'echo "$WORLD_SIZE $RANK"'
  [ "$output" = "1 0" ]
  write_conf "pytorch = 0"
  run_user srun -n1 --container-image="$TORCH" sh -c 'echo "[$MASTER_ADDR]"'
  [ "$output" = "[]" ]
}

@test "PMIx: PMIX_* passed and the module variables mapped to PMIX_MCA_*" {
  run_user srun -n2 --mpi=pmix --container-image="$TINY" sh -c 'env | grep -E "^PMIX_(MCA_(ptl|psec|gds)|PTL_MODULE|SECURITY_MODE|GDS_MODULE|RANK)=" | sort | tr "\n" " "; echo; [ -n "$PMIX_SERVER_TMPDIR" ] && [ -n "$(ls -A "$PMIX_SERVER_TMPDIR")" ] && echo "server dir $PMIX_SERVER_TMPDIR"'
  echo "$output"
  [ "$status" -eq 0 ]
  line=$(echo "$output" | head -1)
  echo "$line" | grep -q 'PMIX_RANK='
  # Slurm makes the server's directory (below the slurmd spool directory) after the container exists:
  # the spool directory is bound, so every rank sees the server's files there.
  [ "$(echo "$output" | grep -c '^server dir /.*/pmix\.[0-9]*\.[0-9]*/*$')" -eq 2 ]
  # Each mapped name carries the value Slurm gave its source name (Slurm 22.05 sets SECURITY_MODE and
  # GDS_MODULE; PTL_MODULE only where its PMIx has several transports).
  mapped=0
  for pair in "PTL_MODULE MCA_ptl" "SECURITY_MODE MCA_psec" "GDS_MODULE MCA_gds"; do
    set -- $pair
    src=$(echo "$line" | grep -o "PMIX_$1=[^ ]*" | cut -d= -f2)
    if [ -z "$src" ]; then ! echo "$line" | grep -q "PMIX_$2="; continue; fi
    # The server's directory is reachable, so the dstore GDS module Slurm chose is kept (not hash).
    echo "$line" | grep -q "PMIX_$2=$src "
    mapped=$((mapped + 1))
  done
  [ "$mapped" -ge 2 ]
}

@test "MPI: an Open MPI allreduce across 3 nodes (6 ranks) with srun --mpi=pmix inside containers" {
  allreduce() {
    run_user env OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0 \
      srun -N3 --ntasks-per-node=2 --mpi=pmix --container-image="$MPI" bash -c /usr/local/bin/allreduce
    echo "$output"
  }
  allreduce
  # Debian 12's Open MPI 4.1.4 TCP BTL can lose the race of two ranks connecting to each other at
  # once ("failed to TCP connect ... Operation now in progress (115)", then a crash in the BTL); seen
  # once in CI on a loaded 2-core machine, and on plain VMs without containers. Only that
  # failure gets one more try, and it is reported. Any other failure fails here.
  if [ "$status" -ne 0 ] && echo "$output" | grep -q 'Open MPI failed to TCP connect to a peer'; then
    echo "# Open MPI's TCP connect race (above); one more try" >&3
    allreduce
  fi
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -c ': sum 21 ok$')" -eq 6 ]
  [ "$(echo "$output" | grep -o 'on gnode[0-9]' | sort -u | wc -l)" -eq 3 ]
  # Open MPI keeps its session files in the PMIx client directory below the node's TmpFS, a host path
  # (here below the build tree): the container sees the step's directory there, made by slurmstepd.
  tmpfs=$(scontrol show config | awk '$1 == "TmpFS" {print $3}')
  [ -n "$tmpfs" ] && [ "$tmpfs" != /tmp ]
  run_user srun -n1 --mpi=pmix --container-image="$TINY" sh -c 'for d in "$1"/spmix_appdir_*; do echo "$d"; done' sh "$tmpfs"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "^$tmpfs/spmix_appdir_[0-9_]*\.[0-9]*$"
}

@test "gantry doctor: a table with a mark and a fix per line, GPUs, EFA, memlock and the plugin" {
  local gantry=$GANTRY_BUILD_DIR/runtime/gantry plugstack=$GANTRY_HARNESS_DIR/slurm/plugstack.conf
  write_conf "efa = 1"
  run env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" "$gantry" doctor --plugstack "$plugstack"
  echo "$output"
  echo "$output" | grep -q '^✓ user namespaces '
  echo "$output" | grep -q '^✓ NVIDIA GPUs and driver .* 4 GPU(s), driver 550.54.15$'
  echo "$output" | grep -q '^✓ EFA devices .* 2 efa of 4 RDMA device(s): uverbs0 uverbs2$'
  echo "$output" | grep -q "^✓ Slurm plugin in plugstack.conf .*spank_gantry.so$"
  # This machine's memlock limit decides the last check (raising it needs CAP_SYS_RESOURCE).
  if [ "$(ulimit -l)" = unlimited ]; then
    [ "$status" -eq 0 ]; echo "$output" | grep -qx '11 of 11 checks passed'
  else
    [ "$status" -eq 1 ]; echo "$output" | grep -qx '10 of 11 checks passed'
    echo "$output" | grep -A1 '^✗ memlock limit' | grep -q 'fix: LimitMEMLOCK=infinity'
  fi
  # Without RDMA devices a limited memlock is fine; without GPUs there is nothing to check.
  mkdir -p "$WORK/emptyroot"
  printf 'store_path = %s\nhost_root = %s\n' "$GANTRY_TEST_FSX/store" "$WORK/emptyroot" > "$WORK/empty.conf"
  run env GANTRY_CONFIG="$WORK/empty.conf" prlimit --memlock=65536 "$gantry" doctor --plugstack "$plugstack"
  echo "$output"
  echo "$output" | grep -q '^✓ memlock limit .* 64 KiB (fine: no RDMA device here)$'
  echo "$output" | grep -q '^✓ NVIDIA GPUs and driver .* no NVIDIA GPU'
  # A limited memlock with EFA present, and a plugstack without the plugin: ✗ with the fix below.
  echo "# no plugin here" > "$WORK/plugstack.conf"
  run env GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" prlimit --memlock=65536 "$gantry" doctor --plugstack "$WORK/plugstack.conf"
  echo "$output"
  [ "$status" -eq 1 ]
  echo "$output" | grep -q '^✗ memlock limit .* 64 KiB (EFA and RDMA need unlimited)$'
  echo "$output" | grep -A1 '^✗ Slurm plugin' | grep -q 'fix: add .required .*spank_gantry.so'
  echo "$output" | grep -qx '9 of 11 checks passed'
}

@test "PMI2: PMI_FD stays open inside the container and PMI_* are set" {
  run_user srun -n2 --mpi=pmi2 --container-image="$TINY" sh -c 'echo "$PMI_RANK $PMI_SIZE $(readlink /proc/self/fd/$PMI_FD)"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | awk '{print $1}' | sort | tr '\n' ' ')" = "0 1 " ]
  [ "$(echo "$output" | awk '{print $2}' | sort -u)" = "2" ]
  [ "$(echo "$output" | grep -c ' socket:\[[0-9]*\]$')" -eq 2 ]
}

@test "a named container keeps its device wiring for later steps (--container-name)" {
  cat > "$WORK/job.sh" <<JOB
#!/bin/bash
NVIDIA_VISIBLE_DEVICES=3 srun -n1 --container-image="$TINY" --container-name=gpus true
srun -n1 --container-name=gpus sh -c 'echo "\$CUDA_VISIBLE_DEVICES \$NVIDIA_VISIBLE_DEVICES \$(ls /dev | grep "^nvidia[0-9]")"'
JOB
  chown "$U" "$WORK/job.sh"
  run_user salloc -N1 bash "$WORK/job.sh"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx '0 3 nvidia3'
}

@test "gantry run applies the same selection outside Slurm" {
  run runuser -u "$U" -- env -C "$WORK" GANTRY_CONFIG="$GANTRY_HARNESS_DIR/gantry.conf" NVIDIA_VISIBLE_DEVICES=1 \
    "$GANTRY_BUILD_DIR/runtime/gantry" run --mount "$FAKE/test:/probe:ro" "$GANTRY_TEST_REGISTRY_HTTP/gantry-test/debian" -- \
    bash -c 'ls /dev | grep "^nvidia[0-9]"; /probe/cuda-probe; echo "$CUDA_VISIBLE_DEVICES"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -3)" = "$(printf 'nvidia1\ncuda driver version 12040 from /usr/local/nvidia/lib64/libcuda.so.1\n0')" ]
}
