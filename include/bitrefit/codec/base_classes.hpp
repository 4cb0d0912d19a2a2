// bitrefit/codec/base_classes.hpp — classes of base values (exponent buckets) and each element's
// rank within its class: what the base-conditioned coding (conditioned.hpp) codes positions by.
//
// A class_spec splits the exponent field into K <= 16 contiguous buckets by K-1 strictly increasing
// exponent thresholds: class(x) = #{ j : exponent(x) >= thresholds[j] }, the sign ignored (on AdamW
// deltas the change rate depends on |value|'s exponent, not on the sign: bench/codec/README.md).
// The rank of element i is the number of elements before i (in the item's range) of the same class,
// so the elements of one class, in range order, are numbered 0, 1, 2, ... and the changed ones
// can be coded as gaps in that numbering with the class's own statistics.
//
// Cost: classes need every element's exponent, i.e. one pass over the base range on both ends. It
// runs on 64-element blocks: per block, one bit mask per threshold ("exponent >= t_j"), computed
// with AVX-512BW or AVX2 compares where the CPU has them (scalar otherwise, same bits); class
// counts are popcounts of those masks, and a rank is a popcount below the element's lane. The
// encoder runs it on slices still in cache from change detection (encoder.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/codec/fixed_log2.hpp"
#include "bitrefit/codec/isa.hpp"
#include "bitrefit/codec/ulp.hpp"
#include "bitrefit/core/error.hpp"

#ifdef BITREFIT_CODEC_X86
#include <immintrin.h>
#endif

namespace bitrefit::codec {

inline constexpr unsigned max_base_classes = 16;

struct class_spec {
  std::uint8_t count = 1;  // K, 1..16
  std::array<std::uint16_t, max_base_classes - 1> thresholds{};  // exponent field values, first K-1 used

