// bitrefit/protocol/model/script.hpp — the scenario command language over model::cluster.
//
// Scenario files (tests/protocol/scenarios/*.txt) are etcd-raft "datadriven" style:
//
//   # comment
//   <command>
//   ----
//   <expected output, one or more lines>
//   <blank line>
//
// Commands (one line each):
//   world k=v ...     start a new world. Keys: receivers owners chunks overwrite_chunks transitions gate=sync|async
//                     attest=0|1 xor=0|1 ordered_device=0|1 max_attempts mutation=<name> and the fault
//                     budgets drops duplicates corruptions conflicts crashes failovers log_faults
//                     early_deadlines aborts. Prints the world summary.
//   <move>            any move text as model::cluster::describe prints it, or a prefix of it in whole
//                     words (the first enabled match in canonical order), e.g. `deliver c->r0 prepare`,
//                     `drop o1->r0 payload 1.1/1/0`, `device r0`, `crash r1`, `restart r1`,
//                     `deadline c`, `failover`, `log unknown-lost compare_and_set`. Prints the trace:
//                     every event fed (`node <- event`) and action emitted (`node: action`).
//   settle [no-log]   fault-free fair moves, no deadlines, until none is enabled; prints each move
//                     (`> move`) and its trace. `no-log` leaves commit-log requests pending (so a
//                     scenario can then choose their outcome)
//   run [N]           fair moves including restarts and deadlines until the world settles (at most
//                     N, default 1000); prints only the moves, then `settled` or `not settled`
//   state             the world summary (log, coordinator, owners, receivers with regions)
//   inflight          the in-flight messages, one per line
//   moves             the enabled moves, one per line
//   check             `ok` or `VIOLATION: <invariant>`
// After every move-applying command a violated invariant prints as a last line `VIOLATION: ...`.
//
// A model checker's counterexample is a `world` line plus its moves' texts: `to_scenario` renders it
// in this format (outputs included), so every bug found becomes a regression scenario.
#pragma once

#include <charconv>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

#include "bitrefit/protocol/model/cluster.hpp"

namespace bitrefit::protocol::model {

/// Parse the arguments of a `world` line (without the word `world`). Throws std::invalid_argument
/// naming the bad key or value.
inline world_config parse_world(const std::string& args) {
  world_config c;
  std::istringstream in(args);
  std::string kv;
  while (in >> kv) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("world: expected key=value, got '" + kv + "'");
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    auto n = [&]() -> std::uint32_t {  // whole: no sign, no spaces, in range (strtoul wrapped -1 round)
      std::uint32_t x = 0;
      const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (v.empty() || ec != std::errc{} || p != v.data() + v.size())
        throw std::invalid_argument("world: key '" + k + "' needs a whole number from 0 to 4294967295, got '" + v + "'");
      return x;
    };
    auto& p = c.protocol;
    if (k == "receivers") p.receivers = n();
    else if (k == "owners") p.owners = n();
    else if (k == "chunks") c.chunks_per_owner = n();
    else if (k == "overwrite_chunks") c.overwrite_chunks = n();
    else if (k == "transitions") c.transitions = n();
    else if (k == "gate") {
      if (v == "sync") p.gate = gate_policy::synchronous;
      else if (v == "async") p.gate = gate_policy::asynchronous;
      else throw std::invalid_argument("world: gate must be sync or async, got '" + v + "'");
    } else if (k == "attest") p.attest = n() != 0;
    else if (k == "xor") c.xor_allowed = n() != 0;
    else if (k == "ordered_device") c.ordered_device = n() != 0;
    else if (k == "max_attempts") p.max_attempts = n();
    else if (k == "mutation") {
      auto m = mutation_from_string(v);
      if (!m) throw std::invalid_argument("world: unknown mutation '" + v + "'");
      c.mutation = *m;
    } else if (k == "drops") c.drops = n();
    else if (k == "duplicates") c.duplicates = n();
    else if (k == "corruptions") c.corruptions = n();
    else if (k == "conflicts") c.conflicts = n();
    else if (k == "crashes") c.crashes = n();
    else if (k == "owner_crashes") c.owner_crashes = n();
    else if (k == "sender_restarts") c.sender_restarts = n();
    else if (k == "failovers") c.failovers = n();
    else if (k == "log_faults") c.log_faults = n();
    else if (k == "early_deadlines") c.early_deadlines = n();
    else if (k == "aborts") c.aborts = n();
    else throw std::invalid_argument("world: unknown key '" + k + "'");
  }
  check_world_config(c);
  return c;
}

/// The `world` line that recreates `c`.
inline std::string world_line(const world_config& c) {
  const auto& p = c.protocol;
  std::string s = "world receivers=" + std::to_string(p.receivers) + " owners=" + std::to_string(p.owners) +
                  " chunks=" + std::to_string(c.chunks_per_owner) + " transitions=" + std::to_string(c.transitions) +
                  " gate=" + std::string(to_string(p.gate));
  auto add = [&](const char* k, std::uint64_t v, std::uint64_t dflt) {
    if (v != dflt) s += std::string(" ") + k + "=" + std::to_string(v);
  };
  add("overwrite_chunks", c.overwrite_chunks, 0);
  add("attest", p.attest, 1);
  add("xor", c.xor_allowed, 1);
  add("ordered_device", c.ordered_device, 0);
  add("max_attempts", p.max_attempts, 0);
  if (c.mutation != protocol_mutation::none) s += " mutation=" + std::string(to_string(c.mutation));
  add("drops", c.drops, 0);
  add("duplicates", c.duplicates, 0);
  add("corruptions", c.corruptions, 0);
  add("conflicts", c.conflicts, 0);
  add("crashes", c.crashes, 0);
  add("owner_crashes", c.owner_crashes, 0);
  add("sender_restarts", c.sender_restarts, 0);
  add("failovers", c.failovers, 0);
  add("log_faults", c.log_faults, 0);
  add("early_deadlines", c.early_deadlines, 0);
  add("aborts", c.aborts, 0);
  return s;
}

