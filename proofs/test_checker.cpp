// Tests of the exhaustive checker (label proofs).
//
// 1. The engine on a toy world whose state graph is known in closed form: exact counts, fingerprint
//    mode agrees with exact mode, a shortest counterexample, a trap found by reverse reachability,
//    a witness.
// 2. The real protocol (model::cluster over the real coordinator/owner/receiver/commit-log machines)
//    under the bounds of proofs/README.md: no violation, the end of the transition reachable from
//    every state, and the unique state / transition / depth counts pinned (a behaviour change in
//    the protocol shows up here as a diff; update the numbers deliberately, with the reason).
// 3. A witness path pinned as a scenario file: commit reached after a receiver crash and an
//    overwrite retry (proofs/witness_crash_overwrite_retry.txt, rewrite with BITREFIT_REWRITE=1).
// 4. Every mutation of the protocol's knob is caught, with a counterexample that replays to the
//    same violation and renders as a scenario whose last output line is the violation.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>

#include "bitrefit_proofs/checker.hpp"
#include "bitrefit_proofs/cluster_world.hpp"
#include "bitrefit_proofs/mutation_cases.hpp"

namespace bitrefit::proofs {
// gtest names a failing row by its mutation (not its bytes).
void PrintTo(const mutation_case& c, std::ostream* os) { *os << protocol::to_string(c.mutation()); }
}  // namespace bitrefit::proofs

namespace {

using namespace bitrefit;
using proofs::check;
using proofs::check_options;
using proofs::cluster_bounds;
using proofs::cluster_world;
using proofs::small_world;
using proofs::verdict;
using M = protocol::protocol_mutation;

// ---- 1. a toy world: two counters a, b in [0, n]; moves inc_a, inc_b; optionally a trap move to
// a sink from which the goal (a == b == n) is unreachable, and an invariant a + b != bad.
struct grid {
  int a = 0, b = 0, n = 3;
  int bad = -1;       // invariant: a + b != bad
  bool trap = false;  // a move from (1, 1) into the sink
  bool sunk = false;
  std::vector<int> enabled_moves() const {
    std::vector<int> m;
    if (sunk) return m;
    if (a < n) m.push_back(0);
    if (b < n) m.push_back(1);
    if (trap && a == 1 && b == 1) m.push_back(2);
    return m;
  }
  void apply(int m) {
    if (m == 0) ++a;
    else if (m == 1) ++b;
    else sunk = true;
  }
  std::optional<std::string> check_invariants() const {
    if (a + b == bad) return "a + b reached " + std::to_string(bad);
    return std::nullopt;
  }
  bool transition_done() const { return a == n && b == n && !sunk; }
  friend bool operator==(const grid&, const grid&) = default;
};

// A ladder whose BFS ids run against its only way to the goal: the start's moves lead to rungs
// 1..n in that order (rung k gets id k), rung k's one move goes down to rung k - 1, and rung 1's to
// the goal (id n + 1). Every path to the goal takes edges to smaller ids, so the liveness sweeps
// (each from the last id to the first) settle one rung per sweep. `cut` (0: none): rung `cut` has
// no move, so it and every rung above it cannot reach the goal.
struct ladder {
  int at = -1;  // -1: the start; 0: the goal; k: rung k
  int n = 5, cut = 0;
  std::vector<int> enabled_moves() const {
    std::vector<int> m;
    if (at == -1)
      for (int k = 1; k <= n; ++k) m.push_back(k);
    else if (at > 0 && at != cut)
      m.push_back(at - 1);
    return m;
  }
  void apply(int m) { at = m; }
  std::optional<std::string> check_invariants() const { return std::nullopt; }
  bool transition_done() const { return at == 0; }
  friend bool operator==(const ladder&, const ladder&) = default;
};

}  // namespace

template <>
struct std::hash<grid> {
  std::size_t operator()(const grid& g) const { return std::size_t(g.a) * 1000003u + std::size_t(g.b) * 7919u + g.sunk; }
};
template <>
struct std::hash<ladder> {
  std::size_t operator()(const ladder& l) const { return std::size_t(l.at + 1) * 1000003u; }
};

namespace {

static_assert(proofs::checkable_world<grid>);
static_assert(proofs::checkable_world<cluster_world>);

TEST(Engine, CountsAStateGraphKnownInClosedForm) {
  for (bool exact : {true, false}) {
    const auto r = check(grid{}, check_options{.liveness = true, .exact = exact});
    ASSERT_TRUE(r.ok()) << r.violation;
    EXPECT_EQ(r.states, 16u);       // (n+1)^2
    EXPECT_EQ(r.transitions, 24u);  // 2 n (n+1)
    EXPECT_EQ(r.depth, 6u);         // 2 n
    EXPECT_EQ(r.goal_states, 1u);
    EXPECT_EQ(r.terminal_states, 1u);
  }
}

TEST(Engine, FindsAShortestCounterexample) {
  const auto r = check(grid{0, 0, 3, 4});
  ASSERT_EQ(r.outcome, verdict::invariant_violated);
  EXPECT_EQ(r.violation, "a + b reached 4");
  EXPECT_EQ(r.counterexample.size(), 4u);
  EXPECT_TRUE(proofs::replay(grid{0, 0, 3, 4}, r.counterexample).check_invariants().has_value());
}

TEST(Engine, ReverseReachabilityFindsATrap) {
  grid g;
  g.trap = true;
  const auto r = check(g);
  ASSERT_EQ(r.outcome, verdict::end_unreachable);
  const grid end = proofs::replay(g, r.counterexample);
  EXPECT_TRUE(end.sunk);
  EXPECT_EQ(r.counterexample.size(), 3u);  // (0,0) -> ... -> (1,1) -> sink
  // Without the liveness check the same world passes: the trap is not a safety violation.
  EXPECT_TRUE(check(g, check_options{.liveness = false}).ok());
}

// Liveness without a reverse graph (checker.hpp): the sweeps reach the same verdict as a reverse
// reachability, also when every path to the goal runs against the id order, and a graph that
// needs more than 16 sweeps is finished by the reverse reachability (without it, the rungs above
// 15 would be reported as unable to reach the goal).
TEST(Engine, LivenessSweepsAgreeWithReverseReachabilityOnAPathAgainstTheIdOrder) {
  for (bool exact : {false, true}) {
    check_options o;
    o.exact = exact;
    const auto short_ladder = check(ladder{-1, 5, 0}, o);
    ASSERT_TRUE(short_ladder.ok()) << short_ladder.violation;
    EXPECT_EQ(short_ladder.states, 7u);
    EXPECT_EQ(short_ladder.liveness_sweeps, 6u);  // one per rung, then one that adds nothing
    EXPECT_FALSE(short_ladder.liveness_reverse_graph);

    const auto long_ladder = check(ladder{-1, 40, 0}, o);
    ASSERT_TRUE(long_ladder.ok()) << long_ladder.violation;
    EXPECT_EQ(long_ladder.states, 42u);
    EXPECT_EQ(long_ladder.liveness_sweeps, 16u);
    EXPECT_TRUE(long_ladder.liveness_reverse_graph);

    // A cut rung: the first state that cannot reach the goal is the cut rung itself, one move away.
    for (const auto& [n, cut] : {std::pair{5, 3}, std::pair{40, 30}}) {
      const auto r = check(ladder{-1, n, cut}, o);
      EXPECT_EQ(r.outcome, verdict::end_unreachable) << "n=" << n;
      EXPECT_EQ(r.counterexample, std::vector<int>{cut}) << "n=" << n;
      EXPECT_EQ(r.liveness_reverse_graph, n > 15) << "n=" << n;
    }
  }
}

TEST(Engine, FindsAWitness) {
  auto w = proofs::find_witness(grid{}, [](const grid& g) { return g.a == 2 && g.b == 1; });
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->size(), 3u);
  EXPECT_FALSE(proofs::find_witness(grid{}, [](const grid& g) { return g.a > 3; }).has_value());
}

// A worker's per-batch filter: each fingerprint is new once per batch, across its growth (it starts
// at 1 024 slots) and its O(1) clear; 0 and ~0 are fingerprints like any other.
TEST(Engine, BatchFilterKeepsEachFingerprintOncePerBatch) {
  proofs::detail::batch_filter f;
  auto fp = [](std::uint64_t i) { return i * 0x9e3779b97f4a7c15ull; };  // i = 0 gives fingerprint 0
  for (int batch = 0; batch < 3; ++batch) {
    for (std::uint64_t i = 0; i < 5000; ++i) EXPECT_TRUE(f.insert(fp(i))) << "batch " << batch << ", " << i;
    EXPECT_TRUE(f.insert(~std::uint64_t{0}));
    for (std::uint64_t i = 0; i < 5000; ++i) EXPECT_FALSE(f.insert(fp(i))) << "batch " << batch << ", " << i;
    EXPECT_FALSE(f.insert(~std::uint64_t{0}));
    f.clear();
  }
}

