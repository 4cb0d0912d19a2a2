// bitrefit/protocol/owner.hpp — the owner state machine (one trainer rank's share of the elements).
//
// An owner freezes the transition's change set (positions and absolute new values against its
// baseline B^v = K.v) at the first prepare of a transition and keeps it until the transition ends;
// every attempt encodes from it (XOR masks against B^v, or absolute values for overwrite). It
// advances B only when it reads the new commit record (announcement, or the next prepare's base),
// idempotently, after a coordinator failover too.
//
// Events (owner_event):  message_event (prepare / obsolete / announce), chunk_encoded_event,
//                        encode_finished_event
// Actions (owner_action), in list order:
//   advance_baseline_action   make B = the frozen target bits, durably recorded as K, BEFORE using it
//                             as a delta base (and release the frozen change set)
//   freeze_change_set_action  compute and keep positions + absolute values of target vs B, BEFORE
//                             encoding anything of the transition
//   encode_action             encode the frozen set for τ in `mode`; report each chunk, in seq order,
//                             as chunk_encoded_event (with the frame's own mode), then
//                             encode_finished_event
//   cancel_encoding_action    τ is obsolete: stop encoding and sending its chunks
//   send_action               payloads to the members, the manifest to the coordinator
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "bitrefit/protocol/messages.hpp"

namespace bitrefit::protocol {

struct chunk_encoded_event {
  attempt_id attempt{};
  std::uint32_t seq = 0;
  digest128 content{};  // digest of the encoded frame
  /// The frame's own mode: xor_mask iff any item is XOR. In an XOR attempt an encoder may code a
  /// whole chunk as overwrite (smaller, or a tensor some receiver places non-bit-preservingly);
  /// that payload is then an overwrite payload, valid on any base. Never XOR in an overwrite attempt.
  protocol::mode mode = mode::overwrite;
  friend auto operator<=>(const chunk_encoded_event&, const chunk_encoded_event&) = default;
};
struct encode_finished_event {
  attempt_id attempt{};
  std::uint32_t chunks = 0;
  friend auto operator<=>(const encode_finished_event&, const encode_finished_event&) = default;
};
using owner_event = std::variant<message_event, chunk_encoded_event, encode_finished_event>;

struct advance_baseline_action {
  commit_record record{};
  friend auto operator<=>(const advance_baseline_action&, const advance_baseline_action&) = default;
};
struct freeze_change_set_action {
  version_t base = 0;
  version_t target = 0;
  digest128 identity{};  // the bits to freeze, as the prepare record names them ({}: not recorded)
  friend auto operator<=>(const freeze_change_set_action&, const freeze_change_set_action&) = default;
};
struct encode_action {
  attempt_id attempt{};
  protocol::mode mode = mode::overwrite;
  version_t base = 0;
  version_t target = 0;
  friend auto operator<=>(const encode_action&, const encode_action&) = default;
};
struct cancel_encoding_action {
  attempt_id attempt{};
  friend auto operator<=>(const cancel_encoding_action&, const cancel_encoding_action&) = default;
};
using owner_action =
    std::variant<send_action, advance_baseline_action, freeze_change_set_action, encode_action, cancel_encoding_action>;

template <MutationPolicy Mut = no_mutation>
struct basic_owner {
  std::uint32_t id = 0;
  [[no_unique_address]] Mut mutation{};  // test policy (mutation.hpp); nothing in the shipped one
  commit_record baseline{};                // B^v with its commit record
  std::optional<version_t> frozen_target;  // the transition's frozen change set, if any (durable)
  digest128 frozen_id{};                   // ... the identity of its bits (prepare_record::frozen)
  attempt_id frozen_at{};                  // ... the attempt that froze it: older prepares are stale
  attempt_id highest_seen{};
  /// The epoch of the sender process this owner belongs to (0: the first deployment's). A prepare of
  /// an older epoch comes from a sender process that is gone, and names the bits of a trainer that
  /// has moved on since (finding H1): never freeze or encode for it. Unlike highest_seen this
  /// survives an owner crash: it is what the sender process (re)started the owner with.
  std::uint64_t sender_epoch = 0;
  // The attempt being encoded/sent.
  std::optional<prepare_record> active;
  bool finished = false;  // encode_finished reported for `active`

