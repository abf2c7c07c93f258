// The content-addressed image store on shared storage (FSx for Lustre in production).
//
// Layout under the store root (see docs/store.md):
//   images/<hex>.sqsh   published squashfs, <hex> = manifest digest; its existence is the commit point
//   images/<hex>.json   metadata (references, config, layers, sizes, when pulled), renamed in first
//   refs/<hex>.json     tag -> digest records, <hex> = sha256 of the canonical reference
//   used/<hex>          empty file whose mtime is the last use (gc is least-recently-used first)
//   locks/<hex>.lock    producer lock: flock(LOCK_EX) held by the one process building <hex>
//   staging/<hex>/      the producer's work area: verified blobs survive a dead producer and are reused
// Readers of a published image take no lock; a container using an image holds flock(LOCK_SH) on its
// .sqsh so that `gantry gc`/`rm` (which try LOCK_EX) never remove an image in use.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/fd.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "gantry/result.hpp"

namespace gantry {

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
};

struct StoredImage {
    std::string digest;
    std::string squashfs_path;
    ImageMetadata metadata;
    int64_t last_used = 0;  // unix seconds
};

struct TagRecord {
    std::string reference;  // canonical reference string
    std::string digest;
    int64_t resolved_at = 0;
};

// Held by the single producer of one digest; released (and the lock file left for reuse) on destruction.
class ProducerLock {
public:
    ProducerLock() = default;
    explicit ProducerLock(UniqueFd fd) : fd_(std::move(fd)) {}
    [[nodiscard]] bool held() const { return fd_.valid(); }

private:
    UniqueFd fd_;
};

class ImageStore {
public:
    // Opens (and with `create`, makes) the store at `root`.
    static Result<ImageStore> open(const std::string& root, bool create);
    // --store, else GANTRY_STORE, else Config::store_path, else $XDG_CACHE_HOME/gantry (~/.cache/gantry).
    static std::string resolve_path(const Config& config, const std::string& cli_value);

    [[nodiscard]] const std::string& root() const { return root_; }
    [[nodiscard]] std::string squashfs_path(const std::string& digest) const;
    [[nodiscard]] std::string staging_dir(const std::string& digest) const;

    std::optional<StoredImage> find(const std::string& digest) const;
    Result<std::vector<StoredImage>> list() const;

    Status record_tag(const ImageReference& ref, const std::string& digest) const;
    std::optional<TagRecord> lookup_tag(const ImageReference& ref) const;

    // Blocks until this process is the producer for `digest` or `timeout` passes. `on_wait` is called
    // about every few seconds while waiting, with who holds the lock ("host:pid") when known.
    Result<ProducerLock> lock_producer(const std::string& digest, std::chrono::seconds timeout,
                                       const std::function<void(const std::string& holder)>& on_wait = {}) const;

    // Atomically publishes a finished squashfs (same filesystem as the store) with its metadata.
    Status publish(const std::string& digest, const std::string& squashfs_tmp, ImageMetadata metadata) const;

    // True when the kernel may mount this store's images: the store root and images/ are owned by root
    // or by config.store_owner and writable by nobody else, so only a trusted producer could have
    // written the bytes.
    bool trusted(const Config& config) const;

    // Marks the image used now (for least-recently-used collection).
    void touch(const std::string& digest) const;
    // Opens the image for a container: the fd holds a shared lock while the container lives.
    Result<UniqueFd> open_in_use(const std::string& digest) const;
    bool in_use(const std::string& digest) const;

    // Removes one image (refused while in use) and the tag records pointing at it.
    Status remove(const std::string& digest) const;

    struct GcResult {
        std::vector<std::string> removed;
        std::vector<std::string> kept_in_use;
        uint64_t bytes_freed = 0;
        uint64_t bytes_left = 0;
    };
    // Removes least recently used images until the store is under `max_bytes` (0: no size target) and
    // every image unused for `unused_for` (0: no age target), never one in use; also clears staging
    // areas no producer holds.
    Result<GcResult> gc(uint64_t max_bytes, std::chrono::seconds unused_for) const;

private:
    explicit ImageStore(std::string root) : root_(std::move(root)) {}
    std::string root_;
};

}  // namespace gantry
