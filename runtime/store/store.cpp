// The content-addressed image store: lookup, tag records, the one-producer lock, atomic publication,
// use tracking and garbage collection. Layout and rules: include/gantry/store.hpp, docs/store.md.
//
// Other users may write a shared store (a legacy 1777 one), so nothing here trusts a path: the root
// and its subdirectories are opened once (subdirectories with O_NOFOLLOW), and every file inside is
// opened, created, renamed and removed relative to those descriptors, never through a symlink, and
// read with a size cap (docs/store.md, "Trust model").
#include "gantry/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"

namespace gantry {

struct ImageStore::Dirs {
    Directory root, images, refs, used, locks, staging;
    std::optional<uid_t> store_owner;
    std::optional<uid_t> acting_for;
    bool private_images = false;
    // The root's path as the kernel resolved it, when a symbolic link was followed on the way there
    // (empty otherwise): removals refuse such a store (check_may_remove).
    std::string linked_to;
};

namespace {

using nlohmann::json;

constexpr const char* kSubdirectories[] = {"images", "refs", "used", "locks", "staging"};

// `path` with "." and ".." and repeated slashes resolved by text alone, without asking the file system.
std::string lexically_normal(const std::string& path) {
    std::string out = std::filesystem::path(path).lexically_normal().string();
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    return out;
}

// Where the kernel found the directory open as `fd`, when that is not `path` itself: some component
// of `path` was a symbolic link. Empty when the path leads there without one.
std::string linked_root(int fd, const std::string& path) {
    char buf[PATH_MAX];
    const std::string proc = "/proc/self/fd/" + std::to_string(fd);
    ssize_t n = ::readlink(proc.c_str(), buf, sizeof buf - 1);
    if (n <= 0) return {};
    std::string real(buf, static_cast<size_t>(n));
    return real == lexically_normal(path) ? std::string() : real;
}

int64_t now_seconds() {
    return static_cast<int64_t>(std::time(nullptr));
}

bool writable_by_others(const struct stat& st) {
    return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
}

json to_json(const ImageMetadata& m) {
    json layers = json::array();
    for (const auto& l : m.layers)
        layers.push_back({{"mediaType", l.media_type}, {"digest", l.digest}, {"size", l.size}});
    return {{"manifest_digest", m.manifest_digest},
            {"references", m.references},
            {"platform", m.platform},
            {"manifest", m.manifest_json},
            {"config", m.config_json},
            {"layers", layers},
            {"image_bytes", m.image_bytes},
            {"compressor", m.compressor},
            {"block_size", m.block_size},
            {"pulled_at", m.pulled_at},
            {"layer_chain", m.layer_chain}};
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
        m.layer_chain = j.value("layer_chain", std::vector<std::string>{});
    } catch (const json::exception& e) {
        return make_error("reading image metadata " + path + ": " + e.what());
    }
    return m;
}

json to_json(const LayerRecord& r) {
    return {{"chain_id", r.chain_id},
            {"diff_id", r.diff_id},
            {"parent", r.parent},
            {"blob_digest", r.blob_digest},
            {"uncompressed_bytes", r.uncompressed_bytes},
            {"layer_bytes", r.layer_bytes},
            {"converted_at", r.converted_at},
            {"group_diff_ids", r.group_diff_ids}};
}

Result<LayerRecord> layer_record_from_json(const std::string& text, const std::string& path) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("reading layer metadata " + path + ": not valid JSON");
    LayerRecord r;
    try {
        r.chain_id = j.value("chain_id", "");
        r.diff_id = j.value("diff_id", "");
        r.parent = j.value("parent", "");
        r.blob_digest = j.value("blob_digest", "");
        r.uncompressed_bytes = j.value("uncompressed_bytes", uint64_t{0});
        r.layer_bytes = j.value("layer_bytes", uint64_t{0});
        r.converted_at = j.value("converted_at", int64_t{0});
        r.group_diff_ids = j.value("group_diff_ids", std::vector<std::string>{});
    } catch (const json::exception& e) {
        return make_error("reading layer metadata " + path + ": " + e.what());
    }
    return r;
}

// A layer's record must say what its name says: its chain ID is the one of its parent and diff_id;
// a group's name is the group key of the chain ID its layers reach from its parent.
Status check_layer_record(const LayerRecord& r) {
    GANTRY_TRY(validate_digest(r.chain_id));
    if (!r.group_diff_ids.empty()) {
        if (!r.parent.empty()) GANTRY_TRY(validate_digest(r.parent));
        std::string top = r.parent;
        for (const auto& d : r.group_diff_ids) {
            GANTRY_TRY(validate_digest(d));
            top = chain_id(top, d);
        }
        if (layer_group_key(top) != r.chain_id)
            return make_error("layer group " + r.chain_id + " is not the group of its " +
                              std::to_string(r.group_diff_ids.size()) + " layers over parent '" + r.parent + "'");
        return {};
    }
    GANTRY_TRY(validate_digest(r.diff_id));
    if (!r.parent.empty()) GANTRY_TRY(validate_digest(r.parent));
    if (chain_id(r.parent, r.diff_id) != r.chain_id)
        return make_error("layer " + r.chain_id + " is not the chain ID of parent '" + r.parent + "' and diff_id " +
                          r.diff_id);
    return {};
}

constexpr std::string_view kLayerPrefix = "layer-";

std::string layer_name(const std::string& chain_id, const char* suffix) {
    return std::string(kLayerPrefix) + digest_hex(chain_id) + suffix;
}

