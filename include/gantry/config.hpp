// gantry.conf: the node-wide settings shared by the CLI and the SPANK plugin.
//
// Format: one `key = value` per line, `#` starts a comment, blank lines ignored. An unknown key is an
// error that names the file, line and key (a typo must not silently fall back to a default).
// Every key, its default and meaning is documented in docs/admin.md and conf/gantry.conf.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/result.hpp"

namespace gantry {

// What one pull may expand to, against decompression bombs and runaway images: a small gzip or zstd
// layer can inflate to terabytes on shared storage. The converter counts while it streams and stops
// at the limit; the blob fetcher refuses declared sizes beyond max_image_bytes before downloading.
// The defaults stay well above genuine ML images (a 20 GB PyTorch image: tens of GB of tar, hundreds
// of thousands of files at most). docs/squashfs.md, "Limits", lists every limit and where it is enforced.
// Every layer may decompress to this much whatever its ratio (max_layer_ratio): a small genuine layer
// of zeros, or a plain tar at 1:1, is never refused by the ratio.
inline constexpr uint64_t kLayerRatioFloorBytes = 1ULL << 30;

struct PullLimits {
    uint64_t max_layer_bytes = 64ULL << 30;   // uncompressed bytes of one layer (sparse files at full size)
    uint64_t max_image_bytes = 256ULL << 30;  // the same for all layers of one pull together
    uint64_t max_layer_entries = 10'000'000;  // tar entries (headers) of one layer
    // A layer's decompressed stream may be at most this many times its blob's size (and always
    // ratio_floor_bytes): a bomb stops after a small part of max_layer_bytes. gzip cannot pass about
    // 1032:1, so only layers of almost nothing but zeros come near the default.
    uint64_t max_layer_ratio = 1000;
    uint64_t ratio_floor_bytes = kLayerRatioFloorBytes;  // not a gantry.conf key: tests lower it
};

struct Config {
    // Shared content-addressed image store (FSx for Lustre in production). Empty: per-user default.
    std::string store_path;
    // The account (name) that owns a trusted shared store besides root: an unprivileged system account
    // the admin trusts to run only our converter. Empty: only a root-owned store is trusted. With it
    // set, the plugin pulls into a store the job user cannot write as this account, after the user's
    // own credentials authorised the image (docs/store.md, "Trusted shared store").
    std::string store_owner;
    // Publish images owner-only (.sqsh 0400, .json 0600), so users cannot copy images out of a
    // store-owner store; only root's plugin (kernel backend) and the owner can read them then.
    bool private_images = false;
    // Trusted store: seconds a node trusts the registry's yes to a user for a digest-pinned image (the
    // store account's pull with the user's credentials), so that later steps of that user with the
    // same digest start without asking again (include/gantry/authorization_cache.hpp); 0: ask on
    // every step.
    int authorization_cache_seconds = 60;
    // sbatch/salloc/srun with --container-image (docs/user.md, "Staged while the job waits"): `auto`
    // (the default) resolves the tag at submit (a missing tag or refused credentials fail the
    // submission) and pulls the image into store_path in the background when store_path exists on the
    // submitting host and the user may write it; `yes` also stages into the per-user store when
    // store_path is unset; `no` does nothing at submit.
    std::string stage_at_submit = "auto";
    // The login nodes' stage server (`gantry stage-server`, run by store_owner; docs/admin.md "Staging
    // into a trusted store"): with a trusted store, sbatch/salloc and `gantry stage` hand the pull of the
    // resolved digest, with the user's credentials, to the server at this Unix socket. Empty (the
    // default): off, and a trusted store is filled by the nodes when the job's first step starts.
    std::string stage_socket;
    // Node-local runtime state: container records, locks, mount points. Must not be shared storage.
    std::string runtime_path = "/run/gantry";
    // Node-local scratch for writable upper layers and the `extract` backend.
    std::string scratch_path = "/tmp";
    // auto | kernel | fuse | extract
    std::string mount_backend = "auto";
    // When a tag is resolved at the registry: always (every pull, the default), missing (only when the
    // store has no record of the tag), never (the store only). A digest-pinned reference whose image
    // is stored never needs the registry.
    std::string pull_policy = "always";
    // Kernel backend: seconds a node-wide image mount stays after its last container left (reused
    // by later steps and jobs meanwhile); 0 releases it as soon as it is idle.
    int mount_idle_seconds = 300;
    // fuse backend: serve an image to all of a user's containers from one server per node
    // (runtime/launcher/image_server.cpp), which lives mount_idle_seconds after its last container.
    bool fuse_shared = true;
    // Store newly pulled images as layers (docs/store.md, "Layers"; issue #19): gantry pull/run,
    // gantry import and the plugin's pulls convert only the layers the store lacks. The default;
    // `layered_images = no` stores every image as one whole squashfs (Enroot's form) instead.
    bool layered_images = true;
    // fuse backend: the program that serves an image: gantry (gantry-imagefs, runtime/imagefs) or
    // squashfuse_ll (Debian's squashfuse, the fallback).
    std::string fuse_server = "gantry";
    // fuse backend, gantry-imagefs: microseconds its thread keeps asking for the next request after
    // answering one before it sleeps (a request that comes meanwhile costs no wake-up); 0: sleep at
    // once. Off by default: it only helps where the server has an idle CPU (docs/runtime.md).
    int fuse_poll_us = 0;
    // Squashfs compressor for new images: zstd | lz4 | gzip | xz | lzo | none, and block size.
    std::string compressor = "lz4";  // fastest to convert and to read (docs/squashfs.md)
    int compression_level = 0;       // 0: the compressor's default
    uint32_t block_size = 131072;
    // Parallel blob downloads per pull; 0: sized for the host.
    int max_connections = 0;
    // max_layer_bytes, max_image_bytes, max_layer_entries.
    PullLimits limits;
    // Registries (host[:port]) reachable over plain HTTP besides loopback ones.
    std::vector<std::string> insecure_registries;
    // Extra CA bundle for registry TLS; empty: the system store (or SSL_CERT_FILE).
    std::string ca_bundle;
    // Bind the whole host /dev instead of a minimal one (Enroot's behaviour).
    bool host_dev = false;
    // Prefix under which host devices, sysfs and driver files are looked up (tests fake hardware here).
    std::string host_root = "/";
    // Device and wiring switches (issue 7).
    bool gpu = true;
    bool efa = true;
    bool efa_host_libs = false;
    // Proving the fabric (issue 37): a step whose EFA check finds a problem fails instead of warning.
    bool efa_required = false;
    bool pmix = true;
    bool pytorch = true;
    // An `srun` inside a containerized batch script (#SBATCH --container-image): the batch step's
    // container also gets Slurm's configuration directory, the munge socket directory and the SPANK
    // plugin itself, read-only at their host paths (the image brings the Slurm client).
    bool batch_srun = true;
    // Pyxis's "importing docker image" / "imported docker image" lines on srun's terminal, once per
    // step (docs/user.md, "What is printed"). Off: srun's output is only the tasks' (some test suites).
    bool import_messages = true;
    // With import_messages: srun prints the nodes' import progress (bytes, layers, rate) this often
    // while they pull; 0: never.
    int import_progress_seconds = 10;
    // Deadlines of root's waits on what a job user influences (issue #34; docs/admin.md, "What root
    // waits for"): a helper that checks or reads the user's files as the user (the image and bind
    // sources, an Enroot image's settings) gets check_timeout_seconds; the container holder's set-up
    // (mounting or extracting the image, the namespaces) setup_timeout_seconds. Each wait also ends at
    // the step's stop request (scancel, time limit). Pulls have no deadline of their own: they live as
    // long as the step.
    int check_timeout_seconds = 5;
    int setup_timeout_seconds = 300;