/// The scenario commands that hand the world to the fair scheduler (fair_move): `settle [no-log]`
/// (no deadlines; at most 100 000 moves; `no-log`: the commit log answers nothing) and `run [N]`
/// (deadlines too; until the world settled, at most N moves, default 1 000).
inline bool is_fair_command(const std::string& cmd) { return cmd == "settle" || cmd == "run"; }

/// Takes the fair scheduler's moves for `cmd rest` (is_fair_command) until none is enabled, the
/// limit is reached, the world settled (`run`), or `take(move)` — which applies the move — returns
/// true (stop: e.g. a violation). The one reading of these commands: the scenario runner below and
/// the spin trace translation (proofs) both replay them.
template <class W, class Take>
void run_fair_command(W& w, const std::string& cmd, const std::string& rest, Take take) {
  const bool full = cmd == "run";
  std::size_t limit = full ? 1000 : 100000;
  bool with_log = true;
  if (full && !rest.empty()) limit = std::stoul(rest);
  if (!full && rest.find("no-log") != std::string::npos) with_log = false;
  for (std::size_t i = 0; i < limit; ++i) {
    if (full && w.settled()) break;
    auto m = fair_move(w, full, with_log);
    if (!m) break;
    if (take(*m)) break;
  }
}

/// Runs scenario commands against one world of type W (cluster or mutated_cluster).
template <class W>
struct basic_script_runner {
  std::optional<W> world;

  /// Execute one command line and return its output (lines joined by '\n', no trailing newline).
  std::string run(const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    std::string rest;
    std::getline(in, rest);
    try {
      if (cmd == "world") {
        world.emplace(parse_world(rest));
        return trim(world->summary());
      }
      if (!world) return "error: no world (start with a `world` line)";
      W& w = *world;
      if (cmd == "state") return trim(w.summary());
      if (cmd == "inflight") {
        for (const auto& e : w.inflight) out.push_back(fmt::str(e));
        return join(out, "(none)");
      }
      if (cmd == "moves") {
        for (const auto& m : w.enabled_moves()) out.push_back(w.describe(m));
        return join(out, "(none)");
      }
      if (cmd == "check") {
        auto v = w.check_invariants();
        return v ? "VIOLATION: " + *v : "ok";
      }
      if (is_fair_command(cmd)) {
        const bool full = cmd == "run";
        run_fair_command(w, cmd, rest, [&](const move& m) {
          out.push_back("> " + w.describe(m));
          std::vector<std::string> t;
          w.apply(m, full ? nullptr : &t);
          for (auto& l : t) out.push_back("  " + l);
          return w.check_invariants().has_value();
        });
        if (full) out.push_back(w.settled() ? "settled" : "not settled");
        if (auto v = w.check_invariants()) out.push_back("VIOLATION: " + *v);
        return join(out, "(no moves)");
      }
      auto m = w.find_move(line);
      if (!m) return "error: no enabled move matches '" + line + "'";
      w.apply(*m, &out);
      if (auto v = w.check_invariants()) out.push_back("VIOLATION: " + *v);
      return join(out, "(no actions)");
    } catch (const std::exception& e) {
      return std::string("error: ") + e.what();
    }
  }

 private:
  static std::string trim(std::string s) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  static std::string join(const std::vector<std::string>& v, const char* empty) {
    if (v.empty()) return empty;
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "\n" : "") + v[i];
    return s;
  }
};

/// Runs scenario commands; a `world` line with `mutation=...` gets the mutated world (the machines
/// instantiated with runtime_mutation), any other the shipped protocol's world.
struct script_runner {
  std::variant<basic_script_runner<cluster>, basic_script_runner<mutated_cluster>> runner;

  std::string run(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "world") {
      std::string rest;
      std::getline(in, rest);
      bool mutated = false;
      try {
        mutated = parse_world(rest).mutation != protocol_mutation::none;
      } catch (const std::exception& e) {
        return std::string("error: ") + e.what();
      }
      if (mutated) runner.emplace<1>();
      else runner.emplace<0>();
    }
    return std::visit([&](auto& r) { return r.run(line); }, runner);
  }
};

/// Render a path of moves from the initial world of `cfg` as a scenario file (outputs included).
/// Moves are given as indices valid in the state they are applied to (of world type W).
template <class W = cluster>
std::string to_scenario(const world_config& cfg, const std::vector<move>& path, const std::string& title = {}) {
  std::string s;
  if (!title.empty()) s += "# " + title + "\n";
  basic_script_runner<W> r;
  const std::string wl = world_line(cfg);
  s += wl + "\n----\n" + r.run(wl) + "\n\n";
  for (const auto& m : path) {
    const std::string text = r.world->describe(m);
    s += text + "\n----\n" + r.run(text) + "\n\n";
  }
  return s;
}

}  // namespace bitrefit::protocol::model
