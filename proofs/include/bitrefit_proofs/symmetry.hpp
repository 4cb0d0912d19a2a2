// bitrefit_proofs/symmetry.hpp — receivers are interchangeable: a permutation of receiver ids maps
// every state of the cluster world to an equivalent one, and the checker explores one state per
// class (symmetry reduction, proofs/README.md "Symmetry reduction").
//
// `permute_receivers(w, p)` renames receiver r to p[r] EVERYWHERE the world names a receiver, and
// re-sorts what is kept sorted, so the result is exactly the world the renamed cluster would be in:
//   - per-receiver vectors of the world (receivers, incarnations, regions, device queues, sync and
//     deadline flags) and of the coordinator (roster, expected attestations): permuted;
//   - a receiver machine's own id; every `member` (prepare records' member lists, the coordinator's
//     attempt, acks, fences, monitor notes, announce/ack/arrived/stopped/failed/join messages);
//     every receiver `endpoint` of an envelope in flight;
//   - attestation digests, which name their receiver ({x, r+1}: cluster.hpp, attestation_of) in
//     ack messages, prepare records' and the coordinator's `expected`;
//   - re-sorted: prepare records' members (with the coordinator's per-member arrived/acked/stopped
//     flags moved along), the in-flight multiset, the log queue, monitor lists.
// Left alone: `violation` (a string naming receivers; a world holding one is never expanded, and
// two such worlds merging or not changes no verdict).
//
// Owners are NOT permuted: in this world they are not interchangeable as values (each owner's
// payloads write its own regions, the frozen identities and payload contents embed the owner
// index, and a receiver's mixed-content attestation hashes its regions in owner order), so an owner
// permutation would not commute with the moves.
//
// Every struct whose fields this walks is pinned by a static_assert on its field count (the
// BITREFIT_FIELDS list, which cannot leave a field out): a new field fails to compile here until
// someone decides whether it names a receiver. tests: proofs/test_checker.cpp "Symmetry.*" check
// that the permutation commutes with every move on every reachable state of small worlds.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "bitrefit/protocol/model/cluster.hpp"

