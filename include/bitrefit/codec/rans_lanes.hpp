// bitrefit/codec/rans_lanes.hpp — sixteen interleaved rANS states over one stream, so that an
// AVX-512 encoder codes sixteen symbols per instruction.
//
// Why: the byte-wise coder (rans.hpp) codes a stream with one state. Every symbol costs a chain of
// about twenty instructions (renormalise, reciprocal multiply, add), and a one-class item at 5 %
// spent 42 % of its encode time there (bench/codec/README.md). Several scalar states do not help
// (measured: the work per symbol stays the same). Sixteen states in one vector do: the same
// symbols cost about 1 ns per change instead of about 7 (bench/codec/README.md, "Sixteen lanes").
//
// The coder. Lane l (0..15) has a 32-bit state x in [L, 2^31), L = 2^15; renormalisation is by
// 16-bit words, at most one per operation. A symbol s with frequency f and start b in a table of
// total 2^S (S <= 15) is coded as x' = (x / f)·2^S + (x mod f) + b, the state first brought below
// f·2^(31-S) by emitting its low word; raw bits v of width w (0..15) as x' = x·2^w + v, the state
// first brought below 2^(31-w) (w = 16 would need L to be a multiple of 2^16: a state could fall
// below L). States stay below 2^31, so the reciprocal division is exact, as in
// rans.hpp. A stream is a schedule of operations, each over the sixteen lanes:
//   - the decoder reads the sixteen initial states (u32 little-endian, lane 0 first), then runs the
//     operations in order, each over lanes 15, 14, ..., 0 (those active), and after each lane's
//     decode reads one 16-bit little-endian word when the state fell below L;
//   - the encoder runs the schedule backwards, each operation over lanes 0, 1, ..., 15, emitting a
//     lane's low word before coding it when its state is too large. Emitted words are kept in
//     emission order and reversed at the end, so the decoder reads forwards.
// Lane-ascending emission is what AVX-512's compress yields, so the vector encoder stores each
// operation's words with one store. The stream ends in every lane's initial state L, and must be
// consumed exactly (a truncated, padded or altered stream is a format error).
//
// Which symbols go to which lane and in which order is the caller's schedule (conditioned.hpp:
// change i of a class is lane i mod 16 of group i / 16). Both encoders here (scalar and AVX-512)
// give the same bytes (tests/codec/test_rans_lanes.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/isa.hpp"
#include "bitrefit/codec/rans.hpp"
#include "bitrefit/core/error.hpp"

#ifdef BITREFIT_CODEC_X86
#include <immintrin.h>
#endif

