// The pull pipeline: reference -> resolved digest -> manifest + config -> layers (downloaded in
// parallel, verified) -> one squashfs (converted top layer first while lower layers still download)
// -> atomic publication in the store. Exactly one producer per digest across processes and nodes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "gantry/result.hpp"
#include "gantry/squashfs.hpp"
#include "gantry/store.hpp"

namespace gantry {

struct PullProgress {
    enum class Phase { resolving, waiting, downloading, publishing, done } phase = Phase::resolving;
    uint64_t bytes_done = 0;   // compressed bytes downloaded (or found already present)
    uint64_t bytes_total = 0;  // sum of layer sizes
    size_t layers_done = 0;    // layers converted into the squashfs
    size_t layers_total = 0;
    std::string note;  // e.g. who holds the producer lock while waiting
};

// When to ask the registry what a tag names (docker/podman's --pull). Digest-pinned references whose
// image is stored are served from the store under every policy: their content cannot change.
enum class PullPolicy { always, missing, never };
Result<PullPolicy> parse_pull_policy(const std::string& text);

struct PullOptions {
    Platform platform = Platform::host();
    PullPolicy policy = PullPolicy::always;
    // The registry's answer is what authorizes the caller (the store owner's half of a plugin pull,
    // for a job user who cannot read the store): every pull then resolves at the registry with the
    // caller's credentials, whatever the policy.
    bool registry_authorizes = false;
    // The tag a digest-pinned `ref` was resolved from moments ago (srun's resolution of the step's
    // image, handed to the plugin's pull as `gantry pull --tag-resolved-to DIGEST TAG`): recorded as
    // the store's last resolution of that tag, as a pull by tag would, so that `missing` finds it
    // later. The caller's own record (the store's owner rule), and never where the registry
    // authorises the caller: the digest is the caller's word.
    std::optional<ImageReference> resolved_tag;
    CredentialLookup credentials;    // empty: the registry client's default sources
    std::string credential_sources;  // names what `credentials` consults, for "no credentials" messages
    std::function<void(const PullProgress&)> on_progress;
    std::chrono::seconds producer_timeout{3600};
    // Store the image as layers (docs/store.md, "Layers"): each layer converted on its own into the
    // overlay form and published under its chain ID, only the layers the store lacks downloaded and
    // converted, then an image record naming them. Not runnable yet (issue #19): off by default.
    bool layered = false;
    // A stored layered image serves this pull (the caller can stack its layers: gantry run with the
    // kernel backend); otherwise such an image counts as absent and the whole squashfs is made.
    bool accept_layered = false;
};

struct PullResult {
    std::string digest;
    std::string squashfs_path;  // a layered image: its record, images/<hex>.json
    bool produced = false;      // false: it was already in the store (or another producer made it)
    bool waited = false;        // not produced: another producer made it while this pull waited for its lock
    ConversionStats stats;
    size_t layers_converted = 0;  // a layered pull: the layers it downloaded and converted
    size_t layers_reused = 0;     // a layered pull: the layers the store had already
};

// Where store_image_as_layers finds layer i's blob: `path(i, dir)`. `fetch` (a pull) downloads the
// blobs it is given into `dir`, calling on_ready(j) once the j-th is complete and verified; without
// it (an import) every blob is there already.
struct LayerBlobSource {
    std::function<Status(const std::vector<Descriptor>&, const std::string& dir, const std::function<void(size_t)>&)>
        fetch;
    std::function<std::string(size_t i, const std::string& dir)> path;
};

// The layered producer (docs/store.md, "Layers"; a pull or an import, holding the image's producer
// lock): stores `layers` (bottom first, with their `diff_ids`) as the lowers plan_lowers() names,
// converting only what the store lacks, and publishes the image's record (`meta`: references,
// platform, manifest and config). `context` starts every error ("pulling REF as layers").
Result<PullResult> store_image_as_layers(const Config& config, const ImageStore& store, const std::string& context,
                                         const std::string& digest, const std::vector<Descriptor>& layers,
                                         const std::vector<std::string>& diff_ids, ImageMetadata meta,
                                         const LayerBlobSource& blobs, PullResult result,
                                         const std::function<void(const std::function<void(PullProgress&)>&)>& update,
                                         std::atomic<bool>& cancel, std::atomic<uint64_t>& bytes_done);

// Makes sure the image `ref` names is in `store`, pulling and converting it if needed.
Result<PullResult> pull_image(const Config& config, const ImageStore& store, const ImageReference& ref,
                              const PullOptions& options);

// The squashfs options the store uses for new images, from gantry.conf.
SquashfsOptions squashfs_options(const Config& config);

}  // namespace gantry
