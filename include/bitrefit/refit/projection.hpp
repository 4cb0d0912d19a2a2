// bitrefit/refit/projection.hpp — the sender's TrainerProjection models (refit/concepts.hpp).
//
//   identity_projection           the trainer already hands over canonical bits (one callback per
//                                 canonical tensor): the default, and what quickstart uses.
//   sharded_projection<P>         the trainer hands over the local bytes of every shard of one
//                                 parallel configuration, each described by a layout::Projection P
//                                 (e.g. layout::megatron_projection per TP/PP/DP rank); canonical
//                                 bits are gathered from the owned runs of the run blocks.
//
// Why gathering is free here: an owner must keep the transition's frozen target bits until cleanup
// (DESIGN, prepare), so it copies v+1 out of the trainer once anyway; projecting while copying
// costs no extra pass. The canonical tensor is written straight into the owner's frozen buffer.
#pragma once

#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/runs.hpp"
#include "bitrefit/refit/concepts.hpp"

namespace bitrefit::refit {

/// Reads the current bits of one canonical tensor into `out` (exactly its byte size).
using tensor_source = std::function<void(const tensor_info&, std::span<std::byte> out)>;

/// The trainer already has canonical bits: project() asks the callback for them.
class identity_projection {
 public:
  using input = tensor_source;

  explicit identity_projection(model_manifest m) : manifest_(std::move(m)) {}

  const model_manifest& canonical() const noexcept { return manifest_; }
  void project(const input& in, const tensor_info& t, std::span<std::byte> out) const {
    if (!in) throw error(errc::invalid_argument, "no canonical bits given for this version", {.file = {}, .tensor = t.name, .field = "input"});
    if (out.size() != t.bytes())
      throw error(errc::invalid_argument, "projection buffer of " + std::to_string(out.size()) + " bytes for a tensor of " + std::to_string(t.bytes()),
                  {.file = {}, .tensor = t.name, .field = "out"});
    in(t, out);
  }

 private:
  model_manifest manifest_;
};

static_assert(TrainerProjection<identity_projection>);

/// The local bytes of trainer shard `shard`'s tensor `tensor` (an index into that shard's
/// projection tensors()), exactly elements * element_size bytes. Called during project() only.
using shard_bytes = std::function<std::span<const std::byte>(std::size_t shard, std::size_t tensor)>;

/// Every shard of one trainer parallel configuration, each a layout::Projection; canonical bits of
/// a tensor are gathered from the runs marked `owned` (exactly one shard owns each element).
template <layout::Projection P>
class sharded_projection {
 public:
  using input = shard_bytes;

  /// @throws errc::invalid_argument for no shards; errc::mismatch when the shards disagree on the
  ///         canonical manifest or do not own every canonical element exactly once (e.g. a rank of
  ///         the configuration is missing), naming the tensor.
  explicit sharded_projection(std::vector<P> shards) : shards_(std::move(shards)) {
    if (shards_.empty()) throw error(errc::invalid_argument, "a sharded projection needs at least one shard", {.file = {}, .tensor = {}, .field = "shards"});
    const model_manifest& m = shards_.front().canonical();
    for (const P& s : shards_)
      if (&s.canonical() != &m && !(s.canonical() == m))
        throw error(errc::mismatch, "trainer shards project to different canonical manifests", {.file = {}, .tensor = {}, .field = "canonical"});
    sources_.resize(m.size());
    std::vector<std::uint64_t> owned(m.size(), 0);
    for (std::size_t r = 0; r < shards_.size(); ++r) {
      const auto& ts = shards_[r].tensors();
      for (std::size_t k = 0; k < ts.size(); ++k)
        for (std::size_t b = 0; b < ts[k].runs.size(); ++b) {
          const layout::run_block& blk = ts[k].runs[b];
          if (!blk.owned) continue;
          if (blk.tensor >= m.size() || ts[k].type != m.tensors()[blk.tensor].type)
            throw error(errc::mismatch, "a run block names no canonical tensor of its dtype", {.file = {}, .tensor = ts[k].name, .field = "runs"});
          sources_[blk.tensor].push_back({r, k, b});
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

  const model_manifest& canonical() const noexcept { return shards_.front().canonical(); }
  const std::vector<P>& shards() const noexcept { return shards_; }

  void project(const input& in, const tensor_info& t, std::span<std::byte> out) const {
    const auto idx = canonical().index_of(t.name);
    if (!idx || out.size() != t.bytes())
      throw error(errc::invalid_argument, "projection of a tensor outside the canonical manifest or into a buffer of the wrong size",
                  {.file = {}, .tensor = t.name, .field = "out"});
    const std::size_t E = element_size(t.type);
    for (const source& s : sources_[*idx]) {
      const layout::shard_tensor& st = shards_[s.shard].tensors()[s.tensor];
      const std::span<const std::byte> local = in(s.shard, s.tensor);
      if (local.size() != st.elements() * E)
        throw error(errc::mismatch, "shard " + std::to_string(s.shard) + " tensor holds " + std::to_string(local.size()) + " bytes, its shape needs " +
                        std::to_string(st.elements() * E),
                    {.file = {}, .tensor = st.name, .field = "input"});
      layout::for_each_run(st.runs[s.block], [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
        std::memcpy(out.data() + cb * E, local.data() + lb * E, len * E);
      });
    }
  }

 private:
  struct source {
    std::size_t shard, tensor, block;
  };
  std::vector<P> shards_;
  std::vector<std::vector<source>> sources_;  // per canonical tensor: the owned run blocks reaching it
};

}  // namespace bitrefit::refit
