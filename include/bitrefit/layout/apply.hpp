// bitrefit/layout/apply.hpp — a receiver's operations on any Loader: apply a decoded item in
// place, read back held canonical bytes (attestation, dense restore), declare held ranges.
//
// A decoded item is (canonical tensor, mode, ascending positions or runs, values): the neutral
// form every location coding decodes to. Each function verifies everything before it writes, so a
// rejected item leaves the engine's tensors bit-identical to before.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/canonical.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/value_mode.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

// How an item's values combine with what the receiver holds: bitrefit::value_mode
// (core/value_mode.hpp; XOR only on bit-preserving placements, only on the item's own base).

/// What an apply did. Positions outside the loader's held ranges are skipped, not errors: a
/// tensor-parallel rank takes its part of an item that was sent to the whole engine.
struct apply_stats {
  std::uint64_t applied = 0;   // elements written
  std::uint64_t not_held = 0;  // elements skipped because this loader does not hold them
  friend bool operator==(const apply_stats&, const apply_stats&) = default;
};

namespace detail {

inline const tensor_info& item_tensor(const model_manifest& m, std::string_view tensor) {
  if (const tensor_info* t = m.find(tensor)) return *t;
  throw error(errc::mismatch, "item names a tensor this loader does not serve", {.file = {}, .tensor = std::string(tensor), .field = "tensor"});
}

inline void check_mode(bool bit_preserving, value_mode mode, std::string_view tensor) {
  if (mode == value_mode::xor_mask && !bit_preserving)
    throw error(errc::mismatch, "XOR item for a tensor whose placement is not bit-preserving (send it as overwrite)",
                {.file = {}, .tensor = std::string(tensor), .field = "mode"});
  if (mode != value_mode::xor_mask && mode != value_mode::overwrite)
    throw error(errc::invalid_argument, "unknown write mode", {.file = {}, .tensor = std::string(tensor), .field = "mode"});
}

inline void combine(std::byte* dst, const std::byte* src, std::size_t bytes, value_mode mode) noexcept {
  if (mode == value_mode::overwrite) {
    std::memcpy(dst, src, bytes);
  } else {
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t a, b;
      std::memcpy(&a, dst + i, 8);
      std::memcpy(&b, src + i, 8);
      a ^= b;
      std::memcpy(dst + i, &a, 8);
    }
    for (; i < bytes; ++i) dst[i] ^= src[i];
  }
}

/// Index of the first range in `rs` (sorted, disjoint) whose end is > i, starting at `from`.
template <class R>
std::size_t advance_to(std::span<const R> rs, std::size_t from, std::uint64_t i) noexcept {
  while (from < rs.size() && rs[from].end <= i) ++from;
  return from;
}

}  // namespace detail

/// Applies one decoded item given as strictly ascending positions and one value per position
/// (positions.size() * element_size bytes, in position order).
/// @throws errc::mismatch for an unknown tensor or XOR on a non-bit-preserving tensor;
///         errc::invalid_argument for unsorted positions, a position outside the tensor or a wrong
///         value size. Nothing is written when it throws.
///
/// Positions may be 32- or 64-bit and relative to `base` (the codec's decoded items carry u32
/// positions relative to the item's range begin): element = base + positions[k].
template <Loader L, class Pos>
  requires std::same_as<Pos, std::uint32_t> || std::same_as<Pos, std::uint64_t>
