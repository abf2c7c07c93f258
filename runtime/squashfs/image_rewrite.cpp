// gantry::add_files_to_image: a copy of a squashfs image with files added on top (an export's
// /etc/environment and /etc/rc); gantry::compose_layers_to_image: the same for the stack of a layered
// image's layer files, merged as overlayfs merges them. The images are read with libsquashfs and
// written by the converter's own ImageTree and SquashfsWriter, so the copy keeps every owner, mode,
// time, xattr and hard link, and the added files win over the image's own exactly as a higher layer's
// would: the ImageTree's walk from the top layer down applies the same rules as a conversion's.
#include <sqfs/compressor.h>
#include <sqfs/data_reader.h>
#include <sqfs/dir_reader.h>
#include <sqfs/error.h>
#include <sqfs/id_table.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/super.h>
#include <sqfs/xattr.h>
#include <sqfs/xattr_reader.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <exception>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "gantry/squashfs.hpp"
#include "image_tree.hpp"
#include "sqfs_handles.hpp"
#include "squashfs_writer.hpp"

namespace gantry {
namespace {

using squashfs::ImageTree;
using squashfs::Inode;
using squashfs::SqfsFree;
using squashfs::SqfsPtr;
using squashfs::SquashfsWriter;
using squashfs::TreeNode;

struct TreeFree {
    void operator()(sqfs_tree_node_t* n) const { sqfs_dir_tree_destroy(n); }
};

uint32_t type_bits(const sqfs_inode_generic_t* in) {
    switch (in->base.type) {
        case SQFS_INODE_DIR:
        case SQFS_INODE_EXT_DIR:
            return 0040000;
        case SQFS_INODE_FILE:
        case SQFS_INODE_EXT_FILE:
            return 0100000;
        case SQFS_INODE_SLINK:
        case SQFS_INODE_EXT_SLINK:
            return 0120000;
        case SQFS_INODE_FIFO:
        case SQFS_INODE_EXT_FIFO:
            return 0010000;
        case SQFS_INODE_SOCKET:
        case SQFS_INODE_EXT_SOCKET:
            return 0140000;
        default:
            return 0;  // devices: never in an image Gantry wrote; skipped like the converter does
    }
}

// The open input image and its readers.
struct Source {
    SqfsPtr<sqfs_file_t> file;
    sqfs_super_t super{};
    SqfsPtr<sqfs_compressor_t> cmp;
    SqfsPtr<sqfs_dir_reader_t> dirs;
    SqfsPtr<sqfs_id_table_t> ids;
    SqfsPtr<sqfs_data_reader_t> data;
    SqfsPtr<sqfs_xattr_reader_t> xattrs;

    Status open(const std::string& path) {
        const std::string what = "reading image " + path;
        file.reset(sqfs_open_file(path.c_str(), SQFS_FILE_OPEN_READ_ONLY));
        if (!file) return make_error(what + ": cannot open it");
        if (sqfs_super_read(&super, file.get()) != 0) return make_error(what + ": not a squashfs image");
        sqfs_compressor_config_t cfg{};
        sqfs_compressor_t* raw = nullptr;
        if (sqfs_compressor_config_init(&cfg, static_cast<SQFS_COMPRESSOR>(super.compression_id), super.block_size,
                                        SQFS_COMP_FLAG_UNCOMPRESS) != 0 ||
            sqfs_compressor_create(&cfg, &raw) != 0)
            return make_error(what + ": unsupported compressor");
        cmp.reset(raw);
        dirs.reset(sqfs_dir_reader_create(&super, cmp.get(), file.get(), 0));
        ids.reset(sqfs_id_table_create(0));
        data.reset(sqfs_data_reader_create(file.get(), super.block_size, cmp.get(), 0));
        xattrs.reset(sqfs_xattr_reader_create(0));
        if (!dirs || !ids || !data || !xattrs) return make_error(what + ": out of memory");
        if (sqfs_id_table_read(ids.get(), file.get(), &super, cmp.get()) != 0)
            return make_error(what + ": corrupt id table");
        if (sqfs_data_reader_load_fragment_table(data.get(), &super) != 0)
            return make_error(what + ": corrupt fragment table");
        if (sqfs_xattr_reader_load(xattrs.get(), &super, file.get(), cmp.get()) != 0)
            return make_error(what + ": corrupt xattr table");
        return {};
    }

