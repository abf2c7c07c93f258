// The image pulls of a step, run from slurmstepd as the job user (and, into a trusted store, as the
// store owner): never as root, each through spawn() with capped output, each answering with a typed
// report (include/gantry/pull_report.hpp). See docs/store.md for the trust model.
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gantry/auth.hpp"
#include "gantry/authorization_cache.hpp"
#include "gantry/digest.hpp"
#include "gantry/environment.hpp"
#include "gantry/files.hpp"
#include "gantry/reference.hpp"
#include "gantry/store.hpp"
#include "gantry/strings.hpp"
#include "step_internal.hpp"

namespace gantry::plugin {
namespace {

// Runs argv as the job user (never as root: the pull parses registry bytes, and credentials must be
// read with the user's identity), through spawn() (include/gantry/spawn.hpp): an explicit
// environment, only the descriptors named here, every output capped (a program that writes more, e.g.
// through an LD_PRELOAD in the job's environment, is killed: slurmstepd's memory stays bounded).
// With `userns_fd`, the program also enters that user namespace (one the job user owns) after
// dropping to the user, so that it sees the container's files as the container does (FUSE mounts made
// inside the container refuse callers from outside its user namespace); `root_of` (a "/proc/PID/root"
// in that namespace) is then opened as descriptor kRootFd, reachable as /proc/self/fd/<kRootFd>/ by
// the program after it lost the namespace's capabilities in execve.
// With `fd3_in`, that descriptor is the program's fd 3 (credentials handed to the store owner's pull);
// with `fd3_out`, what the program writes to its fd 3 is collected there (the job user's half hands the
// credentials back this way): a pipe, never argv, the environment or a file. With `report`, what it
// writes to its fd 4 (`gantry pull --report-fd 4`, include/gantry/pull_report.hpp) is collected there.
// With `stop_when_step_signalled` (the pulls), the program is killed, process group and all, as soon
// as Slurm asks to signal or end this step (see StepSignals): slurmstepd holds such a request until the
// tasks run, and they run only after this returns.
constexpr int kRootFd = 200;
constexpr int kCredentialsFd = kHandOverCredentialsFd;
constexpr int kReportFd = kHandOverReportFd;
constexpr size_t kMaxCaptured = 64 * 1024;
struct RunOptions {
    int userns_fd = -1;
    std::string root_of;
    int fd3_in = -1;
    std::string* fd3_out = nullptr;
    std::string* report = nullptr;
    bool stop_when_step_signalled = false;
};
using Captured = ProcessOutcome;
Result<Captured> run_as_user(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
                             const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const RunOptions& opts = {}) {
    ProcessRequest rq;
    rq.argv = argv;
    rq.env = env;
    rq.identity = ProcessIdentity{uid, gid, groups};
    rq.userns_fd = opts.userns_fd;
    rq.root_of = opts.root_of;
    rq.root_as = kRootFd;
    rq.stdout_cap = rq.stderr_cap = kMaxCaptured;
    if (opts.fd3_in >= 0) rq.inputs.push_back({opts.fd3_in, kCredentialsFd});
    if (opts.fd3_out != nullptr) rq.outputs.push_back({kCredentialsFd, opts.fd3_out, kMaxCaptured, "credentials pipe"});
    if (opts.report != nullptr) rq.outputs.push_back({kReportFd, opts.report, kMaxPullReportBytes, "report"});
    auto& watch = state().signals;
    if (opts.stop_when_step_signalled && watch) rq.should_stop = [&watch] { return watch->pending(); };
    auto r = spawn(rq);
    if (!r && starts_with(r.error().message, "could not run "))
        return make_error(r.error().message + " (set gantry= in plugstack.conf)");
    return r;
}

// The node's memory of the registry's recent yes per user and digest (include/gantry/authorization_cache.hpp),
// in root's runtime directory; none when authorization_cache_seconds is 0 or the directory is unusable
// (then every step asks the registry, as without it).
std::optional<AuthorizationCache> authorization_cache(const Config& config) {
    if (config.authorization_cache_seconds <= 0) return std::nullopt;
    (void)make_directories(config.runtime_path, 0755);  // root's node-local runtime directory, as the launcher makes it
    auto cache = AuthorizationCache::open(config.runtime_path + "/authorized");
    if (!cache) {
        log::warning("the registry's answers are not remembered on this node: " + cache.error().message);
        return std::nullopt;
    }
    return std::move(*cache);
}

// What a pull would report for `digest` when the trusted store holds it in a form this step can run
// (`whole`: not as layers): its config from the store's own record. Root only looks: the store is
// trusted (root's or store_owner's, writable by nobody else), and acquire_image checks the files again.
std::optional<PullReport> stored_report(const Config& config, const std::string& digest, bool whole) {
    auto store = ImageStore::open(config.store_path, false, config);
    if (!store || !store->trusted(config)) return std::nullopt;
    auto image = store->find(digest);
    if (!image || (whole && image->layered())) return std::nullopt;
    PullReport report;
    report.digest = digest;
    report.squashfs_path =
        image->layered() ? store->root() + "/images/" + digest_hex(digest) + ".json" : image->squashfs_path;
    report.config_json = image->metadata.config_json;
    report.outcome = "stored";
    return report;
}

}  // namespace

// A program of ours: beside the configured gantry CLI, else in the build tree next to this plugin, else
// where the package installs it.
std::string helper_path(const Settings& settings, const std::string& name, const char* installed) {
    if (!settings.gantry.empty() && name != "gantry") {
        // Beside the CLI plugstack's `gantry=` names (a build tree), or in the libexec directory of its
        // prefix (an installed or relocated tree: PREFIX/bin/gantry, PREFIX/libexec/gantry/NAME).
        std::string dir = settings.gantry.substr(0, settings.gantry.rfind('/'));
        for (const std::string& candidate : {dir + "/" + name, dir + "/../libexec/gantry/" + name})
            if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&helper_path), &info) != 0 && info.dli_fname != nullptr) {
        std::string self = info.dli_fname;
        std::string candidate = self.substr(0, self.rfind('/')) + "/../runtime/" + name;
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return installed;
}

