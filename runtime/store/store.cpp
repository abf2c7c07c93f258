// The content-addressed image store: lookup, tag records, the one-producer lock, atomic publication,
// use tracking and garbage collection. Layout and rules: include/gantry/store.hpp, docs/store.md.
#include "gantry/store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

using nlohmann::json;

int64_t now_seconds() { return static_cast<int64_t>(std::time(nullptr)); }

json to_json(const ImageMetadata& m) {
    json layers = json::array();
    for (const auto& l : m.layers) layers.push_back({{"mediaType", l.media_type}, {"digest", l.digest}, {"size", l.size}});
    return {{"manifest_digest", m.manifest_digest}, {"references", m.references}, {"platform", m.platform},
            {"manifest", m.manifest_json},           {"config", m.config_json},     {"layers", layers},
            {"image_bytes", m.image_bytes},          {"compressor", m.compressor},  {"block_size", m.block_size},
            {"pulled_at", m.pulled_at}};
}

Result<ImageMetadata> metadata_from_json(const std::string& text, const std::string& path) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("reading image metadata " + path + ": not valid JSON");
    ImageMetadata m;
    try {
        m.manifest_digest = j.value("manifest_digest", "");
        m.references = j.value("references", std::vector<std::string>{});
        m.platform = j.value("platform", "");
        m.manifest_json = j.value("manifest", "");
        m.config_json = j.value("config", "");
        for (const auto& l : j.value("layers", json::array()))
            m.layers.push_back({l.value("mediaType", ""), l.value("digest", ""), l.value("size", uint64_t{0})});
        m.image_bytes = j.value("image_bytes", uint64_t{0});
        m.compressor = j.value("compressor", "");
        m.block_size = j.value("block_size", uint32_t{0});
        m.pulled_at = j.value("pulled_at", int64_t{0});
    } catch (const json::exception& e) {
        return make_error("reading image metadata " + path + ": " + e.what());
    }
    return m;
}

std::string ref_key(const ImageReference& ref) {
    ImageReference r = ref;
    r.user.clear();  // the credential selector does not change what the tag names
    return digest_hex(Sha256::of(r.str()));
}

int64_t mtime_of(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
}

// Tries flock(LOCK_EX|LOCK_NB) on an existing file; true when nobody holds a lock on it.
bool lockable_exclusively(const std::string& path, UniqueFd* keep = nullptr) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return errno == ENOENT;
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;
    if (keep != nullptr) *keep = std::move(fd);
    return true;
}

}  // namespace

std::string ImageStore::resolve_path(const Config& config, const std::string& cli_value) {
    if (!cli_value.empty()) return cli_value;
    if (const char* env = std::getenv("GANTRY_STORE"); env != nullptr && *env != '\0') return env;
    if (!config.store_path.empty()) return config.store_path;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') return std::string(xdg) + "/gantry";
    const char* home = std::getenv("HOME");
    return std::string(home != nullptr && *home == '/' ? home : "/tmp") + "/.cache/gantry";
}

Result<ImageStore> ImageStore::open(const std::string& root, bool create) {
    if (root.empty() || root.front() != '/') return make_error("image store path '" + root + "' must be absolute");
    for (const char* sub : {"images", "refs", "used", "locks", "staging"}) {
        std::string dir = root + "/" + sub;
        if (create) {
            auto st = make_directories(dir, 0755);
            if (!st) return st.error().wrap("opening image store " + root);
        } else if (::access(dir.c_str(), F_OK) != 0) {
            return system_error("opening image store " + root + " (run `gantry pull` first)");
        }
    }
    return ImageStore(root);
}

std::string ImageStore::squashfs_path(const std::string& digest) const {
    return root_ + "/images/" + digest_hex(digest) + ".sqsh";
}

std::string ImageStore::staging_dir(const std::string& digest) const { return root_ + "/staging/" + digest_hex(digest); }

std::optional<StoredImage> ImageStore::find(const std::string& digest) const {
    if (!validate_digest(digest)) return std::nullopt;
    std::string sqsh = squashfs_path(digest);
    if (::access(sqsh.c_str(), R_OK) != 0) return std::nullopt;
    std::string meta_path = root_ + "/images/" + digest_hex(digest) + ".json";
    auto text = read_file(meta_path);
    if (!text) return std::nullopt;
    auto meta = metadata_from_json(*text, meta_path);
    if (!meta) return std::nullopt;
    StoredImage img{digest, sqsh, std::move(*meta), mtime_of(root_ + "/used/" + digest_hex(digest))};
    if (img.last_used == 0) img.last_used = img.metadata.pulled_at;
    return img;
}

