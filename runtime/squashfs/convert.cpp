// gantry::convert_layers: the layer walk. Layers are read from the top one down; each tar entry is
// either the winning version of its path (then its data streams straight into the squashfs writer)
// or hidden by something above it (then it is skipped). The merge rules live in image_tree.cpp, the
// squashfs output in squashfs_writer.cpp, the blob decoding in layer_reader.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "gantry/fd.hpp"
#include "gantry/log.hpp"
#include "gantry/squashfs.hpp"
#include "gantry/strings.hpp"
#include "image_tree.hpp"
#include "layer_reader.hpp"
#include "squashfs_writer.hpp"

namespace gantry {

namespace {

using squashfs::ImageTree;
using squashfs::Inode;
using squashfs::LayerReader;
using squashfs::SquashfsWriter;
using squashfs::TreeNode;

constexpr std::string_view kWhiteoutPrefix = ".wh.";
constexpr std::string_view kOpaqueMarker = ".wh..wh..opq";

// Entries a hard link of the same layer may point at. A tar hard link names an earlier member; if that
// member was hidden by a higher layer while the link itself wins, its metadata is kept here (`shadow`)
// and its data is fetched by a second read of the layer (rare: see fetch_shadowed_data).
struct LinkTarget {
    uint64_t ordinal = 0;           // position of the data-bearing member in the layer's tar
    Inode* inode = nullptr;         // the inode this member became, once it is in the image
    std::unique_ptr<Inode> shadow;  // metadata of a hidden member, until a link adopts it
    bool deleted = false;           // a skipped device: links to it are skipped too
};

struct PendingData {
    uint64_t ordinal;
    Inode* inode;
};

// A tar name as an error message shows it: one line, and not the megabytes a hostile pax header
// may carry.
std::string shown_name(std::string_view name) {
    constexpr size_t kShown = 120;
    std::string out;
    for (char c : name.substr(0, kShown)) out.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c);
    if (name.size() > kShown) out += "... (" + std::to_string(name.size()) + " bytes)";
    return out;
}

std::string entry_name(archive_entry* e) {
    const char* p = archive_entry_pathname(e);
    if (p == nullptr) p = archive_entry_pathname_utf8(e);
    return p != nullptr ? p : "";
}

// Only xattr namespaces squashfs can store; others (system.*, e.g. POSIX ACLs) are dropped, and so
// are overlayfs's own trusted.overlay.* and user.overlay.* (its `userxattr` names), which would
// change the meaning of the image once it is an overlay lower layer (an author's opaque markers or
// redirects).
bool keep_xattr(std::string_view key) {
    if (key.rfind("trusted.overlay.", 0) == 0 || key.rfind("user.overlay.", 0) == 0) return false;
    return key.rfind("user.", 0) == 0 || key.rfind("trusted.", 0) == 0 || key.rfind("security.", 0) == 0;
}

std::unique_ptr<Inode> inode_from(archive_entry* e) {
    auto in = std::make_unique<Inode>();
    in->mode = static_cast<uint32_t>(archive_entry_mode(e));
    in->uid = static_cast<uint32_t>(std::clamp<int64_t>(archive_entry_uid(e), 0, UINT32_MAX));
    in->gid = static_cast<uint32_t>(std::clamp<int64_t>(archive_entry_gid(e), 0, UINT32_MAX));
    in->mtime = archive_entry_mtime(e);
    in->size = archive_entry_size_is_set(e) ? static_cast<uint64_t>(std::max<int64_t>(0, archive_entry_size(e))) : 0;
    if (const char* target = archive_entry_symlink(e); target != nullptr) in->symlink_target = target;
    // Linux symlinks have no permissions of their own (lstat always shows 0777); tars sometimes
    // carry other bits, which would make our tree differ from any extracted one.
    if ((in->mode & 0170000) == 0120000) in->mode = 0120777;
    if (archive_entry_xattr_reset(e) > 0) {
        const char* key = nullptr;
        const void* value = nullptr;
        size_t size = 0;
        while (archive_entry_xattr_next(e, &key, &value, &size) == ARCHIVE_OK) {
            if (key != nullptr && keep_xattr(key))
                in->xattrs.emplace_back(key, std::string(static_cast<const char*>(value), size));
        }
        std::sort(in->xattrs.begin(), in->xattrs.end());
    }
    return in;
}

// "max_layer_bytes = 68719476736 (64.0 GiB)"
std::string limit_value(const char* key, uint64_t value, bool bytes) {
    std::string out = std::string(key) + " = " + std::to_string(value);
    if (bytes) out += " (" + format_bytes(value) + ")";
    return out;
}

class LayerConverter {
public:
    LayerConverter(ImageTree& tree, SquashfsWriter& writer, ConversionStats& stats, const PullLimits& limits)
        : tree_(tree), writer_(writer), stats_(stats), limits_(limits) {}

