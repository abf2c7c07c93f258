// The import pipeline (see include/gantry/import.hpp): local source -> verified manifest, config and
// layer files -> the pull's converter -> the store's publication. The same store rules as a pull: one
// producer per digest, nothing published before it is complete, a stored digest is not built twice.
#include "gantry/import.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/pull.hpp"
#include "gantry/spawn.hpp"

extern char** environ;

namespace gantry {
namespace {

// The name of the work area in staging/ for importing `source`: staging areas are named by a digest,
// and gc removes one only when it can take that digest's producer lock, which the import holds
// meanwhile. Derived from the account and the source, so the lock file is reused by the next import
// of the same source (as a pull's is), and two imports of one source by one account take turns.
std::string work_area_digest(const LocalSource& source) {
    return Sha256::of("gantry import\n" + std::to_string(::geteuid()) + "\n" + source.str());
}

// The work area, removed with everything in it when the import ends, published or not.
class WorkArea {
public:
    WorkArea(const ImageStore& store, std::string digest) : store_(store), digest_(std::move(digest)) {}
    ~WorkArea() { store_.remove_staging(digest_); }
    WorkArea(const WorkArea&) = delete;
    WorkArea& operator=(const WorkArea&) = delete;

private:
    const ImageStore& store_;
    std::string digest_;
};

// `docker save IMAGE` (or podman's) into a pipe, unpacked as it arrives.
Result<ExtractedArchive> extract_saved(const LocalSource& source, const std::string& dir, uint64_t max_bytes) {
    const std::string tool = source.kind == LocalSource::Kind::dockerd ? "docker" : "podman";
    const std::string program = find_program(tool);
    if (program.empty())
        return make_error(source.str() + " needs the " + tool +
                          " command, which is not installed here (not in PATH); " +
                          "save the image on a machine that has it (" + tool + " save -o FILE " + source.path +
                          ") and import docker-archive:FILE");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return system_error("creating a pipe for " + tool + " save");
    UniqueFd read_end(fds[0]);
    UniqueFd write_end(fds[1]);
    ProcessRequest req;
    req.argv = {program, "save", source.path};
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) req.env.emplace_back(*e);
    req.inputs = {{write_end.get(), 1}, {STDERR_FILENO, 2}};
    auto pid = start_process(req);
    if (!pid) return pid.error().wrap("running " + tool + " save " + source.path);
    write_end.reset();
    auto extracted = extract_archive(read_end.get(), tool + " save " + source.path, dir, max_bytes);
    // A reader that gave up closes the pipe: the writer ends with SIGPIPE instead of blocking.
    read_end.reset();
    int status = 0;
    while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status) && !extracted) return extracted.error();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return make_error(tool + " save " + source.path + " failed (" +
                          (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                             : "signal " + std::to_string(WTERMSIG(status))) +
                          "; its message is above)");
    return extracted;
}

Result<LocalImage> read_source(const LocalSource& source, const std::string& work, const ImportOptions& options,
                               uint64_t max_bytes, std::optional<ExtractedArchive>& extracted) {
    using Kind = LocalSource::Kind;
    const std::string what = source.str();
    if (source.kind == Kind::oci_dir)
        return read_oci_layout(layout_directory_files(source.path), what, source.tag, options.platform);
    const std::string blobs = work + "/blobs";
    GANTRY_TRY(make_directories(blobs, 0700));
    if (source.kind == Kind::dockerd || source.kind == Kind::podman) {
        auto saved = extract_saved(source, blobs, max_bytes);
        if (!saved) return saved.error();
        extracted = std::move(*saved);
    } else {
        UniqueFd fd(::open(source.path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) return system_error("opening " + source.path);
        auto got = extract_archive(fd.get(), what, blobs, max_bytes);
        if (!got) return got.error();
        extracted = std::move(*got);
    }
    if (source.kind == Kind::oci_archive)
        return read_oci_layout(extracted->lookup(), what, source.tag, options.platform);
    // docker-archive, and whatever `save` wrote: manifest.json is in both of docker's formats (docker 25
    // writes an OCI layout beside it).
    return read_docker_archive(extracted->lookup(), what, source.tag);
}

}  // namespace

