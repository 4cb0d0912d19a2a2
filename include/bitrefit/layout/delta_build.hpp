// bitrefit/layout/delta_build.hpp — building a refit's change set straight from trainer shards.
//
// Direct projection (what the sender's owners run, through refit::sharded_projection::changes):
// for every owned run of every shard tensor that reaches a canonical tensor, compare the shard's
// local bytes with the canonical baseline's bytes at the run's canonical position and emit the
// changed canonical indices with their new bits (or XOR masks). The canonical tensor is never
// materialised: each byte of the shard and of the baseline is read once, and the only memory
// written is the change set itself, O(changes).
//
// direct_delta indexes, once per parallel configuration, which owned run blocks of which shard
// reach each canonical tensor (checking exactly-once ownership: Projection law 3), so an owner
// builds the changes of just the tensors it owns. gather() is the same index used the other way
// (materialising one canonical tensor), kept for what genuinely needs dense canonical bits: an
// owner's baseline B^v when it boots from the trainer's copy.
// (The materialise-then-diff path is no longer in the library: bench/layout keeps it, labelled as
// the reference it is measured against.)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/layout/change_set.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

namespace detail {
/// Sorts an item's positions (and values with them) when runs were not emitted in canonical order
/// (e.g. a column-parallel split: the runs of several shards interleave in canonical space).
inline void sort_item(change_item& it, std::size_t es) {
  if (std::is_sorted(it.positions.begin(), it.positions.end())) return;
  std::vector<std::size_t> order(it.positions.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return it.positions[a] < it.positions[b]; });
  std::vector<std::uint64_t> pos;
  std::vector<std::byte> vals(it.values.size());
  pos.reserve(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    pos.push_back(it.positions[order[k]]);
    std::memcpy(&vals[k * es], &it.values[order[k] * es], es);
  }
  it.positions = std::move(pos);
  it.values = std::move(vals);
}
}  // namespace detail

/// The direct projection of one parallel configuration's shards onto the canonical model.
class direct_delta {
 public:
  /// One owned run block of shard `shard`'s local tensor `tensor` reaching a canonical tensor.
  struct source {
    std::size_t shard = 0, tensor = 0;
    run_block run;
    std::uint64_t local_bytes = 0;  // the local tensor's byte size (checked against what the trainer hands over)
    std::string local_name;
  };

  /// @throws errc::invalid_argument for no shards; errc::mismatch when the shards disagree on the
  ///         canonical manifest, a run block names no canonical tensor of its dtype, or the shards
  ///         do not own every canonical element exactly once (e.g. a rank of the configuration is
  ///         missing), naming the tensor.
  template <Projection P>
  explicit direct_delta(std::span<const P> shards) {
    if (shards.empty()) throw error(errc::invalid_argument, "a sharded projection needs at least one shard", {.file = {}, .tensor = {}, .field = "shards"});
    const model_manifest& m = shards.front().canonical();
    for (const P& s : shards)
      if (&s.canonical() != &m && !(s.canonical() == m))
        throw error(errc::mismatch, "trainer shards project to different canonical manifests", {.file = {}, .tensor = {}, .field = "canonical"});
    sources_.resize(m.size());
    element_size_.resize(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) element_size_[i] = element_size(m.tensors()[i].type);
    std::vector<std::uint64_t> owned(m.size(), 0);
    for (std::size_t r = 0; r < shards.size(); ++r) {
      const auto& ts = shards[r].tensors();
      for (std::size_t k = 0; k < ts.size(); ++k)
        for (const run_block& blk : ts[k].runs) {
          if (!blk.owned) continue;
          if (blk.tensor >= m.size() || ts[k].type != m.tensors()[blk.tensor].type)
            throw error(errc::mismatch, "a run block names no canonical tensor of its dtype", {.file = {}, .tensor = ts[k].name, .field = "runs"});
          sources_[blk.tensor].push_back({r, k, blk, ts[k].elements() * element_size(ts[k].type), ts[k].name});
          owned[blk.tensor] += blk.elements();
        }
    }
    for (std::size_t i = 0; i < m.size(); ++i)
      if (owned[i] != m.tensors()[i].elements())
        throw error(errc::mismatch,
                    "trainer shards own " + std::to_string(owned[i]) + " of " + std::to_string(m.tensors()[i].elements()) +
                        " elements (every element needs exactly one owning shard)",
                    {.file = {}, .tensor = m.tensors()[i].name, .field = "owned"});
  }

  /// The owned run blocks reaching canonical tensor `t` (an index into the canonical manifest).
  const std::vector<source>& sources(std::size_t t) const { return sources_.at(t); }

  /// The changes of canonical tensor `t` against `base` (its baseline bits), straight from the
  /// shards: `local(shard, tensor)` returns that shard tensor's bytes. Writes it.positions
  /// (ascending canonical indices) and it.values (new bits, or old ^ new for xor_mask), reusing
  /// their capacity; it.tensor is left as it is. Reads each owned local byte and each base byte
  /// once; nothing of the canonical tensor is written anywhere.
  /// @throws errc::mismatch when a shard tensor is not of its shape's size or `base` not t's size.
  template <class Local>
  void changes_into(std::size_t t, Local&& local, std::span<const std::byte> base, value_mode mode, change_item& it) const {
    const std::size_t es = element_size_.at(t);
    check_base(t, base.size());
    it.mode = mode;
    change_cursor c{};  // at 0: the vectors' sizes serve as capacity
    const bool x = mode == value_mode::xor_mask;
    for (const source& s : sources_[t]) {
      const std::span<const std::byte> l = checked_local(s, local);
      for_each_run(s.run, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
        collect_changed(base.data() + cb * es, l.data() + lb * es, len, es, cb, x, it, c);
      });
    }
    c.finish(it);
    detail::sort_item(it, es);
  }

  /// Materialises canonical tensor `t` into `out` (exactly its bytes) from the owned runs.
  template <class Local>
  void gather(std::size_t t, Local&& local, std::span<std::byte> out) const {
    const std::size_t es = element_size_.at(t);
    check_base(t, out.size());
    for (const source& s : sources_[t]) {
      const std::span<const std::byte> l = checked_local(s, local);
      for_each_run(s.run, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) { std::memcpy(out.data() + cb * es, l.data() + lb * es, len * es); });
    }
  }

 private:
  void check_base(std::size_t t, std::size_t bytes) const {
    std::uint64_t n = 0;
    for (const source& s : sources_.at(t)) n += s.run.elements();
    if (bytes != n * element_size_[t])
      throw error(errc::invalid_argument, "canonical buffer of " + std::to_string(bytes) + " bytes for a tensor of " + std::to_string(n * element_size_[t]),
                  {.file = {}, .tensor = {}, .field = "base"});
  }
  template <class Local>
  static std::span<const std::byte> checked_local(const source& s, Local& local) {
    const std::span<const std::byte> l = local(s.shard, s.tensor);
    if (l.size() != s.local_bytes)
      throw error(errc::mismatch, "shard " + std::to_string(s.shard) + " tensor holds " + std::to_string(l.size()) + " bytes, its shape needs " +
                                      std::to_string(s.local_bytes),
                  {.file = {}, .tensor = s.local_name, .field = "input"});
    return l;
  }

  std::vector<std::vector<source>> sources_;  // per canonical tensor
  std::vector<std::size_t> element_size_;     // per canonical tensor
};

}  // namespace bitrefit::layout
