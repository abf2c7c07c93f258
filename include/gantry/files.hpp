// File-system helpers shared by the store, the CLI and the launcher.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry {

// mkdir -p with `mode` for the directories it creates.
Status make_directories(const std::string& path, mode_t mode = 0755);

Result<std::string> read_file(const std::string& path);
// The file's content, or nothing when it cannot be read (for optional files: configs, sysfs entries).
std::optional<std::string> try_read_file(const std::string& path);

// Writes `content` to a temporary file beside `path`, fsyncs it and renames it over `path`, so readers
// see the old or the new content, never a mix.
Status write_file_atomic(const std::string& path, const std::string& content, mode_t mode = 0644);

// rm -rf; a missing path is fine.
Status remove_tree(const std::string& path);

// Total size in bytes of regular files under `path` (not following symlinks).
uint64_t tree_size(const std::string& path);

// "host:pid" for lock owner records and messages.
std::string host_and_pid();

}  // namespace gantry