namespace bitrefit::proofs {

namespace symmetry_detail {
template <class T>
constexpr std::size_t field_count = std::tuple_size_v<decltype(fields_of(std::declval<const T&>()))>;

using perm = std::vector<std::uint32_t>;

inline void rename(const perm& p, protocol::member& m) { m.receiver = p.at(m.receiver); }
inline void rename(const perm& p, protocol::endpoint& e) {
  if (e.role == protocol::role::receiver) e.index = p.at(e.index);
}
/// An attestation digest {x, r+1} (model::basic_cluster::attestation_of) names receiver r.
inline void rename_attestation(const perm& p, digest128& d) {
  if (d.high64 >= 1 && d.high64 <= p.size()) d.high64 = p[d.high64 - 1] + 1;
}
/// Moves block r of `size` elements to block p[r], in place (cycle by cycle: no allocation, this
/// runs for every successor the checker generates).
template <class It>
void permute_blocks(const perm& p, It first, std::size_t size) {
  std::uint32_t done = 0;  // bit r: block r is in its place
  for (std::uint32_t start = 0; start < p.size(); ++start) {
    if (done >> start & 1u) continue;
    // Follow the cycle start -> p[start] -> ...: swapping block `start` with block p[c] moves the
    // element that belongs at p[c] there and brings the next one of the cycle to `start`.
    for (std::uint32_t c = p[start]; c != start; c = p[c]) {
      std::swap_ranges(first + std::ptrdiff_t(start * size), first + std::ptrdiff_t((start + 1) * size),
                       first + std::ptrdiff_t(c * size));
      done |= 1u << c;
    }
    done |= 1u << start;
  }
}
/// out[p[r]] = in[r], with `f` applied to each element.
template <class T, class F>
void permute_vector(const perm& p, std::vector<T>& v, F f) {
  if (v.empty()) return;
  for (auto& x : v) f(x);
  permute_blocks(p, v.begin(), 1);
}
template <class T>
void permute_vector(const perm& p, std::vector<T>& v) {
  permute_vector(p, v, [](T&) {});
}
template <class T>
void sort_all(std::vector<T>& v) {
  std::sort(v.begin(), v.end());
}

static_assert(field_count<protocol::prepare_record> == 11);
/// Members renamed and re-sorted (they are kept sorted by receiver); `order` receives, for each
/// new position, the old position (so per-member arrays can follow).
inline void rename(const perm& p, protocol::prepare_record& r, std::vector<std::size_t>* order = nullptr) {
  for (auto& m : r.members) rename(p, m);
  if (order) {
    order->resize(r.members.size());
    std::iota(order->begin(), order->end(), std::size_t{0});
    std::sort(order->begin(), order->end(), [&](std::size_t a, std::size_t b) { return r.members[a] < r.members[b]; });
  }
  std::sort(r.members.begin(), r.members.end());
  if (r.expected.size() == p.size()) permute_vector(p, r.expected, [&](digest128& d) { rename_attestation(p, d); });
}

static_assert(std::variant_size_v<protocol::message> == 16);
inline void rename(const perm& p, protocol::message& msg) {
  std::visit(
      [&](auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, protocol::prepare_msg>) rename(p, x.record);
        else if constexpr (std::is_same_v<T, protocol::announce_msg>) { if (x.roster) rename(p, *x.roster); }
        else if constexpr (std::is_same_v<T, protocol::ack_msg>) {
          rename(p, x.from);
          if (x.attestation) rename_attestation(p, *x.attestation);
        } else if constexpr (requires { x.from; }) rename(p, x.from);  // arrived, stopped, failed, join
        else {
          // obsolete, open, flush, roll_call, abort, manifest, baseline, frozen_lost, payload:
          // nothing names a receiver (the sets below are checked field by field).
          static_assert(std::is_same_v<T, protocol::obsolete_msg> || std::is_same_v<T, protocol::open_msg> ||
                        std::is_same_v<T, protocol::flush_msg> || std::is_same_v<T, protocol::roll_call_msg> ||
                        std::is_same_v<T, protocol::abort_msg> || std::is_same_v<T, protocol::manifest_msg> ||
                        std::is_same_v<T, protocol::baseline_msg> || std::is_same_v<T, protocol::frozen_lost_msg> ||
                        std::is_same_v<T, protocol::payload_msg>);
        }
      },
      msg);
}
static_assert(field_count<protocol::envelope> == 3);
inline void rename(const perm& p, protocol::envelope& e) {
  rename(p, e.from);
  rename(p, e.to);
  rename(p, e.msg);
}
static_assert(std::variant_size_v<protocol::log_request> == 4);
inline void rename(const perm& p, protocol::log_request& r) {
  if (auto* pp = std::get_if<protocol::persist_prepare_request>(&r)) rename(p, pp->record);
}

template <class M>
void rename(const perm& p, protocol::basic_coordinator<M>& c) {
  static_assert(field_count<protocol::basic_coordinator<M>> == 21);
  permute_vector(p, c.roster);
  if (c.expected.size() == p.size()) permute_vector(p, c.expected, [&](digest128& d) { rename_attestation(p, d); });
  if (c.attempt) {
    static thread_local std::vector<std::size_t> order;  // one per checker thread: no allocation per call
    rename(p, *c.attempt, &order);
    for (auto* flags : {&c.arrived, &c.acked, &c.stopped}) {
      if (flags->size() != order.size()) continue;  // not sized for this attempt (yet)
      std::uint8_t old[64];
      if (order.size() > sizeof old) throw std::length_error("permute_receivers: more than 64 members");
      std::copy(flags->begin(), flags->end(), old);
      for (std::size_t k = 0; k < order.size(); ++k) (*flags)[k] = old[order[k]];
    }
  }
}
template <class M>
void rename(const perm& p, protocol::basic_receiver<M>& r) {
  static_assert(field_count<protocol::basic_receiver<M>> == 17);
  r.id = p.at(r.id);
  if (r.deferred) rename(p, *r.deferred);
  // attempt (receiver_attempt), early (payloads, open, flush): attempt ids, owners and contents only.
}
template <class M>
void rename(const perm& p, protocol::basic_owner<M>& o) {
  static_assert(field_count<protocol::basic_owner<M>> == 10);  // sender_epoch: no receiver in it
  if (o.active) rename(p, *o.active);
}
}  // namespace symmetry_detail

