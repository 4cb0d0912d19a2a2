// bitrefit_proofs/random_schedules.hpp — a randomised long-run harness over the REAL protocol machines.
//
// The exhaustive checker (checker.hpp) holds every interleaving of small worlds (2 receivers, 1–2
// owners, 1–2 transitions). This harness trades completeness for reach: millions of random schedules
// over bigger worlds (3–5 receivers, 2–3 owners, 3–4 transitions by default) with every fault kind
// the world has, through the SAME world the checker explores (basic_cluster_world over
// model::basic_cluster: the coordinator, owners, receivers and commit log the engine runs).
//
// One schedule (deterministic given (seed, index)):
//   1. draw a world: sizes, gate policy and a small budget per fault kind;
//   2. the fault phase: up to `prefix_moves` random enabled moves under the checker's fault bound (a
//      fault only while the current transition has started fewer than `fault_attempts` attempts, so
//      every later attempt is fault-free: DESIGN's liveness assumption). Unlike the checker, the
//      coordinator retries forever by default (max_attempts 0, DESIGN's rule): the checker needs
//      max_attempts = 2 to keep its space finite, and with it a receiver that crashed in attempt 1
//      and rejoins during attempt 2 obsoletes the last attempt (proofs/README.md, "Random
//      schedules"). A fault move is chosen with probability `fault_probability` when one is
//      enabled; invariants are checked after every move;
//   3. the settle phase: faults stop; the fair scheduler of the scenario language (model::fair_move,
//      the `run` command) moves until the world settles (model::cluster::settled: K at the last
//      version, every live receiver a member serving K's bits, the roster equal to the live
//      incarnations) or `settle_bound` moves pass — the latter is a liveness failure.
// A failure (invariant violated, or not settled) is shrunk by delta debugging over the move list
// (each candidate replayed on a fresh world, moves matched by their text, moves no longer enabled
// skipped) and rendered as a scenario file of tests/protocol/scenarios (for a liveness failure:
// the fault-phase moves, then `run <settle_bound>` which prints `not settled`).
//
// Threads take schedule indices from a shared counter; the failure reported is the one with the
// lowest index, so it (and its shrink) does not depend on the thread count. Counts are exact sums
// when every schedule runs (no time limit and no failure).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "bitrefit/protocol/model/script.hpp"
#include "bitrefit_proofs/cli_values.hpp"
#include "bitrefit_proofs/cluster_world.hpp"

