// The `enroot` command: Enroot's command line (import, create, start, list, remove, exec, export,
// version) over Gantry's store and runtime, for scripts written for a site that had Enroot. It is the
// `gantry` binary started under the name `enroot` (a symlink the packages install): no second
// implementation of anything, only Enroot's syntax, file names and exit statuses (docs/user.md,
// "The enroot command").
#pragma once

#include <string>
#include <vector>

namespace gantry::cli {

// What `enroot ARGS...` comes to: either the verb ran here (status), or the work is one of gantry's own
// verbs (start is `gantry run`, exec is `gantry exec`) and gantry_args is that verb's command line, which
// main() then runs exactly as if it had been typed.
struct EnrootOutcome {
    int status = 0;
    std::vector<std::string> gantry_args;
};

// Whether argv[0] names the program `enroot` (any directory, a symlink to gantry).
bool invoked_as_enroot(const char* argv0);

EnrootOutcome enroot_command(const std::vector<std::string>& args);

}  // namespace gantry::cli
