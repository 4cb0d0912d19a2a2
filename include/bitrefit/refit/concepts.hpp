// bitrefit/refit/concepts.hpp — the policy the refit engine adds to those of the other areas.
//
// A sender is composed from policies given as template parameters:
//   TrainerProjection (this file)          the trainer's state of one version -> canonical bits
//   Transport         (transport/concepts.hpp)
//   CommitLog, BaselineStore (durability/concepts.hpp)
//   execution backend (codec/concepts.hpp) where change detection and encoding touch memory
// and a receiver from a layout::Loader, a Transport and a CommitLog.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "bitrefit/core/manifest.hpp"
#include "bitrefit/durability/change_set.hpp"

namespace bitrefit::refit {

/// TrainerProjection: how a sender reads the canonical bits of one version out of the trainer.
///
///   P::input              what the trainer hands to sender::start / sender::refit for one version
///                         (canonical bits already, or the local bytes of every trainer shard).
///   p.canonical()         the canonical manifest (Hugging Face names, dtypes, shapes).
///   p.project(in, t, out) writes the canonical bits of canonical tensor `t` of version `in` into
///                         `out` (exactly t.bytes() bytes): an owner's B^v when it boots from the
///                         trainer's copy.
///   p.changes(in, t, base, cs)  writes into cs (positions, values; replacing them) every element
///                         of `t` whose bits in `in` differ from `base` (t's baseline bits): its
///                         index, ascending, and its new bits. How an owner freezes a transition:
///                         a projection that can, finds them without building the canonical tensor
///                         (sharded_projection: layout's direct path), so the frozen target costs
///                         O(changes) memory.
///
/// Laws (tests/refit checks them end to end: receivers equal the dense canonical reference):
///   1. Total: every byte of `out` is written, from `in` alone (deterministic, no clock, no RNG).
///   2. Exact: an index map, never a value change. Values that change on the way to the serving
///      engine (FP8 with block scales, dtype casts) are a layout::Conversion, not a projection.
///   3. Sharded trainers: every canonical element comes from exactly one owning trainer shard
///      (layout::Projection law 3), so replicas never disagree about what is sent.
///   4. Consistent: changes(in, t, base) is exactly durability::diff_tensor(base, project(in, t)).
/// The owners call changes() once per owned tensor per transition, to freeze the change set;
/// calls for different tensors may come from different threads.
template <class P>
concept TrainerProjection = requires(const P& p, const typename P::input& in, const tensor_info& t, std::span<std::byte> out,
                                     std::span<const std::byte> base, durability::tensor_changes& cs) {
  { p.canonical() } -> std::same_as<const model_manifest&>;
  { p.project(in, t, out) } -> std::same_as<void>;
  { p.changes(in, t, base, cs) } -> std::same_as<void>;
};

}  // namespace bitrefit::refit
