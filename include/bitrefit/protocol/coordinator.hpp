// bitrefit/protocol/coordinator.hpp — the coordinator state machine (one active at a time, fenced by
// its epoch in the commit log).
//
// Events (coordinator_event):
//   start_event               boot: claim the epoch (an unknown outcome is resolved by reading the
//                             log), then finish or retry whatever the log says
//   begin_transition_event    the trainer has version K.v+1 ready (target, XOR allowed, expected digests)
//   message_event             manifest / arrived / ack / stopped / failed / join from owners and receivers
//   log_event                 the commit log's reply to the last log_action
//   deadline_event            the armed timer expired
//   operator_abort_event      an operator gives up on the transition
// Actions (coordinator_action), performed in list order:
//   log_action                call the commit log; feed the reply back as log_event. It is always the
//                             LAST action of a step: everything this coordinator sends afterwards
//                             depends on the reply ("persist BEFORE send", "K durable BEFORE told").
//   send_action               hand a message to the transport (after every earlier action)
//   arm_deadline_action / disarm_deadline_action
//   fence_receiver_action     the transport must drop anything from this incarnation from now on
//   cleanup_action            stop_and_wait(τ) is complete: τ's payload objects may be deleted
//   committed_action          the transition ended: K is durable and announcements were sent
//   deposed_action            the log fenced this coordinator: stop acting, a newer one is active
//   aborted_action            the transition ended by abort (durable in the log, members told and
//                             fenced: each rejoins after a dense restore); a new one may begin
//   needs_operator_action     max_attempts reached or K conflicts: nothing more happens automatically
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bitrefit/protocol/commit_log.hpp"
#include "bitrefit/protocol/messages.hpp"

