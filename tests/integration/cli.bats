# fixtures: registry images
# The CLI's conventions (gantry(1)): --help on every verb, exit status 2 for a usage error of the image
# verbs, `run -e NAME=VALUE` next to `-e NAME`, the words after run's IMAGE passed on verbatim,
# `images -q` / `--format json` / `--digests`, the header of `ps`, and the bash completion
# (packaging/completion/gantry) driven as bash drives it. Containers run as the unprivileged test user, from the tiny test image pulled from the
# loopback registry into a store of that user's (the tiny image's busybox has no printenv: sh -c echo).

bats_require_minimum_version 1.5.0

load helpers

setup_file() {
  export TUSER
  TUSER=$("$GANTRY_SOURCE_DIR/tests/harness/user.sh")
  gantry_open_fuse
}

teardown_file() {
  gantry_restore_fuse
}

setup() {
  gantry_load_env registry images
  GANTRY=$GANTRY_BUILD_DIR/runtime/gantry
  REG=$GANTRY_TEST_REGISTRY_HTTP
  T=$(mktemp -d /tmp/gantry-cli-test.XXXXXX)
  chmod 0755 "$T"
  mkdir -p "$T/home" "$T/store"
  chown "$TUSER" "$T/home" "$T/store"
  STORE=$T/store
  printf 'insecure_registries = %s\n' "$REG" > "$T/gantry.conf"
  chmod 0644 "$T/gantry.conf"
  export GANTRY_CONFIG=$T/gantry.conf
}

teardown() {
  as_user "$GANTRY" stop cli-bats 2>/dev/null || true
  rm -rf "$T"
}

# as_user COMMAND...: as the test user, with a home of this test's and the test's gantry.conf.
as_user() { runuser -u "$TUSER" -- env -C "$T" HOME="$T/home" GANTRY_CONFIG="$GANTRY_CONFIG" XDG_RUNTIME_DIR= "$@"; }

@test "--help and -h on every verb print its usage to stdout and exit 0; gantry --help lists the verbs" {
  for verb in run pull stage stage-server import export images inspect rm gc exec stop ps doctor; do
    for flag in --help -h; do
      run --separate-stderr "$GANTRY" "$verb" "$flag"
      echo "$verb $flag: $status: $output / $stderr"
      [ "$status" -eq 0 ]
      [ -z "$stderr" ]
      [[ "${lines[0]}" == "usage: gantry $verb"* ]]
      echo "$output" | grep -q -- '^  -h, --help  *print this help$'
    done
  done
  # Each verb's help lists its own options (generated from the definitions the parser uses).
  for pair in run:--workdir run:--readonly pull:--platform import:--tag export:--output images:--format \
    inspect:--store rm:--store gc:--max-bytes exec:--workdir doctor:--plugstack; do
    run "$GANTRY" "${pair%%:*}" --help
    echo "$output" | grep -q -- "${pair#*:}" || { echo "${pair%%:*} --help lacks ${pair#*:}"; return 1; }
  done
  # Hidden options and verbs stay out of the help.
  run "$GANTRY" pull --help
  ! echo "$output" | grep -q -- '--report-fd\|--credentials' || false
  run "$GANTRY" --help
  ! echo "$output" | grep -q -- '__complete' || false
  # After options too, and `gantry help VERB`.
  run "$GANTRY" images --store "$STORE" --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "usage: gantry images"* ]]
  run "$GANTRY" help run
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "usage: gantry run"* ]]
  echo "$output" | grep -q -- '-e, --env NAME=VALUE'
  run --separate-stderr "$GANTRY" --help
  [ "$status" -eq 0 ]
  for verb in run pull stage stage-server import export images inspect rm gc exec stop ps doctor version; do
    echo "$output" | grep -q "^  $verb" || { echo "gantry --help lacks $verb"; return 1; }
  done
}

