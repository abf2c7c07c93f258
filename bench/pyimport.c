/* A Python-import-like workload for bench/files.sh: for each of NMODS module names, look the module
 * up along a search path of NDIRS directories the way an interpreter without a listing cache does
 * (stat NAME.py, NAME/ and NAME.so in each directory until one exists; most lookups miss), then
 * open, fstat and read the hit. Module m lives in directory m % NDIRS, so the average lookup misses
 * in half the path. Usage: pyimport ROOT NDIRS NMODS (files under ROOT/lib/pDD/mNNNNN.py). Built
 * statically by bench/files.sh so that the same binary runs on the host and in the image. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: pyimport ROOT NDIRS NMODS\n");
        return 2;
    }
    const char* root = argv[1];
    int ndirs = atoi(argv[2]), nmods = atoi(argv[3]);
    static const char* const suffixes[] = {".py", "", ".so"};
    char path[4096], buf[65536];
    long found = 0, bytes = 0;
    for (int m = 0; m < nmods; ++m) {
        for (int d = 0; d < ndirs; ++d) {
            struct stat st;
            int hit = 0;
            for (int k = 0; k < 3 && !hit; ++k) {
                snprintf(path, sizeof path, "%s/lib/p%02d/m%05d%s", root, d, m, suffixes[k]);
                hit = stat(path, &st) == 0 && k == 0;
            }
            if (!hit) continue;
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0 || fstat(fd, &st) != 0) return 1;
            ssize_t n;
            while ((n = read(fd, buf, sizeof buf)) > 0) bytes += n;
            close(fd);
            ++found;
            break;
        }
    }
    if (found != nmods) {
        fprintf(stderr, "pyimport: found %ld of %d modules\n", found, nmods);
        return 1;
    }
    printf("%ld modules, %ld bytes\n", found, bytes);
    return 0;
}
