// Private to the devices module: reading host facts under Config::host_root and small helpers the
// selection files (gpu.cpp, rdma.cpp, cdi.cpp, select.cpp) share.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gantry/devices.hpp"

namespace gantry::devices {

// Resolves `path` (absolute, as seen on the host) inside host_root: symlinks are followed as if
// host_root were "/" and never leave it. Returns the resolved path *without* the prefix, or nothing
// when it does not exist.
std::optional<std::string> resolve_in_host(const std::string& host_root, const std::string& path);

// Names in a directory (no "." and ".."), sorted; empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& path);

// Whether `path` is a character device.
bool is_char_device(const std::string& path);

// Value of NAME in "NAME=value" entries (last wins).
std::optional<std::string> env_value(const std::vector<std::string>& env, const std::string& name);

// What the driver says about its nvidia-caps devices (mig.cpp): the minors that belong to MIG
// (/proc/driver/nvidia-caps/mig-minors, plus the instance access files found), the MIG config and
// monitor capabilities' minors, and the dynamic major of `nvidia-caps` in /proc/devices.
struct MigCapMinors {
    std::set<unsigned> mig;
    std::optional<unsigned> config, monitor;
    std::optional<unsigned> major;
};
MigCapMinors mig_cap_minors(const std::string& host_root, const std::vector<MigDevice>& migs);

// GPUs and MIG devices as NVML names them (mig.cpp): their UUIDs and where they live. Read through
// the host's libnvidia-ml.so.1, the only place MIG UUIDs exist and the one that knows a GPU's UUID
// where the driver's procfs shows none; fails when the library cannot be loaded.
struct NvmlGpu {
    std::string uuid;  // "GPU-..."
    unsigned minor = 0;
};
struct NvmlMig {
    std::string uuid;  // "MIG-..."
    unsigned gpu_minor = 0, gi = 0, ci = 0;
};
struct NvmlDevices {
    std::vector<NvmlGpu> gpus;
    std::vector<NvmlMig> migs;  // empty before R470 (no MIG in that NVML)
};
Result<NvmlDevices> nvml_devices(const std::string& host_root);

// The NVIDIA part of select_devices (gpu.cpp).
Result<ContainerEdits> nvidia_edits(const Config& config, const std::vector<std::string>& job_env,
                                    const ImageConfig& image);
// The EFA/RDMA part (rdma.cpp).
ContainerEdits rdma_edits(const Config& config, const std::vector<std::string>& job_env);
// The CDI part (cdi.cpp): devices named in GANTRY_CDI_DEVICES or as vendor/class=name in
// NVIDIA_VISIBLE_DEVICES.
Result<ContainerEdits> cdi_edits(const Config& config, const std::vector<std::string>& requested);
// Its two steps over one spec file's text (`yaml`: .yaml/.yml, else JSON), shared with the fuzzer:
// the text as a JSON value, then the fields every later use relies on, checked once so that a broken
// spec is reported by file and field instead of being half applied.
Result<nlohmann::json> parse_cdi_spec(const std::string& file, const std::string& text, bool yaml);
Result<void> check_cdi_spec(const std::string& file, const nlohmann::json& doc);

}  // namespace gantry::devices
