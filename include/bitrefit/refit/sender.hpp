// bitrefit/refit/sender.hpp — the trainer side of a refit: the coordinator and the owners.
//
// Composes the pure state machines (protocol::coordinator, protocol::owner) with policies:
//   Projection  (refit/concepts.hpp)       the trainer's state of a version -> canonical bits
//                                          (identity_projection by default; sharded_projection<P>
//                                          gathers them from layout::Projection shards)
//   Transport   (transport/concepts.hpp)   payload frames + control messages to receivers
//   CommitLog   (durability/concepts.hpp)  the durable K, compare-and-set, epoch fencing
//   BaselineStore (durability/concepts.hpp) each owner's B^v, consistent with the log across crashes
//   Backend     (codec/concepts.hpp)       where change detection and encoding touch memory
// Receivers' placements (refit/placement.hpp, sender_options::placements) decide per tensor XOR
// vs overwrite and each receiver's expected attestation (over its held ranges).
// and carries out the machines' actions in their documented order. The driver loop, one thread:
//   1. feed finished chunk encodings to their owner (chunk_encoded_event in seq order, then
//      encode_finished_event) and step it;
//   2. deliver messages between the coordinator and the owners (they share this process, so the
//      "network" between them is a local queue) and step the addressee;
//   3. receive the coordinator's mailbox from the transport, decode, drop what comes from a fenced
//      incarnation, step the coordinator;
//   4. serve dense-restore requests of restarted receivers from the owners' committed baselines;
//   5. feed deadline_event when the armed deadline passed.
// Actions, in list order: log_action calls the CommitLog and feeds the reply back at once (it is
// always the last action of its step: "persist BEFORE send", "K durable BEFORE anyone is told");
// send_action posts to the transport (payload_msg sends are carried by the data plane: each frame
// was published under its payload id the moment it was encoded, before chunk_encoded_event);
// freeze_change_set_action saves the frozen target durably BEFORE anything is encoded (once per
// target: retries reuse the image; as the sparse change set against B^v when the store is a
// durability::DeltaBaselineStore, so that write scales with the changes, not the model), so a
// crashed owner recovers it (protocol::owner::recovered) without the trainer, and K never names v+1 before every owner can recover v+1;
// advance_baseline_action swaps B := frozen and drops older durable images; encode_action queues
// every chunk on the bounded thread pool (each worker publishes its frame as soon as it is built,
// so encoding overlaps transfer); cancel_encoding_action stops the attempt's remaining chunks;
// cleanup_action deletes the attempt's payload objects.
#pragma once

#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/io/json.hpp"
#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/driver.hpp"
#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/refit/faults.hpp"
#include "bitrefit/refit/concepts.hpp"
#include "bitrefit/refit/owner_shard.hpp"
#include "bitrefit/refit/placement.hpp"
#include "bitrefit/refit/projection.hpp"
#include "bitrefit/refit/stats.hpp"
#include "bitrefit/refit/thread_pool.hpp"
#include "bitrefit/refit/wire.hpp"
#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::refit {

/// Engine-level mailboxes (outside the protocol's message set).
inline const std::string restore_mailbox = "engine/restore";  // restarted receivers ask for K.v
inline const std::string stats_mailbox = "engine/stats";      // receivers report phase times
inline const std::string placement_mailbox = "engine/placement";  // receivers announce their placement digest
inline std::string restore_reply_mailbox(std::uint32_t r) { return "engine/restored/" + std::to_string(r); }

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
  std::chrono::milliseconds deadline{5000};
  std::chrono::milliseconds poll{2};
  std::chrono::milliseconds transition_timeout{10 * 60 * 1000};
  std::uint32_t max_attempts = 0;  // 0: retry until commit (DESIGN); else needs_operator after that many
  fault_injector* faults = nullptr;
  std::function<void()> idle;  // called once per loop iteration (the demo reaps and restarts processes)
  /// Called for every control input the trainer side drops, with the error that names why: a
  /// message that does not decode (refit/wire.hpp: errc::format naming the field), one the
  /// coordinator ignores (errc::protocol, the message spelled out: a stale attempt or epoch, an
  /// unknown member, a fenced or old incarnation, a repeat), a placement, stats or restore request
  /// that does not parse. The input is dropped; the engine keeps running. Must not throw.
  std::function<void(const error&)> on_refused;
};