@test "usage errors: image verbs and doctor exit 2 with one line naming the verb; run exits 125" {
  for verb in pull stage stage-server import export images inspect rm gc doctor; do
    run "$GANTRY" "$verb" --no-such-option
    echo "$verb: $status: $output"
    [ "$status" -eq 2 ]
    [ "${#lines[@]}" -eq 1 ]
    [ "$output" = "gantry: $verb: unknown option '--no-such-option' (see gantry $verb --help)" ]
  done
  # A missing operand, an extra one, an option without its value, an unknown verb.
  for verb in pull inspect rm; do
    run "$GANTRY" "$verb" --store "$STORE"
    echo "$verb: $status: $output"
    [ "$status" -eq 2 ]
    [ "$output" = "gantry: $verb: no IMAGE given (see gantry $verb --help)" ]
  done
  run "$GANTRY" pull --store "$STORE" one two
  [ "$status" -eq 2 ]
  [ "$output" = "gantry: pull: unexpected operand 'two' (see gantry pull --help)" ]
  run "$GANTRY" gc --store "$STORE" --max-bytes
  [ "$status" -eq 2 ]
  [ "$output" = "gantry: gc: --max-bytes needs a value (see gantry gc --help)" ]
  run "$GANTRY" frobnicate
  [ "$status" -eq 2 ]
  [ "$output" = "gantry: unknown command 'frobnicate' (see gantry --help)" ]
  run --separate-stderr "$GANTRY"
  [ "$status" -eq 2 ]
  [[ "$stderr" == "usage: gantry <command>"* ]]
  run "$GANTRY" gc --store "$STORE" --max-bytes lots
  [ "$status" -eq 2 ]
  run "$GANTRY" images --store "$STORE" --format yaml
  [ "$status" -eq 2 ]
  # A failure that is not a usage error: 1.
  run "$GANTRY" inspect --store "$STORE" sha256:0123456789abcdef0123
  [ "$status" -eq 1 ]
  run "$GANTRY" rm --store "$STORE" sha256:0123456789abcdef0123
  [ "$status" -eq 1 ]
  # run/exec keep docker's 125.
  run "$GANTRY" run --no-such-option
  [ "$status" -eq 125 ]
  [ "$output" = "gantry: run: unknown option '--no-such-option' (see gantry run --help)" ]
  run "$GANTRY" run -e =x "$REG/$GANTRY_TEST_IMAGE_TINY" true
  [ "$status" -eq 125 ]
  # "-e=FOO=bar" is not docker's "-e FOO=bar": the value keeps its '=' and is refused, not misread.
  run "$GANTRY" run -e=FOO=bar "$REG/$GANTRY_TEST_IMAGE_TINY" true
  [ "$status" -eq 125 ]
  [ "$output" = "gantry: run: --env '=FOO=bar': no variable name before '='" ]
  run "$GANTRY" run -e
  [ "$status" -eq 125 ]
  [ "$output" = "gantry: run: --env needs a value (see gantry run --help)" ]
  run "$GANTRY" exec --bogus x
  [ "$status" -eq 125 ]
  [ "$output" = "gantry: exec: unknown option '--bogus' (see gantry exec --help)" ]
  run "$GANTRY" ps --bogus
  [ "$status" -eq 125 ]
  [ "$output" = "gantry: ps: unknown option '--bogus' (see gantry ps --help)" ]
  run "$GANTRY" ps extra
  [ "$status" -eq 125 ]
}

@test "run: every word after IMAGE is the command's (--help, -e, -x, --); -- before IMAGE is dropped" {
  img=$REG/$GANTRY_TEST_IMAGE_TINY
  run as_user "$GANTRY" run --store "$STORE" "$img" sh -c 'echo -x'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "-x" ]
  # gantry's own option names after IMAGE reach the command untouched.
  run --separate-stderr as_user "$GANTRY" run --store "$STORE" "$img" sh -c 'echo "$*"' sh --help -e X=1 -w /x -- -d
  echo "$output / $stderr"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "--help -e X=1 -w /x -- -d" ]
  # `ls --help` is ls's help (busybox's), not gantry's.
  run --separate-stderr as_user "$GANTRY" run --store "$STORE" "$img" ls --help
  echo "$output / $stderr"
  [[ "$output$stderr" != *"usage: gantry"* ]]
  [[ "$output$stderr" == *"ls"* ]]
  # A -- right after IMAGE, or before it, is not part of the command.
  run as_user "$GANTRY" run --store "$STORE" "$img" -- sh -c 'echo after'
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "after" ]
  run as_user "$GANTRY" run --store "$STORE" -e V=before -- "$img" sh -c 'echo "$V"'
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "before" ]
  # Options given twice: the last wins, as with docker.
  run as_user "$GANTRY" run --store "$STORE" -w /tmp -w / "$img" sh -c pwd
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "/" ]
}

