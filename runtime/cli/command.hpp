// The CLI's verb table. Each runtime/cli/<verb>.cpp registers its verbs with a static Registration:
// the texts of the verb's help and a function that declares its options and operands on the verb's
// CLI11 subcommand (runtime/command_line) and returns what runs it, so main.cpp stays a dispatcher and
// each verb lives in the file named after it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "command_line.hpp"

namespace gantry::cli {

struct VerbRunner {
    std::function<int()> run{};  // after a successful parse; returns the exit status
    // Optional: told the one-line message of a wrong command line before gantry exits (pull's report).
    std::function<void(const std::string& message)> on_usage_error{};
};

struct Command {
    VerbText text{};
    std::function<VerbRunner(CLI::App& verb)> define{};
};

std::vector<Command>& commands();

struct Registration {
    explicit Registration(Command c) { commands().push_back(std::move(c)); }
};

}  // namespace gantry::cli
