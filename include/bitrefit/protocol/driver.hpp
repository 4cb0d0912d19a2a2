// bitrefit/protocol/driver.hpp — THE interpreter of protocol actions.
//
// The machines (coordinator, owner, receiver) only decide: `step(event) -> actions`. Something must
// then do what the actions say — hand a message to the network, ask the commit log, write a
// payload into the engine's weights, arm a timer. That is `drive()` below, and nothing else: the
// model world (model/cluster.hpp, what RapidCheck and the exhaustive checker explore) and the
// engine (refit/, what users run) are two implementations of the Effects concepts below, and
// neither looks at an action itself. So the code path from a machine's decision to its effect is
// one and the same in the checked world and in production (stateright's rule: the checker and
// the runtime execute the same actor code through the same interpreter).
//
// drive(machine, event, fx):
//   1. fx.on_step(self, event, actions) when fx has it (trace recording, scenario text): called
//      once per step, BEFORE any action is performed, so a process killed while performing them
//      still left a record of everything it was about to do.
//   2. Performs the actions IN LIST ORDER, each through exactly one Effects operation.
//   3. fx.progress(self) after a step that shows a remote machine or a local job is alive (a
//      message the coordinator counts, an owner's encoded chunk). Deadlines measure silence, not
//      total time: an implementation with wall-clock timers pushes its armed deadlines forward
//      here. Deadlines are hints (stepping one early or late is safe, see the laws), so the model
//      implements this as nothing and explores every deadline time instead.
//
// Completions. An action that completes later (ask_log, drain_requests, sync_device, read_commit,
// dense_restore, encode) produces exactly one event for the SAME machine (encode: one
// chunk_encoded per chunk in seq order, then encode_finished); the Effects implementation feeds it
// back with another drive() call — never fabricated, dropped, duplicated or reordered, and never
// from inside the drive() call that issued the action (that would run the completion before the
// rest of the action list). `completion_queue` is a FIFO for implementations that complete
// synchronously.
//
// Laws every Effects implementation keeps (the machines' safety rests on them; the checker
// assumes exactly these):
//   L1 durable first: ask_log is the last action of its step; nothing depending on its reply is
//      sent before the reply is stepped. persist_incarnation is durable before anything is sent
//      under the new incarnation; advance_baseline and freeze_change_set are durable before the
//      baseline / frozen set is used (freeze: before the first encoded chunk is reported).
//   L2 sends may be lost, duplicated, delayed or reordered, never altered: a payload_msg's content
//      is the digest of the frame published under key_of(id) (send(payload) may be a no-op where
//      the data plane already carries that frame).
//   L3 apply_payload may complete asynchronously and out of order within one attempt; only
//      sync_device and dense_restore wait for every issued apply. device_synced is fed only after
//      every earlier apply took effect; its attestation is over the held ranges, when asked.
//   L4 one timer per machine: arm_deadline (re)starts it, disarm_deadline cancels it, expiry is a
//      deadline_event. Any deadline may fire early or late (they are hints).
//   L5 close_gate happens before any apply of the attempt; open_gate after the parameters are
//      exactly K (KV caches invalidated).
//   L6 fence: from now on nothing from that incarnation takes effect at the coordinator (the
//      coordinator also ignores it itself; the effect lets the transport drop its traffic early).
#pragma once

#include <concepts>
#include <cstdint>
#include <deque>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/protocol/receiver.hpp"

namespace bitrefit::protocol {

/// What the coordinator's actions need from the world. `self` is always endpoint::coord().
template <class F>
concept CoordinatorEffects = requires(F& fx, const endpoint& self, const envelope& env, const log_request& q,
                                      const member& m, const attempt_id& a, const commit_record& k,
                                      const std::string& why) {
  fx.send(self, env);            // hand to the transport (L2)
  fx.ask_log(self, q);           // the commit log; its reply comes back as log_event (L1)
  fx.arm_deadline(self);         // L4
  fx.disarm_deadline(self);
  fx.fence(self, m);             // L6
  fx.cleanup(self, a);           // stop_and_wait(τ) done: τ's payload objects may be deleted
  fx.committed(self, k);         // the transition ended with K durable and announced
  fx.deposed(self);              // a newer epoch fenced this coordinator: stop acting
  fx.aborted(self, a);           // operator abort finished
  fx.needs_operator(self, why);  // nothing more happens automatically
  fx.progress(self);             // see the header comment, step 3
};

/// What an owner's actions need. `self` is endpoint::owner_(i).
template <class F>
concept OwnerEffects = requires(F& fx, const endpoint& self, const envelope& env, const commit_record& k,
                                const freeze_change_set_action& fz, const encode_action& enc, const attempt_id& a) {
  fx.send(self, env);
  fx.advance_baseline(self, k);     // B := the frozen target, durably recorded as K (L1)
  fx.freeze_change_set(self, fz);   // keep positions + absolute values of target vs B, durably (L1)
  fx.encode(self, enc);             // then chunk_encoded per chunk in seq order, then encode_finished
  fx.cancel_encoding(self, a);      // stop encoding and sending τ's chunks
  fx.progress(self);
};

/// What a receiver's actions need. `self` is endpoint::receiver_(i).
template <class F>
concept ReceiverEffects = requires(F& fx, const endpoint& self, const envelope& env, std::uint64_t inc,
                                   const payload_id& id, const apply_payload_action& ap, const attempt_id& a,
                                   const commit_record& k, bool flag) {
  fx.send(self, env);
  fx.persist_incarnation(self, inc);  // durable before anything is sent under it (L1)
  fx.close_gate(self);                // L5
  fx.open_gate(self, flag);           // flag: invalidate KV caches (L5)
  fx.drain_requests(self);            // then drained_event
  fx.stage_payload(self, id);         // keep the verified frame (compressed)
  fx.apply_payload(self, ap);         // decode + write the staged frame in place (L3)
  fx.discard_staged(self, a);         // drop every staged frame of τ
  fx.sync_device(self, flag);         // then device_synced_event (flag: with attestation) (L3)
  fx.read_commit(self);               // then commit_read_event
  fx.dense_restore(self, k);          // wait for issued applies, write all of K.v, then restored_event
  fx.arm_deadline(self);              // L4
  fx.disarm_deadline(self);
};

/// The whole protocol's effects (the model world implements every role).
template <class F>
concept Effects = CoordinatorEffects<F> && OwnerEffects<F> && ReceiverEffects<F>;

namespace detail {

/// The one visitor from actions to effects. Every action of every machine has exactly one case.
template <class F>
struct perform {
  F& fx;
  endpoint self;

