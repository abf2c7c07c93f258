#!/usr/bin/env python3
"""A stand-in for the Amazon ECR API on loopback, for tests/integration/auth.bats (test code only).

Answers GetAuthorizationToken after CHECKING the request's AWS Signature Version 4 with botocore's
signer (Debian's python3-botocore): the access key must be one given with --key, the credential scope
must name --region and service "ecr", the X-Amz-Date must be within 5 minutes of this endpoint's clock
(shifted by --clock-offset to provoke the clock-skew path), and the signature over the headers the
client listed in SignedHeaders must match. The token it returns is base64("AWS:" + the harness TLS
registry's password), so the htpasswd registry accepts it. Every request is appended to --log; every
token handed out increments the number in --count-file.

With --tls-cert/--tls-key it is also an HTTPS proxy that terminates CONNECT tunnels itself, so that an
unmodified client (docker-credential-ecr-login) that believes it talks to
https://api.ecr.<region>.amazonaws.com through HTTPS_PROXY reaches this endpoint; the client must trust
the test CA that signed --tls-cert (AWS_CA_BUNDLE).
"""
import argparse
import base64
import datetime
import fcntl
import hmac
import http.server
import json
import os
import re
import socketserver
import ssl
import sys
import threading
import time

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                     r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$")


def bump(path):
    """Adds one to the number in `path` under an exclusive lock (several endpoint threads)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        f.seek(0)
        f.truncate()
        f.write(str(int(text or "0") + 1) + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ecr-endpoint-test"

    def log_message(self, fmt, *args):
        with open(self.server.opts.log, "a") as f:
            f.write("%s %s\n" % (time.strftime("%H:%M:%S"), fmt % args))

    def now(self):
        return datetime.datetime.utcnow() + datetime.timedelta(seconds=self.server.opts.clock_offset)

    def reply(self, code, obj, content_type="application/x-amz-json-1.1"):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Date", self.now().strftime("%a, %d %b %Y %H:%M:%S GMT"))
        self.end_headers()
        self.wfile.write(body)

    def error(self, code, kind, message):
        self.log_message("refused: %s: %s", kind, message)
        self.reply(code, {"__type": kind, "message": message})

    def do_CONNECT(self):
        opts = self.server.opts
        if not opts.tls_cert:
            self.send_error(405)
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
        conn = ctx.wrap_socket(self.connection, server_side=True)
        self.connection = conn
        self.rfile = conn.makefile("rb", -1)
        self.wfile = socketserver._SocketWriter(conn)
        self.close_connection = False  # BaseHTTPRequestHandler.handle goes on reading requests in the tunnel

    def do_POST(self):
        opts = self.server.opts
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else b""
        target = self.headers.get("X-Amz-Target", "")
        if target != "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken":
            return self.error(400, "UnknownOperationException", "unexpected X-Amz-Target %r" % target)
        m = AUTH_RE.match(self.headers.get("Authorization", ""))
        if not m:
            return self.error(403, "MissingAuthenticationTokenException", "no SigV4 Authorization header")
        akid, date, region, service, signed_headers, signature = m.groups()
        if akid not in opts.keys:
            return self.error(403, "UnrecognizedClientException", "The security token included in the request is invalid.")
        if region != opts.region or service != "ecr":
            return self.error(403, "InvalidSignatureException", "Credential should be scoped to a valid region/service")
        amz_date = self.headers.get("X-Amz-Date", "")
        try:
            when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ")
        except ValueError:
            return self.error(400, "IncompleteSignatureException", "bad X-Amz-Date")
        now = self.now()
        if abs((now - when).total_seconds()) > 300:
            return self.error(403, "InvalidSignatureException",
                              "Signature expired: %s is now earlier than %s (%s - 5 min.)" % (
                                  amz_date, (now - datetime.timedelta(minutes=5)).strftime("%Y%m%dT%H%M%SZ"),
                                  now.strftime("%Y%m%dT%H%M%SZ")))
        # Rebuild the request with exactly the headers the client signed, then let botocore sign it.
        names = signed_headers.split(";")
        headers = {}
        for n in names:
            v = self.headers.get(n)
            if v is None:
                return self.error(403, "InvalidSignatureException", "signed header %s missing" % n)
            headers[n] = v
        token = headers.get("x-amz-security-token")
        if opts.session_token and token != opts.session_token:
            return self.error(403, "UnrecognizedClientException", "The security token included in the request is invalid.")
        req = AWSRequest(method="POST", url="http://%s%s" % (self.headers.get("Host"), self.path), data=body,
                         headers=headers)
        signer = SigV4Auth(Credentials(akid, opts.keys[akid], token), "ecr", region)
        req.context["timestamp"] = amz_date
        canonical = signer.canonical_request(req)
        expected = signer.signature(signer.string_to_sign(req, canonical), req)
        if not hmac.compare_digest(expected, signature):
            self.log_message("canonical request botocore computed:\n%s", canonical)
            return self.error(403, "InvalidSignatureException",
                              "The request signature we calculated does not match the signature you provided.")
        bump(opts.count_file)
        self.log_message("token for %s (signature verified by botocore, signed headers %s)", akid, signed_headers)
        token_text = base64.b64encode(("AWS:" + opts.password).encode()).decode()
        self.reply(200, {"authorizationData": [{
            "authorizationToken": token_text,
            "expiresAt": time.time() + opts.lifetime,
            "proxyEndpoint": "https://%s.dkr.ecr.%s.amazonaws.com" % (opts.account, region)}]})


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--count-file", required=True)
    p.add_argument("--key", action="append", default=[], help="ACCESS_KEY_ID:SECRET (repeatable)")
    p.add_argument("--session-token", default="", help="when set, requests must carry this X-Amz-Security-Token")
    p.add_argument("--password-file", required=True, help="the registry password the token must carry")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--account", default="123456789012")
    p.add_argument("--lifetime", type=float, default=43200)
    p.add_argument("--clock-offset", type=float, default=0)
    p.add_argument("--tls-cert", default="")
    p.add_argument("--tls-key", default="")
    opts = p.parse_args()
    opts.keys = dict(k.split(":", 1) for k in opts.key)
    with open(opts.password_file) as f:
        opts.password = f.read().strip()
    open(opts.count_file, "w").write("0\n")
    srv = Server(("127.0.0.1", 0), Handler)
    srv.opts = opts
    tmp = opts.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, opts.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