namespace bitrefit::protocol {

// ----- events ---------------------------------------------------------------------------------
struct start_event {
  friend auto operator<=>(const start_event&, const start_event&) = default;
};
/// The trainer froze version `target` (= K.v + 1). `xor_allowed`: every receiver places every XOR
/// tensor bit-preservingly. `expected[r]`: receiver r's attestation digest of `target` (empty: none).
/// `frozen[o]`: the identity of owner o's frozen change set (empty: not recorded), persisted with
/// every attempt so that whoever retries delivers exactly these bits.
struct begin_transition_event {
  version_t target = 0;
  bool xor_allowed = true;
  std::vector<digest128> expected;
  std::vector<digest128> frozen;
  friend auto operator<=>(const begin_transition_event&, const begin_transition_event&) = default;
};
struct log_event {
  log_reply reply;
  friend auto operator<=>(const log_event&, const log_event&) = default;
};
struct operator_abort_event {
  friend auto operator<=>(const operator_abort_event&, const operator_abort_event&) = default;
};
using coordinator_event = std::variant<start_event, begin_transition_event, message_event, log_event, deadline_event,
                                       operator_abort_event>;

// ----- actions --------------------------------------------------------------------------------
/// Call the commit log. ORDER: last action of its step; the caller feeds the reply (log_event)
/// before anything else is stepped on this coordinator's behalf that depends on it.
struct log_action {
  log_request request;
  friend auto operator<=>(const log_action&, const log_action&) = default;
};
/// The transport must refuse this incarnation from now on (its late acks and writes count for nothing).
struct fence_receiver_action {
  member fenced{};
  friend auto operator<=>(const fence_receiver_action&, const fence_receiver_action&) = default;
};
/// stop_and_wait(τ) finished: no write of τ can take effect anywhere; its payload objects may go.
struct cleanup_action {
  attempt_id attempt{};
  friend auto operator<=>(const cleanup_action&, const cleanup_action&) = default;
};
/// The transition ended with K = record, durable; announcements were sent BEFORE this action.
struct committed_action {
  commit_record record{};
  friend auto operator<=>(const committed_action&, const committed_action&) = default;
};
struct deposed_action {
  friend auto operator<=>(const deposed_action&, const deposed_action&) = default;
};
struct aborted_action {
  attempt_id attempt{};
  std::string why;
  friend auto operator<=>(const aborted_action&, const aborted_action&) = default;
};
struct needs_operator_action {
  std::string why;
  friend auto operator<=>(const needs_operator_action&, const needs_operator_action&) = default;
};
using coordinator_action = std::variant<log_action, send_action, arm_deadline_action, disarm_deadline_action,
                                        fence_receiver_action, cleanup_action, committed_action, deposed_action,
                                        aborted_action, needs_operator_action>;

enum class coordinator_phase : std::uint8_t {
  booting,     // constructed; waiting for start_event
  claiming,    // claim_epoch in flight
  idle,        // no transition in progress
  preparing,   // persist_prepare in flight
  collecting,  // attempt admitted: waiting for manifests, arrivals, acks
  committing,  // compare_and_set in flight
  resolving,   // read_commit in flight after an unknown or conflicting compare-and-set
  stopping,    // mark_obsolete sent; stop_and_wait for every member's stopped_msg
  recovering,  // after takeover: read_commit on the old attempt (after its stop_and_wait)
  aborting,    // the abort decision is being persisted (prepare record `aborted`)
  deposed,     // fenced by a newer epoch
  stuck,       // needs an operator (max attempts, conflicting K)
};
constexpr std::string_view to_string(coordinator_phase p) noexcept {
  constexpr std::string_view n[] = {"booting",  "claiming", "idle",       "preparing", "collecting", "committing",
                                    "resolving", "stopping", "recovering", "aborting",  "deposed",    "stuck"};
  return n[static_cast<int>(p)];
}

/// What the coordinator knows about receiver r.
struct roster_entry {
  bool known = false;    // joined (or bound by a persisted prepare record)
  bool evicted = false;  // this incarnation is fenced; only a join from a newer one readmits r
  std::uint64_t incarnation = 0;
  commit_record at{};    // the K it holds outside attempts (eligible iff at == committed)
  /// Heard from this incarnation since this coordinator's epoch began (a join of this epoch, an
  /// ack of its own attempt), or given at construction. False for an entry a coordinator that
  /// took over rebuilt from the log's last attempt (finding B7) or took from a join of an older
  /// epoch (B7b): the receiver may have restarted since, its new incarnation admitted by the
  /// predecessor only. Such an entry lags until the incarnation answers an announcement asking it
  /// to (announce_msg::confirm).
  bool confirmed = true;
  friend auto operator<=>(const roster_entry&, const roster_entry&) = default;
};

/// What happens once stop_and_wait completes.
enum class after_stop : std::uint8_t { retry, recover, abort };

template <MutationPolicy Mut = no_mutation>
struct basic_coordinator {
  protocol_config config;
  std::uint64_t epoch = 1;
  coordinator_phase phase = coordinator_phase::booting;
  std::uint64_t counter = 0;           // attempts started in this epoch
  commit_record committed{};           // K as last read or written
  std::vector<roster_entry> roster;    // per receiver index
  std::vector<commit_record> owner_at; // per owner: the baseline it last reported
  // The transition in progress.
  std::optional<version_t> target;
  bool xor_allowed = false;
  std::vector<digest128> expected;
  std::vector<digest128> frozen;       // identity of each owner's frozen change set
  std::uint32_t attempts = 0;          // attempts of this transition started by this coordinator
  bool dirty = false;                  // an attempt of this transition may have written somewhere
  // The attempt in progress (preparing .. recovering).
  std::optional<prepare_record> attempt;
  std::vector<std::optional<std::uint32_t>> manifests;  // per owner
  std::vector<std::uint8_t> arrived, acked, stopped;    // per member index
  after_stop then = after_stop::retry;
  std::optional<std::uint32_t> lost_owner;  // the abort in progress: this owner lost the frozen set
  [[no_unique_address]] Mut mutation{};  // test policy (mutation.hpp); nothing in the shipped one

  basic_coordinator() = default;
  /// @param initial_roster receivers known to hold `initial` (e.g. the deployment's first members);
  ///        a coordinator that takes over passes {} and rebuilds its roster from the log + roll call.
  basic_coordinator(protocol_config cfg, std::uint64_t epoch_, std::vector<member> initial_roster = {},
                    commit_record initial = {}, Mut m = {})
      : config(cfg), epoch(epoch_), committed(initial), roster(cfg.receivers), owner_at(cfg.owners, initial), mutation(m) {
    for (const auto& m : initial_roster)
      if (m.receiver < roster.size()) roster[m.receiver] = roster_entry{true, false, m.incarnation, initial, true};
  }

  friend auto operator<=>(const basic_coordinator&, const basic_coordinator&) = default;

  /// Is a transition (attempt, stop, commit, recovery) in progress?
  bool busy() const noexcept {
    return phase != coordinator_phase::idle && phase != coordinator_phase::deposed && phase != coordinator_phase::stuck;
  }

  std::vector<coordinator_action> step(const coordinator_event& ev) {
    std::vector<coordinator_action> out;
    std::visit([&](const auto& e) { on(e, out); }, ev);
    return out;
  }

