// bitrefit/protocol/receiver.hpp — the receiver state machine (one rollout engine incarnation).
//
// Events (receiver_event):
//   boot_event            a fresh process (new incarnation, already persisted by the caller) starts
//   message_event         prepare / payload / open / flush / obsolete / announce / roll_call / abort.
//                         A payload is delivered ONLY after its frame verified (digest, structure);
//                         a copy that does not verify counts as undelivered and is not stepped.
//   drained_event         in-flight requests of v finished after drain_requests_action
//   device_synced_event   every apply issued so far took effect; carries the attestation when asked
//   commit_read_event     the commit record and the log's epoch, answering read_commit_action
//   restored_event        dense_restore_action finished: parameters are exactly K.v
//   deadline_event        the armed timer expired (joining: join again; otherwise read K)
// Actions (receiver_action), performed in list order:
//   persist_incarnation_action  record the new incarnation durably BEFORE sending anything under it
//   close_gate_action           stop admitting requests BEFORE any apply of the attempt
//   drain_requests_action       asynchronous mode: wait for in-flight requests of v, then drained_event
//   stage_payload_action        keep the verified frame (compressed) for τ. τ may be an attempt
//                               whose prepare has not arrived yet (see "Early messages" below);
//                               discard_staged_action of τ drops it like any other staged frame
//   apply_payload_action        decode + apply the staged frame in place, in the order emitted; it may
//                               complete asynchronously and out of order with other applies of the
//                               same attempt (positions are disjoint); only sync_device waits for it
//   discard_staged_action       drop every staged frame of τ (cleanup)
//   sync_device_action          wait for every issued apply, then device_synced_event (with the
//                               attestation digest over the held ranges if `attest`)
//   open_gate_action            reopen with KV caches invalidated: the weights are the committed K
//   read_commit_action          read the commit log, then commit_read_event
//   dense_restore_action        wait for every issued apply, then write every parameter from K.v
//                               (dense refit or checkpoint), then restored_event
//   send_action / arm_deadline_action / disarm_deadline_action
//
// Early messages. The network may deliver a payload, open or flush of attempt τ before τ's prepare
// (they are sent after it, but nothing orders different senders' messages, and a prepare can be
// delayed). Dropping them would be wrong for liveness: nobody sends them again, so the last
// allowed attempt could never end even without a single fault (found by the exhaustive checker).
// So the receiver keeps the messages of ONE attempt newer than everything it has seen
// (`early`): payloads are staged at once (their frames verified), open and flush are remembered.
// When τ's prepare admits it, they are replayed in the order payloads, open, flush, exactly as if
// they had arrived just after the prepare. A newer attempt's early message, a prepare or obsolete
// that passes τ, a prepare that does not name this member, and a restore all drop the buffer (and
// discard its staged frames). The bound is one attempt's manifest, as for the active attempt.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "bitrefit/protocol/messages.hpp"