  unsigned boundaries() const noexcept { return count - 1u; }
  /// The class of a pattern with exponent field e.
  unsigned class_of_exponent(std::uint64_t e) const noexcept {
    unsigned k = 0;
    while (k < boundaries() && e >= thresholds[k]) ++k;
    return k;
  }
  friend bool operator==(const class_spec& a, const class_spec& b) {
    return a.count == b.count && std::equal(a.thresholds.begin(), a.thresholds.begin() + a.boundaries(), b.thresholds.begin());
  }
};

/// True when `s` is well formed for format `f`: 1 <= K <= 16, thresholds strictly increasing in
/// [1, number of exponent values).
inline bool valid_class_spec(const class_spec& s, const float_format& f) noexcept {
  if (s.count < 1 || s.count > max_base_classes) return false;
  for (unsigned j = 0; j < s.boundaries(); ++j) {
    if (s.thresholds[j] < 1 || s.thresholds[j] >= f.exponents()) return false;
    if (j > 0 && s.thresholds[j] <= s.thresholds[j - 1]) return false;
  }
  return true;
}

namespace detail {

/// Per 64-element block: ge[j] bit l set iff element (64·b + l) has magnitude >= t[j]; lanes past
/// the end of the range are zero in every mask. Magnitude thresholds t[j] = threshold_j << mantissa.
struct class_thresholds {
  unsigned T = 0;
  std::array<std::uint64_t, max_base_classes - 1> t{};
  std::uint64_t mag_mask = 0;
  unsigned E = 0;
  unsigned mantissa_bits = 0;  // t[j] are exponent thresholds shifted by this
};

inline class_thresholds thresholds_of(const float_format& f, const class_spec& s) noexcept {
  class_thresholds c;
  c.T = s.boundaries();
  for (unsigned j = 0; j < c.T; ++j) c.t[j] = std::uint64_t{s.thresholds[j]} << f.mantissa_bits;
  c.mag_mask = f.magnitude_mask;
  c.E = f.element_size;
  c.mantissa_bits = f.mantissa_bits;
  return c;
}

/// Element l of a range of W words (any alignment: tensors in mapped files need not be aligned).
template <class W>
BITREFIT_INLINE W load_word(const std::byte* p, std::size_t l) noexcept {
  W w;
  std::memcpy(&w, p + l * sizeof(W), sizeof(W));
  return w;
}

template <class W>
BITREFIT_INLINE void block_masks_scalar(const std::byte* p, std::size_t n, const class_thresholds& c, std::uint64_t* ge) noexcept {
  for (unsigned j = 0; j < c.T; ++j) ge[j] = 0;
  for (std::size_t l = 0; l < n; ++l) {
    const std::uint64_t mag = static_cast<std::uint64_t>(load_word<W>(p, l)) & c.mag_mask;
    for (unsigned j = 0; j < c.T && mag >= c.t[j]; ++j) ge[j] |= std::uint64_t{1} << l;
  }
}

#ifdef BITREFIT_CODEC_X86
__attribute__((target("avx512f,avx512bw"))) inline void block_masks_16_avx512(const std::byte* p, std::size_t nblocks,
                                                                            const class_thresholds& c, std::uint64_t* out,
                                                                            std::size_t stride) noexcept {
  const __m512i mm = _mm512_set1_epi16(static_cast<short>(c.mag_mask));
  __m512i t[max_base_classes - 1];
  for (unsigned j = 0; j < c.T; ++j) t[j] = _mm512_set1_epi16(static_cast<short>(c.t[j]));
  for (std::size_t b = 0; b < nblocks; ++b, p += 128, out += stride) {
    const __m512i a0 = _mm512_and_si512(stream_load512(p), mm);
    const __m512i a1 = _mm512_and_si512(stream_load512(p + 64), mm);
    for (unsigned j = 0; j < c.T; ++j)
      out[j] = std::uint64_t{_mm512_cmpge_epu16_mask(a0, t[j])} | (std::uint64_t{_mm512_cmpge_epu16_mask(a1, t[j])} << 32);
  }
}
__attribute__((target("avx512f"))) inline void block_masks_32_avx512(const std::byte* p, std::size_t nblocks,
                                                                    const class_thresholds& c, std::uint64_t* out,
                                                                    std::size_t stride) noexcept {
  const __m512i mm = _mm512_set1_epi32(static_cast<int>(c.mag_mask));
  __m512i t[max_base_classes - 1];
  for (unsigned j = 0; j < c.T; ++j) t[j] = _mm512_set1_epi32(static_cast<int>(c.t[j]));
  for (std::size_t b = 0; b < nblocks; ++b, p += 256, out += stride) {
    __m512i a[4];
    for (int q = 0; q < 4; ++q) a[q] = _mm512_and_si512(stream_load512(p + 64 * q), mm);
    for (unsigned j = 0; j < c.T; ++j) {
      std::uint64_t m = 0;
      for (int q = 0; q < 4; ++q) m |= std::uint64_t{_mm512_cmpge_epu32_mask(a[q], t[j])} << (16 * q);
      out[j] = m;
    }
  }
}
// AVX2: magnitudes are below the sign bit, so signed compares (cmpgt with t-1) are exact.
__attribute__((target("avx2"))) inline void block_masks_16_avx2(const std::byte* p, std::size_t nblocks,
                                                              const class_thresholds& c, std::uint64_t* out,
                                                              std::size_t stride) noexcept {
  const __m256i mm = _mm256_set1_epi16(static_cast<short>(c.mag_mask));
  __m256i t[max_base_classes - 1];
  for (unsigned j = 0; j < c.T; ++j) t[j] = _mm256_set1_epi16(static_cast<short>(c.t[j] - 1));
  for (std::size_t b = 0; b < nblocks; ++b, p += 128, out += stride) {
    __m256i a[4];
    for (int q = 0; q < 4; ++q) a[q] = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * q)), mm);
    for (unsigned j = 0; j < c.T; ++j) {
      // packs interleaves 128-bit halves; permute 0xD8 restores element order before movemask
      const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi16(_mm256_cmpgt_epi16(a[0], t[j]), _mm256_cmpgt_epi16(a[1], t[j])), 0xD8);
      const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi16(_mm256_cmpgt_epi16(a[2], t[j]), _mm256_cmpgt_epi16(a[3], t[j])), 0xD8);
      out[j] = std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(lo))} |
               (std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(hi))} << 32);
    }
  }
}
__attribute__((target("avx2"))) inline void block_masks_32_avx2(const std::byte* p, std::size_t nblocks,
                                                              const class_thresholds& c, std::uint64_t* out,
                                                              std::size_t stride) noexcept {
  const __m256i mm = _mm256_set1_epi32(static_cast<int>(c.mag_mask));
  __m256i t[max_base_classes - 1];
  for (unsigned j = 0; j < c.T; ++j) t[j] = _mm256_set1_epi32(static_cast<int>(c.t[j] - 1));
  for (std::size_t b = 0; b < nblocks; ++b, p += 256, out += stride) {
    __m256i a[8];
    for (int q = 0; q < 8; ++q) a[q] = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * q)), mm);
    for (unsigned j = 0; j < c.T; ++j) {
      std::uint64_t m = 0;
      for (int q = 0; q < 8; ++q)
        m |= std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a[q], t[j]))))} << (8 * q);
      out[j] = m;
    }
  }
}
#endif