/// Renames receiver r to p[r] everywhere in `w` (p: a permutation of 0..receivers-1).
template <class M>
void permute_receivers(protocol::model::basic_cluster<M>& w, const std::vector<std::uint32_t>& p) {
  using namespace symmetry_detail;
  static_assert(field_count<protocol::model::basic_cluster<M>> == 25);
  static_assert(field_count<protocol::log_snapshot> == 3);
  static_assert(field_count<protocol::model::attempt_note> == 3);
  const std::uint32_t n = w.config.protocol.receivers;
  // config, stores, trainer_flavor, truth, budget, max_epoch, stopped, aborts_durable, stuck:
  // no receiver in them. violation: left alone (see the header comment).
  if (w.log.state.prepared) rename(p, *w.log.state.prepared);
  rename(p, w.coord);
  for (auto& o : w.owners) rename(p, o);
  permute_vector(p, w.receivers, [&](auto& r) { if (r) rename(p, *r); });
  permute_vector(p, w.incarnations);
  if (w.regions.size() == std::size_t(n) * w.regions_per_receiver()) permute_blocks(p, w.regions.begin(), w.regions_per_receiver());
  permute_vector(p, w.device);  // pending writes name payloads and incarnations, not receivers
  permute_vector(p, w.sync_waiting);
  permute_vector(p, w.receiver_deadline);
  for (auto& e : w.inflight) rename(p, e);
  sort_all(w.inflight);
  for (auto& l : w.log_queue) rename(p, l.request);
  sort_all(w.log_queue);
  for (auto& a : w.attempts) {
    for (auto& m : a.members) rename(p, m);
    sort_all(a.members);
  }
  sort_all(w.attempts);
  for (auto& a : w.acks) rename(p, a.second);
  sort_all(w.acks);
  for (auto& f : w.fenced) rename(p, f);
  sort_all(w.fenced);
}