namespace bitrefit::protocol {

struct boot_event {
  friend auto operator<=>(const boot_event&, const boot_event&) = default;
};
struct drained_event {
  friend auto operator<=>(const drained_event&, const drained_event&) = default;
};
struct device_synced_event {
  std::optional<digest128> attestation;
  friend auto operator<=>(const device_synced_event&, const device_synced_event&) = default;
};
struct commit_read_event {
  commit_record record{};
  std::uint64_t epoch = 0;  // the log's coordinator epoch: every older coordinator is fenced
  friend auto operator<=>(const commit_read_event&, const commit_read_event&) = default;
};
struct restored_event {
  commit_record record{};
  friend auto operator<=>(const restored_event&, const restored_event&) = default;
};
using receiver_event = std::variant<boot_event, message_event, drained_event, device_synced_event, commit_read_event,
                                    restored_event, deadline_event>;

struct persist_incarnation_action {
  std::uint64_t incarnation = 0;
  friend auto operator<=>(const persist_incarnation_action&, const persist_incarnation_action&) = default;
};
struct close_gate_action {
  friend auto operator<=>(const close_gate_action&, const close_gate_action&) = default;
};
struct drain_requests_action {
  friend auto operator<=>(const drain_requests_action&, const drain_requests_action&) = default;
};
struct stage_payload_action {
  payload_id id{};
  friend auto operator<=>(const stage_payload_action&, const stage_payload_action&) = default;
};
struct apply_payload_action {
  payload_id id{};
  protocol::mode mode = mode::overwrite;
  version_t base = 0;
  version_t target = 0;
  friend auto operator<=>(const apply_payload_action&, const apply_payload_action&) = default;
};
struct discard_staged_action {
  attempt_id attempt{};
  friend auto operator<=>(const discard_staged_action&, const discard_staged_action&) = default;
};
struct sync_device_action {
  bool attest = true;
  friend auto operator<=>(const sync_device_action&, const sync_device_action&) = default;
};
struct open_gate_action {
  bool invalidate_kv_cache = true;
  friend auto operator<=>(const open_gate_action&, const open_gate_action&) = default;
};
struct read_commit_action {
  friend auto operator<=>(const read_commit_action&, const read_commit_action&) = default;
};
struct dense_restore_action {
  commit_record record{};
  friend auto operator<=>(const dense_restore_action&, const dense_restore_action&) = default;
};
using receiver_action =
    std::variant<send_action, persist_incarnation_action, close_gate_action, drain_requests_action,
                 stage_payload_action, apply_payload_action, discard_staged_action, sync_device_action, open_gate_action,
                 read_commit_action, dense_restore_action, arm_deadline_action, disarm_deadline_action>;

enum class receiver_phase : std::uint8_t {
  booting,    // constructed after a (re)start; waiting for boot_event
  restoring,  // reading K / dense restore in progress
  joining,    // restored, join sent, not yet confirmed
  serving,    // at K, not in an attempt
  member,     // admitted to the active attempt
  stopping,   // obsolete received: waiting for the device before answering stopped
  between,    // an attempt stopped; waiting for the next prepare or for commit news
  aborted,    // operator abort: gate closed until a dense refit
};
constexpr std::string_view to_string(receiver_phase p) noexcept {
  constexpr std::string_view n[] = {"booting", "restoring", "joining", "serving",
                                    "member",  "stopping",  "between", "aborted"};
  return n[static_cast<int>(p)];
}

/// One payload of the active attempt that this receiver holds (staged, maybe applied).
struct chunk_state {
  std::uint32_t owner = 0;
  std::uint32_t seq = 0;
  digest128 content{};
  protocol::mode mode = mode::overwrite;  // the payload's own mode (overwrite allowed in an XOR attempt)
  bool applied = false;
  friend auto operator<=>(const chunk_state&, const chunk_state&) = default;
};

struct receiver_attempt {
  attempt_id attempt{};
  protocol::mode mode = mode::overwrite;
  commit_record base{};
  version_t target = 0;
  baseline_id next{};
  bool open = false;                   // manifest known
  std::vector<std::uint32_t> manifest; // chunks per owner
  std::vector<chunk_state> chunks;     // sorted by (owner, seq)
  bool arrived_sent = false;           // async: arrival reported
  bool flushing = false;               // async: gate closing / closed for apply
  bool drained = false;                // async: requests of v drained
  bool syncing = false;                // sync_device issued for the ack
  bool acked = false;
  bool failed = false;                 // reported failed_msg; waits for obsolete
  friend auto operator<=>(const receiver_attempt&, const receiver_attempt&) = default;
};

/// Messages of an attempt newer than any this receiver has seen, kept until its prepare arrives.
struct early_attempt {
  attempt_id attempt{};
  std::vector<payload_msg> payloads;      // sorted by id; each staged once when it arrived
  bool conflict = false;                  // two verified copies of one id differed
  std::optional<open_msg> open;
  bool flush = false;
  friend auto operator<=>(const early_attempt&, const early_attempt&) = default;
};

template <MutationPolicy Mut = no_mutation>
struct basic_receiver {
  std::uint32_t id = 0;
  std::uint64_t incarnation = 0;
  gate_policy gate = gate_policy::synchronous;
  bool attest = true;
  [[no_unique_address]] Mut mutation{};  // test policy (mutation.hpp); nothing in the shipped one
  receiver_phase phase = receiver_phase::serving;
  commit_record committed{};              // the K its parameters hold outside attempts
  bool gate_open = true;
  attempt_id highest_seen{};              // attempts at or below this that are not active are dead
  std::uint64_t epoch_seen = 0;           // newest coordinator epoch heard of (boot's log read, prepare,
                                          // roll call, abort); its joins carry it (join_msg::epoch)
  std::optional<receiver_attempt> attempt;
  std::optional<commit_record> completed; // parameters are exactly this (acked attempt's target, g')
  bool unsynced = false;                  // applies issued since the last device sync
  bool sync_pending = false;              // a sync_device_action is outstanding
  std::optional<attempt_id> stopping_for; // answer stopped_msg for this once the device is synced
  std::optional<prepare_record> deferred; // a newer prepare waiting for the device sync
  std::optional<early_attempt> early;     // messages of an attempt whose prepare has not arrived

