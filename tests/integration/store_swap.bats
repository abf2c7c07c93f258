# fixtures: registry images
# Issue #33, attack 1, "swap after the check": in an open (1777) store whose subdirectories belong to
# another user, that user may rename entries in them despite the sticky bit. An inotify watch
# (swap_on_open.py, run as the attacker) renames the attacker's squashfs over the victim's layer file
# the moment the victim's own command opens it; whatever opens the name after that gets the attacker's
# bytes. Gantry must open each file once, check it on the descriptor and use only the descriptor
# (acquire_image, docs/store.md "Trust model"): the victim then runs the genuine image, or is refused,
# and never sees the attacker's files. Every command runs under `timeout`.

load helpers

setup_file() {
  export VICTIM ATTACKER
  VICTIM=$("$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  ATTACKER=$(GANTRY_TEST_USER=gantry-attacker GANTRY_TEST_UID=4243 "$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  gantry_open_fuse
}

teardown_file() {
  gantry_restore_fuse
}

setup() {
  gantry_load_env registry images
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  REG=$GANTRY_TEST_REGISTRY_HTTP
  WORK=$(mktemp -d /tmp/gantry-swap.XXXXXX)
  chmod 0755 "$WORK"
  S=$WORK/store
  install -d -m 1777 "$S"
  for u in "$VICTIM" "$ATTACKER"; do install -d -o "$u" -g "$u" -m 0700 "$WORK/home-$u"; done
  export GANTRY_CONFIG=$WORK/gantry.conf  # the defaults: layered images, no store_owner
  : >"$GANTRY_CONFIG"
  chmod 0644 "$GANTRY_CONFIG"
  SWAPPER=
}

teardown() {
  if [ -n "$SWAPPER" ]; then kill "$SWAPPER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}

# as USER CMD...: CMD as USER with a home of this test's own, at most 60 s.
as() {
  local u=$1
  shift
  runuser -u "$u" -- env -C "$WORK" HOME="$WORK/home-$u" GANTRY_CONFIG="$GANTRY_CONFIG" timeout 60 "$@"
}

# victim_pulls_tiny: the attacker lays the store out first (its subdirectories theirs), then the victim
# pulls tiny into it, as layers. Sets LAYER (the name of tiny's one layer file in images/).
victim_pulls_tiny() {
  as "$ATTACKER" sh -c "cd '$S' && mkdir images refs used locks staging && chmod 1777 images refs used locks staging"
  run as "$VICTIM" "$GANTRY" pull --quiet --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  LAYER=$(cd "$S/images" && ls layer-*.sqsh)
  [ "$(echo "$LAYER" | wc -l)" -eq 1 ]
  [ "$(stat -c %U "$S/images/$LAYER")" = "$VICTIM" ]
}

# arm_swap NAME COUNT: the attacker's copy of the genuine layer with /work/README saying
# ATTACKER-MARKER (anyone who can read the layer can make one), in staging/ (theirs, same file system),
# and the watch that renames it over images/$LAYER on images/NAME's COUNT-th open.
arm_swap() {
  unsquashfs -no-xattrs -quiet -no-progress -d "$WORK/evil" "$S/images/$LAYER" >/dev/null
  echo ATTACKER-MARKER >"$WORK/evil/work/README"
  mksquashfs "$WORK/evil" "$WORK/evil.sqsh" -noappend -quiet -no-progress >/dev/null
  chmod 0644 "$WORK/evil.sqsh"
  as "$ATTACKER" cp "$WORK/evil.sqsh" "$S/staging/evil.sqsh"
  runuser -u "$ATTACKER" -- timeout 120 /usr/bin/python3 "$GANTRY_SOURCE_DIR/tests/integration/swap_on_open.py" \
    "$S/images" "$1" "$2" "$S/staging/evil.sqsh" "$LAYER" "$S/staging/armed" >"$WORK/swap.out" 2>&1 &
  SWAPPER=$!
  for _ in $(seq 100); do
    [ -e "$S/staging/armed" ] && break
    sleep 0.1
  done
  [ -e "$S/staging/armed" ]
}

# swapped: the attacker's rename happened (the test exercised the race, not a quiet store).
swapped() {
  wait "$SWAPPER" || true
  SWAPPER=
  cat "$WORK/swap.out"
  grep -qx swapped "$WORK/swap.out"
  [ "$(stat -c %U "$S/images/$LAYER")" = "$ATTACKER" ]
}

@test "swap after the check: the layer renamed over on its first open; the victim's gantry run runs the genuine image" {
  victim_pulls_tiny
  arm_swap "$LAYER" 1
  run as "$VICTIM" "$GANTRY" run --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY" cat /work/README
  echo "$output"
  swapped
  ! echo "$output" | grep -q ATTACKER-MARKER || false
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "tiny work dir"
  # And the next run, which finds the attacker's file under the name, refuses it.
  run as "$VICTIM" "$GANTRY" run --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY" cat /work/README
  echo "$output"
  ! echo "$output" | grep -q ATTACKER-MARKER || false
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
}

@test "swap after the check: --pull=never's whole image is composed from the layers the victim checked, never the attacker's" {
  victim_pulls_tiny
  hex=$(cd "$S/images" && ls | grep -v '^layer-' | grep '\.json$')
  hex=${hex%.json}
  # The extract backend cannot stack layers: the whole squashfs is made from the stored layers, with
  # no registry. Before descriptors, the layer was checked (fstatat) by every lookup of its record
  # and opened by name only by the composition: the attacker renames on the record's sixth open,
  # the last one before the composition opens the layer.
  arm_swap "${LAYER%.sqsh}.json" 6
  run as "$VICTIM" "$GANTRY" run --store "$S" --pull never --backend extract "$REG/$GANTRY_TEST_IMAGE_TINY" cat /work/README
  echo "$output"
  swapped
  ! echo "$output" | grep -q ATTACKER-MARKER || false
  # Genuine, or refused as not the victim's file; never a whole image of the attacker's bytes.
  if [ "$status" -eq 0 ]; then
    echo "$output" | grep -q "tiny work dir"
  else
    [ "$status" -ne 124 ]
    echo "$output" | grep -q "gantry: "
  fi
  if [ -e "$S/images/$hex.sqsh" ]; then
    unsquashfs -cat "$S/images/$hex.sqsh" work/README | grep -qx "tiny work dir"
  fi
}
