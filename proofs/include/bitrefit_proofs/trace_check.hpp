// bitrefit_proofs/trace_check.hpp — real runs validated against the model (bitrefit-check-trace).
//
// The engine records, per machine lifetime, every event it stepped and every action that came out
// (wire/trace.hpp). This file checks such a trace directory in two stages, as etcd-raft validates
// traces of real runs against its TLA+ model:
//
//  1. Replay. Each file is replayed through the PURE machine (protocol::coordinator / owner /
//     receiver, constructed from the file's init line): every recorded event is stepped and the
//     actions the machine emits must equal the recorded ones, in order. The first divergence ends
//     that file's replay and is reported (file, line, event, expected vs recorded actions). An
//     action altered, removed, added or reordered is a divergence.
//  2. Cross-role invariants on the merged trace (DESIGN "Invariants"):
//     - no fabricated messages: every message a machine received was sent by some machine. A
//       payload may also come from an encode job the owner machine started (encode_action of that
//       attempt, same base and target, XOR only in an XOR job) but never reported: the data plane
//       publishes a frame BEFORE its chunk_encoded_event is stepped (driver.hpp law L2), so an owner
//       that dies in between leaves frames no step sent. Their bytes are what the owner would have
//       sent (a chunk's encoding is deterministic), and the attempt can no longer commit without it;
//       the model performs an encode atomically, so only real runs show this;
//     - a commit (compare-and-set answered ok) only after the coordinator received every member's
//       ack of that attempt, each with the expected attestation (when one is expected);
//     - no XOR applied on a base other than the receiver's K.v, nor twice in one lifetime, and
//       every K a receiver holds or restores to is a K the log actually held;
//     - K increases by one per commit, and each version is committed by exactly one record, each
//       from the record before it;
//     - fenced epochs change nothing: every successful prepare / compare-and-set was answered by the
//       log in the request's own epoch, a deposed coordinator acts no more, and no prepare after
//       fence(m) names m;
//     - a dense restore of K was served only while every owner's replayed baseline was K.
// Nothing here trusts the engine: only the pure machines and the recorded lines.
#pragma once

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/protocol.hpp"
#include "bitrefit/wire/json.hpp"
#include "bitrefit/wire/trace.hpp"

namespace bitrefit::proofs::traces {

struct finding {
  std::string file;
  std::size_t line = 0;
  std::string what;
};

struct report {
  std::size_t files = 0, steps = 0, commits = 0, applies = 0, restores = 0, torn_tails = 0;
  std::vector<finding> problems;
  bool ok() const noexcept { return problems.empty() && files > 0; }
  std::string text() const {
    std::string s = std::to_string(files) + " files, " + std::to_string(steps) + " steps replayed, " +
                    std::to_string(commits) + " commits, " + std::to_string(applies) + " applies, " +
                    std::to_string(restores) + " restores served" +
                    (torn_tails ? ", " + std::to_string(torn_tails) + " torn last lines ignored" : std::string());
    if (files == 0) s += "\nno trace files";
    for (const auto& p : problems) s += "\n" + p.file + ":" + std::to_string(p.line) + ": " + p.what;
    return s;
  }
};

namespace detail {

using wire::json;

template <class V>
std::string list_str(const std::vector<V>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "; " : "") + protocol::fmt::str(v[i]);
  return s + "]";
}

inline std::string key_of(const protocol::envelope& e) { return wire::to_json(e).dump(); }

/// Where a fact was recorded.
struct at {
  const wire::trace_file* file = nullptr;
  const wire::trace_line* line = nullptr;
};

struct coordinator_facts {
  std::string file;
  std::uint64_t epoch = 0;
  protocol::protocol_config config;
  std::map<attempt_id, protocol::prepare_record> prepared;            // persisted by this coordinator
  std::map<attempt_id, std::vector<protocol::ack_msg>> acks_received;  // before each line, in order
};

class checker {
 public:
  report run(const std::vector<wire::trace_file>& files) {
    r_.files = files.size();
    for (const auto& f : files) {
      if (f.torn_tail) ++r_.torn_tails;
      if (f.lines.empty()) continue;
      const auto& first = f.lines.front().body;
      const std::string role = first.contains("init") ? first.at("init").at("role").get<std::string>() : "";
      try {
        if (role == "coordinator") replay_coordinator(f);
        else if (role == "owner") replay_owner(f);
        else if (role == "receiver") replay_receiver(f);
        else problem(f, f.lines.front(), "the first line is not an init line of a coordinator, owner or receiver");
      } catch (const std::exception& e) {
        problem(f, f.lines.front(), std::string("unreadable: ") + e.what());
      }
    }
    cross_checks();
    return r_;
  }

