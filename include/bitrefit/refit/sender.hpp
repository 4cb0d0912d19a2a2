// bitrefit/refit/sender.hpp — the trainer side of a refit: the coordinator and the owners.
//
// Composes the pure state machines (protocol::coordinator, protocol::owner) with policies:
//   Projection  (refit/concepts.hpp)       the trainer's state of a version -> its changes against
//                                          an owner's B^v (identity_projection by default;
//                                          sharded_projection<P>: layout's direct path over the
//                                          layout::Projection shards, no canonical copy)
//   Transport   (transport/concepts.hpp)   payload frames + control messages to receivers
//   CommitLog   (durability/concepts.hpp)  the durable K, compare-and-set, epoch fencing
//   BaselineStore (durability/concepts.hpp) each owner's B^v, consistent with the log across crashes
//   Backend     (codec/concepts.hpp)       where change detection and encoding touch memory
//   Crash       (core/crash_points.hpp)    test policy: where a component may "die" (default: nowhere)
// Receivers' placements (refit/placement.hpp, sender_options::placements) decide per tensor XOR
// vs overwrite and each receiver's expected attestation (over its held ranges).
//
// One responsibility per header: this one is the API and the loop; what the machines' actions do
// is refit/sender_effects.hpp (performed only through protocol::drive); chunk encoding is
// refit/encode_pipeline.hpp; dense restores for restarted receivers are refit/restore_server.hpp.
// The loop, one thread:
//   1. step each owner with its encoded chunks (chunk_encoded_event in seq order, then
//      encode_finished_event);
//   2. deliver messages between the coordinator and the owners (they share this process, so the
//      "network" between them is a local queue) and step the addressee;
//   3. receive the coordinator's mailbox (and the engine's side messages) from the transport and
//      step the coordinator; what does not decode is counted, logged and dropped;
//   4. serve dense restores of restarted receivers from the owners' committed baselines;
//   5. step deadline_event when the armed deadline passed.
// Every step goes through protocol::drive, and every completion an effect reports synchronously
// (a commit-log reply, an empty encoding) is stepped after the step that caused it (settle()).
#pragma once

#include <chrono>
#include <thread>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <utility>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/io/json.hpp"
#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/driver.hpp"
#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/refit/concepts.hpp"
#include "bitrefit/refit/encode_pipeline.hpp"
#include "bitrefit/refit/owner_shard.hpp"
#include "bitrefit/refit/placement.hpp"
#include "bitrefit/refit/projection.hpp"
#include "bitrefit/refit/restore_server.hpp"
#include "bitrefit/refit/sender_effects.hpp"
#include "bitrefit/refit/stats.hpp"
#include "bitrefit/refit/takeover.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/wire/control.hpp"
#include "bitrefit/wire/engine.hpp"
#include "bitrefit/wire/trace.hpp"

namespace bitrefit::refit {

struct sender_options {
  protocol::gate_policy gate = protocol::gate_policy::synchronous;
  std::uint32_t owners = 1;
  std::uint32_t receivers = 1;
  unsigned threads = 2;
  std::uint64_t max_frame_input_bytes = 8ull << 20;
  int zstd_level = codec::default_zstd_level;
  bool attest = true;
  /// What each receiver slot's Loader declares (refit::declare(loader)), indexed by receiver:
  /// per-tensor XOR vs overwrite and each receiver's expected attestation follow from it. Empty:
  /// every receiver holds every tensor bit-preservingly.
  std::vector<placement> placements;
  /// XOR deltas in first attempts, per tensor where every holder places it bit-preservingly
  /// (DESIGN's default). false: every attempt is prepared in overwrite mode and sends each changed
  /// element's absolute value, whatever the placements — the overwrite-only baseline that
  /// bench/refit measures against, without making receivers declare a converting placement.
  bool xor_deltas = true;
  std::chrono::milliseconds deadline{5000};
  std::chrono::milliseconds poll{2};
  std::chrono::milliseconds transition_timeout{10 * 60 * 1000};
  std::uint32_t max_attempts = 0;  // 0: retry until commit (DESIGN); else needs_operator after that many
  std::function<void()> idle;  // called once per loop iteration (the demo reaps and restarts processes)
  /// Record every step of the coordinator and the owners (wire/trace.hpp) in this directory;
  /// empty: $BITREFIT_TRACE_DIR if set, else off.
  std::string trace_dir;
  /// Called for every control input the trainer side drops, with the error that names why: a
  /// message that does not decode (wire/: errc::format naming the field), one the coordinator
  /// ignores (errc::protocol, the message spelled out: a stale attempt or epoch, an unknown
  /// member, a fenced or old incarnation, a repeat), a placement, stats or restore request that
  /// does not decode or names no receiver of this configuration. The input is dropped; the engine
  /// keeps running. Must not throw.
  std::function<void(const error&)> on_refused;
};

/// Counters the sender keeps (tests and the demo read them).
struct sender_counters {
  std::uint64_t undecodable = 0;  // messages that did not decode: counted, logged by mailbox, dropped
  std::uint64_t restores_served = 0;
};

template <transport::Transport T, durability::CommitLog L, durability::BaselineStore B,
          TrainerProjection P = identity_projection, codec::execution_backend Backend = codec::host_backend,
          CrashPoints Crash = no_crash_points>
class sender {
 public:
  using input = typename P::input;  // what the trainer hands over for one version