  // shared
  void operator()(const send_action& a) const { fx.send(self, a.env); }
  void operator()(const arm_deadline_action&) const { fx.arm_deadline(self); }
  void operator()(const disarm_deadline_action&) const { fx.disarm_deadline(self); }
  // coordinator
  void operator()(const log_action& a) const { fx.ask_log(self, a.request); }
  void operator()(const fence_receiver_action& a) const { fx.fence(self, a.fenced); }
  void operator()(const cleanup_action& a) const { fx.cleanup(self, a.attempt); }
  void operator()(const committed_action& a) const { fx.committed(self, a.record); }
  void operator()(const deposed_action&) const { fx.deposed(self); }
  void operator()(const aborted_action& a) const { fx.aborted(self, a.attempt); }
  void operator()(const needs_operator_action& a) const { fx.needs_operator(self, a.why); }
  // owner
  void operator()(const advance_baseline_action& a) const { fx.advance_baseline(self, a.record); }
  void operator()(const freeze_change_set_action& a) const { fx.freeze_change_set(self, a); }
  void operator()(const encode_action& a) const { fx.encode(self, a); }
  void operator()(const cancel_encoding_action& a) const { fx.cancel_encoding(self, a.attempt); }
  // receiver
  void operator()(const persist_incarnation_action& a) const { fx.persist_incarnation(self, a.incarnation); }
  void operator()(const close_gate_action&) const { fx.close_gate(self); }
  void operator()(const open_gate_action& a) const { fx.open_gate(self, a.invalidate_kv_cache); }
  void operator()(const drain_requests_action&) const { fx.drain_requests(self); }
  void operator()(const stage_payload_action& a) const { fx.stage_payload(self, a.id); }
  void operator()(const apply_payload_action& a) const { fx.apply_payload(self, a); }
  void operator()(const discard_staged_action& a) const { fx.discard_staged(self, a.attempt); }
  void operator()(const sync_device_action& a) const { fx.sync_device(self, a.attest); }
  void operator()(const read_commit_action&) const { fx.read_commit(self); }
  void operator()(const dense_restore_action& a) const { fx.dense_restore(self, a.record); }
};

template <class F, class Event, class Actions>
void observe(F& fx, const endpoint& self, const Event& ev, const Actions& actions) {
  if constexpr (requires { fx.on_step(self, ev, actions); }) fx.on_step(self, ev, actions);
}

template <class F, class Actions>
void perform_all(F& fx, const endpoint& self, const Actions& actions) {
  const perform<F> p{fx, self};
  for (const auto& a : actions) std::visit(p, a);
}

}  // namespace detail

/// Step the coordinator with `ev` and perform its actions (header comment: 1, 2, 3).
template <class Mut, CoordinatorEffects F>
void drive(basic_coordinator<Mut>& c, const coordinator_event& ev, F& fx) {
  const endpoint self = endpoint::coord();
  // Decided on the state BEFORE the step: did a live remote machine speak to us?
  const auto* msg = std::get_if<message_event>(&ev);
  const bool alive = msg && c.counts(msg->env);
  const auto actions = c.step(ev);
  detail::observe(fx, self, ev, actions);
  if (alive) fx.progress(self);
  detail::perform_all(fx, self, actions);
}

/// Step owner `o` with `ev` and perform its actions. An encoded chunk is a sign of life.
template <class Mut, OwnerEffects F>
void drive(basic_owner<Mut>& o, const owner_event& ev, F& fx) {
  const endpoint self = endpoint::owner_(o.id);
  const auto actions = o.step(ev);
  detail::observe(fx, self, ev, actions);
  if (!std::holds_alternative<message_event>(ev)) fx.progress(self);
  detail::perform_all(fx, self, actions);
}

/// Step receiver `r` with `ev` and perform its actions.
template <class Mut, ReceiverEffects F>
void drive(basic_receiver<Mut>& r, const receiver_event& ev, F& fx) {
  const endpoint self = endpoint::receiver_(r.id);
  const auto actions = r.step(ev);
  detail::observe(fx, self, ev, actions);
  detail::perform_all(fx, self, actions);
}

/// A FIFO of completions for Effects implementations that complete actions synchronously (e.g. a
/// commit log called in place): the effect pushes the event, and the caller drives it once the
/// step that issued the action has performed all of its actions.
template <class Event>
class completion_queue {
 public:
  void push(Event e) { q_.push_back(std::move(e)); }
  bool empty() const noexcept { return q_.empty(); }
  Event pop() {
    Event e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::deque<Event> q_;
};

/// drive(m, ev, fx), then every completion `later` received, in order, until it is empty.
template <class Machine, class Event, class F>
void drive_until_quiet(Machine& m, Event ev, F& fx, completion_queue<Event>& later) {
  drive(m, ev, fx);
  while (!later.empty()) drive(m, later.pop(), fx);
}

}  // namespace bitrefit::protocol