// The gantry CLI: plugstack `gantry=`, else ours beside this plugin or as installed.
std::string gantry_cli(const Settings& settings) {
    if (!settings.gantry.empty()) return settings.gantry;
    return helper_path(settings, "gantry", GANTRY_CLI_INSTALL_PATH);
}

// The job user's account entry: home directory (their per-user store) and name.
Result<passwd> account_of(uid_t uid, std::vector<char>& buf) {
    buf.assign(16384, '\0');
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
        return make_error("uid " + std::to_string(uid) + " has no account entry on this node");
    return pw;
}

// The store the job's pull uses: gantry.conf's store_path, else the job user's own store below the
// home directory in the account database (never slurmstepd's environment, which is root's, and never
// /tmp, where any user could have made it first).
Result<std::string> job_store_path(const Config& config, uid_t uid) {
    if (!config.store_path.empty()) return config.store_path;
    std::vector<char> buf;
    auto pw = account_of(uid, buf);
    if (!pw) return pw.error().wrap("finding the job user's image store");
    std::string home = pw->pw_dir != nullptr ? pw->pw_dir : "";
    while (home.size() > 1 && home.back() == '/') home.pop_back();
    if (home.empty() || home[0] != '/' || home == "/")
        return make_error("the job user's home directory ('" + home +
                          "') cannot hold a per-user image store; set store_path in gantry.conf");
    return home + "/.cache/gantry";
}

// The outcome of a `gantry pull` run by the plugin, from its typed report (never from what it printed):
// a line a user can act on, or the report of a successful pull.
Result<PullReport> pull_outcome(const Captured& r, const std::string& report_text, const std::string& image,
                                const std::string& who) {
    if (r.stopped) {
        // What is downloaded stays in the store's staging area: the next pull of the image resumes it.
        return make_error(import_failed(image) + ": the step was cancelled or signalled while " +
                          "its image was being pulled; the pull on this node was stopped (a later pull resumes it)");
    }
    if (r.signal != 0) {
        // Killed (OOM killer, an admin, a dying node): it printed nothing useful, so say what happened.
        // Its staging area stays for whoever takes over the image next.
        return make_error(import_failed(image) + ": gantry pull" + who + " on this node was killed by signal " +
                          std::to_string(r.signal) + " (" + strsignal(r.signal) + ")");
    }
    auto report = decode_pull_report(report_text);
    if (!report) {
        std::string said = last_line(r.err);
        return make_error(import_failed(image) + ": gantry pull" + who + " exited with status " +
                          std::to_string(r.status) + " and no usable report (" + report.error().message + ")" +
                          (said.empty() ? "" : "; it said: " + said.substr(0, 300)));
    }
    if (report->error != PullErrorKind::none) return make_error(report->message);
    if (r.status != 0)
        return make_error(import_failed(image) + ": gantry pull" + who + " exited with status " +
                          std::to_string(r.status));
    return *report;
}

