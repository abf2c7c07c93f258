/* gantry-entry: runs the image's ENTRYPOINT in front of a Slurm task's command.
 *
 * Slurm execs a task's argv itself after the plugin's task_init hook, and SPANK can replace argv[0]
 * but not add arguments. So for --container-entrypoint the plugin points argv[0] at this program
 * (through /proc/self/fd/N, opened before the task entered the container: the file need not exist in
 * the image) and passes the entrypoint and the original argv[0] in the environment. This program then
 * execs  ENTRYPOINT... ORIGINAL_ARGV0 ARGV[1]...  with a PATH lookup inside the container.
 *
 * It is linked statically because it runs inside images whose C library we know nothing about.
 * Environment (removed before the exec):
 *   GANTRY_ENTRY_ARGV0    the task's original argv[0]
 *   GANTRY_ENTRY_ARGC     number of entrypoint words
 *   GANTRY_ENTRY_ARG_<i>  entrypoint word i, from 0
 *   GANTRY_ENTRY_FD       the descriptor this program was started through, closed here
 *   GANTRY_ENTRY_LOG      when "1", the command line is printed to stderr first
 * These are read with getenv here, not through gantry::environment() (include/gantry/environment.hpp,
 * the runtime's one reader): this is a small static C program that links nothing of the C++ runtime,
 * the variables are meant for it alone, and it removes them before the exec, so that they reach neither
 * the entrypoint nor the task.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char* what, const char* detail) {
    fprintf(stderr, "gantry: entrypoint: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(127);
}

int main(int argc, char** argv) {
    const char* argv0 = getenv("GANTRY_ENTRY_ARGV0");
    const char* count_text = getenv("GANTRY_ENTRY_ARGC");
    if (argv0 == NULL || count_text == NULL) fail("started without GANTRY_ENTRY_ARGV0/ARGC", NULL);
    char* end = NULL;
    long count = strtol(count_text, &end, 10);
    if (*end != '\0' || count < 0 || count > 4096) fail("bad GANTRY_ENTRY_ARGC", count_text);

    char** args = calloc((size_t)count + (size_t)argc + 1, sizeof(char*));
    if (args == NULL) fail("out of memory", NULL);
    size_t n = 0;
    for (long i = 0; i < count; ++i) {
        char name[48];
        snprintf(name, sizeof name, "GANTRY_ENTRY_ARG_%ld", i);
        const char* word = getenv(name);
        if (word == NULL) fail("missing entrypoint word", name);
        args[n++] = strdup(word);
        unsetenv(name);
    }
    args[n++] = strdup(argv0);
    for (int i = 1; i < argc; ++i) args[n++] = argv[i];
    args[n] = NULL;

    const char* fd_text = getenv("GANTRY_ENTRY_FD");
    if (fd_text != NULL) close(atoi(fd_text));
    int log = getenv("GANTRY_ENTRY_LOG") != NULL && strcmp(getenv("GANTRY_ENTRY_LOG"), "1") == 0;
    unsetenv("GANTRY_ENTRY_ARGV0");
    unsetenv("GANTRY_ENTRY_ARGC");
    unsetenv("GANTRY_ENTRY_FD");
    unsetenv("GANTRY_ENTRY_LOG");
    if (log) {
        fputs("gantry: entrypoint:", stderr);
        for (size_t i = 0; i < n; ++i) fprintf(stderr, " %s", args[i]);
        fputc('\n', stderr);
    }
    execvp(args[0], args);
    fail(args[0], strerror(errno));
    return 127;
}