// The fingerprint table under the search's overlap (checker.hpp, "The merge overlaps the next
// batch"): one thread inserts what reserve() made room for while another finds. A reader sees an
// entry whole (its own id) or not yet, never another id; an insert past the reserve throws rather
// than move the slots under the reader; after unpin() the table grows again. Run it under
// ThreadSanitizer too (proofs/README.md, "The merge overlaps the next batch").
TEST(Engine, FingerprintTableFindsWhileOneThreadInserts) {
  proofs::detail::fingerprint_table table;
  auto fp = [](std::uint64_t i) { return (i + 1) * 0x9e3779b97f4a7c15ull; };
  constexpr std::uint32_t n = 200'000;  // the table starts at 65 536 slots: reserve grows it first
  table.reserve(n);
  std::atomic<bool> done{false};
  std::uint64_t wrong = 0, seen = 0;
  std::thread reader([&] {
    while (!done.load(std::memory_order_acquire))
      for (std::uint32_t i = 0; i < n; i += 97) {
        const std::uint32_t id = table.find(fp(i));
        if (id == proofs::detail::fingerprint_table::none) continue;
        ++seen;
        if (id != i) ++wrong;
      }
  });
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_EQ(table.insert(fp(i), i), (std::pair{i, true}));
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(wrong, 0u) << "of " << seen << " entries found while the writer inserted";
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_EQ(table.find(fp(i)), i);
  EXPECT_THROW(for (std::uint32_t i = n; i < 2 * n; ++i) table.insert(fp(i), i), std::logic_error);
  table.unpin();
  for (std::uint32_t i = n; i < 2 * n; ++i) ASSERT_EQ(table.insert(fp(i), i).first, i);
  for (std::uint32_t i = 0; i < 2 * n; ++i) ASSERT_EQ(table.find(fp(i)), i);
}

// Without liveness and trace the table keeps fingerprints only (8-byte slots): the same answers
// to "seen before?", and a known fingerprint's id reads as 0, found beside one inserting thread too.
TEST(Engine, FingerprintOnlyTableKeepsMembershipNotIds) {
  proofs::detail::fingerprint_table with_ids(true), bare(false);
  EXPECT_TRUE(with_ids.keeps_ids());
  EXPECT_FALSE(bare.keeps_ids());
  EXPECT_EQ(bare.slot_bytes() * 2, with_ids.slot_bytes());  // 8 bytes a slot against 16
  auto fp = [](std::uint64_t i) { return (i + 1) * 0x9e3779b97f4a7c15ull; };
  constexpr std::uint32_t n = 200'000;  // past the first 65 536 slots: it grows
  bare.reserve(n);
  std::atomic<bool> done{false};
  std::uint64_t wrong = 0;
  std::thread reader([&] {
    while (!done.load(std::memory_order_acquire))
      for (std::uint32_t i = 0; i < n; i += 97)
        if (const std::uint32_t id = bare.find(fp(i)); id != proofs::detail::fingerprint_table::none && id != 0) ++wrong;
  });
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_EQ(bare.insert(fp(i), i + 7), (std::pair{i + 7, true}));  // fresh: the id given
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(wrong, 0u);
  bare.unpin();
  for (std::uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(bare.find(fp(i)), 0u);
    ASSERT_EQ(bare.insert(fp(i), 99), (std::pair{0u, false}));
  }
  for (std::uint32_t i = n; i < n + 1000; ++i) ASSERT_EQ(bare.find(fp(i)), proofs::detail::fingerprint_table::none);
  EXPECT_GT(bare.slot_bytes(), std::size_t{n} * 8);  // it grew to hold them
}

// ---- 2. the real protocol
struct pinned {
  const char* name;
  cluster_bounds bounds;
  std::uint64_t states, transitions;
  std::uint32_t depth;
};

cluster_bounds base() { return cluster_bounds{}; }
cluster_bounds with(cluster_bounds b, auto f) { f(b); return b; }

std::string report(const std::string& name, const auto& r) {
  std::ostringstream s;
  s << name << ": " << proofs::to_string(r.outcome) << ", " << r.states << " states, " << r.transitions
    << " transitions, depth " << r.depth << ", " << r.goal_states << " goal states, " << r.seconds << " s";
  return s.str();
}

void expect_pinned(const pinned& p) {
  const auto r = check(cluster_world(p.bounds));
  std::cout << report(p.name, r) << "\n  " << protocol::model::world_line(p.bounds.world()) << std::endl;
  ASSERT_TRUE(r.ok()) << p.name << ": " << r.violation << "\n"
                      << proofs::counterexample_scenario(p.bounds, r.counterexample, r.violation);
  EXPECT_EQ(r.states, p.states) << p.name;
  EXPECT_EQ(r.transitions, p.transitions) << p.name;
  EXPECT_EQ(r.depth, p.depth) << p.name;
}

#include "pinned_counts.inc"

// Three receivers (issue 19): the 3-receiver bounds that fit CI today, with the membership goal.
// 1 owner x 1 payload, 1 transition, 1 dropped copy of any message.
TEST(Protocol, ThreeReceiversOneDrop) {
  expect_pinned({"3 receivers, 1 drop (1 owner)",
                 with(base(), [](auto& b) { b.receivers = 3; b.owners = 1; b.chunks = 1; b.transitions = 1; b.drops = 1; }),
                 47189, 246331, 67});  // unreduced: 251 836 / 1 308 536 / 67
}

// Fingerprint mode deduplicates by hash_of alone, exact mode by ==. If a hash_append left out a
// field that == compares, two reachable states differing only there would merge under fingerprints
// and the counts would differ (the field lists are also checked at compile time, BITREFIT_HASH_FIELDS).
TEST(Protocol, FingerprintAndExactModeAgree) {
  for (auto b : {with(base(), [](auto& b) { b.owners = 1; b.chunks = 1; b.transitions = 2; b.owner_crashes = 1; }),
                 with(base(), [](auto& b) { b.owners = 1; b.chunks = 1; b.transitions = 1; b.duplicates = 1; b.drops = 1; })}) {
    const auto exact = check(cluster_world(b), check_options{.liveness = false, .exact = true});
    const auto fingerprints = check(cluster_world(b), check_options{.liveness = false, .exact = false});
    ASSERT_TRUE(exact.ok()) << exact.violation;
    EXPECT_EQ(exact.states, fingerprints.states) << protocol::model::world_line(b.world());
    EXPECT_EQ(exact.transitions, fingerprints.transitions);
  }
}

// ---- 3. the witness
std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Protocol, WitnessCommitAfterCrashAndOverwriteRetry) {
  cluster_bounds b = with(base(), [](auto& b) { b.owners = 1; b.chunks = 1; b.transitions = 1; b.crashes = 1; });
  auto w = proofs::find_witness(cluster_world(b), [](const cluster_world& c) {
    const auto& s = c.world();
    // K moved to v1 by an attempt that is not the first one of the transition, after the crash.
    return s.log.state.record.version == 1 && s.budget.crashes == 0 && c.attempts_of_current_transition() == 0 &&
           std::count_if(s.attempts.begin(), s.attempts.end(), [](const auto& a) { return a.target == 1; }) >= 2;
  });
  ASSERT_TRUE(w.has_value());
  const std::string text = protocol::model::to_scenario(b.world(), *w, "witness: commit reached after a crash and an overwrite retry (pinned by proofs/test_checker.cpp)");
  EXPECT_NE(text.find("\ncrash r"), std::string::npos);
  EXPECT_NE(text.find(" overwrite "), std::string::npos);
  EXPECT_EQ(text.find("VIOLATION"), std::string::npos);
  EXPECT_EQ(text.find("error: no enabled move"), std::string::npos) << "the witness does not replay";
  const std::string path = std::string(BITREFIT_SOURCE_DIR) + "/proofs/witness_crash_overwrite_retry.txt";
  if (std::getenv("BITREFIT_REWRITE")) {
    std::ofstream(path) << text;
  }
  EXPECT_EQ(read_file(path), text) << "the shortest witness changed; rerun with BITREFIT_REWRITE=1 if intended";
  std::cout << "witness: " << w->size() << " moves" << std::endl;
}

// ---- 4. mutations: every row of proofs::mutation_cases() (mutation_cases.hpp) is caught, by the
// property the row names, in the row's world.
class Mutation : public ::testing::TestWithParam<proofs::mutation_case> {};

