# fixtures: registry images
# The shared store attacked by an ordinary user (docs/store.md, "Trust model"): in a legacy 1777 store
# the attacker plants symlinks, FIFOs, a squashfs of their own under a public digest and a symlinked
# lock file; root's `gantry gc`/`images`/`pull` and the victim's `gantry run`/`pull` must neither
# follow, hang on, overwrite nor run any of it. Every command runs under `timeout`: a regression
# fails the test instead of hanging CI.

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
  WORK=$(mktemp -d /tmp/gantry-attack.XXXXXX)
  chmod 0755 "$WORK"
  # The shared store as many sites set it up: world-writable and sticky.
  S=$WORK/store
  install -d -m 1777 "$S"
  for u in "$VICTIM" "$ATTACKER"; do install -d -o "$u" -g "$u" -m 0700 "$WORK/home-$u"; done
  # A directory and a file of the victim's that the attacker wants destroyed or overwritten.
  install -d -o "$VICTIM" -g "$VICTIM" -m 0755 "$WORK/victim" "$WORK/victim/sub"
  echo precious >"$WORK/victim/sub/precious"
  echo precious >"$WORK/victim/file"
  chown -R "$VICTIM:$VICTIM" "$WORK/victim"
  echo root-precious >"$WORK/root-file"
  export GANTRY_CONFIG=$WORK/gantry.conf  # the defaults: no store_owner
  : >"$GANTRY_CONFIG"
  chmod 0644 "$GANTRY_CONFIG"
}

teardown() {
  rm -rf "$WORK"
}

# as USER CMD...: CMD as USER with a home of this test's own, at most 60 s.
as() {
  local u=$1
  shift
  runuser -u "$u" -- env -C "$WORK" HOME="$WORK/home-$u" GANTRY_CONFIG="$GANTRY_CONFIG" timeout 60 "$@"
}

# tiny_digest: the public digest of the tiny test image, as anyone can learn it (the attacker's own pull
# into a store of their own).
tiny_digest() {
  as "$ATTACKER" "$GANTRY" pull --quiet --store "$WORK/home-$ATTACKER/store" "$REG/$GANTRY_TEST_IMAGE_TINY" | awk '{print $1}'
}

# attacker_layout: what the attacker makes of a fresh 1777 store before anyone else pulls: the
# subdirectories, theirs, sticky and world-writable (as the store makes them in a 1777 root).
attacker_layout() {
  as "$ATTACKER" sh -c "cd '$S' && mkdir images refs used locks staging && chmod 1777 images refs used locks staging"
}

