#pragma once
// Errors as values at boundaries (docs/style.md §17): loaders, config parsing and request admission
// return Status or Result<T>; the message names the file, tensor, field or request that is wrong.

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace dz {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // the caller's input is wrong (bad shape, bad JSON, bad config field)
  kNotFound,         // a file, tensor or field that must exist does not
  kCorrupt,          // a file is structurally broken (truncated, offsets out of range)
  kUnsupported,  // well-formed, but not something dayzero runs (unknown model_type, refused dtype)
  kIo,           // the operating system refused (open, mmap, read)
  kInternal,     // a broken invariant reported as a value
  kResourceExhausted,  // a bounded pool or queue is full (no free slot or block: the server's 503)
  kAlreadyExists,      // a name or id that must be new is taken (a request id in use)
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with where it happened: "model.safetensors: tensor \"x\": ...".
  Status with_context(std::string_view context) const&;
  Status with_context(std::string_view context) &&;

  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(state_);
  }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace dz

#define DZ_CONCAT_INNER(a, b) a##b
#define DZ_CONCAT(a, b) DZ_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is an error.
#define DZ_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::dz::Status dz_status_ = (expr);        \
    if (!dz_status_.ok()) return dz_status_; \
  } while (0)

// `DZ_ASSIGN_OR_RETURN(auto x, f())` binds the value of a Result or returns its Status.
#define DZ_ASSIGN_OR_RETURN(lhs, expr) \
  DZ_ASSIGN_OR_RETURN_IMPL(DZ_CONCAT(dz_result_, __LINE__), lhs, expr)
#define DZ_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
