// Per-task wiring for MPI and PyTorch: the PMIx MCA names Enroot's Slurm hook maps, and the
// torch.distributed rendezvous variables derived from Slurm's own (so `python train.py` under srun
// needs no wrapper script that calls `scontrol show hostnames`). Pure functions of the environment.
#include <unistd.h>

#include <cctype>
#include <cstdlib>

#include "gantry/strings.hpp"
#include "internal.hpp"

namespace gantry {
namespace {

// Splits at commas outside brackets: "a[1,2],b" -> "a[1,2]", "b".
std::vector<std::string> top_level_items(const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    int depth = 0;
    for (char c : s) {
        if (c == '[') ++depth;
        if (c == ']') --depth;
        if (c == ',' && depth == 0) {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

bool digits(const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(const std::string& expr) {
    std::vector<std::string> out;
    for (const auto& item : top_level_items(trim(expr))) {
        auto open = item.find('[');
        if (open == std::string::npos) {
            if (item.find(']') != std::string::npos) return make_error("hostlist '" + expr + "': unbalanced ']'");
            out.push_back(item);
            continue;
        }
        auto close = item.find(']', open);
        if (close == std::string::npos) return make_error("hostlist '" + expr + "': unbalanced '['");
        std::string prefix = item.substr(0, open);
        auto rest = expand_hostlist(item.substr(close + 1));
        if (!rest) return rest.error();
        if (rest->empty()) rest->push_back("");
        for (const auto& range : split_list(item.substr(open + 1, close - open - 1), ',')) {
            auto dash = range.find('-');
            std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
            if (!digits(lo) || !digits(hi)) return make_error("hostlist '" + expr + "': bad range '" + range + "'");
            unsigned long a = std::stoul(lo), b = std::stoul(hi);
            if (b < a || b - a > 100000) return make_error("hostlist '" + expr + "': bad range '" + range + "'");
            for (unsigned long n = a; n <= b; ++n) {
                std::string num = std::to_string(n);
                // Slurm keeps the lower bound's width: node[08-10] -> node08 node09 node10.
                if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');
                for (const auto& r : *rest) out.push_back(prefix + num + r);
            }
        }
    }
    return out;
}

std::optional<unsigned> tasks_on_node(const std::string& tasks_per_node, unsigned node_index) {
    unsigned node = 0;
    for (const auto& group : split_list(tasks_per_node, ',')) {
        auto paren = group.find("(x");
        std::string count = group.substr(0, paren);
        std::string times = paren == std::string::npos ? "1" : group.substr(paren + 2, group.find(')') - paren - 2);
        if (!digits(count) || !digits(times)) return std::nullopt;
        unsigned c = static_cast<unsigned>(std::stoul(count)), t = static_cast<unsigned>(std::stoul(times));
        if (node_index < node + t) return c;
        node += t;
    }
    return std::nullopt;
}

unsigned master_port(unsigned long jobid) {
    return 61000 + static_cast<unsigned>(jobid % 4536);
}

std::vector<std::string> task_environment(const Config& config, const std::vector<std::string>& image_env,
                                          const std::vector<std::string>& task_env) {
    using devices::env_value;
    std::vector<std::string> out;
    if (config.pmix) {
        // Slurm's PMIx server announces its choices under these names; PMIx clients inside read the
        // MCA forms (the same mapping Enroot's Slurm hook does).
        for (auto [from, to] : {std::pair{"PMIX_PTL_MODULE", "PMIX_MCA_ptl"},
                                {"PMIX_SECURITY_MODE", "PMIX_MCA_psec"},
                                {"PMIX_GDS_MODULE", "PMIX_MCA_gds"}}) {
            auto v = env_value(task_env, from);
            if (!v || env_value(task_env, to)) continue;
            // The shared-memory dstores (ds12, ds21) live in the server's PMIX_SERVER_TMPDIR. The
            // plugin binds its parent (the slurmd spool directory) because Slurm creates it after
            // the container; when the task (called after joining) still cannot reach it, the clients
            // are told to use the hash store, which works over the server connection alone.
            std::string value = *v;
            auto tmpdir = env_value(task_env, "PMIX_SERVER_TMPDIR");
            if (std::string(from) == "PMIX_GDS_MODULE" && tmpdir && ::access(tmpdir->c_str(), X_OK) != 0)
                value = "hash";
            out.push_back(std::string(to) + "=" + value);
        }
    }
    auto ask = env_value(task_env, "GANTRY_PYTORCH");
    bool pytorch = config.pytorch && (ask ? *ask == "1" : env_value(image_env, "PYTORCH_VERSION").has_value());
    if (pytorch) {
        auto nodes = env_value(task_env, "SLURM_STEP_NODELIST");
        if (!nodes) nodes = env_value(task_env, "SLURM_JOB_NODELIST");
        if (nodes) {
            auto hosts = expand_hostlist(*nodes);
            if (hosts && !hosts->empty()) out.push_back("MASTER_ADDR=" + hosts->front());
        }
        if (auto job = env_value(task_env, "SLURM_JOB_ID"); job && digits(*job))
            out.push_back("MASTER_PORT=" + std::to_string(master_port(std::stoul(*job))));
        auto ntasks = env_value(task_env, "SLURM_STEP_NUM_TASKS");
        if (!ntasks) ntasks = env_value(task_env, "SLURM_NTASKS");
        if (ntasks) out.push_back("WORLD_SIZE=" + *ntasks);
        if (auto v = env_value(task_env, "SLURM_PROCID")) out.push_back("RANK=" + *v);
        if (auto v = env_value(task_env, "SLURM_LOCALID")) out.push_back("LOCAL_RANK=" + *v);
        auto node = env_value(task_env, "SLURM_NODEID");
        if (node) out.push_back("NODE_RANK=" + *node);
        auto per_node = env_value(task_env, "SLURM_STEP_TASKS_PER_NODE");
        if (!per_node) per_node = env_value(task_env, "SLURM_TASKS_PER_NODE");
        if (per_node && node && digits(*node))
            if (auto n = tasks_on_node(*per_node, static_cast<unsigned>(std::stoul(*node))))
                out.push_back("LOCAL_WORLD_SIZE=" + std::to_string(*n));
    }
    return out;
}

}  // namespace gantry
