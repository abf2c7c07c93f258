# fixtures: registry images slurm
# The fake root of --remap-root / --container-remap-root installs packages: every container process runs
# under the system call filter (runtime/launcher/seccomp.cpp) that answers the chown and set*id
# families with success, so dpkg and apt work although the user namespace maps one id. Offline: a
# tiny .deb built here (owned by a foreign uid, as real packages' files often are) and a file:
# repository bound into the harness's debian image, through `gantry run` and through srun.

load helpers

setup_file() {
  gantry_load_env registry images slurm
  export GANTRY="$GANTRY_BUILD_DIR/runtime/gantry"
  [ -x "$GANTRY" ] || { echo "gantry not built at $GANTRY" >&2; return 1; }
  export U=$GANTRY_TEST_USER
  # The debian image as a squashfs file for `gantry run` (from the images fixture's debootstrap),
  # readable by the test user; rebuilt when that tarball changes.
  local tarball=$GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar dir=$GANTRY_HARNESS_DIR/cache/remap-root
  export DEBIAN_SQSH=$dir/debian.sqsh
  if [ ! -s "$DEBIAN_SQSH" ] || [ "$tarball" -nt "$DEBIAN_SQSH" ]; then
    rm -rf "$dir" && mkdir -p "$dir/root"
    tar -C "$dir/root" --numeric-owner -xpf "$tarball"
    mksquashfs "$dir/root" "$DEBIAN_SQSH" -comp lz4 -noappend -quiet -no-progress
    rm -rf "$dir/root"
  fi
  chmod 755 "$GANTRY_HARNESS_DIR/cache" "$dir"
  chmod 644 "$DEBIAN_SQSH"
  # A file: repository with one package whose file belongs to uid/gid 1234 (dpkg chowns it on unpack).
  export REPO
  REPO=$(mktemp -d "$GANTRY_TEST_FSX/remap-root-repo.XXXXXX")
  local pkg=$BATS_FILE_TMPDIR/pkg
  mkdir -p "$pkg/DEBIAN" "$pkg/opt/gantry-hello"
  printf '%s\n' 'Package: gantry-hello' 'Version: 1.0' 'Architecture: all' \
    'Maintainer: Gantry tests <tests@gantry.invalid>' 'Description: a tiny package for the remap-root tests' \
    > "$pkg/DEBIAN/control"
  echo hello > "$pkg/opt/gantry-hello/hello"
  chown -R 1234:1234 "$pkg/opt/gantry-hello"
  dpkg-deb --build "$pkg" "$REPO/gantry-hello_1.0_all.deb" >/dev/null
  # A package whose maintainer script adds a system group and user and chowns to them, as
  # openssh-server's do (its `_ssh` group and `sshd` user): groupadd and useradd rewrite /etc/gshadow
  # and /etc/shadow, which the image has in group `shadow`, an id the namespace does not map.
  local sys=$BATS_FILE_TMPDIR/sys
  mkdir -p "$sys/DEBIAN" "$sys/opt/gantry-sysuser"
  printf '%s\n' 'Package: gantry-sysuser' 'Version: 1.0' 'Architecture: all' 'Depends: adduser' \
    'Maintainer: Gantry tests <tests@gantry.invalid>' 'Description: adds a system user in its postinst' \
    > "$sys/DEBIAN/control"
  printf '%s\n' '#!/bin/sh' 'set -e' 'if [ "$1" = configure ]; then' \
    '  addgroup --system _gantrysys' \
    '  adduser --system --ingroup _gantrysys --no-create-home --home /run/gantrysys gantrysys' \
    '  chown gantrysys:_gantrysys /opt/gantry-sysuser' 'fi' > "$sys/DEBIAN/postinst"
  chmod 755 "$sys/DEBIAN/postinst"
  dpkg-deb --build "$sys" "$REPO/gantry-sysuser_1.0_all.deb" >/dev/null
  (cd "$REPO" && dpkg-scanpackages . /dev/null > Packages 2>/dev/null)
  echo 'deb [trusted=yes] file:/repo ./' > "$REPO/sources.list"
  chmod -R a+rX "$REPO"
}

