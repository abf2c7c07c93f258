// Image verbs for local files: import (an OCI layout, an oci- or docker-archive, docker/podman save
// into the store) and export (a stored image as an Enroot squashfs file).
#include "gantry/import.hpp"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "command.hpp"
#include "common.hpp"
#include "gantry/log.hpp"
#include "gantry/reference.hpp"
#include "gantry/strings.hpp"

namespace gantry::cli {
namespace {

struct ImportArgs {
    std::string source, store, platform, tag;
    bool quiet = false, layered = false;
    CLI::Option *store_opt, *platform_opt, *tag_opt;
};

int cmd_import(const ImportArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    auto platform_opt = given(a.platform_opt, a.platform);
    auto tag_opt = given(a.tag_opt, a.tag);
    bool quiet = a.quiet;
    const std::vector<std::string> args = {a.source};
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
        if (!ref->names_imported_image())
            return usage_error(make_error(
                "import: --tag " + *tag_opt + ": an imported image's name is under local/ (e.g. --tag local/" +
                (ref->registry == kDockerHubRegistry && starts_with(ref->repository, "library/")
                     ? ref->repository.substr(8)
                     : ref->repository) +
                ":" + ref->tag + "), so that it never stands for a registry's image"));
        opts.tags.push_back(*ref);
    }
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), true);
    if (!store) return fail(store.error());
    opts.layered = a.layered || config->layered_images;
    auto t0 = std::chrono::steady_clock::now();
    auto result = import_image(*config, *store, *source, opts);
    if (!result) return fail(result.error());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet) {
        char buf[256];
        if (result->produced)
            std::snprintf(buf, sizeof buf, "imported %s%s in %.1f s: %llu files, %s squashfs, config %s",
                          source->str().c_str(), opts.layered ? " as layers" : "", secs,
                          static_cast<unsigned long long>(result->stats.files),
                          format_bytes(result->stats.image_bytes).c_str(), result->config_digest.c_str());
        else
            std::snprintf(buf, sizeof buf, "%s is in the store already (config %s)", source->str().c_str(),
                          result->config_digest.c_str());
        log::info(buf);
    }
    std::printf("%s %s\n", result->digest.c_str(), result->squashfs_path.c_str());
    return 0;
}

struct ExportArgs {
    std::string image, store, output;
    bool force = false;
    CLI::Option *store_opt, *output_opt;
};

int cmd_export(const ExportArgs& a) {
    auto store_opt = given(a.store_opt, a.store);
    auto output = given(a.output_opt, a.output);
    bool force = a.force;
    const std::vector<std::string> args = {a.image};
    if (!output || output->empty())
        return usage_error(make_error("export: names no output file; add -o FILE.sqsh (see gantry export --help)"));
    auto config = load_config();
    if (!config) return fail(config.error());
    auto store = open_store(*config, store_opt.value_or(""), false);
    if (!store) return fail(store.error());
    auto img = find_stored(*store, args[0]);
    if (!img) return fail(img.error());
    auto stats = export_image(*config, *store, *img, *output, force);
    if (!stats) return fail(stats.error());
    std::printf("%s\n", output->c_str());
    return 0;
}

constexpr const char* kStoreHelp = "the image store (default: gantry.conf's store_path)";

VerbRunner define_import(CLI::App& app) {
    auto a = std::make_shared<ImportArgs>();
    a->store_opt = app.add_option("--store", a->store, kStoreHelp)->type_name("DIR");
    a->tag_opt = app.add_option("--tag", a->tag,
                                "record local/NAME[:TAG] for the image (your own name for it; see docs/user.md)")
                     ->type_name("NAME");
    a->platform_opt = app.add_option("--platform", a->platform, "the platform to pick from a multi-platform OCI layout")
                          ->type_name("OS/ARCH[/VARIANT]");
    app.add_flag("-q,--quiet", a->quiet, "no summary line");
    app.add_flag("--layered", a->layered,
                 "store it as layers (one squashfs per layer, shared with other images); the\n"
                 "default unless gantry.conf sets layered_images = no");
    app.add_option("SOURCE", a->source, "the local image")->required();
    return {[a] { return cmd_import(*a); }, {}};
}

VerbRunner define_export(CLI::App& app) {
    auto a = std::make_shared<ExportArgs>();
    a->output_opt = app.add_option("-o,--output", a->output, "the file to write (it appears complete or not at all)")
                        ->type_name("FILE");
    app.add_flag("-f,--force", a->force, "replace FILE if it exists");
    a->store_opt = app.add_option("--store", a->store, kStoreHelp)->type_name("DIR");
    app.add_option("IMAGE", a->image, "a stored image")->required();
    return {[a] { return cmd_export(*a); }, {}};
}

const Registration reg_import(
    {{"import", "import [--store DIR] [--tag NAME] SOURCE   import a local image (OCI layout, archive, docker/podman)",
      "[OPTIONS] SOURCE",
      "Converts a local image into the store, as `gantry pull` does a registry's, and prints\n"
      "'<digest> <path>' (the image's record, or its squashfs file with layered_images = no).\n"
      "SOURCE is one of\n"
      "  oci:DIR[:TAG]                  an OCI layout directory (skopeo copy ... oci:DIR:TAG)\n"
      "  oci-archive:FILE[:TAG]         a tar of an OCI layout\n"
      "  docker-archive:FILE[:IMAGE]    `docker save` output (IMAGE picks one of several)\n"
      "  dockerd://IMAGE                runs `docker save IMAGE` and imports its output\n"
      "  podman://IMAGE                 runs `podman save IMAGE` and imports its output"},
     define_import});
const Registration reg_export(
    {{"export", "export [--store DIR] [--force] IMAGE -o FILE.sqsh   write an image as an Enroot squashfs file",
      "[OPTIONS] IMAGE -o FILE.sqsh",
      "Writes a stored image as a squashfs file that Enroot (enroot create/start) and `gantry run\n"
      "FILE.sqsh` can start: the image's tree plus /etc/environment (its Env) and /etc/rc (its\n"
      "WorkingDir, entrypoint and command). IMAGE as for gantry inspect. Prints FILE."},
     define_export});

}  // namespace
}  // namespace gantry::cli