namespace bitrefit::codec::rans_lanes {

inline constexpr unsigned lanes = 16;
inline constexpr std::uint32_t lower_bound = 1u << 15;  // L
inline constexpr std::size_t header_bytes = 4 * lanes;  // the initial states
inline constexpr unsigned max_raw_bits = 15;              // per put_raw

/// Encoder form of a rans::table (scale_bits <= 15), one entry per symbol, padded with zeros to a
/// multiple of 32 entries (the vector encoder looks tables of up to 32 symbols up in registers).
struct enc_table {
  std::vector<std::uint32_t> x_limit;  // f·2^(31-S) - 1: a state above it emits a word first
  std::vector<std::uint32_t> rcp;      // reciprocal of f (rans.hpp's enc_symbol)
  std::vector<std::uint32_t> rcp_shift;
  std::vector<std::uint32_t> bias;
  std::vector<std::uint32_t> cmpl;  // 2^S - f
  // The same fields one row per symbol, {x_limit, rcp, bias, cmpl | rcp_shift << 16}: the AVX2
  // encoder loads a lane's row with one 16-byte load and transposes eight rows (AVX2 has no
  // two-register permute, and eight gathers of eight lanes cost more than the loads).
  std::vector<std::array<std::uint32_t, 4>> rows;
  std::size_t symbols = 0;
};

inline enc_table encoder_table(const rans::table& t) {
  if (t.scale_bits == 0 || t.scale_bits > rans::max_scale_bits) throw error(errc::invalid_argument, "rans_lanes: scale bits out of range");
  enc_table e;
  e.symbols = t.size();
  const std::size_t n = std::max<std::size_t>(32, (t.size() + 31) / 32 * 32);
  for (auto* v : {&e.x_limit, &e.rcp, &e.rcp_shift, &e.bias, &e.cmpl}) v->assign(n, 0);
  e.rows.assign(n, {0, 0, 0, 0});
  const auto sym = rans::encoder_symbols(t);
  for (std::size_t s = 0; s < t.size(); ++s) {
    const std::uint32_t f = t.freq[s];
    if (f == 0) continue;
    const rans::enc_symbol& r = sym[s];
    e.x_limit[s] = static_cast<std::uint32_t>((std::uint64_t{f} << (31 - t.scale_bits)) - 1);
    e.rcp[s] = r.rcp_freq, e.rcp_shift[s] = r.rcp_shift, e.bias[s] = r.bias, e.cmpl[s] = r.cmpl_freq;
    e.rows[s] = {e.x_limit[s], r.rcp_freq, r.bias, std::uint32_t{r.cmpl_freq} | (std::uint32_t{r.rcp_shift} << 16)};
  }
  return e;
}

/// Scalar encoder of one stream: sixteen states, words in emission order below `end` of its
/// buffer (see the header comment). The vector encoder below continues from the same object.
class encoder {
 public:
  /// Reserves room for `max_ops` lane operations (each emits at most one word).
  void begin(std::size_t max_ops) {
    buf_.resize_uninit(header_bytes + 2 * max_ops + 64);  // + 64: the vector encoder stores whole vectors
    out_ = buf_.data() + header_bytes;
    x_.fill(lower_bound);
  }
  BITREFIT_INLINE void put(unsigned l, const enc_table& t, std::uint32_t s) noexcept {
    std::uint32_t x = x_[l];
    if (x > t.x_limit[s]) emit(x);
    const std::uint32_t q = static_cast<std::uint32_t>((std::uint64_t{x} * t.rcp[s]) >> 32) >> t.rcp_shift[s];
    x_[l] = x + t.bias[s] + q * t.cmpl[s];
  }
  /// `bits` (0..15) raw bits of v.
  BITREFIT_INLINE void put_raw(unsigned l, std::uint32_t v, unsigned bits) noexcept {
    std::uint32_t x = x_[l];
    if ((std::uint64_t{x} >> (31 - bits)) != 0) emit(x);
    x_[l] = (x << bits) | (v & ((1u << bits) - 1));
  }
  /// The stream: the states, then the words in reading order.
  std::span<const std::byte> finish() {
    const std::size_t words = static_cast<std::size_t>(out_ - (buf_.data() + header_bytes)) / 2;
    std::byte* w = buf_.data() + header_bytes;
    for (std::size_t i = 0, j = words; i + 1 < j; ++i, --j) {
      std::swap(w[2 * i], w[2 * (j - 1)]);
      std::swap(w[2 * i + 1], w[2 * (j - 1) + 1]);
    }
    for (unsigned l = 0; l < lanes; ++l)
      for (unsigned b = 0; b < 4; ++b) buf_.data()[4 * l + b] = static_cast<std::byte>((x_[l] >> (8 * b)) & 0xFF);
    return {buf_.data(), header_bytes + 2 * words};
  }
  std::size_t capacity_bytes() const noexcept { return buf_.capacity_bytes(); }

  std::array<std::uint32_t, lanes>& states() noexcept { return x_; }
  std::byte*& cursor() noexcept { return out_; }

