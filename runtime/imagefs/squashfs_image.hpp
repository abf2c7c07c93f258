// A squashfs image as the FUSE server sees it: inodes by number, directories as sorted listings,
// file bytes by offset. Everything here is safe to call from many threads at once (libsquashfs's
// readers are not: each call borrows one from a pool), and every size read from the image is
// bounded: the image is a user's file, untrusted bytes.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gantry/result.hpp"

namespace gantry::imagefs {

// The kernel's inode numbers are the image's own (stable across servers, one per hard-linked inode),
// except that FUSE wants the root at 1: the root's number and 1 trade places.
uint64_t kernel_ino(uint32_t image_number, uint32_t root_number);
uint32_t image_number(uint64_t kernel_ino, uint32_t root_number);

// One name in a directory: the kernel's inode number and the inode type (d_type).
struct DirEntry {
    std::string name;
    uint64_t ino = 0;
    unsigned char d_type = 0;
};
using Listing = std::vector<DirEntry>;

// Limits on what an image may make us hold. Beyond them a call fails with EIO (a directory larger
// than max_listing_bytes, more xattrs than max_xattrs or a value over max_xattr_value, a file of
// more than max_file_blocks blocks) and open fails for a fragment table of more than max_fragments
// entries, rather than growing without bound.
struct ImageLimits {
    size_t max_listing_bytes = 64u << 20;  // one directory's on-disk listing
    size_t cached_entries = 1u << 20;      // directory entries kept decoded, over all directories
    size_t max_xattrs = 1024;              // key-value pairs of one inode
    size_t max_xattr_value = 64u << 10;    // the kernel's own XATTR_SIZE_MAX
    size_t max_fragments = 1u << 22;       // fragment blocks: 16 bytes each, held by every Reader
    size_t max_file_blocks = 1u << 26;     // one file's block list (4 bytes a block): 8 TiB at 128 KiB
};

class SquashfsImage {
public:
    // Opens the image at `path` (kept open: a file rebuilt in place does not change what we serve).
    // Errors carry the errno to give the kernel (EIO for a corrupt image).
    static Result<std::unique_ptr<SquashfsImage>> open(const std::string& path, ImageLimits limits = {});
    ~SquashfsImage();
    SquashfsImage(const SquashfsImage&) = delete;
    SquashfsImage& operator=(const SquashfsImage&) = delete;

    // The entry `name` in directory `dir`, nullopt when there is none.
    Result<std::optional<DirEntry>> lookup(uint64_t dir, std::string_view name);
    // Every entry of directory `dir` in the image's (name) order, without "." and "..".
    Result<std::shared_ptr<const Listing>> list(uint64_t dir);
    // The parent of directory `dir` (the root's is itself).
    Result<uint64_t> parent(uint64_t dir);
    Result<struct stat> attributes(uint64_t ino);
    Result<std::string> read_link(uint64_t ino);
    // Up to out.size() bytes of file `ino` from `offset`; fewer only at the end of the file.
    Result<size_t> read(uint64_t ino, uint64_t offset, std::span<char> out);
    // The inode's extended attributes as (full name, value), in the image's order.
    Result<std::vector<std::pair<std::string, std::string>>> xattrs(uint64_t ino);
    bool has_xattrs() const;
    struct statvfs filesystem() const;

    struct Shared;
    struct Reader;

private:
    explicit SquashfsImage(std::unique_ptr<Shared> shared);
    std::unique_ptr<Shared> shared_;
};

}  // namespace gantry::imagefs
