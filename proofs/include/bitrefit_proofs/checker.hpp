// bitrefit_proofs/checker.hpp — an exhaustive explicit-state model checker, generic over the world
// it explores (stateright / TLC style, breadth first).
//
// A world is a plain value: copyable, ==, std::hash, with
//   enabled_moves() const   -> a range of moves (every nondeterministic choice in this state)
//   apply(move)              -> the successor (deterministic: same state + same move = same successor)
//   check_invariants() const -> std::optional<std::string>: the first violated safety invariant
//   transition_done() const  -> bool: the goal ("the transition ended")
// The checker visits every state reachable from the initial one, checks the invariants in every state
// (so the first violation found is one of the shortest), and, with `liveness`, checks that a goal state
// stays reachable from every reachable state (reverse reachability over the whole state graph: no
// deadlock, no livelock, no trap). A counterexample is the move sequence from the initial state, which
// the caller replays on a fresh world to print (the world is deterministic).
//
// Deduplication: `exact` keeps every state and compares with == (memory ~ states * sizeof(world));
// otherwise states are identified by their 64-bit std::hash fingerprint (TLC's default: the chance that
// two of n distinct states collide, which would hide the successors of one of them, is about
// n^2 / 2^65; printed as `collision_bound`). Tests run small worlds in both modes and require the
// same counts.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <ranges>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bitrefit::proofs {

template <class W>
using move_of = std::ranges::range_value_t<decltype(std::declval<const W&>().enabled_moves())>;

template <class W>
concept checkable_world = std::copyable<W> && std::equality_comparable<W> && requires(const W& cw, W& w) {
  { cw.enabled_moves() } -> std::ranges::range;
  w.apply(std::declval<const move_of<W>&>());
  { cw.check_invariants() } -> std::convertible_to<std::optional<std::string>>;
  { cw.transition_done() } -> std::convertible_to<bool>;
  { std::hash<W>{}(cw) } -> std::convertible_to<std::size_t>;
};

struct check_options {
  bool liveness = true;            // reverse reachability of a goal state from every state
  bool exact = false;              // keep states (exact ==) instead of 64-bit fingerprints
  std::uint64_t max_states = 20'000'000;  // give up (verdict state_limit) beyond this
};

enum class verdict { ok, invariant_violated, end_unreachable, state_limit };

constexpr const char* to_string(verdict v) noexcept {
  switch (v) {
    case verdict::ok: return "ok";
    case verdict::invariant_violated: return "invariant violated";
    case verdict::end_unreachable: return "end of transition unreachable";
    case verdict::state_limit: return "state limit reached";
  }
  return "?";
}

template <class Move>
struct check_result {
  verdict outcome = verdict::ok;
  std::uint64_t states = 0;       // unique states
  std::uint64_t transitions = 0;  // edges explored (moves applied), including to known states
  std::uint32_t depth = 0;        // longest shortest path from the initial state (BFS levels - 1)
  std::uint64_t goal_states = 0;  // states where transition_done()
  std::uint64_t terminal_states = 0;  // states with no enabled move
  std::string violation;          // what is wrong (invariant message, or why the end is unreachable)
  std::vector<Move> counterexample;  // moves from the initial state to the offending state
  double seconds = 0;
  double collision_bound = 0;     // fingerprint mode: ~ states^2 / 2^65

  bool ok() const noexcept { return outcome == verdict::ok; }
};

