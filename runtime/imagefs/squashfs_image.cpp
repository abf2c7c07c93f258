// Reading a squashfs image for the FUSE server (fuse_server.cpp) through libsquashfs, from many
// threads. libsquashfs's meta and data readers keep state (their current block), so each
// request borrows a Reader from a pool: as many Readers as threads ever ran at once, each with
// its own caches, none shared. What all threads share is immutable after open (super block, id
// table) or synchronised (the inode reference table: atomics; the listing cache: a mutex).
//
// The kernel only names inodes it got from us (lookup, readdirplus), so an inode's location is
// recorded when its directory is listed and found again by number; nothing is ever walked by path.
//
// libsquashfs allocates what the image declares before reading it (a table sized by a count in the
// super block, an xattr value sized by its header). Where that size is the image's word alone, it is
// checked here first (fragment table), or the structure is read here instead (xattrs: keys, values and
// their descriptors are read with a plain meta reader, each size bounded before anything is held).
#include "squashfs_image.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sqfs/block.h>
#include <sqfs/compressor.h>
#include <sqfs/data_reader.h>
#include <sqfs/dir.h>
#include <sqfs/error.h>
#include <sqfs/id_table.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/meta_reader.h>
#include <sqfs/super.h>
#include <sqfs/xattr.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "gantry/fd.hpp"

