// bitrefit/refit/projection.hpp — the sender's TrainerProjection models (refit/concepts.hpp).
//
//   identity_projection           the trainer already hands over canonical bits (one callback per
//                                 canonical tensor): the default, and what quickstart uses.
//   sharded_projection<P>         the trainer hands over the local bytes of every shard of one
//                                 parallel configuration, each described by a layout::Projection P
//                                 (e.g. layout::megatron_projection per TP/PP/DP rank).
//
// Freezing a transition (changes()) never materialises the canonical model: the sharded projection
// runs layout's direct path (layout::direct_delta: each owned run of each shard compared with B^v
// at its canonical position), so an owner's frozen target is its change set, O(changes). The
// identity projection's input reads any element range of a canonical tensor (tensor_source), so a
// freeze reads each tensor in blocks of change_block_bytes into a per-thread scratch of one block
// and diffs block by block: the sender's extra memory is O(block) per thread, never O(tensor).
// project() (dense canonical bits) remains for B^v itself when an owner boots from the trainer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/delta_build.hpp"
#include "bitrefit/layout/runs.hpp"
#include "bitrefit/refit/concepts.hpp"

namespace bitrefit::refit {

/// Reads the current bits of elements `r` of canonical tensor `t` into `out` (exactly r.size() *
/// element_size(t.type) bytes; r lies inside the tensor). The identity projection's input: a freeze
/// asks for blocks of at most change_block_bytes, a dense load (B^v from the trainer) for the whole
/// tensor. Called from the sender's threads, several tensors at once. copy_from() builds one over
/// tensors the trainer holds in memory.
using tensor_source = std::function<void(const tensor_info& t, layout::index_range r, std::span<std::byte> out)>;

/// Writes the dense bits of one whole canonical tensor into `out` (exactly its byte size): how an
/// owner loads B^v from the trainer (owner_shard::load_baseline). From a projection: its project().
using dense_source = std::function<void(const tensor_info&, std::span<std::byte> out)>;

/// The bytes of a freeze's reads (and of its per-thread scratch): 1 MiB stays in L2 between the
/// source's copy and the diff, and the per-block cost (one call, one scan setup) is negligible.
inline constexpr std::size_t change_block_bytes = std::size_t{1} << 20;

namespace detail {
/// The one check that a version's canonical bits were given at all (an empty std::function), named
/// by tensor: every read through a tensor_source starts with it.
inline void require_source(const tensor_source& src, const tensor_info& t) {
  if (!src) throw error(errc::invalid_argument, "no canonical bits given for this version", {.file = {}, .tensor = t.name, .field = "input"});
}
}  // namespace detail

/// The tensor_source of a trainer that holds each canonical tensor's bits in memory: `bits(t)` gives
/// tensor t's bytes (exactly t.bytes(), e.g. a CPU tensor's storage), and ranges are copied out of it.
template <class Bits>
  requires std::is_invocable_r_v<std::span<const std::byte>, const Bits&, const tensor_info&>
tensor_source copy_from(Bits bits) {
  return [bits = std::move(bits)](const tensor_info& t, layout::index_range r, std::span<std::byte> out) {
    const std::span<const std::byte> all = bits(t);
    const std::size_t es = element_size(t.type);
    if (all.size() != t.bytes() || r.end > t.elements() || r.begin > r.end || out.size() != r.size() * es)
      throw error(errc::mismatch, "trainer bits of " + std::to_string(all.size()) + " bytes for a tensor of " + std::to_string(t.bytes()) +
                                      ", or a read outside it",
                  {.file = {}, .tensor = t.name, .field = "input"});
    if (!out.empty()) std::memcpy(out.data(), all.data() + r.begin * es, out.size());
  };
}

/// The dense source that reads whole tensors through `src` (one range: the whole tensor).
inline dense_source whole_tensors(tensor_source src) {
  return [src = std::move(src)](const tensor_info& t, std::span<std::byte> out) {
    detail::require_source(src, t);
    src(t, layout::index_range{0, t.elements()}, out);
  };
}

/// Writes into `out` (positions ascending, new bits; replacing them) every element of canonical
/// tensor `t` whose bits in the trainer's state differ from `base` (t's baseline bits): how an
/// owner freezes a transition (owner_shard::freeze). From a projection: its changes().
using change_source = std::function<void(const tensor_info&, std::span<const std::byte> base, durability::tensor_changes& out)>;

/// The change source of a trainer that hands over canonical bits (identity projection): each
/// tensor is read in blocks of change_block_bytes into a per-thread scratch of one block (kept
/// across transitions) and each block diffed against the same range of `base`.
inline change_source changes_of(tensor_source src) {
  return [src = std::move(src)](const tensor_info& t, std::span<const std::byte> base, durability::tensor_changes& out) {
    detail::require_source(src, t);
    const std::size_t es = element_size(t.type);
    const std::uint64_t n = t.elements();
    const std::uint64_t block = std::max<std::size_t>(change_block_bytes / es, 1);
    thread_local std::vector<std::byte> scratch;
    scratch.resize(std::min<std::uint64_t>(block, n) * es);
    out.positions.clear();
    out.values.clear();
    for (std::uint64_t b = 0; b < n; b += block) {
      const layout::index_range r{b, std::min(n, b + block)};
      const std::span<std::byte> now(scratch.data(), r.size() * es);
      src(t, r, now);
      const std::size_t first = out.positions.size();
      durability::diff_tensor(base.subspan(b * es, now.size()), now, es, out);
      for (std::size_t k = first; k < out.positions.size(); ++k) out.positions[k] += b;  // block -> tensor position
    }
  };
}

/// The trainer already has canonical bits: project() asks the callback for them.
class identity_projection {
 public:
  using input = tensor_source;

