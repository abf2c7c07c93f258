// The `gantry` command line over CLI11 (see command_line.hpp).
#include "command_line.hpp"

#include <algorithm>

namespace gantry::cli {
namespace {

// "-e, --env" from CLI11's "-e,--env", and "--writable, --readonly" from "--writable,--readonly{false}".
std::string option_names(const CLI::Option& opt) {
    std::string names = opt.get_name(false, true), out;
    bool in_default = false;
    for (char c : names) {
        if (c == '{')
            in_default = true;
        else if (c == '}')
            in_default = false;
        else if (!in_default)
            out += c == ',' ? std::string(", ") : std::string(1, c);
    }
    return out;
}

bool is_flag(const CLI::Option& opt) {
    return opt.get_expected_min() == 0;
}

// Options shown in help and completion: named ones not put in the hidden group ("").
std::vector<const CLI::Option*> visible_options(const CLI::App& verb) {
    std::vector<const CLI::Option*> out;
    for (const CLI::Option* opt : verb.get_options()) {
        if (opt->get_positional() || opt->get_group().empty()) continue;
        out.push_back(opt);
    }
    // The help flag last, as every verb's help ends with it.
    std::stable_partition(out.begin(), out.end(), [&](const CLI::Option* o) { return o != verb.get_help_ptr(); });
    return out;
}

// A description may span lines: the following ones are indented to its column.
void append_indented(std::string& out, const std::string& text, size_t column) {
    for (char c : text) {
        out += c;
        if (c == '\n') out.append(column, ' ');
    }
}

}  // namespace

CommandLine::CommandLine() : app_("gantry", "gantry") {
    app_.set_help_flag("-h,--help", "print this help");
    app_.add_flag("--version", version_, "print the version");
    app_.require_subcommand(0, 1);
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

CLI::App& CommandLine::add_verb(const VerbText& text) {
    texts_.push_back(text);
    CLI::App* verb = app_.add_subcommand(text.name, text.synopsis);
    verb->set_help_flag("-h,--help", "print this help");
    if (text.hidden) verb->group("");
    return *verb;
}

const VerbText* CommandLine::text_of(const std::string& verb) const {
    for (const auto& t : texts_)
        if (t.name == verb) return &t;
    return nullptr;
}

std::string CommandLine::overview() const {
    std::vector<VerbText> shown;
    for (const auto& t : texts_)
        if (!t.hidden) shown.push_back(t);
    std::sort(shown.begin(), shown.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    std::string out = "usage: gantry <command> [options]\n\ncommands:\n";
    for (const auto& t : shown) out += "  " + t.synopsis + "\n";
    out +=
        "\n`gantry <command> --help` lists the options of one command.\n"
        "exit status: 0 success; 1 failure; 2 usage error. run, exec, stop, ps: 125 usage error or gantry\n"
        "failed; run and exec: 126 command not executable, 127 command not found, else the command's status\n";
    return out;
}

std::string CommandLine::help(const std::string& name) const {
    const VerbText* text = text_of(name);
    const CLI::App* verb = text ? app_.get_subcommand(name) : nullptr;
    if (verb == nullptr) return overview();
    std::string out = "usage: gantry " + name + (text->operands.empty() ? "" : " " + text->operands) + "\n";
    if (!text->description.empty()) out += text->description + "\n";
    auto options = visible_options(*verb);
    std::vector<std::string> labels;
    size_t width = 0;
    for (const CLI::Option* opt : options) {
        std::string label = option_names(*opt);
        if (!is_flag(*opt)) label += " " + opt->get_type_name();
        width = std::max(width, label.size());
        labels.push_back(std::move(label));
    }
    width = std::min<size_t>(width, 32);
    out += "\noptions:\n";
    for (size_t i = 0; i < options.size(); ++i) {
        std::string line = "  " + labels[i];
        if (labels[i].size() > width)
            line += "\n  " + std::string(width, ' ');
        else
            line.append(width - labels[i].size(), ' ');
        line += "  ";
        append_indented(line, options[i]->get_description(), width + 4);
        out += line + "\n";
    }
    if (!text->footer.empty()) out += "\n" + text->footer;
    return out;
}

ParseOutcome CommandLine::usage_error(const CLI::App* verb, const CLI::ParseError& e) const {
    // Which word was wrong, in our words; CLI11's own text only where we have none.
    const CLI::App& where = verb ? *verb : app_;
    std::string what = e.what();
    // An unknown option is named first: CLI11 checks required operands before leftovers, but
    // `rm --forse` means a typo, not a missing IMAGE.
    std::string unknown;
    for (const auto& word : where.remaining())
        if (unknown.empty() && word.size() > 1 && word[0] == '-') unknown = word;
    if (!unknown.empty()) {
        what = "unknown option '" + unknown + "'";
    } else if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
        auto extra = where.remaining();
        std::string word = extra.empty() ? std::string() : extra.front();
        if (word.size() > 1 && word[0] == '-')
            what = "unknown option '" + word + "'";
        else if (verb == nullptr)
            what = "unknown command '" + word + "'";
        else
            what = "unexpected operand '" + word + "'";
    } else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
        const std::string suffix = " is required";
        if (what.size() > suffix.size() && what.compare(what.size() - suffix.size(), suffix.size(), suffix) == 0)
            what = "no " + what.substr(0, what.size() - suffix.size()) + " given";
    } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
        auto colon = what.find(':');
        if (what.find("required") != std::string::npos && what.find("missing") != std::string::npos &&
            colon != std::string::npos)
            what = what.substr(0, colon) + " needs a value";
    }
    ParseOutcome out;
    if (verb == nullptr) {
        out.status = kUsageError;
        out.error = what + " (see gantry --help)";
        return out;
    }
    const VerbText* text = text_of(verb->get_name());
    out.status = text ? text->usage_status : kUsageError;
    out.wrong_verb = verb->get_name();
    out.error = verb->get_name() + ": " + what + " (see gantry " + verb->get_name() + " --help)";
    return out;
}