  /// Does a message still count, judged by its sender alone? Nothing from a receiver incarnation
  /// that was evicted (fenced) or replaced by a newer one counts (DESIGN op. 8): step() drops such
  /// a message before any handler sees it.
  bool counts(const envelope& env) const {
    const auto from = sender_member(env.msg);
    if (!from) return true;  // owners' messages
    if (from->receiver >= roster.size()) return false;
    const roster_entry& e = roster[from->receiver];
    if (!e.known) return true;
    if (from->incarnation < e.incarnation) return mutated(protocol_mutation::accept_old_incarnation_acks);
    return !(e.evicted && from->incarnation == e.incarnation);
  }

  /// The receiver incarnation a message speaks for, if it is a receiver's message.
  static std::optional<member> sender_member(const message& m) {
    return std::visit(
        [](const auto& x) -> std::optional<member> {
          if constexpr (requires { x.from; }) return x.from;
          else return std::nullopt;
        },
        m);
  }

 private:
  using out_t = std::vector<coordinator_action>;
  bool mutated(protocol_mutation m) const noexcept { return broken(mutation, m); }

  void send(out_t& out, endpoint to, message m) const {
    out.push_back(send_action{envelope{endpoint::coord(), to, std::move(m)}});
  }
  void send_owners(out_t& out, const message& m) const {
    for (std::uint32_t o = 0; o < config.owners; ++o) send(out, endpoint::owner_(o), m);
  }
  void send_members(out_t& out, const message& m) const {
    for (const auto& mb : attempt->members) send(out, endpoint::receiver_(mb.receiver), m);
  }
  /// Index of `from` among the attempt's members (mutation: matched by receiver id only).
  std::optional<std::size_t> member_index(const member& from) const {
    if (!attempt) return std::nullopt;
    for (std::size_t i = 0; i < attempt->members.size(); ++i) {
      const auto& m = attempt->members[i];
      if (m == from) return i;
      if (mutated(protocol_mutation::accept_old_incarnation_acks) && m.receiver == from.receiver) return i;
    }
    return std::nullopt;
  }
  static bool all_set(const std::vector<std::uint8_t>& v) {
    return std::all_of(v.begin(), v.end(), [](std::uint8_t b) { return b != 0; });
  }

  // ---- start / takeover
  void on(const start_event&, out_t& out) {
    if (phase != coordinator_phase::booting) return;
    phase = coordinator_phase::claiming;
    out.push_back(log_action{claim_epoch_request{epoch}});
  }

  void on(const begin_transition_event& e, out_t& out) {
    if (phase != coordinator_phase::idle || target || e.target != committed.version + 1) return;
    target = e.target;
    xor_allowed = e.xor_allowed;
    expected = e.expected;
    frozen = e.frozen;
    lost_owner.reset();
    attempts = 0;
    dirty = false;
    prepare_attempt(out);
  }

  /// Operator abort: honoured while an attempt collects (a compare-and-set or a log write in
  /// flight must be resolved first; abort again afterwards).
  void on(const operator_abort_event&, out_t& out) {
    if (phase != coordinator_phase::collecting) return;
    lost_owner.reset();
    mark_obsolete(out, after_stop::abort);
  }

  /// Some owner or receiver may not know the commit record yet (a lost announcement or roll call),
  /// or the roster does not hold a live incarnation of some receiver (unknown, or evicted and not
  /// yet rejoined as a new incarnation): the roster must converge to the live incarnations.
  bool lagging() const {
    for (const auto& o : owner_at)
      if (o != committed) return true;
    for (const auto& r : roster)
      if (!r.known || needs_announcement(r)) return true;
    return false;
  }

  /// A known receiver's entry the idle coordinator keeps announcing to: fenced (it must restore),
  /// not at K, or a guess not yet answered (roster_entry::confirmed: rebuilt from the log, or
  /// taken from a join of an older epoch).
  bool needs_announcement(const roster_entry& e) const { return e.evicted || e.at != committed || !e.confirmed; }

  /// K, as this coordinator announces it (to owners; receivers get announce_to's).
  announce_msg announcement() const { return announce_msg{committed, std::nullopt, false, false, epoch}; }

  /// K, addressed to receiver r with the roster's view of it (see announce_msg): names the
  /// incarnation the roster admits (confirming its join) or marks it evicted (it must restore);
  /// an entry that is a guess (roster_entry::confirmed) asks that incarnation to answer.
  void announce_to(out_t& out, std::uint32_t r) const {
    const roster_entry& e = roster[r];
    announce_msg a = announcement();
    if (e.known) {
      a.roster = member{r, e.incarnation};
      a.evicted = e.evicted;
      a.confirm = !e.evicted && !e.confirmed;
    }
    send(out, endpoint::receiver_(r), a);
  }

