// The content-addressed image store on shared storage (FSx for Lustre in production).
//
// Layout under the store root (see docs/store.md):
//   images/<hex>.sqsh   published squashfs, <hex> = manifest digest; its existence is the commit point
//   images/<hex>.json   metadata (references, config, layers, sizes, when pulled), renamed in first
//   images/layer-<chain hex>.sqsh/.json  one layer in overlay form, named by its chain ID (the
//                       per-layer store of docs/store.md, "Layers"); same rules as an image's files;
//                       or a group of layers of a deep image, named by layer_group_key()
//   refs/<hex>.json     tag -> digest records, <hex> = sha256 of the canonical reference
//   used/<hex>          empty file whose mtime is the last use (gc is least-recently-used first)
//   locks/<hex>.lock    producer lock: flock(LOCK_EX) held by the one process building <hex>
//   staging/<hex>/      the producer's work area: verified blobs survive a dead producer and are reused
// Readers of a published image take no lock; a container using an image holds flock(LOCK_SH) on its
// .sqsh so that `gantry gc`/`rm` (which try LOCK_EX) never remove an image in use.
//
// Trust (docs/store.md, "Trust model"): the root and its subdirectories are opened once, a
// subdirectory never through a symlink; every file inside is opened relative to them with
// O_NOFOLLOW|O_NONBLOCK, must be a regular file and is read with a size cap. An image counts only when
// its files are owned by root, the store_owner account or the caller, and writable by nobody else.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "gantry/result.hpp"

