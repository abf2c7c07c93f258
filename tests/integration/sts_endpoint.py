#!/usr/bin/env python3
"""A stand-in for AWS STS AssumeRole on loopback, for tests/integration/auth.bats (test code only).

Answers Action=AssumeRole (POST form body, or GET query) after CHECKING the request's AWS Signature
Version 4 with botocore's signer, as tests/integration/ecr_endpoint.py does for ECR: the access key must
be one given with --key (and, with --source-session-token, carry that X-Amz-Security-Token), the scope
must name --region and service "sts", X-Amz-Date must be within 5 minutes, and the signature over the
headers the client listed must match. RoleArn must be --role-arn. The answer is the XML STS returns,
with the temporary credentials --access-key/--secret-key/--session-token valid for --lifetime seconds.
Each request is appended to --log ("assume-role <status> <RoleArn> <RoleSessionName>", or the reason
for a refusal; never a secret); each credential handed out increments the number in --count-file.
"""
import argparse
import datetime
import fcntl
import hmac
import http.server
import os
import re
import socketserver
import sys
import time
import urllib.parse

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                     r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$")


def bump(path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or "0")
        f.seek(0)
        f.truncate()
        f.write("%d\n" % (n + 1))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def record(self, line):
        with open(self.server.opts.log, "a") as f:
            f.write(line + "\n")

    def reply(self, status, xml):
        body = xml.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def refuse(self, status, code, message):
        self.record("refused %d %s: %s" % (status, code, message))
        self.reply(status, "<ErrorResponse><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error>"
                           "</ErrorResponse>" % (code, message))

    def do_GET(self):
        self.handle_request(b"")

    def do_POST(self):
        self.handle_request(self.rfile.read(int(self.headers.get("Content-Length", "0") or 0)))

    def handle_request(self, body):
        o = self.server.opts
        url = urllib.parse.urlsplit(self.path)
        params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        if self.command == "POST":
            params.update({k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()})
        if params.get("Action") != "AssumeRole":
            return self.refuse(400, "InvalidAction", "unexpected Action %r" % params.get("Action"))
        m = AUTH_RE.match(self.headers.get("Authorization", ""))
        if not m:
            return self.refuse(403, "MissingAuthenticationToken", "no SigV4 Authorization header")
        akid, _date, region, service, signed_headers, signature = m.groups()
        if akid not in o.keys:
            return self.refuse(403, "InvalidClientTokenId", "The security token included in the request is invalid.")
        if region != o.region or service != "sts":
            return self.refuse(403, "SignatureDoesNotMatch", "Credential should be scoped to a valid region/service")
        amz_date = self.headers.get("X-Amz-Date", "")
        try:
            when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ")
        except ValueError:
            return self.refuse(400, "IncompleteSignature", "bad X-Amz-Date")
        if abs((datetime.datetime.utcnow() - when).total_seconds()) > 300:
            return self.refuse(403, "SignatureDoesNotMatch", "Signature expired: %s" % amz_date)
        headers = {}
        for n in signed_headers.split(";"):
            v = self.headers.get(n)
            if v is None:
                return self.refuse(403, "SignatureDoesNotMatch", "signed header %s missing" % n)
            headers[n] = v
        token = headers.get("x-amz-security-token")
        if o.source_session_token and token != o.source_session_token:
            return self.refuse(403, "InvalidClientTokenId", "The security token included in the request is invalid.")
        req = AWSRequest(method=self.command, url="http://%s%s" % (self.headers.get("Host"), self.path), data=body,
                         headers=headers)
        signer = SigV4Auth(Credentials(akid, o.keys[akid], token), "sts", region)
        req.context["timestamp"] = amz_date
        expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
        if not hmac.compare_digest(expected, signature):
            return self.refuse(403, "SignatureDoesNotMatch",
                               "The request signature we calculated does not match the signature you provided.")
        if params.get("RoleArn") != o.role_arn:
            return self.refuse(403, "AccessDenied", "not authorized to perform sts:AssumeRole on %s" %
                               params.get("RoleArn"))
        session = params.get("RoleSessionName", "")
        if not session:
            return self.refuse(400, "ValidationError", "RoleSessionName missing")
        bump(o.count_file)
        self.record("assume-role 200 %s %s (signature verified by botocore, signed headers %s)" % (
            params["RoleArn"], session, signed_headers))
        exp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + o.lifetime))
        self.reply(200, "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleResult>"
                        "<AssumedRoleUser><Arn>%s/%s</Arn><AssumedRoleId>AROA:%s</AssumedRoleId></AssumedRoleUser>"
                        "<Credentials><AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>"
                        "<SessionToken>%s</SessionToken><Expiration>%s</Expiration></Credentials>"
                        "</AssumeRoleResult></AssumeRoleResponse>" % (
                            o.role_arn, session, session, o.access_key, o.secret_key, o.session_token, exp))


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--count-file", required=True)
    p.add_argument("--key", action="append", default=[], help="source ACCESS_KEY_ID:SECRET (repeatable)")
    p.add_argument("--source-session-token", default="")
    p.add_argument("--role-arn", required=True)
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--session-token", required=True)
    p.add_argument("--lifetime", type=int, default=3600)
    opts = p.parse_args()
    opts.keys = dict(k.split(":", 1) for k in opts.key)
    open(opts.count_file, "w").write("0\n")
    open(opts.log, "a").close()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.opts = opts
    tmp = opts.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, opts.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