 private:
  BITREFIT_INLINE void emit(std::uint32_t& x) noexcept {
    out_[0] = static_cast<std::byte>(x & 0xFF);
    out_[1] = static_cast<std::byte>((x >> 8) & 0xFF);
    out_ += 2;
    x >>= 16;
  }
  byte_buffer buf_;
  std::byte* out_ = nullptr;
  std::array<std::uint32_t, lanes> x_{};
};

#ifdef BITREFIT_CODEC_X86
/// The vector encoder: all sixteen lanes of one operation at once, states in a register. Each
/// operation's words are compressed in lane order and stored whole at the cursor (the buffer has
/// 64 bytes of slack), which advances by their count: the scalar encoder's bytes.
// (Zero-masked forms with every lane selected: GCC 12's unmasked ones start from an "undefined"
// vector that -Wall reports as maybe-uninitialized wherever they are inlined.)
#define BITREFIT_RANS_LANES_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512cd,popcnt"), always_inline)) inline
inline constexpr __mmask16 all16 = 0xFFFF;
inline constexpr __mmask8 all8 = 0xFF;

BITREFIT_RANS_LANES_TARGET void emit16(__m512i& x, __mmask16 m, std::byte*& out) noexcept {
  // compress the states (32-bit lanes; the 16-bit compress is slow on some CPUs), then narrow
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_maskz_cvtepi32_epi16(all16, _mm512_maskz_compress_epi32(m, x)));
  out += 2 * static_cast<unsigned>(__builtin_popcount(m));
  x = _mm512_mask_srli_epi32(x, m, x, 16);
}
/// A table lookup of sixteen symbols: two registers for tables of up to 32 symbols, else a gather.
BITREFIT_RANS_LANES_TARGET __m512i lookup16(const std::vector<std::uint32_t>& t, __m512i s, bool small) noexcept {
  if (small) return _mm512_permutex2var_epi32(_mm512_loadu_si512(t.data()), s, _mm512_loadu_si512(t.data() + 16));
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), all16, s, t.data(), 4);
}
/// put() of sixteen lanes: symbol s[l] in lane l.
BITREFIT_RANS_LANES_TARGET void put16(__m512i& x, const enc_table& t, __m512i s, std::byte*& out) noexcept {
  const bool small = t.symbols <= 32;
  emit16(x, _mm512_cmpgt_epu32_mask(x, lookup16(t.x_limit, s, small)), out);
  const __m512i rcp = lookup16(t.rcp, s, small);
  // q = mulhi32(x, rcp) >> shift: the even lanes' and the odd lanes' 64-bit products
  const __m512i even = _mm512_maskz_srli_epi64(all8, _mm512_maskz_mul_epu32(all8, x, rcp), 32);
  const __m512i odd = _mm512_maskz_mul_epu32(all8, _mm512_maskz_srli_epi64(all8, x, 32), _mm512_maskz_srli_epi64(all8, rcp, 32));
  const __m512i q = _mm512_maskz_srlv_epi32(all16, _mm512_mask_blend_epi32(0xAAAA, even, odd), lookup16(t.rcp_shift, s, small));
  x = _mm512_add_epi32(_mm512_add_epi32(x, lookup16(t.bias, s, small)), _mm512_mullo_epi32(q, lookup16(t.cmpl, s, small)));
}
/// put_raw() of sixteen lanes: bits[l] (0..15) raw bits of v[l] (v below 2^bits).
BITREFIT_RANS_LANES_TARGET void put_raw16(__m512i& x, __m512i v, __m512i bits, std::byte*& out) noexcept {
  // No lane takes a bit (the common case: +-1 ULP values have no raw field, gaps rarely need more
  // than 15 bits): then nothing is emitted and x stays, so skip the compress and store.
  if (!_mm512_test_epi32_mask(bits, bits)) return;
  const __m512i top = _mm512_maskz_srlv_epi32(all16, x, _mm512_sub_epi32(_mm512_set1_epi32(31), bits));
  emit16(x, _mm512_test_epi32_mask(top, top), out);
  x = _mm512_or_si512(_mm512_maskz_sllv_epi32(all16, x, bits), v);
}
#endif

#ifdef BITREFIT_CODEC_X86
/// The AVX2 encoder (x86-64-v3 CPUs without AVX-512): the sixteen lanes as two registers of eight,
/// lanes 0-7 and 8-15, each operation's words stored lanes 0-7 first: the scalar encoder's bytes.
/// AVX2 has no compress; an operation's words are narrowed to sixteen 16-bit lanes and each half
/// is packed by a byte shuffle looked up by its 8-bit mask (isa.hpp, compress16x8).

struct lanes16_v3 {
  __m256i lo, hi;  // lanes 0-7, 8-15
};