namespace gantry {

// Size caps for what the store reads: any user of a shared store could plant a huge file.
inline constexpr size_t kMaxImageMetadataBytes = size_t{16} << 20;  // images/<hex>.json
inline constexpr size_t kMaxStoreRecordBytes = size_t{64} << 10;    // refs/, lock holder text, .failed notes

struct ImageMetadata {
    std::string manifest_digest;
    std::vector<std::string> references;  // every reference that resolved to this digest
    std::string platform;                 // os/arch[/variant]
    std::string manifest_json;
    std::string config_json;
    std::vector<Descriptor> layers;
    uint64_t image_bytes = 0;  // size of the squashfs
    std::string compressor;
    uint32_t block_size = 0;
    int64_t pulled_at = 0;  // unix seconds
    // The chain IDs of the stored layers (images/layer-*) this image is made of, bottom first; gc
    // keeps a layer while any image names it. Empty for a whole-image squashfs.
    std::vector<std::string> layer_chain;
};

// One layer of the per-layer store (docs/store.md, "Layers"): its squashfs in overlay form
// (convert_layer_for_overlay, opaque directories marked with user.overlay.opaque so that one file
// serves root's overlay mount and a user namespace's, both with `userxattr`), named by its chain ID.
struct LayerRecord {
    std::string chain_id;             // the stack up to and including this layer (chain_id() in digest.hpp)
    std::string diff_id;              // the layer's uncompressed digest
    std::string parent;               // the chain ID below it; empty for the bottom layer
    std::string blob_digest;          // the (compressed) blob it was converted from
    uint64_t uncompressed_bytes = 0;  // the layer's tar, counted against max_image_bytes of each image
    uint64_t layer_bytes = 0;         // size of the squashfs
    int64_t converted_at = 0;         // unix seconds
    // A group (docs/store.md, "Deep images"): several layers composed into one squashfs in overlay
    // form, named by layer_group_key() of its top layer's chain ID; these are their diff_ids, bottom
    // first, and `parent` is the chain ID below the first. Empty for one layer.
    std::vector<std::string> group_diff_ids;
};

// Deep layered images (docs/store.md, "Deep images"): a container's stack has at most kMaxLowers
// layers. An image with more is stacked from groups: its layers in runs of kLayerGroupSize from the
// bottom (a run starts at a multiple of kLayerGroupSize, so a run is the same in every image over the
// same base and the group is shared), and the layers above the last full run one by one, or as one
// more group where that would pass kMaxLowers. Deeper than kMaxLayeredLayers: stored whole.
inline constexpr size_t kMaxLowers = 16;
inline constexpr size_t kLayerGroupSize = 8;
inline constexpr size_t kMaxLayeredLayers = kMaxLowers * kLayerGroupSize;

// Layers [first, end) of an image (bottom first): one layer, or a group of them.
struct LowerRange {
    size_t first = 0;
    size_t end = 0;
    bool grouped = false;
    bool operator==(const LowerRange&) const = default;
};
// The lowers of an image of `layers` layers, bottom first; empty when it has none or more than
// kMaxLayeredLayers.
std::vector<LowerRange> plan_lowers(size_t layers);
// The store name of the group whose top layer has the chain ID `top_chain_id`. The top layer's depth
// fixes where the run starts, so the name says which layers the group holds.
std::string layer_group_key(const std::string& top_chain_id);

struct StoredLayer {
    LayerRecord record;
    std::string squashfs_path;
    int64_t last_used = 0;  // unix seconds
};

struct StoredImage {
    std::string digest;
    std::string squashfs_path;  // empty for a layered image (its layers: metadata.layer_chain)
    ImageMetadata metadata;
    int64_t last_used = 0;  // unix seconds
    // Stored as layers (gantry pull --layered; docs/store.md, "Layers"): no whole-image squashfs.
    [[nodiscard]] bool layered() const { return squashfs_path.empty(); }
};

// How long a tag record naming the same digest stands before record_tag writes it again.
inline constexpr int64_t kTagRecordRefreshSeconds = 600;

struct TagRecord {
    std::string reference;  // canonical reference string
    std::string digest;
    int64_t resolved_at = 0;
};

// How far the producer of one digest has got, as its lock file says (ProducerLock::record_progress):
// what `srun` shows the user while the nodes pull (plugin/srun.cpp).
struct ProducerProgress {
    std::string holder;  // "host:pid"
    uint64_t bytes_done = 0;
    uint64_t bytes_total = 0;
    uint64_t layers_done = 0;
    uint64_t layers_total = 0;
    int64_t updated_at = 0;  // unix seconds
};

// Held by the single producer of one digest; released (and the lock file left for reuse) on destruction.
class ProducerLock {
public:
    ProducerLock() = default;
    ProducerLock(UniqueFd fd, bool ours, std::string holder)
        : fd_(std::move(fd)), ours_(ours), holder_(std::move(holder)) {}
    [[nodiscard]] bool held() const { return fd_.valid(); }
    // Rewrites the lock file's text: the holder line, then "progress DONE TOTAL LAYERS_DONE LAYERS
    // UNIXTIME". Only in a lock file of our own (never one another account planted).
    void record_progress(uint64_t bytes_done, uint64_t bytes_total, uint64_t layers_done, uint64_t layers_total) const;

private:
    UniqueFd fd_;
    bool ours_ = false;
    std::string holder_;
};

struct AcquiredImage;  // include/gantry/acquire.hpp

class ImageStore {
public:
    // Opens (and with `create`, makes) the store at `root`. `config` names the store_owner account
    // whose images count besides root's and the caller's, and private_images. `acting_for`: an account
    // a root caller acts for (the plugin, for the job user), whose own images count too.
    static Result<ImageStore> open(const std::string& root, bool create, const Config& config = Config{},
                                   std::optional<uid_t> acting_for = std::nullopt);
    // --store, else GANTRY_STORE, else Config::store_path, else $XDG_CACHE_HOME/gantry (~/.cache/gantry);
    // empty when none of them names one (no HOME): open() says what to set.
    static std::string resolve_path(const Config& config, const std::string& cli_value);

    [[nodiscard]] const std::string& root() const { return root_; }
    [[nodiscard]] std::string squashfs_path(const std::string& digest) const;
    [[nodiscard]] std::string staging_dir(const std::string& digest) const;
    // Makes staging_dir(digest) a directory of the caller's own (0700, no symlink), removing what
    // another producer of this account left there if it is not; returns its path.
    Result<std::string> prepare_staging(const std::string& digest) const;
    // Removes staging_dir(digest) (never following a symlink), once its image is published.
    void remove_staging(const std::string& digest) const;

