// The parts of an OCI/Docker image configuration that the runtime uses, parsed from the config blob.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gantry/result.hpp"

namespace gantry {

struct ImageConfig {
    std::string architecture;
    std::string os;
    std::vector<std::string> env;         // "NAME=value", in image order
    std::vector<std::string> entrypoint;  // empty when unset
    std::vector<std::string> cmd;         // empty when unset
    std::string working_dir;              // empty when unset
    std::string user;                     // recorded, not applied (Enroot/Pyxis ignore it too)
    std::vector<std::string> volumes;
    std::map<std::string, std::string> labels;
    std::vector<std::string> diff_ids;  // rootfs.diff_ids, bottom layer first
};

// Parses an OCI image config / Docker container config JSON document.
Result<ImageConfig> parse_image_config(const std::string& json);

// Value of NAME in an env list ("NAME=value" entries); the last entry wins, like a shell.
std::optional<std::string> find_env(const std::vector<std::string>& env, const std::string& name);

}  // namespace gantry
