#!/usr/bin/env bash
# Builds a fake host root for the device tests (issue 7; no GPU or EFA on the test machines): real
# device nodes made with mknod and the real major/minor numbers, sysfs-like driver links for EFA and
# mlx5 RDMA devices, a versioned fake NVIDIA driver library set (tiny real shared objects) with an
# ld.so cache built by ldconfig, a fake nvidia-smi, GSP firmware, the driver's procfs files, a
# persistenced socket, host EFA/aws-ofi-nccl libraries and a CDI spec. Gantry reads it through
# `host_root = PREFIX` in gantry.conf; the code path is the one a real node takes.
#
#   tests/harness/fakehw.sh PREFIX       (root; rebuilds PREFIX from scratch, ~1 s)
#
# Device numbers (Linux Documentation/admin-guide/devices.txt and the NVIDIA driver):
#   /dev/nvidiaN 195:N, /dev/nvidiactl 195:255, /dev/nvidia-modeset 195:254  (fixed, registered)
#   /dev/nvidia-uvm, /dev/nvidia-uvm-tools: dynamic major, minors 0 and 1; we use 511:0 and 511:1
#   /dev/nvidia-caps/nvidia-capN: dynamic major (nvidia-caps in PREFIX/proc/devices); we use 510:N,
#     N as the driver numbers them in /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, then
#     per GPU minor g, GPU instance i, compute instance c: gi access 3 + 135g + 9i, ci access that + 1 + c
#   /dev/infiniband/uverbsN 231:(192+N)  (fixed: IB_UVERBS_BASE_MINOR)
#   /dev/infiniband/rdma_cm: a misc device with a dynamic minor; we use 10:58
#   /dev/fakefpga0 240:0 (240-254 are reserved for local/experimental use): the CDI test device
# None of these is backed by a driver here: opening them fails (ENXIO), their presence is what the
# tests check (stat -c %t:%T inside the container).
#
# Contents:
#   GPUs 0..3 (minors 0..3, UUIDs GPU-fake0000-...-000N), driver 550.54.15 in
#   /proc/driver/nvidia/version; libcuda/libnvidia-ml/libnvidia-ptxjitcompiler/libnvidia-encode of
#   550.54.15 and a stale libnvidia-cfg of 535.104.05 (must be skipped) in /usr/lib/x86_64-linux-gnu.
#   RDMA: uverbs0 efa, uverbs1 mlx5_core, uverbs2 efa, uverbs3 mlx5_core.
#   MIG: GPU 1 is in MIG mode with GI 1 (CI 0) and GI 2 (CIs 0, 1): MIG devices 1:0 (caps 147, 148),
#   1:1 (156, 157), 1:2 (156, 158), in /proc/driver/nvidia/capabilities/gpu1/mig/gi*/[ci*/]access;
#   the fake libnvidia-ml (NVML) names them MIG-fake0001-0000-0000-0000-0000000GGCC (GG = GI, CC = CI).
#   CDI: example-fpga.json (a non-NVIDIA device) and nvidia.yaml, shaped like `nvidia-ctk cdi
#   generate`'s output for this fake driver (devices 0..3, 1:0, all; mounts, hooks).
#   Test helper: PREFIX/test/cuda-probe dlopens libcuda.so.1 through the loader and calls cuInit and
#   cuDriverGetVersion (the fake returns 12040).
set -euo pipefail

root=${1:?usage: fakehw.sh PREFIX}
version=550.54.15
stale=535.104.05
libdir=usr/lib/x86_64-linux-gnu

