// The merged file tree of an image, built while walking the layers from the top one down, and the OCI
// whiteout rules that decide, for each tar entry, whether it is the winning version of its path.
//
// Because the walk goes top-down, the first entry that reaches a path wins it; what a layer says can
// only hide things in LOWER layers (OCI image spec: whiteouts never apply to their own layer), while a
// later entry for the same path in the SAME layer replaces the earlier one (tar semantics).
#pragma once

#include <sqfs/inode.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gantry/result.hpp"

namespace gantry::squashfs {

// One file system object of the result. Several tree paths may share one (hard links).
struct Inode {
    uint32_t mode = 0;  // full st_mode: type and permission bits (setuid/setgid/sticky kept)
    uint32_t uid = 0, gid = 0;
    int64_t mtime = 0;
    std::string symlink_target;                               // verbatim, never resolved
    std::vector<std::pair<std::string, std::string>> xattrs;  // key, value
    uint64_t size = 0;                                        // regular files: bytes of data
    // Regular files: the inode libsquashfs's block processor builds while the data streams in; it
    // keeps a pointer to this member and may reallocate it until the processor is finished.
    sqfs_inode_generic_t* file = nullptr;

    // Filled while serializing.
    uint32_t ino = 0;
    uint32_t nlink = 0;
    uint64_t ref = 0;
    bool written = false;

    Inode() = default;
    Inode(const Inode&) = delete;
    Inode& operator=(const Inode&) = delete;
    ~Inode();

    [[nodiscard]] bool is_dir() const { return (mode & 0170000) == 0040000; }
    [[nodiscard]] bool is_reg() const { return (mode & 0170000) == 0100000; }
};

// A directory no layer lists (an entry a/b/c without a/): root-owned 0755, time 0, which is what tar
// and umoci create for missing parents apart from the time (they use "now").
std::unique_ptr<Inode> default_directory();

struct TreeNode {
    Inode* inode = nullptr;  // the winning version; nullptr with decided >= 0 means "deleted" (skipped device)
    int decided = -1;        // layer whose entry won this path
    int whiteout = -1;       // highest layer that whited this path out (hides it and all below from lower layers)
    int opaque = -1;         // highest layer that made this directory opaque (hides lower layers' children)
    bool implied = false;    // a winning entry lies below: this path must be a directory
    // Sorted bytewise (std::string compares as unsigned char), the order squashfs directories need.
    std::map<std::string, std::unique_ptr<TreeNode>> children;

    [[nodiscard]] bool tombstone() const { return decided >= 0 && inode == nullptr; }
    [[nodiscard]] bool emitted() const { return inode != nullptr || implied; }
    [[nodiscard]] bool is_dir() const { return inode != nullptr ? inode->is_dir() : implied; }
};

// Splits a tar member name into path components inside the image root. "./a/b/", "a/b" and "a/./b"
// give {"a","b"}; "." and "./" give {} (the root). Rejects "..", absolute names and empty components,
// and paths beyond kMaxNameBytes, kMaxPathBytes or kMaxPathDepth (gantry/squashfs.hpp; a whiteout
// marker is measured as the path it deletes): then `broken_limit`, when given, names the constant.
Result<std::vector<std::string>> split_entry_path(std::string_view name, std::string* broken_limit = nullptr);
std::string join_path(const std::vector<std::string>& components);

class ImageTree {
public:
    ImageTree();

    // Where an entry of `layer` for `path` goes: the node it wins, or nullptr when a higher layer (or a
    // whiteout/opaque directory of one) hides it. `is_dir`: the entry is a directory.
    TreeNode* place(const std::vector<std::string>& path, int layer, bool is_dir);

    // `.wh.NAME` in `layer`: NAME (and all below it) is deleted for lower layers.
    // Returns false when the whiteout itself lies in a hidden part of the tree (then it is moot).
    bool whiteout(const std::vector<std::string>& path, int layer);
    // `DIR/.wh..wh..opq` in `layer`: lower layers' children of DIR are hidden; DIR itself stays.
    bool make_opaque(const std::vector<std::string>& dir, int layer);

    // Takes ownership; the returned pointer stays valid for the tree's lifetime.
    Inode* adopt(std::unique_ptr<Inode> inode);

    // Overlay form, for a tree of ONE layer (layer 0) that is to be an overlayfs lower layer: what the
    // layer deletes becomes an overlayfs whiteout (a character device 0/0: its whiteouts, and devices,
    // which Gantry never carries and which hide lower versions of their path), and a directory whose
    // lower children it hides (an opaque marker, or a path it whites out and recreates) gets the
    // xattr `opaque_xattr` = "y". Returns how many whiteouts were made.
    size_t to_overlay_form(const std::string& opaque_xattr);

    TreeNode& root() { return root_; }

private:
    // The deepest node on `path` that exists, and whether some ancestor hides entries of `layer`.
    bool hidden_below(const std::vector<std::string>& path, size_t depth, int layer) const;
    TreeNode* ensure(const std::vector<std::string>& path, size_t depth, bool mark_implied);

    TreeNode root_;
    std::vector<std::unique_ptr<Inode>> inodes_;
};

}  // namespace gantry::squashfs
