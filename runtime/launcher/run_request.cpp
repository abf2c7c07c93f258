// One request -> spec function for both front ends (include/gantry/run_request.hpp).
#include "gantry/run_request.hpp"

#include <unistd.h>

#include "gantry/acquire.hpp"
#include "gantry/devices.hpp"
#include "gantry/dropins.hpp"

namespace gantry {

Result<PreparedSpec> container_spec_for(RunRequest request) {
    PreparedSpec out;
    ContainerSpec& spec = out.spec;
    spec.config = request.config;
    spec.uid = request.uid;
    spec.gid = request.gid;
    // A file the requester named is opened by its name, as the user. A name of the form /proc/self/fd/N
    // is what acquired images travel as (pass_image_descriptors hands descriptor N on to the helpers and
    // the holder): taken from a user it would name one of *our* open descriptors (slurmstepd's, as
    // root) and give it to the user's processes. Refused; no image file is named that way.
    if (request.image_source == ImageSource::local_file && descriptor_of_path(request.image_path) >= 0)
        return make_error("the image " + request.image_path +
                          " names an open descriptor of this process, not an image file: give the file's own path");
    spec.image_path = std::move(request.image_path);
    spec.image_layers = std::move(request.image_layers);
    spec.image_config = std::move(request.image_config);
    const uid_t requester = request.uid == static_cast<uid_t>(-1) ? ::getuid() : request.uid;
    // Only a trusted store's image, or a file root itself named, may ever reach the kernel's squashfs
    // driver (Container::create checks ownership again before mounting); a job user's file never does.
    spec.image_trusted = request.image_source == ImageSource::trusted_store ||
                         (request.image_source == ImageSource::local_file && requester == 0);
    // The plugin acquires every store image before it gets here (plugin/stepd.cpp): only descriptors.
    spec.image_acquired = request.image_source != ImageSource::local_file && descriptor_of_path(spec.image_path) >= 0;
    for (const auto& layer : spec.image_layers)
        spec.image_acquired = spec.image_acquired && descriptor_of_path(layer) >= 0;
    spec.backend = request.backend;
    spec.mounts = std::move(request.mounts);
    ContainerDefaults site = container_defaults(spec.config);
    spec.writable = request.writable.value_or(site.writable);
    spec.remap_root = request.remap_root.value_or(site.remap_root);
    spec.mount_home = request.mount_home.value_or(site.mount_home);
    spec.unshare = request.unshare;
    spec.workdir = std::move(request.workdir);
    spec.env_names = std::move(request.env_names);
    spec.env_values = std::move(request.env_values);
    spec.name = std::move(request.name);
    spec.detach = request.detach;
    spec.holder_program = std::move(request.holder_program);
    spec.should_stop = std::move(request.should_stop);
    spec.started_holder = std::move(request.started_holder);

    // An Enroot image's /etc/environment (read as the user), environ.d and mounts.d.
    GANTRY_TRY(apply_site_defaults(spec, request.env));
    // Devices and wiring (docs/devices.md): GPUs, CDI, EFA.
    auto edits = select_devices(spec.config, request.env, spec.image_config);
    if (!edits) return edits.error();
    out.warnings = std::move(edits->warnings);
    out.devices_summary = edits->summary;
    if (request.single_task)
        for (auto& e : task_environment(spec.config, spec.image_config.env, request.env))
            edits->env.push_back(std::move(e));
    spec.devices = std::move(*edits);
    return out;
}

}  // namespace gantry
