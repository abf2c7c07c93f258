// Image verbs of the CLI: pull, images, inspect, rm, gc.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "common.hpp"
#include "gantry/auth.hpp"
#include "gantry/digest.hpp"
#include "gantry/files.hpp"
#include "gantry/image_config.hpp"
#include "gantry/launcher.hpp"
#include "gantry/log.hpp"
#include "gantry/pull.hpp"
#include "gantry/pull_report.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"
#include "progress.hpp"

namespace gantry::cli {
namespace {

// RFC 3339 in UTC for --format json; null when never recorded.
nlohmann::json json_time(int64_t t) {
    if (t <= 0) return nullptr;
    std::time_t tt = static_cast<std::time_t>(t);
    std::tm tm{};
    ::gmtime_r(&tt, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string format_time(int64_t t) {
    if (t <= 0) return "-";
    std::time_t tt = static_cast<std::time_t>(t);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&tt));
    return buf;
}

// Root's gc/rm in a store that one unprivileged account owns (a per-user store, the store_owner store)
// run as that account (become_store_owner says why that is safe); in any other store the library
// applies root's rule (ImageStore::check_root_may_modify).
Status act_as_store_owner(const ImageStore& store) {
    if (::geteuid() != 0) return {};
    auto owner = store.sole_owner();
    if (!owner) return {};
    GANTRY_TRY(become_store_owner(*owner));
    log::debug("acting as uid " + std::to_string(*owner) + ", the owner of " + store.root());
    return {};
}

// Reads a whole descriptor (a pipe) to its end and closes it; at most 1 MiB.
Result<std::string> read_fd_to_end(int fd) {
    std::string out;
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            ::close(fd);
            return system_error("reading the credentials descriptor " + std::to_string(fd));
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
        if (out.size() > (1u << 20)) break;
    }
    ::close(fd);
    return out;
}

Result<int> parse_fd(const std::string& option, const std::string& text) {
    char* end = nullptr;
    long n = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || n < 3 || n > 1023)
        return make_error(option + ": expected a descriptor number >= 3, got '" + text + "'");
    if (::fcntl(static_cast<int>(n), F_GETFD) < 0) return system_error(option + " " + text);
    return static_cast<int>(n);
}

// The credential hand-over between the two halves of a pull into a trusted store (plugin/pull.cpp):
// the job user's half (--credentials-only --credentials-out-fd) looks up the user's own credentials and
// writes them in the one hand-over format (encode_credential_hand_over, auth.hpp) to the descriptor;
// the store owner's half (--credentials-fd) reads exactly that and uses nothing else, never the store
// account's own files. Secrets travel only through the inherited pipe: never argv, the environment or a file.
// The job user's half: look up, with the user's identity and files, the credentials for the image's
// registry and hand them to the descriptor ({} when there are none). No registry request and no store
// access: the store owner's half resolves the reference with them, so the registry's yes/no and the
// digest come from a process the job user cannot tamper with.
int credentials_only(const ImageReference& ref, int out_fd) {
    std::optional<Credentials> found = default_credential_lookup()(ref);
    std::string payload = encode_credential_hand_over(ref.registry, found);
    if (auto sent = write_all(out_fd, payload, "handing over the credentials"); !sent) return fail(sent.error());
    ::close(out_fd);
    return 0;
}

struct PullArgs {
    std::string image, store, platform, pull, report_fd, creds_out, creds_in, resolved;
    bool quiet = false, credentials_only = false, layered = false, whole = false;
    CLI::Option *store_opt, *platform_opt, *pull_opt, *report_opt, *creds_out_opt, *creds_in_opt, *resolved_opt;
};

// A wrong command line with --report-fd: the plugin reads why from the report as from any failure.
void report_usage_error(const PullArgs& a, const std::string& message) {
    if (a.report_opt->count() == 0) return;
    if (auto fd = parse_fd("--report-fd", a.report_fd))
        send_pull_report(*fd, PullReport{{}, {}, {}, {}, PullErrorKind::usage, message, {}});
}

