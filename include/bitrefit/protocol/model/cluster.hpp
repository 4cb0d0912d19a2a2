// bitrefit/protocol/model/cluster.hpp — a deterministic, pure "cluster world" that composes the REAL
// coordinator, owners, receivers and commit log with an in-flight message multiset, per-receiver
// device queues and abstract weight regions, under bounded fault budgets.
//
// The same value is driven by the RapidCheck properties (random moves) and by the exhaustive model
// checker in proofs/ (every move): `enabled_moves()`, `apply(move)`, `check_invariants()`,
// `transition_done()`, `==` and `hash_of()` for deduplication.
//
// Abstraction. Receiver r holds owners*chunks regions; payload (τ, o, s) writes region o*chunks+s
// (positions of one attempt are disjoint). A region holds a version number or `garbage`: OVERWRITE
// sets it to the target; XOR sets it to the target iff it holds exactly the base, else garbage.
// Every version changes every region (the worst case for XOR). Owners encode zero chunks when their
// delta base already equals the target (nothing changed from their point of view).
//
// What the world does by itself (no move): it performs the local actions of every machine at once
// and feeds their completions back (encode -> chunk_encoded/encode_finished, drain -> drained,
// read_commit -> commit_read, dense_restore -> restored after the device queue drained, sync_device ->
// device_synced as soon as the device queue is empty), and starts the next transition when the
// coordinator is idle and K.v < goal. Everything that can race is a move:
//   deliver/drop/duplicate/corrupt/conflict <envelope>   network (drop, duplicate, corrupt and conflict
//                                                        consume fault budget; reorder = choice of message)
//   device r<i> <payload id> <mode>                      a pending apply takes effect (any order)
//   crash r<i> / restart r<i>                            receiver process dies / comes back (new incarnation)
//   crash o<i>                                           owner process dies and restarts from its durable state
//   deadline c / deadline r<i>                           an armed timer expires: always allowed once the
//                                                        world is quiet (nothing in flight), earlier only
//                                                        with the early-deadline budget
//   failover                                             a new coordinator (epoch+1) replaces the active one;
//                                                        the old one's pending log requests still land
//   log ok|failed|unknown-applied|unknown-lost <request> a pending commit-log request completes (faults
//                                                        on every request that writes; a read may fail)
//   abort                                                operator abort (budget)
//   begin v<n>                                           the trainer starts the next transition (coordinator
//                                                        idle, K.v < goal); may race with leftovers in flight
// Invariants (check_invariants): see DESIGN.md "Invariants"; each violation names the receiver,
// region, attempt and versions involved.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "bitrefit/protocol/commit_log.hpp"
#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/driver.hpp"
#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/protocol/receiver.hpp"

namespace bitrefit::protocol::model {

/// Region content: WHICH bits a region holds — a version together with the identity ("flavor") of
/// the frozen change set that produced it — or garbage (an XOR on the wrong base or applied
/// twice). Two frozen change sets of one version (the trainer's bits differ: it moved on, or
/// restarted from another checkpoint) are different contents, so "same version, different bits"
/// is a violation the monitors see (finding B1). A change set of flavor 0 changes every region of
/// its owner; one of flavor f >= 1 leaves the owner's chunk (f-1) mod chunks unchanged (a
/// different step changes different positions), so an overwrite from the wrong change set leaves
/// a receiver holding a mix that equals neither version there.
using region_t = std::int32_t;
inline constexpr region_t garbage = -1;
inline constexpr std::uint32_t flavors = 8;
constexpr region_t content_of(version_t v, std::uint32_t flavor) noexcept { return region_t(v * flavors + flavor); }
constexpr version_t version_of(region_t c) noexcept { return version_t(c) / flavors; }
constexpr std::uint32_t flavor_of(region_t c) noexcept { return std::uint32_t(c) % flavors; }
/// Does owner chunk `seq` change in a change set of flavor `f` (chunks per owner `n`)?
constexpr bool changes(std::uint32_t f, std::uint32_t seq, std::uint32_t n) noexcept { return f == 0 || seq != (f - 1) % n; }
/// The identity of owner o's frozen change set of version t with flavor f (prepare_record::frozen).
constexpr digest128 frozen_identity(std::uint32_t o, version_t t, std::uint32_t f) noexcept {
  return digest128{0xF0000u | (std::uint64_t(o) << 8) | f, t};
}
constexpr std::uint32_t flavor_of(const digest128& identity) noexcept { return std::uint32_t(identity.low64 & 0xFFu); }

struct world_config {
  protocol_config protocol{gate_policy::synchronous, 2, 2, true, 0};
  /// A deliberately broken protocol (tests only): needs the world instantiated with
  /// runtime_mutation (`mutated_cluster`); the shipped world refuses anything but `none`.
  protocol_mutation mutation = protocol_mutation::none;
  std::uint32_t chunks_per_owner = 1;
  /// The last `overwrite_chunks` chunks of every owner are coded as overwrite even in an XOR
  /// attempt (as the engine codes tensors some receiver places non-bit-preservingly, or a chunk
  /// whose overwrite coding is smaller): overwrite payloads riding in an XOR attempt.
  std::uint32_t overwrite_chunks = 0;
  std::uint32_t transitions = 1;  // goal: K.v == transitions (starting from v0)
  bool xor_allowed = true;
  bool ordered_device = false;    // device applies complete in issue order (smaller state space)
  // Fault budgets (each use consumes one).
  std::uint32_t drops = 0;
  std::uint32_t duplicates = 0;
  std::uint32_t corruptions = 0;     // a copy that fails verification (counts as undelivered)
  std::uint32_t conflicts = 0;       // a copy with the same payload id and different bytes
  std::uint32_t crashes = 0;         // receiver crashes
  std::uint32_t owner_crashes = 0;   // an owner process dies and restarts from its durable state
  std::uint32_t failovers = 0;
  std::uint32_t log_faults = 0;      // a log request answered failed / unknown (claim, prepare, CAS, read)
  std::uint32_t early_deadlines = 0; // deadlines while something is still in flight
  std::uint32_t aborts = 0;
  /// The whole sender process (coordinator + owners) dies and restarts from the commit log and the
  /// owners' baseline stores, with their frozen images present, lost or replaced; the trainer's
  /// bits of the next version have moved on each time.
  std::uint32_t sender_restarts = 0;
  friend bool operator==(const world_config&, const world_config&) = default;
};

/// Throws std::invalid_argument naming the bound a world cannot be built with: every receiver holds
/// owners x chunks regions, and a world with none has nothing to refit (before this check, a
/// checker run with owners=0 or chunks=0 crashed, and one with receivers=0 reported "ok").
inline void check_world_config(const world_config& c) {
  const auto need_one = [](const char* key, std::uint32_t v) {
    if (v == 0) throw std::invalid_argument(std::string("world: ") + key + "=0: must be at least 1");
  };
  need_one("receivers", c.protocol.receivers);
  need_one("owners", c.protocol.owners);
  need_one("chunks", c.chunks_per_owner);
}

enum class move_kind : std::uint8_t {
  deliver, drop, duplicate, corrupt, conflict, device, crash, restart, deadline, failover,
  log_ok, log_failed, log_unknown_applied, log_unknown_lost, abort,
  begin,  // the trainer hands the idle coordinator version K.v+1 (while K.v < goal)
  owner_crash,  // owner o dies and restarts at once from its durable baseline and frozen change set
  sender_restart  // coordinator + owners restart from the log and the stores; sub: frozen images
                  // 0 present, 1 lost, 2 replaced by other bits of the same version
};

/// One nondeterministic step. `index`: in-flight message index (network moves), receiver (device,
/// crash, restart; deadline: 0 = coordinator, r+1 = receiver r) or pending log request (log moves);
/// `sub`: the device write index.
struct move {
  move_kind kind = move_kind::deliver;
  std::uint32_t index = 0;
  std::uint32_t sub = 0;
  friend auto operator<=>(const move&, const move&) = default;
};

struct pending_write {
  payload_id id{};
  protocol::mode mode = mode::overwrite;
  version_t base = 0;
  version_t target = 0;
  std::uint32_t flavor = 0;  // of the change set the payload was encoded from (its content says)
  std::uint64_t incarnation = 0;
  friend auto operator<=>(const pending_write&, const pending_write&) = default;
};

struct pending_log {
  log_request request;
  std::uint64_t epoch = 0;  // the coordinator that issued it (its reply goes nowhere if it was replaced)
  friend auto operator<=>(const pending_log&, const pending_log&) = default;
};

struct fault_budget {
  std::uint32_t drops = 0, duplicates = 0, corruptions = 0, conflicts = 0, crashes = 0, failovers = 0, log_faults = 0,
                early_deadlines = 0, aborts = 0, owner_crashes = 0, sender_restarts = 0;
  friend auto operator<=>(const fault_budget&, const fault_budget&) = default;
};

/// Monitor history (part of the state; bounded by the attempt bound).
struct attempt_note {
  attempt_id attempt{};
  version_t target = 0;
  std::vector<member> members;
  friend auto operator<=>(const attempt_note&, const attempt_note&) = default;
};

/// The frozen change set an owner's store holds (owner_store::frozen). At namespace scope, not
/// nested in owner_store: clang 14 asks whether a nested class with default member initializers is
/// default-constructible while the enclosing class is still incomplete, caches "no", and then
/// rejects `std::optional<frozen_image>::emplace()` (the proofs' compact decoding) everywhere.
struct owner_frozen_image {
  version_t target = 0;
  std::uint32_t flavor = 0;
  attempt_id frozen_at{};
  friend auto operator<=>(const owner_frozen_image&, const owner_frozen_image&) = default;
};

/// Owner o's durable baseline store as the world keeps it (what a restarted sender reads back):
/// B^v with its commit record (advance_baseline) and the frozen change set of the transition in
/// progress (freeze_change_set) with the flavor of its bits and the attempt that froze it.
struct owner_store {
  using frozen_image = owner_frozen_image;
  commit_record baseline{};
  std::optional<frozen_image> frozen;
  friend auto operator<=>(const owner_store&, const owner_store&) = default;
};

/// The world over the machines instantiated with mutation policy `Mut` (mutation.hpp): `cluster`
/// is the shipped protocol, `mutated_cluster` the one the mutation tests break.
template <MutationPolicy Mut = no_mutation>
struct basic_cluster {
  using coordinator_t = basic_coordinator<Mut>;
  using owner_t = basic_owner<Mut>;
  using receiver_t = basic_receiver<Mut>;

