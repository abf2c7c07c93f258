// Parallel, resumable, verified blob downloads: fetch_blobs runs max_connections worker threads,
// each with its own keep-alive connection, taking blobs in list order. A blob streams into
// dir/<hex>.partial while it is hashed, is checked against its size and sha256, and only then
// renamed to dir/<hex>. Threads rather than one curl multi handle: hashing (the CPU cost of a pull)
// and disk writes then run in parallel, and retry/resume logic stays straight-line code per blob.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/fd.hpp"
#include "gantry/log.hpp"
#include "gantry/strings.hpp"
#include "registry/client.hpp"

namespace gantry {
namespace {

constexpr size_t kWriteChunk = 1 << 20;  // bytes gathered per pwrite of a downloading blob

Status write_all(int fd, const char* data, size_t size, uint64_t offset) {
    while (size > 0) {
        ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            return system_error("write");
        }
        data += n;
        size -= static_cast<size_t>(n);
        offset += static_cast<uint64_t>(n);
    }
    return {};
}

// Hashes the first `size` bytes of fd (a .partial left by an earlier run).
Status hash_prefix(int fd, uint64_t size, Sha256& hash) {
    std::vector<char> buf(1 << 20);
    uint64_t done = 0;
    while (done < size) {
        size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - done));
        ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? system_error("read") : make_error("unexpected end of file");
        hash.update(buf.data(), static_cast<size_t>(n));
        done += static_cast<uint64_t>(n);
    }
    return {};
}

// "bytes 100-199/200" -> 100
std::optional<uint64_t> content_range_start(const std::string& v) {
    auto sp = v.find(' ');
    if (sp == std::string::npos) return std::nullopt;
    char* end = nullptr;
    unsigned long long n = std::strtoull(v.c_str() + sp + 1, &end, 10);
    if (end == v.c_str() + sp + 1 || *end != '-') return std::nullopt;
    return static_cast<uint64_t>(n);
}

}  // namespace

void BlobProgress::add(int64_t delta) {
    bytes.fetch_add(static_cast<uint64_t>(delta));
    if (!report) return;
    std::lock_guard<std::mutex> lock(report_mutex);
    report(bytes.load());
}

