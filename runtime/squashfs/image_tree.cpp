// OCI layer merge rules over the image tree. See image_tree.hpp for the model; docs/squashfs.md lists
// the rules with examples.
#include "image_tree.hpp"

#include <sqfs/predef.h>

#include <algorithm>

#include "gantry/squashfs.hpp"

namespace gantry::squashfs {

Inode::~Inode() {
    sqfs_free(file);
}

std::unique_ptr<Inode> default_directory() {
    auto in = std::make_unique<Inode>();
    in->mode = 0040755;
    return in;
}

Result<std::vector<std::string>> split_entry_path(std::string_view name, std::string* broken_limit) {
    if (name.empty()) return make_error("empty entry name");
    if (name.front() == '/') return make_error("absolute path escapes the image root");
    // Directories are often written as "dir/": the trailing slashes carry no meaning.
    while (name.size() > 1 && name.back() == '/') name.remove_suffix(1);
    auto too_long = [&](const char* limit, const std::string& why) {
        if (broken_limit != nullptr) *broken_limit = limit;
        return make_error(why + " (" + limit + "); the image cannot be converted, rebuild it with shorter paths");
    };
    std::vector<std::string> parts;
    size_t path_bytes = 1;  // "/a/b" as the container sees it, plus its NUL
    size_t pos = 0;
    for (;;) {
        size_t slash = name.find('/', pos);
        const bool last = slash == std::string_view::npos;
        std::string_view part = name.substr(pos, last ? std::string_view::npos : slash - pos);
        if (part == "..") return make_error("'..' component escapes the image root");
        if (part.empty()) return make_error("empty path component");
        // ".wh." names mark deletions (OCI image spec, "Whiteouts"): no file system of an image can hold
        // one, so one on the way to an entry (".wh.x/y") is a malformed layer, never a directory to make.
        if (!last && part.rfind(".wh.", 0) == 0)
            return make_error(
                "a whiteout name (.wh.*) used as a directory; names starting with .wh. mark "
                "deletions and cannot be directories (OCI image spec), so the layer is malformed");
        if (part != ".") {  // "./a" and "a/./b" are harmless spellings
            // A whiteout marker stands for the path it deletes: ".wh.NAME" for NAME, the opaque marker
            // for its directory; only that path has to fit.
            size_t counted = part.size();
            if (last && part == ".wh..wh..opq") {
                counted = 0;
            } else if (last && part.rfind(".wh.", 0) == 0) {
                counted -= 4;
            }
            if (counted > kMaxNameBytes)
                return too_long("kMaxNameBytes", "a path component of " + std::to_string(counted) +
                                                     " bytes, more than " + std::to_string(kMaxNameBytes));
            if (counted > 0) {
                path_bytes += 1 + counted;
                if (path_bytes > kMaxPathBytes)
                    return too_long("kMaxPathBytes",
                                    "a path longer than " + std::to_string(kMaxPathBytes - 1) + " bytes");
                if (parts.size() == kMaxPathDepth)
                    return too_long("kMaxPathDepth",
                                    "a path deeper than " + std::to_string(kMaxPathDepth) + " components");
            }
            parts.emplace_back(part);
        }
        if (last) break;
        pos = slash + 1;
    }
    return parts;
}

std::string join_path(const std::vector<std::string>& components) {
    std::string out;
    for (const auto& c : components) {
        if (!out.empty()) out.push_back('/');
        out += c;
    }
    return out;
}

ImageTree::ImageTree() {
    root_.implied = true;
}

Inode* ImageTree::adopt(std::unique_ptr<Inode> inode) {
    inodes_.push_back(std::move(inode));
    return inodes_.back().get();
}

bool ImageTree::hidden_below(const std::vector<std::string>& path, size_t depth, int layer) const {
    const TreeNode* node = &root_;
    for (size_t i = 0;; ++i) {
        if (node->opaque > layer) return true;  // a higher layer emptied this directory
        if (i == depth) return false;
        auto it = node->children.find(path[i]);
        if (it == node->children.end()) return false;  // nothing recorded further down
        const TreeNode* child = it->second.get();
        if (child->whiteout > layer) return true;  // a higher layer deleted this ancestor
        // A higher layer (or an earlier entry of this one) made the ancestor a non-directory, or
        // deleted it as a skipped device: nothing can live below it.
        if (child->decided >= layer && !child->is_dir()) return true;
        node = child;
    }
}

TreeNode* ImageTree::ensure(const std::vector<std::string>& path, size_t depth, bool mark_implied) {
    TreeNode* node = &root_;
    for (size_t i = 0; i < depth; ++i) {
        if (mark_implied) node->implied = true;
        auto& slot = node->children[path[i]];
        if (!slot) slot = std::make_unique<TreeNode>();
        node = slot.get();
    }
    return node;
}

TreeNode* ImageTree::place(const std::vector<std::string>& path, int layer, bool is_dir) {
    if (path.empty()) {
        // The root: always a directory; the top-most "./" entry gives its attributes.
        if (!is_dir || root_.decided > layer) return nullptr;
        root_.decided = layer;
        return &root_;
    }
    if (hidden_below(path, path.size() - 1, layer)) return nullptr;
    // Look the node up without creating it: a shadowed entry must leave no trace.
    const TreeNode* existing = &root_;
    for (const auto& c : path) {
        auto it = existing->children.find(c);
        if (it == existing->children.end()) {
            existing = nullptr;
            break;
        }
        existing = it->second.get();
    }
    if (existing != nullptr) {
        if (existing->decided > layer) return nullptr;   // a higher layer has this path
        if (existing->whiteout > layer) return nullptr;  // a higher layer deleted it
        // Winning entries below it (from this or a higher layer) keep it a directory.
        if (!is_dir && existing->implied) return nullptr;
    }
    TreeNode* node = ensure(path, path.size(), true);
    node->decided = layer;
    return node;
}

bool ImageTree::whiteout(const std::vector<std::string>& path, int layer) {
    if (path.empty() || hidden_below(path, path.size() - 1, layer)) return false;
    TreeNode* node = ensure(path, path.size(), false);
    if (node->whiteout < 0) node->whiteout = layer;  // top-down: the first one is the highest
    return true;
}

bool ImageTree::make_opaque(const std::vector<std::string>& dir, int layer) {
    if (hidden_below(dir, dir.size(), layer)) return false;
    TreeNode* node = ensure(dir, dir.size(), true);
    node->implied = true;  // the marker says this is a directory in `layer`
    if (node->opaque < 0) node->opaque = layer;
    return true;
}

namespace {

// Gives `dir` the opaque xattr; a directory the layer has no entry for gets the attributes the
// serializer would give it.
void mark_opaque(ImageTree& tree, TreeNode& dir, const std::string& opaque_xattr) {
    if (dir.inode == nullptr) dir.inode = tree.adopt(default_directory());
    auto& xattrs = dir.inode->xattrs;
    xattrs.emplace_back(opaque_xattr, "y");
    std::sort(xattrs.begin(), xattrs.end());
}

size_t overlay_form(ImageTree& tree, TreeNode& dir, const std::string& opaque_xattr) {
    size_t made = 0;
    for (auto& [name, child] : dir.children) {
        TreeNode& node = *child;
        // Deleted here and not recreated by an entry of this layer: a whiteout hides the lower path.
        if ((node.whiteout >= 0 && node.decided < 0 && !node.implied) || node.tombstone()) {
            auto w = std::make_unique<Inode>();
            w->mode = 0020000;  // S_IFCHR, device 0/0, no permission bits, as overlayfs makes them
            node.inode = tree.adopt(std::move(w));
            node.decided = 0;
            node.children.clear();
            ++made;
            continue;
        }
        if (node.inode != nullptr && !node.inode->is_dir()) continue;
        // A directory, or a node on the way to a deeper whiteout: the way must exist in this layer.
        const size_t below = overlay_form(tree, node, opaque_xattr);
        if (below > 0) node.implied = true;
        // Opaque: the layer says so, or it deleted the path and made a directory there again (the
        // lower contents are gone, so overlayfs must not merge them in).
        if (node.emitted() && (node.opaque >= 0 || node.whiteout >= 0)) mark_opaque(tree, node, opaque_xattr);
        made += below;
    }
    return made;
}

}  // namespace

size_t ImageTree::to_overlay_form(const std::string& opaque_xattr) {
    if (root_.opaque >= 0) mark_opaque(*this, root_, opaque_xattr);
    return overlay_form(*this, root_, opaque_xattr);
}

}  // namespace gantry::squashfs
