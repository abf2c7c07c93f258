// Pieces shared by the CLI verbs: option values, configuration and store opening, and resolving an
// IMAGE operand (a registry reference or a local squashfs path) to a squashfs file plus its config.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "command_line.hpp"
#include "gantry/acquire.hpp"
#include "gantry/config.hpp"
#include "gantry/image_config.hpp"
#include "gantry/pull.hpp"
#include "gantry/result.hpp"
#include "gantry/store.hpp"

namespace gantry::cli {

// The value of an option when the command line gave it.
inline std::optional<std::string> given(const CLI::Option* opt, const std::string& value) {
    return opt->count() > 0 ? std::optional<std::string>(value) : std::nullopt;
}

// Parses "30d", "12h", "15m", "90s" or plain seconds.
Result<long long> parse_duration(const std::string& text);
// Parses "500G", "10GiB", "1T", "4096" (bytes).
Result<unsigned long long> parse_size(const std::string& text);

Result<Config> load_config();

// This program's own path (/proc/self/exe), to re-execute a verb of it (stage runs pull); "" if unknown.
std::string self_program();
Result<ImageStore> open_store(const Config& config, const std::string& store_option, bool create);

// What a container needs from an IMAGE operand.
struct RunnableImage {
    std::string squashfs_path;
    ImageConfig config;             // empty for a local squashfs file
    std::string digest;             // empty for a local squashfs file
    bool in_trusted_store = false;  // published by the store (never true for a user-named file)
    // A store image kept as layers (only with resolve_runnable_image's layers_ok): the layers'
    // squashfs files, bottom first; squashfs_path is then the top one's.
    std::vector<std::string> layer_paths;
    // A store image: its files, opened and checked once (acquire_image); squashfs_path and layer_paths
    // then name these descriptors ("/proc/self/fd/N") and are valid while this is held.
    AcquiredImage acquired;
};

// A path starting with '.' or '/' is a local squashfs file; anything else is a registry reference that
// is pulled into the store unless already there.
// `layers_ok`: the caller can run an image the store keeps as layers (the kernel or fuse backend);
// otherwise such an image is pulled again as one squashfs.
Result<RunnableImage> resolve_runnable_image(const Config& config, const std::string& store_option,
                                             const std::string& image, bool quiet, PullPolicy policy,
                                             bool layers_ok = false);

// The pull policy: --pull=POLICY, else GANTRY_PULL_POLICY (how a job's environment sets it for the
// plugin's pulls), else gantry.conf's pull_policy.
Result<PullPolicy> pull_policy(const Config& config, const std::optional<std::string>& option);

// IMAGE operand for inspect, rm and export: a digest, a digest prefix of 12+ hex digits, or a
// reference whose tag the store has recorded.
Result<StoredImage> find_stored(const ImageStore& store, const std::string& image);

// Exit statuses of the image verbs and doctor (gantry(1), EXIT STATUS): 1 the operation failed,
// kUsageError (2, command_line.hpp) the command line is wrong (unknown option, missing or extra operand,
// malformed option value).
constexpr int kFailed = 1;

// Prints one error line ("gantry: ...") and returns exit status 1.
int fail(const Error& error);
// Prints one error line and returns exit status 2.
int usage_error(const Error& error);

}  // namespace gantry::cli