// ---- The fingerprint of a renamed world, without renaming it ------------------------------------
//
// The canonical fingerprint hashes the image of a world under the renaming that sorts its
// receivers; building that image (permute_receivers, above) for about every second successor cost
// a tenth of the checker's time, and most successors are thrown away once fingerprinted.
// `renamed_fingerprint(w, p)` walks w once and hashes what permute_receivers(w, p) would hold:
// every receiver id renamed on the fly, per-receiver vectors visited in their new order, and the
// containers permute_receivers re-sorts after renaming (in-flight messages, the log queue, the
// attempt notes, acks, fences, member lists) hashed as multisets (the sum of their elements'
// digests), so no sorting is needed. Those containers are kept sorted by the model, so their order
// is a function of their elements and a multiset hash loses nothing. The coordinator's per-member
// flags are hashed together with the member they belong to. Each receiver's own part of the world
// is hashed as its receiver_signature (computed anyway to choose the renamings) plus the fields the
// signature leaves out because they name receivers, so that part is walked once, not twice.
//
// It is a different function from protocol::hash_of (it is never compared with it), and
// test_proofs (`Symmetry.RenamingReceiversCommutesWithEveryMove`) checks
// renamed_fingerprint(w, p) == renamed_fingerprint(permute_receivers(w, p), identity) for every
// renaming of every reachable state of small worlds with every fault kind.
namespace symmetry_detail {
using protocol::detail::hasher;

struct renaming {
  const perm& p;
  std::uint32_t inv[8];  // inv[j]: the receiver renamed to j
  explicit renaming(const perm& p_) : p(p_) {
    if (p.size() > 8) throw std::length_error("renamed_fingerprint: more than 8 receivers");
    for (std::uint32_t r = 0; r < p.size(); ++r) inv[p[r]] = r;
  }
  std::uint32_t n() const noexcept { return std::uint32_t(p.size()); }
  std::uint32_t to(std::uint32_t r) const { return p.at(r); }
};

inline void hash_renamed(hasher& h, const renaming& q, const protocol::member& m) {
  h.mix(q.to(m.receiver));
  h.mix(m.incarnation);
}
inline void hash_renamed(hasher& h, const renaming& q, const protocol::endpoint& e) {
  h.mix(static_cast<std::uint64_t>(e.role));
  h.mix(e.role == protocol::role::receiver ? q.to(e.index) : e.index);
}
inline void hash_attestation(hasher& h, const renaming& q, const digest128& d) {  // {x, r+1}
  h.mix(d.low64);
  h.mix(d.high64 >= 1 && d.high64 <= q.n() ? q.p[d.high64 - 1] + 1 : d.high64);
}
/// A per-receiver vector (index = receiver id) in its renamed order: new position j holds the
/// element of receiver inv[j]. A vector of another size is hashed as it is.
template <class T, class F>
void hash_per_receiver(hasher& h, const renaming& q, const std::vector<T>& v, F elem) {
  h.mix(v.size());
  if (v.size() != q.n()) {
    for (const auto& x : v) elem(x);
    return;
  }
  for (std::uint32_t j = 0; j < q.n(); ++j) elem(v[q.inv[j]]);
}
/// A container kept sorted, whose order a renaming changes: the sum of its elements' digests.
template <class T, class F>
void hash_multiset(hasher& h, const std::vector<T>& v, F elem) {
  std::uint64_t sum = 0;
  for (const auto& x : v) {
    hasher e;
    elem(e, x);
    sum += e.digest();
  }
  h.mix(v.size());
  h.mix(sum);
}
inline void hash_members(hasher& h, const renaming& q, const std::vector<protocol::member>& ms) {
  hash_multiset(h, ms, [&](hasher& e, const protocol::member& m) { hash_renamed(e, q, m); });
}

static_assert(field_count<protocol::prepare_record> == 11);
inline void hash_renamed(hasher& h, const renaming& q, const protocol::prepare_record& r) {
  using protocol::detail::hash_all;
  hash_all(h, r.attempt, r.base, r.target, r.next, r.mode, r.xor_allowed);
  hash_members(h, q, r.members);
  if (r.expected.size() == q.n()) hash_per_receiver(h, q, r.expected, [&](const digest128& d) { hash_attestation(h, q, d); });
  else hash_all(h, r.expected);
  hash_all(h, r.frozen, r.retry, r.aborted);
}
static_assert(field_count<protocol::ack_msg> == 3);
inline void hash_renamed(hasher& h, const renaming& q, const protocol::ack_msg& a) {
  protocol::detail::hash_append(h, a.attempt);
  hash_renamed(h, q, a.from);
  h.mix(a.attestation.has_value());
  if (a.attestation) hash_attestation(h, q, *a.attestation);
}
static_assert(field_count<protocol::model::attempt_note> == 3);
inline void hash_renamed(hasher& h, const renaming& q, const protocol::model::attempt_note& a) {
  protocol::detail::hash_all(h, a.attempt, a.target);
  hash_members(h, q, a.members);
}
template <class M>
void hash_renamed(hasher& h, const renaming& q, const protocol::basic_coordinator<M>& c) {
  static_assert(field_count<protocol::basic_coordinator<M>> == 21);
  using protocol::detail::hash_all;
  hash_all(h, c.config, c.epoch, c.phase, c.counter, c.committed);
  hash_per_receiver(h, q, c.roster, [&](const auto& e) { hash_all(h, e); });
  hash_all(h, c.owner_at, c.target, c.xor_allowed);
  if (c.expected.size() == q.n()) hash_per_receiver(h, q, c.expected, [&](const digest128& d) { hash_attestation(h, q, d); });
  else hash_all(h, c.expected);
  hash_all(h, c.frozen, c.attempts, c.dirty);
  h.mix(c.attempt.has_value());
  if (c.attempt) hash_renamed(h, q, *c.attempt);
  hash_all(h, c.manifests);
  // Per-member flags, each with its member (permute_receivers moves them along when it re-sorts
  // the members); flags not sized for the attempt are hashed as they are, as they are not moved.
  for (const auto* flags : {&c.arrived, &c.acked, &c.stopped}) {
    if (c.attempt && flags->size() == c.attempt->members.size()) {
      std::uint64_t sum = 0;
      for (std::size_t k = 0; k < flags->size(); ++k) {
        hasher e;
        hash_renamed(e, q, c.attempt->members[k]);
        e.mix((*flags)[k]);
        sum += e.digest();
      }
      h.mix(flags->size());
      h.mix(sum);
    } else {
      hash_all(h, *flags);
    }
  }
  hash_all(h, c.then, c.lost_owner, c.mutation);
}
template <class M>
void hash_renamed(hasher& h, const renaming& q, const protocol::basic_owner<M>& o) {
  static_assert(field_count<protocol::basic_owner<M>> == 10);
  using protocol::detail::hash_all;
  hash_all(h, o.id, o.mutation, o.baseline, o.frozen_target, o.frozen_id, o.frozen_at, o.highest_seen, o.sender_epoch);
  h.mix(o.active.has_value());
  if (o.active) hash_renamed(h, q, *o.active);
  hash_all(h, o.finished);
}
inline void hash_renamed(hasher& h, const renaming& q, const protocol::message& msg) {
  h.mix(msg.index());
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        using protocol::detail::hash_all;
        if constexpr (std::is_same_v<T, protocol::prepare_msg>) hash_renamed(h, q, x.record);
        else if constexpr (std::is_same_v<T, protocol::announce_msg>) {
          static_assert(field_count<protocol::announce_msg> == 5);
          hash_all(h, x.record);
          h.mix(x.roster.has_value());
          if (x.roster) hash_renamed(h, q, *x.roster);
          hash_all(h, x.evicted);
          hash_all(h, x.confirm);
          hash_all(h, x.epoch);
        } else if constexpr (std::is_same_v<T, protocol::ack_msg>) hash_renamed(h, q, x);
        else if constexpr (std::is_same_v<T, protocol::arrived_msg> || std::is_same_v<T, protocol::stopped_msg>) {
          static_assert(field_count<T> == 2);
          hash_all(h, x.attempt);
          hash_renamed(h, q, x.from);
        } else if constexpr (std::is_same_v<T, protocol::failed_msg>) {
          static_assert(field_count<T> == 3);
          hash_all(h, x.attempt);
          hash_renamed(h, q, x.from);
          hash_all(h, x.reason);
        } else if constexpr (std::is_same_v<T, protocol::join_msg>) {
          static_assert(field_count<T> == 3);
          hash_renamed(h, q, x.from);
          hash_all(h, x.at);
          hash_all(h, x.epoch);
        } else {
          // the messages rename(p, message) leaves alone (checked there)
          hash_all(h, x);
        }
      },
      msg);
}
inline void hash_renamed(hasher& h, const renaming& q, const protocol::envelope& e) {
  hash_renamed(h, q, e.from);
  hash_renamed(h, q, e.to);
  hash_renamed(h, q, e.msg);
}
inline void hash_renamed(hasher& h, const renaming& q, const protocol::log_request& r) {
  h.mix(r.index());
  if (const auto* pp = std::get_if<protocol::persist_prepare_request>(&r)) {
    static_assert(field_count<protocol::persist_prepare_request> == 2);
    protocol::detail::hash_all(h, pp->epoch);
    hash_renamed(h, q, pp->record);
  } else {
    std::visit([&](const auto& x) { protocol::detail::hash_all(h, x); }, r);
  }
}
}  // namespace symmetry_detail

