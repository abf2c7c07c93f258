// NVIDIA GPUs without nvidia-container-cli: which GPUs a container gets (the step's allocation or
// the NVIDIA_VISIBLE_DEVICES override), their device nodes, and the running driver's user-space
// files per NVIDIA_DRIVER_CAPABILITIES, found through the host's ld.so cache and matched to the
// driver version so that a stale library of an older driver is never mixed in.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>

#include "gantry/files.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

// Where the driver's programs are looked for on the host, in order: the system's directories, then
// /usr/local/nvidia/bin, where a driver installed in its own directory (the layout of GKE-style GPU
// images and of the NVIDIA driver containers) keeps them.
constexpr const char* kDriverBinaryDirs[] = {"/usr/bin", "/usr/sbin",      "/bin",
                                             "/sbin",    "/usr/local/bin", "/usr/local/nvidia/bin"};

// Whether `path` begins with the ELF magic (a program rather than a script). Reads 4 bytes of a
// host file under the admin's host_root (root in slurmstepd does this): O_NONBLOCK, so even a FIFO
// there cannot stall the step.
bool is_elf_file(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return false;
    char magic[4] = {};
    bool elf = ::read(fd, magic, sizeof magic) == 4 && std::memcmp(magic,
                                                                   "\x7f"
                                                                   "ELF",
                                                                   4) == 0;
    ::close(fd);
    return elf;
}

bool all_digits(const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "1:0": GPU 1's MIG device 0.
bool is_mig_index(const std::string& s) {
    auto colon = s.find(':');
    return colon != std::string::npos && all_digits(s.substr(0, colon)) && all_digits(s.substr(colon + 1));
}

bool is_cdi_name(const std::string& s) {
    auto eq = s.find('=');
    auto slash = s.find('/');
    return eq != std::string::npos && slash != std::string::npos && slash < eq;
}

Result<GpuRequest> parse_gpu_list(const std::string& name, const std::string& value) {
    GpuRequest r;
    r.source = name + "=" + value;
    std::string v = trim(value);
    if (v.empty() || v == "void" || v == "NoDevFiles") return r;  // NoDevFiles: old Slurm's "no GPU"
    if (v == "none") {
        r.kind = GpuRequest::Kind::driver_only;
        return r;
    }
    if (v == "all") {
        r.kind = GpuRequest::Kind::all;
        return r;
    }
    r.kind = GpuRequest::Kind::list;
    for (const auto& id : split_list(v, ',')) {
        if (is_cdi_name(id))
            r.cdi.push_back(id);
        else if (all_digits(id) || starts_with(id, "GPU-") || starts_with(id, "MIG-") || is_mig_index(id))
            r.ids.push_back(id);
        else
            return make_error(r.source + ": '" + id +
                              "' is not a GPU index, a GPU-UUID, a MIG device (<gpu>:<mig>, MIG-<uuid>) or a CDI "
                              "device name");
    }
    if (r.ids.empty()) r.kind = GpuRequest::Kind::nothing;  // only CDI names: the CDI path handles them
    return r;
}

// Library base names (before ".so") per capability. What each capability means follows NVIDIA's
// container runtime, so images written for it find the same files.
const std::map<std::string, std::vector<std::string>>& libraries_by_capability() {
    static const std::map<std::string, std::vector<std::string>> table = {
        {"utility", {"libnvidia-ml", "libnvidia-cfg"}},
        {"compute",
         {"libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader",
          "libnvidia-allocator", "libnvidia-compiler", "libnvidia-nvvm", "libnvidia-pkcs11",
          "libnvidia-pkcs11-openssl3", "libnvidia-gpucomp"}},
        {"video", {"libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"}},
        {"graphics",
         {"libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc", "libnvidia-ifr",
          "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia",
          "libnvidia-glvkspirv", "libnvidia-vulkan-producer"}},
        {"ngx", {"libnvidia-ngx"}},
    };
    return table;
}

const std::map<std::string, std::vector<std::string>>& binaries_by_capability() {
    static const std::map<std::string, std::vector<std::string>> table = {
        {"utility", {"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"}},
        {"compute", {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}},
    };
    return table;
}

std::vector<std::string> capability_names(const DriverCapabilities& c) {
    std::vector<std::string> out;
    if (c.utility) out.push_back("utility");
    if (c.compute) out.push_back("compute");
    if (c.video) out.push_back("video");
    if (c.graphics) out.push_back("graphics");
    if (c.ngx) out.push_back("ngx");
    return out;
}

std::string base_name(const std::string& path) {
    return path.substr(path.rfind('/') + 1);
}

// "libcuda.so.1" -> "libcuda"
std::string library_stem(const std::string& soname) {
    auto so = soname.find(".so");
    return so == std::string::npos ? soname : soname.substr(0, so);
}

// The job's own NVIDIA_VISIBLE_DEVICES within Slurm's allocation: `all` means the allocated GPUs, a list
// must name allocated ones only (by the allocation's own names), and none/void stay as they are. The
// job may narrow what Slurm gave it, never widen it: the devices cgroup is not the only fence.
Result<GpuRequest> within_allocation(GpuRequest asked, const GpuRequest& allocated) {
    switch (asked.kind) {
        case GpuRequest::Kind::nothing:
        case GpuRequest::Kind::driver_only:
            if (asked.cdi.empty()) return asked;
            break;
        case GpuRequest::Kind::all: {
            GpuRequest r = allocated;
            r.source = asked.source + ", within " + allocated.source;
            return r;
        }
        case GpuRequest::Kind::list:
            break;
    }
    if (!asked.cdi.empty())
        return make_error(asked.source + ": CDI device names cannot be checked against the step's allocation (" +
                          allocated.source + "); name the allocated GPUs by index instead");
    for (const auto& id : asked.ids)
        if (std::find(allocated.ids.begin(), allocated.ids.end(), id) == allocated.ids.end())
            return make_error(asked.source + ": GPU " + id + " is not allocated to this step (" + allocated.source +
                              "); name only allocated GPUs, or ask Slurm for more (--gpus)");
    asked.source += ", within " + allocated.source;
    return asked;
}

}  // namespace

