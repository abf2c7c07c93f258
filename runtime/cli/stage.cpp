// `gantry stage IMAGE`: put an image into the store before the job that needs it runs. It resolves the
// tag with the caller's credentials (so a missing tag or refused credentials are known at once), then
// pulls exactly that digest with `gantry pull` (the same verb, re-executed: one implementation of a
// pull), in the foreground or, with --background, in a detached process of its own.
//
// The plugin runs `gantry stage --at-submit IMAGE` from sbatch/salloc (docs/user.md, "Staged while
// the job waits"), and `gantry stage --at-submit --tag-resolved-to DIGEST IMAGE` from an srun outside
// any job whose allocation is queued (the digest srun resolved for its step): gantry.conf's
// stage_at_submit then decides whether this host stages at all, and the digest on stdout is what the
// job's steps run. A trusted store the caller cannot write is staged by the login node's stage server
// (gantry stage-server, stage_server.cpp), when gantry.conf names its socket (stage_socket): the
// request and the caller's credentials are handed to it.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.hpp"
#include "common.hpp"
#include "gantry/auth.hpp"
#include "gantry/digest.hpp"
#include "gantry/log.hpp"
#include "gantry/reference.hpp"
#include "gantry/registry.hpp"
#include "gantry/spawn.hpp"
#include "gantry/stage_service.hpp"
#include "gantry/strings.hpp"

extern char** environ;