# plant_layered_tiny [refs]: the attacker learns tiny's public layered form (its record and chain IDs)
# from a store of their own, then plants it in the shared store (laid out by attacker_layout) with an
# evil squashfs under every chain ID; with "refs", its tag record too. Sets RECORD (the record's name).
plant_layered_tiny() {
  local own=$WORK/home-$ATTACKER/store
  as "$ATTACKER" "$GANTRY" pull --layered --quiet --store "$own" "$REG/$GANTRY_TEST_IMAGE_TINY" >/dev/null
  RECORD=$(cd "$own/images" && ls | grep -v '^layer-' | grep '\.json$')
  [ -n "$RECORD" ]
  attacker_layout
  mkdir -p "$WORK/evil/work" "$WORK/evil/bin"
  echo ATTACKER-MARKER >"$WORK/evil/work/README"
  printf '#!/bin/sh\necho ATTACKER-MARKER\n' >"$WORK/evil/bin/cat" && chmod 0755 "$WORK/evil/bin/cat"
  mksquashfs "$WORK/evil" "$WORK/evil.sqsh" -noappend -quiet -no-progress >/dev/null
  chmod 0644 "$WORK/evil.sqsh"
  as "$ATTACKER" sh -c "cp '$own/images/$RECORD' '$S/images/$RECORD' && chmod 0644 '$S/images/$RECORD' &&
    for j in '$own'/images/layer-*.json; do
      b=\$(basename \"\$j\" .json)
      cp \"\$j\" '$S/images/' && cp '$WORK/evil.sqsh' '$S/images/'\"\$b\".sqsh && chmod 0444 '$S/images/'\"\$b\".sqsh
    done"
  [ -n "$(ls "$S"/images/layer-*.sqsh)" ]
  if [ "${1:-}" = refs ]; then
    [ -n "$(ls "$own/refs")" ]
    as "$ATTACKER" sh -c "cp '$own'/refs/* '$S/refs/' && chmod 0644 '$S'/refs/*"
  fi
}

# victim_runs_genuine_tiny REFUSAL CMD...: the victim's `gantry run` of tiny in the shared store
# neither hangs nor shows the attacker's marker: it runs the genuine image, or fails with REFUSAL
# (an extended regex) saying why.
victim_runs_genuine_tiny() {
  local refusal=$1
  shift
  run as "$VICTIM" "$GANTRY" run --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY" "$@"
  echo "$output"
  [ "$status" -ne 124 ]
  ! echo "$output" | grep -q ATTACKER-MARKER || false
  if [ "$status" -ne 0 ]; then
    echo "$output" | grep -Eq "$refusal"
  else
    echo "$output" | grep -q "tiny work dir"
  fi
}

victim_intact() {
  [ "$(cat "$WORK/victim/sub/precious")" = precious ]
  [ "$(cat "$WORK/victim/file")" = precious ]
  [ "$(cat "$WORK/root-file")" = root-precious ]
}

@test "staging/ replaced by a symlink to the victim's directory: root's gc refuses, removes nothing" {
  as "$ATTACKER" sh -c "cd '$S' && mkdir images refs used locks && ln -s '$WORK/victim' staging"
  run timeout 20 "$GANTRY" gc --store "$S" --max-bytes 1
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: .*$S/staging: is a symbolic link, which is never followed here; remove it"
  victim_intact
  [ -d "$WORK/victim/sub" ]
}

@test "staging/<hex> symlinked to the victim's directory: root refuses the 1777 store, the victim's gc reports the failure" {
  attacker_layout
  hex=$(printf '%064d' 0 | tr 0 a)
  as "$ATTACKER" ln -s "$WORK/victim" "$S/staging/$hex"
  run timeout 20 "$GANTRY" gc --store "$S"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: collecting garbage: modifying image store $S as root: $S is writable by all users"
  echo "$output" | grep -q "docs/store.md"
  victim_intact
  # The victim's own gc cannot remove the attacker's link (sticky staging/): an error, not "kept".
  run as "$VICTIM" "$GANTRY" gc --store "$S"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: collecting garbage: removing $S/staging/$hex"
  ! echo "$output" | grep -q "kept" || false
  victim_intact
  [ -L "$S/staging/$hex" ]
}

@test "a FIFO planted as image metadata: root's gc and everyone's gantry images finish at once with a clear message" {
  attacker_layout
  hex=$(printf '%064d' 0 | tr 0 b)
  as "$ATTACKER" sh -c "echo junk >'$S/images/$hex.sqsh' && chmod 0444 '$S/images/$hex.sqsh' && mkfifo -m 0644 '$S/images/$hex.json'"
  start=$(date +%s)
  run timeout 10 "$GANTRY" gc --store "$S"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "as root: $S is writable by all users"
  for who in root "$VICTIM"; do
    if [ "$who" = root ]; then run timeout 10 "$GANTRY" images --store "$S"; else run as "$who" timeout 10 "$GANTRY" images --store "$S"; fi
    echo "$output"
    [ "$status" -eq 0 ]
    echo "$output" | grep -q "ignoring $S/images/$hex"
    echo "$output" | grep -q "REFERENCE"
  done
  # root ignores the attacker's files (owner rule); the victim sees the FIFO for what it is.
  run as "$VICTIM" timeout 10 "$GANTRY" images --store "$S"
  echo "$output" | grep -qE "owned by uid 4243|not a regular file"
  [ $(($(date +%s) - start)) -lt 30 ]
}

@test "a squashfs planted under the digest of a public image: the victim never runs the attacker's files" {
  digest=$(tiny_digest)
  [[ "$digest" == sha256:* ]]
  hex=${digest#sha256:}
  attacker_layout
  # The attacker's image: a tree with a marker, metadata copied from a genuine pull.
  mkdir -p "$WORK/evil/work"
  echo ATTACKER-MARKER >"$WORK/evil/marker"
  echo ATTACKER-MARKER >"$WORK/evil/work/README"
  mksquashfs "$WORK/evil" "$WORK/evil.sqsh" -noappend -quiet -no-progress >/dev/null
  chmod 0644 "$WORK/evil.sqsh"
  as "$ATTACKER" sh -c "cp '$WORK/evil.sqsh' '$S/images/$hex.sqsh' && chmod 0444 '$S/images/$hex.sqsh' &&
    cp '$WORK/home-$ATTACKER/store/images/$hex.json' '$S/images/$hex.json' && chmod 0644 '$S/images/$hex.json'"
  # Here the attacker's files hold the digest's names in a sticky directory, so the victim cannot
  # publish its own and is told so.
  victim_runs_genuine_tiny "gantry: .*$S/images/$hex.json: the store holds this digest from uid 4243, which it does not trust" \
    cat /marker /work/README
  # The victim's listing ignores the planted image and says so.
  run as "$VICTIM" "$GANTRY" images --store "$S"
  echo "$output"
  echo "$output" | grep -q "ignoring $S/images/$hex.sqsh: owned by uid 4243"
  # With images/ the victim's own (a store of its own layout), the genuine image is pulled and run.
  rm -rf "$S"/*
  as "$VICTIM" sh -c "cd '$S' && mkdir images refs used locks staging"
  run as "$VICTIM" "$GANTRY" run --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY" cat /work/README
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
}

@test "layers and a layered record planted under a public image's chain IDs: the victim never runs the attacker's files" {
  plant_layered_tiny
  printf 'layered_images = yes\n' >"$GANTRY_CONFIG"
  victim_runs_genuine_tiny "the store holds this layer from uid 4243, which it does not trust" cat /work/README
  # The victim's listing ignores the planted record and layers, and says why.
  run as "$VICTIM" "$GANTRY" images --store "$S"
  echo "$output"
  echo "$output" | grep -q "ignoring $S/images/.*owned by uid 4243"
  ! echo "$output" | grep -q "$GANTRY_TEST_IMAGE_TINY" || false
  # Root's gc removes none of the victim's files, and follows nothing.
  run timeout 60 "$GANTRY" gc --store "$S" --unused-for 0s
  echo "$output"
  [ "$status" -ne 124 ]
  victim_intact
}

@test "a planted layered image and tag under --pull=never: the victim is told the image is not in the store" {
  # The attacker plants tiny's public layered record, its tag record (refs/) and an evil squashfs under
  # every chain ID, so that a run which never asks the registry would find "tiny" in the store.
  plant_layered_tiny refs
  hex=${RECORD%.json}
  # --pull=never with the extract backend (which needs a whole file, made from stored layers) and
  # auto, by tag and by digest: nothing planted is trusted, so the image is not in the store.
  local ref backend
  for backend in extract auto; do
    for ref in "$REG/$GANTRY_TEST_IMAGE_TINY" "$REG/gantry-test/tiny@sha256:$hex"; do
      run as "$VICTIM" "$GANTRY" run --store "$S" --pull never --backend "$backend" "$ref" cat /work/README
      echo "$output"
      [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
      ! echo "$output" | grep -q ATTACKER-MARKER || false
      echo "$output" | grep -q "gantry: $ref is not in the store $S and the pull policy is 'never'"
    done
  done
  run as "$VICTIM" "$GANTRY" pull --whole --pull never --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "is not in the store $S and the pull policy is 'never'"
  [ ! -e "$S/images/$hex.sqsh" ]   # no whole file composed from the planted layers
  # Root does not use (nor write) a store users can write.
  run timeout 60 "$GANTRY" run --store "$S" --pull never "$REG/$GANTRY_TEST_IMAGE_TINY" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  ! echo "$output" | grep -q ATTACKER-MARKER || false
  echo "$output" | grep -q "as root: $S is writable by all users"
  # A pull from the registry: the genuine image, or a refusal naming the planted files' owner.
  victim_runs_genuine_tiny "uid 4243, which it does not trust" cat /work/README
  [ ! -e "$S/images/$hex.sqsh" ] || [ "$(stat -c %u "$S/images/$hex.sqsh")" != 4243 ]
  victim_intact
}

@test "a lock file symlinked to another user's file: the victim's and root's pulls leave the target unchanged" {
  digest=$(tiny_digest)
  hex=${digest#sha256:}
  attacker_layout
  as "$ATTACKER" ln -s "$WORK/victim/file" "$S/locks/$hex.lock"
  run as "$VICTIM" "$GANTRY" pull --quiet --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: .*$S/locks/$hex.lock: is a symbolic link, which is never followed here; remove it"
  victim_intact
  # Root: the store is one users can write, so root does not write it at all.
  as "$ATTACKER" sh -c "rm '$S/locks/$hex.lock' && ln -s '$WORK/root-file' '$S/locks/$hex.lock'"
  run timeout 60 "$GANTRY" pull --quiet --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "as root: $S is writable by all users"
  victim_intact
}

@test "root's gc in a per-user store runs as its owner" {
  P=$WORK/home-$VICTIM/store
  as "$VICTIM" "$GANTRY" pull --quiet --store "$P" "$REG/$GANTRY_TEST_IMAGE_TINY"
  # The owner planted a link to a root file in its own store: as the owner, gc cannot touch root's file.
  hex=$(printf '%064d' 0 | tr 0 c)
  as "$VICTIM" ln -s "$WORK/root-file" "$P/staging/$hex"
  run timeout 20 "$GANTRY" gc --store "$P" --max-bytes 1
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "^removed sha256:"
  [ -z "$(ls "$P/images")" ]
  [ ! -e "$P/staging/$hex" ] && [ ! -L "$P/staging/$hex" ]
  victim_intact
}

# The imported-name attacks (issue #33): an archive's claims, a layout swapped under root's import, a
# symlinked store root under root's gc, and a CLI without HOME.

@test "an archive claiming a registry reference: root imports only a root-owned file, under a local/ name that no registry reference reaches" {
  R=$WORK/root-store
  install -d -m 0755 "$R"
  tiny=$REG/$GANTRY_TEST_IMAGE_TINY
  [[ "$GANTRY_TEST_IMAGE_TINY" == *:* ]] && name=local/${GANTRY_TEST_IMAGE_TINY} || name=local/${GANTRY_TEST_IMAGE_TINY}:latest
  # The attacker's "tool": the layers image, whose RepoTags say it is tiny of the test registry.
  skopeo copy -q --src-tls-verify=false "docker://$REG/$GANTRY_TEST_IMAGE_LAYERS" "docker-archive:$WORK/tool.tar:$tiny"
  chown "$ATTACKER:$ATTACKER" "$WORK/tool.tar"
  chmod 0644 "$WORK/tool.tar"
  # Root refuses a file its owner could change while root reads it, and says what to do.
  run timeout 60 "$GANTRY" import --store "$R" "docker-archive:$WORK/tool.tar"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "^gantry: importing docker-archive:$WORK/tool.tar: $WORK/tool.tar is owned by uid 4243, who could change it while root reads it; .*import it as its owner"
  [ -z "$(ls "$R/images")" ]
  # Copied to a root-owned file, it imports: known by its digest and a local/ name, nothing else.
  install -m 0600 "$WORK/tool.tar" "$WORK/root-tool.tar"
  run timeout 60 "$GANTRY" import --quiet --store "$R" "docker-archive:$WORK/root-tool.tar"
  echo "$output"
  [ "$status" -eq 0 ]
  digest=$(echo "$output" | tail -n1 | awk '{print $1}')
  run timeout 20 "$GANTRY" images --store "$R" --format json
  echo "$output"
  echo "$output" | grep -qF "\"$name\""
  ! echo "$output" | grep -qF "\"$tiny\"" || false
  run timeout 20 "$GANTRY" inspect --store "$R" "$name"
  [ "$status" -eq 0 ] && echo "$output" | grep -q "$digest"
  # Nobody's registry reference reaches it: not root's, not the victim's, under never or missing.
  run timeout 20 "$GANTRY" inspect --store "$R" "$tiny"
  echo "$output"
  [ "$status" -ne 0 ] && echo "$output" | grep -q "is not in the store $R"
  run as "$VICTIM" "$GANTRY" run --store "$R" --pull never "$tiny" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: $tiny is not in the store $R and the pull policy is 'never'"
  run as "$VICTIM" "$GANTRY" run --store "$R" --pull missing "$tiny" cat /work/README
  echo "$output"
  [ "$status" -ne 124 ]
  [ "$status" -ne 0 ] || [ "$output" = "tiny work dir" ]
  # root's local/ names are root's own: the victim's local/ lookup does not find them.
  run as "$VICTIM" "$GANTRY" run --store "$R" "$name" cat /work/README
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: $name is not an image you imported into the store $R"
  # --tag takes only local/ names.
  run timeout 20 "$GANTRY" import --store "$R" --tag "$tiny" "docker-archive:$WORK/root-tool.tar"
  echo "$output"
  [ "$status" -eq 2 ]
  echo "$output" | grep -q "^gantry: import: --tag $tiny: an imported image's name is under local/"
}

@test "an OCI layout whose layer is swapped for a FIFO once hashed: root's import converts the file it hashed and never hangs" {
  L=$WORK/layout
  skopeo copy -q --src-tls-verify=false "docker://$REG/$GANTRY_TEST_IMAGE_TINY" "oci:$L:v1"
  chown -R "$ATTACKER:$ATTACKER" "$L"
  layer=$(python3 -c 'import json, sys
d = sys.argv[1]
idx = json.load(open(d + "/index.json"))
m = json.load(open(d + "/blobs/sha256/" + idx["manifests"][0]["digest"].split(":")[1]))
print(d + "/blobs/sha256/" + m["layers"][-1]["digest"].split(":")[1])' "$L")
  [ -f "$layer" ]
  # The attacker's watch: the moment the layer file is first closed (its hash is done), a FIFO takes
  # its name. A reopen by name would block on it for good.
  cat >"$WORK/swap.py" <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
path = sys.argv[1]
fd = libc.inotify_init()
if fd < 0 or libc.inotify_add_watch(fd, path.encode(), 0x10) < 0:  # IN_CLOSE_NOWRITE
    sys.exit("inotify failed")
print("ready", flush=True)
os.read(fd, 4096)
os.mkfifo(path + ".fifo", 0o644)
os.rename(path + ".fifo", path)
print("swapped", flush=True)
PY
  runuser -u "$ATTACKER" -- timeout 120 python3 "$WORK/swap.py" "$layer" >"$WORK/swap.log" 2>&1 &
  for _ in $(seq 50); do grep -q ready "$WORK/swap.log" && break; sleep 0.1; done
  grep -q ready "$WORK/swap.log"
  R=$WORK/root-store
  install -d -m 0755 "$R"
  run timeout 60 "$GANTRY" import --quiet --store "$R" "oci:$L:v1"
  echo "$output"
  wait || true
  cat "$WORK/swap.log"
  grep -q swapped "$WORK/swap.log"
  [ -p "$layer" ]
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | tail -n1 | awk '{print $1}')" = "$GANTRY_TEST_DIGEST_TINY" ]
}

@test "a store root reached through a symbolic link: root's gc and rm refuse it, root's images stay" {
  R=$WORK/root-store
  install -d -m 0755 "$R"
  run timeout 60 "$GANTRY" pull --quiet --store "$R" "$REG/$GANTRY_TEST_IMAGE_TINY"
  [ "$status" -eq 0 ]
  digest=$(echo "$output" | tail -n1 | awk '{print $1}')
  before=$(ls "$R/images" | sort)
  [ -n "$before" ]
  # The attacker's cache: a link to root's store.
  as "$ATTACKER" sh -c "mkdir -p '$WORK/home-$ATTACKER/.cache' && ln -s '$R' '$WORK/home-$ATTACKER/.cache/gantry'"
  link=$WORK/home-$ATTACKER/.cache/gantry
  run timeout 20 "$GANTRY" gc --store "$link" --max-bytes 1
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  [ "$(echo "$output" | grep -c .)" -eq 1 ]
  echo "$output" | grep -q "^gantry: collecting garbage: removing from image store $link: it is reached through a symbolic link (to $R), which removals never follow; name the store by its own path (--store $R)"
  run timeout 20 "$GANTRY" rm --store "$link" "$digest"
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "it is reached through a symbolic link (to $R)"
  [ "$(ls "$R/images" | sort)" = "$before" ]
  # Reading through the link is fine; so is gc by the store's own path.
  run timeout 20 "$GANTRY" images --store "$link"
  [ "$status" -eq 0 ]
  run timeout 20 "$GANTRY" gc --store "$R" --max-bytes 1
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -q "^removed $digest"
}

@test "no HOME: the CLI names store_path and --store instead of using a shared directory" {
  had_tmp_cache=no
  [ -e /tmp/.cache ] && had_tmp_cache=yes
  run runuser -u "$VICTIM" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin GANTRY_CONFIG="$GANTRY_CONFIG" \
    timeout 60 "$GANTRY" pull --quiet "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  # What the CLI used to do: pull into /tmp/.cache/gantry, which any user can create first. Removed
  # again before anything is asserted, so that a failure leaves no shared directory behind.
  made_tmp_cache=no
  if [ "$had_tmp_cache" = no ] && [ -e /tmp/.cache ]; then
    rm -rf /tmp/.cache
    made_tmp_cache=yes
  fi
  [ "$made_tmp_cache" = no ]
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  [ "$(echo "$output" | grep -c .)" -eq 1 ]
  echo "$output" | grep -q "^gantry: .*no image store: HOME is not set .*store_path in gantry.conf.*--store DIR"
  run runuser -u "$VICTIM" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin GANTRY_CONFIG="$GANTRY_CONFIG" \
    timeout 60 "$GANTRY" images
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "^gantry: no image store: HOME is not set"
}