  world_config config;
  basic_commit_log<Mut> log;
  coordinator_t coord;
  std::vector<owner_t> owners;
  std::vector<std::optional<receiver_t>> receivers;  // nullopt: crashed
  std::vector<std::uint64_t> incarnations;         // durable incarnation counter per receiver
  std::vector<owner_store> stores;                 // per owner: its durable baseline store
  std::uint32_t trainer_flavor = 0;                // flavor of the trainer's bits of K.v+1 (moves on at a sender restart)
  std::vector<std::vector<region_t>> truth;        // per committed version: each region's content (a dense copy)
  std::vector<region_t> regions;                   // receiver-major
  std::vector<std::vector<pending_write>> device;  // per receiver, sorted (or issue order)
  std::vector<std::uint8_t> sync_waiting;          // receiver awaits device_synced
  std::vector<envelope> inflight;                  // sorted multiset
  std::vector<pending_log> log_queue;              // sorted
  bool coord_deadline = false;
  std::vector<std::uint8_t> receiver_deadline;
  fault_budget budget;
  std::uint64_t max_epoch = 1;
  // monitors
  std::vector<attempt_note> attempts;               // every persisted prepare
  std::vector<std::pair<attempt_id, member>> acks;  // acks sent (sorted)
  std::vector<attempt_id> stopped;                  // attempts whose stop_and_wait completed
  std::vector<member> fenced;                       // evicted incarnations
  std::vector<attempt_id> aborts_durable;           // attempts whose abort the log holds (sorted)
  std::optional<std::string> violation;             // the first invariant violated
  bool stuck = false;                               // coordinator needs an operator

  basic_cluster() = default;
  explicit basic_cluster(const world_config& cfg) : config(cfg) {
    check_world_config(cfg);
    if (!Mut::enabled && cfg.mutation != protocol_mutation::none)
      throw std::invalid_argument("world: mutation=" + std::string(to_string(cfg.mutation)) +
                                  " needs the mutated world (model::mutated_cluster)");
    const auto& p = cfg.protocol;
    log = basic_commit_log<Mut>(commit_record{0, baseline_id{0}}, mut());
    std::vector<member> roster;
    for (std::uint32_t r = 0; r < p.receivers; ++r) roster.push_back(member{r, 0});
    coord = coordinator_t(p, 1, roster, commit_record{}, mut());
    for (std::uint32_t o = 0; o < p.owners; ++o) owners.emplace_back(o, commit_record{}, mut());
    for (std::uint32_t r = 0; r < p.receivers; ++r) receivers.emplace_back(receiver_t(r, 0, p, commit_record{}, mut()));
    incarnations.assign(p.receivers, 0);
    stores.assign(p.owners, owner_store{});
    truth.assign(1, std::vector<region_t>(regions_per_receiver(), content_of(0, 0)));
    regions.assign(std::size_t(p.receivers) * regions_per_receiver(), content_of(0, 0));
    device.assign(p.receivers, {});
    sync_waiting.assign(p.receivers, 0);
    receiver_deadline.assign(p.receivers, 0);
    budget = fault_budget{cfg.drops, cfg.duplicates, cfg.corruptions, cfg.conflicts, cfg.crashes, cfg.failovers,
                          cfg.log_faults, cfg.early_deadlines, cfg.aborts, cfg.owner_crashes, cfg.sender_restarts};
    std::vector<std::string>* none = nullptr;
    run({{node_ref::coord(), coordinator_event{start_event{}}}}, none);
  }

