// Owner: runtime/store/. What srun shows while the nodes import a step's image: a progress line at most
// every `interval`, read from the producer's lock file in the store the nodes use (ProducerLock::
// record_progress), until the image is published or the watch is stopped.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "gantry/config.hpp"
#include "gantry/store.hpp"

namespace gantry {

// One progress line: "IMAGE: 1.2 GiB / 15.0 GiB (8%), 3/12 layers, 110.0 MiB/s". `rate` in bytes/s;
// 0 leaves it out.
std::string format_import_progress(const std::string& image, const ProducerProgress& p, double rate);

class ImportWatch {
public:
    // Watches `digest` in the store at `store_root` on a thread of its own; `say` gets each line
    // (without the "gantry: " prefix). Nothing is started when the image is already stored or the
    // store cannot be opened.
    ImportWatch(const std::string& store_root, const Config& config, std::string digest, std::string image,
                std::chrono::seconds interval, std::function<void(const std::string&)> say);
    ~ImportWatch();
    ImportWatch(const ImportWatch&) = delete;
    ImportWatch& operator=(const ImportWatch&) = delete;
    void stop();
    [[nodiscard]] bool running() const { return thread_.joinable(); }

private:
    void run(ImageStore store);

    std::string digest_, image_;
    std::chrono::seconds interval_;
    std::function<void(const std::string&)> say_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace gantry