TEST_P(Mutation, IsCaughtWithACounterexampleThatReplays) {
  const proofs::mutation_case& m = GetParam();
  cluster_bounds b = m.bounds;
  const auto r = check(proofs::mutated_cluster_world(b));
  const std::string name = std::string(protocol::to_string(m.mutation()));
  std::cout << report("mutation " + name, r) << std::endl;
  ASSERT_FALSE(r.ok()) << name << " was not caught";
  ASSERT_EQ(r.outcome, m.liveness ? verdict::end_unreachable : verdict::invariant_violated)
      << name << ": caught, but not by the property its row names";
  // The counterexample replays on a fresh world and ends in the violation.
  const proofs::mutated_cluster_world end = proofs::replay(proofs::mutated_cluster_world(b), r.counterexample);
  if (r.outcome == verdict::invariant_violated) {
    EXPECT_EQ(end.check_invariants(), r.violation);
  }
  // It prints as a scenario of the protocol's scenario tests; an invariant violation is its last line.
  const std::string text =
      proofs::counterexample_scenario<protocol::model::mutated_cluster>(b, r.counterexample, name + ": " + r.violation);
  if (r.outcome == verdict::invariant_violated) {
    EXPECT_NE(text.find("VIOLATION: " + r.violation), std::string::npos);
  }
  EXPECT_EQ(text.find("error: no enabled move"), std::string::npos) << "the counterexample does not replay";
  std::cout << "  violation: " << r.violation << "\n  counterexample (" << r.counterexample.size()
            << " moves, scenario format):\n" << text << std::endl;
  // Caught without the symmetry reduction too, with the same verdict and a counterexample of the
  // same (shortest) length: the reduction hides no violation (proofs/README.md "Symmetry reduction").
  if (b.symmetry && b.receivers >= 2) {
    b.symmetry = false;
    const auto full = check(proofs::mutated_cluster_world(b));
    std::cout << report("mutation " + name + " without symmetry reduction", full) << std::endl;
    EXPECT_EQ(full.outcome, r.outcome) << name;
    EXPECT_EQ(full.counterexample.size(), r.counterexample.size()) << name;
    EXPECT_GE(full.states, r.states) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Every, Mutation, ::testing::ValuesIn(proofs::mutation_cases()),
                         [](const auto& info) { return std::string(protocol::to_string(info.param.mutation())); });

// The table holds every mutation of the knob but the one only the random harness reaches.
TEST(MutationTable, CoversTheKnob) {
  for (const auto m : protocol::all_mutations) {
    if (m == M::join_mid_attempt) continue;  // 3 receivers + sender restart + failover: mutation_cases.hpp
    EXPECT_NO_THROW(proofs::mutation_case_of(m)) << protocol::to_string(m);
  }
  EXPECT_THROW(proofs::mutation_case_of(M::join_mid_attempt), std::out_of_range);
}

// ---- 5. liveness covers membership (cluster_bounds::membership_liveness): a live, restarted
// receiver is eventually readmitted and the roster holds exactly the live incarnations. A
// coordinator that ignores a newer incarnation's join (the roster keeps the dead one) still lets K
// reach the last version, so the older goal ("the transition ended") cannot see it; the membership
// goal must.
TEST(Liveness, CatchesARosterThatKeepsADeadIncarnation) {
  cluster_bounds b = proofs::mutation_case_of(M::keep_dead_incarnation).bounds;  // 1 receiver, 1 owner, 1 crash
  const auto r = check(proofs::mutated_cluster_world(b));
  std::cout << report("mutation keep_dead_incarnation", r) << std::endl;
  ASSERT_EQ(r.outcome, verdict::end_unreachable);
  const auto end = proofs::replay(proofs::mutated_cluster_world(b), r.counterexample);
  // The trap starts where r0 dies. Run a fair, fault-free scheduler from there (it restarts r0,
  // delivers everything, fires timers): the live r0#1 stays out of the roster for good.
  auto w = end.world();
  for (int i = 0; i < 400; ++i)
    if (auto m = protocol::model::fair_move(w)) w.apply(*m);
    else break;
  ASSERT_TRUE(w.receivers[0].has_value());
  EXPECT_NE(w.roster_stale(), std::nullopt);
  EXPECT_FALSE(w.settled());
  std::cout << proofs::counterexample_scenario<protocol::model::mutated_cluster>(b, r.counterexample, r.violation)
            << std::endl;
  b.membership_liveness = false;
  EXPECT_TRUE(check(proofs::mutated_cluster_world(b)).ok()) << "the transition-only goal now sees it too";
}

// ---- 6. the parallel search is deterministic: any thread count gives the same counts, the same
// first violation and the same counterexample.
TEST(Engine, ThreadCountChangesNothing) {
  cluster_bounds b = small_world([](auto& b) { b.duplicates = 1; });
  std::optional<proofs::check_result<protocol::model::move>> first;
  for (unsigned t : {1u, 2u, 3u}) {
    // Levels of several batches (64 states per thread each), so that with 2 and 3 threads the
    // merge of one batch runs beside the expansion of the next.
    std::uint64_t widest = 0;
    check_options opt{.liveness = true, .exact = false, .max_states = 20'000'000, .threads = t};
    opt.progress = [&](const proofs::check_progress& p) { widest = std::max(widest, p.level_size); };
    const auto r = check(cluster_world(b), opt);
    ASSERT_TRUE(r.ok()) << r.violation;
    EXPECT_GT(widest, 2 * 64 * 3u) << "no level of three batches or more: the overlap is not exercised";
    if (!first) { first = r; continue; }
    EXPECT_EQ(r.states, first->states) << t << " threads";
    EXPECT_EQ(r.transitions, first->transitions) << t << " threads";
    EXPECT_EQ(r.depth, first->depth) << t << " threads";
    EXPECT_EQ(r.goal_states, first->goal_states) << t << " threads";
  }
  // A state limit reached in the middle of a level (the next batch already handed over): the
  // same stop for every thread count.
  std::uint64_t transitions_at_limit = 0;
  for (unsigned t : {1u, 2u, 3u}) {
    const auto r = check(cluster_world(b), check_options{.liveness = false, .exact = false, .max_states = 3000, .threads = t});
    ASSERT_EQ(r.outcome, verdict::state_limit) << t << " threads";
    EXPECT_EQ(r.states, 3001u) << t << " threads";
    if (t == 1) transitions_at_limit = r.transitions;
    else EXPECT_EQ(r.transitions, transitions_at_limit) << t << " threads";
  }
  b.mutation = M::dedup_off;
  std::vector<protocol::model::move> ce;
  for (unsigned t : {1u, 2u, 3u}) {
    const auto r = check(proofs::mutated_cluster_world(b), check_options{.liveness = true, .exact = false, .max_states = 20'000'000, .threads = t});
    ASSERT_EQ(r.outcome, verdict::invariant_violated);
    if (t == 1) ce = r.counterexample;
    else EXPECT_EQ(r.counterexample, ce) << t << " threads";
  }
}

// check_options::trace = false keeps no parents (for by-hand runs of hundreds of millions of
// states): the same counts, verdicts and violation messages, only without the path.
// A search whose fingerprint table would grow past max_table_bytes (by default: past the memory
// available) stops before that batch is merged, as a state limit that says why, with the counts so
// far, instead of being killed for memory while the table doubles (by-hand runs of hours).
TEST(Engine, TableGrowthPastItsLimitStopsWithAReport) {
  const cluster_bounds dd = small_world([](auto& b) { b.owners = 1; b.drops = 1; b.duplicates = 1; });  // 93 185 classes
  for (const bool ids : {true, false}) {
    // the first 65 536 slots (1 MiB with ids, 512 KiB without) hold 49 151 states; a limit of
    // exactly that many bytes lets none of the doublings happen
    const std::uint64_t first = ids ? std::uint64_t{1} << 20 : std::uint64_t{1} << 19;
    for (const unsigned threads : {1u, 2u}) {
      const auto r = check(cluster_world(dd), check_options{.liveness = false, .exact = false, .threads = threads, .trace = ids,
                                                            .max_table_bytes = first});
      ASSERT_EQ(r.outcome, verdict::state_limit) << r.violation;
      EXPECT_NE(r.violation.find("fingerprint table would grow from " + std::to_string(first) + " to " + std::to_string(2 * first)),
                std::string::npos) << r.violation;
      EXPECT_NE(r.violation.find("max_table_bytes"), std::string::npos) << r.violation;
      EXPECT_LE(r.states, 49151u) << "states merged past what the slots hold";
      EXPECT_GT(r.states, 10000u);
      EXPECT_GT(r.transitions, r.states);
    }
    // twice that: one doubling, 131 072 slots, room for all 93 185
    const auto whole = check(cluster_world(dd), check_options{.liveness = false, .exact = false, .threads = 2, .trace = ids,
                                                              .max_table_bytes = 2 * first});
    ASSERT_TRUE(whole.ok()) << whole.violation;
    EXPECT_EQ(whole.states, 93185u);
  }
  // the default reads the machine's available memory (far more than this world needs: the test
  // above runs it with the default)
  EXPECT_GT(proofs::detail::available_memory_bytes(), std::uint64_t{64} << 20);
}

TEST(Engine, TraceOffDropsOnlyThePath) {
  grid g;
  g.trap = true;
  const auto trap = check(g, check_options{.trace = false});
  ASSERT_EQ(trap.outcome, verdict::end_unreachable);
  EXPECT_TRUE(trap.counterexample.empty());
  EXPECT_EQ(trap.states, check(g).states);

  cluster_bounds b = small_world([](auto& b) { b.duplicates = 1; });
  const auto with = check(cluster_world(b), check_options{.liveness = true, .exact = false, .threads = 2});
  const auto without = check(cluster_world(b), check_options{.liveness = true, .exact = false, .threads = 2, .trace = false});
  ASSERT_TRUE(with.ok()) << with.violation;
  ASSERT_TRUE(without.ok()) << without.violation;
  EXPECT_EQ(without.states, with.states);
  EXPECT_EQ(without.transitions, with.transitions);
  EXPECT_EQ(without.depth, with.depth);
  EXPECT_EQ(without.goal_states, with.goal_states);

  b.mutation = M::dedup_off;
  const auto caught = check(proofs::mutated_cluster_world(b), check_options{.liveness = false, .exact = false, .threads = 2});
  const auto caught_lean = check(proofs::mutated_cluster_world(b), check_options{.liveness = false, .exact = false, .threads = 2, .trace = false});
  ASSERT_EQ(caught.outcome, verdict::invariant_violated);
  ASSERT_EQ(caught_lean.outcome, verdict::invariant_violated);
  EXPECT_EQ(caught_lean.violation, caught.violation);
  EXPECT_EQ(caught_lean.states, caught.states);
  EXPECT_FALSE(caught.counterexample.empty());
  EXPECT_TRUE(caught_lean.counterexample.empty());
  // What check_protocol tells the user to do: the first `states` states again, with the path.
  const auto again = check(proofs::mutated_cluster_world(b),
                           check_options{.liveness = false, .exact = false, .max_states = caught_lean.states, .threads = 2});
  ASSERT_EQ(again.outcome, verdict::invariant_violated);
  EXPECT_EQ(again.counterexample, caught.counterexample);

  // Without liveness too, the table keeps no ids (fingerprint_table): the same search, on a world
  // of 93 185 classes (the table grows past its first 65 536 slots), with the merge overlapping.
  const cluster_bounds dd = small_world([](auto& b) { b.owners = 1; b.drops = 1; b.duplicates = 1; });
  const auto ids = check(cluster_world(dd), check_options{.liveness = false, .exact = false, .threads = 2});
  const auto bare = check(cluster_world(dd), check_options{.liveness = false, .exact = false, .threads = 2, .trace = false});
  ASSERT_TRUE(ids.ok()) << ids.violation;
  ASSERT_TRUE(bare.ok()) << bare.violation;
  EXPECT_EQ(ids.states, 93185u);
  EXPECT_EQ(bare.states, ids.states);
  EXPECT_EQ(bare.transitions, ids.transitions);
  EXPECT_EQ(bare.depth, ids.depth);
  EXPECT_EQ(bare.goal_states, ids.goal_states);
  EXPECT_EQ(bare.terminal_states, ids.terminal_states);
  EXPECT_GT(bare.goal_states, 0u);
}

}  // namespace