    // One layer: all its entries, then the diff_id check, then any hard-link data still missing.
    Status convert(const LayerBlob& blob, int layer) {
        // What a layer expands to is the larger of its tar and its files' sizes: sparse files may
        // declare far more than their data. It may expand to its own limit or to what the layers
        // above left of the image's, whichever is less; the decoder stops at that budget, so a bomb
        // costs no more than that, and a file declared larger is refused at its header.
        const uint64_t image_left = limits_.max_image_bytes - std::min(limits_.max_image_bytes, expanded_);
        image_binds_ = image_left < limits_.max_layer_bytes;
        budget_ = std::min(image_left, limits_.max_layer_bytes);
        // The decompressed stream is bound by the layer's ratio too (files' declared sizes are not:
        // sparse holes cost no decompression).
        stream_budget_ = std::min(budget_, ratio_budget(blob.path));
        file_bytes_ = 0;
        auto opened = LayerReader::open(blob.path, blob.media_type, !blob.diff_id.empty(), stream_budget_);
        if (!opened) return opened.error();
        LayerReader& reader = **opened;
        layer_ = layer;
        targets_.clear();
        target_index_.clear();
        pending_.clear();

        Result<std::string> digest = make_error("");
        if (auto read = read_layer(reader); read) {
            digest = reader.finish();
        } else {
            digest = read.error();
        }
        // Past the byte limit, whatever failed (a tar header cut short, the padding after the tar's
        // end) failed because of it.
        if (reader.over_limit()) return stream_budget_ < budget_ ? over_ratio() : over_budget();
        if (!digest) return digest.error();
        stats_.uncompressed_bytes += reader.uncompressed_bytes();
        if (!blob.diff_id.empty() && *digest != blob.diff_id)
            return make_error("uncompressed content has digest " + *digest + ", but the image config says " +
                              blob.diff_id);
        GANTRY_TRY(fetch_shadowed_data(blob));
        expanded_ += std::max(reader.uncompressed_bytes(), file_bytes_);
        return {};
    }

    // The limit the last failed convert() broke, if that was why it failed.
    [[nodiscard]] const std::optional<std::string>& broken_limit() const { return broken_limit_; }

private:
    // The entries of the layer, up to the end of the tar (the padding after it is finish()'s).
    Status read_layer(LayerReader& reader) {
        for (uint64_t ordinal = 0;; ++ordinal) {
            archive_entry* e = nullptr;
            auto more = reader.next(&e);
            if (!more) return more.error();
            if (!*more) break;
            if (ordinal == limits_.max_layer_entries)
                return breach("max_layer_entries",
                              "more tar entries than " +
                                  limit_value("max_layer_entries", limits_.max_layer_entries, false) +
                                  " allows; raise max_layer_entries in gantry.conf if the image is genuine");
            std::string name = entry_name(e);
            if (auto st = entry(reader, e, name, ordinal); !st)
                return st.error().wrap("entry '" + shown_name(name) + "'");
        }
        return {};
    }