  /// @param projection how canonical bits are read out of the trainer (its canonical() is the model).
  /// @param baselines one durable baseline store per owner (owners.size() == options.owners).
  /// @param crash where a test may make this sender's components die (test policy; default none).
  sender(P projection, T transport, L log, std::vector<B> baselines, sender_options o, Crash crash = {})
      : proj_(std::move(projection)),
        manifest_(proj_.canonical()),
        transport_(std::move(transport)),
        log_(std::move(log)),
        opt_(std::move(o)),
        crash_(crash),
        pipeline_({opt_.threads, opt_.zstd_level, opt_.max_frame_input_bytes}, crash) {
    if (opt_.owners == 0 || baselines.size() != opt_.owners)
      throw error(errc::invalid_argument, "one baseline store per owner is required", {.file = {}, .tensor = {}, .field = "owners"});
    if (!opt_.placements.empty() && opt_.placements.size() != opt_.receivers)
      throw error(errc::invalid_argument, "placements: one per receiver (or none for full, bit-preserving receivers)",
                  {.file = {}, .tensor = {}, .field = "placements"});
    overwrite_only_ = overwrite_only_tensors(manifest_, opt_.placements);
    const auto xor_ok = [this](const tensor_info& t) { return !overwrite_only_.count(t.name); };
    // base-conditioned items must lie inside or outside each receiver's held ranges
    const auto cuts = [this](const tensor_info& t) { return item_cuts(t, opt_.placements); };
    for (std::uint32_t i = 0; i < opt_.owners; ++i)
      owners_.push_back(std::make_unique<owner_slot>(owner_shard(manifest_, i, opt_.owners, opt_.max_frame_input_bytes, xor_ok, cuts),
                                                    std::move(baselines[i])));
  }
  /// The trainer already has canonical bits (identity projection): the model is `manifest`.
  sender(model_manifest manifest, T transport, L log, std::vector<B> baselines, sender_options o, Crash crash = {})
    requires std::constructible_from<P, model_manifest>
      : sender(P(std::move(manifest)), std::move(transport), std::move(log), std::move(baselines), std::move(o), crash) {}
  sender(const sender&) = delete;

  /// Boots the coordinator (claims a new epoch; after a takeover it finishes or retries whatever the
  /// log says) and recovers every owner's B^{K.v}: from its durable store, else from
  /// `committed` (the trainer's copy of K.v, through the projection). Throws errc::mismatch
  /// ("lost state") when neither has K.v.
  void start(const input& committed) {
    if constexpr (std::is_constructible_v<bool, const input&>)
      if (!static_cast<bool>(committed)) return start_from({});  // an empty callback: no trainer copy
    start_from(source_of(committed));
  }
  /// Same, with no trainer copy: every owner recovers from its durable baseline store.
  void start() { start_from({}); }