  std::uint32_t regions_per_receiver() const noexcept {
    return config.protocol.owners * config.chunks_per_owner;
  }
  region_t region(std::uint32_t r, std::uint32_t i) const { return regions[std::size_t(r) * regions_per_receiver() + i]; }

  /// The mutation policy value of this world's machines.
  Mut mut() const noexcept { return mutation_policy<Mut>(config.mutation); }

  /// Equality for deduplication: every field (the configuration is constant within one run).
  friend bool operator==(const basic_cluster&, const basic_cluster&) = default;

  /// The trainer may start the next transition: the coordinator is idle and K.v < goal.
  bool can_begin() const {
    return coord.phase == coordinator_phase::idle && !coord.target && coord.committed == log.state.record &&
           coord.committed.version < config.transitions;
  }

  /// Nothing in flight: no message, no pending apply, no log request.
  bool quiet() const {
    if (!inflight.empty() || !log_queue.empty()) return false;
    for (const auto& d : device)
      if (!d.empty()) return false;
    return true;
  }

  /// The goal: K reached `transitions` versions and the coordinator finished (idle).
  bool transition_done() const {
    return log.state.record.version >= config.transitions && coord.phase == coordinator_phase::idle &&
           coord.committed == log.state.record;
  }
  /// transition_done and every live receiver serves K with its gate open holding exactly K's bits,
  /// nothing in flight, and the coordinator's roster converged (roster_stale).
  bool settled() const {
    if (!transition_done() || !quiet()) return false;
    for (const auto& r : receivers)
      if (!r || r->phase != receiver_phase::serving || !r->gate_open || r->committed != log.state.record) return false;
    return !roster_stale() && !stale_region();
  }

  /// A live receiver region whose bits are not those of a dense copy of K.v, if any.
  std::optional<std::string> stale_region() const {
    const auto& want = truth.at(log.state.record.version);
    for (std::uint32_t r = 0; r < receivers.size(); ++r)
      for (std::uint32_t i = 0; receivers[r] && i < regions_per_receiver(); ++i)
        if (region(r, i) != want[i])
          return "r" + std::to_string(r) + " region " + std::to_string(i) + " holds " + region_name(region(r, i)) +
                 ", K's bits there are " + region_name(want[i]);
    return std::nullopt;
  }

  /// Why the coordinator's view is not converged, if it is not: the roster must hold exactly each
  /// live receiver's incarnation, admitted (not evicted) at K, and every owner must have reported K
  /// (finding B2: a dead incarnation kept in the roster forever).
  std::optional<std::string> roster_stale() const {
    const commit_record k = log.state.record;
    for (std::uint32_t r = 0; r < receivers.size(); ++r) {
      if (!receivers[r]) continue;
      const auto& e = coord.roster.at(r);
      if (!e.known || e.evicted || e.incarnation != receivers[r]->incarnation || e.at != k)
        return "roster entry of r" + std::to_string(r) + " is " +
               (e.known ? "#" + std::to_string(e.incarnation) + (e.evicted ? " evicted" : "") + " at " + fmt::str(e.at)
                        : std::string("unknown")) +
               ", the live incarnation is #" + std::to_string(receivers[r]->incarnation) + " and K is " + fmt::str(k);
    }
    for (std::uint32_t o = 0; o < owners.size(); ++o)
      if (coord.owner_at.at(o) != k) return "owner o" + std::to_string(o) + " has not reported K " + fmt::str(k);
    return std::nullopt;
  }

  // ------------------------------------------------------------------------------------------
  std::vector<move> enabled_moves() const {
    std::vector<move> out;
    if (violation) return out;
    for (std::uint32_t i = 0; i < inflight.size(); ++i) {
      if (i > 0 && inflight[i] == inflight[i - 1]) continue;  // identical copies: one choice
      out.push_back({move_kind::deliver, i, 0});
      if (budget.drops) out.push_back({move_kind::drop, i, 0});
      if (budget.duplicates) out.push_back({move_kind::duplicate, i, 0});
      if (std::holds_alternative<payload_msg>(inflight[i].msg)) {
        if (budget.corruptions) out.push_back({move_kind::corrupt, i, 0});
        if (budget.conflicts) out.push_back({move_kind::conflict, i, 0});
      }
    }
    for (std::uint32_t r = 0; r < device.size(); ++r)
      for (std::uint32_t j = 0; j < device[r].size(); ++j) {
        if (config.ordered_device && j > 0) break;
        if (j > 0 && device[r][j] == device[r][j - 1]) continue;
        out.push_back({move_kind::device, r, j});
      }
    for (std::uint32_t i = 0; i < log_queue.size(); ++i) {
      out.push_back({move_kind::log_ok, i, 0});
      if (budget.log_faults) add_log_faults(i, out);
    }
    const bool deadline_ok = quiet() || budget.early_deadlines;
    if (coord_deadline && deadline_ok) out.push_back({move_kind::deadline, 0, 0});
    for (std::uint32_t r = 0; r < receivers.size(); ++r) {
      if (receivers[r] && receiver_deadline[r] && deadline_ok) out.push_back({move_kind::deadline, r + 1, 0});
      if (receivers[r] && budget.crashes) out.push_back({move_kind::crash, r, 0});
      if (!receivers[r]) out.push_back({move_kind::restart, r, 0});
    }
    if (budget.failovers) out.push_back({move_kind::failover, 0, 0});
    if (budget.owner_crashes)
      for (std::uint32_t o = 0; o < owners.size(); ++o) out.push_back({move_kind::owner_crash, o, 0});
    if (budget.sender_restarts) {
      out.push_back({move_kind::sender_restart, 0, 0});
      if (frozen_can_vanish()) {
        out.push_back({move_kind::sender_restart, 0, 1});
        out.push_back({move_kind::sender_restart, 0, 2});
      }
    }
    if (budget.aborts && coord.phase == coordinator_phase::collecting) out.push_back({move_kind::abort, 0, 0});
    if (can_begin()) out.push_back({move_kind::begin, 0, 0});
    return out;
  }

  /// May a restart find the frozen images lost or replaced? Only those of a version that nothing can
  /// commit any more behind the new coordinator's back (no compare-and-set naming it pending): losing
  /// the image of a version that commits is the "lost state" the engine reports (it needs the
  /// trainer's copy of K.v, which is outside the protocol).
  bool frozen_can_vanish() const {
    bool any = false;
    for (const auto& st : stores) any |= st.frozen && st.frozen->target > log.state.record.version;
    if (!any) return false;
    for (const auto& p : log_queue)
      if (std::holds_alternative<compare_and_set_request>(p.request)) return false;
    return true;
  }

  /// Commit-log faults on pending request i: every request that writes (claim, persist_prepare,
  /// compare-and-set) may fail, or take effect or not behind an `unknown` outcome; a read may fail
  /// (its unknown is the same: nothing was written).
  void add_log_faults(std::uint32_t i, std::vector<move>& out) const {
    out.push_back({move_kind::log_failed, i, 0});
    if (std::holds_alternative<read_request>(log_queue[i].request)) return;
    out.push_back({move_kind::log_unknown_applied, i, 0});
    out.push_back({move_kind::log_unknown_lost, i, 0});
  }