  basic_receiver() = default;
  /// A receiver already serving `at` (initial deployment). Restarted processes use `restarted`.
  basic_receiver(std::uint32_t id_, std::uint64_t inc, const protocol_config& cfg, commit_record at = {}, Mut m = {})
      : id(id_), incarnation(inc), gate(cfg.gate), attest(cfg.attest), mutation(m), committed(at) {}
  /// A fresh process with a new incarnation (persisted by the caller); feed boot_event next.
  static basic_receiver restarted(std::uint32_t id_, std::uint64_t inc, const protocol_config& cfg, Mut m = {}) {
    basic_receiver r(id_, inc, cfg, {}, m);
    r.phase = receiver_phase::booting;
    r.gate_open = false;
    return r;
  }
  friend auto operator<=>(const basic_receiver&, const basic_receiver&) = default;

  member self() const noexcept { return member{id, incarnation}; }

  std::vector<receiver_action> step(const receiver_event& ev) {
    std::vector<receiver_action> out;
    std::visit([&](const auto& e) { on(e, out); }, ev);
    return out;
  }

 private:
  using out_t = std::vector<receiver_action>;
  bool mutated(protocol_mutation m) const noexcept { return broken(mutation, m); }
  void send(out_t& out, endpoint to, message m) const {
    out.push_back(send_action{envelope{endpoint::receiver_(id), to, std::move(m)}});
  }
  void to_coord(out_t& out, message m) const { send(out, endpoint::coord(), std::move(m)); }

  void on(const boot_event&, out_t& out) {
    if (phase != receiver_phase::booting) return;
    phase = receiver_phase::restoring;
    out.push_back(read_commit_action{});
  }

  void on(const commit_read_event& e, out_t& out) {
    if (phase == receiver_phase::restoring) {
      // A fresh process joins next: under the log's epoch, so that the coordinator holding the
      // log takes its join for a sign of life (join_msg::epoch). Later reads only look at K.
      epoch_seen = std::max(epoch_seen, e.epoch);
      out.push_back(dense_restore_action{e.record});
      return;
    }
    commit_news(e.record, e.epoch, out);
  }

  void on(const restored_event& e, out_t& out) {
    if (phase != receiver_phase::restoring) return;
    committed = e.record;
    completed.reset();
    attempt.reset();
    unsynced = false;
    phase = receiver_phase::joining;
    // Synchronous RL serves nothing while a transition may run without this receiver: the gate
    // opens when the join is confirmed (or the attempt that admits it commits). Asynchronous RL
    // may serve the restored K (durable) while joining.
    if (!gate_open && gate == gate_policy::asynchronous) {
      gate_open = true;
      out.push_back(open_gate_action{});
    }
    join(out);
    out.push_back(arm_deadline_action{});
  }

  /// Ask to be admitted: this incarnation holds exactly K and has heard of coordinator `epoch`
  /// (join_msg::epoch; an announcement's sender when it answers one).
  void join(out_t& out, std::uint64_t epoch) const { to_coord(out, join_msg{self(), committed, epoch}); }
  void join(out_t& out) const { join(out, epoch_seen); }

