// The local (srun) context: what the user sees before the step starts, and the image's tag resolved
// once for the whole step. srun's stderr is the user's terminal, so a line written here is shown once
// per step, whatever the number of nodes and tasks.
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <memory>
#include <string>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/import_watch.hpp"
#include "gantry/pull.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "gantry/strings.hpp"
#include "gantry/trace.hpp"
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

// Whether the nodes' pulls would ask the registry what the tag names now, so that asking once here
// saves them the request: under `always` (the default) every pull asks; under `missing` only a pull
// the registry must authorise (a trusted store's, private_images), and under `never` none. The policy
// comes from srun's own environment (GANTRY_PULL_POLICY), which is the job's: the nodes' pulls see the
// same one.
bool nodes_would_resolve(const Config& config) {
    const std::string& env = environment().gantry_pull_policy.value;
    auto policy = parse_pull_policy(!env.empty() ? env : config.pull_policy);
    if (!policy) return false;  // the nodes report the bad policy, in their own words
    const bool registry_authorizes =
        config.private_images || (!config.store_owner.empty() && !config.store_path.empty());
    return *policy == PullPolicy::always || (*policy == PullPolicy::missing && registry_authorizes);
}

}  // namespace

// The step's image as srun resolved it, "IMAGE@DIGEST" in the job environment (kResolvedVar): the
// digest, if the variable names exactly the image the step asks for.
//
// Trust: the variable is user input. srun runs as the user, whose environment it is (and who can run
// srun without this plugin's local half, handing the options and any variable to slurmstepd). So the
// nodes use it exactly as if the user had written IMAGE@DIGEST themselves, and that changes nothing:
// into the user's own or an open store the user's own pull fetches that digest with their rights; into
// a trusted store the store account's pull asks the registry for that digest with the user's
// credentials (pull_into_trusted_store), or finds a yes the registry gave this very user for this very
// digest (AuthorizationCache, written only from the store account's report). A digest the user may not
// read is refused either way, and a digest of another image than the tag's only runs what the user
// could have named by digest.
std::optional<std::string> image_resolved_by_srun(const std::vector<std::string>& env, const std::string& image) {
    auto value = find_env(env, kResolvedVar);
    if (!value || value->size() <= image.size() + 1 || !starts_with(*value, image + "@")) return std::nullopt;
    std::string digest = value->substr(image.size() + 1);
    if (!validate_digest(digest)) return std::nullopt;
    return digest;
}

Status pin_image_digest(spank_t, const Settings& settings) {
    JobOptions& o = options();
    // Handed over in srun's own environment, which srun copies into the step's when it launches it:
    // spank_setenv/unsetenv answer ESPANK_NOT_REMOTE here (they edit slurmstepd's copy, on the nodes),
    // which left every node resolving the tag again (81 manifest requests per 80-node step).
    // The variables say what this srun resolved, or nothing: a value inherited from elsewhere (an outer
    // step's tasks, the user's shell) never reaches the nodes from here.
    unset_environment_variable(kResolvedVar);
    unset_environment_variable(kSrunDirVar);
    if (o.image && is_local_image_path(*o.image) && (*o.image)[0] == '.') {
        // A relative squashfs path is srun's directory's (the step's, unless --chdir): the nodes
        // learn which directory that is from here (stepd.cpp); srun's own PWD may be stale.
        std::string cwd(PATH_MAX, '\0');
        if (::getcwd(cwd.data(), cwd.size()) != nullptr) set_environment_variable(kSrunDirVar, cwd.c_str());
    }
    if (!o.image || is_local_image_path(*o.image)) return {};
    // With --container-name, an existing container may make the image irrelevant (it is not imported
    // again): the nodes know, srun does not, so node 0 tells the user instead (join_step). The tag is
    // still resolved here: a node that creates the container needs it, and it is one request per step.
    bool named = o.name.has_value();
    Config config = load_plugin_config(settings);
    if (!named && config.import_messages) tell_user("gantry: importing docker image: " + *o.image);
    auto ref = parse_reference(*o.image);
    if (!ref) return {};  // a bad name is reported by the nodes, in Pyxis's words
    if (!ref->digest.empty()) {
        stage_for_own_allocation(settings, config, *o.image, ref->digest);  // outside any job only
        if (!named) watch_import(config, ref->digest, *o.image);
        return {};
    }
    // Imported names (local/NAME) are the store's alone, and a policy under which the nodes answer
    // from their store asks nothing here either.
    if (ref->names_imported_image() || !nodes_would_resolve(config)) return {};
    // Inside a job that sbatch/salloc staged this image for (stage.cpp): the digest resolved at submit,
    // which the store holds or is fetching, so that every step of the job runs what was staged.
    if (auto staged = image_staged_at_submit(*o.image)) {
        const std::string pinned = *o.image + "@" + *staged;
        set_environment_variable(kResolvedVar, pinned);
        if (!named) watch_import(config, *staged, *o.image);
        return {};
    }
    // srun waits for this: one quick try, with the user's own credentials (srun runs as the user), and
    // the nodes resolve the tag themselves, as without this, when it fails.
    RegistryOptions quick;
    quick.max_attempts = 2;
    RegistryClient client(config, quick);
    auto digest = [&] {
        gantry::trace::Phase phase("srun resolve_digest");  // the registry round trip (bench/srun.sh --breakdown)
        return client.resolve_digest(*ref, Platform::host());
    }();
    if (digest) {
        const std::string pinned = *o.image + "@" + *digest;
        set_environment_variable(kResolvedVar, pinned);
        stage_for_own_allocation(settings, config, *o.image, *digest);  // outside any job only
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

void stop_import_watch() {
    g_import_watch.reset();
}

void clear_resolved_image() {
    unset_environment_variable(kResolvedVar);
}

}  // namespace gantry::plugin