/// A fingerprint of receiver r's own state that names no receiver id: its machine without its id
/// and its deferred prepare's members and attestations (that prepare contributes its attempt), its
/// incarnation counter, regions, device queue, sync and deadline flags, roster entry. Renaming
/// receivers moves signatures with the receivers and changes none. Two uses: the canonical image
/// is looked for among the renamings that sort receivers by signature only, and
/// renamed_fingerprint hashes each receiver's part of the world as its signature (plus the
/// deferred prepare, renamed), so that part is walked once per successor, not twice.
template <class M>
[[gnu::flatten]] std::uint64_t receiver_signature(const protocol::model::basic_cluster<M>& w, std::uint32_t r) {
  static_assert(symmetry_detail::field_count<protocol::basic_receiver<M>> == 17);  // all but id and deferred's names
  using protocol::detail::hash_all;
  protocol::detail::hasher h;
  const auto& rc = w.receivers[r];
  h.mix(rc.has_value());
  if (rc) {
    hash_all(h, rc->incarnation, rc->gate, rc->attest, rc->mutation, rc->phase, rc->committed, rc->gate_open,
             rc->highest_seen, rc->epoch_seen, rc->attempt, rc->completed, rc->unsynced, rc->sync_pending,
             rc->stopping_for, rc->early);
    h.mix(rc->deferred.has_value());
    if (rc->deferred) hash_all(h, rc->deferred->attempt);
  }
  const std::size_t k = w.regions_per_receiver();
  for (std::size_t i = 0; i < k; ++i) h.mix(std::uint64_t(std::uint32_t(w.regions[r * k + i])));
  hash_all(h, w.incarnations[r], w.device[r], w.sync_waiting[r], w.receiver_deadline[r]);
  if (r < w.coord.roster.size()) hash_all(h, w.coord.roster[r]);
  return h.digest();
}