  /// The coordinator's roster holds this incarnation: the join is confirmed.
  void confirm_join(out_t& out) {
    phase = receiver_phase::serving;  // the timer keeps watching K
    if (!gate_open) {
      gate_open = true;
      out.push_back(open_gate_action{});
    }
  }

  /// Join again, or (after an abort: the parameters are a mix) restore first.
  void rejoin(out_t& out, std::uint64_t epoch) {
    if (phase == receiver_phase::aborted) restore(committed, epoch, out);
    else join(out, epoch);
  }
  void rejoin(out_t& out) { rejoin(out, epoch_seen); }

  /// Between admission and the end of its transition: the parameters may differ from K.v.
  bool in_attempt() const noexcept {
    return phase == receiver_phase::member || phase == receiver_phase::stopping || phase == receiver_phase::between;
  }

  /// The timer, once armed (join, admission, ack), keeps running outside a restore: joining, it
  /// re-sends the join; otherwise it reads K. An announcement or obsolete that was lost, or a
  /// coordinator that is gone, then costs one deadline, never a receiver stuck at an old K with
  /// its gate closed. Reading K is idempotent: news older than or equal to K changes nothing.
  void on(const deadline_event&, out_t& out) {
    if (phase == receiver_phase::booting || phase == receiver_phase::restoring) return;
    if (phase == receiver_phase::joining) join(out);
    else out.push_back(read_commit_action{});
    out.push_back(arm_deadline_action{});
  }

  void on(const drained_event&, out_t& out) {
    if (phase != receiver_phase::member || !attempt || !attempt->flushing || attempt->drained) return;
    attempt->drained = true;
    progress(out);
  }

  void on(const device_synced_event& e, out_t& out) {
    if (!sync_pending) return;
    sync_pending = false;
    unsynced = false;
    if (phase == receiver_phase::stopping) {
      if (stopping_for) to_coord(out, stopped_msg{*stopping_for, self()});
      stopping_for.reset();
      phase = receiver_phase::between;
      if (deferred) {
        prepare_record p = *deferred;
        deferred.reset();
        admit(p, out);
      }
      return;
    }
    if (phase == receiver_phase::member && attempt && attempt->syncing) {
      attempt->syncing = false;
      attempt->acked = true;
      completed = commit_record{attempt->target, attempt->next};
      to_coord(out, ack_msg{attempt->attempt, self(), attest ? e.attestation : std::nullopt});
      out.push_back(arm_deadline_action{});
    }
  }

  void on(const message_event& e, out_t& out) {
    if (phase == receiver_phase::booting || phase == receiver_phase::restoring) return;
    std::visit([&](const auto& m) { on_msg(m, out); }, e.env.msg);
  }
  template <class M>
  void on_msg(const M&, out_t&) {}

  /// The commit record is K (announcement, read, or a prepare's base): adopt, or restore if stale.
  /// Returns false if this receiver went to restore.
  /// `epoch`: the coordinator's (or the log's) that told it; a restore's new incarnation joins
  /// under it.
  bool commit_news(const commit_record& k, std::uint64_t epoch, out_t& out) {
    if (k == committed) {
      // A join is confirmed only by a message naming this incarnation (announce_msg::roster or a
      // prepare's members), never by K alone (finding B2; the mutation replays the old rule).
      if (phase == receiver_phase::joining && mutated(protocol_mutation::join_confirmed_by_any_announce))
        confirm_join(out);
      return true;
    }
    if (completed && *completed == k) {
      // The attempt this receiver completed committed: its parameters are exactly K.
      committed = k;
      completed.reset();
      if (attempt) out.push_back(discard_staged_action{attempt->attempt});
      attempt.reset();
      if (phase != receiver_phase::stopping) phase = receiver_phase::serving;
      if (!gate_open) {
        gate_open = true;
        out.push_back(open_gate_action{});
      }
      return true;
    }
    if (k.version > committed.version) {
      // K moved on without this receiver's parameters reaching it: rejoin as a new incarnation.
      restore(k, epoch, out);
      return false;
    }
    return true;  // older news
  }

