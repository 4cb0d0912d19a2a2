// bitrefit/codec/host_backend.hpp — the reference execution backend: plain C++ on host memory.
//
// Change detection compares 64-byte blocks as eight 64-bit words and skips equal blocks with one
// branch (the common case for sparse deltas); inside a block that differs, nonzero lanes of each
// XOR word are found with count-trailing-zeros, so the work per unchanged element is a fraction
// of a word compare and the pass is bound by memory bandwidth, like memcmp. Detection and value
// gathering are fused so each byte of old and new is read exactly once.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BITREFIT_CODEC_X86_AVX2 1
#endif

#include "bitrefit/codec/base_classes.hpp"
#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit::codec {

namespace detail {

template <class T>
inline T load_lane(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Scans [0, m) elements of width sizeof(T); emits changed positions (and optionally XOR / new
// values). WantXor / WantNew are template parameters so the hot loop has no per-element branch.
template <class T, bool WantXor, bool WantNew>
std::size_t collect_lanes(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                          std::byte* xo, std::byte* no) noexcept {
  constexpr std::size_t E = sizeof(T);
  constexpr unsigned lane_bits = 8 * E;
  constexpr std::uint64_t lane_mask = E == 8 ? ~0ull : ((1ull << lane_bits) - 1);
  const std::size_t nbytes = m * E;
  std::size_t c = 0;
  std::size_t i = 0;

  auto emit_word = [&](std::uint64_t x, std::size_t byte_off) {
    // little-endian: lane j of the word is element byte_off/E + j
    const std::size_t e0 = byte_off / E;
    if constexpr (E == 8) {
      pos[c] = static_cast<std::uint32_t>(e0);
      if constexpr (WantXor) std::memcpy(xo + c * E, &x, E);
      if constexpr (WantNew) std::memcpy(no + c * E, b + byte_off, E);
      ++c;
    } else {
      while (x) {
        const unsigned lane = static_cast<unsigned>(std::countr_zero(x)) / lane_bits;
        const std::uint64_t lx = (x >> (lane * lane_bits)) & lane_mask;
        pos[c] = static_cast<std::uint32_t>(e0 + lane);
        if constexpr (WantXor) {
          const T t = static_cast<T>(lx);
          std::memcpy(xo + c * E, &t, E);
        }
        if constexpr (WantNew) std::memcpy(no + c * E, b + byte_off + lane * E, E);
        ++c;
        x &= ~(lane_mask << (lane * lane_bits));
      }
    }
  };

  for (; i + 64 <= nbytes; i += 64) {
    std::uint64_t wa[8], wb[8];
    std::memcpy(wa, a + i, 64);
    std::memcpy(wb, b + i, 64);
    std::uint64_t any = 0;
    for (int k = 0; k < 8; ++k) any |= wa[k] ^ wb[k];
    if (!any) [[likely]] continue;
    for (int k = 0; k < 8; ++k) {
      const std::uint64_t x = wa[k] ^ wb[k];
      if (x) emit_word(x, i + 8 * static_cast<std::size_t>(k));
    }
  }
  for (; i + 8 <= nbytes; i += 8) {
    const std::uint64_t x = load_lane<std::uint64_t>(a + i) ^ load_lane<std::uint64_t>(b + i);
    if (x) emit_word(x, i);
  }
  for (; i < nbytes; i += E) {  // fewer than 8 bytes left: whole elements (E < 8 here)
    const T x = static_cast<T>(load_lane<T>(a + i) ^ load_lane<T>(b + i));
    if (x) {
      pos[c] = static_cast<std::uint32_t>(i / E);
      if constexpr (WantXor) std::memcpy(xo + c * E, &x, E);
      if constexpr (WantNew) std::memcpy(no + c * E, b + i, E);
      ++c;
    }
  }
  return c;
}

#ifdef BITREFIT_CODEC_X86_AVX2
// AVX2 variant: 64-byte blocks compared with two 256-bit XORs and one vptest; in a block that
// differs, a per-element "changed" bit mask comes from cmpeq at the element width + movemask, and
// set bits are visited with count-trailing-zeros. Same outputs as collect_lanes, bit for bit.
template <std::size_t E>
__attribute__((target("avx2"))) inline std::uint32_t changed_mask_avx2(__m256i x) noexcept {
  const __m256i zero = _mm256_setzero_si256();
  __m256i eq;
  if constexpr (E == 1) eq = _mm256_cmpeq_epi8(x, zero);
  else if constexpr (E == 2) eq = _mm256_cmpeq_epi16(x, zero);
  else if constexpr (E == 4) eq = _mm256_cmpeq_epi32(x, zero);
  else eq = _mm256_cmpeq_epi64(x, zero);
  return ~static_cast<std::uint32_t>(_mm256_movemask_epi8(eq));
}

template <class T, bool WantXor, bool WantNew>
__attribute__((target("avx2,bmi"))) std::size_t collect_avx2(const std::byte* a, const std::byte* b, std::size_t m,
                                                             std::uint32_t* pos, std::byte* xo, std::byte* no) noexcept {
  constexpr std::size_t E = sizeof(T);
  // one bit per element in a movemask of 32 bytes
  constexpr std::uint32_t pick = E == 1 ? 0xFFFFFFFFu : E == 2 ? 0x55555555u : E == 4 ? 0x11111111u : 0x01010101u;
  const std::size_t nbytes = m * E;
  std::size_t c = 0, i = 0;
  auto emit = [&](std::uint64_t bits, std::size_t byte_off) {
    while (bits) {
      const std::size_t off = byte_off + static_cast<std::size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      pos[c] = static_cast<std::uint32_t>(off / E);
      if constexpr (WantXor) {
        const T x = static_cast<T>(load_lane<T>(a + off) ^ load_lane<T>(b + off));
        std::memcpy(xo + c * E, &x, E);
      }
      if constexpr (WantNew) std::memcpy(no + c * E, b + off, E);
      ++c;
    }
  };
  for (; i + 64 <= nbytes; i += 64) {
    const __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)),
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    const __m256i x1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 32)),
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 32)));
    const __m256i any = _mm256_or_si256(x0, x1);
    if (_mm256_testz_si256(any, any)) continue;
    emit((static_cast<std::uint64_t>(changed_mask_avx2<E>(x1) & pick) << 32) | (changed_mask_avx2<E>(x0) & pick), i);
  }
  // tail: fewer than 64 bytes, element by element
  for (; i < nbytes; i += E) {
    const T x = static_cast<T>(load_lane<T>(a + i) ^ load_lane<T>(b + i));
    if (x) {
      pos[c] = static_cast<std::uint32_t>(i / E);
      if constexpr (WantXor) std::memcpy(xo + c * E, &x, E);
      if constexpr (WantNew) std::memcpy(no + c * E, b + i, E);
      ++c;
    }
  }
  return c;
}

