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
import http.server
import json
import socketserver
import ssl
import sys
import time

from loopback import Refused, Server, bump, check_sigv4, serve

# How ECR names each refusal of the SigV4 check (loopback.check_sigv4).
ECR_ERRORS = {"missing": "MissingAuthenticationTokenException", "key": "UnrecognizedClientException",
              "scope": "InvalidSignatureException", "date": "IncompleteSignatureException",
              "expired": "InvalidSignatureException", "header": "InvalidSignatureException",
              "token": "UnrecognizedClientException", "signature": "InvalidSignatureException"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ecr-endpoint-test"

    def log_message(self, fmt, *args):
        with open(self.server.opts.log, "a") as f:
            f.write("%s %s\n" % (time.strftime("%H:%M:%S"), fmt % args))

    def now(self):
        return datetime.datetime.utcnow() + datetime.timedelta(seconds=self.server.opts.clock_offset)

    def date_time_string(self, timestamp=None):
        # The one Date header send_response writes, on this endpoint's (possibly offset) clock, as AWS
        # sends exactly one.
        return self.now().strftime("%a, %d %b %Y %H:%M:%S GMT")

    def reply(self, code, obj, content_type="application/x-amz-json-1.1"):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
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
        try:
            akid, signed_headers = check_sigv4(self, body, opts.keys, opts.region, "ecr", opts.session_token, self.now())
        except Refused as r:
            if r.detail:
                self.log_message("%s", r.detail)
            return self.error(r.status, ECR_ERRORS[r.reason], r.message)
        region = opts.region
        bump(opts.count_file)
        self.log_message("token for %s (signature verified by botocore, signed headers %s)", akid, signed_headers)
        token_text = base64.b64encode(("AWS:" + opts.password).encode()).decode()
        self.reply(200, {"authorizationData": [{
            "authorizationToken": token_text,
            "expiresAt": time.time() + opts.lifetime,
            "proxyEndpoint": "https://%s.dkr.ecr.%s.amazonaws.com" % (opts.account, region)}]})


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
    serve(srv, opts.port_file)


if __name__ == "__main__":
    sys.exit(main())