apply_stats apply_positions(L& l, std::string_view tensor, value_mode mode, std::span<const Pos> positions,
                            std::span<const std::byte> values, std::uint64_t base = 0) {
  const tensor_info& info = detail::item_tensor(l.canonical(), tensor);
  const bool bp = l.bit_preserving(tensor);
  detail::check_mode(bp, mode, tensor);
  const std::size_t es = element_size(info.type);
  const std::uint64_t n = info.elements();
  if (values.size() != positions.size() * es)
    throw error(errc::invalid_argument, "item carries " + std::to_string(values.size()) + " value bytes for " +
                    std::to_string(positions.size()) + " positions",
                {.file = {}, .tensor = info.name, .field = "values"});
  for (std::size_t k = 0; k < positions.size(); ++k) {
    if (positions[k] >= n || base > n - 1 - positions[k])
      throw error(errc::invalid_argument, "position " + std::to_string(base + positions[k]) + " outside a tensor of " + std::to_string(n) + " elements",
                  {.file = {}, .tensor = info.name, .field = "positions"});
    if (k > 0 && positions[k] <= positions[k - 1])
      throw error(errc::invalid_argument, "positions are not strictly ascending", {.file = {}, .tensor = info.name, .field = "positions"});
  }
  apply_stats st;
  if (bp) {
    const auto segs = l.segments(tensor);
    std::size_t s = 0;
    for (std::size_t k = 0; k < positions.size(); ++k) {
      const std::uint64_t p = base + positions[k];
      s = detail::advance_to(segs, s, p);
      if (s == segs.size() || p < segs[s].begin) {
        ++st.not_held;
        continue;
      }
      detail::combine(segs[s].data + (p - segs[s].begin) * es, values.data() + k * es, es, mode);
      ++st.applied;
    }
  } else {
    // Overwrite through the loader's own placement, one call per run of consecutive held positions.
    const auto held = l.held(tensor);
    std::size_t h = 0;
    std::size_t k = 0;
    while (k < positions.size()) {
      const std::uint64_t p = base + positions[k];
      h = detail::advance_to(held, h, p);
      if (h == held.size() || p < held[h].begin) {
        ++st.not_held;
        ++k;
        continue;
      }
      std::size_t e = k + 1;
      while (e < positions.size() && positions[e] == positions[e - 1] + 1 && base + positions[e] < held[h].end) ++e;
      l.write(tensor, index_range{p, p + (e - k)}, values.subspan(k * es, (e - k) * es));
      st.applied += e - k;
      k = e;
    }
  }
  return st;
}

/// Same, for positions held in a std::vector (deduces Pos).
template <Loader L, class Pos>
apply_stats apply_positions(L& l, std::string_view tensor, value_mode mode, const std::vector<Pos>& positions,
                            std::span<const std::byte> values, std::uint64_t base = 0) {
  return apply_positions(l, tensor, mode, std::span<const Pos>(positions), values, base);
}

/// Applies one decoded item given as ascending, disjoint runs of positions; `values` holds the
/// values of all runs, concatenated in run order. Same checks and guarantees as apply_positions.
template <Loader L>
apply_stats apply_runs(L& l, std::string_view tensor, value_mode mode, std::span<const index_range> runs,
                       std::span<const std::byte> values) {
  const tensor_info& info = detail::item_tensor(l.canonical(), tensor);
  const bool bp = l.bit_preserving(tensor);
  detail::check_mode(bp, mode, tensor);
  const std::size_t es = element_size(info.type);
  const std::uint64_t n = info.elements();
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    if (runs[k].begin > runs[k].end || runs[k].end > n)
      throw error(errc::invalid_argument, "run [" + std::to_string(runs[k].begin) + ", " + std::to_string(runs[k].end) +
                      ") outside a tensor of " + std::to_string(n) + " elements",
                  {.file = {}, .tensor = info.name, .field = "runs"});
    if (k > 0 && runs[k].begin < runs[k - 1].end)
      throw error(errc::invalid_argument, "runs are not ascending and disjoint", {.file = {}, .tensor = info.name, .field = "runs"});
    total += runs[k].size();
  }
  if (values.size() != total * es)
    throw error(errc::invalid_argument, "item carries " + std::to_string(values.size()) + " value bytes for " + std::to_string(total) + " positions",
                {.file = {}, .tensor = info.name, .field = "values"});
  apply_stats st;
  std::uint64_t voff = 0;  // element offset of the current run's first value
  if (bp) {
    const auto segs = l.segments(tensor);
    std::size_t s = 0;
    for (const index_range& r : runs) {
      std::uint64_t covered = 0;
      s = detail::advance_to(segs, s, r.begin);
      for (std::size_t t = s; t < segs.size() && segs[t].begin < r.end; ++t) {
        const std::uint64_t b = std::max(r.begin, segs[t].begin), e = std::min(r.end, segs[t].end);
        if (b >= e) continue;
        detail::combine(segs[t].data + (b - segs[t].begin) * es, values.data() + (voff + b - r.begin) * es, (e - b) * es, mode);
        covered += e - b;
      }
      st.applied += covered;
      st.not_held += r.size() - covered;
      voff += r.size();
    }
  } else {
    const auto held = l.held(tensor);
    std::size_t h = 0;
    for (const index_range& r : runs) {
      std::uint64_t covered = 0;
      h = detail::advance_to(held, h, r.begin);
      for (std::size_t t = h; t < held.size() && held[t].begin < r.end; ++t) {
        const std::uint64_t b = std::max(r.begin, held[t].begin), e = std::min(r.end, held[t].end);
        if (b >= e) continue;
        l.write(tensor, index_range{b, e}, values.subspan((voff + b - r.begin) * es, (e - b) * es));
        covered += e - b;
      }
      st.applied += covered;
      st.not_held += r.size() - covered;
      voff += r.size();
    }
  }
  return st;
}

