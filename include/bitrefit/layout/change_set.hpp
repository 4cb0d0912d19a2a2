// bitrefit/layout/change_set.hpp — the canonical change set a layout produces: items of
// (canonical tensor, mode, ascending positions, values), and the bitwise diff that finds them.
//
// This is the neutral hand-off to the codec: an item's positions and values are what a codec
// frame item encodes (positions relative to a range begin there; absolute here).
#pragma once

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
template <std::size_t ES>
void collect_changed_fixed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::uint64_t canonical_begin,
                           bool xor_values, std::vector<std::uint64_t>& positions, std::vector<std::byte>& values) {
  const std::uint64_t bytes = len * ES;
  auto emit = [&](std::uint64_t elem) {
    positions.push_back(canonical_begin + elem);
    const std::byte* o = old_bytes + elem * ES;
    const std::byte* n = new_bytes + elem * ES;
    for (std::size_t b = 0; b < ES; ++b) values.push_back(xor_values ? (o[b] ^ n[b]) : n[b]);
  };
  std::uint64_t off = 0;
  for (; off + 64 <= bytes; off += 64) {
    if (std::memcmp(old_bytes + off, new_bytes + off, 64) == 0) continue;  // the common case at 1-5% changes
    for (std::uint64_t w = off; w < off + 64; w += 8) {
      std::uint64_t a, b;
      std::memcpy(&a, old_bytes + w, 8);
      std::memcpy(&b, new_bytes + w, 8);
      if (a == b) continue;
      for (std::uint64_t e = w / ES; e < (w + 8) / ES; ++e)
        if (std::memcmp(old_bytes + e * ES, new_bytes + e * ES, ES) != 0) emit(e);
    }
  }
  for (std::uint64_t e = off / ES; e < len; ++e)
    if (std::memcmp(old_bytes + e * ES, new_bytes + e * ES, ES) != 0) emit(e);
}
}  // namespace detail

/// Compares `len` elements of `es` bytes at `old_bytes` and `new_bytes` by stored bits (-0.0 vs
/// +0.0 and NaN payloads differ) and appends each changed element's canonical index
/// (canonical_begin + offset) and its value (new bits, or old ^ new when `xor_values`).
/// 64 bytes are compared at a time; only differing 8-byte words are split into elements.
/// @pre es is 1, 2, 4 or 8.
inline void collect_changed(const std::byte* old_bytes, const std::byte* new_bytes, std::uint64_t len, std::size_t es,
                            std::uint64_t canonical_begin, bool xor_values, std::vector<std::uint64_t>& positions,
                            std::vector<std::byte>& values) {
  switch (es) {
    case 1: return detail::collect_changed_fixed<1>(old_bytes, new_bytes, len, canonical_begin, xor_values, positions, values);
    case 2: return detail::collect_changed_fixed<2>(old_bytes, new_bytes, len, canonical_begin, xor_values, positions, values);
    case 4: return detail::collect_changed_fixed<4>(old_bytes, new_bytes, len, canonical_begin, xor_values, positions, values);
    case 8: return detail::collect_changed_fixed<8>(old_bytes, new_bytes, len, canonical_begin, xor_values, positions, values);
    default: throw error(errc::invalid_argument, "element size " + std::to_string(es) + " is not 1, 2, 4 or 8", {.file = {}, .tensor = {}, .field = "dtype"});
  }
}

}  // namespace bitrefit::layout
