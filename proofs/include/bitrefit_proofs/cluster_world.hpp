// bitrefit_proofs/cluster_world.hpp — binds the generic checker to the protocol's cluster world
// (bitrefit/protocol/model/cluster.hpp), which composes the REAL coordinator, owner, receiver and
// commit-log state machines: nothing of the protocol is re-implemented here.
//
// What this adds on the proofs side is only the bound on attempts: a fault (drop, corrupt copy,
// conflicting copy, receiver crash, coordinator failover, commit-log failure or unknown outcome,
// a deadline that fires while something is still in flight) is enabled only while the current
// transition has started fewer than `max_attempts` attempts. Under that bound every transition has
// at most `max_attempts` attempts, the last one fault-free: DESIGN's liveness assumption ("eventually
// reliable delivery and eventually stable members"), under which the end of the transition must stay
// reachable from every state. The coordinator is also configured with max_attempts, so a third
// attempt would show up as a coordinator that needs an operator (the end unreachable), not pass
// silently. Operator abort is excluded (aborts = 0). With `faults_after_last_commit` the window
// opens only once K is at the last version (membership after the transitions; inside_fault_window is
// the one statement of the rule, read by the random harness too).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bitrefit/codec/hash.hpp"
#include "bitrefit/protocol/model/script.hpp"
#include "bitrefit_proofs/checker.hpp"
#include "bitrefit_proofs/compact.hpp"
#include "bitrefit_proofs/symmetry.hpp"

namespace bitrefit::proofs {

/// The checker's bounds, in the words of the proofs issue.
struct cluster_bounds {
  std::uint32_t receivers = 2;
  std::uint32_t owners = 2;
  std::uint32_t chunks = 2;        // payloads per owner per attempt
  std::uint32_t transitions = 2;   // successive transitions v0 -> v1 -> v2
  std::uint32_t max_attempts = 2;  // per transition
  std::uint32_t crashes = 0;
  std::uint32_t owner_crashes = 0;
  std::uint32_t sender_restarts = 0;  // coordinator + owners restart from log and stores (frozen images kept/lost/replaced)
  std::uint32_t failovers = 0;
  std::uint32_t drops = 0;
  std::uint32_t duplicates = 0;
  std::uint32_t corruptions = 0;
  std::uint32_t conflicts = 0;
  std::uint32_t log_faults = 0;
  std::uint32_t early_deadlines = 0;
  std::uint32_t aborts = 0;        // operator aborts (the transition ends; the trainer begins it again)
  bool attest = true;              // receivers' attestations checked before commit (off: wrong bits commit)
  bool ordered_device = false;     // device writes land in issue order (default: any order)
  /// Prepare first: a payload, open or flush of attempt τ is not delivered to receiver r while τ's
  /// prepare to r is still in flight (causal order). OFF by default: the network may reorder them,
  /// and the receiver keeps such early messages until the prepare (receiver.hpp, "Early
  /// messages"). Before that fix the checker found the transition could never end with this off
  /// (proofs/README.md, "Findings"); turning it on only shrinks the state space.
  bool causal_payloads = false;
  /// Faults only once the last transition has committed (K at the last version): every transition
  /// runs fault-free, then the fault budget is spent on what follows, where membership must still
  /// converge (restarted receivers readmitted, the roster holding the live incarnations, also
  /// across a takeover). A world of its own for the findings B7 and B7b, which need a receiver
  /// crash, a takeover and lost messages together: with faults during the transitions as well, such
  /// a world needs an attempt per fault plus one and is far too large for a test. OFF by default.
  bool faults_after_last_commit = false;
  /// The liveness goal. ON (default): the world *settles* (model::cluster::settled): K reached the
  /// last version, nothing in flight, every live receiver — a restarted one included — is a member
  /// again, serving K with its gate open and exactly K's bits, and the coordinator's roster holds
  /// exactly the live incarnations at K (a dead incarnation kept in it is a failure). OFF: only
  /// "the transitions ended" (K reached the last version, coordinator idle), the older goal.
  bool membership_liveness = true;
  /// Symmetry reduction over receivers (symmetry.hpp; proofs/README.md "Symmetry reduction"): states
  /// that differ only by a renaming of receivers are explored once. The verdict and the
  /// counterexamples do not change (the stored states are real ones); the counts shrink (up to
  /// receivers! times). OFF: every state, as before.
  bool symmetry = true;
  protocol::gate_policy gate = protocol::gate_policy::synchronous;
  protocol::protocol_mutation mutation = protocol::protocol_mutation::none;

