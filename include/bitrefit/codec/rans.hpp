// bitrefit/codec/rans.hpp — a static range-asymmetric-numeral-system (rANS) entropy coder.
//
// Why rANS and not zstd's Huffman/FSE: the base-conditioned coding (conditioned.hpp) codes, per
// class of the base value, one symbol per changed element with that class's own statistics.
// Measured on the codec bench's AdamW delta (64 MiB BF16, per-class streams of gap and ULP
// symbols), zstd's literals coder on per-class byte streams spent 9–17 % above the class entropy
// (Huffman's whole-bit code lengths on skewed alphabets, e.g. P(+1 ulp) = P(-1 ulp) = 0.44, plus one
// Huffman table per stream and class), while this coder spends 0.3–1 % above it (bench/codec/README.md,
// "entropy coder"). It needs no external dependency and is ~150 lines.
//
// The coder (after F. Giesen's public-domain rans_byte, reimplemented): 32-bit state x in
// [L, 256·L), L = 2^23, byte-wise renormalisation. A symbol s with frequency f_s and cumulative start
// b_s in a table of total 2^S is coded as x' = (x / f_s)·2^S + (x mod f_s) + b_s. The encoder runs
// backwards over the symbols and writes bytes backwards, so the decoder reads forwards. Raw bits
// (uniform values of up to 16 bits) are the special case f = 1, S = bits: x' = x·2^bits + v.
// Everything is integer arithmetic; tables are normalised deterministically (same counts, same
// table, on every platform), so re-encoding yields the same bytes.
//
// Untrusted input: a table is rejected unless its frequencies sum exactly to 2^S with S in
// [1, max_scale_bits]; the decoder never reads outside its span and must end exactly at the span's
// end in the encoder's initial state (a truncated, padded or altered stream is a format error).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/fixed_log2.hpp"
#include "bitrefit/core/error.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define BITREFIT_RANS_INLINE __attribute__((always_inline)) inline
#else
#define BITREFIT_RANS_INLINE inline
#endif

namespace bitrefit::codec::rans {

inline constexpr std::uint32_t lower_bound = 1u << 23;  // L
inline constexpr unsigned max_scale_bits = 15;
inline constexpr unsigned max_alphabet = 512;

/// A normalised frequency table: freq[s] for s < size(), summing to 2^scale_bits.
struct table {
  unsigned scale_bits = 0;
  std::vector<std::uint32_t> freq;   // per symbol (0 = never coded)
  std::vector<std::uint32_t> start;  // cumulative

  std::size_t size() const noexcept { return freq.size(); }
  friend bool operator==(const table& a, const table& b) { return a.scale_bits == b.scale_bits && a.freq == b.freq; }

  void finish_starts() {
    start.resize(freq.size());
    std::uint32_t s = 0;
    for (std::size_t i = 0; i < freq.size(); ++i) start[i] = s, s += freq[i];
  }

