// bitrefit/refit/receiver.hpp — the rollout-engine side of a refit: one receiver incarnation.
//
// Composes the pure protocol::receiver state machine with policies:
//   Loader     (layout/concepts.hpp)      the engine's own placement of canonical values; it may
//                                         hold only some tensors or tensor-parallel slices (it
//                                         writes and attests over its held ranges only) and may
//                                         place some tensors non-bit-preservingly (overwrite only)
//   Transport  (transport/concepts.hpp)   control messages in, payload frames in
//   CommitLog  (durability/concepts.hpp)  read-only: read_commit when an announcement was missed
//   Crash      (core/crash_points.hpp)    test policy: where this process may "die" (default: nowhere)
// Driver loop (step()), one thread:
//   1. receive this receiver's mailbox, decode, step message_event (what does not decode is
//      counted, logged by mailbox and dropped);
//   2. while admitted to an attempt τ: list τ's frames, fetch the ones not delivered yet, verify
//      each fully (a copy that does not verify is undelivered: it is never stepped and is fetched
//      again later), and step it as a payload_msg carrying the frame's own digest as its content;
//   3. feed deadline_event when the armed deadline passed; progress a dense restore in flight.
// Every step goes through protocol::drive, which performs the actions through this class's
// Effects (below), in list order: close_gate BEFORE any apply of the attempt; stage keeps the
// verified (compressed) frame; apply writes it through the Loader (receiver_store: the frame
// verified on arrival is not decoded again), in the order the state machine emits (owner, seq);
// sync_device computes the attestation digest over the
// held ranges and feeds device_synced_event (the ack follows from the machine); open_gate after
// the commit news; persist_incarnation BEFORE sending anything under the new incarnation;
// dense_restore asks the owners (wire::restore_request) for K.v and writes every held element
// from their dense frames, then feeds restored_event; read_commit reads the CommitLog. With a trace
// directory (receiver_options::trace_dir or $BITREFIT_TRACE_DIR) every step is recorded
// (wire/trace.hpp) for bitrefit-check-trace.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <string>

#include <memory>
#include <set>

#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/protocol/driver.hpp"
#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/receiver.hpp"
#include "bitrefit/refit/placement.hpp"
#include "bitrefit/refit/receiver_store.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/wire/control.hpp"
#include "bitrefit/wire/engine.hpp"
#include "bitrefit/wire/trace.hpp"

namespace bitrefit::refit {

struct receiver_options {
  std::uint32_t index = 0;
  std::uint64_t incarnation = 1;  // this process's incarnation, already persisted by the caller
  protocol::gate_policy gate = protocol::gate_policy::synchronous;
  bool attest = true;
  std::chrono::milliseconds poll{2};
  std::chrono::milliseconds deadline{1000};
  std::function<void(std::uint64_t)> persist_incarnation;  // durable record of a new incarnation
  std::function<void(bool open)> on_gate;                   // the serving engine's request gate
  std::function<void()> drain;                              // async: in-flight requests of v finish
  /// Called when the gate reopens: the parameters are exactly K (after a commit or a restore).
  std::function<void(const protocol::commit_record&)> on_commit;
  /// Record every step of this receiver (wire/trace.hpp) in this directory; empty:
  /// $BITREFIT_TRACE_DIR if set, else off.
  std::string trace_dir;
  /// Called for every input this receiver drops, with the error that names why: a control
  /// message that does not decode (refit/wire.hpp: errc::format naming the field), one its state
  /// machine ignores (errc::protocol, the message spelled out: a stale attempt or epoch, another
  /// incarnation, a repeat), a payload copy that does not verify (the frame's error, file = its
  /// key: forged, truncated, oversized, replayed from another attempt, for tensors not served), a
  /// restore reply or frame that does not verify. The receiver drops the input and keeps running;
  /// a payload copy is fetched again later. For logs and metrics; must not throw.
  std::function<void(const error&)> on_refused;
};

/// Counters a receiver keeps (tests and the demo read them).
struct receiver_counters {
  std::uint64_t delivered = 0, undelivered = 0, applied = 0, duplicates_seen = 0, restores = 0;
  std::uint64_t undecodable = 0;  // control / engine messages that did not decode (logged, dropped)
  std::uint64_t decodes = 0;      // payload frames parsed and decoded (once each when applied on arrival)
  std::uint64_t refused_control = 0;  // control messages that did not decode or that the protocol ignored
};

template <layout::Loader Ld, transport::Transport T, durability::CommitLog L, CrashPoints Crash = no_crash_points>
class receiver {
 public:
  receiver(Ld& loader, T transport, L log, receiver_options o, Crash crash = {})
      : store_(loader), transport_(std::move(transport)), log_(std::move(log)), opt_(std::move(o)), crash_(std::move(crash)) {
    const protocol::protocol_config cfg{opt_.gate, 1, opt_.index + 1, opt_.attest, 0};
    sm_ = protocol::receiver::restarted(opt_.index, opt_.incarnation, cfg);
    if (const auto dir = wire::trace_dir_from(opt_.trace_dir); !dir.empty()) {
      trace_ = std::make_unique<wire::trace_file_writer>(dir, "r" + std::to_string(opt_.index) + "-i" + std::to_string(opt_.incarnation));
      trace_->line({{"init", {{"role", "receiver"}, {"id", opt_.index}, {"incarnation", opt_.incarnation}, {"config", wire::value_to_json(cfg)}}}});
    }
  }