  /// Idle: repeat the announcement (or roll call) to whoever has not confirmed K, or whose live
  /// incarnation the roster does not hold. Idempotent.
  void reannounce(out_t& out) {
    for (std::uint32_t o = 0; o < owner_at.size(); ++o)
      if (owner_at[o] != committed) send(out, endpoint::owner_(o), announcement());
    for (std::uint32_t r = 0; r < roster.size(); ++r) {
      if (!roster[r].known) send(out, endpoint::receiver_(r), roll_call_msg{epoch});
      else if (needs_announcement(roster[r])) announce_to(out, r);
    }
  }

  void on(const deadline_event&, out_t& out) {
    if (phase == coordinator_phase::idle) {
      if (!lagging()) return;
      reannounce(out);
      out.push_back(arm_deadline_action{});
    } else if (phase == coordinator_phase::collecting) {
      mark_obsolete(out, after_stop::retry);  // a member or owner missed its deadline
    } else if (phase == coordinator_phase::stopping) {
      // Members that never confirmed are evicted: their incarnation is fenced, so nothing they
      // still do counts, and stop_and_wait can complete without them.
      for (std::size_t i = 0; i < attempt->members.size(); ++i) {
        if (stopped[i]) continue;
        const member& m = attempt->members[i];
        auto& r = roster[m.receiver];
        if (r.incarnation == m.incarnation) r.evicted = true;
        out.push_back(fence_receiver_action{m});
      }
      finish_stop(out);
    }
  }

  // ---- log replies
  void on(const log_event& e, out_t& out) {
    const log_reply& rep = e.reply;
    if (rep.outcome == log_outcome::fenced) {
      phase = coordinator_phase::deposed;
      out.push_back(disarm_deadline_action{});
      out.push_back(deposed_action{});
      return;
    }
    std::visit([&](const auto& q) { on_reply(q, rep, out); }, rep.request);
  }

  void on_reply(const claim_epoch_request& q, const log_reply& rep, out_t& out) {
    if (phase != coordinator_phase::claiming || q.epoch != epoch) return;
    if (rep.outcome == log_outcome::failed) {  // certainly not applied: claim again
      out.push_back(log_action{claim_epoch_request{epoch}});
      return;
    }
    if (rep.outcome == log_outcome::unknown) {
      // Claiming again is NOT idempotent: if the first claim took effect, the log's epoch is now
      // ours and a second claim of it is fenced, deposing the only coordinator (finding B4).
      // Resolve it like read_commit resolves a compare-and-set: read the epoch back.
      if (mutated(protocol_mutation::reclaim_unknown_epoch)) out.push_back(log_action{claim_epoch_request{epoch}});
      else out.push_back(log_action{read_request{}});
      return;
    }
    claimed(rep.snapshot, out);
  }

  /// The read after an unknown claim: ours (it took effect), older (it never will: claim again) or
  /// newer (another coordinator claimed after us: deposed).
  void resolve_claim(const log_snapshot& s, out_t& out) {
    if (s.epoch == epoch) claimed(s, out);
    else if (s.epoch < epoch) out.push_back(log_action{claim_epoch_request{epoch}});
    else {
      phase = coordinator_phase::deposed;
      out.push_back(disarm_deadline_action{});
      out.push_back(deposed_action{});
    }
  }

