// bitrefit/codec/conditioned.hpp — base-conditioned item coding: changed positions coded per class
// of the base value, new values as signed ULP distances from the base value.
//
// Used only where XOR is (the receiver holds exactly the base version, bit-preservingly, and the
// whole item range): the decoder reads the base bits of the item's range. Both ends compute each
// element's class (base_classes.hpp) from the base; the changed elements of class k, numbered in
// range order within their class, are coded as gaps in that numbering with class k's statistics,
// and each change's value as the signed ULP distance d from its base value (ulp.hpp), with class
// k's statistics too (on AdamW deltas, low-exponent classes both change more often and move by more
// ULPs). An escape carries the new pattern verbatim (sign change, NaN/inf on either side).
//
// Sections (both stored raw: an rANS stream does not shrink under zstd):
//   location (location_coding::class_gaps):
//     u8 K (1..16); K-1 varint exponent thresholds (class_spec); per class k: varint c_k (its
//     changed elements) and, if c_k > 0: u8 shift s_k (0..31, plus 0x80 when class k's two streams
//     are 16-lane streams, plus 0x40 when its two tables are predicted tables), the gap table and
//     varint length of class k's stream;
//     then the K streams, class 0 first. Stream k codes the changes of class k in rank order: symbol
//     bucket(g >> s_k), its extra bits, then the low s_k bits of g, where g = rank - previous rank
//     - 1 (previous = -1 at the start of the class).
//   values (value_coding::ulp_distance):
//     per class with c_k > 0: the value table and varint length of its stream; then the streams,
//     same order as the gaps: symbol 1 + 2·bucket(|d| - 1) + (d < 0) and its extra bits, or the
//     escape symbol 0 and the new pattern's 8E raw bits.
//   Tables (rans.hpp): a log-scale count code per symbol up to the last used one, normalised
//   alike on both ends; with flag 0x40 (every encoder since 2026-12-05) as differences from a
//   prediction (write_predicted_table, gap_code_prediction / value_code_prediction) and the scale
//   derived from c_k (scale_bits_for); without it (items written before) one byte per code after a
//   scale byte (write_table).
//   bucket(u): u < 16 is its own symbol; else with b = floor(log2 u): symbol 16 + 2(b - 4) + bit
//   (b-1) of u, followed by the b-1 bits below it raw (a log scale with one mantissa bit).
//   One stream per class lets the encoder code every change in one backward pass over positions
//   (each symbol goes to its class's coder) and the decoder run the classes' states independently.
//   A stream is one rANS state (rans.hpp), or, for a class of at least lanes_min_changes changes
//   in a format of up to 2 bytes, sixteen states (rans_lanes.hpp: change t in lane t mod 16; each
//   raw field as its low min(w, 15) bits, then the rest) that AVX-512 codes sixteen changes at a
//   time: 0.63-0.70x the encode time at 3-5 % (bench/codec/README.md, "Sixteen lanes"). The frame
//   format version stays 2: every item without the flag is unchanged, and a reader from before the
//   flag refuses a flagged item by name ("gap shift 128+s above 31", errc::format).
//
// Decode cost: the rANS streams (one table lookup and multiply per symbol), then one pass over the
// base range in 64-element blocks (threshold masks, one popcount per class per block) that maps
// class ranks back to positions in ascending order; with one class (K = 1) ranks are positions and
// only the changed elements' base values are read (the encoder skips its pass over the base too).
// Extra receiver memory: O(changed) for the decoded ranks and values (bounded by the item range,
// i.e. by the frame's input bound) and the decoder tables (at most 2·16 tables of 2^15 16-bit
// slots, and while a 16-lane class decodes, its two vector tables of 2^15 8-byte slots); the base
// is read in place.
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

#include "bitrefit/codec/base_classes.hpp"
#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/fixed_log2.hpp"
#include "bitrefit/codec/isa.hpp"
#include "bitrefit/codec/rans.hpp"
#include "bitrefit/codec/rans_lanes.hpp"
#include "bitrefit/codec/ulp.hpp"
#include "bitrefit/core/error.hpp"

#ifdef BITREFIT_CODEC_X86
#include <immintrin.h>
#endif

namespace bitrefit::codec {

namespace conditioned_detail {

inline constexpr unsigned direct = 16;  // symbols 0..15 are values 0..15

/// Number of bucket symbols for values below 2^bits.
constexpr unsigned bucket_alphabet(unsigned bits) noexcept { return bits <= 4 ? (1u << bits) : direct + 2 * (bits - 4); }

struct bucketed {
  std::uint32_t symbol;
  unsigned extra_bits;
  std::uint64_t extra;
};
BITREFIT_INLINE bucketed bucket(std::uint64_t u) noexcept {
  if (u < direct) return {static_cast<std::uint32_t>(u), 0, 0};
  const unsigned b = static_cast<unsigned>(std::bit_width(u)) - 1;  // >= 4
  return {direct + 2 * (b - 4) + static_cast<std::uint32_t>((u >> (b - 1)) & 1), b - 1, u & ((std::uint64_t{1} << (b - 1)) - 1)};
}
inline unsigned extra_bits_of(std::uint32_t sym) noexcept { return sym < direct ? 0 : 4 + (sym - direct) / 2 - 1; }
/// The raw bits that follow a gap symbol in a class with gap shift `shift`, and a value symbol
/// (the escape, symbol 0: the new pattern's `escape_bits`; else the ULP bucket's extra bits).
inline unsigned gap_raw_bits(std::uint32_t sym, unsigned shift) noexcept { return extra_bits_of(sym) + shift; }
inline unsigned value_raw_bits(std::uint32_t sym, unsigned escape_bits) noexcept { return sym == 0 ? escape_bits : extra_bits_of((sym - 1) / 2); }
inline std::uint64_t unbucket(std::uint32_t sym, std::uint64_t extra) noexcept {
  if (sym < direct) return sym;
  const unsigned b = 4 + (sym - direct) / 2;
  return (std::uint64_t{1} << b) | (std::uint64_t{(sym - direct) & 1} << (b - 1)) | extra;
}

inline constexpr unsigned gap_alphabet = bucket_alphabet(32);  // gaps < 2^32
inline unsigned value_alphabet(const float_format& f) noexcept {
  return 2 * bucket_alphabet(8 * f.element_size - 1) + 1;  // escape, then |d| - 1 < 2^(8E-1) with a sign
}

inline std::uint64_t load_bits(const std::byte* p, unsigned E) noexcept {
  std::uint64_t v = 0;
  std::memcpy(&v, p, E);  // little-endian hosts only (the codec's frame format is little-endian)
  return v;
}
inline void store_bits(std::byte* p, std::uint64_t v, unsigned E) noexcept { std::memcpy(p, &v, E); }

/// Value symbol and its extra bits for a change o -> n.
struct value_code {
  std::uint32_t symbol;
  unsigned extra_bits;
  std::uint64_t extra;
};
BITREFIT_INLINE value_code code_value(const float_format& f, std::uint64_t o, std::uint64_t n, std::uint32_t escape_symbol) noexcept {
  // same sign, both finite: distance; otherwise escape (ulp.hpp)
  if (((o ^ n) & f.sign_bit) || f.magnitude(o) >= f.special || f.magnitude(n) >= f.special) [[unlikely]]
    return {escape_symbol, 8 * f.element_size, n};
  // branch-free (the direction of a change is a coin flip): diff = mag(n) - mag(o), |d| = |diff|,
  // d < 0 iff the magnitude falls for a positive value or rises for a negative one
  const auto diff = static_cast<std::int64_t>(f.magnitude(n) - f.magnitude(o));
  const std::uint64_t neg = static_cast<std::uint64_t>(diff >> 63);  // all ones when diff < 0
  const std::uint64_t u = ((static_cast<std::uint64_t>(diff) ^ neg) - neg) - 1;
  const std::uint32_t negative_d = static_cast<std::uint32_t>((neg & 1) ^ (f.negative(o) ? 1u : 0u));
  const bucketed b = bucket(u);
  return {1 + 2 * b.symbol + negative_d, b.extra_bits, b.extra};
}

/// Table precision for a class: enough slots for its symbols, about log2 of its count (bigger
/// tables cost header bytes; smaller ones quantise the probabilities of rare symbols).
inline unsigned scale_bits_for(std::uint64_t count, std::size_t used) noexcept {
  const unsigned want = std::min<unsigned>(14, static_cast<unsigned>(std::bit_width(count)) + 1);
  return std::clamp<unsigned>(std::max<unsigned>(want, static_cast<unsigned>(std::bit_width(used))), 1, rans::max_scale_bits);
}

#ifdef BITREFIT_CODEC_X86
/// BMI2 parallel bit deposit; only called from code compiled for x86-64-v3 (it inlines there).
__attribute__((target("bmi2"))) inline std::uint64_t pdep64(std::uint64_t v, std::uint64_t mask) noexcept { return _pdep_u64(v, mask); }
#endif

/// Position of the r-th set bit (r < popcount(x)).
inline unsigned select_bit(std::uint64_t x, unsigned r) noexcept {
  for (unsigned byte = 0;; ++byte) {
    const auto v = static_cast<std::uint8_t>(x >> (8 * byte));
    const unsigned pc = static_cast<unsigned>(std::popcount(v));
    if (r < pc) {
      std::uint32_t w = v;
      for (unsigned i = 0; i < r; ++i) w &= w - 1;
      return 8 * byte + static_cast<unsigned>(std::countr_zero(w));
    }
    r -= pc;
  }
}

/// The low bits of `bits`, in order, moved to the set bits of `mask`, in order (x86 BMI2 pdep;
/// V3 = false: one select_bit per set bit of `bits`, for CPUs without BMI2). Bits of `bits` past
/// popcount(mask) are dropped.
template <bool V3>
BITREFIT_INLINE std::uint64_t deposit(std::uint64_t bits, std::uint64_t mask) noexcept {
#ifdef BITREFIT_CODEC_X86
  if constexpr (V3) return pdep64(bits, mask);
#endif
  bits &= mask == ~0ull ? ~0ull : (std::uint64_t{1} << std::popcount(mask)) - 1;
  std::uint64_t r = 0;
  while (bits) {
    r |= std::uint64_t{1} << select_bit(mask, static_cast<unsigned>(std::countr_zero(bits)));
    bits &= bits - 1;
  }
  return r;
}

}  // namespace conditioned_detail

/// Value codes of 1- and 2-byte formats fit one 32-bit word (see conditioned_encoder::vcode_).
template <class W>
inline constexpr bool packed_values = sizeof(W) <= 2;

namespace conditioned_detail {

/// Where pass 1 of conditioned_encoder::encode_typed writes: per change, in class-major order, its
/// gap and value code (vextra: the extra bits of formats wider than 2 bytes; each class's region
/// followed by class_pad slots of scratch), and four copies of
/// each histogram (copy i & 3 for change i: no chain of increments to the same bin; most changes
/// have the same symbols), class k's bins at k·gap_alphabet and k·VA.
struct pass1_out {
  std::uint32_t* gaps;
  std::uint32_t* vcode;
  std::uint64_t* vextra;
  std::array<std::uint64_t*, 4> gh, vh;
};
/// Slots after each class's changes in pass 1's class-major outputs (gaps, vcode, vextra): the
/// several-class kernel stores sixteen words at a class's next slot whatever the class's share of
/// them, so up to fifteen words past the class's last change may be overwritten. Why: its masked
/// stores (two per class present in each sixteen changes) were the hottest instructions of pass 1
/// on AdamW-like items of four classes; plain stores took 0.97x the encode time (paired tool, Zen 5).
inline constexpr std::size_t class_pad = 16;
/// Per class: the next change's slot in class-major order and its previous rank + 1.
struct pass1_state {
  std::array<std::uint64_t, max_base_classes> slot{};
  std::array<std::uint32_t, max_base_classes> next{};
};

/// A change of class k with class rank r: its gap after the class's previous change, stored at
/// the class's next slot (returned) and counted in histogram copy `copy`.
BITREFIT_INLINE std::uint64_t place_gap(unsigned k, std::uint32_t r, const unsigned* shift, unsigned copy, pass1_state& st,
                                        const pass1_out& o) noexcept {
  const std::uint32_t g = r - st.next[k];
  st.next[k] = r + 1;
  const std::uint64_t j = st.slot[k]++;
  o.gaps[j] = g;
  ++o.gh[copy][k * gap_alphabet + bucket(g >> shift[k]).symbol];
  return j;
}

/// Pass 1 over changes [begin, end), any class count and format.
template <class W>
BITREFIT_INLINE void code_changes(const float_format& f, const unsigned* shift, const std::uint8_t* cls, const std::uint32_t* rk,
                                  const std::byte* ov, const std::byte* nv, std::size_t begin, std::size_t end, pass1_state& st,
                                  const pass1_out& o) noexcept {
  constexpr std::uint32_t escape = 0;
  const unsigned VA = value_alphabet(f);
  for (std::size_t i = begin; i < end; ++i) {
    const unsigned k = cls[i];
    const std::uint64_t j = place_gap(k, rk[i], shift, i & 3, st, o);
    const value_code v = code_value(f, detail::load_word<W>(ov, i), detail::load_word<W>(nv, i), escape);
    ++o.vh[i & 3][k * VA + v.symbol];
    if constexpr (packed_values<W>) {
      o.vcode[j] = v.symbol | (v.extra_bits << 8) | (static_cast<std::uint32_t>(v.extra) << 13);
    } else {
      o.vcode[j] = v.symbol | (v.extra_bits << 16);
      o.vextra[j] = v.extra;
    }
  }
}

#ifdef BITREFIT_CODEC_X86
/// bucket() of sixteen 32-bit values: u < 16 is its own symbol; else, with b = floor(log2 u), symbol
/// 16 + 2(b - 4) + bit b-1 of u, and b - 1 extra bits (u's bits below bit b-1).
struct bucketed16 {
  __m512i symbol, extra_bits, extra;
};
// The kernels below use the zero-masked forms of shifts and conversions with every lane selected
// (`every_lane`): GCC 12's unmasked forms start from an "undefined" vector that -Wall reports as
// maybe-uninitialized wherever they are inlined.
inline constexpr __mmask16 every_lane = 0xFFFF;
__attribute__((target("avx512f,avx512cd"), always_inline)) inline bucketed16 bucket16_avx512(__m512i u) noexcept {
  const __m512i one = _mm512_set1_epi32(1);
  const __mmask16 small = _mm512_cmplt_epu32_mask(u, _mm512_set1_epi32(static_cast<int>(direct)));
  const __mmask16 big = static_cast<__mmask16>(~small);
  const __m512i b1 = _mm512_sub_epi32(_mm512_set1_epi32(30), _mm512_maskz_lzcnt_epi32(every_lane, u));  // b - 1 (u = 0: small)
  const __m512i bit = _mm512_and_si512(_mm512_maskz_srlv_epi32(every_lane, u, b1), one);
  const __m512i symbol = _mm512_add_epi32(_mm512_add_epi32(_mm512_maskz_slli_epi32(every_lane, b1, 1), _mm512_set1_epi32(10)), bit);
  const __m512i low = _mm512_sub_epi32(_mm512_maskz_sllv_epi32(every_lane, one, b1), one);
  return {_mm512_mask_mov_epi32(symbol, small, u), _mm512_maskz_mov_epi32(big, b1), _mm512_maskz_and_epi32(big, u, low)};
}

/// bucket() of eight 32-bit values with AVX2 (no lane-wise lzcnt): floor(log2 u) from the exponent
/// of float(u >> 1), one less where the conversion rounded up (u >> b is then 0). Only lanes with
/// u >= 16 use it; the others are their own symbol.
struct bucketed8 {
  __m256i symbol, extra_bits, extra;
};
__attribute__((target("avx2"), always_inline)) inline bucketed8 bucket8_v3(__m256i u) noexcept {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i small = _mm256_cmpeq_epi32(_mm256_min_epu32(u, _mm256_set1_epi32(static_cast<int>(direct - 1))), u);
  const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(_mm256_srli_epi32(u, 1))), 23), _mm256_set1_epi32(126));
  const __m256i b = _mm256_add_epi32(e, _mm256_cmpeq_epi32(_mm256_srlv_epi32(u, e), _mm256_setzero_si256()));  // floor(log2 u)
  const __m256i b1 = _mm256_sub_epi32(b, one);
  const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(u, b1), one);
  const __m256i symbol = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(b1, 1), _mm256_set1_epi32(10)), bit);
  const __m256i low = _mm256_sub_epi32(_mm256_sllv_epi32(one, b1), one);
  return {_mm256_blendv_epi8(symbol, u, small), _mm256_andnot_si256(small, b1), _mm256_andnot_si256(small, _mm256_and_si256(u, low))};
}
/// code_value() of sixteen changes of a 2-byte format (old and new patterns zero-extended to 32
/// bits), packed as in vcode (symbol | extra bit count << 8 | extra bits << 13): escape (symbol 0,
/// the new pattern's 16 bits) on a sign change or inf/NaN on either side, else the signed ULP
/// distance d: symbol 1 + 2·bucket(|d| - 1) + (d < 0).
__attribute__((target("avx512f,avx512cd"), always_inline)) inline __m512i value_codes16_avx512(const float_format& f, __m512i ow,
                                                                                               __m512i nw) noexcept {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i mag = _mm512_set1_epi32(static_cast<int>(f.magnitude_mask)), special = _mm512_set1_epi32(static_cast<int>(f.special));
  const __m512i mo = _mm512_and_si512(ow, mag), mn = _mm512_and_si512(nw, mag);
  const __mmask16 esc = _mm512_test_epi32_mask(_mm512_xor_si512(ow, nw), _mm512_set1_epi32(static_cast<int>(f.sign_bit))) |
                        _mm512_cmpge_epu32_mask(mo, special) | _mm512_cmpge_epu32_mask(mn, special);
  const __m512i diff = _mm512_sub_epi32(mn, mo);
  const __m512i neg = _mm512_maskz_srai_epi32(every_lane, diff, 31);
  const __m512i u = _mm512_sub_epi32(_mm512_sub_epi32(_mm512_xor_si512(diff, neg), neg), one);
  const __m512i negative_d = _mm512_xor_si512(_mm512_and_si512(neg, one), _mm512_maskz_srli_epi32(every_lane, ow, 15));
  const bucketed16 vb = bucket16_avx512(u);
  const __m512i symbol = _mm512_add_epi32(_mm512_add_epi32(_mm512_maskz_slli_epi32(every_lane, vb.symbol, 1), one), negative_d);
  const __m512i code = _mm512_or_si512(_mm512_or_si512(symbol, _mm512_maskz_slli_epi32(every_lane, vb.extra_bits, 8)),
                                       _mm512_maskz_slli_epi32(every_lane, vb.extra, 13));
  return _mm512_mask_mov_epi32(code, esc, _mm512_or_si512(_mm512_set1_epi32(16 << 8), _mm512_maskz_slli_epi32(every_lane, nw, 13)));
}
/// extra_bits_of() of sixteen bucket symbols: 0 below 16, else (sym - 16) / 2 + 3.
__attribute__((target("avx512f"), always_inline)) inline __m512i extra_bits16_avx512(__m512i sym) noexcept {
  const __m512i sixteen = _mm512_set1_epi32(static_cast<int>(direct));
  return _mm512_maskz_add_epi32(_mm512_cmpge_epu32_mask(sym, sixteen), _mm512_maskz_srli_epi32(every_lane, _mm512_sub_epi32(sym, sixteen), 1),
                                _mm512_set1_epi32(3));
}