int cmd_pull(const PullArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    auto platform_opt = given(a.platform_opt, a.platform);
    bool quiet = a.quiet;
    auto pull_opt = given(a.pull_opt, a.pull);
    auto report_opt = given(a.report_opt, a.report_fd);
    bool credentials_only_flag = a.credentials_only;
    auto creds_out_opt = given(a.creds_out_opt, a.creds_out);
    auto creds_in_opt = given(a.creds_in_opt, a.creds_in);
    const std::vector<std::string> args = {a.image};
    int report_fd = -1;
    // Every outcome goes to stderr (people) and, with --report-fd, into the report (the plugin).
    auto finish = [&](PullErrorKind kind, const Error& error) {
        if (report_fd >= 0) send_pull_report(report_fd, PullReport{{}, {}, {}, {}, kind, error.message, {}});
        return fail(error);
    };
    // A wrong command line: reported the same way, exit status 2.
    auto finish_usage = [&](const Error& error) {
        finish(PullErrorKind::usage, error);
        return kUsageError;
    };
    if (report_opt) {
        auto fd = parse_fd("--report-fd", *report_opt);
        if (!fd) return usage_error(fd.error());
        report_fd = *fd;
    }
    if (credentials_only_flag != creds_out_opt.has_value())
        return finish_usage(make_error("pull: --credentials-only and --credentials-out-fd go together"));
    auto ref = parse_reference(args[0]);
    if (!ref) return finish(PullErrorKind::reference, ref.error().wrap("failed to import docker image " + args[0]));
    if (creds_out_opt) {
        auto fd = parse_fd("--credentials-out-fd", *creds_out_opt);
        if (!fd) return finish_usage(fd.error());
        return credentials_only(*ref, *fd);
    }
    auto config = load_config();
    if (!config) return finish(PullErrorKind::usage, config.error());
    PullOptions opts;
    // The plugin's pull of a tag srun resolved for the step: fetch that digest, record the tag.
    if (auto resolved = given(a.resolved_opt, a.resolved)) {
        if (!ref->digest.empty() || !validate_digest(*resolved))
            return finish_usage(make_error("pull: --tag-resolved-to takes a digest, for an IMAGE without one"));
        opts.resolved_tag = *ref;
        ref->digest = *resolved;
    }
    auto policy = pull_policy(*config, pull_opt);
    if (!policy) return finish_usage(policy.error());
    opts.policy = *policy;
    // gantry.conf's layered_images, unless the extract backend (which needs whole images) is the site's,
    // or this is the plugin's pull (--report-fd) on a node whose kernel cannot stack layers: the step
    // that follows runs here, so it gets a whole image (made from stored layers where there are some).
    // --whole (hidden, the plugin's: the step's backend cannot stack layers, see can_stack_layers)
    // asks for a whole image whatever gantry.conf says.
    if (a.whole && a.layered) return finish_usage(make_error("pull: --whole and --layered exclude each other"));
    opts.layered = !a.whole && (a.layered || (config->layered_images && config->mount_backend != "extract" &&
                                              (!report_opt || kernel_stacks_layers())));
    if (platform_opt) {
        auto p = Platform::parse(*platform_opt);
        if (!p) return finish_usage(p.error().wrap("pull: --platform"));
        opts.platform = *p;
    }
    if (creds_in_opt) {
        auto fd = parse_fd("--credentials-fd", *creds_in_opt);
        if (!fd) return finish_usage(fd.error());
        auto text = read_fd_to_end(*fd);
        if (!text) return finish(PullErrorKind::usage, text.error());
        auto lookup = decode_credential_hand_over(*text);
        if (!lookup) return finish(PullErrorKind::usage, lookup.error().wrap("--credentials-fd"));
        opts.credentials = std::move(*lookup);
        opts.registry_authorizes = true;  // the job user's credentials, checked at the registry every time
        opts.credential_sources = "the user's credentials handed over to the store account (" +
                                  std::string(*text == "{}" ? "none" : "for one registry") + ")";
    }
    auto store = open_store(*config, store_opt.value_or(""), true);
    if (!store) return finish(PullErrorKind::store, store.error().wrap("failed to import docker image " + args[0]));
    ProgressPrinter printer(quiet);
    opts.on_progress = [&](const PullProgress& p) { printer.show(p); };
    auto t0 = std::chrono::steady_clock::now();
    auto result = pull_image(*config, *store, *ref, opts);
    printer.finish();
    if (!result) return finish(PullErrorKind::pull, result.error().wrap("failed to import docker image " + args[0]));
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet && result->produced && opts.layered) {
        char buf[200];
        std::snprintf(buf, sizeof buf,
                      "pulled %s as layers in %.1f s: %zu layers converted (%llu files, %s squashfs), %zu reused",
                      ref->str().c_str(), secs, result->layers_converted,
                      static_cast<unsigned long long>(result->stats.files),
                      format_bytes(result->stats.image_bytes).c_str(), result->layers_reused);
        log::info(buf);
    } else if (!quiet && result->produced) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "pulled %s in %.1f s: %llu files, %s squashfs", ref->str().c_str(), secs,
                      static_cast<unsigned long long>(result->stats.files),
                      format_bytes(result->stats.image_bytes).c_str());
        log::info(buf);
    }
    if (report_fd >= 0) {
        auto img = store->find(result->digest);
        if (!img)
            return finish(PullErrorKind::store, make_error("image " + result->digest + " is not in the store " +
                                                           store->root() + " after pulling it"));
        PullReport report{
            result->digest, img->squashfs_path, {}, img->metadata.config_json, PullErrorKind::none, {}, {}};
        report.outcome = result->produced ? "pulled" : result->waited ? "waited" : "stored";
        if (img->layered()) {
            for (const auto& chain : img->metadata.layer_chain)
                report.layer_paths.push_back(store->layer_squashfs_path(chain));
            report.squashfs_path = report.layer_paths.back();
        }
        send_pull_report(report_fd, report);
    }
    std::printf("%s %s\n", result->digest.c_str(), result->squashfs_path.c_str());
    return 0;
}

