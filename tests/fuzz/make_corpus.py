#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ from the project's own fixtures: the string
literals the unit tests hand to each parser, the shipped conf/gantry.conf, a few tiny layer tars
(plain, gzip, zstd; with whiteouts and an opaque directory) and squashfs images (mksquashfs) built
here. Seeds are named by content hash, so running it again only adds what is new; inputs found by
fuzzing live beside them.
Usage: tests/fuzz/make_corpus.py"""
import gzip, hashlib, io, os, re, subprocess, sys, tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")

# target -> (unit test file, parser names whose first literal argument is a seed, prefix byte or None)
FROM_TESTS = {
    "reference": ("reference_test.cpp", ["parse_reference"], None),
    "image_config": ("core_test.cpp", ["parse_image_config"], None),
    "manifest": ("registry_test.cpp", ["parse_manifest"], b"\x00"),
    "www_authenticate": ("registry_test.cpp", ["parse_www_authenticate"], None),
    "netrc": ("auth_test.cpp", ["parse_netrc"], None),
    "aws_ini": ("auth_test.cpp", ["parse_aws_ini"], b"\x01"),
    "gantry_conf": ("core_test.cpp", ["parse_config"], b"\x00"),
    "container_mounts": ("launcher_test.cpp", ["parse_mounts", "parse_mount"], None),
    "dropins": ("launcher_test.cpp", ["parse_environment_file", "parse_fstab_file", "expand_variables", "parse_enroot_rc"], None),
    "mountinfo": ("core_test.cpp", ["parse_mountinfo"], None),
    "pull_report": ("store_test.cpp", ["decode_pull_report"], None),
    "cdi": ("devices_test.cpp", ["parse_cdi_spec"], b"\x00"),
}
DROPIN_PREFIX = {"parse_environment_file": b"\x00", "parse_fstab_file": b"\x02", "expand_variables": b"\x03", "parse_enroot_rc": b"\x04"}

LIT = re.compile(r'\s*(?:R"([^(]*)\((.*?)\)\1"|"((?:[^"\\\n]|\\.)*)")', re.S)


def unescape(s):
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1", "replace")


def literals_after(text, pos):
    """The adjacent string literals starting at text[pos:], concatenated; None when there are none."""
    out, found = b"", False
    while True:
        m = LIT.match(text, pos)
        if not m:
            return out if found else None
        out += m.group(2).encode() if m.group(2) is not None else unescape(m.group(3))
        pos, found = m.end(), True


def save(target, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def tar_bytes(members, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                t.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, data
                t.addfile(info)
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, data
                t.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def layer_seeds():
    # First byte: bits 0-1 the media type (tar, +gzip, +zstd, docker .tar.gzip), bit 2 over the fixed
    # lower layer of fuzz_layer.cpp (a, dir/b, dir/c, dir/sub/d, etc/passwd).
    simple = tar_bytes([("./", "dir", b""), ("./bin", "dir", b""), ("./bin/sh", "file", b"#!/bin/sh\n"),
                        ("./bin/ash", "hard", "./bin/sh"), ("./lib", "sym", "usr/lib")])
    whiteouts = tar_bytes([("dir", "dir", b""), ("dir/.wh.b", "file", b""), ("dir/sub", "dir", b""),
                           ("dir/sub/.wh..wh..opq", "file", b""), ("dir/sub/e", "file", b"e"), (".wh.a", "file", b""),
                           ("etc/passwd", "file", b"root:x:0:0::/root:/bin/sh\n")])
    gnu = tar_bytes([("x" * 120 + "/" + "y" * 120, "file", b"long"), ("dir/b/new", "file", b"n")], tarfile.GNU_FORMAT)
    seeds = [b"\x00" + simple, b"\x04" + whiteouts, b"\x04" + gnu, b"\x01" + gzip.compress(simple, mtime=0),
             b"\x05" + gzip.compress(whiteouts, mtime=0)]
    try:
        z = subprocess.run(["zstd", "-q", "-c"], input=whiteouts, capture_output=True, check=True).stdout
        seeds += [b"\x06" + z]
    except (OSError, subprocess.CalledProcessError):
        print("make_corpus: no zstd program; no zstd seed", file=sys.stderr)
    for s in seeds:
        save("layer", s)


def imagefs_seeds():
    # Small squashfs images made by squashfs-tools' mksquashfs (an independent writer) from a tree with
    # what gantry-imagefs serves: nested directories, a file over several small blocks and one in a
    # fragment, an empty file, a symlink, a hard link, an xattr where the file system takes one;
    # uncompressed (the fuzzer can change names and sizes directly), gzip and lz4 (Gantry's default).
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(os.path.join(src, "etc", "sub"))
        open(os.path.join(src, "etc", "passwd"), "wb").write(b"root:x:0:0::/root:/bin/sh\n")
        open(os.path.join(src, "etc", "sub", "big"), "wb").write(bytes(range(256)) * 40)
        open(os.path.join(src, "empty"), "wb").close()
        os.symlink("etc/passwd", os.path.join(src, "link"))
        os.link(os.path.join(src, "etc", "passwd"), os.path.join(src, "hard"))
        try:
            os.setxattr(os.path.join(src, "etc", "passwd"), "user.gantry", b"seed")
        except OSError:
            pass
        for opts in (["-noI", "-noD", "-noF", "-noX"], ["-comp", "gzip"], ["-comp", "lz4"]):
            out = os.path.join(tmp, "image.sqsh")
            try:
                subprocess.run(["mksquashfs", src, out, "-noappend", "-nopad", "-quiet", "-all-root", "-b", "4096",
                                "-mkfs-time", "0", "-all-time", "0"] + opts, check=True, capture_output=True)
            except (OSError, subprocess.CalledProcessError) as e:
                print(f"make_corpus: mksquashfs {' '.join(opts)} failed ({e}); no such imagefs seed", file=sys.stderr)
                continue
            save("imagefs", open(out, "rb").read())


# Hand-written seeds in the forms the docs and tests name, where the unit tests build inputs in code.
HAND = {
    "reference": [b"ubuntu", b"nvcr.io#nvidia/pytorch:24.01-py3", b"user@registry.example.com:5000/team/app:v1",
                  b"127.0.0.1:5000/a/b@sha256:" + b"0" * 64, b"docker.io/library/alpine:3.19", b"[::1]:5000/x:y"],
    "docker_config": [b'{"auths":{"https://index.docker.io/v1/":{"auth":"dXNlcjpwYXNz"},"127.0.0.1:5000":'
                      b'{"username":"u","password":"p"}}}',
                      b'{"credHelpers":{"123456789012.dkr.ecr.us-east-1.amazonaws.com":"ecr-login"},"credsStore":"pass"}',
                      b'{"auths":{"127.0.0.1:5000/team":{"identitytoken":"tok"},"127.0.0.1:5000":{"auth":"!!"}}}'],
    "netrc": [b"machine nvcr.io login $oauthtoken password $(cat ~/.ngc-key)\nmachine 127.0.0.1:5000 login u password p\n",
              b"# comment\ndefault login x password y\nmachine auth.docker.io\n login user\n password  a b c \n"],
    "aws_ini": [b"\x00[default]\naws_access_key_id = AKIA\naws_secret_access_key=secret\n",
                b"\x01[profile dev]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile=default\n; c\n# c\n[default]\nregion=us-east-1\n"],
    "cdi": [b"\x00cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n"
            b"    - path: /dev/nvidia0\ncontainerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n  mounts:\n"
            b"  - hostPath: /usr/lib/libcuda.so.1\n    containerPath: /usr/lib/libcuda.so.1\n    options: [ro, nosuid]\n"
            b"  hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-ctk\n"
            b"    args: [nvidia-ctk, hook, create-symlinks, --link, libcuda.so.1::/usr/lib/libcuda.so]\n",
            b'\x01{"cdiVersion":"0.5.0","kind":"vendor.com/net","devices":[{"name":"eth","containerEdits":'
            b'{"env":["A=1"],"deviceNodes":[{"path":"/dev/x","hostPath":"/dev/null"}]}}]}'],
    "mountinfo": [b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                  b"40 22 0:35 / /fsx rw,nosuid - lustre 10.0.0.1@tcp:/fsx rw,flock\n"
                  b"41 22 0:36 / /home/u/my\\040dir rw - nfs4 srv:/h rw,local_lock=flock\n"],
}


def main():
    for target, seeds in HAND.items():
        for data in seeds:
            save(target, data)
    for target, (test, names, prefix) in FROM_TESTS.items():
        path = os.path.join(ROOT, "tests", "unit", test)
        text = open(path, encoding="utf-8").read()
        n = 0
        for name in names:
            for m in re.finditer(r"\b" + name + r"\(", text):
                data = literals_after(text, m.end())
                if data is None:
                    continue
                lead = DROPIN_PREFIX.get(name, prefix) or b""
                save(target, lead + data)
                n += 1
        print(f"make_corpus: {target}: {n} seeds from tests/unit/{test}")
    conf = open(os.path.join(ROOT, "conf", "gantry.conf"), "rb").read()
    save("gantry_conf", b"\x00" + conf)
    layer_seeds()
    imagefs_seeds()


if __name__ == "__main__":
    main()
