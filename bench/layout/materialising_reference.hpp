// bench/layout/materialising_reference.hpp — the REFERENCE the direct projection is measured
// against, not an engine path: gather each canonical tensor from the shards' owned runs into a
// scratch buffer, then diff it against the baseline (what NeMo RL's path amounts to). Same change
// set as layout::direct_delta, one extra write and read of every byte. It lives with the bench
// only; the library's owners run layout::direct_delta (through refit::sharded_projection::changes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/change_set.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/runs.hpp"

namespace bitrefit::bench {

using namespace bitrefit::layout;

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
    check_shard_bytes(proj, local);
    if (!(proj.canonical() == *canonical_))
      throw error(errc::mismatch, "shard projects to another canonical manifest", {.file = {}, .tensor = {}, .field = "canonical"});
    for (std::size_t k = 0; k < proj.tensors().size(); ++k)
      for (const run_block& b : proj.tensors()[k].runs)
        if (b.owned) sources_[b.tensor].push_back({local[k].data(), b});
  }

  /// Writes items[t] = the changes of canonical tensor t (empty when none) into a reusable
  /// workspace (items[t] for canonical tensor t).
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

}  // namespace bitrefit::bench