/// h[s] += how many of the first `len` (<= 64) bytes at `sym` equal s, for every s. Symbols below
/// `dense` are counted with one byte compare and a popcount each per 64 bytes, the rest one by one.
/// Why: one increment per symbol (extract the byte, load-add-store the bin) was most of pass 1's
/// time (perf, one class at 5 %). The gap shift keeps the mean gap >> shift in [4, 8), so gap
/// symbols are mostly below 24; value symbols of +-1..4 ULP are 1..8.
/// @pre dense <= the alphabet h counts (h[s] is written for every s < dense).
__attribute__((target("avx512f,avx512bw,popcnt"))) inline void count_symbols_avx512(const std::uint8_t* sym, unsigned len, unsigned dense,
                                                                                   std::uint64_t* h) noexcept {
  const __mmask64 valid = len >= 64 ? ~__mmask64{0} : (__mmask64{1} << len) - 1;
  const __m512i v = _mm512_maskz_loadu_epi8(valid, sym);
  for (unsigned s = 0; s < dense; ++s)
    h[s] += static_cast<unsigned>(std::popcount(static_cast<std::uint64_t>(_mm512_mask_cmpeq_epi8_mask(valid, v, _mm512_set1_epi8(static_cast<char>(s))))));
  for (std::uint64_t rest = _mm512_mask_cmpge_epu8_mask(valid, v, _mm512_set1_epi8(static_cast<char>(dense))); rest; rest &= rest - 1)
    ++h[sym[std::countr_zero(rest)]];
}
inline constexpr unsigned dense_gap_symbols = 24;
inline constexpr unsigned dense_value_symbols = 9;

/// Pass 1 of a 2-byte format, sixteen changes per step, with the symbols' floor(log2) from
/// AVX-512CD's lzcnt: the first c - c % 16 changes, returned; code_changes does the rest, with the
/// same outputs (tests/codec: Kernels.PassOneOfEveryVariantEqualsTheScalarOne). All scalar, pass 1
/// cost about 13 cycles per change (perf, one class at 5 %: a quarter of encode).
/// One class (K = 1): the slot is the change index, and gaps and gap symbols are vector work too.
__attribute__((target("avx512f,avx512bw,avx512cd,avx512vl"))) inline std::size_t one_class_codes_16_avx512(
    const float_format& f, unsigned shift, const std::uint32_t* rk, const std::byte* ov, const std::byte* nv, std::size_t c,
    const pass1_out& o) noexcept {
  const std::size_t n = c / 16 * 16;
  const __m512i one = _mm512_set1_epi32(1);
  const __m128i gshift = _mm_cvtsi32_si128(static_cast<int>(shift));
  __m512i prev = _mm512_set1_epi32(-1);  // lane 15: the rank before the first change, -1
  // The symbols of 64 changes are counted together (count_symbols_avx512) into histograms on the
  // stack, added to copy 0 at the end: nothing in the loop stores through a uint64_t pointer, which
  // could alias `f`'s fields and made the compiler reload them every sixteen changes.
  alignas(64) std::uint8_t gsym[64], vsym[64];
  std::uint64_t gh[gap_alphabet] = {}, vh[2 * bucket_alphabet(15) + 1] = {};
  static_assert(dense_gap_symbols <= gap_alphabet && dense_value_symbols <= std::size(vh));
  if (value_alphabet(f) != std::size(vh)) return 0;  // not a 2-byte format: code_changes does it all
  const float_format fl = f;  // a copy: stores through o.gaps and o.vcode could alias f's fields
  for (std::size_t i = 0; i < n;) {
    const std::size_t group_end = std::min(n, i + 64);
    unsigned fill = 0;
    for (; i < group_end; i += 16, fill += 16) {
      // gaps: rank - previous rank - 1
      const __m512i r = _mm512_loadu_si512(rk + i);
      const __m512i before = _mm512_maskz_alignr_epi32(every_lane, r, prev, 15);
      prev = r;
      const __m512i g = _mm512_sub_epi32(_mm512_sub_epi32(r, before), one);
      _mm512_storeu_si512(o.gaps + i, g);
      _mm_store_si128(reinterpret_cast<__m128i*>(gsym + fill),
                      _mm512_maskz_cvtepi32_epi8(every_lane, bucket16_avx512(_mm512_maskz_srl_epi32(every_lane, g, gshift)).symbol));
      const __m512i code = value_codes16_avx512(fl, load16_words<std::uint16_t>(ov + 2 * i), load16_words<std::uint16_t>(nv + 2 * i));
      _mm512_storeu_si512(o.vcode + i, code);
      _mm_store_si128(reinterpret_cast<__m128i*>(vsym + fill),
                      _mm512_maskz_cvtepi32_epi8(every_lane, _mm512_and_si512(code, _mm512_set1_epi32(0xFF))));
    }
    count_symbols_avx512(gsym, fill, dense_gap_symbols, gh);
    count_symbols_avx512(vsym, fill, dense_value_symbols, vh);
  }
  for (unsigned s = 0; s < std::size(gh); ++s) o.gh[0][s] += gh[s];
  for (unsigned s = 0; s < std::size(vh); ++s) o.vh[0][s] += vh[s];
  return n;
}
/// Several classes, sixteen changes per step: the value codes, then per class present in the step
/// its changes compressed out in position order (vpcompressd of ranks and codes), their gaps
/// (rank - the class's previous rank - 1) and codes stored at the class's next slots (sixteen words
/// each time: the class_pad slots after a class absorb the rest), and their
/// gap and value symbols kept per class and counted 64 at a time (count_symbols_avx512). Why:
/// placing each change one by one (place_gap: the class's slot and previous rank through memory,
/// two bin increments) cost about 12 cycles per change, 0.98x a memcmp on AdamW-like items of four
/// classes against 0.36x for one class.
__attribute__((target("avx512f,avx512bw,avx512cd,avx512vl,popcnt"))) inline std::size_t class_codes_16_avx512(
    const float_format& f, unsigned K, const unsigned* shift, const std::uint8_t* cls, const std::uint32_t* rk, const std::byte* ov,
    const std::byte* nv, std::size_t c, pass1_state& st, const pass1_out& o) noexcept {
  const std::size_t n = c / 16 * 16;
  const unsigned VA = value_alphabet(f);
  if (VA < dense_value_symbols) return 0;  // count_symbols_avx512 writes that many bins
  const float_format fl = f;  // a copy: stores through the outputs could alias f's fields
  const __m512i one = _mm512_set1_epi32(1), low_byte = _mm512_set1_epi32(0xFF);
  // per class: symbols not yet counted (a step adds at most 16 to at most 48)
  alignas(64) std::uint8_t gsym[max_base_classes][64], vsym[max_base_classes][64];
  unsigned fill[max_base_classes] = {};
  std::uint64_t slot[max_base_classes];
  std::uint32_t next[max_base_classes];
  for (unsigned k = 0; k < K; ++k) slot[k] = st.slot[k], next[k] = st.next[k];
  auto count = [&](unsigned k) {
    count_symbols_avx512(gsym[k], fill[k], dense_gap_symbols, o.gh[0] + std::size_t{k} * gap_alphabet);
    count_symbols_avx512(vsym[k], fill[k], dense_value_symbols, o.vh[0] + std::size_t{k} * VA);
    fill[k] = 0;
  };
  for (std::size_t i = 0; i < n; i += 16) {
    const __m512i code = value_codes16_avx512(fl, load16_words<std::uint16_t>(ov + 2 * i), load16_words<std::uint16_t>(nv + 2 * i));
    const __m512i cl = _mm512_maskz_cvtepu8_epi32(every_lane, _mm_loadu_si128(reinterpret_cast<const __m128i*>(cls + i)));
    const __m512i r = _mm512_loadu_si512(rk + i);
    for (unsigned k = 0; k < K; ++k) {
      const __mmask16 m = _mm512_cmpeq_epi32_mask(cl, _mm512_set1_epi32(static_cast<int>(k)));
      if (!m) continue;
      const unsigned nk = static_cast<unsigned>(std::popcount(static_cast<unsigned>(m)));
      const __m512i rc = _mm512_maskz_compress_epi32(m, r);
      const __m512i cc = _mm512_maskz_compress_epi32(m, code);
      // lane 0's previous rank is the class's (next - 1, -1 before its first change)
      const __m512i before = _mm512_maskz_alignr_epi32(every_lane, rc, _mm512_set1_epi32(static_cast<int>(next[k] - 1)), 15);
      const __m512i g = _mm512_sub_epi32(_mm512_sub_epi32(rc, before), one);
      _mm512_storeu_si512(o.gaps + slot[k], g);
      _mm512_storeu_si512(o.vcode + slot[k], cc);
      const __m512i gs = bucket16_avx512(_mm512_maskz_srl_epi32(every_lane, g, _mm_cvtsi32_si128(static_cast<int>(shift[k])))).symbol;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(gsym[k] + fill[k]), _mm512_maskz_cvtepi32_epi8(every_lane, gs));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(vsym[k] + fill[k]), _mm512_maskz_cvtepi32_epi8(every_lane, _mm512_and_si512(cc, low_byte)));
      fill[k] += nk;
      slot[k] += nk;
      next[k] = rk[i + 31 - static_cast<unsigned>(std::countl_zero(static_cast<std::uint32_t>(m)))] + 1;
      if (fill[k] > 48) count(k);
    }
  }
  for (unsigned k = 0; k < K; ++k) {
    if (fill[k]) count(k);
    st.slot[k] = slot[k], st.next[k] = next[k];
  }
  return n;
}
/// The kernel for K classes: the first c - c % 16 changes (returned), leaving `st` as code_changes
/// would after them, so code_changes continues with the rest. The one-class kernel keeps its
/// gaps in registers, so its class's state is set here from its last change; this is the one
/// place that knows it (encode_typed and the kernel test both call it).
__attribute__((target("avx512f,avx512bw,avx512cd,avx512vl"))) inline std::size_t codes_16_avx512(
    const float_format& f, unsigned K, const unsigned* shift, const std::uint8_t* cls, const std::uint32_t* rk,
    const std::byte* ov, const std::byte* nv, std::size_t c, pass1_state& st, const pass1_out& o) noexcept {
  if (K > 1) return class_codes_16_avx512(f, K, shift, cls, rk, ov, nv, c, st, o);
  const std::size_t done = one_class_codes_16_avx512(f, shift[0], rk, ov, nv, c, o);
  if (done) st.slot[0] = done, st.next[0] = rk[done - 1] + 1;
  return done;
}