namespace gantry::imagefs {

namespace {

// Owning handles for libsquashfs objects (sqfs_destroy) and the memory it hands out (sqfs_free).
struct Destroy {
    void operator()(void* obj) const { sqfs_destroy(obj); }
};
template <typename T>
using Owned = std::unique_ptr<T, Destroy>;
struct Free {
    void operator()(void* p) const { sqfs_free(p); }
};
using InodePtr = std::unique_ptr<sqfs_inode_generic_t, Free>;

constexpr uint64_t no_table = ~uint64_t{0};
constexpr uint32_t no_xattrs = 0xFFFFFFFFu;
constexpr size_t name_max = 255;

Error corrupt(const std::string& what) {
    return Error{"corrupt image: " + what, EIO, 0};
}

// The image as a libsquashfs file: pread on one descriptor, so every Reader can share it. The
// object is a member of Shared (never sqfs_destroy'd), hence the empty destroy.
struct ImageFile {
    sqfs_file_t base{};
    int fd = -1;
    uint64_t size = 0;
};

// Whether `bytes` from `start` lie within a file of `size` bytes (no overflow).
bool lies_within(uint64_t start, uint64_t bytes, uint64_t size) {
    return start <= size && bytes <= size - start;
}

// The metadata blocks (8 KiB each, decompressed) a table of `count` entries of `entry` bytes takes;
// its block list holds one 8-byte start for each.
uint64_t metadata_blocks(uint64_t count, size_t entry) {
    return (count * entry + SQFS_META_BLOCK_SIZE - 1) / SQFS_META_BLOCK_SIZE;
}

int image_read_at(sqfs_file_t* file, sqfs_u64 offset, void* buffer, size_t size) {
    auto* f = reinterpret_cast<ImageFile*>(file);
    if (!lies_within(offset, size, f->size)) return SQFS_ERROR_OUT_OF_BOUNDS;
    auto* p = static_cast<char*>(buffer);
    while (size > 0) {
        ssize_t n = ::pread(f->fd, p, size, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return SQFS_ERROR_IO;
        p += n;
        offset += static_cast<uint64_t>(n);
        size -= static_cast<size_t>(n);
    }
    return 0;
}
int image_write_at(sqfs_file_t*, sqfs_u64, const void*, size_t) {
    return SQFS_ERROR_IO;
}
sqfs_u64 image_get_size(const sqfs_file_t* file) {
    return reinterpret_cast<const ImageFile*>(file)->size;
}
int image_truncate(sqfs_file_t*, sqfs_u64) {
    return SQFS_ERROR_IO;
}
void image_destroy(sqfs_object_t*) {}

bool is_dir(const sqfs_inode_generic_t& inode) {
    return inode.base.type == SQFS_INODE_DIR || inode.base.type == SQFS_INODE_EXT_DIR;
}

// The file type of a squashfs inode type (basic and extended), 0 for an unknown one.
mode_t file_type(unsigned type) {
    switch (type) {
        case SQFS_INODE_DIR:
        case SQFS_INODE_EXT_DIR:
            return S_IFDIR;
        case SQFS_INODE_FILE:
        case SQFS_INODE_EXT_FILE:
            return S_IFREG;
        case SQFS_INODE_SLINK:
        case SQFS_INODE_EXT_SLINK:
            return S_IFLNK;
        case SQFS_INODE_BDEV:
        case SQFS_INODE_EXT_BDEV:
            return S_IFBLK;
        case SQFS_INODE_CDEV:
        case SQFS_INODE_EXT_CDEV:
            return S_IFCHR;
        case SQFS_INODE_FIFO:
        case SQFS_INODE_EXT_FIFO:
            return S_IFIFO;
        case SQFS_INODE_SOCKET:
        case SQFS_INODE_EXT_SOCKET:
            return S_IFSOCK;
        default:
            return 0;
    }
}

uint32_t link_count(const sqfs_inode_generic_t& inode) {
    const auto& d = inode.data;
    switch (inode.base.type) {
        case SQFS_INODE_DIR:
            return d.dir.nlink;
        case SQFS_INODE_EXT_DIR:
            return d.dir_ext.nlink;
        case SQFS_INODE_FILE:
            return 1;
        case SQFS_INODE_EXT_FILE:
            return d.file_ext.nlink;
        case SQFS_INODE_SLINK:
            return d.slink.nlink;
        case SQFS_INODE_EXT_SLINK:
            return d.slink_ext.nlink;
        case SQFS_INODE_BDEV:
        case SQFS_INODE_CDEV:
            return d.dev.nlink;
        case SQFS_INODE_EXT_BDEV:
        case SQFS_INODE_EXT_CDEV:
            return d.dev_ext.nlink;
        case SQFS_INODE_FIFO:
        case SQFS_INODE_SOCKET:
            return d.ipc.nlink;
        default:
            return d.ipc_ext.nlink;
    }
}

}  // namespace

uint64_t kernel_ino(uint32_t image_number, uint32_t root_number) {
    if (image_number == root_number) return 1;
    if (image_number == 1) return root_number;
    return image_number;
}

uint32_t image_number(uint64_t kernel_ino, uint32_t root_number) {
    if (kernel_ino == 1) return root_number;
    if (kernel_ino == root_number) return 1;
    return static_cast<uint32_t>(kernel_ino);
}

// One thread's libsquashfs readers.
struct SquashfsImage::Reader {
    Owned<sqfs_compressor_t> compressor;
    Owned<sqfs_meta_reader_t> inodes;
    Owned<sqfs_meta_reader_t> dirs;
    Owned<sqfs_data_reader_t> data;
    Owned<sqfs_meta_reader_t> xattrs;  // null when the image has none
};

struct SquashfsImage::Shared {
    ImageLimits limits;
    UniqueFd fd;
    ImageFile file;
    sqfs_super_t super{};
    uint32_t root_number = 0;
    uint64_t root_ref = 0;
    uint64_t dir_table_end = 0;
    bool xattrs = false;
    // The xattr tables: key-value pairs from xattr_kv_start, then the descriptors (one per index, in
    // metadata blocks starting at xattr_id_blocks[]), then the id table's header and block list at
    // super.xattr_id_table_start.
    uint64_t xattr_kv_start = 0;
    uint32_t xattr_ids = 0;
    std::vector<uint64_t> xattr_id_blocks;
    std::vector<uint32_t> ids;

    // Inode number -> its reference (block << 16 | offset) + 1, 0 while unknown: chunks of 64 Ki
    // entries, each made the first time one of its inodes is listed (an image may claim 2^32 inodes).
    static constexpr unsigned chunk_bits = 16;
    std::unique_ptr<std::atomic<std::atomic<uint64_t>*>[]> refs;
    size_t ref_chunks = 0;

    std::mutex listings_mutex;
    std::unordered_map<uint64_t, std::shared_ptr<const Listing>> listings;
    size_t listed_entries = 0;

    std::mutex pool_mutex;
    std::vector<std::unique_ptr<Reader>> pool;

    ~Shared() {
        for (size_t i = 0; i < ref_chunks; ++i) delete[] refs[i].load();
    }