// ---- 7. symmetry reduction over receivers (symmetry.hpp). Sound when every renaming of receivers
// commutes with the moves and keeps the invariants and the goal: checked here directly, on every
// reachable state of small worlds with each fault kind (a BFS without reduction, capped), for every
// permutation p: the renamed world's successors are exactly the renamed successors (as sets of
// worlds, ==), invariants and goals agree, and renaming by the identity changes nothing (the
// world's sorted containers are kept sorted, so the identity image is the world itself).
// The worlds whose every reachable state (the first few thousand) the laws of the symmetry
// reduction and of sleep sets are checked on: 2 receivers, 1 owner (2 in one), every fault kind,
// the async gate, causal payloads, 3 receivers.
static std::vector<cluster_bounds> law_worlds() {
  auto two = [](auto f) { return small_world([&](auto& b) { b.owners = 1; f(b); }); };
  return {two([](auto&) {}), two([](auto& b) { b.transitions = 2; b.owners = 2; }),
          two([](auto& b) { b.crashes = 1; }), two([](auto& b) { b.failovers = 1; }),
          two([](auto& b) { b.drops = 1; b.duplicates = 1; }), two([](auto& b) { b.log_faults = 1; }),
          two([](auto& b) { b.early_deadlines = 1; }), two([](auto& b) { b.corruptions = 1; b.conflicts = 1; }),
          two([](auto& b) { b.owner_crashes = 1; b.aborts = 1; }), two([](auto& b) { b.sender_restarts = 1; b.attest = false; }),
          two([](auto& b) { b.gate = protocol::gate_policy::asynchronous; b.crashes = 1; }),
          two([](auto& b) { b.causal_payloads = true; b.crashes = 1; }), two([](auto& b) { b.receivers = 3; b.drops = 1; })};
}
// ...and the mutated machines (a mutation with a crash over 2 transitions).
static cluster_bounds law_mutated_world() {
  cluster_bounds m = small_world([](auto& b) { b.owners = 1; b.crashes = 1; b.transitions = 2; });
  m.mutation = M::accept_old_incarnation_acks;
  return m;
}

// Breadth first over the reachable states of b (no reduction), the first `max_states`: calls
// check(state) on each and stops at the first fatal failure. Returns the states visited.
template <class CW, class F>
std::size_t for_each_reachable(const cluster_bounds& b, std::size_t max_states, F&& check) {
  std::unordered_set<std::size_t> seen;
  std::vector<CW> frontier{CW(b)};
  seen.insert(protocol::hash_of(frontier[0].world()));
  std::size_t visited = 0;
  while (!frontier.empty() && visited < max_states) {
    std::vector<CW> next;
    for (const auto& c : frontier) {
      if (++visited > max_states) break;
      check(c);
      if (::testing::Test::HasFatalFailure()) return visited;
      for (const auto& m : c.enabled_moves()) {
        CW s = c;
        s.apply(m);
        if (seen.insert(protocol::hash_of(s.world())).second) next.push_back(std::move(s));
      }
    }
    frontier = std::move(next);
  }
  return visited;
}

// As the checker's threads do: one scratch world decoded from each reachable state in turn (the
// first `max_states`, breadth first), so mostly by difference from the state before; every fifth
// time the scratch world is changed by a move first, so that it no longer holds what it was
// decoded from. Calls check(state, scratch) after each decode.
template <class CW, class F>
void for_each_decoded(const cluster_bounds& b, std::size_t max_states, F&& check) {
  CW scratch(b);
  std::vector<std::uint8_t> enc;
  std::size_t visited = 0;
  for_each_reachable<CW>(b, max_states, [&](const CW& c) {
    enc.clear();
    c.encode(enc);
    if (++visited % 5 == 4 && !scratch.enabled_moves().empty()) scratch.apply(scratch.enabled_moves().front());
    scratch.decode(enc.data(), enc.data() + enc.size());
    check(c, scratch);
  });
}