  basic_owner() = default;
  basic_owner(std::uint32_t id_, commit_record baseline_, Mut m = {}) : id(id_), mutation(m), baseline(baseline_) {}
  friend auto operator<=>(const basic_owner&, const basic_owner&) = default;

  /// The owner process restarted: only what it made durable survives, its baseline B^v with its
  /// commit record (advance_baseline_action) and the frozen change set of the transition in progress
  /// (freeze_change_set_action). The attempt it was encoding is gone, and so is highest_seen: a
  /// late copy of an old prepare may make it encode a dead attempt again, which receivers and the
  /// coordinator ignore. The next prepare (a retry after the coordinator's deadline) encodes from
  /// the recovered frozen set.
  static basic_owner recovered(const basic_owner& before_crash) {
    basic_owner o(before_crash.id, before_crash.baseline, before_crash.mutation);
    o.frozen_target = before_crash.frozen_target;
    o.frozen_id = before_crash.frozen_id;
    o.frozen_at = before_crash.frozen_at;
    if (!broken(o.mutation, protocol_mutation::owner_forgets_sender_epoch)) o.sender_epoch = before_crash.sender_epoch;
    return o;
  }

  /// What an owner's durable baseline store holds of a frozen change set.
  struct durable_frozen {
    version_t target = 0;
    digest128 identity{};
    attempt_id frozen_at{};
  };

  /// The whole sender process (coordinator and owners) restarted: the owner comes back from its
  /// baseline store alone — B^v with its commit record and, if the store still holds one, the
  /// frozen change set with its identity (whatever the store has: present, lost or replaced; a
  /// retry finds out whether it is the one the prepare record names). `newest_prepared` is the
  /// log's prepare record at restart: every prepare sent so far was persisted first, so none at or
  /// below it can be live any more (the new coordinator stops it and retries under a new id).
  /// `epoch` is the new sender process's coordinator epoch (sender_epoch).
  static basic_owner restarted(std::uint32_t id, commit_record baseline, std::optional<durable_frozen> frozen,
                               attempt_id newest_prepared, std::uint64_t epoch, Mut m = {}) {
    basic_owner o(id, baseline, m);
    if (frozen) {
      o.frozen_target = frozen->target;
      o.frozen_id = frozen->identity;
      o.frozen_at = frozen->frozen_at;
    }
    o.highest_seen = newest_prepared;
    o.sender_epoch = epoch;
    return o;
  }

  std::vector<owner_action> step(const owner_event& ev) {
    std::vector<owner_action> out;
    std::visit([&](const auto& e) { on(e, out); }, ev);
    return out;
  }

 private:
  using out_t = std::vector<owner_action>;

  void advance_to(const commit_record& k, out_t& out) {
    // Idempotent: only the frozen target's commit moves B, and only forward.
    if (frozen_target && k.version == *frozen_target) {
      baseline = k;
      frozen_target.reset();
      frozen_id = {};
      frozen_at = {};
      out.push_back(advance_baseline_action{k});
    } else if (k.version == baseline.version && k.baseline != baseline.baseline && !frozen_target) {
      baseline = k;  // same bits, the committed id (after the broken early advance)
    }
  }

  void on(const message_event& e, out_t& out) {
    std::visit([&](const auto& m) { on_msg(m, out); }, e.env.msg);
  }
  template <class M>
  void on_msg(const M&, out_t&) {}

  void on_msg(const announce_msg& m, out_t& out) {
    advance_to(m.record, out);
    out.push_back(send_action{envelope{endpoint::owner_(id), endpoint::coord(), baseline_msg{id, baseline}}});
  }

