# fixtures: registry images slurm
# Enroot's site configuration, honoured through srun on the real Slurm harness (docs/admin.md,
# "Migrating from Pyxis + Enroot"): gantry.conf's container_writable / container_remap_root /
# container_mount_home defaults (and an enroot.conf's ENROOT_* keys), environ.d/*.env and
# mounts.d/*.fstab drop-ins with ${NAME} expansion, the owner/mode check on the drop-ins, and an
# Enroot-made image whose environment lives in its /etc/environment.

load helpers

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  gantry_plugin_conf
  TINY="$REG#gantry-test/tiny"
  U=$GANTRY_TEST_USER
  UHOME=$(getent passwd "$U" | cut -d: -f6)
  GANTRY=$GANTRY_TEST_GANTRY
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/enroot-compat-test.XXXXXX")
  chmod 0755 "$WORK"
  # The drop-in directories are the admin's: root-owned, writable by root only.
  mkdir -m 0755 "$WORK/environ.d" "$WORK/mounts.d" "$WORK/site"
  echo "site data" >"$WORK/site/marker"
  chmod 0644 "$WORK/site/marker"
}

teardown() {
  gantry_plugin_conf  # the harness's plain gantry.conf again, for the files that follow
  rm -rf "$WORK"
}

# as_user CMD...: run as the test user from the shared directory (a cwd every node has).
as_user() {
  gantry_as_user "$U" "$WORK" "$@"
}

# conf LINE...: the harness gantry.conf plus LINEs, with the drop-in directories of this test.
conf() {
  gantry_plugin_conf "environ_dir = $WORK/environ.d" "mounts_dir = $WORK/mounts.d" "$@"
}

# make_enroot_image: $WORK/enroot.sqsh, as `enroot import` leaves an image: no OCI config, the Env in
# /etc/environment, WorkingDir, Entrypoint and Cmd in /etc/rc; busybox plus a script in a PATH
# directory only /etc/environment names.
make_enroot_image() {
  local tree=$WORK/enroot-tree
  mkdir -p "$tree/bin" "$tree/etc" "$tree/opt/app/bin" "$tree/workspace"
  cp /bin/busybox "$tree/bin/"
  for c in sh cat printenv id true env pwd echo; do ln -s busybox "$tree/bin/$c"; done
  printf '#!/bin/sh\necho "thescript: $APP_GREETING"\n' >"$tree/opt/app/bin/thescript"
  printf '#!/bin/sh\necho "entry($#): $*"\n' >"$tree/opt/app/bin/entry"
  chmod 0755 "$tree/opt/app/bin/thescript" "$tree/opt/app/bin/entry"
  # What `enroot import` writes from the image config's Env (quoted, as pam_env allows).
  printf 'PATH="/opt/app/bin:/bin"\nAPP_GREETING=hello from etc-environment\nAPP_JOB=${SLURM_JOB_ID}\n' >"$tree/etc/environment"
  # ... and from WorkingDir, Entrypoint and Cmd (Enroot's layout of the file, labels as comments).
  cat >"$tree/etc/rc" <<'RC'
# org.opencontainers.image.title enroot-test

mkdir -p "/workspace" 2> /dev/null
cd "/workspace" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec '/opt/app/bin/entry' "$@"
else
    exec '/opt/app/bin/entry' 'the'\''cmd' 'two'
fi
RC
  mksquashfs "$tree" "$WORK/enroot.sqsh" -noappend -quiet -all-root >/dev/null
  chmod 0644 "$WORK/enroot.sqsh"
}

@test "container_writable = yes makes / writable without --container-writable; --container-readonly overrides" {
  conf
  run as_user srun -N1 --container-image="$TINY" sh -c 'touch /x && echo wrote'
  echo "$output"
  [ "$status" -ne 0 ]  # the built-in default: read-only
  conf "container_writable = yes"
  run as_user srun -N2 -n2 --container-image="$TINY" sh -c 'touch /x && echo wrote'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx wrote)" -eq 2 ]
  run as_user srun -N1 --container-readonly --container-image="$TINY" sh -c 'touch /x && echo wrote'
  echo "$output"
  [ "$status" -ne 0 ]
  ! echo "$output" | grep -qx wrote
}

@test "an enroot.conf named by enroot_conf sets the defaults; gantry.conf's own keys win" {
  printf 'ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\nENROOT_ROOTFS_WRITABLE yes\nENROOT_REMAP_ROOT yes\n' >"$WORK/enroot.conf"
  conf "enroot_conf = $WORK/enroot.conf" "container_remap_root = no"
  run as_user srun -N1 --container-image="$TINY" sh -c 'touch /x && echo wrote uid=$(id -u)'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "wrote uid=$(id -u "$U")"
}

@test "container_remap_root = yes makes the user root inside; --no-container-remap-root overrides" {
  conf "container_remap_root = yes"
  run as_user srun -N1 --container-image="$TINY" id -u
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -1)" = 0 ]
  run as_user srun -N1 --no-container-remap-root --container-image="$TINY" id -u
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -1)" = "$(id -u "$U")" ]
}

@test "container_mount_home = no leaves the home directory out; --container-mount-home brings it back" {
  runuser -u "$U" -- sh -c "mkdir -p '$UHOME' 2>/dev/null; echo home-marker > '$UHOME/.enroot-compat-marker'"
  conf "container_mount_home = no"
  run as_user srun -N1 --container-image="$TINY" cat "$UHOME/.enroot-compat-marker"
  echo "$output"
  [ "$status" -ne 0 ]
  run as_user srun -N1 --container-mount-home --container-image="$TINY" cat "$UHOME/.enroot-compat-marker"
  echo "$output"
  rm -f "$UHOME/.enroot-compat-marker"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx home-marker
}

