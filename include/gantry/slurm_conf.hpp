// Slurm's own configuration files, read the way Slurm reads them, so that `gantry doctor` checks the
// plugstack.conf Slurm will actually load: slurm.conf from $SLURM_CONF or the usual places
// (/etc/slurm, ParallelCluster's /opt/slurm/etc), its PlugStackConfig (default: plugstack.conf beside
// slurm.conf), and plugstack.conf's `include GLOB` lines (a relative glob is taken relative to the
// directory of the file that includes it, as Slurm's plugstack.c does).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gantry::slurm_conf {

// Where slurm.conf is looked for when $SLURM_CONF is not set: Slurm's default for Debian and SchedMD's
// packages, then AWS ParallelCluster's prefix.
inline constexpr const char* kDefaultLocations[] = {"/etc/slurm/slurm.conf", "/opt/slurm/etc/slurm.conf"};

// $SLURM_CONF when set (Slurm uses it as given, existing or not), else the first default location
// that exists, else the first default location.
std::string locate(const std::optional<std::string>& slurm_conf_env);

// The value of KEY in slurm.conf (case-insensitive, as Slurm's parser; the last assignment wins),
// following its `include FILE` lines (relative to slurm.conf's directory). Nullopt when unset.
std::optional<std::string> value(const std::string& slurm_conf, std::string_view key);

// PlugStackConfig, or plugstack.conf in slurm.conf's directory.
std::string plugstack_path(const std::string& slurm_conf);

// One `required|optional PLUGIN [ARGS...]` line of a plugstack file.
struct PluginLine {
    std::string file;  // the plugstack file it is in
    int line = 0;      // 1-based
    std::string kind;  // "required" or "optional" (anything else is kept as written: Slurm rejects it)
    std::string plugin;
    std::vector<std::string> args;
};

struct PlugstackScan {
    std::vector<std::string> files;        // every file read, in Slurm's order
    std::vector<std::string> unreadable;   // named (top file or an include match) but not readable
    std::vector<std::string> empty_globs;  // include patterns (made absolute) that matched nothing
    std::optional<PluginLine> found;       // the first line whose plugin's file name is `plugin_name`
};

// Reads `plugstack` and what it includes, depth first as Slurm loads plugins, and stops at the first
// plugin line whose plugin file name (the last path component) is `plugin_name`.
PlugstackScan find_plugin(const std::string& plugstack, std::string_view plugin_name);

// The words of one plugstack line, or nothing for a blank or comment line ('#' to the end of the line
// is a comment, as in Slurm).
std::vector<std::string> line_words(std::string_view line);

// "22.05" from `scontrol --version` output ("slurm 22.05.8", "slurm-wlm 24.11.5"); nullopt when it
// has no YY.MM version.
std::optional<std::string> release_of(std::string_view version_output);

}  // namespace gantry::slurm_conf
