// Diagnostics sink shared by the CLI and the plugin.
#include "gantry/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "gantry/environment.hpp"

namespace gantry::log {
namespace {

std::mutex g_mutex;

Level initial_level() {
    const std::string& d = environment().gantry_debug.value;
    return (!d.empty() && d[0] != '0') ? Level::debug : Level::info;
}

Level g_level = initial_level();

void stderr_sink(Level lvl, const std::string& message) {
    const char* tag = lvl == Level::warning ? "warning: " : "";
    std::fprintf(stderr, "gantry: %s%s\n", tag, message.c_str());
}

Sink g_sink = stderr_sink;

void emit(Level lvl, const std::string& message) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (static_cast<int>(lvl) <= static_cast<int>(g_level)) g_sink(lvl, message);
}

}  // namespace

void set_level(Level lvl) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_level = lvl;
}
Level level() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_level;
}
void set_sink(Sink sink) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_sink = sink ? std::move(sink) : Sink(stderr_sink);
}
void error(const std::string& m) {
    emit(Level::error, m);
}
void warning(const std::string& m) {
    emit(Level::warning, m);
}
void info(const std::string& m) {
    emit(Level::info, m);
}
void debug(const std::string& m) {
    emit(Level::debug, m);
}

}  // namespace gantry::log
