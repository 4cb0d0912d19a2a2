// bitrefit/refit/owner_shard.hpp — an owner's bits: the committed baseline B^v of the canonical
// tensors it owns, the frozen change set of the transition in progress, and chunk encoding.
//
// Ownership: each canonical tensor has exactly one owner, chosen by a stable hash of its name
// (layout::stable_owner), fixed across attempts and restarts, so data-parallel replicas never send
// the same element twice. The protocol's owner state machine decides WHEN things happen; this class
// only does them:
//   freeze(source)     copies the trainer's exported v+1 bits of owned tensors (the trainer may
//                      keep training; the transition sends exactly these bits until cleanup).
//   encode(seq, ...)   chunk seq of the deterministic plan, as a delta frame against B^v: XOR or
//                      overwrite per item (xor_allowed) or overwrite only (retries). The same chunk
//                      under the same payload id always yields the same bytes.
// Per-tensor modes: tensors that some receiver does not place bit-preservingly (placement.hpp)
// are planned into chunks of their own, after the others, and chunk_allows_xor(seq) is false for
// them: the sender encodes those chunks overwrite-only in every attempt, so one frame never mixes
// the two classes and no codec change was needed.
//   advance()          B := frozen (idempotent); called when the owner reads K = (v+1, g').
//   encode_dense(seq)  chunk seq of B^v as a dense frame (restoring a restarted receiver).
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

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
  void load_baseline(const tensor_source& src) {
    for (auto* t : owned_) src(*t, baseline_[t->name]);
    frozen_.clear();
    changes_.clear();
  }
  /// Sets B^v from a durable image; false when the image does not match the owned tensors.
  bool load_baseline(const durability::baseline_image& img) {
    for (auto* t : owned_) {
      auto it = img.find(t->name);
      if (it == img.end() || it->second.size() != t->bytes()) return false;
    }
    for (auto* t : owned_) baseline_[t->name] = img.at(t->name);
    frozen_.clear();
    changes_.clear();
    return true;
  }
  /// B^v or the frozen target as a baseline image, without copying (owner_shard keeps exactly the
  /// owned tensors, by name, in that very form).
  const durability::baseline_image& image(bool frozen) const noexcept { return frozen ? frozen_ : baseline_; }
  /// Sets the frozen target from a durable image (a restarted owner); false when it does not match.
  bool load_frozen(const durability::baseline_image& img) {
    for (auto* t : owned_) {
      auto it = img.find(t->name);
      if (it == img.end() || it->second.size() != t->bytes()) return false;
    }
    for (auto* t : owned_) frozen_[t->name] = img.at(t->name);
    changes_ = durability::diff_images(baseline_, frozen_, [this](const std::string& n) { return element_size(manifest_.at(n).type); });
    return true;
  }
  durability::baseline_image baseline_image_of(bool frozen) const {
    durability::baseline_image img;
    for (auto* t : owned_) img[t->name] = (frozen ? frozen_ : baseline_).at(t->name);
    return img;
  }

  /// Freezes the transition's target bits. @pre no transition is frozen (or it is being replaced
  /// by the same target after an owner restart).
  /// Returns how many elements differ bitwise from B^v (the change set's size). The comparison
  /// that counts them also records them (changes()), so persisting the change set costs no
  /// second pass over the model.
  std::uint64_t freeze(const tensor_source& src) {
    changes_.clear();
    for (auto* t : owned_) {
      auto& buf = frozen_[t->name];
      buf.resize(t->bytes());
      src(*t, buf);
      durability::tensor_changes c;
      c.element_size = static_cast<std::uint32_t>(element_size(t->type));
      c.elements = t->elements();
      durability::diff_tensor(baseline_.at(t->name), buf, c.element_size, c);
      if (!c.positions.empty()) changes_.emplace(t->name, std::move(c));
    }
    return durability::changed_elements(changes_);
  }
  /// The frozen change set against B^v: positions and absolute new bits of every element whose
  /// stored bits differ (what a durability::DeltaBaselineStore persists for the transition).
  /// @pre frozen()
  const durability::change_set& changes() const noexcept { return changes_; }
  bool frozen() const noexcept { return !frozen_.empty(); }
  /// The frozen target bits of a tensor this owner owns (for expected attestation digests).
  std::span<const std::byte> frozen_bytes(const std::string& t) const { return frozen_.at(t); }
  std::span<const std::byte> baseline_bytes(const std::string& t) const { return baseline_.at(t); }

  /// Encodes chunk `seq` of the frozen change set against B^v into `out`.
  template <class Encoder>
  codec::encode_stats encode(std::uint32_t seq, const codec::frame_header& h, Encoder& enc, codec::byte_buffer& out) const {
    if (!frozen()) throw error(errc::protocol, "encode before the change set was frozen", {.file = {}, .tensor = {}, .field = "owner"});
    std::vector<codec::chunk_piece> pieces = pieces_of(seq, /*with_old=*/true);
    codec::encode_stats st;
    enc.encode(h, pieces, out, &st);
    return st;
  }

  /// Encodes chunk `seq` of B^v as a dense frame.
  template <class Encoder>
  codec::encode_stats encode_dense(std::uint32_t seq, const codec::frame_header& h, Encoder& enc, codec::byte_buffer& out) const {
    std::vector<codec::chunk_piece> pieces = pieces_of(seq, /*with_old=*/false);
    for (auto& p : pieces) p.new_bytes = range_bytes(baseline_, p);
    codec::encode_stats st;
    enc.encode_dense(h, pieces, out, &st);
    return st;
  }

  /// B := frozen; a no-op when nothing is frozen (idempotent: a second announcement changes nothing).
  void advance() {
    if (frozen_.empty()) return;
    for (auto& [name, bits] : frozen_) baseline_[name].swap(bits);
    frozen_.clear();
    changes_.clear();
  }
  /// Drops the frozen change set (transition aborted or cleaned up without commit).
  void thaw() {
    frozen_.clear();
    changes_.clear();
  }

 private:
  std::span<const std::byte> range_bytes(const std::map<std::string, std::vector<std::byte>>& m,
                                         const codec::chunk_piece& p) const {
    const std::size_t E = element_size(p.type);
    return std::span<const std::byte>(m.at(std::string(p.tensor))).subspan(p.begin * E, (p.end - p.begin) * E);
  }

  std::vector<codec::chunk_piece> pieces_of(std::uint32_t seq, bool with_old) const {
    if (seq >= plan_.size())
      throw error(errc::invalid_argument, "chunk " + std::to_string(seq) + " past the plan's " + std::to_string(plan_.size()),
                  {.file = {}, .tensor = {}, .field = "seq"});
    std::vector<codec::chunk_piece> pieces;
    for (const auto& r : plan_[seq]) {
      const tensor_info& t = manifest_.at(r.tensor);
      codec::chunk_piece p{.tensor = t.name, .type = t.type, .tensor_elements = t.elements(), .begin = r.begin, .end = r.end,
                           .old_bytes = {}, .new_bytes = {}};
      if (with_old) {
        p.old_bytes = range_bytes(baseline_, p);
        p.new_bytes = range_bytes(frozen_, p);
      }
      pieces.push_back(p);
    }
    return pieces;
  }

  model_manifest manifest_;
  std::uint32_t index_, owners_;
  std::uint64_t max_frame_bytes_;
  std::vector<const tensor_info*> owned_;  // points into manifest_ (stable: never resized)
  std::vector<std::vector<canonical_range>> plan_;
  std::vector<bool> chunk_xor_;
  durability::baseline_image baseline_, frozen_;  // owned tensors only
  durability::change_set changes_;                // frozen_ against baseline_ (set by freeze / load_frozen)
};

}  // namespace bitrefit::refit
