// AWS EFA and other RDMA devices: pass /dev/infiniband/uverbsN only for devices whose driver is
// `efa` (exposing mlx5 uverbs as well makes libfabric's `fi_info -p efa` fail), plus rdma_cm; mlx
// devices only when MELLANOX_VISIBLE_DEVICES asks (the variable Enroot's Mellanox hook reads). /sys's
// class directories are replaced by views listing the same devices, so libibverbs' sysfs scan and
// the device nodes agree. Optionally the host's libfabric and aws-ofi-nccl are mounted in.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "gantry/files.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

std::string link_target(const std::string& path) {
    char buf[4096];
    ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool is_mlx(const RdmaDevice& d) {
    return starts_with(d.driver, "mlx");
}

// The memlock limit the tasks will run with: srun exports the submitting shell's limit as
// SLURM_RLIMIT_MEMLOCK (Slurm applies it to the tasks); otherwise ours.
std::optional<unsigned long long> memlock_limit(const std::vector<std::string>& job_env) {
    if (auto v = devices::env_value(job_env, "SLURM_RLIMIT_MEMLOCK")) {
        char* end = nullptr;
        unsigned long long n = std::strtoull(v->c_str(), &end, 10);
        if (!v->empty() && *end == '\0')
            return n == static_cast<unsigned long long>(RLIM_INFINITY) ? std::nullopt : std::optional(n);
    }
    struct rlimit rl {};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) return rl.rlim_cur;
    return std::nullopt;
}

}  // namespace

std::vector<RdmaDevice> rdma_devices(const std::string& host_root) {
    using devices::host_path;
    std::vector<RdmaDevice> out;
    std::string cls = host_path(host_root, "/sys/class/infiniband_verbs");
    for (const auto& name : devices::list_dir(cls)) {
        if (!starts_with(name, "uverbs")) continue;
        RdmaDevice d;
        d.uverbs = name;
        d.sysfs_link = link_target(cls + "/" + name);
        if (auto drv = devices::resolve_in_host(host_root, "/sys/class/infiniband_verbs/" + name + "/device/driver"))
            d.driver = drv->substr(drv->rfind('/') + 1);
        if (auto ib = try_read_file(cls + "/" + name + "/ibdev")) d.ib_name = trim(*ib);
        if (!d.ib_name.empty()) d.ib_link = link_target(host_path(host_root, "/sys/class/infiniband/" + d.ib_name));
        out.push_back(std::move(d));
    }
    // uverbs10 after uverbs9.
    std::sort(out.begin(), out.end(), [](const RdmaDevice& a, const RdmaDevice& b) {
        auto num = [](const std::string& s) { return std::atoi(s.c_str() + 6); };
        return num(a.uverbs) < num(b.uverbs);
    });
    return out;
}

std::vector<RdmaDevice> select_rdma(const std::vector<RdmaDevice>& all, bool efa,
                                    const std::optional<std::string>& mellanox_visible) {
    std::vector<RdmaDevice> mlx;
    for (const auto& d : all)
        if (is_mlx(d)) mlx.push_back(d);
    std::vector<std::string> want;  // uverbs names of the mlx devices asked for
    std::string m = trim(mellanox_visible.value_or(""));
    if (m == "all") {
        for (const auto& d : mlx) want.push_back(d.uverbs);
    } else if (!m.empty() && m != "none" && m != "void") {
        for (const auto& id : split_list(m, ',')) {
            bool index = std::all_of(id.begin(), id.end(), [](unsigned char c) { return std::isdigit(c); });
            for (size_t i = 0; i < mlx.size(); ++i)
                if ((index && std::to_string(i) == id) || mlx[i].uverbs == id || mlx[i].ib_name == id)
                    want.push_back(mlx[i].uverbs);
        }
    }
    std::vector<RdmaDevice> out;
    for (const auto& d : all) {
        if ((efa && d.driver == "efa") || std::find(want.begin(), want.end(), d.uverbs) != want.end()) out.push_back(d);
    }
    return out;
}

namespace devices {

ContainerEdits rdma_edits(const Config& config, const std::vector<std::string>& job_env) {
    ContainerEdits edits;
    const std::string& root = config.host_root;
    auto chosen = select_rdma(rdma_devices(root), config.efa, env_value(job_env, "MELLANOX_VISIBLE_DEVICES"));
    bool any_efa = std::any_of(chosen.begin(), chosen.end(), [](const RdmaDevice& d) { return d.driver == "efa"; });

    if (!chosen.empty()) {
        SysfsView verbs{"/sys/class/infiniband_verbs", {}, {}};
        SysfsView ib{"/sys/class/infiniband", {}, {}};
        std::string names;
        for (const auto& d : chosen) {
            std::string node = "/dev/infiniband/" + d.uverbs;
            if (is_char_device(host_path(root, node))) edits.devices.push_back({host_path(root, node), node});
            if (!d.sysfs_link.empty()) verbs.entries.push_back({d.uverbs, d.sysfs_link});
            if (!d.ib_link.empty()) ib.entries.push_back({d.ib_name, d.ib_link});
            names += (names.empty() ? "" : ",") + d.uverbs + "(" + d.driver + ")";
        }
        if (is_char_device(host_path(root, "/dev/infiniband/rdma_cm")))
            edits.devices.push_back({host_path(root, "/dev/infiniband/rdma_cm"), "/dev/infiniband/rdma_cm"});
        // libibverbs refuses to work without the class's ABI version file.
        if (auto abi = try_read_file(host_path(root, "/sys/class/infiniband_verbs/abi_version")))
            verbs.files.emplace_back("abi_version", *abi);
        edits.sysfs_views.push_back(std::move(verbs));
        edits.sysfs_views.push_back(std::move(ib));
        edits.summary = "rdma " + names;
    }

    if (any_efa) {
        if (auto limit = memlock_limit(job_env))
            edits.warnings.push_back("the memlock limit is " + std::to_string(*limit / 1024) +
                                     " KiB; EFA needs it unlimited (ulimit -l unlimited before srun, or "
                                     "LimitMEMLOCK=infinity for slurmd)");
    }
    if (any_efa && config.efa_host_libs) {
        bool have_fabric = false;
        for (const char* dir : {"/opt/amazon/efa", "/opt/amazon/ofi-nccl", "/opt/aws-ofi-nccl"}) {
            auto real = resolve_in_host(root, dir);
            if (!real) continue;
            edits.mounts.push_back({host_path(root, *real), dir, true});
            for (const char* lib : {"/lib", "/lib64"}) {
                std::string d = std::string(dir) + lib;
                if (resolve_in_host(root, d)) edits.ld_library_dirs.push_back(d);
            }
            if (std::string(dir) == "/opt/amazon/efa") {
                have_fabric = true;
            } else if (resolve_in_host(root, std::string(dir) + "/lib/libnccl-net-ofi.so") ||
                       resolve_in_host(root, std::string(dir) + "/lib64/libnccl-net-ofi.so")) {
                // aws-ofi-nccl >= 1.7 names its plugin libnccl-net-ofi.so, selected by NCCL_NET_PLUGIN;
                // older releases ship libnccl-net.so, which NCCL finds on the library path by itself.
                edits.env.push_back("NCCL_NET_PLUGIN=ofi");
            }
        }
        if (have_fabric) edits.env.push_back("FI_PROVIDER=efa");
    }
    return edits;
}

}  // namespace devices
}  // namespace gantry
