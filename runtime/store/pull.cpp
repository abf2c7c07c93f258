// The pull pipeline (see include/gantry/pull.hpp). Downloads run on the registry client's workers;
// this thread converts, starting with the top layer as soon as its blob is verified.
#include "gantry/pull.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>

#include "gantry/acquire.hpp"
#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/image_config.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

// Which blobs are ready; conversion waits on it while the downloader fills it.
class BlobBoard {
public:
    explicit BlobBoard(size_t n) : ready_(n, false) {}
    void mark_ready(size_t i) {
        std::lock_guard<std::mutex> lock(m_);
        ready_[i] = true;
        cv_.notify_all();
    }
    void fail(Error e) {
        std::lock_guard<std::mutex> lock(m_);
        if (!error_) error_ = std::move(e);
        cv_.notify_all();
    }
    void finish() {
        std::lock_guard<std::mutex> lock(m_);
        finished_ = true;
        cv_.notify_all();
    }
    Status wait_for(size_t i) {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return ready_[i] || error_ || finished_; });
        if (ready_[i]) return {};
        if (error_) return *error_;
        return make_error("download finished without blob " + std::to_string(i));
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    std::vector<bool> ready_;
    std::optional<Error> error_;
    bool finished_ = false;
};

using ProgressUpdate = std::function<void(const std::function<void(PullProgress&)>&)>;

Result<PullResult> produce_locked(const Config& config, const ImageStore& store, const ImageReference& ref,
                                  const PullOptions& options, RegistryClient& client, const std::string& digest,
                                  PullResult result, const ProgressUpdate& update, std::atomic<bool>& cancel,
                                  std::atomic<uint64_t>& bytes_done);
std::optional<Result<PullResult>> whole_from_stored_layers(const Config& config, const ImageStore& store,
                                                           const ImageReference& ref, const std::string& digest,
                                                           PullResult result, const ProgressUpdate& update);

}  // namespace

namespace {

// The path a pull reports for `digest` when the store holds it in a form this pull serves: a whole
// image's squashfs always; a layered image's record only for a pull whose caller stacks layers
// (PullOptions::layered or accept_layered): for the others (the extract backend) a plain pull makes
// the whole squashfs. One lookup of the image for both questions.
std::optional<std::string> served_path(const ImageStore& store, const std::string& digest, bool layered) {
    auto img = store.find(digest);
    if (!img || (img->layered() && !layered)) return std::nullopt;
    if (img->layered()) return store.root() + "/images/" + digest_hex(digest) + ".json";
    return img->squashfs_path;
}

// The image the store can serve for `ref` without the registry, under `policy`: a digest-pinned
// reference by its own digest (or the platform manifest it was resolved to before), a tag by the
// store's last resolution unless the policy is `always`. Both records pass the store's owner rule
// (lookup_tag, find), so another user cannot redirect a tag to an image of their choosing.
std::optional<std::string> stored_digest(const ImageStore& store, const ImageReference& ref, PullPolicy policy,
                                         bool layered) {
    if (!ref.digest.empty()) {
        if (served_path(store, ref.digest, layered)) return ref.digest;
    } else if (policy == PullPolicy::always) {
        return std::nullopt;
    }
    auto record = store.lookup_tag(ref);
    if (record && validate_digest(record->digest) && served_path(store, record->digest, layered)) return record->digest;
    return std::nullopt;
}

// A tag the registry could not resolve (down, unreachable, a network outage) that the store resolved
// before: says so, with what runs it without the registry, so that a user whose job died on a
// registry outage learns the way round it from the error itself. Not where the registry is what
// authorizes the pull (there `missing` still asks it), and not for the registry's own answers (a 404
// or 401 says the tag or the user's access is gone, which the stored image does not change).
Error with_stored_tag_hint(Error error, const ImageStore& store, const ImageReference& ref, bool registry_authorizes) {
    if (registry_authorizes || error.http_status != 0 || !ref.digest.empty()) return error;
    auto record = store.lookup_tag(ref);
    if (!record || !validate_digest(record->digest) || !store.find(record->digest)) return error;
    char when[32] = "an earlier pull";
    const auto t = static_cast<std::time_t>(record->resolved_at);
    std::tm tm{};
    if (record->resolved_at > 0 && ::gmtime_r(&t, &tm) != nullptr)
        std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
    error.message += "; the store has the image this tag named at " + std::string(when) + " (" +
                     record->digest.substr(0, 19) +
                     "...): --pull=missing (for srun: export GANTRY_PULL_POLICY=missing) runs it without the registry";
    return error;
}

}  // namespace

