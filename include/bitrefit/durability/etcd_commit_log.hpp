// bitrefit/durability/etcd_commit_log.hpp — the commit log on etcd v3, for trainers and rollout
// engines on different machines (DESIGN: "systems that run on more than one machine use an existing
// distributed store, never a home-made one").
//
// Key layout: the whole log lives at `<prefix>/commit`, one JSON value:
//   {"format": "bitrefit-etcd-commit/1", "epoch": e, "version": v, "generation": g,
//    "prepared": {...the prepare record, as wire/json.hpp spells it...}}
// (generation is the baseline id g of K = (v, g)). One key, so every request — claim_epoch too — is
// ONE etcd txn guarded by that key's mod_revision:
//   1. range <prefix>/commit (linearizable) -> the state S and its mod_revision R (0: no key yet,
//      the empty log);
//   2. run the pure protocol::commit_log::apply on S (durability/concepts.hpp: a durable log
//      behaves exactly like it) -> the reply, and S';
//   3. S' == S (a read, a fenced or conflicting request): answer the reply; nothing is written;
//   4. else txn "if mod_revision == R then put S'": applied -> answer the reply; not applied
//      (another writer got in between) -> back to 1 with the new state.
// So the epoch fence and the compare-and-set of K are decided on the very state the txn replaces,
// and a request from a fenced epoch changes nothing: the txn that claimed the newer epoch moved R.
//
// Outcomes (CommitLog law 2): a read that no member answers, and a txn that certainly did not reach
// a member, are `failed`; a txn that reached a member and got no answer before the deadline (etcd
// down or restarting, a partition, a dropped connection) is `unknown` — it may have been applied,
// and only a later read tells (read_commit resolves a compare-and-set, a claim is resolved the same
// way). A read is linearizable, so it never returns a record that is not yet durable. Past
// `options.timeout` of retries under contention, the outcome is `failed` (nothing was written).
//
// A read that resolves an unknown must be FINAL: the protocol reads "K is still the base" as "the
// compare-and-set never happened" and retries. But a txn whose client gave up can still be waiting
// inside etcd (a hung member, a slow proposal) and apply after that read. So after an unknown
// outcome this handle first runs a barrier: it rewrites the same value under the revision the
// unknown txn compared against. Revisions only grow, so once the key's mod_revision has moved past
// that revision the late txn can never apply; whatever the read after the barrier shows is final.
// (A new coordinator needs no barrier: its claim_epoch is a write that moves the revision.)
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/durability/etcd_kv.hpp"
#include "bitrefit/wire/json.hpp"

namespace bitrefit::durability {

struct etcd_commit_log_options {
  etcd_options etcd;
  /// Keys live under this prefix: the log is `<prefix>/commit`. Several deployments can share one
  /// etcd cluster with different prefixes.
  std::string prefix = "/bitrefit";
};

class etcd_commit_log {
 public:
  using options = etcd_commit_log_options;

  explicit etcd_commit_log(options o) : kv_(o.etcd), key_(o.prefix + "/commit"), s_(std::make_shared<state>()) {}

  /// Thread-safe; copies share the handle's state (an unresolved outcome is settled for all).
  protocol::log_reply apply(const protocol::log_request& req) {
    std::lock_guard lock(s_->mu);
    auto& unresolved_ = s_->unresolved;
    auto& last_failure_ = s_->last_failure;
    const protocol::log_reply failed{req, protocol::log_outcome::failed, {}};
    if (unresolved_ && !barrier()) return failed;
    const auto deadline = std::chrono::steady_clock::now() + kv_.options().timeout;
    for (;;) {
      const auto read = kv_.range(key_);
      if (!read.ok) {
        last_failure_ = read.why;
        return failed;
      }
      protocol::commit_log log;
      try {
        log.state = read.kv ? parse(read.kv->data) : protocol::log_snapshot{};
      } catch (const error& e) {
        last_failure_ = e.what();
        return failed;  // an unreadable log is a failed request, never a guess
      }
      const protocol::log_snapshot before = log.state;
      protocol::log_reply r = log.apply(req);
      if (log.state == before) return r;
      const std::int64_t revision = read.kv ? read.kv->mod_revision : 0;
      const auto t = kv_.put_if(key_, revision, to_json(log.state).dump());
      switch (t.result) {
        case etcd_kv::outcome::applied: return r;
        case etcd_kv::outcome::not_sent: last_failure_ = t.why; return failed;
        case etcd_kv::outcome::unknown:
          last_failure_ = t.why;
          unresolved_ = revision;
          return {req, protocol::log_outcome::unknown, {}};
        case etcd_kv::outcome::not_applied: break;  // another writer got in first: decide again on its state
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        last_failure_ = "contention: the record kept changing until the deadline";
        return failed;
      }
    }
  }

