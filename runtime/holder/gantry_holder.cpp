// gantry-holder: the process that holds a container's namespaces. Container::create execs it with a
// socket to the creator as descriptor 3 and nothing else of its own (runtime/launcher/holder.cpp);
// run by hand it reports that it has no creator and exits.
#include <fcntl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gantry/acquire.hpp"
#include "gantry/dropins.hpp"
#include "gantry/launcher.hpp"

int main(int argc, char** argv) {
    // The other job it has: reading an Enroot image's /etc/environment and /etc/rc for its creator, with the
    // rights it was started with (runtime/launcher/image_environment.cpp).
    if (argc == 3 && std::strcmp(argv[1], "--enroot-settings") == 0) return gantry::print_enroot_settings(argv[2]);
    // And checking a spec's user-named paths with the user's rights (Container::create, as root).
    if (argc == 2 && std::strcmp(argv[1], "--check-paths") == 0) return gantry::check_container_paths(0);
    // And serving an image to the user's fuse containers (launcher/image_server.cpp).
    if (argc >= 8 && std::strcmp(argv[1], "--serve-image") == 0)
        return gantry::run_image_server(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7],
                                        std::vector<std::string>(argv + 8, argv + argc));
    // And acquiring a stored image with the user's rights for root (acquire_image_as; descriptor 3).
    if ((argc == 4 || argc == 5) && std::strcmp(argv[1], "--acquire") == 0 && ::fcntl(3, F_GETFD) >= 0)
        return gantry::send_acquired_image(3, argv[2], argv[3], argc == 5 ? argv[4] : "");
    // And, started by root for a job user, acquiring a stored image as that user before holding its
    // container (start_holder_acquiring): --acquire-and-hold STORE DIGEST UID GID [TAG].
    if ((argc == 6 || argc == 7) && std::strcmp(argv[1], "--acquire-and-hold") == 0 && ::fcntl(3, F_GETFD) >= 0) {
        gantry::HolderAcquisition acquisition;
        acquisition.store_root = argv[2];
        acquisition.digest = argv[3];
        char* end_uid = nullptr;
        char* end_gid = nullptr;
        const unsigned long uid = std::strtoul(argv[4], &end_uid, 10);
        const unsigned long gid = std::strtoul(argv[5], &end_gid, 10);
        if (*argv[4] == '\0' || *end_uid != '\0' || *argv[5] == '\0' || *end_gid != '\0' || uid == 0) {
            std::fputs("gantry: gantry-holder --acquire-and-hold: bad uid or gid\n", stderr);
            return 2;
        }
        acquisition.uid = static_cast<uid_t>(uid);
        acquisition.gid = static_cast<gid_t>(gid);
        if (argc == 7) acquisition.resolved_tag = argv[6];
        gantry::run_container_holder(3, &acquisition);
    }
    if (::fcntl(3, F_GETFD) < 0) {
        std::fputs("gantry: gantry-holder is started by gantry and the Slurm plugin, not by hand\n", stderr);
        return 2;
    }
    gantry::run_container_holder(3);
}
