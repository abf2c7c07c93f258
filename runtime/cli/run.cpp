// The container verbs of the CLI: `run`, `exec`, `stop`, `ps` — argument parsing over the launcher
// library (include/gantry/launcher.hpp).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common.hpp"
#include "gantry/config.hpp"
#include "gantry/devices.hpp"
#include "gantry/dropins.hpp"
#include "gantry/fabric_probe.hpp"
#include "gantry/launcher.hpp"
#include "gantry/log.hpp"
#include "gantry/run_request.hpp"
#include "gantry/strings.hpp"
#include "gantry/workdir.hpp"

extern char** environ;

namespace gantry::cli {
namespace {

// Exit status when gantry itself fails before the command runs (like docker/podman).
constexpr int kSetupFailed = 125;

int setup_failed(const Error& e) {
    log::error(e.message);
    return kSetupFailed;
}

// --env/-e VALUE: "NAME=VALUE" sets that value (one variable: the value may hold commas); "NAME" or
// "NAME1,NAME2" takes the caller's value of each name, as before.
Status add_env(const std::string& verb, const std::string& v, std::vector<std::string>& names,
               std::vector<std::string>& values) {
    auto eq = v.find('=');
    if (eq == 0) return make_error(verb + ": --env '" + v + "': no variable name before '='");
    if (eq != std::string::npos) {
        values.push_back(v);
        return {};
    }
    for (auto& n : split_list(v, ',')) names.push_back(n);
    return {};
}

Result<std::string> read_text(const std::string& path) {
    std::ifstream f(path);
    if (!f) return system_error("reading " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Proving the fabric (issue 37) before the command, as the plugin does before a step's tasks:
// -1 to go on, else the exit status. `only` (--fabric-check): the check alone, printed as three lines
// ("ok"/"problem", what was found or the cause, the fix) for `gantry doctor --image`.
int check_run_fabric(const ContainerState& container, const ContainerSpec& spec, bool only) {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
    auto inside = container_environment(container.defaults, env, EnvironmentRule::docker);
    if (!only && !fabric_check_wanted(inside, passes_efa_devices(spec.devices))) return -1;
    auto report = probe_fabric(container, env);
    if (!report) {
        log::error(report.error().message);
        return only || spec.config.efa_required ? kSetupFailed : -1;
    }
    if (only) {
        if (report->problem)
            std::printf("problem\n%s\n%s\n", report->problem->cause.c_str(), report->problem->fix.c_str());
        else
            std::printf("ok\n%s\n\n", report->summary.c_str());
        return report->problem ? 1 : 0;
    }
    if (!report->problem) return -1;
    if (!spec.config.efa_required) {
        log::warning(report->problem->line());
        return -1;
    }
    log::error(report->problem->line() + " (efa_required = yes in gantry.conf: the command does not run)");
    return kSetupFailed;
}

// What `gantry run` was given; the options of RunRequest's optional settings apply only when given.
struct RunArgs {
    std::vector<std::string> mounts, env, operands;  // operands: IMAGE, then the command verbatim
    std::string workdir, unshare, backend, name, store, pull, image_file, config_file;
    bool writable = false, remap_root = false, entrypoint = false, mount_home = false, detach = false;
    bool fabric_check = false;  // --fabric-check: only the EFA check, printed (gantry doctor --image)
    CLI::Option *workdir_opt, *writable_opt, *remap_root_opt, *entrypoint_opt, *mount_home_opt, *unshare_opt,
        *backend_opt, *pull_opt;
};

int run_verb(const RunArgs& a) {
    auto config = load_default_config();
    if (!config) return setup_failed(config.error());
    // What we ask for; container_spec_for (include/gantry/run_request.hpp) makes the spec, as the plugin's.
    RunRequest req;
    req.config = *config;
    req.single_task = true;
    ProcessSpec process;
    for (const auto& m : a.mounts)
        if (auto st = parse_mounts(m, req.mounts); !st) return setup_failed(st.error());
    if (a.workdir_opt->count() > 0) req.workdir = a.workdir;
    for (const auto& e : a.env)
        if (auto st = add_env("run", e, req.env_names, req.env_values); !st) return setup_failed(st.error());
    if (a.writable_opt->count() > 0) req.writable = a.writable;
    if (a.remap_root_opt->count() > 0) req.remap_root = a.remap_root;
    if (a.entrypoint_opt->count() > 0) process.use_entrypoint = a.entrypoint;
    if (a.mount_home_opt->count() > 0) req.mount_home = a.mount_home;
    if (a.unshare_opt->count() > 0) {
        auto ns = parse_unshare(a.unshare);
        if (!ns) return setup_failed(ns.error());
        req.unshare = *ns;
    }
    if (a.backend_opt->count() > 0) {
        auto b = parse_mount_backend(a.backend);
        if (!b) return setup_failed(b.error());
        req.backend = *b;
    }
    req.name = a.name;
    req.detach = a.detach;
    std::string store_option = a.store, config_file = a.config_file;
    auto pull_option = given(a.pull_opt, a.pull);
    auto rest = a.operands;
    std::string image = a.image_file;
    if (image.empty()) {
        if (rest.empty()) return setup_failed(make_error("run: no image given (see gantry run --help)"));
        image = rest.front();
        rest.erase(rest.begin());
        if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    } else if (image[0] != '/' && image[0] != '.') {
        image = "./" + image;
    }
    auto policy = pull_policy(req.config, pull_option);
    if (!policy) return setup_failed(policy.error());
    // An image the store keeps as layers runs as a stack with the kernel or the fuse backend, not with
    // extract (asked for here or by gantry.conf); then the whole squashfs is made instead.
    auto conf_backend = parse_mount_backend(req.config.mount_backend);
    MountBackend wanted = req.backend != MountBackend::auto_ ? req.backend
                          : conf_backend                     ? *conf_backend
                                                             : MountBackend::auto_;
    // Nor on a kernel that cannot stack them (Linux < 5.11), nor where the launcher will fall back to
    // extract (no usable fuse, not root); said when layers are configured. Root counts as privileged:
    // its auto backend is kernel for a trusted store, else fuse, which root can open.
    bool layers_ok = can_stack_layers(req.config, wanted, ::getuid() == 0);
    if (wanted != MountBackend::extract && !layers_ok && req.config.layered_images)
        log::info(kernel_stacks_layers()
                      ? "the fuse backend cannot run here (see gantry doctor) and the kernel backend needs root: "
                        "images stored as layers run as whole images made from their layers (extract backend)"
                      : "this kernel cannot stack image layers (overlayfs with userxattr needs Linux 5.11): images "
                        "stored as layers run as whole images made from their layers");
    auto resolved = resolve_runnable_image(req.config, store_option, image, false, *policy, layers_ok);
    if (!resolved) return setup_failed(resolved.error());
    req.image_path = resolved->squashfs_path;
    req.image_layers = resolved->layer_paths;
    req.image_source = resolved->digest.empty()     ? ImageSource::local_file
                       : resolved->in_trusted_store ? ImageSource::trusted_store
                                                    : ImageSource::store;
    req.image_config = resolved->config;
    if (!config_file.empty()) {
        auto text = read_text(config_file);
        if (!text) return setup_failed(text.error());
        auto ic = parse_image_config(*text);
        if (!ic) return setup_failed(ic.error().wrap("image config " + config_file));
        req.image_config = *ic;
    }
    // Our environment plays the job's.
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) req.env.emplace_back(*e);
    if (req.detach && req.name.empty()) return setup_failed(make_error("run: --detach needs --name"));
    if (req.detach && !rest.empty())
        return setup_failed(make_error("run: --detach takes no command (use gantry exec)"));
    auto prepared = container_spec_for(std::move(req));
    if (!prepared) return setup_failed(prepared.error());
    for (const auto& w : prepared->warnings) log::warning(w);
    if (!prepared->devices_summary.empty()) log::debug("devices: " + prepared->devices_summary);
    const ContainerSpec& spec = prepared->spec;

    process.argv = rest;
    process.entrypoint = spec.image_config.entrypoint;
    process.cmd = spec.image_config.cmd;

    auto container = Container::create(spec);
    if (!container) return setup_failed(container.error());
    if (spec.detach) {
        std::printf("%s %d\n", spec.name.c_str(), static_cast<int>(container->pid()));
        return 0;
    }
    if (int rc = check_run_fabric(container->state(), spec, a.fabric_check); rc >= 0) {
        (void)container->stop();
        return rc;
    }
    auto status = run_in(container->state(), process);
    auto stopped = container->stop();
    if (!status) return setup_failed(status.error());
    if (!stopped) log::warning(stopped.error().message);
    return *status;
}

struct ExecArgs {
    std::vector<std::string> env, operands;  // operands: NAME, then the command verbatim
    std::string workdir;
};

int exec_verb(const ExecArgs& a) {
    auto config = load_default_config();
    if (!config) return setup_failed(config.error());
    std::string workdir = a.workdir;
    std::vector<std::string> env_names, env_values;
    for (const auto& e : a.env)
        if (auto st = add_env("exec", e, env_names, env_values); !st) return setup_failed(st.error());
    auto rest = a.operands;
    if (rest.empty()) return setup_failed(make_error("exec: no container name (see gantry exec --help)"));
    auto container = Container::open(rest.front(), *config);
    if (!container) return setup_failed(container.error());
    rest.erase(rest.begin());
    if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    // exec may override what the creator chose; the holder's state stays as it was.
    auto state = container->state();
    if (!workdir.empty()) {
        auto w = normalize_container_workdir(workdir);
        if (!w) return setup_failed(w.error());
        state.defaults.workdir = *w;
    }
    for (auto& n : env_names) state.defaults.env_names.push_back(n);
    for (auto& e : env_values) state.defaults.env_values.push_back(e);
    ProcessSpec process;
    process.argv = rest;
    auto status = run_in(state, process);
    if (!status) return setup_failed(status.error());
    return *status;
}

int stop_verb(const std::vector<std::string>& args) {
    auto config = load_default_config();
    if (!config) return setup_failed(config.error());
    if (args.empty()) return setup_failed(make_error("stop: no container name (see gantry stop --help)"));
    int rc = 0;
    for (const auto& name : args) {
        auto c = Container::open(name, *config);
        if (!c) {
            log::error(c.error().message);
            rc = 1;
            continue;
        }
        auto st = c->stop();
        if (!st) {
            log::error(st.error().message);
            rc = 1;
        }
    }
    return rc;
}

int ps_verb() {
    auto config = load_default_config();
    if (!config) return setup_failed(config.error());
    // Tab-separated, a header first: `cut -f1` (or `tail -n +2`) gives the names.
    std::printf("NAME\tPID\tBACKEND\n");
    for (const auto& name : list_containers(*config)) {
        auto c = Container::open(name, *config);
        if (c) std::printf("%s\t%d\t%s\n", name.c_str(), static_cast<int>(c->pid()), c->state().backend.c_str());
    }
    return 0;
}

// The environment options of run and exec.
void add_env_option(CLI::App& app, std::vector<std::string>& env) {
    app.add_option("-e,--env", env,
                   "NAME=VALUE sets NAME to VALUE inside; NAME or NAME,NAME passes\n"
                   "the caller's value of each (repeatable)")
        ->type_name("NAME=VALUE|NAME[,NAME]")
        ->allow_extra_args(false);
}

// Docker's rule for run and exec: options come before the first operand; from there on every word,
// options included, is an operand (the command and its arguments, passed on verbatim).
void take_operands_verbatim(CLI::App& app, std::vector<std::string>& operands, const std::string& what) {
    app.positionals_at_end();
    app.add_option("OPERANDS", operands, what)->take_all();
}

VerbRunner define_run(CLI::App& app) {
    auto a = std::make_shared<RunArgs>();
    add_env_option(app, a->env);
    app.add_option("-m,--mount", a->mounts, "bind-mount SRC[:DST[:FLAGS]] (comma-separated list; repeatable)")
        ->type_name("SPEC")
        ->allow_extra_args(false);
    a->workdir_opt =
        app.add_option("-w,--workdir", a->workdir, "working directory inside (default: the image's, else /)")
            ->type_name("DIR");
    a->writable_opt = app.add_flag("--writable,!--readonly", a->writable,
                                   "writes to / land in scratch_path (gantry.conf) and vanish with the container");
    a->remap_root_opt = app.add_flag("--remap-root,!--no-remap-root", a->remap_root, "run as uid/gid 0 inside");
    a->entrypoint_opt =
        app.add_flag("--entrypoint,!--no-entrypoint", a->entrypoint, "prefix the image's Entrypoint to the command");
    a->mount_home_opt =
        app.add_flag("--mount-home,!--no-mount-home", a->mount_home, "bind-mount your home directory (default: on)");
    a->unshare_opt =
        app.add_option("--unshare", a->unshare, "also unshare these namespaces: net, ipc, uts")->type_name("LIST");
    a->backend_opt =
        app.add_option("--backend", a->backend, "how to mount the image")->type_name("auto|kernel|fuse|extract");
    app.add_option("--name", a->name, "name the container, so gantry exec/stop/ps find it")->type_name("NAME");
    app.add_flag("-d,--detach", a->detach, "keep the container running (needs --name; stop it with gantry stop)");
    app.add_option("--store", a->store, "the image store (default: gantry.conf's store_path)")->type_name("DIR");
    a->pull_opt = app.add_option("--pull", a->pull,
                                 "always (resolve the tag at the registry), missing (only if never\n"
                                 "resolved), never (the store only); default: GANTRY_PULL_POLICY, else\n"
                                 "gantry.conf's pull_policy (always). A stored digest needs no registry")
                      ->type_name("always|missing|never");
    app.add_flag(
        "--fabric-check", a->fabric_check,
        "only check the container's EFA fabric (devices, libfabric's efa provider, the NCCL plugin) and print it");
    app.add_option("--image-file", a->image_file, "run this squashfs file (instead of the IMAGE operand)")
        ->type_name("FILE");
    app.add_option("--config-file", a->config_file, "the image config (JSON) for a squashfs file")->type_name("FILE");
    take_operands_verbatim(app, a->operands, "IMAGE, then the command and its arguments");
    return {[a] { return run_verb(*a); }, {}};
}

VerbRunner define_exec(CLI::App& app) {
    auto a = std::make_shared<ExecArgs>();
    add_env_option(app, a->env);
    app.add_option("-w,--workdir", a->workdir, "working directory inside")->type_name("DIR");
    take_operands_verbatim(app, a->operands, "NAME, then the command and its arguments");
    return {[a] { return exec_verb(*a); }, {}};
}

VerbRunner define_stop(CLI::App& app) {
    auto names = std::make_shared<std::vector<std::string>>();
    app.add_option("NAME", *names, "a named container");
    return {[names] { return stop_verb(*names); }, {}};
}

VerbRunner define_ps(CLI::App&) {
    return {[] { return ps_verb(); }, {}};
}

const std::string kRunExitStatus =
    "exit status: the command's; 125 gantry failed, 126 command not executable, 127 command not found\n";

const Registration run_registration(
    {{"run", "run [OPTIONS] IMAGE [--] [CMD...]  run a command in a new container",
      "[OPTIONS] IMAGE [--] [COMMAND [ARG...]]",
      "Runs COMMAND (default: the image's Cmd) in a new container of IMAGE: a registry reference (pulled\n"
      "into the store unless there) or a squashfs file ('/...' or './...'). Options go before IMAGE:\n"
      "every word after it belongs to COMMAND.",
      kRunExitStatus, kRunUsageError},
     define_run});
const Registration exec_registration(
    {{"exec", "exec [OPTIONS] NAME [CMD...]  run a command in a running named container",
      "[OPTIONS] NAME [--] [COMMAND [ARG...]]",
      "Runs COMMAND (default: /bin/sh) in the running container NAME. Options go before NAME.", kRunExitStatus,
      kRunUsageError},
     define_exec});
const Registration stop_registration(
    {{"stop", "stop NAME...            stop named containers", "NAME...", "Stops the named containers.",
      "exit status: 1 when one could not be stopped, 125 on a usage error\n", kRunUsageError},
     define_stop});
const Registration ps_registration({{"ps", "ps                      list named containers", "",
                                     "Lists your named containers, tab-separated under a header: NAME, PID (of the\n"
                                     "holder), BACKEND.",
                                     "exit status: 0; 125 on a usage error\n", kRunUsageError},
                                    define_ps});

}  // namespace
}  // namespace gantry::cli
