// Value errors for the whole library: every fallible call returns Result<T>, never throws across a
// C boundary (SPANK callbacks, libcurl/libsquashfs callbacks). An Error carries the operation, the
// object it was applied to and, where the cause was a system call, the errno.
#pragma once

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace gantry {

struct Error {
    std::string message;  // "what I was doing, on what: why", without the "gantry: " prefix
    int errnum = 0;       // errno of the failing system call, 0 when not a system error
    // The registry's HTTP status when it answered with an error (404: it has no such manifest or blob),
    // 0 otherwise. Lets a caller tell a final answer from a failed transfer without reading the text.
    int http_status = 0;

    // Adds the caller's context in front: wrap("pulling ubuntu") -> "pulling ubuntu: <message>".
    [[nodiscard]] Error wrap(const std::string& context) const {
        return Error{context + ": " + message, errnum, http_status};
    }
};

// An error from errno after a failing system call: "<what>: <strerror(errno)>".
inline Error system_error(const std::string& what, int err = errno) {
    return Error{what + ": " + std::strerror(err), err, 0};
}

inline Error make_error(std::string message) {
    return Error{std::move(message), 0, 0};
}

// A minimal expected<T, Error> (std::expected is C++23; Debian 12's g++ 12 lacks it).
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit by design
    Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

    [[nodiscard]] bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & { return std::get<0>(v_); }
    const T& value() const& { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

    [[nodiscard]] const Error& error() const { return std::get<1>(v_); }

private:
    std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
public:
    Result() = default;
    Result(Error error) : e_(std::move(error)) {}  // NOLINT

    [[nodiscard]] bool ok() const { return !e_.has_value(); }
    explicit operator bool() const { return ok(); }
    [[nodiscard]] const Error& error() const { return *e_; }

private:
    std::optional<Error> e_;
};

using Status = Result<void>;

}  // namespace gantry

// Early return of a failed Result, adding no context. For use in functions returning any Result.
#define GANTRY_TRY(expr)                                       \
    do {                                                       \
        auto&& gantry_try_r_ = (expr);                         \
        if (!gantry_try_r_.ok()) return gantry_try_r_.error(); \
    } while (0)