    Result<std::unique_ptr<Reader>> make_reader() {
        auto r = std::make_unique<Reader>();
        sqfs_compressor_config_t cfg{};
        if (sqfs_compressor_config_init(&cfg, static_cast<SQFS_COMPRESSOR>(super.compression_id), super.block_size,
                                        SQFS_COMP_FLAG_UNCOMPRESS) != 0)
            return Error{"unsupported compressor " + std::to_string(super.compression_id), EIO, 0};
        sqfs_compressor_t* cmp = nullptr;
        if (sqfs_compressor_create(&cfg, &cmp) != 0)
            return Error{"unsupported compressor " + std::to_string(super.compression_id), EIO, 0};
        r->compressor.reset(cmp);
        r->inodes.reset(sqfs_meta_reader_create(&file.base, cmp, super.inode_table_start, super.directory_table_start));
        r->dirs.reset(sqfs_meta_reader_create(&file.base, cmp, super.directory_table_start, dir_table_end));
        r->data.reset(sqfs_data_reader_create(&file.base, super.block_size, cmp, 0));
        if (!r->inodes || !r->dirs || !r->data) return Error{"out of memory", ENOMEM, 0};
        if (sqfs_data_reader_load_fragment_table(r->data.get(), &super) != 0) return corrupt("fragment table");
        if (xattrs) {
            r->xattrs.reset(sqfs_meta_reader_create(&file.base, cmp, xattr_kv_start, super.xattr_id_table_start));
            if (!r->xattrs) return Error{"out of memory", ENOMEM, 0};
        }
        return r;
    }

    std::atomic<uint64_t>* ref_slot(uint32_t number, bool create) {
        size_t chunk = number >> chunk_bits;
        if (chunk >= ref_chunks) return nullptr;
        std::atomic<uint64_t>* slots = refs[chunk].load(std::memory_order_acquire);
        if (slots == nullptr) {
            if (!create) return nullptr;
            auto* fresh = new std::atomic<uint64_t>[size_t{1} << chunk_bits]();
            if (refs[chunk].compare_exchange_strong(slots, fresh, std::memory_order_acq_rel)) {
                slots = fresh;
            } else {
                delete[] fresh;  // another thread made it first: `slots` is theirs
            }
        }
        return &slots[number & ((1u << chunk_bits) - 1)];
    }

    // The inode the kernel calls `ino`; ENOENT for one we never handed out.
    Result<InodePtr> inode(Reader& r, uint64_t ino) {
        if (ino == 0 || ino > super.inode_count) return Error{"no inode " + std::to_string(ino), ENOENT, 0};
        uint32_t number = image_number(ino, root_number);
        uint64_t ref = 0;
        if (number == root_number) {
            ref = root_ref;
        } else {
            auto* slot = ref_slot(number, false);
            uint64_t stored = slot != nullptr ? slot->load(std::memory_order_relaxed) : 0;
            if (stored == 0) return Error{"no inode " + std::to_string(ino), ENOENT, 0};
            ref = stored - 1;
        }
        auto read = read_inode(r, ref);
        if (!read) return corrupt("inode " + std::to_string(number));
        InodePtr out = std::move(*read);
        // A directory entry that names one number and points at an inode of another would give two
        // kernel inodes one identity; refuse it.
        if (out->base.inode_number != number || file_type(out->base.type) == 0)
            return corrupt("inode " + std::to_string(number));
        return out;
    }

    // The inode at `ref` (block relative to the inode table << 16 | offset), its sizes checked first.
    // Every inode is read through here.
    Result<InodePtr> read_inode(Reader& r, uint64_t ref) {
        GANTRY_TRY(check_inode_sizes(r, ref));
        // libsquashfs adds the inode table's start to the block itself.
        sqfs_inode_generic_t* raw = nullptr;
        if (sqfs_meta_reader_read_inode(r.inodes.get(), &super, ref >> 16, ref & 0xFFFF, &raw) != 0)
            return corrupt("inode at " + std::to_string(ref));
        return InodePtr(raw);
    }