    // max_layer_ratio times the blob's size, at least ratio_floor_bytes; no bound when the blob is not
    // a regular file whose size tells its compressed length.
    uint64_t ratio_budget(const std::string& path) {
        struct stat st {};
        compressed_ = 0;
        if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return UINT64_MAX;
        compressed_ = static_cast<uint64_t>(st.st_size);
        const uint64_t ratio = limits_.max_layer_ratio;
        const uint64_t scaled = ratio != 0 && compressed_ > UINT64_MAX / ratio ? UINT64_MAX : compressed_ * ratio;
        return std::max(scaled, limits_.ratio_floor_bytes);
    }

    Error over_ratio() {
        const bool floor = stream_budget_ == limits_.ratio_floor_bytes;
        return breach(
            "max_layer_ratio",
            "expands beyond " + limit_value("max_layer_ratio", limits_.max_layer_ratio, false) +
                " times its compressed size of " + format_bytes(compressed_) +
                (floor ? ", and past the " + format_bytes(limits_.ratio_floor_bytes) + " any layer may expand to,"
                       : std::string()) +
                " uncompressed (a decompression bomb?); raise max_layer_ratio in gantry.conf if the "
                "image is genuine");
    }

    Error over_budget() {
        if (image_binds_)
            return breach("max_image_bytes", "the image expands beyond " +
                                                 limit_value("max_image_bytes", limits_.max_image_bytes, true) +
                                                 " uncompressed with this layer; raise max_image_bytes in gantry.conf "
                                                 "if the image is genuine");
        return breach("max_layer_bytes", "expands beyond " +
                                             limit_value("max_layer_bytes", limits_.max_layer_bytes, true) +
                                             " uncompressed; raise max_layer_bytes in gantry.conf if the image is "
                                             "genuine");
    }

    Error breach(const char* limit, const std::string& message) {
        broken_limit_ = limit;
        return make_error(message);
    }

    Status entry(LayerReader& reader, archive_entry* e, const std::string& name, uint64_t ordinal) {
        std::string broken;
        auto split = squashfs::split_entry_path(name, &broken);
        if (!broken.empty()) broken_limit_ = broken;
        if (!split) return split.error();
        std::vector<std::string>& path = *split;
        const std::string base = path.empty() ? std::string() : path.back();

        if (base.rfind(kWhiteoutPrefix, 0) == 0) {
            path.pop_back();
            bool applied = false;
            if (base == kOpaqueMarker) {
                applied = tree_.make_opaque(path, layer_);
            } else if (base.rfind(".wh..wh.", 0) == 0) {
                applied = true;  // other aufs bookkeeping (.wh..wh.plnk, ...): meaningless here
            } else if (base.size() > kWhiteoutPrefix.size()) {
                path.push_back(base.substr(kWhiteoutPrefix.size()));
                applied = tree_.whiteout(path, layer_);
            }
            if (!applied) ++stats_.shadowed_entries;
            return {};
        }

        if (const char* link = archive_entry_hardlink(e); link != nullptr) return hard_link(path, link);

        const auto type = archive_entry_filetype(e);
        const bool is_dir = type == AE_IFDIR;
        const bool device = type == AE_IFCHR || type == AE_IFBLK;
        if (!is_dir && !device && type != AE_IFREG && type != AE_IFLNK && type != AE_IFIFO && type != AE_IFSOCK)
            return make_error("unsupported tar entry type " + std::to_string(type));
        if (const char* target = archive_entry_symlink(e); type == AE_IFLNK && target != nullptr) {
            // symlink(2) refuses a target that does not fit PATH_MAX with its NUL.
            if (std::strlen(target) >= kMaxPathBytes)
                return breach("kMaxPathBytes", "a symlink target longer than " + std::to_string(kMaxPathBytes - 1) +
                                                   " bytes (kMaxPathBytes); the image cannot be converted, rebuild it "
                                                   "with shorter paths");
        }

        TreeNode* node = tree_.place(path, layer_, is_dir);
        const std::string key = squashfs::join_path(path);
        if (node == nullptr) {
            ++stats_.shadowed_entries;
            // Keep what a winning hard link later in this layer would need.
            if (!is_dir) {
                LinkTarget t;
                t.ordinal = ordinal;
                t.deleted = device;
                if (!device) t.shadow = inode_from(e);
                remember(key, std::move(t));
            }
            return {};  // libarchive skips (and we hash) the data on the next header read
        }
        if (device) {
            // Devices are not carried into images (the runtime provides /dev); the path counts as
            // deleted, so lower layers' versions of it stay hidden too.
            node->inode = nullptr;
            LinkTarget t;
            t.ordinal = ordinal;
            t.deleted = true;
            remember(key, std::move(t));
            return {};
        }
        Inode* in = tree_.adopt(inode_from(e));
        node->inode = in;
        if (in->is_reg()) GANTRY_TRY(stream_data(reader, in));
        if (!is_dir) {
            LinkTarget t;
            t.ordinal = ordinal;
            t.inode = in;
            remember(key, std::move(t));
        }
        return {};
    }

