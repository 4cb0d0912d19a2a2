// bitrefit/protocol/format.hpp — one-line text for messages, events, actions and states.
//
// This is the vocabulary of the scenario files (tests/protocol/scenarios/*.txt) and of the
// counterexample traces the model checker prints, so it is stable: change it only together with
// the scenario files (rewrite them with BITREFIT_REWRITE=1 and review the diff).
//
//   nodes      c (coordinator), o<i> (owner i), r<i> (receiver i)
//   attempt    <epoch>.<counter>               payload id  <epoch>.<counter>/<owner>/<seq>
//   K          (v<version>,g<baseline>)        baseline id of attempt e.c prints as g<e>.<c>
//   member     r<i>#<incarnation>              digest      d<low64 hex>.<high64 hex>
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "bitrefit/protocol/commit_log.hpp"
#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/messages.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/protocol/receiver.hpp"

namespace bitrefit::protocol::fmt {

inline std::string num(std::uint64_t x) { return std::to_string(x); }
inline std::string hex(std::uint64_t x) {
  static constexpr char d[] = "0123456789abcdef";
  if (x == 0) return "0";
  std::string s;
  while (x) { s.insert(s.begin(), d[x & 15]); x >>= 4; }
  return s;
}
inline std::string str(const attempt_id& a) { return num(a.epoch) + "." + num(a.counter); }
inline std::string str(const baseline_id& g) {
  if (g.value >> 32) return "g" + num(g.value >> 32) + "." + num(g.value & 0xffffffffu);
  return "g" + num(g.value);
}
inline std::string str(const commit_record& k) { return "(v" + num(k.version) + "," + str(k.baseline) + ")"; }
inline std::string str(const payload_id& p) { return str(p.attempt) + "/" + num(p.owner) + "/" + num(p.seq); }
inline std::string str(const member& m) { return "r" + num(m.receiver) + "#" + num(m.incarnation); }
inline std::string str(const digest128& d) { return "d" + hex(d.low64) + "." + hex(d.high64); }
inline std::string str(const endpoint& e) {
  switch (e.role) {
    case role::coordinator: return "c";
    case role::owner: return "o" + num(e.index);
    case role::receiver: return "r" + num(e.index);
  }
  return "?";
}
template <class T>
std::string list(const std::vector<T>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ",";
    if constexpr (std::is_integral_v<T>) s += num(v[i]);
    else s += str(v[i]);
  }
  return s + "]";
}
inline std::string str(const prepare_record& p) {
  std::string s = str(p.attempt) + " base=" + str(p.base) + " target=v" + num(p.target) + " next=" + str(p.next) + " " +
                  std::string(to_string(p.mode)) + " members=" + list(p.members);
  if (!p.expected.empty()) s += " expected=" + list(p.expected);
  if (!p.frozen.empty()) s += " frozen=" + list(p.frozen);
  if (p.retry) s += " retry";
  if (p.aborted) s += " aborted";
  return s;
}

// ----- messages
inline std::string str(const prepare_msg& m) { return "prepare " + str(m.record); }
inline std::string str(const obsolete_msg& m) { return "obsolete " + str(m.attempt); }
inline std::string str(const open_msg& m) { return "open " + str(m.attempt) + " chunks=" + list(m.chunks); }
inline std::string str(const flush_msg& m) { return "flush " + str(m.attempt); }
inline std::string str(const announce_msg& m) {
  return "announce " + str(m.record) + (m.roster ? " to=" + str(*m.roster) : std::string()) + (m.evicted ? " evicted" : "") +
         (m.confirm ? " confirm" : "") + " e" + num(m.epoch);
}
inline std::string str(const roll_call_msg& m) { return "roll_call e" + num(m.epoch); }
inline std::string str(const abort_msg& m) { return "abort " + str(m.attempt) + " e" + num(m.epoch); }
inline std::string str(const payload_msg& m) {
  return "payload " + str(m.id) + " " + std::string(to_string(m.mode)) + " v" + num(m.base) + "->v" + num(m.target) +
         " " + str(m.content);
}
inline std::string str(const manifest_msg& m) {
  return "manifest " + str(m.attempt) + " o" + num(m.owner) + " chunks=" + num(m.chunks);
}
inline std::string str(const arrived_msg& m) { return "arrived " + str(m.attempt) + " " + str(m.from); }
inline std::string str(const ack_msg& m) {
  return "ack " + str(m.attempt) + " " + str(m.from) + (m.attestation ? " att=" + str(*m.attestation) : "");
}
inline std::string str(const stopped_msg& m) { return "stopped " + str(m.attempt) + " " + str(m.from); }
inline std::string str(const failed_msg& m) {
  return "failed " + str(m.attempt) + " " + str(m.from) + " " + std::string(to_string(m.reason));
}
inline std::string str(const baseline_msg& m) { return "baseline o" + num(m.owner) + " at=" + str(m.at); }
inline std::string str(const join_msg& m) { return "join " + str(m.from) + " at=" + str(m.at) + " e" + num(m.epoch); }
inline std::string str(const frozen_lost_msg& m) {
  return "frozen_lost " + str(m.attempt) + " o" + num(m.owner) + " v" + num(m.target);
}
inline std::string str(const message& m) {
  return std::visit([](const auto& x) { return str(x); }, m);
}
inline std::string str(const envelope& e) { return str(e.from) + "->" + str(e.to) + " " + str(e.msg); }

