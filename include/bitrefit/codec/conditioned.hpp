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
//     changed elements); if c_k > 0: u8 shift s_k (0..31) and the gap table (rans.hpp format);
//     then one rANS stream: for k = 0..K-1, for each change of class k in order:
//       symbol bucket(g >> s_k), its extra bits, then the low s_k bits of g,
//     where g = rank - previous rank - 1 (previous = -1 at the start of the class).
//   values (value_coding::ulp_distance):
//     per class with c_k > 0: the value table; then one rANS stream, same order as the gaps:
//       symbol 2·bucket(|d| - 1) + (d < 0) and its extra bits, or the escape symbol (the last of
//       the alphabet) and the new pattern's 8E raw bits.
//   bucket(u): u < 16 is its own symbol; else with b = floor(log2 u): symbol 16 + 2(b - 4) + bit
//   (b-1) of u, followed by the b-1 bits below it raw (a log scale with one mantissa bit).
//
// Decode cost: the rANS streams (one table lookup and multiply per symbol), then one pass over the
// base range in 64-element blocks (threshold masks, one popcount per class per block) that maps
// class ranks back to positions in ascending order. Extra receiver memory: O(changed) for the
// decoded ranks and values (bounded by the item range, i.e. by the frame's input bound) and the
// decoder tables (at most 2·16 tables of 2^15 16-bit slots); the base is read in place.
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
#include "bitrefit/codec/rans.hpp"
#include "bitrefit/codec/ulp.hpp"
#include "bitrefit/core/error.hpp"

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
inline bucketed bucket(std::uint64_t u) noexcept {
  if (u < direct) return {static_cast<std::uint32_t>(u), 0, 0};
  const unsigned b = static_cast<unsigned>(std::bit_width(u)) - 1;  // >= 4
  return {direct + 2 * (b - 4) + static_cast<std::uint32_t>((u >> (b - 1)) & 1), b - 1, u & ((std::uint64_t{1} << (b - 1)) - 1)};
}
inline unsigned extra_bits_of(std::uint32_t sym) noexcept { return sym < direct ? 0 : 4 + (sym - direct) / 2 - 1; }
inline std::uint64_t unbucket(std::uint32_t sym, std::uint64_t extra) noexcept {
  if (sym < direct) return sym;
  const unsigned b = 4 + (sym - direct) / 2;
  return (std::uint64_t{1} << b) | (std::uint64_t{(sym - direct) & 1} << (b - 1)) | extra;
}

inline constexpr unsigned gap_alphabet = bucket_alphabet(32);  // gaps < 2^32
inline unsigned value_alphabet(const float_format& f) noexcept {
  return 2 * bucket_alphabet(8 * f.element_size - 1) + 1;  // |d| - 1 < 2^(8E-1); + escape
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
  bool escape;
};
inline value_code code_value(const float_format& f, std::uint64_t o, std::uint64_t n, std::uint32_t escape_symbol) noexcept {
  const auto d = ulp_distance(f, o, n);
  if (!d) return {escape_symbol, 8 * f.element_size, n, true};
  const std::uint64_t u = static_cast<std::uint64_t>(*d < 0 ? -*d : *d) - 1;
  const bucketed b = bucket(u);
  return {2 * b.symbol + (*d < 0 ? 1u : 0u), b.extra_bits, b.extra, false};
}

