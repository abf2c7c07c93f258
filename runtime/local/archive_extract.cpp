// An image archive (oci-archive, docker-archive, `docker save` on a pipe) read in one streaming pass.
// The members of interest come in no useful order -- `docker save` and skopeo put manifest.json last,
// and the converter reads the top layer first -- so each regular member is written once into the
// import's staging area under the sha256 of its bytes, hashed as it streams. Member names never
// become paths: the archive cannot write outside the area, whatever it holds.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/local_image.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

struct ArchiveFree {
    void operator()(archive* a) const { archive_read_free(a); }
};

// The member a link target names: relative to the link's directory for a symlink, from the archive
// root for a hard link (tar's convention).
Result<std::string> link_target(const std::string& member, const std::string& target, bool symbolic) {
    if (!symbolic) return normalize_member_name(target);
    if (!target.empty() && target.front() == '/')
        return make_error("archive member '" + member + "' links to '" + target + "', outside the archive");
    auto slash = member.rfind('/');
    std::string joined = slash == std::string::npos ? target : member.substr(0, slash + 1) + target;
    // Resolve ".." against the member's own directory; one that climbs above the root leaves the archive.
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= joined.size()) {
        size_t slash = joined.find('/', start);
        std::string part = joined.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (part == "..") {
            if (parts.empty())
                return make_error("archive member '" + member + "' links to '" + target + "', outside the archive");
            parts.pop_back();
        } else if (!part.empty() && part != ".") {
            parts.push_back(part);
        }
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
    return normalize_member_name(out);
}

}  // namespace

Result<LocalFile> ExtractedArchive::find(const std::string& name) const {
    auto norm = normalize_member_name(name);
    if (!norm) return norm.error();
    std::string at = *norm;
    for (int hops = 0; hops <= 8; ++hops) {
        if (auto m = members.find(at); m != members.end()) return m->second;
        auto l = links.find(at);
        if (l == links.end()) return make_error("the archive has no file " + name);
        at = l->second;
    }
    return make_error("the archive's file " + name + " is a chain of more than 8 links");
}

LocalFileLookup ExtractedArchive::lookup() const {
    return [this](const std::string& name) { return find(name); };
}

Result<ExtractedArchive> extract_archive(int fd, const std::string& what, const std::string& dir, uint64_t max_bytes) {
    std::unique_ptr<archive, ArchiveFree> ar(archive_read_new());
    if (!ar) return make_error("reading " + what + ": libarchive: out of memory");
    archive_read_support_format_tar(ar.get());
    archive_read_support_format_gnutar(ar.get());
    archive_read_support_filter_gzip(ar.get());
    archive_read_support_filter_zstd(ar.get());
    archive_read_support_filter_xz(ar.get());
    archive_read_support_filter_bzip2(ar.get());
    if (archive_read_open_fd(ar.get(), fd, 1 << 20) != ARCHIVE_OK) {
        const char* why = archive_error_string(ar.get());
        return make_error("reading " + what + ": not a valid tar archive (" + (why != nullptr ? why : "?") + ")");
    }

    ExtractedArchive out;
    out.dir = dir;
    std::vector<char> buf(1 << 20);
    size_t count = 0;
    for (;;) {
        archive_entry* e = nullptr;
        int rc = archive_read_next_header(ar.get(), &e);
        if (rc == ARCHIVE_EOF) break;
        if (rc < ARCHIVE_WARN) {
            const char* why = archive_error_string(ar.get());
            return make_error("reading " + what + ": not a valid tar archive (" + (why != nullptr ? why : "?") + ")");
        }
        if (++count > kMaxArchiveMembers)
            return make_error("reading " + what + ": more than " + std::to_string(kMaxArchiveMembers) +
                              " members; this is not an image archive");
        const char* raw = archive_entry_pathname(e);
        auto name = normalize_member_name(raw != nullptr ? raw : "");
        if (!name) {
            // "./" (the root directory entry some tars carry) is harmless; every other bad name is refused.
            if (raw != nullptr && (std::string_view(raw) == "./" || std::string_view(raw) == ".")) continue;
            return name.error().wrap("reading " + what);
        }
        if (const char* hard = archive_entry_hardlink(e); hard != nullptr) {
            auto target = link_target(*name, hard, false);
            if (!target) return target.error().wrap("reading " + what);
            out.links[*name] = *target;
            continue;
        }
        const auto type = archive_entry_filetype(e);
        if (type == AE_IFLNK) {
            const char* sym = archive_entry_symlink(e);
            auto target = link_target(*name, sym != nullptr ? sym : "", true);
            if (!target) return target.error().wrap("reading " + what);
            out.links[*name] = *target;
            continue;
        }
        if (type != AE_IFREG) continue;  // directories and anything else carry no image data

        const std::string tmp = dir + "/.member." + std::to_string(count);
        UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!f) return system_error("creating " + tmp);
        Sha256 h;
        uint64_t size = 0;
        for (;;) {
            la_ssize_t n = archive_read_data(ar.get(), buf.data(), buf.size());
            if (n < 0) {
                ::unlink(tmp.c_str());
                return make_error("reading " + what + ": member " + *name + ": " + archive_error_string(ar.get()));
            }
            if (n == 0) break;
            size += static_cast<uint64_t>(n);
            if (out.bytes + size > max_bytes) {
                ::unlink(tmp.c_str());
                return make_error("reading " + what + ": more than " + std::to_string(max_bytes) + " bytes (" +
                                  format_bytes(max_bytes) + ", gantry.conf's max_image_bytes) of members");
            }
            const std::string_view chunk(buf.data(), static_cast<size_t>(n));
            h.update(chunk);
            if (auto st = write_all(f.get(), chunk, "writing " + tmp); !st) {
                ::unlink(tmp.c_str());
                return st.error();
            }
        }
        out.bytes += size;
        std::string digest = h.finish();
        std::string path = dir + "/" + digest_hex(digest);
        // The same bytes twice (docker-archive's layer.tar and <hex>.tar in older formats): kept once.
        if (::rename(tmp.c_str(), path.c_str()) != 0) {
            ::unlink(tmp.c_str());
            return system_error("storing " + *name + " of " + what + " as " + path);
        }
        out.members[*name] = LocalFile{path, digest, size, nullptr};
        out.links.erase(*name);
    }
    return out;
}

}  // namespace gantry
