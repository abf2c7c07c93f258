// The EFA check (include/gantry/fabric_check.hpp) of a running container, from outside it: what
// `gantry run` does before its command, and `gantry run --fabric-check` (under `gantry doctor --image`).
#pragma once

#include <vector>

#include "gantry/fabric_check.hpp"
#include "gantry/launcher.hpp"
#include "gantry/result.hpp"

namespace gantry {

// A child joins the container (as run_in's commands do: the caller's identity, the container's
// namespaces) and runs check_fabric with the environment a command there gets (`caller_env` under
// EnvironmentRule::docker); its answer comes back through a pipe, within 30 s.
Result<FabricReport> probe_fabric(const ContainerState& container, const std::vector<std::string>& caller_env);

}  // namespace gantry
