// NVIDIA MIG (Multi-Instance GPU) devices: which GPU instances (GI) and compute instances (CI)
// exist, and the nvidia-caps device nodes that grant access to each. A process uses a MIG device
// through its parent's /dev/nvidiaN plus /dev/nvidia-caps/nvidia-cap<n> of the GI and of the CI;
// the driver publishes n in procfs (the layout of NVIDIA's MIG user guide, "Device Nodes and
// Capabilities"):
//
//   /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access        "DeviceFileMinor: <n>" ...
//   /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access
//   /proc/driver/nvidia/capabilities/mig/config, .../mig/monitor        (reconfigure / observe all)
//   /proc/driver/nvidia-caps/mig-minors    "config 1", "monitor 2", "gpu0/gi0/access 3", ...
//   /proc/devices                          "<major> nvidia-caps" (dynamic major)
//
// MIG UUIDs ("MIG-<uuid>") exist only inside the driver; NVML reports them, so resolving one loads
// the host's libnvidia-ml.so.1 (as Slurm's gpu/nvml plugin does in slurmd).
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "gantry/files.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

std::optional<unsigned> number_after(const std::string& name, const std::string& prefix) {
    if (!starts_with(name, prefix) || name.size() == prefix.size()) return std::nullopt;
    std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }) ||
        digits.size() > 9)
        return std::nullopt;
    return static_cast<unsigned>(std::stoul(digits));
}

// "DeviceFileMinor: 12" from an access file.
std::optional<unsigned> device_file_minor(const std::string& file) {
    auto text = try_read_file(file);
    if (!text) return std::nullopt;
    for (const auto& line : split_list(*text, '\n')) {
        auto colon = line.find(':');
        if (colon == std::string::npos || trim(line.substr(0, colon)) != "DeviceFileMinor") continue;
        std::string v = trim(line.substr(colon + 1));
        if (auto n = number_after(v, "")) return n;
    }
    return std::nullopt;
}