 private:
  void start_from(const dense_source& committed_bits) {
    const protocol::log_reply r = log_.apply(protocol::read_request{});
    if (r.outcome != protocol::log_outcome::ok) throw error(errc::io, "commit log unreadable at start", {.file = {}, .tensor = {}, .field = "commit_log"});
    committed_ = r.snapshot.record;
    const std::uint64_t epoch = r.snapshot.epoch + 1;
    if (const auto dir = wire::trace_dir_from(opt_.trace_dir); !dir.empty()) trace_ = std::make_unique<sender_trace>(dir, epoch, opt_.owners);
    for (std::uint32_t i = 0; i < owners_.size(); ++i) recover_owner(i, committed_bits, r.snapshot, epoch);
    const protocol::protocol_config cfg{opt_.gate, opt_.owners, opt_.receivers, opt_.attest, opt_.max_attempts};
    coord_ = protocol::coordinator(cfg, epoch, {}, committed_);
    if (trace_)
      trace_->coordinator.line({{"init", {{"role", "coordinator"}, {"config", wire::value_to_json(cfg)}, {"epoch", epoch},
                                          {"roster", wire::json::array()}, {"committed", wire::value_to_json(committed_)}}}});
    step_coordinator(protocol::start_event{});
    run_until([&] { return coord_.phase != protocol::coordinator_phase::claiming && local_.empty(); });
  }

  /// The trainer's state `in` as canonical bits, through the projection (valid while `in` lives).
  dense_source source_of(const input& in) const {
    return [this, p = &in](const tensor_info& t, std::span<std::byte> out) { proj_.project(*p, t, out); };
  }
  /// The changes of the trainer's state `in` against an owner's B^v, through the projection's
  /// changes() (a sharded trainer: layout's direct path; valid while `in` lives).
  change_source changes_of_state(const input& in) const {
    return [this, p = &in](const tensor_info& t, std::span<const std::byte> base, durability::tensor_changes& out) {
      proj_.changes(*p, t, base, out);
    };
  }

 public:
  /// Runs one transition K.v -> K.v+1 to its commit, with `next` the trainer's state of v+1
  /// (read through the projection). Returns the transition's statistics. Throws when the
  /// coordinator is deposed (errc::fenced) or needs an operator (errc::protocol).
  transition_stats refit(const input& next_state) {
    struct clear_next {
      change_source& n;
      ~clear_next() { n = nullptr; }  // `next_state` does not outlive this call
    } guard{next_};
    const change_source next = changes_of_state(next_state);
    const auto t0 = clock::now();
    run_until([&] { return !coord_.busy() && local_.empty(); });
    stats_ = transition_stats{};
    stats_.mode = opt_.gate == protocol::gate_policy::asynchronous ? "async" : "sync";
    stats_.version = committed_.version + 1;
    stats_.dense_bytes = manifest_.total_bytes();
    stats_.elements = manifest_.total_elements();
    transition_attempts_.clear();
    receiver_reports_.clear();
    first_publish_.reset();
    next_ = next;
    // compare: freeze the change set (copy v+1 out of the trainer, bitwise against B^v)
    const auto tc = clock::now();
    for (auto& o : owners_) {
      quiesce(*o);  // chunks of a cancelled attempt of the last transition may still be encoding
      stats_.changed += o->shard.freeze(next);
      o->frozen_version = stats_.version;
      o->persisted = 0;  // these bits are not saved yet (an earlier, failed transition may have saved others)
    }
    stats_.phases.compare_s = seconds(clock::now() - tc);
    check_placements();
    const bool any_xor = opt_.xor_deltas && overwrite_only_.size() < manifest_.size();
    std::vector<digest128> frozen;  // persisted in every prepare: a successor retries exactly these bits
    for (const auto& o : owners_) frozen.push_back(frozen_identity(o->shard));
    step_coordinator(protocol::begin_transition_event{stats_.version, any_xor, expected_attestations(), std::move(frozen)});
    const version_t target = stats_.version;
    run_until([&] { return committed_.version >= target && !coord_.busy() && local_.empty(); });
    // receivers report apply/sync/gate times when their gate reopens (after the commit)
    const auto wait_reports = clock::now() + std::chrono::milliseconds(500);
    run_until([&] { return receiver_reports_.size() >= last_members_ || clock::now() > wait_reports; });
    for (auto& [r, rep] : receiver_reports_) {
      stats_.phases.apply_s = std::max(stats_.phases.apply_s, rep.apply_s);
      stats_.phases.sync_s = std::max(stats_.phases.sync_s, rep.sync_s);
      stats_.gate_closed_s = std::max(stats_.gate_closed_s, rep.gate_closed_s);
    }
    stats_.attempts = static_cast<std::uint32_t>(transition_attempts_.size());
    retries_total_ += stats_.attempts > 0 ? stats_.attempts - 1 : 0;
    stats_.committed = committed_.version == target;
    stats_.total_s = seconds(clock::now() - t0);
    return stats_;
  }

