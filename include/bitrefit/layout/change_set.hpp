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

#include "bitrefit/core/bit_diff.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/layout/apply.hpp"

namespace bitrefit::layout {

struct change_item {
  std::string tensor;  // canonical tensor name
  value_mode mode = value_mode::overwrite;
  std::vector<std::uint64_t> positions;  // strictly ascending canonical flat indices
  std::vector<std::byte> values;         // one element per position: new bits (overwrite) or old^new (xor)
  friend bool operator==(const change_item&, const change_item&) = default;
};

namespace detail {
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

/// Compares `len` elements of `es` bytes at `old_bytes` and `new_bytes` by stored bits (-0.0 vs
/// +0.0 and NaN payloads differ; the one diff kernel, core/bit_diff.hpp) and records each changed
/// element in `it` through cursor `c`: its canonical index (canonical_begin + offset) and its value
/// (new bits, or old ^ new when `xor_values`). Call c.finish(it) after the last run of the item.
/// @pre es is 1, 2, 4 or 8; `c` is it's cursor (change_cursor::at_end(it) for a fresh one).
inline void collect_changed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::size_t es,
                            std::uint64_t canonical_begin, bool xor_values, change_item& it, change_cursor& c) {
  std::size_t n = c.n, nv = c.nv;
  for_each_changed(old_bytes, new_bytes, len, es, [&](std::size_t e) {
    std::uint64_t* pos = detail::room(it.positions, n + 1);
    pos[n++] = canonical_begin + e;
    std::byte* val = detail::room(it.values, nv + es) + nv;
    const std::byte* o = old_bytes + e * es;
    const std::byte* nw = new_bytes + e * es;
    for (std::size_t b = 0; b < es; ++b) val[b] = xor_values ? (o[b] ^ nw[b]) : nw[b];
    nv += es;
  });
  c.n = n, c.nv = nv;
}

/// One-shot form: appends the changes of one run to `it` and trims it.
inline void collect_changed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::size_t es,
                            std::uint64_t canonical_begin, bool xor_values, change_item& it) {
  change_cursor c = change_cursor::at_end(it);
  collect_changed(old_bytes, new_bytes, len, es, canonical_begin, xor_values, it, c);
  c.finish(it);
}

}  // namespace bitrefit::layout