template <transport::Transport T, durability::CommitLog L, durability::BaselineStore B,
          TrainerProjection P = identity_projection, codec::execution_backend Backend = codec::host_backend>
class sender {
 public:
  using input = typename P::input;  // what the trainer hands over for one version

  /// @param projection how canonical bits are read out of the trainer (its canonical() is the model).
  /// @param baselines one durable baseline store per owner (owners.size() == options.owners).
  sender(P projection, T transport, L log, std::vector<B> baselines, sender_options o)
      : proj_(std::move(projection)), manifest_(proj_.canonical()), transport_(std::move(transport)), log_(std::move(log)), opt_(std::move(o)) {
    if (opt_.owners == 0 || baselines.size() != opt_.owners)
      throw error(errc::invalid_argument, "one baseline store per owner is required", {.file = {}, .tensor = {}, .field = "owners"});
    if (!opt_.placements.empty() && opt_.placements.size() != opt_.receivers)
      throw error(errc::invalid_argument, "placements: one per receiver (or none for full, bit-preserving receivers)",
                  {.file = {}, .tensor = {}, .field = "placements"});
    overwrite_only_ = overwrite_only_tensors(manifest_, opt_.placements);
    const auto xor_ok = [this](const tensor_info& t) { return !overwrite_only_.count(t.name); };
    for (std::uint32_t i = 0; i < opt_.owners; ++i)
      owners_.push_back(std::make_unique<owner_slot>(owner_shard(manifest_, i, opt_.owners, opt_.max_frame_input_bytes, xor_ok),
                                                    std::move(baselines[i])));
    const unsigned threads = opt_.threads ? opt_.threads : 1;
    for (unsigned w = 0; w < threads; ++w) {
      // one encoder per worker and policy: XOR-or-overwrite (first attempts), overwrite only (retries)
      for (auto policy : {codec::mode_policy::xor_allowed, codec::mode_policy::overwrite_only})
        encoders_.push_back(std::make_unique<codec::chunk_encoder<Backend>>(
            codec::encode_options{policy, opt_.zstd_level, opt_.max_frame_input_bytes}));
      frame_buffers_.push_back(std::make_unique<codec::byte_buffer>());
    }
    pool_ = std::make_unique<thread_pool>(threads, std::size_t(1) << 30);
  }
  /// The trainer already has canonical bits (identity projection): the model is `manifest`.
  sender(model_manifest manifest, T transport, L log, std::vector<B> baselines, sender_options o)
    requires std::constructible_from<P, model_manifest>
      : sender(P(std::move(manifest)), std::move(transport), std::move(log), std::move(baselines), std::move(o)) {}
  sender(const sender&) = delete;
  ~sender() { pool_.reset(); }  // joins workers before the slots they reference go away

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
  void start_from(const tensor_source& committed_bits) {
    const protocol::log_reply r = log_.apply(protocol::read_request{});
    if (r.outcome != protocol::log_outcome::ok) throw error(errc::io, "commit log unreadable at start", {.file = {}, .tensor = {}, .field = "commit_log"});
    committed_ = r.snapshot.record;
    for (std::uint32_t i = 0; i < owners_.size(); ++i) recover_owner(i, committed_bits);
    protocol::protocol_config cfg{opt_.gate, opt_.owners, opt_.receivers, opt_.attest, opt_.max_attempts};
    coord_ = protocol::coordinator(cfg, r.snapshot.epoch + 1, {}, committed_);
    step_coordinator(protocol::start_event{});
    run_until([&] { return coord_.phase != protocol::coordinator_phase::claiming && local_.empty(); });
  }

  /// The trainer's state `in` as canonical bits, through the projection (valid while `in` lives).
  tensor_source source_of(const input& in) const {
    return [this, p = &in](const tensor_info& t, std::span<std::byte> out) { proj_.project(*p, t, out); };
  }

