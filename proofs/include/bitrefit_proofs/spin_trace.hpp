// bitrefit_proofs/spin_trace.hpp — one run of the C++ machines as a trace that forces the Promela
// model (spin/refit.pml, -DTRACE) to follow it, so that the two models are checked against each
// other on the same scenarios and cannot drift apart silently (issue 19, item 4).
//
// A run (a scenario file, or a checker counterexample rendered as one) is replayed on model::cluster
// exactly as the scenario runner does (script.hpp: the same find_move, settle and run). Every move,
// with its effects, becomes zero or more Promela events by THE table below (`mapping`); the moves
// without a counterpart are free steps of the model or nothing there. spin then answers up to
// three questions on the constrained model (proofs/spin_trace.cpp runs it):
//   violation run: does some path along the trace violate an assertion?
//   goal run (-DTRACE_GOAL, assertions off): can the model follow the whole trace and then, with
//     no fault, end every transition with its roster converged (the liveness formula's goal)?
//   reach run (-DTRACE_REACH, assertions off; only where the goal run finds nothing): can the
//     model follow the whole trace?
// and the verdicts must agree: a run the C++ machines complete without violation must be followed
// by the model without violation, and the model must be able to end it exactly when the C++ world
// settles from the run's last state with no fault (translation::cpp_settles, by the random
// harness's settle phase, fuzz::settle); a run that ends in a C++ violation must make the
// model violate.
//
// The shared abstraction — what refit.pml can express — is smaller than the C++ world: 1 to 5
// receivers (an attempt may name any subset of them), 1–4 owners, at most 4 regions per receiver and
// 6 attempts in all, every payload of an
// attempt in that attempt's mode but the last overwrite_chunks of each owner (overwrite in an XOR
// attempt: the model's NOVW), sync or async gate (the model has no gate), every fault kind (an
// owner crash the loss of its highest_seen, and a prepare copy that then looks new to it a late
// prepare; a conflicting copy no event of its own, a sender restart the images it left
// (E_SRESTART) and then a failover, a commit-log fault on a claim at most a failover and a claim
// fault (E_CLAIM_UNKNOWN: applied, reply lost), one on a prepare or read at most a prepare event,
// a corrupt copy a drop, a
// member's failure report a deadline: see step()), a drop,
// duplicate or corruption of a payload only of the current attempt,
// and mutations only where the model has the same one. A run outside it is
// SKIPPED with the reason (never judged).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <string>
#include <variant>
#include <vector>

#include "bitrefit/protocol/model/script.hpp"
#include "bitrefit_proofs/random_schedules.hpp"