Status RegistryClient::Impl::fetch_blob(net::Connection& conn, const ImageReference& ref, const Descriptor& blob,
                                        const std::string& dir, BlobProgress& progress, const std::atomic<bool>* stop) {
    const std::string what = "fetching blob " + blob.digest + " from " + ref.registry + "/" + ref.repository;
    const std::string final_path = dir + "/" + digest_hex(blob.digest);
    const std::string partial = final_path + ".partial";

    // A complete blob left by an earlier producer was verified before it got its name, but it was
    // never synced (see below), so a crash may have left wrong bytes under a right name: hash it again.
    struct stat st {};
    if (::stat(final_path.c_str(), &st) == 0) {
        if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == blob.size) {
            UniqueFd existing(::open(final_path.c_str(), O_RDONLY | O_CLOEXEC));
            Sha256 check;
            if (existing && hash_prefix(existing.get(), blob.size, check) && check.finish() == blob.digest) {
                progress.add(static_cast<int64_t>(blob.size));
                return {};
            }
        }
        log::warning(final_path + " is not the complete blob (" + std::to_string(st.st_size) + " of " +
                     std::to_string(blob.size) + " bytes, or wrong content); downloading it again");
        if (::unlink(final_path.c_str()) != 0) return system_error(what + ": removing " + final_path);
    }

    UniqueFd fd(::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) return system_error(what + ": opening " + partial);
    Sha256 hash;
    uint64_t offset = 0;  // bytes received, hashed and (once flushed) on disk
    // Received bytes are gathered before they are written: the transport hands them over in pieces
    // of ~16 KiB, and one pwrite each made the downloads spend more time in system calls than in
    // hashing. Invariant: written + pending.size() == offset.
    std::vector<char> pending;
    pending.reserve(kWriteChunk);
    uint64_t written = 0;
    auto flush = [&]() -> Status {
        if (pending.empty()) return {};
        if (auto w = write_all(fd.get(), pending.data(), pending.size(), written); !w)
            return w.error().wrap(what + ": writing " + partial);
        written += pending.size();
        pending.clear();
        return {};
    };
    auto restart = [&]() -> Status {
        pending.clear();
        written = 0;
        if (::ftruncate(fd.get(), 0) != 0) return system_error(what + ": truncating " + partial);
        hash = Sha256();
        progress.add(-static_cast<int64_t>(offset));
        offset = 0;
        return {};
    };
    // Resume what an earlier, interrupted run left: its bytes are hashed again, not trusted.
    bool resumed_from_disk = false;
    if (::fstat(fd.get(), &st) != 0) return system_error(what + ": examining " + partial);
    if (static_cast<uint64_t>(st.st_size) > blob.size) {
        GANTRY_TRY(restart());
    } else if (st.st_size > 0) {
        if (auto h = hash_prefix(fd.get(), static_cast<uint64_t>(st.st_size), hash); !h)
            return h.error().wrap(what + ": reading " + partial);
        offset = written = static_cast<uint64_t>(st.st_size);
        resumed_from_disk = true;
        progress.add(static_cast<int64_t>(offset));
        log::debug(what + ": resuming at byte " + std::to_string(offset));
    }

    for (int attempt = 1;;) {
        if (offset < blob.size) {
            const uint64_t start = offset;
            std::optional<Error> fatal;  // stops at once: no retry
            bool start_over = false;     // the server ignored or botched our Range: from byte 0 next time
            net::Request req;
            req.url = repository_url(ref) + "/blobs/" + blob.digest;
            if (start > 0) req.headers.push_back("Range: bytes=" + std::to_string(start) + "-");
            req.cancel = options.cancel;
            req.stop = stop;
            req.sink = [&](const net::Response& head, const char* data, size_t n) -> bool {
                if (data == nullptr) {
                    if (head.status == 206) {
                        auto from = content_range_start(head.header("content-range"));
                        if (!from || *from != start) {
                            start_over = true;
                            return false;
                        }
                    } else if (start > 0) {  // a 200 to a Range request: the whole blob comes again
                        if (auto r = restart(); !r) {
                            fatal = r.error();
                            return false;
                        }
                    }
                    return true;
                }
                if (offset + n > blob.size) {
                    fatal = make_error(what + ": the registry sent more than the " + std::to_string(blob.size) +
                                       " bytes the manifest says");
                    return false;
                }
                pending.insert(pending.end(), data, data + n);
                if (pending.size() >= kWriteChunk) {
                    if (auto w = flush(); !w) {
                        fatal = w.error();
                        return false;
                    }
                }
                hash.update(data, n);
                offset += n;
                progress.add(static_cast<int64_t>(n));
                return true;
            };
            auto resp = send(conn, ref, req);
            // Whatever arrived before a failure is good (it was hashed): on disk with it, for the retry.
            if (!fatal) {
                if (auto w = flush(); !w) fatal = w.error();
            }
            if (!resp) return resp.error().wrap(what);
            if (fatal) {
                ::unlink(partial.c_str());
                return *fatal;
            }
            if (resp->cancelled) return make_error(what + ": cancelled");

            std::optional<Error> retry_reason;
            if (start_over || resp->status == 416) {
                GANTRY_TRY(restart());
                retry_reason = make_error(what + ": the registry did not honour the Range request");
            } else if (resp->curl_code == 0 && resp->status >= 200 && resp->status < 300) {
                if (offset < blob.size)
                    retry_reason = make_error(what + ": connection closed after " + std::to_string(offset) + " of " +
                                              std::to_string(blob.size) + " bytes");
            } else if (retryable(*resp)) {
                retry_reason = failure(what, *resp);
            } else {
                return failure(what, *resp);
            }
            if (retry_reason) {
                if (attempt >= options.max_attempts)
                    return make_error(retry_reason->message + " (gave up after " + std::to_string(attempt) +
                                      " attempts)");
                log::debug(retry_reason->message + "; retrying from byte " + std::to_string(offset));
                if (!backoff(attempt, *resp, stop)) return make_error(what + ": cancelled");
                ++attempt;
                continue;
            }
        }

        // All bytes are here: the digest decides.
        std::string got = hash.finish();
        if (got != blob.digest) {
            if (resumed_from_disk) {
                // The earlier run's bytes may be what is wrong: one more try from scratch.
                log::warning(what + ": the resumed download does not match its digest; downloading it again");
                resumed_from_disk = false;
                GANTRY_TRY(restart());
                continue;
            }
            ::unlink(partial.c_str());
            return make_error(what + ": content does not match its digest (got " + got +
                              "); the registry served corrupt data");
        }
        // No fdatasync: a blob only lives in the staging area until the image is published (the
        // squashfs is synced then), and a later producer re-hashes any blob it finds (above). Syncing
        // here would make every pull wait for the disk to take GBs that are deleted seconds later.
        if (::rename(partial.c_str(), final_path.c_str()) != 0)
            return system_error(what + ": renaming " + partial + " to " + final_path);
        return {};
    }
}