  /// Normalises `counts` (not all zero) to a total of 2^scale_bits. Every symbol with a nonzero
  /// count gets a frequency >= 1 (it stays codable); the rest is spread proportionally, rounding
  /// down, and the remainder goes one unit at a time to the symbols with the largest fractional
  /// parts (ties: lower symbol). Integer-only and deterministic. @pre nonzero symbols <= 2^scale_bits.
  static table normalise(std::span<const std::uint64_t> counts, unsigned scale_bits) {
    if (scale_bits == 0 || scale_bits > max_scale_bits) throw error(errc::invalid_argument, "rANS scale bits out of range");
    if (counts.size() > max_alphabet) throw error(errc::invalid_argument, "rANS alphabet too large");
    std::size_t last = 0, used = 0;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (counts[i]) last = i + 1, ++used, total += counts[i];
    if (total == 0) throw error(errc::invalid_argument, "rANS table of an empty histogram");
    const std::uint64_t M = std::uint64_t{1} << scale_bits;
    if (used > M) throw error(errc::invalid_argument, "more symbols than table slots");
    table t;
    t.scale_bits = scale_bits;
    t.freq.assign(last, 0);
    // Reserve one slot per used symbol, spread the rest proportionally: f = 1 + floor(c * R / total).
    const std::uint64_t R = M - used;
    std::uint64_t given = 0;
    std::vector<std::uint64_t> rem(last, 0);
    for (std::size_t i = 0; i < last; ++i) {
      if (!counts[i]) continue;
      const unsigned __int128 p = static_cast<unsigned __int128>(counts[i]) * R;
      const auto q = static_cast<std::uint64_t>(p / total);
      rem[i] = static_cast<std::uint64_t>(p % total);
      t.freq[i] = static_cast<std::uint32_t>(1 + q);
      given += 1 + q;
    }
    for (std::uint64_t left = M - given; left > 0; --left) {
      std::size_t best = last;
      for (std::size_t i = 0; i < last; ++i)
        if (counts[i] && (best == last || rem[i] > rem[best])) best = i;
      t.freq[best] += 1;
      rem[best] = 0;
    }
    t.finish_starts();
    return t;
  }
};

/// Cost in 1/256 bits of coding the histogram `counts` with table `t`: sum of count·(S - log2 f).
/// @pre every counted symbol has a nonzero frequency in t.
inline std::uint64_t coded_cost_q8(std::span<const std::uint64_t> counts, const table& t) {
  std::uint64_t q8 = 0;
  for (std::size_t i = 0; i < counts.size() && i < t.freq.size(); ++i)
    if (counts[i]) q8 += cost_q8(counts[i], t.freq[i], std::uint64_t{1} << t.scale_bits);
  return q8;
}

namespace detail {
inline void put_varint(byte_buffer& out, std::uint64_t v) {
  while (v >= 0x80) out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80)), v >>= 7;
  out.push_back(static_cast<std::byte>(v));
}
}  // namespace detail

/// Bounded little-endian reader over an untrusted span; every failure is errc::format at `where`.
class reader {
 public:
  reader(std::span<const std::byte> s, const error_context& where) : s_(s), where_(&where) {}
  std::uint64_t varint(std::uint64_t max, const char* what) {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (i_ >= s_.size()) fail(std::string(what) + ": section ends inside a number");
      if (shift > 63) fail(std::string(what) + ": number longer than 64 bits");
      const auto b = static_cast<std::uint8_t>(s_[i_++]);
      v |= std::uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) break;
    }
    if (v > max) fail(std::string(what) + " " + std::to_string(v) + " exceeds its bound " + std::to_string(max));
    return v;
  }
  std::uint8_t u8() {
    if (i_ >= s_.size()) fail("section ends early");
    return static_cast<std::uint8_t>(s_[i_++]);
  }
  std::span<const std::byte> rest() const noexcept { return s_.subspan(i_); }
  std::span<const std::byte> take(std::uint64_t n, const char* what) {
    if (n > s_.size() - i_) fail(std::string(what) + " runs past the section end");
    auto r = s_.subspan(i_, n);
    i_ += n;
    return r;
  }
  [[noreturn]] void fail(const std::string& msg) const { throw error(errc::format, msg, *where_); }
  const error_context& where() const noexcept { return *where_; }

 private:
  std::span<const std::byte> s_;
  std::size_t i_ = 0;
  const error_context* where_;
};

/// Tables on the wire are compact: the histogram they are normalised from is sent approximately,
/// one byte per symbol on a log scale (code 0: unused; code q >= 1: count ~ 2^((q-1)/8)), and both
/// ends normalise the SAME approximate histogram, so they hold identical tables. The coder then
/// spends a little more than the exact histogram's entropy (probabilities off by at most 2^(1/16),
/// under 0.1 % here) and the table costs one byte per symbol instead of two or three: on items of a
/// few thousand changes, where tables are a tenth of the item, that is what matters.
///   u8 scale_bits, varint n (symbols up to the last used one), n count codes.
inline std::uint8_t count_code(std::uint64_t count) noexcept {
  if (count == 0) return 0;
  // round(8·log2(count)) + 1, from the Q32 log (integer arithmetic only), capped at 255
  const std::uint64_t l8 = (log2_q32(count) * 8 + (std::uint64_t{1} << 31)) >> 32;
  return static_cast<std::uint8_t>(std::min<std::uint64_t>(255, l8 + 1));
}
/// The count a code stands for: 2^((q-1)/8) as an integer, from eight fixed mantissas (Q16 of
/// 2^(i/8), i = 0..7), exact and identical on every platform.
inline std::uint64_t code_count(std::uint8_t q) noexcept {
  static constexpr std::uint64_t mant[8] = {65536, 71468, 77936, 84990, 92682, 101070, 110218, 120194};
  if (q == 0) return 0;
  const unsigned e = (q - 1u) / 8, f = (q - 1u) % 8;
  return std::max<std::uint64_t>(1, (mant[f] << e) >> 16);
}