std::string ref_key(const ImageReference& ref) {
    ImageReference r = ref;
    r.user.clear();  // the credential selector does not change what the tag names
    // An imported image's name (local/NAME) is the importing account's own: keyed by its uid too, so
    // that one account's local/app never answers for another's (and a record another account planted
    // under this key is not accepted: lookup_tag's owner rule).
    if (r.names_imported_image())
        return digest_hex(Sha256::of("imported name\n" + std::to_string(::geteuid()) + "\n" + r.str()));
    return digest_hex(Sha256::of(r.str()));
}

// A lock file in locks/, opened (created when missing) without following a symlink or blocking on a
// FIFO. Its holder text is ours to write only when we own it and it has one link: a lock file another
// account planted (a symlink is refused anyway; a hard link to one of our files is not) is opened
// read-only, which flock accepts, and never written.
struct LockFile {
    RegularFile file;
    bool ours = false;
};

Result<LockFile> open_lock_file(const Directory& locks, const std::string& name) {
    auto f = open_regular_at(locks, name, O_RDWR | O_CREAT, 0644);
    if (!f && f.error().errnum == EACCES) {
        // Another account's file (or a directory we cannot create in: then the first error is the one).
        auto read_only = open_regular_at(locks, name, O_RDONLY);
        if (read_only || read_only.error().errnum != ENOENT) f = std::move(read_only);
    }
    if (!f) return f.error();
    bool ours = f->st.st_uid == ::geteuid() && f->st.st_nlink == 1;
    return LockFile{std::move(*f), ours};
}

// The first line of a lock file's text: "host:pid" of its producer (a progress line may follow).
std::string holder_of(const LockFile& lock, const std::string& path) {
    auto text = read_capped(lock.file.fd.get(), kMaxStoreRecordBytes, path);
    if (!text) return {};
    return trim(text->substr(0, text->find('\n')));
}

// Tries flock(LOCK_EX|LOCK_NB) on an existing file; true when nobody holds a lock on it.
bool lockable_exclusively(const Directory& dir, const std::string& name, UniqueFd* keep = nullptr) {
    auto f = open_regular_at(dir, name, O_RDONLY);
    if (!f) return f.error().errnum == ENOENT;
    if (::flock(f->fd.get(), LOCK_EX | LOCK_NB) != 0) return false;
    if (keep != nullptr) *keep = std::move(f->fd);
    return true;
}

// A staging area's name is the hex digest it produces; anything else there is no producer's.
bool is_hex_digest(const std::string& name) {
    return validate_digest("sha256:" + name).ok();
}

}  // namespace

std::string ImageStore::resolve_path(const Config& config, const std::string& cli_value) {
    if (!cli_value.empty()) return cli_value;
    const Environment& env = environment();
    if (!env.gantry_store.empty()) return env.gantry_store.value;
    if (!config.store_path.empty()) return config.store_path;
    if (!env.xdg_cache_home.empty() && env.xdg_cache_home.value[0] == '/') return env.xdg_cache_home.value + "/gantry";
    // No fallback to a shared directory (/tmp/.cache/gantry): another user could create it first and
    // own every image this account pulls into it. open() turns the empty path into an error naming
    // the settings that choose a store.
    if (env.home.empty() || env.home.value[0] != '/') return {};
    return env.home.value + "/.cache/gantry";
}

Result<ImageStore> ImageStore::open(const std::string& root, bool create, const Config& config,
                                    std::optional<uid_t> acting_for) {
    if (root.empty())
        return make_error(
            "no image store: HOME is not set (nor XDG_CACHE_HOME), so there is no ~/.cache/gantry; set "
            "store_path in gantry.conf (docs/admin.md) or GANTRY_STORE, or pass --store DIR");
    if (root.front() != '/') return make_error("image store path '" + root + "' must be absolute");
    const std::string context = "opening image store " + root;
    if (create) {
        auto st = make_directories(root, 0755);
        if (!st) return st.error().wrap(context);
    }
    auto top = Directory::open(root);
    if (!top) {
        if (top.error().errnum == ENOENT) return system_error(context + " (run `gantry pull` first)", ENOENT);
        return top.error().wrap(context);
    }
    // A legacy store whose root is world-writable and sticky (1777) gets 1777 subdirectories too, so
    // that no user owns a directory others must write (the first puller owned them all before).
    struct stat top_st {};
    if (::fstat(top->fd(), &top_st) != 0) return system_error(context);
    bool legacy_shared = (top_st.st_mode & S_IWOTH) != 0 && (top_st.st_mode & S_ISVTX) != 0;
    mode_t sub_mode = legacy_shared ? 01777 : 0755;
    std::vector<Directory> subs;
    for (const char* sub : kSubdirectories) {
        // Created 0700 and then set with fchmod: no window with a wider mode, and the umask plays no part.
        bool made = create && ::mkdirat(top->fd(), sub, 0700) == 0;
        if (create && !made && errno != EEXIST) return system_error(context + ": creating " + top->path_of(sub));
        auto dir = top->open_sub(sub);
        if (!dir) {
            if (dir.error().errnum == ENOENT) return system_error(context + " (run `gantry pull` first)", ENOENT);
            return dir.error().wrap(context);
        }
        if (made && ::fchmod(dir->fd(), sub_mode) != 0)
            return system_error(context + ": setting the mode of " + dir->path());
        subs.push_back(std::move(*dir));
    }
    auto dirs = std::make_shared<Dirs>(Dirs{std::move(*top), std::move(subs[0]), std::move(subs[1]), std::move(subs[2]),
                                            std::move(subs[3]), std::move(subs[4]), std::nullopt, acting_for,
                                            config.private_images, std::string()});
    if (auto owner = store_owner_uid(config)) dirs->store_owner = static_cast<uid_t>(*owner);
    dirs->linked_to = linked_root(dirs->root.fd(), root);
    return ImageStore(root, std::move(dirs));
}

