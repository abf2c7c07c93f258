"""What the loopback test endpoints (ecr_endpoint.py, sts_endpoint.py, imds_endpoint.py,
token_server.py) share: a threaded HTTP server that publishes its kernel-chosen port through a file,
a locked counter file, and the AWS Signature Version 4 check done with botocore's own signer, so that
our C++ signer is judged by an implementation we did not write. Test code only.
"""
import datetime
import fcntl
import hmac
import http.server
import os
import re
import socketserver

AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                     r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$")


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def serve(srv, port_file):
    """Writes the server's port to `port_file` (renamed in whole, so a waiting test never reads half
    a number), then serves until killed."""
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, port_file)
    srv.serve_forever()


def bump(path):
    """Adds one to the number in `path` under an exclusive lock (several endpoint threads)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        f.seek(0)
        f.truncate()
        f.write(str(int(text or "0") + 1) + "\n")


class Refused(Exception):
    """A request the SigV4 check refuses: `reason` is one of missing, key, scope, date, expired,
    header, token, signature (each endpoint names it the way its AWS service does)."""

    def __init__(self, status, reason, message, detail=""):
        super().__init__(message)
        self.status, self.reason, self.message, self.detail = status, reason, message, detail


def check_sigv4(handler, body, keys, region, service, session_token="", now=None):
    """Verifies the SigV4 Authorization of the request `handler` is answering. `keys` maps access key
    ids to secrets; a non-empty `session_token` must come as X-Amz-Security-Token. Returns the access
    key id, or raises Refused."""
    # Imported here: the endpoints that never check a signature need no botocore.
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    m = AUTH_RE.match(handler.headers.get("Authorization", ""))
    if not m:
        raise Refused(403, "missing", "no SigV4 Authorization header")
    akid, _date, scope_region, scope_service, signed_headers, signature = m.groups()
    if akid not in keys:
        raise Refused(403, "key", "The security token included in the request is invalid.")
    if scope_region != region or scope_service != service:
        raise Refused(403, "scope", "Credential should be scoped to a valid region/service")
    amz_date = handler.headers.get("X-Amz-Date", "")
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ")
    except ValueError:
        raise Refused(400, "date", "bad X-Amz-Date")
    now = now or datetime.datetime.utcnow()
    if abs((now - when).total_seconds()) > 300:
        raise Refused(403, "expired", "Signature expired: %s is now earlier than %s (%s - 5 min.)" % (
            amz_date, (now - datetime.timedelta(minutes=5)).strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%dT%H%M%SZ")))
    # Rebuild the request with exactly the headers the client signed, then let botocore sign it.
    headers = {}
    for name in signed_headers.split(";"):
        value = handler.headers.get(name)
        if value is None:
            raise Refused(403, "header", "signed header %s missing" % name)
        headers[name] = value
    token = headers.get("x-amz-security-token")
    if session_token and token != session_token:
        raise Refused(403, "token", "The security token included in the request is invalid.")
    req = AWSRequest(method=handler.command, url="http://%s%s" % (handler.headers.get("Host"), handler.path),
                     data=body, headers=headers)
    signer = SigV4Auth(Credentials(akid, keys[akid], token), service, region)
    req.context["timestamp"] = amz_date
    canonical = signer.canonical_request(req)
    expected = signer.signature(signer.string_to_sign(req, canonical), req)
    if not hmac.compare_digest(expected, signature):
        raise Refused(403, "signature", "The request signature we calculated does not match the signature you provided.",
                      "canonical request botocore computed:\n" + canonical)
    return akid, signed_headers


def pad_headers(handler, total):
    """Adds X-Pad-NNNNN header lines so that the answer's whole header block -- status line, every
    header line and the blank line that ends them, as sent -- comes to exactly `total` bytes. Call it
    after the answer's last send_header and before end_headers (it reads what BaseHTTPRequestHandler
    has buffered so far). Lines stay under 8 KiB: the limit under test is the block's, not a line's."""
    left = total - sum(len(b) for b in handler._headers_buffer) - 2  # 2: the blank line
    overhead = len("X-Pad-00000: \r\n")
    if left < overhead + 1:
        raise ValueError("pad_headers: %d bytes cannot be padded to %d" % (total + 2 - left, total))
    n = 0
    while left > 0:
        take = min(left, 8192)
        if 0 < left - take < overhead + 1:  # keep the rest long enough for one more line
            take = left - (overhead + 1)
        handler.send_header("X-Pad-%05d" % n, "p" * (take - overhead))
        left -= take
        n += 1
