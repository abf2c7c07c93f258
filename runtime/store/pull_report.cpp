// The report of `gantry pull --report-fd` (see include/gantry/pull_report.hpp).
#include "gantry/pull_report.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <utility>

#include "gantry/digest.hpp"
#include "gantry/files.hpp"

namespace gantry {
namespace {

constexpr std::array<std::pair<PullErrorKind, std::string_view>, 5> kKinds{{
    {PullErrorKind::none, "none"},
    {PullErrorKind::reference, "reference"},
    {PullErrorKind::pull, "pull"},
    {PullErrorKind::store, "store"},
    {PullErrorKind::usage, "usage"},
}};

}  // namespace

std::string_view to_string(PullErrorKind kind) {
    for (const auto& [k, name] : kKinds)
        if (k == kind) return name;
    return "pull";
}

std::string encode_pull_report(const PullReport& r) {
    nlohmann::json j = {{"digest", r.digest},      {"squashfs", r.squashfs_path},
                        {"layers", r.layer_paths}, {"config", r.config_json},
                        {"outcome", r.outcome},    {"error", {{"kind", to_string(r.error)}, {"message", r.message}}}};
    // Replace invalid UTF-8 (a registry's error text) rather than throwing.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<PullReport> decode_pull_report(std::string_view text) {
    if (text.size() > kMaxPullReportBytes)
        return make_error("the pull's report is larger than " + std::to_string(kMaxPullReportBytes) + " bytes");
    if (text.empty()) return make_error("the pull ended without a report");
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error("the pull's report is not a JSON object");
    PullReport r;
    try {
        r.digest = j.value("digest", "");
        r.squashfs_path = j.value("squashfs", "");
        r.layer_paths = j.value("layers", std::vector<std::string>{});
        r.config_json = j.value("config", "");
        r.outcome = j.value("outcome", "");
        if (r.outcome != "pulled" && r.outcome != "waited" && r.outcome != "stored") r.outcome.clear();
        const auto& e = j.at("error");
        std::string kind = e.at("kind").get<std::string>();
        r.message = e.value("message", "");
        bool known = false;
        for (const auto& [k, name] : kKinds)
            if (name == kind) r.error = k, known = true;
        if (!known) return make_error("the pull's report has an unknown error kind '" + kind + "'");
    } catch (const nlohmann::json::exception&) {
        return make_error("the pull's report lacks its error field or has fields of the wrong type");
    }
    if (r.error == PullErrorKind::none && !validate_digest(r.digest))
        return make_error("the pull's report names no valid digest");
    if (r.error != PullErrorKind::none && r.message.empty()) r.message = "failed (no message)";
    return r;
}

void send_pull_report(int fd, const PullReport& report) {
    // Best effort: a reader that stopped reading has nothing to be told; it sees a short report.
    (void)write_all(fd, encode_pull_report(report), "sending the pull report");
    ::close(fd);
}

}  // namespace gantry