std::string ImageStore::squashfs_path(const std::string& digest) const {
    return root_ + "/images/" + digest_hex(digest) + ".sqsh";
}

std::string ImageStore::staging_dir(const std::string& digest) const {
    return root_ + "/staging/" + digest_hex(digest);
}

const Directory& ImageStore::images_dir() const {
    return dirs_->images;
}

bool ImageStore::accepted_owner(uid_t uid) const {
    return uid == 0 || uid == ::geteuid() || uid == dirs_->store_owner || uid == dirs_->acting_for;
}

bool ImageStore::accepted_file(const struct stat& st) const {
    return S_ISREG(st.st_mode) && accepted_owner(st.st_uid) && !writable_by_others(st);
}

namespace {

// Why an image file is not accepted, for `gantry images` and find's callers.
Error not_accepted(const std::string& path, const struct stat& st) {
    if (!S_ISREG(st.st_mode)) return make_error("ignoring " + path + ": not a regular file");
    if (writable_by_others(st)) return make_error("ignoring " + path + ": writable by group or others");
    return make_error("ignoring " + path + ": owned by uid " + std::to_string(st.st_uid) +
                      ", an account this store does not trust (root, store_owner or you)");
}

}  // namespace

int64_t ImageStore::used_at(const std::string& name, int64_t otherwise) const {
    struct stat st {};
    if (::fstatat(dirs_->used.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        st.st_mtime != 0)
        return static_cast<int64_t>(st.st_mtime);
    return otherwise;
}

Result<StoredImage> ImageStore::load(const std::string& digest) const {
    const Dirs& d = *dirs_;
    const std::string hex = digest_hex(digest);
    // The .sqsh is only looked at here (its bytes are for the mount), so fstatat without following;
    // open_in_use and the launcher check the file they open again. Without one, the image is a
    // layered one if its record says so (else a producer between its .json and its .sqsh: nothing yet).
    struct stat sqsh_st {};
    const bool whole = ::fstatat(d.images.fd(), (hex + ".sqsh").c_str(), &sqsh_st, AT_SYMLINK_NOFOLLOW) == 0;
    if (!whole && errno != ENOENT) return system_error("finding " + d.images.path_of(hex + ".sqsh"));
    if (whole && !accepted_file(sqsh_st)) return not_accepted(d.images.path_of(hex + ".sqsh"), sqsh_st);
    struct stat meta_st {};
    auto text = read_regular_at(d.images, hex + ".json", kMaxImageMetadataBytes, &meta_st);
    if (!text) return text.error().wrap("ignoring " + d.images.path_of(hex + (whole ? ".sqsh" : ".json")));
    if (!accepted_file(meta_st)) return not_accepted(d.images.path_of(hex + ".json"), meta_st);
    auto meta = metadata_from_json(*text, d.images.path_of(hex + ".json"));
    if (!meta) return meta.error();
    if (meta->manifest_digest != digest)
        return make_error("ignoring " + d.images.path_of(hex + ".json") + ": it describes " + meta->manifest_digest);
    if (!whole) {
        if (meta->layer_chain.empty()) return Error{"finding " + d.images.path_of(hex + ".sqsh"), ENOENT, 0};
        // A layered image counts only with every one of its layers in the store, each accepted.
        for (const auto& chain : meta->layer_chain) {
            if (auto st = validate_digest(chain); !st)
                return st.error().wrap("ignoring " + d.images.path_of(hex + ".json"));
            if (auto layer = load_layer(chain); !layer)
                return make_error("ignoring " + d.images.path_of(hex + ".json") + ": its layer " + chain +
                                  " is not usable (" + layer.error().message + ")");
        }
    }
    StoredImage img{digest, whole ? squashfs_path(digest) : std::string(), std::move(*meta), 0};
    img.last_used = used_at(hex, img.metadata.pulled_at);
    return img;
}

std::optional<StoredImage> ImageStore::find(const std::string& digest) const {
    if (!validate_digest(digest)) return std::nullopt;
    auto img = load(digest);
    if (!img) return std::nullopt;
    return std::move(*img);
}

Result<std::vector<StoredImage>> ImageStore::list(std::vector<std::string>* ignored) const {
    auto names = list_directory(dirs_->images);
    if (!names) return names.error().wrap("listing image store " + root_);
    std::vector<StoredImage> out;
    // Whole images by their .sqsh, layered ones by their record alone.
    std::set<std::string> hexes;
    for (const auto& name : *names) {
        for (const char* suffix : {".sqsh", ".json"})
            if (ends_with(name, suffix) && is_hex_digest(name.substr(0, name.size() - 5)))
                hexes.insert(name.substr(0, 64));
    }
    for (const auto& hex : hexes) {
        auto img = load("sha256:" + hex);
        if (img) {
            out.push_back(std::move(*img));
        } else if (img.error().errnum != ENOENT && ignored != nullptr) {
            ignored->push_back(img.error().message);  // ENOENT: removed since the directory was read
        }
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.metadata.pulled_at > b.metadata.pulled_at; });
    return out;
}

Status ImageStore::record_tag(const ImageReference& ref, const std::string& digest) const {
    GANTRY_TRY(check_root_may_modify());
    ImageReference r = ref;
    r.user.clear();
    // Every warm step of every node resolves its tag to the same digest: a record that says so and is
    // recent is left as it is, saving each of them a write, fsync and rename on the shared file system
    // (its time only dates the stored image in an error's hint, with_stored_tag_hint).
    const int64_t now = now_seconds();
    if (auto record = lookup_tag(ref); record && record->digest == digest && record->reference == r.str() &&
                                       record->resolved_at <= now &&
                                       now - record->resolved_at < kTagRecordRefreshSeconds)
        return {};
    json j = {{"reference", r.str()}, {"digest", digest}, {"resolved_at", now}};
    return write_file_atomic_at(dirs_->refs, ref_key(ref) + ".json", j.dump() + "\n", 0644);
}