SquashfsOptions squashfs_options(const Config& config) {
    SquashfsOptions o;
    o.compressor = config.compressor;
    o.level = config.compression_level;
    o.block_size = config.block_size;
    o.limits = config.limits;
    return o;
}

Result<PullResult> pull_image(const Config& config, const ImageStore& store, const ImageReference& ref,
                              const PullOptions& options) {
    // The converter (this thread) and the reporter thread both update progress; one mutex orders them.
    PullProgress progress;
    std::mutex progress_mutex;
    // Once we produce, the lock file carries our progress for others to show (srun, waiters), every
    // 2 s at most: it may live on a shared file system.
    const ProducerLock* producer = nullptr;
    auto recorded = std::chrono::steady_clock::time_point{};
    auto update = [&](const std::function<void(PullProgress&)>& change) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        change(progress);
        if (options.on_progress) options.on_progress(progress);
        auto now = std::chrono::steady_clock::now();
        if (producer != nullptr && progress.phase == PullProgress::Phase::downloading &&
            now - recorded >= std::chrono::seconds(2)) {
            producer->record_progress(progress.bytes_done, progress.bytes_total, progress.layers_done,
                                      progress.layers_total);
            recorded = now;
        }
    };
    auto report = [&] { update([](PullProgress&) {}); };
    // Root does not write a store users can write (docs/store.md, "Trust model"): said before anything
    // is fetched.
    if (auto st = store.check_root_may_modify(); !st) return st.error().wrap("pulling " + ref.str());

    std::atomic<uint64_t> bytes_done{0};
    std::atomic<bool> cancel{false};
    RegistryOptions ropts;
    ropts.max_connections = config.max_connections;
    ropts.credentials = options.credentials;
    ropts.credential_sources = options.credential_sources;
    ropts.cancel = &cancel;
    ropts.on_progress = [&](uint64_t done) { bytes_done = done; };
    RegistryClient client(config, ropts);

    // A stored digest-pinned image, or a tag under `missing`/`never`, needs no network at all, unless
    // the registry must vouch for the caller: a private_images store (users cannot read its files, so
    // only a registry that lets them pull the image may hand it over) or a pull on someone's behalf.
    const bool registry_authorizes = options.registry_authorizes || config.private_images;
    const bool takes_layers = options.layered || options.accept_layered;
    // The store serves `digest` at `path`: that is the pull's result, with nothing produced.
    bool waited = false;  // found only once the producer lock was ours: another made it (telemetry: "waited")
    auto served = [&](const std::string& digest, const std::string& path) {
        store.touch(digest);
        PullResult r;
        r.digest = digest;
        r.squashfs_path = path;
        r.waited = waited;
        update([](PullProgress& p) { p.phase = PullProgress::Phase::done; });
        return r;
    };
    // An imported image's name (local/NAME) is answered by the store alone, whatever the policy: no
    // registry holds it (RegistryClient refuses to ask), and only the importer's own records name it.
    const bool imported_name = ref.names_imported_image();
    const PullPolicy policy = imported_name ? PullPolicy::never : options.policy;
    if (registry_authorizes && imported_name)
        return make_error(ref.str() +
                          " names an imported image, and in this store every image is authorized by "
                          "a registry (private_images or a store_owner pull); run it by a registry reference, or "
                          "as a file (gantry export IMAGE -o FILE.sqsh)");
    if (registry_authorizes && policy == PullPolicy::never)
        return make_error("the pull policy 'never' is not available for " + ref.str() +
                          ": in this store every pull is authorized by the registry (private_images or a "
                          "store_owner pull); use --pull=always or missing");
    if (options.resolved_tag && !registry_authorizes && !ref.digest.empty())
        (void)store.record_tag(*options.resolved_tag, ref.digest);  // best effort, as below
    if (auto stored = registry_authorizes ? std::nullopt : stored_digest(store, ref, policy, takes_layers))
        return served(*stored, served_path(store, *stored, true).value_or(store.squashfs_path(*stored)));
    // Stored only as layers, for a caller that needs the whole file (the extract backend, a node that
    // cannot stack): where the store answers for the reference without the registry (a pinned digest,
    // a tag under missing/never), the file is made from the layers and the record's own manifest and
    // config under the digest's producer lock: no network, as for a whole image the store holds.
    if (!registry_authorizes && !takes_layers) {
        if (auto layered = stored_digest(store, ref, policy, true)) {
            auto lock = store.lock_producer(*layered, options.producer_timeout, [](const std::string&) {});
            if (!lock) return lock.error();
            // Another producer may have made it meanwhile.
            if (auto path = served_path(store, *layered, false)) return served(*layered, *path);
            PullResult whole;
            whole.digest = *layered;
            whole.squashfs_path = store.squashfs_path(*layered);
            if (auto made = whole_from_stored_layers(config, store, ref, *layered, whole, update)) return *made;
        }
    }
    if (imported_name)
        return make_error(ref.str() + " is not an image you imported into the store " + store.root() +
                          " (local/ names are each account's own); import it with gantry import --tag " + ref.str() +
                          " SOURCE, or run it by digest");
    if (policy == PullPolicy::never)
        return make_error(ref.str() + " is not in the store " + store.root() +
                          " and the pull policy is 'never'; pull it first (gantry pull " + ref.str() +
                          ") or use --pull=missing");

    // A pinned digest whose image is not stored yet (the user's IMAGE@DIGEST, or the digest srun
    // resolved once for a step and handed to all its nodes): wait for its producer before asking the
    // registry anything, so that a cold step's nodes cost the registry the producer's manifest
    // requests alone, not one more per node. Not where the registry authorises the caller: there every
    // pull asks it. (An index digest is published under its platform's manifest digest: its waiters
    // still resolve it, each once, and then take that digest's lock too -- always in this order, index
    // before manifest, so no two pulls wait for each other.)
    auto waiting = [&](const std::string& holder) {
        waited = true;
        update([&](PullProgress& p) {
            p.phase = PullProgress::Phase::waiting;
            p.note = holder;
        });
    };
    std::optional<ProducerLock> pinned_lock;
    const int64_t pinned_since = static_cast<int64_t>(std::time(nullptr));
    if (!ref.digest.empty() && !registry_authorizes) {
        auto held = store.lock_producer(ref.digest, options.producer_timeout, waiting);
        if (!held) return held.error();
        // Published while this pull waited for the lock (or just before it took it): another's work.
        if (auto path = served_path(store, ref.digest, takes_layers)) {
            waited = true;
            return served(ref.digest, *path);
        }
        pinned_lock.emplace(std::move(*held));
    }

    // Only the manifest (never a blob) is fetched before the store and the producer lock are
    // consulted: waiters and cache hits cost the registry one manifest request each. "resolving" is
    // said only now: an image the store answers for (above) prints nothing.
    report();
    auto resolved = client.resolve_digest(ref, options.platform);
    if (!resolved) return with_stored_tag_hint(resolved.error(), store, ref, registry_authorizes);
    const std::string digest = *resolved;
    (void)store.record_tag(ref, digest);  // best effort: the image itself is what matters

    PullResult result;
    result.digest = digest;
    result.squashfs_path = store.squashfs_path(digest);
    if (auto path = served_path(store, digest, takes_layers)) return served(digest, *path);

    // One producer per digest. Others wait here and find the image published when they get the lock.
    // Waiters of one Slurm job step (the plugin sets GANTRY_PULL_GROUP to JOBID.STEPID) share the
    // producer's outcome: when it fails cleanly (registry gone, 401, disk full) each waiter would
    // otherwise repeat the same pull with the same retries one after the other, N nodes x the retry
    // budget, for a step that has failed already. A producer killed outright leaves no note, so a
    // waiter still takes over its work. Other steps and jobs (other users, other credentials) never
    // adopt the note and try for themselves.
    const std::string group = environment().gantry_pull_group.value;
    // A pinned manifest digest's lock is held already (above); flock would make a second one wait on it.
    const bool have_lock = pinned_lock && digest == ref.digest;
    const int64_t waiting_since = have_lock ? pinned_since : static_cast<int64_t>(std::time(nullptr));
    auto lock = have_lock ? Result<ProducerLock>(std::move(*pinned_lock))
                          : store.lock_producer(digest, options.producer_timeout, waiting);
    if (!lock) return lock.error();
    if (auto path = served_path(store, digest, takes_layers)) {
        waited = true;  // published while this pull waited for the lock (or just before it took it)
        return served(digest, *path);
    }
    if (!group.empty()) {
        // "GROUP\nHOST:PID\nMESSAGE", written by a producer of this step since we started waiting
        // (2 s of slack for clocks of nodes that share the store); the store honours only a note
        // written by an account it trusts.
        auto note = store.read_failure_note(digest, waiting_since - 2);
        if (note) {
            auto first = note->find('\n');
            auto second = first == std::string::npos ? first : note->find('\n', first + 1);
            if (second != std::string::npos && note->substr(0, first) == group) {
                const std::string context = "pulling " + ref.str();
                std::string why = trim(note->substr(second + 1));
                if (starts_with(why, context + ": ")) why = why.substr(context.size() + 2);
                return make_error(context + ": the producer of this step (" +
                                  note->substr(first + 1, second - first - 1) + ") failed: " + why);
            }
        }
    }
    {
        std::lock_guard<std::mutex> guard(progress_mutex);
        producer = &*lock;
    }
    auto produced = produce_locked(config, store, ref, options, client, digest, result, update, cancel, bytes_done);
    {
        std::lock_guard<std::mutex> guard(progress_mutex);
        producer = nullptr;
    }
    if (produced) {
        store.clear_failure_note(digest);
    } else if (!group.empty()) {
        store.write_failure_note(digest, group + "\n" + host_and_pid() + "\n" + produced.error().message + "\n");
    }
    return produced;
}

