// bitrefit/codec/host_backend.hpp — the reference execution backend: plain C++ on host memory.
//
// Change detection is the one diff kernel (core/bit_diff.hpp: 64-byte blocks, one branch per equal
// block, AVX2 where the CPU has it), so the pass is bound by memory bandwidth, like memcmp; the
// values of the few changed elements are gathered as they are found (or, for base-conditioned
// items, read back by position afterwards: chunk_encoder::encode_piece).
#pragma once

#include <algorithm>
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
#include "bitrefit/codec/isa.hpp"
#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/core/bit_diff.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit::codec {

namespace detail {

template <class T>
inline T load_lane(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Scans [0, m) elements of width sizeof(T) with the one diff kernel (core/bit_diff.hpp: portable
// and AVX2 paths) and emits changed positions (and optionally XOR / new values). WantXor / WantNew
// are template parameters so the per-change work has no branch.
template <class T, bool WantXor, bool WantNew>
std::size_t collect_kernel(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos, std::byte* xo,
                             std::byte* no) {
  constexpr std::size_t E = sizeof(T);
  std::size_t c = 0;
  for_each_changed(a, b, m, E, [&](std::size_t i) {
    pos[c] = static_cast<std::uint32_t>(i);
    if constexpr (WantXor) {
      const T x = static_cast<T>(load_lane<T>(a + i * E) ^ load_lane<T>(b + i * E));
      std::memcpy(xo + c * E, &x, E);
    }
    if constexpr (WantNew) std::memcpy(no + c * E, b + i * E, E);
    ++c;
  });
  return c;
}

#ifdef BITREFIT_CODEC_X86_AVX2
// The vector kernels' tail: bytes [i, nbytes) element by element, outputs from entry c on; returns
// the count.
template <class T, bool WantXor, bool WantNew>
std::size_t collect_tail(const std::byte* a, const std::byte* b, std::size_t i, std::size_t nbytes, std::uint32_t* pos, std::size_t c,
                         std::byte* xo, std::byte* no) noexcept {
  constexpr std::size_t E = sizeof(T);
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

// The one exception to "every change detector runs core/bit_diff.hpp", and why: this variant fuses
// detection with writing the outputs (vpcompress of positions, XOR words and new values at once),
// which an emit-per-element kernel cannot express; it is a codec-local fast path whose outputs
// tests/codec (Kernels.ChangeDetectionOfEveryVariantIsTheSame) checks bit for bit against
// collect_kernel on every element size and change rate.
// AVX-512 variant for 2- and 4-byte elements, without a data-dependent branch: per 64-byte block
// (read by stream_load512, isa.hpp), the changed lanes' mask (vptestm of old ^ new), then
// positions, XOR words and new values are compressed (vpcompress) into registers and stored whole
// at the output cursor, which advances by the mask's popcount. The stores of a block reach at
// most the block's own slots of the outputs (c <= elements before the block), so they never pass
// m. At AdamW-like rates half the 32-element blocks change, at random: the branchy variants above
// mispredict on every second block.
// 2-byte elements: a block's 32 positions are compressed as 16-bit lane numbers inside a run of
// `run16` elements (one vpcompressw instead of two vpcompressd and their stores: at 5 % change the
// pass took 1.35-1.6x a memcmp with 32-bit positions, 1.15-1.3x with these), then widened and
// offset by the run's start into `pos` once per run, from L1.
template <class T, bool WantXor, bool WantNew>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi2,bmi,popcnt"))) std::size_t collect_avx512(
    const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos, std::byte* xo, std::byte* no) noexcept {
  constexpr std::size_t E = sizeof(T);
  static_assert(E == 2 || E == 4);
  const std::size_t nbytes = m * E;
  std::size_t c = 0, i = 0;
  if constexpr (E == 2) {
    constexpr std::size_t run16 = 4096;  // elements; lane numbers < 2^16
    alignas(64) std::uint16_t lanes[run16];
    const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8,
                                          7, 6, 5, 4, 3, 2, 1, 0);
    while (i + 64 <= nbytes) {
      const std::size_t start = i / E, run_end = std::min(nbytes / 64 * 64, i + run16 * E);
      std::size_t n = 0;  // changes in this run
      __m512i lane = iota;
      for (; i < run_end; i += 64) {
        const __m512i va = stream_load512(a + i), vb = stream_load512(b + i);
        const __m512i x = _mm512_xor_si512(va, vb);
        const __mmask32 mk = _mm512_test_epi16_mask(x, x);
        // n + 32 <= the run's elements so far + 32 <= run16: inside `lanes`
        _mm512_storeu_si512(lanes + n, _mm512_maskz_compress_epi16(mk, lane));
        if constexpr (WantXor) _mm512_storeu_si512(xo + (c + n) * E, _mm512_maskz_compress_epi16(mk, x));
        if constexpr (WantNew) _mm512_storeu_si512(no + (c + n) * E, _mm512_maskz_compress_epi16(mk, vb));
        n += static_cast<unsigned>(__builtin_popcount(mk));
        lane = _mm512_add_epi16(lane, _mm512_set1_epi16(32));
      }
      // widen: positions c .. c + n - 1 (the last sixteen masked: pos holds m entries, no more)
      const __m512i at = _mm512_set1_epi32(static_cast<int>(start));
      for (std::size_t k = 0; k < n; k += 16) {
        const auto left = static_cast<unsigned>(std::min<std::size_t>(16, n - k));
        const __m512i p = _mm512_add_epi32(at, _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + k))));
        _mm512_mask_storeu_epi32(pos + c + k, static_cast<__mmask16>((1u << left) - 1), p);
      }
      c += n;
    }
  } else {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 64 <= nbytes; i += 64) {
      const __m512i va = stream_load512(a + i), vb = stream_load512(b + i);
      const __m512i x = _mm512_xor_si512(va, vb);
      const __m512i idx = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(i / E)));
      const __mmask16 mk = _mm512_test_epi32_mask(x, x);
      _mm512_storeu_si512(pos + c, _mm512_maskz_compress_epi32(mk, idx));
      if constexpr (WantXor) _mm512_storeu_si512(xo + c * E, _mm512_maskz_compress_epi32(mk, x));
      if constexpr (WantNew) _mm512_storeu_si512(no + c * E, _mm512_maskz_compress_epi32(mk, vb));
      c += static_cast<unsigned>(__builtin_popcount(mk));
    }
  }
  return collect_tail<T, WantXor, WantNew>(a, b, i, nbytes, pos, c, xo, no);  // fewer than 64 bytes left
}

