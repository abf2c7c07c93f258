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
import http.server
import sys
import time
import urllib.parse

from loopback import Refused, Server, bump, check_sigv4, serve

# How STS names each refusal of the SigV4 check (loopback.check_sigv4).
STS_ERRORS = {"missing": "MissingAuthenticationToken", "key": "InvalidClientTokenId", "scope": "SignatureDoesNotMatch",
              "date": "IncompleteSignature", "expired": "SignatureDoesNotMatch", "header": "SignatureDoesNotMatch",
              "token": "InvalidClientTokenId", "signature": "SignatureDoesNotMatch"}


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
        try:
            _akid, signed_headers = check_sigv4(self, body, o.keys, o.region, "sts", o.source_session_token)
        except Refused as r:
            return self.refuse(r.status, STS_ERRORS[r.reason], r.message)
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
    serve(srv, opts.port_file)


if __name__ == "__main__":
    sys.exit(main())