    // The image, when its .sqsh and .json are regular files owned by an accepted account (root,
    // store_owner, the caller, `acting_for`) and writable by nobody else; anything else is ignored.
    std::optional<StoredImage> find(const std::string& digest) const;
    // Every image find accepts; `ignored`, when given, receives one line per file that was skipped.
    Result<std::vector<StoredImage>> list(std::vector<std::string>* ignored = nullptr) const;

    // Records that `ref` named `digest` now; a record saying so that is under
    // kTagRecordRefreshSeconds old is left as it is.
    Status record_tag(const ImageReference& ref, const std::string& digest) const;
    std::optional<TagRecord> lookup_tag(const ImageReference& ref) const;
    // The producer of `digest` and its last recorded progress, read-only and without waiting; nullopt
    // when nobody is producing it (no lock file, nobody holds its lock, or no progress recorded yet).
    std::optional<ProducerProgress> producer_progress(const std::string& digest) const;

    // Blocks until this process is the producer for `digest` or `timeout` passes. `on_wait` is called
    // about every few seconds while waiting, with who holds the lock ("host:pid") when known.
    Result<ProducerLock> lock_producer(const std::string& digest, std::chrono::seconds timeout,
                                       const std::function<void(const std::string& holder)>& on_wait = {}) const;

    // Publishes a layered image: its record (images/<hex>.json, no .sqsh) naming metadata.layer_chain,
    // every layer of which must be in the store. The record's rename is the commit point.
    Status publish_layered(const std::string& digest, ImageMetadata metadata) const;
    // Atomically publishes a finished squashfs (same filesystem as the store) with its metadata.
    // With private_images, the .sqsh is 0400 and the .json 0600 (owner only), else 0444 and 0644.
    Status publish(const std::string& digest, const std::string& squashfs_tmp, ImageMetadata metadata) const;

    // The failure note a producer of one Slurm step leaves for that step's waiters (pull.cpp):
    // honoured only when it is a regular file owned by an accepted account and changed at or after
    // `since` (unix seconds); read with kMaxStoreRecordBytes.
    std::optional<std::string> read_failure_note(const std::string& digest, int64_t since) const;
    void write_failure_note(const std::string& digest, const std::string& text) const;
    void clear_failure_note(const std::string& digest) const;

    // Root's rule: with euid 0, a store that anyone but root or store_owner could write (root or a
    // subdirectory group/other-writable, or owned by another account) is refused for every operation
    // that writes or removes; the error says why and what to do. Always fine for other callers.
    [[nodiscard]] Status check_root_may_modify() const;
    // Every removal's rule (gc, rm, remove_layer), for every caller: refused when the store root was
    // reached through a symbolic link (it may be another account's store); the error names its target.
    [[nodiscard]] Status check_may_remove() const;
    // The one account (not root) that owns the store root and every subdirectory, if there is one: a
    // per-user store, or a store_owner store. Root's gc/rm become it (become_store_owner) first.
    [[nodiscard]] std::optional<uid_t> sole_owner() const;

    // True when the kernel may mount this store's images: the store root and images/ are owned by root
    // or by config.store_owner and writable by nobody else, so only a trusted producer could have
    // written the bytes.
    bool trusted(const Config& config) const;

    // Marks the image used now (for least-recently-used collection).
    void touch(const std::string& digest) const;
    // Opens the image for a container: the fd holds a shared lock while the container lives (on the
    // .sqsh; for a layered image on its record, which keeps gc from its layers too).
    Result<UniqueFd> open_in_use(const std::string& digest) const;
    bool in_use(const std::string& digest) const;

