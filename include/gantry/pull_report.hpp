// The typed, size-capped answer of `gantry pull --report-fd N` to the process that started it (the
// SPANK plugin inside root's slurmstepd). Both ends use this one module: the CLI encodes, the plugin
// decodes, so the plugin never parses free text a user-controlled process printed, and an error
// arrives with a kind instead of a message to grep.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/result.hpp"

namespace gantry {

enum class PullErrorKind {
    none,       // the pull succeeded
    reference,  // the image name is malformed
    pull,       // the registry, the network, credentials or the conversion failed
    store,      // the image store could not be opened or written
    usage,      // the command line was wrong (a bug in the caller)
};
std::string_view to_string(PullErrorKind kind);

struct PullReport {
    std::string digest;  // manifest digest, "sha256:<hex>"
    std::string
        squashfs_path;  // the image file in the store (a layered image: its top layer); empty for --credentials-only
    std::vector<std::string> layer_paths;  // a layered image: its layers' squashfs files, bottom first
    std::string config_json;               // the image's OCI config as stored
    PullErrorKind error = PullErrorKind::none;
    std::string message;  // the error, one line, without the "gantry: " prefix
    // Where the image came from (start-up telemetry): "pulled" (this pull produced it), "waited"
    // (another producer did, while this one waited), "stored" (a hit); empty from an older gantry.
    std::string outcome;
};

// Largest report the plugin reads (an image config with a long history is tens of KiB).
constexpr size_t kMaxPullReportBytes = size_t{1} << 20;

std::string encode_pull_report(const PullReport& report);
// Refuses text over kMaxPullReportBytes, invalid JSON, unknown kinds and malformed digests.
Result<PullReport> decode_pull_report(std::string_view text);

// Writes the whole report to `fd` and closes it; errors are ignored (the reader sees a short report).
void send_pull_report(int fd, const PullReport& report);

}  // namespace gantry
