// The squashfs side of the conversion: owns the libsquashfs objects, takes file data as it streams out
// of the layers (compressed by the block processor's worker threads, with fragments and
// deduplication), and at the end serializes the merged tree: inode and directory tables, fragment, id
// and xattr tables, and the super block.
#pragma once

#include <sqfs/block_processor.h>
#include <sqfs/block_writer.h>
#include <sqfs/compressor.h>
#include <sqfs/frag_table.h>
#include <sqfs/id_table.h>
#include <sqfs/io.h>
#include <sqfs/super.h>
#include <sqfs/xattr_writer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gantry/result.hpp"
#include "gantry/squashfs.hpp"
#include "image_tree.hpp"

namespace gantry::squashfs {

// libsquashfs's SQFS_ERROR_* codes in words; errno is meaningful only for SQFS_ERROR_IO.
const char* sqfs_error_name(int code);

class SquashfsWriter {
public:
    // Creates `path` (it must not exist) and writes the space for the super block.
    static Result<std::unique_ptr<SquashfsWriter>> create(const std::string& path, const SquashfsOptions& options);
    ~SquashfsWriter();
    SquashfsWriter(const SquashfsWriter&) = delete;
    SquashfsWriter& operator=(const SquashfsWriter&) = delete;

    // One regular file's data: begin, append any number of times, end. The block processor keeps
    // `&inode->file` and fills it in as blocks are written.
    Status begin_file(Inode* inode);
    Status append(const void* data, size_t size);
    Status append_zeros(uint64_t count);
    Status end_file();

    // Waits for the last blocks, writes all tables and the super block, and syncs the file.
    // Fills the tree-shape counters of `stats` and returns the image size in bytes.
    Result<uint64_t> finish(ImageTree& tree, ConversionStats& stats, bool sync);

private:
    SquashfsWriter() = default;
    Status check(int rc, const char* what);

    std::string path_;
    sqfs_file_t* file_ = nullptr;
    sqfs_compressor_t* cmp_ = nullptr;
    sqfs_compressor_t* uncmp_ = nullptr;  // reads fragment blocks back to verify deduplication
    sqfs_block_writer_t* blocks_ = nullptr;
    sqfs_frag_table_t* frags_ = nullptr;
    sqfs_block_processor_t* proc_ = nullptr;
    sqfs_id_table_t* ids_ = nullptr;
    sqfs_xattr_writer_t* xattrs_ = nullptr;
    sqfs_super_t super_{};
    bool compress_data_ = true;
    // Our own descriptor of the output, to start its writeback while the layers still stream (see
    // append()); libsquashfs keeps its file descriptor to itself.
    int writeback_fd_ = -1;
    uint64_t since_writeback_ = 0;
    bool sync_ = true;
};

}  // namespace gantry::squashfs
