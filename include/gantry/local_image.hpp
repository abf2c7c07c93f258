// Local image sources for `gantry import`: an OCI layout directory, an oci-archive (a tar of such a
// layout), a docker-archive (`docker save`'s format) and the `save` output of a local docker or podman.
// Owner: runtime/local/. Each is read into the pieces a registry pull has -- manifest, config, layer
// blobs with their diff_ids, all verified -- so the same converter and the same store publication
// consume them (runtime/store/import.cpp).
//
// Everything here parses bytes the user hands us: it runs in the CLI as the user, never in the plugin.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/registry.hpp"
#include "gantry/result.hpp"
#include "gantry/squashfs.hpp"

namespace gantry {

// Caps on the JSON documents of a local image, as the registry client has for served ones.
inline constexpr size_t kMaxLocalIndexBytes = size_t{4} << 20;     // index.json, manifest.json
inline constexpr size_t kMaxLocalManifestBytes = size_t{4} << 20;  // an OCI manifest or nested index
inline constexpr size_t kMaxLocalConfigBytes = size_t{64} << 20;   // the image config
// Members of one archive: a docker-archive of a 100-layer image has ~400.
inline constexpr size_t kMaxArchiveMembers = 100000;

struct LocalSource {
    enum class Kind { oci_dir, oci_archive, docker_archive, dockerd, podman } kind = Kind::oci_dir;
    std::string path;  // the directory or archive file; for dockerd/podman the image name given to `save`
    std::string tag;   // oci:DIR:TAG's TAG; for an archive an optional image to pick ("" = the only one)
    [[nodiscard]] std::string str() const;  // as the user wrote it, with an absolute path
};

// "oci:DIR[:TAG]", "oci-archive:FILE[:TAG]", "docker-archive:FILE[:REF]", "dockerd://IMAGE",
// "podman://IMAGE". Anything else is an error listing these forms.
Result<LocalSource> parse_local_source(const std::string& text);

// One file of a local image: where its bytes are and their sha256.
struct LocalFile {
    std::string path;    // for messages; read through open_path()
    std::string digest;  // "sha256:<hex>" of the file's bytes
    uint64_t size = 0;
    // The descriptor `digest` was computed from, for a file outside our own work area (an OCI layout
    // directory another process may change): everything later reads this file, never `path` again.
    std::shared_ptr<const UniqueFd> fd;

    // Where to read the bytes that were hashed: /proc/self/fd/N of `fd` (the same file, whatever has
    // been renamed over `path` since), else `path`.
    [[nodiscard]] std::string open_path() const { return fd ? "/proc/self/fd/" + std::to_string(fd->get()) : path; }
};
// Finds a file of the image by its name inside the layout or archive ("index.json",
// "blobs/sha256/<hex>", a docker-archive's "<hex>.tar"); an error when there is none.
using LocalFileLookup = std::function<Result<LocalFile>(const std::string& name)>;

// A member name made canonical: "./a//b" -> "a/b". Absolute names, ".." components, empty names and
// names beyond kMaxPathBytes are refused ("archive member '...' leaves the archive").
Result<std::string> normalize_member_name(std::string_view name);

// The files of an OCI layout directory (oci:DIR): each is hashed when looked up. Names are
// normalized first; a symlink inside DIR is refused.
LocalFileLookup layout_directory_files(const std::string& dir);

// An archive streamed into a directory: every regular member's bytes land in `dir` as a file named
// by their sha256 (so the member names never become paths), and symlinks and hard links between
// members are resolved to the file they name.
struct ExtractedArchive {
    std::string dir;
    std::map<std::string, LocalFile> members;  // normalized member name -> its bytes
    std::map<std::string, std::string> links;  // normalized member name -> normalized target member
    uint64_t bytes = 0;                        // all members' bytes together
    // The file `name` names, following up to 8 links; an error naming the archive when absent.
    [[nodiscard]] Result<LocalFile> find(const std::string& name) const;
    [[nodiscard]] LocalFileLookup lookup() const;
};

// Reads a tar (plain or compressed with gzip/zstd/xz/bzip2) from `fd` to its end, one pass, no
// seeking: a pipe from `docker save` works. `what` names the source in messages. Refuses member names
// that leave the archive, links pointing out of it, more than kMaxArchiveMembers members and more than
// `max_bytes` of member data altogether.
Result<ExtractedArchive> extract_archive(int fd, const std::string& what, const std::string& dir, uint64_t max_bytes);

// What a local source describes, verified: the same pieces as a registry's ResolvedImage plus the
// layer files the converter reads.
struct LocalImage {
    std::string manifest_digest;  // OCI: the manifest's own; docker-archive: of the manifest made for it
    std::string manifest_json;
    std::string config_digest;
    std::string config_json;
    std::vector<Descriptor> layers;      // bottom layer first
    std::vector<LayerBlob> blobs;        // the same layers as files, with the config's diff_ids
    std::vector<std::string> repo_tags;  // a docker-archive's RepoTags for this image
    std::string platform;                // "os/arch[/variant]" from the config
};

// An OCI layout (index.json -> manifest -> config and layers): the index entry whose
// org.opencontainers.image.ref.name is `tag` ("" = the only entry), and from a multi-platform index
// the manifest for `platform`. Every document and blob is checked against its digest.
Result<LocalImage> read_oci_layout(const LocalFileLookup& files, const std::string& what, const std::string& tag,
                                   const Platform& platform);

// A docker-archive: manifest.json's entry whose RepoTags holds `tag` ("" = the only entry); its
// Config file and Layers files. The config's digest is that of its bytes; each uncompressed layer must
// hash to the config's diff_id (compressed ones are checked while converting). The manifest recorded
// is a Docker schema2 manifest of those blobs, so one archive always imports to one digest.
Result<LocalImage> read_docker_archive(const LocalFileLookup& files, const std::string& what, const std::string& tag);

}  // namespace gantry