    // libsquashfs allocates an inode's variable part at the size its header states before reading
    // it: a file's block list (4 bytes per block of file_size, a 64-bit size for extended inodes)
    // and a symlink's target (32-bit size). Both are read here first and bounded: a block list can
    // be no longer than the inode table could hold decompressed (each metadata block of at most 8 KiB
    // takes at least 3 bytes on disk) nor than limits.max_file_blocks; a target no longer than PATH_MAX.
    Result<void> check_inode_sizes(Reader& r, uint64_t ref) {
        sqfs_meta_reader_t* m = r.inodes.get();
        auto read = [m](auto& part) { return sqfs_meta_reader_read(m, &part, sizeof part) == 0; };
        const auto bad = [ref](const std::string& what) { return corrupt(what + " at " + std::to_string(ref)); };
        sqfs_inode_t base{};
        if (sqfs_meta_reader_seek(m, super.inode_table_start + (ref >> 16), ref & 0xFFFF) != 0 || !read(base))
            return bad("inode");
        uint64_t file_size = 0;
        const unsigned type = le16toh(base.type);
        if (type == SQFS_INODE_FILE) {
            sqfs_inode_file_t f{};
            if (!read(f)) return bad("inode");
            file_size = le32toh(f.file_size);
        } else if (type == SQFS_INODE_EXT_FILE) {
            sqfs_inode_file_ext_t f{};
            if (!read(f)) return bad("inode");
            file_size = le64toh(f.file_size);
        } else if (type == SQFS_INODE_SLINK || type == SQFS_INODE_EXT_SLINK) {
            sqfs_inode_slink_t l{};
            if (!read(l) || le32toh(l.target_size) >= PATH_MAX) return bad("symbolic link");
            return {};
        } else {
            return {};
        }
        const uint64_t blocks = file_size / super.block_size + 1;
        const uint64_t table_bytes = super.directory_table_start > super.inode_table_start
                                         ? super.directory_table_start - super.inode_table_start
                                         : 0;
        if (blocks > limits.max_file_blocks || blocks * sizeof(sqfs_u32) > table_bytes / 3 * SQFS_META_BLOCK_SIZE)
            return bad("file of " + std::to_string(file_size) + " bytes");
        return {};
    }

