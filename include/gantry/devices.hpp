// Devices and wiring inside the container (issue 7): which host devices, driver files and
// environment a container gets for NVIDIA GPUs, CDI devices, AWS EFA, PMIx/PMI2 and PyTorch.
//
// The module only *decides*: it reads host facts under Config::host_root (device nodes, sysfs
// links, the ld.so cache, driver version, CDI specs) and the job's environment, and returns a
// ContainerEdits value. The launcher applies it (device nodes bound into /dev, read-only bind mounts,
// symlinks and an ld.so.conf.d entry written into the overlay's upper layer, the image's ldconfig run
// inside). Keeping the two apart lets the selection logic be unit-tested without namespaces and lets
// the SPANK plugin decide once per step, as root, before the container exists.
//
// See docs/devices.md for the rules and the gantry.conf switches (gpu, efa, efa_host_libs, pmix,
// pytorch, host_root).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/image_config.hpp"
#include "gantry/result.hpp"

namespace gantry {

// A character device the container gets: host node `host_path` (already prefixed with host_root)
// bound at `path` (absolute, under /dev).
struct DeviceNode {
    std::string host_path;
    std::string path;
    bool operator==(const DeviceNode&) const = default;
};

// A host file or directory bound into the container.
struct DeviceMount {
    std::string host_path;  // prefixed with host_root
    std::string path;       // inside the container
    bool read_only = true;
    // A path the job's environment names (PMIX_SERVER_TMPDIR, SLURM_CONF, a %n expanded from
    // SLURMD_NODENAME): bound only if the job user reaches it, which the holder finds out as that user;
    // skipped otherwise, whatever the reason, so that "missing" and "not yours" look alike and root
    // never looks at the path itself (issue #34).
    bool if_reachable = false;
    bool operator==(const DeviceMount&) const = default;
};

// A symlink created in the container (in the overlay's upper layer): path -> target.
struct DeviceSymlink {
    std::string path;
    std::string target;
    bool operator==(const DeviceSymlink&) const = default;
};

// A directory of /sys replaced by a view that lists only some of its entries (each a symlink with
// the same target as on the host), so that sysfs agrees with the device nodes that were passed.
struct SysfsView {
    std::string path;                                        // e.g. /sys/class/infiniband_verbs
    std::vector<DeviceSymlink> entries;                      // name (relative) -> host link target
    std::vector<std::pair<std::string, std::string>> files;  // plain files kept: name -> content
    bool operator==(const SysfsView&) const = default;
};

// Everything the devices module wants done to one container.
struct ContainerEdits {
    std::vector<DeviceNode> devices;
    std::vector<DeviceMount> mounts;
    std::vector<DeviceSymlink> symlinks;
    std::vector<SysfsView> sysfs_views;
    std::vector<std::string> env;              // "NAME=value", applied over the image's Env
    std::vector<std::string> ld_library_dirs;  // container dirs listed in /etc/ld.so.conf.d/ + ldconfig
    std::vector<std::string> warnings;         // one line each, for the user (memlock, stale libraries)
    std::string summary;                       // "gpus 0,2 (driver 550.54.15), efa uverbs0,uverbs1"

