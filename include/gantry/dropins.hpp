// Site-wide container settings in Enroot's file formats, for sites migrating from Pyxis + Enroot:
//
//   environ.d/*.env   NAME=VALUE lines: variables every container gets (NCCL/EFA tuning, proxies)
//   mounts.d/*.fstab  fstab lines: mounts every container gets (/fsx, a site tools directory)
//   /etc/environment  inside an image made by `enroot import` (no OCI config): the image's Env
//   /etc/rc           in the same images: its WorkingDir, Entrypoint and Cmd (parse_enroot_rc)
//
// Both formats may reference the job's (for `gantry run`: the caller's) environment as ${NAME}, which
// is replaced by its value, or by nothing when unset. As in Enroot, a bare $NAME is left as written.
// gantry.conf names the directories (environ_dir, mounts_dir; docs/admin.md has the migration table).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/launcher.hpp"
#include "gantry/mounts.hpp"
#include "gantry/result.hpp"

namespace gantry {

// Replaces every ${NAME} in `text` with NAME's value in `env` ("NAME=value" entries, the last one
// winning), or with nothing when NAME is unset. "${" that does not open a valid NAME and "}" is an
// error (Enroot's ${NAME:-default} forms are not supported); "$" followed by anything else stays.
Result<std::string> expand_variables(std::string_view text, const std::vector<std::string>& env);

// Parses an environment file: one NAME=VALUE per line ("export " in front is allowed); blank lines and
// lines starting with '#' are skipped; one pair of matching quotes around VALUE is removed; ${NAME}
// is expanded from `env`. Returns "NAME=VALUE" entries in file order. Errors read "ORIGIN:LINE: ...".
// `lenient` (an image's own /etc/environment) skips malformed lines instead of failing.
Result<std::vector<std::string>> parse_environment_file(std::string_view text, const std::vector<std::string>& env,
                                                        const std::string& origin, bool lenient = false);

// One line of a mounts.d file.
struct DropinMount {
    MountSpec mount;
    bool nofail = false;  // skip the mount when its source does not exist
    std::string where;    // "FILE:LINE", for messages
};

// Parses fstab text: `SOURCE TARGET [TYPE [OPTIONS [FREQ [PASSNO]]]]` per line, '#' comments.
//   SOURCE  an absolute host path (after ${NAME} expansion), or `tmpfs`
//   TARGET  a path inside the container, relative to its root ("fsx" == "/fsx"); no `..`
//   TYPE    none (a bind mount) or tmpfs; with three fields the third may be the options instead
//           ("/opt/tools /opt/tools rbind"); with two, SOURCE `tmpfs` makes a tmpfs, else a bind mount
//   OPTIONS bind (non-recursive), rbind (the default), ro, rw, nosuid, suid, nodev, dev, noexec, exec,
//           the propagation flags of --container-mounts, nofail, defaults, x-create=dir|file|auto
//           (Gantry always creates the mount point, as a directory or file like the source), and for
//           tmpfs size=, mode=, nr_inodes=, uid=, gid=. x-move and x-detach are refused.
//   FREQ and PASSNO are ignored (the file's order is the mount order).
Result<std::vector<DropinMount>> parse_fstab_file(std::string_view text, const std::vector<std::string>& env,
                                                  const std::string& origin);

// What the drop-in directories add to every container.
struct SiteDefaults {
    std::vector<std::string> env;   // "NAME=VALUE", files in lexical order, lines in file order
    std::vector<MountSpec> mounts;  // nofail mounts of missing sources already left out
};

// Reads config.environ_dir/*.env and config.mounts_dir/*.fstab (other names are ignored), each in
// lexical order of the file names, expanding ${NAME} from `env`. The files are the admin's: a directory
// or file must be owned by root (or, for an unprivileged caller, by the caller) and writable by
// nobody else, checked on the open descriptor before a byte is parsed; otherwise the call fails naming
// the file and the fix. A missing directory adds nothing.
Result<SiteDefaults> load_site_defaults(const Config& config, const std::vector<std::string>& env);

// What `enroot import` leaves in an image instead of an OCI config (Enroot's image format):
// /etc/environment (the Env, as NAME=VALUE lines) and /etc/rc, the script Enroot runs first, which
// `cd`s to the WorkingDir and `exec`s the Entrypoint with the command (or the Cmd without one).
struct EnrootImageSettings {
    std::vector<std::string> env;         // /etc/environment, ${NAME} expanded
    std::string workdir;                  // /etc/rc's leading `cd "DIR"`; "" when it has none
    std::vector<std::string> entrypoint;  // /etc/rc's `exec WORD... "$@"`
    std::vector<std::string> cmd;         // the words its no-argument `exec` adds after the entrypoint
};

// The parts of an /etc/rc that Gantry takes over, read the way Enroot writes the file: comment,
// blank and `mkdir` lines first, then `cd "DIR" && ...` (DIR absolute, without '"', '$', '`' or '\');
// then, in the `if [ $# -gt 0 ]` block, `exec 'WORD'... "$@"` and in its else branch
// `exec 'WORD'...` (single-quoted words as bash's ${x@Q} writes them, '\'' for a quote). Anything else
// (a hand-written rc, or one with a NUL byte) leaves the field empty: the script itself is never run.
EnrootImageSettings parse_enroot_rc(std::string_view rc);

// An Enroot-made image's settings, read from the squashfs file without mounting it, by
// `helper --enroot-settings IMAGE` (gantry-holder; "": default_holder_program()) run with `env` as its
// environment. The image is the user's bytes: when the caller is root and `uid` is not, the helper
// runs as uid/gid (and the user's groups), and only checked, capped entries come back. An image
// without the files: empty settings. The helper is killed, and this fails, after `timeout` or as soon
// as `should_stop` says so (a file on a stalled file system must not hold root: issue #34).
Result<EnrootImageSettings> read_enroot_settings(const std::string& image, uid_t uid, gid_t gid,
                                                 const std::vector<std::string>& env, const std::string& helper = {},
                                                 std::chrono::seconds timeout = std::chrono::seconds(5),
                                                 const std::function<bool()>& should_stop = {});
// The helper's side (gantry-holder --enroot-settings IMAGE): reads IMAGE's /etc/environment and
// /etc/rc with the caller's rights, expands ${NAME} from the process environment, and writes
// NUL-terminated entries to stdout: NAME=VALUE for the environment, then "@workdir=DIR",
// "@entrypoint=WORD" and "@cmd=WORD" (one per word, in order); an error goes to stderr. Returns the
// exit status.
int print_enroot_settings(const std::string& image);

// What both front ends (the plugin's step and `gantry run`) add to a ContainerSpec before
// Container::create, `env` being the job's (or caller's) environment:
//   1. a squashfs without an OCI config (no Env, Entrypoint or Cmd: an Enroot-made or hand-made
//      image) gets its /etc/environment as the image environment, and /etc/rc's working directory,
//      entrypoint and command (read_enroot_settings);
//   2. environ.d variables go after the image's (so they win over the image; the job's own variables
//      do not replace them under the Pyxis rule, --container-env and --env NAME=VALUE still do);
//   3. mounts.d mounts go before the user's --container-mounts (a user mount at the same target is
//      mounted later, over it).
Status apply_site_defaults(ContainerSpec& spec, const std::vector<std::string>& env);

}  // namespace gantry