/// The eight 16-bit lanes of v that mask m selects, packed, stored at out (16 bytes), which advances
/// past them.
BITREFIT_V3_INLINE void store_packed8(__m128i v, unsigned m, std::byte*& out) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(v, _mm_load_si128(reinterpret_cast<const __m128i*>(compress16x8.at[m].data()))));
  out += 2 * static_cast<unsigned>(__builtin_popcount(m));
}
/// emit() of the lanes where `need` is all ones: their low words in lane order, then x >>= 16 there.
BITREFIT_V3_INLINE void emit16_v3(lanes16_v3& x, lanes16_v3 need, std::byte*& out) noexcept {
  const unsigned mlo = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(need.lo)));
  const unsigned mhi = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(need.hi)));
  if ((mlo | mhi) == 0) return;  // most operations of a +-1 ULP stream emit nothing
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  // packus: [lo 0-3, hi 0-3 | lo 4-7, hi 4-7] (values <= 0xFFFF: no saturation); the permute puts
  // the quarters in lane order 0-3, 4-7, 8-11, 12-15
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(x.lo, low16), _mm256_and_si256(x.hi, low16)), 0xD8);
  store_packed8(_mm256_castsi256_si128(w), mlo, out);
  store_packed8(_mm256_extracti128_si256(w, 1), mhi, out);
  x.lo = _mm256_blendv_epi8(x.lo, _mm256_srli_epi32(x.lo, 16), need.lo);
  x.hi = _mm256_blendv_epi8(x.hi, _mm256_srli_epi32(x.hi, 16), need.hi);
}
/// A table's fields for eight symbols: each lane's row loaded and the eight rows transposed.
struct fields8 {
  __m256i x_limit, rcp, bias, cmpl_shift;
};
/// Row a in the low half, row b in the high one. (Helpers, not lambdas: a lambda does not take
/// its enclosing function's target attribute in GCC 12.)
BITREFIT_V3_INLINE __m256i two_rows(const std::array<std::uint32_t, 4>& a, const std::array<std::uint32_t, 4>& b) noexcept {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.data()))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.data())), 1);
}
BITREFIT_V3_INLINE fields8 lookup8(const enc_table& t, __m256i s) noexcept {
  alignas(32) std::uint32_t sym[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sym), s);
  const auto* rows = t.rows.data();
  const __m256i r0 = two_rows(rows[sym[0]], rows[sym[4]]), r1 = two_rows(rows[sym[1]], rows[sym[5]]);
  const __m256i r2 = two_rows(rows[sym[2]], rows[sym[6]]), r3 = two_rows(rows[sym[3]], rows[sym[7]]);
  const __m256i t0 = _mm256_unpacklo_epi32(r0, r1), t1 = _mm256_unpackhi_epi32(r0, r1);
  const __m256i t2 = _mm256_unpacklo_epi32(r2, r3), t3 = _mm256_unpackhi_epi32(r2, r3);
  return {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
}
/// The coding step of put() for eight lanes' states x (already renormalised) given their symbols'
/// fields: the new states.
BITREFIT_V3_INLINE __m256i code8_v3(__m256i x, const fields8& e) noexcept {
  const __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(x, e.rcp), 32);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), _mm256_srli_epi64(e.rcp, 32));
  const __m256i q = _mm256_srlv_epi32(_mm256_blend_epi32(even, odd, 0xAA), _mm256_srli_epi32(e.cmpl_shift, 16));
  return _mm256_add_epi32(_mm256_add_epi32(x, e.bias), _mm256_mullo_epi32(q, _mm256_and_si256(e.cmpl_shift, _mm256_set1_epi32(0xFFFF))));
}
/// put() of sixteen lanes: symbol s[l] in lane l.
BITREFIT_V3_INLINE void put16_v3(lanes16_v3& x, const enc_table& t, lanes16_v3 s, std::byte*& out) noexcept {
  const fields8 a = lookup8(t, s.lo), b = lookup8(t, s.hi);
  // states and limits are below 2^31: the signed compare is the unsigned one
  emit16_v3(x, {_mm256_cmpgt_epi32(x.lo, a.x_limit), _mm256_cmpgt_epi32(x.hi, b.x_limit)}, out);
  x.lo = code8_v3(x.lo, a), x.hi = code8_v3(x.hi, b);
}
/// put_raw() of sixteen lanes: bits[l] (0..15) raw bits of v[l] (v below 2^bits).
BITREFIT_V3_INLINE void put_raw16_v3(lanes16_v3& x, lanes16_v3 v, lanes16_v3 bits, std::byte*& out) noexcept {
  // no lane takes a bit (the common case, as in put_raw16): nothing is emitted and x stays
  if (_mm256_testz_si256(_mm256_or_si256(bits.lo, bits.hi), _mm256_or_si256(bits.lo, bits.hi))) return;
  const __m256i k31 = _mm256_set1_epi32(31), zero = _mm256_setzero_si256();
  const __m256i tlo = _mm256_srlv_epi32(x.lo, _mm256_sub_epi32(k31, bits.lo)), thi = _mm256_srlv_epi32(x.hi, _mm256_sub_epi32(k31, bits.hi));
  const __m256i ones = _mm256_cmpeq_epi32(zero, zero);
  emit16_v3(x, {_mm256_xor_si256(_mm256_cmpeq_epi32(tlo, zero), ones), _mm256_xor_si256(_mm256_cmpeq_epi32(thi, zero), ones)}, out);
  x.lo = _mm256_or_si256(_mm256_sllv_epi32(x.lo, bits.lo), v.lo);
  x.hi = _mm256_or_si256(_mm256_sllv_epi32(x.hi, bits.hi), v.hi);
}
BITREFIT_V3_INLINE lanes16_v3 load_states_v3(const std::array<std::uint32_t, 16>& a) noexcept {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.data())), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.data() + 8))};
}
BITREFIT_V3_INLINE void store_states_v3(std::array<std::uint32_t, 16>& a, lanes16_v3 x) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.data()), x.lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.data() + 8), x.hi);
}
#endif

