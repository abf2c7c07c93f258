// Internal: small helpers shared by the auth module's source files.
#pragma once

#include <string>

namespace gantry::auth {

std::string env(const char* name);
std::string home_dir();
// `path` with the home directory written as "~", for messages.
std::string display_path(const std::string& path);
std::string lower(std::string s);

}  // namespace gantry::auth
