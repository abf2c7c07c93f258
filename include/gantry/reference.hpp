// Image references as users write them, in both the Pyxis/Enroot and the Docker spelling:
//   [docker://][USER@][REGISTRY#]REPOSITORY[:TAG][@sha256:DIGEST]     (Pyxis/Enroot)
//   [docker://]REGISTRY[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST]        (Docker; first component has . or :)
//   REPOSITORY[:TAG]                                                   (Docker Hub, library/ for one component)
// and squashfs files named by a path that starts with '.' or '/'.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gantry/result.hpp"

namespace gantry {

inline constexpr const char* kDockerHubRegistry = "registry-1.docker.io";
// The namespace of imported images' names (`local/NAME[:TAG]`, docs/user.md "Importing local images"):
// parsed like a registry host, but no registry is ever asked for it (RegistryClient refuses), and each
// account's names are its own (the store keys them by the importer's uid). Docker Hub's own `local`
// namespace stays reachable as docker.io/local/NAME.
inline constexpr const char* kImportedNamespace = "local";

struct ImageReference {
    std::string user;        // Enroot's USER@ credential selector; empty when absent
    std::string registry;    // host[:port], e.g. "registry-1.docker.io", "127.0.0.1:5000"
    std::string repository;  // e.g. "library/ubuntu", "team/pytorch"
    std::string tag;         // "latest" when neither tag nor digest was given
    std::string digest;      // "sha256:..." or empty

    // Canonical Docker spelling: registry/repository[:tag][@digest].
    [[nodiscard]] std::string str() const;
    // What a digest-pinned copy of this reference would print: registry/repository@digest.
    [[nodiscard]] std::string pinned(const std::string& manifest_digest) const;
    // The reference used to ask the registry for the manifest: the digest if given, else the tag.
    [[nodiscard]] const std::string& manifest_ref() const { return digest.empty() ? tag : digest; }
    // True for an imported image's name (local/NAME): the store answers for it, never a registry.
    [[nodiscard]] bool names_imported_image() const { return registry == kImportedNamespace; }
    // True for 127.0.0.0/8, localhost and [::1] registries (plain HTTP allowed there).
    [[nodiscard]] bool registry_is_loopback() const;
};

// True when `text` names a local squashfs file rather than a registry image.
bool is_local_image_path(std::string_view text);

// Parses a registry reference; the error says what part is wrong and shows the accepted forms.
Result<ImageReference> parse_reference(std::string_view text);

}  // namespace gantry