/// Decoder of one untrusted stream; every step bounds-checked.
class decoder {
 public:
  decoder(std::span<const std::byte> s, const error_context& where) : p_(s.data()), end_(s.data() + s.size()), where_(&where) {
    if (s.size() < header_bytes) fail("16-lane rANS stream shorter than its 64-byte states");
    for (unsigned l = 0; l < lanes; ++l) {
      std::uint32_t x = 0;
      for (unsigned b = 0; b < 4; ++b) x |= std::uint32_t{static_cast<std::uint8_t>(p_[4 * l + b])} << (8 * b);
      if (x < lower_bound || x >= (1u << 31)) fail("16-lane rANS initial state outside [2^15, 2^31)");
      x_[l] = x;
    }
    p_ += header_bytes;
  }
  BITREFIT_RANS_INLINE std::uint32_t get(unsigned l, const rans::dec_table& t) {
    std::uint32_t x = x_[l];
    const std::uint32_t mask = (1u << t.scale_bits) - 1;
    const std::uint32_t slot = x & mask;
    const std::uint32_t s = t.sym[slot];
    x = t.freq[s] * (x >> t.scale_bits) + slot - t.start[s];
    x_[l] = renorm(x);
    return s;
  }
  /// `bits` (0..15) raw bits.
  BITREFIT_RANS_INLINE std::uint32_t get_raw(unsigned l, unsigned bits) {
    const std::uint32_t x = x_[l];
    const std::uint32_t v = x & ((1u << bits) - 1);
    x_[l] = renorm(x >> bits);
    return v;
  }
  /// The stream must be consumed exactly and end in the encoder's initial states.
  void finish() const {
    if (bad_) fail("16-lane rANS state below the coder's bound (corrupted)");
    if (p_ != end_) fail("16-lane rANS stream has " + std::to_string(end_ - p_) + " bytes left after its last symbol");
    for (unsigned l = 0; l < lanes; ++l)
      if (x_[l] != lower_bound) fail("16-lane rANS stream does not end in the coder's initial states (corrupted)");
  }
  [[noreturn]] void fail(const std::string& msg) const { throw error(errc::format, msg, *where_); }
  const error_context& where() const noexcept { return *where_; }

  // The vector decoder (decode16 below) continues from and hands back to these.
  std::array<std::uint32_t, lanes>& states() noexcept { return x_; }
  const std::byte*& cursor() noexcept { return p_; }
  const std::byte* end() const noexcept { return end_; }
  void mark_bad() noexcept { bad_ = true; }

 private:
  // Without a data-dependent branch (whether a lane reads a word is a coin flip weighted by its
  // symbol's cost): the next word is loaded whenever two bytes are left, and taken or not. A state
  // still below L after its word (only in a corrupted stream) is reported by finish(); until then
  // it is just a number (no read depends on it beyond the bounds-checked cursor).
  BITREFIT_RANS_INLINE std::uint32_t renorm(std::uint32_t x) {
    const bool need = x < lower_bound;
    if (end_ - p_ < 2) [[unlikely]] {
      if (need) fail("16-lane rANS stream ends early");
      return x;
    }
    const std::uint32_t w = static_cast<std::uint8_t>(p_[0]) | (std::uint32_t{static_cast<std::uint8_t>(p_[1])} << 8);
    const std::uint32_t y = need ? (x << 16) | w : x;
    p_ += need ? 2 : 0;
    bad_ |= y < lower_bound;
    return y;
  }
  const std::byte* p_;
  const std::byte* end_;
  std::array<std::uint32_t, lanes> x_{};
  bool bad_ = false;
  const error_context* where_;
};