namespace symmetry_test {
template <class CW>
void expect_equivariant(const cluster_bounds& b, std::size_t max_states) {
  using world_t = std::decay_t<decltype(std::declval<const CW&>().world())>;
  const auto perms = proofs::all_permutations(b.receivers);
  // A violation's text names receivers and is not renamed (symmetry.hpp): compare its presence.
  auto blind = [](world_t w) {
    if (w.violation) w.violation = "violated";
    return w;
  };
  auto successors = [&](const CW& c) {
    std::vector<world_t> out;
    for (const auto& m : c.enabled_moves()) {
      CW s = c;
      s.apply(m);
      out.push_back(blind(s.world()));
    }
    return out;
  };
  auto renamed = [](world_t w, const std::vector<std::uint32_t>& p) {
    proofs::permute_receivers(w, p);
    return w;
  };
  std::size_t checked = 0, incremental_checked = 0;
  const std::size_t visited = for_each_reachable<CW>(b, max_states, [&](const CW& c) {
    ASSERT_TRUE(renamed(c.world(), perms[0]) == c.world()) << "identity renaming changed a reachable world:\n"
                                                           << c.world().summary();
    // The checker fingerprints a successor with canonicalize(false) and then keeps it as the
    // real successor: the world must come back exactly as it was, and every renaming of it must
    // get the same fingerprint.
    CW kept = c;
    const std::uint64_t fp = kept.canonicalize(false);
    ASSERT_TRUE(kept == c) << "canonicalize(false) did not leave the world as it was:\n" << c.world().summary();
    const auto succ = successors(c);
    for (std::size_t k = 1; k < perms.size(); ++k) {
      CW pc = c;
      pc.rename_receivers(perms[k]);
      ASSERT_EQ(CW(pc).canonicalize(false), fp) << "two images of one class fingerprint apart:\n" << c.world().summary();
      // The fingerprint of the image, computed without building it, is that of the image.
      ASSERT_EQ(proofs::renamed_fingerprint(c.world(), perms[k]), proofs::renamed_fingerprint(pc.world(), perms[0]))
          << "renamed_fingerprint differs from the fingerprint of the renamed world:\n" << c.world().summary();
      ASSERT_EQ(pc.check_invariants().has_value(), c.check_invariants().has_value()) << c.world().summary();
      ASSERT_EQ(pc.transition_done(), c.transition_done()) << c.world().summary();
      ASSERT_EQ(pc.world().transition_done(), c.world().transition_done());
      const auto psucc = successors(pc);
      ASSERT_EQ(psucc.size(), succ.size()) << "moves of the renamed world differ in number:\n" << c.world().summary();
      std::vector<std::uint8_t> used(psucc.size(), 0);
      for (const auto& s : succ) {
        const world_t want = renamed(s, perms[k]);
        bool found = false;
        for (std::size_t j = 0; j < psucc.size() && !found; ++j)
          if (!used[j] && psucc[j] == want) used[j] = found = true;
        ASSERT_TRUE(found) << "a successor renamed is no successor of the renamed world (permutation " << k
                           << "):\n" << c.world().summary() << "successor:\n" << s.summary();
      }
      ++checked;
    }
    for (const auto& m : c.enabled_moves()) {
      CW s = c;
      s.apply(m);
      // The checker fingerprints a successor with what it shares with its parent taken over
      // (c keeps its parts between its successors): the same fingerprint as from scratch, and
      // the same canonical image when it renames.
      CW incremental = s, scratch = s;
      ASSERT_EQ(incremental.canonicalize_successor(c, false), scratch.canonicalize(false))
          << "a successor's fingerprint from its parent's parts differs from its own:\n" << s.world().summary();
      ASSERT_TRUE(incremental == s) << "canonicalize_successor(false) changed the world:\n" << s.world().summary();
      ASSERT_EQ(incremental.canonicalize_successor(c, true), scratch.canonicalize(true)) << s.world().summary();
      ASSERT_TRUE(incremental == scratch) << "the two canonical images differ:\n" << s.world().summary();
      ++incremental_checked;
    }
  });
  std::cout << protocol::model::world_line(b.world()) << ": " << visited << " states, " << checked
            << " (state, permutation) pairs commute, " << incremental_checked << " successors fingerprinted from their parent alike"
            << std::endl;
  EXPECT_GT(checked, 0u);
  EXPECT_GT(incremental_checked, 0u);
}
}  // namespace symmetry_test

TEST(Symmetry, RenamingReceiversCommutesWithEveryMove) {
  for (const auto& b : law_worlds()) symmetry_test::expect_equivariant<cluster_world>(b, 4000);
  // The mutated machines too (the mutation runs below use the reduction).
  symmetry_test::expect_equivariant<proofs::mutated_cluster_world>(law_mutated_world(), 4000);
}

// A receiver's deferred prepare (a newer attempt waiting for its device sync) names receivers: its
// members and expected attestations. None of the worlds above reaches one within the states it
// visits, so one is set by hand: renamed_fingerprint hashes it renamed (it fails when the deferred
// prepare is hashed as it is), and hashes it at all (it fails when only the receiver's signature,
// which keeps the deferred prepare's attempt only, stands for it).
TEST(Symmetry, RenamedFingerprintRenamesADeferredPrepare) {
  auto w = cluster_world(small_world([](auto& b) { b.receivers = 3; b.owners = 1; })).world();
  protocol::prepare_record p;
  p.attempt = {1, 2};
  p.target = 1;
  p.members = {{0, 0}, {2, 1}};
  p.expected = {digest128{11, 1}, digest128{12, 2}, digest128{13, 3}};  // {x, r+1}: receiver r's attestation
  ASSERT_TRUE(w.receivers[1].has_value());
  w.receivers[1]->deferred = p;
  const auto perms = proofs::all_permutations(3);
  for (const auto& q : perms) {
    auto image = w;
    proofs::permute_receivers(image, q);
    EXPECT_EQ(proofs::renamed_fingerprint(w, q), proofs::renamed_fingerprint(image, perms[0]));
  }
  auto other = w;
  other.receivers[1]->deferred->members = {{0, 0}, {1, 1}};
  EXPECT_NE(proofs::renamed_fingerprint(w, perms[0]), proofs::renamed_fingerprint(other, perms[0]));
}

// A world keeps its fingerprint parts for its successors (cluster_world.hpp, canonicalize_successor)
// only while it is unchanged: a parent changed in place (a move applied to it, a renaming, another
// state decoded into it, as the checker's scratch worlds are) must not hand its successors parts
// of the state it held before. Along one path of moves, the parent is used (its parts computed),
// then changed in place, then used again: each successor's fingerprint must equal its own.
TEST(Symmetry, ParentPartsAreDroppedWhenTheParentChanges) {
  const cluster_bounds b = small_world([](auto& b) { b.owners = 1; b.crashes = 1; });
  const auto perms = proofs::all_permutations(b.receivers);
  cluster_world parent(b), other(b);
  auto expect_successors_alike = [&](const cluster_world& p) {
    for (const auto& m : p.enabled_moves()) {
      cluster_world s = p;
      s.apply(m);
      cluster_world scratch = s;
      ASSERT_EQ(s.canonicalize_successor(p, false), scratch.canonicalize(false)) << p.world().summary();
    }
  };
  for (std::size_t step = 0; step < 60; ++step) {
    const auto moves = parent.enabled_moves();
    if (moves.empty()) break;
    expect_successors_alike(parent);  // computes and keeps the parent's parts
    parent.apply(moves[(7 * step) % moves.size()]);  // in place
    expect_successors_alike(parent);
    parent.rename_receivers(perms[1]);
    expect_successors_alike(parent);
    // another state decoded into it, then its own again
    const auto others = other.enabled_moves();
    if (!others.empty()) other.apply(others[(3 * step) % others.size()]);
    std::vector<std::uint8_t> theirs, own;
    other.encode(theirs);
    parent.encode(own);
    parent.decode(theirs.data(), theirs.data() + theirs.size());
    expect_successors_alike(parent);
    parent.decode(own.data(), own.data() + own.size());
    expect_successors_alike(parent);
  }
}

// restore_to (cluster_world.hpp) copies back only the parts a successor changed; the checker
// then builds the next successor on it. Over the first states of worlds with every fault kind (a
// BFS, capped), for every pair of consecutive moves of a state as the checker does it: after
// restore_to the scratch world equals the parent, and the next successor built on it equals (and
// fingerprints as) one built on a fresh copy. Restoring any one part fewer fails here (checked by
// deleting each line of restore_to in turn; the mutated world is there so that `violation`
// changes too), except `stuck`: no world within the checker's bounds gets there (the coordinator
// needs an operator only past max_attempts, and the last attempt is fault-free).
namespace restore_test {
template <class CW>
std::size_t expect_restored(const cluster_bounds& b) {
  std::size_t restored = 0;
  std::vector<CW> frontier{CW(b)};
  std::unordered_set<std::uint64_t> seen{CW(b).canonicalize(false)};
  std::array<CW, 2> scratch{CW(b), CW(b)};
  for (std::size_t next = 0; next < frontier.size() && next < 400; ++next) {
    const CW p = frontier[next];
    auto moves = p.enabled_moves();
    // in order, then backwards: each move's successor is restored from at least once
    const std::size_t n = moves.size();
    for (std::size_t i = 0; i + 1 < n; ++i) moves.push_back(moves[n - 2 - i]);
    std::array<bool, 2> from_p{};
    unsigned cur = 0;
    for (const auto& m : moves) {
      CW& s = scratch[cur];
      if (from_p[cur]) {
        s.restore_to(p);
        ++restored;
        EXPECT_TRUE(s == p) << protocol::model::world_line(b.world()) << "\n" << p.world().summary();
        if (!(s == p)) return restored;
      } else {
        s = p;
      }
      from_p[cur] = true;
      s.apply(m);
      CW fresh = p;
      fresh.apply(m);
      EXPECT_TRUE(s == fresh);
      const std::uint64_t fp = s.canonicalize_successor(p, false);
      EXPECT_EQ(fp, fresh.canonicalize(false));
      if (seen.insert(fp).second) frontier.push_back(fresh);
      cur ^= 1;
    }
  }
  return restored;
}
}  // namespace restore_test

