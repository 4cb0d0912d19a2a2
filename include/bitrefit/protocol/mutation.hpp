// bitrefit/protocol/mutation.hpp — deliberately broken protocol variants, as a TEST POLICY of the
// machines (never a field of a production configuration).
//
// Every machine is a template over a mutation policy: `basic_coordinator<Mut>`, `basic_owner<Mut>`,
// `basic_receiver<Mut>`, `basic_commit_log<Mut>`. The shipped protocol is the instantiation with
// `no_mutation` (the aliases `coordinator`, `owner`, `receiver`, `commit_log`): its hook is a
// compile-time `false`, so no broken branch exists in the code that runs. Tests and the checker
// instantiate `runtime_mutation`, which picks one mutation at run time, to show that the
// invariants they check can fail.
//
// Concept MutationPolicy: `M::enabled` (bool constant) and `m.is(protocol_mutation)`; laws: with
// `enabled == false`, `is` is false for every mutation; a policy is a value (copyable, ==, <=>).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>

#include "bitrefit/core/fields.hpp"

namespace bitrefit::protocol {

enum class protocol_mutation : std::uint8_t {
  none,
  retry_by_xor,                    // coordinator: retries keep XOR instead of switching to overwrite
  commit_before_all_acks,          // coordinator: compare-and-set after the first ack
  dedup_off,                       // receiver: a duplicate payload is applied again
  delta_against_uncommitted_base,  // owner: advances its baseline when it finished encoding, not at commit
  retry_without_stop_and_wait,     // coordinator skips stop_and_wait, receivers skip the device sync
  accept_old_incarnation_acks,     // coordinator: acks/joins matched by receiver id, incarnation ignored
  blind_write_commit,              // commit log: compare-and-set becomes an unconditional write
  freeze_stale_prepare,            // owner: freezes and encodes a prepare whose target is not above its baseline
  reclaim_unknown_epoch,           // coordinator: re-sends a claim whose outcome was unknown instead of reading the log
  join_confirmed_by_any_announce,  // receiver: any announcement of its K confirms its join (and it never rejoins)
  unfenced_abort,                  // coordinator sends abort without persisting it; receivers ignore its epoch
  refreeze_at_restart,             // a sender restart deletes the frozen images (retain_only(K.v)) and owners
                                   // re-freeze the trainer's current bits for a retry (finding B1's engine)
  keep_dead_incarnation,           // coordinator: a join from a newer incarnation of a known receiver is
                                   // ignored; the roster keeps the dead one, the live one is never readmitted
  owner_forgets_sender_epoch,      // owner: a crash forgets which sender process it belongs to, so a late
                                   // prepare of a dead sender's coordinator may freeze newer trainer bits (H1)
  join_mid_attempt,                // receiver: answers a roll call with "join at=K" while holding writes of an
                                   // attempt that will not finish (H2)
  trust_rebuilt_roster,            // coordinator: a takeover takes the roster it rebuilt from the log's last
                                   // attempt for a fact, never asking those incarnations to answer (B7)
  join_proves_life,                // coordinator: any join is a sign of life in its epoch, whatever epoch the
                                   // join names, so a late copy from a dead incarnation confirms it (B7b)
};

inline constexpr protocol_mutation all_mutations[] = {
    protocol_mutation::retry_by_xor,
    protocol_mutation::commit_before_all_acks,
    protocol_mutation::dedup_off,
    protocol_mutation::delta_against_uncommitted_base,
    protocol_mutation::retry_without_stop_and_wait,
    protocol_mutation::accept_old_incarnation_acks,
    protocol_mutation::blind_write_commit,
    protocol_mutation::freeze_stale_prepare,
    protocol_mutation::reclaim_unknown_epoch,
    protocol_mutation::join_confirmed_by_any_announce,
    protocol_mutation::unfenced_abort,
    protocol_mutation::refreeze_at_restart,
    protocol_mutation::keep_dead_incarnation,
    protocol_mutation::owner_forgets_sender_epoch,
    protocol_mutation::join_mid_attempt,
    protocol_mutation::trust_rebuilt_roster,
    protocol_mutation::join_proves_life,
};

constexpr std::string_view to_string(protocol_mutation m) noexcept {
  switch (m) {
    case protocol_mutation::none: return "none";
    case protocol_mutation::retry_by_xor: return "retry_by_xor";
    case protocol_mutation::commit_before_all_acks: return "commit_before_all_acks";
    case protocol_mutation::dedup_off: return "dedup_off";
    case protocol_mutation::delta_against_uncommitted_base: return "delta_against_uncommitted_base";
    case protocol_mutation::retry_without_stop_and_wait: return "retry_without_stop_and_wait";
    case protocol_mutation::accept_old_incarnation_acks: return "accept_old_incarnation_acks";
    case protocol_mutation::blind_write_commit: return "blind_write_commit";
    case protocol_mutation::freeze_stale_prepare: return "freeze_stale_prepare";
    case protocol_mutation::reclaim_unknown_epoch: return "reclaim_unknown_epoch";
    case protocol_mutation::join_confirmed_by_any_announce: return "join_confirmed_by_any_announce";
    case protocol_mutation::unfenced_abort: return "unfenced_abort";
    case protocol_mutation::refreeze_at_restart: return "refreeze_at_restart";
    case protocol_mutation::keep_dead_incarnation: return "keep_dead_incarnation";
    case protocol_mutation::owner_forgets_sender_epoch: return "owner_forgets_sender_epoch";
    case protocol_mutation::join_mid_attempt: return "join_mid_attempt";
    case protocol_mutation::trust_rebuilt_roster: return "trust_rebuilt_roster";
    case protocol_mutation::join_proves_life: return "join_proves_life";
  }
  return "?";
}
inline std::optional<protocol_mutation> mutation_from_string(std::string_view s) {
  if (s == "none") return protocol_mutation::none;
  for (auto m : all_mutations)
    if (to_string(m) == s) return m;
  return std::nullopt;
}

template <class M>
concept MutationPolicy = std::regular<M> && requires(const M& m, protocol_mutation x) {
  { M::enabled } -> std::convertible_to<bool>;
  { m.is(x) } -> std::same_as<bool>;
};

/// The shipped protocol: nothing is broken.
struct no_mutation {
  static constexpr bool enabled = false;
  static constexpr bool is(protocol_mutation) noexcept { return false; }
  friend constexpr auto operator<=>(const no_mutation&, const no_mutation&) = default;
};

/// Test policy: the one mutation `which` (none: behaves like the shipped protocol).
struct runtime_mutation {
  static constexpr bool enabled = true;
  protocol_mutation which = protocol_mutation::none;
  constexpr bool is(protocol_mutation m) const noexcept { return which == m; }
  friend constexpr auto operator<=>(const runtime_mutation&, const runtime_mutation&) = default;
};

static_assert(MutationPolicy<no_mutation> && MutationPolicy<runtime_mutation>);
BITREFIT_NO_FIELDS(no_mutation)
BITREFIT_FIELDS(runtime_mutation, which)

/// The policy value for `m` (no_mutation accepts only `none`; the caller checks).
template <MutationPolicy M>
constexpr M mutation_policy(protocol_mutation m) noexcept {
  if constexpr (M::enabled) return M{m};
  else return M{};
}

/// `Mut` broke rule `m`? A constant false in the shipped instantiation.
template <MutationPolicy M>
constexpr bool broken(const M& policy, protocol_mutation m) noexcept {
  if constexpr (M::enabled) return policy.is(m);
  else return false;
}

}  // namespace bitrefit::protocol