  /// Apply one enabled move; `trace` (optional) receives one line per event/action.
  void apply(const move& m, std::vector<std::string>* trace = nullptr) {
    std::vector<work> q;
    switch (m.kind) {
      case move_kind::deliver:
      case move_kind::drop:
      case move_kind::duplicate:
      case move_kind::corrupt:
      case move_kind::conflict: {
        envelope e = inflight.at(m.index);
        if (m.kind == move_kind::duplicate) {
          --budget.duplicates;
          insert_inflight(e);
          return;
        }
        inflight.erase(inflight.begin() + m.index);
        if (m.kind == move_kind::drop) { --budget.drops; return; }
        if (m.kind == move_kind::corrupt) { --budget.corruptions; if (trace) trace->push_back("(copy fails verification: not delivered)"); return; }
        if (m.kind == move_kind::conflict) {
          --budget.conflicts;
          std::get<payload_msg>(e.msg).content.high64 ^= 0xC0FFEE;
        }
        q.push_back(deliver_to(e));
        break;
      }
      case move_kind::device: complete_write(m.index, m.sub, q, trace); break;
      case move_kind::crash: {
        --budget.crashes;
        receivers[m.index].reset();
        device[m.index].clear();
        sync_waiting[m.index] = 0;
        receiver_deadline[m.index] = 0;
        return;
      }
      case move_kind::owner_crash: {
        --budget.owner_crashes;
        owners[m.index] = owner_t::recovered(owners[m.index]);
        return;
      }
      case move_kind::sender_restart: {
        --budget.sender_restarts;
        restart_sender(m.sub, q);
        break;
      }
      case move_kind::restart: {
        std::uint64_t inc = ++incarnations[m.index];
        receivers[m.index] = receiver_t::restarted(m.index, inc, config.protocol, mut());
        q.push_back({node_ref::recv(m.index), receiver_event{boot_event{}}});
        break;
      }
      case move_kind::deadline:
        if (m.index == 0) { coord_deadline = false; q.push_back({node_ref::coord(), coordinator_event{deadline_event{}}}); }
        else { receiver_deadline[m.index - 1] = 0; q.push_back({node_ref::recv(m.index - 1), receiver_event{deadline_event{}}}); }
        if (!quiet()) --budget.early_deadlines;
        break;
      case move_kind::failover: {
        --budget.failovers;
        max_epoch = std::max(max_epoch, coord.epoch) + 1;
        coord = coordinator_t(config.protocol, max_epoch, {}, commit_record{}, mut());
        coord_deadline = false;
        stuck = false;
        q.push_back({node_ref::coord(), coordinator_event{start_event{}}});
        break;
      }
      case move_kind::log_ok:
      case move_kind::log_failed:
      case move_kind::log_unknown_applied:
      case move_kind::log_unknown_lost: {
        pending_log p = log_queue.at(m.index);
        log_queue.erase(log_queue.begin() + m.index);
        log_reply rep{p.request, log_outcome::ok, {}};
        if (m.kind == move_kind::log_ok || m.kind == move_kind::log_unknown_applied) rep = apply_log(p.request);
        if (m.kind != move_kind::log_ok) {
          --budget.log_faults;
          rep.outcome = m.kind == move_kind::log_failed ? log_outcome::failed : log_outcome::unknown;
          rep.snapshot = {};
        }
        if (p.epoch == coord.epoch) q.push_back({node_ref::coord(), coordinator_event{log_event{rep}}});
        else if (trace) trace->push_back("log: " + fmt::str(rep) + " (the reply to replaced coordinator e" +
                                         std::to_string(p.epoch) + " is lost)");
        break;
      }
      case move_kind::abort:
        --budget.aborts;
        q.push_back({node_ref::coord(), coordinator_event{operator_abort_event{}}});
        break;
      case move_kind::begin: {
        const version_t t = coord.committed.version + 1;
        begin_transition_event b{t, config.xor_allowed,
                                 config.protocol.attest ? expected_for(t) : std::vector<digest128>{}, {}};
        for (std::uint32_t o = 0; o < owners.size(); ++o) b.frozen.push_back(frozen_identity(o, t, trainer_flavor));
        q.push_back({node_ref::coord(), coordinator_event{b}});
        break;
      }
    }
    run(std::move(q), trace);
  }

  /// The first violated invariant, with a message; nullopt if all hold.
  std::optional<std::string> check_invariants() const {
    if (violation) return violation;
    const auto n = regions_per_receiver();
    for (std::uint32_t r = 0; r < receivers.size(); ++r)
      for (std::uint32_t i = 0; i < n; ++i)
        if (receivers[r] && region(r, i) == garbage)
          return "garbage: receiver r" + std::to_string(r) + " region " + std::to_string(i);
    for (const auto& o : owners)
      if (o.baseline.version > log.state.record.version)
        return "owner o" + std::to_string(o.id) + " baseline v" + std::to_string(o.baseline.version) +
               " is ahead of the commit record " + fmt::str(log.state.record);
    return std::nullopt;
  }

  // ---- text form of moves (scenario files, counterexamples)
  std::string describe(const move& m) const {
    switch (m.kind) {
      case move_kind::deliver: return "deliver " + fmt::str(inflight.at(m.index));
      case move_kind::drop: return "drop " + fmt::str(inflight.at(m.index));
      case move_kind::duplicate: return "duplicate " + fmt::str(inflight.at(m.index));
      case move_kind::corrupt: return "corrupt " + fmt::str(inflight.at(m.index));
      case move_kind::conflict: return "conflict " + fmt::str(inflight.at(m.index));
      case move_kind::device: {
        const auto& w = device.at(m.index).at(m.sub);
        return "device r" + std::to_string(m.index) + " " + fmt::str(w.id) + " " + std::string(to_string(w.mode));
      }
      case move_kind::crash: return "crash r" + std::to_string(m.index);
      case move_kind::restart: return "restart r" + std::to_string(m.index);
      case move_kind::owner_crash: return "crash o" + std::to_string(m.index);
      case move_kind::sender_restart:
        return m.sub == 0 ? "restart sender" : m.sub == 1 ? "restart sender frozen-lost" : "restart sender frozen-replaced";
      case move_kind::deadline: return m.index == 0 ? "deadline c" : "deadline r" + std::to_string(m.index - 1);
      case move_kind::failover: return "failover";
      case move_kind::log_ok: return "log ok " + fmt::str(log_queue.at(m.index).request);
      case move_kind::log_failed: return "log failed " + fmt::str(log_queue.at(m.index).request);
      case move_kind::log_unknown_applied: return "log unknown-applied " + fmt::str(log_queue.at(m.index).request);
      case move_kind::log_unknown_lost: return "log unknown-lost " + fmt::str(log_queue.at(m.index).request);
      case move_kind::abort: return "abort";
      case move_kind::begin: return "begin v" + std::to_string(coord.committed.version + 1);
    }
    return "?";
  }