TEST(Restore, BringsTheScratchWorldBackToItsParent) {
  std::size_t restored = 0;
  for (const auto& b :
       {small_world([](auto& b) { b.crashes = 1; }), small_world([](auto& b) { b.owner_crashes = 1; b.transitions = 2; }),
        small_world([](auto& b) { b.owners = 1; b.failovers = 1; b.log_faults = 1; }),
        small_world([](auto& b) { b.owners = 1; b.drops = 1; b.duplicates = 1; b.corruptions = 1; }),
        small_world([](auto& b) { b.owners = 1; b.sender_restarts = 1; b.early_deadlines = 1; b.aborts = 1; }),
        small_world([](auto& b) { b.receivers = 3; b.owners = 1; b.conflicts = 1; b.crashes = 1; })})
    restored += restore_test::expect_restored<cluster_world>(b);
  auto mutated = small_world([](auto& b) { b.owners = 1; });
  mutated.mutation = protocol::protocol_mutation::commit_before_all_acks;
  restored += restore_test::expect_restored<proofs::mutated_cluster_world>(mutated);
  EXPECT_GT(restored, 10000u);
}

// As the checker runs it on a compact frontier: one scratch world decoded from each state in turn
// (by difference from the one before), two successor worlds restored to it before every move, the
// first ones from successors of the state before. Every restore gives the state, over the law
// worlds and the mutated one; also when the scratch world was changed before a decode (then the
// first restores copy). Skipping a part that one of the two comparisons did not find equal
// (checked by hand: the coordinator's or a receiver's part kept without the decode's word, or
// any restore from the state before without the digest's) fails here.
namespace restore_test {
template <class CW>
std::array<std::size_t, 3> expect_restored_across_decodes(const cluster_bounds& b, std::size_t max_states) {
  std::array<std::size_t, 3> how{};  // by CW::restored
  std::array<CW, 2> own{CW(b), CW(b)};
  for_each_decoded<CW>(b, max_states, [&](const CW& c, const CW& scratch) {
    unsigned cur = 0;
    for (const auto& m : c.enabled_moves()) {
      const auto r = own[cur].restore_to(scratch);
      ++how[std::size_t(r)];
      ASSERT_TRUE(own[cur] == c) << protocol::model::world_line(b.world()) << ", restored " << int(r) << "\n" << c.world().summary();
      own[cur].apply(m);
      own[cur].canonicalize_successor(scratch, false);
      cur ^= 1;
    }
  });
  return how;
}
}  // namespace restore_test

TEST(Restore, FollowsTheScratchWorldToTheNextDecodedState) {
  std::array<std::size_t, 3> how{};
  auto add = [&](const std::array<std::size_t, 3>& h) {
    for (std::size_t i = 0; i < 3; ++i) how[i] += h[i];
  };
  for (const auto& b : law_worlds()) add(restore_test::expect_restored_across_decodes<cluster_world>(b, 1500));
  add(restore_test::expect_restored_across_decodes<proofs::mutated_cluster_world>(law_mutated_world(), 1500));
  std::cout << how[0] << " whole copies, " << how[1] << " restores from the parent, " << how[2]
            << " from a successor of the state decoded before it" << std::endl;
  EXPECT_GT(how[2], 10000u);
  EXPECT_GT(how[1], how[2]);
}

// Where the world cannot tell what it shares with the state it came from, restore_to copies it
// whole: after a renaming, a move, a decode, and when moved from.
TEST(Restore, CopiesTheWholeParentWhereTheComparisonNoLongerHolds) {
  const cluster_bounds b = small_world([](auto& b) { b.receivers = 3; b.owners = 1; b.crashes = 1; });
  const auto perms = proofs::all_permutations(b.receivers);
  cluster_world p(b);
  for (int i = 0; i < 12; ++i) p.apply(p.enabled_moves()[std::size_t(i) % p.enabled_moves().size()]);
  std::vector<std::uint8_t> bytes;
  cluster_world other(b);
  other.apply(other.enabled_moves().back());
  other.encode(bytes);
  for (int how = 0; how < 4; ++how) {
    for (const auto& m : p.enabled_moves()) {
      cluster_world s = p;
      s.apply(m);
      s.canonicalize_successor(p, false);
      if (how == 0) s.rename_receivers(perms[3]);
      if (how == 1) s.apply(s.enabled_moves().front());
      if (how == 2) s.decode(bytes.data(), bytes.data() + bytes.size());
      if (how == 3) cluster_world taken = std::move(s);
      s.restore_to(p);
      ASSERT_TRUE(s == p) << "case " << how;
    }
  }
}

// The verdict does not depend on the reduction, and the reduced state count is between 1/n! and 1
// of the full one (every class has at most n! members).
TEST(Symmetry, SameVerdictsWithAndWithoutReduction) {
  for (auto b : {small_world([](auto& b) { b.owners = 1; b.crashes = 1; b.max_attempts = 1; }),
                 small_world([](auto& b) { b.owners = 1; b.drops = 1; }),
                 small_world([](auto& b) { b.owners = 1; b.log_faults = 1; b.transitions = 2; }),
                 small_world([](auto& b) { b.owners = 1; b.receivers = 3; b.duplicates = 1; })}) {
    for (bool exact : {false, true}) {
      b.symmetry = false;
      const auto full = check(cluster_world(b), check_options{.liveness = true, .exact = exact});
      b.symmetry = true;
      const auto reduced = check(cluster_world(b), check_options{.liveness = true, .exact = exact});
      std::cout << protocol::model::world_line(b.world()) << (exact ? " (exact)" : "") << ": " << full.states
                << " states -> " << reduced.states << " with symmetry" << std::endl;
      EXPECT_EQ(full.outcome, reduced.outcome);
      EXPECT_EQ(full.depth, reduced.depth);
      EXPECT_LT(reduced.states, full.states);
      std::uint64_t fact = 1;
      for (std::uint32_t k = 2; k <= b.receivers; ++k) fact *= k;
      EXPECT_GE(reduced.states * fact, full.states);
    }
  }
}

// ---- 8. the compact frontier (compact.hpp): every reachable state of small worlds with every fault
// kind decodes back to itself, also into a scratch world that held another state (decode must
// overwrite everything, or keep only what recurs: cluster_world decodes by difference), and one
// changed since its last decode, and the search counts the same with and without it.
TEST(Compact, EveryReachableStateRoundTrips) {
  cluster_bounds b;
  b.owners = 2;
  b.chunks = 1;
  b.transitions = 2;
  b.crashes = b.failovers = b.drops = b.duplicates = b.log_faults = b.owner_crashes = b.aborts = b.conflicts = 1;
  std::unordered_set<std::size_t> seen;
  std::vector<cluster_world> frontier{cluster_world(b)};
  cluster_world scratch = frontier[0];
  std::size_t checked = 0, bytes = 0;
  while (!frontier.empty() && checked < 8000) {
    std::vector<cluster_world> next;
    for (const auto& c : frontier) {
      std::vector<std::uint8_t> enc;
      c.encode(enc);
      // every third state, the scratch world no longer holds what it was decoded from (a move
      // since): decoding by difference must not keep parts of it
      if (checked % 3 == 2 && !scratch.enabled_moves().empty()) scratch.apply(scratch.enabled_moves().back());
      scratch.decode(enc.data(), enc.data() + enc.size());
      ASSERT_TRUE(scratch == c) << c.world().summary();
      ++checked;
      bytes += enc.size();
      for (const auto& m : c.enabled_moves()) {
        cluster_world s = c;
        s.apply(m);
        if (seen.insert(protocol::hash_of(s.world())).second) next.push_back(std::move(s));
      }
    }
    frontier = std::move(next);
  }
  std::cout << checked << " states round-trip, " << bytes / checked << " bytes each on average" << std::endl;
  for (auto bb : {small_world([](auto& b) { b.owners = 1; b.failovers = 1; }), small_world([](auto& b) { b.receivers = 3; b.owners = 1; })}) {
    const auto packed = check(cluster_world(bb), check_options{.liveness = true, .exact = false, .max_states = 20'000'000, .threads = 2, .compact = true});
    const auto live = check(cluster_world(bb), check_options{.liveness = true, .exact = false, .max_states = 20'000'000, .threads = 2, .compact = false});
    EXPECT_EQ(packed.states, live.states);
    EXPECT_EQ(packed.transitions, live.transitions);
    EXPECT_EQ(packed.depth, live.depth);
    EXPECT_EQ(packed.goal_states, live.goal_states);
    check_options raw{true, false, 20'000'000, 2, true};
    raw.compress_frontier = false;
    const auto uncompressed = check(cluster_world(bb), raw);
    EXPECT_EQ(packed.states, uncompressed.states);
    EXPECT_EQ(packed.transitions, uncompressed.transitions);
    EXPECT_EQ(packed.depth, uncompressed.depth);
  }
}