  protocol::model::world_config world() const {
    protocol::model::world_config c;
    c.protocol.gate = gate;
    c.protocol.owners = owners;
    c.protocol.receivers = receivers;
    c.protocol.attest = attest;
    c.protocol.max_attempts = max_attempts;
    c.mutation = mutation;
    c.chunks_per_owner = chunks;
    c.transitions = transitions;
    c.xor_allowed = true;
    c.ordered_device = ordered_device;
    c.drops = drops;
    c.duplicates = duplicates;
    c.corruptions = corruptions;
    c.conflicts = conflicts;
    c.crashes = crashes;
    c.owner_crashes = owner_crashes;
    c.sender_restarts = sender_restarts;
    c.failovers = failovers;
    c.log_faults = log_faults;
    c.early_deadlines = early_deadlines;
    c.aborts = aborts;
    return c;
  }
};

/// Attempts persisted for the transition in progress (target K.v + 1) of world `w` (a
/// model::basic_cluster), over all coordinators.
template <class W>
std::uint32_t attempts_of_current_transition(const W& w) {
  const version_t target = w.log.state.record.version + 1;
  std::uint32_t n = 0;
  for (const auto& a : w.attempts) n += a.target == target;
  return n;
}

/// The fault window, one rule for the checker and the random harness: a fault is enabled only
/// while the current transition has persisted fewer than `max_attempts` attempts (so the last
/// one is fault-free) and, with `after_last_commit`, only once K is at the world's last version.
template <class W>
bool inside_fault_window(const W& w, std::uint32_t max_attempts, bool after_last_commit) {
  return attempts_of_current_transition(w) < max_attempts &&
         (!after_last_commit || w.log.state.record.version >= w.config.transitions);
}

/// The checker's view of a world of type W: model::cluster (the shipped protocol) or
/// model::mutated_cluster (the machines with a mutation chosen at run time, for mutation runs).
template <class W>
class basic_cluster_world {
 public:
  explicit basic_cluster_world(const cluster_bounds& b)
      : w_(b.world()), max_attempts_(b.max_attempts), causal_payloads_(b.causal_payloads),
        faults_after_last_commit_(b.faults_after_last_commit),
        membership_liveness_(b.membership_liveness), symmetry_(b.symmetry && b.receivers >= 2 && b.receivers <= 5) {
    if (symmetry_) (void)permutations();  // built once, before any worker thread reads them
  }

  const W& world() const noexcept { return w_; }

  /// Attempts persisted for the transition in progress (target K.v + 1), over all coordinators.
  std::uint32_t attempts_of_current_transition() const { return proofs::attempts_of_current_transition(w_); }

  std::vector<protocol::model::move> enabled_moves() const {
    using protocol::model::move_kind;
    auto all = w_.enabled_moves();
    const bool faults_ok = inside_fault_window(w_, max_attempts_, faults_after_last_commit_);
    if (faults_ok && !causal_payloads_) return all;
    const bool quiet = w_.quiet();
    std::vector<protocol::model::move> out;
    out.reserve(all.size());
    for (const auto& m : all) {
      if (m.kind == move_kind::deliver && causal_payloads_ && prepare_pending_for(w_.inflight[m.index])) continue;
      if (faults_ok) {
        out.push_back(m);
        continue;
      }
      switch (m.kind) {
        case move_kind::drop:
        case move_kind::corrupt:
        case move_kind::conflict:
        case move_kind::crash:
        case move_kind::owner_crash:
        case move_kind::sender_restart:
        case move_kind::failover:
        case move_kind::log_failed:
        case move_kind::log_unknown_applied:
        case move_kind::log_unknown_lost:
        case move_kind::abort: continue;  // a fault: no attempt left to recover from it
        case move_kind::deadline:
          if (!quiet) continue;  // an early deadline is a fault too
          break;
        default: break;
      }
      out.push_back(m);
    }
    return out;
  }

  void apply(const protocol::model::move& m) {
    w_.apply(m);
    cache_.clear();
  }

