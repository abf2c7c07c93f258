# fixtures: registry images
# The registry harness and the test images, checked with curl only (no Gantry code): both registries
# serve every test image under the digest recorded in images.env, the TLS one only through the
# per-run CA and with the AWS token, the multiarch index has its two platforms, the blob-GET counter
# used by caching tests counts, and the umoci references show the layers' whiteouts applied.

load helpers

setup() {
  gantry_load_env registry images
}

@test "open HTTP registry serves tiny's manifest anonymously under the recorded digest" {
  code=$(gantry_fetch_manifest http gantry-test/tiny latest)
  [ "$code" = 200 ]
  [ "$(gantry_header content-type)" = application/vnd.oci.image.manifest.v1+json ]
  [ "$(gantry_sha256 "$BATS_TEST_TMPDIR/manifest.body")" = "$GANTRY_TEST_DIGEST_TINY" ]
  [ "$(gantry_header docker-content-digest)" = "$GANTRY_TEST_DIGEST_TINY" ]
}

@test "TLS registry serves tiny's manifest with the CA and AWS token under the recorded digest" {
  code=$(gantry_fetch_manifest tls gantry-test/tiny latest)
  [ "$code" = 200 ]
  [ "$(gantry_sha256 "$BATS_TEST_TMPDIR/manifest.body")" = "$GANTRY_TEST_DIGEST_TINY" ]
  # HTTP/2: header names arrive in lower case (gantry_fetch_manifest lower-cases them anyway).
  grep -q '^HTTP/2 200' "$BATS_TEST_TMPDIR/manifest.headers"
}

@test "TLS registry answers 401 with a Basic challenge without credentials" {
  run curl -sS --cacert "$GANTRY_TEST_REGISTRY_CA" -o "$BATS_TEST_TMPDIR/body" -D - \
    -H "Accept: $GANTRY_MANIFEST_ACCEPT" "https://$GANTRY_TEST_REGISTRY_TLS/v2/gantry-test/tiny/manifests/latest"
  [ "$status" -eq 0 ]
  [[ "$output" == "HTTP/2 401"* ]]
  echo "$output" | grep -qi '^www-authenticate: Basic realm="gantry-test"'
}

@test "TLS registry refuses a wrong token and a certificate check without the test CA" {
  first=${GANTRY_TEST_REGISTRY_PASSWORD:0:1}
  [ "$first" = A ] && other=B || other=A
  wrong="$other${GANTRY_TEST_REGISTRY_PASSWORD:1}"
  code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$GANTRY_TEST_REGISTRY_CA" -u "AWS:$wrong" \
    "https://$GANTRY_TEST_REGISTRY_TLS/v2/")
  [ "$code" = 401 ]
  run curl -sS -o /dev/null "https://$GANTRY_TEST_REGISTRY_TLS/v2/"
  [ "$status" -eq 60 ]   # curl: peer certificate cannot be authenticated with known CA certificates
}

@test "bcrypt reads only the first 72 bytes of the token (documented harness limitation)" {
  # htpasswd holds a hash of the token's first 72 bytes, so any tail is accepted.
  tail_changed="${GANTRY_TEST_REGISTRY_PASSWORD:0:72}tail-that-is-not-the-token"
  code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$GANTRY_TEST_REGISTRY_CA" \
    -u "AWS:$tail_changed" "https://$GANTRY_TEST_REGISTRY_TLS/v2/")
  [ "$code" = 200 ]
}

@test "the token is ECR-sized and the password file matches the env" {
  [ "${#GANTRY_TEST_REGISTRY_PASSWORD}" -ge 1900 ]
  [ "$(cat "$GANTRY_TEST_REGISTRY_PASSWORD_FILE")" = "$GANTRY_TEST_REGISTRY_PASSWORD" ]
  [ "$GANTRY_TEST_REGISTRY_USER" = AWS ]
}

