// bitrefit/codec/fixed_log2.hpp — integer log2 and entropy costs for the codec's size estimates.
//
// Why integers: the codec never does floating-point arithmetic (DESIGN: codec), and its choices
// (which coding, which classes) must be the same on every platform so a re-encoded chunk has the
// same bytes. log2 is computed in fixed point with 32 fractional bits: a 4096-entry table of
// log2(1 + i/4096) (built once at startup by exact integer squaring) and linear interpolation over
// the next 20 bits (error below 2^-24 bits, far under what any decision here needs).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <span>

namespace bitrefit::codec {

namespace detail {

// log2(x) for x in [1, 2) given as Q32 (x = 2^32 .. 2^33-1), by repeated squaring: each squaring
// doubles the logarithm; a result >= 2 contributes the next binary digit. Exact up to truncation.
inline std::uint64_t log2_mantissa_q32(std::uint64_t x) noexcept {
  std::uint64_t r = 0;
  for (int b = 0; b < 32; ++b) {
    x = static_cast<std::uint64_t>((static_cast<unsigned __int128>(x) * x) >> 32);
    r <<= 1;
    if (x >= (std::uint64_t{2} << 32)) x >>= 1, r |= 1;
  }
  return r;
}

inline const std::array<std::uint64_t, 4097>& log2_table() noexcept {
  static const std::array<std::uint64_t, 4097> t = [] {
    std::array<std::uint64_t, 4097> a{};
    for (std::uint64_t i = 0; i < 4096; ++i) a[i] = log2_mantissa_q32((4096 + i) << 20);
    a[4096] = std::uint64_t{1} << 32;  // log2(2) = 1.0 (interpolation end point)
    return a;
  }();
  return t;
}

}  // namespace detail

/// log2(v) in Q32 (v >= 1; log2(0) is returned as 0).
inline std::uint64_t log2_q32(std::uint64_t v) noexcept {
  if (v <= 1) return 0;
  const unsigned w = static_cast<unsigned>(std::bit_width(v)) - 1;
  // 32 bits of mantissa below the leading one
  const std::uint64_t frac = w >= 32 ? (v >> (w - 32)) & 0xFFFFFFFFull : (v << (32 - w)) & 0xFFFFFFFFull;
  const auto& t = detail::log2_table();
  const std::uint64_t i = frac >> 20, rest = frac & 0xFFFFF;
  const std::uint64_t a = t[i], b = t[i + 1];
  return (std::uint64_t{w} << 32) + a + (((b - a) * rest) >> 20);
}

/// Bits (in 1/256 bit units) of an ideal code of `count` events of probability `f / total`:
/// count * log2(total / f). @pre 0 < f <= total.
inline std::uint64_t cost_q8(std::uint64_t count, std::uint64_t f, std::uint64_t total) noexcept {
  const std::uint64_t d = log2_q32(total) - log2_q32(f);
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(count) * d) >> 24);
}

/// n·H(c/n) in 1/256 bits: the ideal cost of marking c of n elements as changed.
inline std::uint64_t binary_entropy_q8(std::uint64_t n, std::uint64_t c) noexcept {
  if (c == 0 || c >= n) return 0;
  return cost_q8(c, c, n) + cost_q8(n - c, n - c, n);
}

/// Empirical entropy of a histogram in 1/256 bits: sum over symbols of count * log2(total / count).
inline std::uint64_t histogram_entropy_q8(std::span<const std::uint64_t> h) noexcept {
  std::uint64_t total = 0;
  for (auto v : h) total += v;
  std::uint64_t bits = 0;
  for (auto v : h)
    if (v) bits += cost_q8(v, v, total);
  return bits;
}

}  // namespace bitrefit::codec