namespace detail {
template <Loader L>
const tensor_info& check_held(const L& l, std::string_view tensor, index_range r, std::size_t bytes, const char* what) {
  const tensor_info& info = item_tensor(l.canonical(), tensor);
  const auto held = l.held(tensor);
  const std::size_t h = advance_to(held, 0, r.begin);
  if (r.begin > r.end || (!r.empty() && (h == held.size() || r.begin < held[h].begin || r.end > held[h].end)))
    throw error(errc::invalid_argument,
                std::string(what) + " of elements [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") that this loader does not hold",
                {.file = {}, .tensor = info.name, .field = "range"});
  if (bytes != r.size() * element_size(info.type))
    throw error(errc::invalid_argument, std::string(what) + " buffer of " + std::to_string(bytes) + " bytes for " + std::to_string(r.size()) + " elements",
                {.file = {}, .tensor = info.name, .field = "range"});
  return info;
}
}  // namespace detail

/// Reads the canonical bits of held elements r of `tensor` into `out` (attestation, dense restore
/// from a peer). @throws errc::invalid_argument when r is not inside one held range or sizes differ.
template <Loader L>
void read_canonical(const L& l, std::string_view tensor, index_range r, std::span<std::byte> out) {
  const tensor_info& info = detail::check_held(l, tensor, r, out.size(), "read");
  if (!l.bit_preserving(tensor)) {
    l.read(tensor, r, out);
    return;
  }
  const std::size_t es = element_size(info.type);
  for (const placement_segment& s : l.segments(tensor)) {
    const std::uint64_t b = std::max(r.begin, s.begin), e = std::min(r.end, s.end);
    if (b < e) std::memcpy(out.data() + (b - r.begin) * es, s.data + (b - s.begin) * es, (e - b) * es);
  }
}

/// Overwrites held elements r of `tensor` with canonical values `in` (dense restore).
template <Loader L>
void write_canonical(L& l, std::string_view tensor, index_range r, std::span<const std::byte> in) {
  (void)detail::check_held(l, tensor, r, in.size(), "write");
  const index_range one[1] = {r};
  (void)apply_runs(l, tensor, value_mode::overwrite, std::span<const index_range>(one), in);
}

/// Every canonical range the loader holds, in canonical (tensor-name, index) order: what it
/// declares at join, must receive, and attests over.
template <Loader L>
std::vector<canonical_range> held_ranges(const L& l) {
  std::vector<canonical_range> out;
  for (const tensor_info& t : l.canonical().tensors())
    for (const index_range& r : l.held(t.name)) out.push_back({t.name, r.begin, r.end});
  return out;
}

/// Bytes of canonical values the loader holds (the dense size of its share).
template <Loader L>
std::uint64_t held_bytes(const L& l) {
  std::uint64_t n = 0;
  for (const tensor_info& t : l.canonical().tensors())
    for (const index_range& r : l.held(t.name)) n += r.size() * element_size(t.type);
  return n;
}

}  // namespace bitrefit::layout
