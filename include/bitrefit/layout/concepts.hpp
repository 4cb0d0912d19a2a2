// bitrefit/layout/concepts.hpp — the three layout policies: Projection, Conversion, Loader.
//
// Canonical coordinates are (Hugging Face tensor name, row-major flat index). A trainer shard
// reaches them through a Projection (an exact index map) or, where values change, a Conversion;
// a receiving engine leaves them through a Loader (its own placement, in place).
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/layout/runs.hpp"

namespace bitrefit::layout {

/// Projection: one trainer shard's tensors and the run blocks mapping them to canonical tensors.
///
///   p.canonical()  the canonical manifest (HF names, dtypes, shapes); run_block::tensor indexes it.
///   p.tensors()    the shard's local tensors, each with its run blocks.
///
/// Laws (tests/layout checks them over every coordinate, for every shipped projection and every
/// TP/PP/EP combination up to 4):
///   1. In range: every run of every block lies inside its local tensor and inside its canonical
///      tensor; local dtype == canonical dtype (a dtype change is a Conversion, never a Projection).
///   2. Injective: within one shard tensor the runs are pairwise disjoint in local space, and within
///      one shard no canonical element is reached twice.
///   3. Exactly-once ownership: over all shards of one parallel configuration, every canonical
///      element is reached by exactly one run with owned == true (replicas: one owner chosen by a
///      stable hash of the canonical name; tied embeddings: one owner).
///   4. Reconstruction: gathering owned runs from shards built by the trainer's own sharding rules
///      gives the canonical tensors bit for bit.
///   5. Inverse: locate(project(i)) == i for every covered local i, and project(locate(j)) == j for
///      every canonical j the shard reaches.
/// Local elements reached by no run are padding (vocab padding rows) and are never sent.
template <class P>
concept Projection = requires(const P& p) {
  { p.canonical() } -> std::same_as<const model_manifest&>;
  { p.tensors() } -> std::same_as<const std::vector<shard_tensor>&>;
};

/// Conversion: produces canonical serving tensors whose values differ from the master weights
/// (FP8 with block scales, dtype casts). Changes are found by comparing the converted bits with a
/// residual baseline of converted bits, and are always sent as OVERWRITE (XOR of converted bits
/// would tie the receiver to a base it cannot check).
///
///   c.outputs(master)     the canonical tensors produced from one master tensor (e.g. the FP8
///                         weight and its `weight_scale_inv`), in a fixed order.
///   c.convert(in, outs)   writes every byte of every output.
///
/// Laws:
///   1. Deterministic: the output bits are a function of the input bits alone (same bits in, same
///      bits out, on every machine and thread count); NaN payloads, -0.0 and ±inf included.
///   2. Total: every output byte is written; nothing else is.
///   3. Residual delta: applying (as overwrite) the bitwise difference between convert(new) and the
///      residual baseline convert(old) to convert(old) gives convert(new) bit for bit.
template <class C>
concept Conversion = requires(const C& c, const tensor_info& master, tensor_view in,
                              std::span<const mutable_tensor_view> outs) {
  { c.outputs(master) } -> std::same_as<std::vector<tensor_info>>;
  { c.convert(in, outs) } -> std::same_as<void>;
};

/// Loader: a receiving engine's placement of canonical values into its own tensors (the role of
/// vLLM's weight loader). This is the contract the refit receivers program against.
///
///   l.canonical()          the canonical manifest of the whole model (held(t) may be empty).
///   l.held(t)              canonical element ranges of t this loader holds: sorted, disjoint,
///                          non-touching. What it must receive and what it attests over.
///   l.bit_preserving(t)    true when the engine stores t's canonical bits unchanged, so a XOR mask
///                          on canonical bits may be applied to stored bits (XOR allowed).
///   l.segments(t)          for a bit-preserving t: where each held canonical run lives, as
///                          contiguous bytes in the canonical dtype (the in-place fast path).
///                          Empty for a tensor that is not bit-preserving.
///   l.write(t, r, bytes)   places canonical values of elements r (r within held(t)).
///   l.read(t, r, bytes)    reads back the canonical values of elements r (r within held(t)).
///
/// Laws:
///   1. Round trip: read(t, r) after write(t, r, x) gives x bit for bit, for every held r and
///      every bit pattern x (NaN payloads and -0.0 included); writes to one element leave every
///      other held element unchanged.
///   2. Segments: for a bit-preserving t the segments cover held(t) exactly, in canonical order,
///      and write/read are the same bytes as a memcpy into/out of the segments.
///   3. held(t) is stable for the life of the loader (it is declared at join).
/// Free functions in layout/apply.hpp (apply_positions, apply_runs, read_canonical,
/// write_canonical, held_ranges) build the receiver's operations from these primitives.
template <class L>
concept Loader = requires(L& l, const L& cl, std::string_view t, index_range r, std::span<const std::byte> in,
                          std::span<std::byte> out) {
  { cl.canonical() } -> std::same_as<const model_manifest&>;
  { cl.held(t) } -> std::same_as<std::span<const index_range>>;
  { cl.bit_preserving(t) } -> std::same_as<bool>;
  { cl.segments(t) } -> std::same_as<std::span<const placement_segment>>;
  { l.write(t, r, in) } -> std::same_as<void>;
  { cl.read(t, r, out) } -> std::same_as<void>;
};

}  // namespace bitrefit::layout