Result<std::vector<StoredImage>> ImageStore::list() const {
    std::vector<StoredImage> out;
    std::string dir = root_ + "/images";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return system_error("listing " + dir);
    Defer close_dir([&] { ::closedir(d); });
    while (dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (!ends_with(name, ".sqsh") || name.size() != 64 + 5) continue;
        if (auto img = find("sha256:" + name.substr(0, 64))) out.push_back(std::move(*img));
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.metadata.pulled_at > b.metadata.pulled_at; });
    return out;
}

Status ImageStore::record_tag(const ImageReference& ref, const std::string& digest) const {
    ImageReference r = ref;
    r.user.clear();
    json j = {{"reference", r.str()}, {"digest", digest}, {"resolved_at", now_seconds()}};
    return write_file_atomic(root_ + "/refs/" + ref_key(ref) + ".json", j.dump() + "\n", 0644);
}

std::optional<TagRecord> ImageStore::lookup_tag(const ImageReference& ref) const {
    auto text = read_file(root_ + "/refs/" + ref_key(ref) + ".json");
    if (!text) return std::nullopt;
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    return TagRecord{j.value("reference", ""), j.value("digest", ""), j.value("resolved_at", int64_t{0})};
}

Result<ProducerLock> ImageStore::lock_producer(const std::string& digest, std::chrono::seconds timeout,
                                               const std::function<void(const std::string&)>& on_wait) const {
    // flock() is released by the kernel when the holder dies (SIGKILL included), which is what lets
    // another node take over a dead producer's work without a human. On Lustre this needs the `flock`
    // mount option (FSx for Lustre clients have it); docs/store.md says so.
    std::string path = root_ + "/locks/" + digest_hex(digest) + ".lock";
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) return system_error("opening producer lock " + path);
    auto start = std::chrono::steady_clock::now();
    auto next_report = start + std::chrono::seconds(2);
    auto delay = std::chrono::milliseconds(50);
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) return system_error("locking " + path);
        auto now = std::chrono::steady_clock::now();
        if (now - start >= timeout) {
            auto holder = read_file(path);
            return make_error("timed out after " + std::to_string(timeout.count()) + " s waiting for " +
                              (holder && !holder->empty() ? trim(*holder) : std::string("another process")) +
                              " to finish producing " + digest);
        }
        if (on_wait && now >= next_report) {
            auto holder = read_file(path);
            on_wait(holder ? trim(*holder) : std::string());
            next_report = now + std::chrono::seconds(5);
        }
        std::this_thread::sleep_for(delay);
        delay = std::min(delay * 2, std::chrono::milliseconds(500));
    }
    // Record who we are for waiters' messages; the lock, not this text, is the truth.
    std::string who = host_and_pid() + "\n";
    if (::ftruncate(fd.get(), 0) == 0) (void)!::pwrite(fd.get(), who.data(), who.size(), 0);
    return ProducerLock(std::move(fd));
}

Status ImageStore::publish(const std::string& digest, const std::string& squashfs_tmp, ImageMetadata metadata) const {
    std::string hex = digest_hex(digest);
    struct stat st {};
    if (::stat(squashfs_tmp.c_str(), &st) != 0) return system_error("publishing " + squashfs_tmp);
    metadata.image_bytes = static_cast<uint64_t>(st.st_size);
    metadata.manifest_digest = digest;
    if (metadata.pulled_at == 0) metadata.pulled_at = now_seconds();
    // Metadata first, squashfs last: the .sqsh's existence is the commit point readers check.
    GANTRY_TRY(write_file_atomic(root_ + "/images/" + hex + ".json", to_json(metadata).dump(1) + "\n", 0644));
    UniqueFd f(::open(squashfs_tmp.c_str(), O_RDONLY | O_CLOEXEC));
    if (!f || ::fsync(f.get()) != 0) return system_error("flushing " + squashfs_tmp);
    if (::chmod(squashfs_tmp.c_str(), 0444) != 0) return system_error("making " + squashfs_tmp + " read-only");
    if (::rename(squashfs_tmp.c_str(), squashfs_path(digest).c_str()) != 0)
        return system_error("publishing " + squashfs_path(digest));
    touch(digest);
    return {};
}