#ifdef BITREFIT_CODEC_X86
/// Decoder form of a table for the vector decoder: per slot of the 2^S, its symbol's frequency
/// and the slot's offset in it (f | (slot - start) << 16), and the symbol.
struct dec_table16 {
  unsigned scale_bits = 0;
  std::vector<std::uint32_t> freq_offset, sym;
  explicit dec_table16(const rans::table& t) : scale_bits(t.scale_bits) {
    freq_offset.resize(std::size_t{1} << scale_bits);
    sym.resize(std::size_t{1} << scale_bits);
    for (std::size_t s = 0; s < t.size(); ++s)
      for (std::uint32_t j = 0; j < t.freq[s]; ++j)
        freq_offset[t.start[s] + j] = t.freq[s] | (j << 16), sym[t.start[s] + j] = static_cast<std::uint32_t>(s);
  }
};

/// The decoder's sixteen lanes in one register, in reverse: vector lane j is lane 15 - j, so the
/// lanes' reading order (15 down to 0) is the vector's ascending order and each operation's words
/// are one load and an expand. The caller keeps at least 32 bytes after the cursor per operation.
struct vector_decoder {
  __m512i x;
  const std::byte* p;
  __mmask16 bad = 0;  // lanes whose state stayed below L after a word (a corrupted stream)

  BITREFIT_RANS_LANES_TARGET static __m512i reversed() noexcept {
    return _mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  }
  BITREFIT_RANS_LANES_TARGET void load(decoder& d) noexcept {
    x = _mm512_maskz_permutexvar_epi32(all16, reversed(), _mm512_loadu_si512(d.states().data()));
    p = d.cursor();
  }
  BITREFIT_RANS_LANES_TARGET void store(decoder& d) const noexcept {
    _mm512_storeu_si512(d.states().data(), _mm512_maskz_permutexvar_epi32(all16, reversed(), x));
    d.cursor() = p;
    if (bad) d.mark_bad();
  }
  BITREFIT_RANS_LANES_TARGET void renorm() noexcept {
    const __m512i L = _mm512_set1_epi32(static_cast<int>(lower_bound));
    const __mmask16 need = _mm512_cmplt_epu32_mask(x, L);
    const __m512i words = _mm512_maskz_cvtepu16_epi32(all16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    x = _mm512_mask_or_epi32(x, need, _mm512_maskz_slli_epi32(all16, x, 16), _mm512_maskz_expand_epi32(need, words));
    p += 2 * static_cast<unsigned>(__builtin_popcount(need));
    bad |= _mm512_mask_cmplt_epu32_mask(need, x, L);
  }
  /// get() of sixteen lanes: their symbols.
  BITREFIT_RANS_LANES_TARGET __m512i get(const dec_table16& t) noexcept {
    const __m512i slot = _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>((1u << t.scale_bits) - 1)));
    const __m512i fo = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), all16, slot, t.freq_offset.data(), 4);
    const __m512i s = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), all16, slot, t.sym.data(), 4);
    const __m512i f = _mm512_and_si512(fo, _mm512_set1_epi32(0xFFFF));
    x = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_maskz_srli_epi32(all16, x, t.scale_bits)), _mm512_maskz_srli_epi32(all16, fo, 16));
    renorm();
    return s;
  }
  /// get_raw() of sixteen lanes, bits[j] (0..15) in vector lane j.
  BITREFIT_RANS_LANES_TARGET __m512i get_raw(__m512i bits) noexcept {
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i v = _mm512_and_si512(x, _mm512_sub_epi32(_mm512_maskz_sllv_epi32(all16, one, bits), one));
    x = _mm512_maskz_srlv_epi32(all16, x, bits);
    renorm();
    return v;
  }
};
#endif

}  // namespace bitrefit::codec::rans_lanes
