#!/usr/bin/env python3
"""An unprivileged client that misbehaves towards the stage server (tests/integration/trusted_store.bats).

stage_attacker.py SOCKET OUTDIR FORGED_IMAGE REFUSED_IMAGE REFUSED_REGISTRY HOLD

Writes what it saw into OUTDIR, one file per probe:
  huge      the server's answer to a 1 MiB request with no newline
  forged    the answer to a well-formed request that also claims to come from uid 0
  refused   the answer to a request for REFUSED_IMAGE with credentials the registry refuses
  holding   written once HOLD connections are open and have sent nothing
  over      the answer to one more connection, past the per-user limit, while those are held
  held      after OUTDIR/release appears: how many of the HOLD silent connections the server still
            keeps open (it must not have given up on them: the victim's request completed meanwhile)
"""
import json
import os
import socket
import sys
import time


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def answer(s, timeout=60):
    s.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except (socket.timeout, ConnectionResetError, BrokenPipeError) as e:
        data += ("<%s>" % type(e).__name__).encode()
    return data.decode(errors="replace").strip()


def write(outdir, name, text):
    with open(os.path.join(outdir, name), "w") as f:
        f.write(text + "\n")


def main():
    path, outdir, forged_image, refused_image, refused_registry, hold = sys.argv[1:7]
    hold = int(hold)

    # A line far over the server's limit, never finished: the server answers and closes.
    s = connect(path)
    try:
        s.sendall(b"x" * (1 << 20))
    except (BrokenPipeError, ConnectionResetError):
        pass
    write(outdir, "huge", answer(s))
    s.close()

    # A request that claims another identity: the server must go by SO_PEERCRED, not by the message.
    s = connect(path)
    s.sendall((json.dumps({"image": forged_image, "credentials": {}, "uid": 0, "gid": 0,
                           "peer": {"uid": 0, "pid": 1}}) + "\n").encode())
    write(outdir, "forged", answer(s))
    s.close()

    # A private image with credentials its registry refuses: the registry's no comes back.
    s = connect(path)
    creds = {"registry": refused_registry, "username": "AWS", "password": "wrong-%d" % os.getpid(),
             "identity_token": "", "source": "attacker"}
    s.sendall((json.dumps({"image": refused_image, "credentials": creds}) + "\n").encode())
    write(outdir, "refused", answer(s, 120))
    s.close()

    # Silent connections: each holds one server child until the read deadline, nothing more.
    time.sleep(0.5)  # the children of the probes above have exited: they no longer count for this uid
    held = [connect(path) for _ in range(hold)]
    time.sleep(0.5)  # the server has accepted them (its loop polls every 200 ms)
    write(outdir, "holding", str(hold))
    s = connect(path)
    write(outdir, "over", answer(s, 30))
    s.close()
    for _ in range(3000):
        if os.path.exists(os.path.join(outdir, "release")):
            break
        time.sleep(0.1)
    still = 0
    for c in held:
        c.setblocking(False)
        try:
            data = c.recv(1, socket.MSG_PEEK)
            # b"" is the server's end of stream; any byte is an answer: either way it gave up on us.
        except BlockingIOError:
            still += 1
        except OSError:
            pass
    write(outdir, "held", str(still))
    for c in held:
        c.close()


if __name__ == "__main__":
    main()