ParseOutcome CommandLine::parse(std::vector<std::string> args) {
    version_ = false;
    // CLI11 takes the words last first.
    std::reverse(args.begin(), args.end());
    auto parsed_verb = [&]() -> CLI::App* {
        for (CLI::App* sub : app_.get_subcommands([](CLI::App* s) { return s->parsed(); })) return sub;
        return nullptr;
    };
    try {
        app_.parse(args);
    } catch (const CLI::CallForHelp&) {
        CLI::App* verb = parsed_verb();
        return ParseOutcome{.out = verb ? help(verb->get_name()) : overview()};
    } catch (const CLI::ParseError& e) {
        return usage_error(parsed_verb(), e);
    }
    CLI::App* verb = parsed_verb();
    if (verb != nullptr) return ParseOutcome{.verb = verb->get_name()};
    if (version_) return ParseOutcome{.verb = "version"};
    // `gantry` alone: the overview on stderr, as a usage error.
    return ParseOutcome{.status = kUsageError, .out = overview()};
}

const CLI::App* find_verb(const CLI::App& root, const std::string& name) {
    for (const CLI::App* sub : root.get_subcommands([&](const CLI::App* s) { return s->get_name() == name; }))
        return sub;
    return nullptr;
}

std::vector<std::string> completion_verbs(const CLI::App& root) {
    std::vector<std::string> out;
    for (const CLI::App* sub : root.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); }))
        out.push_back(sub->get_name());
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<std::string> completion_options(const CLI::App& verb) {
    std::vector<std::string> out;
    for (const CLI::Option* opt : visible_options(verb)) {
        std::string value = is_flag(*opt) ? std::string() : "\t" + opt->get_type_name();
        for (const auto& s : opt->get_snames()) out.push_back("-" + s + value);
        for (const auto& l : opt->get_lnames()) out.push_back("--" + l + value);
    }
    return out;
}

}  // namespace gantry::cli