@test "run -e NAME=VALUE sets the value, -e NAME passes the host's, --env the same, repeatable" {
  run as_user "$GANTRY" run --store "$STORE" -e FOO=bar "$REG/$GANTRY_TEST_IMAGE_TINY" \
    sh -c 'echo "$FOO"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "bar" ]
  run as_user env GANTRY_CLI_HOSTVAR=from-host "$GANTRY" run --store "$STORE" -e GANTRY_CLI_HOSTVAR \
    "$REG/$GANTRY_TEST_IMAGE_TINY" sh -c 'echo "$GANTRY_CLI_HOSTVAR"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "from-host" ]
  # Repeatable, mixed, --env=, a value with commas and '=', over the image's own GANTRY_TINY=1.
  run as_user env HOSTONE=1 "$GANTRY" run --store "$STORE" -e A=x,y=z --env B=2 --env=GANTRY_TINY=over \
    -e HOSTONE "$REG/$GANTRY_TEST_IMAGE_TINY" sh -c 'echo "$A|$B|$GANTRY_TINY|$HOSTONE"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "x,y=z|2|over|1" ]
  # Without -e the image's value stays and the caller's variables stay outside.
  run as_user env FOO=outside "$GANTRY" run --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY" \
    sh -c 'echo "${FOO:-unset}|$GANTRY_TINY"'
  [ "${lines[-1]}" = "unset|1" ]
}

@test "exec -e NAME=VALUE, and ps prints a header" {
  run as_user "$GANTRY" run --store "$STORE" --name cli-bats --detach -e FROMRUN=r "$REG/$GANTRY_TEST_IMAGE_TINY"
  echo "$output"
  [ "$status" -eq 0 ]
  run as_user "$GANTRY" exec -e FROMEXEC=e cli-bats sh -c 'echo "$FROMRUN|$FROMEXEC"'
  echo "$output"
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = "r|e" ]
  run as_user "$GANTRY" ps
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(printf '%s' "${lines[0]}" | tr '\t' ' ')" = "NAME PID BACKEND" ]
  printf '%s\n' "${lines[@]:1}" | grep -q "^cli-bats	[0-9]"
  run as_user "$GANTRY" stop cli-bats
  [ "$status" -eq 0 ]
  # An empty list still has its header.
  run as_user "$GANTRY" ps
  [ "$output" = "$(printf 'NAME\tPID\tBACKEND')" ]
}

@test "images -q lists exactly the digests; --format json parses; --digests keeps the columns aligned" {
  STORE=$T/root-store  # root's own: root does not act in the test user's store
  "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_TINY"
  "$GANTRY" pull --quiet --store "$STORE" "$REG/$GANTRY_TEST_IMAGE_ZSTD"
  run --separate-stderr "$GANTRY" images --store "$STORE" -q
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(printf '%s\n' "${lines[@]}" | sort)" = "$(printf '%s\n' "$GANTRY_TEST_DIGEST_TINY" "$GANTRY_TEST_DIGEST_ZSTD" | sort)" ]
  run --separate-stderr "$GANTRY" images --store "$STORE" --quiet
  [ "${#lines[@]}" -eq 2 ]

  run --separate-stderr "$GANTRY" images --store "$STORE" --format json
  echo "$output"
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | jq length)" -eq 2 ]
  echo "$output" | jq -e --arg d "$GANTRY_TEST_DIGEST_TINY" \
    '[.[] | select(.digest == $d) | .references[] | select(contains("gantry-test/tiny"))] | length >= 1'
  echo "$output" | jq -e --arg d "$GANTRY_TEST_DIGEST_TINY" \
    '.[] | select(.digest == $d) | (.size > 0) and (.pulled_at | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$")) and (has("last_used"))'
  # An empty store: an empty array, not nothing.
  "$GANTRY" pull --quiet --store "$T/empty" "$REG/$GANTRY_TEST_IMAGE_TINY" >/dev/null
  "$GANTRY" rm --store "$T/empty" "$GANTRY_TEST_DIGEST_TINY" >/dev/null
  run --separate-stderr "$GANTRY" images --store "$T/empty" --format json
  [ "$(echo "$output" | jq -c .)" = "[]" ]

  # Table: every line's SIZE column ends at the same offset, with and without --digests.
  for opt in "" --digests; do
    run --separate-stderr "$GANTRY" images --store "$STORE" $opt
    echo "$output"
    [ "$status" -eq 0 ]
    [ "${#lines[@]}" -eq 3 ]
    [[ "${lines[0]}" == REFERENCE* ]]
    start=$(echo "${lines[0]}" | awk '{print index($0, "DIGEST")}')
    for l in "${lines[@]:1}"; do
      [ "$(echo "$l" | awk -v s="$start" '{print substr($0, s, 7)}')" = "sha256:" ]
    done
  done
  echo "$output" | grep -qF "$GANTRY_TEST_DIGEST_TINY"
  # The header's LAST USED starts where each row's date does.
  used=$(echo "${lines[0]}" | awk '{print index($0, "LAST USED")}')
  for l in "${lines[@]:1}"; do
    [[ "${l:$((used - 1)):1}" =~ [0-9-] ]]
  done
}