  /// The enabled move whose text starts with `text` (whole words), if any: so a scenario may write
  /// `deliver c->r0 prepare` for the first such message in canonical order.
  std::optional<move> find_move(const std::string& text) const {
    const std::string want = squeeze(text);
    for (const auto& m : enabled_moves()) {
      const std::string d = describe(m);
      if (d.compare(0, want.size(), want) == 0 && (d.size() == want.size() || d[want.size()] == ' ')) return m;
    }
    return std::nullopt;
  }

  /// Multi-line summary: log, coordinator, owners, receivers with regions, in flight.
  std::string summary() const {
    std::string s = "log " + fmt::str(log.state) + "\n" + fmt::str(coord) + "\n";
    for (const auto& o : owners) s += fmt::str(o) + "\n";
    if (config.sender_restarts) {  // what a restarted sender reads back
      s += "trainer v" + std::to_string(log.state.record.version + 1) + primes(trainer_flavor) + " stores=[";
      for (std::uint32_t o = 0; o < stores.size(); ++o) {
        if (o) s += ",";
        s += "o" + std::to_string(o) + ":B=" + fmt::str(stores[o].baseline);
        if (const auto& f = stores[o].frozen) s += " frozen=v" + std::to_string(f->target) + primes(f->flavor);
      }
      s += "]\n";
    }
    for (std::uint32_t r = 0; r < receivers.size(); ++r) {
      if (receivers[r]) s += fmt::str(*receivers[r]);
      else s += std::string("r") + std::to_string(r) + " crashed";
      s += " regions=[";
      for (std::uint32_t i = 0; i < regions_per_receiver(); ++i) {
        if (i) s += ",";
        s += region_name(region(r, i));
      }
      s += "]";
      if (!device[r].empty()) s += " pending=" + std::to_string(device[r].size());
      s += "\n";
    }
    s += "inflight " + std::to_string(inflight.size()) + "\n";
    return s;
  }

 private:
  struct node_ref {
    role kind = role::coordinator;
    std::uint32_t index = 0;
    static node_ref coord() { return {role::coordinator, 0}; }
    static node_ref recv(std::uint32_t i) { return {role::receiver, i}; }
    static node_ref own(std::uint32_t i) { return {role::owner, i}; }
  };
  using any_event = std::variant<coordinator_event, owner_event, receiver_event>;
  struct work {
    node_ref node;
    any_event ev;
  };

  static std::string squeeze(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == ' ' || c == '\t') {
        if (!out.empty() && out.back() != ' ') out += ' ';
      } else {
        out += c;
      }
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }

  void fail(std::string what) {
    if (!violation) violation = std::move(what);
  }

  void insert_inflight(const envelope& e) {
    inflight.insert(std::upper_bound(inflight.begin(), inflight.end(), e), e);
  }

  work deliver_to(const envelope& e) const {
    switch (e.to.role) {
      case role::coordinator: return {node_ref::coord(), coordinator_event{message_event{e}}};
      case role::owner: return {node_ref::own(e.to.index), owner_event{message_event{e}}};
      case role::receiver: return {node_ref::recv(e.to.index), receiver_event{message_event{e}}};
    }
    return {};
  }

  /// Receiver r's attestation of region contents `c`: {v, r+1} when every region holds v's first
  /// change set (flavor 0), else a digest of the contents (any garbage: 0xbad).
  static digest128 attestation_of(const std::vector<region_t>& c, std::uint32_t r) {
    bool uniform = true;
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (region_t x : c) {
      if (x == garbage) return digest128{0xbadu, r + 1u};
      uniform &= x == c.front() && flavor_of(x) == 0;
      h = (h ^ std::uint64_t(x)) * 0x100000001b3ull;
    }
    return uniform ? digest128{version_of(c.front()), r + 1u} : digest128{h | (std::uint64_t(1) << 63), r + 1u};
  }
  digest128 attest(std::uint32_t r) const {
    const auto b = regions.begin() + std::ptrdiff_t(r) * regions_per_receiver();
    return attestation_of(std::vector<region_t>(b, b + regions_per_receiver()), r);
  }
  /// Every region's content once the change sets of `flavor` (per owner) for K.v+1 are applied to K.v.
  std::vector<region_t> contents_after(version_t target, const std::vector<std::uint32_t>& flavor) const {
    std::vector<region_t> c = truth.at(target - 1);
    const std::uint32_t n = config.chunks_per_owner;
    for (std::uint32_t o = 0; o < owners.size(); ++o)
      for (std::uint32_t seq = 0; seq < n; ++seq)
        if (changes(flavor[o], seq, n)) c[o * n + seq] = content_of(target, flavor[o]);
    return c;
  }
  /// Expected attestations of K.v+1: the trainer's current bits of it, applied to K.v.
  std::vector<digest128> expected_for(version_t target) const {
    const auto c = contents_after(target, std::vector<std::uint32_t>(owners.size(), trainer_flavor));
    std::vector<digest128> e;
    for (std::uint32_t r = 0; r < config.protocol.receivers; ++r) e.push_back(attestation_of(c, r));
    return e;
  }

  /// The sender process (coordinator and every owner, one process in the engine) dies and a new one
  /// starts from what is durable: the commit log and each owner's baseline store (`variant`: the
  /// frozen images as they were, lost, or replaced by other bits of the same version). The trainer
  /// has moved on meanwhile (its bits of K.v+1 differ from the frozen ones). The old coordinator's
  /// pending log requests may still land (fenced once the new one claimed).
  void restart_sender(std::uint32_t variant, std::vector<work>& q) {
    const bool drop_images = variant == 1 || (broken(mut(), protocol_mutation::refreeze_at_restart) && frozen_can_vanish());
    for (auto& st : stores) {
      if (!st.frozen || st.frozen->target <= log.state.record.version) continue;
      if (drop_images) st.frozen.reset();
      else if (variant == 2) st.frozen->flavor = (st.frozen->flavor + 1) % flavors;
    }
    trainer_flavor = std::min(trainer_flavor + 1, flavors - 1);
    max_epoch = std::max(max_epoch, coord.epoch) + 1;
    coord = coordinator_t(config.protocol, max_epoch, {}, commit_record{}, mut());
    coord_deadline = false;
    stuck = false;
    const attempt_id newest = log.state.prepared ? log.state.prepared->attempt : attempt_id{};
    for (std::uint32_t o = 0; o < owners.size(); ++o) {
      std::optional<typename owner_t::durable_frozen> f;
      if (const auto& img = stores[o].frozen)
        f = typename owner_t::durable_frozen{img->target, frozen_identity(o, img->target, img->flavor), img->frozen_at};
      owners[o] = owner_t::restarted(o, stores[o].baseline, f, newest, max_epoch, mut());
    }
    q.push_back({node_ref::coord(), coordinator_event{start_event{}}});
  }

