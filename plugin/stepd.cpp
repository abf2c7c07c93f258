// The remote (slurmstepd, root) context of a step: pull the image as the job user and create the
// step's container once per node (prepare_step), stop it after the last local task (task_exited,
// finish_step, with --container-save). Slurm glue over the launcher library and pull.cpp.
#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gantry/acquire.hpp"
#include "gantry/devices.hpp"
#include "gantry/digest.hpp"
#include "gantry/dropins.hpp"
#include "gantry/fabric_check.hpp"
#include "gantry/files.hpp"
#include "gantry/image_config.hpp"
#include "gantry/launcher.hpp"
#include "gantry/mounts.hpp"
#include "gantry/reference.hpp"
#include "gantry/run_request.hpp"
#include "gantry/store.hpp"
#include "gantry/strings.hpp"
#include "gantry/trace.hpp"
#include "gantry/workdir.hpp"
#include "options.hpp"
#include "step.hpp"
#include "step_internal.hpp"
#include "telemetry.hpp"

namespace gantry::plugin {
namespace {

// Whether a step's process is in the container now (Pyxis: the container "is running"): a process
// in its mount namespace other than the holder and the holder's own children (image servers,
// ldconfig). Root (init_post_opt) reads other processes' namespace links; a process that exits
// meanwhile is skipped.
bool has_step_processes(const ContainerState& c) {
    auto link = [](const std::string& path) {
        char buf[64];
        ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
        return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    };
    std::string holder_mnt = link("/proc/" + std::to_string(c.holder_pid) + "/ns/mnt");
    if (holder_mnt.empty()) return false;
    DIR* d = ::opendir("/proc");
    if (!d) return false;
    bool found = false;
    while (dirent* e = ::readdir(d)) {
        char* end = nullptr;
        long pid = std::strtol(e->d_name, &end, 10);
        if (pid <= 0 || *end != '\0' || pid == c.holder_pid) continue;
        std::string dir = std::string("/proc/") + e->d_name;
        if (link(dir + "/ns/mnt") != holder_mnt) continue;
        // The holder's children are part of the container's machinery, not a step.
        std::string status = try_read_file(dir + "/status").value_or("");
        auto at = status.find("\nPPid:\t");
        if (at != std::string::npos && std::strtol(status.c_str() + at + 7, nullptr, 10) == c.holder_pid) continue;
        found = true;
        break;
    }
    ::closedir(d);
    return found;
}

// `--container-unshare` on an existing container: it cannot gain a namespace it was made without.
Status check_unshare_of_existing(const JobOptions& o, const ContainerState& c) {
    if (!o.unshare) return {};
    auto want = parse_unshare(*o.unshare);
    if (!want) return want.error();
    // Pyxis's wording, which scripts may grep for.
    const std::string what = "--container-unshare=" + *o.unshare + ": container " + *o.name;
    if (want->net && !c.unshare.net) return make_error(what + " is not in a separate network namespace");
    if (want->ipc && !c.unshare.ipc) return make_error(what + " is not in a separate IPC namespace");
    if (want->uts && !c.unshare.uts) return make_error(what + " is not in a separate UTS namespace");
    return {};
}

// `--container-remap-root` on an existing container made without it: its user namespace maps the
// user's own id alone, fixed when it was made, so the step would run as the user and fail later
// (`mount`: "drop permissions failed"). Said now instead. The other way round (`--no-container-remap-root`
// on one made with it) the step runs as the user (JoinOptions::as_user), as Pyxis's sshd example needs.
Status check_remap_root_of_existing(const JobOptions& o, const ContainerState& c) {
    if (!o.remap_root || !*o.remap_root || c.defaults.remap_root) return {};
    return make_error("--container-remap-root: container " + *o.name +
                      " was created without --container-remap-root and keeps its user mapping (the user's own id) "
                      "for as long as it exists; create it with --container-remap-root");
}

Status do_prepare(spank_t sp, const Settings& settings) {
    StepState& st = state();
    JobOptions& o = options();
    st.config = load_plugin_config(settings);
    auto id = identity(sp);
    if (!id) return id.error();

    // Steps that never run user tasks in a container.
    if (id->stepid == SLURM_EXTERN_CONT || id->stepid == SLURM_INTERACTIVE_STEP) {
        st.run_on_host = true;
        return {};
    }
    bool batch = id->stepid == SLURM_BATCH_SCRIPT;
    if (batch && !settings.sbatch_support) {
        st.run_on_host = true;
        return {};
    }

    std::string name, mode = "auto";
    if (o.name) {
        name = *o.name;
        auto colon = name.rfind(':');
        if (colon != std::string::npos) {
            mode = name.substr(colon + 1);
            name = name.substr(0, colon);
            if (mode != "auto" && mode != "create" && mode != "exec" && mode != "no_exec")
                return make_error("--container-name=" + *o.name + ": unknown mode '" + mode +
                                  "' (valid: auto, create, exec, no_exec)");
        }
        if (name.empty()) return make_error("--container-name: empty name");
        // JOBID.STEPID names a running step's unnamed container (Pyxis), whatever the scope.
        bool step_id = name.find_first_not_of("0123456789.") == std::string::npos &&
                       name.find('.') != std::string::npos && name.front() != '.' && name.back() != '.' &&
                       name.find('.') == name.rfind('.');
        name = step_id ? "pyxis_" + name : container_name(name, id->jobid, settings);
    }

    // Lines for the user's terminal, from node 0 only: the first task there prints them (join_step).
    uint32_t node_id = 0;
    bool first_node = item(sp, S_JOB_NODEID, &node_id) && node_id == 0;
    auto tell_user = [&](const std::string& line) {
        if (first_node) st.notices += "gantry: " + line + "\n";
    };

    // An existing named container is reused (auto, exec) or replaced (create).
    if (!name.empty()) {
        auto existing = Container::open(name, st.config);
        // A name is its owner's: another user can neither join, replace nor stop it (with
        // container_scope=global, names are shared by every job on the node).
        if (existing && existing->state().uid != id->uid)
            return make_error("--container-name=" + *o.name +
                              ": a container of that name belongs to another user; choose another name");
        if (existing && (mode == "auto" || mode == "exec" || mode == "no_exec")) {
            // Pyxis attaches to a container a step is running in, and starts the others afresh:
            // `exec` asks for a running one.
            bool running = has_step_processes(existing->state());
            if (mode == "exec" && !running)
                return make_error("--container-name=" + *o.name +
                                  ": the container is not running (mode exec attaches to a running one)");
            // `no_exec` never attaches to a running container: its tasks start a new instance from the
            // same files (JoinAs::new_instance, a copy of the container's mount namespace made by each
            // task as it joins). A container no step runs in is started afresh, as by `auto`.
            st.new_instance = mode == "no_exec" && running;
            GANTRY_TRY(check_unshare_of_existing(o, existing->state()));
            GANTRY_TRY(check_remap_root_of_existing(o, existing->state()));
            st.as_user = o.remap_root && !*o.remap_root && existing->state().defaults.remap_root;
            if (st.as_user) st.entry_helper = helper_path(settings, "gantry-entry", GANTRY_ENTRY_INSTALL_PATH);
            // Its mounts were made when it was created (a new instance's are copies of them); Pyxis
            // scripts grep for this phrase.
            if (o.mounts)
                tell_user("warning: ignoring --container-mounts: container " + *o.name +
                          " already exists and keeps the mounts it was created with");
            st.joined = existing->state();
            existing->release();
            // Each step starts where it asks to, else where Pyxis starts it: in the container's `/`
            // when it attaches to a running one (as `enroot exec`), in the image's WorkingDir when it
            // starts a stopped one afresh; never where the step that created the container asked for.
            if (o.workdir) {
                auto w = normalize_container_workdir(*o.workdir);
                if (!w) return w.error();
                st.joined.defaults.workdir = *w;
            } else {
                st.joined.defaults.workdir = running && !st.new_instance ? "/" : st.joined.defaults.image_workdir;
            }
            st.cgroup_level = settings.container_scope == "job" ? CgroupLevel::job : CgroupLevel::node;
            return {};
        }
        if (existing && mode == "create") {
            (void)existing->stop();
        } else if (!existing && mode == "exec") {
            return make_error("--container-name=" + *o.name + ": no such container (mode exec needs an existing one)");
        }
    }
    if (!o.image) {
        if (!name.empty())
            return make_error("--container-name=" + *o.name + ": no such container and no --container-image");
        st.run_on_host = true;
        return {};
    }

    std::vector<std::string> env = job_environment(sp);
    st.uid = id->uid;
    st.gid = id->gid;
    st.groups = id->groups;
    uint32_t node = 0;
    if (o.save && item(sp, S_JOB_NODEID, &node) && node == 0) {
        if (o.save->empty()) return make_error("--container-save: argument required");
        st.save_path = *o.save;  // a relative path is resolved in user_init (resolve_save_path)
    }
    // What the step asks for; container_spec_for (include/gantry/run_request.hpp) makes the spec, as
    // for `gantry run`.
    RunRequest spec;
    spec.config = st.config;
    spec.uid = id->uid;
    spec.gid = id->gid;
    spec.env = env;
    if (is_local_image_path(*o.image)) {
        // A squashfs file the user named: user-controlled bytes, never kernel-mounted for a job user.
        spec.image_path = *o.image;
        spec.image_source = ImageSource::local_file;
        // A relative path (./rel.sqsh) is the step's working directory's, as Pyxis takes it. Slurm tells
        // a plugin that directory only from user_init on, after the container is made here: the path
        // is taken against srun's directory (kSrunDirVar, set by srun; a batch step has no srun:
        // sbatch's SLURM_SUBMIT_DIR), which is the step's unless it runs with --chdir, and user_init
        // checks that it was (check_image_base). Every access to the file is the user's
        // (check_user_paths), so the job's environment naming the directory is safe.
        if ((*o.image)[0] == '.') {
            auto base = find_env(env, kSrunDirVar);
            if (!base || base->empty() || (*base)[0] != '/') base = find_env(env, "SLURM_SUBMIT_DIR");
            if (!base || base->empty() || (*base)[0] != '/')
                return make_error("--container-image=" + *o.image +
                                  ": a relative path needs srun's working directory, which the step's environment "
                                  "lacks; give an absolute path");
            st.image_base = *base;
            spec.image_path = *base + (base->back() == '/' ? "" : "/") + *o.image;
        }
    } else {
        auto ref = parse_reference(*o.image);
        // Pyxis scripts grep for this phrase whatever went wrong with the image, a bad name included.
        if (!ref) return ref.error().wrap(import_failed(*o.image));
        std::string image = *o.image;
        // The digest srun resolved once for the step: as if the user had written IMAGE@DIGEST (see
        // image_resolved_by_srun for why that is all it may be).
        std::string resolved;
        if (ref->digest.empty())
            if (auto pinned = image_resolved_by_srun(env, image)) resolved = *pinned;
        // With store_owner set and a trusted store, the pull runs in two halves (user, store owner) and
        // its image may be kernel-mounted; otherwise the job user pulls and the image is served
        // unprivileged. Root opens nothing in a store the user can write (a per-user store, or any
        // store that is not trusted): what it needs comes in the pull's report.
        auto store_root = job_store_path(st.config, id->uid);
        if (!store_root) return store_root.error().wrap(import_failed(image));
        bool two_halves = false;
        if (!st.config.store_owner.empty() && !st.config.store_path.empty()) {
            auto store = ImageStore::open(st.config.store_path, false,
                                          st.config);  // the admin's path, root-owned or store_owner's
            two_halves = store && store->trusted(st.config);
        }
        // The launcher picks the backend after the pull (Container::create): ask now whether that
        // backend can stack layers (a node without usable fuse falls back to extract, which cannot),
        // so the pull gives the step a whole image rather than layers it cannot run.
        bool whole = !can_stack_layers(st.config, MountBackend::auto_, two_halves);  // auto: gantry.conf's
        // A pinned digest the user's store holds: acquired as the user, who reports its config, and no
        // pull runs (acquire_stored_as_user). For the step's own (attached) container the holder itself
        // does that, as the user, before it takes the namespaces: one exec per warm step, not two.
        std::optional<HolderWithImage> stored;
        if (!two_halves) {
            trace::Phase phase(kPhaseAcquireStored);
            stored =
                acquire_stored_as_user(settings, st.config, *id, *store_root, image, resolved, whole, name.empty());
        }
        auto pulled = [&]() -> Result<PullReport> {
            if (stored) {
                PullReport report;
                report.digest = stored->image.digest;
                report.config_json = stored->image.metadata.config_json;
                report.outcome = "stored";  // a hit, for start-up telemetry
                return report;
            }
            trace::Phase phase(two_halves ? kPhasePullTrusted : kPhasePullAsUser);
            return two_halves ? pull_into_trusted_store(settings, st.config, *id, image, resolved, env, whole)
                              : pull_as_user(settings, *id, *store_root, image, resolved, env, whole);
        }();
        if (!pulled) return pulled.error();
        // srun announced the import unless a named container might have made it unnecessary.
        if (st.config.import_messages) {
            if (o.name) tell_user("importing docker image: " + *o.image);
            tell_user("imported docker image: " + *o.image);
        }
        auto cfg = parse_image_config(pulled->config_json);
        if (!cfg) return cfg.error().wrap(import_failed(image));
        st.digest = pulled->digest;
        note_image_outcome(pulled->outcome);  // start-up telemetry (telemetry.cpp)
        spec.image_path = pulled->squashfs_path;
        spec.image_layers = pulled->layer_paths;  // a layered image (gantry.conf layered_images)
        spec.image_config = std::move(*cfg);
        spec.image_source = two_halves ? ImageSource::trusted_store : ImageSource::store;
        if (two_halves) {
            // The trusted store's own files, opened and checked once (acquire_image): the launcher gets
            // their descriptors, and checks them again before mounting; the image's shared lock keeps
            // `gantry gc` from removing it while the step runs.
            auto store = ImageStore::open(st.config.store_path, false, st.config);
            if (!store) return store.error().wrap(import_failed(image));
            trace::Phase phase("acquire_image");
            auto acquired = acquire_image(*store, pulled->digest);
            if (!acquired) return acquired.error().wrap(import_failed(image));
            auto paths = acquired->paths();
            spec.image_path = paths.back();
            spec.image_layers = acquired->layered ? paths : std::vector<std::string>{};
            st.image_in_use = std::move(acquired->in_use);
            st.image_files = std::move(acquired->files);
        } else {
            // A store the job user can write (theirs, or an open one): root opens nothing in it. The
            // user's own helper acquires the image with the user's rights and hands its descriptors
            // over (acquire_image_as); everything after uses those, never the report's file names.
            trace::Phase phase("acquire_image_as");
            if (stored) spec.started_holder = std::move(stored->holder);
            auto acquired =
                stored
                    ? Result<AcquiredImage>(std::move(stored->image))
                    : acquire_image_as(ProcessIdentity{id->uid, id->gid, id->groups},
                                       helper_path(settings, "gantry-holder", GANTRY_HOLDER_INSTALL_PATH), *store_root,
                                       pulled->digest, std::chrono::seconds(st.config.check_timeout_seconds),
                                       [] { return state().signals && state().signals->pending(); });
            if (!acquired) return acquired.error().wrap(import_failed(image));
            auto paths = acquired->paths();
            spec.image_path = paths.back();
            spec.image_layers = acquired->layered ? paths : std::vector<std::string>{};
            st.image_files = std::move(acquired->files);
        }
    }

    auto backend = parse_mount_backend(st.config.mount_backend);
    if (!backend) return backend.error();
    spec.backend = *backend;
    if (o.mounts) {
        auto st_m = parse_mounts(*o.mounts, spec.mounts);
        if (!st_m) return st_m.error();
    }
    if (batch) {
        // The batch script lives in slurmd's spool directory on the host; make it visible inside.
        char** argv = nullptr;
        int argc = 0;
        if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS && argc > 0 && argv[0][0] == '/') {
            std::string dir = std::string(argv[0]).substr(0, std::string(argv[0]).rfind('/'));
            auto m = parse_mount(dir + ":" + dir + ":ro");
            if (m) spec.mounts.push_back(*m);
        }
    }
    // The srun flags decide; without them, the site's defaults (gantry.conf, or its enroot_conf).
    spec.writable = o.writable;
    spec.remap_root = o.remap_root;
    spec.mount_home = o.mount_home;
    if (o.unshare) {
        auto u = parse_unshare(*o.unshare);
        if (!u) return u.error();
        spec.unshare = *u;
    }
    if (o.workdir) spec.workdir = *o.workdir;
    if (o.env) spec.env_names = split_list(*o.env, ',');
    // A step's own container is named JOBID.STEPID as Pyxis names it, so that another step of the
    // job can attach to it while it runs (--container-name=JOBID.STEPID); it ends with the step. Where
    // several nodes share one runtime directory (the test harness's nodes on one machine), another
    // node's container of this step may hold the name already: this node's then goes unnamed.
    spec.name = name;
    if (name.empty()) {
        std::string step_name = "pyxis_" + std::to_string(id->jobid) + "." + std::to_string(id->stepid);
        if (!Container::open(step_name, st.config)) spec.name = step_name;
    }
    spec.detach = !name.empty();
    spec.holder_program = helper_path(settings, "gantry-holder", GANTRY_HOLDER_INSTALL_PATH);
    // Root's waits on the user's helpers and holder (the image check, Enroot settings, the holder's
    // set-up) end at scancel or the time limit as the pulls do, besides their own deadlines.
    if (auto& watch = state().signals) spec.should_stop = [&watch] { return watch->pending(); };
    auto prepared = [&] {
        trace::Phase phase("container_spec_for");
        return container_spec_for(std::move(spec));
    }();
    if (!prepared) return prepared.error();
    // The fuse backend: the containers of this job on this node share one image server (per image and
    // inner ids), placed in the job's cgroups and ended with the job (task_forked, clean_up_job). Not
    // for a named container that outlives the job (container_scope=global): it keeps its own daemon.
    if (name.empty() || settings.container_scope == "job") {
        char host[HOST_NAME_MAX + 1] = {};
        (void)::gethostname(host, sizeof host - 1);
        prepared->spec.fuse_server_scope = "job " + std::to_string(id->jobid) + " on " + host;
    }
    ContainerEdits* edits = &prepared->spec.devices;
    st.efa_devices = passes_efa_devices(*edits);
    // Warnings (memlock for EFA, stale driver libraries) go to the slurmd log here, and to the user's
    // terminal from the first task of node 0 (join_step): this hook's output never reaches srun.
    uint32_t nodeid = 0;
    for (const auto& w : prepared->warnings) log::warning(w);
    if (item(sp, S_JOB_NODEID, &nodeid) && nodeid == 0)
        for (const auto& w : prepared->warnings) st.device_warnings += "gantry: warning: " + w + "\n";
    if (!prepared->devices_summary.empty()) log::info("devices: " + prepared->devices_summary);
    if (st.config.pmix) add_pmix_mounts(sp, env, !name.empty(), edits->mounts);
    // Inner srun steps of a batch script: Slurm's configuration, munge and this plugin
    // (batch_srun_paths). Safe: read-only binds, made by the holder as the job user and only of what
    // that user reaches (SLURM_CONF comes from the job's environment: root does not look at it).
    if (batch && st.config.batch_srun)
        for (const auto& path : batch_srun_paths(env)) edits->mounts.push_back({path, path, true, true});
    const ContainerSpec& made = prepared->spec;

