// Diagnostics. Every line the user sees starts with "gantry: " (the SPANK plugin routes the same
// lines through slurm_error/slurm_info). Secrets are never passed here.
#pragma once

#include <functional>
#include <string>

namespace gantry::log {

enum class Level { error = 0, warning = 1, info = 2, debug = 3 };

// Lines at or below this level are emitted. Default: info; GANTRY_DEBUG=1 in the environment -> debug.
void set_level(Level level);
Level level();

// Where lines go. Default: stderr, prefixed "gantry: ". The plugin installs a sink that calls Slurm.
using Sink = std::function<void(Level, const std::string&)>;
void set_sink(Sink sink);

void error(const std::string& message);
void warning(const std::string& message);
void info(const std::string& message);
void debug(const std::string& message);

}  // namespace gantry::log
