#!/usr/bin/env python3
"""A Docker registry token server on loopback, for tests/integration/auth.bats (test code only).

It mints the JWTs that CNCF distribution's `auth: token:` mode accepts -- signed ES256 with --key, the
"kid" header being the libtrust key id of that key (what the registry derives from the certificate in
its rootcertbundle), iss = --issuer, aud = the requested service -- and speaks both halves of the
token protocol (distribution's docs/spec/auth/token.md and oauth.md):

- GET --path?service=S&scope=repository:NAME:ACTIONS with Basic credentials (docker login, skopeo):
  {"token", "access_token", "expires_in", "issued_at"}; anonymous GETs get a token granting nothing;
- POST --path, form grant_type=password (username, password; with access_type=offline also a
  refresh_token, which is what Docker stores as "identitytoken") or grant_type=refresh_token
  (refresh_token): {"access_token", "expires_in", "scope"[, "refresh_token"]}.

The one user is --user with the password in --password-file; its refresh token is --refresh-token.
Wrong credentials are answered 401. Every request is appended to --log as one line
"METHOD grant=G service=S scope=SC account=A status=N" (never a secret), so tests can count token
requests and check what was asked for. With --tls-cert/--tls-key it serves HTTPS.
"""
import argparse
import base64
import hashlib
import http.server
import json
import secrets
import ssl
import sys
import threading
import time
import urllib.parse

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from loopback import Server, serve


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jws_es256(claims, key, kid):
    """A compact JWS (RFC 7515) over `claims`, ES256: the signature is r || s, 32 bytes each."""
    header = {"typ": "JWT", "alg": "ES256", "kid": kid}
    signing_input = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


def libtrust_kid(public_key):
    """libtrust's key id: base32 of the first 240 bits of SHA-256 over the DER SubjectPublicKeyInfo,
    in 12 groups of 4 characters joined by ':' (the registry matches it against its trusted keys)."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    b32 = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode()
    return ":".join(b32[i:i + 4] for i in range(0, 48, 4))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def record(self, method, grant, service, scope, account, status):
        with self.server.log_lock, open(self.server.opts.log, "a") as f:
            f.write("%s grant=%s service=%s scope=%s account=%s status=%d\n" % (
                method, grant, service, scope or "-", account or "-", status))

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="gantry-token-server"')
        self.end_headers()
        self.wfile.write(body)

    def mint(self, service, scopes, account):
        """A JWT for `account` (None: anonymous, granted nothing) with the asked-for repository scopes."""
        o = self.server.opts
        access = []
        if account is not None:
            for scope in scopes:
                parts = scope.split(":")
                if len(parts) == 3 and parts[0] == "repository":
                    wanted = [a for a in parts[2].split(",") if a in ("pull", "push")]
                    access.append({"type": "repository", "name": parts[1], "actions": wanted})
        now = int(time.time())
        claims = {"iss": o.issuer, "sub": account or "", "aud": service, "iat": now, "nbf": now - 5,
                  "exp": now + o.lifetime, "jti": secrets.token_hex(8), "access": access}
        return jws_es256(claims, self.server.key, self.server.kid)

    def basic_account(self):
        """(account, ok): the Basic credentials' user if they are right; (None, True) when absent."""
        h = self.headers.get("Authorization", "")
        if not h.startswith("Basic "):
            return None, True
        try:
            user, _, password = base64.b64decode(h[6:]).decode().partition(":")
        except Exception:
            return None, False
        return user, user == self.server.opts.user and password == self.server.password

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        service = (q.get("service") or [""])[0]
        scopes = q.get("scope", [])
        if url.path != self.server.opts.path:
            return self.reply(404, {"error": "not found"})
        account, ok = self.basic_account()
        if not ok:
            self.record("GET", "basic", service, " ".join(scopes), account, 401)
            return self.reply(401, {"errors": [{"code": "UNAUTHORIZED", "message": "wrong credentials"}]})
        token = self.mint(service, scopes, account)
        self.record("GET", "basic" if account else "anonymous", service, " ".join(scopes), account, 200)
        self.reply(200, {"token": token, "access_token": token, "expires_in": self.server.opts.lifetime,
                         "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def do_POST(self):
        o = self.server.opts
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0)).decode()
        form = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
        grant, service, scope = form.get("grant_type", ""), form.get("service", ""), form.get("scope", "")
        if urllib.parse.urlsplit(self.path).path != o.path:
            return self.reply(404, {"error": "not found"})
        if not form.get("client_id"):
            self.record("POST", grant, service, scope, None, 400)
            return self.reply(400, {"error": "invalid_request", "error_description": "client_id missing"})
        if grant == "password":
            account = form.get("username")
            if account != o.user or form.get("password") != self.server.password:
                self.record("POST", grant, service, scope, account, 401)
                return self.reply(401, {"error": "invalid_grant"})
        elif grant == "refresh_token":
            account = o.user if form.get("refresh_token") == o.refresh_token else None
            if account is None:
                self.record("POST", grant, service, scope, None, 401)
                return self.reply(401, {"error": "invalid_grant"})
        else:
            self.record("POST", grant or "-", service, scope, None, 400)
            return self.reply(400, {"error": "unsupported_grant_type"})
        token = self.mint(service, scope.split(" ") if scope else [], account)
        answer = {"access_token": token, "expires_in": o.lifetime, "scope": scope}
        if grant == "password" and form.get("access_type") == "offline":
            answer["refresh_token"] = o.refresh_token
        self.record("POST", grant, service, scope, account, 200)
        self.reply(200, answer)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--key", required=True, help="PEM EC private key (P-256) that signs the tokens")
    p.add_argument("--issuer", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password-file", required=True)
    p.add_argument("--refresh-token", required=True)
    p.add_argument("--path", default="/token")
    p.add_argument("--lifetime", type=int, default=300)
    p.add_argument("--tls-cert", default="")
    p.add_argument("--tls-key", default="")
    opts = p.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.opts = opts
    srv.log_lock = threading.Lock()
    with open(opts.key, "rb") as f:
        srv.key = serialization.load_pem_private_key(f.read(), password=None)
    srv.kid = libtrust_kid(srv.key.public_key())
    with open(opts.password_file) as f:
        srv.password = f.read().strip()
    if opts.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    open(opts.log, "a").close()
    serve(srv, opts.port_file)


if __name__ == "__main__":
    sys.exit(main())