Status RegistryClient::fetch_blobs(const ImageReference& ref, const std::vector<Descriptor>& blobs,
                                   const std::string& dir, const std::function<void(size_t index)>& on_done) {
    GANTRY_TRY(impl_->settings_status);
    const std::string what = "fetching the layers of " + ref.str();
    for (const auto& b : blobs)
        if (auto v = validate_digest(b.digest); !v) return v.error().wrap(what);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return system_error(what + ": " + dir);
    if (!S_ISDIR(st.st_mode)) return make_error(what + ": " + dir + " is not a directory");

    // An image may list one blob twice (e.g. two identical empty layers): download it once, since two
    // workers must never write the same .partial.
    std::vector<size_t> unique;
    std::vector<std::vector<size_t>> users;
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < blobs.size(); ++i) {
        auto [it, fresh] = seen.emplace(blobs[i].digest, unique.size());
        if (fresh) {
            unique.push_back(i);
            users.emplace_back();
        }
        users[it->second].push_back(i);
    }

    // Early refusal, before a byte is downloaded: compressed layers (gzip and zstd add a fraction of a
    // percent at worst) cannot be larger than the tars the converter would then refuse, so declared
    // sizes beyond max_image_bytes would only fill the store's staging area for nothing. The converter
    // counts the real, uncompressed bytes; the download itself never writes more than a declared size.
    const uint64_t max_image_bytes = impl_->config.limits.max_image_bytes;
    uint64_t declared = 0;  // saturates: a hostile manifest may declare sizes near 2^64
    const Descriptor* largest = nullptr;
    for (size_t j : unique) {
        const Descriptor& b = blobs[j];
        declared = b.size > UINT64_MAX - declared ? UINT64_MAX : declared + b.size;
        if (largest == nullptr || b.size > largest->size) largest = &b;
    }
    if (largest != nullptr && declared > max_image_bytes)
        return make_error(what + ": the manifest declares " + format_bytes(declared) + " of compressed layers (" +
                          largest->digest + ": " + format_bytes(largest->size) + "), more than max_image_bytes = " +
                          std::to_string(max_image_bytes) + " (" + format_bytes(max_image_bytes) +
                          ") allows uncompressed; raise max_image_bytes in gantry.conf if the image is genuine");

    BlobProgress progress;
    progress.report = impl_->options.on_progress;
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex error_mutex;
    std::optional<Error> first_error;
    std::mutex done_mutex;
    auto fail = [&](Error e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::move(e);
        stop = true;
    };
    auto worker = [&]() noexcept {
        try {
            auto conn = impl_->lease();
            while (!stop && !impl_->cancelled()) {
                size_t j = next.fetch_add(1);
                if (j >= unique.size()) break;
                auto st = impl_->fetch_blob(*conn, ref, blobs[unique[j]], dir, progress, &stop);
                if (!st) {
                    fail(st.error());
                    break;
                }
                if (on_done) {
                    std::lock_guard<std::mutex> lock(done_mutex);
                    for (size_t i : users[j]) on_done(i);
                }
            }
        } catch (const std::exception& e) {
            fail(make_error(what + ": " + e.what()));
        } catch (...) {
            fail(make_error(what + ": unexpected exception"));
        }
    };

    size_t n = std::min<size_t>(static_cast<size_t>(max_connections()), unique.size());
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n; ++t) {
        try {
            threads.emplace_back(worker);
        } catch (const std::exception& e) {
            log::warning(what + ": could only start " + std::to_string(t) + " download threads: " + e.what());
            break;
        }
    }
    if (n > 0) worker();  // the calling thread is one of the workers
    for (auto& t : threads) t.join();

    if (first_error) return *first_error;
    if (impl_->cancelled()) return make_error(what + ": cancelled");
    return {};
}

}  // namespace gantry
