// Start-up telemetry (issue #37; docs/admin.md, "Start-up telemetry"): per node and step, how long
// the step's image took to resolve, to pull (or to be found in the store), to mount, and until the
// first task was exec'd, with the image's reference and digest, as one JSON line in a file of
// gantry.conf's telemetry_dir; `gantry stats [JOBID]` reads them back.
//
// The phases are not timed here: they are differences of the trace points the plugin passes anyway
// (include/gantry/trace.hpp), remembered in memory by record() in the process that makes them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gantry/result.hpp"

namespace gantry::telemetry {

// --- the trace points of this process ---------------------------------------------------------------
// From now on, every trace point of this process is remembered (the first kMaxPoints of them).
void record();
constexpr size_t kMaxPoints = 512;
// CLOCK_MONOTONIC ns of the first (or last) point named `what` ("prepare_step +", "srun init").
std::optional<int64_t> first_point(std::string_view what);
std::optional<int64_t> last_point(std::string_view what);
// CLOCK_MONOTONIC ns now, and a monotonic time as Unix time in ns (this node's clock).
int64_t monotonic_ns();
int64_t unix_ns_of(int64_t monotonic);

// --- one node's start of one step ---------------------------------------------------------------------
// Where the image came from on this node (the pull's report, PullReport::outcome).
enum class ImageOutcome {
    unknown,  // no registry image (a squashfs file), or a pull too old to say
    pulled,   // this node downloaded and converted it (the step's producer)
    waited,   // another node of the store was producing it: this one waited, then found it
    stored,   // the store had it already (a hit)
};
std::string_view to_string(ImageOutcome outcome);
ImageOutcome parse_outcome(std::string_view text);  // unknown for anything else

// Milliseconds; a phase that did not happen on this node (no resolve in srun, no exec) is empty.
// pull + mount + exec = total, the node's own time from the start of its set-up to the first exec.
struct StartRecord {
    uint32_t job = 0;
    uint32_t step = 0;
    std::string node;  // Slurm's name of the node
    std::string user;  // the job user's name (or the uid as a number)
    uid_t uid = 0;
    std::string image;   // as the user gave it (--container-image)
    std::string digest;  // the manifest digest every rank of the step ran
    ImageOutcome outcome = ImageOutcome::unknown;
    int64_t start_unix_ms = 0;            // when the node's set-up began (prepare_step)
    std::optional<double> resolve_ms;     // srun's resolution of the tag, once for the step
    std::optional<double> pull_ms;        // set-up start to the image in the store (pull, wait or hit)
    std::optional<double> mount_ms;       // image's files opened, mounted, container made
    std::optional<double> exec_ms;        // container ready to the first task's exec (Slurm's launch, task hooks)
    std::optional<double> total_ms;       // set-up start to the first task's exec
    std::optional<double> since_srun_ms;  // srun's start (its clock) to the first task's exec (this node's)
};

// One line of JSON, '\n' included; at most kMaxLineBytes (long names are cut).
std::string to_json_line(const StartRecord& record);
constexpr size_t kMaxLineBytes = 4000;  // < PIPE_BUF: one write() of it is never split
Result<StartRecord> parse_line(std::string_view line);

// The file of one node's record of one step: "JOB.STEP.NODE.json" (NODE: [A-Za-z0-9._-] kept, others '_').
std::string file_name(uint32_t job, uint32_t step, std::string_view node);

// Writes `record` into `dir` as a new file (file_name). Refused unless `dir` is reached without a
// symbolic link, is a directory owned by this process's effective user (root, in slurmstepd) and
// writable by nobody else; the file is created with O_CREAT|O_EXCL|O_NOFOLLOW, so an existing name
// (a symlink planted, a record already written) is never followed nor overwritten.
Status write_record(const std::string& dir, const StartRecord& record);

// Every record in `dir` of `job` (all jobs when empty), ordered by step then node. Lines that do not
// parse are skipped and counted in `skipped`.
Result<std::vector<StartRecord>> read_records(const std::string& dir, std::optional<uint32_t> job,
                                              size_t* skipped = nullptr);
// The job with the newest record in `dir`.
Result<uint32_t> latest_job(const std::string& dir);

// --- gantry stats -----------------------------------------------------------------------------------
// Percentiles by nearest rank (the value at rank ceil(p/100 * n) of the sorted values), as
// bench/rehearsal.sh computes its own.
double percentile(std::vector<double> values, int p);

struct PhaseSummary {
    std::string phase;  // "resolve", "pull", "mount", "exec", "total", "since srun"
    size_t nodes = 0;   // nodes that had the phase
    double p50 = 0, p99 = 0, max = 0;
};
// A straggler: a node whose total is more than `factor` x the step's median total and at least
// kStragglerMinMs over it (a fast step's few ms of noise name nobody); `worst` is its phase furthest
// over that phase's median.
constexpr double kStragglerMinMs = 500;
struct Straggler {
    std::string node;
    double total_ms = 0;
    std::string worst;
    double worst_ms = 0, worst_median_ms = 0;
};
struct StepSummary {
    uint32_t job = 0, step = 0;
    std::string image, digest;
    size_t pulled = 0, waited = 0, stored = 0, unknown = 0;
    std::vector<PhaseSummary> phases;
    std::vector<Straggler> stragglers;
};
std::vector<StepSummary> summarize(const std::vector<StartRecord>& records, double factor = 2.0);

}  // namespace gantry::telemetry
