// The local (srun) context: what the user sees before the step starts, and the image's tag resolved
// once for the whole step. srun's stderr is the user's terminal, so a line written here is shown once
// per step, whatever the number of nodes and tasks.
#include <unistd.h>

#include <climits>

#include <string>

#include <memory>

#include "gantry/import_watch.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "options.hpp"
#include "step.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {
namespace {

void tell_user(const std::string& line) {
    std::string text = line + "\n";
    (void)!::write(STDERR_FILENO, text.data(), text.size());
}

// srun's progress lines while the nodes import the image (one per step: srun is one process).
std::unique_ptr<ImportWatch> g_import_watch;

void watch_import(const Config& config, const std::string& digest, const std::string& image) {
    if (!config.import_messages || config.import_progress_seconds <= 0) return;
    auto store = job_store_path(config, ::getuid());  // srun runs as the user: the store the nodes use for them
    if (!store) return;
    g_import_watch = std::make_unique<ImportWatch>(*store, config, digest, image,
                                                   std::chrono::seconds(config.import_progress_seconds),
                                                   [](const std::string& line) { tell_user("gantry: " + line); });
}

}  // namespace

Status pin_image_digest(spank_t sp, const Settings& settings) {
    JobOptions& o = options();
    if (o.image && is_local_image_path(*o.image) && (*o.image)[0] == '.') {
        // A relative squashfs path is srun's directory's (the step's, unless --chdir): the nodes
        // learn which directory that is from here (stepd.cpp); srun's own PWD may be stale.
        std::string cwd(PATH_MAX, '\0');
        if (::getcwd(cwd.data(), cwd.size()) != nullptr) spank_setenv(sp, kSrunDirVar, cwd.c_str(), 1);
    }
    if (!o.image || is_local_image_path(*o.image)) return {};
    // With --container-name, an existing container may make the image irrelevant (it is not imported
    // again): the nodes know, srun does not, so node 0 tells the user instead (join_step).
    bool named = o.name.has_value();
    Config config = load_plugin_config(settings);
    if (!named && config.import_messages) tell_user("gantry: importing docker image: " + *o.image);
    auto ref = parse_reference(*o.image);
    if (!ref) return {};  // a bad name is reported by the nodes, in Pyxis's words
    if (!ref->digest.empty()) {
        if (!named) watch_import(config, ref->digest, *o.image);
        return {};
    }
    // srun waits for this: one quick try, and the nodes resolve the tag themselves when it fails.
    RegistryOptions quick;
    quick.max_attempts = 2;
    RegistryClient client(config, quick);
    auto digest = client.resolve_digest(*ref, Platform::host());
    if (digest) {
        spank_setenv(sp, kDigestVar, digest->c_str(), 1);
        if (!named) watch_import(config, *digest, *o.image);
        return {};
    }
    // The registry's final word that the tag does not exist: every node would ask again and every
    // task print the same error, so the step ends here, with one request and one line. Anything else
    // (unreachable from the login node, credentials only the nodes have) is left to the nodes.
    if (digest.error().http_status == 404 && !named) {
        Error e = digest.error().wrap(import_failed(*o.image));
        tell_user("gantry: " + e.message);
        return e;
    }
    return {};
}

void stop_import_watch() { g_import_watch.reset(); }

}  // namespace gantry::plugin