// Pass 1 with AVX2 (x86-64-v3 CPUs without AVX-512), eight changes per step: the same outputs as
// code_changes (tests/codec: Kernels.PassOneOfEveryVariantEqualsTheScalarOne). On an AVX2-only
// Zen 3 VM the scalar pass 1 was about 1.2 memcmp units of the adamw encode.
/// code_value() of eight changes of a 2-byte format (patterns zero-extended), packed as in vcode:
/// value_codes16_avx512 with AVX2. Magnitudes and `special` are below 2^15: signed compares.
BITREFIT_V3_INLINE __m256i value_codes8_v3(const float_format& f, __m256i ow, __m256i nw) noexcept {
  const __m256i one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
  const __m256i mag = _mm256_set1_epi32(static_cast<int>(f.magnitude_mask)), special1 = _mm256_set1_epi32(static_cast<int>(f.special) - 1);
  const __m256i mo = _mm256_and_si256(ow, mag), mn = _mm256_and_si256(nw, mag);
  const __m256i sign_change = _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_xor_si256(ow, nw), _mm256_set1_epi32(static_cast<int>(f.sign_bit))), zero),
                                               _mm256_cmpeq_epi32(zero, zero));
  const __m256i esc = _mm256_or_si256(sign_change, _mm256_or_si256(_mm256_cmpgt_epi32(mo, special1), _mm256_cmpgt_epi32(mn, special1)));
  const __m256i diff = _mm256_sub_epi32(mn, mo);
  const __m256i neg = _mm256_srai_epi32(diff, 31);
  const __m256i u = _mm256_sub_epi32(_mm256_sub_epi32(_mm256_xor_si256(diff, neg), neg), one);
  const __m256i negative_d = _mm256_xor_si256(_mm256_and_si256(neg, one), _mm256_srli_epi32(ow, 15));
  const bucketed8 vb = bucket8_v3(u);
  const __m256i symbol = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(vb.symbol, 1), one), negative_d);
  const __m256i code = _mm256_or_si256(_mm256_or_si256(symbol, _mm256_slli_epi32(vb.extra_bits, 8)), _mm256_slli_epi32(vb.extra, 13));
  return _mm256_blendv_epi8(code, _mm256_or_si256(_mm256_set1_epi32(16 << 8), _mm256_slli_epi32(nw, 13)), esc);
}
/// Eight 32-bit lanes (each below 256) stored as eight bytes at p.
BITREFIT_V3_INLINE void store_bytes8_v3(std::uint8_t* p, __m256i v) noexcept {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1, -1, -1, -1);
  const __m256i b = _mm256_shuffle_epi8(v, pick);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
/// count_symbols_avx512 for up to 32 symbols: h[s] += how many of the first `len` bytes at sym
/// equal s; 32 bytes are read (the caller's buffer holds them).
BITREFIT_V3_INLINE void count_symbols_v3(const std::uint8_t* sym, unsigned len, unsigned dense, std::uint64_t* h) noexcept {
  const std::uint32_t valid = len >= 32 ? ~0u : (1u << len) - 1;
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sym));
  for (unsigned s = 0; s < dense; ++s)
    h[s] += static_cast<unsigned>(__builtin_popcount(valid & static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(static_cast<char>(s)))))));
  // bytes >= dense (unsigned): max(v, dense) == v
  const __m256i d = _mm256_set1_epi8(static_cast<char>(dense));
  for (std::uint32_t rest = valid & static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(v, d), v))); rest; rest &= rest - 1)
    ++h[sym[std::countr_zero(rest)]];
}
/// [x0, r0 .. r6]: each lane's predecessor, x0 (broadcast) before lane 0.
BITREFIT_V3_INLINE __m256i shift_in_v3(__m256i r, __m256i x0) noexcept {
  return _mm256_blend_epi32(_mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6)), x0, 0x01);
}
BITREFIT_V3_INLINE __m256i load8_words16_v3(const std::byte* p) noexcept {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
/// Symbol counts of class k's gaps and value codes [b, e) in pass 1's class-major outputs, 32 at
/// a time (reads up to 7 slots past e: the class_pad slots).
BITREFIT_V3_INLINE void count_class_symbols_v3(const pass1_out& o, std::size_t b, std::size_t e, unsigned shift, std::uint64_t* gh,
                                               std::uint64_t* vh) noexcept {
  alignas(32) std::uint8_t gsym[32], vsym[32];
  const __m128i s = _mm_cvtsi32_si128(static_cast<int>(shift));
  const __m256i low_byte = _mm256_set1_epi32(0xFF);
  for (std::size_t j = b; j < e; j += 32) {
    const auto len = static_cast<unsigned>(std::min<std::size_t>(32, e - j));
    for (unsigned q = 0; q < len; q += 8) {
      store_bytes8_v3(gsym + q, bucket8_v3(_mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(o.gaps + j + q)), s)).symbol);
      store_bytes8_v3(vsym + q, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(o.vcode + j + q)), low_byte));
    }
    count_symbols_v3(gsym, len, dense_gap_symbols, gh);
    count_symbols_v3(vsym, len, dense_value_symbols, vh);
  }
}
/// Pass 1 of a 2-byte format, any number of classes, eight changes per step: the first c - c % 8
/// changes (returned), leaving `st` as code_changes would after them (class_codes_16_avx512's
/// scheme: per class present in a step, its changes packed by a lane permutation and stored whole
/// at the class's next slots, the class_pad slots absorbing the rest). The symbols are counted
/// afterwards, class by class over its contiguous slots (in the step loop, once per class present
/// in each step of eight, they cost more: 0.78 -> 0.54 memcmp units at adamw on the Zen 3 VM).
__attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt"))) inline std::size_t codes_8_v3(const float_format& f, unsigned K, const unsigned* shift,
                                                                                  const std::uint8_t* cls, const std::uint32_t* rk,
                                                                                  const std::byte* ov, const std::byte* nv, std::size_t c,
                                                                                  pass1_state& st, const pass1_out& o) noexcept {
  const std::size_t n = c / 8 * 8;
  const unsigned VA = value_alphabet(f);
  if (VA != 2 * bucket_alphabet(15) + 1) return 0;  // not a 2-byte format: code_changes does it all
  const float_format fl = f;  // a copy: stores through the outputs could alias f's fields
  const __m256i one = _mm256_set1_epi32(1);
  std::uint64_t slot[max_base_classes];
  std::uint32_t next[max_base_classes];
  for (unsigned k = 0; k < K; ++k) slot[k] = st.slot[k], next[k] = st.next[k];
  for (std::size_t i = 0; i < n; i += 8) {
    const __m256i code = value_codes8_v3(fl, load8_words16_v3(ov + 2 * i), load8_words16_v3(nv + 2 * i));
    const __m256i cl = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(cls + i)));
    const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rk + i));
    for (unsigned k = 0; k < K; ++k) {
      const auto m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(cl, _mm256_set1_epi32(static_cast<int>(k))))));
      if (!m) continue;
      const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(compress32x8.at[m])));
      const __m256i rc = _mm256_permutevar8x32_epi32(r, perm);
      // lane 0's previous rank is the class's (next - 1, -1 before its first change)
      const __m256i g = _mm256_sub_epi32(_mm256_sub_epi32(rc, shift_in_v3(rc, _mm256_set1_epi32(static_cast<int>(next[k] - 1)))), one);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.gaps + slot[k]), g);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.vcode + slot[k]), _mm256_permutevar8x32_epi32(code, perm));
      slot[k] += static_cast<unsigned>(std::popcount(m));
      next[k] = rk[i + 31 - static_cast<unsigned>(std::countl_zero(m))] + 1;
    }
  }
  // histograms on the stack, added to copy 0 (stores through uint64_t pointers into the outputs
  // could alias f's fields: the compiler would reload them)
  std::uint64_t gh[gap_alphabet], vh[2 * bucket_alphabet(15) + 1];
  for (unsigned k = 0; k < K; ++k) {
    std::fill(std::begin(gh), std::end(gh), 0), std::fill(std::begin(vh), std::end(vh), 0);
    count_class_symbols_v3(o, st.slot[k], slot[k], shift[k], gh, vh);
    for (unsigned s = 0; s < gap_alphabet; ++s) o.gh[0][std::size_t{k} * gap_alphabet + s] += gh[s];
    for (unsigned s = 0; s < VA; ++s) o.vh[0][std::size_t{k} * VA + s] += vh[s];
    st.slot[k] = slot[k], st.next[k] = next[k];
  }
  return n;
}
#endif

/// count[k] += changes of class k (< K) among the c class bytes. Pass 0 of encode_typed; as one
/// scalar loop that also kept each class's last rank it cost ~0.2x a memcmp of the chunk on AdamW
/// items of four classes, here K byte compares and popcounts per 64 changes (count_symbols_avx512:
/// every class byte is below K, so none is counted one by one).
#ifdef BITREFIT_CODEC_X86
__attribute__((target("avx512f,avx512bw,popcnt"))) inline void class_counts_avx512(const std::uint8_t* cls, std::size_t c, unsigned K,
                                                                                 std::uint64_t* count) noexcept {
  for (std::size_t i = 0; i < c; i += 64) count_symbols_avx512(cls + i, static_cast<unsigned>(std::min<std::size_t>(64, c - i)), K, count);
}
#endif
inline void class_counts_scalar(const std::uint8_t* cls, std::size_t c, unsigned K, std::uint64_t* count) noexcept {
  std::uint64_t sub[4][max_base_classes] = {};  // four copies: no chain of increments to one counter
  for (std::size_t i = 0; i < c; ++i) ++sub[i & 3][cls[i]];
  for (unsigned k = 0; k < K; ++k) count[k] += sub[0][k] + sub[1][k] + sub[2][k] + sub[3][k];
}
/// Adds to count[0..K) (callers start from zeros).
inline void class_counts(const std::uint8_t* cls, std::size_t c, unsigned K, std::uint64_t* count) noexcept {
#ifdef BITREFIT_CODEC_X86
  if (cpu_avx512bw()) return class_counts_avx512(cls, c, K, count);
#endif
  class_counts_scalar(cls, c, K, count);
}

