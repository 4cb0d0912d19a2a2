// The mutations of the protocol's knob (protocol/mutation.hpp) that the exhaustive checker catches,
// each with the smallest world that contains the fault it needs and the property that catches it.
//
// One table, read by two: test_checker.cpp asserts that every row is caught, by that property, with
// a counterexample that replays; bitrefit-spin-trace (--mutations) replays the checker's
// counterexample of every row whose mutation the Promela model also has (spin_trace.hpp's
// promela_mutation), so a twin added to the model is judged without a second copy of its bounds.
//
// Not in the table: join_mid_attempt (finding H2). It needs 3 receivers, a sender restart and a
// failover, beyond what the checker holds in a test; the random harness (bitrefit-fuzz-protocol)
// and its scenario file (tests/protocol/scenarios) reach it.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "bitrefit/protocol/mutation.hpp"
#include "bitrefit_proofs/cluster_world.hpp"

namespace bitrefit::proofs {

/// The worlds most tests start from: 2 receivers, 2 owners, 1 chunk, 1 transition, then `f`.
cluster_bounds small_world(auto f) {
  cluster_bounds b;
  b.chunks = 1;
  b.transitions = 1;
  f(b);
  return b;
}

struct mutation_case {
  cluster_bounds bounds;  // its world, the mutation set in it
  /// Caught by liveness: a reachable state from which the world never settles (checker verdict
  /// end_unreachable); else by an invariant along the way (invariant_violated).
  bool liveness = false;
  protocol::protocol_mutation mutation() const { return bounds.mutation; }
};

inline const std::vector<mutation_case>& mutation_cases() {
  using M = protocol::protocol_mutation;
  static const std::vector<mutation_case> cases = [] {
    std::vector<mutation_case> c;
    auto add = [&](M m, auto bounds, bool liveness = false) {
      cluster_bounds b = small_world(bounds);
      b.mutation = m;
      c.push_back({b, liveness});
    };
    add(M::retry_by_xor, [](auto& b) { b.early_deadlines = 1; });
    add(M::commit_before_all_acks, [](auto&) {});
    add(M::dedup_off, [](auto& b) { b.duplicates = 1; });
    add(M::delta_against_uncommitted_base, [](auto&) {});
    add(M::retry_without_stop_and_wait, [](auto& b) { b.early_deadlines = 1; });
    add(M::accept_old_incarnation_acks, [](auto& b) { b.owners = 1; b.transitions = 2; b.crashes = 1; });
    add(M::blind_write_commit, [](auto& b) { b.owners = 1; b.failovers = 1; });
    // The recovery findings (B1-B4, B6).
    add(M::freeze_stale_prepare,  // B3
        [](auto& b) { b.receivers = 1; b.owners = 1; b.transitions = 2; b.duplicates = 1; b.owner_crashes = 1; });
    add(M::reclaim_unknown_epoch,  // B4: the only coordinator deposes itself
        [](auto& b) { b.receivers = 1; b.owners = 1; b.log_faults = 1; }, true);
    add(M::join_confirmed_by_any_announce,  // B2: a lost join leaves the roster stale forever
        [](auto& b) { b.receivers = 1; b.owners = 1; b.max_attempts = 3; b.crashes = 1; b.drops = 1; }, true);
    add(M::unfenced_abort, [](auto& b) { b.owners = 1; b.aborts = 1; });  // B6
    add(M::refreeze_at_restart,  // B1: "delete the frozen image at restart" and re-freeze the trainer's bits
        [](auto& b) { b.receivers = 1; b.owners = 1; b.chunks = 2; b.sender_restarts = 1; b.attest = false; });
    // A roster that keeps a dead incarnation while the live one is never readmitted: only the
    // membership goal (cluster_bounds::membership_liveness) sees it; K still reaches the last version.
    add(M::keep_dead_incarnation, [](auto& b) { b.receivers = 1; b.owners = 1; b.crashes = 1; }, true);
    // The random harness's finding H1: a late prepare of a dead sender freezes newer trainer bits.
    add(M::owner_forgets_sender_epoch,
        [](auto& b) { b.receivers = 1; b.owners = 1; b.sender_restarts = 1; b.owner_crashes = 1; });
    // The random harness's findings B7 and B7b: a takeover's roster keeps a dead incarnation. They
    // need a receiver crash, a sender restart and lost messages together, so the faults come after
    // the commit (cluster_bounds::faults_after_last_commit), where only membership is at stake.
    add(M::trust_rebuilt_roster,  // B7: the roster rebuilt from the log taken for a fact
        [](auto& b) {
          b.receivers = 1; b.owners = 1; b.crashes = 1; b.sender_restarts = 1; b.drops = 1;
          b.faults_after_last_commit = true;
        }, true);
    add(M::join_proves_life,  // B7b: a late join of a dead incarnation taken for proof of life
        [](auto& b) {
          b.receivers = 1; b.owners = 1; b.crashes = 2; b.sender_restarts = 1; b.drops = 2;
          b.faults_after_last_commit = true;
        }, true);
    return c;
  }();
  return cases;
}

/// The table's row of `m`; std::out_of_range if it has none (join_mid_attempt, none).
inline const mutation_case& mutation_case_of(protocol::protocol_mutation m) {
  for (const auto& c : mutation_cases())
    if (c.mutation() == m) return c;
  throw std::out_of_range("no mutation case for " + std::string(protocol::to_string(m)));
}

}  // namespace bitrefit::proofs
