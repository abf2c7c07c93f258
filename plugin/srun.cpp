// The local (srun) context: resolve the image's tag once for the whole step.
#include <string>

#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "options.hpp"
#include "step.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {

void pin_image_digest(spank_t sp, const Settings& settings) {
    JobOptions& o = options();
    if (!o.image || is_local_image_path(*o.image)) return;
    auto ref = parse_reference(*o.image);
    if (!ref || !ref->digest.empty()) return;
    Config config = load_plugin_config(settings);
    // srun waits for this: one quick try, and the nodes resolve the tag themselves when it fails.
    RegistryOptions quick;
    quick.max_attempts = 2;
    RegistryClient client(config, quick);
    auto digest = client.resolve_digest(*ref, Platform::host());
    if (digest) spank_setenv(sp, kDigestVar, digest->c_str(), 1);
}

}  // namespace gantry::plugin
