# fixtures: registry images slurm
# Pyxis 0.24's documented behaviour of single options, through srun on the 3-node harness (issue 35,
# item 2): PMIx directories and MCA names in a named container a later --mpi=pmix step attaches to,
# relative --container-save and --container-image paths, --container-mount-home with
# --container-remap-root (/root), a bind of a file the user cannot read, --container-workdir=../ and a
# missing workdir, and the wording of a missing image's error.

load helpers

setup() {
  gantry_step_suite pyxis-options
  UHOME=$(getent passwd "$U" | cut -d: -f6)
}

teardown() {
  rm -rf "$WORK"
}

as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

@test "--mpi=pmix attaching to a named container: the step's PMIx server and client dirs inside, PMIX_MCA_psec/gds mapped" {
  # Debian's Slurm 22.05 and 24.11 have the pmix plugin (mpi_pmix; PMIx 4 and 5): a real PMIx server per step.
  srun --mpi=list 2>&1 | grep -qw pmix
  tmpfs=$(scontrol show config | awk '$1 == "TmpFS" {print $3}')
  # Step 0 creates the container without PMIx (the job's MpiDefault is none); step 1 attaches with
  # --mpi=pmix: its server directory (made by slurmstepd after the container) must be there.
  cat >"$WORK/job.sh" <<JOB
#!/bin/bash
srun -n1 --container-image="$TINY" --container-name=pmx true || exit 1
srun -n1 --mpi=pmix --container-name=pmx sh -c '
  echo "server \$PMIX_SERVER_TMPDIR"; ls -A "\$PMIX_SERVER_TMPDIR" | grep -q . && echo "server dir has files"
  for d in "$tmpfs"/spmix_appdir_*; do [ -d "\$d" ] && echo "client dir \$d"; done
  echo "psec [\$PMIX_MCA_psec] from [\$PMIX_SECURITY_MODE]"; echo "gds [\$PMIX_MCA_gds] from [\$PMIX_GDS_MODULE]"
  echo "pmix version \$PMIX_VERSION"'
JOB
  chmod 755 "$WORK/job.sh"
  chown "$U" "$WORK/job.sh"
  run as_user sbatch --wait -N1 -o "$WORK/job.out" "$WORK/job.sh"
  cat "$WORK/job.out"
  [ "$status" -eq 0 ]
  grep -q '^server /.*/pmix\.[0-9]*\.1/*$' "$WORK/job.out"
  # PMIx 4 (bookworm, Slurm 22.05) has put its rendezvous files in the server directory by the time a
  # task runs; PMIx 5 (trixie, Slurm 24.11: tcp4 URIs, gds shmem2) leaves it empty then, on the node
  # itself too, so there only the directory's path is checked.
  major=$(sed -n 's/^pmix version \([0-9]*\).*/\1/p' "$WORK/job.out")
  if [ "${major:-0}" -lt 5 ]; then grep -qx 'server dir has files' "$WORK/job.out"; fi
  # The client directory is bound only when TmpFS is not /tmp (the container's own /tmp serves then):
  # the 22.05 harness sets TmpFS to each node's scratch, the 24.11 one leaves Slurm's /tmp.
  if [ "$tmpfs" != /tmp ]; then grep -q "^client dir $tmpfs/spmix_appdir_$(id -u "$U")_[0-9]*\.1$" "$WORK/job.out"; fi
  # Enroot's PMIx hook: the MCA names carry Slurm's values, not a fallback.
  grep -qx 'psec \[\(.\+\)\] from \[\1\]' "$WORK/job.out"
  grep -qx 'gds \[\(.\+\)\] from \[\1\]' "$WORK/job.out"
}

