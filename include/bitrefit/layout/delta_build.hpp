// bitrefit/layout/delta_build.hpp — building a refit's change set from trainer shards.
//
// Direct projection (what owners do): for every owned run of every shard tensor, compare the
// shard's local bytes with the canonical baseline's bytes at the run's canonical position, and
// emit the changed canonical indices. The canonical tensor is never materialised: each byte of
// the shard and of the baseline is read once.
//
// Materialising (the reference it is measured against, and what NeMo RL's path amounts to):
// gather each canonical tensor from the shards' owned runs into a scratch buffer, then diff the
// buffer against the baseline. Same change set, one extra write and read of every byte.
#pragma once

#include <algorithm>
#include <memory>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/change_set.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

namespace detail {
template <Projection P>
void check_shard_bytes(const P& proj, std::span<const std::span<const std::byte>> local) {
  const auto& ts = proj.tensors();
  if (local.size() != ts.size())
    throw error(errc::mismatch, "shard has " + std::to_string(local.size()) + " tensors, its projection " + std::to_string(ts.size()),
                {.file = {}, .tensor = {}, .field = "shard"});
  for (std::size_t k = 0; k < ts.size(); ++k)
    if (local[k].size() != ts[k].elements() * element_size(ts[k].type))
      throw error(errc::mismatch, "shard tensor holds " + std::to_string(local[k].size()) + " bytes, its shape needs " +
                                      std::to_string(ts[k].elements() * element_size(ts[k].type)),
                  {.file = {}, .tensor = ts[k].name, .field = "data"});
}

/// Sorts an item's positions (and values with them) when runs were not emitted in canonical order.
inline void sort_item(change_item& it, std::size_t es) {
  if (std::is_sorted(it.positions.begin(), it.positions.end())) return;
  std::vector<std::size_t> order(it.positions.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return it.positions[a] < it.positions[b]; });
  change_item out{it.tensor, it.mode, {}, {}};
  out.positions.reserve(order.size());
  out.values.resize(it.values.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    out.positions.push_back(it.positions[order[k]]);
    std::memcpy(&out.values[k * es], &it.values[order[k] * es], es);
  }
  it = std::move(out);
}
}  // namespace detail

/// The owned part of one shard's delta against `baseline`, by direct projection, written into a
/// reusable workspace: afterwards items[t] holds this shard's changes of canonical tensor t
/// (empty when none), positions ascending. The items' vectors keep their capacity from one refit
/// to the next, so a steady-state owner allocates nothing. `local[k]` holds the bytes of
/// proj.tensors()[k]; `mode` chooses XOR masks or absolute values.
template <Projection P>
void direct_delta_into(const P& proj, std::span<const std::span<const std::byte>> local, const canonical_store& baseline, value_mode mode,
                       std::vector<change_item>& items) {
  detail::check_shard_bytes(proj, local);
  const auto& canon = proj.canonical().tensors();
  items.resize(canon.size());
  std::vector<change_cursor> cursors(canon.size());  // all at 0: sizes serve as capacity
  for (std::size_t t = 0; t < canon.size(); ++t) {
    if (items[t].tensor != canon[t].name) items[t].tensor = canon[t].name;
    items[t].mode = mode;
  }
  const bool x = mode == value_mode::xor_mask;
  std::vector<std::uint8_t> touched(canon.size(), 0);
  for (std::size_t k = 0; k < proj.tensors().size(); ++k) {
    const shard_tensor& st = proj.tensors()[k];
    const std::size_t es = element_size(st.type);
    for (const run_block& b : st.runs) {
      if (!b.owned) continue;
      touched[b.tensor] = 1;
      const std::byte* base = baseline.bytes(canon[b.tensor].name).data();
      for_each_run(b, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
        collect_changed(base + cb * es, local[k].data() + lb * es, len, es, cb, x, items[b.tensor], cursors[b.tensor]);
      });
    }
  }
  for (std::size_t t = 0; t < canon.size(); ++t) {
    cursors[t].finish(items[t]);
    if (touched[t]) detail::sort_item(items[t], element_size(canon[t].type));
  }
}

/// Same, returning only the non-empty items, in manifest order (allocates per call).
template <Projection P>
std::vector<change_item> direct_delta(const P& proj, std::span<const std::span<const std::byte>> local, const canonical_store& baseline,
                                      value_mode mode) {
  std::vector<change_item> ws, out;
  direct_delta_into(proj, local, baseline, mode, ws);
  for (auto& it : ws)
    if (!it.positions.empty()) out.push_back(std::move(it));
  return out;
}

/// The reference path: gathers canonical tensors from the owned runs of every added shard, then
/// diffs them with the baseline.
///   whole_model_fresh: gather the whole canonical model into freshly allocated tensors (a
///                 gathered state dict, as an export to the Hugging Face layout builds it each
///                 refit, like torch.empty + copy), then diff every tensor, then free them;
///   whole_model:  the same into one scratch allocated (and touched) once, reused by later builds;
///   per_tensor:   gather one tensor into a reused scratch buffer, diff it, next tensor (the
///                 streamed variant: less memory, and small tensors stay in cache).
class materialising_delta {
 public:
  enum class scope { whole_model_fresh, whole_model, per_tensor };

