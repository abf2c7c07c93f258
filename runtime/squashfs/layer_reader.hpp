// Reading one layer blob as a stream of tar entries: the blob is decompressed here (gzip with ISA-L's
// igzip where it was built in, else zlib; zstd with libzstd; or plain), every uncompressed byte goes through SHA-256
// for the diff_id check, and the raw tar is handed to libarchive with no libarchive filter. Decompressing ourselves is
// what lets one pass both verify the diff_id and parse the tar. Decompression and hashing run on a thread of their own,
// a bounded queue of chunks ahead of the tar parser, so that they overlap the merge and the squashfs writer instead of
// taking turns with them on one core.
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gantry/digest.hpp"
#include "gantry/fd.hpp"
#include "gantry/result.hpp"

namespace gantry::squashfs {

enum class LayerCompression { plain, gzip, zstd };

// From the OCI/Docker media type; nullopt-like `detect` when the type says nothing we know.
enum class MediaTypeHint { plain, gzip, zstd, unknown };
MediaTypeHint compression_from_media_type(const std::string& media_type);

class LayerReader {
public:
    // `hash`: feed the uncompressed bytes through SHA-256 (off for the second pass that re-reads a
    // hard-link target, whose layer was verified already). `max_bytes`: the decoder stops with an
    // error (and over_limit() true) rather than produce more uncompressed bytes than this, so a
    // decompression bomb costs no more than the limit, also in the padding after the tar's end.
    static Result<std::unique_ptr<LayerReader>> open(const std::string& path, const std::string& media_type, bool hash,
                                                     uint64_t max_bytes = UINT64_MAX);
    ~LayerReader();
    LayerReader(const LayerReader&) = delete;
    LayerReader& operator=(const LayerReader&) = delete;

    // The next tar header: true with `entry` set, false at the end of the archive.
    Result<bool> next(archive_entry** entry);
    // The current entry's data, in pieces; size 0 at the end. `offset` jumps over holes of sparse files.
    Result<bool> data_block(const void** buf, size_t* size, int64_t* offset);
    // Reads the rest of the blob (tar padding after the end-of-archive blocks) so that the digest covers
    // every byte, then returns "sha256:<hex>" of the uncompressed stream.
    Result<std::string> finish();

    [[nodiscard]] uint64_t uncompressed_bytes() const { return uncompressed_; }
    // The stream went on past `max_bytes`: whatever error the reader returned comes from that.
    [[nodiscard]] bool over_limit() const { return over_limit_; }
    [[nodiscard]] LayerCompression compression() const { return compression_; }

private:
    LayerReader() = default;
    Status init_decoder();
    Status open_archive();  // the libarchive side, on the first next()
    // Decompresses the next piece of tar straight into `dst` (at most `cap` bytes, so the decoder
    // thread fills queue chunks without a copy); size 0 at the end of the stream.
    Result<size_t> produce(unsigned char* dst, size_t cap);
    Result<size_t> inflate_gzip(unsigned char* dst, size_t cap);
    Result<size_t> fill_input();
    Error archive_failure(const char* what);

    static la_ssize_t read_callback(struct archive* a, void* self, const void** buffer);

    // The decoder thread: produce() into chunks, pushed to `ready_`; stops at the end, on an error
    // (kept in `decode_error_`) or when `stop_` is set by the destructor.
    void decode_loop();
    void start_decoder();
    void stop_decoder();
    // The next uncompressed chunk for the tar parser (held in `current_`); size 0 at the end.
    Result<size_t> next_chunk(const void** out);

    std::thread decoder_;
    std::mutex m_;
    std::condition_variable cv_;
    // A piece of uncompressed tar; the buffer is allocated once, uninitialised, and reused.
    struct Chunk {
        std::unique_ptr<unsigned char[]> data;
        size_t size = 0;
    };
    std::deque<Chunk> ready_, spare_;
    Chunk current_;
    bool decode_done_ = false, stop_ = false;
    std::optional<Error> decode_error_;

    std::string path_;
    UniqueFd fd_;
    LayerCompression compression_ = LayerCompression::plain;
    bool hash_ = true;
    Sha256 sha_;
    uint64_t uncompressed_ = 0;
    uint64_t max_bytes_ = UINT64_MAX;
    std::atomic<bool> over_limit_{false};  // set by the decoder thread

    std::vector<unsigned char> in_;
    size_t in_pos_ = 0, in_len_ = 0;
    bool in_eof_ = false, stream_end_ = false, decoder_pending_ = false;

    struct Decoder;
    std::unique_ptr<Decoder> dec_;
    struct archive* ar_ = nullptr;
    std::string pending_error_;  // why the read callback failed, for the message
};

}  // namespace gantry::squashfs