    if (o.entrypoint.value_or(settings.execute_entrypoint) && !made.image_config.entrypoint.empty()) {
        st.entrypoint = made.image_config.entrypoint;
        st.entrypoint_log = o.entrypoint_log.value_or(false);
        st.entry_helper = helper_path(settings, "gantry-entry", GANTRY_ENTRY_INSTALL_PATH);
    }

    auto created = [&] {
        trace::Phase phase("Container::create");
        return Container::create(made);
    }();
    // Another node sharing the runtime directory took the step's name meanwhile: go unnamed.
    if (!created && name.empty() && !made.name.empty() && Container::open(made.name, st.config)) {
        prepared->spec.name.clear();
        created = Container::create(prepared->spec);
    }
    if (!created) return created.error();
    st.joined = created->state();
    if (auto recorded = record_job_image_server(st.config, id->jobid, st.joined); !recorded)
        log::warning("recording the job's image server: " + recorded.error().message);
    // Where the holder goes once Slurm has placed the first task (task_forked): the task's own leaf
    // for a step's container, the job's leaf for a named one, outside every job for a node-wide one
    // (container_scope=global): never left in the step, where it started (cgroup/v2: step_N/slurm).
    if (name.empty())
        st.cgroup_level = CgroupLevel::step;
    else if (settings.container_scope == "job")
        st.cgroup_level = CgroupLevel::job;
    else
        st.cgroup_level = CgroupLevel::node;
    if (name.empty()) {
        st.container = std::move(*created);  // stopped when the step's last task exits
    } else {
        created->release();  // outlives the step; stopped by the job epilog (container_scope=job)
    }
    return {};
}

}  // namespace