  /// The log is ours from epoch `epoch` on: rebuild what the previous coordinator knew, then finish
  /// or retry its attempt.
  void claimed(const log_snapshot& snap, out_t& out) {
    committed = snap.record;
    const auto& p = snap.prepared;
    if (p && p->aborted) {
      // The previous coordinator aborted the transition (durably): it is over. Its members hold a
      // mix and rejoin only as new incarnations after a dense restore; tell them again, in case
      // they never heard (idempotent).
      for (const auto& m : p->members) {
        auto& r = roster[m.receiver];
        if (!r.known || r.incarnation <= m.incarnation) r = roster_entry{true, true, m.incarnation, p->base, false};
        send(out, endpoint::receiver_(m.receiver), abort_msg{epoch, p->attempt});
      }
      for (std::uint32_t r = 0; r < config.receivers; ++r)
        if (!roster[r].known) send(out, endpoint::receiver_(r), roll_call_msg{epoch});
      owner_at.assign(config.owners, commit_record{~version_t{0}, {}});  // unknown until they report
      phase = coordinator_phase::idle;
      if (lagging()) out.push_back(arm_deadline_action{});
      return;
    }
    if (p) {
      // Members of the last persisted attempt: at its target if it committed, else at its base.
      bool done = committed.baseline == p->next;
      for (const auto& m : p->members) {
        auto& r = roster[m.receiver];
        if (!r.known || r.incarnation <= m.incarnation)
          r = roster_entry{true, false, m.incarnation, done ? committed : p->base,
                           mutated(protocol_mutation::trust_rebuilt_roster)};  // from the log: a guess
      }
    }
    // Roll call: receivers this coordinator does not know report their incarnation and record.
    for (std::uint32_t r = 0; r < config.receivers; ++r)
      if (!roster[r].known) send(out, endpoint::receiver_(r), roll_call_msg{epoch});
    if (p && p->target == committed.version + 1 && p->base == committed) {
      // An attempt was in flight when the previous coordinator stopped: stop it, then read K.
      target = p->target;
      xor_allowed = p->xor_allowed;
      expected = p->expected;
      frozen = p->frozen;
      lost_owner.reset();
      attempts = 0;
      dirty = true;
      attempt = *p;
      manifests.assign(config.owners, std::nullopt);
      arrived.assign(p->members.size(), 0);
      acked.assign(p->members.size(), 0);
      mark_obsolete(out, after_stop::recover);
      return;
    }
    if (p && committed.baseline == p->next) {
      // It committed, but announcements may have been lost (failover between compare-and-set and
      // announcement): announce again, idempotently.
      send_owners(out, announcement());
      for (const auto& m : p->members) announce_to(out, m.receiver);
    }
    if (p) owner_at.assign(config.owners, commit_record{~version_t{0}, {}});  // unknown until they report
    phase = coordinator_phase::idle;
    if (lagging()) out.push_back(arm_deadline_action{});
  }

  void on_reply(const persist_prepare_request& q, const log_reply& rep, out_t& out) {
    if (!attempt || q.record.attempt != attempt->attempt) return;
    if (phase != coordinator_phase::preparing && phase != coordinator_phase::aborting) return;
    if (rep.outcome != log_outcome::ok) {  // not (certainly) durable: persist again (idempotent)
      out.push_back(log_action{q});
      return;
    }
    if (phase == coordinator_phase::aborting) {
      finish_abort(out);
      return;
    }
    phase = coordinator_phase::collecting;
    send_owners(out, prepare_msg{*attempt});
    send_members(out, prepare_msg{*attempt});
    out.push_back(arm_deadline_action{});
  }

  void on_reply(const compare_and_set_request& q, const log_reply& rep, out_t& out) {
    if (phase != coordinator_phase::committing || !attempt || q.attempt != attempt->attempt) return;
    switch (rep.outcome) {
      case log_outcome::ok: commit_succeeded(out); return;
      case log_outcome::failed: mark_obsolete(out, after_stop::retry); return;  // confirmed failure
      case log_outcome::unknown:
      case log_outcome::conflict:
        phase = coordinator_phase::resolving;  // read_commit: only a confirmed failure retries
        out.push_back(log_action{read_request{}});
        return;
      case log_outcome::fenced: return;  // handled in on(log_event)
    }
  }

  void on_reply(const read_request&, const log_reply& rep, out_t& out) {
    if (rep.outcome != log_outcome::ok) {
      if (phase == coordinator_phase::resolving || phase == coordinator_phase::recovering ||
          phase == coordinator_phase::claiming)
        out.push_back(log_action{read_request{}});
      return;
    }
    const commit_record k = rep.snapshot.record;
    if (phase == coordinator_phase::claiming) {
      resolve_claim(rep.snapshot, out);
    } else if (phase == coordinator_phase::resolving) {
      if (k == commit_record{attempt->target, attempt->next}) commit_succeeded(out);
      else if (k == attempt->base) mark_obsolete(out, after_stop::retry);
      else needs_operator(out, "commit record " + to_string(k) + " is neither the base nor this attempt's");
    } else if (phase == coordinator_phase::recovering) {
      if (k == commit_record{attempt->target, attempt->next}) {
        // The previous coordinator's attempt committed: every member acked it.
        for (const auto& m : attempt->members)
          if (roster[m.receiver].incarnation == m.incarnation && !roster[m.receiver].evicted) roster[m.receiver].at = k;
        committed = k;
        finish_transition(out);
      } else if (k == attempt->base) {
        committed = k;
        prepare_attempt(out);
      } else {
        needs_operator(out, "commit record " + to_string(k) + " moved under a takeover");
      }
    }
  }

  // ---- messages
  void on(const message_event& e, out_t& out) {
    if (!counts(e.env)) return;  // a fenced or replaced incarnation: counts for nothing
    std::visit([&](const auto& m) { on_msg(m, out); }, e.env.msg);
  }
  template <class M>
  void on_msg(const M&, out_t&) {}  // messages a coordinator never acts on

