// Reading host facts under Config::host_root (a prefix the tests point at a fake hardware tree):
// files, directory listings and symlink resolution that cannot escape the prefix.
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry::devices {

std::string host_path(const std::string& host_root, const std::string& path) {
    std::string root = host_root;
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    if (root.empty() || root == "/") return path;
    return root + path;
}

std::optional<std::string> resolve_in_host(const std::string& host_root, const std::string& path) {
    std::string root = host_path(host_root, "/");
    UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return std::nullopt;
    struct open_how how {};
    how.flags = O_PATH | O_CLOEXEC;
    // IN_ROOT: an absolute link in the fake tree (or a hostile one) is clamped at the prefix.
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    std::string rel = path.size() > 1 ? path.substr(1) : ".";
    UniqueFd fd(openat2_retrying(dir.get(), rel, how));
    if (!fd) return std::nullopt;
    char buf[4096];
    ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd.get())).c_str(), buf, sizeof buf - 1);
    if (n <= 0) return std::nullopt;
    std::string real(buf, static_cast<size_t>(n));
    std::string prefix = host_path(host_root, "");
    if (!prefix.empty()) {
        if (!starts_with(real, prefix + "/")) return std::nullopt;
        real = real.substr(prefix.size());
    }
    return real;
}

std::vector<std::string> list_dir(const std::string& path) {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
        while (dirent* e = ::readdir(d)) {
            std::string n = e->d_name;
            if (n != "." && n != "..") out.push_back(n);
        }
        ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
}

bool is_char_device(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

std::optional<std::string> env_value(const std::vector<std::string>& env, const std::string& name) {
    std::optional<std::string> v;
    for (const auto& e : env)
        if (e.size() > name.size() && e[name.size()] == '=' && e.compare(0, name.size(), name) == 0)
            v = e.substr(name.size() + 1);
    return v;
}

}  // namespace gantry::devices