/// The table both ends use for a histogram: normalise(approximate counts).
inline table table_of(std::span<const std::uint64_t> counts, unsigned scale_bits) {
  std::vector<std::uint64_t> approx(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) approx[i] = code_count(count_code(counts[i]));
  return table::normalise(approx, scale_bits);
}

inline void write_table(std::span<const std::uint64_t> counts, unsigned scale_bits, byte_buffer& out) {
  std::size_t n = counts.size();
  while (n > 0 && counts[n - 1] == 0) --n;
  out.push_back(static_cast<std::byte>(scale_bits));
  detail::put_varint(out, n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(count_code(counts[i])));
}

namespace detail {
inline void check_scale_bits(const reader& r, unsigned scale_bits, const char* what) {
  if (scale_bits == 0 || scale_bits > max_scale_bits) r.fail(std::string(what) + ": rANS scale bits " + std::to_string(scale_bits) + " outside [1, 15]");
}
/// The table of counts read from the wire (`used` of them nonzero), with a checked scale: what
/// both table forms end with. Rejects an empty histogram and more used symbols than table slots.
inline table wire_table(const reader& r, const std::vector<std::uint64_t>& approx, std::size_t used, unsigned scale_bits, const char* what) {
  if (used == 0) r.fail(std::string(what) + ": table without symbols");
  check_scale_bits(r, scale_bits, what);
  if (used > (std::size_t{1} << scale_bits)) r.fail(std::string(what) + ": more symbols than table slots");
  return table::normalise(approx, scale_bits);
}
}  // namespace detail

/// Reads a table written by write_table; `alphabet` bounds its size. Rejects a scale outside
/// [1, 15] (before reading the codes), an empty histogram and more used symbols than table slots.
inline table read_table(reader& r, std::size_t alphabet, const char* what) {
  const unsigned scale_bits = r.u8();
  detail::check_scale_bits(r, scale_bits, what);
  const std::uint64_t n = r.varint(std::min<std::size_t>(alphabet, max_alphabet), what);
  std::vector<std::uint64_t> approx(n);
  std::size_t used = 0;
  for (auto& c : approx) {
    c = code_count(r.u8());
    used += c != 0;
  }
  return detail::wire_table(r, approx, used, scale_bits, what);
}

/// Predicted tables: the same count codes as write_table, each sent as its difference from a
/// prediction made from the codes before it, and no scale byte (both ends derive the scale from
/// what they already know). Why: on items of a few thousand changes the class tables were about
/// 4 % of the item, and their codes are far from random: gap counts fall smoothly from symbol to
/// symbol, and a value's count is close to that of the same distance with the other sign
/// (conditioned.hpp says which predictor each table uses). On a real AdamW run's BF16 items a
/// class's two tables took 26 bytes on average instead of 39 (bench/codec/README.md, "Predicted
/// tables").
///   varint n (symbols up to the last used one); per code q_i, with prediction p_i = predict(codes,
///   i): if p_i < 0 (none), its 8 bits; else Exp-Golomb of order 2 of zigzag(q_i - p_i) (z zero
///   bits, a one bit, then the low z + 2 bits of zigzag + 4, whose bit width is z + 3); bits are
///   packed least significant first; zero bits up to the next byte boundary.
/// `predict(const std::uint8_t* codes, std::size_t i)` -> int: the prediction of code i from
/// codes[0, i), or a negative value for none.
namespace detail {
class bit_writer {
 public:
  explicit bit_writer(byte_buffer& out) : out_(&out) {}
  void put(std::uint64_t bits, unsigned n) {  // n <= 32
    acc_ |= (bits & ((std::uint64_t{1} << n) - 1)) << fill_;
    fill_ += n;
    while (fill_ >= 8) out_->push_back(static_cast<std::byte>(acc_ & 0xFF)), acc_ >>= 8, fill_ -= 8;
  }
  void finish() {
    if (fill_) out_->push_back(static_cast<std::byte>(acc_ & 0xFF));
    acc_ = 0, fill_ = 0;
  }

