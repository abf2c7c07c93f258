// `gantry import`: a local image (include/gantry/local_image.hpp) into the store, through the same
// converter and the same publication as a pull (runtime/store/pull.cpp); and `gantry export`: a stored
// image as a squashfs file Enroot can start. Owner: runtime/store/.
#pragma once

#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/image_config.hpp"
#include "gantry/local_image.hpp"
#include "gantry/result.hpp"
#include "gantry/squashfs.hpp"
#include "gantry/store.hpp"

namespace gantry {

struct ImportOptions {
    Platform platform = Platform::host();  // for a multi-platform OCI layout
    std::vector<ImageReference> tags;      // --tag: references recorded for the image, besides RepoTags
    bool layered = false;  // --layered (or gantry.conf's layered_images): store it as layers, as a pull would
};

struct ImportResult {
    std::string digest;         // the store's key: the manifest digest (see read_docker_archive)
    std::string config_digest;  // what equals a registry pull of the same image
    std::string squashfs_path;
    std::vector<std::string> references;  // recorded tags, or the source itself when there are none
    bool produced = false;                // false: the store held the image already
    ConversionStats stats;
};

// Reads `source` as the user (the bytes are the user's: never call this with privileges), converts its
// layers and publishes the image. An archive or a `save` stream is unpacked into a work area of the
// store's staging directory (held under a producer lock so gc leaves it alone, removed at the end
// whatever happens): the converter reads the top layer first, the archive names it last. Nothing
// reaches images/ unless every digest checked out and the squashfs is complete.
Result<ImportResult> import_image(const Config& config, const ImageStore& store, const LocalSource& source,
                                  const ImportOptions& options);

// Enroot's files for an image: /etc/environment (the config's Env, one NAME=value a line) and /etc/rc
// (cd to WorkingDir, then exec the entrypoint and the command, or the arguments given).
std::string enroot_environment(const ImageConfig& config);
std::string enroot_rc(const ImageConfig& config);

// Writes the stored image `image` of `store` to `output` as an Enroot image: its tree plus
// /etc/environment and /etc/rc, one squashfs file (a layered image's layers composed as overlayfs
// shows them). The image is held in use meanwhile, so gc leaves it and its layers alone. The file
// appears by rename when complete; an existing `output` is an error unless `force`.
Result<ConversionStats> export_image(const Config& config, const ImageStore& store, const StoredImage& image,
                                     const std::string& output, bool force);

}  // namespace gantry
