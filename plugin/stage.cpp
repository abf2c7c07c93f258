// sbatch and salloc (the allocator context, as the submitting user): the job's image is resolved and
// staged while the job waits in the queue (docs/user.md, "Staged while the job waits"). All the work
// is `gantry stage --at-submit IMAGE` (runtime/cli/stage.cpp): it resolves the tag with the user's
// credentials, starts the pull into the shared store in a detached process of its own (or, for a
// trusted store, hands it to the login node's stage server, gantry.conf stage_socket), and prints the
// digest, which the job's steps then run. Here: Slurm glue, and one line on the user's terminal when
// the registry says the image cannot be had, which fails the submission before a job id is allocated.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"
#include "options.hpp"
#include "step.hpp"
#include "step_internal.hpp"

extern char** environ;

namespace gantry::plugin {
namespace {

// sbatch waits for the resolution (the pull itself is detached): a registry that does not answer
// within this leaves the job to resolve and pull on its nodes, as without staging.
constexpr std::chrono::seconds kResolveDeadline{60};

void tell_user(const std::string& line) {
    std::string text = line + "\n";
    (void)!::write(STDERR_FILENO, text.data(), text.size());
}

// `gantry stage --at-submit IMAGE` as the submitting user (this process is theirs: sbatch or salloc),
// in their own environment (credentials, proxies, GANTRY_PULL_POLICY), with the plugin's gantry.conf,
// under a deadline.
Result<ProcessOutcome> run_stage(const Settings& settings, const std::string& image) {
    ProcessRequest rq;
    rq.argv = {gantry_cli(settings), "stage", "--at-submit", image};
    const bool plugin_config = ::access(settings.config.c_str(), F_OK) == 0;
    for (char** e = environ; *e != nullptr; ++e)
        if (!plugin_config || !starts_with(*e, "GANTRY_CONFIG=")) rq.env.emplace_back(*e);
    if (plugin_config) rq.env.push_back("GANTRY_CONFIG=" + settings.config);
    rq.stdout_cap = rq.stderr_cap = 16 * 1024;
    rq.timeout = kResolveDeadline;
    return spawn(rq);
}

}  // namespace

// The image sbatch/salloc resolved (and staged) for this job, "IMAGE@DIGEST" in the job's environment:
// the digest, for an srun inside the job asking for exactly that image. Trust: the variable is user
// input and is used only as IMAGE@DIGEST written by the user would be (see image_resolved_by_srun).
std::optional<std::string> image_staged_at_submit(const std::string& image) {
    const Environment& env = environment();
    if (env.slurm_job_id.empty() || !env.gantry_staged_image.set) return std::nullopt;
    const std::string& staged = env.gantry_staged_image.value;
    if (staged.size() <= image.size() + 1 || !starts_with(staged, image + "@")) return std::nullopt;
    std::string digest = staged.substr(image.size() + 1);
    if (!validate_digest(digest)) return std::nullopt;
    return digest;
}

Status stage_at_submit(spank_t, const Settings& settings) {
    // Only what this submission resolved reaches the job from here, never a value of the shell's.
    unset_environment_variable(kStagedVar);
    const JobOptions& o = options();
    if (!o.image || is_local_image_path(*o.image)) return {};
    Config config = load_plugin_config(settings);
    if (config.stage_at_submit == "no") return {};

    auto r = run_stage(settings, *o.image);
    if (!r) {
        slurm_verbose("gantry: not staging %s at submit: %s", o.image->c_str(), r.error().message.c_str());
        return {};
    }
    const std::string said = last_line(r->err);
    if (r->status == 0) {
        std::string digest = r->out.substr(0, r->out.find('\n'));
        if (!validate_digest(digest)) return {};  // nothing resolved (an imported name, policy `never`)
        auto ref = parse_reference(*o.image);
        // The batch step takes the digest as srun's (GANTRY_RESOLVED_IMAGE, stepd.cpp), the job's
        // sruns as the submission's (GANTRY_STAGED_IMAGE, srun.cpp): the job runs what was staged.
        const std::string pinned = *o.image + "@" + digest;
        if (ref && ref->digest.empty()) {
            set_environment_variable(kResolvedVar, pinned);
            set_environment_variable(kStagedVar, pinned);
        }
        if (!said.empty()) slurm_verbose("%s", said.c_str());
        return {};
    }
    // Status 1: the registry's final no (no such tag, credentials refused), already worded as Pyxis
    // words it. With --container-name an existing container might not need the image: the nodes decide.
    if (r->status == 1 && !o.name && starts_with(said, "gantry: " + import_failed(*o.image))) {
        tell_user(said);
        return make_error(said.substr(8));
    }
    // Anything else (the registry unreachable from here, a slow answer): the nodes resolve and pull.
    slurm_verbose("gantry: not staging %s at submit (status %d): %s", o.image->c_str(), r->status, said.c_str());
    return {};
}

}  // namespace gantry::plugin