teardown_file() {
  rm -rf "$REPO"
}

# openssh_repo DIR: a file: repository in DIR with Debian's openssh-server and openssh-client and what
# they need beyond the debian test image (a minbase bookworm debootstrap): the list is apt's own answer
# for the image's dpkg status against the node's package lists, the .debs fetched with `apt-get download`
# from the node's mirror once and kept in the harness cache (beside the debootstrap tarball they were
# chosen for). Returns 1, with the reason on stdout, when apt cannot list or fetch them.
openssh_repo() {
  local dir=$1 tarball=$GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar
  local cache=$GANTRY_HARNESS_DIR/cache/openssh-debs tmp names
  if [ ! -e "$cache/complete" ] || [ "$tarball" -nt "$cache/complete" ]; then
    rm -rf "$cache" && mkdir -p "$cache"
    tmp=$(mktemp -d "$GANTRY_HARNESS_DIR/cache/openssh.XXXXXX")
    tar -C "$tmp" -xf "$tarball" ./var/lib/dpkg/status
    names=$(apt-get -s -o Dir::State::status="$tmp/var/lib/dpkg/status" install --no-install-recommends \
      openssh-server openssh-client 2>&1 | awk '/^Inst /{print $2}')
    rm -rf "$tmp"
    case $names in
      *openssh-server*) ;;
      *) echo "apt-get on this node cannot list openssh-server for bookworm (run apt-get update with a bookworm mirror)"; return 1 ;;
    esac
    # shellcheck disable=SC2086  # one word per package name
    if ! (cd "$cache" && apt-get download -q -o APT::Sandbox::User=root $names >"$cache/download.log" 2>&1); then
      echo "apt-get download of the openssh .debs from this node's mirror failed: $(tail -1 "$cache/download.log")"
      return 1
    fi
    touch "$cache/complete"
  fi
  mkdir -p "$dir"
  cp "$cache"/*.deb "$dir"/
  (cd "$dir" && dpkg-scanpackages . /dev/null > Packages 2>/dev/null)
  echo 'deb [trusted=yes] file:/repo ./' > "$dir/sources.list"
  chmod -R a+rX "$dir"
}

teardown() {
  fake_ib_devices_done  # a test that failed while it held the EFA stand-ins
}

grun() { runuser -u "$U" -- "$GANTRY" run "$@"; }

# apt-get with the bound file: repository as its only source (the test sandbox has no network).
APT="apt-get -q -o Dir::Etc::SourceList=/repo/sources.list -o Dir::Etc::SourceParts=/nonexistent"

@test "gantry run: Seccomp 2 in every container, with and without --remap-root" {
  run grun "$DEBIAN_SQSH" grep Seccomp: /proc/self/status
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
  run grun --remap-root "$DEBIAN_SQSH" grep Seccomp: /proc/self/status
  [ "$status" -eq 0 ]
  [ "$output" = "$(printf 'Seccomp:\t2')" ]
}

@test "gantry run --remap-root --writable: dpkg -i of a package with foreign-owned files succeeds" {
  run grun --remap-root --writable --mount "$REPO:/repo:ro" "$DEBIAN_SQSH" sh -c \
    'dpkg -i /repo/gantry-hello_1.0_all.deb && dpkg -s gantry-hello | grep ^Status && cat /opt/gantry-hello/hello &&
     stat -c %u:%g /opt/gantry-hello/hello'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-3]}" = "Status: install ok installed" ]
  [ "${lines[-2]}" = "hello" ]
  [ "${lines[-1]}" = "0:0" ]  # the chown was a no-op: the file belongs to the fake root (the user)
}

@test "gantry run --remap-root --writable: apt-get update and install from a file: repository" {
  run grun --remap-root --writable --mount "$REPO:/repo:ro" "$DEBIAN_SQSH" sh -c \
    "$APT update && DEBIAN_FRONTEND=noninteractive $APT install -y gantry-hello && cat /opt/gantry-hello/hello"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "hello" ]
}

@test "srun --container-remap-root --container-writable: Seccomp 2, uid 0, dpkg -i and apt-get install work" {
  gantry_cluster_registry
  gantry_plugin_conf
  local debian="$REG#gantry-test/debian"
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$debian" --container-remap-root \
    --container-writable sh -c 'grep Seccomp: /proc/self/status; id -u'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "$(printf 'Seccomp:\t2')" ]
  [ "${lines[1]}" = "0" ]
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$debian" sh -c 'grep Seccomp: /proc/self/status; id -u'
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "$(printf 'Seccomp:\t2')" ]
  [ "${lines[1]}" = "$(id -u "$U")" ]
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$debian" --container-remap-root \
    --container-writable --container-mounts="$REPO:/repo:ro" sh -c \
    "dpkg -i /repo/gantry-hello_1.0_all.deb >/dev/null && dpkg -r gantry-hello >/dev/null &&
     $APT update >/dev/null && DEBIAN_FRONTEND=noninteractive $APT install -y gantry-hello >/dev/null &&
     cat /opt/gantry-hello/hello"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "hello" ]
}

@test "srun --container-remap-root --container-writable: apt-get install of a package whose postinst adds a system group and user (openssh-server's path)" {
  gantry_cluster_registry
  gantry_plugin_conf
  run runuser -u "$U" -- env -C "$REPO" srun -n1 --container-image="$REG#gantry-test/debian" --container-remap-root \
    --container-writable --container-mounts="$REPO:/repo:ro" sh -c \
    "$APT update >/dev/null && DEBIAN_FRONTEND=noninteractive $APT install -y gantry-sysuser; echo \"apt status \$?\";
     getent group _gantrysys | cut -d: -f1; getent passwd gantrysys | cut -d: -f1,6"
  echo "$output"
  [ "${lines[-3]}" = "apt status 0" ]
  [ "${lines[-2]}" = _gantrysys ]
  [ "${lines[-1]}" = gantrysys:/run/gantrysys ]
}

@test "the seed guides' sbatch job, whole: an enroot-made image on FSx, exported NCCL/FI variables, /fsx, writable, remap-root apt-get" {
  # /work/shared/user-jobs/train-distributed.sbatch with the harness's paths: the image is a .sqsh in
  # Enroot's format on the shared file system (PATH in /etc/environment, WorkingDir in /etc/rc),
  # torchrun a stand-in script that only /etc/environment's PATH finds. Each rank installs a package
  # with apt-get as the fake root, then reports what it sees.
  local tarball=$GANTRY_HARNESS_DIR/cache/debian-bookworm-minbase.tar tree=$BATS_TEST_TMPDIR/enroot-debian
  local fsx=$GANTRY_TEST_FSX/seed-$RANDOM$RANDOM
  mkdir -p "$tree" "$fsx/containers/images" "$fsx/out"
  tar -C "$tree" --numeric-owner -xpf "$tarball"
  mkdir -p "$tree/opt/train/bin" "$tree/workspace"
  cat >"$tree/opt/train/bin/torchrun" <<'SH'
#!/bin/sh
# torchrun stand-in: what rank $SLURM_PROCID sees.
echo "rank=$SLURM_PROCID uid=$(id -u) cwd=$(pwd) hello=$(cat /opt/gantry-hello/hello)" \
  "nccl=$NCCL_DEBUG/$NCCL_PROTO/$NCCL_SOCKET_IFNAME/$NCCL_IB_DISABLE fi=$FI_PROVIDER gloo=$GLOO_SOCKET_IFNAME" \
  "master=$MASTER_ADDR:$MASTER_PORT exp=$EXPERIMENT_NAME lustre=$LUSTRE_BASE ds=$DEEPSPEED_CONFIG args=$*" \
  "ib=$(test -c /dev/infiniband/uverbs0 && echo yes)" > "/fsx/out/rank-$SLURM_PROCID"
SH
  chmod 755 "$tree/opt/train/bin/torchrun"
  printf 'PATH="/opt/train/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n' >"$tree/etc/environment"
  printf 'mkdir -p "/workspace" 2> /dev/null\ncd "/workspace" && unset OLDPWD || exit 1\n' >"$tree/etc/rc"
  mksquashfs "$tree" "$fsx/containers/images/pytorch-training.sqsh" -comp lz4 -noappend -quiet -no-progress
  rm -rf "$tree"
  chmod -R a+rX "$fsx" && chmod 1777 "$fsx/out" && chown "$U" "$fsx"  # the job writes its output there
  fake_ib_devices
  gantry_plugin_conf
  # The job as the guide writes it; only the paths (and the apt-get) are the harness's.
  cat >"$fsx/train-distributed.sbatch" <<JOB
#!/bin/bash
#SBATCH --job-name=distributed-training
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=$fsx/train.out
export EXPERIMENT_NAME=\${EXPERIMENT_NAME:-qwen-wikitext-default}
export LUSTRE_BASE=/lustre
export CONTAINER_IMAGE="$fsx/containers/images/pytorch-training.sqsh"
export MASTER_ADDR=\$(scontrol show hostname \$SLURM_NODELIST | head -n 1)
export MASTER_PORT=29500
export NCCL_DEBUG=INFO
export FI_PROVIDER=efa
export NCCL_PROTO=simple
export NCCL_SOCKET_IFNAME=ens5
export GLOO_SOCKET_IFNAME=ens5
export NCCL_IB_DISABLE=1
export DEEPSPEED_CONFIG=/workspace/ds_config.json
srun --container-image=\${CONTAINER_IMAGE} \\
     --container-mounts=/dev/infiniband:/dev/infiniband,$fsx:/fsx,$REPO:/repo:ro \\
     --container-writable --container-remap-root \\
     bash -c "
     $APT update >/dev/null && DEBIAN_FRONTEND=noninteractive $APT install -y gantry-hello >/dev/null &&
     torchrun \\
       --nproc_per_node=1 \\
       --nnodes=\${SLURM_JOB_NUM_NODES} \\
       --node_rank=\\\${SLURM_PROCID} \\
       --master_addr=\${MASTER_ADDR} \\
       --master_port=\${MASTER_PORT} \\
       /workspace/train_distributed_deepspeed.py
     "
JOB
  chown "$U" "$fsx/train-distributed.sbatch"
  run runuser -u "$U" -- sbatch --wait "$fsx/train-distributed.sbatch"
  fake_ib_devices_done
  echo "$output"; cat "$fsx/train.out" || true; cat "$fsx"/out/rank-* || true
  [ "$status" -eq 0 ]
  master=$(sed -n 's/.* master=\([^ ]*\):29500 .*/\1/p' "$fsx/out/rank-0")
  [ -n "$master" ]
  for r in 0 1; do
    [ "$(cat "$fsx/out/rank-$r")" = "rank=$r uid=0 cwd=/workspace hello=hello nccl=INFO/simple/ens5/1 fi=efa gloo=ens5 master=$master:29500 exp=qwen-wikitext-default lustre=/lustre ds=/workspace/ds_config.json args=--nproc_per_node=1 --nnodes=2 --node_rank=$r --master_addr=$master --master_port=29500 /workspace/train_distributed_deepspeed.py ib=yes" ]
  done
  rm -rf "$fsx"
}

