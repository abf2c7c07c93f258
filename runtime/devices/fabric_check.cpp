// Proving the fabric before training (issue 37): the EFA devices, libfabric's efa provider and an
// aws-ofi-nccl plugin that this container's NCCL will open, checked from inside the container without
// loading anything from the image. See include/gantry/fabric_check.hpp and docs/devices.md.
//
// How NCCL picks its net plugin (read from NVIDIA/nccl's sources):
//   - NCCL_NET_PLUGIN unset: dlopen("libnccl-net.so"), every release since 2.4;
//   - NCCL_NET_PLUGIN=NAME, older releases (src/net.cc, ~2.12-2.18): only "libnccl-net-NAME.so";
//   - newer releases (src/net.cc's openNetPluginLib, then src/plugin/plugin_open.cc): NAME itself
//     first (a file name or a path), then "libnccl-net-NAME.so" unless NAME has a '/' or is already
//     "lib*.so";
//   - in the library: dlsym("ncclNetPlugin_vN") for the ABI versions that release knows, newest first
//     (current releases: v12 down to v6, src/plugin/net/net_v6.cc ... net_v12.cc). A plugin exporting
//     none of them is ignored and NCCL falls back to its internal IB/socket transports.
// Which generation an NCCL is comes from its own read-only strings: the "ncclNetPlugin_vN" names it
// asks dlsym for, and the format strings of the two lookups ("NET/Plugin: Plugin name set by env to
// %s" and "%s-%s.so" only exist where NAME itself is tried first).
// libfabric (ofiwg/libfabric, src/fabric.c): a built-in efa provider is linked into libfabric.so
// itself, which then needs libefa.so.1 (rdma-core); a DSO provider is "libefa-fi.so" exporting
// fi_prov_ini, looked for in FI_PROVIDER_PATH, else in <libdir>/libfabric/.
#include "gantry/fabric_check.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <set>

#include "gantry/devices.hpp"
#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

using devices::env_value;
using devices::list_dir;

// What the check needs of one ELF shared object.
struct ElfFacts {
    std::vector<std::string> needed;  // DT_NEEDED
    std::set<std::string> exported;   // defined global/weak dynamic symbols
    std::string rodata;               // .rodata* contents, when asked for
};

// A read-only mapping of a whole file, unmapped when it goes.
struct Mapping {
    const unsigned char* data = nullptr;
    size_t size = 0;
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping() {
        if (data) ::munmap(const_cast<unsigned char*>(data), size);
    }
};

bool in_bounds(size_t size, uint64_t off, uint64_t len) {
    return off <= size && len <= size - off;
}

std::optional<ElfFacts> read_elf(const std::string& path, bool want_rodata) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat sb {};
    if (!fd || ::fstat(fd.get(), &sb) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr)))
        return std::nullopt;
    Mapping m;
    m.size = static_cast<size_t>(sb.st_size);
    void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) return std::nullopt;
    m.data = static_cast<const unsigned char*>(p);
    Elf64_Ehdr eh;
    std::memcpy(&eh, m.data, sizeof eh);
    // 64-bit little-endian objects only: the images Gantry runs on x86-64 and aarch64.
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        !in_bounds(m.size, eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)))
        return std::nullopt;
    std::vector<Elf64_Shdr> sh(eh.e_shnum);
    if (eh.e_shnum) std::memcpy(sh.data(), m.data + eh.e_shoff, eh.e_shnum * sizeof(Elf64_Shdr));
    auto section_bytes = [&](const Elf64_Shdr& s) -> std::string_view {
        if (s.sh_type == SHT_NOBITS || !in_bounds(m.size, s.sh_offset, s.sh_size)) return {};
        return {reinterpret_cast<const char*>(m.data + s.sh_offset), s.sh_size};
    };
    auto string_at = [](std::string_view table, uint64_t off) -> std::string {
        if (off >= table.size()) return {};
        auto end = table.find('\0', off);
        return std::string(table.substr(off, end == std::string_view::npos ? std::string_view::npos : end - off));
    };
    std::string_view names = eh.e_shstrndx < sh.size() ? section_bytes(sh[eh.e_shstrndx]) : std::string_view{};
    ElfFacts facts;
    for (const auto& s : sh) {
        std::string_view strtab = s.sh_link < sh.size() ? section_bytes(sh[s.sh_link]) : std::string_view{};
        if (s.sh_type == SHT_DYNSYM) {
            auto bytes = section_bytes(s);
            for (size_t off = sizeof(Elf64_Sym); off + sizeof(Elf64_Sym) <= bytes.size(); off += sizeof(Elf64_Sym)) {
                Elf64_Sym sym;
                std::memcpy(&sym, bytes.data() + off, sizeof sym);
                int bind = ELF64_ST_BIND(sym.st_info);
                if (sym.st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
                facts.exported.insert(string_at(strtab, sym.st_name));
            }
        } else if (s.sh_type == SHT_DYNAMIC) {
            auto bytes = section_bytes(s);
            for (size_t off = 0; off + sizeof(Elf64_Dyn) <= bytes.size(); off += sizeof(Elf64_Dyn)) {
                Elf64_Dyn d;
                std::memcpy(&d, bytes.data() + off, sizeof d);
                if (d.d_tag == DT_NULL) break;
                if (d.d_tag == DT_NEEDED) facts.needed.push_back(string_at(strtab, d.d_un.d_val));
            }
        } else if (want_rodata && s.sh_type == SHT_PROGBITS && starts_with(string_at(names, s.sh_name), ".rodata")) {
            facts.rodata.append(section_bytes(s));
        }
    }
    return facts;
}

