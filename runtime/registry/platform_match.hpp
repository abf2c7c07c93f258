// Internal: the platform matching rules shared by platform.cpp and manifest.cpp.
#pragma once

#include "gantry/registry.hpp"

namespace gantry {

// Lower case, OCI architecture names, default variants filled in (arm64 -> v8, arm -> v7).
Platform normalize_platform(Platform p);

// 0: `entry` cannot run on `wanted`; higher is a better match (3 exact, 2 compatible variant,
// 1 same architecture with a variant the caller did not ask for).
int platform_match_score(const Platform& wanted, const Platform& entry);

}  // namespace gantry
