// Parsing of the `--container-mounts` / `--mount` syntax (see include/gantry/mounts.hpp).
#include "gantry/mounts.hpp"

#include <sys/stat.h>

#include <algorithm>

#include "gantry/strings.hpp"
#include "gantry/workdir.hpp"

namespace gantry {

Result<std::string> normalize_container_path(std::string_view path, const std::string& what) {
    std::string p(path);
    if (p.empty()) return make_error(what + " is empty");
    // Security boundary: the checks below see the whole string, the kernel only up to a NUL. "/\0x"
    // passed "not the container root" and then mounted over it (found by tests/fuzz/fuzz_container_mounts).
    if (p.find('\0') != std::string::npos) return make_error(what + ": contains a NUL byte");
    if (p[0] != '/' && p[0] != '.') return make_error(what + " " + p + ": must be absolute or start with '.'");
    std::string out;
    for (const auto& part : split_list(p, '/')) {
        if (part == ".") continue;
        if (part == "..") return make_error(what + " " + p + ": '..' is not allowed");
        out += '/';
        out += part;
    }
    if (out.empty()) return std::string(1, '/');
    return out;
}

Result<std::string> normalize_container_workdir(std::string_view path) {
    std::string p(path);
    const std::string what = "working directory";
    if (p.empty()) return make_error(what + " is empty");
    if (p.find('\0') != std::string::npos) return make_error(what + ": contains a NUL byte");
    if (p[0] != '/' && p[0] != '.') return make_error(what + " " + p + ": must be absolute or start with '.'");
    std::vector<std::string> parts;
    for (const auto& part : split_list(p, '/')) {
        if (part == ".") continue;
        if (part == "..") {
            if (!parts.empty()) parts.pop_back();  // at the root, ".." is the root itself
            continue;
        }
        parts.push_back(part);
    }
    std::string out;
    for (const auto& part : parts) out += "/" + part;
    return out.empty() ? std::string(1, '/') : out;
}

bool apply_mount_flag(MountSpec& m, const std::string& f) {
    if (f == "ro")
        m.read_only = true;
    else if (f == "rw")
        m.read_only = false;
    else if (f == "rbind")
        m.recursive = true;
    else if (f == "bind")
        m.recursive = false;
    else if (f == "nosuid")
        m.nosuid = true;
    else if (f == "suid")
        m.nosuid = false;
    else if (f == "nodev")
        m.nodev = true;
    else if (f == "dev")
        m.nodev = false;
    else if (f == "noexec")
        m.noexec = true;
    else if (f == "exec")
        m.noexec = false;
    else if (f == "private" || f == "rprivate")
        m.propagation = Propagation::private_;
    else if (f == "slave" || f == "rslave")
        m.propagation = Propagation::slave;
    else if (f == "shared" || f == "rshared")
        m.propagation = Propagation::shared;
    else if (f == "unbindable" || f == "runbindable")
        m.propagation = Propagation::unbindable;
    else if (m.kind == MountKind::tmpfs && f.find('=') != std::string::npos && f[0] != '=') {
        if (!m.data.empty()) m.data += ',';
        m.data += f;
        return true;
    } else {
        return false;
    }
    if (f == "private" || f == "slave" || f == "shared" || f == "unbindable") m.propagation_recursive = false;
    if (f[0] == 'r' && (f == "rprivate" || f == "rslave" || f == "rshared" || f == "runbindable"))
        m.propagation_recursive = true;
    return true;
}

Result<MountSpec> parse_mount(std::string_view entry) {
    MountSpec m;
    m.text = trim(entry);
    if (m.text.empty()) return make_error("empty mount entry");
    // A NUL would cut the source short where the kernel reads it (see normalize_container_path).
    if (m.text.find('\0') != std::string::npos) return make_error("mount entry contains a NUL byte");
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
        size_t colon = m.text.find(':', start);
        parts.push_back(m.text.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
        if (colon == std::string::npos) break;
        start = colon + 1;
    }
    if (parts.size() > 3) return make_error("mount " + m.text + ": expected SRC[:DST[:FLAGS]]");
    m.source = parts[0];
    if (m.source.empty()) return make_error("mount " + m.text + ": empty source");
    if (m.source == "tmpfs")
        m.kind = MountKind::tmpfs;
    else if (m.source == "umount")
        m.kind = MountKind::umount;
    else if (m.source[0] != '/' && m.source[0] != '.')
        return make_error("mount " + m.text + ": source must be an absolute path, ./path, tmpfs or umount");

    std::string dst = parts.size() > 1 ? parts[1] : (m.kind == MountKind::bind ? m.source : "");
    if (dst.empty()) return make_error("mount " + m.text + ": a destination is required");
    auto norm = normalize_container_path(dst, "mount destination");
    if (!norm) return norm.error();
    m.destination = *norm;
    if (m.destination == "/") return make_error("mount " + m.text + ": cannot mount over the container root");

    if (parts.size() > 2) {
        if (parts[2].empty()) return make_error("mount " + m.text + ": empty flags");
        for (const auto& f : split_list(parts[2], '+')) {
            if (m.kind == MountKind::umount) return make_error("mount " + m.text + ": umount takes no flags");
            if (!apply_mount_flag(m, f)) return make_error("mount " + m.text + ": unknown mount flag '" + f + "'");
        }
    }
    return m;
}

Status parse_mounts(std::string_view list, std::vector<MountSpec>& out) {
    for (const auto& entry : split_list(list, ',')) {
        auto m = parse_mount(entry);
        if (!m) return m.error();
        auto same = [&](const MountSpec& o) {
            MountSpec a = o, b = *m;
            a.text.clear();
            b.text.clear();
            return a == b;
        };
        if (std::none_of(out.begin(), out.end(), same)) out.push_back(std::move(*m));
    }
    return {};
}

Status check_mount_sources(const std::vector<MountSpec>& mounts) {
    for (const auto& m : mounts) {
        if (m.kind != MountKind::bind) continue;
        struct stat st {};
        if (::stat(m.source.c_str(), &st) != 0) {
            if (m.nofail) continue;  // the holder leaves it out
            std::string what =
                (m.origin.empty() ? "" : m.origin + ": ") + "mounting " + m.source + " at " + m.destination;
            if (errno == ENOENT || errno == ENOTDIR)
                return make_error(what + ": source path does not exist" +
                                  (m.origin.empty() ? "" : " (add nofail to its options to skip it when missing)"));
            return system_error(what);
        }
    }
    return {};
}

}  // namespace gantry