  /// A fresh process: announces its placement (the sender checks it against its configuration),
  /// reads K, restores K.v densely, joins at the next prepare.
  void start() {
    transport_.post(wire::placement_mailbox, wire::encode(wire::placement_announcement{opt_.index, declare(store_.loader()).digest()}));
    step_sm(protocol::boot_event{});
  }

  /// One round of the driver loop; waits at most about `wait` for control messages.
  void step(std::chrono::milliseconds wait) {
    bool any = false;
    const std::string inbox = wire::mailbox(self_endpoint());
    wire::for_each_decoded(
        transport_.receive(inbox, wait), inbox, counters_.undecodable, [](const auto& b) { return wire::decode(b); },
        [&](const protocol::envelope& env) {
          any = true;
          const protocol::receiver before = sm_;
          step_sm(protocol::message_event{env});
          if (first_step_actions_ == 0 && sm_ == before) {  // the machine ignored it
            ++counters_.refused_control;
            refuse(error(errc::protocol, "ignored by the protocol (stale attempt or epoch, another incarnation, or a repeat): " + protocol::fmt::str(env),
                         {.file = inbox, .tensor = {}, .field = "message"}));
          }
        },
        [this](const error& e) {
          ++counters_.refused_control;
          refuse(e);
        });
    any |= poll_payloads();
    if (restoring_) progress_restore();
    if (deadline_ && clock::now() >= *deadline_) {
      deadline_.reset();
      step_sm(protocol::deadline_event{});
    }
    if (read_retry_ && clock::now() >= *read_retry_) {
      read_retry_.reset();
      if (auto ev = read_commit()) step_sm(*ev);
    }
    (void)any;
  }

  /// Steps until `pred` holds or `timeout` passes; returns pred().
  template <class Pred>
  bool run_until(Pred pred, std::chrono::milliseconds timeout) {
    const auto until = clock::now() + timeout;
    while (!pred() && clock::now() < until) step(opt_.poll);
    return pred();
  }

  const protocol::receiver& state() const noexcept { return sm_; }
  bool serving() const noexcept { return sm_.phase == protocol::receiver_phase::serving; }
  bool gate_open() const noexcept { return sm_.gate_open; }
  const receiver_counters& counters() const noexcept {
    counters_.decodes = store_.decodes();
    return counters_;
  }
  Ld& loader() noexcept { return store_.loader(); }
  T& transport() noexcept { return transport_; }
  /// Attestation digest over the held ranges, now.
  digest128 attest() const { return store_.attest(); }
  /// The attestation digest of the last device sync that carried one.
  const std::optional<digest128>& last_attestation() const noexcept { return last_attestation_; }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  protocol::endpoint self_endpoint() const { return protocol::endpoint::receiver_(opt_.index); }