/// receiver_signature of every receiver, by receiver id (at most 8 receivers, as renaming allows).
template <class M>
std::array<std::uint64_t, 8> receiver_signatures(const protocol::model::basic_cluster<M>& w) {
  if (w.receivers.size() > 8) throw std::length_error("receiver_signatures: more than 8 receivers");
  std::array<std::uint64_t, 8> sig{};
  for (std::uint32_t r = 0; r < w.receivers.size(); ++r) sig[r] = receiver_signature(w, r);
  return sig;
}

// ---- Parts of the fingerprint, and what a successor takes over from its parent --------------
//
// A successor differs from its parent in little: one message delivered, one machine stepped. The
// fingerprint is therefore hashed in parts, each a digest of its own: the commit log, the
// coordinator, the owners, the monitors' attempt notes and acks, and each message in flight (the
// in-flight multiset is the sum of its messages' digests). The checker computes a parent's parts
// once per renaming it needs (cluster_world.hpp, canonicalize_successor) and a successor takes over
// every part that EQUALS the parent's (operator==, which compares every field the part hashes and
// more), and every message it holds an equal of in the parent's multiset (a merge of the two sorted
// multisets), hashing only the rest. Comparing equal values is a load and a compare per word;
// hashing them was about nine instructions per word. The fingerprint is the same function of the
// world whichever way the parts were obtained (test_proofs,
// `Symmetry.RenamingReceiversCommutesWithEveryMove`, compares the two on every successor).

/// The renamed parts of one world under one renaming (inflight: per message, in the world's order;
/// filled only where a successor may take them over).
struct fingerprint_parts {
  std::uint64_t log = 0, coord = 0, owners = 0, attempts = 0, acks = 0;
  std::vector<std::uint64_t> inflight;
};

/// Which parts of a world equal those of its parent; the same under every renaming.
struct shared_parts {
  bool log = false, coord = false, owners = false, attempts = false, acks = false;
  /// Per message in flight of the world: the index of an equal message of the parent (each used
  /// once), or -1.
  std::vector<std::int32_t> inflight;
};

