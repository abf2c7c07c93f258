// `gantry stats [JOBID]`: the start-up telemetry of a job's steps (include/gantry/telemetry.hpp), per
// phase p50/p99/max across its nodes, and the nodes that started late (stragglers).
#include <cstdio>
#include <memory>
#include <string>

#include "command.hpp"
#include "common.hpp"
#include "gantry/telemetry.hpp"

namespace gantry::cli {
namespace {

struct StatsArgs {
    std::string job;
    std::string dir;
    double factor = 2.0;
    bool nodes = false;
    CLI::Option* job_opt = nullptr;
    CLI::Option* dir_opt = nullptr;
};

std::string ms_or_dash(const std::optional<double>& v) {
    if (!v) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", *v);
    return buf;
}

int stats_verb(const StatsArgs& a) {
    std::string dir = a.dir;
    if (a.dir_opt == nullptr || a.dir_opt->count() == 0) {
        auto config = load_config();
        if (!config) return fail(config.error());
        dir = config->telemetry_dir;
        if (dir.empty())
            return fail(make_error("stats: no telemetry_dir in " +
                                   (config->source.empty() ? std::string("gantry.conf") : config->source) +
                                   " (start-up telemetry is off); set it, or give --dir DIR"));
    }
    std::optional<uint32_t> job;
    if (a.job_opt != nullptr && a.job_opt->count() > 0) {
        char* end = nullptr;
        unsigned long v = std::strtoul(a.job.c_str(), &end, 10);
        if (a.job.empty() || *end != '\0' || v == 0 || v > 0xffffffffUL)
            return usage_error(make_error("stats: JOBID must be a Slurm job id (a number), got '" + a.job + "'"));
        job = static_cast<uint32_t>(v);
    } else {
        auto latest = telemetry::latest_job(dir);
        if (!latest) return fail(latest.error().wrap("stats"));
        job = *latest;
    }
    size_t skipped = 0;
    auto records = telemetry::read_records(dir, job, &skipped);
    if (!records) return fail(records.error().wrap("stats"));
    if (records->empty())
        return fail(make_error("stats: no start-up records of job " + std::to_string(*job) + " in " + dir));

    for (const auto& s : telemetry::summarize(*records, a.factor)) {
        size_t n = s.pulled + s.waited + s.stored + s.unknown;
        std::printf("job %u step %u: %s (%s) on %zu node%s; image pulled on %zu, waited for on %zu, stored on %zu%s\n",
                    s.job, s.step, s.image.c_str(), s.digest.empty() ? "no digest" : s.digest.c_str(), n,
                    n == 1 ? "" : "s", s.pulled, s.waited, s.stored,
                    s.unknown ? (", unknown on " + std::to_string(s.unknown)).c_str() : "");
        std::printf("  %-12s %6s %10s %10s %10s\n", "phase (ms)", "nodes", "p50", "p99", "max");
        for (const auto& p : s.phases)
            std::printf("  %-12s %6zu %10.0f %10.0f %10.0f\n", p.phase.c_str(), p.nodes, p.p50, p.p99, p.max);
        if (s.stragglers.empty()) {
            std::printf("  stragglers (total > %gx the median and > median + %.0f ms): none\n", a.factor,
                        telemetry::kStragglerMinMs);
        } else {
            std::printf("  stragglers (total > %gx the median and > median + %.0f ms): %zu\n", a.factor,
                        telemetry::kStragglerMinMs, s.stragglers.size());
            for (const auto& st : s.stragglers)
                std::printf("    %s total %.0f ms; most over its median: %s %.0f ms (median %.0f)\n", st.node.c_str(),
                            st.total_ms, st.worst.empty() ? "-" : st.worst.c_str(), st.worst_ms, st.worst_median_ms);
        }
        if (a.nodes) {
            std::printf("  %-20s %-7s %8s %8s %8s %8s %8s %10s\n", "node", "image", "resolve", "pull", "mount", "exec",
                        "total", "since srun");
            for (const auto& r : *records)
                if (r.job == s.job && r.step == s.step)
                    std::printf("  %-20s %-7s %8s %8s %8s %8s %8s %10s\n", r.node.c_str(),
                                std::string(telemetry::to_string(r.outcome)).c_str(), ms_or_dash(r.resolve_ms).c_str(),
                                ms_or_dash(r.pull_ms).c_str(), ms_or_dash(r.mount_ms).c_str(),
                                ms_or_dash(r.exec_ms).c_str(), ms_or_dash(r.total_ms).c_str(),
                                ms_or_dash(r.since_srun_ms).c_str());
        }
    }
    if (skipped > 0)
        std::printf("(%zu file%s in %s could not be read as records and were skipped)\n", skipped,
                    skipped == 1 ? "" : "s", dir.c_str());
    return 0;
}

VerbRunner define_stats(CLI::App& app) {
    auto a = std::make_shared<StatsArgs>();
    a->job_opt = app.add_option("JOBID", a->job, "the job (default: the one with the newest record)");
    a->dir_opt = app.add_option("--dir", a->dir, "the records' directory (default: gantry.conf's telemetry_dir)")
                     ->type_name("DIR");
    app.add_option("--factor", a->factor, "a straggler's total is over FACTOR x the median (default 2)")
        ->type_name("FACTOR")
        ->check(CLI::Range(1.0, 1000.0));
    app.add_flag("--nodes", a->nodes, "also print each node's record");
    return {[a] { return stats_verb(*a); }, {}};
}

const Registration stats_registration(
    {{"stats", "stats [JOBID]            start-up telemetry: p50/p99 per phase across nodes, stragglers",
      "[--dir DIR] [--factor FACTOR] [--nodes] [JOBID]",
      "Reads the start-up records the nodes wrote into gantry.conf's telemetry_dir (one per node and step: "
      "resolve, pull or hit, mount, first exec) and prints, per step of the job, each phase's p50, p99 and "
      "max across the nodes, and the stragglers: nodes whose total is over FACTOR x the step's median and "
      "at least 500 ms over it, with the phase that made them late.",
      "exit status: 0 printed, 1 no records or an unreadable directory, 2 a usage error\n"},
     define_stats});

}  // namespace
}  // namespace gantry::cli