  log_reply apply_log(const log_request& req) {
    const log_snapshot before = log.state;
    log_reply rep = log.apply(req);
    if (const auto* p = std::get_if<persist_prepare_request>(&req); p && rep.outcome == log_outcome::ok) {
      if (p->record.aborted) {
        if (!std::binary_search(aborts_durable.begin(), aborts_durable.end(), p->record.attempt))
          aborts_durable.insert(std::upper_bound(aborts_durable.begin(), aborts_durable.end(), p->record.attempt),
                                p->record.attempt);
      } else {
        on_prepare_persisted(p->record);
      }
    }
    if (log.state.record != before.record) {
      const auto* cas = std::get_if<compare_and_set_request>(&req);
      on_commit(before, *cas);
    }
    return rep;
  }

  /// Version alignment: when an attempt starts, every member holds exactly K.v (XOR), or K.v and
  /// v+1 only in changed positions (overwrite retry).
  void on_prepare_persisted(const prepare_record& p) {
    attempt_note note{p.attempt, p.target, p.members};
    attempts.insert(std::upper_bound(attempts.begin(), attempts.end(), note), note);
    if (p.base != log.state.record)
      fail("attempt " + fmt::str(p.attempt) + " prepared on base " + fmt::str(p.base) + " but K is " +
           fmt::str(log.state.record));
    for (const auto& mb : p.members) {
      // A prepare names it: a member fenced by an earlier coordinator is readmitted, and every
      // monitor covers it again.
      if (auto f = std::lower_bound(fenced.begin(), fenced.end(), mb); f != fenced.end() && *f == mb) fenced.erase(f);
      if (!live(mb)) continue;
      const auto& base = truth.at(p.base.version);
      for (std::uint32_t i = 0; i < regions_per_receiver(); ++i) {
        region_t v = region(mb.receiver, i);
        bool ok = p.mode == mode::xor_mask ? v == base[i]
                                            : (v == base[i] || (v != garbage && version_of(v) == p.target));
        if (!ok)
          fail("version alignment: attempt " + fmt::str(p.attempt) + " (" + std::string(to_string(p.mode)) +
               ") starts while member " + fmt::str(mb) + " region " + std::to_string(i) + " holds " + region_name(v) +
               ", K.v is v" + std::to_string(p.base.version));
      }
    }
  }

  /// K changed: only by compare-and-set from the previous K, from the current epoch, by one version,
  /// with every member's ack, and every live member holds the new version bit for bit.
  void on_commit(const log_snapshot& before, const compare_and_set_request& cas) {
    const commit_record now = log.state.record;
    if (cas.expected != before.record)
      fail("K written from " + fmt::str(before.record) + " by a request that expected " + fmt::str(cas.expected));
    if (cas.epoch != before.epoch)
      fail("K written by fenced epoch e" + std::to_string(cas.epoch) + " (log epoch e" + std::to_string(before.epoch) + ")");
    if (now.version != before.record.version + 1)
      fail("K version went from v" + std::to_string(before.record.version) + " to v" + std::to_string(now.version));
    auto it = std::find_if(attempts.begin(), attempts.end(), [&](const attempt_note& a) { return a.attempt == cas.attempt; });
    if (it == attempts.end()) {
      fail("K written for attempt " + fmt::str(cas.attempt) + " that was never prepared");
      return;
    }
    if (now.version != before.record.version + 1) return;
    // What K.v+1 is, bit for bit: each owner's durable frozen change set applied to K.v (the owners'
    // next baseline). Every owner must be able to recover it before K names it.
    std::vector<std::uint32_t> flavor(owners.size(), 0);
    for (std::uint32_t o = 0; o < owners.size(); ++o) {
      const auto& st = stores[o];
      if (st.frozen && st.frozen->target == now.version) flavor[o] = st.frozen->flavor;
      else if (st.baseline.version != now.version)
        fail("K became " + fmt::str(now) + " while owner o" + std::to_string(o) + "'s store holds no image of v" +
             std::to_string(now.version));
    }
    truth.resize(now.version + 1);
    truth[now.version] = contents_after(now.version, flavor);
    for (const auto& mb : it->members) {
      if (!std::binary_search(acks.begin(), acks.end(), std::make_pair(cas.attempt, mb)))
        fail("commit of " + fmt::str(cas.attempt) + " without the ack of member " + fmt::str(mb));
      if (!live(mb)) continue;
      for (std::uint32_t i = 0; i < regions_per_receiver(); ++i)
        if (region(mb.receiver, i) != truth[now.version][i])
          fail("bit-exactness: K became " + fmt::str(now) + " while member " + fmt::str(mb) + " region " +
               std::to_string(i) + " holds " + region_name(region(mb.receiver, i)) + ", K's bits there are " +
               region_name(truth[now.version][i]));
    }
  }

  static std::string primes(std::uint32_t flavor) { return std::string(flavor, '\''); }

  static std::string region_name(region_t v) {
    return v == garbage ? "garbage" : "v" + std::to_string(version_of(v)) + primes(flavor_of(v));
  }

  bool live(const member& mb) const {
    const auto& r = receivers.at(mb.receiver);
    return r && r->incarnation == mb.incarnation &&
           !std::binary_search(fenced.begin(), fenced.end(), mb);
  }

  void complete_write(std::uint32_t r, std::uint32_t j, std::vector<work>& q, std::vector<std::string>* trace) {
    pending_write w = device[r].at(j);
    device[r].erase(device[r].begin() + j);
    const std::uint32_t idx = w.id.owner * config.chunks_per_owner + w.id.seq;
    region_t& v = regions[std::size_t(r) * regions_per_receiver() + idx];
    const region_t before = v;
    // A chunk its change set does not change carries no position: overwrite writes nothing, an XOR
    // mask of zeros leaves any content as it is.
    if (changes(w.flavor, w.id.seq, config.chunks_per_owner)) {
      if (w.mode == mode::overwrite) v = content_of(w.target, w.flavor);
      else v = (w.base < truth.size() && v == truth[w.base][idx]) ? content_of(w.target, w.flavor) : garbage;
    }
    if (trace) trace->push_back("r" + std::to_string(r) + ": region " + std::to_string(idx) + " " + region_name(before) +
                                " -> " + region_name(v));
    if (v == garbage)
      fail("XOR of payload " + fmt::str(w.id) + " (v" + std::to_string(w.base) + "->v" + std::to_string(w.target) +
           ") applied on receiver r" + std::to_string(r) + " region " + std::to_string(idx) + " holding " +
           region_name(before));
    const member mb{r, w.incarnation};
    if (std::binary_search(stopped.begin(), stopped.end(), w.id.attempt) &&
        !std::binary_search(fenced.begin(), fenced.end(), mb))
      fail("write of payload " + fmt::str(w.id) + " on " + fmt::str(mb) + " after stop_and_wait of its attempt");
    // Also on an incarnation that was fenced and readmitted: nothing of an older attempt lands once
    // the receiver is in a newer one.
    if (const auto& rc = receivers[r]; rc && rc->attempt && rc->attempt->attempt > w.id.attempt)
      fail("write of payload " + fmt::str(w.id) + " on " + fmt::str(mb) + " after it was admitted to " +
           fmt::str(rc->attempt->attempt));
    maybe_synced(r, q);
  }

