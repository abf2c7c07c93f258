// Parsing of image references (see include/gantry/reference.hpp for the accepted forms).
#include "gantry/reference.hpp"

#include "gantry/digest.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

const char* kForms =
    " (expected [USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST] or REGISTRY/IMAGE[:TAG][@sha256:DIGEST])";

Error bad(std::string_view text, const std::string& why) {
    return make_error("invalid image reference '" + std::string(text) + "': " + why + kForms);
}

bool is_lower_alnum(char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

// OCI distribution: path components are [a-z0-9]+ joined by '.', '_', '__' or runs of '-'.
bool valid_component(std::string_view c) {
    if (c.empty() || !is_lower_alnum(c.front()) || !is_lower_alnum(c.back())) return false;
    for (size_t i = 0; i < c.size(); ++i) {
        char ch = c[i];
        if (is_lower_alnum(ch) || ch == '-') continue;
        if (ch == '.' || ch == '_') {
            // no two separators in a row, except "__"
            char next = i + 1 < c.size() ? c[i + 1] : '\0';
            if (next == '.' || next == '-') return false;
            if (next == '_' && (ch != '_' || (i + 2 < c.size() && !is_lower_alnum(c[i + 2])))) return false;
            continue;
        }
        return false;
    }
    return true;
}

bool valid_tag(std::string_view t) {
    if (t.empty() || t.size() > 128) return false;
    auto word = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    };
    if (!word(t.front())) return false;
    for (char c : t)
        if (!word(c) && c != '.' && c != '-') return false;
    return true;
}

bool valid_registry(std::string_view r) {
    if (r.empty()) return false;
    // A host name starts with a letter or digit (an IPv6 literal with '['): ".1:5000" was accepted and
    // printed as ".1:5000/a", which reads back as a file path (found by tests/fuzz/fuzz_reference).
    if (r[0] == '.' || r[0] == '-' || r[0] == ':') return false;
    for (char c : r)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
              c == ':' || c == '[' || c == ']'))
            return false;
    // host:port -- the port must be a number
    auto close = r.rfind(']');
    auto colon = r.rfind(':');
    if (colon != std::string_view::npos && (close == std::string_view::npos || colon > close)) {
        auto port = r.substr(colon + 1);
        if (port.empty() || port.size() > 5) return false;
        for (char c : port)
            if (c < '0' || c > '9') return false;
    }
    return true;
}

std::string normalize_registry(std::string r) {
    if (r == "docker.io" || r == "index.docker.io" || r == "registry.hub.docker.com") return kDockerHubRegistry;
    return r;
}

}  // namespace

namespace {
// "registry/" as Docker's rule reads it back (a first component with '.' or ':', or "localhost"),
// else Enroot's "registry#": a single-label host printed as "myreg/team/app" would be read back as
// Docker Hub's team, and `gantry pull` of what a message printed would ask another registry.
std::string registry_prefix(const std::string& registry) {
    bool docker_reads_it =
        registry.find_first_of(".:") != std::string::npos || registry == "localhost" || registry == kImportedNamespace;
    return registry + (docker_reads_it ? "/" : "#");
}
}  // namespace

std::string ImageReference::str() const {
    std::string s = registry_prefix(registry) + repository;
    if (!tag.empty()) s += ":" + tag;
    if (!digest.empty()) s += "@" + digest;
    return s;
}

std::string ImageReference::pinned(const std::string& manifest_digest) const {
    return registry_prefix(registry) + repository + "@" + manifest_digest;
}

bool ImageReference::registry_is_loopback() const {
    std::string host = registry;
    if (starts_with(host, "[")) return starts_with(host, "[::1]");
    host = host.substr(0, host.find(':'));
    return host == "localhost" || starts_with(host, "127.");
}

bool is_local_image_path(std::string_view text) {
    return !text.empty() && (text.front() == '/' || text.front() == '.');
}

Result<ImageReference> parse_reference(std::string_view text) {
    ImageReference ref;
    std::string_view s = text;
    if (starts_with(s, "docker://")) s.remove_prefix(9);
    if (s.empty()) return bad(text, "empty");
    if (is_local_image_path(s)) return bad(text, "this is a file path, not a registry image");
    for (char c : s)
        if (c <= ' ' || c == 0x7f) return bad(text, "contains whitespace or control characters");

    // Digest
    auto at_digest = s.find("@sha256:");
    if (at_digest == std::string_view::npos) at_digest = s.rfind('@');
    if (at_digest != std::string_view::npos && s.substr(at_digest + 1).find(':') != std::string_view::npos &&
        s.substr(at_digest + 1).find('/') == std::string_view::npos &&
        s.substr(at_digest + 1).find('#') == std::string_view::npos) {
        std::string d(s.substr(at_digest + 1));
        auto st = validate_digest(d);
        if (!st) return bad(text, st.error().message);
        ref.digest = d;
        s = s.substr(0, at_digest);
    }

    // Enroot's USER@ selector: an '@' before any '#' or '/'.
    auto at = s.find('@');
    if (at != std::string_view::npos) {
        ref.user = std::string(s.substr(0, at));
        if (ref.user.empty()) return bad(text, "empty user before '@'");
        s.remove_prefix(at + 1);
    }

    // Registry: Enroot's REGISTRY#, or Docker's first component with '.' or ':' (or "localhost"); a
    // first component "local" is the imported images' namespace (kImportedNamespace).
    auto hash = s.find('#');
    if (hash != std::string_view::npos) {
        ref.registry = std::string(s.substr(0, hash));
        s.remove_prefix(hash + 1);
        if (ref.registry.empty()) return bad(text, "empty registry before '#'");
    } else {
        auto slash = s.find('/');
        if (slash != std::string_view::npos) {
            auto first = s.substr(0, slash);
            if (first.find_first_of(".:") != std::string_view::npos || first == "localhost" ||
                first == kImportedNamespace) {
                ref.registry = std::string(first);
                s.remove_prefix(slash + 1);
            }
        }
    }
    if (ref.registry.empty()) ref.registry = kDockerHubRegistry;
    if (!valid_registry(ref.registry)) return bad(text, "bad registry name '" + ref.registry + "'");
    ref.registry = normalize_registry(ref.registry);

    // Tag: after the last ':' that follows the last '/'.
    auto last_slash = s.rfind('/');
    auto colon = s.rfind(':');
    if (colon != std::string_view::npos && (last_slash == std::string_view::npos || colon > last_slash)) {
        ref.tag = std::string(s.substr(colon + 1));
        s = s.substr(0, colon);
        if (!valid_tag(ref.tag)) return bad(text, "bad tag '" + ref.tag + "'");
    }
    if (ref.tag.empty() && ref.digest.empty()) ref.tag = "latest";

    if (s.empty()) return bad(text, "missing image name");
    ref.repository = std::string(s);
    for (const auto& comp : split_list(ref.repository, '/'))
        if (!valid_component(comp))
            return bad(text, "bad repository component '" + comp + "' (lowercase letters, digits and . _ - only)");
    if (ref.repository.find("//") != std::string::npos || ref.repository.front() == '/' || ref.repository.back() == '/')
        return bad(text, "empty repository component");
    if (ref.registry == kDockerHubRegistry && ref.repository.find('/') == std::string::npos)
        ref.repository = "library/" + ref.repository;
    return ref;
}

}  // namespace gantry