Result<GpuRequest> gpu_request(const std::vector<std::string>& job_env, const std::vector<std::string>& image_env) {
    using devices::env_value;
    if (auto v = env_value(job_env, "NVIDIA_VISIBLE_DEVICES")) {
        auto asked = parse_gpu_list("NVIDIA_VISIBLE_DEVICES", *v);
        if (!asked) return asked;
        // Slurm's allocation, when the step has one, bounds what the job's own variable may ask for.
        for (const char* name : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"})
            if (auto a = env_value(job_env, name)) {
                auto allocated = parse_gpu_list(name, *a);
                if (!allocated) return allocated;
                return within_allocation(std::move(*asked), *allocated);
            }
        return asked;
    }
    // MIG devices scheduled as GRES: Slurm's SLURM_*_GPUS then hold its GRES indices, not GPU
    // indices, and CUDA_VISIBLE_DEVICES the MIG names: those say which devices.
    if (auto v = env_value(job_env, "CUDA_VISIBLE_DEVICES")) {
        auto ids = split_list(*v, ',');
        if (!ids.empty() &&
            std::all_of(ids.begin(), ids.end(), [](const std::string& id) { return starts_with(id, "MIG-"); }))
            return parse_gpu_list("CUDA_VISIBLE_DEVICES", *v);
    }
    for (const char* name : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"})
        if (auto v = env_value(job_env, name)) return parse_gpu_list(name, *v);
    if (auto v = env_value(image_env, "NVIDIA_VISIBLE_DEVICES")) {
        auto r = parse_gpu_list("NVIDIA_VISIBLE_DEVICES", *v);
        if (r) r->source += " (image)";
        return r;
    }
    return GpuRequest{};
}

Result<DriverCapabilities> parse_driver_capabilities(const std::string& text) {
    DriverCapabilities c;
    std::string t = trim(text);
    if (t.empty()) t = "utility,compute";
    for (const auto& cap : split_list(t, ',')) {
        if (cap == "all")
            c.compute = c.utility = c.video = c.graphics = c.display = c.compat32 = c.ngx = true;
        else if (cap == "compute")
            c.compute = true;
        else if (cap == "utility")
            c.utility = true;
        else if (cap == "video")
            c.video = true;
        else if (cap == "graphics")
            c.graphics = true;
        else if (cap == "display")
            c.display = true;
        else if (cap == "compat32")
            c.compat32 = true;
        else if (cap == "ngx")
            c.ngx = true;
        else
            return make_error("NVIDIA_DRIVER_CAPABILITIES: unknown capability '" + cap +
                              "' (valid: compute, utility, video, graphics, display, compat32, ngx, all)");
    }
    return c;
}

std::vector<HostGpu> host_gpus(const std::string& host_root) {
    using devices::host_path;
    std::vector<HostGpu> out;
    std::string procdir = host_path(host_root, "/proc/driver/nvidia/gpus");
    // Bus ids sort in PCI order, which is the order nvidia-smi numbers GPUs in.
    for (const auto& bus : devices::list_dir(procdir)) {
        auto info = try_read_file(procdir + "/" + bus + "/information");
        if (!info) continue;
        HostGpu g;
        g.bus_id = bus;
        bool have_minor = false;
        for (const auto& line : split_list(*info, '\n')) {
            auto colon = line.find(':');
            if (colon == std::string::npos) continue;
            std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
            if (key == "Minor Number" && all_digits(value)) {
                g.minor = static_cast<unsigned>(std::stoul(value));
                have_minor = true;
            } else if (key == "GPU UUID") {
                g.uuid = value;
            }
        }
        if (!have_minor) continue;
        g.index = static_cast<unsigned>(out.size());
        out.push_back(g);
    }
    if (!out.empty()) return out;
    std::vector<unsigned> minors;
    for (const auto& n : devices::list_dir(host_path(host_root, "/dev"))) {
        if (!starts_with(n, "nvidia") || !all_digits(n.substr(6))) continue;
        if (devices::is_char_device(host_path(host_root, "/dev/" + n)))
            minors.push_back(static_cast<unsigned>(std::stoul(n.substr(6))));
    }
    std::sort(minors.begin(), minors.end());
    for (unsigned m : minors) out.push_back(HostGpu{static_cast<unsigned>(out.size()), m, "", ""});
    return out;
}

std::string driver_version(const std::string& host_root) {
    if (auto text = try_read_file(devices::host_path(host_root, "/proc/driver/nvidia/version"))) {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..." or, for the open
        // modules, "... Open Kernel Module for x86_64  550.54.15  Release Build ...".
        auto at = text->find("Kernel Module");
        std::string rest = at == std::string::npos ? *text : text->substr(at);
        for (const auto& word : split_list(rest.substr(0, rest.find('\n')), ' ')) {
            if (!word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) &&
                word.find('.') != std::string::npos && word.find_first_not_of("0123456789.") == std::string::npos)
                return word;
        }
    }
    auto cache = try_read_file(devices::host_path(host_root, "/etc/ld.so.cache"));
    if (!cache) return {};
    auto entries = parse_ld_cache(*cache);
    if (!entries) return {};
    for (const auto& e : *entries) {
        if (e.soname != "libcuda.so.1" || !e.is_64bit()) continue;
        auto real = devices::resolve_in_host(host_root, e.path);
        if (!real) continue;
        std::string name = base_name(*real);
        if (starts_with(name, "libcuda.so.") && name.size() > 11 && name.substr(11) != "1") return name.substr(11);
    }
    return {};
}

namespace {

// The GPU whose UUID is `uuid` ("GPU-..."): procfs names it where the driver shows it there; where
// procfs does not match (one H200 machine with the 580 open kernel modules refused its own UUID
// that way, cause not captured; its successors showed the UUID in procfs), the host's NVML, which
// always knows it, maps the UUID to the GPU's minor number.
std::optional<HostGpu> gpu_by_uuid(const std::string& root, const std::vector<HostGpu>& gpus, const std::string& uuid) {
    for (const auto& g : gpus)
        if (g.uuid == uuid) return g;
    auto nvml = devices::nvml_devices(root);
    if (!nvml) return std::nullopt;
    for (const auto& n : nvml->gpus) {
        if (n.uuid != uuid) continue;
        for (const auto& g : gpus)
            if (g.minor == n.minor) return g;
    }
    return std::nullopt;
}

// One MIG name of a request -> the device. "<gpu>:<mig>" and "MIG-GPU-<uuid>/<gi>/<ci>" (the names of
// R450-R465 drivers) come from procfs alone; "MIG-<uuid>" needs NVML.
Result<MigDevice> resolve_mig(const std::string& root, const std::string& source, const std::string& id,
                              const std::vector<HostGpu>& gpus, const std::vector<MigDevice>& migs) {
    auto missing = [&]() {
        std::string have;
        for (const auto& m : migs)
            have += (have.empty() ? "" : ", ") + std::to_string(m.gpu) + ":" + std::to_string(m.index);
        return make_error(source + ": no MIG device '" + id +
                          "' on this node (MIG devices: " + (have.empty() ? "none" : have) + ")");
    };
    auto at = [&](unsigned minor, unsigned gi, unsigned ci) -> Result<MigDevice> {
        for (const auto& m : migs)
            if (m.gpu_minor == minor && m.gi == gi && m.ci == ci) return m;
        return missing();
    };
    if (is_mig_index(id)) {
        auto colon = id.find(':');
        std::string gpu = id.substr(0, colon), index = id.substr(colon + 1);
        for (const auto& m : migs)
            if (std::to_string(m.gpu) == gpu && std::to_string(m.index) == index) return m;
        return missing();
    }
    if (starts_with(id, "MIG-GPU-")) {
        auto parts = split_list(id.substr(4), '/');
        if (parts.size() != 3 || !all_digits(parts[1]) || !all_digits(parts[2]) || parts[1].size() > 6 ||
            parts[2].size() > 6)
            return make_error(source + ": '" + id + "' is not MIG-GPU-<uuid>/<gi>/<ci>");
        if (auto g = gpu_by_uuid(root, gpus, parts[0]))
            return at(g->minor, static_cast<unsigned>(std::stoul(parts[1])),
                      static_cast<unsigned>(std::stoul(parts[2])));
        return missing();
    }
    auto nvml = devices::nvml_devices(root);
    if (!nvml)
        return make_error(source + ": cannot resolve " + id + ": " + nvml.error().message +
                          " (name MIG devices as <gpu>:<mig> instead)");
    for (const auto& n : nvml->migs)
        if (n.uuid == id) return at(n.gpu_minor, n.gi, n.ci);
    return missing();
}

}  // namespace

namespace devices {

Result<ContainerEdits> nvidia_edits(const Config& config, const std::vector<std::string>& job_env,
                                    const ImageConfig& image) {
    ContainerEdits edits;
    auto request = gpu_request(job_env, image.env);
    if (!request) return request.error();
    if (request->kind == GpuRequest::Kind::nothing) return edits;
    const std::string& root = config.host_root;
    bool from_image = ends_with(request->source, "(image)");

    auto gpus = host_gpus(root);
    bool have_ctl = is_char_device(host_path(root, "/dev/nvidiactl"));
    if (gpus.empty() && !have_ctl) {
        // A CUDA image on a CPU node is normal (preprocessing); an explicit request is worth a word.
        if (!from_image && request->kind == GpuRequest::Kind::list)
            edits.warnings.push_back(request->source + ": no NVIDIA GPU on this node; the container gets none");
        return edits;
    }

    // Which GPUs and MIG devices, with the names they are given inside (host indices, "<gpu>:<mig>").
    std::vector<HostGpu> chosen;
    std::vector<MigDevice> chosen_migs;
    std::vector<std::string> visible_names;
    if (request->kind == GpuRequest::Kind::all) {
        chosen = gpus;
        for (const auto& g : gpus) visible_names.push_back(std::to_string(g.index));
    }
    std::optional<std::vector<MigDevice>> migs;  // read on the first MIG name
    if (request->kind == GpuRequest::Kind::list) {
        for (const auto& id : request->ids) {
            if (all_digits(id) || starts_with(id, "GPU-")) {
                std::optional<HostGpu> gpu;
                if (all_digits(id)) {
                    for (const auto& g : gpus)
                        if (std::to_string(g.index) == id) gpu = g;
                } else {
                    gpu = gpu_by_uuid(root, gpus, id);
                }
                if (!gpu) {
                    std::string have;
                    for (const auto& g : gpus) have += (have.empty() ? "" : ", ") + std::to_string(g.index);
                    return make_error(request->source + ": no GPU '" + id +
                                      "' on this node (GPUs: " + (have.empty() ? "none" : have) + ")");
                }
                if (std::none_of(chosen.begin(), chosen.end(),
                                 [&](const HostGpu& g) { return g.index == gpu->index; })) {
                    chosen.push_back(*gpu);
                    visible_names.push_back(std::to_string(gpu->index));
                }
                continue;
            }
            if (!migs) migs = host_mig_devices(root, gpus);
            auto mig = resolve_mig(root, request->source, id, gpus, *migs);
            if (!mig) return mig.error();
            if (std::none_of(chosen_migs.begin(), chosen_migs.end(), [&](const MigDevice& m) {
                    return m.gpu_minor == mig->gpu_minor && m.gi == mig->gi && m.ci == mig->ci;
                })) {
                chosen_migs.push_back(*mig);
                visible_names.push_back(std::to_string(mig->gpu) + ":" + std::to_string(mig->index));
            }
        }
    }

    std::string caps_text = env_value(job_env, "NVIDIA_DRIVER_CAPABILITIES")
                                .value_or(env_value(image.env, "NVIDIA_DRIVER_CAPABILITIES").value_or(""));
    auto caps = parse_driver_capabilities(caps_text);
    if (!caps) return caps.error();

    // Device nodes: the control devices, then the chosen GPUs only.
    for (const char* node : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"})
        if (is_char_device(host_path(root, node))) edits.devices.push_back({host_path(root, node), node});
    // nvidia-caps: a MIG capability (an instance's GI/CI access, MIG config, MIG monitor) only when
    // selected or asked for; the others (the driver's non-MIG capabilities) as they are.
    if (!migs) migs = host_mig_devices(root, gpus);
    auto capinfo = mig_cap_minors(root, *migs);
    std::set<unsigned> wanted_caps;
    for (const auto& m : chosen_migs) wanted_caps.insert({m.gi_minor, m.ci_minor});
    for (auto [var, minor] : {std::pair{"NVIDIA_MIG_CONFIG_DEVICES", capinfo.config},
                              std::pair{"NVIDIA_MIG_MONITOR_DEVICES", capinfo.monitor}}) {
        std::string v = trim(env_value(job_env, var).value_or(env_value(image.env, var).value_or("")));
        if (v.empty() || v == "none" || v == "void") continue;
        if (v != "all") return make_error(std::string(var) + "=" + v + ": only 'all' is supported");
        if (!minor) return make_error(std::string(var) + "=all: the driver lists no such MIG capability");
        wanted_caps.insert(*minor);
    }
    for (const auto& cap : list_dir(host_path(root, "/dev/nvidia-caps"))) {
        std::string p = "/dev/nvidia-caps/" + cap;
        auto minor = starts_with(cap, "nvidia-cap") && all_digits(cap.substr(10))
                         ? std::optional<unsigned>(static_cast<unsigned>(std::stoul(cap.substr(10))))
                         : std::nullopt;
        if (minor && capinfo.mig.count(*minor) && !wanted_caps.count(*minor)) continue;
        if (minor) wanted_caps.erase(*minor);
        if (is_char_device(host_path(root, p))) edits.devices.push_back({host_path(root, p), p});
    }
    for (const auto& m : chosen_migs) {
        for (unsigned minor : {m.gi_minor, m.ci_minor}) {
            if (!wanted_caps.count(minor)) continue;  // found above
            return make_error(request->source + ": MIG device " + std::to_string(m.gpu) + ":" +
                              std::to_string(m.index) + " needs /dev/nvidia-caps/nvidia-cap" + std::to_string(minor) +
                              ", which the node lacks (nvidia-modprobe -f /proc/driver/nvidia/capabilities/gpu" +
                              std::to_string(m.gpu_minor) + "/mig/gi" + std::to_string(m.gi) + "/... creates it)");
        }
    }
    // The node of each minor must be the nvidia-caps device itself (its major is dynamic).
    if (capinfo.major) {
        for (const auto& d : edits.devices) {
            if (!starts_with(d.path, "/dev/nvidia-caps/")) continue;
            struct stat st {};
            if (::stat(d.host_path.c_str(), &st) == 0 && major(st.st_rdev) != *capinfo.major)
                return make_error(d.host_path + ": major " + std::to_string(major(st.st_rdev)) +
                                  " is not nvidia-caps' " + std::to_string(*capinfo.major) + " (/proc/devices)");
        }
    }
    std::set<unsigned> gpu_minors;
    for (const auto& g : chosen) gpu_minors.insert(g.minor);
    for (const auto& m : chosen_migs) gpu_minors.insert(m.gpu_minor);  // a MIG device works through its parent
    for (unsigned minor : gpu_minors) {
        std::string p = "/dev/nvidia" + std::to_string(minor);
        if (is_char_device(host_path(root, p))) edits.devices.push_back({host_path(root, p), p});
    }

    // Driver libraries from the host's ld.so cache, the running driver's version only.
    std::string version = driver_version(root);
    std::set<std::string> wanted;
    for (const auto& cap : capability_names(*caps))
        for (const auto& lib : libraries_by_capability().at(cap)) wanted.insert(lib);
    size_t libraries = 0;
    auto cache_text = try_read_file(host_path(root, "/etc/ld.so.cache"));
    if (!cache_text) {
        edits.warnings.push_back("no ld.so cache at " + host_path(root, "/etc/ld.so.cache") +
                                 ": NVIDIA driver libraries not added");
    } else {
        auto entries = parse_ld_cache(*cache_text);
        if (!entries) return entries.error().wrap("reading " + host_path(root, "/etc/ld.so.cache"));
        std::set<std::string> done;  // "64:libcuda.so.1": the first cache entry wins, as for ld.so
        bool added32 = false;
        for (const auto& e : *entries) {
            if (!wanted.count(library_stem(e.soname))) continue;
            bool is64 = e.is_64bit();
            if (!is64 && !caps->compat32) continue;
            if (!done.insert((is64 ? "64:" : "32:") + e.soname).second) continue;
            auto real = resolve_in_host(root, e.path);
            if (!real) continue;
            std::string file = base_name(*real);
            if (!version.empty() && !ends_with(file, ".so." + version)) {
                edits.warnings.push_back("skipping " + e.path + " (" + file + "): not of the running driver " +
                                         version);
                continue;
            }
            std::string dir = is64 ? kDriverLibDir : kDriverLib32Dir;
            edits.mounts.push_back({host_path(root, *real), dir + "/" + file, true});
            if (e.soname != file) edits.symlinks.push_back({dir + "/" + e.soname, file});
            // The development name (libcuda.so) too: JIT toolchains such as Triton link with -lcuda.
            std::string dev = library_stem(e.soname) + ".so";
            if (dev != e.soname && dev != file) edits.symlinks.push_back({dir + "/" + dev, e.soname});
            added32 = added32 || !is64;
            ++libraries;
        }
        if (libraries > 0) edits.ld_library_dirs.push_back(kDriverLibDir);
        if (added32) edits.ld_library_dirs.push_back(kDriverLib32Dir);
    }

    // Binaries per capability, where images expect them.
    size_t binaries = 0;
    for (const auto& cap : capability_names(*caps)) {
        auto it = binaries_by_capability().find(cap);
        if (it == binaries_by_capability().end()) continue;
        for (const auto& bin : it->second) {
            // The first program (ELF) of that name, else the first file: a host's /usr/bin/nvidia-smi
            // may be a wrapper script that runs the driver's own copy by a host path (a machine with
            // the driver in /usr/local/nvidia had `exec /usr/local/nvidia/bin/nvidia-smi` there), which
            // means nothing inside the container.
            std::optional<std::string> chosen_file;
            for (const char* dir : kDriverBinaryDirs) {
                auto real = resolve_in_host(root, std::string(dir) + "/" + bin);
                if (!real) continue;
                if (is_elf_file(host_path(root, *real))) {
                    chosen_file = real;
                    break;
                }
                if (!chosen_file) chosen_file = real;
            }
            if (!chosen_file) continue;
            edits.mounts.push_back({host_path(root, *chosen_file), "/usr/bin/" + bin, true});
            ++binaries;
        }
    }

    // GSP firmware of this driver (the driver loads it; tools inside look for it).
    if (!version.empty()) {
        if (auto fw = resolve_in_host(root, "/lib/firmware/nvidia/" + version))
            edits.mounts.push_back({host_path(root, *fw), "/usr/lib/firmware/nvidia/" + version, true});
    }
    // Daemons the driver libraries talk to, when they run.
    for (const char* sock : {"/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket",
                             "/run/nvidia-fabricmanager/fm_sm_ipc.socket"}) {
        std::string p = std::string(sock);
        if (auto real = resolve_in_host(root, p)) edits.mounts.push_back({host_path(root, *real), p, false});
    }

    // What the container's CUDA sees: the chosen GPUs renumbered from 0, since only their device nodes
    // exist inside (a host index such as 2 would name no device there).
    std::string visible, renumbered;
    for (size_t i = 0; i < visible_names.size(); ++i) {
        visible += (i ? "," : "") + visible_names[i];
        renumbered += (i ? "," : "") + std::to_string(i);
    }
    if (request->kind == GpuRequest::Kind::driver_only) {
        edits.env.push_back("NVIDIA_VISIBLE_DEVICES=none");
    } else {
        edits.env.push_back("NVIDIA_VISIBLE_DEVICES=" + (visible.empty() ? std::string("void") : visible));
        if (request->kind == GpuRequest::Kind::list) edits.env.push_back("CUDA_VISIBLE_DEVICES=" + renumbered);
    }
    if (!caps_text.empty()) edits.env.push_back("NVIDIA_DRIVER_CAPABILITIES=" + trim(caps_text));
    edits.summary = "gpus " + (visible.empty() ? std::string("none") : visible) + " (driver " +
                    (version.empty() ? std::string("unknown") : version) + ", " + std::to_string(libraries) +
                    " libraries, " + std::to_string(binaries) + " binaries)";
    return edits;
}

}  // namespace devices
}  // namespace gantry
