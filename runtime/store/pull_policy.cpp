// The pull policy's name -> value (include/gantry/pull.hpp). A file of its own: the plugin reads the
// policy in srun (plugin/srun.cpp), and linking pull.cpp for it would make spank_gantry.so need the
// converter's libraries (libarchive, libsquashfs), which the images an srun runs inside (a containerized
// batch script's) do not have.
#include "gantry/pull.hpp"

namespace gantry {

Result<PullPolicy> parse_pull_policy(const std::string& text) {
    if (text == "always") return PullPolicy::always;
    if (text == "missing") return PullPolicy::missing;
    if (text == "never") return PullPolicy::never;
    return make_error("unknown pull policy '" + text + "' (valid: always, missing, never)");
}

}  // namespace gantry