    Result<struct stat> stat_of(const sqfs_inode_generic_t& inode, uint64_t ino) const {
        struct stat st {};
        st.st_ino = ino;
        st.st_mode = file_type(inode.base.type) | (inode.base.mode & 07777);
        st.st_nlink = link_count(inode);
        if (inode.base.uid_idx >= ids.size() || inode.base.gid_idx >= ids.size())
            return corrupt("id index of inode " + std::to_string(inode.base.inode_number));
        st.st_uid = ids[inode.base.uid_idx];
        st.st_gid = ids[inode.base.gid_idx];
        st.st_mtim.tv_sec = inode.base.mod_time;
        st.st_atim = st.st_ctim = st.st_mtim;
        st.st_blksize = super.block_size;
        const auto& d = inode.data;
        switch (inode.base.type) {
            case SQFS_INODE_DIR:
                st.st_size = d.dir.size;
                break;
            case SQFS_INODE_EXT_DIR:
                st.st_size = d.dir_ext.size;
                break;
            case SQFS_INODE_FILE:
            case SQFS_INODE_EXT_FILE: {
                sqfs_u64 size = 0;
                sqfs_inode_get_file_size(&inode, &size);
                st.st_size = static_cast<off_t>(std::min<sqfs_u64>(size, LLONG_MAX));
                st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
                break;
            }
            case SQFS_INODE_SLINK:
                st.st_size = d.slink.target_size;
                break;
            case SQFS_INODE_EXT_SLINK:
                st.st_size = d.slink_ext.target_size;
                break;
            case SQFS_INODE_BDEV:
            case SQFS_INODE_CDEV:
            case SQFS_INODE_EXT_BDEV:
            case SQFS_INODE_EXT_CDEV: {
                // The kernel's "new" encoding: 12 bits of major, 20 of minor, split around it.
                uint32_t devno = inode.base.type <= SQFS_INODE_CDEV ? d.dev.devno : d.dev_ext.devno;
                st.st_rdev = makedev((devno & 0xFFF00u) >> 8, (devno & 0xFFu) | ((devno >> 12) & 0xFFF00u));
                break;
            }
            default:
                break;
        }
        return st;
    }
};

namespace {

// A Reader borrowed from the pool for one request; returned (caches warm) when it ends.
class Lease {
public:
    explicit Lease(SquashfsImage::Shared& shared) : shared_(shared) {
        std::lock_guard lock(shared.pool_mutex);
        if (!shared.pool.empty()) {
            reader_ = std::move(shared.pool.back());
            shared.pool.pop_back();
        }
    }
    ~Lease() {
        if (!reader_) return;
        std::lock_guard lock(shared_.pool_mutex);
        shared_.pool.push_back(std::move(reader_));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    // The reader, made on first use when the pool had none.
    Result<SquashfsImage::Reader*> get() {
        if (!reader_) {
            auto made = shared_.make_reader();
            if (!made) return made.error();
            reader_ = std::move(*made);
        }
        return reader_.get();
    }

private:
    SquashfsImage::Shared& shared_;
    std::unique_ptr<SquashfsImage::Reader> reader_;
};

}  // namespace

namespace {

// The xattr id table's header (where the key-value pairs start, how many descriptors) and the block
// list of its descriptors, each checked to lie inside the file before it is held.
Result<void> load_xattr_table(SquashfsImage::Shared& s) {
    const sqfs_super_t& sb = s.super;
    sqfs_xattr_id_table_t header{};
    if (sb.xattr_id_table_start >= s.file.size ||
        image_read_at(&s.file.base, sb.xattr_id_table_start, &header, sizeof header) != 0)
        return corrupt("xattr table");
    s.xattr_kv_start = le64toh(header.xattr_table_start);
    s.xattr_ids = le32toh(header.xattr_ids);
    const uint64_t blocks = metadata_blocks(s.xattr_ids, sizeof(sqfs_xattr_id_t));
    const uint64_t list_start = sb.xattr_id_table_start + sizeof header;
    if (s.xattr_kv_start >= sb.xattr_id_table_start || !lies_within(list_start, blocks * sizeof(uint64_t), s.file.size))
        return corrupt("xattr table");
    s.xattr_id_blocks.resize(blocks);
    if (blocks > 0 && image_read_at(&s.file.base, list_start, s.xattr_id_blocks.data(), blocks * sizeof(uint64_t)) != 0)
        return corrupt("xattr table");
    for (uint64_t& start : s.xattr_id_blocks) {
        start = le64toh(start);
        if (start < s.xattr_kv_start || start >= sb.xattr_id_table_start) return corrupt("xattr table");
    }
    return {};
}

// Reads exactly out.size() bytes at the meta reader's position.
bool meta_read(sqfs_meta_reader_t* m, void* out, size_t size) {
    return size == 0 || sqfs_meta_reader_read(m, out, size) == 0;
}

// Seeks to a reference into the key-value area: (block relative to its start << 16) | offset.
bool meta_seek_kv(sqfs_meta_reader_t* m, uint64_t kv_start, uint64_t ref) {
    return sqfs_meta_reader_seek(m, kv_start + (ref >> 16), ref & 0xFFFF) == 0;
}

}  // namespace

SquashfsImage::SquashfsImage(std::unique_ptr<Shared> shared) : shared_(std::move(shared)) {}
SquashfsImage::~SquashfsImage() = default;

Result<std::unique_ptr<SquashfsImage>> SquashfsImage::open(const std::string& path, ImageLimits limits) {
    auto s = std::make_unique<Shared>();
    s->limits = limits;
    s->fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!s->fd) return system_error("opening image " + path);
    struct stat st {};
    if (::fstat(s->fd.get(), &st) != 0) return system_error("opening image " + path);
    if (!S_ISREG(st.st_mode)) return Error{"opening image " + path + ": not a regular file", EINVAL, 0};
    s->file.base.base.destroy = image_destroy;
    s->file.base.read_at = image_read_at;
    s->file.base.write_at = image_write_at;
    s->file.base.get_size = image_get_size;
    s->file.base.truncate = image_truncate;
    s->file.fd = s->fd.get();
    s->file.size = static_cast<uint64_t>(st.st_size);
    std::string what = "reading image " + path;
    if (sqfs_super_read(&s->super, &s->file.base) != 0) return corrupt(what + ": not a squashfs image");
    const sqfs_super_t& sb = s->super;
    // Where the directory table ends: at the next table, whichever comes first.
    s->dir_table_end = std::min<uint64_t>(sb.bytes_used, s->file.size);
    for (uint64_t start : {sb.fragment_table_start, sb.export_table_start, sb.id_table_start, sb.xattr_id_table_start})
        if (start != no_table && start > sb.directory_table_start) s->dir_table_end = std::min(s->dir_table_end, start);
    s->xattrs = (sb.flags & SQFS_FLAG_NO_XATTRS) == 0 && sb.xattr_id_table_start != no_table;
    // libsquashfs reads the whole fragment table into each Reader, sized by the super block's count
    // alone: bound the count first. Each fragment block holds the tail of at least one file, so there
    // are never more than inodes, and the table's block list must lie inside the file.
    if (sb.fragment_entry_count > 0 &&
        (sb.fragment_entry_count > limits.max_fragments || sb.fragment_entry_count > sb.inode_count ||
         !lies_within(sb.fragment_table_start,
                      metadata_blocks(sb.fragment_entry_count, sizeof(sqfs_fragment_t)) * sizeof(uint64_t),
                      s->file.size)))
        return corrupt(what + ": fragment table");
    if (s->xattrs) {
        if (auto loaded = load_xattr_table(*s); !loaded) return loaded.error().wrap(what);
    }
    s->root_ref = sb.root_inode_ref;
    s->ref_chunks = (size_t{sb.inode_count} >> Shared::chunk_bits) + 1;
    s->refs = std::make_unique<std::atomic<std::atomic<uint64_t>*>[]>(s->ref_chunks);

