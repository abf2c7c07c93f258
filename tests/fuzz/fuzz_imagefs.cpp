// A squashfs image as gantry-imagefs serves it (runtime/imagefs/squashfs_image.cpp): the fuse backend
// hands the server a user's own image file, so every byte of it is untrusted. The input is the image;
// the target opens it through SquashfsImage, walks what it lists from the root (breadth first, each
// inode once, bounded) and asks for everything the kernel could ask for: attributes, lookups, link
// targets, file bytes, extended attributes, parents. Checked beyond "no crash, leak, UB or timeout":
//   - every listed name is one path component the kernel can take (1-255 bytes, no '/', no NUL,
//     not "." or "..");
//   - a lookup that finds a listed name finds that name;
//   - a read never returns more than asked, nor more than the file's size from its offset, and at the
//     file's end returns nothing;
//   - a link target fits a path (PATH_MAX), xattrs stay within the limits given.
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fuzz.hpp"
#include "squashfs_image.hpp"

namespace {

const std::string& image_path() {
    static const std::string path = [] {
        char tmpl[] = "/tmp/gantry-fuzz-imagefs-XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) std::abort();
        return std::string(tmpl) + "/image.sqsh";
    }();
    return path;
}

bool name_ok(const std::string& n) {
    return !n.empty() && n.size() <= 255 && n != "." && n != ".." && n.find('/') == std::string::npos &&
           n.find('\0') == std::string::npos;
}

void check_file(gantry::imagefs::SquashfsImage& image, uint64_t ino, const struct stat& st) {
    const auto size = static_cast<uint64_t>(st.st_size);
    char buf[8192];
    uint64_t offset = 0;
    // The first and last pieces and a few in between: enough to reach blocks, fragments and the tail.
    for (int i = 0; i < 8 && offset < size; ++i) {
        auto got = image.read(ino, offset, std::span<char>(buf, sizeof buf));
        if (!got) return;
        FUZZ_CHECK(*got <= sizeof buf);
        FUZZ_CHECK(*got <= size - offset);
        if (*got == 0) return;
        offset = (i == 6 && size > sizeof buf) ? size - sizeof buf : offset + *got + (size / 8);
    }
    if (auto end = image.read(ino, size, std::span<char>(buf, sizeof buf))) FUZZ_CHECK(*end == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    {
        std::ofstream out(image_path(), std::ios::trunc | std::ios::binary);
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
        FUZZ_CHECK(out.good());
    }
    // Lowered limits, so that breaking one is a quick, clean failure rather than a slow input.
    gantry::imagefs::ImageLimits limits;
    limits.max_listing_bytes = 1u << 20;
    limits.cached_entries = 4096;
    limits.max_xattrs = 64;
    limits.max_xattr_value = 4096;
    auto opened = gantry::imagefs::SquashfsImage::open(image_path(), limits);
    if (!opened) return 0;
    auto& image = **opened;
    (void)image.filesystem();
    (void)image.has_xattrs();

    std::vector<uint64_t> dirs = {1};  // the root is inode 1 for the kernel
    std::set<uint64_t> seen = {1};
    size_t visited = 0;
    while (!dirs.empty() && visited < 512) {
        const uint64_t dir = dirs.back();
        dirs.pop_back();
        ++visited;
        (void)image.parent(dir);
        auto listing = image.list(dir);
        if (!listing) continue;
        size_t n = 0;
        for (const auto& e : **listing) {
            if (++n > 256) break;
            FUZZ_CHECK(name_ok(e.name));
            if (auto found = image.lookup(dir, e.name); found && *found) FUZZ_CHECK((*found)->name == e.name);
            if (!seen.insert(e.ino).second) continue;
            auto st = image.attributes(e.ino);
            if (!st) continue;
            if (auto x = image.xattrs(e.ino)) {
                FUZZ_CHECK(x->size() <= limits.max_xattrs);
                for (const auto& [key, value] : *x) FUZZ_CHECK(value.size() <= limits.max_xattr_value);
            }
            if (S_ISDIR(st->st_mode)) {
                dirs.push_back(e.ino);
            } else if (S_ISLNK(st->st_mode)) {
                if (auto target = image.read_link(e.ino)) FUZZ_CHECK(target->size() < PATH_MAX);
            } else if (S_ISREG(st->st_mode)) {
                check_file(image, e.ino, *st);
            }
        }
        // A name the directory does not have: no entry, no error needed.
        (void)image.lookup(dir, "gantry-fuzz-no-such-name");
    }
    return 0;
}