[ "$(id -u)" -eq 0 ] || { echo "fakehw.sh: must run as root (mknod)" >&2; exit 1; }
case $root in /*) ;; *) echo "fakehw.sh: PREFIX must be absolute" >&2; exit 1 ;; esac
[ "$root" != / ] || { echo "fakehw.sh: refusing to write into /" >&2; exit 1; }
rm -rf "$root"
mkdir -p "$root"/{dev/nvidia-caps,dev/infiniband,etc,proc/driver/nvidia/gpus,$libdir,usr/bin,test}
mkdir -p "$root"/{lib/firmware/nvidia/$version,lib/firmware/nvidia/$stale,run/nvidia-persistenced,etc/cdi}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- device nodes ---
node() { mknod -m "$4" "$root/dev/$1" c "$2" "$3"; }
for i in 0 1 2 3; do node nvidia$i 195 $i 666; done
node nvidiactl 195 255 666
node nvidia-modeset 195 254 666
node nvidia-uvm 511 0 666
node nvidia-uvm-tools 511 1 666
node nvidia-caps/nvidia-cap1 510 1 400
node nvidia-caps/nvidia-cap2 510 2 444
for cap in 147 148 156 157 158; do node nvidia-caps/nvidia-cap$cap 510 $cap 444; done
for i in 0 1 2 3; do node infiniband/uverbs$i 231 $((192 + i)) 666; done
node infiniband/rdma_cm 10 58 666
node fakefpga0 240 0 666

# --- procfs of the driver ---
printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Tue Mar  5 19:38:26 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n' \
  "$version" > "$root/proc/driver/nvidia/version"
for i in 0 1 2 3; do
  d="$root/proc/driver/nvidia/gpus/0000:1$i:00.0"
  mkdir -p "$d"
  printf 'Model: \t\t NVIDIA H100 80GB HBM3 (fake)\nIRQ:   \t\t 0\nGPU UUID: \t GPU-fake0000-0000-0000-0000-00000000000%d\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:1%d:00.0\nDevice Minor: \t %d\nMinor Number: \t %d\n' \
    "$i" "$i" "$i" "$i" > "$d/information"
done

# --- MIG: the capability procfs of GPU 1's instances, the driver's minor table, /proc/devices ---
printf 'Character devices:\n  1 mem\n 10 misc\n195 nvidia-frontend\n231 infiniband_verbs\n510 nvidia-caps\n511 nvidia-uvm\n' \
  > "$root/proc/devices"
access() {  # access FILE MINOR: the driver's access file of one capability
  mkdir -p "$(dirname "$1")"
  printf 'DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n' "$2" > "$1"
}
caps=$root/proc/driver/nvidia/capabilities
access "$caps/mig/config" 1
access "$caps/mig/monitor" 2
access "$caps/gpu1/mig/gi1/access" 147
access "$caps/gpu1/mig/gi1/ci0/access" 148
access "$caps/gpu1/mig/gi2/access" 156
access "$caps/gpu1/mig/gi2/ci0/access" 157
access "$caps/gpu1/mig/gi2/ci1/access" 158
mkdir -p "$root/proc/driver/nvidia-caps"
{
  echo "config 1"; echo "monitor 2"
  for g in 0 1 2 3; do for i in $(seq 0 14); do
    echo "gpu$g/gi$i/access $((3 + 135 * g + 9 * i))"
    for c in $(seq 0 7); do echo "gpu$g/gi$i/ci$c/access $((3 + 135 * g + 9 * i + 1 + c))"; done
  done; done
} > "$root/proc/driver/nvidia-caps/mig-minors"

# --- driver libraries: tiny real shared objects with the driver's sonames ---
cat > "$work/cuda.c" <<'C'
/* Fake libcuda: the two entry points the probe calls. */
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
C
cat > "$work/stub.c" <<'C'
/* Fake driver library: one exported symbol so the file is a real, loadable ELF object. */
const char *gantry_fake_driver_library(void) { return "fake"; }
C
cat > "$work/nvml.c" <<'C'
/* Fake NVML: the calls Gantry makes to name MIG devices, answering for the fake GPUs above (GPU 1
 * in MIG mode with GI 1/CI 0, GI 2/CI 0, GI 2/CI 1). Return codes as NVML's: 0 success,
 * 2 invalid argument, 3 not supported, 6 not found. */
