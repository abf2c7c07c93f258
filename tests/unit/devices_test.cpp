// Unit tests for the devices module: GPU requests (indices, UUIDs, all/none/void, precedence),
// driver capabilities, the ld.so cache parser, driver version and GPU discovery from a host root,
// EFA/mlx filtering by sysfs driver links, CDI specs, hostlist expansion, PMIx mapping and the
// PyTorch variables. Host roots are built in a temporary directory (device nodes only when root).
#include "gantry/devices.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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

    // Slurm's allocation beats CUDA_VISIBLE_DEVICES; the user's NVIDIA_VISIBLE_DEVICES beats both.
    r = gpu_request({"CUDA_VISIBLE_DEVICES=0", "SLURM_STEP_GPUS=2,3"}, {});
    CHECK(r->ids == std::vector<std::string>{"2", "3"});
    r = gpu_request({"SLURM_JOB_GPUS=5", "SLURM_STEP_GPUS=2"}, {});
    CHECK(r->ids == std::vector<std::string>{"2"});
    r = gpu_request({"SLURM_STEP_GPUS=2", "NVIDIA_VISIBLE_DEVICES=GPU-aaaa,0"}, {});
    CHECK(r->ids == std::vector<std::string>{"GPU-aaaa", "0"});

    // The image's Env (CUDA images: all) applies only when the job says nothing.
    r = gpu_request({}, {"NVIDIA_VISIBLE_DEVICES=all"});
    CHECK(r->kind == GpuRequest::Kind::all);
    CHECK(r->source == "NVIDIA_VISIBLE_DEVICES=all (image)");
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
    CHECK_FALSE(gpu_request({"NVIDIA_VISIBLE_DEVICES=MIG-1234"}, {}).ok());
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
    if (::geteuid() != 0) {
        WARN("not root: mknod unavailable, device-node selection not exercised");
        return;
    }
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
    r.write("/var/run/cdi/other.yaml", "kind: x.com/y\n");
    auto sel = select_devices(config_for(r), {"GANTRY_CDI_DEVICES=vendor.com/gpu=a,vendor.com/gpu=b"}, ImageConfig{});
    REQUIRE(sel.ok());
    REQUIRE(sel->devices.size() == 2);
    CHECK(sel->devices[0] == DeviceNode{r.path + "/dev/vgpu0", "/dev/vgpu0"});
    CHECK(sel->devices[1] == DeviceNode{r.path + "/dev/vendor/gpu1", "/dev/vgpu1"});
    CHECK(sel->env == std::vector<std::string>{"VENDOR_DRIVER=1", "VENDOR_VISIBLE=a"});  // spec edits once
    REQUIRE(sel->mounts.size() == 1);
    CHECK(sel->mounts[0].read_only);
    CHECK(sel->ld_library_dirs == std::vector<std::string>{"/usr/lib/vendor"});
    auto missing = select_devices(config_for(r), {"GANTRY_CDI_DEVICES=x.com/y=z"}, ImageConfig{});
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message.find("YAML specs are not read") != std::string::npos);
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
