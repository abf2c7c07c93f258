// Layer blobs from a registry (tar, gzip or zstd; the first byte picks the media type, the rest is
// the blob) through the real converter, convert_layers, into a scratch squashfs, which is then read
// back with libsquashfs and checked:
//   - the output is a squashfs libsquashfs can read, tree and file data;
//   - every name is one path component (no "/", ".", "..", empty or over 255 bytes): nothing can
//     land outside the root;
//   - no directory lists a name twice (an entry is never both a file and a directory);
//   - no whiteout (.wh.*) survives into the image;
//   - with the blob as the upper layer over a fixed lower one (bit 2 of the first byte), a whiteout or
//     an opaque marker in the upper tar (listed here with libarchive on its own) hides the lower
//     entries it names unless the upper layer puts them back;
//   - a single layer also goes through convert_layer_for_overlay (overlay form, issue #19): the same
//     checks, every path of the merged image is there too, and what it adds are only whiteouts
//     (character devices) and the directories on the way to them.
#include <archive.h>
#include <archive_entry.h>
#include <sqfs/compressor.h>
#include <sqfs/data_reader.h>
#include <sqfs/dir_reader.h>
#include <sqfs/id_table.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/super.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fuzz.hpp"
#include "gantry/squashfs.hpp"

namespace {

const std::string& scratch() {
    static const std::string dir = [] {
        char tmpl[] = "/tmp/gantry-fuzz-layer-XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) std::abort();
        return std::string(tmpl);
    }();
    return dir;
}

void write_file(const std::string& path, const void* data, size_t size) {
    std::ofstream out(path, std::ios::trunc | std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    FUZZ_CHECK(out.good());
}

// The fixed lower layer: a few files and directories for the upper layer's whiteouts to hide.
const std::vector<std::string> kLowerFiles = {"a", "dir/b", "dir/c", "dir/sub/d", "etc/passwd"};
const std::vector<std::string> kLowerDirs = {"dir", "dir/sub", "etc"};

std::string lower_layer() {
    const std::string path = scratch() + "/lower.tar";
    archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    FUZZ_CHECK(archive_write_open_filename(a, path.c_str()) == ARCHIVE_OK);
    auto add = [&](const std::string& name, bool dir) {
        archive_entry* e = archive_entry_new();
        archive_entry_set_pathname(e, name.c_str());
        archive_entry_set_filetype(e, dir ? AE_IFDIR : AE_IFREG);
        archive_entry_set_perm(e, dir ? 0755 : 0644);
        archive_entry_set_size(e, dir ? 0 : 1);
        archive_write_header(a, e);
        if (!dir) archive_write_data(a, "x", 1);
        archive_entry_free(e);
    };
    for (const auto& d : kLowerDirs) add(d, true);
    for (const auto& f : kLowerFiles) add(f, false);
    archive_write_close(a);
    archive_write_free(a);
    return path;
}

// "./a//b/" -> "a/b"; as the converter normalizes names for the merge.
std::string normalize(std::string p) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i <= p.size()) {
        size_t j = p.find('/', i);
        if (j == std::string::npos) j = p.size();
        std::string c = p.substr(i, j - i);
        if (!c.empty() && c != ".") parts.push_back(c);
        i = j + 1;
    }
    std::string out;
    for (const auto& c : parts) out += (out.empty() ? "" : "/") + c;
    return out;
}