  void step_sm(const protocol::receiver_event& ev) {
    effects fx{*this};
    first_step_ = true;
    protocol::drive_until_quiet(sm_, ev, fx, later_);
  }

  void refuse(const error& e) {
    if (opt_.on_refused) opt_.on_refused(e);
  }

  // ---- the receiver's Effects (protocol/driver.hpp): what its actions do in this engine.
  // protocol::drive is the only caller; completions go through later_ (stepped after the step
  // that issued them performed all of its actions).
  struct effects {
    receiver& s;

    /// Observation before the actions run (protocol/driver.hpp, 1): the trace line, and how many
    /// actions the event's own step produced (step() reports a control message that changed
    /// nothing as ignored).
    template <class Event, class Actions>
    void on_step(const protocol::endpoint&, const Event& ev, const Actions& actions) {
      if (s.trace_) s.trace_->step(ev, actions);  // off: one null check
      if (!s.first_step_) return;
      s.first_step_ = false;
      s.first_step_actions_ = actions.size();
    }

    void send(const protocol::endpoint&, const protocol::envelope& env) {
      s.transport_.post(wire::mailbox(env.to), wire::encode(env));
    }
    void persist_incarnation(const protocol::endpoint&, std::uint64_t inc) {
      if (s.opt_.persist_incarnation) s.opt_.persist_incarnation(inc);
    }
    void close_gate(const protocol::endpoint&) {
      if (s.opt_.on_gate) s.opt_.on_gate(false);
      s.gate_closed_at_ = clock::now();
    }
    void open_gate(const protocol::endpoint&, bool) {
      if (s.opt_.on_gate) s.opt_.on_gate(true);
      if (s.gate_closed_at_) s.gate_closed_s_ += seconds(clock::now() - *s.gate_closed_at_);
      s.gate_closed_at_.reset();
      s.report_and_reset();
      if (s.opt_.on_commit && s.sm_.phase != protocol::receiver_phase::restoring) s.opt_.on_commit(s.sm_.committed);
    }
    void drain_requests(const protocol::endpoint&) {
      if (s.opt_.drain) s.opt_.drain();
      s.later_.push(protocol::drained_event{});
    }
    void stage_payload(const protocol::endpoint&, const payload_id& id) {
      if (s.arrived_ && s.arrived_->id == id) s.staged_[id] = std::move(*s.arrived_);
      s.arrived_.reset();
      if (!s.report_attempt_ || *s.report_attempt_ < id.attempt) s.report_attempt_ = id.attempt;
    }
    void apply_payload(const protocol::endpoint&, const protocol::apply_payload_action& act) { s.apply(act); }
    void discard_staged(const protocol::endpoint&, const attempt_id& a) {
      std::erase_if(s.staged_, [&](const auto& kv) { return kv.first.attempt == a; });
      if (s.listing_ && *s.listing_ == a) {
        s.listing_.reset();
        s.delivered_.clear();
      }
    }
    /// Host memory: every write already took effect, so the device is synchronised at once.
    void sync_device(const protocol::endpoint&, bool attest) {
      const auto t = clock::now();
      std::optional<digest128> att;
      if (attest) att = s.store_.attest();
      if (att) s.last_attestation_ = att;
      s.sync_s_ += seconds(clock::now() - t);
      s.later_.push(protocol::device_synced_event{att});
    }
    void read_commit(const protocol::endpoint&) {
      if (auto ev = s.read_commit()) s.later_.push(*ev);
    }
    void dense_restore(const protocol::endpoint&, const protocol::commit_record&) { s.begin_restore(); }
    void arm_deadline(const protocol::endpoint&) { s.deadline_ = clock::now() + s.opt_.deadline; }
    void disarm_deadline(const protocol::endpoint&) { s.deadline_.reset(); }
  };

