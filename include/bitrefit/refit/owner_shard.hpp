// bitrefit/refit/owner_shard.hpp — an owner's bits: the committed baseline B^v of the canonical
// tensors it owns, the frozen change set of the transition in progress, and chunk encoding.
//
// Ownership: each canonical tensor has exactly one owner, chosen by a stable hash of its name
// (layout::stable_owner), fixed across attempts and restarts, so data-parallel replicas never send
// the same element twice. The protocol's owner state machine decides WHEN things happen; this class
// only does them:
//   freeze(changes)    records the transition's target as its CHANGE SET against B^v: per owned
//                      tensor the positions whose bits differ and their new bits, found by the
//                      trainer projection (refit/projection.hpp; a sharded trainer by layout's
//                      direct path, never building a canonical tensor). The frozen target is never
//                      held densely: B^v + the change set IS the target (the trainer may keep
//                      training; the transition sends exactly these bits until cleanup). Extra
//                      memory O(changes); the durable image of a DeltaBaselineStore is this very set.
//   encode(seq, ...)   chunk seq of the deterministic plan, as a delta frame against B^v, from the
//                      KNOWN changes of the chunk's ranges (codec::chunk_encoder::encode_known: no
//                      change detection, the same bytes encode() gives for B^v -> target): XOR or
//                      overwrite per item (xor_allowed) or overwrite only (retries, absolute). The
//                      same chunk under the same payload id always yields the same bytes.
// Per-tensor modes: tensors that some receiver does not place bit-preservingly (placement.hpp)
// are planned into chunks of their own, after the others, and chunk_allows_xor(seq) is false for
// them: the sender encodes those chunks overwrite-only in every attempt, so one frame never mixes
// the two classes and no codec change was needed.
//   advance()          B := frozen, by applying the change set to B^v in place (idempotent);
//                      called when the owner reads K = (v+1, g').
//   encode_dense(seq)  chunk seq of B^v as a dense frame (restoring a restarted receiver).
// Digests of the frozen target (attestations, frozen_identity) read B^v + the change set through
// frozen_patch(), a leaf or block at a time.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/core/canonical.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/layout/ownership.hpp"
#include "bitrefit/refit/projection.hpp"

namespace bitrefit::refit {

/// The stable owner of a tensor among `owners` (layout/ownership.hpp: one definition everywhere).
inline std::uint32_t owner_of(std::string_view tensor, std::uint32_t owners) {
  return layout::stable_owner(tensor, owners ? owners : 1);
}

class owner_shard {
 public:
  /// @param xor_allowed  per owned tensor: may it be sent as XOR (default: every tensor may).
  /// @param cuts         per owned tensor: element indices where items must be cut (refit::item_cuts:
  ///                     every receiver's held-range boundaries), so a base-conditioned item is
  ///                     held whole or not at all by each receiver. Cuts split a chunk's ranges
  ///                     into more items of the same frame; the plan's chunks do not change.
  owner_shard(model_manifest manifest, std::uint32_t index, std::uint32_t owners,
              std::uint64_t max_frame_input_bytes = codec::default_max_frame_input_bytes,
              const std::function<bool(const tensor_info&)>& xor_allowed = {},
              const std::function<std::vector<std::uint64_t>(const tensor_info&)>& cuts = {})
      : manifest_(std::move(manifest)), index_(index), owners_(owners), max_frame_bytes_(max_frame_input_bytes) {
    std::vector<canonical_range> xor_ranges, overwrite_ranges;
    for (const auto& t : manifest_.tensors())
      if (owner_of(t.name, owners_) == index_) {
        owned_.push_back(&t);
        baseline_[t.name].assign(t.bytes(), std::byte{0});
        if (t.elements() > 0) (!xor_allowed || xor_allowed(t) ? xor_ranges : overwrite_ranges).push_back({t.name, 0, t.elements()});
      }
    plan_ = codec::plan_chunks(std::move(xor_ranges), manifest_, max_frame_bytes_);
    chunk_xor_.assign(plan_.size(), true);
    for (auto& c : codec::plan_chunks(std::move(overwrite_ranges), manifest_, max_frame_bytes_)) {
      plan_.push_back(std::move(c));
      chunk_xor_.push_back(false);
    }
    if (cuts)
      for (auto& chunk : plan_) {
        std::vector<canonical_range> split;
        for (const auto& r : chunk) {
          std::uint64_t b = r.begin;
          for (std::uint64_t x : cuts(manifest_.at(r.tensor)))
            if (x > b && x < r.end) split.push_back({r.tensor, b, x}), b = x;
          split.push_back({r.tensor, b, r.end});
        }
        chunk = std::move(split);
      }
  }