// The upper tar's entry names, normalized, read with libarchive alone; nullopt when it cannot be
// read to the end (then the conversion must have failed, or we do not judge it).
std::optional<std::vector<std::string>> upper_names(const uint8_t* data, size_t size) {
    archive* a = archive_read_new();
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_format_tar(a);
    std::vector<std::string> names;
    bool ok = archive_read_open_memory(a, data, size) == ARCHIVE_OK;
    archive_entry* e = nullptr;
    int r = ARCHIVE_OK;
    while (ok && (r = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
        const char* n = archive_entry_pathname(e);
        names.push_back(normalize(n ? n : ""));
    }
    ok = ok && r == ARCHIVE_EOF;
    archive_read_free(a);
    if (!ok) return std::nullopt;
    return names;
}

template <typename T>
struct Destroy {
    void operator()(T* p) const { sqfs_destroy(p); }
};

// Walks the image: every name checked, every file's data read; fills `paths` ("dir/b") and, when
// given, `whiteouts_or_dirs` with the paths that are character devices or directories.
void check_image(const std::string& image, std::set<std::string>& paths,
                 std::set<std::string>* whiteouts_or_dirs = nullptr) {
    std::unique_ptr<sqfs_file_t, Destroy<sqfs_file_t>> file(sqfs_open_file(image.c_str(), SQFS_FILE_OPEN_READ_ONLY));
    FUZZ_CHECK(file != nullptr);
    sqfs_super_t super{};
    FUZZ_CHECK(sqfs_super_read(&super, file.get()) == 0);
    sqfs_compressor_config_t cfg{};
    FUZZ_CHECK(sqfs_compressor_config_init(&cfg, static_cast<SQFS_COMPRESSOR>(super.compression_id), super.block_size,
                                           SQFS_COMP_FLAG_UNCOMPRESS) == 0);
    sqfs_compressor_t* raw_cmp = nullptr;
    FUZZ_CHECK(sqfs_compressor_create(&cfg, &raw_cmp) == 0);
    std::unique_ptr<sqfs_compressor_t, Destroy<sqfs_compressor_t>> cmp(raw_cmp);
    std::unique_ptr<sqfs_id_table_t, Destroy<sqfs_id_table_t>> ids(sqfs_id_table_create(0));
    FUZZ_CHECK(sqfs_id_table_read(ids.get(), file.get(), &super, cmp.get()) == 0);
    std::unique_ptr<sqfs_dir_reader_t, Destroy<sqfs_dir_reader_t>> dirs(
        sqfs_dir_reader_create(&super, cmp.get(), file.get(), 0));
    FUZZ_CHECK(dirs != nullptr);
    std::unique_ptr<sqfs_data_reader_t, Destroy<sqfs_data_reader_t>> reader(
        sqfs_data_reader_create(file.get(), super.block_size, cmp.get(), 0));
    FUZZ_CHECK(reader != nullptr && sqfs_data_reader_load_fragment_table(reader.get(), &super) == 0);
    sqfs_tree_node_t* root = nullptr;
    FUZZ_CHECK(sqfs_dir_reader_get_full_hierarchy(dirs.get(), ids.get(), nullptr, 0, &root) == 0);
    std::vector<char> buf(super.block_size);
    std::vector<std::pair<const sqfs_tree_node_t*, std::string>> todo{{root, ""}};
    while (!todo.empty()) {
        auto [node, path] = todo.back();
        todo.pop_back();
        std::set<std::string> seen;
        for (const sqfs_tree_node_t* c = node->children; c != nullptr; c = c->next) {
            std::string name(reinterpret_cast<const char*>(c->name));
            FUZZ_CHECK(!name.empty() && name != "." && name != ".." && name.size() <= gantry::kMaxNameBytes);
            FUZZ_CHECK(name.find('/') == std::string::npos);
            FUZZ_CHECK(name.compare(0, 4, ".wh.") != 0);
            FUZZ_CHECK(seen.insert(name).second);
            std::string child = path.empty() ? name : path + "/" + name;
            paths.insert(child);
            const auto type = c->inode->base.type;
            if (whiteouts_or_dirs != nullptr && (type == SQFS_INODE_CDEV || type == SQFS_INODE_EXT_CDEV ||
                                                 type == SQFS_INODE_DIR || type == SQFS_INODE_EXT_DIR))
                whiteouts_or_dirs->insert(child);
            sqfs_u64 size = 0;
            if (sqfs_inode_get_file_size(c->inode, &size) == 0 &&
                (c->inode->base.type == SQFS_INODE_FILE || c->inode->base.type == SQFS_INODE_EXT_FILE)) {
                for (sqfs_u64 off = 0; off < size; off += buf.size()) {
                    auto n = sqfs_data_reader_read(reader.get(), c->inode, off, buf.data(),
                                                   static_cast<sqfs_u32>(buf.size()));
                    FUZZ_CHECK(n > 0);
                }
            }
            if (c->children != nullptr) todo.emplace_back(c, child);
        }
    }
    sqfs_dir_tree_destroy(root);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    if (size == 0) return 0;
    static const char* const kMediaTypes[] = {
        "application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd", "application/vnd.docker.image.rootfs.diff.tar.gzip"};
    static const std::string lower = lower_layer();
    const bool two_layers = (data[0] & 4) != 0;
    const std::string upper = scratch() + "/upper.blob", output = scratch() + "/image.sqfs";
    write_file(upper, data + 1, size - 1);
    ::unlink(output.c_str());

    std::vector<LayerBlob> layers;
    if (two_layers) layers.push_back({lower, "application/vnd.oci.image.layer.v1.tar", "sha256:lower", "", nullptr});
    layers.push_back({upper, kMediaTypes[data[0] & 3], "sha256:upper", "", nullptr});
    SquashfsOptions options;
    options.threads = 1;
    options.sync = false;
    // Small limits keep each run quick; breaking one is an expected, clean failure.
    options.limits.max_layer_bytes = 64 << 20;
    options.limits.max_image_bytes = 64 << 20;
    options.limits.max_layer_entries = 10000;
    auto stats = convert_layers(layers, output, options);
    if (!stats) {
        FUZZ_CHECK(::access(output.c_str(), F_OK) != 0);  // a failed conversion leaves no output
        return 0;
    }
    std::set<std::string> paths;
    check_image(output, paths);
    ::unlink(output.c_str());
    if (!two_layers) {
        auto overlay = convert_layer_for_overlay(layers.back(), output, options);
        FUZZ_CHECK(overlay.ok());  // the same layer converted merged, so in overlay form too
        std::set<std::string> overlay_paths, extra_ok;
        check_image(output, overlay_paths, &extra_ok);
        ::unlink(output.c_str());
        for (const auto& p : paths) FUZZ_CHECK(overlay_paths.count(p) == 1);
        for (const auto& p : overlay_paths)
            if (paths.count(p) == 0) FUZZ_CHECK(extra_ok.count(p) == 1);
        return 0;
    }

    auto names = upper_names(data + 1, size - 1);
    if (!names) return 0;
    std::set<std::string> upper_set(names->begin(), names->end());
    auto put_back = [&](const std::string& p) {
        // The upper layer itself provides p (or something below it, which makes p a directory).
        if (upper_set.count(p)) return true;
        for (const auto& u : upper_set)
            if (u.size() > p.size() && u.compare(0, p.size(), p) == 0 && u[p.size()] == '/') return true;
        return false;
    };
    for (const auto& n : *names) {
        auto slash = n.rfind('/');
        std::string dir = slash == std::string::npos ? "" : n.substr(0, slash);
        std::string base = slash == std::string::npos ? n : n.substr(slash + 1);
        if (base.compare(0, 4, ".wh.") != 0) continue;
        std::vector<std::string> hidden;
        if (base == ".wh..wh..opq") {
            for (const auto& l : kLowerFiles)
                if (!dir.empty() && l.compare(0, dir.size() + 1, dir + "/") == 0) hidden.push_back(l);
        } else {
            std::string target = (dir.empty() ? "" : dir + "/") + base.substr(4);
            for (const auto& l : kLowerFiles)
                if (l == target || l.compare(0, target.size() + 1, target + "/") == 0) hidden.push_back(l);
        }
        for (const auto& h : hidden)
            if (!put_back(h)) FUZZ_CHECK(paths.count(h) == 0);
    }
    return 0;
}