// One group of eight 2-byte lanes of collect_avx2: the lanes of mask mk packed (lane numbers
// `lane`, XOR words x, new values nb) and stored at the cursors, n advanced past them.
// n + 8 <= the run's elements before this group + 8 <= run16: inside `lanes`.
template <bool WantXor, bool WantNew>
__attribute__((target("avx2,bmi,popcnt"), always_inline)) inline void pack_group16(unsigned mk, __m128i lane, __m128i x, __m128i nb,
                                                                                 std::uint16_t* lanes, std::size_t& n, std::byte* xo,
                                                                                 std::byte* no, std::size_t c) noexcept {
  const __m128i shuf = _mm_load_si128(reinterpret_cast<const __m128i*>(compress16x8.at[mk].data()));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes + n), _mm_shuffle_epi8(lane, shuf));
  if constexpr (WantXor) _mm_storeu_si128(reinterpret_cast<__m128i*>(xo + (c + n) * 2), _mm_shuffle_epi8(x, shuf));
  if constexpr (WantNew) _mm_storeu_si128(reinterpret_cast<__m128i*>(no + (c + n) * 2), _mm_shuffle_epi8(nb, shuf));
  n += static_cast<unsigned>(__builtin_popcount(mk));
}

// AVX2 variant of collect_avx512 for x86-64-v3 CPUs without AVX-512 (the branchy per-element emit of
// core/bit_diff.hpp took ~2x a memcmp at AdamW-like rates on a Zen 3 VM): no data-dependent
// branch either; compress by table (isa.hpp). 2-byte elements: per 64-byte block the changed
// lanes' 32-bit mask (two 16-lane compares packed to bytes), then per group of eight lanes its
// 16-bit lane numbers in the run, XOR words and new values packed by one byte shuffle each and
// stored whole (16 bytes) at the output cursor; widened once per run as above. 4-byte elements:
// per 32-byte half, one permutation of eight lanes for positions, XOR words and new values.
// The stores of a group reach at most its own slots of the outputs, so they never pass m.
template <class T, bool WantXor, bool WantNew>
__attribute__((target("avx2,bmi,popcnt"))) std::size_t collect_avx2(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                                                                    std::byte* xo, std::byte* no) noexcept {
  constexpr std::size_t E = sizeof(T);
  static_assert(E == 2 || E == 4);
  const std::size_t nbytes = m * E;
  std::size_t c = 0, i = 0;
  const __m256i zero = _mm256_setzero_si256();
  if constexpr (E == 2) {
    constexpr std::size_t run16 = 4096;  // elements; lane numbers < 2^16
    alignas(32) std::uint16_t lanes[run16];
    while (i + 64 <= nbytes) {
      const std::size_t start = i / E, run_end = std::min(nbytes / 64 * 64, i + run16 * E);
      std::size_t n = 0;  // changes in this run
      __m128i lane = _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7);
      for (; i < run_end; i += 64) {
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)), a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 32));
        const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)), b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 32));
        const __m256i x0 = _mm256_xor_si256(a0, b0), x1 = _mm256_xor_si256(a1, b1);
        // bytes [x0 lanes 0-7, x1 lanes 0-7 | x0 lanes 8-15, x1 lanes 8-15]: mask bits 0-7, 16-23,
        // 8-15, 24-31 are elements 0-7, 8-15, 16-23, 24-31 of the block
        const auto mk = ~static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_packs_epi16(_mm256_cmpeq_epi16(x0, zero), _mm256_cmpeq_epi16(x1, zero))));
        // four groups written out (a loop over arrays of them was neither unrolled nor kept in
        // registers by GCC 12: 2.2x a memcmp instead of 1.3x in a throwaway loop)
        pack_group16<WantXor, WantNew>(mk & 0xFF, lane, _mm256_castsi256_si128(x0), _mm256_castsi256_si128(b0), lanes, n, xo, no, c);
        pack_group16<WantXor, WantNew>((mk >> 16) & 0xFF, _mm_add_epi16(lane, _mm_set1_epi16(8)), _mm256_extracti128_si256(x0, 1),
                                       _mm256_extracti128_si256(b0, 1), lanes, n, xo, no, c);
        pack_group16<WantXor, WantNew>((mk >> 8) & 0xFF, _mm_add_epi16(lane, _mm_set1_epi16(16)), _mm256_castsi256_si128(x1), _mm256_castsi256_si128(b1),
                                       lanes, n, xo, no, c);
        pack_group16<WantXor, WantNew>(mk >> 24, _mm_add_epi16(lane, _mm_set1_epi16(24)), _mm256_extracti128_si256(x1, 1), _mm256_extracti128_si256(b1, 1),
                                       lanes, n, xo, no, c);
        lane = _mm_add_epi16(lane, _mm_set1_epi16(32));
      }
      // widen: positions c .. c + n - 1 (the last few one by one: pos holds m entries, no more)
      const __m256i at = _mm256_set1_epi32(static_cast<int>(start));
      std::size_t k = 0;
      for (; k + 8 <= n; k += 8)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + c + k),
                            _mm256_add_epi32(at, _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(lanes + k)))));
      for (; k < n; ++k) pos[c + k] = static_cast<std::uint32_t>(start + lanes[k]);
      c += n;
    }
  } else {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i idx = iota;
    for (; i + 32 <= nbytes; i += 32) {
      const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)), vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
      const __m256i x = _mm256_xor_si256(va, vb);
      const auto mk = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x, zero)))) ^ 0xFFu;
      const auto nk = static_cast<unsigned>(__builtin_popcount(mk));
      const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(compress32x8.at[mk])));
      // the lanes past the packed ones are zeros, as the 2-byte path's and AVX-512's (concepts.hpp)
      const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nk)), iota);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + c), _mm256_and_si256(keep, _mm256_permutevar8x32_epi32(idx, perm)));
      if constexpr (WantXor) _mm256_storeu_si256(reinterpret_cast<__m256i*>(xo + c * E), _mm256_and_si256(keep, _mm256_permutevar8x32_epi32(x, perm)));
      if constexpr (WantNew) _mm256_storeu_si256(reinterpret_cast<__m256i*>(no + c * E), _mm256_and_si256(keep, _mm256_permutevar8x32_epi32(vb, perm)));
      c += nk;
      idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
    }
  }
  return collect_tail<T, WantXor, WantNew>(a, b, i, nbytes, pos, c, xo, no);  // fewer than 64 (2-byte) or 32 (4-byte) bytes left
}

inline bool cpu_has_avx512_compress() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi2");
  return has;
}
#endif

template <class T, bool WantXor, bool WantNew>
std::size_t collect_dispatch(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                             std::byte* xo, std::byte* no) {
#ifdef BITREFIT_CODEC_X86_AVX2
  if constexpr (sizeof(T) == 2 || sizeof(T) == 4) {
    if (cpu_has_avx512_compress()) return collect_avx512<T, WantXor, WantNew>(a, b, m, pos, xo, no);
    if (cpu_v3()) return collect_avx2<T, WantXor, WantNew>(a, b, m, pos, xo, no);
  }
#endif
  return collect_kernel<T, WantXor, WantNew>(a, b, m, pos, xo, no);
}

template <class T>
std::size_t collect_typed(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                          std::byte* xo, std::byte* no) {
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
                     std::span<const std::uint32_t> positions, std::span<const std::byte> base_at_positions,
                     std::span<std::uint8_t> classes_out, std::span<std::uint32_t> ranks_out, std::span<std::uint64_t> totals) {
    codec::rank_by_class(base, f, spec, positions, base_at_positions, classes_out, ranks_out, totals);
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
