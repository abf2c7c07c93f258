#!/usr/bin/env python3
"""Loopback stand-ins for the AWS credential endpoints, for tests/integration/auth.bats (test code only):

- EC2 instance metadata, IMDSv2 only: PUT /latest/api/token (needs X-aws-ec2-metadata-token-ttl-seconds)
  gives a session token; GET /latest/meta-data/iam/security-credentials/[ROLE] needs it (401 without),
  and serves the role name, then its credentials;
- the container credentials endpoint: GET --container-path, with Authorization equal to --container-token;
- STS AssumeRoleWithWebIdentity: POST / (form) with WebIdentityToken equal to --web-identity-token.

--header-bytes N pads the container endpoint's answers to exactly N bytes of headers.

All of them hand out the same --access-key/--secret-key/--session-token. Each request is appended to --log
as "<kind> <status>", so tests can tell which source was used and that IMDSv1 (no token) was never tried.
"""
import argparse
import http.server
import json
import secrets
import sys
import time
import urllib.parse

from loopback import Server, pad_headers, serve

ROLE = "gantry-test-role"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def record(self, kind, status):
        with open(self.server.opts.log, "a") as f:
            f.write("%s %d\n" % (kind, status))

    def send(self, kind, status, body, content_type="text/plain"):
        self.record(kind, status)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if kind == "container" and self.server.opts.header_bytes:
            pad_headers(self, self.server.opts.header_bytes)
        self.end_headers()
        self.wfile.write(data)

    def creds_json(self, with_code):
        o = self.server.opts
        d = {"AccessKeyId": o.access_key, "SecretAccessKey": o.secret_key, "Token": o.session_token,
             "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))}
        if with_code:
            d.update({"Code": "Success", "Type": "AWS-HMAC"})
        return json.dumps(d)

    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.send("imds-token", 400, "bad token request")
        tok = secrets.token_urlsafe(24)
        self.server.tokens.add(tok)
        return self.send("imds-token", 200, tok)

    def do_GET(self):
        o = self.server.opts
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path.startswith(base):
            if self.headers.get("X-aws-ec2-metadata-token") not in self.server.tokens:
                return self.send("imds-v1", 401, "")
            if self.path == base:
                return self.send("imds-role", 200, ROLE)
            if self.path == base + ROLE:
                return self.send("imds-creds", 200, self.creds_json(True), "application/json")
            return self.send("imds-creds", 404, "")
        if o.container_path and self.path == o.container_path:
            if self.headers.get("Authorization") != o.container_token:
                return self.send("container", 403, "")
            return self.send("container", 200, self.creds_json(False), "application/json")
        return self.send("unknown", 404, "")

    def do_POST(self):
        o = self.server.opts
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0)).decode()
        form = urllib.parse.parse_qs(body)
        if form.get("Action") != ["AssumeRoleWithWebIdentity"]:
            return self.send("sts", 400, "<ErrorResponse><Error><Message>unknown action</Message></Error></ErrorResponse>")
        if form.get("WebIdentityToken") != [o.web_identity_token] or not form.get("RoleArn"):
            return self.send("sts", 403, "<ErrorResponse><Error><Code>AccessDenied</Code>"
                             "<Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>")
        exp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        xml = ("<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
               "<AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey><SessionToken>%s</SessionToken>"
               "<Expiration>%s</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
               "</AssumeRoleWithWebIdentityResponse>" % (o.access_key, o.secret_key, o.session_token, exp))
        return self.send("sts", 200, xml, "text/xml")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--session-token", required=True)
    p.add_argument("--container-path", default="")
    p.add_argument("--container-token", default="")
    p.add_argument("--web-identity-token", default="")
    # The container endpoint's answers carry exactly this many bytes of headers (X-Pad lines added).
    p.add_argument("--header-bytes", type=int, default=0)
    opts = p.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.opts = opts
    srv.tokens = set()
    open(opts.log, "a").close()
    serve(srv, opts.port_file)


if __name__ == "__main__":
    sys.exit(main())