    [[nodiscard]] bool empty() const {
        return devices.empty() && mounts.empty() && symlinks.empty() && sysfs_views.empty() && env.empty() &&
               ld_library_dirs.empty();
    }
    // Appends `other` (later entries for the same container path replace earlier ones when applied).
    void merge(const ContainerEdits& other);
};

// ---- Selection: the plugin's prepare_step (slurmstepd, root) and `gantry run` call this ----------

// Everything for one container: GPUs (built-in NVIDIA discovery), CDI devices, EFA/RDMA devices and
// host libraries, the PMIx server directory. `job_env` is the job's environment ("NAME=value"),
// `image` the image config (its Env may set NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES
// defaults, as CUDA images do). Fails only on malformed requests (an unknown GPU index or UUID, a
// CDI device that no spec defines); absent hardware is no error.
Result<ContainerEdits> select_devices(const Config& config, const std::vector<std::string>& job_env,
                                      const ImageConfig& image);

// ---- Per-task environment: the plugin's join_step and `gantry run` merge this --------------------

// The variables a task gets on top of container_environment(): the PMIx MCA mapping
// (PMIX_PTL_MODULE -> PMIX_MCA_ptl, PMIX_SECURITY_MODE -> PMIX_MCA_psec, PMIX_GDS_MODULE ->
// PMIX_MCA_gds) and, when the image declares PyTorch (PYTORCH_VERSION in its Env) or
// GANTRY_PYTORCH=1 asks, MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK/LOCAL_WORLD_SIZE/NODE_RANK
// from SLURM_* (they replace what the image sets: one launcher decides the rendezvous). "NAME=value".
std::vector<std::string> task_environment(const Config& config, const std::vector<std::string>& image_env,
                                          const std::vector<std::string>& task_env);

// ---- Building blocks, public for the unit tests and `gantry doctor` -----------------------------

// Which GPUs. `nothing`: no GPU wiring at all (NVIDIA_VISIBLE_DEVICES unset, empty or `void`);
// `driver_only`: `none`, the driver files and control devices but no GPU; `all`; `list`: indices
// ("0", "2"), UUIDs ("GPU-...") and MIG devices ("1:0" = GPU 1's MIG device 0, "MIG-<uuid>",
// "MIG-GPU-<uuid>/<gi>/<ci>") in request order.
struct GpuRequest {
    enum class Kind { nothing, driver_only, all, list } kind = Kind::nothing;
    std::vector<std::string> ids;
    std::vector<std::string> cdi;  // fully qualified CDI names (vendor/class=name) in NVIDIA_VISIBLE_DEVICES
    std::string source;            // which variable decided, for messages: "NVIDIA_VISIBLE_DEVICES=0,2"
};
// Precedence, first that is set: NVIDIA_VISIBLE_DEVICES in the job environment (the user's explicit
// choice, bounded by SLURM_STEP_GPUS or else SLURM_JOB_GPUS when set: `all` means the allocated GPUs,
// a list naming any other GPU or a CDI device is an error), CUDA_VISIBLE_DEVICES when it lists only MIG UUIDs (Slurm's
// MIG GRES), SLURM_STEP_GPUS, SLURM_JOB_GPUS (the allocation), CUDA_VISIBLE_DEVICES in the job environment,
// NVIDIA_VISIBLE_DEVICES in the image's Env (CUDA images say `all`).
Result<GpuRequest> gpu_request(const std::vector<std::string>& job_env, const std::vector<std::string>& image_env);

// NVIDIA_DRIVER_CAPABILITIES: compute, utility, video, graphics, display, compat32, ngx, all.
// Unset or empty: "utility,compute" (what the NVIDIA runtime defaults to).
struct DriverCapabilities {
    bool compute = false, utility = false, video = false, graphics = false, display = false, compat32 = false,
         ngx = false;
};
Result<DriverCapabilities> parse_driver_capabilities(const std::string& text);

// One GPU on the host, from the host root: /dev/nvidiaN, and its UUID where the driver's procfs says.
struct HostGpu {
    unsigned index = 0;  // nvidia-smi's index: position in PCI bus order
    unsigned minor = 0;  // /dev/nvidia<minor>
    std::string uuid;    // "GPU-..." or empty
    std::string bus_id;  // "0000:18:00.0" or empty
};
// GPUs under host_root: /proc/driver/nvidia/gpus/<bus>/information (Minor, GPU UUID), else the
// /dev/nvidia[0-9]+ nodes.
std::vector<HostGpu> host_gpus(const std::string& host_root);

// One MIG device (a compute instance inside a GPU instance), from the driver's capability procfs:
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access and .../gi<G>/ci<C>/access, each
// holding "DeviceFileMinor: <n>", the minor of /dev/nvidia-caps/nvidia-cap<n> that grants it.
struct MigDevice {
    unsigned gpu = 0;        // parent GPU's index
    unsigned gpu_minor = 0;  // parent's /dev/nvidia<minor>
    unsigned index = 0;      // among the parent's MIG devices, in (GI, CI) order: the "<gpu>:<index>" name
    unsigned gi = 0, ci = 0;
    unsigned gi_minor = 0, ci_minor = 0;  // nvidia-caps minors of the GI and CI access capabilities
};
std::vector<MigDevice> host_mig_devices(const std::string& host_root, const std::vector<HostGpu>& gpus);

// The running driver's version: /proc/driver/nvidia/version under host_root, else the suffix of
// libcuda.so.VERSION in the ld.so cache. Empty when neither says.
std::string driver_version(const std::string& host_root);

// One entry of an ld.so cache: "libcuda.so.1" -> "/usr/lib/x86_64-linux-gnu/libcuda.so.1".
struct LdCacheEntry {
    std::string soname;
    std::string path;
    uint32_t flags = 0;  // glibc's FLAG_* bits: type (libc6 = 3) | architecture (x86-64 = 0x300, ...)
    [[nodiscard]] bool is_64bit() const;
};
// Parses a glibc ld.so cache file (the "glibc-ld.so.cache1.1" format, alone or after the old one).
Result<std::vector<LdCacheEntry>> parse_ld_cache(const std::string& bytes);

// AWS EFA and other RDMA devices under host_root: /sys/class/infiniband_verbs/uverbsN and the name
// of the driver behind each (basename of device/driver: "efa", "mlx5_core", ...).
struct RdmaDevice {
    std::string uverbs;   // "uverbs0"
    std::string ib_name;  // "rdmap16s27" (its /sys/class/infiniband entry), may be empty
    std::string driver;
    std::string sysfs_link;  // target of /sys/class/infiniband_verbs/uverbsN on the host
    std::string ib_link;     // target of /sys/class/infiniband/<ib_name>
};
std::vector<RdmaDevice> rdma_devices(const std::string& host_root);

// Which RDMA devices go in: every `efa` one (when `efa`), and mlx ones only as MELLANOX_VISIBLE_DEVICES
// asks (all, none, indices into the mlx list, or uverbs/ib names).
std::vector<RdmaDevice> select_rdma(const std::vector<RdmaDevice>& all, bool efa,
                                    const std::optional<std::string>& mellanox_visible);

// Slurm hostlist expression -> host names: "gnode[1-3,7]" -> gnode1 gnode2 gnode3 gnode7,
// "a[01-02]-b[1-2],c" -> a01-b1 a01-b2 a02-b1 a02-b2 c. Zero padding is kept.
Result<std::vector<std::string>> expand_hostlist(const std::string& expr);

// Tasks on node `node_index` from SLURM_STEP_TASKS_PER_NODE ("4(x2),3" -> node 0: 4, 2: 3).
std::optional<unsigned> tasks_on_node(const std::string& tasks_per_node, unsigned node_index);

// The rendezvous port every rank of a job agrees on without talking: 61000 + jobid % 4536, i.e. in
// 61000..65535, above Linux's default ephemeral range (32768..60999) so it never collides with a
// port the kernel handed to an outgoing connection.
unsigned master_port(unsigned long jobid);

// Where the built-in NVIDIA discovery puts the driver libraries inside the container (listed in
// /etc/ld.so.conf.d/000-gantry.conf); the conventional path CUDA images already know.
inline constexpr const char* kDriverLibDir = "/usr/local/nvidia/lib64";
inline constexpr const char* kDriverLib32Dir = "/usr/local/nvidia/lib";

namespace devices {
// host_root + path, for an absolute `path`: ("/", "/dev/x") -> "/dev/x"; ("/fake/", "/dev/x") -> "/fake/dev/x".
std::string host_path(const std::string& host_root, const std::string& path);
}  // namespace devices

}  // namespace gantry