namespace symmetry_detail {
template <class M>
void check_per_receiver_sizes(const protocol::model::basic_cluster<M>& w, std::size_t n) {
  if (w.receivers.size() != n || w.incarnations.size() != n || w.device.size() != n || w.sync_waiting.size() != n ||
      w.receiver_deadline.size() != n || w.regions.size() != n * w.regions_per_receiver())
    throw std::logic_error("renamed_fingerprint: a per-receiver vector of the world does not hold one entry per receiver");
}
template <class M>
std::uint64_t log_part(const protocol::model::basic_cluster<M>& w, const renaming& q) {
  using protocol::detail::hash_all;
  hasher h;
  hash_all(h, w.log.state.epoch, w.log.state.record);
  h.mix(w.log.state.prepared.has_value());
  if (w.log.state.prepared) hash_renamed(h, q, *w.log.state.prepared);
  hash_all(h, w.log.mutation);
  return h.digest();
}
template <class M>
std::uint64_t coord_part(const protocol::model::basic_cluster<M>& w, const renaming& q) {
  hasher h;
  hash_renamed(h, q, w.coord);
  return h.digest();
}
template <class M>
std::uint64_t owners_part(const protocol::model::basic_cluster<M>& w, const renaming& q) {
  hasher h;
  h.mix(w.owners.size());
  for (const auto& o : w.owners) hash_renamed(h, q, o);
  return h.digest();
}
template <class M>
std::uint64_t attempts_part(const protocol::model::basic_cluster<M>& w, const renaming& q) {
  hasher h;
  hash_multiset(h, w.attempts, [&](hasher& e, const protocol::model::attempt_note& x) { hash_renamed(e, q, x); });
  return h.digest();
}
template <class M>
std::uint64_t acks_part(const protocol::model::basic_cluster<M>& w, const renaming& q) {
  hasher h;
  hash_multiset(h, w.acks, [&](hasher& e, const std::pair<attempt_id, protocol::member>& x) {
    protocol::detail::hash_append(e, x.first);
    hash_renamed(e, q, x.second);
  });
  return h.digest();
}
inline std::uint64_t message_part(const protocol::envelope& x, const renaming& q) {
  hasher e;
  hash_renamed(e, q, x);
  return e.digest();
}

/// The parts of w under q, each taken from `parent` where `shared` says it equals the parent's
/// (both null: every part hashed). Returns the sum of the messages' digests; `keep_messages`:
/// each message's digest is kept in out.inflight too.
template <class M>
std::uint64_t parts_of(const protocol::model::basic_cluster<M>& w, const renaming& q, const shared_parts* shared,
                       const fingerprint_parts* parent, bool keep_messages, fingerprint_parts& out) {
  check_per_receiver_sizes(w, q.n());
  out.log = shared && shared->log ? parent->log : log_part(w, q);
  out.coord = shared && shared->coord ? parent->coord : coord_part(w, q);
  out.owners = shared && shared->owners ? parent->owners : owners_part(w, q);
  out.attempts = shared && shared->attempts ? parent->attempts : attempts_part(w, q);
  out.acks = shared && shared->acks ? parent->acks : acks_part(w, q);
  if (keep_messages) out.inflight.resize(w.inflight.size());
  std::uint64_t sum = 0;
  for (std::size_t j = 0; j < w.inflight.size(); ++j) {
    const std::int32_t i = shared ? shared->inflight[j] : -1;
    const std::uint64_t d = i >= 0 ? parent->inflight[std::size_t(i)] : message_part(w.inflight[j], q);
    if (keep_messages) out.inflight[j] = d;
    sum += d;
  }
  return sum;
}

/// The fingerprint from the parts (`inflight_sum`: the sum of the messages' digests) and the rest
/// of the world, hashed here: every receiver's own part (its machine, incarnation counter,
/// regions, device queue, sync and deadline flags), in its renamed place, as its signature, which
/// names no receiver, plus what the signature leaves out because it names receivers (its id and
/// deferred prepare, renamed); the small parts (stores, truth, the log queue, fences, flags).
template <class M>
std::uint64_t combine(const protocol::model::basic_cluster<M>& w, const renaming& q, const std::uint64_t* sig,
                      const fingerprint_parts& parts, std::uint64_t inflight_sum) {
  using protocol::detail::hash_all;
  static_assert(field_count<protocol::model::basic_cluster<M>> == 25);
  static_assert(field_count<protocol::basic_commit_log<M>> == 2);
  static_assert(field_count<protocol::log_snapshot> == 3);
  static_assert(field_count<protocol::model::pending_log> == 2);
  const std::size_t n = q.n();
  hasher h;
  h.mix(parts.log);
  h.mix(parts.coord);
  h.mix(parts.owners);
  h.mix(n);
  for (std::uint32_t j = 0; j < n; ++j) {
    const auto& r = w.receivers[q.inv[j]];
    h.mix(sig[q.inv[j]]);
    if (!r) continue;  // the signature says so
    h.mix(q.to(r->id));
    h.mix(r->deferred.has_value());
    if (r->deferred) hash_renamed(h, q, *r->deferred);
  }
  hash_all(h, w.stores, w.trainer_flavor, w.truth);
  h.mix(w.inflight.size());
  h.mix(inflight_sum);
  hash_multiset(h, w.log_queue, [&](hasher& e, const protocol::model::pending_log& x) {
    hash_renamed(e, q, x.request);
    e.mix(x.epoch);
  });
  hash_all(h, w.coord_deadline, w.budget, w.max_epoch);
  h.mix(parts.attempts);
  h.mix(parts.acks);
  hash_all(h, w.stopped);
  hash_multiset(h, w.fenced, [&](hasher& e, const protocol::member& x) { hash_renamed(e, q, x); });
  hash_all(h, w.aborts_durable, w.violation, w.stuck);
  return h.digest();
}
}  // namespace symmetry_detail