    Result<std::vector<std::pair<std::string, std::string>>> xattrs_of(const sqfs_inode_generic_t* in) {
        std::vector<std::pair<std::string, std::string>> out;
        sqfs_u32 index = 0xFFFFFFFF;
        if (sqfs_inode_get_xattr_index(in, &index) != 0 || index == 0xFFFFFFFF) return out;
        sqfs_xattr_id_t desc{};
        if (sqfs_xattr_reader_get_desc(xattrs.get(), index, &desc) != 0 ||
            sqfs_xattr_reader_seek_kv(xattrs.get(), &desc) != 0)
            return make_error("corrupt xattr table");
        for (sqfs_u32 i = 0; i < desc.count; ++i) {
            sqfs_xattr_entry_t* key = nullptr;
            sqfs_xattr_value_t* value = nullptr;
            if (sqfs_xattr_reader_read_key(xattrs.get(), &key) != 0) return make_error("corrupt xattr key");
            std::unique_ptr<sqfs_xattr_entry_t, SqfsFree> key_guard(key);
            if (sqfs_xattr_reader_read_value(xattrs.get(), key, &value) != 0) return make_error("corrupt xattr value");
            std::unique_ptr<sqfs_xattr_value_t, SqfsFree> value_guard(value);
            // read_key hands back the whole name, prefix included ("user.x"), NUL-terminated.
            out.emplace_back(std::string(reinterpret_cast<const char*>(key->key)),
                             std::string(reinterpret_cast<const char*>(value->value), value->size));
        }
        std::sort(out.begin(), out.end());
        return out;
    }
};

// An overlayfs whiteout: a character device 0/0.
bool is_whiteout(const sqfs_inode_generic_t* in) {
    if (in->base.type == SQFS_INODE_CDEV) return in->data.dev.devno == 0;
    if (in->base.type == SQFS_INODE_EXT_CDEV) return in->data.dev_ext.devno == 0;
    return false;
}

// Copies one image's tree into the ImageTree as layer `layer`. With `opaque_xattr` (a layer in
// overlay form), whiteouts delete their paths and opaque markers empty their directories for the
// layers below, as overlayfs reads them.
class Copier {
public:
    Copier(Source& src, ImageTree& tree, SquashfsWriter& writer, int layer = 0,
           const std::string* opaque_xattr = nullptr)
        : src_(src), tree_(tree), writer_(writer), layer_(layer), opaque_xattr_(opaque_xattr) {}

