// bitrefit/protocol/types.hpp — the protocol's value vocabulary: modes, configuration, the commit
// record K = (v, g), member bindings, the persisted prepare record, the test-only mutation knob and
// the hashing used for state deduplication.
//
// Everything here is a plain value: copyable, equality-comparable (defaulted ==) and hashable with
// `protocol::hash_of(x)`. No clocks, threads, I/O or randomness anywhere under protocol/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/ids.hpp"

namespace bitrefit::protocol {

/// Value coding of one attempt. XOR (new = old ^ mask) is only valid on a receiver that holds exactly
/// the base version in every position it touches, and only once; OVERWRITE carries absolute values
/// and is idempotent, so it is what every retry uses.
enum class mode : std::uint8_t { xor_delta, overwrite };

/// The request gate policy (DESIGN op. 3). synchronous: the gate closes when a receiver is admitted
/// to an attempt and payloads may be applied as they arrive. asynchronous: receivers keep serving v
/// while they stage payloads; the gate closes only after the coordinator's arrival check (flush).
enum class gate_policy : std::uint8_t { synchronous, asynchronous };

/// Deliberately broken variants of the protocol, for tests that must show the checks can fail.
/// Production code never sets anything but `none`.
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
};

constexpr std::string_view to_string(mode m) noexcept { return m == mode::xor_delta ? "xor" : "overwrite"; }
constexpr std::string_view to_string(gate_policy g) noexcept {
  return g == gate_policy::synchronous ? "sync" : "async";
}
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
  }
  return "?";
}
inline std::optional<protocol_mutation> mutation_from_string(std::string_view s) {
  if (s == "none") return protocol_mutation::none;
  for (auto m : all_mutations)
    if (to_string(m) == s) return m;
  return std::nullopt;
}

/// Configuration shared by every role of one cluster. Receivers are numbered 0..receivers-1 and
/// owners 0..owners-1 (an owner is a trainer rank that owns a stable subset of canonical elements).
struct protocol_config {
  gate_policy gate = gate_policy::synchronous;
  std::uint32_t owners = 1;
  std::uint32_t receivers = 1;
  /// Compare receivers' attestation digests against the expected ones before committing.
  bool attest = true;
  /// Attempts per transition before the coordinator stops retrying and waits for an operator
  /// (0: retry forever, which is what DESIGN asks for).
  std::uint32_t max_attempts = 0;
  protocol_mutation mutation = protocol_mutation::none;
  friend auto operator<=>(const protocol_config&, const protocol_config&) = default;
};

/// The commit record K = (v, g): every member and owner shares baseline version v, identified by g.
struct commit_record {
  version_t version = 0;
  baseline_id baseline{};
  friend constexpr auto operator<=>(const commit_record&, const commit_record&) = default;
};

/// A receiver bound to an attempt by (receiver index, incarnation). Messages from any other
/// incarnation of the same receiver count for nothing within that attempt.
struct member {
  std::uint32_t receiver = 0;
  std::uint64_t incarnation = 0;
  friend constexpr auto operator<=>(const member&, const member&) = default;
};

/// What the coordinator persists (compare-and-set on the epoch) before it announces an attempt.
/// A coordinator that takes over reads it back to finish or retry the transition.
struct prepare_record {
  attempt_id attempt{};
  commit_record base{};          // K when the attempt started
  version_t target = 0;          // base.version + 1
  baseline_id next{};            // g' that K takes if this attempt commits
  protocol::mode mode = mode::overwrite;
  bool xor_allowed = false;      // every member places every XOR tensor bit-preservingly
  std::vector<member> members;   // sorted by receiver
  std::vector<digest128> expected;  // expected attestation per receiver index (empty: not checked)
  /// The transition ended by abort at this attempt (re-persisted with this set BEFORE any member is
  /// told, so an abort is fenced by the log like every other decision, finding B6).
  bool aborted = false;
  friend auto operator<=>(const prepare_record&, const prepare_record&) = default;
};

/// The baseline id an attempt would commit: fresh per attempt and never 0 (0 is the initial g).
constexpr baseline_id baseline_of(attempt_id a) noexcept { return baseline_id{(a.epoch << 32) | (a.counter & 0xffffffffu)}; }

// ---------------------------------------------------------------------------------------------
// Hashing for state deduplication (model checker, RapidCheck shrinking caches).

namespace detail {
struct hasher {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void mix(std::uint64_t v) noexcept {
    v *= 0x9E3779B97F4A7C15ull;
    v ^= v >> 29;
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
};

template <class T>
  requires(std::is_integral_v<T> || std::is_enum_v<T>)
inline void hash_append(hasher& h, T v) noexcept {
  h.mix(static_cast<std::uint64_t>(v));
}
inline void hash_append(hasher& h, const attempt_id& a) noexcept { h.mix(a.epoch); h.mix(a.counter); }
inline void hash_append(hasher& h, const baseline_id& b) noexcept { h.mix(b.value); }
inline void hash_append(hasher& h, const digest128& d) noexcept { h.mix(d.low64); h.mix(d.high64); }
inline void hash_append(hasher& h, const payload_id& p) noexcept {
  hash_append(h, p.attempt);
  h.mix(p.owner);
  h.mix(p.seq);
}
inline void hash_append(hasher& h, const commit_record& k) noexcept { h.mix(k.version); h.mix(k.baseline.value); }
inline void hash_append(hasher& h, const member& m) noexcept { h.mix(m.receiver); h.mix(m.incarnation); }
inline void hash_append(hasher& h, const protocol_config& c) noexcept {
  hash_append(h, c.gate); h.mix(c.owners); h.mix(c.receivers); h.mix(c.attest); h.mix(c.max_attempts);
  hash_append(h, c.mutation);
}
template <class T>
void hash_append(hasher& h, const std::optional<T>& o);
template <class T>
void hash_append(hasher& h, const std::vector<T>& v);
template <class... T>
void hash_append(hasher& h, const std::variant<T...>& v);

inline void hash_append(hasher& h, const prepare_record& p) {
  hash_append(h, p.attempt); hash_append(h, p.base); h.mix(p.target); hash_append(h, p.next);
  hash_append(h, p.mode); h.mix(p.xor_allowed); hash_append(h, p.members); hash_append(h, p.expected);
  h.mix(p.aborted);
}

template <class T>
void hash_append(hasher& h, const std::optional<T>& o) {
  h.mix(o.has_value());
  if (o) hash_append(h, *o);
}
template <class T>
void hash_append(hasher& h, const std::vector<T>& v) {
  h.mix(v.size());
  for (const auto& x : v) hash_append(h, x);
}
template <class... T>
void hash_append(hasher& h, const std::variant<T...>& v) {
  h.mix(v.index());
  std::visit([&](const auto& x) { hash_append(h, x); }, v);
}
}  // namespace detail

/// Hash of any protocol value (states, messages, events, actions, the cluster world).
template <class T>
std::size_t hash_of(const T& x) {
  detail::hasher h;
  using detail::hash_append;
  hash_append(h, x);
  return static_cast<std::size_t>(h.h);
}

inline std::string to_string(const commit_record& k) {
  return "(v" + std::to_string(k.version) + ",g" + std::to_string(k.baseline.value) + ")";
}
inline std::string to_string(const member& m) {
  return "r" + std::to_string(m.receiver) + "#" + std::to_string(m.incarnation);
}

}  // namespace bitrefit::protocol
