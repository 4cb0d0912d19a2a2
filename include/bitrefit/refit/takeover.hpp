// bitrefit/refit/takeover.hpp — what a restarted sender reads back to take over a transition that
// its predecessor admitted but did not commit (finding B1, DESIGN op 7).
//
// The prepare record names, per owner, the identity of the frozen change set its attempts deliver
// (prepare_record::frozen, from begin_transition_event::frozen). A restarted sender rebuilds each
// owner from its durable baseline store alone (protocol::owner::restarted): B^{K.v}, and the frozen
// image of the transition in flight if the store still holds one, with the identity of the bits it
// holds. The owner's machine then decides: the same identity -> the retry encodes exactly those
// bits (overwrite); lost or replaced -> frozen_lost_msg, and the coordinator ends the transition by
// abort. Never the trainer's current bits for a version an attempt already admitted: receivers may
// hold a mix of K.v and the admitted bits, and other bits for v+1 would commit a mix equal to
// neither version (silently, when attestation is off).
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "bitrefit/codec/hash.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/refit/owner_shard.hpp"

namespace bitrefit::refit {

/// Identity of an owner's frozen target: XXH3-128 over the owner index and every owned tensor's
/// name, size and frozen bytes, in manifest order. Two frozen sets of one version have the same
/// identity iff they hold the same bits (up to hash collisions). Never digest128{} in practice,
/// which the protocol reads as "not recorded".
/// The frozen bytes are B^v + the change set (owner_shard::frozen_patch), streamed into the hash a
/// block at a time: a block without changes straight from B^v, one with changes from a patched
/// copy of it (scratch of one block, never the tensor).
inline digest128 frozen_identity(const owner_shard& shard) {
  constexpr std::size_t block_bytes = std::size_t{64} << 10;
  codec::xxh3_128_stream h;
  h.update_u64(shard.index());
  std::vector<std::byte> block;
  for (const tensor_info* t : shard.owned()) {
    const codec::patched_bytes bits = shard.frozen_patch(t->name);
    const std::size_t E = element_size(t->type);
    h.update_string(t->name);
    h.update_u64(bits.base.size());
    std::size_t k = 0;  // next change
    for (std::size_t off = 0; off < bits.base.size(); off += block_bytes) {
      const std::size_t len = std::min(block_bytes, bits.base.size() - off);
      const std::span<const std::byte> src = bits.base.subspan(off, len);
      if (k == bits.positions.size() || bits.positions[k] * E >= off + len) {
        h.update(src);
        continue;
      }
      block.assign(src.begin(), src.end());
      for (; k < bits.positions.size() && bits.positions[k] * E < off + len; ++k)
        std::memcpy(block.data() + (bits.positions[k] * E - off), bits.values.data() + k * E, E);
      h.update(block);
    }
  }
  return h.digest();
}

/// Loads the frozen target of `target` (a transition from `base`, whose image `shard` already
/// holds as B^v) from the owner's store: from the stored change set itself where the store keeps
/// one (durability::ChangeSetStore, law 6: memory O(changes)), else from the target's image (a
/// transient full copy). False when the store holds no usable image of the target.
template <durability::BaselineStore B>
bool load_frozen_target(B& store, owner_shard& shard, version_t base, version_t target) {
  if constexpr (durability::ChangeSetStore<B>) {
    if (auto cs = store.load_changes(base, target); cs && shard.load_frozen(std::move(*cs))) return true;
  }
  const auto img = store.load(target);
  return img && shard.load_frozen(*img);
}

/// The frozen target a restarted owner finds in its baseline store for the transition the log's
/// prepare record says was in flight (not aborted, K.v -> K.v+1), loaded into `shard` (whose
/// baseline must already be B^{K.v}). nullopt when there is no such transition or the store no
/// longer holds a usable image of its target. An image of the target with OTHER bits (replaced)
/// is returned with its own identity: the owner's machine compares it with the one the record
/// names. frozen_at is left empty: the restarted owner's highest_seen (the newest prepared
/// attempt) already makes every older prepare stale.
template <durability::BaselineStore B>
std::optional<protocol::owner::durable_frozen> recover_frozen(B& store, owner_shard& shard, const protocol::log_snapshot& snap) {
  const auto& p = snap.prepared;
  if (!p || p->aborted || p->base != snap.record || p->target != snap.record.version + 1) return std::nullopt;
  if (!load_frozen_target(store, shard, p->base.version, p->target)) return std::nullopt;
  return protocol::owner::durable_frozen{p->target, frozen_identity(shard), attempt_id{}};
}

}  // namespace bitrefit::refit