    Status copy(const sqfs_tree_node_t* node, std::vector<std::string>& path) {
        const sqfs_inode_generic_t* in = node->inode;
        if (opaque_xattr_ != nullptr && is_whiteout(in)) {
            if (!path.empty()) tree_.whiteout(path, layer_);
            return {};
        }
        const uint32_t type = type_bits(in);
        if (type != 0) GANTRY_TRY(place(node, path, type));
        if (type == 0040000) {
            for (const sqfs_tree_node_t* c = node->children; c != nullptr; c = c->next) {
                path.emplace_back(reinterpret_cast<const char*>(c->name));
                auto st = copy(c, path);
                path.pop_back();
                if (!st) return st;
            }
        }
        return {};
    }

private:
    Status place(const sqfs_tree_node_t* node, const std::vector<std::string>& path, uint32_t type) {
        const sqfs_inode_generic_t* in = node->inode;
        const bool is_dir = type == 0040000;
        std::optional<std::vector<std::pair<std::string, std::string>>> dir_xattrs;
        if (is_dir && opaque_xattr_ != nullptr) {
            // The opaque marker empties the directory for the layers below, and is not copied: the
            // composed tree has no layers below to hide.
            auto xattrs = src_.xattrs_of(in);
            if (!xattrs) return xattrs.error().wrap("reading /" + squashfs::join_path(path));
            auto marker = std::find_if(xattrs->begin(), xattrs->end(),
                                       [&](const auto& kv) { return kv.first == *opaque_xattr_; });
            if (marker != xattrs->end()) {
                if (marker->second == "y") tree_.make_opaque(path, layer_);
                xattrs->erase(marker);
            }
            dir_xattrs = std::move(*xattrs);
        }
        TreeNode* slot = tree_.place(path, layer_, is_dir);
        if (slot == nullptr) return {};  // a higher layer, or an added file, has this path
        // A hard link: the same inode number seen before.
        if (!is_dir) {
            auto seen = by_number_.find(in->base.inode_number);
            if (seen != by_number_.end()) {
                slot->inode = seen->second;
                return {};
            }
        }
        auto inode = std::make_unique<Inode>();
        inode->mode = type | (in->base.mode & 07777u);
        inode->uid = node->uid;
        inode->gid = node->gid;
        inode->mtime = in->base.mod_time;
        if (dir_xattrs) {
            inode->xattrs = std::move(*dir_xattrs);
        } else {
            auto xattrs = src_.xattrs_of(in);
            if (!xattrs) return xattrs.error().wrap("reading /" + squashfs::join_path(path));
            inode->xattrs = std::move(*xattrs);
        }
        if (type == 0120000) {
            const uint32_t n =
                in->base.type == SQFS_INODE_SLINK ? in->data.slink.target_size : in->data.slink_ext.target_size;
            inode->symlink_target.assign(reinterpret_cast<const char*>(in->extra), n);
        }
        sqfs_u64 size = 0;
        if (type == 0100000) (void)sqfs_inode_get_file_size(in, &size);
        inode->size = size;
        Inode* adopted = tree_.adopt(std::move(inode));
        slot->inode = adopted;
        if (!is_dir) by_number_[in->base.inode_number] = adopted;
        if (type == 0100000) GANTRY_TRY(copy_data(in, adopted, path));
        return {};
    }

    Status copy_data(const sqfs_inode_generic_t* in, Inode* out, const std::vector<std::string>& path) {
        GANTRY_TRY(writer_.begin_file(out));
        std::vector<char> buf(1 << 20);
        for (uint64_t offset = 0; offset < out->size;) {
            const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), out->size - offset));
            sqfs_s32 got = sqfs_data_reader_read(src_.data.get(), in, offset, buf.data(), static_cast<sqfs_u32>(want));
            if (got <= 0)
                return make_error("reading the data of /" + squashfs::join_path(path) + ": " +
                                  squashfs::sqfs_error_name(got));
            GANTRY_TRY(writer_.append(buf.data(), static_cast<size_t>(got)));
            offset += static_cast<uint64_t>(got);
        }
        return writer_.end_file();
    }

    Source& src_;
    ImageTree& tree_;
    SquashfsWriter& writer_;
    const int layer_;
    const std::string* const opaque_xattr_;
    std::unordered_map<uint32_t, Inode*> by_number_;  // this image's inode numbers
};

