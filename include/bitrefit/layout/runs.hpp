// bitrefit/layout/runs.hpp — the vocabulary of exact index maps: ranges, strided run blocks,
// shard tensors and placement segments.
//
// Every direct projection in bitrefit is a list of run blocks. A run block is a strided family of
// contiguous runs, so the cost of projecting a shard is per run, never per element:
//
//   for k in [0, count):  local   [local     + k*local_stride,     + length)
//                     ↔  canonical [canonical + k*canonical_stride, + length)  of canonical tensor `tensor`
//
// Column-parallel slices, vocab shards and fused-QKV groups are single runs (count == 1);
// row-parallel slices are one block of `rows` runs. All of it is constexpr-friendly value types.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit::layout {

/// Elements [begin, end) of one tensor (canonical or local, as the context says).
struct index_range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  constexpr std::uint64_t size() const noexcept { return end - begin; }
  constexpr bool empty() const noexcept { return end <= begin; }
  constexpr bool contains(std::uint64_t i) const noexcept { return begin <= i && i < end; }
  friend constexpr auto operator<=>(const index_range&, const index_range&) = default;
};

/// A strided family of runs mapping shard-local flat indices to canonical flat indices.
/// @pre length > 0, count > 0; when count > 1, local_stride >= length and canonical_stride >= length
///      (the runs of one block never overlap on either side).
struct run_block {
  std::uint32_t tensor = 0;            // canonical tensor: index into the canonical manifest (name order)
  std::uint64_t local = 0;             // first local flat index of run 0
  std::uint64_t canonical = 0;         // first canonical flat index of run 0
  std::uint64_t length = 0;            // elements per run
  std::uint64_t count = 1;             // number of runs
  std::uint64_t local_stride = 0;      // local distance between run k and k+1
  std::uint64_t canonical_stride = 0;  // canonical distance between run k and k+1
  bool owned = true;                   // this shard is the one owner of these canonical elements

  constexpr std::uint64_t elements() const noexcept { return length * count; }
  constexpr std::uint64_t local_begin(std::uint64_t k) const noexcept { return local + k * local_stride; }
  constexpr std::uint64_t canonical_begin(std::uint64_t k) const noexcept { return canonical + k * canonical_stride; }
  /// One past the last local index covered (the local extent of the block).
  constexpr std::uint64_t local_end() const noexcept { return local_begin(count - 1) + length; }

  /// Canonical index of local index `i`, or nullopt when `i` lies in no run of this block.
  constexpr std::optional<std::uint64_t> project(std::uint64_t i) const noexcept {
    if (i < local) return std::nullopt;
    const std::uint64_t d = i - local;
    const std::uint64_t k = count == 1 ? 0 : d / local_stride;
    if (k >= count) return std::nullopt;
    const std::uint64_t off = d - k * local_stride;
    if (off >= length) return std::nullopt;
    return canonical_begin(k) + off;
  }

  /// Local index of canonical index `j`, or nullopt when `j` lies in no run of this block.
  constexpr std::optional<std::uint64_t> locate(std::uint64_t j) const noexcept {
    if (j < canonical) return std::nullopt;
    const std::uint64_t d = j - canonical;
    const std::uint64_t k = count == 1 ? 0 : d / canonical_stride;
    if (k >= count) return std::nullopt;
    const std::uint64_t off = d - k * canonical_stride;
    if (off >= length) return std::nullopt;
    return local_begin(k) + off;
  }

  friend constexpr bool operator==(const run_block&, const run_block&) = default;
};

/// The same map with as few runs as possible: a block whose runs abut on both sides (a
/// row-parallel slice that spans whole rows) is one run.
constexpr run_block coalesced(run_block b) noexcept {
  if (b.count > 1 && b.local_stride == b.length && b.canonical_stride == b.length) {
    b.length *= b.count;
    b.count = 1;
    b.local_stride = b.canonical_stride = 0;
  }
  return b;
}

/// Calls f(local_begin, canonical_begin, length) for every run of the block, in local order.
template <class F>
constexpr void for_each_run(const run_block& b, F&& f) {
  for (std::uint64_t k = 0; k < b.count; ++k) f(b.local_begin(k), b.canonical_begin(k), b.length);
}