 private:
  // ---- recording what the replay saw
  void problem(const wire::trace_file& f, const wire::trace_line& l, std::string what) {
    r_.problems.push_back({f.path.filename().string(), l.number, std::move(what)});
  }
  void note_send(const protocol::envelope& e, at where) { sent_.emplace(key_of(e), where); }
  void note_received(const protocol::envelope& e, at where) { received_.push_back({e, where}); }

  template <class Machine, class Event, class Action>
  bool step(Machine& m, const wire::trace_file& f, const wire::trace_line& l, Event& ev, std::vector<Action>& recorded) {
    ev = wire::value_from_json<Event>(l.body.at("event"));
    recorded = wire::value_from_json<std::vector<Action>>(l.body.at("actions"));
    const auto got = m.step(ev);
    ++r_.steps;
    if (got == recorded) return true;
    problem(f, l, "divergence at event '" + protocol::fmt::str(ev) + "': the machine emits " + list_str(got) +
                      " but the trace recorded " + list_str(recorded));
    return false;
  }

  // ---- coordinator
  void replay_coordinator(const wire::trace_file& f) {
    std::optional<protocol::coordinator> c;
    coordinator_facts facts;
    facts.file = f.path.filename().string();
    std::set<protocol::member> fenced;
    bool deposed = false;
    for (const auto& l : f.lines) {
      const json& b = l.body;
      if (b.contains("init")) {
        const json& i = b.at("init");
        facts.config = wire::value_from_json<protocol::protocol_config>(i.at("config"));
        facts.epoch = i.at("epoch").get<std::uint64_t>();
        const auto roster = wire::value_from_json<std::vector<protocol::member>>(i.at("roster"));
        const auto k = wire::value_from_json<protocol::commit_record>(i.at("committed"));
        c.emplace(facts.config, facts.epoch, roster, k);
        k_history_.insert(k);
        deposed = false;
        continue;
      }
      if (b.contains("restore_served")) {
        restore_served_.push_back({facts.epoch, wire::value_from_json<protocol::commit_record>(b.at("restore_served")), l.seq, {&f, &l}});
        ++r_.restores;
        continue;
      }
      if (!c) {
        problem(f, l, "a step before the init line");
        return;
      }
      protocol::coordinator_event ev;
      std::vector<protocol::coordinator_action> acts;
      if (!step(*c, f, l, ev, acts)) return;
      if (deposed && !acts.empty()) problem(f, l, "a deposed coordinator acted: " + list_str(acts));
      if (const auto* m = std::get_if<protocol::message_event>(&ev)) {
        note_received(m->env, {&f, &l});
        if (const auto* a = std::get_if<protocol::ack_msg>(&m->env.msg)) facts.acks_received[a->attempt].push_back(*a);
      }
      if (const auto* le = std::get_if<protocol::log_event>(&ev)) on_log_reply(f, l, facts, le->reply);
      for (const auto& a : acts) {
        if (const auto* s = std::get_if<protocol::send_action>(&a)) note_send(s->env, {&f, &l});
        if (const auto* fr = std::get_if<protocol::fence_receiver_action>(&a)) fenced.insert(fr->fenced);
        if (std::holds_alternative<protocol::deposed_action>(a)) deposed = true;
        if (const auto* la = std::get_if<protocol::log_action>(&a))
          if (const auto* pp = std::get_if<protocol::persist_prepare_request>(&la->request)) {
            facts.prepared[pp->record.attempt] = pp->record;
            for (const auto& m : pp->record.members)
              if (fenced.count(m)) problem(f, l, "prepare " + protocol::fmt::str(pp->record.attempt) + " names fenced " + protocol::fmt::str(m));
          }
      }
    }
  }