// `inputs` bottom first; `opaque_xattr` non-null: they are layers in overlay form. `overlay_out`
// (with `opaque_xattr`): the output is one layer in overlay form again, for layers below it.
Result<ConversionStats> rewrite(const std::vector<std::string>& inputs, const std::string& output,
                                const std::vector<AddedFile>& added, const SquashfsOptions& options,
                                const std::string* opaque_xattr, bool overlay_out = false) {
    ImageTree tree;  // outlives the writer, whose block processor points into its inodes
    auto created = SquashfsWriter::create(output, options);
    if (!created) return created.error();
    std::unique_ptr<SquashfsWriter> writer = std::move(*created);
    bool done = false;
    struct RemovePartial {
        const std::string& path;
        bool& done;
        ~RemovePartial() {
            if (!done) ::unlink(path.c_str());
        }
    } remove_partial{output, done};

    // The added files first: the walk is top-down, so they win their paths over the image's.
    const int64_t now = static_cast<int64_t>(std::time(nullptr));
    for (const auto& f : added) {
        std::string_view rel = f.path;
        while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
        auto path = squashfs::split_entry_path(rel);
        if (!path || path->empty()) return make_error("adding " + f.path + " to " + output + ": not a file path");
        TreeNode* slot = tree.place(*path, static_cast<int>(inputs.size()), false);
        if (slot == nullptr) return make_error("adding " + f.path + " to " + output + ": the path is taken");
        auto inode = std::make_unique<Inode>();
        inode->mode = 0100000 | (f.mode & 07777u);
        inode->mtime = now;
        inode->size = f.content.size();
        Inode* in = tree.adopt(std::move(inode));
        slot->inode = in;
        GANTRY_TRY(writer->begin_file(in));
        GANTRY_TRY(writer->append(f.content.data(), f.content.size()));
        GANTRY_TRY(writer->end_file());
    }
    // From the top layer down, one image open at a time: each file's data is written as it is placed.
    for (size_t i = inputs.size(); i-- > 0;) {
        const std::string& input = inputs[i];
        Source src;
        GANTRY_TRY(src.open(input));
        sqfs_tree_node_t* raw_root = nullptr;
        if (int rc = sqfs_dir_reader_get_full_hierarchy(src.dirs.get(), src.ids.get(), nullptr, 0, &raw_root); rc != 0)
            return make_error("reading image " + input + ": " + squashfs::sqfs_error_name(rc));
        std::unique_ptr<sqfs_tree_node_t, TreeFree> root(raw_root);
        Copier copier(src, tree, *writer, static_cast<int>(i), opaque_xattr);
        std::vector<std::string> path;
        if (auto st = copier.copy(root.get(), path); !st) return st.error().wrap("copying image " + input);
    }
    // What the inputs delete or hide and do not put back must still be deleted or hidden in the
    // layers below the output: the tree's whiteout and opaque records become markers again.
    if (overlay_out) tree.to_overlay_form(*opaque_xattr);
    ConversionStats stats;
    auto size = writer->finish(tree, stats, options.sync);
    if (!size) return size.error();
    stats.image_bytes = *size;
    done = true;
    return stats;
}

}  // namespace

Result<ConversionStats> add_files_to_image(const std::string& input, const std::string& output,
                                           const std::vector<AddedFile>& added, const SquashfsOptions& options) {
    try {
        return rewrite({input}, output, added, options, nullptr);
    } catch (const std::exception& e) {
        return make_error("writing " + output + ": " + e.what());
    }
}

Result<ConversionStats> compose_layers_to_image(const std::vector<std::string>& layers, const std::string& output,
                                                const std::vector<AddedFile>& added, const SquashfsOptions& options,
                                                const std::string& opaque_xattr) {
    if (layers.empty()) return make_error("writing " + output + ": no layers to compose");
    try {
        return rewrite(layers, output, added, options, &opaque_xattr);
    } catch (const std::exception& e) {
        return make_error("writing " + output + ": " + e.what());
    }
}

Result<ConversionStats> compose_layers_for_overlay(const std::vector<std::string>& layers, const std::string& output,
                                                   const SquashfsOptions& options, const std::string& opaque_xattr) {
    if (layers.empty()) return make_error("writing " + output + ": no layers to compose");
    try {
        return rewrite(layers, output, {}, options, &opaque_xattr, true);
    } catch (const std::exception& e) {
        return make_error("writing " + output + ": " + e.what());
    }
}

}  // namespace gantry
