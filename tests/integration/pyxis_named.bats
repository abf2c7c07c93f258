# fixtures: registry images slurm
# Pyxis 0.24's documented behaviours around named containers and extra namespaces, through srun on the
# harness cluster (issue #35): loopback up with --container-unshare=net, `hostname` with
# --container-unshare=uts, --container-unshare on an existing container that lacks the namespace,
# NAME:exec on a stopped container, NAME:no_exec (a new instance from the same files), a running unnamed
# container attached as JOBID.STEPID, where an attached step starts, and a TCP server in a named
# container reached by a later step.

load helpers

setup() {
  gantry_step_suite pyxis-named
}

teardown() {
  rm -rf "$WORK"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

@test "--container-unshare=net: loopback is up inside (a connect to 127.0.0.1 is refused, not unreachable)" {
  run as_user srun -n1 --container-image="$TINY" --container-unshare=net sh -c \
    'readlink /proc/self/ns/net; nc 127.0.0.1 1 </dev/null; echo "nc status $?"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" != "$(readlink /proc/self/ns/net)" ]  # its own network namespace
  echo "$output" | grep -q "Connection refused"
  ! echo "$output" | grep -q "unreachable" || false
}

@test "--container-unshare=uts: the job user sets the container's hostname; the node's is untouched" {
  node_name=$(as_user srun -n1 hostname)
  run as_user srun -n1 --container-image="$TINY" --container-unshare=uts sh -c 'hostname gantry-uts && hostname && id -u'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-2]}" = gantry-uts ]
  [ "${lines[-1]}" = "$(id -u "$U")" ]  # as the job user, not a remapped root
  [ "$(as_user srun -n1 -w "$node_name" hostname)" = "$node_name" ]
}

# One job, one node: step "srv" (a named container with its own network and UTS namespaces) runs a TCP
# server on the container's loopback and stays; later steps attach to it, or try what Pyxis refuses.
# The server's stdin is a pipe that stays open: busybox nc, at EOF on its stdin (the step's is
# /dev/null), shuts its side of the connection, and a client that sees that first exits 0 without
# having sent its line (5 of 40 tries by hand; the received file was then empty).
write_named_job() {
  cat >"$WORK/job.sh" <<JOB
#!/bin/bash
cd "$WORK"
srun --overlap -n1 --container-image="$TINY" --container-name=srv --container-unshare=net,uts --container-mounts="$WORK:$WORK" sh -c \
  'touch "$WORK/srv-up"; sleep 600 | nc -l -p 5000 > "$WORK/received"' &
for ((i = 0; i < 600; i++)); do [ -e "$WORK/srv-up" ] && break; sleep 0.1; done
# Attached to the running container: the container's /, not the image's WorkingDir (/work).
srun --overlap -n1 --container-name=srv pwd > pwd.out 2>&1
srun --overlap -n1 --container-name=srv:exec true > exec-running.out 2>&1; echo "status \$?" >> exec-running.out
srun --overlap -n1 --container-name=srv --container-unshare=ipc true > ipc.out 2>&1; echo "status \$?" >> ipc.out
# The server, from a later step, through the container's own loopback (its namespace, not the node's).
srun --overlap -n1 --container-name=srv sh -c \
  'for i in \$(seq 100); do echo hello-from-a-later-step | nc 127.0.0.1 5000 && exit 0; sleep 0.1; done; exit 1' \
  > connect.out 2>&1; echo "status \$?" >> connect.out
# A named container no step runs in.
srun --overlap -n1 --container-image="$TINY" --container-name=idle true
srun --overlap -n1 --container-name=idle:exec true > exec-stopped.out 2>&1; echo "status \$?" >> exec-stopped.out
srun --overlap -n1 --container-name=idle --container-unshare=net true > net.out 2>&1; echo "status \$?" >> net.out
srun --overlap -n1 --container-name=idle --container-unshare=uts true > uts.out 2>&1; echo "status \$?" >> uts.out
srun --overlap -n1 --container-name=idle pwd > idle-pwd.out 2>&1
# A running unnamed container, attached as JOBID.STEPID.
srun --overlap -n1 --container-image="$TINY" --container-mounts="$WORK:$WORK" sh -c \
  'echo "\$SLURM_STEP_ID" > /tmp/marker; echo "\$SLURM_STEP_ID" > "$WORK/unnamed-step"; exec sleep 600' &
for ((i = 0; i < 600; i++)); do [ -s "$WORK/unnamed-step" ] && break; sleep 0.1; done
srun --overlap -n1 --container-name="\$SLURM_JOB_ID.\$(cat unnamed-step)" cat /tmp/marker > unnamed.out 2>&1
echo "status \$?" >> unnamed.out
touch done
JOB
  chmod 755 "$WORK/job.sh"
  chown "$U" "$WORK/job.sh"
}

