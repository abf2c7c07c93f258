# fixtures: registry images packages
# The .deb and .rpm (packaging/): contents, dependencies, conffiles and scripts, lintian, documented
# configuration keys, the packaged CLI running a container from the test registry, and the .deb
# installed with apt into a clean debootstrap root (packaging/test-install.sh).
# The packages are built once per run by packaging/build-packages.sh into $GANTRY_BUILD_DIR/package
# (or $GANTRY_PACKAGE_BUILD_DIR): under CTest by the fixture harness.packages.build, beside other
# tests; setup_file's own call then only re-packs them (an incremental rebuild takes seconds).

load helpers
bats_require_minimum_version 1.5.0  # run --separate-stderr

setup_file() {
  export SRC=${GANTRY_SOURCE_DIR:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
  export PKG_BUILD=${GANTRY_PACKAGE_BUILD_DIR:-${GANTRY_BUILD_DIR:-/tmp/gantry-harness}/package}
  out=$("$SRC/packaging/build-packages.sh" --build-dir "$PKG_BUILD")
  DEB=$(sed -n 's/^deb: //p' <<<"$out")
  RPM=$(sed -n 's/^rpm: //p' <<<"$out")
  export DEB RPM
  # The Slurm release the build used, e.g. 22.05 (slurm_version.h: 0xMMmmpp).
  num=$(sed -n 's/^#define SLURM_VERSION_NUMBER[[:space:]]*\(0x[0-9a-fA-F]*\).*/\1/p' /usr/include/slurm/slurm_version.h)
  SLURM_RELEASE=$(printf '%d.%02d' $(( (num >> 16) & 0xff )) $(( (num >> 8) & 0xff )))
  SLURM_NEXT=$(printf '%d.%02d' $(( (num >> 16) & 0xff )) $(( ((num >> 8) & 0xff) + 1 )))
  export SLURM_RELEASE SLURM_NEXT
}

@test "the .deb holds the plugin, the CLI, the helper, configuration, man pages, bash completion and the tmpfiles entry" {
  [ -f "$DEB" ]
  run dpkg-deb -c "$DEB"
  [ "$status" -eq 0 ]
  for f in ./usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so ./usr/bin/gantry ./usr/libexec/gantry/gantry-entry \
    ./etc/gantry/gantry.conf ./etc/slurm/plugstack.conf.d/gantry.conf ./usr/lib/tmpfiles.d/gantry.conf \
    ./usr/share/man/man1/gantry.1.gz ./usr/share/man/man5/gantry.conf.5.gz ./usr/share/doc/gantry/copyright \
    ./usr/share/doc/gantry/changelog.gz ./usr/share/doc/gantry/admin.md ./usr/share/bash-completion/completions/gantry \
    ./usr/libexec/gantry/gantry-holder ./etc/apparmor.d/gantry ./usr/share/man/man1/enroot.1.gz \
    ./usr/lib/systemd/system/gantry-stage.socket ./usr/lib/systemd/system/gantry-stage.service; do
    echo "$output" | grep -q " $f\$" || { echo "missing $f"; return 1; }
  done
  # `enroot` is the CLI under Enroot's name (runtime/cli/enroot.cpp), in Enroot's package's place.
  echo "$output" | grep -q ' \./usr/bin/enroot -> gantry$'
  [ "$(dpkg-deb -f "$DEB" Conflicts)" = "enroot, enroot+caps" ]
  [ "$(dpkg-deb -f "$DEB" Provides)" = "enroot" ]
  # Nothing under /usr/local, nothing outside the paths above.
  ! echo "$output" | grep -q ' \./usr/local/' || false
  # The files under /etc are conffiles: upgrades keep the admin's edits.
  run dpkg-deb -I "$DEB" conffiles
  [ "$(echo "$output" | sort)" = "$(printf '/etc/apparmor.d/gantry\n/etc/gantry/gantry.conf\n/etc/slurm/plugstack.conf.d/gantry.conf')" ]
}

@test "the .deb depends on the Slurm release it was built for, squashfuse, fuse3 and its libraries" {
  run dpkg-deb -f "$DEB" Depends
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qF "slurm-wlm-basic-plugins (>= ${SLURM_RELEASE}~)"
  echo "$output" | grep -qF "slurm-wlm-basic-plugins (<< ${SLURM_NEXT}~)"
  for p in squashfuse fuse3 libcurl4 libsquashfs1 libarchive13 libssl3; do
    echo "$output" | grep -qE "(^|, )$p( |,|$)" || { echo "no dependency on $p"; return 1; }
  done
}

@test "installing enables nothing: the plugstack line is commented and postinst never writes plugstack.conf" {
  dir=$BATS_TEST_TMPDIR/x
  dpkg-deb -x "$DEB" "$dir"
  dpkg-deb -e "$DEB" "$dir/DEBIAN"
  # Every line of the shipped plugstack file is a comment or blank, and it names the packaged plugin.
  ! grep -Evq '^[[:space:]]*(#|$)' "$dir/etc/slurm/plugstack.conf.d/gantry.conf" || false
  grep -q '^#required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so ' "$dir/etc/slurm/plugstack.conf.d/gantry.conf"
  # The maintainer script writes no Slurm file (the only mention of plugstack is the hint it prints).
  run grep -n plugstack "$dir/DEBIAN/postinst"
  echo "$output"
  ! echo "$output" | grep -Ev '^[0-9]+:[[:space:]]*(#|echo )' || false
  sh -n "$dir/DEBIAN/postinst"
  # The plugin finds the CLI where the package puts it (the install prefix is compiled in).
  grep -aq '/usr/bin/gantry' "$dir/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so"
}

@test "the .rpm: same files, both configuration files %config(noreplace), Slurm release required" {
  [ -f "$RPM" ]
  run rpm -qlp "$RPM"
  [ "$status" -eq 0 ]
  for f in /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so /usr/bin/gantry /etc/gantry/gantry.conf \
    /etc/slurm/plugstack.conf.d/gantry.conf /usr/lib/tmpfiles.d/gantry.conf /usr/share/man/man5/gantry.conf.5.gz \
    /etc/apparmor.d/gantry /usr/bin/enroot /usr/share/man/man1/enroot.1.gz /usr/lib/systemd/system/gantry-stage.socket; do
    echo "$output" | grep -qx "$f" || { echo "missing $f"; return 1; }
  done
  run rpm -qp --conflicts "$RPM"
  echo "$output" | grep -qx enroot
  # Directories of Slurm and the system are not claimed by our package.
  ! echo "$output" | grep -qx '/etc/slurm' || false
  ! echo "$output" | grep -qx '/usr/lib/tmpfiles.d' || false
  ! echo "$output" | grep -qx '/etc/apparmor.d' || false
  run rpm -qp --configfiles "$RPM"
  [ "$(echo "$output" | sort)" = "$(printf '/etc/apparmor.d/gantry\n/etc/gantry/gantry.conf\n/etc/slurm/plugstack.conf.d/gantry.conf')" ]
  run rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$RPM"
  echo "$output" | grep -q '^cn /etc/gantry/gantry.conf$'
  run rpm -qpR "$RPM"
  echo "$output" | grep -qx "slurm >= $SLURM_RELEASE"
  echo "$output" | grep -qx "slurm < $SLURM_NEXT"
  echo "$output" | grep -qx squashfuse
}

# aa_parse FILE: apparmor_parser over FILE, parse and compile only (-Q: no kernel load, -K: no cache;
# this kernel has no AppArmor). The profile's `userns` rule needs AppArmor 4's parser: this host's
# where it is one, else the one in the Slurm 24.11 lane's trixie root (tests/harness/slurm2411.sh
# root: cached, built by harness.slurm2411.start before the packages; made here when missing), run
# in it with chroot so that its own /etc/apparmor.d (abi/4.0, tunables) is the one included.
aa_parse() {
  local version
  version=$(apparmor_parser --version 2>/dev/null | sed -n 's/^AppArmor parser version \([0-9]*\)\..*/\1/p')
  if [ "${version:-0}" -ge 4 ]; then
    apparmor_parser -Q -K "$1"
  else
    [ "$(id -u)" -eq 0 ] || { echo "needs root (chroot into the trixie root for AppArmor 4's parser)"; return 1; }
    local root
    root=$("$SRC/tests/harness/slurm2411.sh" root | tail -n1)
    [ -x "$root/usr/sbin/apparmor_parser" ] || { echo "no apparmor_parser in $root"; return 1; }
    chroot "$root" apparmor_parser -Q -K <"$1"
  fi
}

@test "the AppArmor profile (source tree and .deb) parses with apparmor_parser; a broken copy does not" {
  dir=$BATS_TEST_TMPDIR/x
  dpkg-deb -x "$DEB" "$dir"
  run aa_parse "$SRC/packaging/apparmor/gantry"
  echo "$output"
  [ "$status" -eq 0 ]
  run aa_parse "$dir/etc/apparmor.d/gantry"
  echo "$output"
  [ "$status" -eq 0 ]
  # It covers the holder where the package puts it, and grants it user namespaces.
  grep -q '^profile gantry-holder /usr/libexec/gantry/gantry-holder flags=(unconfined) {$' "$dir/etc/apparmor.d/gantry"
  [ -x "$dir/usr/libexec/gantry/gantry-holder" ]
  grep -qx '  userns,' "$dir/etc/apparmor.d/gantry"
  # The check can fail: a rule without its comma, and an unknown rule, are syntax errors.
  sed 's/^  userns,$/  userns/' "$SRC/packaging/apparmor/gantry" >"$BATS_TEST_TMPDIR/broken"
  run aa_parse "$BATS_TEST_TMPDIR/broken"
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q 'AppArmor parser error'
  sed 's/^  userns,$/  usernamespaces,/' "$SRC/packaging/apparmor/gantry" >"$BATS_TEST_TMPDIR/broken"
  run aa_parse "$BATS_TEST_TMPDIR/broken"
  echo "$output"
  [ "$status" -ne 0 ]
  echo "$output" | grep -q 'AppArmor parser error.*syntax error'
  # The postinst loads it only where AppArmor runs (aa-enabled), and a failed load is not fatal.
  dpkg-deb -e "$DEB" "$dir/DEBIAN"
  grep -q 'aa-enabled --quiet' "$dir/DEBIAN/postinst"
  grep -q 'apparmor_parser -r -T -W "$profile" ||' "$dir/DEBIAN/postinst"
}

@test "lintian: no errors or warnings (deliberate tags are overridden with reasons)" {
  run lintian --fail-on error,warning "$DEB"
  echo "$output"
  [ "$status" -eq 0 ]
  ! echo "$output" | grep -E '^[EW]: ' || false
}

@test "the man pages render without warnings" {
  for page in gantry.1 gantry.conf.5; do
    run bash -c "LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l '$SRC/packaging/man/$page' 2>&1 >/dev/null"
    echo "$page: $output"
    [ -z "$output" ]
  done
  run bash -c "LC_ALL=C.UTF-8 MANWIDTH=80 man -l '$SRC/packaging/man/gantry.1' | grep -c 'gantry gc'"
  [ "$output" -ge 1 ]
}

@test "every gantry.conf key and plugstack key is documented in docs/admin.md and gantry.conf(5)" {
  keys=$(sed -n 's/^[[:space:]]*{"\([a-z_]*\)",.*/\1/p' "$SRC/runtime/core/config.cpp")
  [ "$(echo "$keys" | wc -w)" -ge 15 ]
  for k in $keys; do
    grep -q "^| \`$k\` |" "$SRC/docs/admin.md" || { echo "docs/admin.md lacks gantry.conf key $k"; return 1; }
    grep -q "^\.BR $k \"" "$SRC/packaging/man/gantry.conf.5" || { echo "gantry.conf.5 lacks key $k"; return 1; }
    grep -q "^#$k =" "$SRC/conf/gantry.conf" || { echo "conf/gantry.conf lacks key $k"; return 1; }
  done
  pkeys=$(grep -o 'key == "[a-z_]*"' "$SRC/plugin/settings.cpp" | sed 's/key == "\(.*\)"/\1/' | sort -u)
  [ "$(echo "$pkeys" | wc -w)" -ge 8 ]
  for k in $pkeys; do
    case $k in use_enroot_load | importer | use_squashfuse) grep -q "\`$k\`" "$SRC/docs/admin.md" || return 1; continue ;; esac
    grep -q "^| \`$k\` |" "$SRC/docs/admin.md" || { echo "docs/admin.md lacks plugstack key $k"; return 1; }
    grep -q "^\.BR $k= " "$SRC/packaging/man/gantry.conf.5" || { echo "gantry.conf.5 lacks plugstack key $k"; return 1; }
  done
}