  void apply(const protocol::apply_payload_action& act) {
    auto it = staged_.find(act.id);
    if (it == staged_.end())
      throw error(errc::protocol, "apply of payload " + act.id.to_string() + " that was never staged", {.file = {}, .tensor = {}, .field = "payload"});
    const auto t = clock::now();
    // Parsed and matched when it arrived; decoded once, here, then written.
    if (it->second.view.header().target_version != act.target)
      throw error(errc::protocol, "staged frame's target differs from the attempt's", {.file = act.id.to_string(), .tensor = {}, .field = "target"});
    store_.apply_parsed(it->second.view, act.id.to_string());
    apply_s_ += seconds(clock::now() - t);
    staged_.erase(it);  // applied once; a duplicate is ignored by the state machine
    ++counters_.applied;
    crash_.pass("receiver_applied", "receiver/" + std::to_string(opt_.index));
  }

  /// Lists the active attempt's frames and delivers the ones not delivered yet.
  bool poll_payloads() {
    if (sm_.phase != protocol::receiver_phase::member || !sm_.attempt) return false;
    const attempt_id a = sm_.attempt->attempt;
    if (listing_ != a) {
      listing_ = a;
      delivered_.clear();
    }
    bool any = false;
    std::set<transport::frame_key> this_round;
    for (const auto& key : transport_.list(transport::attempt_stream(a))) {
      const bool repeat = !this_round.insert(key).second;  // the network listed it twice: a duplicate copy
      if (delivered_.count(key) && !repeat) continue;
      std::optional<transport::bytes> bytes;
      std::optional<std::pair<codec::frame_view, verified_frame>> inspected;
      try {
        bytes = transport_.fetch(key);  // may refuse an object above the store's size limit
        if (!bytes) continue;
        inspected.emplace(store_.inspect(*bytes, key.stream.name + "/" + transport::frame_object_name(key.owner, key.seq)));
        const verified_frame& v = inspected->second;
        if (v.header.kind != codec::frame_kind::delta || v.header.id.attempt != a || v.header.id.owner != key.owner ||
            v.header.id.seq != key.seq)
          throw error(errc::mismatch, "frame id " + v.header.id.to_string() + (v.header.kind != codec::frame_kind::delta ? " (dense)" : "") +
                                          " differs from its key (a replayed or misplaced copy)",
                      {.file = key.stream.name + "/" + transport::frame_object_name(key.owner, key.seq), .tensor = {}, .field = "id"});
      } catch (const error& e) {
        ++counters_.undelivered;  // corrupt or foreign copy: fetched again on a later poll
        refuse(e);
        continue;
      } catch (const std::bad_alloc&) {  // (the decoder names its own; this is the fetch's)
        ++counters_.undelivered;
        refuse(error(errc::integrity, "out of memory reading this copy", {.file = key.stream.name + "/" + transport::frame_object_name(key.owner, key.seq), .tensor = {}, .field = "size"}));
        continue;
      }
      if (repeat) ++counters_.duplicates_seen;
      delivered_.insert(key);
      ++counters_.delivered;
      any = true;
      if (!sm_.attempt || sm_.attempt->attempt != a) break;
      // The frame's own mode (xor iff any item is XOR): the machine decides whether it fits the attempt.
      const verified_frame& v = inspected->second;
      protocol::payload_msg m{v.header.id, v.header.base_version, v.header.target_version, v.mode, v.content};
      // The view points into the vector's buffer, which moves with it (never reallocated).
      arrived_.emplace(staged_frame{v.header.id, std::move(*bytes), std::move(inspected->first)});
      step_sm(protocol::message_event{protocol::envelope{protocol::endpoint::owner_(key.owner), self_endpoint(), m}});
      arrived_.reset();
      if (sm_.phase != protocol::receiver_phase::member || !sm_.attempt || sm_.attempt->attempt != a) break;
    }
    return any;
  }

  /// Reads K; the answer is a commit_read_event for the machine (nothing when the log did not
  /// answer: read_retry_ asks again soon).
  std::optional<protocol::receiver_event> read_commit() {
    const auto r = log_.apply(protocol::read_request{});
    if (r.outcome != protocol::log_outcome::ok) {
      read_retry_ = clock::now() + opt_.poll * 10;
      return std::nullopt;
    }
    return protocol::commit_read_event{r.snapshot.record, r.snapshot.epoch};
  }

