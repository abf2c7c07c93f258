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
 *   GANTRY_ENTRY_USERNS   "UID:GID": first make a user namespace nested in the container's that maps
 *                         UID and GID to the container's 0 (`--no-container-remap-root` on a named
 *                         container made with remap-root: the task then runs as the user's own ids;
 *                         JoinOptions::as_user in include/gantry/launcher.hpp). Done here because this
 *                         process, fresh from exec as the container's root, may write its own
 *                         /proc/self/uid_map, which the task that switched from root could not. Not
 *                         privileged: each map names only our own id in the parent namespace, as any
 *                         process may for a namespace it made (setgroups denied first, as it must be).
 * These are read with getenv here, not through gantry::environment() (include/gantry/environment.hpp,
 * the runtime's one reader): this is a small static C program that links nothing of the C++ runtime,
 * the variables are meant for it alone, and it removes them before the exec, so that they reach neither
 * the entrypoint nor the task.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char* what, const char* detail) {
    fprintf(stderr, "gantry: entrypoint: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(127);
}

static void write_proc(const char* path, const char* text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len) fail(path, strerror(errno));
    close(fd);
}

static void enter_user_view(const char* ids) {
    char* end = NULL;
    unsigned long uid = strtoul(ids, &end, 10);
    if (end == ids || *end != ':') fail("bad GANTRY_ENTRY_USERNS", ids);
    const char* gid_text = end + 1;
    unsigned long gid = strtoul(gid_text, &end, 10);
    if (end == gid_text || *end != '\0' || uid > 0xfffffffeUL || gid > 0xfffffffeUL)
        fail("bad GANTRY_ENTRY_USERNS", ids);
    if (unshare(CLONE_NEWUSER) != 0) fail("making a user namespace for the job user's own ids", strerror(errno));
    char map[64];
    write_proc("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "%lu 0 1\n", uid);
    write_proc("/proc/self/uid_map", map);
    snprintf(map, sizeof map, "%lu 0 1\n", gid);
    write_proc("/proc/self/gid_map", map);
}

int main(int argc, char** argv) {
    const char* userns = getenv("GANTRY_ENTRY_USERNS");
    if (userns != NULL) {
        enter_user_view(userns);
        unsetenv("GANTRY_ENTRY_USERNS");
    }
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
