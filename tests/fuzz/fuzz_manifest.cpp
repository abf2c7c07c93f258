// Manifests and indexes from a registry: parse_manifest under each Content-Type a registry may send
// (the first byte picks it), then platform selection over the index, and Platform::parse.
#include "fuzz.hpp"
#include "gantry/registry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    static const char* const kTypes[] = {kMediaOciManifest,
                                         kMediaOciIndex,
                                         kMediaDockerManifest,
                                         kMediaDockerList,
                                         "",
                                         "application/json; charset=utf-8"};
    if (size == 0) return 0;
    const char* type = kTypes[data[0] % (sizeof kTypes / sizeof kTypes[0])];
    auto body = fuzz::text_of(data + 1, size - 1);
    auto m = parse_manifest(body, type);
    if (m && m->kind == ParsedManifest::Kind::index) {
        for (const auto& e : m->entries)
            if (e.platform) (void)Platform::parse(e.platform->str());
        (void)select_platform(*m, Platform{"linux", "amd64", ""});
        (void)select_platform(*m, Platform{"linux", "arm64", "v8"});
    }
    if (size < 256) (void)Platform::parse(std::string(body));
    return 0;
}
