// Naming a local image (`gantry import SOURCE`) and reading the files of an OCI layout directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <memory>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/fd.hpp"
#include "gantry/local_image.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

constexpr const char* kForms =
    "oci:DIR[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE[:IMAGE], dockerd://IMAGE or podman://IMAGE";

std::string absolute(const std::string& path) {
    if (path.empty() || path.front() == '/') return path;
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) == nullptr) return path;
    return std::string(cwd) + "/" + path;
}

}  // namespace

std::string LocalSource::str() const {
    switch (kind) {
        case Kind::dockerd:
            return "dockerd://" + path;
        case Kind::podman:
            return "podman://" + path;
        case Kind::oci_dir:
            return "oci:" + path + (tag.empty() ? "" : ":" + tag);
        case Kind::oci_archive:
            return "oci-archive:" + path + (tag.empty() ? "" : ":" + tag);
        case Kind::docker_archive:
            return "docker-archive:" + path + (tag.empty() ? "" : ":" + tag);
    }
    return path;
}

Result<LocalSource> parse_local_source(const std::string& text) {
    LocalSource s;
    for (auto [prefix, kind] :
         {std::pair{"dockerd://", LocalSource::Kind::dockerd}, std::pair{"podman://", LocalSource::Kind::podman}}) {
        if (!starts_with(text, prefix)) continue;
        s.kind = kind;
        s.path = text.substr(std::string(prefix).size());
        if (s.path.empty()) return make_error("import: " + text + " names no image (" + kForms + ")");
        return s;
    }
    // The path ends at the first ':' after the prefix, as in skopeo's transports: what follows is the
    // tag (OCI) or the image (docker-archive), which may hold ':' itself ("repo:tag").
    for (auto [prefix, kind] :
         {std::pair{"oci:", LocalSource::Kind::oci_dir}, std::pair{"oci-archive:", LocalSource::Kind::oci_archive},
          std::pair{"docker-archive:", LocalSource::Kind::docker_archive}}) {
        if (!starts_with(text, prefix)) continue;
        s.kind = kind;
        std::string rest = text.substr(std::string(prefix).size());
        auto colon = rest.find(':');
        s.path = rest.substr(0, colon);
        if (colon != std::string::npos) s.tag = rest.substr(colon + 1);
        if (s.path.empty()) return make_error("import: " + text + " names no path (" + kForms + ")");
        if (colon != std::string::npos && s.tag.empty())
            return make_error("import: " + text + " ends in ':' but names no tag (" + kForms + ")");
        s.path = absolute(s.path);
        return s;
    }
    return make_error("import: unknown image source '" + text + "' (expected " + kForms + ")");
}

Result<std::string> normalize_member_name(std::string_view name) {
    auto refuse = [&](const std::string& why) {
        std::string shown;
        for (char c : name.substr(0, 120)) shown.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
        return make_error("archive member '" + shown + "' " + why);
    };
    if (name.size() >= kMaxPathBytes) return refuse("has too long a name");
    if (!name.empty() && name.front() == '/') return refuse("leaves the archive (an absolute name)");
    std::vector<std::string_view> parts;
    size_t start = 0;
    while (start <= name.size()) {
        size_t slash = name.find('/', start);
        std::string_view part =
            name.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
        if (part == "..") return refuse("leaves the archive (a '..' component)");
        if (!part.empty() && part != ".") parts.push_back(part);
        if (slash == std::string_view::npos) break;
        start = slash + 1;
    }
    if (parts.empty()) return refuse("has an empty name");
    std::string out;
    for (auto p : parts) {
        if (!out.empty()) out += '/';
        out += p;
    }
    return out;
}

LocalFileLookup layout_directory_files(const std::string& dir) {
    return [dir](const std::string& name) -> Result<LocalFile> {
        auto norm = normalize_member_name(name);
        if (!norm) return norm.error().wrap("reading " + dir);
        const std::string path = dir + "/" + *norm;
        // The layout is the caller's own directory; a symlink in its last component is still refused,
        // so that a layout cannot make us hash (and convert) a file elsewhere by accident, and a FIFO
        // cannot block us (O_NONBLOCK, then the regular-file check). The descriptor hashed here is
        // the one everything later reads (LocalFile::fd): a file renamed over `path` after the hash
        // -- a FIFO, a symlink to a file only root may read -- is never opened.
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
        if (!fd) {
            if (errno == ENOENT) return make_error(path + " does not exist: is " + dir + " an OCI layout?");
            return system_error("opening " + path);
        }
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) return system_error("reading " + path);
        if (!S_ISREG(st.st_mode)) return make_error(path + " is not a regular file");
        Sha256 h;
        std::vector<char> buf(1 << 20);
        uint64_t total = 0;
        for (;;) {
            ssize_t n = ::read(fd.get(), buf.data(), buf.size());
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return system_error("reading " + path);
            if (n == 0) break;
            h.update(buf.data(), static_cast<size_t>(n));
            total += static_cast<uint64_t>(n);
        }
        return LocalFile{path, h.finish(), total, std::make_shared<const UniqueFd>(std::move(fd))};
    };
}

}  // namespace gantry
