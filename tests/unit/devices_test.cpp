// Unit tests for the devices module: GPU requests (indices, UUIDs, all/none/void, precedence),
// driver capabilities, the ld.so cache parser, driver version and GPU discovery from a host root,
// EFA/mlx filtering by sysfs driver links, CDI specs (JSON and YAML), MIG devices (procfs, NVML
// of the fake driver), hostlist expansion, PMIx mapping and the PyTorch variables. Host roots are
// built in a temporary directory (device nodes only when root).
#include "gantry/devices.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace gantry;
namespace fs = std::filesystem;

namespace {

// A temporary host root, removed at the end of the test.
struct TempRoot {
    std::string path;
    TempRoot() {
        char tmpl[] = "/tmp/gantry-devices-test.XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempRoot() { fs::remove_all(path); }
    void write(const std::string& rel, const std::string& text) const {
        fs::create_directories(fs::path(path + rel).parent_path());
        std::ofstream(path + rel) << text;
    }
    void link(const std::string& rel, const std::string& target) const {
        fs::create_directories(fs::path(path + rel).parent_path());
        fs::create_symlink(target, path + rel);
    }
    bool mknod_char(const std::string& rel, unsigned major, unsigned minor) const {
        fs::create_directories(fs::path(path + rel).parent_path());
        return ::mknod((path + rel).c_str(), S_IFCHR | 0666, makedev(major, minor)) == 0;
    }
};

// A Config whose host_root is tests/harness/fakehw.sh's fake host below r. Needs root (device nodes):
// without it the test fails by name ([root] tests run apart, `ctest -L root`), never passes quietly.
std::optional<Config> make_fake_hardware(const TempRoot& r) {
    if (::geteuid() != 0) FAIL("needs root: fakehw.sh makes device nodes (mknod); run `ctest -L root` as root");
    Config c;
    c.host_root = r.path + "/hw";
    REQUIRE(std::system(
                (std::string(GANTRY_SOURCE_DIR) + "/tests/harness/fakehw.sh " + c.host_root + " >/dev/null").c_str()) ==
            0);
    return c;
}

Config config_for(const TempRoot& r) {
    Config c;
    c.host_root = r.path;
    return c;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

// A cache in glibc's new format with the given (flags, soname, path) entries.
std::string make_cache(const std::vector<std::tuple<uint32_t, std::string, std::string>>& libs) {
    std::string header = "glibc-ld.so.cache1.1";
    header.resize(48, '\0');
    uint32_t n = static_cast<uint32_t>(libs.size());
    std::memcpy(&header[20], &n, 4);
    std::string entries, strings;
    size_t strings_at = 48 + libs.size() * 24;
    for (const auto& [flags, soname, path] : libs) {
        uint32_t key = static_cast<uint32_t>(strings_at + strings.size());
        strings += soname + '\0';
        uint32_t value = static_cast<uint32_t>(strings_at + strings.size());
        strings += path + '\0';
        std::string e(24, '\0');
        std::memcpy(&e[0], &flags, 4);
        std::memcpy(&e[4], &key, 4);
        std::memcpy(&e[8], &value, 4);
        entries += e;
    }
    return header + entries + strings;
}

}  // namespace

TEST_CASE("GPU request: precedence of the variables") {
    auto r = gpu_request({}, {});
    REQUIRE(r.ok());
    CHECK(r->kind == GpuRequest::Kind::nothing);

    r = gpu_request({"CUDA_VISIBLE_DEVICES=1,3"}, {"NVIDIA_VISIBLE_DEVICES=all"});
    REQUIRE(r.ok());
    CHECK(r->kind == GpuRequest::Kind::list);
    CHECK(r->ids == std::vector<std::string>{"1", "3"});
    CHECK(r->source == "CUDA_VISIBLE_DEVICES=1,3");

    // Slurm's allocation beats CUDA_VISIBLE_DEVICES; the user's NVIDIA_VISIBLE_DEVICES beats both,
    // within the allocation only (issue #34): it may narrow, never widen.
    r = gpu_request({"CUDA_VISIBLE_DEVICES=0", "SLURM_STEP_GPUS=2,3"}, {});
    CHECK(r->ids == std::vector<std::string>{"2", "3"});
    r = gpu_request({"SLURM_JOB_GPUS=5", "SLURM_STEP_GPUS=2"}, {});
    CHECK(r->ids == std::vector<std::string>{"2"});
    r = gpu_request({"SLURM_STEP_GPUS=2,3", "NVIDIA_VISIBLE_DEVICES=3"}, {});
    REQUIRE(r.ok());
    CHECK(r->ids == std::vector<std::string>{"3"});
    // Without an allocation (gantry run, a node without GPU GRES) the job's variable decides alone.
    r = gpu_request({"NVIDIA_VISIBLE_DEVICES=GPU-aaaa,0"}, {});
    CHECK(r->ids == std::vector<std::string>{"GPU-aaaa", "0"});
}

TEST_CASE("GPU request: the job's NVIDIA_VISIBLE_DEVICES never widens Slurm's allocation") {
    auto all = gpu_request({"SLURM_STEP_GPUS=1", "NVIDIA_VISIBLE_DEVICES=all"}, {});
    REQUIRE(all.ok());
    CHECK(all->kind == GpuRequest::Kind::list);
    CHECK(all->ids == std::vector<std::string>{"1"});
    CHECK(all->source == "NVIDIA_VISIBLE_DEVICES=all, within SLURM_STEP_GPUS=1");
    // An allocation of none: `all` is none too.
    CHECK(gpu_request({"SLURM_JOB_GPUS=", "NVIDIA_VISIBLE_DEVICES=all"}, {})->kind == GpuRequest::Kind::nothing);
    auto outside = gpu_request({"SLURM_STEP_GPUS=2", "NVIDIA_VISIBLE_DEVICES=GPU-aaaa,0"}, {});
    REQUIRE_FALSE(outside.ok());
    CHECK(outside.error().message.find("GPU GPU-aaaa is not allocated to this step (SLURM_STEP_GPUS=2)") !=
          std::string::npos);
    auto cdi = gpu_request({"SLURM_JOB_GPUS=0", "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"}, {});
    REQUIRE_FALSE(cdi.ok());
    CHECK(cdi.error().message.find("CDI device names cannot be checked") != std::string::npos);
    // Narrowing to nothing, or to the driver alone, stays possible.
    CHECK(gpu_request({"SLURM_STEP_GPUS=0,1", "NVIDIA_VISIBLE_DEVICES=none"}, {})->kind ==
          GpuRequest::Kind::driver_only);
    CHECK(gpu_request({"SLURM_STEP_GPUS=0,1", "NVIDIA_VISIBLE_DEVICES=void"}, {})->kind == GpuRequest::Kind::nothing);

    // The image's Env (CUDA images: all) applies only when the job says nothing, and an allocation
    // (the first variables looked at) comes before it.
    auto image = gpu_request({}, {"NVIDIA_VISIBLE_DEVICES=all"});
    CHECK(image->kind == GpuRequest::Kind::all);
    CHECK(image->source == "NVIDIA_VISIBLE_DEVICES=all (image)");
    CHECK(gpu_request({"SLURM_STEP_GPUS=1"}, {"NVIDIA_VISIBLE_DEVICES=all"})->ids == std::vector<std::string>{"1"});
}

TEST_CASE("GPU request: all, none, void, CDI names and bad entries") {
    CHECK(gpu_request({"NVIDIA_VISIBLE_DEVICES=none"}, {})->kind == GpuRequest::Kind::driver_only);
    CHECK(gpu_request({"NVIDIA_VISIBLE_DEVICES=void"}, {})->kind == GpuRequest::Kind::nothing);
    CHECK(gpu_request({"NVIDIA_VISIBLE_DEVICES="}, {"NVIDIA_VISIBLE_DEVICES=all"})->kind == GpuRequest::Kind::nothing);
    CHECK(gpu_request({"CUDA_VISIBLE_DEVICES=NoDevFiles"}, {})->kind == GpuRequest::Kind::nothing);
    auto r = gpu_request({"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,1"}, {});
    REQUIRE(r.ok());
    CHECK(r->cdi == std::vector<std::string>{"nvidia.com/gpu=0"});
    CHECK(r->ids == std::vector<std::string>{"1"});
    auto bad = gpu_request({"NVIDIA_VISIBLE_DEVICES=0,gpu-one"}, {});
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("'gpu-one' is not a GPU index") != std::string::npos);
    CHECK(gpu_request({"NVIDIA_VISIBLE_DEVICES=MIG-1234"}, {})->ids == std::vector<std::string>{"MIG-1234"});
}

TEST_CASE("driver capabilities") {
    auto c = parse_driver_capabilities("");
    REQUIRE(c.ok());
    CHECK((c->compute && c->utility && !c->video && !c->graphics));
    c = parse_driver_capabilities("video, compat32");
    CHECK((c->video && c->compat32 && !c->compute));
    c = parse_driver_capabilities("all");
    CHECK((c->compute && c->utility && c->video && c->graphics && c->display && c->compat32 && c->ngx));
    auto bad = parse_driver_capabilities("compute,teleport");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("unknown capability 'teleport'") != std::string::npos);
}