/// Masks of `nblocks` whole blocks (64 elements each) starting at p: out[b*stride + j]. With V3
/// (the caller was compiled for x86-64-v3) 16- and 32-bit elements use AVX-512BW or AVX2 compares.
template <class W, bool V3>
BITREFIT_INLINE void block_masks(const std::byte* bp, std::size_t nblocks, const class_thresholds& c, std::uint64_t* out,
                                 std::size_t stride) noexcept {
  if (c.T == 0) return;
#ifdef BITREFIT_CODEC_X86
  constexpr bool simd = V3 && (sizeof(W) == 2 || sizeof(W) == 4);
#else
  constexpr bool simd = false;
#endif
  if constexpr (simd) {
#ifdef BITREFIT_CODEC_X86
    if constexpr (sizeof(W) == 2) {
      if (cpu_avx512bw()) block_masks_16_avx512(bp, nblocks, c, out, stride);
      else block_masks_16_avx2(bp, nblocks, c, out, stride);
    } else {
      if (cpu_avx512bw()) block_masks_32_avx512(bp, nblocks, c, out, stride);
      else block_masks_32_avx2(bp, nblocks, c, out, stride);
    }
#endif
  } else {
    for (std::size_t b = 0; b < nblocks; ++b) block_masks_scalar<W>(bp + 64 * sizeof(W) * b, 64, c, out + b * stride);
  }
}

inline std::uint64_t below(unsigned lane) noexcept { return lane >= 64 ? ~0ull : (std::uint64_t{1} << lane) - 1; }

/// Class masks of a batch of blocks in an extended layout, (T + 2) words per block:
///   ext[0] = the block's valid lanes (every element has magnitude >= 0), ext[1 + j] = lanes with
///   magnitude >= t_j, ext[T + 1] = 0 (no element is above the last class);
/// so class k's lanes are ext[k] & ~ext[k + 1] and an element's class is the number of ext[1..T]
/// words with its bit set, with no special case for the first or last class. cum[b·(T+2) + j] is
/// the number of elements before block b of the walk with their bit set in word j (same layout).
struct block_batch {
  static constexpr std::size_t blocks = 128;
  std::uint64_t ext[blocks * (max_base_classes + 1)];
  std::uint64_t cum[blocks * (max_base_classes + 1)];
};

/// Fills `bb` for up to block_batch::blocks blocks starting at element `first` (a multiple of 64)
/// of m; `running[j]` carries the counts of words j in 1..T across batches. Returns the blocks filled.
template <class W, bool V3>
BITREFIT_INLINE std::size_t fill_batch(const std::byte* base, std::size_t first, std::size_t m, const class_thresholds& c,
                                       std::uint64_t* running, block_batch& bb) noexcept {
  const unsigned T = c.T, X = T + 2;
  const std::size_t left = m - first;
  const std::size_t full = std::min(block_batch::blocks, left / 64);
  block_masks<W, V3>(base + first * sizeof(W), full, c, bb.ext + 1, X);
  std::size_t nb = full;
  if (full < block_batch::blocks && left % 64) {
    block_masks_scalar<W>(base + (first + full * 64) * sizeof(W), left % 64, c, bb.ext + full * X + 1);
    ++nb;
  }
  for (std::size_t b = 0; b < nb; ++b) {
    std::uint64_t* e = bb.ext + b * X;
    std::uint64_t* cu = bb.cum + b * X;
    const std::size_t start = first + b * 64;
    e[0] = m - start >= 64 ? ~0ull : below(static_cast<unsigned>(m - start));
    e[T + 1] = 0;
    cu[0] = start;
    cu[T + 1] = 0;
  }
  // word by word, blocks inner: the running count stays in a register (blocks outer, T is not a
  // constant and running[j] went through memory, a load-add-store chain per block and word)
  for (unsigned j = 1; j <= T; ++j) {
    std::uint64_t r = running[j];
    const std::uint64_t* e = bb.ext + j;
    std::uint64_t* cu = bb.cum + j;
    for (std::size_t b = 0; b < nb; ++b) cu[b * X] = r, r += static_cast<unsigned>(std::popcount(e[b * X]));
    running[j] = r;
  }
  return nb;
}

/// A change's class from its base value's exponent field: one table load instead of testing its
/// lane in each of the T threshold masks (8 % of encode time on AdamW items of four classes).
/// Class j holds the exponents in [threshold j-1, threshold j) (ascending: valid_class_spec).
/// 2^11 entries: the widest exponent field (F64).
inline void fill_class_of_exponent(const class_thresholds& c, std::uint8_t (&out)[2048]) noexcept {
  const unsigned T = c.T;
  const std::size_t exponents = static_cast<std::size_t>(c.mag_mask >> c.mantissa_bits) + 1;
  for (std::size_t j = 0, from = 0; j <= T; ++j) {
    const std::size_t to = j < T ? std::min<std::size_t>(static_cast<std::size_t>(c.t[j] >> c.mantissa_bits), exponents) : exponents;
    if (to > from) std::memset(out + from, static_cast<int>(j), to - from), from = to;
  }
}

