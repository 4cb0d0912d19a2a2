// bitrefit/core/error.hpp — the one exception type of the library.
//
// Every failure on bad input names what was wrong and where: the file (or object key), the tensor
// and the field. Callers branch on `code()`; humans read `what()`.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace bitrefit {

enum class errc {
  invalid_argument,  // a caller broke a documented precondition
  io,                // the operating system refused a read, write, rename, ...
  format,            // bytes that do not parse (safetensors header, frame, manifest, JSON)
  integrity,         // a digest or size check failed (corruption, truncation)
  mismatch,          // well-formed input that does not fit (wrong base, other tensor set, shape)
  protocol,          // a message that breaks the refit protocol
  fenced,            // a write from a fenced epoch or an older incarnation
  unsupported,       // a format version, dtype or mode this build does not implement
};

constexpr std::string_view errc_name(errc c) noexcept {
  switch (c) {
    case errc::invalid_argument: return "invalid argument";
    case errc::io: return "I/O error";
    case errc::format: return "format error";
    case errc::integrity: return "integrity error";
    case errc::mismatch: return "mismatch";
    case errc::protocol: return "protocol error";
    case errc::fenced: return "fenced";
    case errc::unsupported: return "unsupported";
  }
  return "error";
}

/// Where an error happened. Empty fields are omitted from the message.
struct error_context {
  std::string file;    // file path or object key
  std::string tensor;  // canonical tensor name
  std::string field;   // header field, frame field, option name, ...
};

class error : public std::runtime_error {
 public:
  error(errc code, std::string message, error_context where = {})
      : std::runtime_error(format(code, message, where)),
        code_(code),
        message_(std::move(message)),
        where_(std::move(where)) {}

  errc code() const noexcept { return code_; }
  /// The bare description, without the location prefix.
  const std::string& message() const noexcept { return message_; }
  const error_context& where() const noexcept { return where_; }

 private:
  static std::string format(errc code, const std::string& message, const error_context& w) {
    std::string s{errc_name(code)};
    if (!w.file.empty()) s += " in file '" + w.file + "'";
    if (!w.tensor.empty()) s += " at tensor '" + w.tensor + "'";
    if (!w.field.empty()) s += " field '" + w.field + "'";
    s += ": ";
    s += message;
    return s;
  }

  errc code_;
  std::string message_;
  error_context where_;
};

}  // namespace bitrefit