  void maybe_synced(std::uint32_t r, std::vector<work>& q) {
    if (sync_waiting[r] && device[r].empty()) {
      sync_waiting[r] = 0;
      q.push_back({node_ref::recv(r), receiver_event{device_synced_event{attest(r)}}});
    }
  }

  // ---- run the local work queue to completion
  // ---- the world's side of protocol::drive: the Effects of every role --------------------------
  //
  // Nothing here looks at an action: protocol::drive (driver.hpp) turns each one into one of these
  // operations, exactly as it does for the engine. Local completions go back onto the work queue
  // `q` (processed in FIFO order after the current step), never into the machine directly.
  struct effects {
    basic_cluster& w;
    std::vector<work>& q;
    std::vector<std::string>* trace;
    commit_record owner_before{};  // the stepped owner's baseline before its step (monitor)

    template <class Event, class Actions>
    void on_step(const endpoint& self, const Event& ev, const Actions& actions) {
      if (!trace) return;
      const std::string who = fmt::str(self);
      // Messages are shown by the move that delivered them; owners' local events are implied.
      if constexpr (!std::is_same_v<Event, owner_event>)
        if (!std::holds_alternative<message_event>(ev)) trace->push_back(who + " <- " + fmt::str(ev));
      for (const auto& a : actions) trace->push_back(who + ": " + fmt::str(a));
    }

    // -- every role
    void send(const endpoint& self, const envelope& env) {
      if (self.role == role::receiver)
        if (const auto* ack = std::get_if<ack_msg>(&env.msg)) {  // monitor: acks sent
          auto p = std::make_pair(ack->attempt, ack->from);
          if (!std::binary_search(w.acks.begin(), w.acks.end(), p)) w.acks.insert(std::upper_bound(w.acks.begin(), w.acks.end(), p), p);
        }
      w.insert_inflight(env);
    }
    void arm_deadline(const endpoint& self) { w.set_deadline(self, true); }
    void disarm_deadline(const endpoint& self) { w.set_deadline(self, false); }
    /// Deadlines are moves here: the checker fires them at every quiet point (and early, with the
    /// early-deadline budget), which covers every extension a wall-clock timer would make.
    void progress(const endpoint&) {}

    // -- coordinator
    void ask_log(const endpoint&, const log_request& req) {
      pending_log p{req, w.coord.epoch};
      w.log_queue.insert(std::upper_bound(w.log_queue.begin(), w.log_queue.end(), p), p);
    }
    void fence(const endpoint&, const member& m) {
      w.fenced.insert(std::upper_bound(w.fenced.begin(), w.fenced.end(), m), m);
    }
    void cleanup(const endpoint&, const attempt_id& a) {
      if (!std::binary_search(w.stopped.begin(), w.stopped.end(), a))
        w.stopped.insert(std::upper_bound(w.stopped.begin(), w.stopped.end(), a), a);
    }
    void committed(const endpoint&, const commit_record&) {}
    void deposed(const endpoint&) {}
    void aborted(const endpoint&, const attempt_id&) {}
    void needs_operator(const endpoint&, const std::string&) { w.stuck = true; }

    // -- owners
    /// Monitors: never ahead of K, and only forward (K.v's durable image is written once, B3).
    void advance_baseline(const endpoint& self, const commit_record& k) {
      if (k.version > w.log.state.record.version)
        w.fail("owner o" + std::to_string(self.index) + " advanced its baseline to " + fmt::str(k) +
               " before the commit record (K is " + fmt::str(w.log.state.record) + ")");
      if (k.version <= owner_before.version)
        w.fail("owner o" + std::to_string(self.index) + " advanced its baseline from " + fmt::str(owner_before) + " to " +
               fmt::str(k) + ": not forward");
      auto& st = w.stores[self.index];  // the frozen image becomes B (older images are dropped)
      st.baseline = k;
      if (st.frozen && st.frozen->target <= k.version) st.frozen.reset();
    }
    /// Monitor: only a target above the baseline is frozen; a stale prepare must not freeze "v+1" out
    /// of the trainer's current bits (finding B3).
    void freeze_change_set(const endpoint& self, const freeze_change_set_action& f) {
      if (f.target <= f.base)
        w.fail("owner o" + std::to_string(self.index) + " froze a change set v" + std::to_string(f.base) + "->v" +
               std::to_string(f.target) + ": its target is not above its baseline");
      // The trainer's current bits of the target, made durable (a retry must never get here,
      // finding B1). They must be the bits the prepare names: freezing newer ones under the old
      // identity makes every retry deliver bits other than the admitted ones (finding H1).
      if (f.identity != digest128{} && f.identity != frozen_identity(self.index, f.target, w.trainer_flavor))
        w.fail("owner o" + std::to_string(self.index) + " froze the trainer's current bits of v" + std::to_string(f.target) +
               ", not the ones its prepare names");
      w.stores[self.index].frozen = owner_store::frozen_image{f.target, w.trainer_flavor, w.owners[self.index].frozen_at};
    }
    /// Every chunk at once, in seq order, then encode_finished; zero chunks when the delta base
    /// already is the target. A chunk's content names (owner, seq, target, mode, base).
    void encode(const endpoint& self, const encode_action& x) {
      const std::uint32_t o = self.index;
      const std::uint32_t n = x.base == x.target ? 0 : w.config.chunks_per_owner;
      const auto& img = w.stores[o].frozen;  // the bits the chunks carry: the durable frozen set's
      const std::uint64_t flavor = img && img->target == x.target ? img->flavor : 0;
      for (std::uint32_t s = 0; s < n; ++s) {
        const bool overwrite_only = s + w.config.overwrite_chunks >= n;
        const mode m = x.mode == mode::xor_mask && !overwrite_only ? mode::xor_mask : mode::overwrite;
        digest128 content{(std::uint64_t(o) << 16 | s) + 1,
                          (x.target << 8) | (m == mode::xor_mask ? 1u : 2u) | (x.base << 32) | (flavor << 60)};
        q.push_back({node_ref::own(o), owner_event{chunk_encoded_event{x.attempt, s, content, m}}});
      }
      q.push_back({node_ref::own(o), owner_event{encode_finished_event{x.attempt, n}}});
    }
    void cancel_encoding(const endpoint&, const attempt_id&) {}  // encoding completes at once here