// ----- commit log
inline std::string str(const log_request& q) {
  return std::visit(
      [](const auto& x) -> std::string {
        using Q = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<Q, claim_epoch_request>) return "claim_epoch e" + num(x.epoch);
        else if constexpr (std::is_same_v<Q, persist_prepare_request>)
          return "persist_prepare e" + num(x.epoch) + " " + str(x.record.attempt) + (x.record.aborted ? " aborted" : "");
        else if constexpr (std::is_same_v<Q, compare_and_set_request>)
          return "compare_and_set e" + num(x.epoch) + " " + str(x.attempt) + " " + str(x.expected) + "->" +
                 str(x.desired);
        else return "read";
      },
      q);
}
inline std::string str(const log_snapshot& s) {
  return "e" + num(s.epoch) + " K=" + str(s.record) +
         (s.prepared ? " prepared=" + str(s.prepared->attempt) + (s.prepared->aborted ? " aborted" : "") : "");
}
inline std::string str(const log_reply& r) {
  std::string s = str(r.request) + " -> " + std::string(to_string(r.outcome));
  if (r.outcome != log_outcome::failed && r.outcome != log_outcome::unknown) s += " " + str(r.snapshot);
  return s;
}

// ----- actions
inline std::string str(const send_action& a) { return "send " + str(a.env); }
inline std::string str(const arm_deadline_action&) { return "arm_deadline"; }
inline std::string str(const disarm_deadline_action&) { return "disarm_deadline"; }
inline std::string str(const log_action& a) { return "log " + str(a.request); }
inline std::string str(const fence_receiver_action& a) { return "fence " + str(a.fenced); }
inline std::string str(const cleanup_action& a) { return "cleanup " + str(a.attempt); }
inline std::string str(const committed_action& a) { return "committed " + str(a.record); }
inline std::string str(const deposed_action&) { return "deposed"; }
inline std::string str(const aborted_action& a) { return "aborted " + str(a.attempt) + ": " + a.why; }
inline std::string str(const needs_operator_action& a) { return "needs_operator: " + a.why; }
inline std::string str(const advance_baseline_action& a) { return "advance_baseline " + str(a.record); }
inline std::string str(const freeze_change_set_action& a) {
  if (a.identity != digest128{}) return "freeze_change_set v" + num(a.base) + "->v" + num(a.target) + " " + str(a.identity);
  return "freeze_change_set v" + num(a.base) + "->v" + num(a.target);
}
inline std::string str(const encode_action& a) {
  return "encode " + str(a.attempt) + " " + std::string(to_string(a.mode)) + " v" + num(a.base) + "->v" + num(a.target);
}
inline std::string str(const cancel_encoding_action& a) { return "cancel_encoding " + str(a.attempt); }
inline std::string str(const persist_incarnation_action& a) { return "persist_incarnation " + num(a.incarnation); }
inline std::string str(const close_gate_action&) { return "close_gate"; }
inline std::string str(const drain_requests_action&) { return "drain_requests"; }
inline std::string str(const stage_payload_action& a) { return "stage " + str(a.id); }
inline std::string str(const apply_payload_action& a) {
  return "apply " + str(a.id) + " " + std::string(to_string(a.mode));
}
inline std::string str(const discard_staged_action& a) { return "discard_staged " + str(a.attempt); }
inline std::string str(const sync_device_action& a) { return a.attest ? "sync_device attest" : "sync_device"; }
inline std::string str(const open_gate_action&) { return "open_gate invalidate_kv"; }
inline std::string str(const read_commit_action&) { return "read_commit"; }
inline std::string str(const dense_restore_action& a) { return "dense_restore " + str(a.record); }