@test "named containers: attach starts in /, :exec needs a running one, --container-unshare needs the namespace, JOBID.STEPID, a server reached by a later step" {
  write_named_job
  # The job ends with its script: Slurm then ends the steps still running (srv's, the unnamed one).
  run as_user sbatch --wait -N1 -o "$WORK/job.out" "$WORK/job.sh"
  for f in job pwd exec-running ipc connect exec-stopped net uts idle-pwd unnamed; do echo "--- $f"; cat "$WORK/$f.out"; done
  echo "--- received"; cat "$WORK/received" || true
  [ -e "$WORK/done" ]
  [ "$(cat "$WORK/pwd.out")" = / ]
  grep -qx "status 0" "$WORK/exec-running.out"
  grep -q "status [1-9]" "$WORK/ipc.out"
  grep -q "gantry: .*not in a separate IPC namespace" "$WORK/ipc.out"
  grep -qx "status 0" "$WORK/connect.out"
  [ "$(cat "$WORK/received")" = hello-from-a-later-step ]
  grep -q "status [1-9]" "$WORK/exec-stopped.out"
  grep -q "gantry: .*not running" "$WORK/exec-stopped.out"
  grep -q "status [1-9]" "$WORK/net.out"
  grep -q "gantry: .*not in a separate network namespace" "$WORK/net.out"
  grep -q "status [1-9]" "$WORK/uts.out"
  grep -q "gantry: .*not in a separate UTS namespace" "$WORK/uts.out"
  # No step runs in "idle": a step starts it afresh, in the image's WorkingDir.
  [ "$(cat "$WORK/idle-pwd.out")" = /work ]
  grep -qx "status 0" "$WORK/unnamed.out"
  [ "$(head -1 "$WORK/unnamed.out")" = "$(cat "$WORK/unnamed-step")" ]
}

