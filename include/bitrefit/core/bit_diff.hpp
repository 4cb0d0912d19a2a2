// bitrefit/core/bit_diff.hpp — the one bitwise diff kernel: which elements' stored bits differ.
//
// for_each_changed(a, b, n, es, emit) calls emit(i) for every element i in [0, n) whose `es` bytes
// differ between a and b, in ascending order. Bits are compared, never values: -0.0 vs +0.0 and
// NaN payloads differ. Every change detector uses it — the codec's host backend (chunk encoding),
// the layout's change sets (delta build, conversions) and the owners' frozen change sets
// (durability/change_set.hpp) — so the hot loop exists once.
//
// How: 64-byte blocks are compared as eight 64-bit words and an equal block costs one branch (the
// common case at 1–5 % changes, so the pass runs at memory bandwidth, like memcmp); in a block that
// differs, each nonzero 64-bit XOR word is split into element lanes (per-lane "nonzero" bits by
// SWAR, no lane carries into the next) and set lanes are visited with count-trailing-zeros. On
// x86-64 with AVX2 a block is two 256-bit XORs and one vptest, and a differing block's per-element
// mask comes from one compare + movemask. Both paths visit the same elements in the same order.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <immintrin.h>
#define BITREFIT_BIT_DIFF_AVX2 1
#endif

#include "bitrefit/core/error.hpp"

namespace bitrefit {

namespace bit_diff_detail {

/// Per-lane "nonzero" flags of a 64-bit word split into lanes of ES bytes: the top bit of each
/// lane of the result is set iff that lane of x is nonzero (SWAR; no lane carries into the next).
template <std::size_t ES>
constexpr std::uint64_t nonzero_lanes(std::uint64_t x) noexcept {
  if constexpr (ES == 8) {
    return x ? 0x8000000000000000ull : 0;
  } else {
    constexpr std::uint64_t top = ES == 1 ? 0x8080808080808080ull : ES == 2 ? 0x8000800080008000ull : 0x8000000080000000ull;
    constexpr std::uint64_t low = ~top;
    return (((x & low) + low) | x) & top;
  }
}
static_assert(nonzero_lanes<2>(0x0000000100000000ull) == 0x0000800000000000ull);
static_assert(nonzero_lanes<1>(0x8000000000000001ull) == 0x8000000000000080ull);
static_assert(nonzero_lanes<4>(0x0000000080000000ull) == 0x0000000080000000ull);

inline std::uint64_t load64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

/// Elements [first, n) one by one (the tail shorter than a block).
template <std::size_t ES, class Emit>
void tail(const std::byte* a, const std::byte* b, std::size_t first, std::size_t n, Emit& emit) {
  for (std::size_t e = first; e < n; ++e)
    if (std::memcmp(a + e * ES, b + e * ES, ES) != 0) emit(e);
}

template <std::size_t ES, class Emit>
void portable(const std::byte* a, const std::byte* b, std::size_t n, Emit& emit) {
  const std::size_t bytes = n * ES;
  std::size_t off = 0;
  for (; off + 64 <= bytes; off += 64) {
    std::uint64_t x[8], any = 0;
    for (int k = 0; k < 8; ++k) any |= (x[k] = load64(a + off + 8 * k) ^ load64(b + off + 8 * k));
    if (!any) [[likely]] continue;
    for (int k = 0; k < 8; ++k)  // lanes in ascending order (little-endian)
      for (std::uint64_t m = nonzero_lanes<ES>(x[k]); m; m &= m - 1)
        emit((off + 8 * std::size_t(k)) / ES + static_cast<std::size_t>(std::countr_zero(m)) / (8 * ES));
  }
  tail<ES>(a, b, off / ES, n, emit);
}

#ifdef BITREFIT_BIT_DIFF_AVX2
template <std::size_t ES>
__attribute__((target("avx2"))) inline std::uint32_t changed_bytes_avx2(__m256i x) noexcept {
  const __m256i zero = _mm256_setzero_si256();
  __m256i eq;
  if constexpr (ES == 1) eq = _mm256_cmpeq_epi8(x, zero);
  else if constexpr (ES == 2) eq = _mm256_cmpeq_epi16(x, zero);
  else if constexpr (ES == 4) eq = _mm256_cmpeq_epi32(x, zero);
  else eq = _mm256_cmpeq_epi64(x, zero);
  return ~static_cast<std::uint32_t>(_mm256_movemask_epi8(eq));
}

template <std::size_t ES, class Emit>
__attribute__((target("avx2,bmi"))) void avx2(const std::byte* a, const std::byte* b, std::size_t n, Emit& emit) {
  // one bit per element in a 32-byte movemask
  constexpr std::uint32_t pick = ES == 1 ? 0xFFFFFFFFu : ES == 2 ? 0x55555555u : ES == 4 ? 0x11111111u : 0x01010101u;
  const std::size_t bytes = n * ES;
  std::size_t off = 0;
  for (; off + 64 <= bytes; off += 64) {
    const __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + off)),
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + off)));
    const __m256i x1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + off + 32)),
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + off + 32)));
    const __m256i any = _mm256_or_si256(x0, x1);
    if (_mm256_testz_si256(any, any)) continue;
    std::uint64_t bits = (std::uint64_t(changed_bytes_avx2<ES>(x1) & pick) << 32) | (changed_bytes_avx2<ES>(x0) & pick);
    for (; bits; bits &= bits - 1) emit((off + static_cast<std::size_t>(std::countr_zero(bits))) / ES);
  }
  tail<ES>(a, b, off / ES, n, emit);
}

inline bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
  return has;
}
#endif

template <std::size_t ES, class Emit>
void fixed(const std::byte* a, const std::byte* b, std::size_t n, Emit& emit) {
#ifdef BITREFIT_BIT_DIFF_AVX2
  if (cpu_has_avx2()) return avx2<ES>(a, b, n, emit);
#endif
  portable<ES>(a, b, n, emit);
}

}  // namespace bit_diff_detail

/// Calls emit(i) for every element i in [0, n) of `es` bytes whose stored bits differ between `a`
/// and `b`, in ascending order. @pre es is 1, 2, 4 or 8 (else errc::invalid_argument).
template <class Emit>
void for_each_changed(const std::byte* a, const std::byte* b, std::size_t n, std::size_t es, Emit&& emit) {
  switch (es) {
    case 1: return bit_diff_detail::fixed<1>(a, b, n, emit);
    case 2: return bit_diff_detail::fixed<2>(a, b, n, emit);
    case 4: return bit_diff_detail::fixed<4>(a, b, n, emit);
    case 8: return bit_diff_detail::fixed<8>(a, b, n, emit);
    default:
      throw error(errc::invalid_argument, "element size " + std::to_string(es) + " is not 1, 2, 4 or 8", {.file = {}, .tensor = {}, .field = "dtype"});
  }
}

/// How many elements differ (same kernel).
inline std::uint64_t count_changed(const std::byte* a, const std::byte* b, std::size_t n, std::size_t es) {
  std::uint64_t c = 0;
  for_each_changed(a, b, n, es, [&c](std::size_t) { ++c; });
  return c;
}

}  // namespace bitrefit