template <class W>
BITREFIT_INLINE void rank_impl(const std::byte* base, std::size_t m, const class_thresholds& c, const std::uint32_t* positions,
                               const std::byte* at_positions, std::size_t n_pos, std::uint8_t* classes_out, std::uint32_t* ranks_out,
                               std::uint64_t* totals) {
  const unsigned T = c.T, X = T + 2;
  std::uint64_t running[max_base_classes + 1] = {};
  block_batch bb;
  std::uint8_t class_of_exponent[2048];
  fill_class_of_exponent(c, class_of_exponent);
  std::size_t k = 0;
  for (std::size_t first = 0; first < m; first += block_batch::blocks * 64) {
    const std::size_t nb = fill_batch<W, false>(base, first, m, c, running, bb);
    const std::uint64_t end = first + nb * 64;
    // every change in the batch, without data-dependent branches: class = number of threshold
    // words with the lane's bit; rank = (ext[cls] count below) - (ext[cls+1] count below)
    for (; k < n_pos && positions[k] < end; ++k) {
      const std::uint64_t p = positions[k];
      const std::size_t b = (p - first) >> 6;
      const unsigned lane = static_cast<unsigned>(p & 63);
      const std::uint64_t* e = bb.ext + b * X;
      const std::uint64_t* cu = bb.cum + b * X;
      const std::uint64_t bl = below(lane);
      const W v = at_positions ? load_word<W>(at_positions, k) : load_word<W>(base, p);
      const unsigned cls = class_of_exponent[(static_cast<std::uint64_t>(v) & c.mag_mask) >> c.mantissa_bits];
      const std::uint64_t hi = cu[cls] + static_cast<unsigned>(std::popcount(e[cls] & bl));
      const std::uint64_t lo = cu[cls + 1] + static_cast<unsigned>(std::popcount(e[cls + 1] & bl));
      classes_out[k] = static_cast<std::uint8_t>(cls);
      ranks_out[k] = static_cast<std::uint32_t>(totals[cls] + hi - lo);
    }
  }
  // class totals of the range: N_k = G_{k-1} - G_k (G_{-1} = m, G_T = 0)
  std::uint64_t prev = m;
  for (unsigned j = 0; j <= T; ++j) {
    const std::uint64_t g = j < T ? running[j + 1] : 0;
    totals[j] += prev - g;
    prev = g;
  }
}

/// Per block of a batch and per class k (stride 16 = max_base_classes, so a change's slot is
/// block · 16 + class, a shift and an add): the block's lanes of class k, and totals[k] + the
/// elements of class k before the block (mod 2^32: ranks are 32-bit).
struct class_batch {
  static constexpr std::size_t blocks = 128;
  alignas(64) std::uint64_t lanes[blocks * max_base_classes];
  alignas(64) std::uint32_t before[blocks * max_base_classes];
};

/// rank_impl for x86-64-v3 CPUs, in rank_avx512's layout: per block each class's own lanes (from
/// the AVX2 threshold masks: class k is >= t_{k-1} and not >= t_k) and the counts of every class
/// before the block; per change one lanes word, one count and one popcount (rank_impl: two of
/// each, and cumulative counts per threshold word), without a data-dependent branch. On an
/// AVX2-only Zen 3 VM rank_impl was about 1.0 memcmp units of an adamw encode (four classes).
/// Same outputs as rank_generic (tests/codec, Kernels.RanksOfTheVectorAndScalarPathsAreTheSame).
template <class W>
BITREFIT_TARGET_V3 void rank_v3(const std::byte* base, std::size_t m, const class_thresholds& c, const std::uint32_t* positions,
                                const std::byte* at_positions, std::size_t n_pos, std::uint8_t* classes_out, std::uint32_t* ranks_out,
                                std::uint64_t* totals) {
  constexpr std::size_t S = max_base_classes;
  const unsigned T = c.T, K = T + 1;
  std::uint64_t running[S] = {};
  for (unsigned k = 0; k < K; ++k) running[k] = totals[k];
  class_batch cb;
  std::uint8_t class_of_exponent[2048];
  fill_class_of_exponent(c, class_of_exponent);
  // the threshold masks of a block at lanes[1 .. T], turned into class lanes [0 .. T] in place
  auto own_lanes = [T](std::uint64_t* l, std::uint64_t valid) {
    std::uint64_t lo = valid;
    for (unsigned j = 0; j < T; ++j) {
      const std::uint64_t hi = l[j + 1];
      l[j] = lo & ~hi, lo = hi;
    }
    l[T] = lo;
  };
  std::size_t k = 0;
  for (std::size_t first = 0; first < m; first += class_batch::blocks * 64) {
    const std::size_t left = m - first;
    const std::size_t full = std::min(class_batch::blocks, left / 64);
    block_masks<W, true>(base + first * sizeof(W), full, c, cb.lanes + 1, S);
    for (std::size_t b = 0; b < full; ++b) own_lanes(cb.lanes + b * S, ~0ull);
    std::size_t nb = full;
    if (full < class_batch::blocks && left % 64) {  // the partial last block
      block_masks_scalar<W>(base + (first + full * 64) * sizeof(W), left % 64, c, cb.lanes + full * S + 1);
      own_lanes(cb.lanes + full * S, below(static_cast<unsigned>(left % 64)));
      ++nb;
    }
    for (std::size_t b = 0; b < nb; ++b)
      for (unsigned j = 0; j < K; ++j) {
        cb.before[b * S + j] = static_cast<std::uint32_t>(running[j]);
        running[j] += static_cast<unsigned>(std::popcount(cb.lanes[b * S + j]));
      }
    const std::uint64_t end = first + nb * 64;
    for (; k < n_pos && positions[k] < end; ++k) {
      const std::uint64_t p = positions[k];
      const W v = at_positions ? load_word<W>(at_positions, k) : load_word<W>(base, p);
      const unsigned cls = class_of_exponent[(static_cast<std::uint64_t>(v) & c.mag_mask) >> c.mantissa_bits];
      const std::size_t slot = ((p - first) >> 6) * S + cls;
      classes_out[k] = static_cast<std::uint8_t>(cls);
      ranks_out[k] = cb.before[slot] + static_cast<unsigned>(std::popcount(cb.lanes[slot] & below(static_cast<unsigned>(p & 63))));
    }
  }
  for (unsigned j = 0; j < K; ++j) totals[j] = running[j];
}
template <class W>
void rank_generic(const std::byte* base, std::size_t m, const class_thresholds& c, const std::uint32_t* positions,
                  const std::byte* at_positions, std::size_t n, std::uint8_t* classes_out, std::uint32_t* ranks_out,
                  std::uint64_t* totals) {
  rank_impl<W>(base, m, c, positions, at_positions, n, classes_out, ranks_out, totals);
}

