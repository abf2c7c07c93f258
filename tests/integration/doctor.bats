# fixtures:
# `gantry doctor` finding the plugstack.conf Slurm reads, with no --plugstack: slurm.conf from
# $SLURM_CONF (here an /opt/slurm/etc layout as on ParallelCluster), its PlugStackConfig or
# plugstack.conf beside it, and `include` globs relative to the including file. Also the Slurm release
# spank_gantry.so carries against `slurmd -V`, and the store file system line. Needs no services: the
# trees are fake files in a temporary directory (the real Slurm's plugstack is tests in devices.bats).

setup() {
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  T=$BATS_TEST_TMPDIR
  ETC=$T/opt/slurm/etc
  mkdir -p "$ETC/plugstack.conf.d" "$T/lib" "$T/store"
  : > "$T/lib/spank_gantry.so"
  printf 'store_path = %s\n' "$T/store" > "$T/gantry.conf"
}

teardown() {
  [ -z "${U:-}" ] || rm -rf "$U"
}

# doctor with this test's gantry.conf and SLURM_CONF, nothing else of the caller's Slurm environment.
doctor() {
  run env -u SLURM_CONF GANTRY_CONFIG="$T/gantry.conf" ${SLURM_CONF_TEST:+SLURM_CONF="$SLURM_CONF_TEST"} "$GANTRY" doctor "$@"
  echo "$output"
}

@test "doctor: PlugStackConfig in slurm.conf, a relative include glob, the line in an included file" {
  printf 'ClusterName=test\nPlugStackConfig=%s/stack.conf\nSlurmctldHost=head\n' "$ETC" > "$ETC/slurm.conf"
  printf '# plugins of this site\ninclude plugstack.conf.d/*.conf\n' > "$ETC/stack.conf"
  printf 'optional /usr/lib/other/spank_x.so\n' > "$ETC/plugstack.conf.d/10-other.conf"
  printf '#required /old/spank_gantry.so\nrequired %s/lib/spank_gantry.so config=/etc/gantry/gantry.conf\n' "$T" \
    > "$ETC/plugstack.conf.d/50-gantry.conf"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -qx "✓ Slurm plugin in plugstack.conf  *$ETC/plugstack.conf.d/50-gantry.conf: required $T/lib/spank_gantry.so"
}

@test "doctor: without PlugStackConfig, plugstack.conf beside slurm.conf (/opt/slurm/etc layout)" {
  printf 'ClusterName=test\n' > "$ETC/slurm.conf"
  printf 'include %s/plugstack.conf.d/*\n' "$ETC" > "$ETC/plugstack.conf"
  printf '  optional\t%s/lib/spank_gantry.so   # trailing comment\n' "$T" > "$ETC/plugstack.conf.d/gantry.conf"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -qx "✓ Slurm plugin in plugstack.conf  *$ETC/plugstack.conf.d/gantry.conf: optional $T/lib/spank_gantry.so"
  # A plugstack line naming a plugin file that is not there: ✗ with the path to install.
  rm "$T/lib/spank_gantry.so"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  [ "$status" -eq 1 ]
  echo "$output" | grep -q "^✗ Slurm plugin in plugstack.conf .*spank_gantry.so (file missing)$"
  echo "$output" | grep -A1 '^✗ Slurm plugin' | grep -q "fix: install the plugin at $T/lib/spank_gantry.so"
}

@test "doctor: an include that matches nothing is named, with the fix" {
  printf 'ClusterName=test\n' > "$ETC/slurm.conf"
  printf 'include plugstack.conf.d/*.conf\n' > "$ETC/plugstack.conf"
  rmdir "$ETC/plugstack.conf.d"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  [ "$status" -eq 1 ]
  echo "$output" | grep -q "^✗ Slurm plugin in plugstack.conf .*no spank_gantry.so line in $ETC/plugstack.conf; 'include $ETC/plugstack.conf.d/\*.conf' matches no file$"
  echo "$output" | grep -A1 '^✗ Slurm plugin' | grep -q "fix: add 'required .*spank_gantry.so' to $ETC/plugstack.conf .*create the file its include line names"
  # No plugstack.conf at all: the file doctor looked for, and where that came from.
  rm "$ETC/plugstack.conf"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  [ "$status" -eq 1 ]
  echo "$output" | grep -q "^✗ Slurm plugin in plugstack.conf .*cannot read $ETC/plugstack.conf (PlugStackConfig of $ETC/slurm.conf, or beside it)$"
}

@test "doctor: --plugstack overrides slurm.conf; includes nest" {
  printf 'ClusterName=test\nPlugStackConfig=/nonexistent/plugstack.conf\n' > "$ETC/slurm.conf"
  mkdir -p "$T/site/a" "$T/site/b"
  printf 'include a/*.conf\ninclude %s/site/b/*.conf\n' "$T" > "$T/site/plugstack.conf"
  printf 'include ../b/nothing-*.conf\n' > "$T/site/a/1.conf"
  printf 'required %s/lib/spank_gantry.so\n' "$T" > "$T/site/b/2.conf"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor --plugstack "$T/site/plugstack.conf"
  echo "$output" | grep -qx "✓ Slurm plugin in plugstack.conf  *$T/site/b/2.conf: required $T/lib/spank_gantry.so"
}