  void on_msg(const manifest_msg& m, out_t& out) {
    if (phase != coordinator_phase::collecting || m.attempt != attempt->attempt || m.owner >= manifests.size()) return;
    if (manifests[m.owner]) return;  // duplicate
    manifests[m.owner] = m.chunks;
    if (std::all_of(manifests.begin(), manifests.end(), [](const auto& x) { return x.has_value(); })) {
      std::vector<std::uint32_t> chunks;
      for (const auto& x : manifests) chunks.push_back(*x);
      send_members(out, open_msg{attempt->attempt, chunks});
      maybe_commit(out);
    }
  }

  void on_msg(const arrived_msg& m, out_t& out) {
    if (phase != coordinator_phase::collecting || m.attempt != attempt->attempt) return;
    auto i = member_index(m.from);
    if (!i || arrived[*i]) return;
    arrived[*i] = 1;
    if (all_set(arrived)) send_members(out, flush_msg{attempt->attempt});
  }

  void on_msg(const ack_msg& m, out_t& out) {
    if (phase != coordinator_phase::collecting || m.attempt != attempt->attempt) return;
    auto i = member_index(m.from);
    if (!i || acked[*i]) return;
    if (config.attest && m.from.receiver < attempt->expected.size() &&
        (!m.attestation || *m.attestation != attempt->expected[m.from.receiver])) {
      mark_obsolete(out, after_stop::retry);  // the receiver does not hold what a dense copy would give
      return;
    }
    acked[*i] = 1;
    // An ack of this coordinator's own attempt comes from an incarnation alive since the takeover:
    // any later one joins this coordinator, so the entry taken over from the log is no guess now.
    auto& e = roster[m.from.receiver];
    if (attempt->attempt.epoch == epoch && e.known && e.incarnation == m.from.incarnation) e.confirmed = true;
    maybe_commit(out);
  }

  void on_msg(const failed_msg& m, out_t& out) {
    if (phase != coordinator_phase::collecting || m.attempt != attempt->attempt || !member_index(m.from)) return;
    mark_obsolete(out, after_stop::retry);
  }

  /// An owner cannot deliver the transition's frozen change set any more: no attempt can commit
  /// the admitted bits, so the transition ends by abort, never by a commit of other bits (B1).
  void on_msg(const frozen_lost_msg& m, out_t& out) {
    if (phase != coordinator_phase::collecting || m.attempt != attempt->attempt) return;
    lost_owner = m.owner;
    mark_obsolete(out, after_stop::abort);
  }

  void on_msg(const stopped_msg& m, out_t& out) {
    if (phase != coordinator_phase::stopping || m.attempt != attempt->attempt) return;
    auto i = member_index(m.from);
    if (!i || stopped[*i]) return;
    stopped[*i] = 1;
    if (all_set(stopped)) finish_stop(out);
  }

  void on_msg(const baseline_msg& m, out_t& out) {
    if (m.owner >= owner_at.size()) return;
    // An owner's baseline only moves forward: a delayed earlier report must not set it back.
    auto& at = owner_at[m.owner];
    if (at.version == ~version_t{0} || m.at.version >= at.version) at = m.at;
    idle_timer(out);
  }

  /// Idle: the timer runs exactly while someone lags (it repeats announcements and roll calls).
  void idle_timer(out_t& out) const {
    if (phase != coordinator_phase::idle) return;
    if (lagging()) out.push_back(arm_deadline_action{});
    else out.push_back(disarm_deadline_action{});
  }