#ifdef BITREFIT_CODEC_X86

/// rank_impl for 2- and 4-byte elements with AVX-512, sixteen changes per step. Why: the scalar
/// loop cost about 14 cycles per change (perf, AdamW-like items of four classes: with its class
/// masks 1.42x a memcmp of the data, a third of encode), each change a chain of dependent loads
/// (base value, class table, two threshold words and two counts) behind a branch on the batch end.
/// Here, per block, each class's own lanes (not the T threshold words: one lanes word and one
/// count per change instead of two each) and the counts before the block of every class at once
/// (one VPOPCNTDQ per block, the running counts in a vector); per sixteen changes, the base values,
/// the class's lanes and count are gathered and the rank is that count plus a lane-wise popcount
/// below the lane: 1.05x a memcmp in the same perf, encode 0.90x the time (bench/codec/README.md,
/// "Class ranks sixteen at a time"). Same outputs as rank_generic (tests/codec,
/// Kernels.RanksOfTheVectorAndScalarPathsAreTheSame).
/// With `at_positions` (the base values of the changes, contiguous; nullptr: none), sixteen changes'
/// classes come from one load instead of a gather from the base: the encoder has gathered those
/// values for the value codes anyway, and the gather reads the base slice from L2, one line per
/// change (AdamW-like items: encode 0.95x the time, bench/codec/README.md "Classes from the
/// gathered values").
/// @pre m <= 2^31 (gather indices are signed 32-bit).
template <class W>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vpopcntdq,popcnt"))) inline void rank_avx512(
    const std::byte* base, std::size_t m, const class_thresholds& c, const std::uint32_t* positions, const std::byte* at_positions,
    std::size_t n_pos, std::uint8_t* classes_out, std::uint32_t* ranks_out, std::uint64_t* totals) noexcept {
  static_assert(sizeof(W) == 2 || sizeof(W) == 4);
  constexpr std::size_t S = max_base_classes;
  const unsigned T = c.T, K = T + 1;
  const unsigned padded = K <= 8 ? 8 : 16;  // classes counted per block: one or two vectors
  alignas(64) std::uint64_t running[max_base_classes] = {};
  for (unsigned k = 0; k < K; ++k) running[k] = totals[k];
  __m512i run0 = _mm512_load_si512(running), run1 = _mm512_load_si512(running + 8);
  class_batch cb;
  for (std::size_t b = 0; b < class_batch::blocks; ++b)  // counted per block, never read as a class
    for (unsigned j = K; j < padded; ++j) cb.lanes[b * S + j] = 0;
  __m512i t[max_base_classes - 1];
  for (unsigned j = 0; j < T; ++j) t[j] = _mm512_set1_epi32(static_cast<int>(c.t[j]));
  const __m512i mag = _mm512_set1_epi32(static_cast<int>(c.mag_mask));
  __m512i t16[max_base_classes - 1];  // for the 2-byte class lanes
  for (unsigned j = 0; j < T; ++j) t16[j] = _mm512_set1_epi16(static_cast<short>(c.t[j]));
  const __m512i mag16 = _mm512_set1_epi16(static_cast<short>(c.mag_mask));
  const __m512i one32 = _mm512_set1_epi32(1), one64 = _mm512_set1_epi64(1), low6 = _mm512_set1_epi32(63), zero = _mm512_setzero_si512();
  constexpr __mmask16 all16 = 0xFFFF;
  constexpr __mmask8 all8 = 0xFF;
  auto class_of = [&](std::uint64_t w) {
    unsigned cls = 0;
    while (cls < T && (w & c.mag_mask) >= c.t[cls]) ++cls;
    return cls;
  };
  std::size_t k = 0;
  for (std::size_t first = 0; first < m; first += class_batch::blocks * 64) {
    const std::size_t left = m - first;
    const std::size_t full = std::min(class_batch::blocks, left / 64);
    // each whole block's class lanes, straight from the threshold compares: class k's lanes are
    // magnitude >= t_{k-1} (every lane for k = 0) and not >= t_k
    for (std::size_t b = 0; b < full; ++b) {
      const std::byte* q = base + (first + b * 64) * sizeof(W);
      std::uint64_t* own = cb.lanes + b * S;
      if constexpr (sizeof(W) == 2) {
        __mmask64 lo = ~0ull;
        const __m512i a0 = _mm512_and_si512(stream_load512(q), mag16), a1 = _mm512_and_si512(stream_load512(q + 64), mag16);
        for (unsigned j = 0; j < T; ++j) {
          const __mmask64 hi = _mm512_kunpackd(_mm512_cmpge_epu16_mask(a1, t16[j]), _mm512_cmpge_epu16_mask(a0, t16[j]));
          own[j] = _cvtmask64_u64(_kandn_mask64(hi, lo)), lo = hi;
        }
        own[T] = _cvtmask64_u64(lo);
      } else {
        std::uint64_t lo = ~0ull;
        __m512i a[4];
        for (int r = 0; r < 4; ++r) a[r] = _mm512_and_si512(stream_load512(q + 64 * r), mag);
        for (unsigned j = 0; j < T; ++j) {
          std::uint64_t hi = 0;
          for (int r = 0; r < 4; ++r) hi |= std::uint64_t{_mm512_cmpge_epu32_mask(a[r], t[j])} << (16 * r);
          own[j] = lo & ~hi, lo = hi;
        }
        own[T] = lo;
      }
    }
    std::size_t nb = full;
    if (full < class_batch::blocks && left % 64) {  // the partial last block, scalar
      const std::size_t n = left % 64;
      std::uint64_t ge[max_base_classes - 1];
      block_masks_scalar<W>(base + (first + full * 64) * sizeof(W), n, c, ge);
      std::uint64_t* own = cb.lanes + full * S;
      std::uint64_t lo = below(static_cast<unsigned>(n));
      for (unsigned j = 0; j < T; ++j) own[j] = lo & ~ge[j], lo = ge[j];
      own[T] = lo;
      ++nb;
    }
    // counts before each block, all classes at once: eight (or sixteen) lanes of running counts,
    // narrowed in a register and stored whole (the truncating store vpmovqd to memory is slower on
    // AMD Zen: 0.993-0.996x the encode time on AdamW-like items, paired tool)
    for (std::size_t b = 0; b < nb; ++b) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(cb.before + b * S), _mm512_maskz_cvtepi64_epi32(all8, run0));
      run0 = _mm512_add_epi64(run0, _mm512_popcnt_epi64(_mm512_load_si512(cb.lanes + b * S)));
      if (padded > 8) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(cb.before + b * S + 8), _mm512_maskz_cvtepi64_epi32(all8, run1));
        run1 = _mm512_add_epi64(run1, _mm512_popcnt_epi64(_mm512_load_si512(cb.lanes + b * S + 8)));
      }
    }
    const std::uint64_t end = first + nb * 64;
    // a 4-byte gather at a 2-byte element reads the next element too: the last element of the
    // range goes to the scalar loop
    const std::uint64_t vector_end = sizeof(W) == 2 ? std::min<std::uint64_t>(end, m - 1) : end;
    const __m512i at = _mm512_set1_epi32(static_cast<int>(first));
    // (the masked forms with every lane set: GCC's unmasked ones merge into an undefined vector
    // and warn under -Wmaybe-uninitialized)
    for (; k + 16 <= n_pos && positions[k + 15] < vector_end; k += 16) {
      const __m512i p = _mm512_loadu_si512(positions + k);
      const __m512i a = _mm512_and_si512(at_positions ? load16_words<W>(at_positions + k * sizeof(W))
                                                      : _mm512_mask_i32gather_epi32(zero, all16, p, base, sizeof(W)),
                                         mag);
      __m512i cls = zero;
      for (unsigned j = 0; j < T; ++j) cls = _mm512_mask_add_epi32(cls, _mm512_cmpge_epu32_mask(a, t[j]), cls, one32);
      const __m512i block = _mm512_maskz_srli_epi32(all16, _mm512_sub_epi32(p, at), 6);
      const __m512i slot = _mm512_add_epi32(_mm512_maskz_slli_epi32(all16, block, 4), cls);
      const __m512i before = _mm512_mask_i32gather_epi32(zero, all16, slot, cb.before, 4);
      const __m256i slot_lo = _mm512_maskz_extracti64x4_epi64(0xF, slot, 0), slot_hi = _mm512_maskz_extracti64x4_epi64(0xF, slot, 1);
      const __m512i own_lo = _mm512_mask_i32gather_epi64(zero, all8, slot_lo, cb.lanes, 8);
      const __m512i own_hi = _mm512_mask_i32gather_epi64(zero, all8, slot_hi, cb.lanes, 8);
      const __m512i lane = _mm512_and_si512(p, low6);
      const __m512i lane_lo = _mm512_maskz_cvtepu32_epi64(all8, _mm512_maskz_extracti64x4_epi64(0xF, lane, 0));
      const __m512i lane_hi = _mm512_maskz_cvtepu32_epi64(all8, _mm512_maskz_extracti64x4_epi64(0xF, lane, 1));
      const __m512i below_lo = _mm512_sub_epi64(_mm512_maskz_sllv_epi64(all8, one64, lane_lo), one64);
      const __m512i below_hi = _mm512_sub_epi64(_mm512_maskz_sllv_epi64(all8, one64, lane_hi), one64);
      const __m256i n_lo = _mm512_maskz_cvtepi64_epi32(all8, _mm512_maskz_popcnt_epi64(all8, _mm512_and_si512(own_lo, below_lo)));
      const __m256i n_hi = _mm512_maskz_cvtepi64_epi32(all8, _mm512_maskz_popcnt_epi64(all8, _mm512_and_si512(own_hi, below_hi)));
      const __m512i n = _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(n_lo), n_hi, 1);
      _mm512_storeu_si512(ranks_out + k, _mm512_add_epi32(before, n));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(classes_out + k), _mm512_maskz_cvtepi32_epi8(all16, cls));
    }
    for (; k < n_pos && positions[k] < end; ++k) {
      const std::uint64_t p = positions[k];
      const unsigned cls = class_of(at_positions ? load_word<W>(at_positions, k) : load_word<W>(base, p));
      const std::size_t slot = ((p - first) >> 6) * S + cls;
      classes_out[k] = static_cast<std::uint8_t>(cls);
      ranks_out[k] = cb.before[slot] + static_cast<unsigned>(std::popcount(cb.lanes[slot] & below(static_cast<unsigned>(p & 63))));
    }
  }
  _mm512_store_si512(running, run0);
  _mm512_store_si512(running + 8, run1);
  for (unsigned j = 0; j < K; ++j) totals[j] = running[j];
}
#endif