TEST_CASE("ld.so cache: a synthetic cache, the system's own, and damaged files") {
    auto cache = make_cache({{0x0303, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                             {0x0003, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"}});
    auto e = parse_ld_cache(cache);
    REQUIRE(e.ok());
    REQUIRE(e->size() == 2);
    CHECK((*e)[0].soname == "libcuda.so.1");
    CHECK((*e)[0].path == "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    CHECK((*e)[0].is_64bit());
    CHECK_FALSE((*e)[1].is_64bit());

    // Old format in front: the new header is found after it.
    auto combined = parse_ld_cache(std::string("ld.so-1.7.0") + std::string(13, '\0') + cache);
    REQUIRE(combined.ok());
    CHECK(combined->size() == 2);

    CHECK_FALSE(parse_ld_cache("not a cache").ok());
    CHECK_FALSE(parse_ld_cache(cache.substr(0, 60)).ok());  // entries cut off
    std::string wild = cache;
    uint32_t far = 1u << 30;
    std::memcpy(&wild[48 + 8], &far, 4);
    CHECK_FALSE(parse_ld_cache(wild).ok());  // a string offset outside the file

    // The machine's own cache (written by its ldconfig) lists the C library.
    std::ifstream f("/etc/ld.so.cache", std::ios::binary);
    std::string system((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto sys = parse_ld_cache(system);
    REQUIRE(sys.ok());
    bool libc = false;
    for (const auto& x : *sys)
        libc = libc || (x.soname == "libc.so.6" && x.is_64bit() && ::access(x.path.c_str(), F_OK) == 0);
    CHECK(libc);
}

TEST_CASE("GPUs and driver version from the host root's procfs") {
    TempRoot r;
    r.write("/proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)\n");
    CHECK(driver_version(r.path) == "550.54.15");
    r.write("/proc/driver/nvidia/gpus/0000:2a:00.0/information",
            "Model: H100\nGPU UUID: \t GPU-bbbb\nMinor Number: \t 1\n");
    r.write("/proc/driver/nvidia/gpus/0000:18:00.0/information",
            "Model: H100\nGPU UUID: \t GPU-aaaa\nMinor Number: \t 0\n");
    auto gpus = host_gpus(r.path);
    REQUIRE(gpus.size() == 2);
    CHECK((gpus[0].index == 0 && gpus[0].minor == 0 && gpus[0].uuid == "GPU-aaaa" && gpus[0].bus_id == "0000:18:00.0"));
    CHECK((gpus[1].index == 1 && gpus[1].minor == 1 && gpus[1].uuid == "GPU-bbbb"));

    // Selection errors name the request and the node's GPUs.
    ImageConfig image;
    auto sel = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=3"}, image);
    REQUIRE_FALSE(sel.ok());
    CHECK(sel.error().message == "NVIDIA_VISIBLE_DEVICES=3: no GPU '3' on this node (GPUs: 0, 1)");
    CHECK_FALSE(select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=GPU-cccc"}, image).ok());
    // gpu = 0 in gantry.conf: the request is not even looked at.
    Config off = config_for(r);
    off.gpu = false;
    CHECK(select_devices(off, {"NVIDIA_VISIBLE_DEVICES=3"}, image).ok());
}

TEST_CASE("GPU selection with device nodes: only the chosen GPUs, renumbered for CUDA", "[root]") {
    if (::geteuid() != 0) FAIL("needs root: device nodes (mknod); run `ctest -L root` as root");
    TempRoot r;
    for (unsigned i = 0; i < 4; ++i) REQUIRE(r.mknod_char("/dev/nvidia" + std::to_string(i), 195, i));
    REQUIRE(r.mknod_char("/dev/nvidiactl", 195, 255));
    REQUIRE(r.mknod_char("/dev/nvidia-uvm", 511, 0));
    ImageConfig image;
    image.env = {"NVIDIA_VISIBLE_DEVICES=all"};
    auto sel = select_devices(config_for(r), {"SLURM_STEP_GPUS=1,3"}, image);
    REQUIRE(sel.ok());
    std::vector<std::string> paths;
    for (const auto& d : sel->devices) paths.push_back(d.path);
    CHECK(paths == std::vector<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidia3"});
    CHECK(sel->devices[2].host_path == r.path + "/dev/nvidia1");
    CHECK(has(sel->env, "NVIDIA_VISIBLE_DEVICES=1,3"));
    CHECK(has(sel->env, "CUDA_VISIBLE_DEVICES=0,1"));
    // No ld.so cache in this root: a warning, no libraries.
    CHECK(sel->ld_library_dirs.empty());
    REQUIRE_FALSE(sel->warnings.empty());

    auto all = select_devices(config_for(r), {}, image);  // the image's `all`
    REQUIRE(all.ok());
    CHECK(all->devices.size() == 6);
}

TEST_CASE("EFA and mlx devices: filtered by the sysfs driver link") {
    TempRoot r;
    auto dev = [&](int n, const std::string& driver, const std::string& ib) {
        std::string pci = "/sys/devices/pci0000:00/0000:00:1" + std::to_string(n) + ".0";
        r.link(pci + "/driver", "../../../bus/pci/drivers/" + driver);
        fs::create_directories(r.path + "/sys/bus/pci/drivers/" + driver);
        r.link(pci + "/infiniband_verbs/uverbs" + std::to_string(n) + "/device", "../..");
        r.write(pci + "/infiniband_verbs/uverbs" + std::to_string(n) + "/ibdev", ib + "\n");
        r.link("/sys/class/infiniband_verbs/uverbs" + std::to_string(n),
               "../../devices/pci0000:00/0000:00:1" + std::to_string(n) + ".0/infiniband_verbs/uverbs" +
                   std::to_string(n));
        r.link("/sys/class/infiniband/" + ib,
               "../../devices/pci0000:00/0000:00:1" + std::to_string(n) + ".0/infiniband/" + ib);
    };
    dev(0, "efa", "rdmap0");
    dev(1, "mlx5_core", "mlx5_0");
    dev(2, "efa", "rdmap2");
    dev(3, "mlx5_core", "mlx5_1");
    r.write("/sys/class/infiniband_verbs/abi_version", "6\n");
    auto all = rdma_devices(r.path);
    REQUIRE(all.size() == 4);
    CHECK(all[0].driver == "efa");
    CHECK(all[1].driver == "mlx5_core");
    CHECK(all[1].ib_name == "mlx5_0");
    CHECK(all[2].sysfs_link == "../../devices/pci0000:00/0000:00:12.0/infiniband_verbs/uverbs2");

    auto names = [](const std::vector<RdmaDevice>& v) {
        std::string s;
        for (const auto& d : v) s += d.uverbs + " ";
        return s;
    };
    CHECK(names(select_rdma(all, true, std::nullopt)) == "uverbs0 uverbs2 ");
    CHECK(names(select_rdma(all, false, std::nullopt)).empty());
    CHECK(names(select_rdma(all, true, std::string("1"))) == "uverbs0 uverbs2 uverbs3 ");
    CHECK(names(select_rdma(all, false, std::string("mlx5_0"))) == "uverbs1 ");
    CHECK(names(select_rdma(all, true, std::string("all"))) == "uverbs0 uverbs1 uverbs2 uverbs3 ");
    CHECK(names(select_rdma(all, true, std::string("none"))) == "uverbs0 uverbs2 ");

    // The sysfs views list what is passed, with the host's link targets, and keep abi_version.
    auto sel = select_devices(config_for(r), {"SLURM_RLIMIT_MEMLOCK=65536"}, ImageConfig{});
    REQUIRE(sel.ok());
    REQUIRE(sel->sysfs_views.size() == 2);
    const auto& verbs = sel->sysfs_views[0];
    CHECK(verbs.path == "/sys/class/infiniband_verbs");
    REQUIRE(verbs.entries.size() == 2);
    CHECK(verbs.entries[1].path == "uverbs2");
    CHECK(verbs.entries[1].target == all[2].sysfs_link);
    CHECK(verbs.files == std::vector<std::pair<std::string, std::string>>{{"abi_version", "6\n"}});
    CHECK(sel->sysfs_views[1].entries[0].path == "rdmap0");
    // memlock 64 KiB from srun's propagated limit: a warning.
    REQUIRE(sel->warnings.size() == 1);
    CHECK(sel->warnings[0].find("memlock limit is 64 KiB") != std::string::npos);
    auto unlimited = select_devices(config_for(r), {"SLURM_RLIMIT_MEMLOCK=18446744073709551615"}, ImageConfig{});
    CHECK(unlimited->warnings.empty());
}

TEST_CASE("CDI: spec-wide and device edits; unknown devices fail") {
    TempRoot r;
    r.write("/etc/cdi/gpu.json", R"({"cdiVersion":"0.6.0","kind":"vendor.com/gpu",
      "containerEdits":{"env":["VENDOR_DRIVER=1"],"mounts":[{"hostPath":"/usr/lib/libvendor.so.1","containerPath":"/usr/lib/vendor/libvendor.so.1","options":["ro"]}]},
      "devices":[{"name":"a","containerEdits":{"deviceNodes":[{"path":"/dev/vgpu0"}],"env":["VENDOR_VISIBLE=a"]}},
                 {"name":"b","containerEdits":{"deviceNodes":[{"path":"/dev/vgpu1","hostPath":"/dev/vendor/gpu1"}]}}]})");
    r.write("/var/run/cdi/other.yaml", "cdiVersion: 0.6.0\nkind: x.com/y\ndevices:\n- name: z\n");
    auto sel = select_devices(config_for(r), {"GANTRY_CDI_DEVICES=vendor.com/gpu=a,vendor.com/gpu=b"}, ImageConfig{});
    REQUIRE(sel.ok());
    REQUIRE(sel->devices.size() == 2);
    CHECK(sel->devices[0] == DeviceNode{r.path + "/dev/vgpu0", "/dev/vgpu0"});
    CHECK(sel->devices[1] == DeviceNode{r.path + "/dev/vendor/gpu1", "/dev/vgpu1"});
    CHECK(sel->env == std::vector<std::string>{"VENDOR_DRIVER=1", "VENDOR_VISIBLE=a"});  // spec edits once
    REQUIRE(sel->mounts.size() == 1);
    CHECK(sel->mounts[0].read_only);
    CHECK(sel->ld_library_dirs == std::vector<std::string>{"/usr/lib/vendor"});
    CHECK(select_devices(config_for(r), {"GANTRY_CDI_DEVICES=x.com/y=z"}, ImageConfig{}).ok());  // from the YAML
    auto missing = select_devices(config_for(r), {"GANTRY_CDI_DEVICES=x.com/y=w"}, ImageConfig{});
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message == "CDI device x.com/y=w is not defined by any spec in /etc/cdi or /var/run/cdi");
}

// A spec the way `nvidia-ctk cdi generate` writes it (YAML, its default), for a driver whose
// libcuda is in the root's ld.so cache; the same spec in JSON must give the same edits.
const char* kNvidiaCtkYaml = R"(---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-fake0000-0000-0000-0000-000000000001
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args:
    - nvidia-ctk
    - hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
)";

const char* kNvidiaCtkJson = R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu",
  "devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}},
             {"name":"GPU-fake0000-0000-0000-0000-000000000001","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia1"}]}}],
  "containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"],
    "deviceNodes":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia-uvm"}],
    "hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-ctk","args":["nvidia-ctk","hook","create-symlinks","--link","libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"]},
             {"hookName":"createContainer","path":"/usr/bin/nvidia-ctk","args":["nvidia-ctk","hook","update-ldcache","--folder","/usr/lib/x86_64-linux-gnu"]}],
    "mounts":[{"hostPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15","containerPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15","options":["ro","nosuid","nodev","bind"]},
              {"hostPath":"/usr/bin/nvidia-smi","containerPath":"/usr/bin/nvidia-smi","options":["ro","nosuid","nodev","bind"]}]}})";