struct ImagesArgs {
    std::string store, format;
    bool digests = false, quiet = false;
    CLI::Option *store_opt, *format_opt;
};

int cmd_images(const ImagesArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    auto format_opt = given(a.format_opt, a.format);
    bool digests = a.digests, quiet = a.quiet;
    if (format_opt && *format_opt != "json" && *format_opt != "table")
        return usage_error(make_error("images: unknown --format '" + *format_opt + "' (json or table)"));
    bool json = format_opt && *format_opt == "json";
    if (json && quiet) return usage_error(make_error("images: --quiet and --format json exclude each other"));
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), false);
    if (!store) return fail(store.error());
    std::vector<std::string> ignored;
    auto all = store->list(&ignored);
    if (!all) return fail(all.error());
    for (const auto& why : ignored) log::warning(why);
    if (quiet) {
        for (const auto& img : *all) std::printf("%s\n", img.digest.c_str());
        return 0;
    }
    if (json) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& img : *all)
            out.push_back({{"digest", img.digest},
                           {"references", img.metadata.references},
                           {"size", img.metadata.image_bytes},
                           {"pulled_at", json_time(img.metadata.pulled_at)},
                           {"last_used", json_time(img.last_used)},
                           {"in_use", store->in_use(img.digest)},
                           {"layers", img.layered() ? img.metadata.layers.size() : size_t{0}},
                           {"lowers", img.layered() ? img.metadata.layer_chain.size() : size_t{0}}});
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    struct Row {
        std::string ref, digest, size, last_used, in_use;
    };
    std::vector<Row> rows = {{"REFERENCE", "DIGEST", "SIZE", "LAST USED", "IN USE"}};
    for (const auto& img : *all)
        rows.push_back({img.metadata.references.empty() ? "-" : img.metadata.references.front(),
                        digests ? img.digest : img.digest.substr(0, 19), format_bytes(img.metadata.image_bytes),
                        format_time(img.last_used), store->in_use(img.digest) ? "yes" : "no"});
    // Each column as wide as its widest cell, so a full digest or a long reference keeps the others aligned.
    size_t ref_w = 0, digest_w = 0, size_w = 0, used_w = 0;
    for (const auto& r : rows) {
        ref_w = std::max(ref_w, r.ref.size());
        digest_w = std::max(digest_w, r.digest.size());
        size_w = std::max(size_w, r.size.size());
        used_w = std::max(used_w, r.last_used.size());
    }
    for (const auto& r : rows)
        std::printf("%-*s  %-*s  %*s  %-*s  %s\n", static_cast<int>(ref_w), r.ref.c_str(), static_cast<int>(digest_w),
                    r.digest.c_str(), static_cast<int>(size_w), r.size.c_str(), static_cast<int>(used_w),
                    r.last_used.c_str(), r.in_use.c_str());
    return 0;
}

// inspect and rm: IMAGE operands and --store.
struct StoredArgs {
    std::vector<std::string> images;
    std::string store;
    CLI::Option* store_opt;
};

