// Layers -> squashfs in one streaming pass (libarchive in, libsquashfs out). Owner: runtime/squashfs/.
//
// The layers are walked from the top one down, so each path's winning version is the first one seen
// and its data is written exactly once; whiteouts and opaque directories only hide what lies below.
// Nothing is extracted to disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry {

// Fixed limits on the paths of tar entries (and hard link targets), after "./" and "." components
// are dropped. Not settings: the first two are what Linux and squashfs can represent at all, and no
// genuine image comes near the third, while a tar of millions of nested directories costs the tree
// memory and the kernel's path walk time.
inline constexpr size_t kMaxNameBytes = 255;   // one path component (NAME_MAX, squashfs's limit too)
inline constexpr size_t kMaxPathBytes = 4096;  // "/a/b/c" as the container sees it, NUL included (PATH_MAX)
inline constexpr size_t kMaxPathDepth = 256;   // components of one path

struct LayerBlob {
    std::string path;        // the compressed (or plain) tar blob on disk
    std::string media_type;  // OCI/Docker layer media type: decides gzip / zstd / plain
    std::string digest;      // blob digest, for messages
    std::string diff_id;     // sha256 of the uncompressed tar; verified while reading ("" = skip)
    // Keeps `path` valid when it is /proc/self/fd/N: the descriptor a local blob was hashed from
    // (LocalFile::fd), so that what is converted is the file that was checked, not a name reopened.
    std::shared_ptr<const UniqueFd> held;
};

struct SquashfsOptions {
    // zstd | lz4 | gzip | xz | lzo | none. lz4 with 128 KiB blocks: the fastest to start from and to
    // write, 15% larger than zstd (docs/squashfs.md has the measurements).
    std::string compressor = "lz4";
    int level = 0;                 // 0: Gantry's default for the compressor (zstd 3, gzip 6, lzo1x_1)
    uint32_t block_size = 131072;  // power of two, 4 KiB .. 1 MiB
    unsigned threads = 0;          // compressor threads; 0: number of online CPUs
    bool sync = true;              // fsync the image before returning (it is published by rename)
    PullLimits limits;             // counted while the layers stream (gantry.conf, gantry/config.hpp)
};

// Which layer broke which limit: the layer's blob is intact (its digest verified) but must not be
// converted, so the caller removes it rather than keeping it for a resumed pull.
struct LimitBreach {
    size_t layer = 0;   // index into `layers`
    std::string limit;  // the gantry.conf key or constant: "max_layer_bytes", "kMaxPathDepth", ...
};

struct ConversionStats {
    uint64_t files = 0, directories = 0, symlinks = 0, hardlinks = 0, others = 0;
    uint64_t shadowed_entries = 0;    // entries hidden by higher layers or whiteouts, skipped
    uint64_t uncompressed_bytes = 0;  // tar bytes read
    uint64_t image_bytes = 0;         // size of the squashfs written
};

// Writes `output` (created; must not exist) from `layers` (bottom layer first, as in the manifest).
// `wait_for(i)` is called before layer i is opened and blocks until its blob is complete (or returns
// the download error), which lets conversion of the top layer overlap the download of the others.
// A diff_id mismatch, a path escaping the root, a corrupt tar or a layer beyond `options.limits`
// or the path limits above fails the call naming the layer; the partial output is removed. A broken
// limit is also reported in `breach` when given.
Result<ConversionStats> convert_layers(const std::vector<LayerBlob>& layers, const std::string& output,
                                       const SquashfsOptions& options,
                                       const std::function<Status(size_t index)>& wait_for = {},
                                       std::optional<LimitBreach>* breach = nullptr);

// Overlay form (issue #19, per-layer images): writes `output` from ONE layer so that overlayfs can
// stack it with the others as a lower layer and show what convert_layers would have merged: the
// layer's whiteouts (and devices, which images never carry) become overlayfs whiteouts (character
// devices 0/0), and a directory whose lower contents it hides (an opaque marker, or a path it deletes
// and recreates) gets `opaque_xattr` = "y": "trusted.overlay.opaque" for an overlay mounted by root,
// "user.overlay.opaque" for one mounted with `userxattr` in a user namespace. A layer's own
// trusted.overlay.* and user.overlay.* xattrs are dropped, as in convert_layers. Directories the
// layer has no entry for (its root included) get root-owned 0755 attributes, which overlayfs shows
// in place of a lower layer's: compose with it only layers whose tars list their directories, or
// key such a layer by the stack below it. Limits and errors as for convert_layers.
// `breach` as for convert_layers.
Result<ConversionStats> convert_layer_for_overlay(const LayerBlob& layer, const std::string& output,
                                                  const SquashfsOptions& options,
                                                  const std::string& opaque_xattr = "trusted.overlay.opaque",
                                                  std::optional<LimitBreach>* breach = nullptr);

// A file to add to an image: its path inside the image ("/etc/rc"), content and permission bits;
// owned by root, modified now.
struct AddedFile {
    std::string path;
    std::string content;
    uint32_t mode = 0644;
};

// Writes `output` (created; must not exist) as a copy of the squashfs `input` with `added` on top:
// an added file replaces the image's file of the same path. Owners, modes, times, xattrs and hard
// links are kept. The partial output is removed on failure. `input` is parsed: pass an image of a
// store, or the user's own file read with the user's rights.
Result<ConversionStats> add_files_to_image(const std::string& input, const std::string& output,
                                           const std::vector<AddedFile>& added, const SquashfsOptions& options);

// The opaque-directory marker of the store's layers: one form for both backends, since overlayfs
// reads it with `userxattr` whether root mounts the stack or a user namespace does.
inline constexpr const char* kOverlayOpaqueXattr = "user.overlay.opaque";

// Writes `output` as the one tree that overlayfs shows for `layers` (bottom first), each a layer
// squashfs in overlay form (convert_layer_for_overlay with `opaque_xattr`): a character device 0/0
// deletes its path from the layers below, a directory with `opaque_xattr` = "y" hides their children
// (and the marker itself is not copied), and otherwise the highest layer's version of a path wins,
// directories merging. `added` go on top as in add_files_to_image. A layered image's export and the
// whole file of a layered image come from here. `layers` are parsed: pass a store's layers.
Result<ConversionStats> compose_layers_to_image(const std::vector<std::string>& layers, const std::string& output,
                                                const std::vector<AddedFile>& added, const SquashfsOptions& options,
                                                const std::string& opaque_xattr);

// Writes `output` as ONE layer in overlay form equal to `layers` (bottom first, each in overlay form)
// stacked: the group of a deep layered image (docs/store.md, "Deep images"). Within the group the
// layers compose as in compose_layers_to_image; what they delete or make opaque is kept as a
// whiteout or an opaque marker for the layers below the group, so that overlayfs shows the same tree
// for the group over those layers as for the layers one by one. `layers` are parsed: store layers.
Result<ConversionStats> compose_layers_for_overlay(const std::vector<std::string>& layers, const std::string& output,
                                                   const SquashfsOptions& options, const std::string& opaque_xattr);

// The content of the regular file `path` ("/etc/environment") inside the squashfs `image`, read with
// libsquashfs without mounting it; nullopt when the image has no such regular file (a symlink is not
// followed). A file larger than `max_bytes` is an error. The image may be user-controlled: run this
// with the user's rights (runtime/launcher/image_environment.cpp does).
Result<std::optional<std::string>> read_image_file(const std::string& image, const std::string& path, size_t max_bytes);

}  // namespace gantry
