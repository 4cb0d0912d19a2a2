// bitrefit_proofs/cli_values.hpp — the values of the proofs tools' key=value arguments
// (check_protocol, bitrefit-fuzz-protocol), read strictly.
//
// A proof run is only worth its bounds: `crashes=one` must stop the run with a message, not check
// a world with 0 crashes (what strtoul made of it), and `schedules=1e6` must not run 1 schedule.
// So a value is read whole (no sign, no spaces, nothing after it), in range, or refused, and the
// refusal names the argument as the user wrote it.
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace bitrefit::proofs::cli {

/// `v` as a whole decimal number of type T (an unsigned type: a minus sign is refused), or nullopt.
template <std::unsigned_integral T>
std::optional<T> whole_number(std::string_view v) {
  T x{};
  const char* end = v.data() + v.size();
  const auto [p, ec] = std::from_chars(v.data(), end, x);
  if (v.empty() || ec != std::errc{} || p != end) return std::nullopt;
  return x;
}

/// `v` as a finite decimal number of at least 0 (e.g. seconds), or nullopt.
inline std::optional<double> nonnegative_number(std::string_view v) {
  double x = 0;
  const char* end = v.data() + v.size();
  const auto [p, ec] = std::from_chars(v.data(), end, x);
  if (v.empty() || ec != std::errc{} || p != end || !std::isfinite(x) || x < 0) return std::nullopt;
  return x;
}

/// Reads the value of one `key=value` argument as the caller's key wants it. Each accessor returns
/// the value, or a neutral one and notes a refusal ("<tool>: <argument>: expected ..."): the caller
/// checks refusal() once per argument and stops with exit status 2.
class value_reader {
 public:
  value_reader(std::string tool, std::string argument, std::string_view value)
      : tool_(std::move(tool)), argument_(std::move(argument)), value_(value) {}

  template <std::unsigned_integral T = std::uint32_t>
  T count() {
    if (auto x = whole_number<T>(value_)) return *x;
    refuse("expected a whole number from 0 to " + std::to_string(std::numeric_limits<T>::max()));
    return 0;
  }
  bool flag() {
    if (value_ != "0" && value_ != "1") refuse("expected 0 or 1");
    return value_ == "1";
  }
  double seconds() {
    if (auto x = nonnegative_number(value_)) return *x;
    refuse("expected seconds, a number of at least 0");
    return 0;
  }
  double probability() {
    if (auto x = nonnegative_number(value_); x && *x <= 1) return *x;
    refuse("expected a probability from 0 to 1");
    return 0;
  }
  /// For values with a form of their own (a choice, a range): refuses with `expected`.
  void refuse(const std::string& expected) {
    if (!refusal_) refusal_ = tool_ + ": " + argument_ + ": " + expected;
  }
  const std::optional<std::string>& refusal() const noexcept { return refusal_; }

 private:
  std::string tool_, argument_;
  std::string_view value_;
  std::optional<std::string> refusal_;
};

}  // namespace bitrefit::proofs::cli
