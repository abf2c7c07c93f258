// gantry-holder: the process that holds a container's namespaces. Container::create execs it with a
// socket to the creator as descriptor 3 and nothing else of its own (runtime/launcher/holder.cpp);
// run by hand it reports that it has no creator and exits.
#include <fcntl.h>

#include <cstdio>

#include "gantry/launcher.hpp"

int main() {
    if (::fcntl(3, F_GETFD) < 0) {
        std::fputs("gantry: gantry-holder is started by gantry and the Slurm plugin, not by hand\n", stderr);
        return 2;
    }
    gantry::run_container_holder(3);
}