  /// `e` carries attempt τ's data or control (payload, open, flush) to a receiver while τ's prepare
  /// to that receiver is still in flight.
  bool prepare_pending_for(const protocol::envelope& e) const {
    if (e.to.role != protocol::role::receiver) return false;
    std::optional<attempt_id> a;
    if (const auto* p = std::get_if<protocol::payload_msg>(&e.msg)) a = p->id.attempt;
    else if (const auto* o = std::get_if<protocol::open_msg>(&e.msg)) a = o->attempt;
    else if (const auto* f = std::get_if<protocol::flush_msg>(&e.msg)) a = f->attempt;
    if (!a) return false;
    for (const auto& f : w_.inflight) {
      const auto* prep = std::get_if<protocol::prepare_msg>(&f.msg);
      if (prep && f.to == e.to && prep->record.attempt == *a) return true;
    }
    return false;
  }
  /// Sleep sets (checker.hpp, sleep_world; proofs/README.md "Sleep sets"). Two moves are
  /// independent when each acts on one machine only, not the same one, and they do not spend the
  /// same fault budget: a network move (deliver, drop, duplicate, corrupt, conflict) acts on the
  /// envelope's addressee, a device write, crash or restart on its receiver; every other move
  /// (deadlines, whose enabling reads whether anything is in flight; commit-log outcomes, which
  /// persist attempts and so enable or disable faults; failover, owner crash, sender restart,
  /// begin, abort) is dependent on all. Why this is enough: a move's effects are its machine's
  /// new state, the messages it sends (the in-flight multiset, kept sorted, so the order of two
  /// sends does not matter) and its budget; whether a fault is enabled reads the attempts
  /// persisted, which only commit-log moves change. Tested, not assumed (test_checker,
  /// `Sleep.IndependentMovesCommute`, every reachable state of worlds with every fault kind).
  bool independent(const protocol::model::move& a, const protocol::model::move& b) const {
    const auto fa = footprint(a), fb = footprint(b);
    if (!fa.local || !fb.local || fa.machine == fb.machine) return false;
    return !(fa.spends_budget && a.kind == b.kind);
  }
  /// The renaming this world's last canonicalize chose (an index into the permutations of its
  /// receivers; 0, the identity, without symmetry or after renaming in place).
  std::uint32_t sleep_frame() const noexcept { return frame_; }
  /// Move m's identity in the frame `frame` (sleep_frame() of this world or of another member of
  /// its class): its kind and what it acts on, receivers renamed by that frame's permutation, as
  /// one digest. Two members of a class, each in its own frame, give a move and its image the
  /// same id: the id names the move of the canonical image. A network move's message enters as its
  /// renamed digest from the world's fingerprint parts under that frame (parts_under), which the
  /// checker has mostly computed already for the successors' fingerprints.
  std::uint64_t sleep_id(const protocol::model::move& m, std::uint32_t frame) const {
    using protocol::model::move_kind;
    const symmetry_detail::renaming q(permutations().at(frame));
    protocol::detail::hasher h;
    h.mix(static_cast<std::uint64_t>(m.kind));
    switch (m.kind) {
      case move_kind::deliver:
      case move_kind::drop:
      case move_kind::duplicate:
      case move_kind::corrupt:
      case move_kind::conflict:  // the message's renamed digest, the one its fingerprint part holds
        h.mix(parts_under(frame).inflight.at(m.index));
        break;
      case move_kind::device: h.mix(q.to(m.index)), h.mix(m.sub); break;
      case move_kind::crash:
      case move_kind::restart: h.mix(q.to(m.index)); break;
      // the moves below are never asleep (dependent on every move); their ids are renamed alike
      // all the same, so that the law "one id, one move, in every member" holds for every move
      case move_kind::deadline: h.mix(m.index == 0 ? 0 : q.to(m.index - 1) + 1); break;
      case move_kind::log_ok:
      case move_kind::log_failed:
      case move_kind::log_unknown_applied:
      case move_kind::log_unknown_lost:
        symmetry_detail::hash_renamed(h, q, w_.log_queue.at(m.index).request);
        h.mix(w_.log_queue.at(m.index).epoch);
        break;
      case move_kind::owner_crash: h.mix(m.index); break;
      case move_kind::sender_restart: h.mix(m.sub); break;
      case move_kind::failover:
      case move_kind::abort:
      case move_kind::begin: break;
    }
    return h.digest();
  }
  std::optional<std::string> check_invariants() const { return w_.check_invariants(); }
  /// The checker's goal: not only "K reached the last version" but the world settled — every live
  /// receiver serves exactly K's bits with its gate open, the coordinator's roster holds every live
  /// incarnation at K and every owner reported K (model::cluster::settled). Liveness then says
  /// that from every reachable state this stays reachable: no stale roster (finding B2), no
  /// receiver left behind. cluster_bounds::membership_liveness = false keeps the old goal (K at
  /// the last version) for comparison.
  bool transition_done() const { return membership_liveness_ ? w_.settled() : w_.transition_done(); }

  friend bool operator==(const basic_cluster_world& a, const basic_cluster_world& b) { return a.w_ == b.w_; }

