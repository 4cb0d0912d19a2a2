// check_protocol — run the exhaustive checker on the protocol's cluster world with given bounds.
//
//   check_protocol [key=value ...] [--exact] [--no-liveness] [--quiet] [--scenario=FILE]
// A progress line goes to stderr every 30 s of search (progress=S to change, --quiet for none).
// keys: receivers owners chunks transitions max_attempts crashes owner_crashes sender_restarts failovers drops duplicates aborts attest=0|1
//       corruptions conflicts log_faults early_deadlines ordered_device=0|1 causal_payloads=0|1 gate=sync|async
//       faults_after_last_commit=0|1 (default 0: faults from the start; 1: only once K is at the last
//       version, for membership after the transitions, e.g. across a takeover)
//       membership=0|1 (liveness goal: the world settles, members and roster included; 0: K reached the goal)
//       mutation=<name> max_states threads (0 = every core; the counts do not depend on it)
//       compress_frontier=0|1 (default 1: the frontier's encodings kept zstd-compressed in blocks)
//       symmetry=0|1 (default 1: receivers interchangeable, one state per renaming class; the
//       verdict does not depend on it, the counts do)
//       trace=0|1 (default 1: each state's parent kept for the counterexample; 0: 16 bytes less
//       per state for runs of hundreds of millions of states, a violation then has no path;
//       with --no-liveness too, the table keeps fingerprints only: 8-byte slots, not 16)
//       sleep=0|1 (default 0; needs --no-liveness: sleep sets, moves whose successor is reached
//       elsewhere are not explored; same states, depth and verdict, fewer transitions, "slept"
//       counts the moves skipped; proofs/README.md "Sleep sets")
//       max_table_bytes (default 0: the memory available when the fingerprint table would grow;
//       a growth past it stops the search with the counts so far, exit status 3, instead of the
//       run being killed for memory)
// Prints one JSON object: bounds, verdict, unique states, transitions, depth, goal and terminal
// states, seconds, and on a violation the message and the counterexample length. With --scenario the
// counterexample is written as a scenario file that tests/protocol's runner replays.
// Exit status: 0 ok, 1 violation found, 2 bad arguments, 3 state limit. Every value is checked
// (numbers whole and in range, flags 0 or 1, a world with at least one receiver, owner and chunk):
// a bad one is named on stderr and nothing is checked (bitrefit_proofs/cli_values.hpp;
// tested by tools_cli.cmake).
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <iostream>
#include <string>

#include "bitrefit_proofs/cli_values.hpp"
#include "bitrefit_proofs/cluster_world.hpp"

using namespace bitrefit;

template <class W>
int run(const proofs::cluster_bounds& b, proofs::check_options opt, const std::string& scenario_file, double progress_s) {
  // Progress on stderr (stdout stays one JSON object): at most one line per `progress_s` seconds.
  double last = 0;
  if (progress_s > 0)
    opt.progress = [&](const proofs::check_progress& p) {
      const bool liveness_starts = std::string(p.phase) == "liveness" && p.liveness_sweeps == 0;
      if (p.seconds - last < progress_s && !liveness_starts) return;
      last = p.seconds;
      char level[96] = "";
      if (p.level_expanded < p.level_size)  // inside a level: how far its expansion is
        std::snprintf(level, sizeof level, " (level %u: %llu of %llu states expanded)", p.depth + 1,
                      (unsigned long long)p.level_expanded, (unsigned long long)p.level_size);
      else if (p.liveness_sweeps > 0)
        std::snprintf(level, sizeof level, " (%u sweeps over the state graph done)", p.liveness_sweeps);
      std::fprintf(stderr,
                   "check_protocol: %s depth %u%s, %llu states, %llu transitions, frontier %llu (%.1f MB), %.0f s, %.0f states/s\n",
                   p.phase, p.depth, level, (unsigned long long)p.states, (unsigned long long)p.transitions,
                   (unsigned long long)p.frontier, double(p.frontier_bytes) / 1e6, p.seconds,
                   p.seconds > 0 ? double(p.states) / p.seconds : 0.0);
    };
  proofs::check_result<protocol::model::move> r;
  try {
    r = proofs::check(proofs::basic_cluster_world<W>(b), opt);
  } catch (const std::invalid_argument& e) {  // options the checker cannot combine (e.g. sleep=1 with liveness)
    std::cerr << "check_protocol: " << e.what() << "\n";
    return 2;
  }
  std::printf("{\"world\": \"%s\", \"verdict\": \"%s\", \"states\": %llu, \"transitions\": %llu, \"depth\": %u, "
              "\"goal_states\": %llu, \"terminal_states\": %llu, \"seconds\": %.2f, \"states_per_second\": %.0f, "
              "\"threads\": %u, \"symmetry\": %d, \"collision_bound\": %.3g, "
              "\"liveness_sweeps\": %u, \"slept\": %llu, \"counterexample_moves\": %zu",
              (protocol::model::world_line(b.world()) + (b.faults_after_last_commit ? " faults_after_last_commit=1" : ""))
                  .c_str(),
              proofs::to_string(r.outcome),
              (unsigned long long)r.states, (unsigned long long)r.transitions, r.depth,
              (unsigned long long)r.goal_states, (unsigned long long)r.terminal_states, r.seconds,
              r.seconds > 0 ? double(r.states) / r.seconds : 0.0, r.threads, b.symmetry && b.receivers >= 2 ? 1 : 0,
              r.collision_bound, r.liveness_sweeps, (unsigned long long)r.slept,
              r.counterexample.size());
  if (!r.ok()) {
    std::string msg;
    for (char c : r.violation) msg += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    std::printf(", \"violation\": \"%s\"", msg.c_str());
  }
  std::printf("}\n");
  if (!opt.trace && r.outcome == proofs::verdict::invariant_violated)  // the violating state is the last one found
    std::fprintf(stderr, "check_protocol: trace=0 keeps no path; rerun with trace=1 max_states=%llu for the counterexample\n",
                 (unsigned long long)r.states);
  if (!opt.trace && r.outcome == proofs::verdict::end_unreachable)
    std::fprintf(stderr, "check_protocol: trace=0 keeps no path; rerun with trace=1 for the counterexample\n");
  if (!r.ok() && !r.counterexample.empty() && !scenario_file.empty()) {
    std::ofstream f(scenario_file);
    f << proofs::counterexample_scenario<W>(b, r.counterexample,
                                         std::string("counterexample found by proofs/check_protocol: ") + r.violation);
  }
  if (r.outcome == proofs::verdict::state_limit) return 3;
  return r.ok() ? 0 : 1;
}