  /// Serves messages and restore requests for `d` (between refits).
  void pump(std::chrono::milliseconds d) {
    const auto until = clock::now() + d;
    run_until([&] { return clock::now() >= until; });
  }

  /// Pumps until every receiver index is known to the coordinator at the committed record (the
  /// deployment is complete), or `timeout` passes. Returns whether it got there.
  bool wait_for_members(std::chrono::milliseconds timeout) {
    const auto until = clock::now() + timeout;
    auto all = [&] {
      for (const auto& e : coord_.roster)
        if (!e.known || e.evicted || e.at != committed_) return false;
      return coord_.roster.size() == opt_.receivers;
    };
    run_until([&] { return all() || clock::now() >= until; });
    return all();
  }

  protocol::commit_record committed() const noexcept { return committed_; }
  const protocol::coordinator& coordinator() const noexcept { return coord_; }
  std::uint64_t retries_total() const noexcept { return retries_total_; }
  T& transport() noexcept { return transport_; }
  const P& projection() const noexcept { return proj_; }
  /// Tensors sent as OVERWRITE in every attempt (some receiver's placement is not bit-preserving).
  const std::set<std::string, std::less<>>& overwrite_only() const noexcept { return overwrite_only_; }
  const owner_shard& shard(std::uint32_t i) const { return owners_.at(i)->shard; }
  const sender_counters& counters() const noexcept { return counters_; }

  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

 private:
  friend struct sender_effects<sender>;
  using effects = sender_effects<sender>;

  struct owner_slot {
    owner_slot(owner_shard s, B b) : shard(std::move(s)), store(std::move(b)) {}
    protocol::owner sm;
    owner_shard shard;
    B store;
    version_t frozen_version = 0;
    std::atomic<std::uint64_t> generation{0};  // bumped by cancel: queued chunks of older jobs skip
    std::atomic<std::uint32_t> in_flight{0};   // pool tasks of this owner past their generation check
    attempt_id encoding{};
    std::uint32_t next_report = 0;              // chunk_encoded_event is fed in seq order
    std::map<std::uint32_t, std::pair<digest128, protocol::mode>> done;  // encoded, not yet reported
    std::uint32_t total = 0;
    version_t persisted = 0;                    // target whose frozen image is durable
  };

  struct receiver_report {
    double apply_s = 0, sync_s = 0, gate_closed_s = 0;
  };

  /// The trace files of this sender's coordinator and owners (wire/trace.hpp).
  struct sender_trace {
    wire::trace_file_writer coordinator;
    std::vector<std::unique_ptr<wire::trace_file_writer>> owners;
    std::uint64_t epoch;
    sender_trace(const std::filesystem::path& dir, std::uint64_t e, std::uint32_t n) : coordinator(dir, "c-e" + std::to_string(e)), epoch(e) {
      for (std::uint32_t i = 0; i < n; ++i)
        owners.push_back(std::make_unique<wire::trace_file_writer>(dir, "o" + std::to_string(i) + "-e" + std::to_string(e)));
    }
    wire::trace_file_writer& of(const protocol::endpoint& e) {
      return e.role == protocol::role::coordinator ? coordinator : *owners.at(e.index);
    }
  };

  // ---- owners ---------------------------------------------------------------------------------