  owner_shard(const owner_shard&) = delete;  // owned_ points into manifest_
  owner_shard(owner_shard&&) noexcept = default;

  std::uint32_t index() const noexcept { return index_; }
  const model_manifest& manifest() const noexcept { return manifest_; }
  /// Number of chunks (= payloads per attempt, = dense frames per restore). Fixed for the model.
  std::uint32_t chunk_count() const noexcept { return static_cast<std::uint32_t>(plan_.size()); }
  /// Whether chunk seq may carry XOR items (false: its tensors are overwrite-only, in every attempt).
  bool chunk_allows_xor(std::uint32_t seq) const { return chunk_xor_.at(seq); }
  /// The canonical ranges of chunk seq (tests inspect the plan).
  const std::vector<canonical_range>& chunk(std::uint32_t seq) const { return plan_.at(seq); }
  const std::vector<const tensor_info*>& owned() const noexcept { return owned_; }
  std::uint64_t owned_bytes() const {
    std::uint64_t n = 0;
    for (auto* t : owned_) n += t->bytes();
    return n;
  }

  /// Sets B^v from the trainer (initial version, or a dense reload).
  void load_baseline(const dense_source& src) {
    for (auto* t : owned_) src(*t, baseline_[t->name]);
    thaw();
  }
  /// Same, from a trainer that hands over canonical bits (each owned tensor read whole).
  void load_baseline(const tensor_source& src) { load_baseline(whole_tensors(src)); }
  /// Sets B^v from a durable image; false when the image does not match the owned tensors.
  bool load_baseline(const durability::baseline_image& img) {
    if (!fits(img)) return false;
    for (auto* t : owned_) baseline_[t->name] = img.at(t->name);
    thaw();
    return true;
  }
  /// B^v as a baseline image (owner_shard keeps exactly the owned tensors, by name, in that form).
  const durability::baseline_image& baseline() const noexcept { return baseline_; }
  /// The frozen target as a whole image: B^v with the change set applied, built on demand (a
  /// transient copy of the owned tensors) for a store that can only save whole images.
  /// @pre frozen()
  durability::baseline_image frozen_image() const {
    durability::baseline_image img = baseline_;
    durability::apply_changes(img, changes_);
    return img;
  }
  /// Sets the frozen target from a durable image (a restarted owner): kept as its change set
  /// against B^v, not as the image; false when it does not match the owned tensors.
  bool load_frozen(const durability::baseline_image& img) {
    if (!fits(img)) return false;
    changes_.clear();
    for (auto* t : owned_) {
      durability::tensor_changes c;
      c.element_size = static_cast<std::uint32_t>(element_size(t->type));
      c.elements = t->elements();
      durability::diff_tensor(baseline_.at(t->name), img.at(t->name), c.element_size, c);
      if (!c.positions.empty()) changes_.emplace(t->name, std::move(c));
    }
    frozen_ = true;
    return true;
  }