 public:
  /// Runs one transition K.v -> K.v+1 to its commit, with `next` the trainer's state of v+1
  /// (read through the projection). Returns the transition's statistics. Throws when the
  /// coordinator is deposed (errc::fenced) or needs an operator (errc::protocol).
  transition_stats refit(const input& next_state) {
    struct clear_next {
      tensor_source& n;
      ~clear_next() { n = nullptr; }  // `next_state` does not outlive this call
    } guard{next_};
    const tensor_source next = source_of(next_state);
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
    const bool any_xor = overwrite_only_.size() < manifest_.size();
    step_coordinator(protocol::begin_transition_event{stats_.version, any_xor, expected_attestations()});
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

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

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

  struct completion {
    std::uint32_t owner = 0;
    std::uint64_t generation = 0;
    attempt_id attempt{};
    std::uint32_t seq = 0;
    digest128 content{};
    protocol::mode mode = protocol::mode::overwrite;  // xor_delta iff the frame has an XOR item
    bool crashed = false;
    bool fatal = false;
    std::string what;
  };

  struct receiver_report {
    double apply_s = 0, sync_s = 0, gate_closed_s = 0;
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
    auto lost = [&](version_t v, const char* what) {
      return error(errc::mismatch, "owner " + std::to_string(i) + " lost its state: no durable " + what + " image of version " + std::to_string(v),
                   {.file = {}, .tensor = {}, .field = "baseline"});
    };
    auto base = o.store.load(o.sm.baseline.version);
    if (!base || !o.shard.load_baseline(*base)) throw lost(o.sm.baseline.version, "baseline");
    o.frozen_version = o.persisted = 0;
    if (o.sm.frozen_target) {
      auto frozen = o.store.load(*o.sm.frozen_target);
      if (!frozen || !o.shard.load_frozen(*frozen)) throw lost(*o.sm.frozen_target, "frozen target");
      o.frozen_version = o.persisted = *o.sm.frozen_target;
    }
  }

  void recover_owner(std::uint32_t i, const tensor_source& committed_bits) {
    auto& o = *owners_[i];
    quiesce(o);
    o.persisted = 0;
    o.done.clear();
    o.next_report = 0;
    if (auto img = o.store.load(committed_.version); img && o.shard.load_baseline(*img)) {
      // durable image of K.v (saved when v was frozen, or at the initial deployment)
    } else if (committed_bits) {
      o.shard.load_baseline(committed_bits);
      o.store.save(committed_.version, o.shard.image(false));
    } else {
      throw error(errc::mismatch, "owner " + std::to_string(i) + " lost its state: no baseline image of version " +
                                      std::to_string(committed_.version) + " and no trainer copy",
                  {.file = {}, .tensor = {}, .field = "baseline"});
    }
    o.store.retain_only(committed_.version);
    o.frozen_version = 0;
    o.sm = protocol::owner(i, committed_);
  }

  void step_owner(std::uint32_t i, const protocol::owner_event& ev) {
    effects fx{*this};
    protocol::drive(owners_.at(i)->sm, ev, fx);
    settle();
  }

  /// Makes the frozen target durable. A DeltaBaselineStore gets only the change set against B^v
  /// (law 4: positions and absolute new bits; K.v's image is durable there by law 2), so the
  /// before-encoding write scales with the changes, not the model. Should the store no longer
  /// hold B^v (errc::mismatch), the target is saved whole instead: slower, never unrecoverable.
  void persist_frozen(owner_slot& o, const protocol::freeze_change_set_action& act) {
    if constexpr (durability::DeltaBaselineStore<B>) {
      try {
        o.store.save_changes(act.base, act.target, o.shard.changes());
        return;
      } catch (const error& e) {
        if (e.code() != errc::mismatch) throw;
      }
    }
    o.store.save(act.target, o.shard.image(true));
  }

  void start_encoding(std::uint32_t i, const protocol::encode_action& act) {
    auto& o = *owners_[i];
    const std::uint64_t gen = ++o.generation;
    o.encoding = act.attempt;
    o.done.clear();
    o.next_report = 0;
    o.total = o.shard.chunk_count();
    for (std::uint32_t seq = 0; seq < o.total; ++seq) {
      // per tensor: XOR only in XOR attempts and only for chunks of bit-preservingly placed tensors
      const auto policy = act.mode == protocol::mode::xor_delta && o.shard.chunk_allows_xor(seq) ? codec::mode_policy::xor_allowed
                                                                                                 : codec::mode_policy::overwrite_only;
      pool_->submit([this, i, gen, seq, policy, act](std::size_t w) {
        auto& slot = *owners_[i];
        ++slot.in_flight;  // before the generation check: see quiesce()
        struct leave {
          std::atomic<std::uint32_t>& n;
          ~leave() { --n; }
        } in_flight_guard{slot.in_flight};
        if (slot.generation.load() != gen) return;  // cancelled
        completion c{i, gen, act.attempt, seq, {}, protocol::mode::overwrite, false, false, {}};
        try {
          const auto te = clock::now();
          auto& enc = *encoders_[2 * w + (policy == codec::mode_policy::overwrite_only ? 1 : 0)];
          codec::byte_buffer& out = *frame_buffers_[w];
          const codec::frame_header h{codec::frame_kind::delta, payload_id{act.attempt, i, seq}, act.base, act.target};
          const auto st = slot.shard.encode(seq, h, enc, out);
          if (slot.generation.load() != gen) return;
          transport_.publish(transport::key_of(h.id), out.span());
          c.content = codec::load_digest_le(out.data() + out.size() - codec::frame_digest_size);
          c.mode = st.xor_items > 0 ? protocol::mode::xor_delta : protocol::mode::overwrite;
          std::lock_guard lock(mu_);
          if (!first_publish_) first_publish_ = clock::now();
          stats_.payload_bytes += out.size();
          stats_.frames += 1;
          stats_.phases.encode_s += seconds(clock::now() - te);
        } catch (const injected_crash& e) {
          c.crashed = true;
          c.what = e.what();
        } catch (const std::exception& e) {
          c.crashed = c.fatal = true;  // not an injected fault: the driver rethrows it
          c.what = e.what();
        }
        if (!c.crashed && opt_.faults) {
          try {
            opt_.faults->pass(fault_point::owner_mid_stream, "owner/" + std::to_string(i));
          } catch (const injected_crash& e) {
            c.crashed = true;
            c.what = e.what();
          }
        }
        std::lock_guard lock(mu_);
        completions_.push_back(std::move(c));
      });
    }
    if (o.total == 0) owner_later_.push({i, protocol::encode_finished_event{act.attempt, 0}});
  }

  bool drain_completions() {
    std::deque<completion> got;
    {
      std::lock_guard lock(mu_);
      got.swap(completions_);
    }
    for (auto& c : got) {
      auto& o = *owners_[c.owner];
      if (c.generation != o.generation.load()) continue;
      if (c.fatal) throw error(errc::io, "owner " + std::to_string(c.owner) + " failed to encode: " + c.what);
      if (c.crashed) {
        crash_owner(c.owner);
        continue;
      }
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
  /// (computed once per distinct placement).
  std::vector<digest128> expected_attestations() const {
    std::map<std::string, std::span<const std::byte>, std::less<>> frozen;
    for (const auto& o : owners_)
      for (const tensor_info* t : o->shard.owned()) frozen[t->name] = o->shard.frozen_bytes(t->name);
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
    struct reset { bool& b; ~reset() { b = false; } } guard{settling_};
    effects fx{*this};
    while (!coord_later_.empty() || !owner_later_.empty()) {
      if (!coord_later_.empty()) {
        protocol::drive(coord_, coord_later_.pop(), fx);
      } else {
        auto [i, ev] = owner_later_.pop();
        protocol::drive(owners_.at(i)->sm, ev, fx);
      }
    }
  }

  // ---- the sender's Effects (protocol/driver.hpp): what the coordinator's and the owners'
  // actions do here. protocol::drive is the only caller; nothing else interprets an action.
  struct effects {
    sender& s;

    // every role
    void send(const protocol::endpoint& self, const protocol::envelope& env) {
      if (self.role == protocol::role::coordinator)
        if (const auto* p = std::get_if<protocol::prepare_msg>(&env.msg)) {
          s.last_members_ = p->record.members.size();
          s.transition_attempts_.insert(p->record.attempt);
        }
      s.route(env);
    }
    void arm_deadline(const protocol::endpoint&) { s.deadline_ = clock::now() + s.opt_.deadline; }
    void disarm_deadline(const protocol::endpoint&) { s.deadline_.reset(); }
    void progress(const protocol::endpoint&) { s.extend_deadline(); }

    // coordinator
    /// The commit log is called in place; its reply is stepped right after this step (settle()).
    void ask_log(const protocol::endpoint&, const protocol::log_request& req) {
      const bool cas = std::holds_alternative<protocol::compare_and_set_request>(req);
      const auto tl = clock::now();
      if (cas) {
        std::lock_guard lock(s.mu_);
        if (s.first_publish_) s.stats_.phases.transfer_s = seconds(tl - *s.first_publish_);
      }
      protocol::log_reply reply = s.log_.apply(req);
      if (cas) {
        s.stats_.phases.commit_s += seconds(clock::now() - tl);
        if (reply.outcome == protocol::log_outcome::ok && s.opt_.faults)
          s.opt_.faults->pass(fault_point::coordinator_after_cas, "coordinator");  // before anyone is told
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
    void aborted(const protocol::endpoint&, const attempt_id&) {
      throw error(errc::protocol, "transition aborted by the operator", {.file = {}, .tensor = {}, .field = {}});
    }
    void needs_operator(const protocol::endpoint&, const std::string& why) {
      throw error(errc::protocol, "the coordinator needs an operator: " + why, {.file = {}, .tensor = {}, .field = {}});
    }

    // owners
    void advance_baseline(const protocol::endpoint& self, const protocol::commit_record& k) {
      auto& o = *s.owners_.at(self.index);
      s.quiesce(o);  // chunks of a cancelled attempt may still be encoding from the baseline
      o.shard.advance();
      o.frozen_version = 0;
      const auto tr = clock::now();
      o.store.retain_only(k.version);  // may fold a delta chain into a full image
      s.stats_.phases.persist_s += seconds(clock::now() - tr);
    }
    void freeze_change_set(const protocol::endpoint& self, const protocol::freeze_change_set_action& act) {
      auto& o = *s.owners_.at(self.index);
      if (o.frozen_version != act.target) {  // e.g. a restarted trainer-side engine
        if (!s.next_) throw error(errc::protocol, "owner asked to freeze without the trainer's target bits");
        s.quiesce(o);
        o.shard.freeze(s.next_);
        o.frozen_version = act.target;
      }
      if (o.persisted != act.target) {  // retries of the same target reuse the saved image
        const auto tp = clock::now();
        s.persist_frozen(o, act);  // durable BEFORE encoding
        o.persisted = act.target;
        s.stats_.phases.persist_s += seconds(clock::now() - tp);
      }
    }
    void encode(const protocol::endpoint& self, const protocol::encode_action& act) { s.start_encoding(self.index, act); }
    void cancel_encoding(const protocol::endpoint& self, const attempt_id& a) {
      auto& o = *s.owners_.at(self.index);
      if (o.encoding == a) o.generation++;
    }
  };

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

  bool receive_control(std::chrono::milliseconds wait) {
    bool any = false;
    for (auto& bytes : transport_.receive("coordinator", wait)) {
      any = true;
      protocol::envelope env;
      try {
        env = wire::decode(bytes);
      } catch (const error& e) {
        refuse(e);  // not a protocol message: lost, as far as the protocol is concerned
        continue;
      }
      const protocol::coordinator before = coord_;
      step_coordinator(protocol::message_event{env});
      if (coord_ == before)  // the machine ignored it
        refuse(error(errc::protocol, "ignored by the protocol (stale attempt or epoch, unknown member, old incarnation, or a repeat): " + protocol::fmt::str(env),
                     {.file = "coordinator", .tensor = {}, .field = "message"}));
    }
    for (auto& bytes : transport_.receive(placement_mailbox, std::chrono::milliseconds(0)))
      side_message(bytes, placement_mailbox, [&](const nlohmann::json& x) {
        announced_placements_[io::json_integer_at<std::uint32_t>(x, "receiver", {})] = {io::json_integer_at<std::uint64_t>(x, "low", {}),
                                                                                      io::json_integer_at<std::uint64_t>(x, "high", {})};
      });
    for (auto& bytes : transport_.receive(stats_mailbox, std::chrono::milliseconds(0)))
      side_message(bytes, stats_mailbox, [&](const nlohmann::json& x) {
        const attempt_id a = durability::json_io::attempt_from(x.at("attempt"));
        if (!transition_attempts_.count(a)) return;
        const auto r = io::json_integer_at<std::uint32_t>(x, "receiver", {});
        receiver_report rep;
        for (auto [key, field] : {std::pair{"apply_s", &rep.apply_s}, {"sync_s", &rep.sync_s}, {"gate_closed_s", &rep.gate_closed_s}}) {
          const nlohmann::json& v = x.at(key);
          if (!v.is_number()) throw error(errc::format, "not a number", {.file = stats_mailbox, .tensor = {}, .field = key});
          *field = v.get<double>();
        }
        receiver_reports_[r] = rep;
      });
    return any;
  }

  void refuse(const error& e) {
    if (opt_.on_refused) opt_.on_refused(e);
  }

  /// A placement, stats or restore request (JSON, bounded like every control message): `use` reads
  /// it; anything that does not parse or fit is refused by name and dropped.
  template <class Use>
  void side_message(const transport::bytes& bytes, const std::string& mailbox, Use&& use) {
    try {
      use(io::parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), durability::json_io::control_json_limits,
                         {.file = mailbox, .tensor = {}, .field = {}}));
    } catch (const error& e) {
      refuse(error(e.code(), e.message(), {.file = mailbox, .tensor = e.where().tensor, .field = e.where().field}));
    } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type (x.at on a non-object, ...)
      refuse(error(errc::format, std::string("does not fit: ") + e.what(), {.file = mailbox, .tensor = {}, .field = "message"}));
    }
  }

  // ---- dense restore ----------------------------------------------------------------------------

  void serve_restores() {
    for (auto& bytes : transport_.receive(restore_mailbox, std::chrono::milliseconds(0)))
      side_message(bytes, restore_mailbox, [&](const nlohmann::json& x) {
        const auto r = io::json_integer_at<std::uint32_t>(x, "receiver", {});
        if (r >= opt_.receivers) throw error(errc::format, "no such receiver", {.file = {}, .tensor = {}, .field = "receiver"});
        restore_waiting_.insert(r);
      });
    if (restore_waiting_.empty()) return;
    std::vector<protocol::commit_record> baselines;
    for (auto& o : owners_) baselines.push_back(o->sm.baseline);
    if (!protocol::serves_dense_restore(committed_, baselines)) return;  // owners still advancing: later
    if (restored_k_ != committed_) {
      if (restored_k_) transport_.discard(transport::restore_stream(restored_k_->version, restored_k_->baseline));
      const auto stream = transport::restore_stream(committed_.version, committed_.baseline);
      for (auto& o : owners_)
        for (std::uint32_t seq = 0; seq < o->shard.chunk_count(); ++seq) {
          pool_->submit([this, &o, seq, stream](std::size_t w) {
            auto& enc = *encoders_[2 * w];
            codec::byte_buffer& out = *frame_buffers_[w];
            const codec::frame_header h{codec::frame_kind::dense, payload_id{attempt_id{}, o->shard.index(), seq},
                                        committed_.version, committed_.version};
            o->shard.encode_dense(seq, h, enc, out);
            transport_.publish(transport::frame_key{stream, o->shard.index(), seq}, out.span());
          });
        }
      pool_->wait();
      restored_k_ = committed_;
    }
    nlohmann::json chunks = nlohmann::json::array();
    for (auto& o : owners_) chunks.push_back(o->shard.chunk_count());
    const nlohmann::json reply{{"version", committed_.version}, {"baseline", committed_.baseline.value}, {"chunks", chunks}};
    const std::string s = reply.dump();
    for (std::uint32_t r : restore_waiting_) transport_.post(restore_reply_mailbox(r), std::as_bytes(std::span(s.data(), s.size())));
    restore_waiting_.clear();
  }

  // ---- the loop ---------------------------------------------------------------------------------

  /// The coordinator's deadline measures silence, not total time: while owners encode and members
  /// answer, an armed deadline moves forward, so a slow but live transition on a busy machine is
  /// not retried; a dead member or owner still trips it `deadline` after the last sign of life.
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
  protocol::coordinator coord_;
  protocol::commit_record committed_{};
  std::vector<std::unique_ptr<owner_slot>> owners_;
  std::vector<std::unique_ptr<codec::chunk_encoder<Backend>>> encoders_;
  std::vector<std::unique_ptr<codec::byte_buffer>> frame_buffers_;
  std::unique_ptr<thread_pool> pool_;
  std::mutex mu_;
  std::deque<completion> completions_;
  std::deque<protocol::envelope> local_;
  protocol::completion_queue<protocol::coordinator_event> coord_later_;
  protocol::completion_queue<std::pair<std::uint32_t, protocol::owner_event>> owner_later_;
  bool settling_ = false;
  std::optional<clock::time_point> deadline_;
  std::set<std::uint32_t> restore_waiting_;
  std::optional<protocol::commit_record> restored_k_;
  tensor_source next_;
  transition_stats stats_;
  std::set<attempt_id> transition_attempts_;
  std::map<std::uint32_t, receiver_report> receiver_reports_;
  std::size_t last_members_ = 0;
  std::optional<clock::time_point> first_publish_;
  std::uint64_t retries_total_ = 0;
};

}  // namespace bitrefit::refit