namespace bitrefit::proofs::spin {

/// Promela events (refit.pml's E_* constants, same numbers).
enum class event_kind : std::uint8_t {
  prep = 1, admit = 2, ingest = 3, ack = 4, deadline = 5, cas = 6, crash = 7, failover = 8, drop = 9, dup = 10,
  rejoin = 11, evict = 12, abort = 13, roll_call = 14, sender_restart = 15, owner_crash = 16, late_prepare = 17,
  stale_join = 18, claim_unknown = 19, join_lost = 20
};

/// THE mapping: C++ move (and what it did) -> Promela step. One row per event kind; every other
/// move maps to nothing (listed last). The translation below implements exactly these rows.
struct mapping_row {
  const char* cpp;
  const char* promela;
};
inline constexpr mapping_row mapping[] = {
    {"a prepare is persisted (`log ok persist_prepare`; model::cluster::attempts grows), naming members M",
     "coordinator: prepare d_step (E_PREP, y = M as a bitmask, a subset of the model's roster); the model's owners "
     "freeze and send at once"},
    {"receiver r's attempt becomes a new one (delivery of its prepare, or a deferred admission)",
     "receiver(r): admission to the model's attempt a (E_ADMIT r a)"},
    {"the move's effects contain `rR: apply τ/o/s` (a verified, new payload decoded and issued)",
     "receiver(r): INGEST(a(τ), o*NS+s) (E_INGEST); the model applies it at once (no device queue)"},
    {"`deliver rR->c ack τ` / `drop rR->c ack τ`, its sender still alive and in τ (else: no event); with a "
     "duplicated ack, the first copy delivered, or the last one dropped (the other copies: no event)",
     "receiver(r): ack step, delivered / lost branch (E_ACK r 0|1)"},
    {"`deadline c` while the coordinator is collecting, or `deliver rR->c failed τ` (a conflicting copy, a base it does "
     "not hold) that takes it from collecting to stopping",
     "coordinator: deadline during transfer (E_DEADLINE; the same mark_obsolete for a retry)"},
    {"`deadline c` while the coordinator is stopping (after a retry's, a failed commit's or a recovery's mark_obsolete)",
     "coordinator: stop_and_wait's deadline: members not stopped are evicted, the stop ends (E_EVICT)"},
    {"`log ok|unknown-applied|failed|unknown-lost compare_and_set`", "commit_log: option success / written-reply-lost / failed / not-written-lost (E_CAS 1..4)"},
    {"`crash rR`", "env: CRASH(r) (E_CRASH); the model's restart is its stale flag (restore at admission)"},
    {"`log ok claim_epoch eN`, N > 1, that takes effect (a new coordinator's claim fences the old one; between "
     "`failover` and this claim the old coordinator's requests may still land)",
     "env: failover (E_FAILOVER)"},
    {"`deliver rR->c join rR#n` that takes the coordinator from collecting to stopping (a newer incarnation of a member); "
     "under the mutation accept_old_incarnation_acks, such a join that leaves it collecting",
     "coordinator: the join of a newer incarnation during transfer: the roster learns it (rinc), the attempt is obsolete "
     "(E_REJOIN); under MUT_OLD_INCARNATION_ACKS it stays live and the newer incarnation is restored at the join's K"},
    {"`abort` (operator), or `deliver oO->c frozen_lost` (an owner lost the frozen change set), that takes the "
     "coordinator from collecting to stopping",
     "coordinator: abort (E_ABORT): mark_obsolete, stop_and_wait, then the abort is persisted and every member "
     "fenced (one free step; under MUT_UNFENCED_ABORT fenced only) and the transition starts afresh"},
    {"`drop oO->rR payload τ/O/S` or `corrupt oO->rR payload τ/O/S` (the copy fails verification and counts as "
     "undelivered: the receiver is not stepped), τ the current attempt",
     "env: DROP(r, O*NS+S) (E_DROP; DROPS counts drops and corruptions)"},
    {"`duplicate oO->rR payload τ/O/S`, τ the current attempt", "env: DUP(r, O*NS+S) (E_DUP)"},
    {"`restart sender` (the coordinator and every owner restart; the trainer moved on); M = the owners whose durable "
     "frozen image still holds the bits the log's uncommitted prepare names",
     "env: sender restart (E_SRESTART, y = M as a bitmask): the model's images F as M says, the trainer's bits "
     "(tflav) move on; its new coordinator's claim is the failover event that follows"},
    {"`deliver c->rR roll_call eN` to a live receiver",
     "receiver(r): the roll call's answer (E_ROLL_CALL r): it restarts first if it is in an attempt (ANSWER_ROLL_CALL)"},
    {"the roster takes a join of a dead incarnation of rR (`deliver rR->c join rR#n`, n below the live incarnation, "
     "to a roster that did not know r); after a new coordinator's claim (the failover event), each such entry its "
     "roster holds that the model's recovery does not restore (a receiver the persisted attempt does not name)",
     "coordinator: the roster names r's incarnation y back (E_STALE_JOIN r y; trace mode only: the model's own join "
     "step takes the live incarnation)"},
    {"`log unknown-applied claim_epoch eN` that takes effect (the log applied the claim, its reply is lost): after the "
     "failover event for N > 1, alone for the first coordinator's claim",
     "coordinator: the claim fault (E_CLAIM_UNKNOWN) right after that claim (the first one's at the coordinator's "
     "start, a failover's in its step): nothing changes (it reads its epoch back); under MUT_RECLAIM_UNKNOWN_EPOCH it "
     "is deposed"},
    {"`drop rR->c join rR#n` of r's live incarnation while it is joining (its join is lost)",
     "env: JOIN_LOST(r) (E_JOIN_LOST r): nothing changes (the receiver joins again when an announce does not name it); "
     "under MUT_JOIN_CONFIRMED_BY_ANY_ANNOUNCE it takes that announce for the join's confirmation and never joins "
     "again as that incarnation"},
    {"`crash oO`", "owner(o): its crash (E_OCRASH o): highest_seen is gone (ocrashed); broken, the sender epoch too"},
    {"`deliver c->oO prepare τ`, τ persisted before o's last crash (and after the last sender restart), that passes "
     "o's highest_seen check (a late or duplicated copy that looks new to it)",
     "owner(o): late_prepare(o, a(τ)) (E_LATE_PREP o a): ignored when its sender process is gone (H1) or its target "
     "is not above B (B3); else the monitor's checks, and a freeze only where the owner has no image"},
    {"`drop`/`duplicate` of any other message (prepare, open, flush, obsolete, stopped, announce, join, manifest, ...)",
     "no event: the model has no copy of it (its delivery is an event of its own or a free step)"},
    {"every other move: the first coordinator's claim, read replies, `failover` itself (its claim is the event), "
     "begin, the persisted abort, every other delivery of a prepare to an owner, manifest, open, flush, obsolete, stopped, announce, "
     "join, abort, device, restart rR, deadline rR, `conflict` (applied as the payload where it verifies first)",
     "no event (a free step of the model: owners' baseline read, commit request, stop completion, recovery, "
     "abort completion, a restore after eviction, a join outside transfer that updates the roster)"},
};

struct event {
  event_kind kind;
  std::uint32_t x = 0, y = 0;
  std::string from;  // the C++ move it came from
};

struct translation {
  std::optional<std::string> skip;  // why the run is outside the shared abstraction
  std::vector<event> events;
  std::vector<std::string> defines;  // spin -D flags (sizes, budgets, mutation)
  bool cpp_violation = false;
  std::string cpp_message;
  std::size_t moves = 0;
  /// Liveness on this run (one without a violation): from the run's last state, with no fault,
  /// does the C++ world settle (`settled()`: K at the last version, the roster converged, nothing
  /// in flight)? Decided by the harness's settle phase (fuzz::settle: the fair scheduler of the
  /// scenario command `run`); unset where the coordinator needs an operator. `liveness_note`:
  /// why it does not settle.
  std::optional<bool> cpp_settles;
  std::string liveness_note;

