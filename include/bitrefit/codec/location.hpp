// bitrefit/codec/location.hpp — location coding: changed positions <-> bytes.
//
// Positions are relative to an item's range begin, strictly ascending, each < m (the range's
// element count, < 2^32). Four codings, chosen per item by density and clustering:
//  - gaps in the smallest integer width that fits, with escapes: gap = pos - prev - 1 (prev = -1
//    at start); a gap >= E (E = the width's all-ones value) is written as floor(gap/E) escapes E
//    followed by gap mod E. For geometric gaps (uniform random changes) the u8 form is memoryless:
//    the remainder after an escape has the same distribution, so zstd's order-0 coder gets close
//    to the entropy n·H(p).
//  - bitmaps for dense changes, runs for clustered ones, `all` for fully dense ranges.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit::codec {

namespace detail {

inline std::size_t varint_size(std::uint64_t v) noexcept {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
inline void put_varint(byte_buffer& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::byte>(v));
}

/// Order-0 entropy in bytes of a byte histogram (the estimate of what zstd's entropy stage reaches).
inline double entropy_bytes(const std::array<std::uint64_t, 256>& h) noexcept {
  std::uint64_t total = 0;
  for (auto v : h) total += v;
  if (total == 0) return 0.0;
  double bits = 0.0;
  const double t = static_cast<double>(total);
  for (auto v : h)
    if (v) bits -= static_cast<double>(v) * std::log2(static_cast<double>(v) / t);
  return bits / 8.0;
}

template <class W>
void put_gaps(std::span<const std::uint32_t> pos, byte_buffer& out) {
  constexpr std::uint64_t E = static_cast<W>(~W{0});
  // worst case size is computed by the caller; here we append with a growing buffer
  std::int64_t prev = -1;
  for (std::uint32_t p : pos) {
    std::uint64_t gap = static_cast<std::uint64_t>(static_cast<std::int64_t>(p) - prev - 1);
    prev = p;
    std::size_t need = (gap / E + 1) * sizeof(W);
    std::size_t old = out.size();
    out.resize_uninit(old + need);
    std::byte* o = out.data() + old;
    while (gap >= E) {
      const W e = static_cast<W>(E);
      std::memcpy(o, &e, sizeof(W));
      o += sizeof(W);
      gap -= E;
    }
    const W g = static_cast<W>(gap);
    std::memcpy(o, &g, sizeof(W));
  }
}

// Specialised u8 gap writer: the hot case (1–10% change rates), one byte per position.
inline void put_gaps8(std::span<const std::uint32_t> pos, byte_buffer& out) {
  const std::size_t old = out.size();
  out.resize_uninit(old + pos.size());  // optimistic: one byte per position
  std::size_t n = old;
  std::int64_t prev = -1;
  for (std::size_t k = 0; k < pos.size(); ++k) {
    std::uint64_t gap = static_cast<std::uint64_t>(static_cast<std::int64_t>(pos[k]) - prev - 1);
    prev = pos[k];
    if (gap >= 255) [[unlikely]] {
      const std::size_t extra = gap / 255;
      out.resize_uninit(out.size() + extra);
      std::memset(out.data() + n, 0xFF, extra);
      n += extra;
      gap -= 255 * extra;
    }
    out.data()[n++] = static_cast<std::byte>(gap);
  }
  out.resize_uninit(n);
}

template <class W>
void get_gaps(std::span<const std::byte> raw, std::uint64_t m, std::span<std::uint32_t> out,
              const error_context& where) {
  constexpr std::uint64_t E = static_cast<W>(~W{0});
  if (raw.size() % sizeof(W) != 0) throw error(errc::format, "gap section is not a whole number of words", where);
  const std::size_t words = raw.size() / sizeof(W);
  std::uint64_t next = 0;  // prev + 1
  std::size_t k = 0;
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < words; ++i) {
    W w;
    std::memcpy(&w, raw.data() + i * sizeof(W), sizeof(W));
    acc += w;
    if (w == E) {
      if (acc > m) throw error(errc::format, "gap escapes run past the end of the item's range", where);
      continue;
    }
    const std::uint64_t p = next + acc;
    if (k >= out.size()) throw error(errc::format, "gap section holds more positions than the item declares", where);
    if (p >= m) throw error(errc::format, "position " + std::to_string(p) + " outside the item's range of " + std::to_string(m) + " elements", where);
    out[k++] = static_cast<std::uint32_t>(p);
    next = p + 1;
    acc = 0;
  }
  if (acc != 0) throw error(errc::format, "gap section ends inside an escape", where);
  if (k != out.size()) throw error(errc::format, "gap section holds " + std::to_string(k) + " positions, item declares " + std::to_string(out.size()), where);
}

}  // namespace detail