/// Sixteen-lane streams (rans_lanes.hpp) for a class of at least this many changes, in formats of
/// up to 2 bytes (a value's raw field is at most 16 bits). Their larger final states (2 x 64 bytes
/// instead of 2 x 4) cost 120 bytes: at this size 0.2-0.5 % of the class's bytes (0.4-1 byte per
/// change), less above it, more below it (bench/codec/README.md "Sixteen lanes").
inline constexpr std::uint64_t lanes_min_changes = std::uint64_t{1} << 16;
/// The shift byte's flag: this class's two streams are 16-lane streams.
inline constexpr unsigned lanes_flag = 0x80;
/// The shift byte's flag: this class's gap and value tables are predicted tables
/// (rans::write_predicted_table with gap_code_prediction and value_code_prediction; their scale is
/// scale_bits_for(c_k, used symbols)). Every encoder since it was added sets it; a class without it
/// has write_table's tables (items written before), which the decoder still reads.
inline constexpr unsigned predicted_tables_flag = 0x40;
/// The shift itself: the shift byte's bits below its flags.
inline constexpr unsigned shift_mask = 0x3F;

/// Predictions of count codes (rans.hpp, count_code: 8·log2(count) + 1) from the codes before.
/// Gap symbols: the previous code minus 2. After the gap shift the mean gap is 4-8 units, so the
/// counts of symbols 0..15 fall roughly geometrically, ~1/7 per symbol, which is about 2 codes
/// (measured on a real AdamW run's tables: -2 gave the fewest bits of the offsets 0 to -4).
inline int gap_code_prediction(const std::uint8_t* codes, std::size_t i) noexcept {
  return i == 0 ? -1 : std::max(0, int{codes[i - 1]} - 2);
}
/// Value symbols: 0 is the escape and 1 + 2·bucket + sign the rest (value_symbol), so the count of
/// a negative distance (even symbol) is predicted by the positive one just before it, and a
/// positive distance by the positive distance one bucket smaller; the escape and the first
/// distance have none.
inline int value_code_prediction(const std::uint8_t* codes, std::size_t i) noexcept {
  if (i < 2) return -1;
  return i % 2 == 0 ? int{codes[i - 1]} : int{codes[i - 2]};
}

/// A class's schedule in 16-lane streams: change t is lane t mod 16 of group t / 16; per group the
/// decoder runs, on the gap stream, the gap symbols, then the low min(w, 15) bits of each gap's raw
/// field (w = its bucket's extra bits + shift <= 30), then the rest; on the value stream, the value
/// symbols, then the low min(w, 15) bits of each value's raw field (w <= 16), then the rest. The
/// encoder runs it backwards (groups, and operations within a group).
struct lane_fields {
  std::array<std::uint32_t, 16> gsym, graw, gbits, vsym, vraw, vbits;
};
/// One group of r <= 16 changes (gaps and value codes at its first change), scalar.
BITREFIT_INLINE void code_lane_group(const std::uint32_t* gaps, const std::uint32_t* vcode, unsigned r, unsigned shift,
                                     const rans_lanes::enc_table& gt, const rans_lanes::enc_table& vt, rans_lanes::encoder& ge,
                                     rans_lanes::encoder& ve) noexcept {
  lane_fields a;
  const std::uint32_t low = static_cast<std::uint32_t>((std::uint64_t{1} << shift) - 1);
  for (unsigned l = 0; l < r; ++l) {
    const bucketed q = bucket(gaps[l] >> shift);
    a.gsym[l] = q.symbol, a.graw[l] = static_cast<std::uint32_t>(q.extra << shift) | (gaps[l] & low), a.gbits[l] = q.extra_bits + shift;
    a.vsym[l] = vcode[l] & 0xFF, a.vraw[l] = vcode[l] >> 13, a.vbits[l] = (vcode[l] >> 8) & 31;
  }
  constexpr unsigned R = rans_lanes::max_raw_bits;
  for (unsigned l = 0; l < r; ++l) ge.put_raw(l, a.graw[l] >> R, a.gbits[l] - std::min(a.gbits[l], R));
  for (unsigned l = 0; l < r; ++l) ge.put_raw(l, a.graw[l] & ((1u << R) - 1), std::min(a.gbits[l], R));
  for (unsigned l = 0; l < r; ++l) ge.put(l, gt, a.gsym[l]);
  for (unsigned l = 0; l < r; ++l) ve.put_raw(l, a.vraw[l] >> R, a.vbits[l] - std::min(a.vbits[l], R));
  for (unsigned l = 0; l < r; ++l) ve.put_raw(l, a.vraw[l] & ((1u << R) - 1), std::min(a.vbits[l], R));
  for (unsigned l = 0; l < r; ++l) ve.put(l, vt, a.vsym[l]);
}
#ifdef BITREFIT_CODEC_X86
/// Groups [0, groups) of sixteen changes, backwards, all lanes at once (the same bytes as
/// code_lane_group: tests/codec, Kernels.SixteenLaneStreamsOfTheVectorAndScalarEncodersAreTheSame).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512cd,popcnt"))) inline void code_lane_groups_avx512(
    const std::uint32_t* gaps, const std::uint32_t* vcode, std::uint64_t groups, unsigned shift, const rans_lanes::enc_table& gt,
    const rans_lanes::enc_table& vt, rans_lanes::encoder& ge, rans_lanes::encoder& ve) noexcept {
  constexpr unsigned R = rans_lanes::max_raw_bits;
  const __m512i rmax = _mm512_set1_epi32(R), rmask = _mm512_set1_epi32((1 << R) - 1), byte = _mm512_set1_epi32(0xFF);
  const __m512i s = _mm512_set1_epi32(static_cast<int>(shift)), low = _mm512_set1_epi32(static_cast<int>((std::uint64_t{1} << shift) - 1));
  __m512i xg = _mm512_loadu_si512(ge.states().data()), xv = _mm512_loadu_si512(ve.states().data());
  std::byte* og = ge.cursor();
  std::byte* ov = ve.cursor();
  for (std::uint64_t g = groups; g-- > 0;) {
    const __m512i gap = _mm512_loadu_si512(gaps + 16 * g);
    const bucketed16 q = bucket16_avx512(_mm512_maskz_srlv_epi32(every_lane, gap, s));
    const __m512i graw = _mm512_or_si512(_mm512_maskz_sllv_epi32(every_lane, q.extra, s), _mm512_and_si512(gap, low));
    const __m512i gbits = _mm512_add_epi32(q.extra_bits, s), glo = _mm512_maskz_min_epu32(every_lane, gbits, rmax);
    rans_lanes::put_raw16(xg, _mm512_maskz_srli_epi32(every_lane, graw, R), _mm512_sub_epi32(gbits, glo), og);
    rans_lanes::put_raw16(xg, _mm512_and_si512(graw, rmask), glo, og);
    rans_lanes::put16(xg, gt, q.symbol, og);
    const __m512i vc = _mm512_loadu_si512(vcode + 16 * g);
    const __m512i vraw = _mm512_maskz_srli_epi32(every_lane, vc, 13);
    const __m512i vbits = _mm512_and_si512(_mm512_maskz_srli_epi32(every_lane, vc, 8), _mm512_set1_epi32(31)), vlo = _mm512_maskz_min_epu32(every_lane, vbits, rmax);
    rans_lanes::put_raw16(xv, _mm512_maskz_srli_epi32(every_lane, vraw, R), _mm512_sub_epi32(vbits, vlo), ov);
    rans_lanes::put_raw16(xv, _mm512_and_si512(vraw, rmask), vlo, ov);
    rans_lanes::put16(xv, vt, _mm512_and_si512(vc, byte), ov);
  }
  _mm512_storeu_si512(ge.states().data(), xg);
  _mm512_storeu_si512(ve.states().data(), xv);
  ge.cursor() = og, ve.cursor() = ov;
}
/// One register's eight changes of a group, as code_lane_groups_v3 codes them: per stream the raw
/// field's high and low parts, their widths, and the symbol.
struct lane_fields8 {
  __m256i ghi, glo, gbh, gbl, gsym, vhi, vlo, vbh, vbl, vsym;
};
__attribute__((target("avx2"), always_inline)) inline lane_fields8 lane_fields8_v3(const std::uint32_t* g, const std::uint32_t* v,
                                                                                  __m128i s, __m256i sv, __m256i low) noexcept {
  constexpr unsigned R = rans_lanes::max_raw_bits;
  const __m256i rmax = _mm256_set1_epi32(R), rmask = _mm256_set1_epi32((1 << R) - 1);
  const __m256i gap = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  const bucketed8 q = bucket8_v3(_mm256_srl_epi32(gap, s));
  const __m256i graw = _mm256_or_si256(_mm256_sll_epi32(q.extra, s), _mm256_and_si256(gap, low));
  const __m256i gbits = _mm256_add_epi32(q.extra_bits, sv), glo = _mm256_min_epu32(gbits, rmax);
  const __m256i vc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  const __m256i vraw = _mm256_srli_epi32(vc, 13);
  const __m256i vbits = _mm256_and_si256(_mm256_srli_epi32(vc, 8), _mm256_set1_epi32(31)), vlo = _mm256_min_epu32(vbits, rmax);
  return {_mm256_srli_epi32(graw, R), _mm256_and_si256(graw, rmask), _mm256_sub_epi32(gbits, glo), glo, q.symbol,
          _mm256_srli_epi32(vraw, R), _mm256_and_si256(vraw, rmask), _mm256_sub_epi32(vbits, vlo), vlo, _mm256_and_si256(vc, _mm256_set1_epi32(0xFF))};
}
/// code_lane_groups_avx512 with AVX2 (rans_lanes' lanes16_v3): the same bytes as code_lane_group.
__attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt"))) inline void code_lane_groups_v3(const std::uint32_t* gaps, const std::uint32_t* vcode,
                                                                                      std::uint64_t groups, unsigned shift,
                                                                                      const rans_lanes::enc_table& gt,
                                                                                      const rans_lanes::enc_table& vt, rans_lanes::encoder& ge,
                                                                                      rans_lanes::encoder& ve) noexcept {
  using namespace rans_lanes;
  const __m128i s = _mm_cvtsi32_si128(static_cast<int>(shift));
  const __m256i sv = _mm256_set1_epi32(static_cast<int>(shift)), low = _mm256_set1_epi32(static_cast<int>((std::uint64_t{1} << shift) - 1));
  lanes16_v3 xg = load_states_v3(ge.states()), xv = load_states_v3(ve.states());
  std::byte* og = ge.cursor();
  std::byte* ov = ve.cursor();
  for (std::uint64_t g = groups; g-- > 0;) {
    const lane_fields8 a = lane_fields8_v3(gaps + 16 * g, vcode + 16 * g, s, sv, low);
    const lane_fields8 b = lane_fields8_v3(gaps + 16 * g + 8, vcode + 16 * g + 8, s, sv, low);
    put_raw16_v3(xg, {a.ghi, b.ghi}, {a.gbh, b.gbh}, og);
    put_raw16_v3(xg, {a.glo, b.glo}, {a.gbl, b.gbl}, og);
    put16_v3(xg, gt, {a.gsym, b.gsym}, og);
    put_raw16_v3(xv, {a.vhi, b.vhi}, {a.vbh, b.vbh}, ov);
    put_raw16_v3(xv, {a.vlo, b.vlo}, {a.vbl, b.vbl}, ov);
    put16_v3(xv, vt, {a.vsym, b.vsym}, ov);
  }
  store_states_v3(ge.states(), xg), store_states_v3(ve.states(), xv);
  ge.cursor() = og, ve.cursor() = ov;
}
#endif
/// Operations of a 16-lane stream that can emit a word, for a class whose symbols have histogram
/// h and raw fields of raw_bits(sym) bits: the symbol, and each nonempty part of the raw field.
template <class RawBits>
std::uint64_t lane_word_ops(std::span<const std::uint64_t> h, RawBits raw_bits) noexcept {
  std::uint64_t n = 0;
  for (std::uint32_t sym = 0; sym < h.size(); ++sym)
    if (h[sym]) {
      const unsigned w = raw_bits(sym);
      n += h[sym] * (1 + (w > 0) + (w > rans_lanes::max_raw_bits));
    }
  return n;
}

/// Which kernel codes a class's full groups of sixteen: every one gives the same bytes.
enum class lane_kernel { scalar, avx2, avx512 };
/// The fastest lane kernel this CPU runs.
inline lane_kernel best_lane_kernel() noexcept {
  if (cpu_avx512_lzcnt()) return lane_kernel::avx512;
  if (cpu_v3()) return lane_kernel::avx2;
  return lane_kernel::scalar;
}

