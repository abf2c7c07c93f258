// libsquashfs output: data blocks while the layers stream, tables and super block at the end.
// See squashfs_writer.hpp.
#include "squashfs_writer.hpp"

#include <fcntl.h>
#include <sqfs/dir_writer.h>
#include <sqfs/error.h>
#include <sqfs/inode.h>
#include <sqfs/meta_writer.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "gantry/fd.hpp"

namespace gantry::squashfs {

namespace {

// Defaults for level 0 where libsquashfs's own favour size over speed (zstd 15, lzo1x_999 level 8):
// images are written once per cluster but the conversion is on the critical path of the first job.
constexpr unsigned kZstdDefaultLevel = 3;
constexpr unsigned kGzipDefaultLevel = 6;
// Blocks queued for the compressor threads at most; bounds memory to about backlog x block size.
constexpr unsigned kBacklogPerWorker = 4;
constexpr uint64_t kDevBlockSize = 4096;  // images are padded to this, as mksquashfs does
// Start writing the image back to disk after every this many bytes of file data. Without it the
// whole image (GBs) sits dirty in the page cache until the fsync before publishing, and that fsync
// then waits for all of it with the CPUs idle; started early, the disk works while we convert.
constexpr uint64_t kWritebackStep = 32ull << 20;

// "none": a compressor that never compresses, so every data block, fragment block and metadata block
// is stored raw (libsquashfs keeps a block uncompressed when do_block returns 0). The super block
// still names gzip, which every kernel's squashfs supports, but nothing is ever inflated.
struct StoreOnlyCompressor {
    sqfs_compressor_t base;
    sqfs_u32 block_size;
    bool uncompress;
};

void store_only_destroy(sqfs_object_t* obj) {
    std::free(obj);
}

sqfs_object_t* store_only_copy(const sqfs_object_t* obj) {
    auto* copy = static_cast<StoreOnlyCompressor*>(std::malloc(sizeof(StoreOnlyCompressor)));
    if (copy != nullptr) std::memcpy(copy, obj, sizeof(StoreOnlyCompressor));
    return reinterpret_cast<sqfs_object_t*>(copy);
}

void store_only_config(const sqfs_compressor_t* cmp, sqfs_compressor_config_t* cfg) {
    const auto* self = reinterpret_cast<const StoreOnlyCompressor*>(cmp);
    sqfs_compressor_config_init(cfg, SQFS_COMP_GZIP, self->block_size,
                                self->uncompress ? SQFS_COMP_FLAG_UNCOMPRESS : 0);
}

int store_only_write_options(sqfs_compressor_t*, sqfs_file_t*) {
    return 0;
}
int store_only_read_options(sqfs_compressor_t*, sqfs_file_t*) {
    return 0;
}

sqfs_s32 store_only_do_block(sqfs_compressor_t* cmp, const sqfs_u8* in, sqfs_u32 size, sqfs_u8* out, sqfs_u32 outsize) {
    const auto* self = reinterpret_cast<const StoreOnlyCompressor*>(cmp);
    if (!self->uncompress) return 0;  // "did not get smaller": stored as is
    // Never reached for our own images (no block is marked compressed); copy to be safe.
    if (size > outsize) return 0;
    std::memcpy(out, in, size);
    return static_cast<sqfs_s32>(size);
}

sqfs_compressor_t* make_store_only(sqfs_u32 block_size, bool uncompress) {
    auto* c = static_cast<StoreOnlyCompressor*>(std::calloc(1, sizeof(StoreOnlyCompressor)));
    if (c == nullptr) return nullptr;
    c->base.base.destroy = store_only_destroy;
    c->base.base.copy = store_only_copy;
    c->base.get_configuration = store_only_config;
    c->base.write_options = store_only_write_options;
    c->base.read_options = store_only_read_options;
    c->base.do_block = store_only_do_block;
    c->block_size = block_size;
    c->uncompress = uncompress;
    return &c->base;
}

// Wraps a real compressor so that a block whose compressed form is not smaller than the input is
// stored raw. libsquashfs keeps whatever the backend returns, and lz4 turns tiny metadata blocks (a
// one-entry id table: 4 bytes) into larger ones, which unsquashfs 4.5 rejects as corrupt ("failed to
// read id table block") although the kernel reads them.
struct NeverGrowCompressor {
    sqfs_compressor_t base;
    sqfs_compressor_t* inner;
};

void never_grow_destroy(sqfs_object_t* obj) {
    auto* self = reinterpret_cast<NeverGrowCompressor*>(obj);
    sqfs_destroy(self->inner);
    std::free(self);
}

sqfs_compressor_t* wrap_never_grow(sqfs_compressor_t* inner);

sqfs_object_t* never_grow_copy(const sqfs_object_t* obj) {
    const auto* self = reinterpret_cast<const NeverGrowCompressor*>(obj);
    auto* inner = static_cast<sqfs_compressor_t*>(sqfs_copy(self->inner));
    if (inner == nullptr) return nullptr;
    sqfs_compressor_t* copy = wrap_never_grow(inner);
    if (copy == nullptr) sqfs_destroy(inner);
    return reinterpret_cast<sqfs_object_t*>(copy);
}

void never_grow_config(const sqfs_compressor_t* cmp, sqfs_compressor_config_t* cfg) {
    const auto* self = reinterpret_cast<const NeverGrowCompressor*>(cmp);
    self->inner->get_configuration(self->inner, cfg);
}

int never_grow_write_options(sqfs_compressor_t* cmp, sqfs_file_t* file) {
    auto* self = reinterpret_cast<NeverGrowCompressor*>(cmp);
    return self->inner->write_options(self->inner, file);
}

int never_grow_read_options(sqfs_compressor_t* cmp, sqfs_file_t* file) {
    auto* self = reinterpret_cast<NeverGrowCompressor*>(cmp);
    return self->inner->read_options(self->inner, file);
}

sqfs_s32 never_grow_do_block(sqfs_compressor_t* cmp, const sqfs_u8* in, sqfs_u32 size, sqfs_u8* out, sqfs_u32 outsize) {
    auto* self = reinterpret_cast<NeverGrowCompressor*>(cmp);
    sqfs_s32 n = self->inner->do_block(self->inner, in, size, out, outsize);
    if (n > 0 && static_cast<sqfs_u32>(n) >= size) return 0;  // no gain: store the block raw
    return n;
}

sqfs_compressor_t* wrap_never_grow(sqfs_compressor_t* inner) {
    auto* c = static_cast<NeverGrowCompressor*>(std::calloc(1, sizeof(NeverGrowCompressor)));
    if (c == nullptr) return nullptr;
    c->base.base.destroy = never_grow_destroy;
    c->base.base.copy = never_grow_copy;
    c->base.get_configuration = never_grow_config;
    c->base.write_options = never_grow_write_options;
    c->base.read_options = never_grow_read_options;
    c->base.do_block = never_grow_do_block;
    c->inner = inner;
    return &c->base;
}

const unsigned char kZeros[64 * 1024] = {};

uint32_t clamp_time(int64_t t) {
    // squashfs stores unsigned 32-bit seconds: times before 1970 become 0, after 2106 the maximum.
    return static_cast<uint32_t>(std::clamp<int64_t>(t, 0, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

const char* sqfs_error_name(int code) {
    switch (code) {
        case SQFS_ERROR_ALLOC:
            return "out of memory";
        case SQFS_ERROR_IO:
            return "I/O error";
        case SQFS_ERROR_COMPRESSOR:
            return "compressor error";
        case SQFS_ERROR_INTERNAL:
            return "internal libsquashfs error";
        case SQFS_ERROR_CORRUPTED:
            return "corrupted data";
        case SQFS_ERROR_UNSUPPORTED:
            return "unsupported";
        case SQFS_ERROR_OVERFLOW:
            return "size overflow";
        case SQFS_ERROR_OUT_OF_BOUNDS:
            return "out of bounds";
        case SQFS_ERROR_SUPER_BLOCK_SIZE:
            return "invalid block size";
        case SQFS_ERROR_NOT_DIR:
            return "not a directory";
        case SQFS_ERROR_NO_ENTRY:
            return "no such entry";
        case SQFS_ERROR_LINK_LOOP:
            return "hard link loop";
        case SQFS_ERROR_NOT_FILE:
            return "not a regular file";
        case SQFS_ERROR_ARG_INVALID:
            return "invalid argument";
        case SQFS_ERROR_SEQUENCE:
            return "calls out of sequence";
        default:
            return "unknown libsquashfs error";
    }
}

Status SquashfsWriter::check(int rc, const char* what) {
    if (rc == 0) return {};
    // libsquashfs's file implementation keeps errno for I/O errors (e.g. ENOSPC on a full store).
    if (rc == SQFS_ERROR_IO && errno != 0) return system_error(std::string(what) + " in " + path_);
    return make_error(std::string(what) + " in " + path_ + ": " + sqfs_error_name(rc));
}

SquashfsWriter::~SquashfsWriter() {
    if (proc_ != nullptr) {
        // Abandoned after an error: libsquashfs 1.2 leaks the block it is still filling when destroyed
        // unfinished, so close the file and flush (into an output that is about to be removed).
        (void)sqfs_block_processor_end_file(proc_);
        (void)sqfs_block_processor_finish(proc_);
    }
    // Reverse order of creation: the processor references the writer, table, file and compressors.
    sqfs_destroy(proc_);
    sqfs_destroy(xattrs_);
    sqfs_destroy(ids_);
    sqfs_destroy(frags_);
    sqfs_destroy(blocks_);
    sqfs_destroy(uncmp_);
    sqfs_destroy(cmp_);
    sqfs_destroy(file_);
    if (writeback_fd_ >= 0) ::close(writeback_fd_);
}

Result<std::unique_ptr<SquashfsWriter>> SquashfsWriter::create(const std::string& path,
                                                               const SquashfsOptions& options) {
    const uint32_t bs = options.block_size;
    if (bs < 4096 || bs > SQFS_MAX_BLOCK_SIZE || (bs & (bs - 1)) != 0)
        return make_error("squashfs block size " + std::to_string(bs) + " is not a power of two from 4 KiB to 1 MiB");

    std::unique_ptr<SquashfsWriter> w(new SquashfsWriter());
    w->path_ = path;

    SQFS_COMPRESSOR id = SQFS_COMP_GZIP;
    if (options.compressor == "none") {
        w->compress_data_ = false;
        w->cmp_ = make_store_only(bs, false);
        w->uncmp_ = make_store_only(bs, true);
        if (w->cmp_ == nullptr || w->uncmp_ == nullptr) return make_error("out of memory");
    } else {
        int found = sqfs_compressor_id_from_name(options.compressor.c_str());
        if (found < 0) return make_error("unknown squashfs compressor '" + options.compressor + "'");
        id = static_cast<SQFS_COMPRESSOR>(found);
        sqfs_compressor_config_t cfg;
        if (sqfs_compressor_config_init(&cfg, id, bs, 0) != 0)
            return make_error("cannot configure compressor " + options.compressor);
        if (options.level > 0) {
            cfg.level = static_cast<sqfs_u32>(options.level);
        } else if (id == SQFS_COMP_ZSTD) {
            cfg.level = kZstdDefaultLevel;
        } else if (id == SQFS_COMP_GZIP) {
            cfg.level = kGzipDefaultLevel;
        } else if (id == SQFS_COMP_LZO) {
            cfg.opt.lzo.algorithm = SQFS_LZO1X_1;  // the fast variant; 999 is for archives
            cfg.level = 0;
        }
        sqfs_compressor_t* real = nullptr;
        int rc = sqfs_compressor_create(&cfg, &real);
        if (rc != 0)
            return make_error("cannot create the " + options.compressor + " compressor (level " +
                              std::to_string(cfg.level) + "): " + sqfs_error_name(rc));
        w->cmp_ = wrap_never_grow(real);
        if (w->cmp_ == nullptr) {
            sqfs_destroy(real);
            return make_error("out of memory");
        }
        cfg.flags |= SQFS_COMP_FLAG_UNCOMPRESS;
        rc = sqfs_compressor_create(&cfg, &w->uncmp_);
        if (rc != 0)
            return make_error("cannot create the " + options.compressor + " decompressor: " + sqfs_error_name(rc));
    }

    // Flags 0: the file must not exist yet (a stale one is the caller's business, not ours to clobber).
    errno = 0;
    w->file_ = sqfs_open_file(path.c_str(), 0);
    if (w->file_ == nullptr) return system_error("creating " + path, errno != 0 ? errno : EEXIST);
    w->sync_ = options.sync;
    if (w->sync_)
        w->writeback_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // best effort: -1 = no early writeback

    // Reproducible output: the same layers give the same bytes, so the image time is fixed at 0.
    if (sqfs_super_init(&w->super_, bs, 0, id) != 0) return make_error("cannot initialise the super block");
    GANTRY_TRY(w->check(sqfs_super_write(&w->super_, w->file_), "writing the super block"));
    int optsize = w->cmp_->write_options(w->cmp_, w->file_);
    if (optsize < 0) return w->check(optsize, "writing compressor options").error();
    if (optsize > 0) w->super_.flags |= SQFS_FLAG_COMPRESSOR_OPTIONS;

    w->blocks_ = sqfs_block_writer_create(w->file_, kDevBlockSize, 0);
    w->frags_ = sqfs_frag_table_create(0);
    w->ids_ = sqfs_id_table_create(0);
    w->xattrs_ = sqfs_xattr_writer_create(0);
    if (w->blocks_ == nullptr || w->frags_ == nullptr || w->ids_ == nullptr || w->xattrs_ == nullptr)
        return make_error("out of memory creating squashfs tables");

    unsigned threads = options.threads;
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    sqfs_block_processor_desc_t desc{};
    desc.size = sizeof(desc);
    desc.max_block_size = bs;
    desc.num_workers = threads;
    desc.max_backlog = kBacklogPerWorker * threads + 2;
    desc.cmp = w->cmp_;
    desc.wr = w->blocks_;
    desc.tbl = w->frags_;
    desc.file = w->file_;
    desc.uncmp = w->uncmp_;
    GANTRY_TRY(w->check(sqfs_block_processor_create_ex(&desc, &w->proc_), "starting the block processor"));
    return w;
}

Status SquashfsWriter::begin_file(Inode* inode) {
    return check(sqfs_block_processor_begin_file(proc_, &inode->file, nullptr, 0), "writing file data");
}

Status SquashfsWriter::append(const void* data, size_t size) {
    GANTRY_TRY(check(sqfs_block_processor_append(proc_, data, size), "writing file data"));
    since_writeback_ += size;
    if (since_writeback_ >= kWritebackStep && writeback_fd_ >= 0) {
        since_writeback_ = 0;
        // Asynchronous: queues the dirty pages written so far for writeback and returns; durability
        // still comes from the fsync in finish(). An error here only means no head start.
        (void)::sync_file_range(writeback_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    return {};
}

Status SquashfsWriter::append_zeros(uint64_t count) {
    // Holes of sparse tar members; the block processor turns all-zero blocks into sparse blocks.
    while (count > 0) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(count, sizeof(kZeros)));
        GANTRY_TRY(append(kZeros, n));
        count -= n;
    }
    return {};
}

Status SquashfsWriter::end_file() {
    return check(sqfs_block_processor_end_file(proc_), "writing file data");
}

namespace {

// Walks the merged tree twice in the same order (children sorted, directories after their contents):
// once to number the inodes (a directory inode names its parent's number, written after it), once to
// write them. Each directory's listing goes to the directory table, kept in memory because on disk it
// follows the inode table.
class TreeSerializer {
public:
    TreeSerializer(ImageTree& tree, sqfs_meta_writer_t* inodes, sqfs_dir_writer_t* dirs, sqfs_id_table_t* ids,
                   sqfs_xattr_writer_t* xattrs, ConversionStats& stats)
        : tree_(tree), im_(inodes), dw_(dirs), ids_(ids), xw_(xattrs), stats_(stats) {}

    uint32_t number(TreeNode& dir) {
        for (auto& [name, child] : dir.children) {
            if (!child->emitted()) continue;
            if (child->is_dir()) {
                number(*child);
            } else if (child->inode->nlink++ == 0) {
                child->inode->ino = ++count_;
            } else {
                ++stats_.hardlinks;
            }
        }
        if (dir.inode == nullptr) dir.inode = tree_.adopt(default_directory());
        dir.inode->ino = ++count_;
        return count_;
    }

    Status write_dir(TreeNode& dir, uint32_t parent_ino) {
        size_t subdirs = 0;
        for (auto& [name, child] : dir.children) {
            if (!child->emitted()) continue;
            if (child->is_dir()) {
                ++subdirs;
                GANTRY_TRY(write_dir(*child, dir.inode->ino));
            } else if (!child->inode->written) {
                GANTRY_TRY(write_leaf(*child->inode, name));
            }
        }
        GANTRY_TRY(check(sqfs_dir_writer_begin(dw_, 0), "starting a directory listing"));
        for (auto& [name, child] : dir.children) {
            if (!child->emitted()) continue;
            const Inode& in = *child->inode;
            GANTRY_TRY(
                check(sqfs_dir_writer_add_entry(dw_, name.c_str(), in.ino, in.ref, static_cast<sqfs_u16>(in.mode)),
                      "adding directory entry", name));
        }
        GANTRY_TRY(check(sqfs_dir_writer_end(dw_), "finishing a directory listing"));

        Inode& self = *dir.inode;
        auto xattr = write_xattrs(self);
        if (!xattr) return xattr.error();
        sqfs_inode_generic_t* node = sqfs_dir_writer_create_inode(dw_, 2 + subdirs, *xattr, parent_ino);
        if (node == nullptr) return make_error("out of memory creating a directory inode");
        Defer free_node([&] { sqfs_free(node); });
        // POSIX count (2 + subdirectories), as on the file system the image was built from;
        // libsquashfs's helper counts every entry.
        if (node->base.type == SQFS_INODE_EXT_DIR) {
            node->data.dir_ext.nlink = static_cast<sqfs_u32>(2 + subdirs);
        } else {
            node->data.dir.nlink = static_cast<sqfs_u32>(2 + subdirs);
        }
        GANTRY_TRY(fill_base(*node, self));
        ++stats_.directories;
        return write_inode(*node, self, "directory");
    }

    [[nodiscard]] uint32_t count() const { return count_; }

private:
    static Status check(int rc, const char* what, const std::string& name = {}) {
        if (rc == 0) return {};
        return make_error(std::string(what) + (name.empty() ? "" : " '" + name + "'") + ": " + sqfs_error_name(rc));
    }

    Result<sqfs_u32> write_xattrs(const Inode& in) {
        if (in.xattrs.empty()) return sqfs_u32{0xFFFFFFFF};
        GANTRY_TRY(check(sqfs_xattr_writer_begin(xw_, 0), "recording xattrs"));
        for (const auto& [key, value] : in.xattrs)
            GANTRY_TRY(
                check(sqfs_xattr_writer_add(xw_, key.c_str(), value.data(), value.size()), "recording xattr", key));
        sqfs_u32 index = 0;
        GANTRY_TRY(check(sqfs_xattr_writer_end(xw_, &index), "recording xattrs"));
        return index;
    }

    Status fill_base(sqfs_inode_generic_t& node, const Inode& in) {
        node.base.mode = static_cast<sqfs_u16>(in.mode);
        GANTRY_TRY(check(sqfs_id_table_id_to_index(ids_, in.uid, &node.base.uid_idx), "recording uid"));
        GANTRY_TRY(check(sqfs_id_table_id_to_index(ids_, in.gid, &node.base.gid_idx), "recording gid"));
        node.base.mod_time = clamp_time(in.mtime);
        node.base.inode_number = in.ino;
        return {};
    }

    Status write_inode(sqfs_inode_generic_t& node, Inode& in, const char* kind) {
        sqfs_u64 block = 0;
        sqfs_u32 offset = 0;
        sqfs_meta_writer_get_position(im_, &block, &offset);
        in.ref = (block << 16) | offset;
        in.written = true;
        return check(sqfs_meta_writer_write_inode(im_, &node), "writing inode of a", kind);
    }

    Status write_leaf(Inode& in, const std::string& name) {
        auto xattr = write_xattrs(in);
        if (!xattr) return xattr.error();
        sqfs_inode_generic_t* node = nullptr;
        bool owned = true;  // ours to free; a regular file's inode belongs to `in`
        const uint32_t type = in.mode & 0170000;
        if (type == 0100000) {
            node = in.file;
            owned = false;
            if (node == nullptr) return make_error("internal error: no data written for file '" + name + "'");
            if (in.nlink > 1) {
                GANTRY_TRY(check(sqfs_inode_make_extended(node), "writing file", name));
                node->data.file_ext.nlink = in.nlink;
            }
            ++stats_.files;
        } else if (type == 0120000) {
            const std::string& target = in.symlink_target;
            node = static_cast<sqfs_inode_generic_t*>(std::calloc(1, sizeof(sqfs_inode_generic_t) + target.size()));
            if (node == nullptr) return make_error("out of memory");
            node->base.type = SQFS_INODE_SLINK;
            node->payload_bytes_available = node->payload_bytes_used = static_cast<sqfs_u32>(target.size());
            node->data.slink.nlink = in.nlink;
            node->data.slink.target_size = static_cast<sqfs_u32>(target.size());
            std::memcpy(node->extra, target.data(), target.size());
            ++stats_.symlinks;
        } else if (type == 0020000) {
            // An overlayfs whiteout (ImageTree::to_overlay_form): character device 0/0.
            node = static_cast<sqfs_inode_generic_t*>(std::calloc(1, sizeof(sqfs_inode_generic_t)));
            if (node == nullptr) return make_error("out of memory");
            node->base.type = SQFS_INODE_CDEV;
            node->data.dev.nlink = in.nlink;
            node->data.dev.devno = 0;
            ++stats_.others;
        } else {
            node = static_cast<sqfs_inode_generic_t*>(std::calloc(1, sizeof(sqfs_inode_generic_t)));
            if (node == nullptr) return make_error("out of memory");
            node->base.type = type == 0010000 ? SQFS_INODE_FIFO : SQFS_INODE_SOCKET;
            node->data.ipc.nlink = in.nlink;
            ++stats_.others;
        }
        Defer free_node([&] {
            if (owned) std::free(node);
        });
        if (*xattr != 0xFFFFFFFF)
            GANTRY_TRY(check(sqfs_inode_set_xattr_index(node, *xattr), "writing xattrs of", name));
        GANTRY_TRY(fill_base(*node, in));
        return write_inode(*node, in, "file");
    }

    ImageTree& tree_;
    sqfs_meta_writer_t* im_;
    sqfs_dir_writer_t* dw_;
    sqfs_id_table_t* ids_;
    sqfs_xattr_writer_t* xw_;
    ConversionStats& stats_;
    uint32_t count_ = 0;
};

}  // namespace

Result<uint64_t> SquashfsWriter::finish(ImageTree& tree, ConversionStats& stats, bool sync) {
    GANTRY_TRY(check(sqfs_block_processor_finish(proc_), "writing file data"));

    sqfs_meta_writer_t* im = sqfs_meta_writer_create(file_, cmp_, 0);
    sqfs_meta_writer_t* dm = sqfs_meta_writer_create(file_, cmp_, SQFS_META_WRITER_KEEP_IN_MEMORY);
    sqfs_dir_writer_t* dw = dm != nullptr ? sqfs_dir_writer_create(dm, 0) : nullptr;
    Defer destroy_meta([&] {
        sqfs_destroy(dw);
        sqfs_destroy(dm);
        sqfs_destroy(im);
    });
    if (im == nullptr || dm == nullptr || dw == nullptr) return make_error("out of memory creating metadata writers");

    super_.inode_table_start = file_->get_size(file_);
    TreeSerializer ser(tree, im, dw, ids_, xattrs_, stats);
    const uint32_t count = ser.number(tree.root());
    // The root's parent number is one past the last inode, as mksquashfs does.
    if (auto st = ser.write_dir(tree.root(), count + 1); !st) return st.error().wrap("writing " + path_);
    super_.root_inode_ref = tree.root().inode->ref;
    super_.inode_count = count;

    GANTRY_TRY(check(sqfs_meta_writer_flush(im), "writing the inode table"));
    super_.directory_table_start = file_->get_size(file_);
    GANTRY_TRY(check(sqfs_meta_writer_flush(dm), "writing the directory table"));
    GANTRY_TRY(check(sqfs_meta_write_write_to_file(dm), "writing the directory table"));
    GANTRY_TRY(check(sqfs_frag_table_write(frags_, file_, &super_, cmp_), "writing the fragment table"));
    GANTRY_TRY(check(sqfs_id_table_write(ids_, file_, &super_, cmp_), "writing the id table"));
    GANTRY_TRY(check(sqfs_xattr_writer_flush(xattrs_, file_, &super_, cmp_), "writing the xattr table"));

    if (!compress_data_)
        super_.flags |= SQFS_FLAG_UNCOMPRESSED_INODES | SQFS_FLAG_UNCOMPRESSED_DATA | SQFS_FLAG_UNCOMPRESSED_FRAGMENTS |
                        SQFS_FLAG_UNCOMPRESSED_IDS | SQFS_FLAG_UNCOMPRESSED_XATTRS;
    super_.bytes_used = file_->get_size(file_);
    // Pad to the device block size: loop devices and some tools read whole 4 KiB blocks.
    if (uint64_t tail = super_.bytes_used % kDevBlockSize; tail != 0) {
        GANTRY_TRY(check(file_->write_at(file_, super_.bytes_used, kZeros, kDevBlockSize - tail), "padding the image"));
    }
    GANTRY_TRY(check(sqfs_super_write(&super_, file_), "writing the super block"));
    const uint64_t total = file_->get_size(file_);

    // Closing flushes libsquashfs's file; the caller publishes by rename, so make the bytes durable first.
    sqfs_destroy(proc_);
    proc_ = nullptr;
    sqfs_destroy(file_);
    file_ = nullptr;
    if (sync) {
        UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd || ::fsync(fd.get()) != 0) return system_error("syncing " + path_);
    }
    return total;
}

}  // namespace gantry::squashfs
