// bitrefit-fuzz-protocol — the randomised long-run harness over the real protocol machines
// (bitrefit_proofs/random_schedules.hpp): random schedules with every fault kind, invariants after
// every move, the world required to settle once faults stop, failures shrunk to a scenario file.
//
//   bitrefit-fuzz-protocol [key=value ...] [--scenario=FILE] [--json=FILE]
//   bitrefit-fuzz-protocol --replay=FILE   (replay a scenario file through the scenario runner: exit 0
//                                           iff every recorded output is reproduced)
// keys: seed schedules (0 = until the time limit) seconds threads
//       receivers=LO-HI owners=LO-HI chunks=LO-HI transitions=LO-HI   (a single number: LO=HI)
//       max_attempts (coordinator; 0 = retry forever, the default) fault_attempts (faults only while fewer
//       attempts of the current transition started; default 2) faults_after_last_commit=0|1 (faults
//       only once K is at the last version: membership after the transitions) attest_off_p (share of worlds without
//       attestation) faults (each kind's budget drawn from [0, faults]) prefix (fault-phase moves, max)
//       fault_p (chance to pick an enabled fault) settle_bound (fair moves to settle) async=0|1
//       mutation=<name> shrink=0|1 shrink_replays progress (seconds between progress lines, 0: none)
//       keep_going=0|1 (count failures by class, keep and shrink the first of each: FILE.N.txt)
// Progress lines go to stderr; one JSON summary to stdout (and to --json=FILE). On a failure the
// shrunk schedule is printed and written to --scenario=FILE (default: fuzz_failure.txt) in the
// scenario format of tests/protocol/scenarios.
// Exit status: 0 no failure, 1 failure found, 2 bad arguments.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bitrefit_proofs/cli_values.hpp"
#include "bitrefit_proofs/random_schedules.hpp"

using namespace bitrefit;
namespace fz = proofs::fuzz;

