// CDI specs (YAML or JSON; the first byte picks): parse_cdi_spec and check_cdi_spec, and for a spec
// that passes, cdi_edits over it as the only file in /etc/cdi of a scratch host root, asking for its
// first device, so that the edits (mounts, device nodes, hooks' symlinks) are built from it too.
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>

#include "devices/internal.hpp"
#include "fuzz.hpp"

namespace {
std::string scratch_root() {
    char tmpl[] = "/tmp/gantry-fuzz-cdi-XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    if (dir == nullptr) std::abort();
    std::string root(dir);
    ::mkdir((root + "/etc").c_str(), 0755);
    ::mkdir((root + "/etc/cdi").c_str(), 0755);
    return root;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    if (size == 0) return 0;
    static const std::string root = scratch_root();
    const bool yaml = (data[0] & 1) == 0;
    std::string text(fuzz::text_of(data + 1, size - 1));
    auto doc = devices::parse_cdi_spec("fuzz", text, yaml);
    if (!doc || !devices::check_cdi_spec("fuzz", *doc)) return 0;
    const auto& devs = (*doc)["devices"];
    if (devs.empty()) return 0;
    const std::string file = root + "/etc/cdi/spec" + (yaml ? ".yaml" : ".json");
    {
        std::ofstream out(file, std::ios::trunc | std::ios::binary);
        out << text;
    }
    Config config;
    config.host_root = root;
    auto edits =
        devices::cdi_edits(config, {(*doc)["kind"].get<std::string>() + "=" + devs[0]["name"].get<std::string>()});
    ::unlink(file.c_str());
    if (edits) {
        // Where the container sees each mount and link: absolute paths, as the launcher requires.
        for (const auto& m : edits->mounts) FUZZ_CHECK(!m.path.empty() && m.path[0] == '/');
        for (const auto& l : edits->symlinks) FUZZ_CHECK(!l.path.empty() && l.path[0] == '/');
    }
    return 0;
}
