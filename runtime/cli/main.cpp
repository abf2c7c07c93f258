// The `gantry` command: a thin dispatcher over the runtime library's verbs.
#include <cstdio>
#include <cstring>
#include <string>

#include "gantry/log.hpp"
#include "gantry/version.hpp"

namespace {

void usage(FILE* out) {
    std::fputs(
        "usage: gantry <command> [options]\n"
        "\n"
        "commands:\n"
        "  pull IMAGE            fetch an image into the store as one squashfs file\n"
        "  images                list the images in the store\n"
        "  inspect IMAGE         show an image's digest, size, layers and config\n"
        "  rm IMAGE              remove an image from the store\n"
        "  gc                    remove least recently used images\n"
        "  run IMAGE [CMD...]    run a command in a container\n"
        "  exec NAME [CMD...]    run a command in a running container\n"
        "  doctor                check this node's readiness\n"
        "  version               print the version\n",
        out);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    std::string cmd = argv[1];
    if (cmd == "--version" || cmd == "version") {
        std::printf("gantry %s\n", gantry::kVersion);
        return 0;
    }
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
        usage(stdout);
        return 0;
    }
    gantry::log::error("unknown command '" + cmd + "' (see gantry --help)");
    return 2;
}