  /// Renames receiver r to p[r] throughout the world (symmetry.hpp); tests of the reduction.
  void rename_receivers(const std::vector<std::uint32_t>& p) {
    permute_receivers(w_, p);
    cache_.clear();
  }
  /// The world's state as compact bytes (compact.hpp; checker.hpp, compact_world). The bounds and
  /// switches of this view are not encoded: they are the same for every state of one search.
  void encode(std::vector<std::uint8_t>& out) const { compact::encode(w_, out); }
  /// Decodes a state encoded by encode(). The world keeps a copy of the bytes, with where each of
  /// its fields, each receiver and each message in flight begins, while it stays unchanged: the
  /// checker expands a decoded state, and its successors' encodings copy what they share with it
  /// (encode_successor).
  /// Decoding by difference: if the world still holds the state it was last decoded from (nothing
  /// changed it since), a field, receiver or message whose old bytes recur at the reading position
  /// is kept as it is instead of being decoded again. That is exact because an encoding delimits
  /// itself: reading a value from bytes that begin with the encoding of x reads exactly those
  /// bytes and gives x. The checker's frontier states follow one another in BFS order, most of them
  /// siblings that share most of their parts. So are the fingerprint parts of the parts that
  /// recur, under each renaming the world had them for (parts_under). Tested: test_checker,
  /// Compact.EveryReachableStateRoundTrips, Compact.DecodingByDifferenceKeepsTheFingerprintParts.
  void decode(const std::uint8_t* p, const std::uint8_t* end) {
    const bool holds_previous = cache_.source.valid;
    std::swap(cache_.source, cache_.previous);
    std::swap(cache_.parts, cache_.earlier_parts);
    std::swap(cache_.parts_valid, cache_.earlier_valid);
    cache_.clear(/*keep_earlier=*/holds_previous);
    const auto* prev = holds_previous ? &cache_.previous : nullptr;
    auto& src = cache_.source;
    auto& rec = cache_.recurring;
    rec.log = rec.coord = rec.owners = rec.attempts = rec.acks = false;
    std::size_t receiver_fields_recurring = 0;  // per-receiver vectors that recur
    compact::reader r{p, end};
    std::size_t i = 0;
    std::apply(
        [&](auto&... f) {
          ((src.field_at[i] = static_cast<std::uint32_t>(r.p - p), receiver_fields_recurring += decode_field(r, p, f, i, prev), ++i), ...);
        },
        fields_of(w_));
    src.field_at[i] = static_cast<std::uint32_t>(r.p - p);
    rec.receiver_fields = receiver_fields_recurring == per_receiver_vectors;
    if (r.p != end) throw std::runtime_error("cluster_world: trailing bytes after a state");
    src.bytes.assign(p, end);
    src.digest = codec::xxh3_128(std::as_bytes(std::span(p, end)));
    src.valid = true;
  }
  /// Appends exactly what encode(out) appends (checker.hpp, incremental_compact_world), faster
  /// when this world is a successor of `parent` as restore_to requires it (copied from parent,
  /// moves applied, then canonicalize_successor(parent, ...)) and `parent` was decoded and has not
  /// changed since: the parts the fingerprint's comparison found equal to the parent's (the
  /// commit log, coordinator, owners, attempts, acks; each receiver whose part is unchanged; each
  /// message still in flight) are copied from the parent's bytes, not encoded again. Equal values
  /// have equal encodings, so the bytes are the same. Anywhere else, it encodes in full.
  /// Returns how many of the bytes were copied. Tested: test_checker,
  /// Compact.SuccessorEncodingCopiesWhatItSharesWithItsParent.
  std::size_t encode_successor(std::vector<std::uint8_t>& out, const basic_cluster_world& parent) const {
    const auto& src = parent.cache_.source;
    const std::size_t n = w_.receivers.size();
    // The comparison must have been made with the state those bytes encode: `parent` may have
    // been decoded from other bytes since (every other change invalidates its bytes).
    if (!cache_.restorable || !src.valid || src.digest != cache_.compared_with_bytes || parent.w_.receivers.size() != n) {
      encode(out);
      return 0;
    }
    static_assert(symmetry_detail::field_count<W> == 25, "encode_successor: a field was added to the world: decide below whether it can be copied");
    const auto& same = cache_.shared;
    const bool receivers_same = std::all_of(cache_.same_receiver.begin(), cache_.same_receiver.begin() + std::ptrdiff_t(n), [](bool b) { return b; });
    compact::writer o{out};
    std::size_t copied = 0;
    auto copy = [&](std::uint32_t from, std::uint32_t to) {
      o.raw(src.bytes.data() + from, to - from);
      copied += to - from;
    };
    auto field = [&](const auto& f, std::size_t i) {
      using F = std::decay_t<decltype(f)>;
      const void* const at = &f;
      if constexpr (std::is_same_v<F, decltype(W::receivers)>) {
        if (at == &w_.receivers) {  // each receiver whose part is unchanged (same_receiver_part)
          o.varint(n);
          for (std::size_t r = 0; r < n; ++r)
            cache_.same_receiver[r] ? copy(src.receiver_at[r], src.receiver_at[r + 1]) : compact::put(o, f[r]);
          return;
        }
      }
      if constexpr (std::is_same_v<F, decltype(W::inflight)>) {
        if (at == &w_.inflight) {  // each message the parent has too (shared_with_parent's match)
          o.varint(f.size());
          for (std::size_t j = 0; j < f.size(); ++j) {
            const std::int32_t k = same.inflight[j];
            k >= 0 ? copy(src.message_at[std::size_t(k)], src.message_at[std::size_t(k) + 1]) : compact::put(o, f[j]);
          }
          return;
        }
      }
      const bool shared = at == &w_.config  // never changed by a move (restore_to)
                          || (at == &w_.log && same.log) || (at == &w_.coord && same.coord) ||
                          (at == &w_.owners && same.owners) || (at == &w_.attempts && same.attempts) ||
                          (at == &w_.acks && same.acks) ||
                          (receivers_same && is_per_receiver_vector(at));
      shared ? copy(src.field_at[i], src.field_at[i + 1]) : compact::put(o, f);
    };
    std::size_t i = 0;
    std::apply([&](const auto&... f) { (field(f, i++), ...); }, fields_of(w_));
    o.finish();
    return copied;
  }
  /// Symmetry reduction on (checker.hpp, symmetric_world)?
  bool symmetric() const noexcept { return symmetry_; }
  /// Returns the smallest fingerprint among the images of this world under the renamings that
  /// sort receivers by their own state's signature (symmetry.hpp, receiver_signature; ties: the
  /// first permutation in lexicographic order, identity first): equal for every world of one
  /// symmetry class (up to 64-bit hash collisions, the same bound as fingerprint deduplication).
  /// Each image is hashed without being built (symmetry.hpp, renamed_fingerprint), the receivers'
  /// own parts by their signatures.
  /// `leave_canonical`: the world is then renamed to that image (exact mode keys by it); false:
  /// it is left exactly as it was, so the checker keeps the real successor as it is.
  std::uint64_t canonicalize(bool leave_canonical = true) {
    frame_ = 0;
    if (!symmetry_) return protocol::hash_of(w_);
    const auto sig = receiver_signatures(w_);
    return canonical(sig, leave_canonical, [&](const std::vector<std::uint32_t>& p, std::size_t) {
      return renamed_fingerprint(w_, p, sig.data());
    });
  }
  /// canonicalize(leave_canonical) of a successor of `parent`, the same value, computed with what
  /// it shares with the parent taken over (symmetry.hpp, "Parts of the fingerprint"): each
  /// receiver's signature where that receiver's part of the world equals the parent's, and the
  /// parent's fingerprint parts under each renaming, computed once per parent and kept in it
  /// (a cache that every change of the parent empties, and that a copy does not take along).
  std::uint64_t canonicalize_successor(const basic_cluster_world& parent, bool leave_canonical = true) {
    frame_ = 0;
    if (!symmetry_) return protocol::hash_of(w_);
    const auto& psig = parent.signatures();
    std::array<std::uint64_t, 8> sig{};
    for (std::uint32_t r = 0; r < w_.receivers.size(); ++r) {
      cache_.same_receiver[r] = same_receiver_part(w_, parent.w_, r);
      sig[r] = cache_.same_receiver[r] ? psig[r] : receiver_signature(w_, r);
    }
    shared_with_parent(w_, parent.w_, cache_.shared);
    cache_.restorable = true;  // until the world changes (a renaming below clears it)
    cache_.compared_with_bytes = parent.cache_.source.valid ? parent.cache_.source.digest : digest128{};
    return canonical(sig, leave_canonical, [&](const std::vector<std::uint32_t>& p, std::size_t k) {
      return renamed_fingerprint_from_parent(w_, p, sig.data(), cache_.shared, parent.parts_under(k));
    });
  }

