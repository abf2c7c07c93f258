// Reading glibc's ld.so cache (/etc/ld.so.cache under the host root), to find the driver's
// user-space libraries the way the host's dynamic loader finds them. We parse the file rather than
// run `ldconfig -p`: no process per container start, and the bytes we trust are the host's own.
//
// Layout (glibc elf/cache.h, "new" format written since glibc 2.32, and after the old format before):
//   header, 48 bytes: "glibc-ld.so.cache" "1.1", u32 nlibs, u32 len_strings, u8 flags, 3 pad,
//                     u32 extension_offset, 3 x u32 unused
//   nlibs entries, 24 bytes: i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap
//   key/value: offsets of NUL-terminated strings (soname, path), counted from the header's start.
#include <cstdint>
#include <cstring>

#include "gantry/devices.hpp"

namespace gantry {
namespace {

constexpr char kOldMagic[] = "ld.so-1.7.0";
constexpr char kNewMagic[] = "glibc-ld.so.cache1.1";
constexpr size_t kHeaderSize = 48;
constexpr size_t kEntrySize = 24;

uint32_t u32_at(const std::string& b, size_t off) {
    uint32_t v;
    std::memcpy(&v, b.data() + off, sizeof v);
    return v;
}

}  // namespace

bool LdCacheEntry::is_64bit() const {
    // The architecture byte: 0 is a plain 32-bit libc6 entry (i386, arm), 0x0800 is x32 (32-bit
    // pointers); every other value names a 64-bit ABI (x86-64 0x0300, aarch64 0x0a00, ppc64, ...).
    uint32_t arch = flags & 0xff00;
    return arch != 0 && arch != 0x0800;
}

Result<std::vector<LdCacheEntry>> parse_ld_cache(const std::string& bytes) {
    size_t base = 0;
    if (bytes.compare(0, sizeof kOldMagic - 1, kOldMagic) == 0) {
        // Old format first: the new header follows its entries; find it by its magic.
        base = bytes.find(kNewMagic);
        if (base == std::string::npos) return make_error("ld.so cache has only the old format (glibc < 2.32?)");
    } else if (bytes.compare(0, sizeof kNewMagic - 1, kNewMagic) != 0) {
        return make_error("not a glibc ld.so cache (unknown magic)");
    }
    if (bytes.size() < base + kHeaderSize) return make_error("ld.so cache truncated (header)");
    uint32_t nlibs = u32_at(bytes, base + 20);
    if (nlibs > (bytes.size() - base - kHeaderSize) / kEntrySize) return make_error("ld.so cache truncated (entries)");
    auto string_at = [&](uint32_t off, std::string& out) {
        size_t at = base + off;
        if (at >= bytes.size()) return false;
        size_t end = bytes.find('\0', at);
        if (end == std::string::npos) return false;
        out.assign(bytes, at, end - at);
        return true;
    };
    std::vector<LdCacheEntry> out;
    out.reserve(nlibs);
    for (uint32_t i = 0; i < nlibs; ++i) {
        size_t e = base + kHeaderSize + size_t{i} * kEntrySize;
        LdCacheEntry entry;
        entry.flags = u32_at(bytes, e);
        if (!string_at(u32_at(bytes, e + 4), entry.soname) || !string_at(u32_at(bytes, e + 8), entry.path))
            return make_error("ld.so cache entry " + std::to_string(i) + " points outside the file");
        out.push_back(std::move(entry));
    }
    return out;
}

}  // namespace gantry
