// The image store's file system and its flock scope (see include/gantry/store_fs.hpp).
#include "gantry/store_fs.hpp"

#include <sstream>

#include "gantry/strings.hpp"

namespace gantry {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' &&
            s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
            out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
            i += 3;
        } else {
            out += s[i];
        }
    }
    return out;
}

bool has_option(const std::vector<std::string>& options, std::string_view want) {
    for (const auto& o : options)
        if (o == want) return true;
    return false;
}

}  // namespace

std::vector<MountEntry> parse_mountinfo(std::string_view text) {
    std::vector<MountEntry> out;
    for (const auto& line : split_list(text, '\n')) {
        // ID PARENT MAJ:MIN ROOT MOUNT_POINT MOUNT_OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        std::istringstream in(line);
        std::vector<std::string> f;
        for (std::string w; in >> w;) f.push_back(w);
        size_t dash = 6;
        while (dash < f.size() && f[dash] != "-") ++dash;
        if (f.size() < 6 || dash + 2 >= f.size()) continue;
        MountEntry m;
        m.mount_point = unescape(f[4]);
        m.mount_options = f[5];
        m.fstype = f[dash + 1];
        m.source = unescape(f[dash + 2]);
        m.super_options = dash + 3 < f.size() ? f[dash + 3] : "";
        out.push_back(std::move(m));
    }
    return out;
}

std::optional<MountEntry> mount_containing(const std::vector<MountEntry>& mounts, std::string_view path) {
    std::optional<MountEntry> best;
    for (const auto& m : mounts) {
        const std::string& mp = m.mount_point;
        bool contains = mp == "/" ? starts_with(path, "/")
                                  : starts_with(path, mp) && (path.size() == mp.size() || path[mp.size()] == '/');
        if (contains && (!best || mp.size() >= best->mount_point.size())) best = m;
    }
    return best;
}

const char* to_string(FlockScope scope) {
    switch (scope) {
        case FlockScope::cluster:
            return "coherent across nodes";
        case FlockScope::node:
            return "local to each node";
        case FlockScope::disabled:
            return "disabled";
        case FlockScope::unchecked:
            return "not checked";
    }
    return "?";
}

FlockScope flock_scope(std::string_view fstype, std::string_view options, bool is_lustre) {
    auto opts = split_list(options, ',');
    if (is_lustre || fstype == "lustre") {
        // The client lists exactly one of them; without any, flock is off (Lustre's default).
        if (has_option(opts, "localflock")) return FlockScope::node;
        if (has_option(opts, "noflock")) return FlockScope::disabled;
        if (has_option(opts, "flock")) return FlockScope::cluster;
        return FlockScope::disabled;
    }
    if (fstype == "nfs" || fstype == "nfs4") {
        if (has_option(opts, "local_lock=flock") || has_option(opts, "local_lock=all")) return FlockScope::node;
        return FlockScope::cluster;
    }
    return FlockScope::unchecked;
}

}  // namespace gantry
