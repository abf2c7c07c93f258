#!/usr/bin/env python3
"""Failure-injecting registry front for tests/integration/registry_client.bats.

A real registry cannot answer 429/500 on demand, redirect blob GETs to another host or cut a
download short, so this loopback HTTP server sits in front of the harness's open registry and
proxies to it, except where told to misbehave. Every request is logged, one line each, to --log:

  REQ <METHOD> <path> auth=<none|basic|bearer> range=<Range or ->     (the registry front)
  TOKEN auth=<none|basic>                                              (the token endpoint)
  STORAGE <path> auth=<present|absent> range=<Range or ->              (the redirect target)

Options:
  --upstream HOST:PORT    the registry to proxy to (plain HTTP)
  --port-file FILE        written with "<port> <storage-port>" once listening
  --require-token         demand a Bearer token from /token (WWW-Authenticate challenge) on /v2/
  --fail-status CODE      answer blob GETs with CODE ...
  --fail-count N          ... the first N times (default: always)
  --retry-after SECONDS   send Retry-After with the injected failures
  --redirect-blobs        answer blob GETs with 307 to a second listener on 127.0.0.2 (another host),
                          which refuses requests that carry Authorization, as S3 does
  --truncate-blobs N      cut the first N blob bodies over 64 KiB (layers, not configs) in half:
                          the full Content-Length is announced, then the connection closes
  --header-bytes N        pad every answer of the front with X-Pad headers to exactly N bytes of
                          headers (status line and blank line included)
"""

import argparse
import http.client
import http.server
import re
import sys
import threading

from loopback import pad_headers

BLOB = re.compile(r"^/v2/(.+)/blobs/(sha256:[0-9a-f]{64})$")
PASS_HEADERS = ("content-type", "content-length", "docker-content-digest", "content-range", "accept-ranges", "etag")


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.failures_left = args.fail_count
        self.truncations_left = args.truncate_blobs
        self.tokens = 0
        self.port = 0
        self.storage_port = 0

    def log(self, line):
        with self.lock:
            with open(self.args.log, "a") as f:
                f.write(line + "\n")

    def take(self, name):
        with self.lock:
            left = getattr(self, name)
            if left == 0:
                return False
            if left > 0:
                setattr(self, name, left - 1)
            return True


def auth_kind(headers):
    a = headers.get("Authorization", "")
    return a.split(" ", 1)[0].lower() if a else "none"


class Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):
        pass

    def end_headers(self):
        if self.state.args.header_bytes and isinstance(self, Front):
            pad_headers(self, self.state.args.header_bytes)
        super().end_headers()

    def reply(self, code, body=b"", headers=None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def proxy(self, path, truncate=False):
        up = http.client.HTTPConnection(self.state.args.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "range")}
        up.request(self.command, path, headers=headers)
        r = up.getresponse()
        body = r.read()
        if truncate and (len(body) <= 65536 or not self.state.take("truncations_left")):
            truncate = False
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() in PASS_HEADERS:
                self.send_header(k, v)
        if r.getheader("Content-Length") is None:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            if truncate:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)
        up.close()


class Front(Base):
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        st, a = self.state, self.state.args
        path = self.path.split("?", 1)[0]
        if path == "/token":
            st.tokens += 1
            st.log(f"TOKEN auth={auth_kind(self.headers)}")
            self.reply(200, b'{"token":"tok-%d","expires_in":300}' % st.tokens, {"Content-Type": "application/json"})
            return
        st.log(f"REQ {self.command} {path} auth={auth_kind(self.headers)} range={self.headers.get('Range', '-')}")
        m = BLOB.match(path)
        if a.require_token and path.startswith("/v2/"):
            if not self.headers.get("Authorization", "").startswith("Bearer tok-"):
                repo = m.group(1) if m else path.split("/")[2] if path.count("/") > 2 else ""
                challenge = (f'Bearer realm="http://127.0.0.1:{st.port}/token",service="fake-upstream",'
                             f'scope="repository:{repo}:pull"')
                self.reply(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}',
                           {"WWW-Authenticate": challenge, "Content-Type": "application/json"})
                return
        if m and self.command == "GET":
            if a.fail_status and st.take("failures_left"):
                h = {"Content-Type": "application/json"}
                if a.retry_after is not None:
                    h["Retry-After"] = str(a.retry_after)
                self.reply(a.fail_status, b'{"errors":[{"code":"INJECTED","message":"fake_upstream failure"}]}', h)
                return
            if a.redirect_blobs:
                loc = f"http://127.0.0.2:{st.storage_port}/storage{path}?X-Amz-Signature=not-a-secret"
                self.reply(307, b"", {"Location": loc})
                return
            if st.truncations_left != 0:
                self.proxy(path, truncate=True)
                return
        self.proxy(path)


class Storage(Base):
    def do_GET(self):
        st = self.state
        path = self.path.split("?", 1)[0]
        has_auth = "Authorization" in self.headers
        st.log(f"STORAGE {path} auth={'present' if has_auth else 'absent'} range={self.headers.get('Range', '-')}")
        if has_auth:
            # What S3 says to a pre-signed URL that also carries the registry's Authorization header.
            self.reply(400, b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed"
                            b"</Message></Error>", {"Content-Type": "application/xml"})
            return
        self.proxy(path[len("/storage"):])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--require-token", action="store_true")
    p.add_argument("--fail-status", type=int, default=0)
    p.add_argument("--fail-count", type=int, default=-1)
    p.add_argument("--retry-after", type=int)
    p.add_argument("--redirect-blobs", action="store_true")
    p.add_argument("--truncate-blobs", type=int, default=0)
    p.add_argument("--header-bytes", type=int, default=0)
    args = p.parse_args()
    state = State(args)
    Front.state = state
    Storage.state = state
    front = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
    storage = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Storage)
    state.port = front.server_address[1]
    state.storage_port = storage.server_address[1]
    threading.Thread(target=storage.serve_forever, daemon=True).start()
    with open(args.port_file + ".tmp", "w") as f:
        f.write(f"{state.port} {state.storage_port}\n")
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    try:
        front.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
