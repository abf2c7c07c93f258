// Image verbs for local files: import (an OCI layout, an oci- or docker-archive, docker/podman save
// into the store) and export (a stored image as an Enroot squashfs file).
#include "gantry/import.hpp"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>

#include "command.hpp"
#include "common.hpp"
#include "gantry/log.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"

namespace gantry::cli {
namespace {

int cmd_import(std::vector<std::string> args) {
    if (take_help(args)) return print_usage("import");
    auto store_opt = take_option(args, "--store");
    auto platform_opt = take_option(args, "--platform");
    auto tag_opt = take_option(args, "--tag");
    bool quiet = take_flag(args, "--quiet") || take_flag(args, "-q");
    if (auto st = reject_unknown_options(args, "import"); !st) return usage_error(st.error());
    if (args.size() != 1) return usage_error(make_error("import: takes exactly one SOURCE (see gantry import --help)"));
    auto source = parse_local_source(args[0]);
    if (!source) return usage_error(source.error());
    ImportOptions opts;
    if (platform_opt) {
        auto p = Platform::parse(*platform_opt);
        if (!p) return usage_error(p.error().wrap("import: --platform"));
        opts.platform = *p;
    }
    if (tag_opt) {
        auto ref = parse_reference(*tag_opt);
        if (!ref) return usage_error(ref.error().wrap("import: --tag"));
        if (!ref->digest.empty())
            return usage_error(make_error("import: --tag " + *tag_opt + ": a tag names no digest"));
        opts.tags.push_back(*ref);
    }
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), true);
    if (!store) return fail(store.error());
    auto t0 = std::chrono::steady_clock::now();
    auto result = import_image(*config, *store, *source, opts);
    if (!result) return fail(result.error());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet) {
        char buf[256];
        if (result->produced)
            std::snprintf(buf, sizeof buf, "imported %s in %.1f s: %llu files, %s squashfs, config %s",
                          source->str().c_str(), secs, static_cast<unsigned long long>(result->stats.files),
                          format_bytes(result->stats.image_bytes).c_str(), result->config_digest.c_str());
        else
            std::snprintf(buf, sizeof buf, "%s is in the store already (config %s)", source->str().c_str(),
                          result->config_digest.c_str());
        log::info(buf);
    }
    std::printf("%s %s\n", result->digest.c_str(), result->squashfs_path.c_str());
    return 0;
}

int cmd_export(std::vector<std::string> args) {
    if (take_help(args)) return print_usage("export");
    auto store_opt = take_option(args, "--store");
    auto output_long = take_option(args, "--output");
    auto output_short = take_option(args, "-o");
    bool force = take_flag(args, "--force") || take_flag(args, "-f");
    if (auto st = reject_unknown_options(args, "export"); !st) return usage_error(st.error());
    if (args.size() != 1) return usage_error(make_error("export: takes exactly one IMAGE (see gantry export --help)"));
    auto output = output_short ? output_short : output_long;
    if (!output || output->empty())
        return usage_error(make_error("export: names no output file; add -o FILE.sqsh (see gantry export --help)"));
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), false);
    if (!store) return fail(store.error());
    auto img = find_stored(*store, args[0]);
    if (!img) return fail(img.error());
    auto stats = export_image(*config, *img, *output, force);
    if (!stats) return fail(stats.error());
    std::printf("%s\n", output->c_str());
    return 0;
}

const Registration reg_import(
    {"import", "import [--store DIR] [--tag NAME] SOURCE   import a local image (OCI layout, archive, docker/podman)",
     "usage: gantry import [OPTIONS] SOURCE\n"
     "Converts a local image into the store, as `gantry pull` does a registry's, and prints\n"
     "'<digest> <squashfs path>'. SOURCE is one of\n"
     "  oci:DIR[:TAG]                  an OCI layout directory (skopeo copy ... oci:DIR:TAG)\n"
     "  oci-archive:FILE[:TAG]         a tar of an OCI layout\n"
     "  docker-archive:FILE[:IMAGE]    `docker save` output (IMAGE picks one of several)\n"
     "  dockerd://IMAGE                runs `docker save IMAGE` and imports its output\n"
     "  podman://IMAGE                 runs `podman save IMAGE` and imports its output\n\n"
     "options:\n"
     "  --store DIR                     the image store (default: gantry.conf's store_path)\n"
     "  --tag NAME                      record NAME (a reference) for the image, like a pulled tag\n"
     "  --platform OS/ARCH[/VARIANT]    the platform to pick from a multi-platform OCI layout\n"
     "  -q, --quiet                     no summary line\n"
     "  -h, --help                      print this help\n",
     cmd_import});
const Registration reg_export(
    {"export", "export [--store DIR] [--force] IMAGE -o FILE.sqsh   write an image as an Enroot squashfs file",
     "usage: gantry export [OPTIONS] IMAGE -o FILE.sqsh\n"
     "Writes a stored image as a squashfs file that Enroot (enroot create/start) and `gantry run\n"
     "FILE.sqsh` can start: the image's tree plus /etc/environment (its Env) and /etc/rc (its\n"
     "WorkingDir, entrypoint and command). IMAGE as for gantry inspect. Prints FILE.\n\n"
     "options:\n"
     "  -o, --output FILE    the file to write (it appears complete or not at all)\n"
     "  -f, --force          replace FILE if it exists\n"
     "  --store DIR          the image store (default: gantry.conf's store_path)\n"
     "  -h, --help           print this help\n",
     cmd_export});

}  // namespace
}  // namespace gantry::cli
