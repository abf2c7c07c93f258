// The command line over CLI11 (runtime/command_line): help and usage errors for verbs declared as the
// CLI's are, parsed with the real library.
#include "command_line.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

using gantry::cli::CommandLine;
using gantry::cli::ParseOutcome;

namespace {

// Two verbs shaped like the CLI's: an image verb (usage status 2) and a run-like verb whose operands
// after the first are taken verbatim (usage status 125).
struct Fixture {
    CommandLine line;
    std::string store;
    std::vector<std::string> images, env, operands;
    bool writable = false;
    CLI::Option* writable_opt = nullptr;

    Fixture() {
        CLI::App& rm = line.add_verb({.name = "rm",
                                      .synopsis = "rm IMAGE...   remove",
                                      .operands = "[--store DIR] IMAGE...",
                                      .description = "Removes images."});
        rm.add_option("--store", store, "the image store")->type_name("DIR");
        rm.add_option("IMAGE", images, "an image")->required();
        CLI::App& run = line.add_verb({.name = "run",
                                       .synopsis = "run IMAGE   run",
                                       .operands = "[OPTIONS] IMAGE [CMD...]",
                                       .description = "Runs.",
                                       .footer = "exit status: 125\n",
                                       .usage_status = gantry::cli::kRunUsageError});
        run.add_option("-e,--env", env, "NAME=VALUE sets NAME\nNAME passes it")
            ->type_name("NAME=VALUE|NAME")
            ->allow_extra_args(false);
        writable_opt = run.add_flag("--writable,!--readonly", writable, "writes land in scratch");
        run.positionals_at_end();
        run.add_option("OPERANDS", operands, "IMAGE and command")->take_all();
        line.add_verb({.name = "__complete", .synopsis = "hidden", .hidden = true});
    }
    ParseOutcome parse(std::vector<std::string> args) { return line.parse(std::move(args)); }
};

}  // namespace

TEST_CASE("a verb's options and operands parse; the last of a repeated option wins") {
    Fixture f;
    auto o = f.parse({"rm", "--store", "/a", "--store=/b", "x", "y"});
    CHECK(o.verb == "rm");
    CHECK(o.error.empty());
    CHECK(f.store == "/b");
    CHECK(f.images == std::vector<std::string>{"x", "y"});
}

TEST_CASE("run-like verbs: options before the first operand, every word after it verbatim") {
    Fixture f;
    auto o = f.parse({"run", "-e", "A=x,y=z", "--env=B=2", "-eC", "img", "ls", "--help", "-e", "X", "--", "-la"});
    CHECK(o.verb == "run");
    CHECK(f.env == std::vector<std::string>{"A=x,y=z", "B=2", "C"});
    CHECK(f.operands == std::vector<std::string>{"img", "ls", "--help", "-e", "X", "--", "-la"});
    // "-eVALUE" attaches a value to a short option; "-e=VALUE" keeps the '=' (the verb rejects it).
    Fixture e;
    CHECK(e.parse({"run", "-e=A=1", "img"}).verb == "run");
    CHECK(e.env == std::vector<std::string>{"=A=1"});
    Fixture g;
    CHECK(g.parse({"run", "--", "img", "-x"}).verb == "run");
    CHECK(g.operands == std::vector<std::string>{"img", "-x"});
}

TEST_CASE("a flag and its negation: the last one given wins, and count() says one was given") {
    Fixture f;
    f.parse({"run", "--writable", "--readonly", "img"});
    CHECK_FALSE(f.writable);
    CHECK(f.writable_opt->count() > 0);
    Fixture g;
    g.parse({"run", "--readonly", "--writable", "img"});
    CHECK(g.writable);
    Fixture h;
    h.parse({"run", "img"});
    CHECK(h.writable_opt->count() == 0);
}