    Status hard_link(const std::vector<std::string>& path, const char* raw_target) {
        std::string broken;
        auto target_path = squashfs::split_entry_path(raw_target, &broken);
        if (!broken.empty()) broken_limit_ = broken;
        if (!target_path) return target_path.error().wrap("hard link target '" + shown_name(raw_target) + "'");
        const std::string target_key = squashfs::join_path(*target_path);
        auto it = target_index_.find(target_key);
        if (it == target_index_.end())
            return make_error("hard link to '" + shown_name(raw_target) +
                              "', which is not an earlier non-directory entry of this layer");
        const size_t index = it->second;

        TreeNode* node = tree_.place(path, layer_, false);
        const std::string key = squashfs::join_path(path);
        target_index_[key] = index;  // a later link to this name means the same file
        if (node == nullptr) {
            ++stats_.shadowed_entries;
            return {};
        }
        LinkTarget& t = targets_[index];
        if (t.deleted) {
            node->inode = nullptr;
            return {};
        }
        if (t.inode == nullptr) {
            // The target's own name lost to a higher layer, but this name wins: bring the file in.
            t.inode = tree_.adopt(std::move(t.shadow));
            if (t.inode->is_reg()) {
                if (t.inode->size > 0) {
                    pending_.push_back({t.ordinal, t.inode});
                } else {
                    GANTRY_TRY(writer_.begin_file(t.inode));
                    GANTRY_TRY(writer_.end_file());
                }
            }
        }
        node->inode = t.inode;
        return {};
    }

    void remember(const std::string& key, LinkTarget t) {
        targets_.push_back(std::move(t));
        target_index_[key] = targets_.size() - 1;
    }

    Status stream_data(LayerReader& reader, Inode* in) {
        if (in->size > budget_ - file_bytes_) return over_budget();  // a sparse file's holes count too
        file_bytes_ += in->size;
        GANTRY_TRY(writer_.begin_file(in));
        uint64_t written = 0;
        for (;;) {
            const void* buf = nullptr;
            size_t size = 0;
            int64_t offset = 0;
            auto more = reader.data_block(&buf, &size, &offset);
            if (!more) return more.error();
            if (!*more) break;
            if (offset < 0 || static_cast<uint64_t>(offset) < written) return make_error("file data out of order");
            GANTRY_TRY(writer_.append_zeros(static_cast<uint64_t>(offset) - written));  // sparse hole
            GANTRY_TRY(writer_.append(buf, size));
            written = static_cast<uint64_t>(offset) + size;
        }
        if (written < in->size) GANTRY_TRY(writer_.append_zeros(in->size - written));  // trailing hole
        return writer_.end_file();
    }

    // Second read of the layer for hard links whose target member was hidden: stream just those
    // members' data. Layers with such links are rare, so reading them twice beats buffering every
    // hidden file on the chance that a link to it follows.
    Status fetch_shadowed_data(const LayerBlob& blob) {
        if (pending_.empty()) return {};
        std::sort(pending_.begin(), pending_.end(),
                  [](const PendingData& a, const PendingData& b) { return a.ordinal < b.ordinal; });
        auto opened = LayerReader::open(blob.path, blob.media_type, false);
        if (!opened) return opened.error();
        LayerReader& reader = **opened;
        size_t next = 0;
        for (uint64_t ordinal = 0; next < pending_.size(); ++ordinal) {
            archive_entry* e = nullptr;
            auto more = reader.next(&e);
            if (!more) return more.error();
            if (!*more) return make_error("hard link target vanished on the second read of the layer");
            if (ordinal == pending_[next].ordinal) GANTRY_TRY(stream_data(reader, pending_[next++].inode));
        }
        return {};
    }

