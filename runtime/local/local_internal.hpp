// Pieces the readers of local images share (oci_layout.cpp, docker_archive.cpp).
#pragma once

#include <string>

#include "gantry/image_config.hpp"
#include "gantry/local_image.hpp"
#include "gantry/strings.hpp"

namespace gantry::local {

// The file's bytes, at most `cap`, checked against the digest its lookup computed.
Result<std::string> read_local_json(const LocalFile& file, size_t cap, const std::string& what);
// The layout's blob of `digest` (blobs/sha256/<hex>), whose bytes must hash to it.
Result<LocalFile> blob_file(const LocalFileLookup& files, const std::string& digest, const std::string& what);
// The config's diff_ids and the manifest's layers agree in number.
Status check_layers(const LocalImage& image, const ImageConfig& cfg, const std::string& what);
// "os/arch" from the config.
std::string config_platform(const ImageConfig& cfg);

}  // namespace gantry::local