TEST_CASE("usage errors: one line naming the verb and the word, the verb's exit status") {
    Fixture f;
    auto o = f.parse({"rm", "--no-such-option", "x"});
    CHECK(o.verb.empty());
    CHECK(o.status == 2);
    CHECK(o.wrong_verb == "rm");
    CHECK(o.error == "rm: unknown option '--no-such-option' (see gantry rm --help)");

    // Unknown before missing: a typo is named rather than the operand it left out.
    o = Fixture().parse({"rm", "--no-such-option"});
    CHECK(o.error == "rm: unknown option '--no-such-option' (see gantry rm --help)");

    o = Fixture().parse({"rm", "--store", "/s"});
    CHECK(o.status == 2);
    CHECK(o.error == "rm: no IMAGE given (see gantry rm --help)");

    o = Fixture().parse({"rm", "--store"});
    CHECK(o.status == 2);
    CHECK(o.error == "rm: --store needs a value (see gantry rm --help)");

    o = Fixture().parse({"run", "--bogus", "img"});
    CHECK(o.status == 125);
    CHECK(o.error == "run: unknown option '--bogus' (see gantry run --help)");

    o = Fixture().parse({"frobnicate"});
    CHECK(o.status == 2);
    CHECK(o.error == "unknown command 'frobnicate' (see gantry --help)");
    CHECK(o.error.find('\n') == std::string::npos);
}

TEST_CASE("--help: the verb's usage line, description, options with their values, footer; exit 0") {
    for (const char* flag : {"--help", "-h"}) {
        Fixture f;
        auto o = f.parse({"run", "-e", "A=1", flag});
        CHECK(o.verb.empty());
        CHECK(o.status == 0);
        CHECK(o.error.empty());
        CHECK(o.out.rfind("usage: gantry run [OPTIONS] IMAGE [CMD...]\nRuns.\n", 0) == 0);
        CHECK(o.out.find("  -e, --env NAME=VALUE|NAME") != std::string::npos);
        CHECK(o.out.find("  --writable, --readonly") != std::string::npos);
        // A description's second line is indented under its first.
        auto first = o.out.find("NAME=VALUE sets NAME\n");
        REQUIRE(first != std::string::npos);
        CHECK(o.out.find("  NAME passes it", first) != std::string::npos);
        CHECK(o.out.find("OPERANDS") == std::string::npos);
        CHECK(o.out.find("-h, --help") != std::string::npos);
        CHECK(o.out.substr(o.out.size() - 17) == "exit status: 125\n");
    }
    // After the first operand of run, --help is the command's.
    Fixture f;
    CHECK(f.parse({"run", "img", "--help"}).verb == "run");
}

TEST_CASE("gantry alone prints the overview as a usage error; --help lists visible verbs only") {
    Fixture f;
    auto o = f.parse({});
    CHECK(o.status == 2);
    CHECK(o.out.rfind("usage: gantry <command>", 0) == 0);
    o = Fixture().parse({"--help"});
    CHECK(o.status == 0);
    CHECK(o.out.find("\n  rm IMAGE...") != std::string::npos);
    CHECK(o.out.find("\n  run IMAGE") != std::string::npos);
    CHECK(o.out.find("__complete") == std::string::npos);
    CHECK(Fixture().parse({"--version"}).verb == "version");
}

TEST_CASE("completion words come from the definitions; hidden verbs and options stay out") {
    Fixture f;
    CHECK(gantry::cli::completion_verbs(f.line.app()) == std::vector<std::string>{"rm", "run"});
    auto opts = gantry::cli::completion_options(*f.line.app().get_subcommand("run"));
    auto has = [&](const std::string& w) { return std::find(opts.begin(), opts.end(), w) != opts.end(); };
    CHECK(has("-e\tNAME=VALUE|NAME"));
    CHECK(has("--env\tNAME=VALUE|NAME"));
    CHECK(has("--writable"));
    CHECK(has("--readonly"));
    CHECK(has("--help"));
    CHECK_FALSE(has("OPERANDS"));
}