void driver_files(const TempRoot& r) {
    r.write("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "ELF (fake)");
    r.link("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.550.54.15");
    r.write("/usr/bin/nvidia-smi", "#!/bin/sh\n");
    r.write("/etc/ld.so.cache", make_cache({{0x0303, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}}));
}

TEST_CASE("CDI: an nvidia-ctk spec in YAML, and the same in JSON, give the same edits") {
    TempRoot y, j;
    driver_files(y);
    driver_files(j);
    y.write("/etc/cdi/nvidia.yaml", kNvidiaCtkYaml);
    j.write("/var/run/cdi/nvidia.json", kNvidiaCtkJson);
    std::vector<std::string> env = {"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=GPU-fake0000-0000-0000-0000-000000000001"};
    auto sel = select_devices(config_for(y), env, ImageConfig{});
    REQUIRE(sel.ok());
    std::vector<std::string> nodes;
    for (const auto& d : sel->devices) nodes.push_back(d.path);
    CHECK(nodes == std::vector<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"});
    CHECK(sel->devices[2].host_path == y.path + "/dev/nvidia1");
    CHECK(sel->env == std::vector<std::string>{"NVIDIA_VISIBLE_DEVICES=void"});
    REQUIRE(sel->mounts.size() == 2);
    CHECK(sel->mounts[0] == DeviceMount{y.path + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                                        "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", true});
    CHECK(sel->ld_library_dirs == std::vector<std::string>{"/usr/lib/x86_64-linux-gnu"});
    // The soname link the host's cache names (update-ldcache's effect) and create-symlinks' link.
    CHECK(sel->symlinks ==
          std::vector<DeviceSymlink>{{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.550.54.15"},
                                     {"/usr/lib/x86_64-linux-gnu/libcuda.so", "libcuda.so.1"}});
    CHECK(sel->summary.find("cdi nvidia.com/gpu=GPU-fake0000-0000-0000-0000-000000000001 (1 hooks not run)") !=
          std::string::npos);

    auto from_json = select_devices(config_for(j), env, ImageConfig{});
    REQUIRE(from_json.ok());
    CHECK(from_json->env == sel->env);
    CHECK(from_json->symlinks == sel->symlinks);
    CHECK(from_json->ld_library_dirs == sel->ld_library_dirs);
    REQUIRE(from_json->devices.size() == sel->devices.size());
    for (size_t i = 0; i < sel->devices.size(); ++i) CHECK(from_json->devices[i].path == sel->devices[i].path);
    REQUIRE(from_json->mounts.size() == 2);
    CHECK(from_json->mounts[1].path == "/usr/bin/nvidia-smi");
}

TEST_CASE("CDI: broken specs are reported by file and problem") {
    auto fails = [](const std::string& name, const std::string& text) {
        TempRoot r;
        r.write("/etc/cdi/" + name, text);
        auto sel = select_devices(config_for(r), {"GANTRY_CDI_DEVICES=a.com/b=c"}, ImageConfig{});
        REQUIRE_FALSE(sel.ok());
        std::string msg = sel.error().message, prefix =
                                                   "CDI device a.com/b=c is not defined by any spec in /etc/cdi "
                                                   "or /var/run/cdi (skipped CDI spec " +
                                                   r.path + "/etc/cdi/" + name + ": ";
        CHECK(msg.find(prefix) == 0);
        return msg.substr(prefix.size(), msg.size() - prefix.size() - 1);
    };
    CHECK(fails("bad.yaml", "cdiVersion: 0.5.0\nkind: [a.com/b\n").find("not valid YAML (line ") == 0);
    CHECK(fails("bad.json", "{\"cdiVersion\": ") == "not valid JSON");
    CHECK(fails("nokind.yml", "cdiVersion: 0.5.0\ndevices: []\n") == "kind '' is not vendor/class");
    CHECK(fails("kind.yaml", "cdiVersion: 0.5.0\nkind: gpu\ndevices: []\n") == "kind 'gpu' is not vendor/class");
    CHECK(fails("version.yaml", "kind: a.com/b\ndevices: []\n") == "no cdiVersion");
    CHECK(fails("devices.yaml", "cdiVersion: 0.5.0\nkind: a.com/b\n") == "no devices list");
    CHECK(fails("name.yaml", "cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- containerEdits: {}\n") ==
          "device 0 has no name");
    CHECK(fails("list.yaml", "- 1\n- 2\n") == "not a mapping of cdiVersion, kind, devices");
    // A broken spec beside a good one: the good one's devices work, with a warning naming the other.
    TempRoot r;
    r.write("/etc/cdi/good.yaml",
            "cdiVersion: 0.6.0\nkind: a.com/b\ndevices:\n- name: c\n  containerEdits:\n    env: [C=1]\n");
    r.write("/etc/cdi/vendor.json", "{");
    auto sel = select_devices(config_for(r), {"GANTRY_CDI_DEVICES=a.com/b=c"}, ImageConfig{});
    REQUIRE(sel.ok());
    CHECK(sel->env == std::vector<std::string>{"C=1"});
    CHECK(has(sel->warnings, "CDI spec " + r.path + "/etc/cdi/vendor.json: not valid JSON (skipped)"));
    // Aliases: a node inside itself, and a few lines that expand to a million nodes.
    CHECK(fails("cycle.yaml", "cdiVersion: 0.5.0\nkind: a.com/b\ndevices: &d [*d]\n") ==
          "not valid YAML (nested or aliased too deeply)");
    std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i < 7; ++i) {
        std::string prev = "*a" + std::to_string(i - 1);
        bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + prev;
        for (int k = 1; k < 10; ++k) bomb += ", " + prev;
        bomb += "]\n";
    }
    CHECK(fails("bomb.yaml", bomb) == "not valid YAML (nested or aliased too deeply)");
}

// The driver's MIG procfs for GPU 1 of two (the layout fakehw.sh builds: GI 1/CI 0, GI 2/CIs 0 and 1).
void mig_procfs(const TempRoot& r) {
    for (int g = 0; g < 2; ++g)
        r.write("/proc/driver/nvidia/gpus/0000:1" + std::to_string(g) + ":00.0/information",
                "GPU UUID: \t GPU-fake0000-0000-0000-0000-00000000000" + std::to_string(g) + "\nMinor Number: \t " +
                    std::to_string(g) + "\n");
    auto access = [&](const std::string& rel, int minor) {
        r.write("/proc/driver/nvidia/capabilities/" + rel,
                "DeviceFileMinor: " + std::to_string(minor) + "\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
    };
    access("mig/config", 1);
    access("mig/monitor", 2);
    access("gpu1/mig/gi1/access", 147);
    access("gpu1/mig/gi1/ci0/access", 148);
    access("gpu1/mig/gi2/access", 156);
    access("gpu1/mig/gi2/ci0/access", 157);
    access("gpu1/mig/gi2/ci1/access", 158);
    r.write("/proc/driver/nvidia-caps/mig-minors", "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n");
    r.write("/proc/devices", "Character devices:\n195 nvidia-frontend\n510 nvidia-caps\n");
}

TEST_CASE("MIG: devices from the capability procfs, names accepted by the request") {
    TempRoot r;
    mig_procfs(r);
    auto gpus = host_gpus(r.path);
    REQUIRE(gpus.size() == 2);
    auto migs = host_mig_devices(r.path, gpus);
    REQUIRE(migs.size() == 3);
    CHECK((migs[0].gpu == 1 && migs[0].gpu_minor == 1 && migs[0].index == 0 && migs[0].gi == 1 && migs[0].ci == 0 &&
           migs[0].gi_minor == 147 && migs[0].ci_minor == 148));
    CHECK((migs[2].index == 2 && migs[2].gi == 2 && migs[2].ci == 1 && migs[2].gi_minor == 156 &&
           migs[2].ci_minor == 158));

    auto req = gpu_request({"NVIDIA_VISIBLE_DEVICES=1:0,MIG-GPU-fake/2/1,MIG-abc,0"}, {});
    REQUIRE(req.ok());
    CHECK(req->ids == std::vector<std::string>{"1:0", "MIG-GPU-fake/2/1", "MIG-abc", "0"});
    CHECK_FALSE(gpu_request({"NVIDIA_VISIBLE_DEVICES=1:x"}, {}).ok());
    // Slurm's MIG GRES: SLURM_STEP_GPUS holds GRES indices, CUDA_VISIBLE_DEVICES the MIG UUIDs, which win.
    req = gpu_request({"SLURM_STEP_GPUS=0", "CUDA_VISIBLE_DEVICES=MIG-aaaa,MIG-bbbb"}, {});
    CHECK(req->ids == std::vector<std::string>{"MIG-aaaa", "MIG-bbbb"});
    CHECK(req->source == "CUDA_VISIBLE_DEVICES=MIG-aaaa,MIG-bbbb");

    // Without device nodes a selection still reports unknown names with the node's MIG devices.
    auto bad = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=1:3"}, ImageConfig{});
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message ==
          "NVIDIA_VISIBLE_DEVICES=1:3: no MIG device '1:3' on this node (MIG devices: 1:0, 1:1, 1:2)");
    auto nonvml = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=MIG-fake0001-0000-0000-0000-00000000100"},
                                 ImageConfig{});
    REQUIRE_FALSE(nonvml.ok());
    CHECK(nonvml.error().message.find("libnvidia-ml.so.1 is not in the host's ld.so cache (name MIG devices as "
                                      "<gpu>:<mig> instead)") != std::string::npos);
}

TEST_CASE("MIG: the parent GPU and the instance's capability nodes only", "[root]") {
    if (::geteuid() != 0) FAIL("needs root: MIG device nodes (mknod); run `ctest -L root` as root");
    TempRoot r;
    mig_procfs(r);
    for (unsigned i = 0; i < 2; ++i) REQUIRE(r.mknod_char("/dev/nvidia" + std::to_string(i), 195, i));
    REQUIRE(r.mknod_char("/dev/nvidiactl", 195, 255));
    for (unsigned c : {1u, 2u, 147u, 148u, 156u, 157u, 158u})
        REQUIRE(r.mknod_char("/dev/nvidia-caps/nvidia-cap" + std::to_string(c), 510, c));
    auto paths = [](const ContainerEdits& e) {
        std::string s;
        for (const auto& d : e.devices) s += d.path + " ";
        return s;
    };
    auto sel = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=1:1"}, ImageConfig{});
    REQUIRE(sel.ok());
    CHECK(paths(*sel) == "/dev/nvidiactl /dev/nvidia-caps/nvidia-cap156 /dev/nvidia-caps/nvidia-cap157 /dev/nvidia1 ");
    CHECK(has(sel->env, "NVIDIA_VISIBLE_DEVICES=1:1"));
    CHECK(has(sel->env, "CUDA_VISIBLE_DEVICES=0"));

    // The legacy MIG-GPU-<uuid>/<gi>/<ci> name, a whole GPU beside it, and the monitor capability.
    sel = select_devices(
        config_for(r),
        {"NVIDIA_VISIBLE_DEVICES=MIG-GPU-fake0000-0000-0000-0000-000000000001/1/0,0", "NVIDIA_MIG_MONITOR_DEVICES=all"},
        ImageConfig{});
    REQUIRE(sel.ok());
    CHECK(paths(*sel) ==
          "/dev/nvidiactl /dev/nvidia-caps/nvidia-cap147 /dev/nvidia-caps/nvidia-cap148 "
          "/dev/nvidia-caps/nvidia-cap2 /dev/nvidia0 /dev/nvidia1 ");
    CHECK(has(sel->env, "NVIDIA_VISIBLE_DEVICES=1:0,0"));
    CHECK(has(sel->env, "CUDA_VISIBLE_DEVICES=0,1"));
    // A plain GPU: no MIG capability at all.
    sel = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=0"}, ImageConfig{});
    REQUIRE(sel.ok());
    CHECK(paths(*sel) == "/dev/nvidiactl /dev/nvidia0 ");
    CHECK_FALSE(
        select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES=1"}, ImageConfig{}).ok());

    // A missing capability node, and one whose major is not nvidia-caps', fail the step.
    fs::remove(r.path + "/dev/nvidia-caps/nvidia-cap158");
    auto missing = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=1:2"}, ImageConfig{});
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message.find("needs /dev/nvidia-caps/nvidia-cap158, which the node lacks") !=
          std::string::npos);
    REQUIRE(r.mknod_char("/dev/nvidia-caps/nvidia-cap158", 240, 158));
    auto wrong = select_devices(config_for(r), {"NVIDIA_VISIBLE_DEVICES=1:2"}, ImageConfig{});
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.error().message.find("major 240 is not nvidia-caps' 510") != std::string::npos);
}

