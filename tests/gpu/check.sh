#!/bin/bash
# Gantry's NVIDIA path on a machine with a real GPU and driver (nothing faked): which devices,
# libraries and binaries a container gets for each way of asking, and whether CUDA runs inside.
#   tests/gpu/check.sh BUNDLE_DIR      (as root; BUNDLE_DIR from tests/gpu/make-bundle.sh, unpacked)
# Prints facts about the node, then one PASS/FAIL line per check; exits 1 if any check failed.
# Not part of the CTest suite (CI has no GPU); docs/devices.md, "On a real GPU", says how to run it
# and what it showed.
set -u
g=$(realpath "${1:?usage: check.sh BUNDLE_DIR}")
gantry=$g/bin/gantry
img=$g/debian.sqsh
pass=0 fail=0
runas=()  # a prefix that runs gantry as another user
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

echo "== the node"
uname -r
nvidia-smi -L || true
head -1 /proc/driver/nvidia/version || true
ls -l /dev/nvidia* 2>&1 | head -20
for f in /proc/driver/nvidia/gpus/*/information; do echo "$f:"; sed 's/^/   /' "$f"; done 2>&1
echo "nvidia-smi: $(command -v nvidia-smi || echo none)"
ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so|libnvidia-ptxjitcompiler\.so' || echo "(no driver library in the ld.so cache)"
cat /etc/ld.so.conf.d/*.conf 2>/dev/null | grep -v '^#' | sort -u | tr '\n' ' '; echo
grep -E 'squashfs|overlay|fuse' /proc/filesystems | tr '\n' ' '; echo
echo "max_user_namespaces: $(cat /proc/sys/user/max_user_namespaces 2>/dev/null)"
ls -d /usr/local/nvidia/* 2>/dev/null | tr '\n' ' '; echo
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -1)
ngpus=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l)

mkdir -p "$g/store" "$g/scratch"
cat > "$g/gantry.conf" <<CONF
store_path = $g/store
scratch_path = $g/scratch
CONF
export GANTRY_CONFIG=$g/gantry.conf
echo "== gantry doctor"
"$gantry" doctor 2>&1 | tail -25

# check NAME EXPECT_RC GREP... -- ENV... -- GANTRY_RUN_ARGS...: runs the probe in a container, with
# the GPU variables of this shell removed and ENV set, and checks its exit status and output (a GREP
# that starts with '!' must not match).
probe='echo "devices: $(ls /dev | grep -c "^nvidia[0-9]")"; env | grep -E "^(NVIDIA|CUDA)_" | sort;
ls /usr/local/nvidia/lib64 2>/dev/null | tr "\n" " "; echo; command -v nvidia-smi >/dev/null && nvidia-smi -L; cudacheck'
check() {
    local name=$1 want=$2
    shift 2
    local greps=() envs=()
    while [ "$1" != -- ]; do greps+=("$1"); shift; done
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local out rc
    out=$("${runas[@]}" env -u NVIDIA_VISIBLE_DEVICES -u CUDA_VISIBLE_DEVICES -u NVIDIA_DRIVER_CAPABILITIES \
        -u SLURM_STEP_GPUS -u SLURM_JOB_GPUS PATH="$g/bin:$PATH" "${envs[@]}" timeout 120 "$gantry" run "$@" -- sh -c "$probe" 2>&1)
    rc=$?
    echo "-- $name (rc $rc)"
    echo "$out" | sed 's/^/   /' | head -30
    if [ "$rc" != "$want" ]; then bad "$name: exit $rc, expected $want"; return; fi
    for pat in "${greps[@]}"; do
        if [ "${pat#!}" != "$pat" ]; then
            if echo "$out" | grep -qE -- "${pat#!}"; then bad "$name: output has '${pat#!}'"; return; fi
        elif ! echo "$out" | grep -qE -- "$pat"; then
            bad "$name: output lacks '$pat'"
            return
        fi
    done
    ok "$name"
}

cuda_ok="cudacheck: device 0 of $ngpus: .*correct"
echo "== containers"
for backend in kernel fuse extract; do
    check "all GPUs, $backend backend" 0 "$cuda_ok" "^GPU 0: " "devices: $ngpus" -- NVIDIA_VISIBLE_DEVICES=all -- \
        --backend "$backend" --image-file "$img"
done
check "Slurm's allocation (SLURM_STEP_GPUS=0)" 0 "cudacheck: device 0 of 1:" "CUDA_VISIBLE_DEVICES=0" "devices: 1" -- \
    SLURM_STEP_GPUS=0 -- --image-file "$img"
[ -n "$uuid" ] && check "a GPU by UUID" 0 "cudacheck: device 0 of 1:" "NVIDIA_VISIBLE_DEVICES=0" -- \
    NVIDIA_VISIBLE_DEVICES="$uuid" -- --image-file "$img"
check "NVIDIA_DRIVER_CAPABILITIES=utility: nvidia-smi, no CUDA" 2 "^GPU 0: " "libcuda.so.1: cannot open" -- \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility -- --image-file "$img"
check "NVIDIA_VISIBLE_DEVICES=none: the driver, no GPU" 1 "devices: 0" "cudacheck: cuInit" -- \
    NVIDIA_VISIBLE_DEVICES=none -- --image-file "$img"
check "no request: no GPU, no driver" 2 "devices: 0" "libcuda.so.1: cannot open" -- -- --image-file "$img"
check "a GPU the node lacks" 125 "no GPU '7' on this node" -- NVIDIA_VISIBLE_DEVICES=7 -- --image-file "$img"
printf '{"config":{"Env":["PATH=/usr/local/bin:/usr/bin:/bin","NVIDIA_VISIBLE_DEVICES=all"]}}' > "$g/cuda-image.json"
check "an image that asks for all GPUs (CUDA images' Env)" 0 "$cuda_ok" -- -- \
    --image-file "$img" --config-file "$g/cuda-image.json"

echo "== an unprivileged user (fuse backend, user namespace)"
if [ "$(stat -c %a /dev/fuse 2>/dev/null)" != 666 ]; then
    echo "SKIP: /dev/fuse is mode $(stat -c %a /dev/fuse 2>/dev/null || echo missing), not usable by users (gantry doctor says how)"
elif id gantrygpu >/dev/null 2>&1 || useradd -m -s /bin/sh gantrygpu 2>/dev/null; then
    chmod 755 "$g" "$g/bin" "$g/bin/lib"
    chmod 644 "$img"
    cat > "$g/user.conf" <<CONF
scratch_path = /tmp
CONF
    runas=(runuser -u gantrygpu --)
    check "as uid $(id -u gantrygpu), all GPUs" 0 "$cuda_ok" "^GPU 0: " "devices: $ngpus" -- \
        GANTRY_CONFIG="$g/user.conf" NVIDIA_VISIBLE_DEVICES=all -- --image-file "$img"
    [ -n "$uuid" ] && check "as uid $(id -u gantrygpu), a GPU by UUID, extract backend" 0 "cudacheck: device 0 of 1:" -- \
        GANTRY_CONFIG="$g/user.conf" NVIDIA_VISIBLE_DEVICES="$uuid" -- --backend extract --image-file "$img"
    runas=()
else
    bad "no unprivileged user could be made"
fi
# PyTorch as an ML image brings it: its own CUDA runtime libraries (here the pip wheels') over the
# driver Gantry binds in. The machine's own root file system, where it has PyTorch, becomes the
# image (mksquashfs from the bundle; the driver's directories, /proc, /sys, /dev, /tmp and the like
# left out), and the same program runs on the host and in the container: results must agree, and
# the times are printed (informational; bench/ holds the measured comparisons).
echo "== PyTorch in a container of this machine's own root file system"
host_root_dir=${GANTRY_GPU_HOST_IMAGE_ROOT:-/}
torch_prog='import time, torch
x = torch.arange(256 * 256, dtype=torch.float32).reshape(256, 256) / 65536
ref = x @ x
got = (x.cuda() @ x.cuda()).cpu()
assert torch.allclose(ref, got, rtol=1e-3, atol=1e-3), "GPU product differs from the CPU one"
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ b
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10): a @ b
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / 10
print("torch %s on %s: product correct, bf16 8192^3 %.0f TFLOP/s" % (torch.__version__, torch.cuda.get_device_name(0), 2 * 8192**3 / dt / 1e12))'
if ! python3 -c 'import torch' 2>/dev/null; then
    echo "SKIP: python3 here has no torch"
else
    py=$(python3 -c 'import sys; print(sys.executable)')
    start=$EPOCHREALTIME
    host_out=$(python3 -c "$torch_prog" 2>&1)
    host_s=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    echo "   host ($py): $host_out (${host_s} s with the import)"
    # Contents only, so the directories stay as mount points; the CUDA toolkit and Nsight too (the
    # wheels bring PyTorch's CUDA libraries).
    excludes=(proc/* sys/* dev/* run/* tmp/* mnt/* media/* home/* root/* boot/* srv/* lost+found var/tmp/*
        var/cache/* var/log/* var/lib/apt/* usr/local/nvidia/* 'usr/local/cuda*' opt/nvidia "${g#/}")
    if ! timeout 300 "$g/bin/mksquashfs" "$host_root_dir" "$g/host.sqsh" -comp lz4 -quiet -no-progress \
        -processors "$(nproc)" -wildcards -e "${excludes[@]}" >/dev/null 2>"$g/mksquashfs.err"; then
        bad "making an image of $host_root_dir: $(tail -1 "$g/mksquashfs.err")"
    else
        echo "   image of $host_root_dir: $(du -h "$g/host.sqsh" | cut -f1)"
        printf '{"config":{"Env":["PATH=%s","NVIDIA_VISIBLE_DEVICES=all"]}}' "$(dirname "$py"):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
            > "$g/host-image.json"
        start=$EPOCHREALTIME
        out=$(env -u NVIDIA_VISIBLE_DEVICES -u CUDA_VISIBLE_DEVICES -u NVIDIA_DRIVER_CAPABILITIES \
            PATH="$g/bin:$PATH" timeout 300 "$gantry" run --image-file "$g/host.sqsh" --config-file "$g/host-image.json" \
            -- "$py" -c "$torch_prog" 2>&1)
        rc=$?
        ctr_s=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
        echo "   container: $out (${ctr_s} s with the container's start and the import)"
        if [ $rc = 0 ] && echo "$out" | grep -q "product correct"; then ok "PyTorch in the container (exit $rc)"; else bad "PyTorch in the container: exit $rc"; fi
        # Again, now that the image's files are in the page cache: what a second step pays.
        start=$EPOCHREALTIME
        out=$(env -u NVIDIA_VISIBLE_DEVICES -u CUDA_VISIBLE_DEVICES -u NVIDIA_DRIVER_CAPABILITIES \
            PATH="$g/bin:$PATH" timeout 300 "$gantry" run --image-file "$g/host.sqsh" --config-file "$g/host-image.json" \
            -- "$py" -c "$torch_prog" 2>&1)
        echo "   container again: $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s"
        # torch.distributed over NCCL with the rendezvous Gantry derives from Slurm's variables
        # (GANTRY_PYTORCH=1: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), one rank.
        nccl_prog='import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
t = torch.full((1 << 20,), float(dist.get_rank() + 1), device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
assert t[0].item() == dist.get_world_size() * (dist.get_world_size() + 1) / 2
print("nccl %s: rank %s of %s, master %s:%s, all_reduce correct" % (".".join(map(str, torch.cuda.nccl.version())),
      os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]))
dist.destroy_process_group()'
        out=$(env -u NVIDIA_VISIBLE_DEVICES -u CUDA_VISIBLE_DEVICES -u NVIDIA_DRIVER_CAPABILITIES \
            GANTRY_PYTORCH=1 SLURM_JOB_ID=4242 SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 \
            SLURM_STEP_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=1 SLURM_STEP_GPUS=0 \
            PATH="$g/bin:$PATH" timeout 300 "$gantry" run --image-file "$g/host.sqsh" --config-file "$g/host-image.json" \
            -- "$py" -c "$nccl_prog" 2>&1)
        rc=$?
        echo "$out" | tail -5 | sed 's/^/   /'
        if [ $rc = 0 ] && echo "$out" | grep -q "rank 0 of 1, master localhost:.*all_reduce correct"; then
            ok "torch.distributed (NCCL) in the container with Gantry's PyTorch variables"
        else
            bad "torch.distributed (NCCL) in the container: exit $rc"
        fi
    fi
fi

echo "== $pass passed, $fail failed"
[ "$fail" = 0 ]
