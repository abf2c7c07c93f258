// --container-save: the container's root file system (image plus what the step wrote) as a squashfs
// file, made as the job user inside the container's user namespace (see save_container below).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gantry/fd.hpp"
#include "gantry/launcher.hpp"
#include "gantry/spawn.hpp"
#include "gantry/strings.hpp"

namespace gantry {
namespace {

// The descriptor of the holder's root in mksquashfs.
constexpr int kRootFd = 200;

}  // namespace

// The mount points below "/" in a process's view, relative to its root ("proc", "etc/hosts"), decoded
// from /proc/PID/mountinfo (field 5, with octal escapes such as \040 for a space). Left out: the
// mounts that make up the root itself — a read-only container's "/" is a skeleton whose top-level
// directories are clones of the image mount (squashfs, gantry-imagefs, squashfuse) or small overlays over it (/etc):
// those are the image, not something mounted over it.
Result<std::vector<std::string>> mount_points_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/mountinfo");
    if (!in) return system_error("reading the mounts of process " + std::to_string(pid));
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string id, parent, devno, root, point;
        if (!(fields >> id >> parent >> devno >> root >> point)) continue;
        std::string fstype;
        if (auto dash = line.find(" - "); dash != std::string::npos)
            fstype = line.substr(dash + 3, line.find(' ', dash + 3) - (dash + 3));
        bool image_part = fstype == "squashfs" || fstype == "overlay" || starts_with(fstype, "fuse.squashfuse") ||
                          fstype == "fuse.gantry-imagefs";
        if (image_part && point.size() > 1 && point.find('/', 1) == std::string::npos) continue;
        std::string decoded;
        for (size_t i = 0; i < point.size(); ++i) {
            if (point[i] == '\\' && i + 3 < point.size()) {
                decoded.push_back(static_cast<char>(std::stoi(point.substr(i + 1, 3), nullptr, 8)));
                i += 3;
            } else {
                decoded.push_back(point[i]);
            }
        }
        if (decoded.size() > 1 && decoded[0] == '/') out.push_back(decoded.substr(1));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

// Writes the container's root file system (image plus the step's writes) as squashfs, as the job user
// inside the container's user namespace: the tree is the user's, so reading it must not use root's
// rights. /proc/PID/root enters the holder's mount namespace; what is mounted over the root (/proc,
// /sys, /dev, /tmp, every bind mount: see mount_points_of) is excluded; -all-root stores every file as
// root's, as Enroot's export does.
Status save_container(const ContainerState& container, const ProcessIdentity& user, const std::string& path) {
    std::string pid = std::to_string(container.holder_pid);
    std::string root = "/proc/self/fd/" + std::to_string(kRootFd) + "/";
    std::string tmp = path + ".partial";
    // Opened here, with the caller's rights (root in the plugin): the holder root started for the user
    // is not dumpable, so the user could open neither. The user's mksquashfs gets them as descriptors:
    // the namespace the user owns and the container's root, both the user's to read already.
    UniqueFd userns(::open(("/proc/" + pid + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    if (!userns) return system_error("--container-save: opening the container's user namespace");
    UniqueFd root_dir(::open(("/proc/" + pid + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root_dir) return system_error("--container-save: opening the container's root");
    std::vector<std::string> argv = {
        "/usr/bin/mksquashfs", root, tmp, "-noappend", "-all-root", "-comp", "lz4", "-quiet", "-no-progress", "-e"};
    // Everything mounted over the root file system (/proc, /sys, /dev, /tmp, binds) stays out. Not
    // -one-file-system: overlayfs reports its files with the device of the layer they come from.
    auto mounts = mount_points_of(container.holder_pid);
    if (!mounts) return mounts.error().wrap("--container-save");
    argv.insert(argv.end(), mounts->begin(), mounts->end());
    if (mounts->empty()) argv.pop_back();
    ProcessRequest inside;
    inside.argv = std::move(argv);
    inside.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    inside.identity = user;
    inside.userns_fd = userns.get();
    inside.inputs = {{root_dir.get(), kRootFd}};
    auto r = spawn(inside);
    if (!r) return r.error().wrap("--container-save " + path);
    if (r->status != 0) {
        // Removed as the user, never by root: the user chose the path, and any directory on the way
        // may be a symbolic link of theirs into another account's directory (root's unlink would
        // follow it and delete, say, another user's results.partial). As the user, rm can remove
        // only what the user could remove anyway.
        ProcessRequest cleanup;
        cleanup.argv = {"/bin/rm", "-f", "--", tmp};
        cleanup.env = {"PATH=/usr/bin:/bin"};
        cleanup.identity = user;
        (void)spawn(cleanup);
        return make_error("--container-save " + path +
                          ": mksquashfs failed: " + last_line(r->err + r->out).substr(0, 300));
    }
    // Renamed as the user too, so a path the user may not write stays unwritten.
    ProcessRequest rename;
    rename.argv = {"/bin/mv", "-f", tmp, path};
    rename.env = {"PATH=/usr/bin:/bin"};
    rename.identity = user;
    auto mv = spawn(rename);
    if (!mv || mv->status != 0) return make_error("--container-save: could not rename " + tmp + " to " + path);
    return {};
}

}  // namespace gantry