template <checkable_world W>
check_result<move_of<W>> check(const W& initial, const check_options& opt = {}) {
  using Move = move_of<W>;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  check_result<Move> res;

  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> parent;  // per state id (ids are assigned in BFS order)
  std::vector<Move> via;              // the move from parent
  std::vector<std::uint8_t> goal;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;  // (from, to), liveness only
  std::unordered_map<std::uint64_t, std::uint32_t> by_fingerprint;
  std::unordered_map<W, std::uint32_t> by_state;

  auto path_to = [&](std::uint32_t id) {
    std::vector<Move> p;
    for (std::uint32_t s = id; parent[s] != none; s = parent[s]) p.push_back(via[s]);
    return std::vector<Move>(p.rbegin(), p.rend());
  };
  auto finish = [&]() {
    res.states = parent.size();
    res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    if (!opt.exact) res.collision_bound = double(res.states) * double(res.states) / 36893488147419103232.0;
    return res;
  };
  // Returns (id, fresh).
  auto intern = [&](const W& w) -> std::pair<std::uint32_t, bool> {
    const auto id = static_cast<std::uint32_t>(parent.size());
    if (opt.exact) {
      auto [it, fresh] = by_state.try_emplace(w, id);
      return {it->second, fresh};
    }
    auto [it, fresh] = by_fingerprint.try_emplace(static_cast<std::uint64_t>(std::hash<W>{}(w)), id);
    return {it->second, fresh};
  };

  std::vector<std::pair<std::uint32_t, W>> frontier, next;
  {
    W w0 = initial;
    intern(w0);
    parent.push_back(none);
    via.emplace_back();
    goal.push_back(w0.transition_done() ? 1 : 0);
    if (auto v = w0.check_invariants()) {
      res.outcome = verdict::invariant_violated;
      res.violation = *v;
      return finish();
    }
    frontier.emplace_back(0, std::move(w0));
  }
  std::uint32_t level = 0;
  while (!frontier.empty()) {
    for (auto& [id, w] : frontier) {
      bool any = false;
      for (const auto& m : w.enabled_moves()) {
        any = true;
        ++res.transitions;
        W succ = w;
        succ.apply(m);
        auto [sid, fresh] = intern(succ);
        if (opt.liveness) edges.emplace_back(id, sid);
        if (!fresh) continue;
        parent.push_back(id);
        via.push_back(m);
        goal.push_back(succ.transition_done() ? 1 : 0);
        res.depth = level + 1;
        if (auto v = succ.check_invariants()) {
          res.outcome = verdict::invariant_violated;
          res.violation = *v;
          res.counterexample = path_to(sid);
          return finish();
        }
        if (parent.size() > opt.max_states) {
          res.outcome = verdict::state_limit;
          res.violation = "more than " + std::to_string(opt.max_states) + " states";
          return finish();
        }
        next.emplace_back(sid, std::move(succ));
      }
      if (!any) ++res.terminal_states;
    }
    frontier.clear();
    std::swap(frontier, next);
    ++level;
  }
  for (auto g : goal) res.goal_states += g;

  if (opt.liveness) {
    // Reverse reachability: mark every state from which a goal state is reachable.
    const std::size_t n = parent.size();
    std::vector<std::uint32_t> start(n + 1, 0), rev(edges.size());
    for (const auto& e : edges) ++start[e.second + 1];
    for (std::size_t i = 0; i < n; ++i) start[i + 1] += start[i];
    {
      std::vector<std::uint32_t> fill(start.begin(), start.end() - 1);
      for (const auto& e : edges) rev[fill[e.second]++] = e.first;
    }
    edges.clear();
    edges.shrink_to_fit();
    std::vector<std::uint8_t> reaches(n, 0);
    std::vector<std::uint32_t> work;
    for (std::uint32_t i = 0; i < n; ++i)
      if (goal[i]) { reaches[i] = 1; work.push_back(i); }
    while (!work.empty()) {
      const std::uint32_t s = work.back();
      work.pop_back();
      for (std::uint32_t k = start[s]; k < start[s + 1]; ++k)
        if (!reaches[rev[k]]) { reaches[rev[k]] = 1; work.push_back(rev[k]); }
    }
    for (std::uint32_t i = 0; i < n; ++i)
      if (!reaches[i]) {  // the smallest id is one of the shallowest such states
        res.outcome = verdict::end_unreachable;
        res.violation = "no move sequence from this state ends the transition";
        res.counterexample = path_to(i);
        return finish();
      }
  }
  return finish();
}

/// Breadth-first search for a shortest path from `initial` to a state where `pred` holds (a witness:
/// "this behaviour is possible"). nullopt if no reachable state satisfies it within `max_states`.
template <checkable_world W, class Pred>
std::optional<std::vector<move_of<W>>> find_witness(const W& initial, Pred pred, std::uint64_t max_states = 20'000'000) {
  using Move = move_of<W>;
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> parent{none};
  std::vector<Move> via(1);
  std::unordered_map<std::uint64_t, std::uint32_t> seen{{static_cast<std::uint64_t>(std::hash<W>{}(initial)), 0}};
  auto path_to = [&](std::uint32_t id) {
    std::vector<Move> p;
    for (std::uint32_t s = id; parent[s] != none; s = parent[s]) p.push_back(via[s]);
    return std::vector<Move>(p.rbegin(), p.rend());
  };
  if (pred(initial)) return std::vector<Move>{};
  std::vector<std::pair<std::uint32_t, W>> frontier{{0, initial}}, next;
  while (!frontier.empty() && parent.size() <= max_states) {
    for (auto& [id, w] : frontier)
      for (const auto& m : w.enabled_moves()) {
        W succ = w;
        succ.apply(m);
        const auto sid = static_cast<std::uint32_t>(parent.size());
        if (!seen.try_emplace(static_cast<std::uint64_t>(std::hash<W>{}(succ)), sid).second) continue;
        parent.push_back(id);
        via.push_back(m);
        if (pred(succ)) return path_to(sid);
        next.emplace_back(sid, std::move(succ));
      }
    frontier.clear();
    std::swap(frontier, next);
  }
  return std::nullopt;
}

/// Replays `path` from `initial` (each move must be enabled where it is applied); returns the final
/// world. Used to print and to re-verify counterexamples.
template <checkable_world W>
W replay(const W& initial, const std::vector<move_of<W>>& path) {
  W w = initial;
  for (const auto& m : path) w.apply(m);
  return w;
}

}  // namespace bitrefit::proofs