  /// Dense refit to K under a new incarnation, then join (after an abort, or when stale).
  /// `epoch`: the newest coordinator epoch the news that sent it here came from: the new
  /// incarnation's join names it (join_msg::epoch), so the coordinator that asked takes it as a
  /// sign of life.
  void restore(const commit_record& k, std::uint64_t epoch, out_t& out) {
    epoch_seen = std::max(epoch_seen, epoch);
    {
      if (attempt) out.push_back(discard_staged_action{attempt->attempt});
      attempt.reset();
      completed.reset();
      deferred.reset();
      stopping_for.reset();
      drop_early(out);
      ++incarnation;
      out.push_back(persist_incarnation_action{incarnation});
      if (gate_open) {
        gate_open = false;
        out.push_back(close_gate_action{});
      }
      phase = receiver_phase::restoring;
      sync_pending = false;
      unsynced = false;
      out.push_back(disarm_deadline_action{});
      out.push_back(dense_restore_action{k});
    }
  }

  void on_msg(const announce_msg& m, out_t& out) {
    // Only the newest coordinator this receiver heard of can confirm its join: an older one is
    // fenced, and the newer one may hold a dead incarnation of it (finding B7b). An answer names
    // the sender's epoch; epoch_seen itself stays (states that differ only in an epoch heard
    // from an announcement would split the checker's space for nothing).
    const bool from_current = m.epoch >= epoch_seen;
    const std::uint64_t answer_epoch = std::max(epoch_seen, m.epoch);
    if (!commit_news(m.record, m.epoch, out)) return;  // restoring
    if (mutated(protocol_mutation::join_confirmed_by_any_announce)) return;
    if (m.roster == self()) {
      if (m.evicted) {
        restore(committed, m.epoch, out);  // fenced: only a new incarnation is admitted
        return;
      }
      if (phase == receiver_phase::joining && from_current) confirm_join(out);
      // The coordinator holds this incarnation only as a guess (rebuilt from the log after a
      // takeover, or from a join of an older epoch): answer, or a later incarnation's join lost
      // at the takeover leaves its roster wrong for ever (findings B7, B7b). The join of an
      // incarnation it holds changes nothing else there.
      if (m.confirm) join(out, answer_epoch);
      return;
    }
    // The roster holds no incarnation of this receiver, or an older one (a lost join, a
    // coordinator that took over): join again, so that it converges to this live incarnation.
    if (!m.roster || m.roster->incarnation < incarnation) rejoin(out, answer_epoch);
  }

  void on_msg(const roll_call_msg& m, out_t& out) {
    epoch_seen = std::max(epoch_seen, m.epoch);
    // A roll call goes only to receivers the new coordinator's roster does not hold: whatever
    // attempt this one is in (member, stopping, between) will not be finished with it. Its landed
    // writes stay, so "join at=K" would be a lie that gets it admitted to an XOR attempt on dirty
    // bits (finding H2): restore K densely under a new incarnation first, as an evicted member does
    // (the restore waits for every issued apply, so nothing of the old attempt lands afterwards).
    // Only the roll call: an announcement whose roster lacks this incarnation may be a late copy
    // from an older coordinator, and restoring on it would throw away a live membership (the 2-
    // receiver drop + duplicate run grew from 93 185 classes past 3 million when it did). The
    // mutation replays the old rule.
    if (in_attempt() && !mutated(protocol_mutation::join_mid_attempt)) restore(committed, epoch_seen, out);
    else rejoin(out);
  }