  /// The generated trace.pml (refit.pml includes it under -DTRACE).
  std::string trace_pml() const {
    std::string s = "/* generated by proofs/spin_trace.cpp: " + std::to_string(events.size()) + " events */\n";
    s += "#define TLEN " + std::to_string(std::max<std::size_t>(events.size(), 1)) + "\n";
    s += "inline trace_init() {\n";
    for (std::size_t i = 0; i < events.size(); ++i) {
      const auto& e = events[i];
      s += "  ev_k[" + std::to_string(i) + "] = " + std::to_string(int(e.kind)) + "; ev_x[" + std::to_string(i) +
           "] = " + std::to_string(e.x) + "; ev_y[" + std::to_string(i) + "] = " + std::to_string(e.y) + "; /* " +
           e.from + " */\n";
    }
    if (events.empty()) s += "  skip\n";
    s += "}\n";
    return s;
  }
};

/// The Promela mutation of a C++ one, if the model has it.
inline std::optional<std::string> promela_mutation(protocol::protocol_mutation m) {
  using M = protocol::protocol_mutation;
  switch (m) {
    case M::none: return std::string();
    case M::retry_by_xor: return std::string("-DMUT_XOR_RETRY");
    case M::commit_before_all_acks: return std::string("-DMUT_COMMIT_EARLY");
    case M::dedup_off: return std::string("-DMUT_DEDUP_OFF");
    case M::delta_against_uncommitted_base: return std::string("-DMUT_DELTA_UNCOMMITTED");
    case M::retry_without_stop_and_wait: return std::string("-DMUT_NO_STOP");
    case M::blind_write_commit: return std::string("-DMUT_BLIND_WRITE");
    case M::join_mid_attempt: return std::string("-DMUT_JOIN_MID_ATTEMPT");
    case M::accept_old_incarnation_acks: return std::string("-DMUT_OLD_INCARNATION_ACKS");
    case M::keep_dead_incarnation: return std::string("-DMUT_KEEP_DEAD_INCARNATION");
    case M::refreeze_at_restart: return std::string("-DMUT_REFREEZE_AT_RESTART");
    case M::freeze_stale_prepare: return std::string("-DMUT_FREEZE_STALE_PREPARE");
    case M::owner_forgets_sender_epoch: return std::string("-DMUT_OWNER_FORGETS_SENDER_EPOCH");
    case M::unfenced_abort: return std::string("-DMUT_UNFENCED_ABORT");
    case M::reclaim_unknown_epoch: return std::string("-DMUT_RECLAIM_UNKNOWN_EPOCH");
    case M::join_confirmed_by_any_announce: return std::string("-DMUT_JOIN_CONFIRMED_BY_ANY_ANNOUNCE");
    default: return std::nullopt;
  }
}

namespace detail {

template <class W>
struct translator {
  translation t;
  std::optional<W> w;
  protocol::model::world_config cfg;
  std::map<attempt_id, std::uint32_t> promela_attempt;  // C++ attempt -> the model's `cur` number
  protocol::envelope t_inflight_before{};  // the message a deliver move carries
  /// Per owner: how many attempts were persisted when it last crashed (0: not since the last
  /// sender restart, whose owners have seen every persisted prepare). A prepare of one of those
  /// that gets past its highest_seen check is a late copy: the model's owner took it at persistence.
  std::vector<std::uint32_t> persisted_at_owner_crash;

  void skip(const std::string& why) {
    if (!t.skip) t.skip = why;
  }

