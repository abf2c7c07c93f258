# fixtures: registry images slurm
# Credentials through the SPANK plugin (issue 6): the pull that slurmstepd starts on a node must find
# the job user's credentials -- ~/.docker/config.json and the credential helper it names, run as that
# user -- and must not read anything with root's rights. The registry is a TLS + htpasswd one the
# nodes can reach: the harness's TLS registry storage and htpasswd (user AWS, its ECR-length password)
# served on the bridge (GANTRY_TEST_LOGIN_ADDR:PORT) with a certificate from the harness CA for that address.

load helpers

setup() {
  gantry_load_env registry images slurm
  U=$GANTRY_TEST_USER
  WORK=$(mktemp -d "$GANTRY_TEST_FSX/auth-test.XXXXXX")
  chown "$U" "$WORK"
  REG_PID=
}

teardown() {
  [ -z "$REG_PID" ] || { kill "$REG_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}

# as_user CMD...: run as the test user from the shared directory, with a home of this test's own there
# (every node sees it), so that nothing is left in the account's real home.
as_user() {
  # The test harness's own secrets are not part of the job's environment (the job exports everything
  # it has into the container, as Pyxis does).
  runuser -u "$U" -- env -u GANTRY_TEST_REGISTRY_PASSWORD -C "$WORK" HOME="$WORK/home" "$@"
}

# node_registry: the test's own TLS registry the nodes reach (gantry_node_tls_registry; TREG, REG_PID)
# and the plugin's configuration for it.
node_registry() {
  gantry_node_tls_registry "$WORK/registry" gantry-auth-slurm || return 1
  # The plugin's gantry.conf: a store of this test's own (an image already in the shared store would
  # need no credentials) and the harness CA for the registry's certificate.
  mkdir -p "$WORK/store" && chmod 1777 "$WORK/store"
  printf 'store_path = %s\nca_bundle = %s\n' "$WORK/store" "$GANTRY_TEST_REGISTRY_CA" >"$GANTRY_HARNESS_DIR/gantry.conf"
}

@test "srun: the job user's ~/.docker/config.json and credential helper authenticate the node's pull; root's rights are not used" {
  node_registry
  # 1. Valid credentials in a config only root can read, named by the job's DOCKER_CONFIG: a pull that
  #    read with slurmstepd's (root's) rights would succeed; the user's own lookup finds nothing.
  mkdir -m 700 "$WORK/rootonly"
  printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$TREG" \
    "$(printf '%s:%s' "$GANTRY_TEST_REGISTRY_USER" "$GANTRY_TEST_REGISTRY_PASSWORD" | base64 -w0)" >"$WORK/rootonly/config.json"
  chmod 600 "$WORK/rootonly/config.json"
  run as_user timeout 120 env DOCKER_CONFIG="$WORK/rootonly" srun -n1 --container-image="$TREG#gantry-test/tiny" true
  echo "$output"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
  echo "$output" | grep -q "gantry: failed to import docker image"
  echo "$output" | grep -q "no credentials found for $TREG"
  ! echo "$output" | grep -qF "${GANTRY_TEST_REGISTRY_PASSWORD:0:40}" || false

  # 2. The user's ~/.docker/config.json names a credential helper for this registry; the helper, run
  #    on the node by the pull, records who ran it and answers with the registry's credentials.
  mkdir -p "$WORK/home/.docker" "$WORK/bin"
  printf '{"credHelpers":{"%s":"gantrywho"}}\n' "$TREG" >"$WORK/home/.docker/config.json"
  cp "$GANTRY_TEST_REGISTRY_PASSWORD_FILE" "$WORK/home/secret"
  cat >"$WORK/bin/docker-credential-gantrywho" <<EOF
#!/bin/sh
# Test credential helper (Docker's protocol): "get", the server on stdin, JSON on stdout.
[ "\$1" = get ] || exit 2
read -r server
echo "\$(id -u) \$(hostname) \$server" >>"$WORK/helper.log"
printf '{"ServerURL":"%s","Username":"%s","Secret":"%s"}\n' "\$server" "$GANTRY_TEST_REGISTRY_USER" "\$(cat "$WORK/home/secret")"
EOF
  chmod 755 "$WORK/bin/docker-credential-gantrywho"
  chmod 600 "$WORK/home/secret"
  chown -R "$U" "$WORK/home" "$WORK/bin"
  run as_user timeout 120 env PATH="$WORK/bin:$PATH" srun -n1 --container-image="$TREG#gantry-test/tiny" \
    sh -c 'cat /work/README; env'
  echo "$output"
  [ "$status" -eq 0 ]
  echo "$output" | grep -qx "tiny work dir"
  # The helper ran as the job user (not root), for this registry, on a compute node.
  cat "$WORK/helper.log"
  [ "$(awk '{ print $1 }' "$WORK/helper.log" | sort -u)" = "$(id -u "$U")" ]
  awk '{ print $3 }' "$WORK/helper.log" | grep -qx "$TREG"
  if [ "$GANTRY_TEST_MODE" = multi ]; then awk '{ print $2 }' "$WORK/helper.log" | grep -q "^${GANTRY_SLURM_NODE_PREFIX:-gnode}"; fi
  # The registry saw authenticated requests from the node; the secret reached neither the job's
  # environment nor its output.
  grep -q 'GET /v2/gantry-test/tiny/blobs/.*" 200 ' "$WORK/registry/registry.log" ||
    grep -q 'uri=/v2/gantry-test/tiny/blobs/' "$WORK/registry/registry.log"
  ! echo "$output" | grep -qF "${GANTRY_TEST_REGISTRY_PASSWORD:0:40}" || false
  ! echo "$output" | grep -q "^DOCKER_AUTH\|^GANTRY_.*TOKEN\|^REGISTRY_AUTH" || false
}