# Pyxis's sshd example, with Debian's own packages: in one named container, the job user installs
# openssh-server as the container's root (--container-remap-root: its postinst adds the `sshd` user and
# makes host keys); a step with --no-container-remap-root runs sshd as the user's own id (as root, sshd
# would switch to its `sshd` user, which the filter's no-op setuid leaves root, and stop there); a later
# step logs in over the node's loopback with a key the test made, and runs as the user in the container.
@test "srun: apt-get install openssh-server under --container-remap-root, then sshd in that named container (--no-container-remap-root) accepts a later step's ssh" {
  gantry_cluster_registry
  gantry_plugin_conf
  local work port
  work=$(mktemp -d "$GANTRY_TEST_FSX/sshd.XXXXXX")
  chown "$U" "$work"
  if ! why=$(openssh_repo "$work/repo"); then
    rm -rf "$work"
    skip "$why"
  fi
  # A port free on the node now (the kernel's pick); sshd takes it moments later.
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$work/job.sh" <<JOB
#!/bin/bash
cd "$work"
srun -n1 --container-image="$REG#gantry-test/debian" --container-name=ssh --container-remap-root --container-writable \\
  --no-container-mount-home --container-mounts="$work/repo:/repo:ro,$work:$work" sh -c \\
  "$APT update >/dev/null && DEBIAN_FRONTEND=noninteractive $APT install -y openssh-server openssh-client" \\
  > install.out 2>&1; echo "status \$?" >> install.out
mkdir -p keys
srun -n1 --container-name=ssh --no-container-remap-root sh -c \\
  'id -u; grep -E "^Cap(Eff|Amb):" /proc/self/status; stat -c %u /etc/ssh/sshd_config; cd "$work/keys" && ssh-keygen -q -t ed25519 -N "" -f host && ssh-keygen -q -t ed25519 -N "" -f id && cp id.pub authorized_keys' \\
  > keys.out 2>&1
srun --overlap -n1 --container-name=ssh --no-container-remap-root /usr/sbin/sshd -D -e -p $port -o ListenAddress=127.0.0.1 \\
  -h "$work/keys/host" -o UsePAM=no -o PidFile=none -o StrictModes=no -o AuthorizedKeysFile="$work/keys/authorized_keys" \\
  > sshd.out 2>&1 &
srun --overlap -n1 --container-name=ssh --no-container-remap-root sh -c \\
  'for i in \$(seq 100); do ssh -p $port -i $work/keys/id -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \\
     127.0.0.1 "id -u; test -x /usr/sbin/sshd && echo in-container" && exit 0; sleep 0.2; done; exit 1' \\
  > ssh.out 2>&1; echo "status \$?" >> ssh.out
JOB
  chmod 755 "$work/job.sh"
  chown "$U" "$work/job.sh"
  run runuser -u "$U" -- sbatch --wait -N1 -o "$work/job.out" "$work/job.sh"
  echo "--- install"; tail -5 "$work/install.out"
  for f in job keys sshd ssh; do echo "--- $f"; tail -20 "$work/$f.out"; done
  tail -1 "$work/install.out" | grep -qx "status 0"
  grep -q "Setting up openssh-server" "$work/install.out"
  [ "$(sed -n 1p "$work/keys.out")" = "$(id -u "$U")" ]  # --no-container-remap-root: the user's own id,
  [ "$(sed -n 2p "$work/keys.out")" = "$(printf 'CapEff:\t0000000000000000')" ]  # no capabilities
  [ "$(sed -n 3p "$work/keys.out")" = "$(printf 'CapAmb:\t0000000000000000')" ]
  [ "$(sed -n 4p "$work/keys.out")" = "$(id -u "$U")" ]  # and what the container's root installed is theirs
  grep -q "Accepted publickey for $U " "$work/sshd.out"
  grep -qx "status 0" "$work/ssh.out"
  [ "$(grep -x '[0-9]*' "$work/ssh.out" | head -1)" = "$(id -u "$U")" ]  # logged in as the job user
  grep -qx in-container "$work/ssh.out"
  rm -rf "$work"
}
