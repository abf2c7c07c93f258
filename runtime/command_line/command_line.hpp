// The `gantry` command line: one CLI11 application whose subcommands are the verbs. Help text, usage
// errors and their exit statuses come from here for every verb, so each verb file only declares its
// options and operands (runtime/cli/command.hpp) and says what it does with them.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace gantry::cli {

// Exit statuses of a wrong command line (gantry(1), EXIT STATUS).
constexpr int kUsageError = 2;       // image verbs, doctor, and `gantry` without a verb
constexpr int kRunUsageError = 125;  // run, exec, stop, ps: docker's "the runtime failed"

// What `gantry <verb> --help` and the usage errors say about one verb, besides its options.
struct VerbText {
    std::string name{};
    std::string synopsis{};     // one line in `gantry --help`: "pull IMAGE   fetch an image ..."
    std::string operands{};     // after "usage: gantry <verb> ": "[OPTIONS] IMAGE"
    std::string description{};  // the paragraph under the usage line
    std::string footer{};       // after the options (exit status notes); may be empty
    int usage_status = kUsageError;
    bool hidden = false;  // not in `gantry --help` or completion (the completion helper itself)
};

// The outcome of parsing: run `verb`, or return `status` at once after printing `error` as one error
// line (a wrong command line) and `out` (help: to stdout with status 0, else to stderr).
struct ParseOutcome {
    std::string verb{};  // empty when nothing is left to run
    int status = 0;
    std::string out{};
    std::string error{};       // without the "gantry: " prefix
    std::string wrong_verb{};  // with `error`: the verb whose command line was wrong, if any
};

class CommandLine {
public:
    CommandLine();
    CommandLine(const CommandLine&) = delete;
    CommandLine& operator=(const CommandLine&) = delete;

    // Adds a verb; the caller declares its options and operands on the returned subcommand. Options
    // take one value per occurrence and the last occurrence wins (docker's rule).
    CLI::App& add_verb(const VerbText& text);

    // args: the words after the program name.
    ParseOutcome parse(std::vector<std::string> args);

    // `gantry --help` and `gantry <verb> --help`.
    std::string overview() const;
    std::string help(const std::string& verb) const;

    CLI::App& app() { return app_; }

private:
    const VerbText* text_of(const std::string& verb) const;
    ParseOutcome usage_error(const CLI::App* verb, const CLI::ParseError& e) const;

    CLI::App app_;
    std::vector<VerbText> texts_;
    bool version_ = false;
};

// The verb named `name`, hidden ones included; nullptr when there is none.
const CLI::App* find_verb(const CLI::App& root, const std::string& name);

// The lines `gantry __complete` prints for the bash completion (packaging/completion/gantry):
// the visible verbs, or one verb's options as "NAME" (a flag) or "NAME\tVALUE" (VALUE: the value's
// name in the help, e.g. DIR, FILE, always|missing|never).
std::vector<std::string> completion_verbs(const CLI::App& root);
std::vector<std::string> completion_options(const CLI::App& verb);

}  // namespace gantry::cli
