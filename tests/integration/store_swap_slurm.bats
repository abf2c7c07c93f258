# fixtures: registry images slurm
# Issue #33, attack 1, through the plugin: a containerized srun step of the victim's, its image in an
# open (1777) store whose images/ the attacker made, the attacker's squashfs renamed over the victim's
# layer the moment it is first opened (swap_on_open.py; store_swap.bats does the same for gantry run).
# Root never opens a file in such a store: the job user's helper acquires the image
# (acquire_image_as) and every later step uses those descriptors, so the step runs the genuine image.

load helpers

setup() {
  gantry_load_env registry images slurm
  gantry_cluster_registry
  TINY="$REG#gantry-test/tiny"
  VICTIM=$GANTRY_TEST_USER
  ATTACKER=$(GANTRY_TEST_USER=gantry-attacker GANTRY_TEST_UID=4243 "$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/store-swap.XXXXXX")
  chmod 0755 "$WORK"
  S=$WORK/store
  install -d -m 1777 "$S"
  CONF=${GANTRY_TEST_GANTRY_CONF:-$GANTRY_HARNESS_DIR/gantry.conf}
  cp "$CONF" "$WORK/gantry.conf.orig"
  printf 'store_path = %s\ninsecure_registries = %s\nimport_messages = 0\n' "$S" "$REG" >"$CONF"
  SWAPPER=
}

teardown() {
  if [ -n "$SWAPPER" ]; then kill "$SWAPPER" 2>/dev/null || true; fi
  cp "$WORK/gantry.conf.orig" "$CONF"
  rm -rf "$WORK"
}

as() {
  local who=$1
  shift
  gantry_as_user "$who" "$WORK" timeout 120 "$@"
}

@test "swap after the check through srun: the layer renamed over on its first open; the victim's step runs the genuine image" {
  runuser -u "$ATTACKER" -- sh -c "cd '$S' && mkdir images refs used locks staging && chmod 1777 images refs used locks staging"
  run as "$VICTIM" srun -N1 -n1 --container-image="$TINY" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  LAYER=$(cd "$S/images" && ls layer-*.sqsh)
  [ "$(echo "$LAYER" | wc -l)" -eq 1 ]
  unsquashfs -no-xattrs -quiet -no-progress -d "$WORK/evil" "$S/images/$LAYER" >/dev/null
  echo ATTACKER-MARKER >"$WORK/evil/work/README"
  mksquashfs "$WORK/evil" "$WORK/evil.sqsh" -noappend -quiet -no-progress >/dev/null
  chmod 0644 "$WORK/evil.sqsh"
  runuser -u "$ATTACKER" -- cp "$WORK/evil.sqsh" "$S/staging/evil.sqsh"
  runuser -u "$ATTACKER" -- timeout 150 /usr/bin/python3 "$GANTRY_SOURCE_DIR/tests/integration/swap_on_open.py" \
    "$S/images" "$LAYER" 1 "$S/staging/evil.sqsh" "$LAYER" "$S/staging/armed" >"$WORK/swap.out" 2>&1 &
  SWAPPER=$!
  for _ in $(seq 100); do
    [ -e "$S/staging/armed" ] && break
    sleep 0.1
  done
  [ -e "$S/staging/armed" ]
  run as "$VICTIM" srun -N1 -n1 --container-image="$TINY" cat /work/README
  echo "$output"
  wait "$SWAPPER" || true
  SWAPPER=
  cat "$WORK/swap.out"
  grep -qx swapped "$WORK/swap.out"
  ! echo "$output" | grep -q ATTACKER-MARKER || false
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "tiny work dir"
}