int cmd_inspect(const StoredArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    const auto& args = a.images;
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), false);
    if (!store) return fail(store.error());
    auto img = find_stored(*store, args[0]);
    if (!img) return fail(img.error());
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : img->metadata.layers)
        layers.push_back({{"digest", l.digest}, {"size", l.size}, {"mediaType", l.media_type}});
    nlohmann::json cfg = nlohmann::json::parse(img->metadata.config_json, nullptr, false);
    nlohmann::json out = {
        {"digest", img->digest},
        {"references", img->metadata.references},
        {"platform", img->metadata.platform},
        {"squashfs", img->squashfs_path},
        {"size", img->metadata.image_bytes},
        {"compressor", img->metadata.compressor},
        {"block_size", img->metadata.block_size},
        {"layers", layers},
        {"config", cfg.is_discarded() ? nlohmann::json(nullptr) : cfg.value("config", nlohmann::json::object())},
        {"pulled", format_time(img->metadata.pulled_at)},
        {"last_used", format_time(img->last_used)},
        {"in_use", store->in_use(img->digest)},
    };
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
}

int cmd_rm(const StoredArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    const auto& args = a.images;
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), false);
    if (!store) return fail(store.error());
    if (auto st = act_as_store_owner(*store); !st) return fail(st.error().wrap("removing images"));
    int status = 0;
    for (const auto& name : args) {
        auto img = find_stored(*store, name);
        if (!img) {
            status = fail(img.error());
            continue;
        }
        if (auto st = store->remove(img->digest); !st) {
            status = fail(st.error().wrap("removing " + name));
            continue;
        }
        std::printf("removed %s\n", img->digest.c_str());
    }
    return status;
}

struct GcArgs {
    std::string store, max_bytes, unused_for;
    CLI::Option *store_opt, *max_bytes_opt, *unused_opt;
};

int cmd_gc(const GcArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    auto max_bytes_opt = given(a.max_bytes_opt, a.max_bytes);
    auto unused_opt = given(a.unused_opt, a.unused_for);
    unsigned long long max_bytes = 0;
    long long unused = 0;
    if (max_bytes_opt) {
        auto n = parse_size(*max_bytes_opt);
        if (!n) return usage_error(n.error().wrap("gc: --max-bytes"));
        max_bytes = *n;
    }
    if (unused_opt) {
        auto n = parse_duration(*unused_opt);
        if (!n) return usage_error(n.error().wrap("gc: --unused-for"));
        unused = *n;
    }
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), false);
    if (!store) return fail(store.error());
    if (auto st = act_as_store_owner(*store); !st) return fail(st.error().wrap("collecting garbage"));
    auto r = store->gc(max_bytes, std::chrono::seconds(unused));
    if (!r) return fail(r.error().wrap("collecting garbage"));
    for (const auto& d : r->removed) std::printf("removed %s\n", d.c_str());
    for (const auto& d : r->removed_layers) std::printf("removed layer %s\n", d.c_str());
    for (const auto& d : r->kept_in_use) std::printf("kept %s (in use)\n", d.c_str());
    std::printf("freed %s, %s left\n", format_bytes(r->bytes_freed).c_str(), format_bytes(r->bytes_left).c_str());
    // A removal that failed is an error, not an image kept: reported as one, and the exit status says so.
    int status = 0;
    for (const auto& e : r->failed) status = fail(e.wrap("collecting garbage"));
    return status;
}

constexpr const char* kStoreHelp = "the image store (default: gantry.conf's store_path)";

CLI::Option* add_store(CLI::App& app, std::string& store) {
    return app.add_option("--store", store, kStoreHelp)->type_name("DIR");
}

VerbRunner define_pull(CLI::App& app) {
    auto a = std::make_shared<PullArgs>();
    a->store_opt = add_store(app, a->store);
    a->platform_opt = app.add_option("--platform", a->platform, "the platform to pick from a multi-platform image")
                          ->type_name("OS/ARCH[/VARIANT]");
    a->pull_opt = app.add_option("--pull", a->pull,
                                 "when to ask the registry what a tag names (default:\n"
                                 "GANTRY_PULL_POLICY, else gantry.conf's pull_policy)")
                      ->type_name("always|missing|never");
    app.add_flag("-q,--quiet", a->quiet, "no progress");
    app.add_flag("--layered", a->layered,
                 "store the image as layers (one squashfs per layer, shared with other\n"
                 "images), converting only those the store lacks; the default unless\n"
                 "gantry.conf sets layered_images = no");
    // Hidden (group ""): the plugin's side of a pull (plugin/pull.cpp): the typed report
    // (include/gantry/pull_report.hpp) and the two halves of a pull into a trusted store (see
    // encode_credential_hand_over in auth.hpp).
    a->report_opt = app.add_option("--report-fd", a->report_fd)->group("");
    app.add_flag("--whole", a->whole)->group("");
    app.add_flag("--credentials-only", a->credentials_only)->group("");
    a->creds_out_opt = app.add_option("--credentials-out-fd", a->creds_out)->group("");
    a->creds_in_opt = app.add_option("--credentials-fd", a->creds_in)->group("");
    a->resolved_opt = app.add_option("--tag-resolved-to", a->resolved)->group("");
    app.add_option("IMAGE", a->image, "a registry reference")->required();
    return {[a] { return cmd_pull(*a); }, [a](const std::string& message) { report_usage_error(*a, message); }};
}

