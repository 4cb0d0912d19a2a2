// bitrefit/core/digest.hpp — the 128-bit digest value type (XXH3-128 results).
//
// Only the value lives here (core/ has no dependencies); computing digests is codec/'s job.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "bitrefit/core/fields.hpp"

namespace bitrefit {

struct digest128 {
  std::uint64_t low64 = 0;   // XXH128_hash_t::low64
  std::uint64_t high64 = 0;  // XXH128_hash_t::high64

  friend constexpr bool operator==(const digest128&, const digest128&) = default;
  friend constexpr auto operator<=>(const digest128&, const digest128&) = default;

  /// 32 lowercase hex digits, high word first (the canonical XXH128 spelling).
  std::string to_hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(32, '0');
    for (int i = 0; i < 16; ++i) {
      s[15 - i] = digits[(high64 >> (4 * i)) & 0xF];
      s[31 - i] = digits[(low64 >> (4 * i)) & 0xF];
    }
    return s;
  }

  /// Law: from_hex(d.to_hex()) == d. Returns nullopt for anything but 32 hex digits.
  static std::optional<digest128> from_hex(std::string_view s) {
    if (s.size() != 32) return std::nullopt;
    digest128 d;
    for (std::size_t i = 0; i < 32; ++i) {
      char c = s[i];
      std::uint64_t v;
      if (c >= '0' && c <= '9') v = static_cast<std::uint64_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v = static_cast<std::uint64_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v = static_cast<std::uint64_t>(c - 'A' + 10);
      else return std::nullopt;
      std::uint64_t& w = i < 16 ? d.high64 : d.low64;
      w = (w << 4) | v;
    }
    return d;
  }
};

BITREFIT_FIELDS(digest128, low64, high64)

}  // namespace bitrefit

template <>
struct std::hash<bitrefit::digest128> {
  std::size_t operator()(const bitrefit::digest128& d) const noexcept {
    return static_cast<std::size_t>(d.low64 ^ (d.high64 * 0x9E3779B97F4A7C15ull));
  }
};