#include <stdio.h>
struct fake_device { int gpu; int mig; };
static struct fake_device gpus[4] = {{0, -1}, {1, -1}, {2, -1}, {3, -1}};
static struct fake_device migs[3] = {{1, 0}, {1, 1}, {1, 2}};
static const unsigned gi[3] = {1, 2, 2}, ci[3] = {0, 0, 1};
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 4; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, struct fake_device **d) {
    if (i >= 4) return 2;
    *d = &gpus[i];
    return 0;
}
int nvmlDeviceGetMinorNumber(struct fake_device *d, unsigned *m) { *m = (unsigned)d->gpu; return 0; }
int nvmlDeviceGetMaxMigDeviceCount(struct fake_device *d, unsigned *n) { *n = d->gpu == 1 ? 7 : 0; return 0; }
int nvmlDeviceGetMigDeviceHandleByIndex(struct fake_device *d, unsigned i, struct fake_device **m) {
    if (d->gpu != 1 || i >= 3) return 6;
    *m = &migs[i];
    return 0;
}
int nvmlDeviceGetUUID(struct fake_device *d, char *buf, unsigned len) {
    if (d->mig < 0) snprintf(buf, len, "GPU-fake0000-0000-0000-0000-00000000000%d", d->gpu);
    else snprintf(buf, len, "MIG-fake0001-0000-0000-0000-0000000%02u%02u", gi[d->mig], ci[d->mig]);
    return 0;
}
int nvmlDeviceGetGpuInstanceId(struct fake_device *d, unsigned *v) {
    if (d->mig < 0) return 3;
    *v = gi[d->mig];
    return 0;
}
int nvmlDeviceGetComputeInstanceId(struct fake_device *d, unsigned *v) {
    if (d->mig < 0) return 3;
    *v = ci[d->mig];
    return 0;
}
C
mklib() {  # mklib SOURCE SONAME FILE
  gcc -shared -fPIC -o "$root/$libdir/$3" -Wl,-soname,"$2" "$work/$1"
  ln -sf "$3" "$root/$libdir/$2"
}
mklib cuda.c libcuda.so.1 libcuda.so.$version
mklib nvml.c libnvidia-ml.so.1 libnvidia-ml.so.$version
mklib stub.c libnvidia-ptxjitcompiler.so.1 libnvidia-ptxjitcompiler.so.$version
mklib stub.c libnvidia-encode.so.1 libnvidia-encode.so.$version
mklib stub.c libnvidia-cfg.so.1 libnvidia-cfg.so.$stale
echo "/$libdir" > "$root/etc/ld.so.conf"
# The cache the host's loader would use; -r: paths in it are as on the host (no prefix).
ldconfig -r "$root" -C /etc/ld.so.cache -f /etc/ld.so.conf