/// Calls f(type tag) with the unsigned integer type of element size E (1, 2, 4, 8).
template <class F>
decltype(auto) with_word(std::size_t E, F&& f) {
  switch (E) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    default: return f(std::uint64_t{});
  }
}

}  // namespace detail

/// For the changed elements at `positions` (strictly ascending, < m) of `base` (m elements of format
/// f): classes_out[k] = class of base element p_k, ranks_out[k] = totals[class] + number of elements
/// before p_k in this range of the same class. Then totals[k] += elements of class k in the range
/// (so a range processed in consecutive slices yields ranks relative to the first slice).
/// `base_at_positions`: empty, or the base elements at the positions, in order (E bytes each, so
/// base_at_positions[k] = base element p_k); when given, the classes are read from it rather than
/// from the base. Same outputs either way.
/// @pre base 8-byte aligned or not (any), totals.size() >= spec.count, outputs >= positions.size(),
///      base_at_positions empty or positions.size() · E bytes.
inline void rank_by_class(std::span<const std::byte> base, const float_format& f, const class_spec& spec,
                          std::span<const std::uint32_t> positions, std::span<const std::byte> base_at_positions,
                          std::span<std::uint8_t> classes_out, std::span<std::uint32_t> ranks_out, std::span<std::uint64_t> totals) {
  if (!base_at_positions.empty() && base_at_positions.size() != positions.size() * f.element_size)
    throw error(errc::invalid_argument, "rank_by_class: base_at_positions must hold one base element per position");
  const std::size_t m = base.size() / f.element_size;
  if (spec.count == 1) {
    // one class: every element is in it, so a change's class rank is its position. The base is
    // not read (at 1 % change the scan of the base cost about as much as change detection).
    // Two plain loops over plain pointers: a byte store through classes_out may alias anything, so
    // one fused loop reloaded the spans' pointers every step and did not vectorise (3 % of an
    // encode at 5 % change, as much as change detection's own loop).
    const auto r0 = static_cast<std::uint32_t>(totals[0]);
    const std::uint32_t* p = positions.data();
    std::uint32_t* r = ranks_out.data();
    const std::size_t n = positions.size();
    if (n) std::memset(classes_out.data(), 0, n);
    for (std::size_t k = 0; k < n; ++k) r[k] = r0 + p[k];
    totals[0] += m;
    return;
  }
  const auto c = detail::thresholds_of(f, spec);
  const std::byte* at = base_at_positions.empty() ? nullptr : base_at_positions.data();
  detail::with_word(f.element_size, [&](auto w) {
    using W = decltype(w);
    const std::byte* p = base.data();
    const std::uint32_t* pos = positions.data();
    const std::size_t n = positions.size();
#ifdef BITREFIT_CODEC_X86
    if constexpr (sizeof(W) == 2 || sizeof(W) == 4)
      if (cpu_avx512_vpopcnt() && m <= (std::size_t{1} << 31))
        return detail::rank_avx512<W>(p, m, c, pos, at, n, classes_out.data(), ranks_out.data(), totals.data());
#endif
    if (cpu_v3()) detail::rank_v3<W>(p, m, c, pos, at, n, classes_out.data(), ranks_out.data(), totals.data());
    else detail::rank_generic<W>(p, m, c, pos, at, n, classes_out.data(), ranks_out.data(), totals.data());
  });
}