# Pyxis: `no_exec` "does not attach to a running instance: starts a new container instance from the same
# container's files". Step "first" stays in the container; a no_exec step then runs in the image (busybox's
# /linuxrc, which the node lacks), in a mount namespace of its own, and each sees the file the other wrote
# in the writable layer. The old behaviour (the step on the node, outside any container) fails every line.
@test "--container-name=NAME:no_exec: a new instance from the running container's files; created or started afresh otherwise" {
  cat >"$WORK/job.sh" <<JOB
#!/bin/bash
cd "$WORK"
srun --overlap -n1 --container-image="$TINY" --container-name=inst --container-writable --container-mounts="$WORK:$WORK" sh -c \
  'echo from-first > /first-file; readlink /proc/self/ns/mnt > "$WORK/first-mnt"; touch "$WORK/first-up"; exec sleep 600' &
for ((i = 0; i < 600; i++)); do [ -e "$WORK/first-up" ] && break; sleep 0.1; done
srun --overlap -n1 --container-name=inst:no_exec sh -c \
  'cat /first-file; echo from-second > /second-file; readlink /proc/self/ns/mnt; test -e /linuxrc && echo in-image; pwd' \
  > noexec.out 2>&1; echo "status \$?" >> noexec.out
srun --overlap -n1 --container-name=inst sh -c 'cat /second-file; readlink /proc/self/ns/mnt' > attach.out 2>&1
echo "status \$?" >> attach.out
# No container of that name yet: no_exec makes one and runs in it; stopped, it is started afresh.
srun --overlap -n1 --container-image="$TINY" --container-name=fresh:no_exec --container-writable sh -c \
  'test -e /linuxrc && echo in-image; echo kept > /fresh-file' > fresh.out 2>&1; echo "status \$?" >> fresh.out
srun --overlap -n1 --container-name=fresh:no_exec cat /fresh-file > stopped.out 2>&1; echo "status \$?" >> stopped.out
touch done
JOB
  chmod 755 "$WORK/job.sh"
  chown "$U" "$WORK/job.sh"
  run as_user sbatch --wait -N1 -o "$WORK/job.out" "$WORK/job.sh"
  for f in job noexec attach fresh stopped; do echo "--- $f"; cat "$WORK/$f.out"; done
  [ -e "$WORK/done" ]
  first_mnt=$(cat "$WORK/first-mnt")
  [ -n "$first_mnt" ]
  [ "$(sed -n 1p "$WORK/noexec.out")" = from-first ]   # the running container's file
  second_mnt=$(sed -n 2p "$WORK/noexec.out")
  [ -n "$second_mnt" ] && [ "$second_mnt" != "$first_mnt" ]  # not attached: a mount namespace of its own
  [ "$second_mnt" != "$(readlink /proc/self/ns/mnt)" ]        # and not the node's
  [ "$(sed -n 3p "$WORK/noexec.out")" = in-image ]
  [ "$(sed -n 4p "$WORK/noexec.out")" = /work ]  # started afresh: the image's WorkingDir, not /
  grep -qx "status 0" "$WORK/noexec.out"
  [ "$(sed -n 1p "$WORK/attach.out")" = from-second ]  # the instance's file, seen by the running container
  [ "$(sed -n 2p "$WORK/attach.out")" = "$first_mnt" ]
  grep -qx "status 0" "$WORK/attach.out"
  [ "$(sed -n 1p "$WORK/fresh.out")" = in-image ]
  grep -qx "status 0" "$WORK/fresh.out"
  [ "$(sed -n 1p "$WORK/stopped.out")" = kept ]
  grep -qx "status 0" "$WORK/stopped.out"
}

@test "--container-remap-root: mount -t tmpfs works in a named container made with it; one made without it says why at once" {
  cat >"$WORK/job.sh" <<JOB
#!/bin/bash
cd "$WORK"
srun -n1 --container-image="$DEBIAN" --container-name=root --container-remap-root --container-writable mkdir /mymnt
srun -n1 --container-name=root --container-remap-root sh -c 'mount -t tmpfs none /mymnt && findmnt -n -o FSTYPE /mymnt' \
  > mount.out 2>&1; echo "status \$?" >> mount.out
srun -n1 --container-image="$DEBIAN" --container-name=user true
srun -n1 --container-name=user --container-remap-root sh -c 'mount -t tmpfs none /mnt' > user.out 2>&1
echo "status \$?" >> user.out
JOB
  chmod 755 "$WORK/job.sh"
  chown "$U" "$WORK/job.sh"
  run as_user sbatch --wait -N1 -o "$WORK/job.out" "$WORK/job.sh"
  for f in job mount user; do echo "--- $f"; cat "$WORK/$f.out"; done
  [ "$(head -1 "$WORK/mount.out")" = tmpfs ]
  grep -qx "status 0" "$WORK/mount.out"
  grep -q "status [1-9]" "$WORK/user.out"
  grep -q "gantry: --container-remap-root: container user was created without --container-remap-root" "$WORK/user.out"
  ! grep -q "drop permissions" "$WORK/user.out" || false
}