  void world(const std::string& args) {
    cfg = protocol::model::parse_world(args);
    w.emplace(cfg);
    const auto& p = cfg.protocol;
    if (p.receivers < 1 || p.receivers > 5) skip("receivers=" + std::to_string(p.receivers) + ": the model has 1 to 5");
    if (p.owners < 1 || p.owners > 4) skip("owners=" + std::to_string(p.owners) + ": the model has 1 to 4");
    if (p.owners * cfg.chunks_per_owner > 4) skip("more than 4 regions per receiver");
    if (cfg.transitions > 4) skip("more than 4 transitions");
    auto mut = promela_mutation(cfg.mutation);
    if (!mut) skip("mutation " + std::string(to_string(cfg.mutation)) + " has no Promela counterpart");
    // A sender restart brings a new coordinator too: the model's failover (see step()).
    t.defines = {"-DNR=" + std::to_string(p.receivers), "-DNO=" + std::to_string(p.owners),
                 "-DNS=" + std::to_string(cfg.chunks_per_owner), "-DNTRANS=" + std::to_string(cfg.transitions),
                 "-DCRASHES=" + std::to_string(cfg.crashes),
                 "-DFAILOVERS=" + std::to_string(cfg.failovers + cfg.sender_restarts),
                 "-DSRESTARTS=" + std::to_string(cfg.sender_restarts),
                 "-DOCRASHES=" + std::to_string(cfg.owner_crashes),
                 "-DDROPS=" + std::to_string(cfg.drops + cfg.corruptions), "-DDUPS=" + std::to_string(cfg.duplicates),
                 "-DNOVW=" + std::to_string(cfg.overwrite_chunks)};
    if (mut && !mut->empty()) t.defines.push_back(*mut);
    persisted_at_owner_crash.assign(p.owners, 0);
  }

  void add(event_kind k, std::uint32_t x, std::uint32_t y, const std::string& from) { t.events.push_back({k, x, y, from}); }

  std::optional<std::uint32_t> attempt_no(const attempt_id& a) {
    auto it = promela_attempt.find(a);
    if (it == promela_attempt.end()) return std::nullopt;
    return it->second;
  }
  std::uint32_t current_attempt() const { return std::uint32_t(promela_attempt.size()); }

  /// After a sender restart: the owners whose durable frozen image holds the bits the log's
  /// uncommitted prepare names (bit o), the images a retry of it can send from. With no such
  /// prepare none: the next prepare is a transition's first, which freezes afresh.
  static std::uint32_t sender_restart_images(const W& cw) {
    const auto& p = cw.log.state.prepared;
    if (!p || p->aborted || p->target <= cw.log.state.record.version) return 0;
    std::uint32_t mask = 0;
    for (std::uint32_t o = 0; o < cw.stores.size(); ++o) {
      const auto& img = cw.stores[o].frozen;
      if (img && img->target == p->target && o < p->frozen.size() &&
          protocol::model::frozen_identity(o, img->target, img->flavor) == p->frozen[o])
        mask |= 1u << o;
    }
    return mask;
  }

  /// The model sends and delivers an ack in one step of the receiver, inside its attempt: an ack
  /// that arrives after its sender died or moved to another attempt is no event there (the model's
  /// crash loses it; a late ack of another attempt is ignored on arrival in both).
  bool ack_of_current(const protocol::ack_msg& ak) const {
    const auto& rc = w->receivers.at(ak.from.receiver);
    return rc && rc->incarnation == ak.from.incarnation && rc->attempt && rc->attempt->attempt == ak.attempt;
  }

  /// A duplicated ack: the model's one ack step is "delivered" when the first copy arrives and
  /// "lost" only when the last copy is dropped (the coordinator takes an ack once; a second copy
  /// changes nothing). Per ack: the extra copies in flight, and whether its event was emitted.
  using ack_key = std::tuple<std::uint32_t, decltype(protocol::member{}.incarnation), attempt_id>;
  std::map<ack_key, std::uint32_t> ack_extra_copies;
  std::set<ack_key> ack_emitted;
  static ack_key key_of(const protocol::ack_msg& ak) { return {ak.from.receiver, ak.from.incarnation, ak.attempt}; }
  void ack_arrives(const protocol::ack_msg& ak, bool lost, const std::string& text) {
    const auto k = key_of(ak);
    if (ack_emitted.count(k)) return;
    if (lost && ack_extra_copies[k] > 0) {  // another copy is still in flight
      --ack_extra_copies[k];
      return;
    }
    if (!ack_of_current(ak)) return;
    add(event_kind::ack, ak.from.receiver, lost ? 1 : 0, text);
    ack_emitted.insert(k);
  }

  /// The incarnation of receiver r the model holds as live: a crashed receiver restarts at once
  /// there (refit.pml RESTART), as the next incarnation its C++ `restart rR` will be.
  static std::uint64_t live_incarnation(const W& cw, std::uint32_t r) {
    return cw.receivers.at(r) ? cw.receivers[r]->incarnation : cw.incarnations.at(r) + 1;
  }
  /// Receiver r's roster entry names a dead incarnation that can be named (not evicted, at K): how
  /// many incarnations back it is (0: none such).
  static std::uint64_t stale_roster_entry(const W& cw, std::uint32_t r) {
    const auto& e = cw.coord.roster.at(r);
    const auto live = live_incarnation(cw, r);
    if (!e.known || e.evicted || e.at != cw.log.state.record || e.incarnation >= live) return 0;
    return live - e.incarnation;
  }