 private:
  byte_buffer* out_;
  std::uint64_t acc_ = 0;
  unsigned fill_ = 0;
};
class bit_reader {
 public:
  explicit bit_reader(reader& r) : r_(&r) {}
  unsigned bit() {
    if (fill_ == 0) acc_ = r_->u8(), fill_ = 8;
    const unsigned b = acc_ & 1u;
    acc_ >>= 1, --fill_;
    return b;
  }
  std::uint32_t bits(unsigned n) {
    std::uint32_t v = 0;
    for (unsigned i = 0; i < n; ++i) v |= std::uint32_t{bit()} << i;
    return v;
  }
  /// The padding of the last byte must be zero (one encoding per table).
  bool padding_is_zero() const noexcept { return acc_ == 0; }

 private:
  reader* r_;
  std::uint32_t acc_ = 0;
  unsigned fill_ = 0;
};
inline constexpr unsigned table_golomb_order = 2;
}  // namespace detail

template <class Predict>
void write_predicted_table(std::span<const std::uint64_t> counts, Predict&& predict, byte_buffer& out) {
  std::size_t n = counts.size();
  while (n > 0 && counts[n - 1] == 0) --n;
  detail::put_varint(out, n);
  std::vector<std::uint8_t> codes(n);
  detail::bit_writer w(out);
  constexpr unsigned k = detail::table_golomb_order;
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = count_code(counts[i]);
    const int p = predict(static_cast<const std::uint8_t*>(codes.data()), i);
    if (p < 0) {
      w.put(codes[i], 8);
      continue;
    }
    const int d = int{codes[i]} - p;
    const std::uint32_t v = (d >= 0 ? 2u * static_cast<std::uint32_t>(d) : 2u * static_cast<std::uint32_t>(-d) - 1u) + (1u << k);
    const unsigned width = static_cast<unsigned>(std::bit_width(v));
    w.put(0, width - 1 - k);
    w.put(1, 1);
    w.put(v, width - 1);
  }
  w.finish();
}

/// The count codes of a table written by write_predicted_table with the same `predict`;
/// `alphabet` bounds their number. Rejects a code outside [0, 255], an Exp-Golomb prefix longer
/// than any code needs and nonzero padding.
template <class Predict>
std::vector<std::uint8_t> read_predicted_codes(reader& r, std::size_t alphabet, Predict&& predict, const char* what) {
  const std::uint64_t n = r.varint(std::min<std::size_t>(alphabet, max_alphabet), what);
  std::vector<std::uint8_t> codes(n);
  detail::bit_reader br(r);
  constexpr unsigned k = detail::table_golomb_order;
  for (std::size_t i = 0; i < n; ++i) {
    const int p = predict(static_cast<const std::uint8_t*>(codes.data()), i);
    if (p < 0) {
      codes[i] = static_cast<std::uint8_t>(br.bits(8));
      continue;
    }
    unsigned zeros = 0;
    while (br.bit() == 0)
      // a difference of two codes in [-255, 255] from a prediction of at most 255 stays below 2^10
      if (++zeros > 8) r.fail(std::string(what) + ": code difference longer than any code");
    const std::uint32_t v = (std::uint32_t{1} << (zeros + k)) | br.bits(zeros + k);
    const std::uint32_t z = v - (1u << k);
    const int q = p + ((z & 1u) ? -static_cast<int>((z + 1) / 2) : static_cast<int>(z / 2));
    if (q < 0 || q > 255) r.fail(std::string(what) + ": count code " + std::to_string(q) + " outside [0, 255]");
    codes[i] = static_cast<std::uint8_t>(q);
  }
  if (!br.padding_is_zero()) r.fail(std::string(what) + ": nonzero bits after the last code");
  return codes;
}

/// Reads a table written by write_predicted_table with the same `predict`; `scale_of(used)` gives
/// its scale from its number of used symbols. Rejects what read_predicted_codes rejects, an empty
/// histogram and more used symbols than table slots.
template <class Predict, class ScaleOf>
table read_predicted_table(reader& r, std::size_t alphabet, Predict&& predict, ScaleOf&& scale_of, const char* what) {
  const std::vector<std::uint8_t> codes = read_predicted_codes(r, alphabet, predict, what);
  std::vector<std::uint64_t> approx(codes.size());
  std::size_t used = 0;
  for (std::size_t i = 0; i < codes.size(); ++i) used += (approx[i] = code_count(codes[i])) != 0;
  return detail::wire_table(r, approx, used, used ? scale_of(used) : 0, what);
}