// Subdirectories named <prefix><number>, in numeric order.
std::vector<unsigned> numbered(const std::string& dir, const std::string& prefix) {
    std::vector<unsigned> out;
    for (const auto& n : devices::list_dir(dir))
        if (auto v = number_after(n, prefix)) out.push_back(*v);
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

std::vector<MigDevice> host_mig_devices(const std::string& host_root, const std::vector<HostGpu>& gpus) {
    std::vector<MigDevice> out;
    for (const auto& g : gpus) {
        std::string mig =
            devices::host_path(host_root, "/proc/driver/nvidia/capabilities/gpu" + std::to_string(g.minor) + "/mig");
        unsigned index = 0;
        for (unsigned gi : numbered(mig, "gi")) {
            std::string gdir = mig + "/gi" + std::to_string(gi);
            auto gi_minor = device_file_minor(gdir + "/access");
            if (!gi_minor) continue;
            for (unsigned ci : numbered(gdir, "ci")) {
                auto ci_minor = device_file_minor(gdir + "/ci" + std::to_string(ci) + "/access");
                if (!ci_minor) continue;
                out.push_back(MigDevice{g.index, g.minor, index++, gi, ci, *gi_minor, *ci_minor});
            }
        }
    }
    return out;
}

namespace devices {

MigCapMinors mig_cap_minors(const std::string& host_root, const std::vector<MigDevice>& migs) {
    MigCapMinors m;
    for (const auto& d : migs) {
        m.mig.insert(d.gi_minor);
        m.mig.insert(d.ci_minor);
    }
    if (auto text = try_read_file(host_path(host_root, "/proc/driver/nvidia-caps/mig-minors"))) {
        for (const auto& line : split_list(*text, '\n')) {
            auto sp = line.rfind(' ');
            if (sp == std::string::npos) continue;
            auto minor = number_after(trim(line.substr(sp + 1)), "");
            if (!minor) continue;
            std::string name = trim(line.substr(0, sp));
            m.mig.insert(*minor);
            if (name == "config") m.config = minor;
            if (name == "monitor") m.monitor = minor;
        }
    }
    const std::string caps = "/proc/driver/nvidia/capabilities/mig/";
    if (auto n = device_file_minor(host_path(host_root, caps + "config"))) m.config = n;
    if (auto n = device_file_minor(host_path(host_root, caps + "monitor"))) m.monitor = n;
    for (auto n : {m.config, m.monitor})
        if (n) m.mig.insert(*n);
    if (auto text = try_read_file(host_path(host_root, "/proc/devices"))) {
        for (const auto& line : split_list(*text, '\n')) {
            auto sp = line.find(' ');
            if (sp != std::string::npos && trim(line.substr(sp + 1)) == "nvidia-caps")
                m.major = number_after(trim(line.substr(0, sp)), "");
        }
    }
    return m;
}

Result<NvmlDevices> nvml_devices(const std::string& host_root) {
    // The library the host's loader would pick for libnvidia-ml.so.1, inside host_root.
    std::string lib;
    if (auto cache = try_read_file(host_path(host_root, "/etc/ld.so.cache"))) {
        if (auto entries = parse_ld_cache(*cache)) {
            for (const auto& e : *entries) {
                if (e.soname != "libnvidia-ml.so.1" || !e.is_64bit()) continue;
                if (auto real = resolve_in_host(host_root, e.path)) {
                    lib = host_path(host_root, *real);
                    break;
                }
            }
        }
    }
    if (lib.empty()) return make_error("libnvidia-ml.so.1 is not in the host's ld.so cache");
    // Loading the driver's own NVML as root is what Slurm's gpu/nvml plugin and nvidia-container-cli
    // do; the file comes from the host's ld.so cache under the admin-configured host_root, never from
    // the job. RTLD_LOCAL: its symbols stay out of slurmstepd's namespace.
    void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return make_error("loading " + lib + ": " + ::dlerror());
    using Dev = void*;
    auto sym = [&](const char* name) { return ::dlsym(h, name); };
    auto init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    auto shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
    auto count = reinterpret_cast<int (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
    auto by_index = reinterpret_cast<int (*)(unsigned, Dev*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
    auto minor_of = reinterpret_cast<int (*)(Dev, unsigned*)>(sym("nvmlDeviceGetMinorNumber"));
    auto uuid_of = reinterpret_cast<int (*)(Dev, char*, unsigned)>(sym("nvmlDeviceGetUUID"));
    // MIG (R470 and later); without these symbols the GPUs alone are listed.
    auto max_migs = reinterpret_cast<int (*)(Dev, unsigned*)>(sym("nvmlDeviceGetMaxMigDeviceCount"));
    auto mig_at = reinterpret_cast<int (*)(Dev, unsigned, Dev*)>(sym("nvmlDeviceGetMigDeviceHandleByIndex"));
    auto gi_of = reinterpret_cast<int (*)(Dev, unsigned*)>(sym("nvmlDeviceGetGpuInstanceId"));
    auto ci_of = reinterpret_cast<int (*)(Dev, unsigned*)>(sym("nvmlDeviceGetComputeInstanceId"));
    bool have_mig = max_migs && mig_at && gi_of && ci_of;
    if (!init || !shutdown || !count || !by_index || !minor_of || !uuid_of) {
        ::dlclose(h);
        return make_error(lib + ": not an NVML library");
    }
    if (int rc = init(); rc != 0) {
        ::dlclose(h);
        return make_error(lib + ": nvmlInit failed (NVML error " + std::to_string(rc) + ")");
    }
    auto uuid_string = [&](Dev d) -> std::optional<std::string> {
        char uuid[96] = {};
        if (uuid_of(d, uuid, sizeof uuid) != 0) return std::nullopt;
        return std::string(uuid, ::strnlen(uuid, sizeof uuid));
    };
    NvmlDevices out;
    unsigned n = 0;
    if (count(&n) == 0) {
        for (unsigned i = 0; i < n; ++i) {
            Dev gpu = nullptr;
            unsigned minor = 0, slots = 0;
            if (by_index(i, &gpu) != 0 || minor_of(gpu, &minor) != 0) continue;
            if (auto uuid = uuid_string(gpu)) out.gpus.push_back({*uuid, minor});
            if (!have_mig || max_migs(gpu, &slots) != 0) continue;
            for (unsigned j = 0; j < slots; ++j) {
                Dev mig = nullptr;
                NvmlMig m;
                // Slots without a MIG device answer NVML_ERROR_NOT_FOUND: skipped.
                if (mig_at(gpu, j, &mig) != 0 || gi_of(mig, &m.gi) != 0 || ci_of(mig, &m.ci) != 0) continue;
                auto uuid = uuid_string(mig);
                if (!uuid) continue;
                m.uuid = *uuid;
                m.gpu_minor = minor;
                out.migs.push_back(m);
            }
        }
    }
    shutdown();
    ::dlclose(h);
    return out;
}

}  // namespace devices
}  // namespace gantry
