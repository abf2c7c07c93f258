#!/bin/bash
# Packs what tests/gpu/check.sh needs on a GPU machine that has neither Gantry's build dependencies nor
# a network: the gantry CLI, its helpers, unsquashfs and mksquashfs, with every library they load apart from the C library
# (DT_RPATH $ORIGIN/lib, so the helpers' own libraries are found wherever the bundle is unpacked), and a
# small Debian image (a squashfs made from the harness's debian test image, documentation left out)
# holding the CUDA check program built against its own C library.
#   tests/gpu/make-bundle.sh BUILD_DIR OUT.tar.xz
# Needs patchelf, mksquashfs and the harness's reference trees (tests/images/build.sh).
set -euo pipefail
build=$(realpath "$1")
out=$(realpath -m "$2")
here=$(dirname "$(realpath "$0")")
ref=${GANTRY_TEST_REF_DEBIAN:-$build/harness/ref/debian/rootfs}
[ -x "$ref/bin/sh" ] || { echo "make-bundle: no Debian reference tree at $ref (run tests/images/build.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/g/bin/lib"
for p in gantry gantry-holder gantry-imagefs gantry-entry; do
    cp "$build/runtime/$p" "$work/g/bin/$p"
    strip --strip-debug "$work/g/bin/$p"
done
cp "$(command -v unsquashfs)" "$work/g/bin/unsquashfs"  # the extract backend's tool
cp "$(command -v mksquashfs)" "$work/g/bin/mksquashfs"  # check.sh's image of the machine's own root
# Every library but glibc's own (the machine's C library is the one that runs them).
for p in gantry gantry-holder gantry-imagefs unsquashfs mksquashfs; do
    ldd "$work/g/bin/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
    case $(basename "$lib") in
        libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux*) continue ;;
    esac
    cp -L "$lib" "$work/g/bin/lib/"
done
for p in gantry gantry-holder gantry-imagefs unsquashfs mksquashfs; do
    patchelf --force-rpath --set-rpath '$ORIGIN/lib' "$work/g/bin/$p"
done
# The image: the Debian test image without documentation, plus the CUDA check.
mkdir -p "$work/rootfs"
cp -a "$ref/." "$work/rootfs/"
rm -rf "$work/rootfs"/usr/share/{doc,man,info,locale,i18n,zoneinfo,perl*} "$work/rootfs"/usr/lib/x86_64-linux-gnu/{perl*,gconv} \
    "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/var/cache/*
gcc -O2 -Wall -Wextra -o "$work/rootfs/usr/local/bin/cudacheck" "$here/cudacheck.c" -ldl
mksquashfs "$work/rootfs" "$work/g/debian.sqsh" -comp xz -quiet -no-progress -all-root
tar -C "$work" -cJf "$out" g
ls -l "$out"
