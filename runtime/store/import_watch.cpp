// srun's view of a step's image import (include/gantry/import_watch.hpp): the producer, on whichever
// node it runs, records its progress in its lock file on the shared store; srun, on the login node,
// reads it read-only every few seconds and prints a line at most every `interval`.
#include "gantry/import_watch.hpp"

#include <cstdio>
#include <ctime>

#include "gantry/strings.hpp"

namespace gantry {

std::string format_import_progress(const std::string& image, const ProducerProgress& p, double rate) {
    std::string line = image + ": " + format_bytes(p.bytes_done);
    if (p.bytes_total > 0) {
        int percent = static_cast<int>(100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total));
        line += " / " + format_bytes(p.bytes_total) + " (" + std::to_string(std::min(percent, 100)) + "%)";
    }
    if (p.layers_total > 0)
        line += ", " + std::to_string(p.layers_done) + "/" + std::to_string(p.layers_total) + " layers";
    if (rate > 0) line += ", " + format_bytes(static_cast<unsigned long long>(rate)) + "/s";
    return line;
}

ImportWatch::ImportWatch(const std::string& store_root, const Config& config, std::string digest, std::string image,
                         std::chrono::seconds interval, std::function<void(const std::string&)> say)
    : digest_(std::move(digest)), image_(std::move(image)), interval_(interval), say_(std::move(say)) {
    // Read-only: srun runs as the user, and opening never creates or changes anything.
    auto store = ImageStore::open(store_root, false, config);
    if (!store || store->find(digest_)) return;
    thread_ = std::thread([this, s = std::move(*store)]() mutable { run(std::move(s)); });
}

ImportWatch::~ImportWatch() {
    stop();
}

void ImportWatch::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void ImportWatch::run(ImageStore store) {
    using clock = std::chrono::steady_clock;
    const auto poll = std::chrono::seconds(1);
    auto next_line = clock::now() + interval_;
    uint64_t last_bytes = 0;
    auto last_at = clock::now();
    bool have_last = false;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        wake_.wait_for(lock, poll, [this] { return stopping_; });
        if (stopping_) break;
        lock.unlock();
        bool published = store.find(digest_).has_value();
        std::optional<ProducerProgress> p;
        if (!published) p = store.producer_progress(digest_);
        auto now = clock::now();
        if (p && now >= next_line) {
            double rate = 0;
            if (have_last && p->bytes_done >= last_bytes) {
                double secs = std::chrono::duration<double>(now - last_at).count();
                if (secs > 0) rate = static_cast<double>(p->bytes_done - last_bytes) / secs;
            }
            say_("importing docker image: " + format_import_progress(image_, *p, rate));
            last_bytes = p->bytes_done;
            last_at = now;
            have_last = true;
            next_line = now + interval_;
        }
        lock.lock();
        if (published) break;
    }
}

}  // namespace gantry