  /// Whether a txn of this handle ended unknown and no barrier has settled it yet.
  bool unresolved() const {
    std::lock_guard lock(s_->mu);
    return s_->unresolved.has_value();
  }

  /// The key holding the log.
  const std::string& key() const noexcept { return key_; }
  /// Why the last failed or unknown outcome happened (for logs and error messages).
  std::string last_failure() const {
    std::lock_guard lock(s_->mu);
    return s_->last_failure;
  }

  /// The JSON value stored at key().
  static nlohmann::json to_json(const protocol::log_snapshot& s) {
    nlohmann::json x{{"format", "bitrefit-etcd-commit/1"},
                     {"epoch", s.epoch},
                     {"version", s.record.version},
                     {"generation", s.record.baseline.value}};
    if (s.prepared) x["prepared"] = wire::to_json(*s.prepared);
    return x;
  }

  /// @throws errc::format / errc::unsupported naming the key when the value is not this log's.
  protocol::log_snapshot parse(const std::string& text) const {
    try {
      const auto x = nlohmann::json::parse(text);
      if (x.at("format") != "bitrefit-etcd-commit/1")
        throw error(errc::unsupported, "unknown commit log format", {.file = key_, .tensor = {}, .field = "format"});
      protocol::log_snapshot s;
      s.epoch = x.at("epoch").get<std::uint64_t>();
      s.record = {x.at("version").get<std::uint64_t>(), baseline_id{x.at("generation").get<std::uint64_t>()}};
      if (x.contains("prepared")) s.prepared = wire::prepare_from(x.at("prepared"));
      return s;
    } catch (const nlohmann::json::exception& e) {
      throw error(errc::format, std::string("commit log does not parse: ") + e.what(), {.file = key_, .tensor = {}, .field = {}});
    }
  }

 private:
  /// Moves the key's mod_revision past *unresolved_ (see the header comment); false when etcd did
  /// not answer (the caller's request then fails and is asked again).
  bool barrier() {
    auto& unresolved_ = s_->unresolved;
    auto& last_failure_ = s_->last_failure;
    const auto read = kv_.range(key_);
    if (!read.ok) {
      last_failure_ = read.why;
      return false;
    }
    const std::int64_t now = read.kv ? read.kv->mod_revision : 0;
    if (now == *unresolved_) {  // nothing moved it yet: rewrite the same state (an absent key: the empty log)
      const auto t = kv_.put_if(key_, now, read.kv ? read.kv->data : to_json(protocol::log_snapshot{}).dump());
      if (t.result == etcd_kv::outcome::not_sent || t.result == etcd_kv::outcome::unknown) {
        last_failure_ = t.why;
        return false;  // (an unknown barrier is harmless: it writes what is there)
      }
    }
    unresolved_.reset();
    return true;
  }

  struct state {
    std::mutex mu;
    std::string last_failure;
    std::optional<std::int64_t> unresolved;  // the revision an unknown txn compared against
  };

  etcd_kv kv_;
  std::string key_;
  std::shared_ptr<state> s_;
};

static_assert(CommitLog<etcd_commit_log>);

}  // namespace bitrefit::durability