  void on_msg(const prepare_msg& m, out_t& out) {
    const prepare_record& p = m.record;
    if (attempt && attempt->attempt == p.attempt) return;  // duplicate
    if (p.attempt <= highest_seen) return;                 // stale
    // A prepare of an older coordinator than one this receiver heard from (roll call, prepare,
    // abort) is a late copy from a fenced epoch: that coordinator can never commit it, and a
    // receiver that already answered the newer one's roll call with "join at=K" would otherwise
    // write the dead attempt's XOR payloads under that claim (finding H2, second form).
    if (p.attempt.epoch < epoch_seen) return;
    epoch_seen = std::max(epoch_seen, p.attempt.epoch);    // a prepare is sent by its attempt's coordinator
    if (phase == receiver_phase::aborted) {                // only a dense refit brings it back
      highest_seen = p.attempt;
      if (committed == p.base) restore(p.base, epoch_seen, out);
      else commit_news(p.base, epoch_seen, out);
      return;
    }
    if (!commit_news(p.base, epoch_seen, out)) return;     // the base is a commit record too
    const bool named = std::find(p.members.begin(), p.members.end(), self()) != p.members.end();
    if (early && (early->attempt < p.attempt || (early->attempt == p.attempt && !named)))
      drop_early(out);  // passed, or this member was not admitted to it
    if (!named) return;
    highest_seen = p.attempt;
    if (phase == receiver_phase::stopping) {  // still waiting for the device: admit afterwards
      deferred = p;
      return;
    }
    if (attempt) {
      // Superseded without an obsolete_msg: the older attempt must not write after this one starts.
      out.push_back(discard_staged_action{attempt->attempt});
      attempt.reset();
      if (unsynced && !mutated(protocol_mutation::retry_without_stop_and_wait)) {
        phase = receiver_phase::stopping;
        deferred = p;
        request_sync(out, false);
        return;
      }
    }
    admit(p, out);
  }

  void admit(const prepare_record& p, out_t& out) {
    if (committed != p.base) {
      to_coord(out, failed_msg{p.attempt, self(), failure_reason::not_at_base});
      phase = receiver_phase::between;
      return;
    }
    receiver_attempt a;
    a.attempt = p.attempt;
    a.mode = p.mode;
    a.base = p.base;
    a.target = p.target;
    a.next = p.next;
    attempt = a;
    phase = receiver_phase::member;
    if (gate == gate_policy::synchronous && gate_open) {
      gate_open = false;
      out.push_back(close_gate_action{});
    }
    out.push_back(arm_deadline_action{});  // watch K while a member (a lost obsolete or announcement)
    replay_early(out);
  }

  /// The admitted attempt's early messages, as if they arrived now: payloads, open, flush.
  void replay_early(out_t& out) {
    if (!early || !attempt || early->attempt != attempt->attempt) return;
    early_attempt e = std::move(*early);
    early.reset();
    for (const auto& m : e.payloads) take_payload(m, out, /*staged=*/true);
    if (e.conflict) fail(failure_reason::conflicting_payload, out);  // fail() reports once
    if (e.open && phase == receiver_phase::member && attempt) on_msg(*e.open, out);
    if (e.flush && phase == receiver_phase::member && attempt) on_msg(flush_msg{e.attempt}, out);
  }

  /// Drop the early buffer (its staged frames too): its attempt can no longer be admitted here.
  void drop_early(out_t& out) {
    if (!early) return;
    if (!early->payloads.empty()) out.push_back(discard_staged_action{early->attempt});
    early.reset();
  }

  /// May a message of attempt `t` be kept for later? Only for an attempt newer than every one seen
  /// (and than the active one): older ones are dead here. Makes room by dropping an older buffer.
  bool keep_early(const attempt_id& t, out_t& out) {
    if (phase == receiver_phase::aborted || t <= highest_seen || (attempt && t <= attempt->attempt)) return false;
    if (early && early->attempt > t) return false;  // a newer attempt already started sending
    if (early && early->attempt < t) drop_early(out);
    if (!early) early = early_attempt{t, {}, false, std::nullopt, false};
    return true;
  }

  void request_sync(out_t& out, bool with_attestation) {
    sync_pending = true;
    out.push_back(sync_device_action{with_attestation && attest});
  }

  void fail(failure_reason why, out_t& out) {
    if (attempt->failed) return;
    attempt->failed = true;
    to_coord(out, failed_msg{attempt->attempt, self(), why});
  }

  void on_msg(const payload_msg& m, out_t& out) {
    if (phase == receiver_phase::member && attempt && m.id.attempt == attempt->attempt) {
      take_payload(m, out, /*staged=*/false);
      return;
    }
    if (!keep_early(m.id.attempt, out)) return;  // an attempt that is over here: dropped
    auto& ps = early->payloads;
    auto it = std::lower_bound(ps.begin(), ps.end(), m, [](const payload_msg& a, const payload_msg& b) { return a.id < b.id; });
    if (it != ps.end() && it->id == m.id) {
      if (it->content != m.content) early->conflict = true;  // reported when the attempt is admitted
      return;                                                // an identical duplicate is ignored
    }
    ps.insert(it, m);
    out.push_back(stage_payload_action{m.id});
  }