bool ImageStore::trusted(const Config& config) const {
    // The store owner is an unprivileged account the admin trusts to run only our converter; users
    // cannot write a store it (or root) owns without group/other write, so the bytes in images/ were
    // written by our own squashfs writer. An unknown store_owner name adds nobody.
    auto owner = store_owner_uid(config);
    for (const std::string& dir : {root_, root_ + "/images"}) {
        struct stat st {};
        if (::stat(dir.c_str(), &st) != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return false;
        if (st.st_uid != 0 && (!owner || st.st_uid != *owner)) return false;
    }
    return true;
}

void ImageStore::touch(const std::string& digest) const {
    std::string path = root_ + "/used/" + digest_hex(digest);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    if (fd) ::futimens(fd.get(), nullptr);
}

Result<UniqueFd> ImageStore::open_in_use(const std::string& digest) const {
    std::string path = squashfs_path(digest);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return system_error("opening image " + path);
    if (::flock(fd.get(), LOCK_SH) != 0) return system_error("locking image " + path);
    touch(digest);
    return fd;
}

bool ImageStore::in_use(const std::string& digest) const { return !lockable_exclusively(squashfs_path(digest)); }

Status ImageStore::remove(const std::string& digest) const {
    std::string hex = digest_hex(digest);
    std::string sqsh = squashfs_path(digest);
    UniqueFd guard;
    if (!lockable_exclusively(sqsh, &guard)) return make_error("image " + digest + " is in use by a running container");
    // The .sqsh goes first so that no reader finds an image without metadata.
    if (::unlink(sqsh.c_str()) != 0 && errno != ENOENT) return system_error("removing " + sqsh);
    ::unlink((root_ + "/images/" + hex + ".json").c_str());
    ::unlink((root_ + "/used/" + hex).c_str());
    std::string refs = root_ + "/refs";
    if (DIR* d = ::opendir(refs.c_str())) {
        Defer close_dir([&] { ::closedir(d); });
        while (dirent* e = ::readdir(d)) {
            std::string p = refs + "/" + e->d_name;
            auto text = read_file(p);
            if (!text) continue;
            json j = json::parse(*text, nullptr, false);
            if (!j.is_discarded() && j.is_object() && j.value("digest", "") == digest) ::unlink(p.c_str());
        }
    }
    return {};
}

Result<ImageStore::GcResult> ImageStore::gc(uint64_t max_bytes, std::chrono::seconds unused_for) const {
    auto images = list();
    if (!images) return images.error();
    std::sort(images->begin(), images->end(), [](const auto& a, const auto& b) { return a.last_used < b.last_used; });
    GcResult r;
    for (const auto& img : *images) r.bytes_left += img.metadata.image_bytes;
    int64_t cutoff = unused_for.count() > 0 ? now_seconds() - unused_for.count() : INT64_MIN;
    for (const auto& img : *images) {
        bool too_big = max_bytes > 0 && r.bytes_left > max_bytes;
        bool too_old = unused_for.count() > 0 && img.last_used < cutoff;
        if (!too_big && !too_old) continue;
        auto st = remove(img.digest);
        if (!st) {
            r.kept_in_use.push_back(img.digest);
            continue;
        }
        r.removed.push_back(img.digest);
        r.bytes_freed += img.metadata.image_bytes;
        r.bytes_left -= img.metadata.image_bytes;
    }
    // Staging areas whose producer lock nobody holds are leftovers of dead producers that no one
    // resumed; a later pull would reuse their blobs, but gc reclaims the space.
    std::string staging = root_ + "/staging";
    if (DIR* d = ::opendir(staging.c_str())) {
        Defer close_dir([&] { ::closedir(d); });
        while (dirent* e = ::readdir(d)) {
            std::string name = e->d_name;
            if (name == "." || name == "..") continue;
            UniqueFd guard;
            if (!lockable_exclusively(root_ + "/locks/" + name + ".lock", &guard)) continue;
            r.bytes_freed += tree_size(staging + "/" + name);
            (void)remove_tree(staging + "/" + name);
        }
    }
    return r;
}

}  // namespace gantry