# --- binaries, firmware, sockets ---
cat > "$root/usr/bin/nvidia-smi" <<SH
#!/bin/sh
# Fake nvidia-smi: lists the GPUs whose device nodes this process can see.
if [ "\${1:-}" = "-L" ]; then
  for d in /dev/nvidia[0-9]*; do
    [ -c "\$d" ] || continue
    n=\${d#/dev/nvidia}
    echo "GPU \$n: NVIDIA H100 80GB HBM3 (fake) (UUID: GPU-fake0000-0000-0000-0000-00000000000\$n)"
  done
  exit 0
fi
echo "NVIDIA-SMI $version   Driver Version: $version   CUDA Version: 12.4 (fake)"
SH
chmod 755 "$root/usr/bin/nvidia-smi"
echo fake-gsp > "$root/lib/firmware/nvidia/$version/gsp_ga10x.bin"
echo stale-gsp > "$root/lib/firmware/nvidia/$stale/gsp_ga10x.bin"
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$root/run/nvidia-persistenced/socket"

# --- RDMA: sysfs-like tree, drivers efa and mlx5_core ---
mkdir -p "$root/sys/bus/pci/drivers/efa" "$root/sys/bus/pci/drivers/mlx5_core" \
  "$root/sys/class/infiniband_verbs" "$root/sys/class/infiniband"
echo 6 > "$root/sys/class/infiniband_verbs/abi_version"
rdma() {  # rdma N DRIVER IBNAME
  local pci="0000:00:1$1.0" dev="$root/sys/devices/pci0000:00/0000:00:1$1.0"
  mkdir -p "$dev/infiniband_verbs/uverbs$1" "$dev/infiniband/$3"
  ln -s "../../../bus/pci/drivers/$2" "$dev/driver"
  ln -s ../.. "$dev/infiniband_verbs/uverbs$1/device"
  echo "$3" > "$dev/infiniband_verbs/uverbs$1/ibdev"
  ln -s "../../devices/pci0000:00/$pci/infiniband_verbs/uverbs$1" "$root/sys/class/infiniband_verbs/uverbs$1"
  ln -s "../../devices/pci0000:00/$pci/infiniband/$3" "$root/sys/class/infiniband/$3"
}
rdma 0 efa rdmap16s27
rdma 1 mlx5_core mlx5_0
rdma 2 efa rdmap17s27
rdma 3 mlx5_core mlx5_1

# --- host EFA software (efa_host_libs) ---
mkdir -p "$root/opt/amazon/efa/lib" "$root/opt/amazon/efa/bin" "$root/opt/amazon/ofi-nccl/lib"
gcc -shared -fPIC -o "$root/opt/amazon/efa/lib/libfabric.so.1" -Wl,-soname,libfabric.so.1 "$work/stub.c"
gcc -shared -fPIC -o "$root/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so" "$work/stub.c"
printf '#!/bin/sh\necho "provider: efa (fake)"\n' > "$root/opt/amazon/efa/bin/fi_info"
chmod 755 "$root/opt/amazon/efa/bin/fi_info"

# --- a CDI spec (JSON) for a non-NVIDIA device ---
echo "fpga bitstream (fake)" > "$root/opt/fpga-firmware.bin"
cat > "$root/etc/cdi/example-fpga.json" <<JSON
{
  "cdiVersion": "0.6.0",
  "kind": "example.com/fpga",
  "containerEdits": { "env": ["FPGA_RUNTIME=fake"] },
  "devices": [
    { "name": "fpga0",
      "containerEdits": {
        "deviceNodes": [ { "path": "/dev/fpga0", "hostPath": "/dev/fakefpga0", "type": "c", "major": 240, "minor": 0 } ],
        "env": ["FPGA_VISIBLE_DEVICES=0"],
        "mounts": [ { "hostPath": "/opt/fpga-firmware.bin", "containerPath": "/opt/fpga/firmware.bin", "options": ["ro", "bind"] } ] } }
  ]
}
JSON

# --- a CDI spec (YAML) shaped like `nvidia-ctk cdi generate` writes for this driver ---
# Device nodes and mounts name host paths; the hooks are nvidia-ctk programs Gantry does not run
# (create-symlinks' links are made, update-ldcache's effect comes from the container's ldconfig).
cdi_gpu() {  # cdi_gpu NAME NODE...
  echo "- name: \"$1\""
  echo "  containerEdits:"
  echo "    deviceNodes:"
  shift
  for n in "$@"; do echo "    - path: $n"; done
}
{
  cat <<YAML
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
YAML
  for i in 0 1 2 3; do cdi_gpu $i /dev/nvidia$i; done
  cdi_gpu 1:0 /dev/nvidia1 /dev/nvidia-caps/nvidia-cap147 /dev/nvidia-caps/nvidia-cap148
  cdi_gpu all /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3
  cat <<YAML
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args:
    - nvidia-ctk
    - hook
    - create-symlinks
    - --link
    - libcuda.so.1::/$libdir/libcuda.so
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args:
    - nvidia-ctk
    - hook
    - update-ldcache
    - --folder
    - /$libdir
  mounts:
  - hostPath: /$libdir/libcuda.so.$version
    containerPath: /$libdir/libcuda.so.$version
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - hostPath: /$libdir/libnvidia-ml.so.$version
    containerPath: /$libdir/libnvidia-ml.so.$version
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
YAML
} > "$root/etc/cdi/nvidia.yaml"

# --- test helper: resolves libcuda.so.1 through the dynamic loader, as CUDA applications do ---
cat > "$work/probe.c" <<'C'
/* cuda-probe: dlopen("libcuda.so.1") by soname (ld.so cache lookup), call cuInit and
 * cuDriverGetVersion, print the version and the file the loader picked. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "cuda-probe: %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*ver)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int v = 0;
    if (!init || !ver || init(0) != 0 || ver(&v) != 0) { fprintf(stderr, "cuda-probe: calls failed\n"); return 1; }
    struct link_map *map = NULL;
    dlinfo(h, RTLD_DI_LINKMAP, &map);
    printf("cuda driver version %d from %s\n", v, map ? map->l_name : "?");
    return 0;
}
C
gcc -O2 -o "$root/test/cuda-probe" "$work/probe.c" -ldl
chmod -R a+rX "$root"
echo "fakehw: fake host root in $root (driver $version, 4 GPUs, GPU 1 with 3 MIG devices, uverbs0/2 efa, uverbs1/3 mlx5)"
