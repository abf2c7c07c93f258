// Shared by the libFuzzer targets: the input as text, and an invariant check that crashes loudly
// (libFuzzer records a crash with the input that caused it; a failed check is a bug like any other).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace gantry::fuzz {

inline std::string_view text_of(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

[[noreturn]] inline void invariant_failed(const char* what, const char* file, int line) {
    std::fprintf(stderr, "%s:%d: invariant broken: %s\n", file, line, what);
    std::abort();
}

}  // namespace gantry::fuzz

#define FUZZ_CHECK(cond) ((cond) ? (void)0 : ::gantry::fuzz::invariant_failed(#cond, __FILE__, __LINE__))