    auto reader = s->make_reader();
    if (!reader) return reader.error().wrap(what);
    auto read_root = s->read_inode(**reader, s->root_ref);
    if (!read_root) return corrupt(what + ": root inode");
    InodePtr root = std::move(*read_root);
    if (!is_dir(*root) || root->base.inode_number == 0 || root->base.inode_number > sb.inode_count)
        return corrupt(what + ": root inode");
    s->root_number = root->base.inode_number;

    Owned<sqfs_id_table_t> table(sqfs_id_table_create(0));
    if (!table) return Error{"out of memory", ENOMEM, 0};
    if (sqfs_id_table_read(table.get(), &s->file.base, &sb, (*reader)->compressor.get()) != 0)
        return corrupt(what + ": id table");
    for (uint16_t i = 0; i < sb.id_count; ++i) {
        sqfs_u32 id = 0;
        if (sqfs_id_table_index_to_id(table.get(), i, &id) != 0) return corrupt(what + ": id table");
        s->ids.push_back(id);
    }
    s->pool.push_back(std::move(*reader));
    return std::unique_ptr<SquashfsImage>(new SquashfsImage(std::move(s)));
}

Result<std::shared_ptr<const Listing>> SquashfsImage::list(uint64_t dir) {
    Shared& s = *shared_;
    {
        std::lock_guard lock(s.listings_mutex);
        auto it = s.listings.find(dir);
        if (it != s.listings.end()) return it->second;
    }
    Lease lease(s);
    auto r = lease.get();
    if (!r) return r.error();
    auto inode = s.inode(**r, dir);
    if (!inode) return inode.error();
    if (!is_dir(**inode)) return Error{"not a directory", ENOTDIR, 0};
    sqfs_readdir_state_t state{};
    if (sqfs_readdir_state_init(&state, &s.super, inode->get()) != 0)
        return corrupt("directory " + std::to_string(dir));
    if (state.init.size > s.limits.max_listing_bytes)
        return corrupt("directory " + std::to_string(dir) + " is larger than " +
                       std::to_string(s.limits.max_listing_bytes) + " bytes");
    auto listing = std::make_shared<Listing>();
    for (;;) {
        sqfs_dir_entry_t* raw = nullptr;
        sqfs_u32 number = 0;
        sqfs_u64 ref = 0;
        int ret = sqfs_meta_reader_readdir((*r)->dirs.get(), &state, &raw, &number, &ref);
        if (ret > 0) break;
        if (ret < 0) return corrupt("directory " + std::to_string(dir));
        std::unique_ptr<sqfs_dir_entry_t, Free> ent(raw);
        size_t len = size_t{ent->size} + 1;
        std::string_view name(reinterpret_cast<const char*>(ent->name), len);
        // Names the kernel could not take or that would alias another entry are left out.
        if (len > name_max || name == "." || name == ".." ||
            name.find_first_of(std::string_view("/\0", 2)) != name.npos)
            continue;
        mode_t type = file_type(ent->type);
        if (type == 0 || number == 0 || number > s.super.inode_count)
            return corrupt("directory " + std::to_string(dir));
        auto* slot = s.ref_slot(number, true);
        if (slot == nullptr) return corrupt("directory " + std::to_string(dir));
        slot->store(ref + 1, std::memory_order_relaxed);
        listing->push_back(
            DirEntry{std::string(name), kernel_ino(number, s.root_number), static_cast<unsigned char>(IFTODT(type))});
    }
    std::shared_ptr<const Listing> out = std::move(listing);
    std::lock_guard lock(s.listings_mutex);
    if (s.listed_entries + out->size() > s.limits.cached_entries) {
        s.listings.clear();
        s.listed_entries = 0;
    }
    if (s.listings.emplace(dir, out).second) s.listed_entries += out->size();
    return out;
}

Result<std::optional<DirEntry>> SquashfsImage::lookup(uint64_t dir, std::string_view name) {
    auto listing = list(dir);
    if (!listing) return listing.error();
    const Listing& l = **listing;
    // squashfs keeps a directory sorted by name (bytewise); an image that is not finds less, no worse.
    auto it = std::lower_bound(l.begin(), l.end(), name,
                               [](const DirEntry& e, std::string_view n) { return std::string_view(e.name) < n; });
    if (it == l.end() || it->name != name) return std::optional<DirEntry>();
    return std::optional<DirEntry>(*it);
}

Result<uint64_t> SquashfsImage::parent(uint64_t dir) {
    Shared& s = *shared_;
    Lease lease(s);
    auto r = lease.get();
    if (!r) return r.error();
    auto inode = s.inode(**r, dir);
    if (!inode) return inode.error();
    if (!is_dir(**inode)) return Error{"not a directory", ENOTDIR, 0};
    uint32_t p =
        (*inode)->base.type == SQFS_INODE_DIR ? (*inode)->data.dir.parent_inode : (*inode)->data.dir_ext.parent_inode;
    // The root's parent is stored as inode_count + 1; anything out of range is the root too.
    if (dir == 1 || p == 0 || p > s.super.inode_count) return uint64_t{1};
    return kernel_ino(p, s.root_number);
}

Result<struct stat> SquashfsImage::attributes(uint64_t ino) {
    Shared& s = *shared_;
    Lease lease(s);
    auto r = lease.get();
    if (!r) return r.error();
    auto inode = s.inode(**r, ino);
    if (!inode) return inode.error();
    return s.stat_of(**inode, ino);
}

Result<std::string> SquashfsImage::read_link(uint64_t ino) {
    Shared& s = *shared_;
    Lease lease(s);
    auto r = lease.get();
    if (!r) return r.error();
    auto inode = s.inode(**r, ino);
    if (!inode) return inode.error();
    const auto& i = **inode;
    if (i.base.type != SQFS_INODE_SLINK && i.base.type != SQFS_INODE_EXT_SLINK)
        return Error{"not a symbolic link", EINVAL, 0};
    uint32_t size = i.base.type == SQFS_INODE_SLINK ? i.data.slink.target_size : i.data.slink_ext.target_size;
    if (size >= PATH_MAX || size > i.payload_bytes_used) return corrupt("symbolic link " + std::to_string(ino));
    return std::string(reinterpret_cast<const char*>(i.extra), size);
}

Result<size_t> SquashfsImage::read(uint64_t ino, uint64_t offset, std::span<char> out) {
    Shared& s = *shared_;
    Lease lease(s);
    auto r = lease.get();
    if (!r) return r.error();
    auto inode = s.inode(**r, ino);
    if (!inode) return inode.error();
    if (file_type((*inode)->base.type) != S_IFREG) return Error{"not a regular file", EISDIR, 0};
    sqfs_u64 size = 0;
    sqfs_inode_get_file_size(inode->get(), &size);
    if (offset >= size || out.empty()) return size_t{0};
    auto want = static_cast<sqfs_u32>(std::min<uint64_t>({out.size(), size - offset, uint64_t{1} << 30}));
    sqfs_s32 n = sqfs_data_reader_read((*r)->data.get(), inode->get(), offset, out.data(), want);
    if (n < 0) return corrupt("file " + std::to_string(ino));
    return static_cast<size_t>(n);
}

Result<std::vector<std::pair<std::string, std::string>>> SquashfsImage::xattrs(uint64_t ino) {
    Shared& s = *shared_;
    std::vector<std::pair<std::string, std::string>> out;
    Lease lease(s);
    auto r = lease.get();
    if (!r) return r.error();
    auto inode = s.inode(**r, ino);
    if (!inode) return inode.error();
    sqfs_u32 index = no_xattrs;
    if (!s.xattrs || sqfs_inode_get_xattr_index(inode->get(), &index) != 0 || index == no_xattrs) return out;
    auto bad = [ino] { return corrupt("xattrs of " + std::to_string(ino)); };
    sqfs_meta_reader_t* m = (*r)->xattrs.get();
    // The inode's descriptor: where its pairs start and how many there are.
    if (index >= s.xattr_ids) return bad();
    uint64_t at = uint64_t{index} * sizeof(sqfs_xattr_id_t);
    sqfs_xattr_id_t desc{};
    if (sqfs_meta_reader_seek(m, s.xattr_id_blocks[at / SQFS_META_BLOCK_SIZE], at % SQFS_META_BLOCK_SIZE) != 0 ||
        !meta_read(m, &desc, sizeof desc))
        return bad();
    desc.xattr = le64toh(desc.xattr);
    desc.count = le32toh(desc.count);
    if (desc.count > s.limits.max_xattrs || !meta_seek_kv(m, s.xattr_kv_start, desc.xattr)) return bad();
    for (sqfs_u32 i = 0; i < desc.count; ++i) {
        // A key: type (prefix and the out-of-line flag) and the name's size (16 bits: bounded).
        uint16_t key[2] = {};
        if (!meta_read(m, key, sizeof key)) return bad();
        const unsigned type = le16toh(key[0]);
        std::string name(le16toh(key[1]), '\0');
        if (!meta_read(m, name.data(), name.size())) return bad();
        // Its value: a 32-bit size and the bytes, or (out of line) the reference of a value stored
        // once for many inodes. The size is checked before anything is held.
        uint32_t value_size = 0;
        if (!meta_read(m, &value_size, sizeof value_size)) return bad();
        value_size = le32toh(value_size);
        sqfs_u64 back_block = 0;
        size_t back_offset = 0;
        const bool out_of_line = (type & SQFS_XATTR_FLAG_OOL) != 0;
        if (out_of_line) {
            uint64_t ref = 0;
            if (value_size != sizeof ref || !meta_read(m, &ref, sizeof ref)) return bad();
            sqfs_meta_reader_get_position(m, &back_block, &back_offset);
            if (!meta_seek_kv(m, s.xattr_kv_start, le64toh(ref)) || !meta_read(m, &value_size, sizeof value_size))
                return bad();
            value_size = le32toh(value_size);
        }
        if (value_size > s.limits.max_xattr_value) return bad();
        std::string value(value_size, '\0');
        if (!meta_read(m, value.data(), value.size())) return bad();
        if (out_of_line && sqfs_meta_reader_seek(m, back_block, back_offset) != 0) return bad();
        // Unknown prefixes and names the kernel could not take are left out.
        const char* prefix = sqfs_get_xattr_prefix(static_cast<SQFS_XATTR_TYPE>(type & SQFS_XATTR_PREFIX_MASK));
        if (prefix == nullptr || name.find('\0') != std::string::npos) continue;
        out.emplace_back(prefix + name, std::move(value));
    }
    return out;
}

bool SquashfsImage::has_xattrs() const {
    return shared_->xattrs;
}

struct statvfs SquashfsImage::filesystem() const {
    const sqfs_super_t& sb = shared_->super;
    struct statvfs v {};
    v.f_bsize = v.f_frsize = sb.block_size;
    v.f_blocks = (sb.bytes_used + sb.block_size - 1) / sb.block_size;
    v.f_files = sb.inode_count;
    v.f_namemax = name_max;
    v.f_flag = ST_RDONLY;
    return v;
}

}  // namespace gantry::imagefs
