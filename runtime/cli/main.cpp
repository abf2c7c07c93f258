// The `gantry` command: a thin dispatcher over the verbs registered in runtime/cli/*.cpp.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "command.hpp"
#include "gantry/log.hpp"
#include "gantry/version.hpp"

namespace gantry::cli {

std::vector<Command>& commands() {
    static std::vector<Command> table;
    return table;
}

int print_usage(const std::string& verb) {
    for (const auto& c : commands()) {
        if (c.name == verb) {
            std::fputs(c.usage.c_str(), stdout);
            return 0;
        }
    }
    return 0;
}

}  // namespace gantry::cli

namespace {

void usage(FILE* out) {
    auto cmds = gantry::cli::commands();
    std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    std::fputs("usage: gantry <command> [options]\n\ncommands:\n", out);
    for (const auto& c : cmds) std::fprintf(out, "  %s\n", c.synopsis.c_str());
    std::fputs(
        "  version                 print the version\n\n"
        "`gantry <command> --help` lists the options of one command.\n"
        "exit status: 0 success; 1 failure; 2 usage error (image verbs and doctor); run and exec: 125\n"
        "gantry failed, 126 command not executable, 127 command not found, else the command's status\n",
        out);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    std::string verb = argv[1];
    if (verb == "--version" || verb == "version") {
        std::printf("gantry %s\n", gantry::kVersion);
        return 0;
    }
    if (verb == "--help" || verb == "-h" || verb == "help") {
        if (argc > 2 && verb == "help") {
            for (const auto& c : gantry::cli::commands())
                if (c.name == argv[2]) return gantry::cli::print_usage(c.name);
            gantry::log::error("help: unknown command '" + std::string(argv[2]) + "' (see gantry --help)");
            return 2;
        }
        usage(stdout);
        return 0;
    }
    for (const auto& c : gantry::cli::commands()) {
        if (c.name != verb) continue;
        try {
            return c.run(std::vector<std::string>(argv + 2, argv + argc));
        } catch (const std::exception& e) {
            gantry::log::error(verb + ": internal error: " + e.what());
            return 1;
        }
    }
    gantry::log::error("unknown command '" + verb + "' (see gantry --help)");
    return 2;
}
