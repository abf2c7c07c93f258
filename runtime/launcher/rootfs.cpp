// Assembling the container's "/": an overlay over the image (tmpfs upper layer, so mount points and
// generated /etc files can be added even to a read-only image) when --writable, otherwise a tmpfs
// skeleton of binds of the image's top-level entries with small overlays where we add entries
// (mount_skeleton_root: host-speed warm reads), the standard mounts (/proc, /sys, /dev, /tmp, /run,
// host network files, home), the user's mounts, then pivot_root.
//
// Where new mount points are created matters: under the image they go into the overlay's upper
// layer *before* the overlay is mounted (the image's directories belong to ids that are unmapped in
// our user namespace, so we could not create entries through the overlay); under one of our tmpfs
// mounts they are created in place; under a host bind mount they must already exist (we never
// create files on the host).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry::launcher {
namespace {

struct PlannedMount {
    std::string destination;
    bool ours;  // a tmpfs we create: mount points below it may be created
};

// Whether the calling user (the holder runs as the job user when it plans and makes mounts) reaches
// `path` for a bind: its path resolves for the user (every directory on the way searchable by them),
// as Pyxis checks a source exists. Missing and hidden from the user give the same answer.
// Not whether the user may read it: a bind grants nothing. The mounted file or directory keeps its
// owner and mode, and inside the container the user is the same uid (root-owned entries show as the
// overflow id, remap-root included, and the namespace's capabilities do not reach them), so a file
// they cannot read on the host (/etc/shadow) stays unreadable inside; they learn only that it exists,
// which stat(2) on the host already tells them.
bool user_reaches(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

// Where the user's home (the account's, from the password database: not $HOME) appears: at its own
// path, or at /root with remap-root, where the user is root (Enroot's home hook does the same).
std::string home_mount_point(const Setup& s) {
    return s.spec->remap_root ? "/root" : s.id.home;
}

// The standard mounts, in order (user mounts follow).
std::vector<PlannedMount> planned_mounts(const Setup& s) {
    std::vector<PlannedMount> p = {{"/proc", false}, {"/sys", false}};
    p.push_back({"/dev", !s.spec->config.host_dev});
    for (const char* d : {"/tmp", "/run"}) p.push_back({d, true});
    for (const char* f : {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}) p.push_back({f, false});
    if (s.spec->mount_home && !s.id.home.empty()) p.push_back({home_mount_point(s), false});
    // A mount left out because the user does not reach its source (a path from the job's environment,
    // a mounts.d `nofail` entry) gets no mount point either: the container shows no trace of it.
    for (const auto& m : s.spec->devices.mounts)
        if (!m.if_reachable || user_reaches(m.host_path)) p.push_back({m.path, false});
    for (const auto& m : s.spec->mounts)
        if (m.kind != MountKind::umount && (!m.nofail || m.kind != MountKind::bind || user_reaches(m.source)))
            p.push_back({m.destination, m.kind == MountKind::tmpfs});
    return p;
}

bool is_below(const std::string& path, const std::string& dir) {
    return dir == "/" || path == dir || starts_with(path, dir + "/");
}

std::string read_in_root(int root, const std::string& path) {
    auto fd = open_in_root(root, path);
    if (!fd) return {};
    std::ifstream f(fd_path(fd->get()));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Creates `path` (a mount point on the image level) in the upper layer unless the image has it.
Status precreate_in_upper(int image, int upper, const std::string& path, NodeType type) {
    if (open_in_root(image, path)) return {};
    // Walk the literal components: every existing one must be a real directory in the image, so the
    // upper-layer copy we create merges with it rather than shadowing a symlink the image relies on.
    std::string prefix;
    for (const auto& part : split_list(path, '/')) {
        prefix += "/" + part;
        struct stat st {};
        if (::fstatat(image, prefix.c_str() + 1, &st, AT_SYMLINK_NOFOLLOW) != 0) break;
        if (prefix == path) break;
        if (!S_ISDIR(st.st_mode))
            return make_error("creating mount point " + path + ": " + prefix + " in the image is not a directory");
    }
    auto fd = ensure_in_root(upper, path, type);
    if (!fd) return fd.error();
    return {};
}

uint64_t propagation_flag(Propagation p) {
    switch (p) {
        case Propagation::slave:
            return MS_SLAVE;
        case Propagation::shared:
            return MS_SHARED;
        case Propagation::unbindable:
            return MS_UNBINDABLE;
        case Propagation::private_:
            break;
    }
    return MS_PRIVATE;
}

// The mount point for `dst`: opened in the root, or created when it lies below one of our tmpfs.
Result<UniqueFd> mount_point(Setup& s, const std::string& dst, NodeType type) {
    auto fd = open_in_root(s.root.get(), dst);
    if (fd || fd.error().errnum != ENOENT) return fd;
    // Below which mount? Only our own tmpfs mounts may grow new entries; image-level ones were made
    // in the upper layer already; host binds are never written to.
    std::string owner;
    bool ours = false;
    for (const auto& p : planned_mounts(s)) {
        if (p.destination != dst && is_below(dst, p.destination) && p.destination.size() > owner.size()) {
            owner = p.destination;
            ours = p.ours;
        }
    }
    if (!ours)
        return make_error("mount destination " + dst + " does not exist" + (owner.empty() ? "" : " in " + owner));
    return ensure_in_root(s.root.get(), dst, type);
}

Status open_upper_etc(Setup& s, UniqueFd& out) {
    auto etc = ensure_in_root(s.upper.get(), "/etc", NodeType::directory);
    if (!etc) return etc.error();
    out = UniqueFd(::openat(etc->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!out) return system_error("opening /etc in the upper layer");
    return {};
}

}  // namespace

Status write_file_at(int dirfd, const std::string& name, const std::string& content, const std::string& what) {
    ::unlinkat(dirfd, name.c_str(), 0);
    UniqueFd fd(::openat(dirfd, name.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd) return system_error("creating " + what);
    if (::write(fd.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size()))
        return system_error("writing " + what);
    return {};
}

Status bind_into(Setup& s, const std::string& source, const std::string& dst, bool recursive, uint64_t attr_set,
                 Propagation propagation, bool propagation_recursive) {
    std::string what = "mounting " + source + " at " + dst;
    int tree = static_cast<int>(
        ::open_tree(AT_FDCWD, source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0)));
    if (tree < 0) return system_error(what);
    UniqueFd tree_fd(tree);
    struct stat st {};
    if (::fstat(tree, &st) != 0) return system_error(what);
    if (attr_set != 0) {
        struct mount_attr attr {};
        attr.attr_set = attr_set;
        if (::mount_setattr(tree, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr, sizeof attr) != 0)
            return system_error(what);
    }
    auto target = mount_point(s, dst, S_ISDIR(st.st_mode) ? NodeType::directory : NodeType::file);
    if (!target) return target.error().wrap(what);
    if (::move_mount(tree, "", target->get(), "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
        return system_error(what);
    struct mount_attr prop {};
    prop.propagation = propagation_flag(propagation);
    if (::mount_setattr(tree, "", AT_EMPTY_PATH | (propagation_recursive ? AT_RECURSIVE : 0), &prop, sizeof prop) != 0)
        return system_error(what + " (propagation)");
    return {};
}

Status tmpfs_into(Setup& s, const std::string& dst, const std::string& options, uint64_t attr_set) {
    std::string what = "mounting tmpfs at " + dst;
    UniqueFd fs(::fsopen("tmpfs", FSOPEN_CLOEXEC));
    if (!fs) return system_error(what);
    for (const auto& opt : split_list(options, ',')) {
        auto eq = opt.find('=');
        std::string key = opt.substr(0, eq);
        int rc = eq == std::string::npos
                     ? ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, key.c_str(), nullptr, 0)
                     : ::fsconfig(fs.get(), FSCONFIG_SET_STRING, key.c_str(), opt.c_str() + eq + 1, 0);
        if (rc != 0) return system_error(what + ": option " + opt);
    }
    if (::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return system_error(what);
    UniqueFd mnt(::fsmount(fs.get(), FSMOUNT_CLOEXEC, static_cast<unsigned>(attr_set)));
    if (!mnt) return system_error(what);
    auto target = mount_point(s, dst, NodeType::directory);
    if (!target) return target.error().wrap(what);
    if (::move_mount(mnt.get(), "", target->get(), "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
        return system_error(what);
    return {};
}

Status mount_staging_area(Setup& s) {
    if (s.staging_mounted) return {};
    if (::mount("tmpfs", s.staging.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0)
        return system_error("mounting the staging tmpfs on " + s.staging);
    s.staging_mounted = true;
    for (const char* d : {"/image", "/rw"})
        if (::mkdir((s.staging + d).c_str(), 0755) != 0) return system_error("creating " + s.staging + d);
    return {};
}

Result<std::vector<std::string>> make_layer_dirs(Setup& s) {
    const std::string base = s.staging + "/layers";
    // overlayfs separates lower layers with ':' and options with ',': the staging path must have neither.
    if (base.find_first_of(":,") != std::string::npos)
        return make_error("cannot stack image layers below " + base + ": the path holds ':' or ','");
    if (::mkdir(base.c_str(), 0700) != 0 || ::mkdir((base + "/empty").c_str(), 0755) != 0)
        return system_error("creating " + base);
    std::vector<std::string> dirs;
    for (size_t i = 0; i < s.spec->image_layers.size(); ++i) {
        dirs.push_back(base + "/" + std::to_string(i));
        if (::mkdir(dirs.back().c_str(), 0755) != 0) return system_error("creating " + dirs.back());
    }
    return dirs;
}

}  // namespace gantry::launcher

namespace gantry {

bool kernel_release_at_least(std::string_view release, int major, int minor) {
    auto number = [&](size_t& at) -> std::optional<int> {
        size_t start = at;
        int value = 0;
        while (at < release.size() && release[at] >= '0' && release[at] <= '9' && at - start < 6)
            value = value * 10 + (release[at++] - '0');
        if (at == start) return std::nullopt;
        return value;
    };
    size_t at = 0;
    auto have_major = number(at);
    if (!have_major || at >= release.size() || release[at] != '.') return false;
    ++at;
    auto have_minor = number(at);
    if (!have_minor) return false;
    return *have_major > major || (*have_major == major && *have_minor >= minor);
}

bool kernel_stacks_layers() {
    struct utsname u {};
    return ::uname(&u) == 0 && kernel_release_at_least(u.release, 5, 11);
}

}  // namespace gantry

namespace gantry::launcher {

Status stack_layers(const std::string& base, const std::vector<std::string>& names, const std::string& target,
                    const std::string& what) {
    // The lower layers by their names below `base` ("2:1:0:empty"), which the kernel resolves against
    // our working directory: the mount's options are one page (4 KiB), which full paths would fill at
    // about a hundred layers; overlayfs itself takes up to 500. An empty directory at the bottom:
    // overlayfs needs two lower layers without an upper one.
    std::string lowers = "empty";
    for (const auto& name : names) lowers = name + ":" + lowers;  // top layer first
    const std::string opts = "lowerdir=" + lowers + ",userxattr";
    UniqueFd here(::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!here || ::chdir(base.c_str()) != 0) return system_error("entering " + base);
    int rc = ::mount("overlay", target.c_str(), "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, opts.c_str());
    int err = errno;
    if (::fchdir(here.get()) != 0) return system_error("returning from " + base);
    if (rc != 0)
        return system_error(
            "stacking the " + std::to_string(names.size()) + " layers of " + what + " with overlayfs at " + target,
            err);
    return {};
}

Status mount_layer_stack(Setup& s, const std::vector<std::string>& dirs) {
    const std::string base = s.staging + "/layers";
    std::vector<std::string> names;
    for (const auto& dir : dirs) names.push_back(dir.substr(base.size() + 1));
    return stack_layers(base, names, s.image_dir, s.spec->image_path);
}

// Where the writable layer lives: with --writable, a directory of the user's in scratch_path (local
// NVMe: a job that writes 50 GB into its container must not fill the node's memory), removed when the
// holder exits; otherwise (only mount points and generated files) a small tmpfs. Runs as the user, in
// the container's namespaces: the directory belongs to the user on the host.
Status mount_writable_area(Setup& s, const std::string& rw) {
    const std::string& scratch = s.spec->config.scratch_path;
    if (!s.spec->writable || scratch.empty()) {
        if (::mount("tmpfs", rw.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0)
            return system_error("mounting the writable layer on " + rw);
        return {};
    }
    std::string tmpl = scratch + "/gantry-rw-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr)
        return system_error("creating the writable layer in scratch_path " + scratch +
                            " (gantry.conf; it must be a directory every user can create in, e.g. 1777)");
    std::string dir = buf.data();
    s.rw_scratch_dir = UniqueFd(::open(scratch.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    s.rw_scratch_name = dir.substr(dir.rfind('/') + 1);
    if (::mount(dir.c_str(), rw.c_str(), nullptr, MS_BIND, nullptr) != 0)
        return system_error("binding the writable layer " + dir + " on " + rw);
    return {};
}

Status prepare_writable_layer(Setup& s) {
    std::string rw = s.staging + "/rw";
    GANTRY_TRY(mount_writable_area(s, rw));
    for (const char* d : {"/upper", "/work", "/root"})
        if (::mkdir((rw + d).c_str(), 0755) != 0) return system_error("creating " + rw + d);

    // Offline edits of the upper layer, before the overlay exists: mount points and generated files.
    s.image = UniqueFd(::open(s.image_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    s.upper = UniqueFd(::open((rw + "/upper").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!s.image || !s.upper) return system_error("opening the image layers");
    const auto planned = planned_mounts(s);
    for (const auto& p : planned) {
        bool ancestor_planned = false;
        for (const auto& q : planned)
            if (q.destination != p.destination && is_below(p.destination, q.destination)) ancestor_planned = true;
        if (ancestor_planned) continue;
        bool is_file = starts_with(p.destination, "/etc/");
        for (const auto& m : s.spec->mounts) {
            struct stat st {};
            if (m.destination == p.destination && m.kind == MountKind::bind && ::stat(m.source.c_str(), &st) == 0)
                is_file = !S_ISDIR(st.st_mode);
        }
        for (const auto& m : s.spec->devices.mounts) {
            struct stat st {};
            if (m.path == p.destination && ::stat(m.host_path.c_str(), &st) == 0) is_file = !S_ISDIR(st.st_mode);
        }
        GANTRY_TRY(precreate_in_upper(s.image.get(), s.upper.get(), p.destination,
                                      is_file ? NodeType::file : NodeType::directory));
    }
    // The host's network files replace whatever the image has there (often a dangling symlink).
    UniqueFd etc;
    GANTRY_TRY(open_upper_etc(s, etc));
    for (const char* f : {"hosts", "hostname", "resolv.conf"})
        GANTRY_TRY(write_file_at(etc.get(), f, "", std::string("/etc/") + f));
    return write_device_files_in_upper(s);
}

// --remap-root: apt drops to its sandbox user `_apt`, then checks that its ids changed. The system call
// filter (seccomp.cpp) turns the switch into a no-op, so that check fails ("Could not switch group")
// and every download with it. Only one id exists in the namespace: tell apt to stay root, in images
// that have apt's configuration directory (each component a real directory, never a symlink, so the
// upper-layer copy merges with the image's instead of hiding it).
namespace {

Status keep_apt_as_root(Setup& s) {
    std::string prefix;
    for (const char* part : {"etc", "apt", "apt.conf.d"}) {
        prefix += prefix.empty() ? part : std::string("/") + part;
        struct stat st {};
        if (::fstatat(s.image.get(), prefix.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) return {};
    }
    auto dir = ensure_in_root(s.upper.get(), "/etc/apt/apt.conf.d", NodeType::directory);
    if (!dir) return dir.error().wrap("creating /etc/apt/apt.conf.d in the upper layer");
    UniqueFd fd(::openat(dir->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return system_error("opening /etc/apt/apt.conf.d in the upper layer");
    return write_file_at(fd.get(), "00gantry-remap-root",
                         "// Written by gantry for --remap-root: the container has one user id, apt's\n"
                         "// sandbox user _apt cannot exist (see gantry's docs/runtime.md).\n"
                         "APT::Sandbox::User \"root\";\n",
                         "/etc/apt/apt.conf.d/00gantry-remap-root");
}

// --remap-root: useradd, groupadd and passwd (run by package maintainer scripts: openssh's `_ssh` group
// and `sshd` user) rewrite /etc/shadow and /etc/gshadow in place. The image has them in group
// `shadow`, an id the one-id namespace does not map, and overlayfs cannot copy up a file whose owner
// it cannot set ("groupadd: cannot open /etc/gshadow", apt-get exits 100). Copies in the upper
// layer, owned by the user (root inside) as every file is under Enroot, which unpacks images as
// the user. Only with remap-root: the user is then the owner of the image's root files and reads
// these anyway; without it they stay the image's, unreadable.
Status copy_shadow_files(Setup& s, int etc) {
    for (const char* name : {"shadow", "gshadow"}) {
        std::string path = std::string("/etc/") + name;
        auto fd = open_in_root(s.image.get(), path);
        struct stat st {};
        if (!fd || ::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        GANTRY_TRY(write_file_at(etc, name, read_in_root(s.image.get(), path), path));
        if (::fchmodat(etc, name, st.st_mode & 0777, 0) != 0) return system_error("setting the mode of " + path);
    }
    return {};
}

}  // namespace

Status write_identity_files(Setup& s) {
    // The image's entries minus those clashing with the user, plus root and the user, written into
    // the upper layer so they shadow the image's files.
    UniqueFd etc;
    GANTRY_TRY(open_upper_etc(s, etc));
    const Identity& id = s.id;
    auto rebuild = [&](const std::string& file, const std::string& name, unsigned num, const std::string& root_line,
                       const std::string& user_line) -> Status {
        std::string out;
        bool have_root = false;
        std::istringstream in(read_in_root(s.image.get(), "/etc/" + file));
        std::string line;
        while (std::getline(in, line)) {
            std::vector<std::string> fields;
            size_t start = 0;
            while (true) {
                auto c = line.find(':', start);
                fields.push_back(line.substr(start, c == std::string::npos ? std::string::npos : c - start));
                if (c == std::string::npos) break;
                start = c + 1;
            }
            if (fields.size() < 3) continue;
            if (fields[2] == "0") have_root = true;
            if (num != 0 && (fields[0] == name || fields[2] == std::to_string(num))) continue;
            out += line + "\n";
        }
        if (!have_root) out = root_line + out;
        if (num != 0) out += user_line;
        return write_file_at(etc.get(), file, out, "/etc/" + file);
    };
    // With remap_root the user is root inside (the image's root entry), and also has an entry of
    // their own ids: a step that joins as the user (JoinOptions::as_user, `--no-container-remap-root`)
    // is then a known user, as sshd and ssh need to be.
    const uid_t user_uid = id.uid;
    const gid_t user_gid = id.gid;
    std::string uid = std::to_string(user_uid), gid = std::to_string(user_gid);
    GANTRY_TRY(rebuild("passwd", id.name, user_uid, "root:x:0:0:root:/root:/bin/sh\n",
                       id.name + ":x:" + uid + ":" + gid + ":" + id.name + ":" + s.home + ":/bin/sh\n"));
    GANTRY_TRY(rebuild("group", id.group_name, user_gid, "root:x:0:\n", id.group_name + ":x:" + gid + ":\n"));
    if (s.spec->remap_root) {
        GANTRY_TRY(keep_apt_as_root(s));
        GANTRY_TRY(copy_shadow_files(s, etc.get()));
    }
    return {};
}

Status mount_overlay_root(Setup& s) {
    std::string rw = s.staging + "/rw";
    std::string opts = "lowerdir=" + s.image_dir + ",upperdir=" + rw + "/upper,workdir=" + rw + "/work,userxattr";
    s.rootfs = rw + "/root";
    if (::mount("overlay", s.rootfs.c_str(), "overlay", MS_NOSUID | MS_NODEV, opts.c_str()) != 0)
        return system_error("mounting the container root (overlay over " + s.spec->image_path + ")");
    s.root = UniqueFd(::open(s.rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!s.root) return system_error("opening the container root");
    return {};
}

Result<std::vector<RootEntry>> plan_root_entries(int image, int upper, const std::vector<std::string>& covered) {
    auto names_in = [](int dir, const std::string& what) -> Result<std::vector<std::string>> {
        int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return system_error("listing " + what);
        DIR* d = ::fdopendir(fd);
        if (d == nullptr) {
            ::close(fd);
            return system_error("listing " + what);
        }
        std::vector<std::string> names;
        while (dirent* e = ::readdir(d)) {
            std::string n = e->d_name;
            if (n != "." && n != "..") names.push_back(n);
        }
        ::closedir(d);
        std::sort(names.begin(), names.end());
        return names;
    };
    auto in_image = names_in(image, "the image root");
    if (!in_image) return in_image.error();
    auto in_upper = names_in(upper, "the upper layer");
    if (!in_upper) return in_upper.error();
    std::vector<RootEntry> plan;
    for (const auto& name : *in_image) {
        struct stat img {
        }, ours{};
        if (::fstatat(image, name.c_str(), &img, AT_SYMLINK_NOFOLLOW) != 0)
            return system_error("checking /" + name + " in the image");
        bool mine = std::binary_search(in_upper->begin(), in_upper->end(), name);
        if (mine && ::fstatat(upper, name.c_str(), &ours, AT_SYMLINK_NOFOLLOW) != 0)
            return system_error("checking /" + name);
        // The overlay's rules at the top level: a directory in both merges, otherwise our entry wins.
        if (mine) {
            plan.push_back(
                {name, S_ISDIR(img.st_mode) && S_ISDIR(ours.st_mode) ? RootEntryKind::merged : RootEntryKind::ours});
            continue;
        }
        if (S_ISDIR(img.st_mode))
            plan.push_back({name, std::find(covered.begin(), covered.end(), name) != covered.end()
                                      ? RootEntryKind::mount_point
                                      : RootEntryKind::image_dir});
        else if (S_ISLNK(img.st_mode))
            plan.push_back({name, RootEntryKind::image_symlink});
        else
            plan.push_back({name, RootEntryKind::image_other});
    }
    for (const auto& name : *in_upper)
        if (!std::binary_search(in_image->begin(), in_image->end(), name)) plan.push_back({name, RootEntryKind::ours});
    std::sort(plan.begin(), plan.end(), [](const RootEntry& a, const RootEntry& b) { return a.name < b.name; });
    return plan;
}

// The read-only root without a whole-image overlay. A fresh overlay per container means fresh overlay
// dentries and inodes for every file it reads (a warm read of 20,000 files cost 1.4-2x the host);
// binds of the image's own directories reuse the image mount's dentries, warm in the page and dentry
// caches of the node since the last container. So "/" is the upper layer's directory (a small tmpfs
// "skeleton" holding our mount points and generated files), and each top-level entry of the image is
// bound, copied (symlinks) or, where we add entries inside it (/etc: passwd, hosts, ...), merged by a
// small overlay of that directory alone. What the container sees is what the whole-image overlay shows.
Status mount_skeleton_root(Setup& s) {
    std::string rw = s.staging + "/rw";
    std::vector<std::string> covered;
    // The standard mounts hide these directories whole, unless the user unmounts one again.
    if (std::none_of(s.spec->mounts.begin(), s.spec->mounts.end(),
                     [](const MountSpec& m) { return m.kind == MountKind::umount; }))
        covered = {"dev", "proc", "run", "sys", "tmp"};
    auto plan = plan_root_entries(s.image.get(), s.upper.get(), covered);
    if (!plan) return plan.error();
    // pivot_root needs a mount: the skeleton directory bound onto rw/root (our own tmpfs: safe).
    s.rootfs = rw + "/root";
    std::string upper = rw + "/upper";
    if (::mount(upper.c_str(), s.rootfs.c_str(), nullptr, MS_BIND, nullptr) != 0)
        return system_error("mounting the container root (" + upper + ")");
    s.root = UniqueFd(::open(s.rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!s.root) return system_error("opening the container root");
    int image = s.image.get(), root = s.root.get();
    int layer = 0;
    for (const auto& e : *plan) {
        const char* name = e.name.c_str();
        std::string what = "/" + e.name;
        switch (e.kind) {
            case RootEntryKind::ours:
                break;
            case RootEntryKind::mount_point:
                if (::mkdirat(root, name, 0755) != 0) return system_error("creating mount point " + what);
                break;
            case RootEntryKind::image_symlink: {
                // Copied, not followed: it resolves inside the container once we are there.
                std::vector<char> target(PATH_MAX + 1);
                ssize_t n = ::readlinkat(image, name, target.data(), PATH_MAX);
                if (n < 0) return system_error("reading the symlink " + what + " in the image");
                if (::symlinkat(std::string(target.data(), static_cast<size_t>(n)).c_str(), root, name) != 0)
                    return system_error("copying the symlink " + what);
                break;
            }
            case RootEntryKind::image_dir:
            case RootEntryKind::image_other: {
                bool dir = e.kind == RootEntryKind::image_dir;
                if (dir ? ::mkdirat(root, name, 0755) != 0
                        : UniqueFd(::openat(root, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644))
                                  .get() < 0)
                    return system_error("creating mount point " + what);
                // The entry itself, never a symlink's target (AT_SYMLINK_NOFOLLOW on a name we saw as a
                // directory or file): a clone of the image mount, so no host path is ever resolved.
                UniqueFd tree(static_cast<int>(
                    ::open_tree(image, name, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW)));
                if (!tree) return system_error("cloning " + what + " of the image");
                struct mount_attr attr {};
                attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
                if (::mount_setattr(tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
                    return system_error("making " + what + " of the image read-only");
                if (::move_mount(tree.get(), "", root, name, MOVE_MOUNT_F_EMPTY_PATH) != 0)
                    return system_error("mounting " + what + " of the image");
                break;
            }
            case RootEntryKind::merged: {
                // Our entries for this directory move out of the skeleton into the overlay's upper layer
                // (all within our tmpfs); the image's directory, by descriptor, is the lower layer.
                std::string dir = rw + "/layers/" + std::to_string(layer++);
                if ((::mkdir((rw + "/layers").c_str(), 0755) != 0 && errno != EEXIST) ||
                    ::mkdir(dir.c_str(), 0755) != 0 || ::mkdir((dir + "/work").c_str(), 0755) != 0)
                    return system_error("creating " + dir);
                if (::renameat(s.upper.get(), name, AT_FDCWD, (dir + "/upper").c_str()) != 0 ||
                    ::mkdirat(root, name, 0755) != 0)
                    return system_error("preparing the overlay of " + what);
                UniqueFd lower(::openat(image, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
                UniqueFd target(::openat(root, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
                if (!lower || !target) return system_error("opening " + what + " for its overlay");
                std::string opts = "lowerdir=" + fd_path(lower.get()) + ",upperdir=" + dir + "/upper,workdir=" + dir +
                                   "/work,userxattr";
                if (::mount("overlay", fd_path(target.get()).c_str(), "overlay", MS_NOSUID | MS_NODEV, opts.c_str()) !=
                    0)
                    return system_error("mounting the overlay of " + what + " (over " + s.spec->image_path + ")");
                // The overlay itself (opened through the new mount), to be made read-only after set-up.
                UniqueFd merged(::openat(root, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
                if (!merged) return system_error("opening the overlay of " + what);
                s.merged_dirs.push_back(std::move(merged));
                break;
            }
        }
    }
    return {};
}

Status mount_container_root(Setup& s) {
    // extract: its tree is unpacked per container, so there are no warm dentries to share, and mounts
    // stacked on the tree's own directories would keep the holder from deleting it at the end.
    if (s.spec->writable || s.backend == MountBackend::extract) return mount_overlay_root(s);
    return mount_skeleton_root(s);
}

Status mount_proc_and_sys(Setup& s) {
    // No pid namespace of our own, so a fresh proc mount is not allowed: the host's /proc, recursively
    // (its submounts are locked to us anyway).
    GANTRY_TRY(bind_into(s, "/proc", "/proc", true, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
    GANTRY_TRY(bind_into(s, "/sys", "/sys", true,
                         MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
    return {};
}

Status set_up_dev(Setup& s) {
    if (s.spec->config.host_dev) return bind_into(s, "/dev", "/dev", true, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC);
    GANTRY_TRY(tmpfs_into(s, "/dev", "mode=0755,size=65536k", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC));
    for (const char* node : {"null", "zero", "full", "random", "urandom", "tty"}) {
        std::string host = std::string("/dev/") + node;
        if (::access(host.c_str(), F_OK) != 0) continue;
        GANTRY_TRY(bind_into(s, host, host, false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC));
    }
    // The host's pts instance, so the caller's terminal (/dev/pts/N) stays valid inside.
    GANTRY_TRY(bind_into(s, "/dev/pts", "/dev/pts", false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC));
    GANTRY_TRY(tmpfs_into(s, "/dev/shm", "mode=1777", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
    if (::access("/dev/mqueue", F_OK) == 0)
        GANTRY_TRY(bind_into(s, "/dev/mqueue", "/dev/mqueue", false,
                             MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
    auto dev = open_in_root(s.root.get(), "/dev");
    if (!dev) return dev.error();
    UniqueFd dir(::openat(dev->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    for (auto [name, target] : {std::pair{"ptmx", "pts/ptmx"},
                                {"fd", "/proc/self/fd"},
                                {"stdin", "/proc/self/fd/0"},
                                {"stdout", "/proc/self/fd/1"},
                                {"stderr", "/proc/self/fd/2"},
                                {"core", "/proc/kcore"}}) {
        if (::symlinkat(target, dir.get(), name) != 0) return system_error(std::string("creating /dev/") + name);
    }
    return {};
}

Status mount_tmp_and_run(Setup& s) {
    GANTRY_TRY(tmpfs_into(s, "/tmp", "mode=1777", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
    GANTRY_TRY(tmpfs_into(s, "/run", "mode=0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
    return {};
}

Status bind_host_network_files(Setup& s) {
    for (const char* f : {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}) {
        if (::access(f, R_OK) != 0) continue;
        GANTRY_TRY(bind_into(s, f, f, false, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
    }
    return {};
}

Status mount_home(Setup& s) {
    if (!s.spec->mount_home || s.id.home.empty() || s.id.home == "/") return {};
    struct stat st {};
    if (::stat(s.id.home.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        log::debug("home " + s.id.home + " not found on the host; not mounted");
        return {};
    }
    return bind_into(s, s.id.home, home_mount_point(s), true, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
}

Status perform_user_mounts(Setup& s) {
    for (const auto& m : s.spec->mounts) {
        if (m.kind == MountKind::umount) {
            auto fd = open_in_root(s.root.get(), m.destination);
            if (!fd) return fd.error().wrap("unmounting " + m.destination);
            if (::umount2(fd_path(fd->get()).c_str(), MNT_DETACH) != 0)
                return system_error("unmounting " + m.destination);
            continue;
        }
        uint64_t attrs = (m.read_only ? MOUNT_ATTR_RDONLY : 0) | (m.nosuid ? MOUNT_ATTR_NOSUID : 0) |
                         (m.nodev ? MOUNT_ATTR_NODEV : 0) | (m.noexec ? MOUNT_ATTR_NOEXEC : 0);
        if (m.kind == MountKind::tmpfs) {
            GANTRY_TRY(tmpfs_into(s, m.destination, m.data.empty() ? "mode=1777" : m.data, attrs | MOUNT_ATTR_NODEV));
            continue;
        }
        std::string what = "mounting " + m.source + " at " + m.destination;
        struct stat st {};
        // As the job user: a mounts.d `nofail` entry the user does not reach is left out, whether it is
        // missing or not theirs (the same answer for both).
        if (m.nofail && !user_reaches(m.source)) continue;
        if (::stat(m.source.c_str(), &st) != 0) {
            if (errno == ENOENT || errno == ENOTDIR) return make_error(what + ": source path does not exist");
            return system_error(what);
        }
        // The stat above ran as the user (the holder's capabilities cover only the user's own
        // files): the source exists for them. Reading it is not needed for a bind (user_reaches).
        GANTRY_TRY(bind_into(s, m.source, m.destination, m.recursive, attrs, m.propagation, m.propagation_recursive));
    }
    return {};
}

Status check_workdir(Setup& s) {
    if (s.workdir.empty() || s.workdir == "/") return {};
    auto fd = open_in_root(s.root.get(), s.workdir);
    // "working directory /DIR: No such file or directory": Pyxis's wording ends the same way.
    if (!fd && fd.error().errnum != 0) return system_error("working directory " + s.workdir, fd.error().errnum);
    if (!fd) return fd.error().wrap("working directory " + s.workdir);
    return {};
}

Status pivot_into_root(Setup& s) {
    s.image.reset();
    s.upper.reset();
    s.root.reset();
    if (::chdir(s.rootfs.c_str()) != 0) return system_error("entering " + s.rootfs);
    // pivot_root(".", "."): the old root ends up stacked on the new one and is detached right away.
    if (::syscall(SYS_pivot_root, ".", ".") != 0) return system_error("pivot_root into the container");
    if (::umount2(".", MNT_DETACH) != 0) return system_error("detaching the host root");
    if (::chdir("/") != 0) return system_error("entering the container root");
    return {};
}

Status finish_root_flags(Setup& s) {
    struct mount_attr attr {};
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (s.spec->writable ? 0 : MOUNT_ATTR_RDONLY);
    if (::mount_setattr(AT_FDCWD, "/", 0, &attr, sizeof attr) != 0)
        return system_error("remounting the container root " + std::string(s.spec->writable ? "nosuid" : "read-only"));
    // The skeleton's overlays (by descriptor: whatever was mounted over them later stays as it is).
    for (const auto& fd : s.merged_dirs)
        if (::mount_setattr(fd.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
            return system_error("remounting the container's overlays read-only");
    s.merged_dirs.clear();
    return {};
}

}  // namespace gantry::launcher