TEST_CASE("MIG UUIDs through the fake driver's NVML (fakehw.sh)", "[root]") {
    TempRoot r;
    const auto hw = make_fake_hardware(r);
    REQUIRE(hw.has_value());
    const Config& c = *hw;
    auto sel = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=MIG-fake0001-0000-0000-0000-00000000201"}, ImageConfig{});
    REQUIRE(sel.ok());
    std::string caps;
    for (const auto& d : sel->devices)
        if (d.path.find("nvidia-cap") != std::string::npos || d.path == "/dev/nvidia1") caps += d.path + " ";
    CHECK(caps == "/dev/nvidia-caps/nvidia-cap156 /dev/nvidia-caps/nvidia-cap158 /dev/nvidia1 ");
    CHECK(has(sel->env, "NVIDIA_VISIBLE_DEVICES=1:2"));
    auto unknown = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=MIG-fake0001-0000-0000-0000-00000000999"}, ImageConfig{});
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.error().message.find("no MIG device 'MIG-fake0001-0000-0000-0000-00000000999'") != std::string::npos);
    // The YAML spec shaped like nvidia-ctk's, for the MIG device 1:0.
    auto cdi = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1:0"}, ImageConfig{});
    REQUIRE(cdi.ok());
    CHECK(has(cdi->env, "NVIDIA_VISIBLE_DEVICES=void"));
    std::string nodes;
    for (const auto& d : cdi->devices)
        if (d.path.find("nvidia") != std::string::npos) nodes += d.path + " ";
    CHECK(nodes ==
          "/dev/nvidia-modeset /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidiactl /dev/nvidia1 "
          "/dev/nvidia-caps/nvidia-cap147 /dev/nvidia-caps/nvidia-cap148 ");
}

