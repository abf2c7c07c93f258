// The `gantry` command: a thin dispatcher over the verbs registered in runtime/cli/*.cpp; the command
// line itself (help, usage errors, exit statuses) is runtime/command_line's. Started as `enroot` (the
// packages' symlink), it reads Enroot's command line instead (enroot.cpp), which either runs there or
// comes back as one of gantry's verbs to run here.
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "command.hpp"
#include "enroot.hpp"
#include "gantry/log.hpp"
#include "gantry/version.hpp"

namespace gantry::cli {

std::vector<Command>& commands() {
    static std::vector<Command> table;
    return table;
}

}  // namespace gantry::cli

int main(int argc, char** argv) {
    using namespace gantry::cli;
    std::vector<std::string> args(argv + 1, argv + argc);
    if (invoked_as_enroot(argv[0])) {
        auto enroot = enroot_command(args);
        if (enroot.gantry_args.empty()) return enroot.status;
        args = std::move(enroot.gantry_args);
    }
    CommandLine line;
    std::map<std::string, VerbRunner> runners;
    for (const auto& c : commands()) runners[c.text.name] = c.define(line.add_verb(c.text));

    // `gantry help VERB` and `gantry version`: the command line's own verbs.
    std::string help_for;
    CLI::App& help = line.add_verb({"help", "help COMMAND            print the options of COMMAND", "COMMAND",
                                    "Prints the help of COMMAND, as `gantry COMMAND --help` does.", "", kUsageError});
    help.add_option("COMMAND", help_for, "the command");
    line.add_verb(
        {"version", "version                 print the version", "", "Prints Gantry's version.", "", kUsageError});

    auto outcome = line.parse(args);
    if (!outcome.error.empty()) {
        gantry::log::error(outcome.error);
        if (auto r = runners.find(outcome.wrong_verb); r != runners.end() && r->second.on_usage_error)
            r->second.on_usage_error(outcome.error);
    }
    if (!outcome.out.empty()) std::fputs(outcome.out.c_str(), outcome.status == 0 ? stdout : stderr);
    if (outcome.verb.empty()) return outcome.status;
    if (outcome.verb == "version") {
        std::printf("gantry %s\n", gantry::kVersion);
        return 0;
    }
    if (outcome.verb == "help") {
        if (help_for.empty() || help_for == "help" || find_verb(line.app(), help_for) == nullptr) {
            if (help_for.empty()) {
                std::fputs(line.overview().c_str(), stdout);
                return 0;
            }
            gantry::log::error("help: unknown command '" + help_for + "' (see gantry --help)");
            return kUsageError;
        }
        std::fputs(line.help(help_for).c_str(), stdout);
        return 0;
    }
    try {
        return runners.at(outcome.verb).run();
    } catch (const std::exception& e) {
        gantry::log::error(outcome.verb + ": internal error: " + e.what());
        return 1;
    }
}