@test "the packaged gantry CLI (nothing from the build tree) pulls and runs the tiny image" {
  gantry_load_env registry images
  dir=$BATS_TEST_TMPDIR/x
  dpkg-deb -x "$DEB" "$dir"
  run "$dir/usr/bin/gantry" --version
  [ "$status" -eq 0 ]
  [[ "$output" =~ ^gantry\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
  store=$BATS_TEST_TMPDIR/store
  run --separate-stderr env GANTRY_CONFIG=/dev/null "$dir/usr/bin/gantry" pull --quiet --store "$store" "$GANTRY_TEST_REGISTRY_HTTP/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == "$GANTRY_TEST_DIGEST_TINY "* ]]
  run --separate-stderr env GANTRY_CONFIG=/dev/null "$dir/usr/bin/gantry" run --store "$store" \
    "$GANTRY_TEST_REGISTRY_HTTP/$GANTRY_TEST_IMAGE_TINY" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$output" = "tiny work dir" ]
}

@test "deployment scripts, the bash completion and YAML pass shellcheck and yamllint" {
  run shellcheck -x "$SRC/packaging/build-packages.sh" "$SRC/packaging/test-install.sh" \
    "$SRC/packaging/parallelcluster/gantry-node.sh" "$SRC/packaging/slinky/build-gantry.sh" \
    "$SRC/tests/harness/deploy_roots.sh"
  echo "$output"
  [ "$status" -eq 0 ]
  # The bash completion has no #! line (bash-completion sources it): checked as bash.
  run shellcheck -s bash "$SRC/packaging/completion/gantry"
  echo "$output"
  [ "$status" -eq 0 ]
  run yamllint -d '{extends: default, rules: {line-length: {max: 110}}}' \
    "$SRC/packaging/parallelcluster/cluster-snippet.yaml" "$SRC/packaging/slinky/values-gantry.yaml"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "test-install.sh: apt installs the .deb into a clean debootstrap root and every check passes" {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (chroot)"; return 1; }
  run "$SRC/packaging/test-install.sh" --deb "$DEB"
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q 'all checks passed'
  ! echo "$output" | grep -q '^FAIL' || false
  echo "$output" | grep -q "^ok   Debian's srun loads the packaged plugin once enabled"
}
