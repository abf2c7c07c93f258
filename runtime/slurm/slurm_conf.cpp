// Reading slurm.conf and plugstack.conf as Slurm does (see include/gantry/slurm_conf.hpp).
#include "gantry/slurm_conf.hpp"

#include <glob.h>
#include <strings.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace gantry::slurm_conf {
namespace {

// Includes deeper than this are a loop (a file including itself); Slurm would recurse until it fails.
constexpr int kMaxIncludeDepth = 16;

std::optional<std::string> read_file(const std::string& path) {
    std::ifstream f(path);
    if (!f) return std::nullopt;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Every line, empty ones included (line numbers in messages must match the file).
std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(std::move(line));
    return out;
}

std::string dir_of(const std::string& path) {
    auto slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

// Slurm resolves a relative include against the directory of the file that names it.
std::string relative_to(const std::string& including_file, const std::string& path) {
    if (!path.empty() && path[0] == '/') return path;
    std::string dir = dir_of(including_file);
    return dir == "/" ? "/" + path : dir + "/" + path;
}

std::vector<std::string> glob_paths(const std::string& pattern) {
    std::vector<std::string> out;
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    return out;
}

bool is_include(const std::vector<std::string>& words) {
    return words.size() == 2 && ::strcasecmp(words[0].c_str(), "include") == 0;
}

std::optional<std::string> value_in(const std::string& file, std::string_view key, int depth) {
    if (depth > kMaxIncludeDepth) return std::nullopt;
    auto text = read_file(file);
    if (!text) return std::nullopt;
    std::optional<std::string> result;
    for (const auto& raw : lines_of(*text)) {
        auto words = line_words(raw);
        if (words.empty()) continue;
        if (is_include(words)) {
            for (const auto& inc : glob_paths(relative_to(file, words[1])))
                if (auto v = value_in(inc, key, depth + 1)) result = v;
            continue;
        }
        // slurm.conf lines may hold several KEY=VALUE pairs; PlugStackConfig is a plain one.
        for (const auto& w : words) {
            auto eq = w.find('=');
            if (eq == std::string::npos || eq != key.size()) continue;
            if (::strncasecmp(w.c_str(), std::string(key).c_str(), key.size()) == 0) result = w.substr(eq + 1);
        }
    }
    return result;
}

std::string file_name(const std::string& path) {
    auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

void scan(const std::string& file, std::string_view plugin_name, int depth, PlugstackScan& out) {
    if (out.found || depth > kMaxIncludeDepth) return;
    auto text = read_file(file);
    if (!text) {
        out.unreadable.push_back(file);
        return;
    }
    out.files.push_back(file);
    int number = 0;
    for (const auto& raw : lines_of(*text)) {
        ++number;
        auto words = line_words(raw);
        if (words.empty()) continue;
        if (is_include(words)) {
            std::string pattern = relative_to(file, words[1]);
            auto matches = glob_paths(pattern);
            if (matches.empty()) out.empty_globs.push_back(pattern);
            for (const auto& inc : matches) {
                scan(inc, plugin_name, depth + 1, out);
                if (out.found) return;
            }
            continue;
        }
        if (words.size() >= 2 && file_name(words[1]) == plugin_name) {
            out.found = PluginLine{file, number, words[0], words[1], {words.begin() + 2, words.end()}};
            return;
        }
    }
}

}  // namespace

std::string locate(const std::optional<std::string>& slurm_conf_env) {
    if (slurm_conf_env && !slurm_conf_env->empty()) return *slurm_conf_env;
    for (const char* path : kDefaultLocations)
        if (::access(path, F_OK) == 0) return path;
    return kDefaultLocations[0];
}

std::optional<std::string> value(const std::string& slurm_conf, std::string_view key) {
    return value_in(slurm_conf, key, 0);
}

std::string plugstack_path(const std::string& slurm_conf) {
    if (auto v = value(slurm_conf, "PlugStackConfig"); v && !v->empty()) return *v;
    return relative_to(slurm_conf, "plugstack.conf");
}

PlugstackScan find_plugin(const std::string& plugstack, std::string_view plugin_name) {
    PlugstackScan out;
    scan(plugstack, plugin_name, 0, out);
    return out;
}

std::vector<std::string> line_words(std::string_view line) {
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string> words;
    std::string word;
    for (char c : line) {
        if (std::isspace(static_cast<unsigned char>(c)) != 0) {
            if (!word.empty()) words.push_back(std::move(word));
            word.clear();
        } else {
            word += c;
        }
    }
    if (!word.empty()) words.push_back(std::move(word));
    return words;
}

std::optional<std::string> release_of(std::string_view version_output) {
    for (const auto& word : line_words(version_output)) {
        unsigned major = 0, minor = 0;
        if (std::sscanf(word.c_str(), "%u.%u", &major, &minor) == 2 && major < 100 && minor < 100) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "%02u.%02u", major, minor);
            return std::string(buf);
        }
    }
    return std::nullopt;
}

}  // namespace gantry::slurm_conf