namespace {

template <class W>
int run(const fz::options& o, const std::string& scenario_file, const std::string& json_file) {
  const auto r = fz::run<W>(o);
  const auto& t = r.totals;
  nlohmann::ordered_json j;
  j["tool"] = "bitrefit-fuzz-protocol";
  j["seed"] = o.seed;
  j["threads"] = o.threads;
  j["worlds"] = {{"receivers", std::to_string(o.receivers.lo) + "-" + std::to_string(o.receivers.hi)},
                 {"owners", std::to_string(o.owners.lo) + "-" + std::to_string(o.owners.hi)},
                 {"chunks", std::to_string(o.chunks.lo) + "-" + std::to_string(o.chunks.hi)},
                 {"transitions", std::to_string(o.transitions.lo) + "-" + std::to_string(o.transitions.hi)},
                 {"max_attempts", o.max_attempts},
                 {"fault_attempts", o.fault_attempts},
                 {"faults_after_last_commit", o.faults_after_last_commit},
                 {"attest_off_probability", o.attest_off_probability},
                 {"faults_per_kind_max", o.max_faults_per_kind},
                 {"prefix_moves_max", o.prefix_moves},
                 {"fault_probability", o.fault_probability},
                 {"settle_bound", o.settle_bound},
                 {"mutation", std::string(protocol::to_string(o.mutation))}};
  j["schedules"] = t.schedules;
  j["moves"] = t.moves;
  j["fault_moves"] = t.fault_moves;
  j["settle_moves"] = t.settle_moves;
  j["max_settle_moves"] = t.max_settle_moves;
  j["states_touched"] = t.states_touched;
  j["distinct_states_estimate"] = std::llround(t.distinct.estimate());
  j["settled"] = t.settled;
  j["transitions_committed"] = t.transitions_committed;
  nlohmann::ordered_json f;
  for (std::size_t i = 0; i < std::size(t.faults); ++i) f[fz::fault_names[i]] = t.faults[i];
  j["faults"] = f;
  j["live_joins_dropped"] = t.live_joins_dropped;
  nlohmann::ordered_json byr;
  for (std::size_t i = 1; i < std::size(t.by_receivers); ++i)
    if (t.by_receivers[i]) byr[std::to_string(i)] = t.by_receivers[i];
  j["schedules_by_receivers"] = byr;
  j["seconds"] = std::round(r.seconds * 100) / 100;
  j["schedules_per_second"] = r.seconds > 0 ? std::round(double(t.schedules) / r.seconds) : 0.0;
  j["moves_per_second"] = r.seconds > 0 ? std::round(double(t.moves) / r.seconds) : 0.0;
  j["time_limited"] = r.time_limited;
  if (r.first_failure) {
    const auto& ff = *r.first_failure;
    j["verdict"] = "failure";
    j["failure"] = {{"kind", fz::to_string(ff.kind)},
                    {"schedule", ff.index},
                    {"message", ff.message},
                    {"world", protocol::model::world_line(ff.config)},
                    {"moves", ff.moves.size()},
                    {"shrunk_moves", ff.shrunk.size()},
                    {"shrink_replays", ff.replays},
                    {"scenario_file", scenario_file}};
    std::ofstream(scenario_file) << ff.scenario;
    if (!o.keep_going) std::cerr << ff.scenario;
    j["failures"] = r.failures;
    nlohmann::ordered_json cls = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < r.classes.size(); ++i) {
      const auto& c = r.classes[i];
      const std::string file = scenario_file + "." + std::to_string(i) + ".txt";
      std::ofstream(file) << c.first.scenario;
      cls.push_back({{"class", c.signature}, {"count", c.count}, {"first_schedule", c.first.index},
                     {"world", protocol::model::world_line(c.first.config)}, {"moves", c.first.moves.size()},
                     {"shrunk_moves", c.first.shrunk.size()}, {"scenario_file", file}});
    }
    if (o.keep_going) j["failure_classes"] = cls;
  } else {
    j["verdict"] = "ok";
  }
  std::cout << j.dump() << "\n";
  if (!json_file.empty()) std::ofstream(json_file) << j.dump(2) << "\n";
  return r.first_failure ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  fz::options o;
  o.progress = [](const std::string& line) { std::cerr << line << std::endl; };
  std::string scenario_file = "fuzz_failure.txt", json_file;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--scenario=", 0) == 0) { scenario_file = a.substr(11); continue; }
    if (a.rfind("--json=", 0) == 0) { json_file = a.substr(7); continue; }
    if (a.rfind("--replay=", 0) == 0) {  // check a scenario file against the scenario runner, then exit
      std::ifstream in(a.substr(9));
      if (!in) { std::cerr << "bitrefit-fuzz-protocol: cannot read " << a.substr(9) << "\n"; return 2; }
      std::stringstream buf;
      buf << in.rdbuf();
      const auto r = fz::replay_scenario_text(buf.str());
      if (!r.error.empty()) { std::cerr << a.substr(9) << ": " << r.error << "\n"; return 2; }
      for (const auto& m : r.mismatches) std::cerr << "mismatch: " << m << "\n";
      std::cout << a.substr(9) << ": " << r.commands << " commands, " << r.mismatches.size()
                << " mismatches; last output line: " << r.last_output.substr(r.last_output.rfind('\n') + 1) << "\n";
      return r.mismatches.empty() ? 0 : 1;
    }
    const auto eq = a.find('=');
    if (eq == std::string::npos) { std::cerr << "bitrefit-fuzz-protocol: expected key=value, got '" << a << "'\n"; return 2; }
    const std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    // Every value is checked before use (bitrefit_proofs/cli_values.hpp); a bad one ends the run
    // with exit status 2, naming it.
    proofs::cli::value_reader value("bitrefit-fuzz-protocol", a, v);
    auto n = [&] { return value.count(); };
    auto n64 = [&] { return value.count<std::uint64_t>(); };
    auto rng_arg = [&](fz::range& r) {
      if (!fz::parse_range(v, r)) value.refuse("expected N or LO-HI with 1 <= LO <= HI");
    };
    if (k == "seed") o.seed = n64();
    else if (k == "schedules") o.schedules = n64();
    else if (k == "seconds") o.seconds = value.seconds();
    else if (k == "threads") o.threads = std::max(1u, n());
    else if (k == "receivers") rng_arg(o.receivers);
    else if (k == "owners") rng_arg(o.owners);
    else if (k == "chunks") rng_arg(o.chunks);
    else if (k == "transitions") rng_arg(o.transitions);
    else if (k == "max_attempts") o.max_attempts = n();
    else if (k == "fault_attempts") o.fault_attempts = n();
    else if (k == "faults_after_last_commit") o.faults_after_last_commit = value.flag();
    else if (k == "attest_off_p") o.attest_off_probability = value.probability();
    else if (k == "faults") o.max_faults_per_kind = n();
    else if (k == "prefix") o.prefix_moves = n();
    else if (k == "fault_p") o.fault_probability = value.probability();
    else if (k == "settle_bound") o.settle_bound = n();
    else if (k == "async") o.async_gate = value.flag();
    else if (k == "shrink") o.shrink = value.flag();
    else if (k == "keep_going") o.keep_going = value.flag();
    else if (k == "shrink_replays") o.shrink_replays = n();
    else if (k == "progress") o.progress_seconds = value.seconds();
    else if (k == "mutation") {
      auto m = protocol::mutation_from_string(v);
      if (!m) { std::cerr << "bitrefit-fuzz-protocol: unknown mutation '" << v << "'\n"; return 2; }
      o.mutation = *m;
    } else { std::cerr << "bitrefit-fuzz-protocol: unknown key '" << k << "'\n"; return 2; }
    if (value.refusal()) { std::cerr << *value.refusal() << "\n"; return 2; }
  }
  if (o.schedules == 0 && o.seconds <= 0) {
    std::cerr << "bitrefit-fuzz-protocol: schedules=0 (no limit) needs seconds=N\n";
    return 2;
  }
  if (o.max_attempts && o.fault_attempts > o.max_attempts) {
    std::cerr << "bitrefit-fuzz-protocol: fault_attempts must not exceed max_attempts (faults stop when the last attempt starts)\n";
    return 2;
  }
  return o.mutation == protocol::protocol_mutation::none ? run<protocol::model::cluster>(o, scenario_file, json_file)
                                                         : run<protocol::model::mutated_cluster>(o, scenario_file, json_file);
}