TEST_CASE("a GPU UUID that procfs does not show comes from NVML; a real nvidia-smi wins over a wrapper script",
          "[root]") {
    TempRoot r;
    const auto hw = make_fake_hardware(r);
    REQUIRE(hw.has_value());
    const Config& c = *hw;
    const std::string& fake = c.host_root;
    const std::string uuid2 = "GPU-fake0000-0000-0000-0000-000000000002";
    auto by_procfs = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=" + uuid2}, ImageConfig{});
    REQUIRE(by_procfs.ok());
    CHECK(has(by_procfs->env, "NVIDIA_VISIBLE_DEVICES=2"));
    // A driver whose procfs shows no UUID (its placeholder): only NVML can map the UUID to the GPU.
    const std::string unknown_uuid = "GPU-" + std::string(8, '?') + "-" + std::string(4, '?') + "-" +
                                     std::string(4, '?') + "-" + std::string(4, '?') + "-" + std::string(12, '?');
    for (const auto& bus : fs::directory_iterator(fake + "/proc/driver/nvidia/gpus")) {
        std::string file = bus.path().string() + "/information";
        std::ifstream in(file);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), out, line;
        std::istringstream lines(text);
        while (std::getline(lines, line))
            out += (line.rfind("GPU UUID:", 0) == 0 ? "GPU UUID: \t " + unknown_uuid : line) + "\n";
        std::ofstream(file, std::ios::trunc) << out;
    }
    for (const auto& g : host_gpus(fake)) CHECK(g.uuid != uuid2);
    auto by_nvml = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=" + uuid2}, ImageConfig{});
    REQUIRE(by_nvml.ok());
    CHECK(has(by_nvml->env, "NVIDIA_VISIBLE_DEVICES=2"));
    std::string gpus;
    for (const auto& d : by_nvml->devices)
        if (d.path.find("/dev/nvidia") == 0 && std::isdigit(static_cast<unsigned char>(d.path.back())) &&
            d.path.find("caps") == std::string::npos)
            gpus += d.path + " ";
    CHECK(gpus == "/dev/nvidia2 ");
    auto unknown =
        select_devices(c, {"NVIDIA_VISIBLE_DEVICES=GPU-fake0000-0000-0000-0000-000000000009"}, ImageConfig{});
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.error().message.find("no GPU 'GPU-fake0000-0000-0000-0000-000000000009'") != std::string::npos);

    // nvidia-smi: fakehw.sh's /usr/bin/nvidia-smi is a script, and with nothing better it is used.
    auto mount_of = [&](const ContainerEdits& e) {
        for (const auto& m : e.mounts)
            if (m.path == "/usr/bin/nvidia-smi") return m.host_path;
        return std::string();
    };
    auto script = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=0"}, ImageConfig{});
    REQUIRE(script.ok());
    CHECK(mount_of(*script) == fake + "/usr/bin/nvidia-smi");
    // A driver in /usr/local/nvidia whose /usr/bin/nvidia-smi only runs it by a host path: the program.
    fs::create_directories(fake + "/usr/local/nvidia/bin");
    fs::copy_file("/bin/true", fake + "/usr/local/nvidia/bin/nvidia-smi");
    auto program = select_devices(c, {"NVIDIA_VISIBLE_DEVICES=0"}, ImageConfig{});
    REQUIRE(program.ok());
    CHECK(mount_of(*program) == fake + "/usr/local/nvidia/bin/nvidia-smi");
}

