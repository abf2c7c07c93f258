// `gantry __complete`: the words the bash completion (packaging/completion/gantry) offers, read from
// the same CLI11 definitions the command line parses with, so the completion never lists an option
// that does not exist. Hidden from `gantry --help`; prints nothing but words, one per line, and exits
// 0 also when the store cannot be read (a completion has no one to report to).
#include <cstdio>
#include <memory>
#include <set>

#include "command.hpp"
#include "common.hpp"
#include "gantry/launcher.hpp"

namespace gantry::cli {
namespace {

struct CompleteArgs {
    std::string what, verb, store;
};

void print_lines(const std::vector<std::string>& lines) {
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
}

int complete(const CLI::App& root, const CompleteArgs& a) {
    if (a.what == "verbs") {
        print_lines(completion_verbs(root));
    } else if (a.what == "options") {
        const CLI::App* verb = find_verb(root, a.verb);
        if (verb == nullptr || verb->get_group().empty())
            return usage_error(make_error("__complete: no command '" + a.verb + "'"));
        print_lines(completion_options(*verb));
    } else if (a.what == "images") {
        // Reading only: the store is opened as `gantry images` opens it (not created).
        auto config = load_config();
        if (!config) return 0;
        auto store = open_store(*config, a.store, false);
        if (!store) return 0;
        auto all = store->list();
        if (!all) return 0;
        std::set<std::string> names;
        for (const auto& img : *all) names.insert(img.metadata.references.begin(), img.metadata.references.end());
        print_lines({names.begin(), names.end()});
    } else if (a.what == "containers") {
        auto config = load_config();
        if (config) print_lines(list_containers(*config));
    } else {
        return usage_error(
            make_error("__complete: unknown query '" + a.what + "' (verbs, options VERB, images, containers)"));
    }
    return 0;
}

VerbRunner define_complete(CLI::App& app) {
    auto a = std::make_shared<CompleteArgs>();
    app.add_option("--store", a->store, "the image store")->type_name("DIR");
    app.add_option("QUERY", a->what, "verbs, options, images or containers")->required();
    app.add_option("VERB", a->verb, "for options: the verb");
    const CLI::App* root = app.get_parent();
    return {[a, root] { return complete(*root, *a); }, {}};
}

const Registration reg_complete({{.name = "__complete",
                                  .synopsis = "__complete QUERY   words for the bash completion",
                                  .operands = "[--store DIR] verbs|options VERB|images|containers",
                                  .description = "Prints the words the bash completion offers, one per line.",
                                  .hidden = true},
                                 define_complete});

}  // namespace
}  // namespace gantry::cli