namespace bitrefit::proofs::fuzz {

/// A small deterministic generator (splitmix64): the same seed gives the same schedules on every
/// platform (std distributions are not specified bit for bit).
struct rng {
  std::uint64_t s;
  explicit rng(std::uint64_t seed) : s(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (n > 0), Lemire's multiply-shift.
  std::uint32_t below(std::uint32_t n) { return std::uint32_t((std::uint64_t(std::uint32_t(next())) * n) >> 32); }
  std::uint32_t between(std::uint32_t lo, std::uint32_t hi) { return lo + below(hi - lo + 1); }
  bool chance(double p) { return double(next() >> 11) * 0x1.0p-53 < p; }
};

/// The seed of schedule `index` of a run with seed `seed`.
inline std::uint64_t schedule_seed(std::uint64_t seed, std::uint64_t index) {
  rng r(seed ^ (index * 0xD1B54A32D192ED03ull));
  return r.next();
}

struct range {
  std::uint32_t lo = 0, hi = 0;
};

/// "N" or "LO-HI" with 1 <= LO <= HI (the command-line form of a range); false for anything else.
inline bool parse_range(const std::string& v, range& r) {
  const auto dash = v.find('-');
  const auto lo = cli::whole_number<std::uint32_t>(std::string_view(v).substr(0, dash));
  const auto hi = dash == std::string::npos ? lo : cli::whole_number<std::uint32_t>(std::string_view(v).substr(dash + 1));
  if (!lo || !hi || *lo < 1 || *lo > *hi) return false;
  r.lo = *lo, r.hi = *hi;
  return true;
}

struct options {
  std::uint64_t seed = 1;
  std::uint64_t schedules = 1000;  // 0: no limit (then a time limit is needed)
  double seconds = 0;              // wall-clock limit (0: none)
  unsigned threads = 1;
  range receivers{3, 5};
  range owners{2, 3};
  range chunks{1, 2};
  range transitions{3, 4};
  /// The coordinator's attempts per transition: 0 retries forever, DESIGN's rule (the checker needs
  /// a bound to keep its space finite; a random schedule does not).
  std::uint32_t max_attempts = 0;
  /// The fault window: a fault is enabled only while fewer than this many attempts of the current
  /// transition have started (the checker's bound with max_attempts = 2), so from then on delivery
  /// is reliable and members stable — DESIGN's liveness assumption.
  std::uint32_t fault_attempts = 2;
  /// Faults only once K is at the last version (the checker's cluster_bounds::
  /// faults_after_last_commit): the whole budget goes to membership after the transitions (crashes,
  /// takeovers, lost joins; findings B7, B7b), which the default runs, spending their faults in the
  /// first transition, rarely reach.
  bool faults_after_last_commit = false;
  double attest_off_probability = 0.5;  // worlds without attestation: wrong bits commit (monitors see them)
  std::uint32_t max_faults_per_kind = 1;  // each kind's budget is drawn from [0, this]
  std::uint32_t prefix_moves = 600;       // the fault phase is [0, this] moves long
  double fault_probability = 0.15;        // chance to pick a fault when one is enabled
  std::uint32_t settle_bound = 2000;      // fair moves allowed to settle once faults stop (the most
                                          // a settling schedule needed in the first 2 000: 437)
  protocol::protocol_mutation mutation = protocol::protocol_mutation::none;
  bool async_gate = true;                 // also draw gate=async worlds
  /// The fault kinds drawn (bit i: fault kind i of `fault`, the sender-restart variants share
  /// sender_restart's bit); default every kind. Narrower sets fit smaller models (spin_trace).
  std::uint32_t fault_kinds = ~0u;
  bool shrink = true;
  /// Keep going after a failure: count failures by class (kind + message with numbers masked) and
  /// keep the lowest-index failure of each class (up to `max_classes`), each shrunk. Off: stop at
  /// the first failure.
  bool keep_going = false;
  std::size_t max_classes = 8;
  std::uint32_t shrink_replays = 4000;    // replay budget of delta debugging
  double progress_seconds = 10;           // progress line interval (0: none)
  std::function<void(const std::string&)> progress;  // receives progress lines
};

/// Fault kinds the harness counts (the moves that consume a fault budget).
enum class fault : std::uint8_t {
  drop, duplicate, corrupt, conflict, receiver_crash, owner_crash, sender_restart, sender_restart_frozen_lost,
  sender_restart_frozen_replaced, failover, log_failed, log_unknown_applied, log_unknown_lost, early_deadline, abort,
  count_
};
inline constexpr const char* fault_names[] = {
    "drop", "duplicate", "corrupt", "conflict", "receiver_crash", "owner_crash", "sender_restart",
    "sender_restart_frozen_lost", "sender_restart_frozen_replaced", "failover", "log_failed",
    "log_unknown_applied", "log_unknown_lost", "early_deadline", "operator_abort"};
static_assert(std::size(fault_names) == std::size_t(fault::count_));

/// The fault `m` is in world `w` (before it is applied), if it is one.
template <class W>
std::optional<fault> fault_of(const W& w, const protocol::model::move& m) {
  using protocol::model::move_kind;
  switch (m.kind) {
    case move_kind::drop: return fault::drop;
    case move_kind::duplicate: return fault::duplicate;
    case move_kind::corrupt: return fault::corrupt;
    case move_kind::conflict: return fault::conflict;
    case move_kind::crash: return fault::receiver_crash;
    case move_kind::owner_crash: return fault::owner_crash;
    case move_kind::sender_restart:
      return m.sub == 0 ? fault::sender_restart : m.sub == 1 ? fault::sender_restart_frozen_lost
                                                             : fault::sender_restart_frozen_replaced;
    case move_kind::failover: return fault::failover;
    case move_kind::log_failed: return fault::log_failed;
    case move_kind::log_unknown_applied: return fault::log_unknown_applied;
    case move_kind::log_unknown_lost: return fault::log_unknown_lost;
    case move_kind::abort: return fault::abort;
    case move_kind::deadline:
      if (!w.quiet()) return fault::early_deadline;
      return std::nullopt;
    default: return std::nullopt;
  }
}

/// `m` drops the join of a live receiver's incarnation while it waits to be confirmed (finding B2's
/// point: the receiver must join again, or the roster keeps its dead incarnation for ever).
template <class W>
bool drops_a_live_join(const W& w, const protocol::model::move& m) {
  if (m.kind != protocol::model::move_kind::drop) return false;
  const auto* jn = std::get_if<protocol::join_msg>(&w.inflight.at(m.index).msg);
  if (!jn) return false;
  const auto& rx = w.receivers.at(jn->from.receiver);
  return rx && rx->incarnation == jn->from.incarnation && rx->phase == protocol::receiver_phase::joining;
}

/// A distinct-state estimate (HyperLogLog, 2^12 registers: about 1.6 % standard error) over the
/// worlds' 64-bit fingerprints: "states touched" without keeping the states.
struct distinct_estimate {
  static constexpr unsigned bits = 12;
  std::vector<std::uint8_t> reg = std::vector<std::uint8_t>(1u << bits, 0);
  void add(std::uint64_t h) {
    h *= 0x9E3779B97F4A7C15ull;  // spread: std::hash of the world need not be uniform in its top bits
    h ^= h >> 29;
    const std::uint32_t i = std::uint32_t(h >> (64 - bits));
    const std::uint8_t rank = std::uint8_t(std::countl_zero((h << bits) | (1ull << (bits - 1))) + 1);
    reg[i] = std::max(reg[i], rank);
  }
  void merge(const distinct_estimate& o) {
    for (std::size_t i = 0; i < reg.size(); ++i) reg[i] = std::max(reg[i], o.reg[i]);
  }
  double estimate() const {
    const double m = double(reg.size());
    double sum = 0;
    std::size_t zeros = 0;
    for (auto r : reg) {
      sum += std::ldexp(1.0, -int(r));
      zeros += r == 0;
    }
    const double e = 0.7213 / (1 + 1.079 / m) * m * m / sum;
    if (e <= 2.5 * m && zeros) return m * std::log(m / double(zeros));  // linear counting
    return e;
  }
};

struct stats {
  std::uint64_t schedules = 0;
  std::uint64_t moves = 0;          // every move applied (both phases)
  std::uint64_t fault_moves = 0;
  std::uint64_t settle_moves = 0;   // moves of the settle phase
  std::uint64_t states_touched = 0; // states visited (initial + one per move), with repeats
  std::uint64_t settled = 0;        // schedules whose world settled within the bound
  std::uint64_t max_settle_moves = 0;  // the most fair moves a schedule that settled needed
  std::uint64_t transitions_committed = 0;  // K.v reached, summed
  std::uint64_t faults[std::size_t(fault::count_)] = {};
  std::uint64_t live_joins_dropped = 0;  // drops that lost a live receiver's join (drops_a_live_join)
  std::uint64_t by_receivers[6] = {};  // schedules per receiver count (index = receivers, capped at 5)
  distinct_estimate distinct;
  void merge(const stats& o) {
    schedules += o.schedules;
    moves += o.moves;
    fault_moves += o.fault_moves;
    settle_moves += o.settle_moves;
    states_touched += o.states_touched;
    settled += o.settled;
    max_settle_moves = std::max(max_settle_moves, o.max_settle_moves);
    transitions_committed += o.transitions_committed;
    for (std::size_t i = 0; i < std::size(faults); ++i) faults[i] += o.faults[i];
    live_joins_dropped += o.live_joins_dropped;
    for (std::size_t i = 0; i < std::size(by_receivers); ++i) by_receivers[i] += o.by_receivers[i];
    distinct.merge(o.distinct);
  }
};

enum class failure_kind { safety, liveness };
inline const char* to_string(failure_kind k) { return k == failure_kind::safety ? "safety" : "liveness"; }

struct failure {
  failure_kind kind = failure_kind::safety;
  std::uint64_t index = 0;        // schedule index
  std::string message;            // the violated invariant, or why the world is not settled
  protocol::model::world_config config;
  std::vector<std::string> moves;         // as found: texts (safety: every move; liveness: fault phase)
  std::vector<std::string> shrunk;        // after delta debugging
  std::uint32_t replays = 0;              // replays spent shrinking
  std::string scenario;                   // the shrunk schedule as a scenario file
};

/// A failure's class: its kind and message with every number masked ("attempt 2.1" and "attempt
/// 3.1" are one class).
inline std::string failure_class(failure_kind k, const std::string& msg) {
  std::string s = std::string(to_string(k)) + ": ";
  for (char c : msg)
    if (c >= '0' && c <= '9') {
      if (s.back() != '#') s += '#';
    } else {
      s += c;
    }
  return s;
}

struct failure_class_count {
  std::string signature;
  std::uint64_t count = 0;
  failure first;  // the lowest schedule index of the class, shrunk
};

struct result {
  stats totals;
  std::optional<failure> first_failure;           // the lowest-index failure, shrunk
  std::vector<failure_class_count> classes;       // keep_going: every class seen (first one shrunk)
  std::uint64_t failures = 0;
  double seconds = 0;
  bool time_limited = false;
};

/// The moves a schedule may take in `w`: every enabled move, faults only inside the fault window
/// (fewer than `o.fault_attempts` attempts of the current transition; with
/// `o.faults_after_last_commit`, only once K is at the last version).
template <class W>
std::vector<protocol::model::move> allowed_moves(const W& w, const options& o) {
  auto all = w.enabled_moves();
  if (inside_fault_window(w, o.fault_attempts, o.faults_after_last_commit)) return all;
  std::erase_if(all, [&](const protocol::model::move& m) { return fault_of(w, m).has_value(); });
  return all;
}

/// The fair scheduler's verdict after the fault phase: settled within `bound` moves, or why not.
template <class W>
std::optional<std::string> settle(W& w, std::uint32_t bound, std::uint64_t* moves = nullptr,
                                  std::vector<std::string>* violation = nullptr) {
  for (std::uint32_t k = 0; k < bound; ++k) {  // the fair scheduler's moves are never faults
    if (w.settled()) return std::nullopt;
    auto m = protocol::model::fair_move(w);
    if (!m) break;
    w.apply(*m);
    if (moves) ++*moves;
    if (auto v = w.check_invariants()) {
      if (violation) violation->push_back(*v);
      return "VIOLATION: " + *v;
    }
  }
  if (w.settled()) return std::nullopt;
  std::string why = "not settled after " + std::to_string(bound) + " fair moves: ";
  if (w.stuck) why += "the coordinator needs an operator; ";
  if (!w.transition_done()) why += "K is " + protocol::fmt::str(w.log.state.record) + " (goal v" + std::to_string(w.config.transitions) + ")";
  else if (!w.quiet()) why += "something is still in flight";
  else if (auto s = w.roster_stale()) why += *s;
  else if (auto s = w.stale_region()) why += *s;
  else why += "a live receiver is not serving K with its gate open";
  return why;
}

/// Draw the world of one schedule.
inline protocol::model::world_config draw_world(rng& g, const options& o) {
  cluster_bounds b;
  b.receivers = g.between(o.receivers.lo, o.receivers.hi);
  b.owners = g.between(o.owners.lo, o.owners.hi);
  b.chunks = g.between(o.chunks.lo, o.chunks.hi);
  b.transitions = g.between(o.transitions.lo, o.transitions.hi);
  b.max_attempts = o.max_attempts;
  b.attest = !g.chance(o.attest_off_probability);
  b.gate = o.async_gate && g.chance(0.25) ? protocol::gate_policy::asynchronous : protocol::gate_policy::synchronous;
  b.mutation = o.mutation;
  const std::uint32_t k = o.max_faults_per_kind;
  auto budget = [&](fault f) {
    const std::uint32_t n = g.between(0, k);  // drawn either way: the same seed gives the same sizes
    return (o.fault_kinds >> unsigned(f)) & 1u ? n : 0u;
  };
  b.drops = budget(fault::drop);
  b.duplicates = budget(fault::duplicate);
  b.corruptions = budget(fault::corrupt);
  b.conflicts = budget(fault::conflict);
  b.crashes = budget(fault::receiver_crash);
  b.owner_crashes = budget(fault::owner_crash);
  b.sender_restarts = budget(fault::sender_restart);
  b.failovers = budget(fault::failover);
  b.log_faults = budget(fault::log_failed);
  b.early_deadlines = budget(fault::early_deadline);
  b.aborts = budget(fault::abort);
  return b.world();  // the checker's world for these bounds (max_attempts 0 included: retry forever)
}

/// One schedule: returns a failure (without shrinking) or nullopt; adds to `st`.
template <class W>
std::optional<failure> run_schedule(const options& o, std::uint64_t index, stats& st,
                                    std::string* as_scenario = nullptr) {
  using protocol::model::move;
  rng g(schedule_seed(o.seed, index));
  const protocol::model::world_config cfg = draw_world(g, o);
  W w(cfg);
  ++st.schedules;
  ++st.by_receivers[std::min<std::uint32_t>(cfg.protocol.receivers, 5)];
  ++st.states_touched;
  st.distinct.add(protocol::hash_of(w));
  std::vector<move> path;
  auto fail = [&](failure_kind k, std::string msg) {
    failure f;
    f.kind = k;
    f.index = index;
    f.message = std::move(msg);
    f.config = cfg;
    W again(cfg);  // replay to get the texts of the moves (indices are only valid state by state)
    for (const auto& m : path) {
      f.moves.push_back(again.describe(m));
      again.apply(m);
    }
    return f;
  };
  const std::uint32_t prefix = g.between(0, o.prefix_moves);
  std::vector<move> faults, normal;
  for (std::uint32_t step = 0; step < prefix; ++step) {
    const auto all = allowed_moves(w, o);
    if (all.empty()) break;
    faults.clear();
    normal.clear();
    for (const auto& m : all) (fault_of(w, m) ? faults : normal).push_back(m);
    if (faults.empty() && w.settled()) break;  // nothing left to disturb
    const bool pick_fault = !faults.empty() && (normal.empty() || g.chance(o.fault_probability));
    const move m = pick_fault ? faults[g.below(std::uint32_t(faults.size()))] : normal[g.below(std::uint32_t(normal.size()))];
    if (auto f = fault_of(w, m)) {
      ++st.faults[std::size_t(*f)];
      ++st.fault_moves;
      st.live_joins_dropped += drops_a_live_join(w, m);
    }
    path.push_back(m);
    w.apply(m);
    ++st.moves;
    ++st.states_touched;
    st.distinct.add(protocol::hash_of(w));
    if (auto v = w.check_invariants()) return fail(failure_kind::safety, *v);
  }
  // Settle phase: the fair scheduler, no faults. A violation here is a safety failure whose path is
  // the whole schedule; not settling is a liveness failure of the fault phase's path.
  const std::vector<move> fault_phase = path;
  std::uint64_t n = 0;
  std::optional<std::string> why;
  for (;; ++n) {
    if (w.settled()) break;
    if (n >= o.settle_bound) { why = "bound"; break; }
    auto m = protocol::model::fair_move(w);
    if (!m) { why = "no move"; break; }
    path.push_back(*m);
    w.apply(*m);
    ++st.moves;
    ++st.states_touched;
    st.distinct.add(protocol::hash_of(w));
    if (auto v = w.check_invariants()) return fail(failure_kind::safety, *v);
  }
  st.settle_moves += n;
  st.transitions_committed += w.log.state.record.version;
  if (!why) {
    ++st.settled;
    st.max_settle_moves = std::max<std::uint64_t>(st.max_settle_moves, n);
    if (as_scenario) {  // the whole schedule as scenario commands (outputs left for the reader to fill)
      W again(cfg);
      *as_scenario = protocol::model::world_line(cfg) + "\n----\n\n";
      for (const auto& m : path) {
        *as_scenario += again.describe(m) + "\n----\n\n";
        again.apply(m);
      }
    }
    return std::nullopt;
  }
  path = fault_phase;
  W again(cfg);
  for (const auto& m : path) again.apply(m);
  auto msg = settle(again, o.settle_bound);
  return fail(failure_kind::liveness, msg ? *msg : "not settled");
}

/// Replay `texts` on a fresh world of `b` (moves matched by their exact text among the enabled moves
/// under the checker's fault bound; a move no longer enabled is skipped). Returns the texts applied
/// and whether it fails as `want` does (same kind; a safety failure with the same message).
template <class W>
bool replay_fails(const failure& want, const std::vector<std::string>& texts, const options& o,
                  std::vector<std::string>& applied) {
  applied.clear();
  W w(want.config);
  for (const auto& t : texts) {
    std::optional<protocol::model::move> hit;
    for (const auto& m : allowed_moves(w, o))
      if (w.describe(m) == t) { hit = m; break; }
    if (!hit) continue;
    w.apply(*hit);
    applied.push_back(t);
    if (auto v = w.check_invariants()) return want.kind == failure_kind::safety && *v == want.message;
  }
  if (want.kind == failure_kind::safety) return false;
  std::vector<std::string> violation;
  auto why = settle(w, o.settle_bound, nullptr, &violation);
  return why && violation.empty();
}

/// Delta debugging (Zeller's ddmin) over the move list: the smallest list found (1-minimal within the
/// replay budget) that still fails the same way.
template <class W>
void shrink(failure& f, const options& o) {
  std::vector<std::string> cur = f.moves, applied;
  f.replays = 0;
  auto test = [&](const std::vector<std::string>& cand) {
    ++f.replays;
    if (!replay_fails<W>(f, cand, o, applied)) return false;
    cur = applied;
    return true;
  };
  if (!test(cur)) {  // not reproducible by text replay: keep the original (should not happen)
    f.shrunk = f.moves;
    return;
  }
  std::size_t n = 2;
  while (cur.size() >= 2 && f.replays < o.shrink_replays) {
    const std::size_t len = cur.size();
    const std::size_t chunk = (len + n - 1) / n;
    bool reduced = false;
    for (std::size_t i = 0; i < n && !reduced && f.replays < o.shrink_replays; ++i) {  // complements
      const std::size_t lo = i * chunk, hi = std::min(len, lo + chunk);
      if (lo >= hi) continue;
      std::vector<std::string> cand(cur.begin(), cur.begin() + std::ptrdiff_t(lo));
      cand.insert(cand.end(), cur.begin() + std::ptrdiff_t(hi), cur.end());
      if (test(cand)) {
        n = std::max<std::size_t>(n - 1, 2);
        reduced = true;
      }
    }
    if (reduced) continue;
    if (n >= len) break;
    n = std::min(len, n * 2);
  }
  // The fault phase of a liveness failure may also end with an empty list (the failure needs no
  // fault): try it.
  if (f.kind == failure_kind::liveness && !cur.empty() && f.replays < o.shrink_replays) test({});
  f.shrunk = cur;
}

/// The shrunk failure as a scenario file of tests/protocol/scenarios (outputs included): replayable
/// by the scenario runner (test_protocol) or by hand.
template <class W>
std::string render_scenario(const failure& f, const options& o) {
  protocol::model::basic_script_runner<W> r;
  std::string s = "# Found by proofs/bitrefit-fuzz-protocol (seed " + std::to_string(o.seed) + ", schedule " +
                  std::to_string(f.index) + "), shrunk from " + std::to_string(f.moves.size()) + " to " +
                  std::to_string(f.shrunk.size()) + " moves.\n# " + to_string(f.kind) + ": " + f.message + "\n";
  auto cmd = [&](const std::string& c) { s += c + "\n----\n" + r.run(c) + "\n\n"; };
  cmd(protocol::model::world_line(f.config));
  for (const auto& t : f.shrunk) cmd(t);
  if (f.kind == failure_kind::liveness) {
    cmd("run " + std::to_string(o.settle_bound));
    cmd("state");
  }
  return s;
}

/// A scenario file replayed command by command through the protocol's scenario runner (the format of
/// tests/protocol/scenarios): the commands whose output differs from the recorded one, and the last
/// output. Shared by the harness's `--replay=FILE` and its tests.
struct scenario_replay {
  std::vector<std::string> mismatches;  // "command / want / got" per differing command
  std::string last_output;
  std::size_t commands = 0;
  std::string error;  // a malformed file
};
inline scenario_replay replay_scenario_text(const std::string& text) {
  scenario_replay r;
  protocol::model::script_runner runner;
  std::istringstream in(text);
  std::string line, cmd, expected;
  enum { want_command, want_sep, in_output } st = want_command;
  auto finish = [&] {
    const std::string got = runner.run(cmd);
    if (got != expected) r.mismatches.push_back(cmd + "\n  want: " + expected + "\n  got:  " + got);
    r.last_output = got;
    ++r.commands;
    expected.clear();
  };
  while (std::getline(in, line)) {
    if (st == want_command) {
      if (line.empty() || line[0] == '#') continue;
      cmd = line;
      st = want_sep;
    } else if (st == want_sep) {
      if (line != "----") {
        r.error = "expected ---- after command '" + cmd + "'";
        return r;
      }
      st = in_output;
    } else if (line.empty()) {
      finish();
      st = want_command;
    } else {
      expected += (expected.empty() ? "" : "\n") + line;
    }
  }
  if (st == in_output) finish();
  else if (st == want_sep) r.error = "the file ends after command '" + cmd + "' without ----";
  return r;
}

/// Run the harness. The failure with the lowest schedule index is reported (then shrunk).
template <class W>
result run(const options& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  result res;
  std::atomic<std::uint64_t> next{0};
  std::atomic<std::uint64_t> first_fail{~std::uint64_t{0}};
  std::atomic<bool> out_of_time{false};
  std::mutex mu;
  std::vector<stats> per_thread(std::max(1u, o.threads));
  std::optional<failure> best;
  std::vector<failure_class_count> classes;
  std::uint64_t failures = 0;
  // progress: thread 0 reports the sum of what every thread has published
  std::vector<std::atomic<std::uint64_t>> done_sched(per_thread.size()), done_moves(per_thread.size()),
      done_settled(per_thread.size());
  auto worker = [&](unsigned t) {
    stats& st = per_thread[t];
    double next_report = o.progress_seconds;
    for (;;) {
      const std::uint64_t i = next.fetch_add(1);
      if (o.schedules && i >= o.schedules) break;
      if (i > first_fail.load()) break;
      if (o.seconds > 0 && ((i & 15) == 0 || t == 0) && elapsed() > o.seconds) {
        out_of_time = true;
        break;
      }
      if (out_of_time) break;
      auto f = run_schedule<W>(o, i, st);
      done_sched[t] = st.schedules;
      done_moves[t] = st.moves;
      done_settled[t] = st.settled;
      if (f) {
        std::lock_guard lk(mu);
        ++failures;
        if (o.keep_going) {
          const std::string sig = failure_class(f->kind, f->message);
          auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) { return c.signature == sig; });
          if (it != classes.end()) {
            ++it->count;
            if (f->index < it->first.index) it->first = *f;
          } else if (classes.size() < o.max_classes) {
            classes.push_back({sig, 1, *f});
          }
        }
        if (!best || f->index < best->index) {
          best = std::move(*f);
          if (!o.keep_going) first_fail = best->index;
        }
      }
      if (t == 0 && o.progress && o.progress_seconds > 0 && elapsed() >= next_report) {
        std::uint64_t nf = 0;
        {
          std::lock_guard lk(mu);
          nf = failures;
        }
        std::uint64_t s = 0, m = 0, d = 0;
        for (std::size_t k = 0; k < per_thread.size(); ++k) s += done_sched[k], m += done_moves[k], d += done_settled[k];
        const double e = elapsed();
        char line[256];
        std::snprintf(line, sizeof line, "[fuzz] %.0f s: %llu schedules (%.0f/s), %.2f M moves (%.0f/s), %llu settled, %llu failures",
                      e, (unsigned long long)s, s / e, m / 1e6, m / e, (unsigned long long)d, (unsigned long long)nf);
        o.progress(line);
        next_report = e + o.progress_seconds;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < per_thread.size(); ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  for (const auto& st : per_thread) res.totals.merge(st);
  res.time_limited = out_of_time;
  res.failures = failures;
  std::sort(classes.begin(), classes.end(), [](const auto& a, const auto& b) { return a.first.index < b.first.index; });
  for (auto& c : classes) {
    if (o.shrink) shrink<W>(c.first, o);
    else c.first.shrunk = c.first.moves;
    c.first.scenario = render_scenario<W>(c.first, o);
  }
  res.classes = std::move(classes);
  if (best) {
    if (o.shrink) shrink<W>(*best, o);
    else best->shrunk = best->moves;
    best->scenario = render_scenario<W>(*best, o);
    res.first_failure = std::move(best);
  }
  res.seconds = elapsed();
  return res;
}

}  // namespace bitrefit::proofs::fuzz
