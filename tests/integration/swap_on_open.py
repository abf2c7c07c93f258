#!/usr/bin/python3
"""The attacker's half of the swap-after-check attack (tests/integration/store_swap.bats).

swap_on_open.py DIR NAME COUNT EVIL TARGET READY: watches DIR with inotify and, the moment NAME in
it has been opened COUNT times, renames EVIL (a file of the attacker's on the same file system) over
DIR/TARGET, prints "swapped" and exits. READY is created once the watch is in place. Plain ctypes: the
attack needs nothing but the ability to rename entries in a directory one owns, which a sticky bit
does not take away.
"""
import ctypes
import os
import struct
import sys

IN_OPEN = 0x00000020


def main():
    directory, name, count, evil, target, ready = sys.argv[1:7]
    count = int(count)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        sys.exit("inotify_init1: " + os.strerror(ctypes.get_errno()))
    if libc.inotify_add_watch(fd, directory.encode(), IN_OPEN) < 0:
        sys.exit("inotify_add_watch " + directory + ": " + os.strerror(ctypes.get_errno()))
    open(ready, "w").close()
    seen = 0
    while True:
        buf = os.read(fd, 65536)
        off = 0
        while off < len(buf):
            _wd, mask, _cookie, length = struct.unpack_from("iIII", buf, off)
            event_name = buf[off + 16:off + 16 + length].rstrip(b"\0").decode()
            off += 16 + length
            if mask & IN_OPEN and event_name == name:
                seen += 1
                if seen == count:
                    os.rename(evil, os.path.join(directory, target))
                    print("swapped", flush=True)
                    return


if __name__ == "__main__":
    main()