void watch_step_signals() {
    state().signals.emplace();
}
Status prepare_step(spank_t sp, const Settings& settings) {
    auto st = do_prepare(sp, settings);
    if (!st) state().error = "gantry: " + st.error().message;
    return st;
}

void check_image_base() {
    StepState& st = state();
    if (st.image_base.empty() || !st.error.empty()) return;
    // user_init runs in the step's working directory (srun --chdir, else srun's own).
    std::string cwd(PATH_MAX, '\0');
    if (::getcwd(cwd.data(), cwd.size()) == nullptr) return;
    cwd.resize(std::strlen(cwd.c_str()));
    struct stat here {
    }, base{};
    if (::stat(cwd.c_str(), &here) == 0 && ::stat(st.image_base.c_str(), &base) == 0 && here.st_dev == base.st_dev &&
        here.st_ino == base.st_ino)
        return;
    st.error = "gantry: a relative --container-image was taken against srun's directory " + st.image_base +
               ", not the step's " + cwd + " (srun --chdir): give an absolute path";
}

void resolve_save_path() {
    StepState& st = state();
    if (st.save_path.empty() || !st.error.empty()) return;
    std::string path = st.save_path;
    if (path[0] != '/') {
        std::string cwd(PATH_MAX, '\0');
        if (::getcwd(cwd.data(), cwd.size()) == nullptr) {
            st.error = "gantry: --container-save=" + path +
                       ": could not read the job's working directory to take the path against; give an absolute path";
            st.save_path.clear();
            return;
        }
        cwd.resize(std::strlen(cwd.c_str()));
        path = cwd + (cwd.back() == '/' ? "" : "/") + path;
    }
    // As the job user (user_init runs with the user's euid): whether the target is a directory is
    // theirs to know. srun checked the same path already, but from its own directory and filesystem.
    struct stat sb {};
    if (::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st.error = "gantry: --container-save=" + st.save_path + ": target is a directory (give a file path, e.g. " +
                   path + "/image.sqsh)";
        st.save_path.clear();
        return;
    }
    st.save_path = path;
}

