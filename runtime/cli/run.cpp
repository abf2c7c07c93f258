// The container verbs of the CLI: `run`, `exec`, `stop`, `ps` — argument parsing over the launcher
// library (include/gantry/launcher.hpp).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common.hpp"
#include "gantry/config.hpp"
#include "gantry/devices.hpp"
#include "gantry/dropins.hpp"
#include "gantry/launcher.hpp"
#include "gantry/log.hpp"
#include "gantry/run_request.hpp"
#include "gantry/strings.hpp"

extern char** environ;

namespace gantry::cli {
namespace {

// Exit status when gantry itself fails before the command runs (like docker/podman).
constexpr int kSetupFailed = 125;

int setup_failed(const Error& e) {
    log::error(e.message);
    return kSetupFailed;
}

// Walks options of the form --name, --name VALUE and --name=VALUE up to the first operand or "--".
class OptionReader {
public:
    explicit OptionReader(const std::vector<std::string>& args) : args_(args) {}
    bool done() const { return i_ >= args_.size() || args_[i_] == "--" || args_[i_].empty() || args_[i_][0] != '-'; }
    // Returns the option name ("--mount") of the current argument and moves past it.
    std::string next() {
        std::string a = args_[i_++];
        auto eq = a.find('=');
        inline_value_.reset();
        if (eq != std::string::npos) {
            inline_value_ = a.substr(eq + 1);
            a.resize(eq);
        }
        return a;
    }
    Result<std::string> value(const std::string& opt) {
        if (inline_value_) return *std::exchange(inline_value_, std::nullopt);
        if (i_ >= args_.size()) return make_error(opt + " needs a value");
        return args_[i_++];
    }
    bool has_inline_value() const { return inline_value_.has_value(); }
    // The remaining operands, with a leading "--" dropped.
    std::vector<std::string> rest() {
        if (i_ < args_.size() && args_[i_] == "--") ++i_;
        return {args_.begin() + static_cast<long>(std::min(i_, args_.size())), args_.end()};
    }

private:
    const std::vector<std::string>& args_;
    size_t i_ = 0;
    std::optional<std::string> inline_value_;
};

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

int run_verb(const std::vector<std::string>& args) {
    auto config = load_default_config();
    if (!config) return setup_failed(config.error());
    // What we ask for; container_spec_for (include/gantry/run_request.hpp) makes the spec, as the plugin's.
    RunRequest req;
    req.config = *config;
    req.single_task = true;
    ProcessSpec process;
    std::string image_file, config_file, store_option;
    std::optional<std::string> pull_option;
    OptionReader opts(args);
    while (!opts.done()) {
        std::string o = opts.next();
        if (o == "--help" || o == "-h") return print_usage("run");
        Status st;
        auto take = [&](auto&& apply) -> Status {
            auto v = opts.value(o);
            if (!v) return v.error();
            return apply(*v);
        };
        if (o == "--mount" || o == "-m")
            st = take([&](const std::string& v) { return parse_mounts(v, req.mounts); });
        else if (o == "--workdir" || o == "-w")
            st = take([&](const std::string& v) -> Status { req.workdir = v; return {}; });
        else if (o == "--env" || o == "-e")
            st = take([&](const std::string& v) { return add_env("run", v, req.env_names, req.env_values); });
        else if (o == "--writable") req.writable = true;
        else if (o == "--readonly") req.writable = false;
        else if (o == "--remap-root") req.remap_root = true;
        else if (o == "--no-remap-root") req.remap_root = false;
        else if (o == "--entrypoint") process.use_entrypoint = true;
        else if (o == "--no-entrypoint") process.use_entrypoint = false;
        else if (o == "--mount-home") req.mount_home = true;
        else if (o == "--no-mount-home") req.mount_home = false;
        else if (o == "--unshare")
            st = take([&](const std::string& v) -> Status {
                auto ns = parse_unshare(v);
                if (!ns) return ns.error();
                req.unshare = *ns;
                return {};
            });
        else if (o == "--backend")
            st = take([&](const std::string& v) -> Status {
                auto b = parse_mount_backend(v);
                if (!b) return b.error();
                req.backend = *b;
                return {};
            });
        else if (o == "--name")
            st = take([&](const std::string& v) -> Status { req.name = v; return {}; });
        else if (o == "--detach" || o == "-d") req.detach = true;
        else if (o == "--store")
            st = take([&](const std::string& v) -> Status { store_option = v; return {}; });
        else if (o == "--pull")
            st = take([&](const std::string& v) -> Status { pull_option = v; return {}; });
        else if (o == "--image-file")
            st = take([&](const std::string& v) -> Status { image_file = v; return {}; });
        else if (o == "--config-file")
            st = take([&](const std::string& v) -> Status { config_file = v; return {}; });
        else
            st = make_error("run: unknown option '" + o + "' (see gantry run --help)");
        if (!st) return setup_failed(st.error());
    }
    auto rest = opts.rest();
    std::string image = image_file;
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
    auto resolved = resolve_runnable_image(req.config, store_option, image, false, *policy);
    if (!resolved) return setup_failed(resolved.error());
    req.image_path = resolved->squashfs_path;
    req.image_source = resolved->digest.empty()    ? ImageSource::local_file
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
    if (req.detach && !rest.empty()) return setup_failed(make_error("run: --detach takes no command (use gantry exec)"));
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
    auto status = run_in(container->state(), process);
    auto stopped = container->stop();
    if (!status) return setup_failed(status.error());
    if (!stopped) log::warning(stopped.error().message);
    return *status;
}

int exec_verb(const std::vector<std::string>& args) {
    auto config = load_default_config();
    if (!config) return setup_failed(config.error());
    std::string workdir;
    std::vector<std::string> env_names, env_values;
    OptionReader opts(args);
    while (!opts.done()) {
        std::string o = opts.next();
        if (o == "--help" || o == "-h") return print_usage("exec");
        auto v = (o == "--workdir" || o == "-w" || o == "--env" || o == "-e")
                     ? opts.value(o)
                     : Result<std::string>(make_error("exec: unknown option " + o + " (see gantry exec --help)"));
        if (!v) return setup_failed(v.error());
        if (o == "--workdir" || o == "-w") workdir = *v;
        else if (auto st = add_env("exec", *v, env_names, env_values); !st)
            return setup_failed(st.error());
    }
    auto rest = opts.rest();
    if (rest.empty()) return setup_failed(make_error("exec: no container name (see gantry exec --help)"));
    auto container = Container::open(rest.front(), *config);
    if (!container) return setup_failed(container.error());
    rest.erase(rest.begin());
    if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    // exec may override what the creator chose; the holder's state stays as it was.
    auto state = container->state();
    if (!workdir.empty()) {
        auto w = normalize_container_path(workdir, "working directory");
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

// stop and ps take no options but --help: anything else that looks like one is a usage error (125).
Result<bool> help_or_no_options(const std::string& verb, const std::vector<std::string>& args) {
    for (const auto& a : args) {
        if (a == "--") break;
        if (a == "--help" || a == "-h") return true;
        if (a.size() > 1 && a[0] == '-')
            return make_error(verb + ": unknown option '" + a + "' (see gantry " + verb + " --help)");
    }
    return false;
}

int stop_verb(const std::vector<std::string>& args_in) {
    auto help = help_or_no_options("stop", args_in);
    if (!help) return setup_failed(help.error());
    if (*help) return print_usage("stop");
    std::vector<std::string> args = args_in;
    if (!args.empty() && args.front() == "--") args.erase(args.begin());
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

int ps_verb(const std::vector<std::string>& args) {
    auto help = help_or_no_options("ps", args);
    if (!help) return setup_failed(help.error());
    if (*help) return print_usage("ps");
    if (!args.empty()) return setup_failed(make_error("ps: takes no operands (see gantry ps --help)"));
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

const Registration run_registration(
    {"run", "run [OPTIONS] IMAGE [--] [CMD...]  run a command in a new container",
     "usage: gantry run [OPTIONS] IMAGE [--] [COMMAND [ARG...]]\n"
     "Runs COMMAND (default: the image's Cmd) in a new container of IMAGE: a registry reference (pulled\n"
     "into the store unless there) or a squashfs file ('/...' or './...').\n\n"
     "options:\n"
     "  -e, --env NAME=VALUE     set NAME to VALUE inside (repeatable)\n"
     "  -e, --env NAME[,NAME]    pass the caller's value of NAME (repeatable)\n"
     "  -m, --mount SPEC         bind-mount SRC[:DST[:FLAGS]] (comma-separated list; repeatable)\n"
     "  -w, --workdir DIR        working directory inside (default: the image's, else /)\n"
     "  --writable, --readonly   writes to / land in scratch_path (gantry.conf) and vanish with the container\n"
     "  --remap-root, --no-remap-root   run as uid/gid 0 inside\n"
     "  --entrypoint, --no-entrypoint   prefix the image's Entrypoint to the command\n"
     "  --mount-home, --no-mount-home   bind-mount your home directory (default: on)\n"
     "  --unshare LIST           also unshare these namespaces: net, ipc, uts\n"
     "  --backend NAME           how to mount the image: auto, kernel, fuse, extract\n"
     "  --name NAME              name the container, so gantry exec/stop/ps find it\n"
     "  -d, --detach             keep the container running (needs --name; stop it with gantry stop)\n"
     "  --store DIR              the image store (default: gantry.conf's store_path)\n"
     "  --pull POLICY            always (resolve the tag at the registry), missing (only if never\n"
     "                           resolved), never (the store only); default: GANTRY_PULL_POLICY, else\n"
     "                           gantry.conf's pull_policy (always). A stored digest needs no registry\n"
     "  --image-file FILE        run this squashfs file (instead of the IMAGE operand)\n"
     "  --config-file FILE       the image config (JSON) for a squashfs file\n"
     "  -h, --help               print this help\n\n"
     "exit status: the command's; 125 gantry failed, 126 command not executable, 127 command not found\n",
     run_verb});
const Registration exec_registration({"exec",
                                      "exec [OPTIONS] NAME [CMD...]  run a command in a running named container",
                                      "usage: gantry exec [OPTIONS] NAME [--] [COMMAND [ARG...]]\n"
                                      "Runs COMMAND (default: /bin/sh) in the running container NAME.\n\n"
                                      "options:\n"
                                      "  -e, --env NAME=VALUE     set NAME to VALUE inside (repeatable)\n"
                                      "  -e, --env NAME[,NAME]    pass the caller's value of NAME (repeatable)\n"
                                      "  -w, --workdir DIR        working directory inside\n"
                                      "  -h, --help               print this help\n\n"
                                      "exit status: the command's; 125 gantry failed, 126 command not executable,\n"
                                      "127 command not found\n",
                                      exec_verb});
const Registration stop_registration(
    {"stop", "stop NAME...            stop named containers",
     "usage: gantry stop NAME...\n"
     "Stops the named containers. Exit status 1 when one could not be stopped, 125 on a\n"
     "usage error.\n\n"
     "options:\n"
     "  -h, --help   print this help\n",
     stop_verb});
const Registration ps_registration(
    {"ps", "ps                      list named containers",
     "usage: gantry ps\n"
     "Lists your named containers, tab-separated under a header: NAME, PID (of the holder),\n"
     "BACKEND.\n\n"
     "options:\n"
     "  -h, --help   print this help\n",
     ps_verb});

}  // namespace
}  // namespace gantry::cli