inline bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
  return has;
}

// AVX-512 variant for 2- and 4-byte elements, without a data-dependent branch: per 64-byte block,
// the changed lanes' mask (vptestm of old ^ new), then positions, XOR words and new values are
// compressed (vpcompress) into registers and stored whole at the output cursor, which advances by
// the mask's popcount. The stores of a block reach at most the block's own slots of the outputs
// (c <= elements before the block), so they never pass m. At AdamW-like rates half the 32-element
// blocks change, at random: the branchy variants above mispredict on every second block.
template <class T, bool WantXor, bool WantNew>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi2,bmi,popcnt"))) std::size_t collect_avx512(
    const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos, std::byte* xo, std::byte* no) noexcept {
  constexpr std::size_t E = sizeof(T);
  static_assert(E == 2 || E == 4);
  constexpr std::size_t L = 64 / E;  // lanes per block
  const std::size_t nbytes = m * E;
  std::size_t c = 0, i = 0;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i + 64 <= nbytes; i += 64) {
    const __m512i va = _mm512_loadu_si512(a + i), vb = _mm512_loadu_si512(b + i);
    const __m512i x = _mm512_xor_si512(va, vb);
    const __m512i idx = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(i / E)));
    if constexpr (E == 2) {
      const __mmask32 mk = _mm512_test_epi16_mask(x, x);
      const __mmask16 lo = static_cast<__mmask16>(mk), hi = static_cast<__mmask16>(mk >> 16);
      const unsigned nlo = static_cast<unsigned>(__builtin_popcount(lo)), n = static_cast<unsigned>(__builtin_popcount(mk));
      _mm512_storeu_si512(pos + c, _mm512_maskz_compress_epi32(lo, idx));
      _mm512_storeu_si512(pos + c + nlo, _mm512_maskz_compress_epi32(hi, _mm512_add_epi32(idx, _mm512_set1_epi32(16))));
      if constexpr (WantXor) _mm512_storeu_si512(xo + c * E, _mm512_maskz_compress_epi16(mk, x));
      if constexpr (WantNew) _mm512_storeu_si512(no + c * E, _mm512_maskz_compress_epi16(mk, vb));
      c += n;
    } else {
      const __mmask16 mk = _mm512_test_epi32_mask(x, x);
      _mm512_storeu_si512(pos + c, _mm512_maskz_compress_epi32(mk, idx));
      if constexpr (WantXor) _mm512_storeu_si512(xo + c * E, _mm512_maskz_compress_epi32(mk, x));
      if constexpr (WantNew) _mm512_storeu_si512(no + c * E, _mm512_maskz_compress_epi32(mk, vb));
      c += static_cast<unsigned>(__builtin_popcount(mk));
    }
    (void)L;
  }
  for (; i < nbytes; i += E) {  // tail: fewer than 64 bytes, element by element
    const T x = static_cast<T>(load_lane<T>(a + i) ^ load_lane<T>(b + i));
    if (x) {
      pos[c] = static_cast<std::uint32_t>(i / E);
      if constexpr (WantXor) std::memcpy(xo + c * E, &x, E);
      if constexpr (WantNew) std::memcpy(no + c * E, b + i, E);
      ++c;
    }
  }
  return c;
}