/// Precomputed encoder form of one symbol (reciprocal multiplication instead of division).
struct enc_symbol {
  std::uint32_t x_max = 0;     // (L >> S << 8) * freq: the state must be below this before coding
  std::uint32_t rcp_freq = 0;  // fixed-point reciprocal of freq
  std::uint32_t bias = 0;
  std::uint16_t cmpl_freq = 0;
  std::uint16_t rcp_shift = 0;
};

/// Encoder tables of `t`: one enc_symbol per symbol (freq 0 symbols are left zero: never coded).
inline std::vector<enc_symbol> encoder_symbols(const table& t) {
  std::vector<enc_symbol> out(t.size());
  const std::uint32_t M = 1u << t.scale_bits;
  for (std::size_t s = 0; s < t.size(); ++s) {
    const std::uint32_t f = t.freq[s], b = t.start[s];
    if (f == 0) continue;
    enc_symbol& e = out[s];
    e.x_max = ((lower_bound >> t.scale_bits) << 8) * f;
    e.cmpl_freq = static_cast<std::uint16_t>(M - f);
    if (f < 2) {
      // freq 1 (or M == 1): x / 1 = x; with rcp_freq = ~0, shift 0: q = mulhi(x, 2^32-1) = x - 1,
      // so bias = start + M - 1 makes x + bias + q*(M-1) = x*M + start.
      e.rcp_freq = ~0u;
      e.rcp_shift = 0;
      e.bias = b + M - 1;
    } else {
      std::uint32_t shift = 0;
      while (f > (1u << shift)) ++shift;
      e.rcp_freq = static_cast<std::uint32_t>(((std::uint64_t{1} << (shift + 31)) + f - 1) / f);
      e.rcp_shift = static_cast<std::uint16_t>(shift - 1);
      e.bias = b;
    }
  }
  return out;
}

/// The coder's state while encoding: a value type, so a loop keeps it in registers. Writes
/// backwards below `p` into space its encoder reserved. put/put_raw in REVERSE decoding order.
struct writer {
  std::uint32_t x = lower_bound;
  std::byte* p = nullptr;

  // Renormalisation emits 0, 1 or 2 bytes (x < 2^31 and every x_max >= 2^15): both candidate bytes
  // are stored unconditionally below p (the space is free) and p moves by the count, so the
  // encoder has no data-dependent branch (a mispredicted renormalisation loop cost ~40 % of it).
  // The new state is selected from its three candidates (x, x >> 8, x >> 16) by the two compares
  // rather than shifted by their sum: one step less on the state's dependency chain, which bounds
  // a one-class item's coding (0.96x its encode time at 5 %, bench/codec/README.md).
  BITREFIT_RANS_INLINE void renorm(std::uint32_t x_max) noexcept {
    const bool one = x >= x_max, two = std::uint64_t{x} >= (std::uint64_t{x_max} << 8);
    const std::uint16_t bytes = static_cast<std::uint16_t>(((x & 0xFF) << 8) | ((x >> 8) & 0xFF));
    std::memcpy(p - 2, &bytes, 2);
    p -= static_cast<unsigned>(one) + static_cast<unsigned>(two);
    const std::uint32_t x1 = one ? x >> 8 : x;
    x = two ? x >> 16 : x1;
  }
  BITREFIT_RANS_INLINE void put(const enc_symbol& s) noexcept {
    renorm(s.x_max);
    const std::uint32_t q = static_cast<std::uint32_t>((std::uint64_t{x} * s.rcp_freq) >> 32) >> s.rcp_shift;
    x = x + s.bias + q * s.cmpl_freq;
  }
  /// `bits` (0..16) raw bits of v.
  BITREFIT_RANS_INLINE void put_raw(std::uint32_t v, unsigned bits) noexcept {
    renorm((lower_bound >> bits) << 8);
    x = (x << bits) | (v & ((1u << bits) - 1));
  }
  /// Up to 64 raw bits, as 16-bit chunks (the decoder reads the low chunk first).
  BITREFIT_RANS_INLINE void put_raw64(std::uint64_t v, unsigned bits) noexcept {
    if (bits <= 16) [[likely]] {
      put_raw(static_cast<std::uint32_t>(v), bits);
      return;
    }
    // reverse order of get_raw64: highest chunk first
    unsigned chunks = (bits + 15) / 16;
    while (chunks-- > 0) {
      const unsigned lo = chunks * 16, n = std::min(16u, bits - lo);
      put_raw(static_cast<std::uint32_t>(v >> lo), n);
    }
  }
};