// Pulls a registry image as the job user into `store_root` (gantry.conf's store_path or the user's own
// store). Everything it reports (digest, file, config) is the user's word: the image is served only
// unprivileged (squashfuse in the user's namespace), never kernel-mounted.
Result<PullReport> pull_as_user(const Settings& settings, const JobIdentity& id, const std::string& store_root,
                                const std::string& image, const std::string& resolved, std::vector<std::string> env,
                                bool whole) {
    std::vector<std::string> argv = {gantry_cli(settings),      "pull",    "--quiet", "--report-fd",
                                     std::to_string(kReportFd), "--store", store_root};
    if (whole) argv.push_back("--whole");
    // The user's own pull fetches srun's digest and records the tag as the user's resolution of it.
    if (!resolved.empty()) argv.insert(argv.end(), {"--tag-resolved-to", resolved});
    argv.push_back(image);
    if (::access(settings.config.c_str(), F_OK) == 0) env.push_back("GANTRY_CONFIG=" + settings.config);
    // The nodes of this step share a failed producer's error instead of each retrying the same pull
    // in turn (runtime/store/pull.cpp); a killed producer is still taken over.
    env.push_back("GANTRY_PULL_GROUP=" + std::to_string(id.jobid) + "." + std::to_string(id.stepid));
    std::string report;
    RunOptions run;
    run.report = &report;
    run.stop_when_step_signalled = true;
    auto r = run_as_user(id.uid, id.gid, id.groups, argv, env, run);
    if (!r) return r.error().wrap(import_failed(image));
    return pull_outcome(*r, report, image, "");
}

std::optional<HolderWithImage> acquire_stored_as_user(const Settings& settings, const Config& config,
                                                      const JobIdentity& id, const std::string& store_root,
                                                      const std::string& image, const std::string& resolved, bool whole,
                                                      bool in_holder) {
    // The registry vouches for every use of a private_images store's image: always a pull there.
    if (config.private_images) return std::nullopt;
    const auto ref = parse_reference(image);
    if (!ref) return std::nullopt;
    const std::string digest = resolved.empty() ? ref->digest : resolved;
    if (digest.empty()) return std::nullopt;  // a tag srun did not resolve: the pull resolves it
    // The same decision a pull of the pinned digest makes (runtime/store/pull.cpp, stored_digest): the
    // store's own copy, by the owner rule of the user's helper (root's, store_owner's or the user's own
    // files, on descriptors it checked); never the registry for a digest, whatever the pull policy.
    const std::string holder = helper_path(settings, "gantry-holder", GANTRY_HOLDER_INSTALL_PATH);
    const std::string tag = resolved.empty() ? "" : image;
    const auto limit = std::chrono::seconds(config.check_timeout_seconds);
    auto stop = [] { return state().signals && state().signals->pending(); };
    // Only root starts a holder for a job user (a root job's container is set up as root throughout).
    in_holder = in_holder && id.uid != 0 && ::geteuid() == 0;
    auto acquired = in_holder ? start_holder_acquiring(
                                    holder, HolderAcquisition{store_root, digest, id.uid, id.gid, tag}, limit, stop)
                              : [&]() -> Result<HolderWithImage> {
        auto image =
            acquire_image_as(ProcessIdentity{id.uid, id.gid, id.groups}, holder, store_root, digest, limit, stop, tag);
        if (!image) return image.error();
        return HolderWithImage{nullptr, std::move(*image)};
    }();
    if (!acquired) {
        log::debug("no stored image " + digest + " to use without a pull: " + acquired.error().message);
        return std::nullopt;
    }
    // A layered copy serves only a step whose pull would take layers (gantry pull: layered_images, a
    // backend that stacks); the others get the whole file a pull makes from the layers. (A holder
    // started for it goes with `acquired`: killed and reaped.)
    const bool takes_layers = !whole && config.layered_images && config.mount_backend != "extract";
    if (!acquired->image.reported || (acquired->image.layered && !takes_layers)) return std::nullopt;
    return std::move(*acquired);
}