  /// How restore_to made the world equal to its parent (tests).
  enum class restored { copy, from_parent, from_state_before_parent };
  /// Makes this world equal to `parent` again, copying only the parts that differ from it. The
  /// checker builds every successor of a state in the same scratch worlds: a plain copy of the
  /// parent rewrites the whole world (every machine's vectors) for each one, though a move changes
  /// one or two machines and the messages. What differs is known from canonicalize_successor's
  /// comparison (shared_with_parent, same_receiver_part), valid until the world changes again.
  /// Precondition: this world was made from `parent` (a copy, then moves applied) and its last
  /// change was canonicalize_successor(parent, ...), and `parent` has not changed since. Where
  /// the world cannot tell (it was renamed, decoded, moved from or changed since), it copies the
  /// whole parent.
  /// A decoded parent is checked rather than assumed (the digest of its bytes): and where it was
  /// decoded by difference from the state this world was compared with (the checker's scratch
  /// world, a frontier state's parent, decodes the next state), the parts kept are those equal
  /// in both comparisons: this world's with the state before, and the decode's of the parent with
  /// it. So the first successors of each frontier state need no whole copy either.
  /// Tested: test_checker, Restore.*.
  restored restore_to(const basic_cluster_world& parent) {
    const auto& ps = parent.cache_.source;
    bool restorable = cache_.restorable, via_state_before = false;
    if (restorable && ps.valid) {  // a decoded parent, unchanged since: told by its bytes
      via_state_before = cache_.compared_with_bytes != ps.digest;
      restorable = !via_state_before ||
                   (parent.cache_.previous.valid && cache_.compared_with_bytes == parent.cache_.previous.digest);
    } else if (restorable) {  // a parent never decoded: the precondition is assumed, unless this world was compared with a decoded one
      restorable = cache_.compared_with_bytes == digest128{};
    }
    if (!restorable) {
      *this = parent;
      return restored::copy;
    }
    static_assert(symmetry_detail::field_count<W> == 25, "restore_to: a field was added to the world: restore it below");
    W& w = w_;
    const W& p = parent.w_;
    const auto& same = cache_.shared;
    // via the state before: also equal in parent's decode (its parts that recur)
    const auto& rec = parent.cache_.recurring;
    auto also = [&](bool recurs) { return !via_state_before || recurs; };
    // config: never changed by a move. The parts compared with the parent:
    if (!(same.log && also(rec.log))) w.log = p.log;
    if (!(same.coord && also(rec.coord))) w.coord = p.coord;
    if (!(same.owners && also(rec.owners))) w.owners = p.owners;
    if (!(same.attempts && also(rec.attempts))) w.attempts = p.attempts;
    if (!(same.acks && also(rec.acks))) w.acks = p.acks;
    const std::size_t k = w.regions_per_receiver();
    for (std::uint32_t r = 0; r < w.receivers.size(); ++r) {
      if (cache_.same_receiver[r] && also(rec.receiver_fields && rec.receivers[r] >= 0)) continue;  // its roster entry is coord's
      w.receivers[r] = p.receivers[r];
      w.incarnations[r] = p.incarnations[r];
      w.device[r] = p.device[r];
      w.sync_waiting[r] = p.sync_waiting[r];
      w.receiver_deadline[r] = p.receiver_deadline[r];
      std::copy_n(p.regions.begin() + std::ptrdiff_t(r * k), k, w.regions.begin() + std::ptrdiff_t(r * k));
    }
    // the rest, not compared: copied (small, or like the messages changed by most moves)
    w.stores = p.stores;
    w.trainer_flavor = p.trainer_flavor;
    w.truth = p.truth;
    w.inflight = p.inflight;
    w.log_queue = p.log_queue;
    w.coord_deadline = p.coord_deadline;
    w.budget = p.budget;
    w.max_epoch = p.max_epoch;
    w.stopped = p.stopped;
    w.fenced = p.fenced;
    w.aborts_durable = p.aborts_durable;
    w.violation = p.violation;
    w.stuck = p.stuck;
    cache_.clear();
    return via_state_before ? restored::from_state_before_parent : restored::from_parent;
  }