    // -- receivers
    void persist_incarnation(const endpoint& self, std::uint64_t inc) {
      w.incarnations[self.index] = std::max(w.incarnations[self.index], inc);
    }
    void close_gate(const endpoint&) {}
    void open_gate(const endpoint&, bool) {}
    void drain_requests(const endpoint& self) { q.push_back({node_ref::recv(self.index), receiver_event{drained_event{}}}); }
    void stage_payload(const endpoint&, const payload_id&) {}
    void apply_payload(const endpoint& self, const apply_payload_action& x) {
      const std::uint32_t r = self.index;
      pending_write pw{x.id, x.mode, x.base, x.target, 0, w.receivers[r]->incarnation};
      if (const auto& a = w.receivers[r]->attempt)  // the content of the copy it holds says which bits
        for (const auto& c : a->chunks)
          if (c.owner == x.id.owner && c.seq == x.id.seq) pw.flavor = std::uint32_t(c.content.high64 >> 60) % flavors;
      auto& d = w.device[r];
      if (w.config.ordered_device) d.push_back(pw);
      else d.insert(std::upper_bound(d.begin(), d.end(), pw), pw);
    }
    void discard_staged(const endpoint&, const attempt_id&) {}
    void sync_device(const endpoint& self, bool) {
      w.sync_waiting[self.index] = 1;
      w.maybe_synced(self.index, q);
    }
    void read_commit(const endpoint& self) {
      q.push_back({node_ref::recv(self.index), receiver_event{commit_read_event{w.log.state.record, w.log.state.epoch}}});
    }
    void dense_restore(const endpoint& self, const commit_record& k) {
      const std::uint32_t r = self.index;
      while (!w.device[r].empty()) w.complete_write(r, 0, q, trace);  // waits for issued applies first
      w.sync_waiting[r] = 0;
      for (std::uint32_t i = 0; i < w.regions_per_receiver(); ++i)
        w.regions[std::size_t(r) * w.regions_per_receiver() + i] = w.truth.at(k.version)[i];
      q.push_back({node_ref::recv(r), receiver_event{restored_event{k}}});
    }
  };
  static_assert(Effects<effects>);

  /// A receiver enters `aborted` only on an abort the log holds: an abort is a decision like a
  /// commit, fenced by the coordinator's epoch (finding B6).
  void monitor_receiver_step(std::uint32_t r, receiver_phase before, const receiver_event& ev) {
    if (before == receiver_phase::aborted || receivers[r]->phase != receiver_phase::aborted) return;
    const auto* me = std::get_if<message_event>(&ev);
    const auto* ab = me ? std::get_if<abort_msg>(&me->env.msg) : nullptr;
    if (!ab || !std::binary_search(aborts_durable.begin(), aborts_durable.end(), ab->attempt))
      fail("receiver r" + std::to_string(r) + " aborted " + (ab ? fmt::str(ab->attempt) : std::string("?")) +
           " on an abort the commit log does not hold");
  }

  void set_deadline(const endpoint& e, bool armed) {
    if (e.role == role::coordinator) coord_deadline = armed;
    else receiver_deadline.at(e.index) = armed;
  }

  // ---- run the local work queue to completion, every step through protocol::drive
  void run(std::vector<work> q, std::vector<std::string>* trace) {
    for (std::size_t k = 0; k < q.size(); ++k) {
      work w = q[k];  // copy: q may grow
      effects fx{*this, q, trace};
      if (w.node.kind == role::coordinator) {
        drive(coord, std::get<coordinator_event>(w.ev), fx);
      } else if (w.node.kind == role::owner) {
        auto& o = owners.at(w.node.index);
        fx.owner_before = o.baseline;
        drive(o, std::get<owner_event>(w.ev), fx);
      } else {
        auto& slot = receivers.at(w.node.index);
        if (!slot) continue;  // delivered to a dead process: lost
        const receiver_phase before = slot->phase;
        const auto& ev = std::get<receiver_event>(w.ev);
        drive(*slot, ev, fx);
        if (slot) monitor_receiver_step(w.node.index, before, ev);
      }
    }
  }
};

/// A fault-free, fair scheduler's next move: complete log requests, then device applies, then
/// deliver messages (control before data: lowest message kind first, in canonical order), then
/// restart crashed receivers, then fire deadlines (only possible once the world is quiet).
/// Used for "a transition ends once faults stop" and by scenario `settle` / `run`.
template <class Mut>
std::optional<move> fair_move(const basic_cluster<Mut>& w, bool with_deadlines = true, bool with_log = true) {
  std::optional<move> best;
  std::size_t best_rank = ~std::size_t{0};
  for (const auto& m : w.enabled_moves()) {
    std::size_t rank;
    switch (m.kind) {
      case move_kind::log_ok: rank = with_log ? 0 : ~std::size_t{0}; break;
      case move_kind::device: rank = 1; break;
      case move_kind::deliver: rank = 10 + w.inflight[m.index].msg.index(); break;
      case move_kind::restart: rank = 100; break;
      case move_kind::begin: rank = 150; break;
      case move_kind::deadline: {
        rank = with_deadlines ? 200 + m.index : ~std::size_t{0};
        if (rank < best_rank) {  // a timer that fires into the same state (a receiver re-reading K) is no progress
          basic_cluster<Mut> after = w;
          after.apply(m);
          if (after == w) rank = ~std::size_t{0};
        }
        break;
      }
      default: rank = ~std::size_t{0};
    }
    if (rank < best_rank && rank != ~std::size_t{0}) { best_rank = rank; best = m; }
  }
  return best;
}

/// The shipped protocol's world, and the world whose machines take a mutation chosen at run time.
using cluster = basic_cluster<no_mutation>;
using mutated_cluster = basic_cluster<runtime_mutation>;

BITREFIT_FIELDS(pending_write, id, mode, base, target, flavor, incarnation)
BITREFIT_FIELDS(pending_log, request, epoch)
BITREFIT_FIELDS(attempt_note, attempt, target, members)
BITREFIT_FIELDS(owner_frozen_image, target, flavor, frozen_at)
BITREFIT_FIELDS(owner_store, baseline, frozen)
BITREFIT_FIELDS(fault_budget, drops, duplicates, corruptions, conflicts, crashes, failovers, log_faults, early_deadlines, aborts,
                owner_crashes, sender_restarts)
BITREFIT_FIELDS(world_config, protocol, mutation, chunks_per_owner, overwrite_chunks, transitions, xor_allowed, ordered_device,
                drops, duplicates, corruptions, conflicts, crashes, owner_crashes, failovers, log_faults, early_deadlines, aborts,
                sender_restarts)
BITREFIT_FIELDS_T(template <class M>, basic_cluster<M>, config, log, coord, owners, receivers, incarnations, stores,
                  trainer_flavor, truth, regions, device, sync_waiting, inflight, log_queue, coord_deadline, receiver_deadline,
                  budget, max_epoch, attempts, acks, stopped, fenced, aborts_durable, violation, stuck)

}  // namespace bitrefit::protocol::model

namespace bitrefit::protocol::detail {
inline void hash_append(hasher& h, const std::pair<attempt_id, member>& p) {
  hash_append(h, p.first);
  hash_append(h, p.second);
}
}  // namespace bitrefit::protocol::detail

template <class M>
struct std::hash<bitrefit::protocol::model::basic_cluster<M>> {
  std::size_t operator()(const bitrefit::protocol::model::basic_cluster<M>& c) const { return bitrefit::protocol::hash_of(c); }
};