void task_forked(spank_t sp) {
    StepState& st = state();
    if (st.holder_placed || !st.cgroup_level || !st.error.empty() || st.run_on_host || st.joined.holder_pid <= 0)
        return;
    pid_t task = 0;
    if (!item(sp, S_TASK_PID, &task) || task <= 0) return;
    st.holder_placed = true;
    // Slurm has put this task in the step's cgroups (proctrack_g_add) and holds it until every
    // post-fork hook returned: the holder joins it there (or in the job's, for a named container), and
    // the job's shared image server (when this container's holder found or started one) the job's
    // cgroups, not this step's: it serves the job's later steps too, and the job epilog ends it. The
    // cgroups are read here, while Slurm holds the task; the moves finish in a thread of their own
    // (finish_step waits for them), as the first one waits out an RCU grace period in the kernel.
    {
        trace::Phase phase("plan cgroup placement");
        uint32_t jobid = 0;
        (void)item(sp, S_JOB_ID, &jobid);
        st.placement.start(task, st.joined, *st.cgroup_level, st.config, jobid);
    }
    // cgroup/v2: the job's own leaf, if one was made, is ended and removed by the job epilog (the
    // placement notes it, record_job_cgroups).
}

void task_exited(spank_t sp, const Settings& settings) {
    uint32_t local_tasks = 0;
    if (!item(sp, S_JOB_LOCAL_TASK_COUNT, &local_tasks)) return;
    if (++state().tasks_exited >= local_tasks) finish_step(sp, settings);
}

void finish_cgroup_placement() {
    StepState& st = state();
    if (!st.placement.started()) return;
    // Each failure says which move it was.
    for (const auto& result : st.placement.finish())
        if (!result) log::warning(result.error().message);
}

void finish_step(spank_t, const Settings&) {
    StepState& st = state();
    finish_cgroup_placement();
    if (!st.save_path.empty() && st.joined.holder_pid > 0) {
        auto saved = save_container(st.joined, ProcessIdentity{st.uid, st.gid, st.groups}, st.save_path);
        // The message names --container-save and the path already (save_container's errors).
        if (!saved) slurm_error("gantry: %s", saved.error().message.c_str());
        st.save_path.clear();
    }
    if (st.container) {
        (void)st.container->stop();
        st.container.reset();
    }
    st.image_in_use.reset();
    st.image_files.clear();
}

}  // namespace gantry::plugin