 private:
  /// The smallest of fingerprint(p, k) over the renamings p = permutations()[k] that sort the
  /// receivers by `sig` (receiver r goes to p[r]; a smaller signature to a smaller id). Usually
  /// one; ties (receivers whose own states are equal) leave several. Every world of a class has
  /// the same candidate images, so the same fingerprint.
  template <class F>
  std::uint64_t canonical(const std::array<std::uint64_t, 8>& sig, bool leave_canonical, F&& fingerprint) {
    const auto& ps = permutations();
    const std::uint32_t n = w_.config.protocol.receivers;
    std::uint64_t best = 0;
    std::size_t best_k = 0;
    bool any = false;
    for (std::size_t k = 0; k < ps.size(); ++k) {
      const auto& p = ps[k];
      bool sorted = true;
      for (std::uint32_t a = 0; a < n && sorted; ++a)
        for (std::uint32_t b = 0; b < n && sorted; ++b)
          if (sig[a] < sig[b] && p[a] > p[b]) sorted = false;
      if (!sorted) continue;
      const std::uint64_t h = fingerprint(p, k);
      if (!any || h < best) { best = h; best_k = k; any = true; }
    }
    if (leave_canonical && best_k != 0) {
      permute_receivers(w_, ps[best_k]);
      cache_.clear();
    }
    frame_ = leave_canonical ? 0 : static_cast<std::uint32_t>(best_k);
    return best;
  }
  /// Does receiver r's part of `a` (everything receiver_signature hashes, and more) equal `b`'s?
  static bool same_receiver_part(const W& a, const W& b, std::uint32_t r) {
    const std::size_t k = a.regions_per_receiver();
    if (!(a.receivers[r] == b.receivers[r]) || a.incarnations[r] != b.incarnations[r] || a.device[r] != b.device[r] ||
        a.sync_waiting[r] != b.sync_waiting[r] || a.receiver_deadline[r] != b.receiver_deadline[r] ||
        !std::equal(a.regions.begin() + std::ptrdiff_t(r * k), a.regions.begin() + std::ptrdiff_t((r + 1) * k),
                    b.regions.begin() + std::ptrdiff_t(r * k)))
      return false;
    const bool ra = r < a.coord.roster.size(), rb = r < b.coord.roster.size();
    return ra == rb && (!ra || a.coord.roster[r] == b.coord.roster[r]);
  }
  /// This world's receiver signatures, computed once while it is unchanged.
  const std::array<std::uint64_t, 8>& signatures() const {
    if (!cache_.signatures_valid) {
      cache_.signatures = receiver_signatures(w_);
      cache_.signatures_valid = true;
    }
    return cache_.signatures;
  }
  /// This world's fingerprint parts under permutations()[k], computed once while it is unchanged.
  const fingerprint_parts& parts_under(std::size_t k) const {
    if (cache_.parts.size() <= k) {
      cache_.parts.resize(permutations().size());
      cache_.parts_valid.resize(permutations().size(), 0);
    }
    if (!cache_.parts_valid[k]) {
      if (k < cache_.earlier_valid.size() && cache_.earlier_valid[k])  // decoded by difference: see decode
        renamed_parts_reusing(w_, permutations()[k], cache_.recurring, cache_.earlier_parts[k], cache_.parts[k]);
      else
        renamed_parts(w_, permutations()[k], cache_.parts[k]);
      cache_.parts_valid[k] = 1;
    }
    return cache_.parts[k];
  }
  /// What canonicalize_successor keeps: a parent's signatures and parts (valid until the world
  /// changes: apply, decode, renaming empty it), and a successor's scratch. A copied or moved
  /// world starts with it empty: the copy is about to change (the checker's successors are copies
  /// of their parent), and copying the parts would cost what they save.
  struct fingerprint_cache {
    fingerprint_cache() = default;
    fingerprint_cache(const fingerprint_cache&) noexcept {}
    fingerprint_cache& operator=(const fingerprint_cache&) noexcept {
      clear();
      return *this;
    }
    // A world moved from has lost its parts: its comparison with its parent no longer holds.
    fingerprint_cache(fingerprint_cache&& o) noexcept { o.clear(); }
    fingerprint_cache& operator=(fingerprint_cache&& o) noexcept {
      clear();
      o.clear();
      return *this;
    }
    /// `keep_earlier`: decode keeps the parts of the state held before (see there).
    void clear(bool keep_earlier = false) noexcept {
      if (!keep_earlier) std::fill(earlier_valid.begin(), earlier_valid.end(), 0);
      restorable = false;
      source.valid = false;
      signatures_valid = false;
      std::fill(parts_valid.begin(), parts_valid.end(), 0);
    }
    bool signatures_valid = false;
    std::array<std::uint64_t, 8> signatures{};
    std::vector<fingerprint_parts> parts;  // by permutation index
    std::vector<std::uint8_t> parts_valid;
    // decode: the parts (and their validity) of the state the world held before, and which parts
    // of the state decoded equal that one's (log ... acks; inflight[j] = j or -1)
    std::vector<fingerprint_parts> earlier_parts;
    std::vector<std::uint8_t> earlier_valid;
    struct recurring_parts : shared_parts {
      std::vector<std::int32_t> receivers;  // per receiver: its index if its machine recurs, else -1
      bool receiver_fields = false;         // incarnations, regions, device, sync_waiting, receiver_deadline
    } recurring;
    shared_parts shared;
    // restore_to: shared and same_receiver compare this world with the parent it was built from
    bool restorable = false;
    std::array<bool, 8> same_receiver{};
    // decode(): the bytes this world was decoded from, and where each field (field_at, and after
    // them the end), each receiver and each message in flight (receiver_at, message_at: the
    // offsets of their elements, then the end) begins in them
    struct decoded_from {
      bool valid = false;
      digest128 digest{};  // of `bytes`
      std::vector<std::uint8_t> bytes;
      std::array<std::uint32_t, symmetry_detail::field_count<W> + 1> field_at{};
      std::vector<std::uint32_t> receiver_at, message_at;
    } source, previous;  // previous: decode's scratch (the bytes the world held before)
    // restore_to's comparison was made with a parent decoded from bytes with this digest (zero: not
    // decoded): encode_successor copies from the parent's bytes only if they are still those
    digest128 compared_with_bytes{};
  };