@test "every test image has the same recorded digest on both registries" {
  [ -n "$GANTRY_TEST_IMAGES" ]
  for name in $GANTRY_TEST_IMAGES; do
    var=$(echo "$name" | tr 'a-z-' 'A-Z_')
    image_var=GANTRY_TEST_IMAGE_$var digest_var=GANTRY_TEST_DIGEST_$var
    repo=${!image_var%:*} tag=${!image_var##*:}
    for kind in http tls; do
      code=$(gantry_fetch_manifest "$kind" "$repo" "$tag")
      echo "$kind $repo:$tag -> $code" >&2
      [ "$code" = 200 ]
      [ "$(gantry_sha256 "$BATS_TEST_TMPDIR/manifest.body")" = "${!digest_var}" ]
    done
  done
}

@test "multiarch is an OCI index with amd64 and arm64 manifests" {
  code=$(gantry_fetch_manifest http gantry-test/multiarch latest)
  [ "$code" = 200 ]
  [ "$(gantry_header content-type)" = application/vnd.oci.image.index.v1+json ]
  body=$BATS_TEST_TMPDIR/manifest.body
  [ "$(jq '.manifests | length' "$body")" -eq 2 ]
  [ "$(jq -r '[.manifests[].platform | .os + "/" + .architecture] | sort | join(",")' "$body")" = linux/amd64,linux/arm64 ]
  [ "$(jq -r '.manifests[] | select(.platform.architecture == "arm64") | .digest' "$body")" = "$GANTRY_TEST_DIGEST_MULTIARCH_ARM64" ]
  # Each platform's manifest is fetchable by digest and its config names that architecture.
  for arch in amd64 arm64; do
    dvar=GANTRY_TEST_DIGEST_MULTIARCH_${arch^^}
    [ "$(gantry_fetch_manifest tls gantry-test/multiarch "${!dvar}")" = 200 ]
    config=$(jq -r .config.digest "$BATS_TEST_TMPDIR/manifest.body")
    gantry_curl tls "/v2/gantry-test/multiarch/blobs/$config" -o "$BATS_TEST_TMPDIR/config"
    [ "$(jq -r .architecture "$BATS_TEST_TMPDIR/config")" = "$arch" ]
  done
}

@test "registry 2.8 hides OCI manifests from a client that does not accept them" {
  # Why every client (ours included) must send the full Accept list; see docs/testing.md.
  code=$(curl -s -o "$BATS_TEST_TMPDIR/body" -w '%{http_code}' \
    -H "Accept: application/vnd.docker.distribution.manifest.v2+json" \
    "http://$GANTRY_TEST_REGISTRY_HTTP/v2/gantry-test/tiny/manifests/latest")
  [ "$code" = 404 ]
  grep -q MANIFEST_UNKNOWN "$BATS_TEST_TMPDIR/body"
}

@test "tiny-docker is a Docker schema2 manifest; zstd and layers carry zstd and gzip layers" {
  [ "$(gantry_fetch_manifest http gantry-test/tiny-docker latest)" = 200 ]
  [ "$(gantry_header content-type)" = application/vnd.docker.distribution.manifest.v2+json ]
  [ "$(jq -r '.layers[0].mediaType' "$BATS_TEST_TMPDIR/manifest.body")" = application/vnd.docker.image.rootfs.diff.tar.gzip ]
  [ "$(gantry_fetch_manifest http gantry-test/zstd latest)" = 200 ]
  jq -r '.layers[].mediaType' "$BATS_TEST_TMPDIR/manifest.body" | grep -qx 'application/vnd.oci.image.layer.v1.tar+zstd'
  [ "$(gantry_fetch_manifest http gantry-test/layers latest)" = 200 ]
  [ "$(jq '[.layers[] | select(.mediaType == "application/vnd.oci.image.layer.v1.tar+gzip")] | length' "$BATS_TEST_TMPDIR/manifest.body")" -ge 4 ]
}

@test "tiny's config has Env, WorkingDir, Entrypoint and Cmd" {
  [ "$(gantry_fetch_manifest http gantry-test/tiny latest)" = 200 ]
  config=$(jq -r .config.digest "$BATS_TEST_TMPDIR/manifest.body")
  gantry_curl http "/v2/gantry-test/tiny/blobs/$config" -o "$BATS_TEST_TMPDIR/config"
  [ "$(gantry_sha256 "$BATS_TEST_TMPDIR/config")" = "$config" ]
  jq -e '.config.Env | index("GANTRY_TINY=1")' "$BATS_TEST_TMPDIR/config"
  jq -e '.config.Env[] | select(startswith("PATH="))' "$BATS_TEST_TMPDIR/config"
  [ "$(jq -r .config.WorkingDir "$BATS_TEST_TMPDIR/config")" = /work ]
  [ "$(jq -r '.config.Entrypoint[0]' "$BATS_TEST_TMPDIR/config")" = /usr/local/bin/gantry-entrypoint ]
  [ "$(jq -r '.config.Cmd[0]' "$BATS_TEST_TMPDIR/config")" = /bin/sh ]
}

@test "blob GET counter goes up by one per GET, on both registries" {
  [ "$(gantry_fetch_manifest http gantry-test/tiny latest)" = 200 ]
  blob=$(jq -r '.layers[0].digest' "$BATS_TEST_TMPDIR/manifest.body")
  count=$BATS_TEST_DIRNAME/../harness/registry-log-count.sh
  for kind in http tls; do
    logvar=GANTRY_TEST_REGISTRY_${kind^^}_LOG
    before=$("$count" "${!logvar}" "$blob")
    all_before=$("$count" "${!logvar}" 'sha256:[0-9a-f]{64}')
    gantry_curl "$kind" "/v2/gantry-test/tiny/blobs/$blob" -o "$BATS_TEST_TMPDIR/blob"
    [ "$(gantry_sha256 "$BATS_TEST_TMPDIR/blob")" = "$blob" ]
    # A HEAD is not a GET and must not be counted.
    gantry_curl "$kind" "/v2/gantry-test/tiny/blobs/$blob" -I -o /dev/null
    # The access log line is written when the response completes; allow it a moment.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      after=$("$count" "${!logvar}" "$blob")
      [ "$after" -gt "$before" ] && break
      sleep 0.2
    done
    echo "$kind: $before -> $after" >&2
    [ "$after" -eq $((before + 1)) ]
    [ "$("$count" "${!logvar}" 'sha256:[0-9a-f]{64}')" -eq $((all_before + 1)) ]
  done
}

@test "references: umoci applied the layers image's whiteouts and kept its special files" {
  r=$GANTRY_TEST_REF_LAYERS/data
  [ -f "$r/keep.txt" ]
  [ ! -e "$r/delete-me.txt" ]
  [ ! -e "$r/whole-dir-gone" ]
  [ "$(ls -A "$r/opaque" | sort | tr '\n' ' ')" = "fresh new-file " ]
  [ -f "$r/dir-to-file" ] && [ -d "$r/file-to-dir" ]
  [ -f "$r/dir-to-file-clean" ] && [ -d "$r/file-to-dir-clean" ]
  [ "$(readlink "$r/symlink-escape-rel")" = ../../../../etc/passwd ]
  [ -p "$r/fifo" ] && [ -u "$r/setuid-file" ]
  [ "$r/hardlink-a" -ef "$r/hardlink-b" ]
  [ "$(stat -c %u:%g "$r/owned-1234")" = 1234:5678 ]
  [ -f "$GANTRY_TEST_REF_TINY/bin/busybox" ] && [ -d "$GANTRY_TEST_REF_TINY/work" ]
  [ "$(cat "$GANTRY_TEST_REF_MULTIARCH_AMD64/arch")" = amd64 ]
  [ "$(cat "$GANTRY_TEST_REF_MULTIARCH_ARM64/arch")" = arm64 ]
  grep -q 'VERSION_CODENAME=bookworm' "$GANTRY_TEST_REF_DEBIAN/etc/os-release"
  [ -f "$GANTRY_TEST_REF_ZSTD/zstd/marker" ]
}
