// Platforms (os/architecture/variant): the host's, parsed from --platform, and the matching rules
// used to pick one manifest out of an index.
#include <sys/utsname.h>

#include <string>

#include "gantry/registry.hpp"
#include "gantry/strings.hpp"
#include "registry/platform_match.hpp"

namespace gantry {
namespace {

// Kernel and distribution spellings of architectures, mapped to the OCI (Go GOARCH) names.
struct ArchAlias {
    const char* alias;
    const char* arch;
    const char* variant;
};
constexpr ArchAlias kAliases[] = {
    {"x86_64", "amd64", ""}, {"x86-64", "amd64", ""}, {"aarch64", "arm64", "v8"}, {"armv8l", "arm64", "v8"},
    {"armhf", "arm", "v7"},  {"armv7l", "arm", "v7"}, {"armel", "arm", "v6"},     {"armv6l", "arm", "v6"},
    {"i386", "386", ""},     {"i686", "386", ""},     {"x86", "386", ""},
};

}  // namespace

Platform normalize_platform(Platform p) {
    p.os = lower(p.os);
    p.architecture = lower(p.architecture);
    p.variant = lower(p.variant);
    for (const auto& a : kAliases) {
        if (p.architecture == a.alias) {
            p.architecture = a.arch;
            if (p.variant.empty()) p.variant = a.variant;
            break;
        }
    }
    // An arm64 image or host without a variant is v8; 32-bit arm without one is v7 (containerd's rule).
    if (p.architecture == "arm64" && p.variant.empty()) p.variant = "v8";
    if (p.architecture == "arm" && p.variant.empty()) p.variant = "v7";
    return p;
}

int platform_match_score(const Platform& wanted_in, const Platform& entry_in) {
    Platform wanted = normalize_platform(wanted_in);
    Platform entry = normalize_platform(entry_in);
    if (wanted.os != entry.os || wanted.architecture != entry.architecture) return 0;
    if (wanted.variant == entry.variant) return 3;
    if (wanted.variant.empty()) return entry.variant.empty() ? 3 : 1;  // e.g. amd64 vs amd64/v3
    // arm: a v7 host runs v6 and v5 images; arm64: a v8.x/v9 host runs v8 images.
    auto version = [](const std::string& v) -> int {
        if (v.size() < 2 || v[0] != 'v') return -1;
        int n = 0;
        for (size_t i = 1; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i) n = n * 10 + (v[i] - '0');
        return n;
    };
    int w = version(wanted.variant), e = version(entry.variant);
    if (w > 0 && e > 0 && e <= w && (wanted.architecture == "arm" || wanted.architecture == "arm64")) return 2;
    return 0;
}

Platform Platform::host() {
    struct utsname u {};
    Platform p;
    if (::uname(&u) == 0) {
        p.architecture = u.machine;
    } else {
        p.architecture = "amd64";
    }
    return normalize_platform(p);
}

Result<Platform> Platform::parse(const std::string& text) {
    auto parts = std::vector<std::string>();
    size_t start = 0;
    while (true) {
        size_t slash = text.find('/', start);
        parts.push_back(text.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    const std::string form = " (expected OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm64/v8)";
    if (parts.size() < 2 || parts.size() > 3) return make_error("invalid platform '" + text + "'" + form);
    for (const auto& part : parts) {
        if (part.empty()) return make_error("invalid platform '" + text + "': empty component" + form);
        for (char c : part)
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                  c == '.'))
                return make_error("invalid platform '" + text + "': unexpected character '" + std::string(1, c) + "'" +
                                  form);
    }
    Platform p;
    p.os = lower(parts[0]);
    p.architecture = lower(parts[1]);
    p.variant = parts.size() == 3 ? lower(parts[2]) : "";
    // Aliases (x86_64, aarch64) become OCI names; an unspecified arm64 variant stays unspecified here
    // (it matches v8 entries anyway) so that str() gives back what the user wrote.
    for (const auto& a : kAliases) {
        if (p.architecture == a.alias) {
            p.architecture = a.arch;
            if (p.variant.empty() && p.architecture != "arm64") p.variant = a.variant;
            break;
        }
    }
    return p;
}

std::string Platform::str() const {
    std::string s = os + "/" + architecture;
    if (!variant.empty()) s += "/" + variant;
    return s;
}

}  // namespace gantry