/// Table precision for a class: enough slots for its symbols, about log2 of its count (bigger
/// tables cost header bytes; smaller ones quantise the probabilities of rare symbols).
inline unsigned scale_bits_for(std::uint64_t count, std::size_t used) noexcept {
  const unsigned want = std::min<unsigned>(14, static_cast<unsigned>(std::bit_width(count)) + 1);
  return std::clamp<unsigned>(std::max<unsigned>(want, static_cast<unsigned>(std::bit_width(used))), 1, rans::max_scale_bits);
}

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
    using namespace conditioned_detail;
    const std::size_t c = classes.size();
    const unsigned K = spec.count, E = f.element_size;
    const std::uint32_t esc = value_alphabet(f) - 1;
    // counting sort by class (stable: ranks stay ascending within a class)
    std::array<std::uint64_t, max_base_classes + 1> start{};
    for (std::size_t i = 0; i < c; ++i) ++start[classes[i] + 1u];
    for (unsigned k = 0; k < K; ++k) start[k + 1] += start[k];
    order_.resize_uninit(c);
    {
      auto at = start;
      for (std::size_t i = 0; i < c; ++i) order_[at[classes[i]]++] = static_cast<std::uint32_t>(i);
    }
    // per class: shift from the mean gap, histograms of gap and value symbols
    std::array<unsigned, max_base_classes> shift{};
    gap_hist_.assign(K * gap_alphabet, 0);
    const unsigned VA = value_alphabet(f);
    val_hist_.assign(K * VA, 0);
    for (unsigned k = 0; k < K; ++k) {
      const std::uint64_t ck = start[k + 1] - start[k];
      if (!ck) continue;
      const std::uint64_t last = ranks[order_[start[k + 1] - 1]];
      const std::uint64_t mean = (last + 1 - ck) / ck;  // sum of gaps / count
      unsigned s = 0;
      while ((mean >> s) >= 8) ++s;
      shift[k] = s;
      std::int64_t prev = -1;
      for (std::uint64_t i = start[k]; i < start[k + 1]; ++i) {
        const std::uint32_t j = order_[i];
        const std::uint64_t g = static_cast<std::uint64_t>(static_cast<std::int64_t>(ranks[j]) - prev - 1);
        prev = ranks[j];
        ++gap_hist_[k * gap_alphabet + bucket(g >> s).symbol];
        const auto v = code_value(f, load_bits(old_vals.data() + std::size_t{j} * E, E), load_bits(new_vals.data() + std::size_t{j} * E, E), esc);
        ++val_hist_[k * VA + v.symbol];
      }
    }
    // tables and headers
    std::array<rans::table, max_base_classes> gt, vt;
    loc.push_back(static_cast<std::byte>(K));
    for (unsigned j = 0; j + 1 < K; ++j) rans::detail::put_varint(loc, spec.thresholds[j]);
    for (unsigned k = 0; k < K; ++k) {
      const std::uint64_t ck = start[k + 1] - start[k];
      rans::detail::put_varint(loc, ck);
      if (!ck) continue;
      loc.push_back(static_cast<std::byte>(shift[k]));
      gt[k] = make_table({gap_hist_.data() + k * gap_alphabet, gap_alphabet}, ck);
      rans::write_table(gt[k], loc);
      vt[k] = make_table({val_hist_.data() + k * VA, VA}, ck);
      rans::write_table(vt[k], val);
    }
    // streams, coded backwards (the decoder reads class 0 first, each class in rank order)
    std::array<std::vector<rans::enc_symbol>, max_base_classes> ge, ve;
    for (unsigned k = 0; k < K; ++k)
      if (start[k + 1] > start[k]) ge[k] = rans::encoder_symbols(gt[k]), ve[k] = rans::encoder_symbols(vt[k]);
    enc_.reset(6 * c + 8);
    for (unsigned k = K; k-- > 0;) {
      for (std::uint64_t i = start[k + 1]; i-- > start[k];) {
        const std::uint32_t j = order_[i];
        const std::int64_t prev = i > start[k] ? static_cast<std::int64_t>(ranks[order_[i - 1]]) : -1;
        const std::uint64_t g = static_cast<std::uint64_t>(static_cast<std::int64_t>(ranks[j]) - prev - 1);
        const bucketed q = bucket(g >> shift[k]);
        enc_.put_raw64(g & ((std::uint64_t{1} << shift[k]) - 1), shift[k]);
        enc_.put_raw64(q.extra, q.extra_bits);
        enc_.put(ge[k][q.symbol]);
      }
    }
    enc_.finish();
    loc.append(enc_.bytes());
    enc_.reset(6 * c + 8);
    for (unsigned k = K; k-- > 0;) {
      for (std::uint64_t i = start[k + 1]; i-- > start[k];) {
        const std::uint32_t j = order_[i];
        const auto v = code_value(f, load_bits(old_vals.data() + std::size_t{j} * E, E), load_bits(new_vals.data() + std::size_t{j} * E, E), esc);
        enc_.put_raw64(v.extra, v.extra_bits);
        enc_.put(ve[k][v.symbol]);
      }
    }
    enc_.finish();
    val.append(enc_.bytes());
  }

  std::size_t scratch_bytes() const noexcept {
    return order_.capacity_bytes() + enc_.capacity_bytes() + (gap_hist_.capacity() + val_hist_.capacity()) * sizeof(std::uint64_t);
  }

 private:
  static rans::table make_table(std::span<const std::uint64_t> hist, std::uint64_t count) {
    std::size_t used = 0, last = 0;
    for (std::size_t i = 0; i < hist.size(); ++i)
      if (hist[i]) ++used, last = i + 1;
    return rans::table::normalise(hist.first(last), conditioned_detail::scale_bits_for(count, used));
  }

  scratch_buffer<std::uint32_t> order_;
  std::vector<std::uint64_t> gap_hist_, val_hist_;
  rans::encoder enc_;
};