/// Class streams in 16 lanes: n changes (gaps and value codes from the class's first slot), the
/// streams' buffers sized for gap_ops and value_ops word-emitting operations (lane_word_ops). The
/// last group, if partial, is coded first (the encoder runs backwards), always scalar; the full
/// groups by `kernel` (which the caller checked the CPU runs).
inline void code_class_lanes(const std::uint32_t* gaps, const std::uint32_t* vcode, std::uint64_t n, unsigned shift,
                             const rans_lanes::enc_table& gt, const rans_lanes::enc_table& vt, rans_lanes::encoder& ge,
                             rans_lanes::encoder& ve, std::uint64_t gap_ops, std::uint64_t value_ops, lane_kernel kernel) {
  ge.begin(gap_ops), ve.begin(value_ops);
  const std::uint64_t full = n / 16;
  if (const unsigned r = static_cast<unsigned>(n % 16)) code_lane_group(gaps + 16 * full, vcode + 16 * full, r, shift, gt, vt, ge, ve);
#ifdef BITREFIT_CODEC_X86
  if (kernel == lane_kernel::avx512) return code_lane_groups_avx512(gaps, vcode, full, shift, gt, vt, ge, ve);
  if (kernel == lane_kernel::avx2) return code_lane_groups_v3(gaps, vcode, full, shift, gt, vt, ge, ve);
#else
  (void)kernel;
#endif
  for (std::uint64_t g = full; g-- > 0;) code_lane_group(gaps + 16 * g, vcode + 16 * g, 16, shift, gt, vt, ge, ve);
}

}  // namespace conditioned_detail

/// Encoder of base-conditioned items; holds reusable scratch (O(changed)). One per thread.
class conditioned_encoder {
 public:
  /// Codes the c changes of one item. Inputs per change k (ascending position order): its base
  /// class and class rank (rank_by_class), its old and new patterns (E bytes each, little-endian).
  /// Appends the location and value sections to `loc` and `val`.
  void encode(const float_format& f, const class_spec& spec, std::span<const std::uint8_t> classes,
              std::span<const std::uint32_t> ranks, std::span<const std::byte> old_vals, std::span<const std::byte> new_vals,
              byte_buffer& loc, byte_buffer& val) {
    detail::with_word(f.element_size, [&](auto w) { encode_typed<decltype(w)>(f, spec, classes, ranks, old_vals, new_vals, loc, val); });
  }

  std::size_t scratch_bytes() const noexcept {
    std::size_t n = gaps_.capacity_bytes() + vcode_.capacity_bytes() + vextra_.capacity_bytes() + (gap_hist_.capacity() + val_hist_.capacity()) * sizeof(std::uint64_t);
    for (auto& e : gap_enc_) n += e.capacity_bytes();
    for (auto& e : val_enc_) n += e.capacity_bytes();
    for (auto& e : gap_lanes_) n += e.capacity_bytes();
    for (auto& e : val_lanes_) n += e.capacity_bytes();
    for (std::size_t k = 0; k < max_base_classes; ++k) n += (gsym_[k].capacity() + vsym_[k].capacity()) * sizeof(rans::enc_symbol);
    return n;
  }

 private:
  template <class W>
  void encode_typed(const float_format& f, const class_spec& spec, std::span<const std::uint8_t> classes,
                    std::span<const std::uint32_t> ranks, std::span<const std::byte> old_vals, std::span<const std::byte> new_vals,
                    byte_buffer& loc, byte_buffer& val) {
    using namespace conditioned_detail;
    const std::size_t c = classes.size();
    const unsigned K = spec.count;
    const unsigned VA = value_alphabet(f);
    const std::uint8_t* cls = classes.data();
    const std::uint32_t* rk = ranks.data();
    const std::byte* ov = old_vals.data();
    const std::byte* nv = new_vals.data();
    // pass 0: changes and last rank per class -> gap shift (mean gap >> s in [4, 8))
    std::array<std::uint64_t, max_base_classes> count{}, last{};
    if (K == 1) {  // every change is class 0, ranks ascend
      count[0] = c;
      if (c) last[0] = rk[c - 1];
    } else {
      class_counts(cls, c, K, count.data());
      // each class's last change, from the end (stops once every class with changes is seen)
      unsigned left = 0;
      for (unsigned k = 0; k < K; ++k) left += count[k] != 0;
      std::array<bool, max_base_classes> seen{};
      for (std::size_t i = c; left && i-- > 0;)
        if (!seen[cls[i]]) seen[cls[i]] = true, last[cls[i]] = rk[i], --left;
    }
    std::array<unsigned, max_base_classes> shift{};
    for (unsigned k = 0; k < K; ++k) {
      if (!count[k]) continue;
      const std::uint64_t mean = (last[k] + 1 - count[k]) / count[k];  // sum of gaps / count
      while ((mean >> shift[k]) >= 8) ++shift[k];
    }
    // pass 1, in position order: gaps, value codes and the symbol histograms, stored class-major
    // (class k's changes at [at[k], at[k] + count[k]) in position order, then class_pad slots of
    // scratch) so pass 2 runs class by class with its coders' states in registers.
    gaps_.resize_uninit(c + K * conditioned_detail::class_pad);
    vcode_.resize_uninit(c + K * conditioned_detail::class_pad);
    if constexpr (!packed_values<W>) vextra_.resize_uninit(c + K * conditioned_detail::class_pad);
    gap_hist_.assign(4 * std::size_t{K} * gap_alphabet, 0);
    val_hist_.assign(4 * std::size_t{K} * VA, 0);
    std::array<std::uint64_t, max_base_classes + 1> at{};
    for (unsigned k = 0; k < K; ++k) at[k + 1] = at[k] + count[k] + class_pad;
    {
      pass1_state st;
      for (unsigned k = 0; k < K; ++k) st.slot[k] = at[k];
      const pass1_out out = pass1_outputs(K, VA);
      std::size_t done = 0;
#ifdef BITREFIT_CODEC_X86
      // 2-byte formats: sixteen changes per step (the same outputs, tests/codec)
      if constexpr (sizeof(W) == 2) {
        if (cpu_avx512_lzcnt()) done = codes_16_avx512(f, K, shift.data(), cls, rk, ov, nv, c, st, out);
        else if (cpu_v3()) done = codes_8_v3(f, K, shift.data(), cls, rk, ov, nv, c, st, out);
      }
#endif
      code_changes<W>(f, shift.data(), cls, rk, ov, nv, done, c, st, out);
      fold_histograms(K, VA);
    }
    // per class: tables, then its changes backwards (LIFO: the decoder reads symbol, then raw bits)
    std::array<rans::table, max_base_classes> gt, vt;
    std::array<unsigned, max_base_classes> gscale{}, vscale{};
    std::array<std::span<const std::byte>, max_base_classes> gs, vs;
    // large classes of 1- and 2-byte formats: 16-lane streams (rans_lanes.hpp), coded here; the
    // rest by code_streams
    std::array<bool, max_base_classes> lanes16{};
    const lane_kernel kernel = best_lane_kernel();
    for (unsigned k = 0; k < K; ++k) {
      if (!count[k]) continue;
      gt[k] = make_table({gap_hist_.data() + k * gap_alphabet, gap_alphabet}, count[k], gscale[k]);
      vt[k] = make_table({val_hist_.data() + k * VA, VA}, count[k], vscale[k]);
      if (packed_values<W> && count[k] >= lanes_min_changes) {
        lanes16[k] = true;
        const unsigned s = shift[k], escape_bits = 8 * f.element_size;
        const std::uint64_t gap_ops = lane_word_ops({gap_hist_.data() + k * gap_alphabet, gap_alphabet},
                                                    [s](std::uint32_t sym) { return gap_raw_bits(sym, s); });
        const std::uint64_t value_ops =
            lane_word_ops({val_hist_.data() + k * VA, VA}, [escape_bits](std::uint32_t sym) { return value_raw_bits(sym, escape_bits); });
        code_class_lanes(gaps_.data() + at[k], vcode_.data() + at[k], count[k], s, rans_lanes::encoder_table(gt[k]),
                         rans_lanes::encoder_table(vt[k]), gap_lanes_[k], val_lanes_[k], gap_ops, value_ops, kernel);
        gs[k] = gap_lanes_[k].finish(), vs[k] = val_lanes_[k].finish();
        continue;
      }
      gsym_[k] = rans::encoder_symbols(gt[k]);
      vsym_[k] = rans::encoder_symbols(vt[k]);
    }
    code_streams<packed_values<W>>(K, count, lanes16, at, shift, VA, 8 * f.element_size, gs, vs);
    // sections: headers, then the streams
    loc.push_back(static_cast<std::byte>(K));
    for (unsigned j = 0; j + 1 < K; ++j) rans::detail::put_varint(loc, spec.thresholds[j]);
    for (unsigned k = 0; k < K; ++k) {
      rans::detail::put_varint(loc, count[k]);
      if (!count[k]) continue;
      loc.push_back(static_cast<std::byte>(shift[k] | predicted_tables_flag | (lanes16[k] ? lanes_flag : 0u)));
      // the decoder derives gscale/vscale (make_table: scale_bits_for(count, used)) itself
      rans::write_predicted_table({gap_hist_.data() + k * gap_alphabet, gap_alphabet}, gap_code_prediction, loc);
      rans::detail::put_varint(loc, gs[k].size());
      rans::write_predicted_table({val_hist_.data() + k * VA, VA}, value_code_prediction, val);
      rans::detail::put_varint(val, vs[k].size());
    }
    for (unsigned k = 0; k < K; ++k)
      if (count[k]) loc.append(gs[k]), val.append(vs[k]);
  }

  conditioned_detail::pass1_out pass1_outputs(unsigned K, unsigned VA) noexcept {
    using conditioned_detail::gap_alphabet;
    const std::size_t gstride = std::size_t{K} * gap_alphabet, vstride = std::size_t{K} * VA;
    conditioned_detail::pass1_out o{gaps_.data(), vcode_.data(), vextra_.data(), {}, {}};
    for (std::size_t copy = 0; copy < 4; ++copy) o.gh[copy] = gap_hist_.data() + copy * gstride, o.vh[copy] = val_hist_.data() + copy * vstride;
    return o;
  }
  // the four copies of each histogram summed into the first
  void fold_histograms(unsigned K, unsigned VA) noexcept {
    const std::size_t gstride = std::size_t{K} * conditioned_detail::gap_alphabet, vstride = std::size_t{K} * VA;
    std::uint64_t* gh = gap_hist_.data();
    std::uint64_t* vh = val_hist_.data();
    for (std::size_t i = 0; i < gstride; ++i) gh[i] += gh[i + gstride] + gh[i + 2 * gstride] + gh[i + 3 * gstride];
    for (std::size_t i = 0; i < vstride; ++i) vh[i] += vh[i + vstride] + vh[i + 2 * vstride] + vh[i + 3 * vstride];
  }

  // One put reserves at most 2 bytes. A class's stream space follows from its histograms: a gap
  // symbol's raw field is its bucket's extra bits plus the class's shift, a value symbol's is its
  // bucket's extra bits (the escape: the whole pattern), 16 bits per raw put.
  std::uint64_t gap_puts(unsigned k, unsigned shift) const noexcept {
    using namespace conditioned_detail;
    std::uint64_t n = 0;
    const std::uint64_t* h = gap_hist_.data() + std::size_t{k} * gap_alphabet;
    for (unsigned sym = 0; sym < gap_alphabet; ++sym)
      if (h[sym]) n += h[sym] * (1 + (gap_raw_bits(sym, shift) + 15) / 16);
    return n;
  }
  std::uint64_t value_puts(unsigned k, unsigned VA, unsigned element_bits) const noexcept {
    using namespace conditioned_detail;
    std::uint64_t n = 0;
    const std::uint64_t* h = val_hist_.data() + std::size_t{k} * VA;
    for (unsigned sym = 0; sym < VA; ++sym)
      if (h[sym]) n += h[sym] * (1 + (value_raw_bits(sym, element_bits) + 15) / 16);
    return n;
  }

  // A lane codes whole classes one after the other (code_streams).
  struct lane {
    unsigned next = 0;     // index into its queue of the class after the current one
    unsigned k = 0;        // current class
    std::uint64_t j = 0;   // changes at[k] <= index < j are still to code (backwards)
    std::uint64_t stop = 0;
    unsigned s = 0;
    std::uint64_t low_mask = 0;
    const rans::enc_symbol* ge = nullptr;
    const rans::enc_symbol* ve = nullptr;
    rans::writer gw, vw;
  };
  template <bool Packed>
  static BITREFIT_INLINE void step(lane& ln, const std::uint32_t* gaps, const std::uint32_t* vcode, const std::uint64_t* vextra) noexcept {
    using namespace conditioned_detail;
    const std::uint64_t j = --ln.j;
    const std::uint32_t g = gaps[j];
    const bucketed q = bucket(g >> ln.s);
    // one raw field: the bucket's extra bits above the low s bits of g
    ln.gw.put_raw64((q.extra << ln.s) | (g & ln.low_mask), q.extra_bits + ln.s);
    ln.gw.put(ln.ge[q.symbol]);
    const std::uint32_t vc = vcode[j];
    if constexpr (Packed) {
      if ((vc >> 8) & 31) ln.vw.put_raw(vc >> 13, (vc >> 8) & 31);  // most changes (+-1 ULP) have none
      ln.vw.put(ln.ve[vc & 0xFF]);
    } else {
      if (vc >> 16) ln.vw.put_raw64(vextra[j], vc >> 16);
      ln.vw.put(ln.ve[vc & 0xFFFF]);
    }
  }