bool is_regular_file(const std::string& path) {
    struct stat sb {};
    return ::stat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

std::string real_path(const std::string& path) {
    char buf[PATH_MAX];
    return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// The library search of the image's dynamic loader for dlopen(name): a name with a '/' is a path;
// otherwise LD_LIBRARY_PATH, the image's ld.so cache, then the default directories.
class LibraryPath {
public:
    explicit LibraryPath(const std::vector<std::string>& env) {
        if (auto v = env_value(env, "LD_LIBRARY_PATH"))
            for (const auto& d : split_list(*v, ':')) dirs_.push_back(d);
        if (auto text = try_read_file("/etc/ld.so.cache"))
            if (auto entries = parse_ld_cache(*text)) cache_ = std::move(*entries);
    }
    [[nodiscard]] std::optional<std::string> find(const std::string& name) const {
        if (name.find('/') != std::string::npos) return is_regular_file(name) ? std::optional(name) : std::nullopt;
        for (const auto& d : dirs_)
            if (is_regular_file(d + "/" + name)) return d + "/" + name;
        for (const auto& e : cache_)
            if (e.soname == name && e.is_64bit() && is_regular_file(e.path)) return e.path;
        for (const char* d : {"/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                              "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib"})
            if (is_regular_file(std::string(d) + "/" + name)) return std::string(d) + "/" + name;
        return std::nullopt;
    }
    // The first DT_NEEDED of `facts` that cannot be found (libc's own are always there).
    [[nodiscard]] std::optional<std::string> missing_dependency(const ElfFacts& facts) const {
        for (const auto& n : facts.needed)
            if (!find(n)) return n;
        return std::nullopt;
    }

private:
    std::vector<std::string> dirs_;
    std::vector<LdCacheEntry> cache_;
};

// /dev/infiniband/uverbsN in the container whose driver is efa (where the container's sysfs says;
// Gantry passes only efa ones unless MELLANOX_VISIBLE_DEVICES asks for more).
std::vector<std::string> efa_devices() {
    std::vector<std::string> out;
    for (const auto& name : list_dir("/dev/infiniband")) {
        if (!starts_with(name, "uverbs") || !devices::is_char_device("/dev/infiniband/" + name)) continue;
        // Gantry's sysfs views exist only where the container's /sys has the class (a host with RDMA).
        char buf[PATH_MAX];
        std::string link = "/sys/class/infiniband_verbs/" + name + "/device/driver";
        if (::realpath(link.c_str(), buf) != nullptr && std::strcmp(std::strrchr(buf, '/') + 1, "efa") != 0) continue;
        out.push_back(name);
    }
    return out;
}

// NCCL itself: libnccl.so.2 on the library path, else in a Python wheel (PyTorch's nvidia-nccl-cu*).
std::optional<std::string> find_nccl(const LibraryPath& libs) {
    if (auto p = libs.find("libnccl.so.2")) return p;
    for (const char* base : {"/usr/local/lib", "/usr/lib", "/opt/conda/lib"})
        for (const auto& py : list_dir(base)) {
            if (!starts_with(py, "python3")) continue;
            for (const char* pk : {"/site-packages", "/dist-packages"}) {
                std::string p = std::string(base) + "/" + py + pk + "/nvidia/nccl/lib/libnccl.so.2";
                if (is_regular_file(p)) return p;
            }
        }
    return std::nullopt;
}

// What an NCCL library tells about its plugin lookup.
struct NcclFacts {
    std::string version;          // "2.23.4" from the file name libnccl.so.2.23.4, else empty
    std::vector<int> abi;         // the ncclNetPlugin_vN it asks for; empty: not known
    bool takes_full_name = true;  // NCCL_NET_PLUGIN may be a file name or path (newer releases)
};

NcclFacts nccl_facts(const std::string& path) {
    NcclFacts n;
    std::string real = real_path(path);
    std::string file = real.substr(real.rfind('/') + 1);
    if (starts_with(file, "libnccl.so.2.")) n.version = file.substr(std::strlen("libnccl.so."));
    auto elf = read_elf(real, true);
    if (!elf) return n;
    for (int v = 1; v <= 32; ++v) {
        std::string sym = "ncclNetPlugin_v" + std::to_string(v);
        if (elf->rodata.find(std::string_view(sym.c_str(), sym.size() + 1)) != std::string::npos) n.abi.push_back(v);
    }
    bool full = elf->rodata.find("NET/Plugin: Plugin name set by env to %s") != std::string::npos ||
                elf->rodata.find("%s-%s.so") != std::string::npos;
    bool suffix_only = elf->rodata.find("libnccl-net-%s.so") != std::string::npos;
    n.takes_full_name = full || !suffix_only;  // unknown generation: assume the current one
    return n;
}

std::string nccl_name(const NcclFacts& n) {
    return n.version.empty() ? "this NCCL" : "NCCL " + n.version;
}

std::string abi_list(const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ", ") + std::string("v") + std::to_string(x);
    return s;
}

FabricProblem problem(FabricProblem::Kind kind, std::string cause, std::string fix) {
    return FabricProblem{kind, std::move(cause), std::move(fix)};
}

}  // namespace

std::string FabricProblem::line() const {
    return "EFA check: " + cause + "; " + fix;
}

bool passes_efa_devices(const ContainerEdits& edits) {
    return std::any_of(edits.devices.begin(), edits.devices.end(),
                       [](const DeviceNode& d) { return starts_with(d.path, "/dev/infiniband/uverbs"); });
}

bool fabric_check_wanted(const std::vector<std::string>& container_env, bool efa_devices_passed) {
    return efa_devices_passed || trim(env_value(container_env, "FI_PROVIDER").value_or("")) == "efa";
}

FabricReport check_fabric(const std::vector<std::string>& env) {
    FabricReport r;
    using K = FabricProblem::Kind;
    const std::string fallback = ": NCCL would fall back to TCP sockets";

    // 1. The devices.
    auto devs = efa_devices();
    if (devs.empty()) {
        r.problem =
            problem(K::no_devices, "no EFA device is visible in the container (/dev/infiniband/uverbs*)" + fallback,
                    "run on nodes with EFA, with efa = 1 in gantry.conf (`gantry doctor` shows both)");
        return r;
    }
    r.summary = std::to_string(devs.size()) + " EFA device(s)";

    // 2. libfabric and its efa provider.
    LibraryPath libs(env);
    auto fabric = libs.find("libfabric.so.1");
    if (!fabric) {
        r.problem =
            problem(K::no_libfabric, "no libfabric (libfabric.so.1) on the container's library path" + fallback,
                    "install libfabric with the efa provider in the image (the EFA installer's /opt/amazon/efa), "
                    "or set efa_host_libs = 1 in gantry.conf to bind the host's");
        return r;
    }
    auto fabric_elf = read_elf(real_path(*fabric), false);
    bool builtin = fabric_elf && std::find(fabric_elf->needed.begin(), fabric_elf->needed.end(), "libefa.so.1") !=
                                     fabric_elf->needed.end();
    std::string provider_file;  // the DSO provider, when not built in
    if (!builtin) {
        std::vector<std::string> dirs;
        if (auto v = env_value(env, "FI_PROVIDER_PATH"))
            dirs = split_list(*v, ':');
        else
            dirs.push_back(real_path(*fabric).substr(0, real_path(*fabric).rfind('/')) + "/libfabric");
        for (const auto& d : dirs) {
            std::string p = d + "/libefa-fi.so";
            auto e = is_regular_file(p) ? read_elf(p, false) : std::nullopt;
            if (e && e->exported.count("fi_prov_ini")) {
                provider_file = p;
                break;
            }
        }
        if (provider_file.empty()) {
            r.problem =
                problem(K::no_efa_provider,
                        "libfabric " + *fabric + " has no efa provider (not built in, no libefa-fi.so in " +
                            (dirs.empty() ? std::string("FI_PROVIDER_PATH") : dirs.front()) + ")" + fallback,
                        "use a libfabric built with the efa provider (the EFA installer's), or efa_host_libs = 1");
            return r;
        }
    }
    {
        auto pe = builtin ? fabric_elf : read_elf(provider_file, false);
        std::string who = builtin ? "libfabric " + *fabric + " (efa built in)" : "the efa provider " + provider_file;
        if (pe)
            if (auto miss = libs.missing_dependency(*pe)) {
                r.problem = problem(K::provider_dependency,
                                    who + " needs " + *miss + ", which is not in the container" + fallback,
                                    "install rdma-core's " + *miss + " in the image (or efa_host_libs = 1)");
                return r;
            }
    }
    r.summary += "; libfabric " + *fabric + (builtin ? " (efa built in)" : " (efa provider " + provider_file + ")");

    // 3. The NCCL net plugin this NCCL opens.
    NcclFacts nccl;
    if (auto path = find_nccl(libs)) {
        nccl = nccl_facts(*path);
        r.summary += "; " + nccl_name(nccl) + " (" + *path + ")";
    }
    auto named = env_value(env, "NCCL_NET_PLUGIN");
    std::string value = trim(named.value_or(""));
    std::vector<std::string> tried;
    if (value.empty()) {
        tried.push_back("libnccl-net.so");
    } else {
        bool full_form = value.find('/') != std::string::npos || (starts_with(value, "lib") && ends_with(value, ".so"));
        if (nccl.takes_full_name) tried.push_back(value);
        if (!(nccl.takes_full_name && full_form)) tried.push_back("libnccl-net-" + value + ".so");
    }
    std::optional<std::string> plugin;
    for (const auto& t : tried)
        if ((plugin = libs.find(t))) break;
    if (!plugin) {
        auto ofi = libs.find("libnccl-net-ofi.so");
        auto plain = libs.find("libnccl-net.so");
        std::string looks = tried.front() + (tried.size() > 1 ? " and " + tried.back() : "");
        if (!value.empty()) {
            std::string cause = "NCCL_NET_PLUGIN=" + value + " names a plugin that is not in the container (" +
                                nccl_name(nccl) + " opens " + looks + ")" + fallback;
            std::string fix;
            if (!nccl.takes_full_name && (value.find('/') != std::string::npos || ends_with(value, ".so")))
                fix = nccl_name(nccl) + " takes NCCL_NET_PLUGIN as a name suffix only: set NCCL_NET_PLUGIN=ofi";
            else if (ofi)
                fix = "aws-ofi-nccl's plugin is " + *ofi + ": set NCCL_NET_PLUGIN=ofi";
            else if (plain)
                fix = "the plugin here is " + *plain + " (aws-ofi-nccl before 1.15): unset NCCL_NET_PLUGIN";
            else
                fix = "install aws-ofi-nccl in the image, or set efa_host_libs = 1 in gantry.conf";
            r.problem = problem(K::named_plugin_missing, cause, fix);
        } else if (ofi) {
            r.problem = problem(K::plugin_not_selected,
                                "aws-ofi-nccl's " + *ofi + " is in the container but " + nccl_name(nccl) +
                                    " opens it only when NCCL_NET_PLUGIN=ofi (it looks for libnccl-net.so)" + fallback,
                                "set NCCL_NET_PLUGIN=ofi (export it before srun, or in the image's Env)");
        } else {
            r.problem = problem(
                K::no_plugin,
                "no NCCL net plugin in the container (" + nccl_name(nccl) + " looks for " + looks + ")" + fallback,
                "install aws-ofi-nccl in the image, or set efa_host_libs = 1 in gantry.conf to bind the host's");
        }
        return r;
    }
    auto pe = read_elf(real_path(*plugin), false);
    std::vector<int> exported;
    if (pe)
        for (int v = 1; v <= 32; ++v)
            if (pe->exported.count("ncclNetPlugin_v" + std::to_string(v))) exported.push_back(v);
    std::vector<int> usable;
    for (int v : exported)
        if (nccl.abi.empty() || std::find(nccl.abi.begin(), nccl.abi.end(), v) != nccl.abi.end()) usable.push_back(v);
    if (usable.empty()) {
        std::string cause = exported.empty() ? *plugin + " is not an NCCL net plugin (it exports no ncclNetPlugin_vN)"
                                             : *plugin + " exports ncclNetPlugin " + abi_list(exported) + " but " +
                                                   nccl_name(nccl) + " asks for " + abi_list(nccl.abi);
        r.problem = problem(K::plugin_abi, cause + fallback,
                            "install the aws-ofi-nccl release built for " + nccl_name(nccl) +
                                " (a newer plugin for a newer NCCL, an older one for an older NCCL)");
        return r;
    }
    if (auto miss = libs.missing_dependency(*pe)) {
        r.problem =
            problem(K::plugin_dependency, *plugin + " needs " + *miss + ", which is not in the container" + fallback,
                    "install " + *miss + " in the image, or set efa_host_libs = 1 in gantry.conf");
        return r;
    }
    r.summary += "; NCCL opens " + *plugin + " (ncclNetPlugin_v" + std::to_string(usable.back()) + ")";
    return r;
}

}  // namespace gantry