  /// Same, from the durable change set itself (durability::ChangeSetStore::load_changes): no image
  /// of the target is built. Entries whose bits equal B^v's are dropped, so the frozen set is
  /// exactly the one the image form yields. False when `cs` does not fit the owned tensors (a
  /// tensor not owned, another size, positions not strictly increasing in range).
  bool load_frozen(durability::change_set cs) {
    try {
      durability::check_fits(baseline_, cs);  // B^v holds the owned tensors only
    } catch (const error&) {
      return false;
    }
    for (auto* t : owned_)  // same bytes, other element width: not this tensor's change set
      if (auto it = cs.find(t->name); it != cs.end() && it->second.element_size != element_size(t->type)) return false;
    for (auto& [name, c] : cs) {
      const std::byte* base = baseline_.at(name).data();
      const std::size_t E = c.element_size;
      std::size_t kept = 0;
      for (std::size_t k = 0; k < c.positions.size(); ++k) {
        const std::byte* v = c.values.data() + k * E;
        if (std::memcmp(base + c.positions[k] * E, v, E) == 0) continue;
        c.positions[kept] = c.positions[k];
        std::memmove(c.values.data() + kept * E, v, E);
        ++kept;
      }
      c.positions.resize(kept);
      c.values.resize(kept * E);
      c.positions.shrink_to_fit();
      c.values.shrink_to_fit();
    }
    std::erase_if(cs, [](const auto& kv) { return kv.second.positions.empty(); });
    changes_ = std::move(cs);
    frozen_ = true;
    return true;
  }

  /// Freezes the transition's target as its change set against B^v: `src` finds, per owned
  /// tensor, the elements whose bits differ and their new bits (a projection's changes()).
  /// @pre no transition is frozen (or it is being replaced by the same target after an owner restart).
  /// Returns how many elements differ bitwise from B^v (the change set's size).
  /// @throws errc::mismatch when the source's changes do not fit B^v (positions not strictly
  ///         ascending or out of range, value bytes not one element per position), naming the tensor.
  std::uint64_t freeze(const change_source& src) {
    thaw();
    for (auto* t : owned_) {
      durability::tensor_changes c;
      c.element_size = static_cast<std::uint32_t>(element_size(t->type));
      c.elements = t->elements();
      src(*t, baseline_.at(t->name), c);
      if (c.positions.empty()) continue;
      c.positions.shrink_to_fit();  // held for the whole transition: no growth slack (one copy of the set)
      c.values.shrink_to_fit();
      changes_.emplace(t->name, std::move(c));
    }
    durability::check_fits(baseline_, changes_);  // O(changes): a projection's bug is named, never sent
    frozen_ = true;
    return durability::changed_elements(changes_);
  }
  /// Same, from a trainer that hands over canonical bits (each owned tensor read and diffed).
  std::uint64_t freeze(const tensor_source& src) { return freeze(changes_of(src)); }
  /// The frozen change set against B^v: positions and absolute new bits of every element whose
  /// stored bits differ (what a durability::DeltaBaselineStore persists for the transition).
  /// @pre frozen()
  const durability::change_set& changes() const noexcept { return changes_; }
  bool frozen() const noexcept { return frozen_; }
  /// The frozen target bits of a tensor this owner owns, as B^v plus its changes (for expected
  /// attestation digests and the frozen identity, computed without a dense copy). @pre frozen()
  codec::patched_bytes frozen_patch(const std::string& t) const {
    codec::patched_bytes p{baseline_.at(t), {}, {}};
    if (auto it = changes_.find(t); it != changes_.end()) p.positions = it->second.positions, p.values = it->second.values;
    return p;
  }
  std::span<const std::byte> baseline_bytes(const std::string& t) const { return baseline_.at(t); }

