// Inside the option code (options.cpp, env_forms.cpp): the option ids and the checks both the
// command-line and the environment forms of an option go through.
#pragma once

#include <string>
#include <string_view>

namespace gantry::plugin {

enum OptionId {
    kImage = 1,
    kMounts,
    kWorkdir,
    kName,
    kSave,
    kMountHome,
    kNoMountHome,
    kRemapRoot,
    kNoRemapRoot,
    kEntrypoint,
    kNoEntrypoint,
    kEntrypointLog,
    kWritable,
    kReadonly,
    kEnv,
    kUnshare,
};

// Remembers the first error of the options (option_error()), for srun's and slurmstepd's hooks.
void record_error(const std::string& message);

// The checks Pyxis makes on an option's value (empty, an empty list element, --container-save naming a
// directory); "" when the value is fine, else the whole "gantry: ..." line.
std::string value_problem(int id, const std::string& label, std::string_view value, bool as_user);

}  // namespace gantry::plugin