  /// A verified payload of the active attempt; `staged` when its frame was kept before admission.
  void take_payload(const payload_msg& m, out_t& out, bool staged) {
    auto& cs = attempt->chunks;
    auto it = std::find_if(cs.begin(), cs.end(),
                           [&](const chunk_state& c) { return c.owner == m.id.owner && c.seq == m.id.seq; });
    if (it != cs.end()) {
      if (it->content != m.content) {
        fail(failure_reason::conflicting_payload, out);  // same id, different verified bytes
      } else if (mutated(protocol_mutation::dedup_off) && it->applied) {
        unsynced = true;  // broken on purpose: the duplicate is applied again
        out.push_back(apply_payload_action{m.id, it->mode, attempt->base.version, attempt->target});
      }
      return;  // an identical duplicate is ignored
    }
    // XOR needs exactly this attempt's base and an XOR attempt (never a retry); an overwrite
    // payload is valid on any base, so it may ride in an XOR attempt too.
    if (m.target != attempt->target ||
        (m.mode == mode::xor_mask && (attempt->mode != mode::xor_mask || m.base != attempt->base.version))) {
      fail(failure_reason::wrong_base, out);
      return;
    }
    chunk_state c{m.id.owner, m.id.seq, m.content, m.mode, false};
    cs.insert(std::upper_bound(cs.begin(), cs.end(), c), c);
    if (!staged) out.push_back(stage_payload_action{m.id});
    progress(out);
  }

  void on_msg(const open_msg& m, out_t& out) {
    if (!(phase == receiver_phase::member && attempt && m.attempt == attempt->attempt)) {
      if (keep_early(m.attempt, out) && !early->open) early->open = m;
      return;
    }
    if (attempt->open) return;
    attempt->open = true;
    attempt->manifest = m.chunks;
    progress(out);
  }

  void on_msg(const flush_msg& m, out_t& out) {
    if (gate != gate_policy::asynchronous) return;
    if (!(phase == receiver_phase::member && attempt && m.attempt == attempt->attempt)) {
      if (keep_early(m.attempt, out)) early->flush = true;
      return;
    }
    if (attempt->flushing) return;
    attempt->flushing = true;
    if (gate_open) {
      gate_open = false;
      out.push_back(close_gate_action{});
    }
    out.push_back(drain_requests_action{});
  }

  void on_msg(const obsolete_msg& m, out_t& out) {
    highest_seen = std::max(highest_seen, m.attempt);
    if (early && early->attempt <= m.attempt) drop_early(out);
    if (phase == receiver_phase::stopping) {
      if (!stopping_for || *stopping_for < m.attempt) stopping_for = m.attempt;
      if (deferred && deferred->attempt <= m.attempt) deferred.reset();
      return;
    }
    if (attempt && attempt->attempt <= m.attempt) {
      out.push_back(discard_staged_action{attempt->attempt});
      attempt.reset();
      if ((unsynced || sync_pending) && !mutated(protocol_mutation::retry_without_stop_and_wait)) {
        phase = receiver_phase::stopping;
        stopping_for = m.attempt;
        if (!sync_pending) request_sync(out, false);
        return;
      }
      phase = receiver_phase::between;
    }
    if (phase == receiver_phase::member || phase == receiver_phase::serving || phase == receiver_phase::joining ||
        phase == receiver_phase::between || phase == receiver_phase::aborted)
      to_coord(out, stopped_msg{m.attempt, self()});  // nothing of it can still take effect here
  }