std::optional<TagRecord> ImageStore::lookup_tag(const ImageReference& ref) const {
    struct stat st {};
    auto text = read_regular_at(dirs_->refs, ref_key(ref) + ".json", kMaxStoreRecordBytes, &st);
    if (!text || !accepted_file(st)) return std::nullopt;
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    return TagRecord{j.value("reference", ""), j.value("digest", ""), j.value("resolved_at", int64_t{0})};
}

Result<ProducerLock> ImageStore::lock_producer(const std::string& digest, std::chrono::seconds timeout,
                                               const std::function<void(const std::string&)>& on_wait) const {
    GANTRY_TRY(check_root_may_modify());
    // flock() is released by the kernel when the holder dies (SIGKILL included), which is what lets
    // another node take over a dead producer's work without a human. On Lustre this needs the `flock`
    // mount option (FSx for Lustre clients have it); docs/store.md says so.
    const std::string name = digest_hex(digest) + ".lock";
    const std::string path = dirs_->locks.path_of(name);
    auto lock = open_lock_file(dirs_->locks, name);
    if (!lock) return lock.error().wrap("opening producer lock " + path);
    const int fd = lock->file.fd.get();
    auto start = std::chrono::steady_clock::now();
    auto next_report = start + std::chrono::seconds(2);
    auto delay = std::chrono::milliseconds(50);
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) return system_error("locking " + path);
        auto now = std::chrono::steady_clock::now();
        if (now - start >= timeout) {
            std::string holder = holder_of(*lock, path);
            return make_error("timed out after " + std::to_string(timeout.count()) + " s waiting for " +
                              (holder.empty() ? std::string("another process") : holder) + " to finish producing " +
                              digest);
        }
        if (on_wait && now >= next_report) {
            on_wait(holder_of(*lock, path));
            next_report = now + std::chrono::seconds(5);
        }
        std::this_thread::sleep_for(delay);
        delay = std::min(delay * 2, std::chrono::milliseconds(500));
    }
    // Record who we are for waiters' messages; the lock, not this text, is the truth.
    std::string who = host_and_pid();
    if (lock->ours) {
        std::string line = who + "\n";
        if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, line.data(), line.size(), 0);
    }
    return ProducerLock(std::move(lock->file.fd), lock->ours, who);
}

void ProducerLock::record_progress(uint64_t bytes_done, uint64_t bytes_total, uint64_t layers_done,
                                   uint64_t layers_total) const {
    if (!ours_ || !fd_) return;
    std::string text = holder_ + "\nprogress " + std::to_string(bytes_done) + " " + std::to_string(bytes_total) + " " +
                       std::to_string(layers_done) + " " + std::to_string(layers_total) + " " +
                       std::to_string(static_cast<long long>(std::time(nullptr))) + "\n";
    // One pwrite of a few dozen bytes: a reader sees the old text or the new one (padded by ftruncate
    // below only when it shrank), never a mix that parses.
    if (::pwrite(fd_.get(), text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()))
        (void)!::ftruncate(fd_.get(), static_cast<off_t>(text.size()));
}

std::optional<ProducerProgress> ImageStore::producer_progress(const std::string& digest) const {
    if (!validate_digest(digest)) return std::nullopt;
    const std::string name = digest_hex(digest) + ".lock";
    // Read-only and never locked by us beyond a non-blocking probe: a reader must not delay the producer.
    auto f = open_regular_at(dirs_->locks, name, O_RDONLY);
    if (!f) return std::nullopt;
    if (::flock(f->fd.get(), LOCK_SH | LOCK_NB) == 0) {
        ::flock(f->fd.get(), LOCK_UN);
        return std::nullopt;  // nobody holds it: no producer at work
    }
    auto text = read_capped(f->fd.get(), kMaxStoreRecordBytes, dirs_->locks.path_of(name));
    if (!text) return std::nullopt;
    auto nl = text->find('\n');
    if (nl == std::string::npos) return std::nullopt;
    ProducerProgress p;
    p.holder = trim(text->substr(0, nl));
    std::istringstream in(text->substr(nl + 1));
    std::string word;
    if (!(in >> word) || word != "progress") return std::nullopt;
    long long at = 0;
    if (!(in >> p.bytes_done >> p.bytes_total >> p.layers_done >> p.layers_total >> at)) return std::nullopt;
    p.updated_at = at;
    return p;
}

Result<std::string> ImageStore::prepare_staging(const std::string& digest) const {
    GANTRY_TRY(check_root_may_modify());
    const Directory& staging = dirs_->staging;
    const std::string name = digest_hex(digest);
    for (int attempt = 0; attempt < 2; ++attempt) {
        if (::mkdirat(staging.fd(), name.c_str(), 0700) != 0 && errno != EEXIST)
            return system_error("creating " + staging.path_of(name));
        auto dir = staging.open_sub(name);
        struct stat st {};
        if (dir && ::fstat(dir->fd(), &st) == 0 && st.st_uid == ::geteuid()) return dir->path();
        // A symlink, a file, or another account's directory: never written through; removed (which
        // works in a directory of ours, or for an entry of ours), then made afresh.
        auto removed = remove_tree_at(staging, name);
        if (!removed)
            return make_error("preparing " + staging.path_of(name) +
                              ": it is not a directory of this account and cannot be removed (" +
                              removed.error().message + "); ask its owner or the admin to remove it (docs/store.md)");
    }
    return make_error("preparing " + staging.path_of(name) + ": it keeps being replaced");
}

