#include "dayzero/core/status.h"

namespace dz {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kIo: return "i/o error";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kAlreadyExists: return "already exists";
  }
  return "unknown";
}

Status Status::with_context(std::string_view context) const& {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

Status Status::with_context(std::string_view context) && {
  if (ok()) return std::move(*this);
  message_ = fmt::format("{}: {}", context, message_);
  return std::move(*this);
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{} ({})", message_, status_code_name(code_));
}

}  // namespace dz
