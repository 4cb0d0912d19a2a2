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

/// Calls f(local_begin, canonical_begin, length) for every run of the block, in local order.
template <class F>
constexpr void for_each_run(const run_block& b, F&& f) {
  for (std::uint64_t k = 0; k < b.count; ++k) f(b.local_begin(k), b.canonical_begin(k), b.length);
}

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