@test "environ.d: variables in every container, \${NAME} from the job, over the job's own value unless --container-env" {
  printf '# site tuning\nSITE_NCCL=INFO\nexport SITE_JOB=job-${SLURM_JOB_ID}\nSITE_LITERAL=$HOME\n' >"$WORK/environ.d/10-site.env"
  printf 'SITE_NCCL=TRACE\n' >"$WORK/environ.d/20-later.env"
  printf 'IGNORED=1\n' >"$WORK/environ.d/README"
  chmod 0644 "$WORK"/environ.d/*
  conf
  run as_user bash -c 'export SITE_NCCL=WARN; srun -N2 -n2 --container-image="$0" sh -c "echo \$SITE_NCCL \$SITE_JOB=\$SLURM_JOB_ID \$SITE_LITERAL \${IGNORED:-unset}"' "$TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  # The later file wins; the job's SITE_NCCL=WARN does not replace the site's value.
  [ "$(echo "$output" | grep -cE '^TRACE job-([0-9]+)=\1 \$HOME unset$')" -eq 2 ]
  run as_user bash -c 'export SITE_NCCL=WARN; srun -N1 --container-env=SITE_NCCL --container-image="$0" sh -c "echo \$SITE_NCCL"' "$TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -1)" = WARN ]
}

@test "mounts.d: a bind mount in every container (srun and gantry run), \${NAME} expanded, nofail skips a missing source" {
  cat >"$WORK/mounts.d/10-site.fstab" <<EOF
# site storage
$WORK/site site-data none x-create=dir,rbind,ro
$WORK/site /job-\${SLURM_JOB_ID} none x-create=dir,bind
/nonexistent/gantry-enroot-compat /missing none x-create=dir,bind,nofail
EOF
  chmod 0644 "$WORK/mounts.d/10-site.fstab"
  make_enroot_image
  conf
  run as_user srun -N2 -n2 --container-image="$TINY" sh -c 'cat /site-data/marker /job-$SLURM_JOB_ID/marker; test -e /missing || echo no-missing; touch /site-data/new 2>/dev/null || echo read-only'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx 'site data')" -eq 4 ]
  [ "$(echo "$output" | grep -cx no-missing)" -eq 2 ]
  [ "$(echo "$output" | grep -cx read-only)" -eq 2 ]
  # gantry run reads the same drop-ins.
  run as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" SLURM_JOB_ID=77 "$GANTRY" run "$WORK/enroot.sqsh" cat /site-data/marker /job-77/marker
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx 'site data')" -eq 2 ]
  # Without nofail a missing source stops the step, naming the file and line.
  echo "/nonexistent/gantry-enroot-compat /missing none bind" >"$WORK/mounts.d/20-strict.fstab"
  chmod 0644 "$WORK/mounts.d/20-strict.fstab"
  run as_user srun -N1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "gantry: .*$WORK/mounts.d/20-strict.fstab:1: mounting /nonexistent/gantry-enroot-compat at /missing: source path does not exist"
}

@test "a group-writable drop-in is refused with the file and the fix, before it is read" {
  printf 'SITE_NCCL=INFO\n' >"$WORK/environ.d/10-site.env"
  chmod 0664 "$WORK/environ.d/10-site.env"
  conf
  run as_user srun -N1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "gantry: .*drop-in file $WORK/environ.d/10-site.env is writable by its group or others (mode 0664).*chmod go-w"
  # A drop-in owned by the user (not root) is refused too.
  chmod 0644 "$WORK/environ.d/10-site.env"
  chown "$U" "$WORK/environ.d/10-site.env"
  run as_user srun -N1 --container-image="$TINY" true
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q "gantry: .*drop-in file $WORK/environ.d/10-site.env is owned by uid $(id -u "$U"), not root"
}

@test "an Enroot-made image (no OCI config) keeps its environment from /etc/environment" {
  make_enroot_image
  conf
  run as_user srun -N2 -n2 --container-image="$WORK/enroot.sqsh" thescript
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx 'thescript: hello from etc-environment')" -eq 2 ]
  run as_user srun -N1 --container-image="$WORK/enroot.sqsh" sh -c 'echo "$PATH|$APP_JOB|$SLURM_JOB_ID"'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | tail -1 | grep -qE '^/opt/app/bin:/bin\|([0-9]+)\|\1$'
  # gantry run reads it the same way.
  run as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" "$GANTRY" run "$WORK/enroot.sqsh" thescript
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx 'thescript: hello from etc-environment'
}

@test "an Enroot-made image: /etc/rc gives the working directory, --container-entrypoint its entrypoint, gantry run its Cmd" {
  make_enroot_image
  conf
  run as_user srun -N2 -n2 --container-image="$WORK/enroot.sqsh" pwd
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | grep -cx /workspace)" -eq 2 ]
  run as_user srun -N1 --container-image="$WORK/enroot.sqsh" --container-workdir=/opt pwd
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -1)" = /opt ]
  # The entrypoint runs only when asked for, as with Pyxis; the script /etc/rc itself never runs.
  run as_user srun -N1 --container-image="$WORK/enroot.sqsh" --container-entrypoint echo a b
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -1)" = "entry(3): echo a b" ]
  run as_user srun -N1 --container-image="$WORK/enroot.sqsh" echo a b
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -1)" = "a b" ]
  # gantry run --entrypoint without a command: the entrypoint with the Cmd (a quote kept in a word).
  run as_user env GANTRY_CONFIG="$GANTRY_TEST_GANTRY_CONF" "$GANTRY" run --entrypoint "$WORK/enroot.sqsh"
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "entry(2): the'cmd two" ]
}
