// bitrefit/protocol/messages.hpp — the closed set of protocol messages and their addressing.
//
// A message is what one role sends another over the control plane (payloads travel on the data
// plane, but the protocol sees them as messages too: their bytes are represented by a digest of
// the verified frame). Every message may be lost, duplicated, delayed or reordered; every handler
// is idempotent under duplication. Messages of another attempt are ignored by id, never trusted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bitrefit/protocol/types.hpp"

namespace bitrefit::protocol {

enum class role : std::uint8_t { coordinator, owner, receiver };

/// One node: the (single active) coordinator, owner i or receiver i.
struct endpoint {
  protocol::role role = role::coordinator;
  std::uint32_t index = 0;
  friend constexpr auto operator<=>(const endpoint&, const endpoint&) = default;
  static constexpr endpoint coord() noexcept { return {role::coordinator, 0}; }
  static constexpr endpoint owner_(std::uint32_t i) noexcept { return {role::owner, i}; }
  static constexpr endpoint receiver_(std::uint32_t i) noexcept { return {role::receiver, i}; }
};

// ----- coordinator -> owners and receivers ----------------------------------------------------

/// Admits the members to attempt τ of the transition K.v -> target (DESIGN op. 1). Sent only after
/// the prepare record is durable. Owners freeze the change set and encode; receivers that find
/// themselves in `members` (same incarnation) join the attempt.
struct prepare_msg {
  prepare_record record;
  friend auto operator<=>(const prepare_msg&, const prepare_msg&) = default;
};

/// mark_obsolete(τ) (DESIGN op. 6): nothing of τ (or earlier) may be written any more. Receivers
/// answer with `stopped_msg` once no write of τ can still take effect on their device.
struct obsolete_msg {
  attempt_id attempt{};
  friend auto operator<=>(const obsolete_msg&, const obsolete_msg&) = default;
};

/// The owners' manifests of τ, relayed to the members: chunks[o] payloads from owner o. A receiver
/// applies in (owner, seq) order and acks only when every listed payload is applied.
struct open_msg {
  attempt_id attempt{};
  std::vector<std::uint32_t> chunks;
  friend auto operator<=>(const open_msg&, const open_msg&) = default;
};

/// Asynchronous mode: every member reported arrival; close the gate, drain, apply, ack.
struct flush_msg {
  attempt_id attempt{};
  friend auto operator<=>(const flush_msg&, const flush_msg&) = default;
};

/// The commit record, after it is durable (announcement; also the reply to a join). Idempotent.
/// It also tells the addressed receiver how the coordinator's roster holds it, because a join is
/// confirmed only by a message that names the joiner's incarnation (a lost join must not be
/// mistaken for an accepted one, finding B2): `roster` is the incarnation the roster admits for
/// this receiver (nullopt: it knows none), `evicted` that this incarnation is fenced and only a
/// new one, after a dense restore, can be admitted. A receiver that is not the incarnation named
/// joins again; one named as evicted restores. `confirm`: the roster's entry was not heard from the
/// receiver but taken over from the log (a coordinator that took over): the incarnation named
/// answers with a join, so that the entry stops being a guess (finding B7: the receiver may have
/// restarted, and a join its predecessor admitted, or a late copy of that predecessor's
/// announcement naming it, never reaches this coordinator). `epoch`: the sender's; the receiver
/// learns the current coordinator from it, and its joins say so (join_msg::epoch).
struct announce_msg {
  commit_record record{};
  std::optional<member> roster;
  bool evicted = false;
  bool confirm = false;
  std::uint64_t epoch = 0;
  friend auto operator<=>(const announce_msg&, const announce_msg&) = default;
};

/// Sent by a coordinator that took over (and at start): every receiver answers with a join_msg
/// naming its incarnation and the commit record it holds, so the roster can be rebuilt.
struct roll_call_msg {
  std::uint64_t epoch = 0;
  friend auto operator<=>(const roll_call_msg&, const roll_call_msg&) = default;
};

/// The transition ended by abort at attempt τ (an operator's, or the frozen target was lost):
/// receivers keep their gate closed until a dense refit. Sent only after the abort is durable in
/// the log (prepare record `aborted`), by the coordinator of `epoch`; a receiver ignores an abort
/// of an older epoch than one it has heard from, or of an attempt older than one it has seen.
struct abort_msg {
  std::uint64_t epoch = 0;
  attempt_id attempt{};
  friend auto operator<=>(const abort_msg&, const abort_msg&) = default;
};

// ----- owners -> receivers (data plane) -------------------------------------------------------

/// One chunk of owner `id.owner` for attempt `id.attempt`. `content` stands for the frame's bytes
/// (its digest); re-encoding the same chunk yields the same id and the same content.
struct payload_msg {
  payload_id id{};
  version_t base = 0;    // the version the delta was computed against (XOR needs exactly this)
  version_t target = 0;
  protocol::mode mode = mode::overwrite;
  digest128 content{};
  friend auto operator<=>(const payload_msg&, const payload_msg&) = default;
};

// ----- owners -> coordinator ------------------------------------------------------------------

/// Owner o finished encoding τ into `chunks` payloads (all handed to the transport).
struct manifest_msg {
  attempt_id attempt{};
  std::uint32_t owner = 0;
  std::uint32_t chunks = 0;
  friend auto operator<=>(const manifest_msg&, const manifest_msg&) = default;
};

/// Owner o holds baseline `at` (reply to every announcement; lets the coordinator re-announce to
/// owners that missed one).
struct baseline_msg {
  std::uint32_t owner = 0;
  commit_record at{};
  friend auto operator<=>(const baseline_msg&, const baseline_msg&) = default;
};

// ----- receivers -> coordinator ---------------------------------------------------------------

/// Asynchronous mode: every payload of the manifest is staged (arrival check passed).
struct arrived_msg {
  attempt_id attempt{};
  member from{};
  friend auto operator<=>(const arrived_msg&, const arrived_msg&) = default;
};

/// Every payload of τ is applied, queues drained, device synchronised; `attestation` is the digest
/// over the receiver's held ranges (absent when attestation is off).
struct ack_msg {
  attempt_id attempt{};
  member from{};
  std::optional<digest128> attestation;
  friend auto operator<=>(const ack_msg&, const ack_msg&) = default;
};

/// Reply to obsolete_msg: no write of τ can still take effect on this receiver.
struct stopped_msg {
  attempt_id attempt{};
  member from{};
  friend auto operator<=>(const stopped_msg&, const stopped_msg&) = default;
};

enum class failure_reason : std::uint8_t {
  conflicting_payload,  // same payload id, different verified bytes
  wrong_base,           // an XOR payload whose base is not the version this receiver holds
  not_at_base,          // admitted to an attempt whose base K this receiver does not hold
};
constexpr std::string_view to_string(failure_reason r) noexcept {
  switch (r) {
    case failure_reason::conflicting_payload: return "conflicting_payload";
    case failure_reason::wrong_base: return "wrong_base";
    case failure_reason::not_at_base: return "not_at_base";
  }
  return "?";
}

/// The attempt cannot succeed on this receiver.
struct failed_msg {
  attempt_id attempt{};
  member from{};
  failure_reason reason = failure_reason::conflicting_payload;
  friend auto operator<=>(const failed_msg&, const failed_msg&) = default;
};

/// Owner `owner` cannot encode attempt τ of the transition to `target`: it no longer holds the
/// frozen change set that the transition's admitted attempts delivered (the durable image is gone
/// or is not the one the prepare record names). No attempt of this transition can commit bits
/// equal to it, so the coordinator ends the transition by abort (finding B1).
struct frozen_lost_msg {
  attempt_id attempt{};
  std::uint32_t owner = 0;
  version_t target = 0;
  friend auto operator<=>(const frozen_lost_msg&, const frozen_lost_msg&) = default;
};

/// A (re)started or restored receiver holds exactly `at` and asks to be admitted at the next prepare.
/// `epoch`: the newest coordinator epoch the receiver had heard of when it sent this (from the log
/// at boot, a prepare, roll call, abort or announcement). A join proves its incarnation alive to
/// the coordinator of that epoch only: a copy can be delayed past a takeover and past the
/// incarnation's death, and a later incarnation that only the predecessor answered never joins
/// the new coordinator by itself (finding B7b). So a coordinator takes a join of an older epoch
/// as a guess it asks to confirm (announce_msg::confirm), as it does an entry rebuilt from the log.
struct join_msg {
  member from{};
  commit_record at{};
  std::uint64_t epoch = 0;
  friend auto operator<=>(const join_msg&, const join_msg&) = default;
};

/// The closed message set. The order of alternatives is also the priority a fair scheduler uses
/// (control before data), see sim/cluster.hpp.
using message = std::variant<prepare_msg, obsolete_msg, open_msg, flush_msg, announce_msg, roll_call_msg, abort_msg,
                             manifest_msg, arrived_msg, ack_msg, stopped_msg, failed_msg, join_msg,
                             baseline_msg, frozen_lost_msg, payload_msg>;

struct envelope {
  endpoint from{};
  endpoint to{};
  protocol::message msg;
  friend auto operator<=>(const envelope&, const envelope&) = default;
};

// ----- actions every role uses ----------------------------------------------------------------

/// Hand `env` to the transport. Sends are performed in the order the actions list them, and only
/// after every earlier action of the same step (e.g. "persist BEFORE send").
struct send_action {
  envelope env;
  friend auto operator<=>(const send_action&, const send_action&) = default;
};
/// Start (or restart) this node's single timer; when it expires feed `deadline_event`.
struct arm_deadline_action {
  friend auto operator<=>(const arm_deadline_action&, const arm_deadline_action&) = default;
};
/// Cancel the timer: a `deadline_event` that still arrives is ignored anyway.
struct disarm_deadline_action {
  friend auto operator<=>(const disarm_deadline_action&, const disarm_deadline_action&) = default;
};

// ----- events every role uses -----------------------------------------------------------------

/// A message arrived from the transport (for payloads: only after the frame's digest and structure
/// verified; a copy that does not verify is simply not delivered, see receiver.hpp).
struct message_event {
  envelope env;
  friend auto operator<=>(const message_event&, const message_event&) = default;
};
/// The timer armed by the last arm_deadline_action expired.
struct deadline_event {
  friend auto operator<=>(const deadline_event&, const deadline_event&) = default;
};

// ----- field lists (state hashing, trace JSON; core/fields.hpp) ----------------------------------
BITREFIT_FIELDS(endpoint, role, index)
BITREFIT_FIELDS(prepare_msg, record)
BITREFIT_FIELDS(obsolete_msg, attempt)
BITREFIT_FIELDS(open_msg, attempt, chunks)
BITREFIT_FIELDS(flush_msg, attempt)
BITREFIT_FIELDS(announce_msg, record, roster, evicted, confirm, epoch)
BITREFIT_FIELDS(roll_call_msg, epoch)
BITREFIT_FIELDS(abort_msg, epoch, attempt)
BITREFIT_FIELDS(payload_msg, id, base, target, mode, content)
BITREFIT_FIELDS(manifest_msg, attempt, owner, chunks)
BITREFIT_FIELDS(arrived_msg, attempt, from)
BITREFIT_FIELDS(ack_msg, attempt, from, attestation)
BITREFIT_FIELDS(stopped_msg, attempt, from)
BITREFIT_FIELDS(failed_msg, attempt, from, reason)
BITREFIT_FIELDS(baseline_msg, owner, at)
BITREFIT_FIELDS(join_msg, from, at, epoch)
BITREFIT_FIELDS(frozen_lost_msg, attempt, owner, target)
BITREFIT_FIELDS(envelope, from, to, msg)
BITREFIT_FIELDS(send_action, env)
BITREFIT_NO_FIELDS(arm_deadline_action)
BITREFIT_NO_FIELDS(disarm_deadline_action)
BITREFIT_FIELDS(message_event, env)
BITREFIT_NO_FIELDS(deadline_event)

}  // namespace bitrefit::protocol