/// Appends the location section for `pos` under `coding` to `out`.
/// @pre pos strictly ascending, every p < m; `all` requires pos.size() == m.
inline void encode_locations(location_coding coding, std::span<const std::uint32_t> pos, std::uint64_t m,
                             byte_buffer& out) {
  switch (coding) {
    case location_coding::all: return;
    case location_coding::gaps8: return detail::put_gaps8(pos, out);
    case location_coding::gaps16: return detail::put_gaps<std::uint16_t>(pos, out);
    case location_coding::gaps32: return detail::put_gaps<std::uint32_t>(pos, out);
    case location_coding::runs: {
      std::uint64_t end_prev = 0;
      std::size_t k = 0;
      while (k < pos.size()) {
        std::size_t j = k + 1;
        while (j < pos.size() && pos[j] == pos[j - 1] + 1) ++j;
        detail::put_varint(out, pos[k] - end_prev);
        detail::put_varint(out, j - k - 1);
        end_prev = std::uint64_t{pos[j - 1]} + 1;
        k = j;
      }
      return;
    }
    case location_coding::bitmap: {
      const std::size_t nb = static_cast<std::size_t>((m + 7) / 8);
      const std::size_t old = out.size();
      out.resize_uninit(old + nb);
      std::byte* b = out.data() + old;
      std::memset(b, 0, nb);
      for (std::uint32_t p : pos) b[p >> 3] |= static_cast<std::byte>(1u << (p & 7));
      return;
    }
    case location_coding::class_gaps: throw error(errc::invalid_argument, "class_gaps locations are written by the conditioned encoder");
  }
}

/// Upper bound of a location section's raw size (rejects absurd declared sizes before allocating).
/// Runs: at most `changed` runs of two LEB128 numbers; a number v takes at most 1 + v/128 bytes and
/// the gaps and lengths of one item sum to at most m, so 2 * changed + m/128 bytes (+2 of slack).
inline std::uint64_t max_location_raw_size(location_coding coding, std::uint64_t m, std::uint64_t changed) {
  switch (coding) {
    case location_coding::all: return 0;
    case location_coding::gaps8: return changed + m / 255 + 1;
    case location_coding::gaps16: return 2 * (changed + m / 65535 + 1);
    case location_coding::gaps32: return 4 * (changed + 2);
    case location_coding::runs: return 2 * changed + m / 128 + 2;
    case location_coding::bitmap: return (m + 7) / 8;
    case location_coding::class_gaps: return 0;  // never decoded here (conditioned.hpp)
  }
  return 0;
}

/// Decodes a location section into exactly `out.size()` (= declared changed count) positions,
/// validating everything: strictly ascending, inside [0, m), counts and sizes consistent.
/// Throws errc::format naming `where` on any violation.
inline void decode_locations(location_coding coding, std::span<const std::byte> raw, std::uint64_t m,
                             std::span<std::uint32_t> out, const error_context& where) {
  switch (coding) {
    case location_coding::all: {
      if (!raw.empty()) throw error(errc::format, "location coding 'all' carries a non-empty section", where);
      if (out.size() != m) throw error(errc::format, "location coding 'all' but changed count differs from the range size", where);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint32_t>(i);
      return;
    }
    case location_coding::gaps8: return detail::get_gaps<std::uint8_t>(raw, m, out, where);
    case location_coding::gaps16: return detail::get_gaps<std::uint16_t>(raw, m, out, where);
    case location_coding::gaps32: return detail::get_gaps<std::uint32_t>(raw, m, out, where);
    case location_coding::runs: {
      std::size_t i = 0, k = 0;
      std::uint64_t end_prev = 0;
      auto get = [&](std::uint64_t& v) {
        v = 0;
        for (int shift = 0;; shift += 7) {
          if (i >= raw.size()) throw error(errc::format, "run section ends inside a number", where);
          if (shift > 63) throw error(errc::format, "run section number longer than 64 bits", where);
          const auto b = static_cast<std::uint8_t>(raw[i++]);
          v |= std::uint64_t{b & 0x7Fu} << shift;
          if (!(b & 0x80)) break;
        }
      };
      while (i < raw.size()) {
        std::uint64_t gap, len1;
        get(gap);
        get(len1);
        if (gap > m || len1 >= m) throw error(errc::format, "run outside the item's range", where);
        const std::uint64_t start = end_prev + gap;
        if (k > 0 && gap == 0) throw error(errc::format, "runs touch (not canonical)", where);
        if (start + len1 + 1 > m) throw error(errc::format, "run outside the item's range", where);
        if (k + len1 + 1 > out.size()) throw error(errc::format, "run section holds more positions than the item declares", where);
        for (std::uint64_t j = 0; j <= len1; ++j) out[k++] = static_cast<std::uint32_t>(start + j);
        end_prev = start + len1 + 1;
      }
      if (k != out.size()) throw error(errc::format, "run section holds " + std::to_string(k) + " positions, item declares " + std::to_string(out.size()), where);
      return;
    }
    case location_coding::bitmap: {
      if (raw.size() != (m + 7) / 8) throw error(errc::format, "bitmap size does not match the item's range", where);
      if (m % 8 && (static_cast<std::uint8_t>(raw.back()) >> (m % 8)))
        throw error(errc::format, "bitmap has bits set past the item's range", where);
      std::size_t k = 0;
      for (std::size_t i = 0; i < raw.size(); i += 8) {
        std::uint64_t w = 0;
        std::memcpy(&w, raw.data() + i, std::min<std::size_t>(8, raw.size() - i));
        if (k + static_cast<std::size_t>(std::popcount(w)) > out.size())
          throw error(errc::format, "bitmap holds more positions than the item declares", where);
        while (w) {
          out[k++] = static_cast<std::uint32_t>(i * 8 + static_cast<std::size_t>(std::countr_zero(w)));
          w &= w - 1;
        }
      }
      if (k != out.size()) throw error(errc::format, "bitmap holds " + std::to_string(k) + " positions, item declares " + std::to_string(out.size()), where);
      return;
    }
    case location_coding::class_gaps: throw error(errc::format, "class_gaps locations need the base (conditioned decoder)", where);
  }
  throw error(errc::format, "unknown location coding", where);
}

