// The import pipeline (see include/gantry/import.hpp): local source -> verified manifest, config and
// layer files -> the pull's converter -> the store's publication. The same store rules as a pull: one
// producer per digest, nothing published before it is complete, a stored digest is not built twice.
#include "gantry/import.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/pull.hpp"
#include "gantry/reference.hpp"
#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"

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

// The name in the importer's local/ namespace that stands for `ref`, a name an archive claims:
// registry.example/team/app:1 -> local/team/app:1, app:1 (Docker Hub's library/app) -> local/app:1.
ImageReference imported_name(const ImageReference& ref) {
    ImageReference name;
    name.registry = kImportedNamespace;
    name.repository = ref.repository;
    if (ref.registry == kDockerHubRegistry && starts_with(name.repository, "library/"))
        name.repository = name.repository.substr(8);
    name.tag = ref.tag.empty() ? "latest" : ref.tag;
    return name;
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

// An archive to import, opened once; everything reads this descriptor. Root takes only a file that no
// other account could change while root reads it -- a regular file owned by root and writable by
// nobody else, checked on the descriptor (a check on the path would say nothing about what another
// user renames over it afterwards) -- and opens it without blocking, so that a FIFO cannot hang root.
// A user imports what the user could read anyway, a pipe (/dev/stdin) included.
Result<UniqueFd> open_archive_file(const std::string& path) {
    const bool root = ::geteuid() == 0;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | (root ? O_NONBLOCK | O_NOCTTY : 0)));
    if (!fd) return system_error("opening " + path);
    if (!root) return fd;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return system_error("opening " + path);
    std::string why;
    if (!S_ISREG(st.st_mode))
        why = "is not a regular file";
    else if (st.st_uid != 0)
        why = "is owned by uid " + std::to_string(st.st_uid) + ", who could change it while root reads it";
    else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        why = "is writable by its group or by all users, who could change it while root reads it";
    if (!why.empty())
        return make_error(path + " " + why +
                          "; root imports only a root-owned file: import it as its owner (runuser -u OWNER -- gantry "
                          "import ...), or copy it to a "
                          "root-owned file first (install -m 0600 FILE /root/...)");
    if (::fcntl(fd.get(), F_SETFL, 0) != 0) return system_error("opening " + path);  // regular: blocking reads
    return fd;
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
        auto fd = open_archive_file(source.path);
        if (!fd) return fd.error();
        auto got = extract_archive(fd->get(), what, blobs, max_bytes);
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
    // An imported image is known by its digest and by names in the importer's own local/ namespace
    // (docs/user.md, "Importing local images"), never by a registry's reference: an archive's RepoTags
    // are claims by whoever made it, so `REGISTRY/app:1` is recorded as local/app:1, and a pull of
    // REGISTRY/app:1 (or srun's) still asks that registry.
    std::vector<ImageReference> refs;
    for (const auto& r : options.tags) {
        if (!r.names_imported_image())
            return make_error(context + ": --tag " + r.str() +
                              " names a registry's image; an imported image's name "
                              "is under local/ (e.g. local/" +
                              imported_name(r).repository + ":" + r.tag + ")");
        refs.push_back(r);
    }
    for (const auto& t : image->repo_tags)
        if (auto r = parse_reference(t)) refs.push_back(imported_name(*r));
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
                         std::to_string(kMaxLayeredLayers) +
                         " a layered image stacks; storing it as one whole squashfs");
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
            auto stored = store_image_as_layers(
                config, store, context + " as layers", result.digest, image->layers, diff_ids, std::move(meta), blobs,
                {}, [](const std::function<void(PullProgress&)>&) {}, cancel, bytes_done);
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
