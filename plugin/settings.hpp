// plugstack.conf arguments of spank_gantry.so, e.g.
//   required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_gantry.so container_scope=job config=/etc/gantry/gantry.conf
// An unknown key makes the plugin refuse to load, naming the key (a typo must not go unnoticed).
#pragma once

#include <string>

#include "gantry/result.hpp"

namespace gantry::plugin {

struct Settings {
    // Pyxis keys that still mean something here.
    std::string runtime_path;             // overrides gantry.conf's runtime_path when set
    bool execute_entrypoint = false;      // default for --container-entrypoint
    std::string container_scope = "job";  // job | global: how --container-name is scoped
    bool sbatch_support = true;           // run the batch script in the container for #SBATCH --container-image
    // Ours.
    std::string config = "/etc/gantry/gantry.conf";
    std::string store;          // overrides gantry.conf's store_path
    std::string mount_backend;  // overrides gantry.conf's mount_backend
    std::string gantry;         // the gantry CLI used for pulls (default: installed next to us)
    std::string trace;          // a file trace points are appended to (bench/srun.sh --breakdown)
};

Result<Settings> parse_settings(int argc, char** argv);

}  // namespace gantry::plugin