@test "doctor: the Slurm release spank_gantry.so was built for, against slurmd -V" {
  local running
  running=$(slurmd -V | awk '{print $2}' | cut -d. -f1,2)
  [ -n "$running" ]
  printf 'ClusterName=test\n' > "$ETC/slurm.conf"
  printf 'required %s/lib/spank_gantry.so\n' "$T" > "$ETC/plugstack.conf"
  # The plugin this build made carries its release; it is the one this machine runs.
  cp "$GANTRY_BUILD_DIR/plugin/spank_gantry.so" "$T/lib/spank_gantry.so"
  strings "$T/lib/spank_gantry.so" | grep -qx "gantry-built-for-slurm=$running"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -q "^✓ Slurm version .* spank_gantry.so built for Slurm $running, running .*$running\.[0-9]* (slurmd -V)$"
  # One built for another release: ✗ and the rebuild.
  printf '\x7fELF...gantry-built-for-slurm=21.08\0...' > "$T/lib/spank_gantry.so"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  [ "$status" -eq 1 ]
  echo "$output" | grep -q "^✗ Slurm version .* spank_gantry.so built for Slurm 21.08, running .*$running"
  echo "$output" | grep -A1 '^✗ Slurm version' | grep -q 'fix: rebuild Gantry against this Slurm'
  # A plugin without the marker (older builds): this gantry's own release is compared instead.
  : > "$T/lib/spank_gantry.so"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -q "^✓ Slurm version .* this gantry built for Slurm $running, running"
}

@test "doctor: the store's file system and its flock (a local one: nothing to check)" {
  printf 'ClusterName=test\n' > "$ETC/slurm.conf"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  local fstype
  fstype=$(findmnt -n -o FSTYPE -T "$T/store")
  echo "$output" | grep -q "^✓ store file system (flock) .* $(realpath "$T/store") on $fstype (.*): flock not checked (only Lustre and NFS mounts are)$"
}

@test "doctor: AppArmor's user namespace restriction (Ubuntu 24.04), with and without gantry-holder's profile" {
  printf 'ClusterName=test\n' > "$ETC/slurm.conf"
  # A fake host root for the sysctl and AppArmor's list of loaded profiles (host_root, as for GPUs).
  local R=$T/host
  mkdir -p "$R/proc/sys/kernel" "$R/sys/kernel/security/apparmor" "$R/etc/apparmor.d"
  printf 'host_root = %s\n' "$R" >> "$T/gantry.conf"
  # No such sysctl (a kernel without AppArmor, like this one): nothing to check.
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -qx "✓ AppArmor user namespaces  *no kernel.apparmor_restrict_unprivileged_userns here (nothing to check)"
  echo 0 > "$R/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -qx "✓ AppArmor user namespaces  *kernel.apparmor_restrict_unprivileged_userns = 0 (not restricted)"
  # Restricted, other profiles loaded but not the holder's: ✗, the restriction named, both fixes.
  echo 1 > "$R/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
  printf 'unprivileged_userns (enforce)\n/usr/bin/man (enforce)\nenroot (unconfined)\n' > "$R/sys/kernel/security/apparmor/profiles"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  [ "$status" -eq 1 ]
  echo "$output" | grep -qx "✗ AppArmor user namespaces  *kernel.apparmor_restrict_unprivileged_userns = 1; no gantry-holder profile loaded: containers get no capabilities in their user namespace"
  echo "$output" | grep -A1 '^✗ AppArmor user namespaces' |
    grep -q 'fix: apparmor_parser -r /etc/apparmor.d/gantry (the gantry package installs it; .*), or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 '
  # The package's profile loaded: ✓ with its line.
  printf 'gantry-holder (unconfined)\n' >> "$R/sys/kernel/security/apparmor/profiles"
  SLURM_CONF_TEST=$ETC/slurm.conf doctor
  echo "$output" | grep -qx "✓ AppArmor user namespaces  *kernel.apparmor_restrict_unprivileged_userns = 1; profile gantry-holder (unconfined) loaded"
}

@test "doctor: AppArmor's restriction, run by an ordinary user, who cannot read the list of loaded profiles" {
  [ "$(id -u)" -eq 0 ] || skip "needs root (runs doctor as nobody)"
  # A world-readable tree of its own (the test's tmpdir is root's alone), the profiles list root-only
  # as on a real kernel.
  U=$(mktemp -d /tmp/gantry-doctor-apparmor.XXXXXX)  # removed by teardown
  chmod 755 "$U"
  mkdir -p "$U/host/proc/sys/kernel" "$U/host/sys/kernel/security/apparmor" "$U/host/etc/apparmor.d" "$U/store"
  echo 1 > "$U/host/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
  printf 'gantry-holder (unconfined)\n' > "$U/host/sys/kernel/security/apparmor/profiles"
  chmod 600 "$U/host/sys/kernel/security/apparmor/profiles"
  printf 'store_path = %s\nhost_root = %s/host\n' "$U/store" "$U" > "$U/gantry.conf"
  chmod -R a+rX "$U/gantry.conf" "$U/host/proc" "$U/host/etc"
  run runuser -u nobody -- env -u SLURM_CONF GANTRY_CONFIG="$U/gantry.conf" "$GANTRY" doctor --plugstack /dev/null
  echo "$output"
  echo "$output" | grep -qx "✗ AppArmor user namespaces  *kernel.apparmor_restrict_unprivileged_userns = 1; no gantry-holder profile in /etc/apparmor.d/gantry: containers get no capabilities"
  # The profile file installed: what can be known without root is said, and passes.
  cp "$BATS_TEST_DIRNAME/../../packaging/apparmor/gantry" "$U/host/etc/apparmor.d/gantry"
  chmod 644 "$U/host/etc/apparmor.d/gantry"
  run runuser -u nobody -- env -u SLURM_CONF GANTRY_CONFIG="$U/gantry.conf" "$GANTRY" doctor --plugstack /dev/null
  echo "$output"
  echo "$output" | grep -qx "✓ AppArmor user namespaces  *kernel.apparmor_restrict_unprivileged_userns = 1; /etc/apparmor.d/gantry installed (whether it is loaded, only root can see)"
}