  /// Cancels the owner's queued chunks and waits for the ones already encoding: afterwards no pool
  /// task reads the owner's shard (until the next start_encoding), so it may be replaced. Without
  /// this, a crash or a restore swapped the shard's images while chunks were still being encoded
  /// from them (a heap-use-after-free AddressSanitizer found in the demo). A task enters in_flight
  /// before it reads the generation and this bumps the generation before it reads in_flight (both
  /// sequentially consistent), so either the task sees the new generation and leaves, or this
  /// waits for it.
  void quiesce(owner_slot& o) {
    o.generation++;
    while (o.in_flight.load() != 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

  /// The owner process died mid-stream: every volatile bit is gone. What it made durable survives
  /// (protocol::owner::recovered): B^v of its commit record and the frozen target of the transition
  /// in progress, both read back from its baseline store — never from the trainer. The
  /// coordinator's deadline then retries the attempt; the retry encodes the recovered frozen set.
  void crash_owner(std::uint32_t i) {
    auto& o = *owners_[i];
    quiesce(o);
    o.done.clear();
    o.next_report = 0;
    const protocol::owner before = o.sm;
    o.sm = protocol::owner::recovered(before);
    if (trace_) trace_->owners.at(i)->line({{"recovered", true}});
    auto lost = [&](version_t v, const char* what) {
      return error(errc::mismatch, "owner " + std::to_string(i) + " lost its state: no durable " + what + " image of version " + std::to_string(v),
                   {.file = {}, .tensor = {}, .field = "baseline"});
    };
    auto base = o.store.load(o.sm.baseline.version);
    if (!base || !o.shard.load_baseline(*base)) throw lost(o.sm.baseline.version, "baseline");
    o.frozen_version = o.persisted = 0;
    if (o.sm.frozen_target) {
      if (!load_frozen_target(o.store, o.shard, o.sm.baseline.version, *o.sm.frozen_target)) throw lost(*o.sm.frozen_target, "frozen target");
      o.frozen_version = o.persisted = *o.sm.frozen_target;
    }
  }

  /// A (re)started sender rebuilds owner i from its baseline store (refit/takeover.hpp): B^{K.v},
  /// and the frozen target of a transition its predecessor admitted but did not commit — kept on
  /// disk (not retain_only'd away) so that the coordinator's takeover retries exactly those bits.
  void recover_owner(std::uint32_t i, const dense_source& committed_bits, const protocol::log_snapshot& snap, std::uint64_t epoch) {
    auto& o = *owners_[i];
    quiesce(o);
    o.persisted = 0;
    o.done.clear();
    o.next_report = 0;
    if (auto img = o.store.load(committed_.version); img && o.shard.load_baseline(*img)) {
      // durable image of K.v (saved when v was frozen, or at the initial deployment)
    } else if (committed_bits) {
      o.shard.load_baseline(committed_bits);
      o.store.save(committed_.version, o.shard.baseline());
    } else {
      throw error(errc::mismatch, "owner " + std::to_string(i) + " lost its state: no baseline image of version " +
                                      std::to_string(committed_.version) + " and no trainer copy",
                  {.file = {}, .tensor = {}, .field = "baseline"});
    }
    const auto frozen = recover_frozen(o.store, o.shard, snap);
    if (!frozen) o.store.retain_only(committed_.version);
    o.frozen_version = o.persisted = frozen ? frozen->target : 0;
    const attempt_id newest_prepared = snap.prepared ? snap.prepared->attempt : attempt_id{};
    o.sm = protocol::owner::restarted(i, committed_, frozen, newest_prepared, epoch);
    if (trace_) {  // what owner::restarted was given, so that the replay starts from the same owner
      wire::json init{{"role", "owner"}, {"id", i}, {"epoch", epoch}, {"baseline", wire::value_to_json(committed_)},
                      {"newest_prepared", wire::value_to_json(newest_prepared)}};
      if (frozen)
        init["frozen"] = {{"target", frozen->target}, {"identity", wire::value_to_json(frozen->identity)},
                          {"frozen_at", wire::value_to_json(frozen->frozen_at)}};
      trace_->owners.at(i)->line({{"init", init}});
    }
  }

  void step_owner(std::uint32_t i, const protocol::owner_event& ev) {
    effects fx{*this};
    protocol::drive(owners_.at(i)->sm, ev, fx);
    settle();
  }

  /// Makes the frozen target durable. A DeltaBaselineStore gets only the change set against B^v
  /// (law 4: positions and absolute new bits; K.v's image is durable there by law 2), so the
  /// before-encoding write scales with the changes, not the model. Should the store no longer
  /// hold B^v (errc::mismatch), or save only whole images, the target is built (B^v + the change
  /// set, a transient copy of the owner's tensors) and saved whole: slower, never unrecoverable.
  void persist_frozen(owner_slot& o, const protocol::freeze_change_set_action& act) {
    if constexpr (durability::DeltaBaselineStore<B>) {
      try {
        o.store.save_changes(act.base, act.target, o.shard.changes());
        return;
      } catch (const error& e) {
        if (e.code() != errc::mismatch) throw;
      }
    }
    o.store.save(act.target, o.shard.frozen_image());
  }

  /// Queues every chunk of owner i's attempt on the pipeline; each frame is published under its
  /// payload id as soon as it is built (before its chunk_encoded_event is stepped: law L2).
  void start_encoding(std::uint32_t i, const protocol::encode_action& act) {
    auto& o = *owners_[i];
    const std::uint64_t gen = ++o.generation;
    o.encoding = act.attempt;
    o.done.clear();
    o.next_report = 0;
    o.total = o.shard.chunk_count();
    for (std::uint32_t seq = 0; seq < o.total; ++seq) {
      // per tensor: XOR only in XOR attempts and only for chunks of bit-preservingly placed tensors
      const auto policy = act.mode == protocol::mode::xor_mask && o.shard.chunk_allows_xor(seq) ? codec::mode_policy::xor_allowed
                                                                                                 : codec::mode_policy::overwrite_only;
      const codec::frame_header h{codec::frame_kind::delta, payload_id{act.attempt, i, seq}, act.base, act.target};
      pipeline_.submit(o.shard, gen, h, policy, o.in_flight, [&o, gen] { return o.generation.load() == gen; },
                       [this, id = h.id](std::span<const std::byte> frame) { transport_.publish(transport::key_of(id), frame); });
    }
    if (o.total == 0) owner_later_.push({i, protocol::encode_finished_event{act.attempt, 0}});
  }

  bool drain_completions() {
    std::deque<chunk_done> got = pipeline_.take();
    for (auto& c : got) {
      auto& o = *owners_[c.owner];
      if (c.generation != o.generation.load()) continue;
      if (c.outcome == chunk_done::result::failed) throw error(errc::io, "owner " + std::to_string(c.owner) + " failed to encode: " + c.what);
      if (c.outcome == chunk_done::result::crashed) {
        crash_owner(c.owner);
        continue;
      }
      if (!first_publish_ || c.published < *first_publish_) first_publish_ = c.published;
      stats_.payload_bytes += c.bytes;
      stats_.frames += 1;
      stats_.phases.encode_s += c.encode_s;
      o.done[c.seq] = {c.content, c.mode};
      while (o.done.count(o.next_report)) {
        const std::uint32_t s = o.next_report++;
        const auto [content, mode] = o.done[s];
        step_owner(c.owner, protocol::chunk_encoded_event{c.attempt, s, content, mode});
        o.done.erase(s);
      }
      if (o.next_report == o.total) step_owner(c.owner, protocol::encode_finished_event{c.attempt, o.total});
    }
    return !got.empty();
  }

  /// Receiver r's expected attestation digest of the frozen target: over its declared held ranges
  /// (computed once per distinct placement), from each owner's B^v + change set (no dense copy).
  std::vector<digest128> expected_attestations() const {
    std::map<std::string, codec::patched_bytes, std::less<>> frozen;
    for (const auto& o : owners_)
      for (const tensor_info* t : o->shard.owned()) frozen[t->name] = o->shard.frozen_patch(t->name);
    auto bits = [&](const tensor_info& t) { return frozen.at(t.name); };
    if (opt_.placements.empty()) return std::vector<digest128>(opt_.receivers, expected_attestation(manifest_, placement{}, bits));
    std::vector<digest128> out(opt_.receivers);
    for (std::uint32_t r = 0; r < opt_.receivers; ++r) {
      std::uint32_t same = r;
      for (std::uint32_t q = 0; q < r && same == r; ++q)
        if (opt_.placements[q] == opt_.placements[r]) same = q;
      out[r] = same == r ? expected_attestation(manifest_, opt_.placements[r], bits) : out[same];
    }
    return out;
  }

  /// Refuses to start a transition while a receiver announced a placement other than the one this
  /// sender was configured with: that transition could never commit (see placement.hpp).
  void check_placements() {
    receive_control(std::chrono::milliseconds(0));
    for (const auto& [r, d] : announced_placements_) {
      if (r >= opt_.receivers) continue;
      const digest128 want = r < opt_.placements.size() ? opt_.placements[r].digest() : placement{}.digest();
      if (d != want)
        throw error(errc::mismatch,
                    "receiver " + std::to_string(r) + " announced a placement (held ranges, bit-preserving tensors) that differs from "
                    "sender_options::placements; configure it with refit::declare(that receiver's loader)",
                    {.file = {}, .tensor = {}, .field = "placements"});
    }
  }

  // ---- coordinator ------------------------------------------------------------------------------

  void step_coordinator(const protocol::coordinator_event& ev) {
    effects fx{*this};
    protocol::drive(coord_, ev, fx);
    settle();
  }

  /// Steps every completion the effects reported synchronously (commit-log replies, an owner's
  /// empty encoding), in order, after the step that issued it performed all of its actions.
  void settle() {
    if (settling_) return;  // the outer settle() loop steps it
    settling_ = true;
    struct reset {
      bool& b;
      ~reset() { b = false; }
    } guard{settling_};
    effects fx{*this};
    while (!coord_later_.empty() || !owner_later_.empty()) {
      if (!coord_later_.empty()) {
        protocol::drive(coord_, coord_later_.pop(), fx);
      } else {
        auto [i, ev] = owner_later_.pop();
        protocol::drive(owners_.at(i)->sm, ev, fx);
      }
    }
    if (abort_error_) std::rethrow_exception(std::exchange(abort_error_, nullptr));
  }

  /// Owners and the coordinator share this process: their messages go through a local queue.
  void route(const protocol::envelope& env) {
    switch (env.to.role) {
      case protocol::role::owner:
      case protocol::role::coordinator: local_.push_back(env); return;
      case protocol::role::receiver:
        if (std::holds_alternative<protocol::payload_msg>(env.msg)) return;  // carried by the data plane
        transport_.post(wire::mailbox(env.to), wire::encode(env));
        return;
    }
  }

  bool drain_local() {
    bool any = false;
    while (!local_.empty()) {
      protocol::envelope env = std::move(local_.front());
      local_.pop_front();
      any = true;
      if (env.to.role == protocol::role::owner) {
        if (env.to.index < owners_.size()) step_owner(env.to.index, protocol::message_event{env});
      } else {
        step_coordinator(protocol::message_event{env});
      }
    }
    return any;
  }

  /// The coordinator's mailbox and the engine's side messages. Anything that does not decode is
  /// counted (counters().undecodable), logged with its mailbox's name, and dropped (lost).
  bool receive_control(std::chrono::milliseconds wait) {
    bool any = false;
    const std::string inbox = wire::mailbox(protocol::endpoint::coord());
    const auto refused = [this](const error& e) { refuse(e); };
    wire::for_each_decoded(
        transport_.receive(inbox, wait), inbox, counters_.undecodable, [](const auto& b) { return wire::decode(b); },
        [&](const protocol::envelope& env) {
          any = true;
          if (std::holds_alternative<protocol::ack_msg>(env.msg))
            crash_.pass("coordinator_before_ack", "coordinator");  // receivers applied, no compare-and-set yet
          const protocol::coordinator before = coord_;
          step_coordinator(protocol::message_event{env});
          if (coord_ == before)  // the machine ignored it
            refuse(error(errc::protocol, "ignored by the protocol (stale attempt or epoch, unknown member, old incarnation, or a repeat): " + protocol::fmt::str(env),
                         {.file = inbox, .tensor = {}, .field = "message"}));
        },
        refused);
    wire::for_each_decoded(transport_.receive(wire::placement_mailbox, std::chrono::milliseconds(0)), wire::placement_mailbox,
                           counters_.undecodable, [](const auto& b) { return wire::decode<wire::placement_announcement>(b); },
                           [&](const wire::placement_announcement& p) { announced_placements_[p.receiver] = p.digest; }, refused);
    wire::for_each_decoded(transport_.receive(wire::stats_mailbox, std::chrono::milliseconds(0)), wire::stats_mailbox,
                           counters_.undecodable, [](const auto& b) { return wire::decode<wire::stats_report>(b); },
                           [&](const wire::stats_report& x) {
                             if (!transition_attempts_.count(x.attempt)) return;
                             receiver_reports_[x.receiver] = {x.apply_s, x.sync_s, x.gate_closed_s};
                           }, refused);
    return any;
  }

  void refuse(const error& e) {
    if (opt_.on_refused) opt_.on_refused(e);
  }

  /// Dense restores (restore_server.hpp): served only while every owner's baseline is K.
  void serve_restores() {
    restores_.take_requests(transport_, counters_.undecodable, opt_.receivers, [this](const error& e) { refuse(e); });
    if (!restores_.pending()) return;
    std::vector<protocol::commit_record> baselines;
    std::vector<std::uint32_t> chunks;
    for (auto& o : owners_) {
      baselines.push_back(o->sm.baseline);
      chunks.push_back(o->shard.chunk_count());
    }
    const bool served = restores_.serve(transport_, committed_, baselines, chunks, [&](const transport::stream_key& stream) {
      for (auto& o : owners_)
        pipeline_.dense(o->shard, committed_.version, [&](std::uint32_t seq, std::span<const std::byte> frame) {
          transport_.publish(transport::frame_key{stream, o->shard.index(), seq}, frame);
        });
    });
    if (!served) return;
    ++counters_.restores_served;
    if (trace_) {
      wire::json owners = wire::json::array();
      for (const auto& b : baselines) owners.push_back(wire::value_to_json(b));
      trace_->coordinator.line({{"restore_served", wire::value_to_json(committed_)}, {"owners", owners}});
    }
  }

  // ---- the loop ---------------------------------------------------------------------------------

  /// The coordinator's deadline measures silence, not total time: while owners encode and members
  /// answer, an armed deadline moves forward (the driver's progress()), so a slow but live
  /// transition on a busy machine is not retried; a dead member or owner still trips it `deadline`
  /// after the last sign of life.
  void extend_deadline() {
    if (deadline_) deadline_ = std::max(*deadline_, clock::now() + opt_.deadline);
  }

  template <class Pred>
  void run_until(Pred done) {
    const auto give_up = clock::now() + opt_.transition_timeout;
    while (!done()) {
      bool progressed = drain_completions();
      progressed |= drain_local();
      if (done()) break;
      progressed |= receive_control(progressed ? std::chrono::milliseconds(0) : opt_.poll);
      serve_restores();
      if (deadline_ && clock::now() >= *deadline_) {
        deadline_.reset();
        step_coordinator(protocol::deadline_event{});
      }
      if (opt_.idle) opt_.idle();
      if (clock::now() > give_up)
        throw error(errc::protocol, "transition did not finish within the timeout (phase " +
                                        std::string(protocol::to_string(coord_.phase)) + ")");
    }
  }

  P proj_;
  model_manifest manifest_;
  std::set<std::string, std::less<>> overwrite_only_;
  std::map<std::uint32_t, digest128> announced_placements_;
  T transport_;
  L log_;
  sender_options opt_;
  Crash crash_;
  protocol::coordinator coord_;
  protocol::commit_record committed_{};
  std::vector<std::unique_ptr<owner_slot>> owners_;
  std::deque<protocol::envelope> local_;
  protocol::completion_queue<protocol::coordinator_event> coord_later_;
  protocol::completion_queue<std::pair<std::uint32_t, protocol::owner_event>> owner_later_;
  bool settling_ = false;
  std::exception_ptr abort_error_;  // an abort, reported once its step's actions are all performed
  std::optional<clock::time_point> deadline_;
  restore_server<T> restores_;
  std::unique_ptr<sender_trace> trace_;
  sender_counters counters_;
  change_source next_;
  transition_stats stats_;
  std::set<attempt_id> transition_attempts_;
  std::map<std::uint32_t, receiver_report> receiver_reports_;
  std::size_t last_members_ = 0;
  std::optional<clock::time_point> first_publish_;
  std::uint64_t retries_total_ = 0;
  // Last: destroyed first, so its workers are joined before the owners' shards they read go away.
  encode_pipeline<Backend, Crash> pipeline_;
};

}  // namespace bitrefit::refit
