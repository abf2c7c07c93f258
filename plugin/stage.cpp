// sbatch and salloc (the allocator context, as the submitting user), and srun when it asks for an
// allocation of its own: the job's image is resolved and staged while the job waits in the queue
// (docs/user.md, "Staged while the job waits"). All the work is `gantry stage --at-submit IMAGE`
// (runtime/cli/stage.cpp): it resolves the tag with the user's credentials (srun hands over the digest
// it resolved for its step instead), starts the pull into the shared store in a detached process of its
// own (or, for a trusted store, hands it to the login node's stage server, gantry.conf stage_socket),
// and prints the digest, which the job's steps then run. Here: Slurm glue, and one line on the user's
// terminal when the registry says the image cannot be had, which fails the submission before a job id
// is allocated.
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/reference.hpp"
#include "gantry/store.hpp"
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

// The submitting user's environment (credentials, proxies, GANTRY_PULL_POLICY) for `gantry stage`,
// with the plugin's gantry.conf.
std::vector<std::string> stage_environment(const Settings& settings) {
    std::vector<std::string> env;
    const bool plugin_config = ::access(settings.config.c_str(), F_OK) == 0;
    for (char** e = environ; *e != nullptr; ++e)
        if (!plugin_config || !starts_with(*e, "GANTRY_CONFIG=")) env.emplace_back(*e);
    if (plugin_config) env.push_back("GANTRY_CONFIG=" + settings.config);
    return env;
}

// `gantry stage --at-submit IMAGE` as the submitting user (this process is theirs: sbatch, salloc or
// srun), in `env` (stage_environment), under a deadline. `resolved`: the digest the caller has resolved
// IMAGE's tag to already (srun's), so that the registry is not asked twice.
Result<ProcessOutcome> run_stage(const Settings& settings, const std::string& image, std::vector<std::string> env,
                                 const std::string& resolved = {}) {
    ProcessRequest rq;
    rq.argv = {gantry_cli(settings), "stage", "--at-submit"};
    if (!resolved.empty()) rq.argv.insert(rq.argv.end(), {"--tag-resolved-to", resolved});
    rq.argv.push_back(image);
    rq.env = std::move(env);
    rq.stdout_cap = rq.stderr_cap = 16 * 1024;
    rq.timeout = kResolveDeadline;
    return spawn(rq);
}

// srun outside any job waits for its allocation inside slurm_allocate_resources_blocking, where no
// SPANK callback runs, and learns it has one in slurm_spank_local_user_init. So the stage is a timer:
// armed in slurm_spank_init_post_opt, it starts `gantry stage` from a thread of its own once srun has
// waited kPendingBeforeStage, and is called off when the allocation comes first. An srun whose nodes
// are free (most of them) thus stages nothing and starts no process: its nodes pull at once, as before,
// where the pull belongs (their bandwidth, and a pull that scancel stops). Slurm's own start of a job
// on idle nodes takes well under a second; a node still completing its previous job adds 1-3 s.
constexpr std::chrono::seconds kPendingBeforeStage{5};

class PendingStage {
public:
    // `env`: srun's environment now (stage_environment), read on srun's own thread: srun writes its
    // environment (SLURM_JOB_ID ...) once the allocation arrives, which may be while the timer fires.
    PendingStage(Settings settings, std::string image, std::string resolved, std::vector<std::string> env)
        : settings_(std::move(settings)),
          image_(std::move(image)),
          resolved_(std::move(resolved)),
          env_(std::move(env)) {
        // The thread takes no signal of srun's (its Ctrl-C, its forwarded signals): they stay srun's
        // main thread's. spawn() gives `gantry stage` an empty mask of its own.
        sigset_t all, old;
        sigfillset(&all);
        ::pthread_sigmask(SIG_SETMASK, &all, &old);
        thread_ = std::thread([this] { run(); });
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    ~PendingStage() { (void)stop(); }
    PendingStage(const PendingStage&) = delete;
    PendingStage& operator=(const PendingStage&) = delete;

    // No stage from now on; waits for one being started (its deadline: kResolveDeadline). Returns what
    // the stage did, for srun's log, or nothing when it never started.
    std::optional<std::string> stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
        return outcome_;
    }

private:
    void run() {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (wake_.wait_for(lock, kPendingBeforeStage, [this] { return stopping_; })) return;
        }
        // Slurm's logging is not called from this thread (srun may be ending): the outcome is logged
        // by stop()'s caller.
        auto r = run_stage(settings_, image_, std::move(env_), resolved_);
        if (!r) {
            outcome_ = "not staged: " + r.error().message;
            return;
        }
        const std::string said = last_line(r->err);
        std::string outcome = r->status == 0 ? "staged" : "not staged (status " + std::to_string(r->status) + ")";
        outcome_ = said.empty() ? outcome : outcome + ": " + said;
    }

    Settings settings_;
    std::string image_, resolved_;
    std::vector<std::string> env_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::optional<std::string> outcome_;  // written by the thread, read after join
    std::thread thread_;
};

std::unique_ptr<PendingStage> g_pending_stage;

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

    auto r = run_stage(settings, *o.image, stage_environment(settings));
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

void stage_for_own_allocation(const Settings& settings, const Config& config, const std::string& image,
                              const std::string& digest) {
    // Inside a job (an salloc shell, a batch script, a task) the nodes are allocated already: the step
    // pulls at once. (`srun --jobid=N` typed outside the job has no SLURM_JOB_ID either; its
    // allocation exists, so local_user_init calls the stage off before it starts.)
    if (!environment().slurm_job_id.empty() || config.stage_at_submit == "no" || g_pending_stage) return;
    // Every warm srun ends here, with a lookup in the store and no thread or process started: the store
    // is not on this host (not mounted here: `gantry stage` refuses that too), or it holds the image
    // already. A directory that is no store yet goes on to `gantry stage`, which makes it one, as
    // sbatch's does.
    const std::string root = ImageStore::resolve_path(config, "");
    struct stat st {};
    if (root.empty() || ::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
    if (auto store = ImageStore::open(root, false, config); store && store->find(digest)) return;
    auto ref = parse_reference(image);
    const bool tag = ref && ref->digest.empty();
    g_pending_stage =
        std::make_unique<PendingStage>(settings, image, tag ? digest : std::string(), stage_environment(settings));
}

void allocation_granted() {
    if (!g_pending_stage) return;
    auto outcome = g_pending_stage->stop();
    g_pending_stage.reset();
    // srun applies -v by now (not yet in init_post_opt), so `srun -v` shows what the stage did.
    if (outcome) slurm_verbose("gantry: while the job waited for its nodes: %s", outcome->c_str());
}

}  // namespace gantry::plugin