// ----- events
inline std::string str(const start_event&) { return "start"; }
inline std::string str(const begin_transition_event& e) {
  return "begin_transition v" + num(e.target) + (e.xor_allowed ? " xor_allowed" : " overwrite_only");
}
inline std::string str(const message_event& e) { return "recv " + str(e.env); }
inline std::string str(const log_event& e) { return "log_reply " + str(e.reply); }
inline std::string str(const deadline_event&) { return "deadline"; }
inline std::string str(const operator_abort_event&) { return "operator_abort"; }
inline std::string str(const chunk_encoded_event& e) {
  return "chunk_encoded " + str(e.attempt) + "/" + num(e.seq) + " " + std::string(to_string(e.mode)) + " " + str(e.content);
}
inline std::string str(const encode_finished_event& e) {
  return "encode_finished " + str(e.attempt) + " chunks=" + num(e.chunks);
}
inline std::string str(const boot_event&) { return "boot"; }
inline std::string str(const drained_event&) { return "drained"; }
inline std::string str(const device_synced_event& e) {
  return "device_synced" + (e.attestation ? " att=" + str(*e.attestation) : std::string());
}
inline std::string str(const commit_read_event& e) { return "commit_read " + str(e.record) + " e" + num(e.epoch); }
inline std::string str(const restored_event& e) { return "restored " + str(e.record); }

// Any closed event/action set (after every alternative's overload is declared).
template <class... T>
std::string str(const std::variant<T...>& v) {
  return std::visit([](const auto& x) { return str(x); }, v);
}

// ----- states (one line each)
template <class M>
std::string str(const basic_coordinator<M>& c) {
  std::string s = "c e" + num(c.epoch) + " " + std::string(to_string(c.phase)) + " K=" + str(c.committed);
  if (c.attempt) s += " attempt=" + str(c.attempt->attempt) + " " + std::string(to_string(c.attempt->mode));
  s += " roster=[";
  for (std::size_t r = 0; r < c.roster.size(); ++r) {
    if (r) s += ",";
    const auto& e = c.roster[r];
    if (!e.known) s += "?";
    else s += "r" + num(r) + "#" + num(e.incarnation) + (e.evicted ? "!" : "") + "@v" + num(e.at.version);
  }
  return s + "]";
}
template <class M>
std::string str(const basic_owner<M>& o) {
  std::string s = "o" + num(o.id) + " B=" + str(o.baseline);
  if (o.frozen_target) s += " frozen=v" + num(*o.frozen_target);
  if (o.active) s += " active=" + str(o.active->attempt);
  return s;
}
template <class M>
std::string str(const basic_receiver<M>& r) {
  std::string s = "r" + num(r.id) + "#" + num(r.incarnation) + " " + std::string(to_string(r.phase)) + " K=" +
                  str(r.committed) + (r.gate_open ? " gate=open" : " gate=closed");
  if (r.attempt) {
    s += " attempt=" + str(r.attempt->attempt) + " " + std::string(to_string(r.attempt->mode)) + " held=[";
    bool first = true;
    for (const auto& c : r.attempt->chunks) {
      if (!first) s += ",";
      first = false;
      s += num(c.owner) + "/" + num(c.seq) + (c.applied ? "*" : "");
    }
    s += "]";
    if (r.attempt->acked) s += " acked";
  }
  if (r.completed) s += " completed=" + str(*r.completed);
  if (r.early) s += " early=" + str(r.early->attempt) + "(" + num(r.early->payloads.size()) + " payloads" +
                    (r.early->open ? ", open" : "") + (r.early->flush ? ", flush" : "") + ")";
  return s;
}

}  // namespace bitrefit::protocol::fmt
