// bitrefit/refit/sender_effects.hpp — what the coordinator's and the owners' actions do in the
// sender: its implementation of protocol::CoordinatorEffects and protocol::OwnerEffects.
//
// protocol::drive (protocol/driver.hpp) is the only caller: nothing else in the engine looks at an
// action. The laws of driver.hpp hold here as follows:
//   ask_log         the CommitLog is called in place; its reply is queued and stepped after the
//                   step that asked (L1: the request is the step's last action)
//   send            owner <-> coordinator messages stay in this process (a local queue); messages
//                   to receivers are posted on the control plane; a payload_msg is carried by the
//                   data plane (its frame was published under key_of(id) before chunk_encoded was
//                   stepped), so its send is the frame itself (L2)
//   freeze          the owner copies v+1 out of the trainer (once per target) and saves it durably
//                   BEFORE anything is encoded: the change set, or the whole image (L1)
//   advance         B := frozen, then the store keeps only K.v's image
//   encode / cancel the encode pipeline (refit/encode_pipeline.hpp), one job per owner
//   progress        pushes the armed deadline forward: it measures silence, not total time
//   on_step         the trace line (wire/trace.hpp), written before any effect
#pragma once

#include <exception>
#include <string>
#include <variant>

#include "bitrefit/core/error.hpp"
#include "bitrefit/protocol/driver.hpp"
#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::refit {

/// `Sender` is refit::sender (it befriends this struct).
template <class Sender>
struct sender_effects {
  Sender& s;

  template <class Event, class Actions>
  void on_step(const protocol::endpoint& self, const Event& ev, const Actions& actions) {
    if (s.trace_) s.trace_->of(self).step(ev, actions);  // off: one null check
  }

  // ---- every role
  void send(const protocol::endpoint& self, const protocol::envelope& env) {
    if (self.role == protocol::role::coordinator) {
      if (const auto* p = std::get_if<protocol::prepare_msg>(&env.msg)) {
        s.last_members_ = p->record.members.size();
        s.transition_attempts_.insert(p->record.attempt);
      }
      if (std::holds_alternative<protocol::obsolete_msg>(env.msg)) s.crash_.pass("coordinator_stopping", "coordinator");  // mid stop_and_wait
    }
    s.route(env);
  }
  void arm_deadline(const protocol::endpoint&) { s.deadline_ = Sender::clock::now() + s.opt_.deadline; }
  void disarm_deadline(const protocol::endpoint&) { s.deadline_.reset(); }
  void progress(const protocol::endpoint&) { s.extend_deadline(); }

  // ---- coordinator
  void ask_log(const protocol::endpoint&, const protocol::log_request& req) {
    const bool cas = std::holds_alternative<protocol::compare_and_set_request>(req);
    const auto tl = Sender::clock::now();
    if (cas && s.first_publish_) s.stats_.phases.transfer_s = Sender::seconds(tl - *s.first_publish_);
    protocol::log_reply reply = s.log_.apply(req);
    if (cas) {
      s.stats_.phases.commit_s += Sender::seconds(Sender::clock::now() - tl);
      if (reply.outcome == protocol::log_outcome::ok) s.crash_.pass("coordinator_after_cas", "coordinator");  // before anyone is told
    }
    s.coord_later_.push(protocol::log_event{reply});
  }
  /// The coordinator itself ignores a fenced incarnation (coordinator::counts); this transport
  /// has nothing to drop early.
  void fence(const protocol::endpoint&, const protocol::member&) {}
  void cleanup(const protocol::endpoint&, const attempt_id& a) { s.transport_.discard(transport::attempt_stream(a)); }
  void committed(const protocol::endpoint&, const protocol::commit_record& k) { s.committed_ = k; }
  void deposed(const protocol::endpoint&) {
    throw error(errc::fenced, "this coordinator was fenced by a newer epoch", {.file = {}, .tensor = {}, .field = "epoch"});
  }
  void aborted(const protocol::endpoint&, const attempt_id& a) {
    // Reported once the step performed all of its actions (settle): the coordinator still re-arms
    // its idle timer so that the fenced members' restores and rejoins converge.
    if (const auto& lost = s.coord_.lost_owner)  // the takeover found an owner's frozen image lost or replaced
      s.abort_error_ = std::make_exception_ptr(error(
          errc::mismatch,
          "owner " + std::to_string(*lost) + " lost the frozen change set of v" + std::to_string(s.committed_.version + 1) + " (attempt " +
              a.to_string() + "; its baseline store no longer holds the bits the prepare record names): the transition ended by abort, nothing committed; refit again",
          {.file = {}, .tensor = {}, .field = "frozen"}));
    else
      s.abort_error_ = std::make_exception_ptr(error(errc::protocol, "transition aborted by the operator", {.file = {}, .tensor = {}, .field = {}}));
  }
  void needs_operator(const protocol::endpoint&, const std::string& why) {
    throw error(errc::protocol, "the coordinator needs an operator: " + why, {.file = {}, .tensor = {}, .field = {}});
  }

  // ---- owners
  void advance_baseline(const protocol::endpoint& self, const protocol::commit_record& k) {
    auto& o = *s.owners_.at(self.index);
    s.quiesce(o);  // chunks of a cancelled attempt may still be encoding from the baseline
    o.shard.advance();
    o.frozen_version = 0;
    const auto tr = Sender::clock::now();
    o.store.retain_only(k.version);  // may fold a delta chain into a full image
    s.stats_.phases.persist_s += Sender::seconds(Sender::clock::now() - tr);
  }
  void freeze_change_set(const protocol::endpoint& self, const protocol::freeze_change_set_action& act) {
    auto& o = *s.owners_.at(self.index);
    if (o.frozen_version != act.target) {  // e.g. a restarted trainer-side engine
      if (!s.next_) throw error(errc::protocol, "owner asked to freeze without the trainer's target bits");
      s.quiesce(o);
      o.shard.freeze(s.next_);
      // Only the bits the prepare names may be frozen for it (finding H1): the trainer's current
      // bits under an older prepare's identity would make every retry deliver other bits.
      if (act.identity != digest128{} && frozen_identity(o.shard) != act.identity) {
        o.shard.thaw();
        throw error(errc::protocol, "owner " + std::to_string(self.index) + " asked to freeze v" + std::to_string(act.target) +
                                        " with bits other than the trainer's current ones",
                    {.file = {}, .tensor = {}, .field = {}});
      }
      o.frozen_version = act.target;
    }
    if (o.persisted != act.target) {  // retries of the same target reuse the saved image
      const auto tp = Sender::clock::now();
      s.persist_frozen(o, act);  // durable BEFORE encoding
      o.persisted = act.target;
      s.stats_.phases.persist_s += Sender::seconds(Sender::clock::now() - tp);
    }
  }
  void encode(const protocol::endpoint& self, const protocol::encode_action& act) { s.start_encoding(self.index, act); }
  void cancel_encoding(const protocol::endpoint& self, const attempt_id& a) {
    auto& o = *s.owners_.at(self.index);
    if (o.encoding == a) o.generation++;
  }
};

}  // namespace bitrefit::refit
