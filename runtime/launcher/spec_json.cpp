// ContainerSpec as JSON: how the creator hands a container's description to the gantry-holder
// program it execs (holder.cpp). Both ends are the same build; the parser is strict all the same (a
// missing or mistyped field is an error naming it) and refuses documents over kMaxContainerSpecBytes.
#include <nlohmann/json.hpp>

#include "gantry/launcher.hpp"
#include "holder_reply.hpp"
#include "internal.hpp"

namespace gantry {

NLOHMANN_JSON_SERIALIZE_ENUM(MountBackend, {{MountBackend::auto_, "auto"},
                                            {MountBackend::kernel, "kernel"},
                                            {MountBackend::fuse, "fuse"},
                                            {MountBackend::extract, "extract"}})
NLOHMANN_JSON_SERIALIZE_ENUM(MountKind,
                             {{MountKind::bind, "bind"}, {MountKind::tmpfs, "tmpfs"}, {MountKind::umount, "umount"}})
NLOHMANN_JSON_SERIALIZE_ENUM(Propagation, {{Propagation::private_, "private"},
                                           {Propagation::slave, "slave"},
                                           {Propagation::shared, "shared"},
                                           {Propagation::unbindable, "unbindable"}})

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PullLimits, max_layer_bytes, max_image_bytes, max_layer_entries)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Config, store_path, store_owner, private_images, runtime_path, scratch_path,
                                   mount_backend, mount_idle_seconds, fuse_shared, fuse_server, fuse_poll_us,
                                   compressor, compression_level, block_size, max_connections, limits,
                                   insecure_registries, ca_bundle, host_dev, host_root, gpu, efa, efa_host_libs, pmix,
                                   pytorch, batch_srun, source)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ImageConfig, architecture, os, env, entrypoint, cmd, working_dir, user, volumes,
                                   labels, diff_ids)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MountSpec, kind, source, destination, read_only, recursive, nosuid, nodev, noexec,
                                   propagation, propagation_recursive, data, text, nofail, origin)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ExtraNamespaces, net, ipc, uts)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DeviceNode, host_path, path)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DeviceMount, host_path, path, read_only, if_reachable)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DeviceSymlink, path, target)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SysfsView, path, entries, files)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ContainerEdits, devices, mounts, symlinks, sysfs_views, env, ld_library_dirs,
                                   warnings, summary)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ContainerSpec, image_path, image_layers, image_trusted, image_config, backend,
                                   mounts, writable, remap_root, mount_home, unshare, workdir, env_names, env_values,
                                   uid, gid, name, detach, config, devices, holder_program, fuse_server_scope)

std::string container_spec_to_json(const ContainerSpec& spec) {
    return nlohmann::json(spec).dump();
}

Result<ContainerSpec> container_spec_from_json(std::string_view text) {
    if (text.size() > kMaxContainerSpecBytes)
        return make_error("container description of " + std::to_string(text.size()) + " bytes (at most " +
                          std::to_string(kMaxContainerSpecBytes) + ")");
    try {
        return nlohmann::json::parse(text).get<ContainerSpec>();
    } catch (const std::exception& e) {
        return make_error(std::string("reading a container description: ") + e.what());
    }
}

namespace launcher {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Identity, uid, gid, name, home, inner_uid, inner_gid, group_name)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(HolderRequest, spec, id, backend, staging, image_dir, workdir, home, parent,
                                   creator_writes_maps)

NLOHMANN_JSON_SERIALIZE_ENUM(HolderReply::Kind, {{HolderReply::Kind::userns, "userns"},
                                                 {HolderReply::Kind::ready, "ready"},
                                                 {HolderReply::Kind::failed, "failed"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(HolderReply, kind, pid, start_time, pid_namespace, server_pid, server_start_time,
                                   message)

std::string holder_reply_to_line(const HolderReply& reply) {
    // The error handler replaces bytes that are not UTF-8 (a path in a message) instead of throwing.
    return nlohmann::json(reply).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<HolderReply> holder_reply_from_line(std::string_view line) {
    if (line.size() > kMaxHolderReplyBytes)
        return make_error("holder reply of " + std::to_string(line.size()) + " bytes (at most " +
                          std::to_string(kMaxHolderReplyBytes) + ")");
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (line.find('\n') != std::string_view::npos) return make_error("a holder reply is one line");
    try {
        auto j = nlohmann::json::parse(line);
        // A kind the enum does not name decodes as its first value (nlohmann's rule): refuse it here.
        if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string() ||
            (j["kind"] != "userns" && j["kind"] != "ready" && j["kind"] != "failed"))
            return make_error("reading the holder's reply: no known kind");
        auto r = j.get<HolderReply>();
        // (A userns pid is checked by the creator against the sender the kernel names.)
        if (r.kind == HolderReply::Kind::ready && r.pid <= 1)
            return make_error("reading the holder's reply: pid " + std::to_string(r.pid));
        return r;
    } catch (const std::exception& e) {
        return make_error(std::string("reading the holder's reply: ") + e.what());
    }
}

std::string holder_request_to_json(const HolderRequest& request) {
    return nlohmann::json(request).dump();
}

Result<HolderRequest> holder_request_from_json(std::string_view text) {
    if (text.size() > kMaxContainerSpecBytes)
        return make_error("holder request of " + std::to_string(text.size()) + " bytes (at most " +
                          std::to_string(kMaxContainerSpecBytes) + ")");
    try {
        return nlohmann::json::parse(text).get<HolderRequest>();
    } catch (const std::exception& e) {
        return make_error(std::string("reading the holder request: ") + e.what());
    }
}

}  // namespace launcher
}  // namespace gantry