Result<ImportResult> import_image(const Config& config, const ImageStore& store, const LocalSource& source,
                                  const ImportOptions& options) {
    const std::string context = "importing " + source.str();
    if (auto st = store.check_root_may_modify(); !st) return st.error().wrap(context);

    const std::string work_digest = work_area_digest(source);
    auto work_lock = store.lock_producer(work_digest, std::chrono::seconds(3600));
    if (!work_lock) return work_lock.error().wrap(context);
    auto work = store.prepare_staging(work_digest);
    if (!work) return work.error().wrap(context);
    WorkArea cleanup(store, work_digest);

    std::optional<ExtractedArchive> extracted;
    auto image = read_source(source, *work, options, config.limits.max_image_bytes, extracted);
    if (!image) return image.error().wrap(context);

    ImportResult result;
    result.digest = image->manifest_digest;
    result.config_digest = image->config_digest;
    result.squashfs_path = store.squashfs_path(image->manifest_digest);
    std::vector<ImageReference> refs = options.tags;
    for (const auto& t : image->repo_tags)
        if (auto r = parse_reference(t)) refs.push_back(*r);
    for (const auto& r : refs) result.references.push_back(r.str());
    if (result.references.empty()) result.references.push_back(source.str());
    auto record_tags = [&] {
        for (const auto& r : refs) (void)store.record_tag(r, result.digest);  // best effort, as a pull's
    };

    if (!store.find(result.digest)) {
        auto lock = store.lock_producer(result.digest, std::chrono::seconds(3600));
        if (!lock) return lock.error().wrap(context);
        bool layered = options.layered;
        if (layered && image->layers.size() > kMaxLayeredLayers) {
            log::warning(context + ": it has " + std::to_string(image->layers.size()) + " layers, more than the " +
                         std::to_string(kMaxLayeredLayers) + " a layered image stacks; storing it as one whole squashfs");
            layered = false;
        }
        if (!store.find(result.digest) && layered) {
            // As a layered pull stores it (docs/store.md, "Layers"), the layer files taken from the
            // source (the converter checks each against its diff_id) instead of a registry.
            std::vector<std::string> diff_ids;
            for (const auto& b : image->blobs) diff_ids.push_back(b.diff_id);
            ImageMetadata meta;
            meta.references = result.references;
            meta.platform = image->platform;
            meta.manifest_json = image->manifest_json;
            meta.config_json = image->config_json;
            LayerBlobSource blobs;
            blobs.path = [&](size_t i, const std::string&) { return image->blobs[i].path; };
            std::atomic<bool> cancel{false};
            std::atomic<uint64_t> bytes_done{0};
            auto stored = store_image_as_layers(config, store, context + " as layers", result.digest, image->layers,
                                                diff_ids, std::move(meta), blobs, {},
                                                [](const std::function<void(PullProgress&)>&) {}, cancel, bytes_done);
            if (!stored) return stored.error();
            result.produced = true;
            result.stats = stored->stats;
        } else if (!store.find(result.digest)) {
            const std::string output = *work + "/image.sqsh";
            auto stats = convert_layers(image->blobs, output, squashfs_options(config));
            if (!stats) return stats.error().wrap(context);
            ImageMetadata meta;
            meta.references = result.references;
            meta.platform = image->platform;
            meta.manifest_json = image->manifest_json;
            meta.config_json = image->config_json;
            meta.layers = image->layers;
            meta.compressor = config.compressor;
            meta.block_size = config.block_size;
            if (auto st = store.publish(result.digest, output, meta); !st) {
                ::unlink(output.c_str());
                return st.error().wrap(context);
            }
            result.produced = true;
            result.stats = *stats;
        }
    }
    // A layered image's record stands for it (as a pull prints it).
    if (auto stored = store.find(result.digest); stored && stored->layered())
        result.squashfs_path = store.root() + "/images/" + digest_hex(result.digest) + ".json";
    store.touch(result.digest);
    record_tags();
    return result;
}

}  // namespace gantry