namespace {

// A whole squashfs of `digest` at `output` from the store's layers of it, when the store holds it as
// a layered image with every layer present: the layers held in use (the record's lock keeps gc from
// them) and composed as overlayfs shows them (compose_layers_to_image). nullopt when the image is not
// stored as layers, or the composition failed (said as a warning; the caller downloads instead).
std::optional<ConversionStats> compose_stored_layers(const Config& config, const ImageStore& store,
                                                     const std::string& digest, const std::string& output,
                                                     const ProgressUpdate& update) {
    auto stored = store.find(digest);
    if (!stored || !stored->layered()) return std::nullopt;
    // The layers as acquire_image opened and checked them: the composition reads these descriptors
    // (as /proc/self/fd/N), so a layer renamed over in the meantime is not what gets published.
    auto acquired = acquire_image(store, digest);
    if (!acquired) {
        log::warning("making the whole image of " + digest + " from its stored layers: " + acquired.error().message +
                     "; downloading it instead");
        return std::nullopt;
    }
    if (!acquired->layered || !acquired->in_use) return std::nullopt;
    const std::vector<std::string> files = acquired->paths();
    update([&](PullProgress& p) {
        p.phase = PullProgress::Phase::publishing;
        p.layers_total = files.size();
    });
    auto stats = compose_layers_to_image(files, output, {}, squashfs_options(config), kOverlayOpaqueXattr);
    if (!stats) {
        ::unlink(output.c_str());
        log::warning("making the whole image of " + digest + " from its stored layers: " + stats.error().message +
                     "; downloading it instead");
        return std::nullopt;
    }
    return *stats;
}

// The store holds `digest` as layers and the caller needs it whole: the whole squashfs composed from the
// layer files (compose_stored_layers) in the digest's staging area and published with the record's own
// metadata (its manifest, config and layers; no layer_chain), the reference added. Called under the
// digest's producer lock, with no registry. nullopt when the image is not stored as layers or composing
// failed (said as a warning); the caller then downloads, or says the image is not in the store.
std::optional<Result<PullResult>> whole_from_stored_layers(const Config& config, const ImageStore& store,
                                                           const ImageReference& ref, const std::string& digest,
                                                           PullResult result, const ProgressUpdate& update) {
    auto stored = store.find(digest);
    if (!stored || !stored->layered()) return std::nullopt;
    auto staging = store.prepare_staging(digest);
    if (!staging) return Result<PullResult>(staging.error().wrap("pulling " + ref.str()));
    std::string output = *staging + "/image.sqsh." + std::to_string(::getpid());
    ::unlink(output.c_str());
    auto composed = compose_stored_layers(config, store, digest, output, update);
    if (!composed) return std::nullopt;
    ImageMetadata meta = stored->metadata;
    meta.layer_chain.clear();
    if (std::find(meta.references.begin(), meta.references.end(), ref.str()) == meta.references.end())
        meta.references.push_back(ref.str());
    meta.compressor = config.compressor;
    meta.block_size = config.block_size;
    auto published = store.publish(digest, output, meta);
    if (!published) {
        ::unlink(output.c_str());
        return Result<PullResult>(published.error().wrap("pulling " + ref.str()));
    }
    store.remove_staging(digest);
    result.produced = true;
    result.stats = *composed;
    update([](PullProgress& p) { p.phase = PullProgress::Phase::done; });
    return Result<PullResult>(std::move(result));
}

// The producer's part of pull_image, run while holding the producer lock.
Result<PullResult> produce_locked(const Config& config, const ImageStore& store, const ImageReference& ref,
                                  const PullOptions& options, RegistryClient& client, const std::string& digest,
                                  PullResult result, const ProgressUpdate& update, std::atomic<bool>& cancel,
                                  std::atomic<uint64_t>& bytes_done) {
    ImageReference pinned = ref;
    pinned.digest = digest;
    auto image = client.resolve(pinned, options.platform);
    if (!image) return image.error();
    if (image->manifest_digest != digest)
        return make_error("pulling " + ref.str() + ": the registry served manifest " + image->manifest_digest +
                          " for " + digest);

    auto cfg = parse_image_config(image->config_json);
    if (!cfg) return cfg.error().wrap("pulling " + ref.str());
    if (!cfg->diff_ids.empty() && cfg->diff_ids.size() != image->layers.size())
        return make_error("pulling " + ref.str() + ": the config lists " + std::to_string(cfg->diff_ids.size()) +
                          " layers but the manifest " + std::to_string(image->layers.size()));

    if (options.layered && image->layers.size() > kMaxLayeredLayers)
        log::warning("pulling " + ref.str() + ": it has " + std::to_string(image->layers.size()) +
                     " layers, more than the " + std::to_string(kMaxLayeredLayers) +
                     " a layered image stacks; storing it as one whole squashfs");
    else if (options.layered) {
        ImageMetadata meta;
        meta.references.push_back(ref.str());
        meta.platform = options.platform.str();
        meta.manifest_json = image->manifest_json;
        meta.config_json = image->config_json;
        LayerBlobSource blobs;
        blobs.fetch = [&](const std::vector<Descriptor>& wanted, const std::string& dir,
                          const std::function<void(size_t)>& on_ready) {
            return client.fetch_blobs(ref, wanted, dir, on_ready);
        };
        blobs.path = [&](size_t i, const std::string& dir) { return dir + "/" + digest_hex(image->layers[i].digest); };
        return store_image_as_layers(config, store, "pulling " + ref.str() + " as layers", digest, image->layers,
                                     cfg->diff_ids, std::move(meta), blobs, std::move(result), update, cancel,
                                     bytes_done);
    }

    // The staging area survives a producer that dies: its verified blobs are reused by the next one.
    auto staging = store.prepare_staging(digest);
    if (!staging) return staging.error().wrap("pulling " + ref.str());
    std::string blobs_dir = *staging + "/blobs";
    GANTRY_TRY(make_directories(blobs_dir, 0755));
    std::string output = *staging + "/image.sqsh." + std::to_string(::getpid());
    ::unlink(output.c_str());

    // The finished squashfs at `output` into the store, with the image's metadata.
    auto publish_whole = [&](const ConversionStats& stats) -> Result<PullResult> {
        ImageMetadata meta;
        meta.references.push_back(ref.str());
        meta.platform = options.platform.str();
        meta.manifest_json = image->manifest_json;
        meta.config_json = image->config_json;
        meta.layers = image->layers;
        meta.compressor = config.compressor;
        meta.block_size = config.block_size;
        auto published = store.publish(digest, output, meta);
        if (!published) {
            ::unlink(output.c_str());
            return published.error().wrap("pulling " + ref.str());
        }
        store.remove_staging(digest);
        result.produced = true;
        result.stats = stats;
        update([](PullProgress& p) { p.phase = PullProgress::Phase::done; });
        return result;
    };
    // The store holds this image as layers (a layered pull), and this caller needs it whole (the
    // extract backend): composed from the layer files, no blob downloaded. Any failure there falls
    // back to the download below.
    if (auto made = whole_from_stored_layers(config, store, ref, digest, result, update)) return *made;

    std::vector<LayerBlob> layers;
    uint64_t bytes_total = 0;
    for (size_t i = 0; i < image->layers.size(); ++i) {
        const auto& d = image->layers[i];
        bytes_total += d.size;
        layers.push_back({blobs_dir + "/" + digest_hex(d.digest), d.media_type, d.digest,
                          i < cfg->diff_ids.size() ? cfg->diff_ids[i] : std::string(), nullptr});
    }

    BlobBoard board(layers.size());
    Status download_status;
    std::thread downloader([&] {
        // Top layer first: the converter starts there, so the blobs it needs first are asked for first.
        std::vector<Descriptor> top_down(image->layers.rbegin(), image->layers.rend());
        const size_t n = top_down.size();
        download_status = client.fetch_blobs(ref, top_down, blobs_dir, [&](size_t j) { board.mark_ready(n - 1 - j); });
        if (!download_status) board.fail(download_status.error());
        board.finish();
    });
    update([&](PullProgress& p) {
        p.phase = PullProgress::Phase::downloading;
        p.layers_total = layers.size();
        p.bytes_total = bytes_total;
    });

    std::atomic<bool> converting{true};
    std::thread reporter([&] {
        while (converting) {
            update([&](PullProgress& p) { p.bytes_done = bytes_done; });
            for (int i = 0; i < 10 && converting; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });

    std::optional<LimitBreach> breach;
    bool download_failed = false;  // the conversion stopped on the download's error, not its own
    auto stats = convert_layers(
        layers, output, squashfs_options(config),
        [&](size_t i) -> Status {
            auto st = board.wait_for(i);
            if (st) update([&](PullProgress& p) { p.layers_done = layers.size() - 1 - i; });
            download_failed = !st;
            return st;
        },
        &breach);
    if (!stats) cancel = true;
    // A blob over a limit is intact but useless: a resumed pull must not find and convert it again.
    if (breach) ::unlink(layers[breach->layer].path.c_str());
    downloader.join();
    converting = false;
    reporter.join();
    // The first failure is the cause: a conversion that failed on its own cancelled the downloads,
    // whose "cancelled" says nothing.
    if (!stats && !download_failed) {
        ::unlink(output.c_str());
        return stats.error().wrap("pulling " + ref.str());
    }
    if (!download_status) {
        ::unlink(output.c_str());
        return download_status.error().wrap("pulling " + ref.str());
    }
    if (!stats) {
        ::unlink(output.c_str());
        return stats.error().wrap("pulling " + ref.str());
    }

    update([&](PullProgress& p) {
        p.phase = PullProgress::Phase::publishing;
        p.bytes_done = p.bytes_total;
        p.layers_done = layers.size();
    });

    return publish_whole(*stats);
}

}  // namespace

// The layered producer (docs/store.md, "Layers"), run while holding the image's producer lock: the
// layers the store lacks are downloaded (in parallel, as for a whole image), each converted on its own
// into the overlay form and published under its chain ID, one producer per layer (a layer two images
// being pulled at once share is converted once); every layer is held in use until the image record
// naming them is published. The image's limits hold for the whole stack, stored layers included.
// A deep image (more than kMaxLowers layers) is stored as the groups plan_lowers() names: a group the
// store lacks is composed from its layers (stored ones as they are, the others converted into the
// staging area) and published under its group key, one producer per group; its layers are not
// published on their own (docs/store.md, "Deep images").
Result<PullResult> store_image_as_layers(const Config& config, const ImageStore& store, const std::string& context,
                                         const std::string& digest, const std::vector<Descriptor>& layers,
                                         const std::vector<std::string>& diff_ids, ImageMetadata meta,
                                         const LayerBlobSource& blobs, PullResult result,
                                         const std::function<void(const std::function<void(PullProgress&)>&)>& update,
                                         std::atomic<bool>& cancel, std::atomic<uint64_t>& bytes_done) {
    if (layers.empty()) return make_error(context + ": the image has no layers");
    if (diff_ids.size() != layers.size())
        return make_error(context + ": the config lists no diff_ids for its layers, which name them in the store");
    const uint64_t max_image_bytes = config.limits.max_image_bytes;
    const std::vector<std::string> chain = chain_ids(diff_ids);
    const std::vector<LowerRange> plan = plan_lowers(chain.size());
    if (plan.empty()) return make_error(context + ": " + std::to_string(chain.size()) + " layers cannot be stacked");
    std::vector<std::string> keys;  // the store name of each lower
    for (const auto& r : plan) keys.push_back(r.grouped ? layer_group_key(chain[r.end - 1]) : chain[r.first]);
    std::vector<UniqueFd> held(plan.size());
    std::vector<UniqueFd> member_held(chain.size());  // layers of a group to make, stored on their own
    std::vector<uint64_t> member_bytes(chain.size(), 0);
    std::vector<size_t> missing;  // lowers to make
    std::vector<bool> fetch(chain.size(), false);
    uint64_t declared = 0, expanded = 0;  // both saturate: a manifest may declare sizes near 2^64
    auto add = [](uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; };
    // The store's entry `key`, when it has it: held in use in `slot`; its size is put in `bytes`.
    auto hold = [&](const std::string& key, UniqueFd& slot, uint64_t& bytes) {
        auto stored = store.find_layer(key);
        if (!stored) return false;
        auto fd = store.open_layer_in_use(key);
        if (!fd) return false;
        slot = std::move(*fd);
        bytes = stored->record.uncompressed_bytes;
        return true;
    };
    auto hold_stored = [&](size_t e) {
        uint64_t bytes = 0;
        if (!hold(keys[e], held[e], bytes)) return false;
        expanded = add(expanded, bytes);
        return true;
    };
    for (const auto& d : layers) declared = add(declared, d.size);
    for (size_t e = 0; e < plan.size(); ++e) {
        if (hold_stored(e)) continue;
        missing.push_back(e);
        for (size_t i = plan[e].first; i < plan[e].end; ++i) {
            // A group's layer the store has on its own (a shallower image's) is not downloaded again.
            if (plan[e].grouped && hold(chain[i], member_held[i], member_bytes[i])) continue;
            fetch[i] = true;
        }
    }
    std::vector<Descriptor> to_fetch;  // bottom first, the order they are converted in
    std::vector<size_t> fetch_slot(chain.size(), 0);
    for (size_t i = 0; i < chain.size(); ++i) {
        if (!fetch[i]) continue;
        fetch_slot[i] = to_fetch.size();
        to_fetch.push_back(layers[i]);
    }
    const size_t to_convert = to_fetch.size();
    // The whole stack, not only the layers fetched now: compressed layers cannot be larger than the
    // tars they expand to (as the registry client's own check for a whole image).
    if (declared > max_image_bytes)
        return make_error(context + ": the manifest declares " + format_bytes(declared) +
                          " of compressed layers, more than max_image_bytes = " + std::to_string(max_image_bytes) +
                          " (" + format_bytes(max_image_bytes) +
                          ") allows uncompressed; raise max_image_bytes in gantry.conf "
                          "if the image is genuine");
    uint64_t bytes_total = 0;
    for (const auto& d : to_fetch) bytes_total += d.size;
    update([&](PullProgress& p) {
        p.phase = PullProgress::Phase::downloading;
        p.layers_total = to_convert;
        p.bytes_total = bytes_total;
    });

    auto staging = store.prepare_staging(digest);
    if (!staging) return staging.error().wrap(context);
    const std::string blobs_dir = *staging + "/blobs";
    GANTRY_TRY(make_directories(blobs_dir, 0755));
    // The blobs download (in parallel, as for a whole image) while the layers whose blobs are in are
    // converted: a layer waits for its own blob only. However this returns, the downloads stop
    // (cancel) and the downloader is joined.
    BlobBoard board(to_fetch.size());
    Status download_status;
    std::thread downloader;
    if (!to_fetch.empty() && blobs.fetch)
        downloader = std::thread([&] {
            download_status = blobs.fetch(to_fetch, blobs_dir, [&](size_t j) { board.mark_ready(j); });
            if (!download_status) board.fail(download_status.error());
            board.finish();
        });
    std::atomic<bool> converting{true};
    std::thread reporter([&] {
        while (converting) {
            update([&](PullProgress& p) { p.bytes_done = bytes_done; });
            for (int i = 0; i < 10 && converting; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    Defer stop_threads([&] {
        if (downloader.joinable()) {
            cancel = true;  // a no-op once the downloads are done
            downloader.join();
        }
        converting = false;
        reporter.join();
    });

    SquashfsOptions options = squashfs_options(config);
    size_t converted = 0;
    // Converts layer i into `out` (overlay form), within what is left of the image's budget (the
    // converter's limits are per image).
    auto convert = [&](size_t i, const std::string& out) -> Result<ConversionStats> {
        if (blobs.fetch)
            if (auto ready = board.wait_for(fetch_slot[i]); !ready) return ready.error().wrap(context);
        const Descriptor& d = layers[i];
        ::unlink(out.c_str());
        LayerBlob blob{blobs.path(i, blobs_dir), d.media_type, d.digest, diff_ids[i], nullptr};
        options.limits.max_image_bytes = max_image_bytes - std::min(max_image_bytes, expanded);
        std::optional<LimitBreach> breach;
        auto stats = convert_layer_for_overlay(blob, out, options, kOverlayOpaqueXattr, &breach);
        if (!stats) {
            ::unlink(out.c_str());
            // A downloaded blob over a limit is intact but useless: a resumed pull must not convert
            // it again. (An import's blobs are the source's files: they stay.)
            if (breach && blobs.fetch) ::unlink(blob.path.c_str());
            return stats.error().wrap(context);
        }
        expanded = add(expanded, stats->uncompressed_bytes);
        result.stats.files += stats->files;
        result.stats.uncompressed_bytes += stats->uncompressed_bytes;
        ++result.layers_converted;
        ++converted;
        update([&](PullProgress& p) { p.layers_done = converted; });
        return stats;  // the blob stays until the staging area goes: an image may list it twice
    };
    const std::string tmp = *staging + "/layer.sqsh." + std::to_string(::getpid());
    for (const size_t e : missing) {
        const LowerRange& r = plan[e];
        auto lock = store.lock_producer(keys[e], std::chrono::seconds(3600));
        if (!lock) return lock.error().wrap(context);
        if (hold_stored(e)) continue;  // made meanwhile by the producer of another image
        LayerRecord record;
        uint64_t image_bytes = 0;
        record.chain_id = keys[e];
        record.parent = r.first == 0 ? std::string() : chain[r.first - 1];
        if (!r.grouped) {
            auto stats = convert(r.first, tmp);
            if (!stats) return stats.error();
            record.diff_id = diff_ids[r.first];
            record.blob_digest = layers[r.first].digest;
            record.uncompressed_bytes = stats->uncompressed_bytes;
            image_bytes = stats->image_bytes;
        } else {
            std::vector<std::string> files, made;
            Defer remove_made([&] {
                for (const auto& f : made) ::unlink(f.c_str());
            });
            for (size_t i = r.first; i < r.end; ++i) {
                record.group_diff_ids.push_back(diff_ids[i]);
                if (member_held[i]) {
                    files.push_back(store.layer_squashfs_path(chain[i]));
                    record.uncompressed_bytes = add(record.uncompressed_bytes, member_bytes[i]);
                    expanded = add(expanded, member_bytes[i]);
                    continue;
                }
                const std::string out =
                    *staging + "/member-" + std::to_string(i) + ".sqsh." + std::to_string(::getpid());
                made.push_back(out);
                auto stats = convert(i, out);
                if (!stats) return stats.error();
                files.push_back(out);
                record.uncompressed_bytes = add(record.uncompressed_bytes, stats->uncompressed_bytes);
            }
            ::unlink(tmp.c_str());
            auto composed = compose_layers_for_overlay(files, tmp, options, kOverlayOpaqueXattr);
            if (!composed)
                return composed.error().wrap(context + ": composing layers " + std::to_string(r.first + 1) + "-" +
                                             std::to_string(r.end) + " into one group");
            image_bytes = composed->image_bytes;
        }
        auto published = store.publish_layer(tmp, record);
        if (!published) {
            ::unlink(tmp.c_str());
            return published.error().wrap(context);
        }
        held[e] = std::move(*published);
        result.stats.image_bytes += image_bytes;
    }
    result.layers_reused = chain.size() - result.layers_converted;
    if (downloader.joinable()) downloader.join();  // every blob was converted: the downloads are done
    if (!download_status) return download_status.error().wrap(context);
    update([&](PullProgress& p) { p.bytes_done = p.bytes_total; });

    update([&](PullProgress& p) { p.phase = PullProgress::Phase::publishing; });
    meta.layers = layers;
    meta.compressor = config.compressor;
    meta.block_size = config.block_size;
    meta.layer_chain = keys;
    if (auto st = store.publish_layered(digest, meta); !st) return st.error().wrap(context);
    store.remove_staging(digest);
    result.produced = true;
    result.squashfs_path = served_path(store, digest, true).value_or(store.squashfs_path(digest));
    update([](PullProgress& p) { p.phase = PullProgress::Phase::done; });
    return result;
}

}  // namespace gantry