  // The per-change coding is bound by the latency of each stream's state update (renormalise,
  // multiply, add: ~20 cycles per change on the gap stream), not by throughput. Two lanes, each
  // coding whole classes one after the other (classes dealt to the lanes longest first, to the
  // lane with less work), interleave two independent gap and value chains per step. Every class
  // still has its own streams, coded in the same order, so the bytes are the one-lane bytes.
  template <bool Packed>
  void code_streams(unsigned K, const std::array<std::uint64_t, max_base_classes>& count, const std::array<bool, max_base_classes>& lanes16,
                    const std::array<std::uint64_t, max_base_classes + 1>& at, const std::array<unsigned, max_base_classes>& shift,
                    unsigned VA, unsigned element_bits, std::array<std::span<const std::byte>, max_base_classes>& gs,
                    std::array<std::span<const std::byte>, max_base_classes>& vs) {
    using namespace conditioned_detail;
    // deal classes to two lanes
    std::array<unsigned, max_base_classes> order{};
    unsigned used = 0;
    for (unsigned k = 0; k < K; ++k)
      if (count[k] && !lanes16[k]) order[used++] = k;
    // largest first, ties by class (std::sort with a total order: no temporary buffer, unlike stable_sort)
    std::sort(order.begin(), order.begin() + used, [&](unsigned a, unsigned b) { return count[a] != count[b] ? count[a] > count[b] : a < b; });
    std::array<std::array<unsigned, max_base_classes>, 2> queue{};
    std::array<unsigned, 2> queued{};
    std::array<std::uint64_t, 2> load{};
    for (unsigned i = 0; i < used; ++i) {
      const unsigned l = load[1] < load[0] ? 1 : 0;
      queue[l][queued[l]++] = order[i], load[l] += count[order[i]];
    }
    const std::uint32_t* gaps = gaps_.data();
    const std::uint32_t* vcode = vcode_.data();
    const std::uint64_t* vextra = vextra_.data();
    auto start = [&](lane& ln, unsigned l) {
      const unsigned k = queue[l][ln.next++];
      ln.k = k, ln.j = at[k] + count[k], ln.stop = at[k], ln.s = shift[k];
      ln.low_mask = (std::uint64_t{1} << shift[k]) - 1;
      ln.ge = gsym_[k].data(), ln.ve = vsym_[k].data();
      ln.gw = gap_enc_[k].begin(gap_puts(k, shift[k]));
      ln.vw = val_enc_[k].begin(value_puts(k, VA, element_bits));
    };
    std::array<lane, 2> lanes;
    std::array<bool, 2> busy{};
    // lane l's class is coded: its streams are done; the lane takes its next class or goes idle
    auto advance = [&](unsigned l) {
      lane& ln = lanes[l];
      gs[ln.k] = gap_enc_[ln.k].finish(ln.gw), vs[ln.k] = val_enc_[ln.k].finish(ln.vw);
      if (ln.next < queued[l]) start(ln, l);
      else busy[l] = false;
    };
    for (unsigned l = 0; l < 2; ++l)
      if (queued[l]) start(lanes[l], l), busy[l] = true;
    // both lanes busy: interleaved steps; a lane whose class ends moves to its next class
    while (busy[0] && busy[1]) {
      std::uint64_t n = std::min(lanes[0].j - lanes[0].stop, lanes[1].j - lanes[1].stop);
      lane a = lanes[0], b = lanes[1];  // locals: the states stay in registers
      for (; n > 0; --n) step<Packed>(a, gaps, vcode, vextra), step<Packed>(b, gaps, vcode, vextra);
      lanes[0] = a, lanes[1] = b;
      for (unsigned l = 0; l < 2; ++l)
        if (lanes[l].j == lanes[l].stop) advance(l);
    }
    for (unsigned l = 0; l < 2; ++l)
      while (busy[l]) {
        lane a = lanes[l];
        while (a.j > a.stop) step<Packed>(a, gaps, vcode, vextra);
        lanes[l] = a;
        advance(l);
      }
  }

  static rans::table make_table(std::span<const std::uint64_t> hist, std::uint64_t count, unsigned& scale) {
    std::size_t used = 0, last = 0;
    for (std::size_t i = 0; i < hist.size(); ++i)
      if (hist[i]) ++used, last = i + 1;
    scale = conditioned_detail::scale_bits_for(count, used);
    return rans::table_of(hist.first(last), scale);
  }

  // Per change in class-major order: its gap, and its value code: symbol | extra bits << 16 with
  // the extra bits' value in vextra_, or, for 1- and 2-byte formats (packed_values), symbol (< 256)
  // | extra bit count (<= 16) << 8 | extra bits << 13 in one word and no vextra_.
  scratch_buffer<std::uint32_t> gaps_, vcode_;
  scratch_buffer<std::uint64_t> vextra_;
  std::vector<std::uint64_t> gap_hist_, val_hist_;
  std::array<rans::encoder, max_base_classes> gap_enc_, val_enc_;
  std::array<rans_lanes::encoder, max_base_classes> gap_lanes_, val_lanes_;
  std::array<std::vector<rans::enc_symbol>, max_base_classes> gsym_, vsym_;
};

/// Decoder of base-conditioned items; holds reusable scratch (O(changed) of the largest item).
namespace conditioned_detail {

/// The new pattern of a change whose base pattern is o: the escape's pattern (d == 0) or o moved by
/// d ULPs (ulp_step, inlined: it stays on o's side of zero and inside the finite range). `bad` is
/// set when the result cannot come from the right base: an escape equal to its base, a base that
/// is not finite, or a distance that leaves the finite range.
BITREFIT_INLINE std::uint64_t new_pattern(const float_format& f, std::uint64_t o, std::int64_t d, std::uint64_t raw, bool& bad) noexcept {
  if (d == 0) {
    bad |= raw == o;
    return raw;
  }
  const std::uint64_t mo = f.magnitude(o);
  const std::uint64_t steps = d < 0 ? static_cast<std::uint64_t>(-d) : static_cast<std::uint64_t>(d);
  const bool grow = (d > 0) != f.negative(o);
  bad |= mo >= f.special || (grow ? steps >= f.special - mo : steps > mo);
  return (o & f.sign_bit) | (grow ? mo + steps : mo - steps);
}

#ifdef BITREFIT_CODEC_X86
// The low 32 bits of the sixteen 64-bit lanes of lo, then hi (two vpmovqd and an insert, in one
// permute that GCC 12's -Wall does not flag).
__attribute__((target("avx512f"), always_inline)) inline __m512i low_halves(__m512i lo, __m512i hi) noexcept {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_maskz_permutex2var_epi32(every_lane, lo, even, hi);
}

/// new_patterns for a 2-byte format, sixteen changes at a time, in 32-bit lanes (a 2-byte format's
/// distances and escape patterns fit): the base values gathered 4 bytes at a time, distances
/// loaded (Indexed: gathered through src), escape patterns read only for the escapes among the
/// sixteen. A group whose last position is the range's last element is left to the caller (its
/// 4-byte gather would read past the base), as is a partial group. Returns the changes done.
/// The per-change loop it replaces cost ~14 cycles a change (1.2x a memcmp of the range at 5 %
/// changes); here the gathers and the escape's rare branch are per sixteen.
template <bool Indexed>
__attribute__((target("avx512f"))) inline std::uint64_t new_patterns_16_avx512(const float_format& f, const std::byte* base, std::uint64_t m,
                                                                                const std::uint32_t* pos, const std::uint32_t* src,
                                                                                const std::int64_t* dist, const std::uint64_t* raw,
                                                                                std::uint64_t n, std::byte* out, bool& bad) noexcept {
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(f.sign_bit)), magm = _mm512_set1_epi32(static_cast<int>(f.magnitude_mask));
  const __m512i special = _mm512_set1_epi32(static_cast<int>(f.special)), low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i spread_lo = _mm512_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0);
  const __m512i spread_hi = _mm512_setr_epi32(8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15, 0);
  __mmask16 badm = 0;
  std::uint64_t k = 0;
  for (; k + 16 <= n && std::uint64_t{pos[k + 15]} + 1 < m; k += 16) {
    const __m512i p = _mm512_loadu_si512(pos + k);
    const __m512i o = _mm512_and_si512(_mm512_mask_i32gather_epi32(zero, every_lane, p, base, 2), low16);
    __m512i d, r = zero;
    if constexpr (Indexed) {
      // the sixteen indices as two vectors of eight 64-bit ones (index j to 32-bit lane 2j, odd lanes zero)
      const __m512i s = _mm512_loadu_si512(src + k);
      const __m512i slo = _mm512_maskz_permutexvar_epi32(0x5555, spread_lo, s), shi = _mm512_maskz_permutexvar_epi32(0x5555, spread_hi, s);
      d = low_halves(_mm512_mask_i64gather_epi64(zero, 0xFF, slo, dist, 8), _mm512_mask_i64gather_epi64(zero, 0xFF, shi, dist, 8));
      if (const __mmask16 e = _mm512_testn_epi32_mask(d, d))
        r = low_halves(_mm512_mask_i64gather_epi64(zero, static_cast<__mmask8>(e), slo, raw, 8),
                       _mm512_mask_i64gather_epi64(zero, static_cast<__mmask8>(e >> 8), shi, raw, 8));
    } else {
      d = low_halves(_mm512_loadu_si512(dist + k), _mm512_loadu_si512(dist + k + 8));
      if (const __mmask16 e = _mm512_testn_epi32_mask(d, d))
        r = low_halves(_mm512_maskz_loadu_epi64(static_cast<__mmask8>(e), raw + k), _mm512_maskz_loadu_epi64(static_cast<__mmask8>(e >> 8), raw + k + 8));
    }
    const __mmask16 esc = _mm512_testn_epi32_mask(d, d);
    const __m512i mo = _mm512_and_si512(o, magm);
    const __m512i steps = _mm512_maskz_abs_epi32(every_lane, d);
    // grow = (d > 0) != negative(o); for d != 0, d > 0 is "not d < 0"
    const auto grow = static_cast<__mmask16>(~_mm512_cmplt_epi32_mask(d, zero) ^ _mm512_test_epi32_mask(o, sign));
    const auto leaves = static_cast<__mmask16>(_mm512_cmpge_epu32_mask(mo, special) |
                                               (grow & _mm512_cmpge_epu32_mask(steps, _mm512_sub_epi32(special, mo))) |
                                               (~grow & _mm512_cmpgt_epu32_mask(steps, mo)));
    badm |= static_cast<__mmask16>((~esc & leaves) | (esc & _mm512_cmpeq_epi32_mask(r, o)));
    const __m512i moved = _mm512_or_si512(_mm512_and_si512(o, sign), _mm512_mask_blend_epi32(grow, _mm512_sub_epi32(mo, steps), _mm512_add_epi32(mo, steps)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k * 2), _mm512_maskz_cvtepi32_epi16(every_lane, _mm512_mask_blend_epi32(esc, moved, r)));
  }
  bad |= badm != 0;
  return k;
}

/// One block's changes in lane order, for the several-class scan: n = popcount(hits) <= 16 changed
/// lanes; change t (its lane the t-th set bit of hits) gets position start + lane and index
/// next[class] + (the block's earlier changes of that class), its class being the number of
/// threshold words e[1..T] that hold the lane. `next` is not updated (the caller adds each
/// class's count). Per block: the lanes' classes as bytes (T masked adds), the changed lanes and
/// their classes compressed out, the earlier changes of the same class counted with a conflict
/// mask. The loop it replaces (a class per change from T bit tests, the class's next index through
/// memory, an exit that depends on the data) was about a third of the several-class scan.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512cd,avx512vbmi2,avx512vpopcntdq"))) inline void block_changes_avx512(
    std::uint64_t hits, unsigned n, const std::uint64_t* e, unsigned T, const std::uint32_t* next, std::uint32_t start,
    std::uint32_t* pos_out, std::uint32_t* src_out) noexcept {
  alignas(64) static constexpr std::uint8_t iota[64] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                                        16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                                                        32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                                                        48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
  __m512i classes = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi8(1);
  for (unsigned j = 1; j <= T; ++j) classes = _mm512_mask_add_epi8(classes, e[j], classes, one);
  const __m512i cls = _mm512_maskz_cvtepu8_epi32(every_lane, _mm512_maskz_extracti32x4_epi32(0xF, _mm512_maskz_compress_epi8(hits, classes), 0));
  const __m512i lane =
      _mm512_maskz_cvtepu8_epi32(every_lane, _mm512_maskz_extracti32x4_epi32(0xF, _mm512_maskz_compress_epi8(hits, _mm512_load_si512(iota)), 0));
  const auto valid = static_cast<__mmask16>((1u << n) - 1);
  // conflict: per change, the earlier changes of its class (the invalid lanes come after all valid ones)
  const __m512i earlier = _mm512_popcnt_epi32(_mm512_maskz_conflict_epi32(valid, cls));
  const __m512i src = _mm512_add_epi32(_mm512_maskz_permutexvar_epi32(every_lane, cls, _mm512_loadu_si512(next)), earlier);
  _mm512_mask_storeu_epi32(pos_out, valid, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(start))));
  _mm512_mask_storeu_epi32(src_out, valid, src);
}
#endif

