// Pull progress on the terminal (see progress.hpp). Output goes to stderr so that stdout carries only
// the result line "<digest> <path>" for scripts.
#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "gantry/strings.hpp"

namespace gantry::cli {

ProgressPrinter::ProgressPrinter(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}

void ProgressPrinter::show(const PullProgress& p) {
    if (quiet_) return;
    using Phase = PullProgress::Phase;
    auto now = std::chrono::steady_clock::now();
    double secs = std::chrono::duration<double>(now - start_).count();
    double rate = secs > 0 ? static_cast<double>(p.bytes_done) / secs : 0;
    std::string text;
    switch (p.phase) {
        case Phase::resolving:
            text = "resolving";
            break;
        case Phase::waiting:
            text = "waiting for " + (p.note.empty() ? std::string("another producer") : p.note);
            break;
        case Phase::downloading:
            text = format_bytes(p.bytes_done) + " / " + format_bytes(p.bytes_total) + ", layers " +
                   std::to_string(p.layers_done) + "/" + std::to_string(p.layers_total) + ", " +
                   format_bytes(static_cast<unsigned long long>(rate)) + "/s";
            break;
        case Phase::publishing:
            text = "publishing";
            break;
        case Phase::done:
            return;
    }
    if (tty_) {
        int width = 30;
        int filled =
            p.bytes_total > 0
                ? static_cast<int>(width * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total))
                : 0;
        std::string bar(static_cast<size_t>(std::min(filled, width)), '=');
        bar.resize(static_cast<size_t>(width), ' ');
        std::fprintf(stderr, "\r\033[Kgantry: [%s] %s", bar.c_str(), text.c_str());
        drew_ = true;
    } else if (p.phase != last_phase_ || now - last_line_ >= std::chrono::seconds(5)) {
        std::fprintf(stderr, "gantry: %s\n", text.c_str());
        last_line_ = now;
    }
    last_phase_ = p.phase;
}

void ProgressPrinter::finish() {
    if (drew_) std::fputs("\r\033[K", stderr);
    drew_ = false;
}

}  // namespace gantry::cli
