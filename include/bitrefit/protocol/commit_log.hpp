// bitrefit/protocol/commit_log.hpp — the semantics of the durable commit log, as a pure value.
//
// The durable implementations (durability/, the engine issue) must behave exactly like
// `commit_log::apply`: every request is linearizable and applied atomically. The log holds the
// coordinator epoch (fence), the commit record K and the latest prepare record.
//
// Laws:
//  - claim_epoch(e) succeeds iff e > epoch; afterwards every request of an older epoch is `fenced`.
//  - persist_prepare and compare_and_set succeed only from the current epoch.
//  - compare_and_set(expected, desired) changes K iff K == expected (else `conflict`), so K's version
//    rises by exactly one per commit and never from a record the writer did not see.
//  - An `unknown` outcome (a timeout on the caller's side) means the request either took effect or
//    never will; a later `read` tells which. `failed` means it certainly did not take effect.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>

#include "bitrefit/protocol/types.hpp"

namespace bitrefit::protocol {

/// Fence a new coordinator: every later request of a lower epoch is refused.
struct claim_epoch_request {
  std::uint64_t epoch = 0;
  friend auto operator<=>(const claim_epoch_request&, const claim_epoch_request&) = default;
};
/// Persist the prepare record of a new attempt (replaces the previous one).
struct persist_prepare_request {
  std::uint64_t epoch = 0;
  prepare_record record;
  friend auto operator<=>(const persist_prepare_request&, const persist_prepare_request&) = default;
};
/// commit(τ): K from `expected` to `desired`, only if K == expected and the epoch is current.
struct compare_and_set_request {
  std::uint64_t epoch = 0;
  attempt_id attempt{};
  commit_record expected{};
  commit_record desired{};
  friend auto operator<=>(const compare_and_set_request&, const compare_and_set_request&) = default;
};
/// read_commit: the current contents.
struct read_request {
  friend auto operator<=>(const read_request&, const read_request&) = default;
};

using log_request = std::variant<claim_epoch_request, persist_prepare_request, compare_and_set_request, read_request>;

enum class log_outcome : std::uint8_t {
  ok,        // applied (for read: the snapshot is current)
  fenced,    // refused: the request's epoch is not the log's epoch (another coordinator took over)
  conflict,  // compare-and-set refused: K != expected
  failed,    // certainly not applied (transient error); the caller may retry
  unknown,   // may or may not have been applied; resolve with a read
};
constexpr std::string_view to_string(log_outcome o) noexcept {
  switch (o) {
    case log_outcome::ok: return "ok";
    case log_outcome::fenced: return "fenced";
    case log_outcome::conflict: return "conflict";
    case log_outcome::failed: return "failed";
    case log_outcome::unknown: return "unknown";
  }
  return "?";
}

/// The log's contents.
struct log_snapshot {
  std::uint64_t epoch = 0;
  commit_record record{};
  std::optional<prepare_record> prepared;
  friend auto operator<=>(const log_snapshot&, const log_snapshot&) = default;
};

/// The reply to one request. `snapshot` is the state after the request when the outcome is ok,
/// fenced or conflict; it is meaningless (default) for failed and unknown.
struct log_reply {
  log_request request;
  log_outcome outcome = log_outcome::ok;
  log_snapshot snapshot;
  friend auto operator<=>(const log_reply&, const log_reply&) = default;
};

/// The pure commit log. The mutation policy (mutation.hpp) lets tests break compare-and-set on
/// purpose; `commit_log` is the shipped one.
template <MutationPolicy Mut = no_mutation>
struct basic_commit_log {
  log_snapshot state;
  [[no_unique_address]] Mut mutation{};

  basic_commit_log() = default;
  explicit basic_commit_log(commit_record initial, Mut m = {}) : state{0, initial, std::nullopt}, mutation(m) {}

  /// Apply one request atomically and return its reply (never failed/unknown: those are outcomes a
  /// faulty channel produces around a log, see sim/cluster.hpp).
  log_reply apply(const log_request& req) {
    log_reply r{req, log_outcome::ok, {}};
    std::visit(
        [&](const auto& q) {
          using Q = std::decay_t<decltype(q)>;
          if constexpr (std::is_same_v<Q, claim_epoch_request>) {
            if (q.epoch > state.epoch) state.epoch = q.epoch;
            else r.outcome = log_outcome::fenced;
          } else if constexpr (std::is_same_v<Q, persist_prepare_request>) {
            if (q.epoch == state.epoch) state.prepared = q.record;
            else r.outcome = log_outcome::fenced;
          } else if constexpr (std::is_same_v<Q, compare_and_set_request>) {
            if (broken(mutation, protocol_mutation::blind_write_commit)) {
              state.record = q.desired;  // the broken variant: no epoch fence, no comparison
            } else if (q.epoch != state.epoch) {
              r.outcome = log_outcome::fenced;
            } else if (state.record != q.expected) {
              r.outcome = log_outcome::conflict;
            } else {
              state.record = q.desired;
            }
          }
        },
        req);
    r.snapshot = state;
    return r;
  }

  friend bool operator==(const basic_commit_log&, const basic_commit_log&) = default;
};
using commit_log = basic_commit_log<>;

BITREFIT_FIELDS(claim_epoch_request, epoch)
BITREFIT_FIELDS(persist_prepare_request, epoch, record)
BITREFIT_FIELDS(compare_and_set_request, epoch, attempt, expected, desired)
BITREFIT_NO_FIELDS(read_request)
BITREFIT_FIELDS(log_snapshot, epoch, record, prepared)
BITREFIT_FIELDS(log_reply, request, outcome, snapshot)
BITREFIT_FIELDS_T(template <class M>, basic_commit_log<M>, state, mutation)

}  // namespace bitrefit::protocol