/// The new patterns (W: the format's word) of n changes of a range of m elements whose base bits
/// are `base`: change k at position pos[k] (ascending), its distance and escape pattern at dist[j],
/// raw[j] with j = src[k] (src null: j = k); into out, sizeof(W) bytes each. `bad` as new_pattern.
template <class W>
void new_patterns(const float_format& f, const std::byte* base, std::uint64_t m, const std::uint32_t* pos, const std::uint32_t* src,
                  const std::int64_t* dist, const std::uint64_t* raw, std::uint64_t n, std::byte* out, bool& bad) noexcept {
  std::uint64_t k = 0;
#ifdef BITREFIT_CODEC_X86
  if constexpr (sizeof(W) == 2)
    if (cpu_avx512bw())
      k = src ? new_patterns_16_avx512<true>(f, base, m, pos, src, dist, raw, n, out, bad)
              : new_patterns_16_avx512<false>(f, base, m, pos, src, dist, raw, n, out, bad);
#endif
  for (; k < n; ++k) {
    const std::uint64_t j = src ? src[k] : k;
    const W nw = static_cast<W>(new_pattern(f, detail::load_word<W>(base, pos[k]), dist[j], raw[j], bad));
    std::memcpy(out + k * sizeof(W), &nw, sizeof(W));
  }
}

}  // namespace conditioned_detail

class conditioned_decoder {
 public:
  /// Decodes one item of `changed` changes over a range of m elements whose base bits are `base`
  /// (m·E bytes, host memory) into ascending positions (relative to the range) and absolute new
  /// patterns (E bytes each). Everything read is checked: a malformed section, a rank past its
  /// class's element count, a distance that leaves the finite range of its base value or an escape
  /// equal to its base is errc::format at `where`; nothing is written outside the two outputs.
  void decode(const float_format& f, std::uint64_t m, std::uint64_t changed, std::span<const std::byte> loc_section,
              std::span<const std::byte> val_section, std::span<const std::byte> base, std::span<std::uint32_t> positions_out,
              std::span<std::byte> values_out, const error_context& where) {
    using namespace conditioned_detail;
    const unsigned E = f.element_size;
    if (base.size() != m * E) throw error(errc::invalid_argument, "conditioned decode: base bytes do not cover the item range", where);
    if (positions_out.size() != changed || values_out.size() != changed * E)
      throw error(errc::invalid_argument, "conditioned decode: output spans do not match the changed count", where);
    rans::reader lr(loc_section, where);
    class_spec spec;
    const unsigned K = lr.u8();
    if (K < 1 || K > max_base_classes) lr.fail("class count " + std::to_string(K) + " outside [1, 16]");
    spec.count = static_cast<std::uint8_t>(K);
    for (unsigned j = 0; j + 1 < K; ++j) spec.thresholds[j] = static_cast<std::uint16_t>(lr.varint(f.exponents() - 1, "class threshold"));
    if (!valid_class_spec(spec, f)) lr.fail("class thresholds are not strictly increasing exponents");
    state st;
    st.K = K;
    std::array<rans::table, max_base_classes> gt, vt;
    std::array<std::uint64_t, max_base_classes> glen{}, vlen{};
    std::array<bool, max_base_classes> predicted{};
    // a predicted table's scale, as the encoder chose it (make_table) for a class of c changes
    const auto scale_of = [](std::uint64_t c) { return [c](std::size_t used) { return scale_bits_for(c, used); }; };
    for (unsigned k = 0; k < K; ++k) {
      const std::uint64_t ck = lr.varint(changed - st.start[k], "class change count");
      st.start[k + 1] = st.start[k] + ck;
      if (!ck) continue;
      const unsigned shift_byte = lr.u8();
      st.lanes16[k] = (shift_byte & lanes_flag) != 0;
      predicted[k] = (shift_byte & predicted_tables_flag) != 0;
      st.shift[k] = shift_byte & shift_mask;
      if (st.shift[k] > 31) lr.fail("gap shift " + std::to_string(st.shift[k]) + " above 31");
      if (st.lanes16[k] && E > 2) lr.fail("16-lane streams in a format wider than 2 bytes");
      gt[k] = predicted[k] ? rans::read_predicted_table(lr, gap_alphabet, gap_code_prediction, scale_of(ck), "gap table")
                           : rans::read_table(lr, gap_alphabet, "gap table");
      glen[k] = lr.varint(loc_section.size(), "gap stream length");
    }
    if (st.start[K] != changed) lr.fail("class change counts sum to " + std::to_string(st.start[K]) + ", item declares " + std::to_string(changed));
    rans::reader vr(val_section, where);
    const unsigned VA = value_alphabet(f);
    for (unsigned k = 0; k < K; ++k)
      if (st.start[k + 1] > st.start[k]) {
        vt[k] = predicted[k] ? rans::read_predicted_table(vr, VA, value_code_prediction, scale_of(st.start[k + 1] - st.start[k]), "value table")
                             : rans::read_table(vr, VA, "value table");
        vlen[k] = vr.varint(val_section.size(), "value stream length");
      }
    ranks_.resize_uninit(changed);
    dist_.resize_uninit(changed);
    raw_.resize_uninit(changed);
    for (unsigned k = 0; k < K; ++k) {
      if (st.start[k + 1] == st.start[k]) continue;
      const auto gaps = lr.take(glen[k], "gap stream");
      const auto values = vr.take(vlen[k], "value stream");
      if (st.lanes16[k])
        decode_class_lanes(f, gt[k], vt[k], gaps, values, st.start[k], st.start[k + 1], st.shift[k], m, where);
      else
        decode_class(f, rans::dec_table(gt[k]), rans::dec_table(vt[k]), gaps, values, st.start[k], st.start[k + 1], st.shift[k], m, where);
    }
    if (!lr.rest().empty() || !vr.rest().empty()) throw error(errc::format, "bytes after the last class stream", where);
    // ranks -> positions and values: one pass over the base
    detail::with_word(E, [&](auto w) {
      using W = decltype(w);
      if (K == 1) scan_one_class<W>(f, base.data(), m, changed, positions_out.data(), values_out.data(), where);
      else if (cpu_v3()) scan_v3<W>(f, spec, base.data(), m, st, positions_out.data(), values_out.data(), where);
      else scan_generic<W>(f, spec, base.data(), m, st, positions_out.data(), values_out.data(), where);
    });
  }

  std::size_t scratch_bytes() const noexcept { return ranks_.capacity_bytes() + src_.capacity_bytes() + rank_bits_.capacity_bytes() + dist_.capacity_bytes() + raw_.capacity_bytes(); }

 private:
  struct state {
    unsigned K = 1;
    std::array<std::uint64_t, max_base_classes + 1> start{};
    std::array<unsigned, max_base_classes> shift{};
    std::array<bool, max_base_classes> lanes16{};
    const std::uint32_t* ranks = nullptr;
    const std::int64_t* dist = nullptr;
    const std::uint64_t* raw = nullptr;
  };

  // Change i of a class: its gap g after the class's previous change (next: previous rank + 1) and
  // its value symbol vs with its raw field, into ranks_, dist_ and raw_. A rank at or past the
  // item's m elements or a distance beyond the format's range is errc::format. Every class decoder
  // (one state, 16 lanes scalar and vector) ends in it.
  BITREFIT_INLINE void put_change(const float_format& f, std::uint64_t i, std::uint64_t g, std::uint32_t vs, std::uint64_t vraw,
                                  std::uint64_t m, std::uint64_t& next, const error_context& where) {
    using namespace conditioned_detail;
    if (g >= m || next + g >= m) throw error(errc::format, "class rank outside the item's " + std::to_string(m) + " elements", where);
    ranks_[i] = static_cast<std::uint32_t>(next + g);
    next += g + 1;
    if (vs == 0) [[unlikely]] {  // the escape: the new pattern
      dist_[i] = 0;
      raw_[i] = vraw;
      return;
    }
    const std::uint32_t bs = (vs - 1) >> 1;  // bucket of |d| - 1; the low bit of vs - 1 is the sign
    const std::uint64_t u = unbucket(bs, vraw);
    if (u >= f.magnitude_mask) throw error(errc::format, "ULP distance beyond the format's range", where);
    dist_[i] = ((vs - 1) & 1) ? -static_cast<std::int64_t>(u + 1) : static_cast<std::int64_t>(u + 1);
  }

  // Class k's gap and value streams, decoded side by side (two independent coder states).
  void decode_class(const float_format& f, const rans::dec_table& gt, const rans::dec_table& vt, std::span<const std::byte> gaps,
                    std::span<const std::byte> values, std::uint64_t b, std::uint64_t e, unsigned shift, std::uint64_t m,
                    const error_context& where) {
    using namespace conditioned_detail;
    rans::decoder gd(gaps, where), vd(values, where);
    std::uint64_t next = 0;  // previous rank + 1
    for (std::uint64_t i = b; i < e; ++i) {
      const std::uint32_t gs = gd.get(gt);
      const std::uint32_t vs = vd.get(vt);
      // q = unbucket(gs, extra) < 2^32 (the table has <= 72 symbols); the raw field holds the
      // extra bits above the low `shift` bits of g
      const std::uint64_t raw = gd.get_raw64(gap_raw_bits(gs, shift));
      const std::uint64_t vraw = vd.get_raw64(value_raw_bits(vs, 8 * f.element_size));
      put_change(f, i, (unbucket(gs, 0) << shift) | raw, vs, vraw, m, next, where);
    }
    gd.finish();
    vd.finish();
  }

  // Class k's 16-lane streams (conditioned_detail::code_class_lanes's schedule): per group of up to
  // sixteen changes, the symbols, then the raw fields' low and high parts, each over the lanes
  // from the last to the first (rans_lanes.hpp); then the group's ranks and values as in
  // decode_class. Formats of up to 2 bytes (the escape's pattern fits a value's raw field).
  void decode_class_lanes(const float_format& f, const rans::table& gtab, const rans::table& vtab, std::span<const std::byte> gaps,
                          std::span<const std::byte> values, std::uint64_t b, std::uint64_t e, unsigned shift, std::uint64_t m,
                          const error_context& where) {
    using namespace conditioned_detail;
    constexpr unsigned R = rans_lanes::max_raw_bits;
    rans_lanes::decoder gd(gaps, where), vd(values, where);
    std::uint32_t gs[16], vs[16], gbits[16], vbits[16];
    std::uint64_t graw[16], vraw[16];
    std::uint64_t next = 0;  // previous rank + 1
    std::uint64_t i0 = b;
#ifdef BITREFIT_CODEC_X86
    if (cpu_avx512_lzcnt()) i0 = decode_lane_groups_avx512(f, rans_lanes::dec_table16(gtab), rans_lanes::dec_table16(vtab), gd, vd, b, e, shift, m, next);
#endif
    const rans::dec_table gt(gtab), vt(vtab);
    for (; i0 < e; i0 += 16) {
      const unsigned r = static_cast<unsigned>(std::min<std::uint64_t>(16, e - i0));
      for (unsigned l = r; l-- > 0;) {
        gs[l] = gd.get(l, gt);
        gbits[l] = gap_raw_bits(gs[l], shift);
        if (gbits[l] > 2 * R) gd.fail("gap raw field wider than 30 bits");
      }
      for (unsigned l = r; l-- > 0;) graw[l] = gd.get_raw(l, std::min(gbits[l], R));
      for (unsigned l = r; l-- > 0;) graw[l] |= std::uint64_t{gd.get_raw(l, gbits[l] - std::min(gbits[l], R))} << R;
      for (unsigned l = r; l-- > 0;) {
        vs[l] = vd.get(l, vt);
        vbits[l] = value_raw_bits(vs[l], 8 * f.element_size);
        if (vbits[l] > 2 * R) vd.fail("value raw field wider than 30 bits");
      }
      for (unsigned l = r; l-- > 0;) vraw[l] = vd.get_raw(l, std::min(vbits[l], R));
      for (unsigned l = r; l-- > 0;) vraw[l] |= std::uint64_t{vd.get_raw(l, vbits[l] - std::min(vbits[l], R))} << R;
      for (unsigned l = 0; l < r; ++l) put_change(f, i0 + l, (unbucket(gs[l], 0) << shift) | graw[l], vs[l], vraw[l], m, next, where);
    }
    gd.finish();
    vd.finish();
  }

#ifdef BITREFIT_CODEC_X86
  // decode_class_lanes's whole groups with the vector decoder (rans_lanes::vector_decoder), while
  // both streams keep the 96 bytes its three loads per stream may read; returns the first change
  // left to the scalar decoder. The same outputs and refusals as the scalar loop (tests/codec:
  // Lanes.TheVectorDecoderReadsWhatTheScalarOneReads).
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512cd,popcnt"))) std::uint64_t decode_lane_groups_avx512(
      const float_format& f, const rans_lanes::dec_table16& gt, const rans_lanes::dec_table16& vt, rans_lanes::decoder& gd,
      rans_lanes::decoder& vd, std::uint64_t b, std::uint64_t e, unsigned shift, std::uint64_t m, std::uint64_t& next) {
    using namespace conditioned_detail;
    constexpr unsigned R = rans_lanes::max_raw_bits;
    constexpr __mmask16 all = 0xFFFF;
    const __m512i rmax = _mm512_set1_epi32(R), sixteen = _mm512_set1_epi32(16), three = _mm512_set1_epi32(3), one = _mm512_set1_epi32(1);
    const __m512i s = _mm512_set1_epi32(static_cast<int>(shift)), escape_bits = _mm512_set1_epi32(static_cast<int>(8 * f.element_size));
    rans_lanes::vector_decoder g, v;
    g.load(gd), v.load(vd);
    alignas(64) std::uint32_t gq[16], vs[16], vraw[16];
    std::uint64_t i0 = b;
    for (; e - i0 >= 16 && gd.end() - g.p >= 96 && vd.end() - v.p >= 96; i0 += 16) {
      const __m512i gsym = g.get(gt);
      const __m512i gbits = _mm512_add_epi32(extra_bits16_avx512(gsym), s), glo = _mm512_maskz_min_epu32(all, gbits, rmax);
      if (_mm512_cmpgt_epu32_mask(gbits, _mm512_set1_epi32(2 * R))) gd.fail("gap raw field wider than 30 bits");
      const __m512i graw_lo = g.get_raw(glo);
      const __m512i graw = _mm512_or_si512(graw_lo, _mm512_maskz_slli_epi32(all, g.get_raw(_mm512_sub_epi32(gbits, glo)), R));
      // unbucket(sym, 0) << shift (below 2^32: bucket bits + shift <= 31 when the raw field is <= 30 bits)
      const __m512i hb = _mm512_maskz_srli_epi32(all, _mm512_sub_epi32(gsym, sixteen), 1);  // b - 4
      const __m512i top = _mm512_or_si512(_mm512_maskz_sllv_epi32(all, _mm512_set1_epi32(16), hb),
                                          _mm512_maskz_sllv_epi32(all, _mm512_and_si512(gsym, one), _mm512_add_epi32(hb, three)));
      const __m512i q = _mm512_mask_mov_epi32(top, _mm512_cmplt_epu32_mask(gsym, sixteen), gsym);
      _mm512_store_si512(gq, _mm512_or_si512(_mm512_maskz_sllv_epi32(all, q, s), graw));
      const __m512i vsym = v.get(vt);
      const __m512i vbits = _mm512_mask_mov_epi32(extra_bits16_avx512(_mm512_maskz_srli_epi32(all, _mm512_sub_epi32(vsym, one), 1)),
                                                  _mm512_cmpeq_epi32_mask(vsym, _mm512_setzero_si512()), escape_bits);
      const __m512i vlo = _mm512_maskz_min_epu32(all, vbits, rmax);
      const __m512i vraw_lo = v.get_raw(vlo);
      _mm512_store_si512(vraw, _mm512_or_si512(vraw_lo, _mm512_maskz_slli_epi32(all, v.get_raw(_mm512_sub_epi32(vbits, vlo)), R)));
      _mm512_store_si512(vs, vsym);
      for (unsigned l = 0; l < 16; ++l) put_change(f, i0 + l, gq[15 - l], vs[15 - l], vraw[15 - l], m, next, gd.where());  // vector lane 15 - l is lane l
    }
    g.store(gd), v.store(vd);
    return i0;
  }