// A successor's encoding copied in part from the bytes its parent was decoded from
// (cluster_world::encode_successor) is byte for byte its full encoding: over the first reachable
// states of the law worlds (every fault kind, 3 receivers) and of the mutated world, for every
// move, appended behind other bytes as the checker's arena does. Also where the world cannot take
// the copy (the parent live rather than decoded; the successor not compared with it) and when the
// parent changes after its decode (a decode of another state, a move). Checked by hand: copying
// the owners, the coordinator, every receiver, the per-receiver vectors or the messages by
// position without the comparison's word, or from a parent decoded again since, fails here.
namespace encode_test {
struct tally {
  std::size_t encodings = 0, bytes = 0, copied = 0;
};
template <class CW>
tally expect_same_bytes(const cluster_bounds& b, std::size_t max_states) {
  tally t;
  CW decoded(b), other(b);
  std::vector<std::uint8_t> enc, other_enc, full, incremental;
  other.apply(other.enabled_moves().back());
  other.encode(other_enc);
  for_each_reachable<CW>(b, max_states, [&](const CW& p) {
    enc.clear();
    p.encode(enc);
    decoded.decode(enc.data(), enc.data() + enc.size());
    for (const auto& m : p.enabled_moves()) {
      for (int how = 0; how < 3; ++how) {
        CW s = decoded;
        s.apply(m);
        if (how != 2) s.canonicalize_successor(decoded, false);  // 2: not compared with its parent
        const CW& parent = how == 1 ? p : decoded;               // 1: a parent not decoded (the same state)
        full.assign(3, 0xA5), incremental.assign(3, 0xA5);       // behind other bytes, as in the checker's arena
        s.encode(full);
        const std::size_t copied = s.encode_successor(incremental, parent);
        ASSERT_EQ(full, incremental) << "case " << how << ", move " << p.world().describe(m) << "\n" << p.world().summary();
        if (how == 0) ++t.encodings, t.bytes += full.size() - 3, t.copied += copied;
        else ASSERT_EQ(copied, 0u) << "case " << how << ": copied from a parent it cannot tell it shares with";
      }
    }
    // the parent's bytes are not used once it changed since its decode: decoded again (from
    // another state's bytes), or a move
    const auto moves = p.enabled_moves();
    for (int how = enc == other_enc ? 1 : 0; how < 2 && !moves.empty(); ++how) {
      CW parent = decoded;  // a copy does not take the bytes along: decode it
      parent.decode(enc.data(), enc.data() + enc.size());
      CW s = parent;
      s.apply(moves.front());
      s.canonicalize_successor(parent, false);
      if (how == 0) parent.decode(other_enc.data(), other_enc.data() + other_enc.size());
      if (how == 1) parent.apply(parent.enabled_moves().front());
      full.clear(), incremental.clear();
      s.encode(full);
      const std::size_t copied = s.encode_successor(incremental, parent);
      ASSERT_EQ(full, incremental) << "changed parent, case " << how;
      ASSERT_EQ(copied, 0u) << "changed parent, case " << how;
    }
  });
  return t;
}
}  // namespace encode_test

TEST(Compact, SuccessorEncodingCopiesWhatItSharesWithItsParent) {
  encode_test::tally all;
  auto add = [&](const encode_test::tally& t) {
    all.encodings += t.encodings, all.bytes += t.bytes, all.copied += t.copied;
  };
  for (const auto& b : law_worlds()) add(encode_test::expect_same_bytes<cluster_world>(b, 1500));
  add(encode_test::expect_same_bytes<proofs::mutated_cluster_world>(law_mutated_world(), 1500));
  std::cout << all.encodings << " successor encodings equal their full encodings; " << all.copied << " of their "
            << all.bytes << " bytes copied from the parent's" << std::endl;
  EXPECT_GT(all.encodings, 50000u);
  EXPECT_GT(all.copied * 2, all.bytes);  // most of a successor is its parent's
}

// Decoding by difference keeps the fingerprint parts of what recurs (cluster_world::decode): a
// scratch world decoded from each reachable state in turn, after its successors were fingerprinted
// from it (so it had parts under the renamings they chose), gives every successor the fingerprint
// a fresh copy gets, over the law worlds; also when the scratch world was changed before the
// decode. Taking over a part that did not recur (checked by hand: the log, coordinator, owners or
// messages marked as recurring regardless) fails here.
TEST(Compact, DecodingByDifferenceKeepsTheFingerprintParts) {
  std::size_t checked = 0;
  for (const auto& b : law_worlds()) {
    for_each_decoded<cluster_world>(b, 1500, [&](const cluster_world& c, const cluster_world& scratch) {
      for (const auto& m : c.enabled_moves()) {
        cluster_world s = scratch, fresh = c;
        s.apply(m), fresh.apply(m);
        ASSERT_EQ(s.canonicalize_successor(scratch, false), fresh.canonicalize(false))
            << protocol::model::world_line(b.world()) << ", move " << c.world().describe(m) << "\n" << c.world().summary();
        ++checked;
      }
    });
  }
  std::cout << checked << " successors of decoded states fingerprinted as fresh copies" << std::endl;
  EXPECT_GT(checked, 50000u);
}

// The compressed frontier (packed_frontier.hpp) gives back every encoding byte for byte, across
// block boundaries, to readers that each see indices in increasing order, and after its contents
// are cleared or swapped with another level's (a reader must not serve a block of the old contents).
TEST(Compact, PackedFrontierReturnsEveryEncoding) {
  auto encoding = [](std::size_t k, std::size_t round) {
    std::vector<std::uint8_t> e(1 + (k * 7919 + round) % 900);
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = std::uint8_t((k * 31 + i * 7 + round) % 5 == 0 ? k + i : 0);
    return e;
  };
  for (bool compress : {true, false}) {
    proofs::packed_frontier a(compress, 16), b(compress, 16);
    proofs::packed_frontier::reader r0, r1;
    for (std::size_t round = 0; round < 3; ++round) {
      const std::size_t n = 100 + 37 * round;  // not a multiple of the block: the last block is short
      a.clear();
      for (std::size_t k = 0; k < n; ++k) {
        const auto e = encoding(k, round);
        a.push(e.data(), e.size());
      }
      a.seal();
      ASSERT_EQ(a.size(), n);
      for (std::size_t k = 0; k < n; ++k) {  // two readers taking turns, as the checker's threads do
        const auto [p, end] = (k % 2 ? r1 : r0).at(a, k);
        const auto e = encoding(k, round);
        ASSERT_EQ(std::size_t(end - p), e.size()) << k;
        ASSERT_TRUE(std::equal(p, end, e.begin())) << "state " << k << " of round " << round;
      }
      std::swap(a, b);  // the next round writes into what was the other level
    }
    if (compress) {
      EXPECT_LT(b.bytes_held(), 100u * 450u / 2);  // mostly zeros: it must shrink
    }
  }
}