  void on_msg(const abort_msg& m, out_t& out) {
    // Fenced like everything else (finding B6): an abort from an older coordinator than one this
    // receiver heard from, or of an attempt older than one it has seen, is stale.
    if (!mutated(protocol_mutation::unfenced_abort) && (m.epoch < epoch_seen || m.attempt < highest_seen)) return;
    epoch_seen = std::max(epoch_seen, m.epoch);
    if (early && early->attempt <= m.attempt) drop_early(out);
    if (phase == receiver_phase::stopping || (attempt && attempt->attempt > m.attempt)) return;
    if (attempt) out.push_back(discard_staged_action{attempt->attempt});
    attempt.reset();
    if (phase == receiver_phase::between || phase == receiver_phase::member) {
      phase = receiver_phase::aborted;
      if (gate_open) {
        gate_open = false;
        out.push_back(close_gate_action{});
      }
    }
  }

  /// Apply what can be applied, in manifest order; report arrival / sync for the ack when complete.
  void progress(out_t& out) {
    auto& a = *attempt;
    if (!a.open || a.failed) return;
    const bool may_apply = gate == gate_policy::synchronous || (a.flushing && a.drained);
    std::size_t total = 0;
    for (auto n : a.manifest) total += n;
    std::size_t present = 0;
    for (const auto& c : a.chunks)
      if (c.owner < a.manifest.size() && c.seq < a.manifest[c.owner]) ++present;
    if (!may_apply) {
      if (present == total && !a.arrived_sent) {
        a.arrived_sent = true;
        to_coord(out, arrived_msg{a.attempt, self()});
      }
      return;
    }
    std::size_t applied = 0;
    for (std::uint32_t o = 0; o < a.manifest.size(); ++o) {
      for (std::uint32_t s = 0; s < a.manifest[o]; ++s) {
        auto it = std::find_if(a.chunks.begin(), a.chunks.end(),
                               [&](const chunk_state& c) { return c.owner == o && c.seq == s; });
        if (it == a.chunks.end()) goto done;  // in order: wait for the missing one
        if (!it->applied) {
          it->applied = true;
          unsynced = true;
          completed.reset();  // parameters diverge from any earlier completed attempt
          out.push_back(apply_payload_action{payload_id{a.attempt, o, s}, it->mode, a.base.version, a.target});
        }
        ++applied;
      }
    }
  done:
    if (applied == total && !a.syncing && !a.acked) {
      a.syncing = true;
      completed.reset();
      request_sync(out, true);
    }
  }
};

using receiver = basic_receiver<>;

BITREFIT_NO_FIELDS(boot_event)
BITREFIT_NO_FIELDS(drained_event)
BITREFIT_FIELDS(device_synced_event, attestation)
BITREFIT_FIELDS(commit_read_event, record, epoch)
BITREFIT_FIELDS(restored_event, record)
BITREFIT_FIELDS(persist_incarnation_action, incarnation)
BITREFIT_NO_FIELDS(close_gate_action)
BITREFIT_NO_FIELDS(drain_requests_action)
BITREFIT_FIELDS(stage_payload_action, id)
BITREFIT_FIELDS(apply_payload_action, id, mode, base, target)
BITREFIT_FIELDS(discard_staged_action, attempt)
BITREFIT_FIELDS(sync_device_action, attest)
BITREFIT_FIELDS(open_gate_action, invalidate_kv_cache)
BITREFIT_NO_FIELDS(read_commit_action)
BITREFIT_FIELDS(dense_restore_action, record)
BITREFIT_FIELDS(chunk_state, owner, seq, content, mode, applied)
BITREFIT_FIELDS(receiver_attempt, attempt, mode, base, target, next, open, manifest, chunks, arrived_sent, flushing, drained,
                syncing, acked, failed)
BITREFIT_FIELDS(early_attempt, attempt, payloads, conflict, open, flush)
BITREFIT_FIELDS_T(template <class M>, basic_receiver<M>, id, incarnation, gate, attest, mutation, phase, committed, gate_open,
                  highest_seen, epoch_seen, attempt, completed, unsynced, sync_pending, stopping_for, deferred, early)

}  // namespace bitrefit::protocol

template <class M>
struct std::hash<bitrefit::protocol::basic_receiver<M>> {
  std::size_t operator()(const bitrefit::protocol::basic_receiver<M>& r) const { return bitrefit::protocol::hash_of(r); }
};