VerbRunner define_images(CLI::App& app) {
    auto a = std::make_shared<ImagesArgs>();
    a->store_opt = add_store(app, a->store);
    app.add_flag("--digests", a->digests, "full digests in the DIGEST column");
    app.add_flag("-q,--quiet", a->quiet, "only the digests, one per line");
    a->format_opt = app.add_option("--format", a->format,
                                   "json: a JSON array of {digest, references, size, pulled_at,\n"
                                   "last_used, in_use}; times in RFC 3339 UTC, null when unknown;\n"
                                   "table: the columns (the default)")
                        ->type_name("json|table");
    return {[a] { return cmd_images(*a); }, {}};
}

VerbRunner define_inspect(CLI::App& app) {
    auto a = std::make_shared<StoredArgs>();
    a->store_opt = add_store(app, a->store);
    app.add_option("IMAGE", a->images, "a digest, a prefix of 12+ hex digits, or a pulled reference")
        ->required()
        ->expected(1);
    return {[a] { return cmd_inspect(*a); }, {}};
}

VerbRunner define_rm(CLI::App& app) {
    auto a = std::make_shared<StoredArgs>();
    a->store_opt = add_store(app, a->store);
    app.add_option("IMAGE", a->images, "as for gantry inspect")->required();
    return {[a] { return cmd_rm(*a); }, {}};
}

VerbRunner define_gc(CLI::App& app) {
    auto a = std::make_shared<GcArgs>();
    a->store_opt = add_store(app, a->store);
    a->max_bytes_opt =
        app.add_option("--max-bytes", a->max_bytes, "remove until the store holds at most SIZE (500G, 2T, 4096)")
            ->type_name("SIZE");
    a->unused_opt =
        app.add_option("--unused-for", a->unused_for, "remove images unused for DURATION (90s, 15m, 12h, 30d)")
            ->type_name("DURATION");
    return {[a] { return cmd_gc(*a); }, {}};
}

const Registration reg_pull(
    {{"pull", "pull [--store DIR] [--platform OS/ARCH] [--pull POLICY] [--quiet] IMAGE   fetch an image into the store",
      "[OPTIONS] IMAGE",
      "Fetches IMAGE (a registry reference) into the store, one squashfs per layer (gantry.conf\n"
      "layered_images, the default), and prints '<digest> <path>': the image's record (with\n"
      "layered_images = no or the extract backend: the image's one squashfs file)."},
     define_pull});
const Registration reg_images(
    {{"images", "images [--store DIR] [-q] [--digests] [--format json]   list the images in the store", "[OPTIONS]",
      "Lists the images in the store: reference, digest, size, last use, whether in use."},
     define_images});
const Registration reg_inspect(
    {{"inspect", "inspect [--store DIR] IMAGE   show an image's digest, size, layers and config", "[--store DIR] IMAGE",
      "Prints one stored image as JSON: digest, references, platform, squashfs, size, layers,\n"
      "config, pulled, last_used, in_use. IMAGE: a digest, a prefix of 12+ hex digits, or a\n"
      "reference the store has pulled."},
     define_inspect});
const Registration reg_rm({{"rm", "rm [--store DIR] IMAGE...   remove images from the store (not while in use)",
                            "[--store DIR] IMAGE...",
                            "Removes images from the store; an image in use stays. IMAGE as for gantry inspect."},
                           define_rm});
const Registration reg_gc({{"gc", "gc [--max-bytes N] [--unused-for DURATION]   remove least recently used images",
                            "[OPTIONS]",
                            "Removes images not in use, least recently used first, and prints what it freed."},
                           define_gc});

}  // namespace
}  // namespace gantry::cli