// Pulls into a trusted store (owned by root or gantry.conf's store_owner, not writable by the job
// user): its images may be kernel-mounted, so what the plugin serves must not depend on anything the
// job user controls, and root must not parse registry bytes. Two halves:
//  1. as the job user: `gantry pull --credentials-only` looks up the user's credentials for the
//     image's registry (the user's files, helpers and identity) and hands them back on a pipe;
//  2. always (cached or not), as the store owner in a clean environment: `gantry pull` of the image
//     with exactly those credentials (on a pipe: never argv, the environment or a file; never the
//     account's own credential files). It asks the registry for the manifest with the user's
//     credentials, so the registry decides whether THIS user may have the image (docs/store.md,
//     "Private images are not handed to users who cannot pull them"), converts it if it is not stored
//     yet, and its report -- digest, file, config -- comes from a process the job user cannot trace,
//     preload into or otherwise tamper with. Forged credentials only get the registry's 401.
//
// A digest-pinned image (the user's own IMAGE@DIGEST, or srun's resolution of the tag) that the registry
// let this user have on this node less than authorization_cache_seconds ago is served from the store
// without the two halves: the registry is asked at most once per user, digest, node and period.
Result<PullReport> pull_into_trusted_store(const Settings& settings, const Config& config, const JobIdentity& id,
                                           std::string image, const std::string& resolved, std::vector<std::string> env,
                                           bool whole) {
    // srun's digest as IMAGE@DIGEST: the store account records no tag from it (its records count for
    // every user of the store, and the digest is this user's word).
    if (!resolved.empty()) image += "@" + resolved;
    const auto cache = authorization_cache(config);
    const auto ref = parse_reference(image);
    const std::string pinned = ref ? ref->digest : "";
    if (cache && !pinned.empty() &&
        cache->fresh(id.uid, pinned, std::chrono::seconds(config.authorization_cache_seconds)))
        if (auto stored = stored_report(config, pinned, whole)) return *stored;
    bool have_config = ::access(settings.config.c_str(), F_OK) == 0;
    std::vector<std::string> argv = {gantry_cli(settings),           "pull",
                                     "--credentials-only",           "--credentials-out-fd",
                                     std::to_string(kCredentialsFd), image};
    if (have_config) env.push_back("GANTRY_CONFIG=" + settings.config);
    std::string credentials;
    RunOptions run;
    run.fd3_out = &credentials;
    run.stop_when_step_signalled = true;
    auto r = run_as_user(id.uid, id.gid, id.groups, argv, env, run);
    if (!r) return r.error().wrap(import_failed(image));
    if (r->stopped || r->signal != 0) return pull_outcome(*r, "", image, "").error();
    if (r->status != 0) {
        std::string why = last_line(r->err);
        if (starts_with(why, "gantry: ")) why = why.substr(8);
        return make_error(import_failed(image) + ": looking up your registry credentials: " +
                          (why.empty() ? "gantry pull --credentials-only failed" : why.substr(0, 300)));
    }

    // The store owner's identity, from the account database like the job user's.
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* owner = nullptr;
    if (::getpwnam_r(config.store_owner.c_str(), &pw, buf.data(), buf.size(), &owner) != 0 || owner == nullptr)
        return make_error(import_failed(image) + ": store_owner '" + config.store_owner +
                          "' is not an account on this node");
    const std::vector<gid_t> groups = user_identity(owner->pw_uid, owner->pw_gid).groups;

    // The credentials on a pipe (hand_over_pipe: slurmstepd never waits on a reader that has not
    // started), the store account's pull as the stage server runs it (auth.hpp, one recipe).
    auto read_end = hand_over_pipe(credentials);
    if (!read_end) return read_end.error().wrap(import_failed(image));
    // Proxies are the site's network path, not code: the pull needs them where the user's half did.
    std::map<std::string, std::string> proxies;
    for (const char* name : kProxyVariables)
        if (auto v = find_env(env, name)) proxies.emplace(name, *v);
    const std::vector<std::string> owner_argv =
        store_owner_pull_argv(gantry_cli(settings), config.store_path, image, whole);
    const std::vector<std::string> owner_env = store_owner_pull_environment(
        owner->pw_dir, owner->pw_name, have_config ? settings.config : "", proxies,
        {"GANTRY_PULL_GROUP=" + std::to_string(id.jobid) + "." + std::to_string(id.stepid)});
    std::string report;
    RunOptions owner_run;
    owner_run.fd3_in = read_end->get();
    owner_run.report = &report;
    owner_run.stop_when_step_signalled = true;
    auto o = run_as_user(owner->pw_uid, owner->pw_gid, groups, owner_argv, owner_env, owner_run);
    if (!o) return o.error().wrap(import_failed(image));
    auto pulled = pull_outcome(*o, report, image, " (as " + config.store_owner + ")");
    // The store account's pull asked the registry with the user's credentials (--credentials-fd: every
    // time, whatever the policy) and reports the digest it was let have: the only writer of the cache.
    if (cache) {
        if (pulled)
            cache->remember(id.uid, pulled->digest);
        else if (!pinned.empty())
            cache->forget(id.uid, pinned);
    }
    return pulled;
}

}  // namespace gantry::plugin
