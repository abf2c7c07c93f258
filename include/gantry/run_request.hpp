// Owner: runtime/launcher/. What a front end asks for once it has the image, and the one function that
// turns that into a ContainerSpec: `gantry run` (runtime/cli/run.cpp) and the SPANK plugin
// (plugin/stepd.cpp) both call it, so they cannot disagree on which image may be kernel-mounted, on
// the site's defaults and drop-ins, or on device selection.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gantry/config.hpp"
#include "gantry/image_config.hpp"
#include "gantry/launcher.hpp"
#include "gantry/mounts.hpp"
#include "gantry/result.hpp"

namespace gantry {

// Where the image came from: what decides whether root may ever hand it to the kernel.
enum class ImageSource {
    local_file,     // a squashfs file the requester named (user-controlled bytes unless the requester is root)
    store,          // a store image in a store users can write (or a per-user store)
    trusted_store,  // a store image in a trusted store (root- or store_owner-owned, writable by nobody else)
};

struct RunRequest {
    Config config;
    // Who the container is for; -1: the caller (gantry run). The plugin names the job user.
    uid_t uid = static_cast<uid_t>(-1);
    gid_t gid = static_cast<gid_t>(-1);
    std::string image_path;
    std::vector<std::string> image_layers;  // a layered store image (ContainerSpec::image_layers)
    ImageConfig image_config;
    ImageSource image_source = ImageSource::local_file;
    std::vector<std::string> env;   // the job's environment (gantry run: the caller's)
    std::vector<MountSpec> mounts;  // --container-mounts / --mount, parsed, plus the front end's own binds
    // Unset: the site's defaults (gantry.conf's container_* keys, or its enroot_conf).
    std::optional<bool> writable, remap_root, mount_home;
    ExtraNamespaces unshare;
    std::string workdir;
    std::vector<std::string> env_names, env_values;
    MountBackend backend = MountBackend::auto_;
    std::string name;
    bool detach = false;
    std::string holder_program;
    // gantry run: the one command is the only task, so the per-task variables are fixed now (the
    // plugin sets them per task when each joins).
    bool single_task = false;
    // ContainerSpec::should_stop.
    std::function<bool()> should_stop;
    // ContainerSpec::started_holder: the plugin's holder that acquired the image itself.
    std::shared_ptr<StartedHolder> started_holder;
};

struct PreparedSpec {
    ContainerSpec spec;
    std::vector<std::string> warnings;  // device selection's (memlock for EFA, stale driver libraries)
    std::string devices_summary;
};

// The container spec for `request`: the trust decision (a trusted store's image; a local file only when
// the requester is root, who named it, and the launcher checks again that its path is root-owned all the
// way up), the site's defaults and drop-ins (an Enroot image's /etc/environment read as the user,
// environ.d, mounts.d), devices and wiring.
Result<PreparedSpec> container_spec_for(RunRequest request);

}  // namespace gantry