@test "a relative --container-save or PYXIS_CONTAINER_SAVE (./rel.sqsh) is the step's working directory's; --container-image=./rel.sqsh finds it" {
  mkdir "$WORK/sub" && chown "$U" "$WORK/sub"
  # srun starts in $WORK; the step runs in $WORK/sub (--chdir): the step's directory decides.
  run as_user srun -n1 --chdir="$WORK/sub" --container-image="$TINY" --container-writable --container-save=./rel.sqsh \
    sh -c 'echo saved-by-option > /marker'
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$WORK/sub/rel.sqsh" ] && [ ! -e "$WORK/rel.sqsh" ]
  # Written as the user; no partial file left beside it.
  [ "$(stat -c %U "$WORK/sub/rel.sqsh")" = "$U" ]
  [ -z "$(find "$WORK/sub" -name '*.partial*')" ]
  # The next step, started there, finds it by the same relative name.
  run gantry_as_user "$U" "$WORK/sub" srun -n1 --container-image=./rel.sqsh cat /marker
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = saved-by-option ]
  run gantry_as_user "$U" "$WORK/sub" env PYXIS_CONTAINER_SAVE=./env.sqsh srun -n1 --container-image="$TINY" \
    --container-writable sh -c 'echo saved-by-env > /marker'
  echo "$output"
  [ "$status" -eq 0 ]
  [ -f "$WORK/sub/env.sqsh" ] && [ ! -e "$WORK/env.sqsh" ]
  run gantry_as_user "$U" "$WORK/sub" env PYXIS_CONTAINER_IMAGE=./env.sqsh srun -n1 cat /marker
  echo "$output"
  [ "$output" = saved-by-env ]
  # In a job script, after a cd: the srun's directory, not sbatch's (the job's SLURM_SUBMIT_DIR).
  printf '#!/bin/sh\ncd %s/sub || exit 3\nsrun -n1 --container-image=./rel.sqsh cat /marker\n' "$WORK" >"$WORK/cd.sh"
  chmod 0755 "$WORK/cd.sh" && chown "$U" "$WORK/cd.sh"
  run as_user sbatch --wait -N1 -o "$WORK/cd.out" "$WORK/cd.sh"
  cat "$WORK/cd.out"
  [ "$status" -eq 0 ]
  grep -qx saved-by-option "$WORK/cd.out"
  # A relative image with srun --chdir elsewhere: Slurm tells the plugin the step's directory too late
  # (docs/user.md): one clear error, not another directory's file.
  cp "$WORK/sub/env.sqsh" "$WORK/env.sqsh" && chown "$U" "$WORK/env.sqsh"
  run as_user srun -n1 --chdir="$WORK/sub" --container-image=./env.sqsh cat /marker
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$(echo "$output" | grep -c "gantry: a relative --container-image was taken against srun's directory $WORK, not the step's $WORK/sub (srun --chdir): give an absolute path")" -eq 1 ]
}

@test "--container-mount-home --container-remap-root: /root is the user's home (also with HOME=/tmp, and PYXIS_CONTAINER_MOUNT_HOME=1)" {
  runuser -u "$U" -- sh -c "mkdir -p '$UHOME' 2>/dev/null; echo home-marker > '$UHOME/.pyxis-options-marker'"
  # /proc/self/mountinfo's 4th field is the mounted directory's path in its filesystem, the 5th the
  # mount point (what `findmnt /root` shows).
  where_root='awk "\$5 == \"/root\" {print \$4}" /proc/self/mountinfo; cat /root/.pyxis-options-marker; echo "HOME=$HOME"'
  run as_user srun -n1 --container-mount-home --container-remap-root --container-image="$TINY" sh -c "$where_root"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx home-marker
  echo "$output" | grep -qx HOME=/root
  run as_user env HOME=/tmp srun -n1 --container-mount-home --container-remap-root --container-image="$TINY" sh -c "$where_root"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx home-marker
  run as_user env PYXIS_CONTAINER_MOUNT_HOME=1 srun -n1 --container-remap-root --container-image="$TINY" sh -c "$where_root"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx home-marker
  # Without remap-root the home stays at its own path; --no-container-mount-home leaves /root the image's.
  run as_user srun -n1 --container-mount-home --no-container-remap-root --container-image="$TINY" cat "$UHOME/.pyxis-options-marker"
  [ "$output" = home-marker ]
  run as_user srun -n1 --no-container-mount-home --container-remap-root --container-image="$TINY" sh -c "$where_root"
  echo "$output"
  ! echo "$output" | grep -qx home-marker || false
  rm -f "$UHOME/.pyxis-options-marker"
}

@test "--container-mounts=/etc/shadow:/shadow: a file the user cannot read is bound, and stays unreadable" {
  ! runuser -u "$U" -- cat /etc/shadow >/dev/null 2>&1 || false
  run as_user srun -n1 --container-image="$TINY" --container-mounts=/etc/shadow:/shadow \
    sh -c 'ls -ln /shadow | cut -d" " -f1; cat /shadow >/dev/null 2>&1 && echo READ || echo "not readable"'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qxF -- "$(ls -l /etc/shadow | cut -d' ' -f1)"
  echo "$output" | grep -qx "not readable"
  ! echo "$output" | grep -q READ || false
  # A missing source is still an error, and so is one below a directory the user cannot search (the
  # user decides what exists).
  run as_user srun -n1 --container-image="$TINY" --container-mounts=/etc/no-such-file-here:/x true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "source path does not exist"
  mkdir -m 0700 "$WORK/closed" && touch "$WORK/closed/inside"
  run as_user srun -n1 --container-image="$TINY" --container-mounts="$WORK/closed/inside:/x" true
  echo "$output"
  [ "$status" -ne 0 ]
}

@test "--container-workdir=../ resolves inside the container (to /); a missing workdir: '/DIR: No such file or directory'" {
  run as_user srun -n1 --container-image="$TINY" --container-workdir=../ pwd
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = / ]
  run as_user srun -n1 --container-image="$TINY" --container-workdir=/gantry-missing-dir true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q '/gantry-missing-dir: No such file or directory'
}

@test "a missing image: 'failed to import docker image: IMAGE' (with the colon)" {
  image="$REG#gantry-test/no-such-image-$RANDOM"
  run as_user srun -n1 --container-image="$image" true
  echo "$output"
  [ "$status" -ne 0 ]
  [ "$(echo "$output" | grep -cF "gantry: failed to import docker image: $image")" -eq 1 ]
}
