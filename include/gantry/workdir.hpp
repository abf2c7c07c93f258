// The working directory a container's process starts in, as the user names it (--container-workdir,
// gantry run/exec --workdir).
#pragma once

#include <string>
#include <string_view>

#include "gantry/result.hpp"

namespace gantry {

// Normalizes a working directory inside the container as `chdir` there reads it from the container's
// root: absolute or starting with '.'; a `..` component goes up one level, never above the root
// ("../" -> "/", "/a/../b" -> "/b"), as Pyxis's --container-workdir=../ resolves to "/". Taken by
// name (a symlink in the image is not followed to decide what `..` means): the result is a path
// inside the container either way, and only the container's own process goes there.
Result<std::string> normalize_container_workdir(std::string_view path);

}  // namespace gantry