  /// Apply one move and translate it (the table above, row by row).
  void step(const protocol::model::move& m) {
    using protocol::model::move_kind;
    W& cw = *w;
    const std::string text = cw.describe(m);
    ++t.moves;
    bool claim_took_effect = false;  // a new coordinator's claim: the model's failover (RECALL)
    // The move's own event (before its effects).
    switch (m.kind) {
      case move_kind::conflict:
        // No event of its own: the copy is delivered with other bytes. The world's regions take
        // their bits from the payload's id, mode and target, never from its bytes (cluster.hpp,
        // complete_write), so a conflicting copy the receiver verifies first is applied as the
        // payload: that apply is an INGEST (below), and the model's bag keeps one copy more (never
        // ingested: dedup). One that arrives after a copy with other bytes makes the receiver
        // report its attempt failed; the report's arrival is the coordinator's obsolete (below).
        break;
      case move_kind::owner_crash:
        // An owner restarts from its durable baseline, frozen change set and sender epoch
        // (owner.hpp, `recovered`) and loses the attempt it was encoding (the model's owner never
        // has one: it encodes and sends a whole attempt at prepare) and highest_seen: the model's
        // ocrashed, after which a late or duplicated prepare may look new (E_LATE_PREP, below).
        // Copies it encodes again are dropped or deduplicated by receivers, and any one a receiver
        // applies is an INGEST the model must follow from its own bag (a run it cannot follow is
        // a disagreement, never a silent pass). The coordinator's deadline that a lost manifest
        // forces is a deadline event of its own.
        add(event_kind::owner_crash, m.index, 0, text);
        persisted_at_owner_crash.at(m.index) = current_attempt();
        break;
      case move_kind::sender_restart:
        // Its event comes after the move (which images survived it: sender_restart_images); the
        // new coordinator's claim is the failover event (below), and the owners restart as after
        // an owner crash. Where the frozen change set is gone or replaced, the retry's owner
        // answers frozen_lost (the model's owner too: its image F), and the coordinator aborts:
        // the abort event.
        break;
      case move_kind::crash:
        // An ack this receiver sent in its attempt and that is still in flight outlives the crash:
        // the C++ coordinator may still take it (it names a member incarnation), and commit on it.
        // The model sends and delivers an ack in one step of the receiver, which its crash would
        // lose: the ack step is taken now, as delivered, before the crash (found by
        // `--random=100 --seed=6`, run 9). Whatever then happens to the copy is no event; had it
        // been lost, the model's coordinator holds an ack the C++ one lacks, which only lets it
        // request a commit the run never shows (the log's outcome is an event).
        for (const auto& e : cw.inflight)
          if (const auto* ak = std::get_if<protocol::ack_msg>(&e.msg); ak && ak->from.receiver == m.index)
            ack_arrives(*ak, false, text + " (its ack " + protocol::fmt::str(ak->attempt) + " is in flight)");
        add(event_kind::crash, m.index, 0, text);
        break;
      case move_kind::deadline:
        if (m.index == 0 && cw.coord.phase == protocol::coordinator_phase::collecting)
          add(event_kind::deadline, 0, 0, text);
        else if (m.index == 0 && cw.coord.phase == protocol::coordinator_phase::stopping)
          add(event_kind::evict, 0, 0, text);
        break;
      case move_kind::log_ok:
      case move_kind::log_failed:
      case move_kind::log_unknown_applied:
      case move_kind::log_unknown_lost: {
        const auto& req = cw.log_queue.at(m.index).request;
        const bool applied = m.kind == move_kind::log_ok || m.kind == move_kind::log_unknown_applied;
        if (const auto* claim = std::get_if<protocol::claim_epoch_request>(&req)) {
          // The model's failover is the new coordinator's claim taking effect in the log: until
          // then the old coordinator's prepare or compare-and-set may still land (found when a
          // prepare persisted after the `failover` move could not be followed). A claim that
          // fails, or whose reply is lost, is the same event if the log applied it (the
          // coordinator reads the epoch back), and nothing if it did not (it claims again).
          // A claim the log applied whose reply is lost is the claim fault too, after its failover
          // (the first coordinator's claim has no event of its own): the coordinator learns only
          // from the read that follows that the epoch is its own (finding B4).
          if (applied && claim->epoch > cw.log.state.epoch) {
            if (claim->epoch > 1) {
              add(event_kind::failover, 0, 0, text);
              claim_took_effect = true;
            }
            if (m.kind == move_kind::log_unknown_applied) add(event_kind::claim_unknown, 0, 0, text);
          }
        } else if (std::holds_alternative<protocol::compare_and_set_request>(req)) {
          const std::uint32_t y = m.kind == move_kind::log_ok ? 1 : m.kind == move_kind::log_unknown_applied ? 2
                                : m.kind == move_kind::log_failed ? 3 : 4;
          add(event_kind::cas, 0, y, text);
        }
        // A prepare the log applied (whatever reached the coordinator) is handled with the effects
        // below; one it did not apply changed nothing durable (the coordinator asks again or gives
        // the attempt up, its next event says which). A persisted abort is a free step, and a
        // read (read_commit, a failed one retried) changes nothing in the log.
        break;
      }
      case move_kind::drop:
      case move_kind::corrupt:  // fails verification: undelivered, the receiver is not stepped (cluster.hpp)
      case move_kind::duplicate: {
        const auto& e = cw.inflight.at(m.index);
        if (const auto* p = std::get_if<protocol::payload_msg>(&e.msg)) {
          auto a = attempt_no(p->id.attempt);
          if (!a || *a != current_attempt()) {
            skip("`" + text + "`: the model drops/duplicates/corrupts copies of the current attempt only");
            break;
          }
          add(m.kind == move_kind::duplicate ? event_kind::dup : event_kind::drop, e.to.index,
              p->id.owner * cfg.chunks_per_owner + p->id.seq, text);
        } else if (const auto* jn = std::get_if<protocol::join_msg>(&e.msg)) {
          // The live incarnation's join, lost while it waits for the confirmation: finding B2's
          // point (the shipped receiver joins again when an announce does not name it; the old
          // rule took any announce of its K for the confirmation). A dead incarnation's join, or
          // a duplicate, is no event.
          if (fuzz::drops_a_live_join(cw, m)) add(event_kind::join_lost, jn->from.receiver, 0, text);
        } else if (const auto* ak = std::get_if<protocol::ack_msg>(&e.msg)) {
          if (m.kind == move_kind::drop) ack_arrives(*ak, true, text);
          else if (!ack_emitted.count(key_of(*ak))) ++ack_extra_copies[key_of(*ak)];
        }
        // Any other message has no copy in the model: losing or duplicating it is no event (what
        // its delivery would have done is an event of its own, or a free step).
        break;
      }
      case move_kind::deliver: {
        const auto& e = cw.inflight.at(m.index);
        if (const auto* ak = std::get_if<protocol::ack_msg>(&e.msg)) ack_arrives(*ak, false, text);
        // A roll call reaches a live receiver: it restores first if it is in an attempt, and the
        // model must decide the same (its ANSWER_ROLL_CALL), or a later join cannot follow.
        if (std::holds_alternative<protocol::roll_call_msg>(e.msg) && e.to.role == protocol::role::receiver &&
            cw.receivers.at(e.to.index))
          add(event_kind::roll_call, e.to.index, 0, text);
        // A prepare persisted before the owner's last crash that gets past its highest_seen: the
        // model's owner takes it as late (late_prepare), ignoring or freezing it by the same rules.
        if (const auto* pm = std::get_if<protocol::prepare_msg>(&e.msg); pm && e.to.role == protocol::role::owner) {
          const auto a = attempt_no(pm->record.attempt);
          const auto crashed_at = persisted_at_owner_crash.at(e.to.index);
          if (a && *a <= crashed_at && cw.owners.at(e.to.index).highest_seen < pm->record.attempt)
            add(event_kind::late_prepare, e.to.index, *a, text);
        }
        break;
      }
      default: break;
    }
    // Effects.
    if (m.kind == move_kind::deliver) t_inflight_before = cw.inflight.at(m.index);
    const std::size_t attempts_before = cw.attempts.size();
    std::vector<std::optional<attempt_id>> admitted(cw.receivers.size());
    for (std::size_t r = 0; r < cw.receivers.size(); ++r)
      if (cw.receivers[r] && cw.receivers[r]->attempt) admitted[r] = cw.receivers[r]->attempt->attempt;
    const auto phase_before = cw.coord.phase;
    // A join delivered to the coordinator (read before the move): whether it is a newer incarnation
    // of one of the current attempt's members, and its roster entry before (stale joins, below).
    const auto* join = m.kind == move_kind::deliver ? std::get_if<protocol::join_msg>(&t_inflight_before.msg) : nullptr;
    bool newer_member_join = false;
    if (join && cw.coord.attempt)
      for (const auto& mb : cw.coord.attempt->members)
        newer_member_join |= mb.receiver == join->from.receiver && mb.incarnation < join->from.incarnation;
    std::optional<std::pair<std::uint32_t, protocol::roster_entry>> join_roster_before;
    if (join && join->from.receiver < cw.coord.roster.size())
      join_roster_before.emplace(join->from.receiver, cw.coord.roster[join->from.receiver]);
    std::vector<std::string> trace;
    cw.apply(m, &trace);
    // The roster names a dead incarnation: taken from a join now, or kept across a new
    // coordinator's claim where the model's recovery (RECALL) forgets it.
    if (join_roster_before && cw.coord.roster.at(join_roster_before->first) != join_roster_before->second)
      if (const auto back = stale_roster_entry(cw, join_roster_before->first))
        add(event_kind::stale_join, join_roster_before->first, std::uint32_t(back), text);
    if (claim_took_effect) {
      const auto& p = cw.log.state.prepared;
      for (std::uint32_t r = 0; r < cw.coord.roster.size(); ++r) {
        bool recalled = false;  // RECALL restores the persisted attempt's members
        if (p && !p->aborted)
          for (const auto& mb : p->members) recalled |= mb.receiver == r;
        if (recalled) continue;
        if (const auto back = stale_roster_entry(cw, r)) add(event_kind::stale_join, r, std::uint32_t(back), text);
      }
    }
    if (m.kind == move_kind::sender_restart) {
      add(event_kind::sender_restart, 0, sender_restart_images(cw), text);
      std::fill(persisted_at_owner_crash.begin(), persisted_at_owner_crash.end(), 0u);  // restarted owners have seen every persisted prepare
    }
    // The attempt became obsolete in this move (other than by the coordinator's deadline): the
    // coordinator left collecting to stop it. Usually it is stopping now; where every member has
    // stopped at once (one receiver, whose newer incarnation's join counts as the dead one's stop)
    // it is already preparing the retry, persisting the abort, or stuck (found with 1 receiver).
    // (A failover or sender restart replaces the coordinator: its claim is the failover event.)
    using phase_t = protocol::coordinator_phase;
    const auto after = cw.coord.phase;
    const bool stopped_it = after == phase_t::stopping || after == phase_t::preparing || after == phase_t::aborting ||
                            after == phase_t::stuck;
    if (phase_before == phase_t::collecting && stopped_it && !(m.kind == move_kind::deadline && m.index == 0) &&
        m.kind != move_kind::failover && m.kind != move_kind::sender_restart) {
      const auto* e = m.kind == move_kind::deliver ? &t_inflight_before : nullptr;
      if (e && std::holds_alternative<protocol::join_msg>(e->msg)) add(event_kind::rejoin, 0, 0, text);
      // A member reports its attempt failed (a conflicting copy, or not at the base): the
      // coordinator makes it obsolete for a retry, exactly as at its deadline during transfer.
      else if (e && std::holds_alternative<protocol::failed_msg>(e->msg)) add(event_kind::deadline, 0, 0, text);
      else if (m.kind == move_kind::abort || (e && std::holds_alternative<protocol::frozen_lost_msg>(e->msg)))
        add(event_kind::abort, 0, 0, text);
      else skip("`" + text + "` makes the attempt obsolete: the model has no such rule");
    }
    // The same join leaving the attempt live: only the mutation accept_old_incarnation_acks does
    // (the shipped coordinator always makes it obsolete, above; were it ever not to, the model
    // could not follow the run and the check would say so); its twin takes E_REJOIN that way.
    if (cfg.mutation == protocol::protocol_mutation::accept_old_incarnation_acks &&
        phase_before == phase_t::collecting && after == phase_t::collecting && newer_member_join)
      add(event_kind::rejoin, 0, 0, text);
    if (cw.attempts.size() > attempts_before) {  // a prepare persisted
      for (const auto& note : cw.attempts)
        if (!promela_attempt.count(note.attempt)) {
          const auto n = std::uint32_t(promela_attempt.size() + 1);
          promela_attempt[note.attempt] = n;
          if (n > 6) skip("more than 6 attempts in all (the model's option lists stop at 6)");
          // A prepare may name a dead incarnation (the newer one's join has not reached the
          // coordinator yet): the model's coordinator binds its roster's incarnations (rinc), which
          // learn of a restart only at the join (refit.pml), so it can too. It names the members
          // the run names (E_PREP's y), which must be ones the model's roster holds.
          std::uint32_t members = 0;
          for (const auto& mb : note.members) members |= 1u << mb.receiver;
          add(event_kind::prep, 0, members, text);
        }
    }
    for (std::size_t r = 0; r < cw.receivers.size(); ++r) {
      std::optional<attempt_id> now;
      if (cw.receivers[r] && cw.receivers[r]->attempt) now = cw.receivers[r]->attempt->attempt;
      if (now && now != admitted[r]) {
        // The receiver may admit an attempt the coordinator has already given up (deadline,
        // failover, failed commit) while its prepare was in flight, and stop on the obsolete that
        // follows; the model's receivers do too (refit.pml, `heard`), and admit a late prepare of
        // an older attempt of the transition after a newer one was prepared. E_ADMIT names the
        // attempt (the model's number): the model judges whether its receiver may admit it.
        auto no = attempt_no(*now);
        if (!no) {
          skip("`" + text + "`: r" + std::to_string(r) + " admits " + protocol::fmt::str(*now) + ", never persisted");
          continue;
        }
        add(event_kind::admit, std::uint32_t(r), *no, text);
      }
    }
    static const std::regex apply_line(R"(^r(\d+): apply (\d+)\.(\d+)/(\d+)/(\d+) )");
    for (const auto& line : trace) {
      std::smatch mt;
      if (!std::regex_search(line, mt, apply_line)) continue;
      const attempt_id a{std::stoull(mt[2]), std::stoull(mt[3])};
      auto no = attempt_no(a);
      if (!no) {
        skip("`" + line + "`: an apply of an attempt never persisted");
        continue;
      }
      const std::uint32_t region = std::uint32_t(std::stoul(mt[4]) * cfg.chunks_per_owner + std::stoul(mt[5]));
      add(event_kind::ingest, std::uint32_t(std::stoul(mt[1])), *no * 8 + region, text + " [" + line + "]");
    }
    if (auto v = cw.check_invariants(); v && !t.cpp_violation) {
      t.cpp_violation = true;
      t.cpp_message = *v;
    }
  }