/// Decoder of base-conditioned items; holds reusable scratch (O(changed) of the largest item).
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
    std::array<std::uint64_t, max_base_classes + 1> start{};
    std::array<unsigned, max_base_classes> shift{};
    std::array<rans::table, max_base_classes> gt, vt;
    for (unsigned k = 0; k < K; ++k) {
      const std::uint64_t ck = lr.varint(changed - start[k], "class change count");
      start[k + 1] = start[k] + ck;
      if (!ck) continue;
      shift[k] = lr.u8();
      if (shift[k] > 31) lr.fail("gap shift " + std::to_string(shift[k]) + " above 31");
      gt[k] = rans::read_table(lr, gap_alphabet, "gap table");
    }
    if (start[K] != changed) lr.fail("class change counts sum to " + std::to_string(start[K]) + ", item declares " + std::to_string(changed));
    rans::reader vr(val_section, where);
    const unsigned VA = value_alphabet(f);
    for (unsigned k = 0; k < K; ++k)
      if (start[k + 1] > start[k]) vt[k] = rans::read_table(vr, VA, "value table");
    // ranks, class-major
    ranks_.resize_uninit(changed);
    {
      rans::decoder d(lr.rest(), where);
      for (unsigned k = 0; k < K; ++k) {
        if (start[k + 1] == start[k]) continue;
        const rans::dec_table t(gt[k]);
        std::uint64_t next = 0;  // previous rank + 1
        for (std::uint64_t i = start[k]; i < start[k + 1]; ++i) {
          const std::uint32_t sym = d.get(t);
          const unsigned eb = extra_bits_of(sym);
          const std::uint64_t q = unbucket(sym, d.get_raw64(eb));  // < 2^32: the table has <= 72 symbols
          const std::uint64_t low = d.get_raw64(shift[k]);
          const std::uint64_t g = (q << shift[k]) | low;
          const std::uint64_t r = next + g;
          if (g >= m || r >= m) d.fail("class rank " + std::to_string(r) + " outside the item's " + std::to_string(m) + " elements");
          ranks_[i] = static_cast<std::uint32_t>(r);
          next = r + 1;
        }
      }
      d.finish();
    }
    // values, class-major: distance, or 0 and the escaped pattern
    dist_.resize_uninit(changed);
    raw_.resize_uninit(changed);
    {
      rans::decoder d(vr.rest(), where);
      const std::uint32_t esc = VA - 1;
      const std::uint64_t vmax = f.magnitude_mask;  // |d| <= magnitude range
      for (unsigned k = 0; k < K; ++k) {
        if (start[k + 1] == start[k]) continue;
        const rans::dec_table t(vt[k]);
        for (std::uint64_t i = start[k]; i < start[k + 1]; ++i) {
          const std::uint32_t sym = d.get(t);
          if (sym == esc) {
            dist_[i] = 0;
            raw_[i] = d.get_raw64(8 * E);
            continue;
          }
          const std::uint64_t u = unbucket(sym >> 1, d.get_raw64(extra_bits_of(sym >> 1)));
          if (u >= vmax) d.fail("ULP distance beyond the format's range");
          dist_[i] = (sym & 1) ? -static_cast<std::int64_t>(u + 1) : static_cast<std::int64_t>(u + 1);
        }
      }
      d.finish();
    }
    // ranks -> positions: one pass over the base in 64-element blocks, classes in order
    std::array<std::uint64_t, max_base_classes> next_idx{}, count{};
    for (unsigned k = 0; k < K; ++k) next_idx[k] = start[k];
    const unsigned T = spec.boundaries();
    std::size_t out = 0;
    std::array<std::uint32_t, 64> lane_src;
    for_each_class_block(base, f, spec, [&](std::size_t b, const std::uint64_t* ge, std::uint64_t valid) {
      std::uint64_t hits = 0;
      for (unsigned k = 0; k < K; ++k) {
        const std::uint64_t cm = (k == 0 ? valid : ge[k - 1]) & (k < T ? ~ge[k] : ~0ull);
        const unsigned pc = static_cast<unsigned>(std::popcount(cm));
        while (next_idx[k] < start[k + 1] && ranks_[next_idx[k]] < count[k] + pc) {
          const unsigned lane = select_bit(cm, static_cast<unsigned>(ranks_[next_idx[k]] - count[k]));
          hits |= std::uint64_t{1} << lane;
          lane_src[lane] = static_cast<std::uint32_t>(next_idx[k]++);
        }
        count[k] += pc;
      }
      while (hits) {
        const unsigned lane = static_cast<unsigned>(std::countr_zero(hits));
        hits &= hits - 1;
        const std::uint64_t p = std::uint64_t{b} * 64 + lane;
        const std::uint32_t i = lane_src[lane];
        const std::uint64_t o = load_bits(base.data() + p * E, E);
        std::uint64_t n;
        if (dist_[i] == 0) {
          n = raw_[i];
          if (n == o) throw error(errc::format, "escaped value equals its base value", where);
        } else {
          const auto s = ulp_step(f, o, dist_[i]);
          if (!s || !f.finite(o)) throw error(errc::format, "ULP distance leaves the base value's sign or finite range (wrong base?)", where);
          n = *s;
        }
        positions_out[out] = static_cast<std::uint32_t>(p);
        store_bits(values_out.data() + out * E, n, E);
        ++out;
      }
    });
    for (unsigned k = 0; k < K; ++k)
      if (next_idx[k] != start[k + 1])
        throw error(errc::format, "class " + std::to_string(k) + " rank past the class's element count in this base", where);
  }

  std::size_t scratch_bytes() const noexcept { return ranks_.capacity_bytes() + dist_.capacity_bytes() + raw_.capacity_bytes(); }

 private:
  scratch_buffer<std::uint32_t> ranks_;
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
    const auto v = code_value(f, load_bits(old_vals.data() + i * E, E), load_bits(new_vals.data() + i * E, E), VA - 1);
    ++vh[classes[i] * VA + v.symbol];
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
