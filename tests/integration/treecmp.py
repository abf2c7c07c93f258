#!/usr/bin/env python3
"""Compares two extracted root file systems, e.g. `umoci unpack`'s reference rootfs with the
unsquashfs'd (or mounted) squashfs that Gantry wrote for the same image.

    treecmp.py [--ignore-dir-mtime] [--ignore-mtime] [--ignore-xattr PREFIX]... [--ignore PATH]... REF OURS

Compared for every path (by os.lstat, never following symlinks): presence, file type, permission bits
(incl. setuid/setgid/sticky), uid, gid, symlink target, sha256 of regular file contents, xattrs, hard
link groups (which paths share an inode), and mtimes of non-directories (and of directories unless
--ignore-dir-mtime: tools that create missing parents stamp them with "now"). Symlink permission bits
are not compared (Linux ignores them). Device nodes in REF are reported only with --devices (Gantry
skips them by design).

Prints one line per difference and exits 1 if there is any, 0 otherwise.
"""
import argparse
import hashlib
import os
import stat
import sys


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def xattrs(path, ignore):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    out = {}
    for n in names:
        if any(n.startswith(p) for p in ignore):
            continue
        try:
            out[n] = os.getxattr(path, n, follow_symlinks=False)
        except OSError:
            pass
    return out


def walk(root, args):
    """path (relative, '.' for the root) -> dict of compared properties, plus inode groups."""
    entries = {}
    inodes = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [None] + dirnames + filenames:
            full = dirpath if name is None else os.path.join(dirpath, name)
            if name is None and dirpath != root:
                continue  # directories are visited as names of their parent
            rel = os.path.relpath(full, root)
            if rel in args.ignore:
                continue
            st = os.lstat(full)
            fmt = stat.S_IFMT(st.st_mode)
            e = {"type": stat.filemode(st.st_mode)[0], "uid": st.st_uid, "gid": st.st_gid}
            if not stat.S_ISLNK(st.st_mode):
                e["mode"] = oct(stat.S_IMODE(st.st_mode))
            if stat.S_ISREG(st.st_mode):
                e["sha256"] = file_sha256(full)
                if st.st_nlink > 1:
                    inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
            elif stat.S_ISLNK(st.st_mode):
                e["target"] = os.readlink(full)
            elif fmt in (stat.S_IFCHR, stat.S_IFBLK):
                if not args.devices:
                    continue
                e["rdev"] = st.st_rdev
            is_dir = stat.S_ISDIR(st.st_mode)
            if not args.ignore_mtime and not (is_dir and args.ignore_dir_mtime):
                e["mtime"] = int(st.st_mtime)
            e["xattrs"] = xattrs(full, args.ignore_xattr)
            entries[rel] = e
    groups = {}
    for paths in inodes.values():
        group = tuple(sorted(paths))
        for p in group:
            groups[p] = group
    return entries, groups


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("ours")
    ap.add_argument("--ignore-dir-mtime", action="store_true")
    ap.add_argument("--ignore-mtime", action="store_true")
    ap.add_argument("--ignore-xattr", action="append", default=[], metavar="PREFIX")
    ap.add_argument("--ignore", action="append", default=[], metavar="PATH", help="relative path to skip")
    ap.add_argument("--devices", action="store_true", help="also compare device nodes")
    args = ap.parse_args()

    ref, ref_groups = walk(args.ref, args)
    ours, our_groups = walk(args.ours, args)
    diffs = []
    for p in sorted(set(ref) | set(ours)):
        if p not in ours:
            diffs.append(f"only in {args.ref}: {p}")
            continue
        if p not in ref:
            diffs.append(f"only in {args.ours}: {p}")
            continue
        a, b = ref[p], ours[p]
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(f"{p}: {k} differs: {a.get(k)!r} vs {b.get(k)!r}")
        if ref_groups.get(p) != our_groups.get(p):
            diffs.append(f"{p}: hard link group differs: {ref_groups.get(p)} vs {our_groups.get(p)}")
    for d in diffs:
        print(d)
    print(f"treecmp: {len(ref)} paths in {args.ref}, {len(ours)} in {args.ours}, {len(diffs)} differences",
          file=sys.stderr)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
