// Start-up telemetry (include/gantry/telemetry.hpp): the trace points remembered in memory, one
// node's record of a step as a JSON line, its safe write by root, and the summary `gantry stats` prints.
#include "gantry/telemetry.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "gantry/fd.hpp"
#include "gantry/files.hpp"
#include "gantry/trace.hpp"

namespace gantry::telemetry {
namespace {

struct Point {
    int64_t ns;
    std::string what;  // "NAME", or "NAME +" / "NAME -" for a phase
};
std::mutex g_points_mutex;
std::vector<Point> g_points;

void remember(long long ns, std::string_view what, std::string_view detail) {
    try {
        std::lock_guard<std::mutex> guard(g_points_mutex);
        if (g_points.size() >= kMaxPoints) return;
        std::string name(what.substr(0, 100));
        if (!detail.empty()) name.append(" ").append(detail.substr(0, 100));
        g_points.push_back({static_cast<int64_t>(ns), std::move(name)});
    } catch (...) {
        // Out of memory: the record only loses a point.
    }
}

int64_t clock_ns(clockid_t clock) {
    timespec ts{};
    ::clock_gettime(clock, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Names and references in a record are cut, so a line stays one write below PIPE_BUF.
std::string cut(std::string_view s, size_t max) {
    return std::string(s.substr(0, max));
}

const char* const kPhaseKeys[] = {"resolve_ms", "pull_ms", "mount_ms", "exec_ms", "total_ms", "since_srun_ms"};
std::optional<double> StartRecord::*const kPhaseFields[] = {&StartRecord::resolve_ms, &StartRecord::pull_ms,
                                                            &StartRecord::mount_ms,   &StartRecord::exec_ms,
                                                            &StartRecord::total_ms,   &StartRecord::since_srun_ms};
const char* const kPhaseNames[] = {"resolve", "pull", "mount", "exec", "total", "since srun"};

}  // namespace

void record() {
    trace::set_recorder(&remember);
}

std::optional<int64_t> first_point(std::string_view what) {
    std::lock_guard<std::mutex> guard(g_points_mutex);
    for (const auto& p : g_points)
        if (p.what == what) return p.ns;
    return std::nullopt;
}

std::optional<int64_t> last_point(std::string_view what) {
    std::lock_guard<std::mutex> guard(g_points_mutex);
    for (auto p = g_points.rbegin(); p != g_points.rend(); ++p)
        if (p->what == what) return p->ns;
    return std::nullopt;
}

int64_t monotonic_ns() {
    return clock_ns(CLOCK_MONOTONIC);
}
int64_t unix_ns_of(int64_t monotonic) {
    return monotonic + (clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC));
}

std::string_view to_string(ImageOutcome outcome) {
    switch (outcome) {
        case ImageOutcome::pulled:
            return "pulled";
        case ImageOutcome::waited:
            return "waited";
        case ImageOutcome::stored:
            return "stored";
        case ImageOutcome::unknown:
            break;
    }
    return "unknown";
}

ImageOutcome parse_outcome(std::string_view text) {
    for (auto o : {ImageOutcome::pulled, ImageOutcome::waited, ImageOutcome::stored})
        if (text == to_string(o)) return o;
    return ImageOutcome::unknown;
}

std::string to_json_line(const StartRecord& r) {
    nlohmann::ordered_json j = {{"job", r.job},
                                {"step", r.step},
                                {"node", cut(r.node, 256)},
                                {"user", cut(r.user, 64)},
                                {"uid", r.uid},
                                {"image", cut(r.image, 1024)},
                                {"digest", cut(r.digest, 100)},
                                {"image_from", to_string(r.outcome)},
                                {"start_unix_ms", r.start_unix_ms}};
    for (size_t i = 0; i < std::size(kPhaseKeys); ++i) {
        const auto& v = r.*kPhaseFields[i];
        // Whole microseconds: enough, and no float noise in the file.
        j[kPhaseKeys[i]] = v ? nlohmann::ordered_json(std::round(*v * 1000) / 1000) : nlohmann::ordered_json(nullptr);
    }
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<StartRecord> parse_line(std::string_view line) {
    if (line.size() > kMaxLineBytes)
        return make_error("a telemetry line longer than " + std::to_string(kMaxLineBytes) + " bytes");
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("a telemetry line that is not a JSON object");
    StartRecord r;
    try {
        r.job = j.at("job").get<uint32_t>();
        r.step = j.at("step").get<uint32_t>();
        r.node = j.at("node").get<std::string>();
        r.user = j.value("user", "");
        r.uid = j.value("uid", uid_t{0});
        r.image = j.value("image", "");
        r.digest = j.value("digest", "");
        r.outcome = parse_outcome(j.value("image_from", ""));
        r.start_unix_ms = j.value("start_unix_ms", int64_t{0});
        for (size_t i = 0; i < std::size(kPhaseKeys); ++i) {
            auto at = j.find(kPhaseKeys[i]);
            if (at != j.end() && at->is_number()) r.*kPhaseFields[i] = at->get<double>();
        }
    } catch (const nlohmann::json::exception&) {
        return make_error("a telemetry line without job, step and node, or with fields of the wrong type");
    }
    return r;
}

std::string file_name(uint32_t job, uint32_t step, std::string_view node) {
    std::string safe;
    for (char c : node.substr(0, 200))
        safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
    return std::to_string(job) + "." + std::to_string(step) + "." + safe + ".json";
}

Status write_record(const std::string& dir, const StartRecord& record) {
    if (dir.empty() || dir[0] != '/') return make_error("telemetry_dir '" + dir + "': not an absolute path");
    // Root writes here, in a directory on shared storage: why nobody can make it write elsewhere.
    // 1. The directory is reached without following any symbolic link (RESOLVE_NO_SYMLINKS), so no
    //    component of the path can be swapped for a link to /etc; where openat2 is missing, only the
    //    last component is checked (O_NOFOLLOW).
    open_how how{};
    how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_NO_SYMLINKS;
    UniqueFd dfd(openat2_retrying(AT_FDCWD, dir, how));
    if (!dfd && errno == ENOSYS) dfd.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dfd) return system_error("telemetry_dir " + dir + ": opening it without following symbolic links");
    // 2. Checked on the descriptor opened: ours (root's) and writable by nobody else, so no other
    //    user can have planted a name in it. A directory others may write (1777, group-writable: a
    //    misconfiguration) is refused, not written into.
    struct stat st {};
    if (::fstat(dfd.get(), &st) != 0) return system_error("telemetry_dir " + dir);
    if (!S_ISDIR(st.st_mode)) return make_error("telemetry_dir " + dir + ": not a directory");
    if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        return make_error("telemetry_dir " + dir + ": refused: it must be owned by uid " + std::to_string(::geteuid()) +
                          " and writable by nobody else (it is uid " + std::to_string(st.st_uid) + ", mode " +
                          [&] {
                              char m[8];
                              std::snprintf(m, sizeof m, "%04o", st.st_mode & 07777);
                              return std::string(m);
                          }() +
                          ")");
    // 3. A new file, relative to that descriptor: O_EXCL|O_NOFOLLOW never follow nor reuse an existing
    //    name (a planted symlink, a FIFO, a record already there), whatever made it.
    const std::string name = file_name(record.job, record.step, record.node);
    UniqueFd fd(::openat(dfd.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd) return system_error("telemetry_dir " + dir + ": creating " + name);
    // 4. One line, one write() below PIPE_BUF.
    const std::string line = to_json_line(record);
    return write_all(fd.get(), line, "writing " + dir + "/" + name);
}

Result<std::vector<StartRecord>> read_records(const std::string& dir, std::optional<uint32_t> job, size_t* skipped) {
    auto d = Directory::open(dir);
    if (!d) return d.error().wrap("telemetry_dir " + dir);
    auto names = list_directory(*d);
    if (!names) return names.error();
    const std::string prefix = job ? std::to_string(*job) + "." : "";
    std::vector<StartRecord> out;
    size_t bad = 0;
    for (const auto& name : *names) {
        if (name.size() < 5 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
        if (!prefix.empty() && name.compare(0, prefix.size(), prefix) != 0) continue;
        auto text = read_regular_at(*d, name, kMaxLineBytes + 1);
        auto r = text ? parse_line(*text) : Result<StartRecord>(text.error());
        if (!r || (job && r->job != *job)) {
            ++bad;
            continue;
        }
        out.push_back(std::move(*r));
    }
    std::sort(out.begin(), out.end(), [](const StartRecord& a, const StartRecord& b) {
        return std::tie(a.job, a.step, a.node) < std::tie(b.job, b.step, b.node);
    });
    if (skipped) *skipped = bad;
    return out;
}

Result<uint32_t> latest_job(const std::string& dir) {
    auto all = read_records(dir, std::nullopt);
    if (!all) return all.error();
    if (all->empty()) return make_error("no start-up records in " + dir);
    auto newest = std::max_element(all->begin(), all->end(), [](const StartRecord& a, const StartRecord& b) {
        return a.start_unix_ms < b.start_unix_ms;
    });
    return newest->job;
}

double percentile(std::vector<double> values, int p) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    size_t rank = (static_cast<size_t>(p) * values.size() + 99) / 100;  // ceil(p/100 * n)
    if (rank < 1) rank = 1;
    return values[std::min(rank, values.size()) - 1];
}

std::vector<StepSummary> summarize(const std::vector<StartRecord>& records, double factor) {
    std::map<std::pair<uint32_t, uint32_t>, std::vector<const StartRecord*>> steps;
    for (const auto& r : records) steps[{r.job, r.step}].push_back(&r);
    std::vector<StepSummary> out;
    for (const auto& [key, nodes] : steps) {
        StepSummary s;
        s.job = key.first;
        s.step = key.second;
        s.image = nodes.front()->image;
        s.digest = nodes.front()->digest;
        std::map<std::string, double> medians;
        for (size_t i = 0; i < std::size(kPhaseKeys); ++i) {
            std::vector<double> v;
            for (const auto* r : nodes)
                if (r->*kPhaseFields[i]) v.push_back(*(r->*kPhaseFields[i]));
            if (v.empty()) continue;
            PhaseSummary ph{kPhaseNames[i], v.size(), percentile(v, 50), percentile(v, 99),
                            *std::max_element(v.begin(), v.end())};
            medians[ph.phase] = ph.p50;
            s.phases.push_back(ph);
        }
        for (const auto* r : nodes) {
            switch (r->outcome) {
                case ImageOutcome::pulled:
                    ++s.pulled;
                    break;
                case ImageOutcome::waited:
                    ++s.waited;
                    break;
                case ImageOutcome::stored:
                    ++s.stored;
                    break;
                case ImageOutcome::unknown:
                    ++s.unknown;
                    break;
            }
            if (!r->total_ms || !medians.count("total")) continue;
            const double median = medians["total"];
            if (*r->total_ms <= factor * median || *r->total_ms < median + kStragglerMinMs) continue;
            Straggler st{r->node, *r->total_ms, {}, 0, 0};
            double over = -1;
            for (size_t i = 1; i < 4; ++i) {  // pull, mount, exec: the parts of total
                const auto& v = r->*kPhaseFields[i];
                if (!v || !medians.count(kPhaseNames[i])) continue;
                if (*v - medians[kPhaseNames[i]] > over) {
                    over = *v - medians[kPhaseNames[i]];
                    st.worst = kPhaseNames[i];
                    st.worst_ms = *v;
                    st.worst_median_ms = medians[kPhaseNames[i]];
                }
            }
            s.stragglers.push_back(st);
        }
        std::sort(s.stragglers.begin(), s.stragglers.end(),
                  [](const Straggler& a, const Straggler& b) { return a.total_ms > b.total_ms; });
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace gantry::telemetry