# complete [--bash-completion] WORD...: what the completion offers for the last WORD (the word under the
# cursor) after `gantry` WORD..., one per line, as bash calls _gantry on TAB; with --bash-completion,
# through bash-completion's word splitting (keeps "registry:port/image:tag" whole).
complete() {
  local with=''
  if [ "$1" = --bash-completion ]; then with=/usr/share/bash-completion/bash_completion; shift; fi
  bash -c '
    [ -z "$1" ] || source "$1"
    source "$2"; shift 2
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    _gantry gantry "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    printf "%s\n" "${COMPREPLY[@]}"' _ "$with" "$GANTRY_SOURCE_DIR/packaging/completion/gantry" "$GANTRY" "$@"
}

@test "bash completion: verbs, each verb's options and their values, stored images, not after IMAGE" {
  run complete ru
  [ "$output" = "run" ]
  run complete ''
  echo "$output"
  for verb in run pull import export images inspect rm gc exec stop ps doctor help version; do
    echo "$output" | grep -qx "$verb" || { echo "no $verb"; return 1; }
  done
  ! echo "$output" | grep -q __complete || false
  run complete run --wo
  [ "$output" = "--workdir" ]
  run complete run --re
  echo "$output" | grep -qx -- --readonly
  echo "$output" | grep -qx -- --remap-root
  run complete run --pull ''
  [ "$(echo "$output" | sort | tr '\n' ' ')" = "always missing never " ]
  run complete images --format j
  [ "$output" = "json" ]
  run complete export -
  echo "$output" | grep -qx -- --output
  echo "$output" | grep -qx -- -f
  # A verb's completion lists only options that verb has: exec has no --mount.
  run complete exec --m
  [ -z "$output" ]

  # Stored images, from the store --store names, for the verbs that take one.
  S=$T/root-store
  "$GANTRY" pull --quiet --store "$S" "$REG/$GANTRY_TEST_IMAGE_TINY" >/dev/null
  ref=$("$GANTRY" images --store "$S" --format json | jq -r '.[0].references[0]')
  [ -n "$ref" ]
  for verb in run export rm inspect; do
    run complete "$verb" --store "$S" ''
    echo "$verb: $output"
    [ "$output" = "$ref" ]
  done
  run complete export --store="$S" "${ref:0:3}"
  [ "$output" = "$ref" ]
  # After IMAGE the words are the command's: no gantry options, no images.
  run complete run --store "$S" "$ref" --
  [ -z "$output" ]
  run complete run --store "$S" "$ref" ''
  ! echo "$output" | grep -qxF "$ref" || false
  # With bash-completion loaded, as on a user's shell: the same words.
  if [ -f /usr/share/bash-completion/bash_completion ]; then
    run complete --bash-completion run --wo
    [ "$output" = "--workdir" ]
    run complete --bash-completion export --store "$S" ''
    [ "$output" = "$ref" ]
  fi
}