  void on_log_reply(const wire::trace_file& f, const wire::trace_line& l, coordinator_facts& facts, const protocol::log_reply& rep) {
    using protocol::log_outcome;
    if (rep.outcome == log_outcome::ok || rep.outcome == log_outcome::conflict || rep.outcome == log_outcome::fenced)
      k_history_.insert(rep.snapshot.record);
    if (rep.outcome != log_outcome::ok) return;
    std::visit(
        [&](const auto& q) {
          using Q = std::decay_t<decltype(q)>;
          if constexpr (std::is_same_v<Q, protocol::persist_prepare_request> || std::is_same_v<Q, protocol::compare_and_set_request>) {
            if (rep.snapshot.epoch != q.epoch)
              problem(f, l, "the log accepted a request of epoch e" + std::to_string(q.epoch) + " while at epoch e" +
                                std::to_string(rep.snapshot.epoch) + " (a fenced epoch changed something)");
          }
          if constexpr (std::is_same_v<Q, protocol::compare_and_set_request>) {
            ++r_.commits;
            commits_.push_back({q.expected, q.desired, {&f, &l}});
            const auto p = facts.prepared.find(q.attempt);
            if (p == facts.prepared.end()) {
              problem(f, l, "commit of " + protocol::fmt::str(q.attempt) + " that this coordinator never prepared");
              return;
            }
            const auto& acks = facts.acks_received[q.attempt];
            for (const auto& m : p->second.members) {
              const bool expected = facts.config.attest && m.receiver < p->second.expected.size();
              const bool acked = std::any_of(acks.begin(), acks.end(), [&](const protocol::ack_msg& a) {
                return a.from == m && (!expected || (a.attestation && *a.attestation == p->second.expected[m.receiver]));
              });
              if (!acked)
                problem(f, l, "commit of " + protocol::fmt::str(q.attempt) + " without the ack of member " + protocol::fmt::str(m) +
                                  (expected ? " with the expected attestation " + protocol::fmt::str(p->second.expected[m.receiver]) : ""));
            }
          }
        },
        rep.request);
  }

  // ---- owner
  void replay_owner(const wire::trace_file& f) {
    std::optional<protocol::owner> o;
    std::uint64_t epoch = 0;
    auto& history = owner_baselines_[f.path.filename().string()];
    for (const auto& l : f.lines) {
      const json& b = l.body;
      if (b.contains("init")) {
        const json& i = b.at("init");
        epoch = i.at("epoch").get<std::uint64_t>();
        // a (re)started sender's owner: owner::restarted from what its baseline store and the log
        // held (refit/takeover.hpp); older traces carry only the baseline
        std::optional<protocol::owner::durable_frozen> frozen;
        if (i.contains("frozen")) {
          const json& z = i.at("frozen");
          frozen = protocol::owner::durable_frozen{z.at("target").get<version_t>(), wire::value_from_json<digest128>(z.at("identity")),
                                                   wire::value_from_json<attempt_id>(z.at("frozen_at"))};
        }
        const attempt_id newest = i.contains("newest_prepared") ? wire::value_from_json<attempt_id>(i.at("newest_prepared")) : attempt_id{};
        o.emplace(protocol::owner::restarted(i.at("id").get<std::uint32_t>(), wire::value_from_json<protocol::commit_record>(i.at("baseline")),
                                             frozen, newest, epoch));
        owners_of_epoch_[epoch].insert(f.path.filename().string());
        history.push_back({l.seq, o->baseline});
        continue;
      }
      if (!o) {
        problem(f, l, "a step before the init line");
        return;
      }
      if (b.contains("recovered")) {
        o = protocol::owner::recovered(*o);
        continue;
      }
      protocol::owner_event ev;
      std::vector<protocol::owner_action> acts;
      if (!step(*o, f, l, ev, acts)) return;
      if (const auto* m = std::get_if<protocol::message_event>(&ev)) note_received(m->env, {&f, &l});
      for (const auto& a : acts) {
        if (const auto* s = std::get_if<protocol::send_action>(&a)) note_send(s->env, {&f, &l});
        if (const auto* e = std::get_if<protocol::encode_action>(&a)) encode_jobs_.insert({{o->id, e->attempt}, *e});
      }
      history.push_back({l.seq, o->baseline});
    }
  }

  // ---- receiver
  void replay_receiver(const wire::trace_file& f) {
    std::optional<protocol::receiver> r;
    std::set<payload_id> xor_applied;
    for (const auto& l : f.lines) {
      const json& b = l.body;
      if (b.contains("init")) {
        const json& i = b.at("init");
        r = protocol::receiver::restarted(i.at("id").get<std::uint32_t>(), i.at("incarnation").get<std::uint64_t>(),
                                          wire::value_from_json<protocol::protocol_config>(i.at("config")));
        xor_applied.clear();
        continue;
      }
      if (!r) {
        problem(f, l, "a step before the init line");
        return;
      }
      protocol::receiver_event ev;
      std::vector<protocol::receiver_action> acts;
      if (!step(*r, f, l, ev, acts)) return;
      if (const auto* m = std::get_if<protocol::message_event>(&ev)) note_received(m->env, {&f, &l});
      if (const auto* x = std::get_if<protocol::restored_event>(&ev)) held_.push_back({x->record, {&f, &l}});
      for (const auto& a : acts) {
        if (const auto* s = std::get_if<protocol::send_action>(&a)) note_send(s->env, {&f, &l});
        if (const auto* ap = std::get_if<protocol::apply_payload_action>(&a)) {
          ++r_.applies;
          if (ap->mode != protocol::mode::xor_mask) continue;
          if (!xor_applied.insert(ap->id).second) problem(f, l, "XOR payload " + protocol::fmt::str(ap->id) + " applied twice");
          if (r->committed.version != ap->base)
            problem(f, l, "XOR payload " + protocol::fmt::str(ap->id) + " (base v" + std::to_string(ap->base) +
                              ") applied on a receiver holding " + protocol::fmt::str(r->committed));
          held_.push_back({r->committed, {&f, &l}});
        }
      }
    }
  }