  void on_msg(const join_msg& m, out_t& out) {
    const std::uint32_t r = m.from.receiver;
    if (r >= roster.size()) return;
    // Not (or no longer) the coordinator: K and the roster are unknown until the claim (and its
    // roll call), so an answer would name a K the log may have left. The receiver joins again at
    // its deadline, or answers the roll call.
    if (phase == coordinator_phase::booting || phase == coordinator_phase::claiming ||
        phase == coordinator_phase::deposed)
      return;
    auto& e = roster[r];
    if (e.known && m.from.incarnation < e.incarnation) return;  // an older incarnation: counts for nothing
    if (e.known && m.from.incarnation > e.incarnation && mutated(protocol_mutation::keep_dead_incarnation)) return;
    if (e.known && e.evicted && m.from.incarnation == e.incarnation) {
      announce_to(out, r);  // fenced: tell it, so it restores and rejoins as a new incarnation
      return;
    }
    const bool newer = !e.known || m.from.incarnation > e.incarnation;
    // One incarnation's K only moves forward: a delayed copy of its earlier join must not set the
    // roster back (it would stay "lagging" forever while the receiver, named, never rejoins).
    const commit_record at = !newer && e.at.version > m.at.version ? e.at : m.at;
    // Heard from it in this epoch only if no other coordinator can have answered a later
    // incarnation since the join was sent: a join of an older epoch may be a late copy from an
    // incarnation that died after it (finding B7b), so it is asked again. Epoch 0 is the log's
    // before any claim, never a coordinator's: a join sent then is fresh to the first one.
    const bool confirmed = std::max<std::uint64_t>(m.epoch, 1) >= epoch || (!newer && e.confirmed) ||
                           mutated(protocol_mutation::join_proves_life);
    e = roster_entry{true, false, m.from.incarnation, at, confirmed};
    announce_to(out, r);  // names this incarnation: confirms the join (and asks to restore if K moved)
    idle_timer(out);
    if (!newer || !attempt) return;
    // A member restarted: its applied state is gone, the attempt cannot commit with it.
    bool was_member = false;
    for (const auto& mb : attempt->members) was_member |= mb.receiver == r && mb.incarnation < m.from.incarnation;
    if (!was_member) return;
    if (mutated(protocol_mutation::accept_old_incarnation_acks)) return;  // broken: keeps the old ack
    if (phase == coordinator_phase::collecting) mark_obsolete(out, after_stop::retry);
    // The newer incarnation joins only after its dense restore, and a restart ends the old
    // process: nothing the old incarnation issued can still take effect, so its join counts as
    // the old member's stopped_msg (stop_and_wait need not wait out a deadline for a dead process).
    if (phase != coordinator_phase::stopping) return;
    for (std::size_t i = 0; i < attempt->members.size(); ++i)
      if (attempt->members[i].receiver == r && attempt->members[i].incarnation < m.from.incarnation) stopped[i] = 1;
    if (all_set(stopped)) finish_stop(out);
  }

  // ---- helpers
  void needs_operator(out_t& out, std::string why) {
    phase = coordinator_phase::stuck;
    out.push_back(disarm_deadline_action{});
    out.push_back(needs_operator_action{std::move(why)});
  }

  void prepare_attempt(out_t& out) {
    if (config.max_attempts && attempts >= config.max_attempts) {
      needs_operator(out, "transition to v" + std::to_string(*target) + " failed " + std::to_string(attempts) +
                              " attempts");
      return;
    }
    ++counter;
    ++attempts;
    prepare_record p;
    p.attempt = attempt_id{epoch, counter};
    p.base = committed;
    p.target = *target;
    p.next = baseline_of(p.attempt);
    const bool use_xor = xor_allowed && (!dirty || mutated(protocol_mutation::retry_by_xor));
    p.mode = use_xor ? mode::xor_mask : mode::overwrite;
    p.xor_allowed = xor_allowed;
    p.expected = expected;
    p.frozen = frozen;
    p.retry = dirty;  // an earlier attempt of this transition was admitted
    for (std::uint32_t r = 0; r < roster.size(); ++r) {
      const auto& e = roster[r];
      if (e.known && !e.evicted && e.at == committed) p.members.push_back(member{r, e.incarnation});
    }
    dirty = true;  // from now on receivers may hold a mix of v and v+1
    attempt = p;
    manifests.assign(config.owners, std::nullopt);
    arrived.assign(p.members.size(), 0);
    acked.assign(p.members.size(), 0);
    stopped.assign(p.members.size(), 0);
    phase = coordinator_phase::preparing;
    out.push_back(log_action{persist_prepare_request{epoch, p}});
  }

  void maybe_commit(out_t& out) {
    if (!std::all_of(manifests.begin(), manifests.end(), [](const auto& x) { return x.has_value(); })) return;
    bool ready = all_set(acked);
    if (mutated(protocol_mutation::commit_before_all_acks))
      ready = acked.empty() || std::any_of(acked.begin(), acked.end(), [](std::uint8_t b) { return b != 0; });
    if (!ready) return;
    phase = coordinator_phase::committing;
    out.push_back(disarm_deadline_action{});
    out.push_back(log_action{compare_and_set_request{epoch, attempt->attempt, attempt->base,
                                                     commit_record{attempt->target, attempt->next}}});
  }

  void commit_succeeded(out_t& out) {
    const commit_record k{attempt->target, attempt->next};
    for (std::size_t i = 0; i < attempt->members.size(); ++i) {
      const member& m = attempt->members[i];
      auto& e = roster[m.receiver];
      const bool same = e.incarnation == m.incarnation || mutated(protocol_mutation::accept_old_incarnation_acks);
      if (acked[i] && same && !e.evicted) e.at = k;
    }
    committed = k;
    finish_transition(out);
  }