// ---- 9. sleep sets (check_options::sleep_sets, proofs/README.md "Sleep sets"): the independence
// the cluster world declares holds in every reachable state of small worlds with every fault kind,
// move ids name the same move in every member of a class, and the search with sleep sets finds the
// same states, depth and verdict as without.
namespace sleep_test {
template <class CW>
void expect_independent_moves_commute(const cluster_bounds& b, std::size_t max_states) {
  using world_t = std::decay_t<decltype(std::declval<const CW&>().world())>;
  using move = protocol::model::move;
  const auto perms = proofs::all_permutations(b.receivers);
  // The unique enabled move of w with id `id` in frame 0 (fails the test where there are none or two).
  auto with_id = [](const CW& w, std::uint64_t id) -> std::optional<move> {
    std::optional<move> found;
    for (const auto& m : w.enabled_moves())
      if (w.sleep_id(m, 0) == id) {
        if (found) return std::nullopt;
        found = m;
      }
    return found;
  };
  std::size_t pairs = 0, renamed = 0;
  const std::size_t visited = for_each_reachable<CW>(b, max_states, [&](const CW& p) {
    const auto moves = p.enabled_moves();
    // distinct moves, distinct ids, in every frame
    for (std::uint32_t k = 0; k < perms.size(); ++k) {
      std::unordered_set<std::uint64_t> ids;
      for (const auto& m : moves) ASSERT_TRUE(ids.insert(p.sleep_id(m, k)).second) << p.world().describe(m) << "\n" << p.world().summary();
    }
    // a move's id in frame k is its image's id in the image under that renaming (frame 0)
    for (std::uint32_t k = 1; k < perms.size(); ++k) {
      CW image = p;
      image.rename_receivers(perms[k]);
      for (const auto& m : moves) {
        const auto im = with_id(image, p.sleep_id(m, k));
        ASSERT_TRUE(im) << "no move of the renamed world has the id of " << p.world().describe(m) << "\n" << p.world().summary();
        CW a = p, ia = image;
        a.apply(m), ia.apply(*im);
        world_t want = a.world();
        proofs::permute_receivers(want, perms[k]);
        if (want.violation && ia.world().violation) want.violation = ia.world().violation;  // texts name receivers
        ASSERT_TRUE(ia.world() == want) << "the move with the same id is not the renamed move: " << p.world().describe(m) << "\n"
                                        << p.world().summary();
        ++renamed;
      }
    }
    // independent moves commute, and each stays enabled, with its id, after the other
    for (const auto& a : moves)
      for (const auto& bm : moves) {
        if (a == bm || !p.independent(a, bm)) continue;
        ASSERT_TRUE(p.independent(bm, a)) << "independence is not symmetric";
        CW pa = p, pb = p;
        pa.apply(a), pb.apply(bm);
        const auto b2 = with_id(pa, p.sleep_id(bm, 0)), a2 = with_id(pb, p.sleep_id(a, 0));
        ASSERT_TRUE(b2 && a2) << "a move declared independent is not enabled after the other: " << p.world().describe(a) << " | "
                              << p.world().describe(bm) << "\n" << p.world().summary();
        pa.apply(*b2), pb.apply(*a2);
        ASSERT_TRUE(pa == pb) << "moves declared independent do not commute: " << p.world().describe(a) << " | "
                              << p.world().describe(bm) << "\n" << p.world().summary() << "one order:\n" << pa.world().summary()
                              << "the other:\n" << pb.world().summary();
        ++pairs;
      }
  });
  std::cout << protocol::model::world_line(b.world()) << ": " << visited << " states, " << pairs
            << " independent pairs commute, " << renamed << " ids renamed alike" << std::endl;
  EXPECT_GT(pairs, 0u);
}
}  // namespace sleep_test

TEST(Sleep, IndependentMovesCommute) {
  for (const auto& b : law_worlds()) sleep_test::expect_independent_moves_commute<cluster_world>(b, 3000);
  sleep_test::expect_independent_moves_commute<proofs::mutated_cluster_world>(law_mutated_world(), 3000);
}

TEST(Sleep, SameStatesDepthAndVerdictAsTheFullSearch) {
  // one owner, and one attempt per transition where two make millions of states
  auto one = [](auto f) { return small_world([&](auto& b) { b.owners = 1; b.max_attempts = 1; f(b); }); };
  auto two = [](auto f) { return small_world([&](auto& b) { b.owners = 1; f(b); }); };
  for (auto b : {one([](auto& b) { b.crashes = 1; }), one([](auto& b) { b.drops = 1; b.duplicates = 1; }),
                 two([](auto& b) { b.corruptions = 1; b.conflicts = 1; }), two([](auto& b) { b.log_faults = 1; b.transitions = 2; }),
                 one([](auto& b) { b.failovers = 1; }), one([](auto& b) { b.owner_crashes = 1; b.sender_restarts = 1; }),
                 one([](auto& b) { b.early_deadlines = 1; b.gate = protocol::gate_policy::asynchronous; }),
                 one([](auto& b) { b.receivers = 3; b.duplicates = 1; }),
                 small_world([](auto& b) { b.owners = 2; b.chunks = 2; b.transitions = 1; })}) {
    for (bool symmetry : {false, true}) {
      b.symmetry = symmetry;
      const auto full = check(cluster_world(b), check_options{.liveness = false, .threads = 1});
      for (unsigned threads : {1u, 2u}) {
        if (threads == 2 && b.crashes == 0) continue;  // the thread count changes nothing: once is enough
        const auto asleep = check(cluster_world(b), check_options{.liveness = false, .threads = threads, .sleep_sets = true});
        std::cout << protocol::model::world_line(b.world()) << " symmetry=" << symmetry << " threads=" << threads << ": "
                  << full.states << " states, " << full.transitions << " transitions -> " << asleep.transitions
                  << " with sleep sets (" << asleep.slept << " asleep)" << std::endl;
        EXPECT_EQ(asleep.outcome, full.outcome);
        EXPECT_EQ(asleep.states, full.states);
        EXPECT_EQ(asleep.depth, full.depth);
        EXPECT_EQ(asleep.terminal_states, full.terminal_states);
        EXPECT_LT(asleep.transitions, full.transitions);
        EXPECT_GT(asleep.slept, 0u);
      }
    }
  }
  // exact keys without symmetry: the same counts as with fingerprints
  cluster_bounds b = one([](auto& b) { b.crashes = 1; b.symmetry = false; });
  const auto fp = check(cluster_world(b), check_options{.liveness = false, .sleep_sets = true});
  const auto exact = check(cluster_world(b), check_options{.liveness = false, .exact = true, .sleep_sets = true});
  EXPECT_EQ(exact.states, fp.states);
  EXPECT_EQ(exact.transitions, fp.transitions);
  EXPECT_EQ(exact.slept, fp.slept);
  // what it cannot do says so
  EXPECT_THROW(check(cluster_world(b), check_options{.liveness = true, .sleep_sets = true}), std::invalid_argument);
  b.symmetry = true;
  EXPECT_THROW(check(cluster_world(b), check_options{.liveness = false, .exact = true, .sleep_sets = true}), std::invalid_argument);
}

// Every invariant-caught mutation of the table is caught with sleep sets too, at the same depth.
TEST(Sleep, CatchesEveryInvariantMutationAtTheSameDepth) {
  for (const auto& m : proofs::mutation_cases()) {
    if (m.liveness) continue;  // sleep sets are for safety runs
    const auto full = check(proofs::mutated_cluster_world(m.bounds), check_options{.liveness = false});
    const auto asleep = check(proofs::mutated_cluster_world(m.bounds), check_options{.liveness = false, .sleep_sets = true});
    const std::string name(protocol::to_string(m.mutation()));
    ASSERT_EQ(full.outcome, verdict::invariant_violated) << name;
    EXPECT_EQ(asleep.outcome, verdict::invariant_violated) << name << " is not caught with sleep sets";
    EXPECT_EQ(asleep.counterexample.size(), full.counterexample.size()) << name;
    const auto end = proofs::replay(proofs::mutated_cluster_world(m.bounds), asleep.counterexample);
    EXPECT_EQ(end.check_invariants(), asleep.violation) << name;
    std::cout << name << ": caught in " << asleep.counterexample.size() << " moves, " << asleep.states << " of " << full.states
              << " states, " << asleep.transitions << " of " << full.transitions << " transitions" << std::endl;
  }
}

// The pinned no-fault world (PayloadBoundsTwoTransitionsNoFaults) with sleep sets: the same states
// and depth, and the transitions they explore pinned too (a change of the independence rule or of
// the move ids shows up here as a diff; proofs/README.md "Sleep sets" has the numbers).
TEST(Sleep, PinnedWorldKeepsItsStatesInFewerTransitions) {
  const auto r = check(cluster_world(base()), check_options{.liveness = false, .sleep_sets = true});
  std::cout << report("2 owners x 2 payloads, 2 transitions, sleep sets", r) << ", " << r.slept << " asleep" << std::endl;
  ASSERT_TRUE(r.ok()) << r.violation;
  EXPECT_EQ(r.states, 239135u);
  EXPECT_EQ(r.depth, 71u);
  EXPECT_EQ(r.transitions, 1065111u);  // of 1 919 265 without sleep sets
  EXPECT_EQ(r.slept, 854154u);
}