inline bool cpu_has_avx512_compress() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi2");
  return has;
}
#endif

template <class T, bool WantXor, bool WantNew>
std::size_t collect_dispatch(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                             std::byte* xo, std::byte* no) noexcept {
#ifdef BITREFIT_CODEC_X86_AVX2
  if constexpr (sizeof(T) == 2 || sizeof(T) == 4)
    if (cpu_has_avx512_compress()) return collect_avx512<T, WantXor, WantNew>(a, b, m, pos, xo, no);
  if (cpu_has_avx2()) return collect_avx2<T, WantXor, WantNew>(a, b, m, pos, xo, no);
#endif
  return collect_lanes<T, WantXor, WantNew>(a, b, m, pos, xo, no);
}

template <class T>
std::size_t collect_typed(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                          std::byte* xo, std::byte* no) noexcept {
  if (xo && no) return collect_dispatch<T, true, true>(a, b, m, pos, xo, no);
  if (xo) return collect_dispatch<T, true, false>(a, b, m, pos, xo, no);
  if (no) return collect_dispatch<T, false, true>(a, b, m, pos, xo, no);
  return collect_dispatch<T, false, false>(a, b, m, pos, xo, no);
}

template <class T>
void apply_typed(std::byte* t, value_mode mode, const std::uint32_t* pos, std::size_t c,
                 const std::byte* v) noexcept {
  constexpr std::size_t E = sizeof(T);
  if (mode == value_mode::overwrite) {
    for (std::size_t k = 0; k < c; ++k) std::memcpy(t + std::size_t{pos[k]} * E, v + k * E, E);
  } else {
    for (std::size_t k = 0; k < c; ++k) {
      std::byte* p = t + std::size_t{pos[k]} * E;
      const T x = static_cast<T>(load_lane<T>(p) ^ load_lane<T>(v + k * E));
      std::memcpy(p, &x, E);
    }
  }
}

}  // namespace detail