  explicit materialising_delta(const model_manifest& canonical, scope s = scope::whole_model)
      : canonical_(&canonical), scope_(s), sources_(canonical.size()) {}

  /// Registers a shard; `local` must outlive build().
  template <Projection P>
  void add_shard(const P& proj, std::span<const std::span<const std::byte>> local) {
    detail::check_shard_bytes(proj, local);
    if (!(proj.canonical() == *canonical_))
      throw error(errc::mismatch, "shard projects to another canonical manifest", {.file = {}, .tensor = {}, .field = "canonical"});
    for (std::size_t k = 0; k < proj.tensors().size(); ++k)
      for (const run_block& b : proj.tensors()[k].runs)
        if (b.owned) sources_[b.tensor].push_back({local[k].data(), b});
  }

  /// Writes items[t] = the changes of canonical tensor t (empty when none) into a reusable
  /// workspace, like direct_delta_into.
  void build_into(const canonical_store& baseline, value_mode mode, std::vector<change_item>& items) {
    const auto& canon = canonical_->tensors();
    items.resize(canon.size());
    std::vector<std::uint64_t> offset(canon.size(), 0);
    std::uint64_t need = 0;
    const bool whole = scope_ != scope::per_tensor;
    for (std::size_t t = 0; t < canon.size(); ++t) {
      if (whole) offset[t] = need, need += canon[t].bytes();
      else need = std::max(need, canon[t].bytes());
    }
    std::unique_ptr<std::byte[]> fresh;  // default-initialised: pages are first touched by the gather
    std::byte* scratch = nullptr;
    if (scope_ == scope::whole_model_fresh) {
      fresh.reset(new std::byte[need]);
      scratch = fresh.get();
    } else {
      if (scratch_.size() < need) scratch_.resize(need);
      scratch = scratch_.data();
    }
    auto gather = [&](std::size_t t) {
      const std::size_t es = element_size(canon[t].type);
      std::byte* dst = scratch + offset[t];
      std::uint64_t covered = 0;
      for (const source& s : sources_[t])
        for_each_run(s.run, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
          std::memcpy(dst + cb * es, s.bytes + lb * es, len * es);
          covered += len;
        });
      if (covered != canon[t].elements())
        throw error(errc::mismatch, "owned runs cover " + std::to_string(covered) + " of " + std::to_string(canon[t].elements()) + " elements",
                    {.file = {}, .tensor = canon[t].name, .field = "shards"});
    };
    auto diff = [&](std::size_t t) {
      change_item& it = items[t];
      if (it.tensor != canon[t].name) it.tensor = canon[t].name;
      it.mode = mode;
      change_cursor c{};
      collect_changed(baseline.bytes(canon[t].name).data(), scratch + offset[t], canon[t].elements(), element_size(canon[t].type), 0,
                      mode == value_mode::xor_mask, it, c);
      c.finish(it);
    };
    if (whole) {
      for (std::size_t t = 0; t < canon.size(); ++t) gather(t);
      for (std::size_t t = 0; t < canon.size(); ++t) diff(t);
    } else {
      for (std::size_t t = 0; t < canon.size(); ++t) gather(t), diff(t);
    }
  }

  /// One item per canonical tensor with changes, in manifest order.
  /// @throws errc::mismatch when the registered shards' owned runs do not cover a tensor (a gap
  ///         would diff stale scratch bytes).
  std::vector<change_item> build(const canonical_store& baseline, value_mode mode) {
    std::vector<change_item> ws, out;
    build_into(baseline, mode, ws);
    for (auto& it : ws)
      if (!it.positions.empty()) out.push_back(std::move(it));
    return out;
  }

 private:
  struct source {
    const std::byte* bytes;
    run_block run;
  };
  const model_manifest* canonical_;
  scope scope_;
  std::vector<std::vector<source>> sources_;
  std::vector<std::byte> scratch_;
};

/// Merges per-shard items of the same tensor (disjoint positions) into one sorted item per tensor.
inline std::vector<change_item> merge_items(std::vector<change_item> items, const model_manifest& canonical) {
  std::sort(items.begin(), items.end(), [](const change_item& a, const change_item& b) { return a.tensor < b.tensor; });
  std::vector<change_item> out;
  for (auto& it : items) {
    if (!out.empty() && out.back().tensor == it.tensor) {
      out.back().positions.insert(out.back().positions.end(), it.positions.begin(), it.positions.end());
      out.back().values.insert(out.back().values.end(), it.values.begin(), it.values.end());
    } else {
      out.push_back(std::move(it));
    }
  }
  for (auto& it : out) detail::sort_item(it, element_size(canonical.at(it.tensor).type));
  return out;
}

}  // namespace bitrefit::layout
