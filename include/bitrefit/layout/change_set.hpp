// bitrefit/layout/change_set.hpp — the canonical change set a layout produces: items of
// (canonical tensor, mode, ascending positions, values), and the bitwise diff that finds them.
//
// This is the neutral hand-off to the codec: an item's positions and values are what a codec
// frame item encodes (positions relative to a range begin there; absolute here).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/layout/apply.hpp"

namespace bitrefit::layout {

struct change_item {
  std::string tensor;  // canonical tensor name
  write_mode mode = write_mode::overwrite;
  std::vector<std::uint64_t> positions;  // strictly ascending canonical flat indices
  std::vector<std::byte> values;         // one element per position: new bits (overwrite) or old^new (xor)
  friend bool operator==(const change_item&, const change_item&) = default;
};

namespace detail {

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

/// Grows `v` geometrically so that `need` elements fit, and returns its data pointer.
template <class T>
[[gnu::noinline]] void grow(std::vector<T>& v, std::size_t need) {
  v.resize(std::max(need, v.size() * 2));
}
template <class T>
inline T* room(std::vector<T>& v, std::size_t need) {
  if (v.size() < need) [[unlikely]] grow(v, need);
  return v.data();
}
}  // namespace detail

/// Where the next change of an item goes while it is being collected: the item's vectors are
/// grown ahead (their size is capacity) and trimmed once by finish(), so the hot loop writes
/// through raw pointers with no per-element capacity check.
struct change_cursor {
  std::size_t n = 0;   // positions written
  std::size_t nv = 0;  // value bytes written
  static change_cursor at_end(const change_item& it) noexcept { return {it.positions.size(), it.values.size()}; }
  void finish(change_item& it) const {
    it.positions.resize(n);
    it.values.resize(nv);
  }
};

namespace detail {
template <std::size_t ES>
void collect_changed_fixed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::uint64_t canonical_begin,
                           bool xor_values, change_item& it, change_cursor& c) {
  std::size_t n = c.n, nv = c.nv;
  const std::uint64_t bytes = len * ES;
  auto emit = [&](std::uint64_t elem, std::uint64_t* pos, std::byte* val) {
    pos[n++] = canonical_begin + elem;
    const std::byte* o = old_bytes + elem * ES;
    const std::byte* nw = new_bytes + elem * ES;
    for (std::size_t b = 0; b < ES; ++b) val[nv++] = xor_values ? (o[b] ^ nw[b]) : nw[b];
  };
  std::uint64_t off = 0;
  for (; off + 64 <= bytes; off += 64) {
    if (std::memcmp(old_bytes + off, new_bytes + off, 64) == 0) continue;  // the common case at 1-5% changes
    std::uint64_t* pos = room(it.positions, n + 64 / ES);
    std::byte* val = room(it.values, nv + 64);
    for (std::uint64_t w = off; w < off + 64; w += 8) {
      std::uint64_t a, b;
      std::memcpy(&a, old_bytes + w, 8);
      std::memcpy(&b, new_bytes + w, 8);
      for (std::uint64_t m = nonzero_lanes<ES>(a ^ b); m; m &= m - 1)  // lanes in ascending order (little-endian)
        emit(w / ES + static_cast<std::uint64_t>(std::countr_zero(m)) / (8 * ES), pos, val);
    }
  }
  if (off < bytes) {
    const std::uint64_t tail = len - off / ES;
    std::uint64_t* pos = room(it.positions, n + tail);
    std::byte* val = room(it.values, nv + tail * ES);
    for (std::uint64_t e = off / ES; e < len; ++e)
      if (std::memcmp(old_bytes + e * ES, new_bytes + e * ES, ES) != 0) emit(e, pos, val);
  }
  c.n = n, c.nv = nv;
}
}  // namespace detail

/// Compares `len` elements of `es` bytes at `old_bytes` and `new_bytes` by stored bits (-0.0 vs
/// +0.0 and NaN payloads differ) and records each changed element in `it` through cursor `c`:
/// its canonical index (canonical_begin + offset) and its value (new bits, or old ^ new when
/// `xor_values`). 64 bytes are compared at a time; differing ones are split into elements with
/// per-lane word arithmetic. Call c.finish(it) after the last run of the item.
/// @pre es is 1, 2, 4 or 8; `c` is it's cursor (change_cursor::at_end(it) for a fresh one).
inline void collect_changed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::size_t es,
                            std::uint64_t canonical_begin, bool xor_values, change_item& it, change_cursor& c) {
  switch (es) {
    case 1: return detail::collect_changed_fixed<1>(old_bytes, new_bytes, len, canonical_begin, xor_values, it, c);
    case 2: return detail::collect_changed_fixed<2>(old_bytes, new_bytes, len, canonical_begin, xor_values, it, c);
    case 4: return detail::collect_changed_fixed<4>(old_bytes, new_bytes, len, canonical_begin, xor_values, it, c);
    case 8: return detail::collect_changed_fixed<8>(old_bytes, new_bytes, len, canonical_begin, xor_values, it, c);
    default: throw error(errc::invalid_argument, "element size " + std::to_string(es) + " is not 1, 2, 4 or 8", {.file = {}, .tensor = it.tensor, .field = "dtype"});
  }
}

/// One-shot form: appends the changes of one run to `it` and trims it.
inline void collect_changed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::size_t es,
                            std::uint64_t canonical_begin, bool xor_values, change_item& it) {
  change_cursor c = change_cursor::at_end(it);
  collect_changed(old_bytes, new_bytes, len, es, canonical_begin, xor_values, it, c);
  c.finish(it);
}

}  // namespace bitrefit::layout