/// Owns the output space of one stream: begin() reserves room for `max_symbols` puts (each emits at
/// most 2 bytes) and returns the writer; finish(w) appends the final state and returns the stream.
class encoder {
 public:
  writer begin(std::size_t max_symbols) {
    buf_.resize_uninit(2 * max_symbols + 8);
    end_ = buf_.data() + buf_.size();
    return writer{lower_bound, end_};
  }
  std::span<const std::byte> finish(writer w) {
    for (int i = 0; i < 4; ++i) *--w.p = static_cast<std::byte>((w.x >> (8 * i)) & 0xFF);  // big-endian: read first
    return {w.p, static_cast<std::size_t>(end_ - w.p)};
  }
  std::size_t capacity_bytes() const noexcept { return buf_.capacity_bytes(); }

 private:
  byte_buffer buf_;
  std::byte* end_ = nullptr;
};

/// Decoder form of a table: slot -> symbol for the 2^S slots.
struct dec_table {
  unsigned scale_bits = 0;
  std::vector<std::uint16_t> sym;  // 2^S entries
  std::vector<std::uint32_t> freq, start;
  explicit dec_table(const table& t = {}) : scale_bits(t.scale_bits), freq(t.freq), start(t.start) {
    if (t.size() == 0) return;
    sym.resize(std::size_t{1} << scale_bits);
    for (std::size_t s = 0; s < t.size(); ++s)
      std::fill_n(sym.begin() + t.start[s], t.freq[s], static_cast<std::uint16_t>(s));
  }
};

/// Forward decoder over an untrusted stream; every step bounds-checked.
class decoder {
 public:
  decoder(std::span<const std::byte> s, const error_context& where) : p_(s.data()), end_(s.data() + s.size()), where_(&where) {
    if (s.size() < 4) fail("rANS stream shorter than its 4-byte state");
    x_ = 0;
    for (int i = 0; i < 4; ++i) x_ = (x_ << 8) | static_cast<std::uint8_t>(*p_++);
    if (x_ < lower_bound) fail("rANS initial state below the coder's bound");
  }
  BITREFIT_RANS_INLINE std::uint32_t get(const dec_table& t) {
    const std::uint32_t mask = (1u << t.scale_bits) - 1;
    const std::uint32_t slot = x_ & mask;
    const std::uint32_t s = t.sym[slot];
    x_ = t.freq[s] * (x_ >> t.scale_bits) + slot - t.start[s];
    renorm();
    return s;
  }
  BITREFIT_RANS_INLINE std::uint32_t get_raw(unsigned bits) {
    const std::uint32_t v = x_ & ((1u << bits) - 1);
    x_ >>= bits;
    renorm();
    return v;
  }
  BITREFIT_RANS_INLINE std::uint64_t get_raw64(unsigned bits) {
    if (bits <= 16) [[likely]] return get_raw(bits);
    std::uint64_t v = 0;
    for (unsigned lo = 0; lo < bits; lo += 16) v |= std::uint64_t{get_raw(std::min(16u, bits - lo))} << lo;
    return v;
  }
  /// The stream must be consumed exactly and end in the encoder's initial state.
  void finish() const {
    if (p_ != end_) fail("rANS stream has " + std::to_string(end_ - p_) + " bytes left after its last symbol");
    if (x_ != lower_bound) fail("rANS stream does not end in the coder's initial state (corrupted)");
  }
  [[noreturn]] void fail(const std::string& msg) const { throw error(errc::format, msg, *where_); }

 private:
  BITREFIT_RANS_INLINE void renorm() {
    while (x_ < lower_bound) {
      if (p_ == end_) fail("rANS stream ends early");
      x_ = (x_ << 8) | static_cast<std::uint8_t>(*p_++);
    }
  }
  const std::byte* p_;
  const std::byte* end_;
  std::uint32_t x_;
  const error_context* where_;
};

}  // namespace bitrefit::codec::rans
