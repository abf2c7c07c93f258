// Proving the fabric before training (issue 37): from inside a container, whether NCCL in it will
// really talk over AWS EFA, or silently fall back to TCP sockets. Checked once per node and step by
// the SPANK plugin (the first task of each node, after it joined the container, as the job user),
// by `gantry run`, and by `gantry doctor --image` (which runs `gantry run`); docs/devices.md,
// "Proving the fabric".
//
// Nothing from the image is loaded or run: the libraries are found the way the image's dynamic
// loader finds them (LD_LIBRARY_PATH, the image's /etc/ld.so.cache, the default directories) and
// read as ELF files (exported symbols, DT_NEEDED, read-only strings). Every path is the container's:
// the caller is in its mount namespace.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gantry/devices.hpp"

namespace gantry {

// Whether a device selection passes EFA devices (/dev/infiniband/uverbsN) into the container.
bool passes_efa_devices(const ContainerEdits& edits);

// Whether a container is to be checked: EFA devices were passed into it, or the environment its
// processes get says FI_PROVIDER=efa (the user expects EFA).
bool fabric_check_wanted(const std::vector<std::string>& container_env, bool efa_devices_passed);

// One way of losing EFA. Only the first one found is reported: each hides the ones after it.
struct FabricProblem {
    enum class Kind {
        no_devices,            // no /dev/infiniband/uverbsN of an efa device in the container
        no_libfabric,          // libfabric.so.1 not on the library path
        no_efa_provider,       // libfabric without the efa provider (neither built in nor lib efa-fi.so)
        provider_dependency,   // the provider (or libfabric with it built in) needs a library that is missing
        no_plugin,             // no NCCL net plugin NCCL would open at all
        plugin_not_selected,   // aws-ofi-nccl's libnccl-net-ofi.so is there but NCCL_NET_PLUGIN does not name it
        named_plugin_missing,  // NCCL_NET_PLUGIN names a file that is not there
        plugin_abi,            // the plugin exports no ncclNetPlugin_vN this NCCL asks for
        plugin_dependency,     // the plugin needs a library that is missing
    };
    Kind kind;
    std::string cause;  // what is wrong, naming the files
    std::string fix;    // what to do about it
    // "EFA check: <cause>; <fix>" (the caller puts "gantry: " or "gantry: warning: " in front).
    [[nodiscard]] std::string line() const;
};

struct FabricReport {
    std::optional<FabricProblem> problem;
    // What was found, for `gantry doctor`: "2 EFA device(s); libfabric /opt/amazon/efa/lib/libfabric.so.1
    // (efa built in); NCCL 2.23.4 opens /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so (ncclNetPlugin_v8)".
    std::string summary;
};

// Checks the container the caller is in. `env`: the environment the container's processes get
// ("NAME=value": LD_LIBRARY_PATH, FI_PROVIDER_PATH and NCCL_NET_PLUGIN are read from it).
FabricReport check_fabric(const std::vector<std::string>& env);

}  // namespace gantry