int main(int argc, char** argv) {
  proofs::cluster_bounds b;
  proofs::check_options opt;
  std::string scenario_file;
  double progress_s = 30;  // a progress line on stderr every 30 s of search (--quiet: none; progress=S)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--exact") { opt.exact = true; continue; }
    if (a == "--no-liveness") { opt.liveness = false; continue; }
    if (a == "--quiet") { progress_s = 0; continue; }
    if (a.rfind("--scenario=", 0) == 0) { scenario_file = a.substr(11); continue; }
    auto eq = a.find('=');
    if (eq == std::string::npos) { std::cerr << "check_protocol: expected key=value, got '" << a << "'\n"; return 2; }
    std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    // Every value is checked before use; a bad one ends the run with exit status 2, naming it.
    proofs::cli::value_reader value("check_protocol", a, v);
    auto n = [&] { return value.count(); };
    auto n64 = [&] { return value.count<std::uint64_t>(); };
    auto flag = [&] { return value.flag(); };
    if (k == "receivers") b.receivers = n();
    else if (k == "owners") b.owners = n();
    else if (k == "chunks") b.chunks = n();
    else if (k == "transitions") b.transitions = n();
    else if (k == "max_attempts") b.max_attempts = n();
    else if (k == "crashes") b.crashes = n();
    else if (k == "owner_crashes") b.owner_crashes = n();
    else if (k == "sender_restarts") b.sender_restarts = n();
    else if (k == "aborts") b.aborts = n();
    else if (k == "attest") b.attest = flag();
    else if (k == "failovers") b.failovers = n();
    else if (k == "drops") b.drops = n();
    else if (k == "duplicates") b.duplicates = n();
    else if (k == "corruptions") b.corruptions = n();
    else if (k == "conflicts") b.conflicts = n();
    else if (k == "log_faults") b.log_faults = n();
    else if (k == "early_deadlines") b.early_deadlines = n();
    else if (k == "ordered_device") b.ordered_device = flag();
    else if (k == "causal_payloads") b.causal_payloads = flag();
    else if (k == "faults_after_last_commit") b.faults_after_last_commit = flag();
    else if (k == "membership") b.membership_liveness = flag();
    else if (k == "threads") opt.threads = n();
    else if (k == "symmetry") b.symmetry = flag();
    else if (k == "compress_frontier") opt.compress_frontier = flag();
    else if (k == "trace") opt.trace = flag();
    else if (k == "sleep") opt.sleep_sets = flag();
    else if (k == "progress") progress_s = value.seconds();
    else if (k == "max_states") opt.max_states = n64();
    else if (k == "max_table_bytes") opt.max_table_bytes = n64();
    else if (k == "gate") {
      if (v != "sync" && v != "async") value.refuse("expected sync or async");
      b.gate = v == "async" ? protocol::gate_policy::asynchronous : protocol::gate_policy::synchronous;
    } else if (k == "mutation") {
      auto m = protocol::mutation_from_string(v);
      if (!m) { std::cerr << "check_protocol: unknown mutation '" << v << "'\n"; return 2; }
      b.mutation = *m;
    } else { std::cerr << "check_protocol: unknown key '" << k << "'\n"; return 2; }
    if (value.refusal()) { std::cerr << *value.refusal() << "\n"; return 2; }
  }
  // The shipped protocol's world, or the machines with a run-time mutation (mutation.hpp).
  return b.mutation == protocol::protocol_mutation::none ? run<protocol::model::cluster>(b, opt, scenario_file, progress_s)
                                                         : run<protocol::model::mutated_cluster>(b, opt, scenario_file, progress_s);
}
