// The CLI's verb table. Each runtime/cli/<verb>.cpp registers its verbs with a static Registration,
// so main.cpp stays a dispatcher and each verb lives in the file named after it.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace gantry::cli {

// Gets the arguments after the verb (args[0] is the first option or operand). Returns the exit status.
using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
    std::string name;
    std::string synopsis;  // one line for `gantry --help`: "pull IMAGE    fetch an image ..."
    // `gantry <verb> --help`: the usage line and the options, one per line. The only copy: error
    // messages point here ("see gantry <verb> --help") rather than repeat it.
    std::string usage;
    CommandFn run;
};

std::vector<Command>& commands();

// Prints the verb's usage text to stdout (`gantry <verb> --help`); returns exit status 0.
int print_usage(const std::string& verb);

struct Registration {
    explicit Registration(Command c) { commands().push_back(std::move(c)); }
};

}  // namespace gantry::cli