TEST_CASE("hostlists and tasks per node") {
    CHECK(*expand_hostlist("gnode[1-3]") == std::vector<std::string>{"gnode1", "gnode2", "gnode3"});
    CHECK(*expand_hostlist("n[08-10,15],login") == std::vector<std::string>{"n08", "n09", "n10", "n15", "login"});
    CHECK(*expand_hostlist("a[1-2]-b[1-2]") == std::vector<std::string>{"a1-b1", "a1-b2", "a2-b1", "a2-b2"});
    CHECK(*expand_hostlist("single") == std::vector<std::string>{"single"});
    CHECK_FALSE(expand_hostlist("n[1-").ok());
    CHECK_FALSE(expand_hostlist("n[3-1]").ok());
    CHECK(tasks_on_node("4(x2),3", 0) == 4u);
    CHECK(tasks_on_node("4(x2),3", 1) == 4u);
    CHECK(tasks_on_node("4(x2),3", 2) == 3u);
    CHECK_FALSE(tasks_on_node("4(x2),3", 3).has_value());
    CHECK(master_port(0) == 61000);
    CHECK(master_port(4536 + 7) == 61007);
    CHECK(master_port(4535) == 65535);
}

TEST_CASE("task environment: PMIx mapping and PyTorch ranks") {
    Config c;
    std::vector<std::string> task = {"PMIX_PTL_MODULE=tcp",  "PMIX_SECURITY_MODE=native",
                                     "PMIX_GDS_MODULE=hash", "SLURM_STEP_NODELIST=gnode[2-3]",
                                     "SLURM_JOB_ID=4540",    "SLURM_STEP_NUM_TASKS=8",
                                     "SLURM_PROCID=5",       "SLURM_LOCALID=1",
                                     "SLURM_NODEID=1",       "SLURM_STEP_TASKS_PER_NODE=4(x2)"};
    auto env = task_environment(c, {}, task);
    CHECK(env == std::vector<std::string>{"PMIX_MCA_ptl=tcp", "PMIX_MCA_psec=native", "PMIX_MCA_gds=hash"});

    env = task_environment(c, {"PYTORCH_VERSION=2.3.0"}, task);
    for (const char* want : {"MASTER_ADDR=gnode2", "MASTER_PORT=61004", "WORLD_SIZE=8", "RANK=5", "LOCAL_RANK=1",
                             "LOCAL_WORLD_SIZE=4", "NODE_RANK=1"})
        CHECK(has(env, want));

    auto asked = task;
    asked.push_back("GANTRY_PYTORCH=1");
    CHECK(has(task_environment(c, {}, asked), "RANK=5"));
    auto refused = task;
    refused.push_back("GANTRY_PYTORCH=0");
    CHECK_FALSE(has(task_environment(c, {"PYTORCH_VERSION=2.3.0"}, refused), "RANK=5"));

    // dstores need the server's directory: unreachable from the task, the hash store is used.
    auto unreachable = task;
    unreachable.push_back("PMIX_SERVER_TMPDIR=/nonexistent/pmix.1.0/");
    unreachable[2] = "PMIX_GDS_MODULE=ds21,ds12,hash";
    CHECK(has(task_environment(c, {}, unreachable), "PMIX_MCA_gds=hash"));
    unreachable.back() = "PMIX_SERVER_TMPDIR=/tmp";
    CHECK(has(task_environment(c, {}, unreachable), "PMIX_MCA_gds=ds21,ds12,hash"));

    // An explicit PMIX_MCA_* is left alone; pmix = 0 / pytorch = 0 turn the pieces off.
    auto explicit_mca = task;
    explicit_mca.push_back("PMIX_MCA_gds=ds21");
    CHECK_FALSE(has(task_environment(c, {}, explicit_mca), "PMIX_MCA_gds=hash"));
    c.pmix = false;
    c.pytorch = false;
    CHECK(task_environment(c, {"PYTORCH_VERSION=2.3.0"}, task).empty());
}