  /// What a move acts on (independent()): `local` moves act on one machine only.
  struct move_footprint {
    bool local = false;
    protocol::endpoint machine{};
    bool spends_budget = false;  // a fault: enabled while budget and attempts are left
  };
  move_footprint footprint(const protocol::model::move& m) const {
    using protocol::model::move_kind;
    switch (m.kind) {
      case move_kind::deliver: return {true, w_.inflight[m.index].to, false};
      case move_kind::drop:
      case move_kind::duplicate:
      case move_kind::corrupt:
      case move_kind::conflict: return {true, w_.inflight[m.index].to, true};
      case move_kind::device:
      case move_kind::restart: return {true, protocol::endpoint::receiver_(m.index), false};
      case move_kind::crash: return {true, protocol::endpoint::receiver_(m.index), true};
      default: return {};
    }
  }
  /// The world's vectors with one entry (regions: one slice) per receiver, besides `receivers`:
  /// with it, a receiver's part (same_receiver_part compares them, restore_to copies them).
  static constexpr std::size_t per_receiver_vectors = 5;
  bool is_per_receiver_vector(const void* at) const noexcept {
    return at == &w_.incarnations || at == &w_.regions || at == &w_.device || at == &w_.sync_waiting ||
           at == &w_.receiver_deadline;
  }
  /// decode(): field i of the world, the receivers and the messages in flight element by element
  /// with where each begins (cache_.source); kept where its bytes in `prev` (the encoding the world
  /// holds, if any) recur at the reading position.
  /// The parts that recur are noted in cache_.recurring (as shared_parts: "equal to the state
  /// held before", whose fingerprint parts are cache_.earlier_parts; and for restore_to, each
  /// receiver). Returns whether f is one of the five per-receiver vectors besides `receivers`
  /// and recurred.
  template <class F>
  bool decode_field(compact::reader& r, const std::uint8_t* base, F& f, std::size_t i,
                    const typename fingerprint_cache::decoded_from* prev) {
    auto& rec = cache_.recurring;
    if constexpr (std::is_same_v<F, decltype(W::receivers)>) {
      if (&f == &w_.receivers) {
        compact::get_indexed(r, f, base, cache_.source.receiver_at, prev ? prev->bytes.data() : nullptr,
                             prev ? &prev->receiver_at : nullptr, &rec.receivers);
        return false;
      }
    }
    if constexpr (std::is_same_v<F, decltype(W::inflight)>) {
      if (&f == &w_.inflight) {
        compact::get_indexed(r, f, base, cache_.source.message_at, prev ? prev->bytes.data() : nullptr,
                             prev ? &prev->message_at : nullptr, &rec.inflight);
        return false;
      }
    }
    if (prev && compact::skip_if_same(r, prev->bytes.data() + prev->field_at[i], prev->bytes.data() + prev->field_at[i + 1])) {
      const void* const at = &f;
      rec.log |= at == &w_.log, rec.coord |= at == &w_.coord, rec.owners |= at == &w_.owners;
      rec.attempts |= at == &w_.attempts, rec.acks |= at == &w_.acks;
      return is_per_receiver_vector(at);
    }
    compact::get(r, f);
    return false;
  }
  /// Every permutation of the receivers (identity first); one table per receiver count, shared.
  const std::vector<std::vector<std::uint32_t>>& permutations() const {
    static const auto table = [] {
      std::vector<std::vector<std::vector<std::uint32_t>>> t;
      for (std::uint32_t n = 0; n <= 5; ++n) t.push_back(all_permutations(n));
      return t;
    }();
    return table.at(w_.config.protocol.receivers);
  }