    // The per-layer store (docs/store.md, "Layers"): a layer's files live in images/ beside the
    // images and are accepted by the same rules (regular files of an accepted owner, writable by
    // nobody else, metadata that names the chain ID asked for).
    [[nodiscard]] std::string layer_squashfs_path(const std::string& chain_id) const;
    std::optional<StoredLayer> find_layer(const std::string& chain_id) const;
    Result<std::vector<StoredLayer>> list_layers(std::vector<std::string>* ignored = nullptr) const;
    // Publishes a finished layer squashfs (same filesystem as the store) atomically, after checking
    // that record.chain_id is chain_id(record.parent, record.diff_id). The returned descriptor holds
    // the layer's shared lock from before it appears in the store, so that no gc removes it before
    // the producer has recorded the image that uses it; keep it until then.
    Result<UniqueFd> publish_layer(const std::string& squashfs_tmp, LayerRecord record) const;
    // Opens a layer for a container (or a producer): the fd holds a shared lock while it lives.
    Result<UniqueFd> open_layer_in_use(const std::string& chain_id) const;
    // Removes one layer. Refused while in use (errnum EBUSY); it does not look at image records (gc does).
    Status remove_layer(const std::string& chain_id) const;

    // Removes one image and the tag records pointing at it. Refused while in use: then the error's
    // errnum is EBUSY (any other failure carries the failing call's errno, or 0).
    Status remove(const std::string& digest) const;

    struct GcResult {
        std::vector<std::string> removed;
        std::vector<std::string> removed_layers;  // chain IDs
        std::vector<std::string> kept_in_use;
        std::vector<Error> failed;  // images and staging areas that could not be removed, and why
        uint64_t bytes_freed = 0;
        uint64_t bytes_left = 0;
    };
    // Removes least recently used images until the store is under `max_bytes` (0: no size target) and
    // every image unused for `unused_for` (0: no age target), never one in use; also clears staging
    // areas no producer holds. Layers count once however many images name them: removing an image
    // removes each of its layers no remaining image names and nothing holds in use, and a layer no
    // image names at all (a producer's left-over) goes when nothing holds it.
    Result<GcResult> gc(uint64_t max_bytes, std::chrono::seconds unused_for) const;

private:
    // The descriptors of the store root and its subdirectories, shared by copies of one ImageStore.
    struct Dirs;
    ImageStore(std::string root, std::shared_ptr<const Dirs> dirs) : root_(std::move(root)), dirs_(std::move(dirs)) {}
    // acquire_image (include/gantry/acquire.hpp) opens an image's files in images/ under these rules.
    friend Result<AcquiredImage> acquire_image(const ImageStore& store, const std::string& digest);
    [[nodiscard]] const Directory& images_dir() const;
    [[nodiscard]] bool accepted_owner(uid_t uid) const;
    [[nodiscard]] bool accepted_file(const struct stat& st) const;
    // find's work; the error says why an image is not accepted.
    [[nodiscard]] Result<StoredImage> load(const std::string& digest) const;
    [[nodiscard]] Result<StoredLayer> load_layer(const std::string& chain_id) const;
    // Opens images/<name> for a user (an accepted regular file), holds its shared lock and marks
    // used/<used_name>; `what` ("image", "layer") names it in errors.
    [[nodiscard]] Result<UniqueFd> open_shared(const std::string& name, const std::string& used_name,
                                               const char* what) const;
    // Marks used/<name> used now.
    void touch_name(const std::string& name) const;
    // used/<name>'s time, or `otherwise` when there is none.
    [[nodiscard]] int64_t used_at(const std::string& name, int64_t otherwise) const;
    // Removes the images/ entries `names` (of one image or layer, a `what`) that an account the store
    // does not trust left, before a publication renames ours over them; an error when we may not.
    [[nodiscard]] Status remove_untrusted(std::initializer_list<std::string> names, const char* what) const;

    std::string root_;
    std::shared_ptr<const Dirs> dirs_;
};

// Drops a root process to `uid` for good (its primary group, no supplementary groups), verified; for
// root's gc/rm in a store that one unprivileged account owns. Runs only when euid is 0.
Status become_store_owner(uid_t uid);

}  // namespace gantry