#endif

  // One class (K = 1): a change's class rank is its position (decode_class keeps every rank below
  // m and the ranks ascending), so only the changed elements' base values are read, not the whole
  // range's classes.
  template <class W>
  void scan_one_class(const float_format& f, const std::byte* base, std::uint64_t m, std::uint64_t changed, std::uint32_t* pos_out,
                      std::byte* val_out, const error_context& where) {
    bool bad = false;
    if (changed) std::memcpy(pos_out, ranks_.data(), changed * sizeof(std::uint32_t));
    conditioned_detail::new_patterns<W>(f, base, m, pos_out, nullptr, dist_.data(), raw_.data(), changed, val_out, bad);
    if (bad) throw error(errc::format, "a decoded value leaves its base value's sign or finite range, or escapes to the base value (wrong base?)", where);
  }

  // Several classes: a change's class rank becomes its position in one pass over the base, 64
  // elements (a block) at a time. Each class's changes are first set as bits of a bitmap over the
  // class's elements (bit r: the element of class rank r changed); a block then takes, per class,
  // the bits of its elements (the next popcount(class lanes) bits from the class's running count)
  // and deposits them on the class's lanes (pdep): the block's changed lanes without a branch per
  // change. Walking each class's ranks instead (a loop per class and block whose exit depends on
  // the data) made the scan ~120 cycles a block on AdamW-like items of four classes; the bitmaps
  // took it to about three quarters of that (perf), the rest mostly the walk over the block's
  // changes, which block_changes_avx512 now does sixteen changes at a time.
  // A change's index (for its distance and escape pattern) follows from its class: a class's
  // changes meet the walk in rank order, so the next index of its lane's class (sixteen changes of
  // a block at once with AVX-512: block_changes_avx512).
  template <class W, bool V3>
  BITREFIT_INLINE void scan_impl(const float_format& f, const class_spec& spec, const std::byte* base, std::uint64_t m,
                                 const state& st, std::uint32_t* pos_out, std::byte* val_out, const error_context& where) {
    using namespace conditioned_detail;
    const auto c = detail::thresholds_of(f, spec);
    const unsigned K = st.K, T = c.T;
    const std::uint32_t* ranks = ranks_.data();
    // class k's bitmap: words [word0[k], word0[k] + words[k]), the last one zero, so a block past
    // the class's last change reads zeros. Valid ranks satisfy sum_k (last rank + 1) <= m (each is
    // below its class's element count, and the counts sum to m): checked first, so the bitmaps take
    // at most m / 64 + 2K words.
    std::uint64_t word0[max_base_classes], words[max_base_classes], count[max_base_classes] = {};
    // each class's next change index (changed < 2^32: positions are 32-bit); 16 entries for the
    // vector lookup in block_changes_avx512
    alignas(64) std::uint32_t next[16] = {}, block_count[16] = {};
    std::uint64_t covered = 0, total_words = 0;
    for (unsigned k = 0; k < K; ++k) {
      const std::uint64_t span = st.start[k + 1] > st.start[k] ? std::uint64_t{ranks[st.start[k + 1] - 1]} + 1 : 0;
      covered += span;
      word0[k] = total_words;
      words[k] = span / 64 + 2;  // the words that hold bits 0 .. span - 1, and the zero word
      total_words += words[k];
      next[k] = static_cast<std::uint32_t>(st.start[k]);
    }
    if (covered > m) throw error(errc::format, "class ranks past their classes' element counts in this base", where);
    rank_bits_.resize_uninit(total_words);
    std::uint64_t* bits = rank_bits_.data();
    std::memset(bits, 0, total_words * sizeof(std::uint64_t));
    for (unsigned k = 0; k < K; ++k) {
      std::uint64_t* bk = bits + word0[k];
      for (std::uint64_t i = st.start[k]; i < st.start[k + 1]; ++i) bk[ranks[i] >> 6] |= std::uint64_t{1} << (ranks[i] & 63);
    }
    const std::int64_t* dist = dist_.data();
    const std::uint64_t* raw = raw_.data();
    std::size_t out = 0, batch_out = 0;  // changes placed; the first of the batch
    src_.resize_uninit(detail::block_batch::blocks * 64);
    std::uint32_t* src = src_.data();  // per change of the batch: its index in ranks_, dist_, raw_
    [[maybe_unused]] const bool vector_blocks = cpu_avx512_block_changes();  // read once, not per block
    bool bad = false;
    const unsigned X = T + 2;
    std::uint64_t running[max_base_classes + 1] = {};
    detail::block_batch bb;
    for (std::size_t first = 0; first < m; first += detail::block_batch::blocks * 64) {
      const std::size_t nb = detail::fill_batch<W, V3>(base, first, m, c, running, bb);
      for (std::size_t b = 0; b < nb; ++b) {
        const std::uint64_t* e = bb.ext + b * X;
        std::uint64_t hits = 0;
        for (unsigned k = 0; k < K; ++k) {
          const std::uint64_t cm = e[k] & ~e[k + 1];
          const unsigned pc = static_cast<unsigned>(std::popcount(cm));
          // bits count[k] .. count[k] + pc - 1 of class k's bitmap (words past its end: the zero word)
          const std::uint64_t* bk = bits + word0[k];
          const std::uint64_t w = count[k] >> 6, last = words[k] - 1;
          const unsigned sh = static_cast<unsigned>(count[k] & 63);
          const std::uint64_t lo = bk[std::min(w, last)], hi = bk[std::min(w + 1, last)];
          const std::uint64_t mine = ((lo >> sh) | ((hi << 1) << (63 - sh))) & detail::below(pc);
          const std::uint64_t mine_lanes = conditioned_detail::deposit<V3>(mine, cm);
          hits |= mine_lanes;
          block_count[k] = static_cast<std::uint32_t>(std::popcount(mine_lanes));
          count[k] += pc;
        }
        const std::uint64_t start = first + b * 64;
#ifdef BITREFIT_CODEC_X86
        if (const auto nh = static_cast<unsigned>(std::popcount(hits)); nh <= 16 && vector_blocks) {
          block_changes_avx512(hits, nh, e, T, next, static_cast<std::uint32_t>(start), pos_out + out, src + (out - batch_out));
          for (unsigned k = 0; k < K; ++k) next[k] += block_count[k];
          out += nh;
          continue;
        }
#endif
        while (hits) {
          const unsigned lane = static_cast<unsigned>(std::countr_zero(hits));
          hits &= hits - 1;
          unsigned cls = 0;  // the threshold words that hold the lane
          for (unsigned j = 1; j <= T; ++j) cls += static_cast<unsigned>((e[j] >> lane) & 1);
          pos_out[out] = static_cast<std::uint32_t>(start + lane);
          src[out - batch_out] = next[cls]++;
          ++out;
        }
      }
      // the batch's new patterns in one pass (its base lines are still in L1): in the loop above
      // they cost about a fifth of an AdamW-like item's apply, one change at a time
      new_patterns<W>(f, base, m, pos_out + batch_out, src, dist, raw, out - batch_out, val_out + batch_out * sizeof(W), bad);
      batch_out = out;
    }
    if (bad) throw error(errc::format, "a decoded value leaves its base value's sign or finite range, or escapes to the base value (wrong base?)", where);
    for (unsigned k = 0; k < K; ++k)
      if (next[k] != st.start[k + 1]) throw error(errc::format, "class " + std::to_string(k) + " rank past the class's element count in this base", where);
  }

  template <class W>
  BITREFIT_TARGET_V3 void scan_v3(const float_format& f, const class_spec& spec, const std::byte* base, std::uint64_t m,
                                  const state& st, std::uint32_t* pos_out, std::byte* val_out, const error_context& where) {
    scan_impl<W, true>(f, spec, base, m, st, pos_out, val_out, where);
  }
  template <class W>
  void scan_generic(const float_format& f, const class_spec& spec, const std::byte* base, std::uint64_t m, const state& st,
                    std::uint32_t* pos_out, std::byte* val_out, const error_context& where) {
    scan_impl<W, false>(f, spec, base, m, st, pos_out, val_out, where);
  }

  scratch_buffer<std::uint32_t> ranks_;
  scratch_buffer<std::uint32_t> src_;        // scan_impl: each change of a batch, its index in ranks_
  scratch_buffer<std::uint64_t> rank_bits_;  // scan_impl: the classes' changed ranks as bitmaps
  scratch_buffer<std::int64_t> dist_;
  scratch_buffer<std::uint64_t> raw_;
};

/// Ideal cost estimate (1/256 bits) of coding a sample's changes base-conditioned under `spec`:
/// sum_k n_k·H(c_k/n_k) + the empirical entropy of each class's value symbols + their raw bits.
/// `class_elements[k]` = n_k over the sample; `classes`, `old_vals`, `new_vals` per sampled change.
inline std::uint64_t conditioned_cost_q8(const float_format& f, const class_spec& spec, std::span<const std::uint64_t> class_elements,
                                         std::span<const std::uint8_t> classes, std::span<const std::byte> old_vals,
                                         std::span<const std::byte> new_vals) {
  using namespace conditioned_detail;
  const unsigned K = spec.count, E = f.element_size, VA = value_alphabet(f);
  std::vector<std::uint64_t> vh(K * VA, 0);
  std::array<std::uint64_t, max_base_classes> ck{};
  std::uint64_t raw_bits = 0;
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const auto v = code_value(f, load_bits(old_vals.data() + i * E, E), load_bits(new_vals.data() + i * E, E), 0);
    ++vh[std::size_t{classes[i]} * VA + v.symbol];
    ++ck[classes[i]];
    raw_bits += v.extra_bits;
  }
  std::uint64_t q8 = raw_bits << 8;
  for (unsigned k = 0; k < K; ++k) {
    q8 += binary_entropy_q8(class_elements[k], std::min(ck[k], class_elements[k]));
    q8 += histogram_entropy_q8({vh.data() + k * VA, VA});
  }
  return q8;
}

}  // namespace bitrefit::codec
