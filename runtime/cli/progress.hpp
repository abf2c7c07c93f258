// Pull progress on the terminal: a redrawn bar on a TTY, occasional plain lines otherwise.
#pragma once

#include <chrono>

#include "gantry/pull.hpp"

namespace gantry::cli {

class ProgressPrinter {
public:
    explicit ProgressPrinter(bool quiet);
    void show(const PullProgress& p);
    void finish();

private:
    bool quiet_;
    bool tty_;
    bool drew_ = false;
    PullProgress::Phase last_phase_ = PullProgress::Phase::done;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last_line_{};
};

}  // namespace gantry::cli