/// Raw (pre-zstd) byte size of each location coding for one item, and its number of runs: what
/// the location coding is chosen by. A backend that keeps positions where its tensors live
/// computes the same sizes there (thrust/locations.hpp), so the choice, and the bytes, are equal.
struct location_sizes {
  std::uint64_t gaps8 = 0, gaps16 = 0, gaps32 = 0, runs = 0, bitmap = 0, run_count = 0;
  friend bool operator==(const location_sizes&, const location_sizes&) = default;
};

/// location_sizes of `pos` (strictly ascending, < m).
inline location_sizes location_sizes_of(std::span<const std::uint32_t> pos, std::uint64_t m) {
  location_sizes s;
  s.bitmap = (m + 7) / 8;
  std::uint64_t next = 0;  // previous position + 1
  for (std::uint32_t p : pos) {
    const std::uint64_t gap = p - next;
    s.gaps8 += gap / 0xFF + 1;
    s.gaps16 += 2 * (gap / 0xFFFF + 1);
    s.gaps32 += 4 * (gap / 0xFFFFFFFFull + 1);
    next = std::uint64_t{p} + 1;
  }
  // runs: LEB128(gap from the previous run's end) + LEB128(length - 1) each
  std::uint64_t end_prev = 0;
  for (std::size_t k = 0; k < pos.size();) {
    std::size_t j = k + 1;
    while (j < pos.size() && pos[j] == pos[j - 1] + 1) ++j;
    s.runs += detail::varint_size(pos[k] - end_prev) + detail::varint_size(j - k - 1);
    ++s.run_count;
    end_prev = std::uint64_t{pos[j - 1]} + 1;
    k = j;
  }
  return s;
}

/// Picks the location coding of an item of c changes in m elements from its sizes. Deterministic:
///  - every element changed -> all;
///  - clustered changes (runs coded in less than half the raw size of the alternative) -> runs;
///  - density > 1/4 -> bitmap (gap symbols then have a mode > 1/2 that zstd's Huffman codes at
///    >= 1 bit, while bitmap bytes stay near 8·H(p) bits);
///  - else gaps in u8 unless escapes make it > 2x the raw size of a wider width.
inline location_coding choose_location_coding(const location_sizes& s, std::uint64_t c, std::uint64_t m) {
  if (m > 0 && c == m) return location_coding::all;
  if (c * 4 > m) return 4 * s.run_count < s.bitmap && s.runs * 2 < s.bitmap ? location_coding::runs : location_coding::bitmap;
  const std::uint64_t best_gaps = std::min({s.gaps8, s.gaps16, s.gaps32});
  if (c > 0 && 4 * s.run_count < best_gaps && s.runs * 2 < best_gaps) return location_coding::runs;
  const std::uint64_t wide = std::min(s.gaps16, s.gaps32);
  if (s.gaps8 > 2 * wide) return s.gaps16 <= s.gaps32 ? location_coding::gaps16 : location_coding::gaps32;
  return location_coding::gaps8;
}

/// Picks the location coding for `pos` in a range of m elements (see above).
inline location_coding choose_location_coding(std::span<const std::uint32_t> pos, std::uint64_t m) {
  return choose_location_coding(location_sizes_of(pos, m), pos.size(), m);
}

}  // namespace bitrefit::codec