void ImageStore::remove_staging(const std::string& digest) const {
    (void)remove_tree_at(dirs_->staging, digest_hex(digest));
}

Status ImageStore::remove_untrusted(std::initializer_list<std::string> names, const char* what) const {
    const Directory& images = dirs_->images;
    for (const std::string& name : names) {
        struct stat st {};
        if (::fstatat(images.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || accepted_file(st)) continue;
        if (::unlinkat(images.fd(), name.c_str(), 0) != 0)
            return make_error("publishing " + images.path_of(name) + ": the store holds this " + what + " from uid " +
                              std::to_string(st.st_uid) +
                              ", which it does not trust, and this account cannot replace it; ask the file's owner "
                              "or the admin to remove it, or use a per-user store (docs/store.md)");
    }
    return {};
}

Status ImageStore::publish_layered(const std::string& digest, ImageMetadata metadata) const {
    GANTRY_TRY(check_root_may_modify());
    const Directory& images = dirs_->images;
    const std::string hex = digest_hex(digest);
    if (metadata.layer_chain.empty()) return make_error("publishing layered image " + digest + ": it names no layers");
    uint64_t bytes = 0;
    for (const auto& chain : metadata.layer_chain) {
        auto layer = find_layer(chain);
        if (!layer)
            return make_error("publishing layered image " + digest + ": its layer " + chain + " is not in the store");
        bytes += layer->record.layer_bytes;
    }
    // As publish(): files of this digest from an account the store does not trust go first.
    GANTRY_TRY(remove_untrusted({hex + ".json", hex + ".sqsh"}, "digest"));
    metadata.manifest_digest = digest;
    metadata.image_bytes = bytes;  // shown by `gantry images`; gc counts the layers themselves
    if (metadata.pulled_at == 0) metadata.pulled_at = now_seconds();
    GANTRY_TRY(write_file_atomic_at(images, hex + ".json", to_json(metadata).dump(1) + "\n",
                                    dirs_->private_images ? 0600 : 0644));
    touch(digest);
    return {};
}

Status ImageStore::publish(const std::string& digest, const std::string& squashfs_tmp, ImageMetadata metadata) const {
    GANTRY_TRY(check_root_may_modify());
    const Directory& images = dirs_->images;
    const std::string hex = digest_hex(digest);
    // An image of this digest from an account the store does not trust is not ours to keep: removed
    // when we may (our own directory), else a clear error instead of a failing rename.
    GANTRY_TRY(remove_untrusted({hex + ".json", hex + ".sqsh"}, "digest"));
    UniqueFd f(::open(squashfs_tmp.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!f || ::fstat(f.get(), &st) != 0) return system_error("publishing " + squashfs_tmp);
    if (!S_ISREG(st.st_mode)) return make_error("publishing " + squashfs_tmp + ": not a regular file");
    metadata.image_bytes = static_cast<uint64_t>(st.st_size);
    metadata.manifest_digest = digest;
    if (metadata.pulled_at == 0) metadata.pulled_at = now_seconds();
    // private_images: owner-only files, so users cannot copy images out of a store-owner store; only
    // root (the plugin's kernel backend) and the owner can read them then.
    const mode_t sqsh_mode = dirs_->private_images ? 0400 : 0444;
    const mode_t meta_mode = dirs_->private_images ? 0600 : 0644;
    // Metadata first, squashfs last: the .sqsh's existence is the commit point readers check.
    GANTRY_TRY(write_file_atomic_at(images, hex + ".json", to_json(metadata).dump(1) + "\n", meta_mode));
    if (::fsync(f.get()) != 0) return system_error("flushing " + squashfs_tmp);
    if (::fchmod(f.get(), sqsh_mode) != 0) return system_error("making " + squashfs_tmp + " read-only");
    if (::renameat(AT_FDCWD, squashfs_tmp.c_str(), images.fd(), (hex + ".sqsh").c_str()) != 0)
        return system_error("publishing " + squashfs_path(digest));
    touch(digest);
    return {};
}

std::string ImageStore::layer_squashfs_path(const std::string& chain_id) const {
    return root_ + "/images/" + layer_name(chain_id, ".sqsh");
}

Result<StoredLayer> ImageStore::load_layer(const std::string& chain_id) const {
    const Dirs& d = *dirs_;
    const std::string sqsh = layer_name(chain_id, ".sqsh");
    const std::string meta = layer_name(chain_id, ".json");
    struct stat sqsh_st {};
    if (::fstatat(d.images.fd(), sqsh.c_str(), &sqsh_st, AT_SYMLINK_NOFOLLOW) != 0)
        return system_error("finding " + d.images.path_of(sqsh));
    if (!accepted_file(sqsh_st)) return not_accepted(d.images.path_of(sqsh), sqsh_st);
    struct stat meta_st {};
    auto text = read_regular_at(d.images, meta, kMaxStoreRecordBytes, &meta_st);
    if (!text) return text.error().wrap("ignoring " + d.images.path_of(sqsh));
    if (!accepted_file(meta_st)) return not_accepted(d.images.path_of(meta), meta_st);
    auto record = layer_record_from_json(*text, d.images.path_of(meta));
    if (!record) return record.error();
    if (record->chain_id != chain_id)
        return make_error("ignoring " + d.images.path_of(meta) + ": it describes " + record->chain_id);
    if (auto st = check_layer_record(*record); !st) return st.error().wrap("ignoring " + d.images.path_of(meta));
    StoredLayer layer{std::move(*record), layer_squashfs_path(chain_id), 0};
    layer.last_used = used_at(layer_name(chain_id, ""), layer.record.converted_at);
    return layer;
}

std::optional<StoredLayer> ImageStore::find_layer(const std::string& chain_id) const {
    if (!validate_digest(chain_id)) return std::nullopt;
    auto layer = load_layer(chain_id);
    if (!layer) return std::nullopt;
    return std::move(*layer);
}

Result<std::vector<StoredLayer>> ImageStore::list_layers(std::vector<std::string>* ignored) const {
    auto names = list_directory(dirs_->images);
    if (!names) return names.error().wrap("listing image store " + root_);
    std::vector<StoredLayer> out;
    for (const auto& name : *names) {
        if (!starts_with(name, kLayerPrefix) || !ends_with(name, ".sqsh")) continue;
        std::string hex = name.substr(kLayerPrefix.size(), name.size() - kLayerPrefix.size() - 5);
        if (!is_hex_digest(hex)) continue;
        auto layer = load_layer("sha256:" + hex);
        if (layer) {
            out.push_back(std::move(*layer));
        } else if (layer.error().errnum != ENOENT && ignored != nullptr) {
            ignored->push_back(layer.error().message);
        }
    }
    return out;
}

Result<UniqueFd> ImageStore::publish_layer(const std::string& squashfs_tmp, LayerRecord record) const {
    GANTRY_TRY(check_root_may_modify());
    if (auto st = check_layer_record(record); !st) return st.error().wrap("publishing a layer");
    const Directory& images = dirs_->images;
    const std::string sqsh = layer_name(record.chain_id, ".sqsh");
    const std::string meta = layer_name(record.chain_id, ".json");
    // As publish(): a layer of this chain ID from an account the store does not trust is removed when
    // we may, else a clear error instead of a failing rename.
    GANTRY_TRY(remove_untrusted({meta, sqsh}, "layer"));
    UniqueFd f(::open(squashfs_tmp.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!f || ::fstat(f.get(), &st) != 0) return system_error("publishing " + squashfs_tmp);
    if (!S_ISREG(st.st_mode)) return make_error("publishing " + squashfs_tmp + ": not a regular file");
    record.layer_bytes = static_cast<uint64_t>(st.st_size);
    if (record.converted_at == 0) record.converted_at = now_seconds();
    // Locked before it has a name in the store: gc (LOCK_EX, non-blocking) can never take a layer
    // whose image record its producer has not written yet.
    if (::flock(f.get(), LOCK_SH) != 0) return system_error("locking " + squashfs_tmp);
    const mode_t sqsh_mode = dirs_->private_images ? 0400 : 0444;
    const mode_t meta_mode = dirs_->private_images ? 0600 : 0644;
    // Metadata first, squashfs last: the .sqsh's existence is the commit point, as for images.
    GANTRY_TRY(write_file_atomic_at(images, meta, to_json(record).dump(1) + "\n", meta_mode));
    if (::fsync(f.get()) != 0) return system_error("flushing " + squashfs_tmp);
    if (::fchmod(f.get(), sqsh_mode) != 0) return system_error("making " + squashfs_tmp + " read-only");
    if (::renameat(AT_FDCWD, squashfs_tmp.c_str(), images.fd(), sqsh.c_str()) != 0)
        return system_error("publishing " + layer_squashfs_path(record.chain_id));
    touch_name(layer_name(record.chain_id, ""));
    return f;
}

Result<UniqueFd> ImageStore::open_layer_in_use(const std::string& chain_id) const {
    if (auto st = validate_digest(chain_id); !st) return st.error().wrap("opening layer");
    return open_shared(layer_name(chain_id, ".sqsh"), layer_name(chain_id, ""), "layer");
}

Result<UniqueFd> ImageStore::open_shared(const std::string& name, const std::string& used_name,
                                         const char* what) const {
    auto f = open_regular_at(dirs_->images, name, O_RDONLY);
    if (!f) return f.error().wrap(std::string("opening ") + what);
    if (!accepted_file(f->st))
        return not_accepted(dirs_->images.path_of(name), f->st).wrap(std::string("opening ") + what);
    if (::flock(f->fd.get(), LOCK_SH) != 0)
        return system_error(std::string("locking ") + what + " " + dirs_->images.path_of(name));
    touch_name(used_name);
    return std::move(f->fd);
}

Status ImageStore::remove_layer(const std::string& chain_id) const {
    GANTRY_TRY(check_may_remove());
    GANTRY_TRY(check_root_may_modify());
    GANTRY_TRY(validate_digest(chain_id));
    const Dirs& d = *dirs_;
    const std::string sqsh = layer_name(chain_id, ".sqsh");
    UniqueFd guard;
    if (!lockable_exclusively(d.images, sqsh, &guard)) return Error{"layer " + chain_id + " is in use", EBUSY, 0};
    if (::unlinkat(d.images.fd(), sqsh.c_str(), 0) != 0 && errno != ENOENT)
        return system_error("removing " + d.images.path_of(sqsh));
    ::unlinkat(d.images.fd(), layer_name(chain_id, ".json").c_str(), 0);
    ::unlinkat(d.used.fd(), layer_name(chain_id, "").c_str(), 0);
    return {};
}

std::optional<std::string> ImageStore::read_failure_note(const std::string& digest, int64_t since) const {
    struct stat st {};
    auto text = read_regular_at(dirs_->locks, digest_hex(digest) + ".failed", kMaxStoreRecordBytes, &st);
    if (!text || !accepted_file(st) || static_cast<int64_t>(st.st_mtime) < since) return std::nullopt;
    return std::move(*text);
}

void ImageStore::write_failure_note(const std::string& digest, const std::string& text) const {
    if (!check_root_may_modify()) return;
    (void)write_file_atomic_at(dirs_->locks, digest_hex(digest) + ".failed", text, 0644);
}

void ImageStore::clear_failure_note(const std::string& digest) const {
    if (!check_root_may_modify()) return;
    ::unlinkat(dirs_->locks.fd(), (digest_hex(digest) + ".failed").c_str(), 0);
}

Status ImageStore::check_root_may_modify() const {
    if (::geteuid() != 0) return {};
    const Dirs& d = *dirs_;
    for (const Directory* dir : {&d.root, &d.images, &d.refs, &d.used, &d.locks, &d.staging}) {
        struct stat st {};
        if (::fstat(dir->fd(), &st) != 0) return system_error("checking image store " + root_);
        std::string why;
        if ((st.st_mode & S_IWOTH) != 0)
            why = "is writable by all users";
        else if ((st.st_mode & S_IWGRP) != 0)
            why = "is writable by its group";
        else if (st.st_uid != 0 && st.st_uid != d.store_owner)
            why = "is owned by uid " + std::to_string(st.st_uid) + ", neither root nor store_owner";
        if (!why.empty())
            return make_error("modifying image store " + root_ + " as root: " + dir->path() + " " + why +
                              ", so users could plant files that root would act on; run this as the store's owner, "
                              "or make the store owned by root or store_owner and writable by nobody else "
                              "(docs/store.md, \"Trust model\")");
    }
    return {};
}

Status ImageStore::check_may_remove() const {
    // A store root reached through a symbolic link may be another account's store: a user who makes
    // ~/.cache/gantry a link to root's store would have root's `gc --store ~user/.cache/gantry` (which
    // runs as the link's apparent owner, or as root) remove root's images. Removals happen only in a
    // store named by its own path, whoever runs them.
    if (dirs_->linked_to.empty()) return {};
    return make_error("removing from image store " + root_ + ": it is reached through a symbolic link (to " +
                      dirs_->linked_to + "), which removals never follow; name the store by its own path (--store " +
                      dirs_->linked_to + ") if that is the store you mean");
}

std::optional<uid_t> ImageStore::sole_owner() const {
    const Dirs& d = *dirs_;
    std::optional<uid_t> owner;
    for (const Directory* dir : {&d.root, &d.images, &d.refs, &d.used, &d.locks, &d.staging}) {
        struct stat st {};
        if (::fstat(dir->fd(), &st) != 0 || st.st_uid == 0 || (owner && *owner != st.st_uid)) return std::nullopt;
        owner = st.st_uid;
    }
    return owner;
}

bool ImageStore::trusted(const Config& config) const {
    // The store owner is an unprivileged account the admin trusts to run only our converter; users
    // cannot write a store it (or root) owns without group/other write, so the bytes in images/ were
    // written by our own squashfs writer. An unknown store_owner name adds nobody.
    auto owner = store_owner_uid(config);
    for (const Directory* dir : {&dirs_->root, &dirs_->images}) {
        struct stat st {};
        if (::fstat(dir->fd(), &st) != 0 || writable_by_others(st)) return false;
        if (st.st_uid != 0 && (!owner || st.st_uid != *owner)) return false;
    }
    return true;
}

void ImageStore::touch(const std::string& digest) const {
    touch_name(digest_hex(digest));
}

void ImageStore::touch_name(const std::string& name) const {
    // Best effort; root leaves a store that users can write alone (check_root_may_modify).
    if (!check_root_may_modify()) return;
    auto f = open_regular_at(dirs_->used, name, O_WRONLY | O_CREAT, 0644);
    if (f) ::futimens(f->fd.get(), nullptr);
}

Result<UniqueFd> ImageStore::open_in_use(const std::string& digest) const {
    const std::string hex = digest_hex(digest);
    auto f = open_shared(hex + ".sqsh", hex, "image");
    // A layered image: its users hold its record, which keeps gc from removing it and so from
    // removing any of its layers (gc frees a layer only with the last image naming it).
    if (!f && f.error().errnum == ENOENT)
        if (auto img = find(digest); img && img->layered()) return open_shared(hex + ".json", hex, "image");
    return f;
}

bool ImageStore::in_use(const std::string& digest) const {
    // A layered image's users hold its record (and its layers), a whole image's its squashfs.
    const std::string hex = digest_hex(digest);
    return !lockable_exclusively(dirs_->images, hex + ".sqsh") || !lockable_exclusively(dirs_->images, hex + ".json");
}

Status ImageStore::remove(const std::string& digest) const {
    GANTRY_TRY(check_may_remove());
    GANTRY_TRY(check_root_may_modify());
    const Dirs& d = *dirs_;
    const std::string hex = digest_hex(digest);
    const std::string sqsh = hex + ".sqsh";
    UniqueFd guard, record_guard;
    if (!lockable_exclusively(d.images, sqsh, &guard) || !lockable_exclusively(d.images, hex + ".json", &record_guard))
        return Error{"image " + digest + " is in use by a running container", EBUSY, 0};
    // The .sqsh goes first so that no reader finds an image without metadata.
    if (::unlinkat(d.images.fd(), sqsh.c_str(), 0) != 0 && errno != ENOENT)
        return system_error("removing " + d.images.path_of(sqsh));
    ::unlinkat(d.images.fd(), (hex + ".json").c_str(), 0);
    ::unlinkat(d.used.fd(), hex.c_str(), 0);
    if (auto names = list_directory(d.refs)) {
        for (const auto& name : *names) {
            struct stat st {};
            auto text = read_regular_at(d.refs, name, kMaxStoreRecordBytes, &st);
            if (!text || !accepted_file(st)) continue;
            json j = json::parse(*text, nullptr, false);
            if (!j.is_discarded() && j.is_object() && j.value("digest", "") == digest)
                ::unlinkat(d.refs.fd(), name.c_str(), 0);
        }
    }
    return {};
}

Result<ImageStore::GcResult> ImageStore::gc(uint64_t max_bytes, std::chrono::seconds unused_for) const {
    GANTRY_TRY(check_may_remove());
    GANTRY_TRY(check_root_may_modify());
    auto images = list();
    if (!images) return images.error();
    auto layers = list_layers();
    if (!layers) return layers.error();
    std::sort(images->begin(), images->end(), [](const auto& a, const auto& b) { return a.last_used < b.last_used; });
    GcResult r;
    // How many images name each stored layer; a layer is counted (and freed) once.
    std::map<std::string, const StoredLayer*> stored;
    std::map<std::string, size_t> references;
    for (const auto& layer : *layers) {
        stored[layer.record.chain_id] = &layer;
        r.bytes_left += layer.record.layer_bytes;
    }
    for (const auto& img : *images) {
        r.bytes_left += img.layered() ? 0 : img.metadata.image_bytes;
        for (const auto& chain : img.metadata.layer_chain) ++references[chain];
    }
    auto drop_layer = [&](const StoredLayer& layer) {
        auto st = remove_layer(layer.record.chain_id);
        if (!st) {
            if (st.error().errnum == EBUSY)
                r.kept_in_use.push_back(layer.record.chain_id);
            else
                r.failed.push_back(st.error());
            return;
        }
        r.removed_layers.push_back(layer.record.chain_id);
        r.bytes_freed += layer.record.layer_bytes;
        r.bytes_left -= layer.record.layer_bytes;
    };
    int64_t cutoff = unused_for.count() > 0 ? now_seconds() - unused_for.count() : INT64_MIN;
    auto collectable = [&](int64_t last_used) {
        bool too_big = max_bytes > 0 && r.bytes_left > max_bytes;
        bool too_old = unused_for.count() > 0 && last_used < cutoff;
        return too_big || too_old;
    };
    for (const auto& img : *images) {
        if (!collectable(img.last_used)) continue;
        auto st = remove(img.digest);
        if (!st) {
            if (st.error().errnum == EBUSY)
                r.kept_in_use.push_back(img.digest);
            else
                r.failed.push_back(st.error());
            continue;
        }
        r.removed.push_back(img.digest);
        if (!img.layered()) {
            r.bytes_freed += img.metadata.image_bytes;
            r.bytes_left -= img.metadata.image_bytes;
        }
        // Its layers that no remaining image names go with it (unless a container holds them).
        for (const auto& chain : img.metadata.layer_chain) {
            auto n = references.find(chain);
            if (n == references.end() || n->second == 0 || --n->second > 0) continue;
            if (auto it = stored.find(chain); it != stored.end()) drop_layer(*it->second);
        }
    }
    // Layers no image names (a producer that died between its layers and its image record left
    // them; a later pull of that image would reuse them): collected by the same targets as images.
    std::vector<const StoredLayer*> orphans;
    for (const auto& layer : *layers)
        if (references.find(layer.record.chain_id) == references.end()) orphans.push_back(&layer);
    std::sort(orphans.begin(), orphans.end(), [](const auto* a, const auto* b) { return a->last_used < b->last_used; });
    for (const auto* layer : orphans)
        if (collectable(layer->last_used)) drop_layer(*layer);
    // Staging areas whose producer lock nobody holds are leftovers of dead producers that no one
    // resumed; a later pull would reuse their blobs, but gc reclaims the space. gc holds the producer
    // lock itself (creating the lock file if it is missing) while it removes, so no producer starts
    // in the area meanwhile; anything there that is not a producer's area is removed as well.
    const Directory& staging = dirs_->staging;
    auto names = list_directory(staging);
    if (!names) {
        r.failed.push_back(names.error());
        return r;
    }
    for (const auto& name : *names) {
        UniqueFd guard;
        if (is_hex_digest(name)) {
            auto lock = open_lock_file(dirs_->locks, name + ".lock");
            if (!lock) {
                r.failed.push_back(lock.error().wrap("removing " + staging.path_of(name)));
                continue;
            }
            if (::flock(lock->file.fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // a producer is at work
            guard = std::move(lock->file.fd);
        }
        uint64_t bytes = tree_size_at(staging, name);
        if (auto st = remove_tree_at(staging, name); !st)
            r.failed.push_back(st.error());
        else
            r.bytes_freed += bytes;
    }
    return r;
}

std::string layer_group_key(const std::string& top_chain_id) {
    return Sha256::of("gantry layer group " + top_chain_id);
}

std::vector<LowerRange> plan_lowers(size_t layers) {
    std::vector<LowerRange> out;
    if (layers == 0 || layers > kMaxLayeredLayers) return out;
    if (layers <= kMaxLowers) {
        for (size_t i = 0; i < layers; ++i) out.push_back({i, i + 1, false});
        return out;
    }
    const size_t full = layers / kLayerGroupSize, rest = layers % kLayerGroupSize;
    for (size_t k = 0; k < full; ++k) out.push_back({k * kLayerGroupSize, (k + 1) * kLayerGroupSize, true});
    if (full + rest <= kMaxLowers) {
        for (size_t i = full * kLayerGroupSize; i < layers; ++i) out.push_back({i, i + 1, false});
    } else {
        out.push_back({full * kLayerGroupSize, layers, true});
    }
    return out;
}

}  // namespace gantry
