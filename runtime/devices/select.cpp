// select_devices: one container's devices and wiring, assembled from the NVIDIA (gpu.cpp), CDI
// (cdi.cpp) and RDMA (rdma.cpp) parts, each behind its gantry.conf switch.
#include <sys/stat.h>

#include <algorithm>

#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {

void ContainerEdits::merge(const ContainerEdits& o) {
    devices.insert(devices.end(), o.devices.begin(), o.devices.end());
    mounts.insert(mounts.end(), o.mounts.begin(), o.mounts.end());
    symlinks.insert(symlinks.end(), o.symlinks.begin(), o.symlinks.end());
    sysfs_views.insert(sysfs_views.end(), o.sysfs_views.begin(), o.sysfs_views.end());
    env.insert(env.end(), o.env.begin(), o.env.end());
    for (const auto& d : o.ld_library_dirs)
        if (std::find(ld_library_dirs.begin(), ld_library_dirs.end(), d) == ld_library_dirs.end())
            ld_library_dirs.push_back(d);
    warnings.insert(warnings.end(), o.warnings.begin(), o.warnings.end());
    if (!o.summary.empty()) summary += (summary.empty() ? "" : "; ") + o.summary;
}

Result<ContainerEdits> select_devices(const Config& config, const std::vector<std::string>& job_env,
                                      const ImageConfig& image) {
    ContainerEdits edits;
    std::vector<std::string> cdi;
    if (config.gpu) {
        auto gpu = devices::nvidia_edits(config, job_env, image);
        if (!gpu) return gpu.error();
        edits.merge(*gpu);
        auto request = gpu_request(job_env, image.env);
        if (request) cdi = request->cdi;
    }
    if (auto named = devices::env_value(job_env, "GANTRY_CDI_DEVICES"))
        for (const auto& n : split_list(*named, ',')) cdi.push_back(n);
    auto from_cdi = devices::cdi_edits(config, cdi);
    if (!from_cdi) return from_cdi.error();
    edits.merge(*from_cdi);
    edits.merge(devices::rdma_edits(config, job_env));

    // Slurm's PMIx server keeps its per-step files (the dstore shared-memory segments clients attach
    // to) in PMIX_SERVER_TMPDIR, a host path: bound at the same path, writable, when the job user
    // reaches it. The job's environment names it, so it is not looked at here (this may run as root):
    // the holder decides as the user (DeviceMount::if_reachable).
    if (config.pmix) {
        if (auto dir = devices::env_value(job_env, "PMIX_SERVER_TMPDIR")) {
            std::string d = *dir;
            while (d.size() > 1 && d.back() == '/') d.pop_back();
            if (!d.empty() && d[0] == '/' && d != "/") edits.mounts.push_back({d, d, false, true});
        }
    }

    // Device nodes named twice (a CDI spec and the built-in discovery) are bound once.
    std::vector<DeviceNode> unique;
    for (const auto& d : edits.devices)
        if (std::none_of(unique.begin(), unique.end(), [&](const DeviceNode& u) { return u.path == d.path; }))
            unique.push_back(d);
    edits.devices = std::move(unique);
    return edits;
}

}  // namespace gantry