  // ---- across roles
  void cross_checks() {
    for (const auto& [env, where] : received_)
      if (!sent_.count(key_of(env)) && !published_by_an_encode_job(env))
        problem(*where.file, *where.line, "received '" + protocol::fmt::str(env) + "', which no traced machine sent");
    for (const auto& [k, where] : held_)
      if (!k_history_.count(k))
        problem(*where.file, *where.line, "holds " + protocol::fmt::str(k) + ", a commit record the log never held");
    // K: one step per commit, one record per version, each from the one before.
    std::map<version_t, protocol::commit_record> by_version;
    for (const auto& c : commits_) {
      if (c.desired.version != c.expected.version + 1)
        problem(*c.where.file, *c.where.line, "K went from " + protocol::fmt::str(c.expected) + " to " + protocol::fmt::str(c.desired));
      auto [it, fresh] = by_version.emplace(c.desired.version, c.desired);
      if (!fresh && it->second != c.desired)
        problem(*c.where.file, *c.where.line, "version v" + std::to_string(c.desired.version) + " committed twice: " +
                                                  protocol::fmt::str(it->second) + " and " + protocol::fmt::str(c.desired));
    }
    for (const auto& c : commits_) {
      auto prev = by_version.find(c.expected.version);
      if (prev != by_version.end() && prev->second != c.expected)
        problem(*c.where.file, *c.where.line, "commit from " + protocol::fmt::str(c.expected) + " but v" +
                                                  std::to_string(c.expected.version) + " was committed as " + protocol::fmt::str(prev->second));
    }
    // Dense restores: every owner of that sender at K when it was served.
    for (const auto& s : restore_served_) {
      for (const auto& name : owners_of_epoch_[s.epoch]) {
        const auto& h = owner_baselines_[name];
        std::optional<protocol::commit_record> b;
        for (const auto& [seq, k] : h)
          if (seq < s.seq) b = k;
        if (!b || *b != s.record)
          problem(*s.where.file, *s.where.line, "dense restore of " + protocol::fmt::str(s.record) + " served while " + name +
                                                    "'s baseline was " + (b ? protocol::fmt::str(*b) : std::string("unknown")));
      }
      if (owners_of_epoch_[s.epoch].empty())
        problem(*s.where.file, *s.where.line, "dense restore served, but no owner of epoch e" + std::to_string(s.epoch) + " is traced");
    }
  }

  /// A payload an owner's encode job may have published before the owner reported it (see top).
  bool published_by_an_encode_job(const protocol::envelope& env) const {
    const auto* p = std::get_if<protocol::payload_msg>(&env.msg);
    if (!p || env.from != protocol::endpoint::owner_(p->id.owner)) return false;
    for (auto [it, end] = encode_jobs_.equal_range({p->id.owner, p->id.attempt}); it != end; ++it) {
      const protocol::encode_action& e = it->second;
      if (e.base == p->base && e.target == p->target && (p->mode == protocol::mode::overwrite || e.mode == protocol::mode::xor_mask))
        return true;
    }
    return false;
  }

  struct commit_fact {
    protocol::commit_record expected, desired;
    at where;
  };
  struct restore_fact {
    std::uint64_t epoch = 0;
    protocol::commit_record record;
    std::uint64_t seq = 0;
    at where;
  };

  report r_;
  std::multimap<std::string, at> sent_;
  std::multimap<std::pair<std::uint32_t, attempt_id>, protocol::encode_action> encode_jobs_;
  std::vector<std::pair<protocol::envelope, at>> received_;
  std::set<protocol::commit_record> k_history_;
  std::vector<std::pair<protocol::commit_record, at>> held_;
  std::vector<commit_fact> commits_;
  std::vector<restore_fact> restore_served_;
  std::map<std::uint64_t, std::set<std::string>> owners_of_epoch_;
  std::map<std::string, std::vector<std::pair<std::uint64_t, protocol::commit_record>>> owner_baselines_;
};

}  // namespace detail

/// Checks already-read trace files (tests alter them in memory).
inline report check(const std::vector<wire::trace_file>& files) { return detail::checker{}.run(files); }

/// Checks every *.jsonl file of a trace directory.
inline report check_dir(const std::filesystem::path& dir) { return check(wire::read_trace_dir(dir)); }

}  // namespace bitrefit::proofs::traces