/// Picks a class_spec for format f from a sample: `base_exponents` (histogram of the exponent
/// field over sampled base elements, f.exponents() entries) and `changed_exponents` (the same over
/// the sampled changed elements' base values). Minimises, over partitions of the exponent range
/// into at most `max_classes` contiguous buckets, the ideal position cost sum_k n_k·H(c_k / n_k)
/// scaled to the item (`scale_num / scale_den`) plus `class_overhead_q8` per class (its tables).
/// Deterministic (integer costs). Exponents are grouped into at most 64 runs of equal weight first.
inline class_spec choose_class_spec(const float_format& f, std::span<const std::uint64_t> base_exponents,
                                    std::span<const std::uint64_t> changed_exponents, unsigned max_classes,
                                    std::uint64_t scale_num, std::uint64_t scale_den, std::uint64_t class_overhead_q8) {
  if (base_exponents.size() != f.exponents() || changed_exponents.size() != f.exponents())
    throw error(errc::invalid_argument, "class choice: exponent histograms of " + std::to_string(base_exponents.size()) + " and " +
                                            std::to_string(changed_exponents.size()) + " entries for a format of " + std::to_string(f.exponents()),
                {.file = {}, .tensor = {}, .field = "exponents"});
  class_spec best;
  max_classes = std::clamp(max_classes, 1u, max_base_classes);
  // groups of consecutive exponents: start exponent, n, c
  struct group {
    std::uint64_t first, n, c;
  };
  std::vector<group> gs;
  std::uint64_t total = 0;
  for (auto v : base_exponents) total += v;
  if (total == 0 || max_classes == 1) return best;
  const std::uint64_t target = std::max<std::uint64_t>(1, total / 64);
  for (std::size_t e = 0; e < base_exponents.size(); ++e) {
    if (!base_exponents[e] && !changed_exponents[e]) continue;
    if (gs.empty() || gs.back().n >= target) gs.push_back({e, 0, 0});
    gs.back().n += base_exponents[e];
    gs.back().c += changed_exponents[e];
  }
  const std::size_t G = gs.size();
  if (G <= 1) return best;
  // prefix sums
  std::vector<std::uint64_t> pn(G + 1, 0), pc(G + 1, 0);
  for (std::size_t i = 0; i < G; ++i) pn[i + 1] = pn[i] + gs[i].n, pc[i + 1] = pc[i] + gs[i].c;
  auto cost = [&](std::size_t a, std::size_t b) {  // groups [a, b)
    const std::uint64_t n = pn[b] - pn[a], c = std::min(pc[b] - pc[a], n);
    const unsigned __int128 h = static_cast<unsigned __int128>(binary_entropy_q8(n, c)) * scale_num / std::max<std::uint64_t>(1, scale_den);
    return static_cast<std::uint64_t>(h) + class_overhead_q8;
  };
  const std::size_t K = std::min<std::size_t>(max_classes, G);
  constexpr std::uint64_t inf = ~0ull;
  // dp[k][i]: best cost of groups [0, i) in k buckets; cut[k][i]: start of the last bucket
  std::vector<std::vector<std::uint64_t>> dp(K + 1, std::vector<std::uint64_t>(G + 1, inf));
  std::vector<std::vector<std::size_t>> cut(K + 1, std::vector<std::size_t>(G + 1, 0));
  dp[0][0] = 0;
  for (std::size_t k = 1; k <= K; ++k)
    for (std::size_t i = k; i <= G; ++i)
      for (std::size_t j = k - 1; j < i; ++j) {
        if (dp[k - 1][j] == inf) continue;
        const std::uint64_t v = dp[k - 1][j] + cost(j, i);
        if (v < dp[k][i]) dp[k][i] = v, cut[k][i] = j;
      }
  std::size_t bk = 1;
  for (std::size_t k = 2; k <= K; ++k)
    if (dp[k][G] < dp[bk][G]) bk = k;
  best.count = static_cast<std::uint8_t>(bk);
  std::size_t i = G;
  for (std::size_t k = bk; k > 1; --k) {
    const std::size_t j = cut[k][i];
    best.thresholds[k - 2] = static_cast<std::uint16_t>(gs[j].first);
    i = j;
  }
  return best;
}

}  // namespace bitrefit::codec