/// The fingerprint of the world permute_receivers(w, p) would make, computed from w without
/// changing it (see above). With p the identity: the fingerprint of w itself. `sig[r]`:
/// receiver_signature(w, r) for every receiver (canonicalize has them already). The world's
/// configuration is not hashed: it is the same for every state of one search, and fingerprints
/// are only compared within one search.
template <class M>
[[gnu::flatten]] std::uint64_t renamed_fingerprint(const protocol::model::basic_cluster<M>& w,
                                                   const std::vector<std::uint32_t>& p, const std::uint64_t* sig) {
  using namespace symmetry_detail;
  const renaming q(p);
  fingerprint_parts parts;
  const std::uint64_t messages = parts_of(w, q, nullptr, nullptr, false, parts);
  return combine(w, q, sig, parts, messages);
}
/// The same, computing the receivers' signatures itself.
template <class M>
std::uint64_t renamed_fingerprint(const protocol::model::basic_cluster<M>& w, const std::vector<std::uint32_t>& p) {
  return renamed_fingerprint(w, p, receiver_signatures(w).data());
}

/// The parts of w under renaming p, every message's digest kept: what its successors take over.
template <class M>
[[gnu::flatten]] void renamed_parts(const protocol::model::basic_cluster<M>& w, const std::vector<std::uint32_t>& p,
                                    fingerprint_parts& out) {
  using namespace symmetry_detail;
  parts_of(w, renaming(p), nullptr, nullptr, true, out);
}

/// The same, with the parts that `same` says equal those of a state whose parts under p are
/// `earlier` taken from there (cluster_world::decode: the state a scratch world held before).
template <class M>
[[gnu::flatten]] void renamed_parts_reusing(const protocol::model::basic_cluster<M>& w, const std::vector<std::uint32_t>& p,
                                            const shared_parts& same, const fingerprint_parts& earlier, fingerprint_parts& out) {
  using namespace symmetry_detail;
  parts_of(w, renaming(p), &same, &earlier, true, out);
}

/// Which parts of w equal its parent's (see above). The in-flight multisets are sorted, so one
/// merge pairs every message of w with an equal one of the parent where there is one.
template <class M>
void shared_with_parent(const protocol::model::basic_cluster<M>& w, const protocol::model::basic_cluster<M>& parent,
                        shared_parts& out) {
  out.log = w.log == parent.log;
  out.coord = w.coord == parent.coord;
  out.owners = w.owners == parent.owners;
  out.attempts = w.attempts == parent.attempts;
  out.acks = w.acks == parent.acks;
  out.inflight.assign(w.inflight.size(), -1);
  // one three-way comparison per step: an equal pair was compared in full twice by < then ==
  std::size_t i = 0;
  for (std::size_t j = 0; j < w.inflight.size() && i < parent.inflight.size();) {
    const auto c = parent.inflight[i] <=> w.inflight[j];
    if (c < 0) ++i;
    else if (c > 0) ++j;
    else out.inflight[j++] = std::int32_t(i++);
  }
}

/// renamed_fingerprint(w, p, sig), with the parts that `shared` says equal the parent's taken
/// from `parent_parts` (the parent's renamed_parts under the same p) instead of hashed again.
template <class M>
[[gnu::flatten]] std::uint64_t renamed_fingerprint_from_parent(const protocol::model::basic_cluster<M>& w,
                                                               const std::vector<std::uint32_t>& p, const std::uint64_t* sig,
                                                               const shared_parts& shared,
                                                               const fingerprint_parts& parent_parts) {
  using namespace symmetry_detail;
  const renaming q(p);
  fingerprint_parts parts;
  const std::uint64_t messages = parts_of(w, q, &shared, &parent_parts, false, parts);
  return combine(w, q, sig, parts, messages);
}

/// Every permutation of 0..n-1, the identity first (lexicographic order).
inline std::vector<std::vector<std::uint32_t>> all_permutations(std::uint32_t n) {
  std::vector<std::uint32_t> p(n);
  std::iota(p.begin(), p.end(), 0u);
  std::vector<std::vector<std::uint32_t>> out;
  do out.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  return out;
}

}  // namespace bitrefit::proofs