  // ---- dense restore from the owners' committed baseline ----

  void begin_restore() {
    restoring_ = true;
    restore_asked_.reset();
    ask_restore();
  }
  void ask_restore() {
    transport_.post(wire::restore_mailbox, wire::encode(wire::restore_request{opt_.index, sm_.incarnation}));
    restore_asked_ = clock::now();
  }
  void progress_restore() {
    const std::string inbox = wire::restore_reply_mailbox(opt_.index);
    wire::for_each_decoded(transport_.receive(inbox, std::chrono::milliseconds(0)), inbox, counters_.undecodable,
                           [](const auto& b) { return wire::decode<wire::restore_offer>(b); },
                           [&](const wire::restore_offer& offer) {
                             if (!restoring_ || !restore_from(offer.record, offer.chunks)) return;
                             restoring_ = false;
                             ++counters_.restores;
                             step_sm(protocol::restored_event{offer.record});
                           },
                           [this](const error& e) { refuse(e); });
    if (restoring_ && restore_asked_ && clock::now() - *restore_asked_ > opt_.deadline) ask_restore();
  }
  /// Verifies every dense frame of K first (nothing written if one is missing or corrupt), then
  /// writes them. Frames are held one at a time after verification, so scratch stays bounded by
  /// re-fetching in the write pass.
  bool restore_from(const protocol::commit_record& k, const std::vector<std::uint32_t>& chunks) {
    const auto stream = transport::restore_stream(k.version, k.baseline);
    for (int pass = 0; pass < 2; ++pass)
      for (std::uint32_t o = 0; o < chunks.size(); ++o)
        for (std::uint32_t s = 0; s < chunks[o]; ++s) {
          const std::string src = stream.name + "/" + transport::frame_object_name(o, s);
          try {
            auto bytes = transport_.fetch(transport::frame_key{stream, o, s});  // may refuse an oversized object
            if (!bytes) return false;
            // pass 0: every frame present, intact and matched before anything is written; pass 1:
            // each decoded once and written
            const verified_frame v = pass == 0 ? store_.inspect(*bytes, src).second : store_.apply(*bytes, src);
            if (v.header.kind != codec::frame_kind::dense || v.header.target_version != k.version) return false;
          } catch (const error& e) {
            ++counters_.undelivered;
            refuse(e);
            return false;  // a pass-1 failure means a copy changed between passes: ask again
          }
        }
    return true;
  }

  void report_and_reset() {
    if (report_attempt_)
      transport_.post(wire::stats_mailbox, wire::encode(wire::stats_report{opt_.index, *report_attempt_, apply_s_, sync_s_, gate_closed_s_}));
    apply_s_ = sync_s_ = gate_closed_s_ = 0;
    report_attempt_.reset();
  }

  receiver_store<Ld> store_;
  T transport_;
  L log_;
  receiver_options opt_;
  Crash crash_;
  protocol::receiver sm_;
  protocol::completion_queue<protocol::receiver_event> later_;
  /// A verified frame kept (compressed) for the machine: its id, the digest it verified with.
  struct staged_frame {
    payload_id id{};
    std::vector<std::byte> bytes;
    codec::frame_view view;  // parsed from `bytes` (their heap buffer), matched to the loader
  };
  std::map<payload_id, staged_frame> staged_;
  std::optional<staged_frame> arrived_;  // the frame being stepped as a payload_msg right now
  std::optional<attempt_id> listing_;
  std::set<transport::frame_key> delivered_;
  std::optional<clock::time_point> deadline_, read_retry_, gate_closed_at_, restore_asked_;
  bool restoring_ = false;
  std::optional<digest128> last_attestation_;
  std::optional<attempt_id> report_attempt_;
  double apply_s_ = 0, sync_s_ = 0, gate_closed_s_ = 0;
  mutable receiver_counters counters_;
  std::unique_ptr<wire::trace_file_writer> trace_;
  bool first_step_ = false;             // the next on_step is the event's own step (not a completion)
  std::size_t first_step_actions_ = 0;  // actions of that step
};

}  // namespace bitrefit::refit
