#!/usr/bin/env python3
"""Hand-crafting steps for Gantry's test images, for what umoci cannot express.

Works directly on an OCI image layout (index.json + blobs/sha256/) with the standard library only, so
the test images stay independent of Gantry's own code:

  oci.py add-layer LAYOUT TAG TAR|- --compress gzip|zstd|none [--created-by TEXT]
      Append one layer (an uncompressed tar, or '-' for stdin) to the image tagged TAG: the blob is
      compressed with the gzip/zstd command-line tools, its diff_id goes into a new config, and TAG is
      moved to a new manifest (which, unlike umoci's, carries a mediaType field).
  oci.py make-index LAYOUT TAG SRC_TAG=OS/ARCH[/VARIANT]...
      Tag an image index that lists the manifests tagged SRC_TAG with their platforms.
  oci.py layers LAYOUT TAG
      Print "mediaType digest" for each layer of the manifest tagged TAG.
  oci.py to-gzip LAYOUT SRC_TAG DST_TAG
      Tag DST_TAG as a copy of SRC_TAG whose zstd layers are recompressed with gzip (same diff_ids),
      for tools like umoci 0.4 that cannot read zstd layers.
  oci.py list-layer BLOB
      One line per tar entry of a (gzip, zstd or plain) layer blob: type, mode, uid:gid, name,
      link target and xattr names, for the recipe's self-checks.
  oci.py tar-gen random|text|zeros MEGABYTES [PREFIX] | tar-gen small COUNT [PREFIX]
      Stream a generated tar to stdout (the `big` benchmark image): incompressible or compressible
      file contents, or COUNT small files spread over directories.
"""

import argparse
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    "none": "application/vnd.oci.image.layer.v1.tar",
}
COMPRESSORS = {
    "gzip": ["gzip", "-n", "-6", "-c"],
    "zstd": ["zstd", "-q", "-3", "-T0", "-c"],
}
REF_NAME = "org.opencontainers.image.ref.name"


def die(msg):
    sys.stderr.write(f"oci.py: {msg}\n")
    sys.exit(1)


def blob_path(layout, digest):
    algo, hexpart = digest.split(":", 1)
    return os.path.join(layout, "blobs", algo, hexpart)


def read_json_blob(layout, digest):
    with open(blob_path(layout, digest), "rb") as f:
        data = f.read()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        die(f"blob {digest} in {layout} does not match its digest")
    return json.loads(data)