  W w_;
  std::uint32_t max_attempts_ = 2;
  bool causal_payloads_ = false;
  bool faults_after_last_commit_ = false;
  bool membership_liveness_ = true;
  bool symmetry_ = false;
  std::uint32_t frame_ = 0;  // sleep_frame()
  mutable fingerprint_cache cache_;
};

using cluster_world = basic_cluster_world<protocol::model::cluster>;
using mutated_cluster_world = basic_cluster_world<protocol::model::mutated_cluster>;

/// A counterexample as a scenario file of the protocol's scenario tests (world line, then one move
/// per command, with the expected output), so it replays as a regression scenario.
template <class W = protocol::model::cluster>
std::string counterexample_scenario(const cluster_bounds& b, const std::vector<protocol::model::move>& path,
                                    const std::string& title) {
  // The checker's own bounds are not part of the world line (it replays the moves, whatever
  // allowed them); say which one shaped the search, so the run can be repeated.
  return protocol::model::to_scenario<W>(
      b.world(), path, b.faults_after_last_commit ? title + " (check_protocol faults_after_last_commit=1)" : title);
}

}  // namespace bitrefit::proofs

template <class W>
struct std::hash<bitrefit::proofs::basic_cluster_world<W>> {
  std::size_t operator()(const bitrefit::proofs::basic_cluster_world<W>& w) const {
    return bitrefit::protocol::hash_of(w.world());
  }
};