/// Reference backend on host memory, single-threaded (callers parallelise across chunks).
struct host_backend {
  static constexpr std::string_view name() noexcept { return "host"; }

  std::size_t collect_changes(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E,
                              std::span<std::uint32_t> positions, std::span<std::byte> xor_out,
                              std::span<std::byte> new_out) {
    check_element_size(E);
    if (old.size() != neu.size() || old.size() % E != 0)
      throw error(errc::invalid_argument, "collect_changes: old and new must be equal whole-element spans");
    const std::size_t m = old.size() / E;
    if (m >= (1ull << 32)) throw error(errc::invalid_argument, "collect_changes: chunk must hold < 2^32 elements");
    if (positions.size() < m || (!xor_out.empty() && xor_out.size() < m * E) ||
        (!new_out.empty() && new_out.size() < m * E))
      throw error(errc::invalid_argument, "collect_changes: output spans smaller than the chunk");
    std::byte* xo = xor_out.empty() ? nullptr : xor_out.data();
    std::byte* no = new_out.empty() ? nullptr : new_out.data();
    switch (E) {
      case 1: return detail::collect_typed<std::uint8_t>(old.data(), neu.data(), m, positions.data(), xo, no);
      case 2: return detail::collect_typed<std::uint16_t>(old.data(), neu.data(), m, positions.data(), xo, no);
      case 4: return detail::collect_typed<std::uint32_t>(old.data(), neu.data(), m, positions.data(), xo, no);
      default: return detail::collect_typed<std::uint64_t>(old.data(), neu.data(), m, positions.data(), xo, no);
    }
  }

  void apply_changes(std::span<std::byte> target, std::size_t E, value_mode mode,
                     std::span<const std::uint32_t> positions, std::span<const std::byte> values) {
    check_element_size(E);
    if (values.size() != positions.size() * E)
      throw error(errc::invalid_argument, "apply_changes: values must hold one element per position");
    switch (E) {
      case 1: return detail::apply_typed<std::uint8_t>(target.data(), mode, positions.data(), positions.size(), values.data());
      case 2: return detail::apply_typed<std::uint16_t>(target.data(), mode, positions.data(), positions.size(), values.data());
      case 4: return detail::apply_typed<std::uint32_t>(target.data(), mode, positions.data(), positions.size(), values.data());
      default: return detail::apply_typed<std::uint64_t>(target.data(), mode, positions.data(), positions.size(), values.data());
    }
  }

  std::span<const std::byte> host_bytes(std::span<const std::byte> bytes, byte_buffer&) const noexcept { return bytes; }

  void rank_by_class(std::span<const std::byte> base, const float_format& f, const class_spec& spec,
                     std::span<const std::uint32_t> positions, std::span<std::uint8_t> classes_out,
                     std::span<std::uint32_t> ranks_out, std::span<std::uint64_t> totals) {
    codec::rank_by_class(base, f, spec, positions, classes_out, ranks_out, totals);
  }

  void hash_slices(std::span<const std::byte> bytes, std::size_t slice_bytes, std::span<digest128> out) {
    if (slice_bytes == 0) throw error(errc::invalid_argument, "hash_slices: slice size must be positive");
    const std::size_t n = (bytes.size() + slice_bytes - 1) / slice_bytes;
    if (out.size() != n) throw error(errc::invalid_argument, "hash_slices: one output digest per slice");
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t off = j * slice_bytes;
      out[j] = xxh3_128(bytes.subspan(off, std::min(slice_bytes, bytes.size() - off)));
    }
  }

 private:
  static void check_element_size(std::size_t E) {
    if (E != 1 && E != 2 && E != 4 && E != 8)
      throw error(errc::invalid_argument, "element size must be 1, 2, 4 or 8 bytes");
  }
};

static_assert(execution_backend<host_backend>);

}  // namespace bitrefit::codec