    ImageTree& tree_;
    SquashfsWriter& writer_;
    ConversionStats& stats_;
    const PullLimits& limits_;
    std::optional<std::string> broken_limit_;
    uint64_t expanded_ = 0;       // what the layers converted so far expanded to
    uint64_t budget_ = 0;         // what this layer may expand to
    uint64_t stream_budget_ = 0;  // what its decompressed stream may come to (budget_ and the ratio)
    uint64_t compressed_ = 0;     // the blob's size
    bool image_binds_ = false;    // the budget is what is left of max_image_bytes
    uint64_t file_bytes_ = 0;     // sizes of this layer's files written so far, holes included
    int layer_ = 0;
    std::vector<LinkTarget> targets_;
    std::unordered_map<std::string, size_t> target_index_;
    std::vector<PendingData> pending_;
};

// `overlay_xattr`: non-null for the overlay form of one layer (convert_layer_for_overlay).
Result<ConversionStats> convert(const std::vector<LayerBlob>& layers, const std::string& output,
                                const SquashfsOptions& options, const std::function<Status(size_t)>& wait_for,
                                std::optional<LimitBreach>* breach, const std::string* overlay_xattr = nullptr) {
    // Declared first so it is destroyed last: the writer's block processor still points into the
    // tree's inodes until it is finished or destroyed.
    ImageTree tree;
    auto created = SquashfsWriter::create(output, options);
    if (!created) return created.error();
    // From here on the output exists and is ours: remove it unless the conversion completes.
    Defer remove_partial([&] { ::unlink(output.c_str()); });
    std::unique_ptr<SquashfsWriter> writer = std::move(*created);

    ConversionStats stats;
    LayerConverter converter(tree, *writer, stats, options.limits);
    for (size_t i = layers.size(); i-- > 0;) {
        const LayerBlob& blob = layers[i];
        const std::string what = "converting layer " + (blob.digest.empty() ? blob.path : blob.digest);
        if (wait_for) {
            if (auto st = wait_for(i); !st) return st.error().wrap(what);
        }
        if (auto st = converter.convert(blob, static_cast<int>(i)); !st) {
            if (breach != nullptr && converter.broken_limit()) *breach = LimitBreach{i, *converter.broken_limit()};
            return st.error().wrap(what);
        }
    }
    if (overlay_xattr != nullptr) tree.to_overlay_form(*overlay_xattr);
    auto size = writer->finish(tree, stats, options.sync);
    if (!size) return size.error();
    stats.image_bytes = *size;
    remove_partial.dismiss();
    return stats;
}

// Nothing may unwind out of the public entry points (the SPANK plugin calls them).
template <typename F>
Result<ConversionStats> without_exceptions(const std::string& output, F&& f) {
    try {
        return f();
    } catch (const std::exception& e) {
        // The partial output, if any, was removed while unwinding (see convert()).
        return make_error("converting layers into " + output + ": " + e.what());
    } catch (...) {
        return make_error("converting layers into " + output + ": unexpected exception");
    }
}

}  // namespace

Result<ConversionStats> convert_layers(const std::vector<LayerBlob>& layers, const std::string& output,
                                       const SquashfsOptions& options,
                                       const std::function<Status(size_t index)>& wait_for,
                                       std::optional<LimitBreach>* breach) {
    return without_exceptions(output, [&] { return convert(layers, output, options, wait_for, breach); });
}

Result<ConversionStats> convert_layer_for_overlay(const LayerBlob& layer, const std::string& output,
                                                  const SquashfsOptions& options, const std::string& opaque_xattr,
                                                  std::optional<LimitBreach>* breach) {
    return without_exceptions(output, [&] { return convert({layer}, output, options, {}, breach, &opaque_xattr); });
}

}  // namespace gantry