  /// K is durable: tell everyone (owners advance their baseline, receivers reopen the gate).
  void finish_transition(out_t& out) {
    send_owners(out, announcement());
    for (std::uint32_t r = 0; r < config.receivers; ++r) announce_to(out, r);
    out.push_back(committed_action{committed});
    out.push_back(arm_deadline_action{});  // until every owner and receiver confirmed K (see reannounce)
    end_transition();
  }

  /// The transition is over (committed or aborted): back to idle with nothing of it left. The one
  /// place a transition's per-attempt state is dropped, so a commit and an abort cannot disagree on
  /// what "over" means.
  void end_transition() {
    phase = coordinator_phase::idle;
    target.reset();
    attempt.reset();
    manifests.clear();
    arrived.clear();
    acked.clear();
    stopped.clear();
  }

  /// mark_obsolete(τ) -> stop_and_wait(τ): no write of τ may take effect after this completes.
  void mark_obsolete(out_t& out, after_stop next) {
    then = next;
    phase = coordinator_phase::stopping;
    stopped.assign(attempt->members.size(), 0);
    send_owners(out, obsolete_msg{attempt->attempt});
    send_members(out, obsolete_msg{attempt->attempt});
    if (mutated(protocol_mutation::retry_without_stop_and_wait) || attempt->members.empty()) {
      finish_stop(out);
      return;
    }
    out.push_back(arm_deadline_action{});
  }

  void finish_stop(out_t& out) {
    out.push_back(disarm_deadline_action{});
    out.push_back(cleanup_action{attempt->attempt});
    switch (then) {
      case after_stop::retry: prepare_attempt(out); return;
      case after_stop::recover:
        phase = coordinator_phase::recovering;
        out.push_back(log_action{read_request{}});
        return;
      case after_stop::abort:
        attempt->aborted = true;
        if (mutated(protocol_mutation::unfenced_abort)) {  // broken: tells members before the log knows
          finish_abort(out);
          return;
        }
        // Persisted BEFORE any member is told: a fenced coordinator cannot abort (finding B6), and
        // a coordinator that takes over finds the transition over instead of retrying it.
        phase = coordinator_phase::aborting;
        out.push_back(log_action{persist_prepare_request{epoch, *attempt}});
        return;
    }
  }

  /// The abort is durable: members are told and fenced (their parameters are a mix; each rejoins
  /// as a new incarnation after a dense restore), and the transition is over. The trainer may
  /// begin the next one (a fresh change set, first attempt).
  void finish_abort(out_t& out) {
    for (const auto& m : attempt->members) {
      auto& r = roster[m.receiver];
      if (r.incarnation == m.incarnation) r.evicted = true;
      out.push_back(fence_receiver_action{m});
    }
    send_members(out, abort_msg{epoch, attempt->attempt});
    out.push_back(aborted_action{attempt->attempt, lost_owner ? "owner o" + std::to_string(*lost_owner) +
                                                                     " lost the frozen change set of v" +
                                                                     std::to_string(attempt->target) +
                                                                     ": no attempt can deliver the admitted bits"
                                                               : std::string("aborted by the operator")});
    end_transition();
    if (lagging()) out.push_back(arm_deadline_action{});
  }
};

using coordinator = basic_coordinator<>;

BITREFIT_NO_FIELDS(start_event)
BITREFIT_FIELDS(begin_transition_event, target, xor_allowed, expected, frozen)
BITREFIT_FIELDS(log_event, reply)
BITREFIT_NO_FIELDS(operator_abort_event)
BITREFIT_FIELDS(log_action, request)
BITREFIT_FIELDS(fence_receiver_action, fenced)
BITREFIT_FIELDS(cleanup_action, attempt)
BITREFIT_FIELDS(committed_action, record)
BITREFIT_NO_FIELDS(deposed_action)
BITREFIT_FIELDS(aborted_action, attempt, why)
BITREFIT_FIELDS(needs_operator_action, why)
BITREFIT_FIELDS(roster_entry, known, evicted, incarnation, at, confirmed)
BITREFIT_FIELDS_T(template <class M>, basic_coordinator<M>, config, epoch, phase, counter, committed, roster, owner_at, target,
                  xor_allowed, expected, frozen, attempts, dirty, attempt, manifests, arrived, acked, stopped, then,
                  lost_owner, mutation)

}  // namespace bitrefit::protocol

template <class M>
struct std::hash<bitrefit::protocol::basic_coordinator<M>> {
  std::size_t operator()(const bitrefit::protocol::basic_coordinator<M>& c) const { return bitrefit::protocol::hash_of(c); }
};