  /// One scenario command, as basic_script_runner::run interprets it.
  void command(const std::string& line) {
    std::istringstream in(line);
    std::string cmd, rest;
    in >> cmd;
    std::getline(in, rest);
    if (cmd == "world") return world(rest);
    if (!w || t.cpp_violation) return;  // nothing after the first violation is judged
    if (cmd == "state" || cmd == "inflight" || cmd == "moves" || cmd == "check") return;
    if (protocol::model::is_fair_command(cmd)) {
      protocol::model::run_fair_command(*w, cmd, rest, [&](const protocol::model::move& m) {
        step(m);
        return t.cpp_violation;
      });
      return;
    }
    auto m = w->find_move(line);
    if (!m) {
      skip("`" + line + "` matches no enabled move");
      return;
    }
    step(*m);
  }
};

}  // namespace detail

/// Translate a scenario file's text: one translation per `world` line (a file may hold several
/// worlds in sequence).
inline std::vector<translation> translate_scenario_worlds(const std::string& text);

/// Translate a scenario file's text (a single world).
inline translation translate_scenario(const std::string& text) {
  // The world line decides the world type, as script_runner does.
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> commands;
  enum { want_command, want_sep, in_output } st = want_command;
  while (std::getline(in, line)) {
    if (st == want_command) {
      if (line.empty() || line[0] == '#') continue;
      commands.push_back(line);
      st = want_sep;
    } else if (st == want_sep) {
      st = in_output;
    } else if (line.empty()) {
      st = want_command;
    }
  }
  bool mutated = false;
  for (const auto& c : commands)
    if (c.rfind("world ", 0) == 0) mutated = protocol::model::parse_world(c.substr(6)).mutation != protocol::protocol_mutation::none;
  auto go = [&](auto tr) {
    for (const auto& c : commands) tr.command(c);
    if (!tr.w) tr.skip("no world line");
    // Evictions, aborts and claim faults are budgeted by the run itself (the world line has no bound for them):
    // exactly as many as it took, so a free tail after a C++ violation stays within them too.
    std::size_t evicts = 0, aborts = 0, claim_faults = 0;
    for (const auto& e : tr.t.events) {
      evicts += e.kind == event_kind::evict;
      aborts += e.kind == event_kind::abort;
      claim_faults += e.kind == event_kind::claim_unknown;
    }
    tr.t.defines.push_back("-DEVICTS=" + std::to_string(evicts));
    tr.t.defines.push_back("-DABORTS=" + std::to_string(aborts));
    tr.t.defines.push_back("-DCFAULTS=" + std::to_string(claim_faults));
    if (tr.w && !tr.t.cpp_violation && !tr.t.skip) {
      auto end = *tr.w;  // the run's last state; the run itself is not changed
      // The harness's settle phase: the fair scheduler, no fault, until settled (or why not),
      // within the harness's bound of fair moves.
      const auto why = fuzz::settle(end, fuzz::options{}.settle_bound);
      if (why) tr.t.liveness_note = *why;
      // A coordinator out of attempts waits for an operator (max_attempts); the model has no
      // such bound on a transition's attempts, so there is nothing to compare.
      if (!end.stuck) tr.t.cpp_settles = !why;
    }
    return tr.t;
  };
  return mutated ? go(detail::translator<protocol::model::mutated_cluster>{})
                 : go(detail::translator<protocol::model::cluster>{});
}

inline std::vector<translation> translate_scenario_worlds(const std::string& text) {
  std::vector<std::string> parts;  // each from a world line to the next
  std::istringstream in(text);
  std::string line, cur;
  bool has_world = false;
  while (std::getline(in, line)) {
    if (line.rfind("world ", 0) == 0) {
      if (has_world) {
        parts.push_back(cur);
        cur.clear();
      }
      has_world = true;
    }
    cur += line + "\n";
  }
  parts.push_back(cur);
  std::vector<translation> out;
  for (const auto& p : parts) out.push_back(translate_scenario(p));
  return out;
}

}  // namespace bitrefit::proofs::spin