    // Site defaults of the container flags (Enroot's ENROOT_ROOTFS_WRITABLE, ENROOT_REMAP_ROOT,
    // ENROOT_MOUNT_HOME): --container-writable/--container-readonly, --[no-]container-remap-root and
    // --[no-]container-mount-home (gantry run: --writable, --remap-root, --mount-home and their
    // opposites) still decide per job. Unset: the value from `enroot_conf` when it has one, else
    // off, off, on (container_defaults).
    std::optional<bool> container_writable;
    std::optional<bool> container_remap_root;
    std::optional<bool> container_mount_home;
    // Drop-in directories applied to every container (Enroot's environ.d and mounts.d formats,
    // include/gantry/dropins.hpp): *.env files add environment variables, *.fstab files add mounts.
    // Empty: none. A missing directory is the same as an empty one.
    std::string environ_dir = "/etc/gantry/environ.d";
    std::string mounts_dir = "/etc/gantry/mounts.d";
    // Start-up telemetry (issue #37; docs/admin.md): each node writes one JSON line per step here
    // (resolve, pull or hit, mount, first exec; image and digest). Empty: off.
    std::string telemetry_dir;
    // An enroot.conf whose ENROOT_ROOTFS_WRITABLE, ENROOT_REMAP_ROOT and ENROOT_MOUNT_HOME fill the
    // container_* keys this file leaves unset (migration; every other ENROOT_* key is ignored).
    std::string enroot_conf;

    // Path the values were read from, empty for built-in defaults.
    std::string source;
};

// Calls `each(line, where)` with every trimmed line of `text` that is neither blank nor a comment
// ('#' first), `where` being "ORIGIN:LINE" for messages; stops at the first error. The walk of the
// line-based site files: enroot.conf, environ.d, mounts.d.
Status for_each_config_line(std::string_view text, const std::string& origin,
                            const std::function<Status(std::string& line, const std::string& where)>& each);

// Parses gantry.conf text; `origin` names it in error messages.
Result<Config> parse_config(const std::string& text, const std::string& origin);

// Fills the container_* keys that `config` leaves unset from enroot.conf text (`KEY VALUE` or
// `KEY=VALUE` lines; ENROOT_ROOTFS_WRITABLE, ENROOT_REMAP_ROOT, ENROOT_MOUNT_HOME; y/yes/true/1 or
// n/no/false/0). Other keys are Enroot's business and ignored; a bad boolean names `origin` and line.
Status apply_enroot_conf(Config& config, const std::string& text, const std::string& origin);

// The container flags a job gets when it names none: gantry.conf, then enroot_conf, then the built-in
// defaults (not writable, no remap-root, home mounted).
struct ContainerDefaults {
    bool writable = false;
    bool remap_root = false;
    bool mount_home = true;
};
ContainerDefaults container_defaults(const Config& config);

// Reads the file at `path` (and the enroot.conf it names). A missing file yields the defaults only
// when `missing_ok`.
Result<Config> load_config(const std::string& path, bool missing_ok);

// GANTRY_CONFIG, else /etc/gantry/gantry.conf (missing is fine: defaults).
Result<Config> load_default_config();

// The uid of Config::store_owner; nullopt when the key is unset or names no account (then only root
// counts as a trusted owner: an unknown name must never widen trust).
std::optional<unsigned> store_owner_uid(const Config& config);

}  // namespace gantry