/// A piece of a projected local range: local [local, local + length) ↔ canonical
/// [canonical, canonical + length) of canonical tensor `tensor`.
struct projected_run {
  std::uint32_t tensor = 0;
  std::uint64_t local = 0;
  std::uint64_t canonical = 0;
  std::uint64_t length = 0;
  bool owned = true;
  friend constexpr bool operator==(const projected_run&, const projected_run&) = default;
};

/// Calls f(projected_run) for every run of `b` intersected with local range `r`, in local order.
/// Cost is per run touched (found by division), not per element.
template <class F>
constexpr void for_each_projected(const run_block& b, index_range r, F&& f) {
  if (r.empty() || b.count == 0 || b.length == 0 || r.end <= b.local || r.begin >= b.local_end()) return;
  const std::uint64_t first = b.count == 1 || r.begin <= b.local ? 0 : (r.begin - b.local) / b.local_stride;
  const std::uint64_t last = b.count == 1 ? 0 : std::min(b.count - 1, (r.end - 1 - b.local) / b.local_stride);
  for (std::uint64_t k = first; k <= last; ++k) {
    const std::uint64_t lb = b.local_begin(k), le = lb + b.length;
    const std::uint64_t x = std::max(lb, r.begin), y = std::min(le, r.end);
    if (x < y) f(projected_run{b.tensor, x, b.canonical_begin(k) + (x - lb), y - x, b.owned});
  }
}

namespace detail {
// A row-parallel slice of a [4, 10] tensor, columns [6, 10): the maps are constant expressions.
inline constexpr run_block example_row_parallel{.tensor = 0, .local = 0, .canonical = 6, .length = 4, .count = 4, .local_stride = 4, .canonical_stride = 10};
static_assert(example_row_parallel.project(5) == 17 && example_row_parallel.locate(17) == 5);
static_assert(!example_row_parallel.locate(12).has_value() && !example_row_parallel.project(16).has_value());
constexpr std::uint64_t projected_elements(index_range r) {
  std::uint64_t n = 0;
  for_each_projected(example_row_parallel, r, [&](projected_run p) { n += p.length; });
  return n;
}
static_assert(projected_elements({3, 9}) == 6 && projected_elements({0, 16}) == 16 && projected_elements({16, 20}) == 0);
}  // namespace detail

/// One tensor as a trainer shard stores it, with the run blocks that map it to canonical tensors.
/// Local elements covered by no run are padding (e.g. vocab padding rows) and map nowhere.
struct shard_tensor {
  std::string name;  // the trainer's own name, e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  dtype type = dtype::BF16;
  shape_t shape;
  std::vector<run_block> runs;  // sorted by `local`, pairwise disjoint in local space

  std::uint64_t elements() const { return element_count(shape, name); }

  /// (canonical tensor, canonical index) of local index `i`, or nullopt for padding.
  std::optional<std::pair<std::uint32_t, std::uint64_t>> project(std::uint64_t i) const {
    for (const run_block& b : runs)
      if (auto j = b.project(i)) return std::pair{b.tensor, *j};
    return std::nullopt;
  }

  /// The canonical runs of local elements [r.begin, r.end), in local order; padding is skipped.
  std::vector<projected_run> project_range(index_range r) const {
    std::vector<projected_run> out;
    for (const run_block& b : runs) for_each_projected(b, r, [&](const projected_run& p) { out.push_back(p); });
    std::sort(out.begin(), out.end(), [](const projected_run& a, const projected_run& b) { return a.local < b.local; });
    return out;
  }

  /// Local index holding canonical (tensor, j) in this shard tensor, or nullopt.
  std::optional<std::uint64_t> locate(std::uint32_t tensor, std::uint64_t j) const {
    for (const run_block& b : runs)
      if (b.tensor == tensor)
        if (auto i = b.locate(j)) return i;
    return std::nullopt;
  }
};

/// Where a loader keeps canonical elements [begin, end) of one tensor: contiguously at `data`,
/// in the canonical dtype's bits (so only bit-preserving placements have segments).
struct placement_segment {
  std::uint64_t begin = 0;  // canonical flat index of the first element
  std::uint64_t end = 0;    // one past the last
  std::byte* data = nullptr;

  constexpr std::uint64_t size() const noexcept { return end - begin; }
};

}  // namespace bitrefit::layout