  /// Encodes chunk `seq` of the frozen change set against B^v into `out`, from the known changes
  /// of its ranges (codec::chunk_encoder::encode_known).
  template <class Encoder>
  codec::encode_stats encode(std::uint32_t seq, const codec::frame_header& h, Encoder& enc, codec::byte_buffer& out) const {
    if (!frozen()) throw error(errc::protocol, "encode before the change set was frozen", {.file = {}, .tensor = {}, .field = "owner"});
    std::vector<codec::known_changes_piece> pieces;
    for (const codec::chunk_piece& p : pieces_of(seq)) {
      codec::known_changes_piece k{.tensor = p.tensor, .type = p.type, .tensor_elements = p.tensor_elements, .begin = p.begin, .end = p.end,
                                   .old_bytes = range_bytes(p), .positions = {}, .new_values = {}};
      if (auto it = changes_.find(p.tensor); it != changes_.end()) {
        const auto& pos = it->second.positions;
        const auto lo = std::lower_bound(pos.begin(), pos.end(), p.begin);
        const auto hi = std::lower_bound(lo, pos.end(), p.end);
        const std::size_t first = static_cast<std::size_t>(lo - pos.begin()), n = static_cast<std::size_t>(hi - lo);
        k.positions = std::span<const std::uint64_t>(pos).subspan(first, n);
        k.new_values = std::span<const std::byte>(it->second.values).subspan(first * it->second.element_size, n * it->second.element_size);
      }
      pieces.push_back(k);
    }
    codec::encode_stats st;
    enc.encode_known(h, pieces, out, &st);
    return st;
  }

  /// Encodes chunk `seq` of B^v as a dense frame.
  template <class Encoder>
  codec::encode_stats encode_dense(std::uint32_t seq, const codec::frame_header& h, Encoder& enc, codec::byte_buffer& out) const {
    std::vector<codec::chunk_piece> pieces = pieces_of(seq);
    for (auto& p : pieces) p.new_bytes = range_bytes(p);
    codec::encode_stats st;
    enc.encode_dense(h, pieces, out, &st);
    return st;
  }

  /// B := frozen, the change set applied to B^v in place; a no-op when nothing is frozen
  /// (idempotent: a second announcement changes nothing).
  void advance() {
    if (!frozen_) return;
    durability::apply_changes(baseline_, changes_);
    thaw();
  }
  /// Drops the frozen change set (transition aborted or cleaned up without commit).
  void thaw() {
    changes_.clear();
    frozen_ = false;
  }

 private:
  bool fits(const durability::baseline_image& img) const {
    for (auto* t : owned_) {
      auto it = img.find(t->name);
      if (it == img.end() || it->second.size() != t->bytes()) return false;
    }
    return true;
  }

  std::span<const std::byte> range_bytes(const codec::chunk_piece& p) const {
    const std::size_t E = element_size(p.type);
    return std::span<const std::byte>(baseline_.at(std::string(p.tensor))).subspan(p.begin * E, (p.end - p.begin) * E);
  }

  std::vector<codec::chunk_piece> pieces_of(std::uint32_t seq) const {
    if (seq >= plan_.size())
      throw error(errc::invalid_argument, "chunk " + std::to_string(seq) + " past the plan's " + std::to_string(plan_.size()),
                  {.file = {}, .tensor = {}, .field = "seq"});
    std::vector<codec::chunk_piece> pieces;
    for (const auto& r : plan_[seq]) {
      const tensor_info& t = manifest_.at(r.tensor);
      pieces.push_back({.tensor = t.name, .type = t.type, .tensor_elements = t.elements(), .begin = r.begin, .end = r.end,
                        .old_bytes = {}, .new_bytes = {}});
    }
    return pieces;
  }

  model_manifest manifest_;
  std::uint32_t index_, owners_;
  std::uint64_t max_frame_bytes_;
  std::vector<const tensor_info*> owned_;  // points into manifest_ (stable: never resized)
  std::vector<std::vector<canonical_range>> plan_;
  std::vector<bool> chunk_xor_;
  durability::baseline_image baseline_;  // B^v of the owned tensors only
  durability::change_set changes_;       // the frozen target against baseline_ (set by freeze / load_frozen)
  bool frozen_ = false;
};

}  // namespace bitrefit::refit