namespace gantry::cli {
namespace {

// Exit statuses (gantry(1)): 0 resolved (and stored, or its pull started), 1 the registry's final no
// (no such tag, credentials refused) or a failed pull, 2 a wrong command line, 3 the registry could not
// be asked from here (unreachable, a server error): the nodes resolve and pull the image themselves.
constexpr int kCouldNotAsk = 3;

struct StageArgs {
    std::string image, store, deadline = "1h", resolved;
    bool background = false, quiet = false, at_submit = false;
    CLI::Option *store_opt = nullptr, *deadline_opt = nullptr, *resolved_opt = nullptr;
};

std::string import_failed(const std::string& image) {
    return "failed to import docker image: " + image;
}

// The registry's final word: the tag does not exist, or these credentials may not have it.
bool final_no(const Error& e) {
    return e.http_status == 404 || e.http_status == 401 || e.http_status == 403;
}

// Where this caller's pull would write, or why it would not (a sentence for --at-submit's note). With
// --at-submit, gantry.conf's stage_at_submit decides: `auto` stages only into a configured store_path
// (shared storage the nodes read too), `yes` also into the per-user store. Either way the store must
// be there already (a login node without the shared file system mounted stages nothing, and says
// nothing) and writable by the caller, or a trusted store with a stage server (gantry.conf
// stage_socket) that fills it as the store account (`via_server`); without one, a trusted store is
// filled by its account on the nodes.
struct StoreToFill {
    std::string root;
    bool via_server = false;
};

Result<StoreToFill> store_to_fill(const Config& config, const StageArgs& a) {
    const std::string root = ImageStore::resolve_path(config, a.store);
    if (a.at_submit && a.store.empty()) {
        if (config.stage_at_submit == "no") return make_error("stage_at_submit = no");
        if (config.store_path.empty() && config.stage_at_submit != "yes")
            return make_error("no store_path (per-user stores are staged only with stage_at_submit = yes)");
        struct stat st {};
        if (root.empty() || ::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            return make_error("the store " + root + " is not on this host");
    }
    auto store = ImageStore::open(root, true, config);
    if (!store) return store.error();
    if (store->trusted(config) && ::access(root.c_str(), W_OK) != 0) {
        // The stage server pulls into store_path only: another store named here is not its business.
        if (!config.stage_socket.empty() && root == config.store_path) return StoreToFill{root, true};
        return make_error("the trusted store " + root + " is filled by its account (" +
                          (config.store_owner.empty() ? std::string("root") : config.store_owner) +
                          ") when the job's first step starts");
    }
    return StoreToFill{root, false};
}

// A trusted store the caller cannot write: the stage server (gantry stage-server, run by the store
// account) pulls `pinned` with the caller's credentials for its registry, in the one hand-over format
// the nodes use. --background and --at-submit return once the request is handed over (the pull goes
// on in the server; if it fails, the job's first step pulls and shows why); otherwise the server's
// answer decides.
int hand_to_stage_server(const StageArgs& a, const Config& config, const ImageReference& ref,
                         const std::string& pinned) {
    StageRequest request;
    request.image = ref.digest.empty() ? a.image + "@" + pinned : a.image;
    request.credentials = encode_credential_hand_over(ref.registry, default_credential_lookup()(ref));
    const bool wait = !a.background && !a.at_submit;
    const auto deadline = wait ? std::chrono::milliseconds(std::chrono::seconds(*parse_duration(a.deadline)))
                               : std::chrono::milliseconds(5000);
    auto said = send_stage_request(config.stage_socket, request, wait, deadline);
    if (!said) {
        if (!a.at_submit) return fail(said.error().wrap("stage: " + a.image));
        log::warning("stage: " + said.error().message + " (the job's first step pulls the image)");
        std::printf("%s\n", pinned.c_str());
        return 0;
    }
    if (!wait) {
        if (!a.quiet && !a.at_submit)
            log::info("stage: " + a.image + ": handed to the stage server at " + config.stage_socket);
        std::printf("%s\n", pinned.c_str());
        return 0;
    }
    if (starts_with(*said, "ok ")) {
        std::printf("%s\n", said->substr(3).c_str());
        return 0;
    }
    std::string why = starts_with(*said, "error ") ? said->substr(6) : *said;
    log::error(import_failed(a.image) + ": " + why + " (the stage server at " + config.stage_socket + ")");
    return kFailed;
}

// The pull itself: this process becomes `gantry pull` of the digest (the tag recorded as resolved to
// it), under a deadline that execve keeps (alarm): SIGALRM ends it, and a later pull resumes what it
// downloaded (the store's staging area).
int exec_pull(const StageArgs& a, const std::string& store, const std::string& digest) {
    std::vector<std::string> argv = {self_program(), "pull", "--store", store};
    if (a.quiet) argv.emplace_back("--quiet");
    if (!digest.empty()) argv.insert(argv.end(), {"--tag-resolved-to", digest});
    argv.push_back(a.image);
    if (a.deadline_opt->count() > 0) {
        // An ignored or blocked SIGALRM (inherited from whoever started us) would end nothing.
        ::signal(SIGALRM, SIG_DFL);
        sigset_t alarm_only;
        sigemptyset(&alarm_only);
        sigaddset(&alarm_only, SIGALRM);
        ::sigprocmask(SIG_UNBLOCK, &alarm_only, nullptr);
        ::alarm(static_cast<unsigned>(*parse_duration(a.deadline)));  // checked by cmd_stage
    }
    std::vector<char*> raw;
    for (auto& s : argv) raw.push_back(s.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    return fail(system_error("stage: running " + argv[0] + " pull"));
}

// --background: the same stage, without resolving again, in a session of its own that is no child of
// ours (the caller -- sbatch, a CI step -- returns at once and may exit), its output discarded: a pull
// that fails here is made again, with its error shown, by the job's first step.
Status start_in_background(const StageArgs& a, const std::string& store, const std::string& digest) {
    ProcessRequest rq;
    rq.argv = {self_program(), "stage", "--quiet", "--store", store, "--deadline", a.deadline};
    if (!digest.empty()) rq.argv.insert(rq.argv.end(), {"--tag-resolved-to", digest});
    rq.argv.push_back(a.image);
    for (char** e = environ; *e != nullptr; ++e) rq.env.emplace_back(*e);  // the caller's credentials and proxies
    rq.own_session = true;
    rq.daemonize = true;
    auto started = start_process(rq);
    if (!started) return started.error().wrap("stage: starting the pull in the background");
    return {};
}

int cmd_stage(const StageArgs& a) {
    auto config = load_config();
    if (!config) return fail(config.error());
    auto ref = parse_reference(a.image);
    if (!ref) return fail(ref.error().wrap(import_failed(a.image)));
    if (ref->names_imported_image()) {
        if (a.at_submit) return 0;  // the store's own name: nothing to fetch
        return usage_error(make_error("stage: " + a.image + " names an imported image, which is in the store already"));
    }
    auto seconds = parse_duration(a.deadline);
    if (!seconds || *seconds <= 0 || *seconds > 7 * 24 * 3600)
        return usage_error(
            make_error("stage: --deadline: expected a duration up to 7d (90s, 15m, 2h), got '" + a.deadline + "'"));
    // At submit, a job whose pull policy is `never` (GANTRY_PULL_POLICY in the submitting environment,
    // which the job inherits, else gantry.conf's) asks the registry nothing: neither does its submission.
    if (a.at_submit) {
        if (config->stage_at_submit == "no") return 0;  // the plugin asks nothing then; nor does this
        auto policy = pull_policy(*config, std::nullopt);
        if (!policy || *policy == PullPolicy::never) return 0;
    }
    // The digest this stage stores: the user's own, the one a previous resolution handed over
    // (--tag-resolved-to: the background half), or the registry's answer now.
    std::string digest = ref->digest.empty() ? a.resolved : std::string();
    if (!digest.empty() && !validate_digest(digest))
        return usage_error(make_error("stage: --tag-resolved-to takes a digest, for an IMAGE without one"));
    if (ref->digest.empty() && digest.empty()) {
        RegistryOptions options;
        if (a.at_submit) options.max_attempts = 2;  // sbatch waits for this: one quick try, as srun's
        RegistryClient client(*config, options);
        auto resolved = client.resolve_digest(*ref, Platform::host());
        if (!resolved) {
            Error e = resolved.error().wrap(import_failed(a.image));
            log::error(e.message);
            return final_no(resolved.error()) ? kFailed : kCouldNotAsk;
        }
        digest = *resolved;
    }
    const std::string pinned = ref->digest.empty() ? digest : ref->digest;
    auto store = store_to_fill(*config, a);
    if (!store) {
        if (!a.at_submit) return fail(store.error().wrap("stage: " + a.image));
        log::info("stage: " + a.image + " resolved to " + pinned + ", not staged here: " + store.error().message);
        std::printf("%s\n", pinned.c_str());
        return 0;
    }
    if (store->via_server) return hand_to_stage_server(a, *config, *ref, pinned);
    if (a.background || a.at_submit) {
        if (auto st = start_in_background(a, store->root, digest); !st) {
            if (!a.at_submit) return fail(st.error());
            log::warning(st.error().message + " (the job's first step pulls the image)");
        }
        std::printf("%s\n", pinned.c_str());
        return 0;
    }
    std::fflush(stdout);
    return exec_pull(a, store->root, digest);
}

VerbRunner define_stage(CLI::App& app) {
    auto a = std::make_shared<StageArgs>();
    a->store_opt =
        app.add_option("--store", a->store, "the store to fill (default: as for gantry pull)")->type_name("DIR");
    app.add_flag("--background", a->background,
                 "resolve, print the digest and return; the pull goes on in a\n"
                 "detached process of its own (output discarded)");
    a->deadline_opt = app.add_option("--deadline", a->deadline,
                                     "end the pull after DURATION (90s, 15m, 2h; default with\n"
                                     "--background: 1h); a later pull resumes its downloads")
                          ->type_name("DURATION");
    app.add_flag("-q,--quiet", a->quiet, "no progress");
    // Hidden (group ""): the plugin's call at submit time, and the background half's digest.
    app.add_flag("--at-submit", a->at_submit)->group("");
    a->resolved_opt = app.add_option("--tag-resolved-to", a->resolved)->group("");
    app.add_option("IMAGE", a->image, "a registry reference")->required();
    return {[a] { return cmd_stage(*a); }, {}};
}

const Registration reg_stage(
    {{"stage", "stage [--background] [--deadline DURATION] [--store DIR] IMAGE   resolve IMAGE now and store it",
      "[OPTIONS] IMAGE",
      "Resolves IMAGE's tag with your credentials (a missing tag or refused credentials fail at once),\n"
      "then pulls that digest into the store, as gantry pull does, and prints '<digest> <path>'. With\n"
      "--background it prints the digest and returns while the pull goes on. For CI pipelines and job\n"
      "scripts that want an image stored before the job that uses it starts; sbatch and salloc do\n"
      "this themselves at submit time (gantry.conf stage_at_submit). A trusted store you cannot write\n"
      "is filled by the login nodes' stage server (gantry.conf stage_socket), which pulls with your\n"
      "credentials as the store account. Exit status 3: the registry could not be asked from this host."},
     define_stage});

}  // namespace
}  // namespace gantry::cli