  void on_msg(const prepare_msg& m, out_t& out) {
    const prepare_record& p = m.record;
    if (p.attempt <= highest_seen) return;  // stale or duplicate
    if (p.attempt.epoch < sender_epoch) return;  // from a sender process that is gone (H1)
    highest_seen = p.attempt;
    advance_to(p.base, out);  // a prepare's base is a commit record too (missed announcement)
    // A prepare whose target is not above B is stale, however new its attempt id looks: after a
    // crash highest_seen is gone, so a late copy of an already committed attempt can get here.
    // Freezing it would take "v+1" from the trainer's current bits and, at the next advance,
    // overwrite K.v's durable image with them (finding B3).
    if (p.target <= baseline.version && !broken(mutation, protocol_mutation::freeze_stale_prepare)) return;
    if (frozen_target && p.attempt < frozen_at) return;  // older than the attempt that froze its set
    const digest128 want = id < p.frozen.size() ? p.frozen[id] : digest128{};
    const bool holds = frozen_target && *frozen_target == p.target && frozen_id == want;
    if (active) {
      out.push_back(cancel_encoding_action{active->attempt});
      active.reset();
    }
    if (!holds) {
      if (p.retry && !broken(mutation, protocol_mutation::refreeze_at_restart)) {
        // Receivers may hold a mix of K.v and the admitted attempts' bits: only that very change
        // set can finish the transition (overwrite makes every changed position exactly v+1), and
        // this owner no longer has it. Freezing the trainer's current bits instead would commit
        // bits equal to neither version where the two change sets differ (finding B1).
        out.push_back(send_action{envelope{endpoint::owner_(id), endpoint::coord(), frozen_lost_msg{p.attempt, id, p.target}}});
        return;
      }
      // The transition's first attempt (or a new transition after an abort): freeze the bits the
      // prepare names, durably, before anything is encoded.
      frozen_target = p.target;
      frozen_id = want;
      frozen_at = p.attempt;
      out.push_back(freeze_change_set_action{baseline.version, p.target, want});
    }
    active = p;
    finished = false;
    out.push_back(encode_action{p.attempt, p.mode, baseline.version, p.target});
  }

  void on_msg(const obsolete_msg& m, out_t& out) {
    highest_seen = std::max(highest_seen, m.attempt);
    if (active && active->attempt <= m.attempt) {
      if (!finished) out.push_back(cancel_encoding_action{active->attempt});
      active.reset();
    }
  }

  void on(const chunk_encoded_event& e, out_t& out) {
    if (!active || active->attempt != e.attempt || finished) return;
    payload_msg p{payload_id{e.attempt, id, e.seq}, baseline.version, active->target, e.mode, e.content};
    for (const auto& m : active->members)
      out.push_back(send_action{envelope{endpoint::owner_(id), endpoint::receiver_(m.receiver), p}});
  }

  void on(const encode_finished_event& e, out_t& out) {
    if (!active || active->attempt != e.attempt || finished) return;
    finished = true;
    out.push_back(send_action{envelope{endpoint::owner_(id), endpoint::coord(), manifest_msg{e.attempt, id, e.chunks}}});
    if (broken(mutation, protocol_mutation::delta_against_uncommitted_base) && frozen_target) {
      // Broken on purpose: treats what it sent as committed.
      commit_record k{active->target, active->next};
      baseline = k;
      frozen_target.reset();
      frozen_id = {};
      frozen_at = {};
      out.push_back(advance_baseline_action{k});
    }
  }
};

using owner = basic_owner<>;

/// The dense-restore rule (a restarted receiver restores K.v from the owners' baselines): serve K
/// only while EVERY owner's baseline is exactly K. Between a commit and an owner's advance its B is
/// still the previous version; serving those bits under K's name would hand a receiver the record
/// K with other bits (a later XOR on it would produce garbage). The model world restores an oracle
/// K.v; this rule is what makes the engine's restore equal to it, and bitrefit-check-trace checks
/// it on every recorded run (README, "Limits").
inline bool serves_dense_restore(const commit_record& k, const std::vector<commit_record>& owner_baselines) {
  return !owner_baselines.empty() &&
         std::all_of(owner_baselines.begin(), owner_baselines.end(), [&](const commit_record& b) { return b == k; });
}

BITREFIT_FIELDS(chunk_encoded_event, attempt, seq, content, mode)
BITREFIT_FIELDS(encode_finished_event, attempt, chunks)
BITREFIT_FIELDS(advance_baseline_action, record)
BITREFIT_FIELDS(freeze_change_set_action, base, target, identity)
BITREFIT_FIELDS(encode_action, attempt, mode, base, target)
BITREFIT_FIELDS(cancel_encoding_action, attempt)
BITREFIT_FIELDS_T(template <class M>, basic_owner<M>, id, mutation, baseline, frozen_target, frozen_id, frozen_at, highest_seen,
                  sender_epoch, active, finished)

}  // namespace bitrefit::protocol

template <class M>
struct std::hash<bitrefit::protocol::basic_owner<M>> {
  std::size_t operator()(const bitrefit::protocol::basic_owner<M>& o) const { return bitrefit::protocol::hash_of(o); }
};