def write_blob(layout, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(layout, digest)
    if not os.path.exists(path):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return digest, len(data)


def canonical(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def load_index(layout):
    with open(os.path.join(layout, "index.json")) as f:
        return json.load(f)


def find_tag(index, tag):
    for desc in index.get("manifests", []):
        if desc.get("annotations", {}).get(REF_NAME) == tag:
            return desc
    return None


def set_tag(layout, tag, desc):
    index = load_index(layout)
    desc = dict(desc)
    desc["annotations"] = {REF_NAME: tag}
    kept = [d for d in index.get("manifests", []) if d.get("annotations", {}).get(REF_NAME) != tag]
    index["manifests"] = kept + [desc]
    tmp = os.path.join(layout, "index.json.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f)
    os.replace(tmp, os.path.join(layout, "index.json"))


def compress_into_blob(layout, src, method):
    """Stream src (a binary file object holding a tar) through the compressor into a new blob.
    Returns (diff_id, digest, size)."""
    tmp = tempfile.NamedTemporaryFile(dir=os.path.join(layout, "blobs", "sha256"), prefix=".layer-",
                                      delete=False)
    diff = hashlib.sha256()
    try:
        if method == "none":
            proc = None
            sink = tmp
        else:
            proc = subprocess.Popen(COMPRESSORS[method], stdin=subprocess.PIPE, stdout=tmp)
            sink = proc.stdin
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            diff.update(chunk)
            sink.write(chunk)
        if proc:
            proc.stdin.close()
            if proc.wait() != 0:
                die(f"{COMPRESSORS[method][0]} failed")
        tmp.close()
        comp = hashlib.sha256()
        size = 0
        with open(tmp.name, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                comp.update(chunk)
                size += len(chunk)
        digest = "sha256:" + comp.hexdigest()
        os.replace(tmp.name, blob_path(layout, digest))
        os.chmod(blob_path(layout, digest), 0o644)
        return "sha256:" + diff.hexdigest(), digest, size
    except BaseException:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)
        raise


def cmd_add_layer(args):
    index = load_index(args.layout)
    desc = find_tag(index, args.tag)
    if desc is None:
        die(f"no tag {args.tag} in {args.layout}")
    manifest = read_json_blob(args.layout, desc["digest"])
    config = read_json_blob(args.layout, manifest["config"]["digest"])

    if args.tar == "-":
        diff_id, digest, size = compress_into_blob(args.layout, sys.stdin.buffer, args.compress)
    else:
        with open(args.tar, "rb") as f:
            diff_id, digest, size = compress_into_blob(args.layout, f, args.compress)

    config.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(diff_id)
    config.setdefault("history", []).append({
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "created_by": args.created_by or f"tests/images/oci.py add-layer ({args.compress})",
    })
    cdigest, csize = write_blob(args.layout, canonical(config))
    manifest["mediaType"] = OCI_MANIFEST
    manifest["config"] = {"mediaType": OCI_CONFIG, "digest": cdigest, "size": csize}
    manifest["layers"] = manifest.get("layers", []) + [
        {"mediaType": LAYER_TYPES[args.compress], "digest": digest, "size": size}]
    mdigest, msize = write_blob(args.layout, canonical(manifest))
    set_tag(args.layout, args.tag, {"mediaType": OCI_MANIFEST, "digest": mdigest, "size": msize})
    print(digest)


def cmd_make_index(args):
    index = load_index(args.layout)
    entries = []
    for spec in args.entries:
        src, _, plat = spec.partition("=")
        parts = plat.split("/")
        if len(parts) not in (2, 3):
            die(f"bad platform in {spec!r}; want SRC_TAG=OS/ARCH[/VARIANT]")
        desc = find_tag(index, src)
        if desc is None:
            die(f"no tag {src} in {args.layout}")
        platform = {"architecture": parts[1], "os": parts[0]}
        if len(parts) == 3:
            platform["variant"] = parts[2]
        entries.append({"mediaType": desc.get("mediaType", OCI_MANIFEST), "digest": desc["digest"],
                        "size": desc["size"], "platform": platform})
    image_index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
    digest, size = write_blob(args.layout, canonical(image_index))
    set_tag(args.layout, args.tag, {"mediaType": OCI_INDEX, "digest": digest, "size": size})
    print(digest)


def cmd_layers(args):
    desc = find_tag(load_index(args.layout), args.tag)
    if desc is None:
        die(f"no tag {args.tag} in {args.layout}")
    for layer in read_json_blob(args.layout, desc["digest"])["layers"]:
        print(layer["mediaType"], layer["digest"])


def open_layer(path):
    """Return a binary stream with the uncompressed tar of a layer blob, whatever its compression."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"\x1f\x8b":
        cmd = ["gzip", "-dc", path]
    elif magic == b"\x28\xb5\x2f\xfd":
        cmd = ["zstd", "-dc", "-q", path]
    else:
        return open(path, "rb"), None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    return proc.stdout, proc


def cmd_to_gzip(args):
    desc = find_tag(load_index(args.layout), args.src_tag)
    if desc is None:
        die(f"no tag {args.src_tag} in {args.layout}")
    manifest = read_json_blob(args.layout, desc["digest"])
    layers = []
    for layer in manifest["layers"]:
        if layer["mediaType"].endswith("+zstd"):
            stream, proc = open_layer(blob_path(args.layout, layer["digest"]))
            _, digest, size = compress_into_blob(args.layout, stream, "gzip")
            if proc and proc.wait() != 0:
                die(f"zstd could not decompress {layer['digest']}")
            layer = {"mediaType": LAYER_TYPES["gzip"], "digest": digest, "size": size}
        layers.append(layer)
    manifest["layers"] = layers
    manifest["mediaType"] = OCI_MANIFEST
    mdigest, msize = write_blob(args.layout, canonical(manifest))
    set_tag(args.layout, args.dst_tag, {"mediaType": OCI_MANIFEST, "digest": mdigest, "size": msize})
    print(mdigest)


def cmd_list_layer(args):
    stream, proc = open_layer(args.blob)
    kinds = {tarfile.REGTYPE: "f", tarfile.AREGTYPE: "f", tarfile.DIRTYPE: "d", tarfile.SYMTYPE: "l",
             tarfile.LNKTYPE: "h", tarfile.FIFOTYPE: "p", tarfile.CHRTYPE: "c", tarfile.BLKTYPE: "b"}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            xattrs = sorted(k[len("SCHILY.xattr."):] for k in m.pax_headers if k.startswith("SCHILY.xattr."))
            link = f" -> {m.linkname}" if m.issym() or m.islnk() else ""
            print(f"{kinds.get(m.type, '?')} {m.mode:04o} {m.uid}:{m.gid} {m.size} {m.name}{link}"
                  + (f" xattrs={','.join(xattrs)}" if xattrs else ""))
    if proc and proc.wait() != 0:
        die(f"could not decompress {args.blob}")


class GeneratedFile(io.RawIOBase):
    """A read-only stream of SIZE bytes of one kind of content, made on the fly."""

    def __init__(self, kind, size, seed):
        self.kind, self.left = kind, size
        self.rng = random.Random(seed)
        # Compressible content: log-like lines drawn from a pool (gzip gets about 3:1 on it).
        words = ("step", "loss", "rank", "node", "epoch", "grad", "nccl", "efa", "allreduce",
                 "checkpoint", "INFO", "WARN", "tokens/s", "lr")
        pool_rng = random.Random(4242)
        self.pool = [" ".join(pool_rng.choice(words) for _ in range(8)) +
                     f" {pool_rng.randrange(1 << 20)}\n" for _ in range(65536)] if kind == "text" else []

    def readable(self):
        return True

    def _chunk(self, n):
        if self.kind == "random":
            return self.rng.randbytes(n)
        if self.kind == "zeros":
            # Mostly zeros with a few random bytes per 64 KiB: compresses to almost nothing.
            buf = bytearray(n)
            for _ in range(max(1, n >> 16)):
                buf[self.rng.randrange(n)] = self.rng.randrange(256)
            return bytes(buf)
        text = "".join(self.rng.choices(self.pool, k=n // 40 + 1)).encode()
        while len(text) < n:
            text += text
        return text[:n]

    def readinto(self, b):
        if self.left <= 0:
            return 0
        n = min(len(b), self.left, 1 << 20)
        data = self._chunk(n)
        b[:n] = data
        self.left -= n
        return n


def cmd_tar_gen(args):
    out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
    now = int(time.time())
    prefix = args.prefix or f"big-{args.kind}"

    def add_dir(name):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
        out.addfile(info)

    add_dir(prefix)
    if args.kind == "small":
        rng = random.Random(20000)
        per_dir = 500
        for i in range(args.amount):
            if i % per_dir == 0:
                add_dir(f"{prefix}/d{i // per_dir:03d}")
            body = (f"small file {i}\n" * rng.randrange(1, 200)).encode()
            info = tarfile.TarInfo(f"{prefix}/d{i // per_dir:03d}/f{i:05d}.txt")
            info.size, info.mode, info.mtime = len(body), 0o644, now
            out.addfile(info, io.BytesIO(body))
    else:
        total = args.amount << 20
        file_size = 256 << 20
        n = 0
        while total > 0:
            size = min(file_size, total)
            info = tarfile.TarInfo(f"{prefix}/part{n:02d}.bin")
            info.size, info.mode, info.mtime = size, 0o644, now
            out.addfile(info, io.BufferedReader(GeneratedFile(args.kind, size, seed=n + 1)))
            total -= size
            n += 1
    out.close()
    sys.stdout.buffer.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add-layer")
    a.add_argument("layout")
    a.add_argument("tag")
    a.add_argument("tar")
    a.add_argument("--compress", choices=sorted(LAYER_TYPES), default="gzip")
    a.add_argument("--created-by")
    a.set_defaults(func=cmd_add_layer)
    m = sub.add_parser("make-index")
    m.add_argument("layout")
    m.add_argument("tag")
    m.add_argument("entries", nargs="+")
    m.set_defaults(func=cmd_make_index)
    ls = sub.add_parser("layers")
    ls.add_argument("layout")
    ls.add_argument("tag")
    ls.set_defaults(func=cmd_layers)
    z = sub.add_parser("to-gzip")
    z.add_argument("layout")
    z.add_argument("src_tag")
    z.add_argument("dst_tag")
    z.set_defaults(func=cmd_to_gzip)
    ll = sub.add_parser("list-layer")
    ll.add_argument("blob")
    ll.set_defaults(func=cmd_list_layer)
    g = sub.add_parser("tar-gen")
    g.add_argument("kind", choices=["random", "text", "zeros", "small"])
    g.add_argument("amount", type=int, help="megabytes, or the number of files for 'small'")
    g.add_argument("prefix", nargs="?")
    g.set_defaults(func=cmd_tar_gen)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