  explicit identity_projection(model_manifest m) : manifest_(std::move(m)) {}

  const model_manifest& canonical() const noexcept { return manifest_; }
  void project(const input& in, const tensor_info& t, std::span<std::byte> out) const {
    detail::require_source(in, t);
    if (out.size() != t.bytes())
      throw error(errc::invalid_argument, "projection buffer of " + std::to_string(out.size()) + " bytes for a tensor of " + std::to_string(t.bytes()),
                  {.file = {}, .tensor = t.name, .field = "out"});
    in(t, layout::index_range{0, t.elements()}, out);
  }
  /// The changes of `t` against its baseline bits `base` into `out` (positions, new bits; replaced).
  void changes(const input& in, const tensor_info& t, std::span<const std::byte> base, durability::tensor_changes& out) const {
    if (base.size() != t.bytes())
      throw error(errc::invalid_argument, "changes against a base of " + std::to_string(base.size()) + " bytes for a tensor of " + std::to_string(t.bytes()),
                  {.file = {}, .tensor = t.name, .field = "base"});
    changes_of(in)(t, base, out);
  }

 private:
  model_manifest manifest_;
};

static_assert(TrainerProjection<identity_projection>);

/// The local bytes of trainer shard `shard`'s tensor `tensor` (an index into that shard's
/// projection tensors()), exactly elements * element_size bytes. Called during project() only.
using shard_bytes = std::function<std::span<const std::byte>(std::size_t shard, std::size_t tensor)>;

/// Every shard of one trainer parallel configuration, each a layout::Projection; a canonical
/// tensor's bits come from the runs marked `owned` (exactly one shard owns each element).
template <layout::Projection P>
class sharded_projection {
 public:
  using input = shard_bytes;

  /// @throws errc::invalid_argument for no shards; errc::mismatch when the shards disagree on the
  ///         canonical manifest or do not own every canonical element exactly once (e.g. a rank of
  ///         the configuration is missing), naming the tensor (layout::direct_delta checks it).
  explicit sharded_projection(std::vector<P> shards) : shards_(std::move(shards)), direct_(std::span<const P>(shards_)) {}

  const model_manifest& canonical() const noexcept { return shards_.front().canonical(); }
  const std::vector<P>& shards() const noexcept { return shards_; }

  /// Dense canonical bits of `t` (an owner's B^v, booted from the trainer's copy).
  void project(const input& in, const tensor_info& t, std::span<std::byte> out) const {
    const auto idx = canonical().index_of(t.name);
    if (!idx || out.size() != t.bytes())
      throw error(errc::invalid_argument, "projection of a tensor outside the canonical manifest or into a buffer of the wrong size",
                  {.file = {}, .tensor = t.name, .field = "out"});
    direct_.gather(*idx, in, out);
  }

  /// The changes of `t` against its baseline bits `base`, by direct projection (the canonical
  /// tensor is never built) into `out` (positions ascending, new bits; replaced, its capacity reused).
  void changes(const input& in, const tensor_info& t, std::span<const std::byte> base, durability::tensor_changes& out) const {
    const auto idx = canonical().index_of(t.name);
    if (!idx || base.size() != t.bytes())
      throw error(errc::invalid_argument, "changes of a tensor outside the canonical manifest or against a base of the wrong size",
                  {.file = {}, .tensor = t.name, .field = "base"});
    layout::change_item it;  // the same vectors: layout's item and durability's changes hold positions and bits alike
    it.positions.swap(out.positions);
    it.values.swap(out.values);
    struct give_back {
      layout::change_item& it;
      durability::tensor_changes& out;
      ~give_back() { it.positions.swap(out.positions), it.values.swap(out.values); }
    } guard{it, out};
    direct_.changes_into(*idx, in, base, value_mode::overwrite, it);
  }

 private:
  std::vector<P> shards_;
  layout::direct_delta direct_;
};

}  // namespace bitrefit::refit
