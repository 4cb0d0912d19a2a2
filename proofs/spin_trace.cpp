// bitrefit-spin-trace — checks the Promela model (spin/refit.pml) and the C++ machines against each
// other on the same runs (bitrefit_proofs/spin_trace.hpp): every scenario file given and, with
// --mutations, the C++ checker's counterexample of every mutation the model also has.
//
//   bitrefit-spin-trace --spin=SPIN --cc=CC --model=refit.pml --workdir=DIR [--mutations] [--table]
//                       [--promela-extra=-DMUT_x] [--random=N [--seed=S] [--keep-outside]
//                        [--receivers=LO-HI] [--owners=LO-HI]] [--jobs=N] [FILE...]
// For each run inside the shared abstraction: writes DIR/<name>/trace.pml, generates and compiles
// pan two or three times (violation run; for a run without a C++ violation, a goal run with
// -DTRACE_GOAL and, where that finds nothing, a reach run with -DTRACE_REACH) and compares verdicts:
//   C++ ok        -> spin: no assertion violation along the trace, and the whole trace followed;
//                    and liveness on the run: the C++ world settles from the run's last state with
//                    no fault (fair scheduler) exactly when the model can end every transition with
//                    its roster converged after the trace (no fault either);
//   C++ violation -> spin: an assertion violation along the trace or in a continuation of it (the
//                    C++ monitors fire at other points than the model's assertions).
// Prints one line per run (AGREE / DISAGREE / SKIP with the reason) and a summary. --table prints
// the move -> Promela step table. --random=N adds N random schedules of the harness
// (random_schedules.hpp) drawn inside the shared abstraction (--receivers, default 2-2; --owners,
// default 1-2; 1 chunk, 1-2 transitions, every fault kind; the summary counts the judged runs that
// lost a live receiver's join);
// schedules the translation still finds outside it are passed over (--keep-outside writes each to
// DIR/outside_<i>.txt, its reason in the first line), and one that fails in the C++ world is listed
// as FAILING (with --keep-outside shrunk and written to DIR/failing_<i>.txt, outputs included).
// --promela-extra adds spin flags to the model only: a drift made on purpose (a Promela mutation
// the C++ run does not have), which the check must report. Exit status: 0 every judged run agrees,
// 1 a disagreement or an error, 2 bad arguments.
// --jobs=N judges N runs at a time (default: one per core). Each run has its own folder and its
// pans are separate processes, so runs share nothing; the lines are printed in the order of the
// runs whatever the number of jobs, so the output does not depend on it.
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bitrefit_proofs/cli_values.hpp"
#include "bitrefit_proofs/checker.hpp"
#include "bitrefit_proofs/cluster_world.hpp"
#include "bitrefit_proofs/mutation_cases.hpp"
#include "bitrefit_proofs/random_schedules.hpp"
#include "bitrefit_proofs/spin_trace.hpp"

using namespace bitrefit;
namespace fs = std::filesystem;
namespace st = proofs::spin;

namespace {

struct tools {
  std::string spin, cc, model;
  std::string promela_extra;  // extra spin -D flags for the model only (a drift injected on purpose)
  fs::path workdir;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream b;
  b << f.rdbuf();
  return b.str();
}

// Runs `cmd` in `dir`, output to `log`; returns the exit status.
int sh(const fs::path& dir, const std::string& cmd, const fs::path& log) {
  const std::string full = "cd '" + dir.string() + "' && " + cmd + " > '" + log.string() + "' 2>&1";
  return std::system(full.c_str());
}

// One spin run on the constrained model: the number of errors pan reports, or -1 on a tool failure.
enum class pan_run { violation, reach, goal };

long spin_errors(const tools& t, const fs::path& dir, const st::translation& tr, pan_run run, std::string& why) {
  const char* tag = run == pan_run::violation ? "violation" : run == pan_run::reach ? "reach" : "goal";
  std::string defs = "-DTRACE";
  if (run == pan_run::goal) defs += " -DTRACE_GOAL";
  else if (run == pan_run::reach) defs += " -DTRACE_REACH";
  else if (tr.cpp_violation) defs += " -DTRACE_FREE_TAIL";
  for (const auto& d : tr.defines) defs += " " + d;
  if (!t.promela_extra.empty()) defs += " " + t.promela_extra;
  std::uint32_t ntrans = 1;
  for (const auto& d : tr.defines)
    if (d.rfind("-DNTRANS=", 0) == 0) ntrans = std::uint32_t(std::stoul(d.substr(9)));
  defs += " -DMAXA=" + std::to_string(std::max<std::uint32_t>(1, 4 / ntrans));
  const fs::path log = dir / (std::string(tag) + ".out");
  // -o3: no statement merging. trace_init's assignments (3 per event) sit in init's atomic block,
  // and spin cannot merge more than 256 of them ("merge requires more than 256 bups": a run of 90
  // events with 5 receivers); the trace runs are small, merging buys them nothing.
  // The spin command, kept beside the run (replay a trail with `spin -t -p` and these flags).
  const std::string spin_cmd = t.spin + " " + defs + " -o3 -a refit.pml";
  std::ofstream(dir / (std::string(tag) + ".cmd")) << spin_cmd << "\n";
  if (sh(dir, spin_cmd, log) != 0) {
    why = "spin -a failed: " + read_file(log);
    return -1;
  }
  if (sh(dir, t.cc + " -O0 -w -DSAFETY -DNOCLAIM -o pan pan.c", log) != 0) {
    why = "compiling pan failed: " + read_file(log);
    return -1;
  }
  // -E: blocked processes are not errors here (the trace blocks every step it does not name);
  // -m: depth enough for the free steps between events.
  sh(dir, "./pan -E -m1000000", log);
  const std::string out = read_file(log);
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("errors: ([0-9]+)"))) {
    why = "pan printed no error count: " + out;
    return -1;
  }
  if (out.find("max search depth too small") != std::string::npos) {
    why = "pan: max search depth too small";
    return -1;
  }
  // An index past one of the model's arrays is no verdict on the protocol: the model left the bounds
  // it is written for (e.g. more attempts than NATT), and pan stops there before any assertion of
  // the run's continuations could fire. Counted as a violation it would "agree" with any C++
  // violation.
  if (out.find("invalid array index") != std::string::npos) {
    why = "pan: the model left its array bounds (\"invalid array index\"), no verdict";
    return -1;
  }
  if (run == pan_run::violation) {  // keep the violated assertion's text for the report
    std::smatch a;
    if (std::regex_search(out, a, std::regex("assertion violated [^\\n]*"))) why = a[0];
  }
  return std::stol(m[1]);
}

struct tally {
  int agree = 0, disagree = 0, skipped = 0, errors = 0;
};

/// A skip reason without the run's own move text and numbers, so that runs outside the shared
/// abstraction for the same reason count together.
std::string reason_kind(const std::string& why) {
  std::string out;
  bool quoted = false, digits = false;
  for (char c : why) {
    if (c == '`') {
      if (!quoted) out.append(3, '.');  // the run's move text
      quoted = !quoted;
      continue;
    }
    if (quoted) continue;
    const bool d = std::isdigit(static_cast<unsigned char>(c)) != 0;
    if (d && !digits) out += 'N';
    digits = d;
    if (!d) out += c;
  }
  return out;
}

/// One line of the report: its kind (what it adds to the tally) and its text.
struct report_line {
  enum kind_t { agree, disagree, skipped, error, note } kind = note;  // note: counted by nobody
  std::string text;
};

template <class... A>
std::string format(const char* fmt, A... a) {
  const int n = std::snprintf(nullptr, 0, fmt, a...);
  std::string out(std::size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, a...);
  out.resize(std::size_t(n));
  return out;
}

void count(const report_line& l, tally& n) {
  switch (l.kind) {
    case report_line::agree: ++n.agree; break;
    case report_line::disagree: ++n.disagree; break;
    case report_line::skipped: ++n.skipped; break;
    case report_line::error: ++n.errors; break;
    case report_line::note: break;
  }
}

// Judges one run (safe to call from several threads at once: a run writes only in its own folder).
report_line judge(const tools& t, const std::string& name, const st::translation& tr) {
  if (tr.skip) return {report_line::skipped, format("SKIP      %-52s %s\n", name.c_str(), tr.skip->c_str())};
  const fs::path dir = t.workdir / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(t.model, dir / "refit.pml");
  std::ofstream(dir / "trace.pml") << tr.trace_pml();
  std::string why_v, why_r;
  const long ev = spin_errors(t, dir, tr, pan_run::violation, why_v);
  // An ok run: the goal run proves "trace followed, and the model can end it" in one pan; only
  // where it finds nothing does the reach run tell "followed, cannot end" from "not followed".
  const long eg = tr.cpp_violation || ev != 0 ? 0 : spin_errors(t, dir, tr, pan_run::goal, why_r);
  const long er = tr.cpp_violation ? 0 : eg != 0 ? eg : spin_errors(t, dir, tr, pan_run::reach, why_r);
  if (ev < 0 || er < 0)
    return {report_line::error, format("ERROR     %-52s %s\n", name.c_str(), (ev < 0 ? why_v : why_r).c_str())};
  const bool spin_ends = eg > 0;
  const std::string cpp_end = !tr.cpp_settles ? ", liveness not compared (" + tr.liveness_note + ")"
                              : *tr.cpp_settles ? ", settles" : ", never settles (" + tr.liveness_note + ")";
  const std::string cpp = tr.cpp_violation ? "violation (" + tr.cpp_message + ")" : "ok" + cpp_end;
  bool ok;
  std::string spin;
  if (tr.cpp_violation) {
    ok = ev > 0;
    spin = ev > 0 ? "violation (" + why_v + ")" : "no violation along the trace or after it";
  } else {
    ok = ev == 0 && er > 0 && (!tr.cpp_settles || *tr.cpp_settles == spin_ends);
    spin = ev > 0    ? "violation (" + why_v + ")"
           : er > 0 ? std::string("ok, trace followed") + (spin_ends ? ", ends" : ", cannot end (no fault after the run)")
                    : "trace NOT followed (the model cannot make these steps)";
  }
  report_line line{ok ? report_line::agree : report_line::disagree,
                   format("%-9s %-52s %zu moves -> %zu events; C++: %s; spin: %s\n", ok ? "AGREE" : "DISAGREE",
                          name.c_str(), tr.moves, tr.events.size(), cpp.c_str(), spin.c_str())};
  if (!ok) line.text += format("          trace and pan output kept in %s\n", dir.c_str());
  return line;
}

/// The report in the making: runs to judge and lines already known (errors, failing random
/// schedules), in the order they are printed.
struct plan {
  struct entry {
    std::string name;
    std::optional<st::translation> run;  // empty: `line` is the entry's whole report
    report_line line;
  };
  std::vector<entry> entries;

  void judge_later(std::string name, st::translation tr) { entries.push_back({std::move(name), std::move(tr), {}}); }
  void say(report_line::kind_t k, std::string text) { entries.push_back({{}, std::nullopt, {k, std::move(text)}}); }

  /// Judges every run, `jobs` at a time, then prints every line in order and adds it to `n`.
  void run_and_print(const tools& t, unsigned jobs, tally& n) {
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < entries.size();)
        if (entries[i].run) entries[i].line = judge(t, entries[i].name, *entries[i].run);
    };
    std::vector<std::jthread> pool;
    for (unsigned k = 1; k < jobs; ++k) pool.emplace_back(worker);
    worker();
    pool.clear();  // joins
    for (const auto& e : entries) {
      std::fputs(e.line.text.c_str(), stdout);
      count(e.line, n);
    }
    std::fflush(stdout);
    entries.clear();
  }
};

// The C++ checker's counterexample of every mutation the model also has (promela_mutation), in the
// world of its row of proofs::mutation_cases() (mutation_cases.hpp: the smallest that contains the
// fault it needs). A liveness row (keep_dead_incarnation) gives a path to a state from which the
// world never settles: replayed, it is a run without a violation whose end C++ cannot settle, and
// the model must not be able to end it either.
std::vector<std::pair<std::string, std::string>> mutation_counterexamples() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : proofs::mutation_cases()) {
    if (!st::promela_mutation(c.mutation())) continue;
    proofs::check_options opt;
    opt.liveness = c.liveness;
    opt.threads = 1;
    const auto r = proofs::check(proofs::mutated_cluster_world(c.bounds), opt);
    const std::string name = "mutation_" + std::string(to_string(c.mutation())) + "_counterexample";
    if (r.ok() || r.counterexample.empty()) {
      out.emplace_back(name, "");  // not found: reported as an error below
      continue;
    }
    out.emplace_back(name, proofs::counterexample_scenario<protocol::model::mutated_cluster>(c.bounds, r.counterexample, r.violation));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  tools t;
  bool mutations = false, table = false, keep_outside = false;
  std::uint64_t random_runs = 0, random_seed = 1;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  proofs::fuzz::range random_receivers{2, 2}, random_owners{1, 2};
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* k) { return a.substr(std::string(k).size()); };
    if (a.rfind("--spin=", 0) == 0) t.spin = val("--spin=");
    else if (a.rfind("--cc=", 0) == 0) t.cc = val("--cc=");
    else if (a.rfind("--model=", 0) == 0) t.model = val("--model=");
    else if (a.rfind("--workdir=", 0) == 0) t.workdir = val("--workdir=");
    else if (a.rfind("--promela-extra=", 0) == 0) t.promela_extra = val("--promela-extra=");
    else if (a == "--mutations") mutations = true;
    else if (a.rfind("--random=", 0) == 0 || a.rfind("--seed=", 0) == 0) {
      const bool runs = a[2] == 'r';
      const auto x = proofs::cli::whole_number<std::uint64_t>(val(runs ? "--random=" : "--seed="));
      if (!x) {
        std::cerr << "bitrefit-spin-trace: " << a << ": expected a whole number\n";
        return 2;
      }
      (runs ? random_runs : random_seed) = *x;
    }
    else if (a == "--table") table = true;
    else if (a.rfind("--jobs=", 0) == 0) {
      const auto x = proofs::cli::whole_number<unsigned>(val("--jobs="));
      if (!x || *x == 0 || *x > 256) {
        std::cerr << "bitrefit-spin-trace: " << a << ": expected a number of jobs from 1 to 256\n";
        return 2;
      }
      jobs = *x;
    }
    else if (a == "--keep-outside") keep_outside = true;
    else if (a.rfind("--receivers=", 0) == 0 || a.rfind("--owners=", 0) == 0) {
      const bool rec = a[2] == 'r';
      auto& r = rec ? random_receivers : random_owners;
      // the model's limits (refit.pml: NR = 1..5, NO = 1..4 with one chunk each)
      if (!proofs::fuzz::parse_range(val(rec ? "--receivers=" : "--owners="), r) || r.hi > (rec ? 5u : 4u)) {
        std::cerr << "bitrefit-spin-trace: " << a << ": expected LO-HI within " << (rec ? "1-5" : "1-4") << "\n";
        return 2;
      }
    }
    else if (a.rfind("--", 0) == 0) { std::cerr << "bitrefit-spin-trace: unknown option " << a << "\n"; return 2; }
    else files.emplace_back(a);
  }
  if (table) {
    std::printf("C++ move (model::cluster) -> Promela step (spin/refit.pml, -DTRACE)\n");
    for (const auto& r : st::mapping) std::printf("- %s\n    -> %s\n", r.cpp, r.promela);
    if (files.empty() && !mutations) return 0;
  }
  if (t.spin.empty() || t.cc.empty() || t.model.empty() || t.workdir.empty()) {
    std::cerr << "bitrefit-spin-trace: --spin, --cc, --model and --workdir are required\n";
    return 2;
  }
  t.model = fs::absolute(t.model).string();
  fs::create_directories(t.workdir);
  tally n;
  plan runs;
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::vector<st::translation> trs;
    try {
      trs = st::translate_scenario_worlds(read_file(f));
    } catch (const std::exception& e) {
      trs.assign(1, st::translation{});
      trs[0].skip = std::string("cannot replay: ") + e.what();
    }
    for (std::size_t k = 0; k < trs.size(); ++k)  // a file with several worlds: one run per world
      runs.judge_later(f.stem().string() + (trs.size() > 1 ? "#" + std::to_string(k + 1) : ""), std::move(trs[k]));
  }
  if (mutations)
    for (const auto& [name, scenario] : mutation_counterexamples()) {
      if (scenario.empty()) {
        runs.say(report_line::error, format("ERROR     %-52s the C++ checker found no counterexample\n", name.c_str()));
        continue;
      }
      std::ofstream(t.workdir / (name + ".txt")) << scenario;
      runs.judge_later(name, st::translate_scenario(scenario));
    }
  // Random schedules inside the shared abstraction's sizes and fault kinds (the harness's
  // generator, bitrefit_proofs/random_schedules.hpp): runs no scenario file was written for.
  if (random_runs) {
    namespace fz = proofs::fuzz;
    fz::options o;
    o.seed = random_seed;
    o.receivers = random_receivers;
    o.owners = random_owners;
    o.chunks = {1, 1};
    o.transitions = {1, 2};
    o.max_attempts = 2;
    o.prefix_moves = 60;
    o.attest_off_probability = 0;
    o.async_gate = false;
    // o.fault_kinds keeps its default: every fault kind (the model judges them all since 2026-12-05).
    int judged = 0, failing = 0, outside = 0, lost_join_runs = 0;
    std::map<std::string, int> outside_reasons;
    std::uint64_t i = 0;
    for (; judged < int(random_runs) && i < 50 * random_runs; ++i) {
      fz::stats stt;
      std::string scenario;
      if (auto f = fz::run_schedule<protocol::model::cluster>(o, i, stt, &scenario)) {
        ++failing;  // not judged (it is the harness's finding), but never passed over in silence
        runs.say(report_line::note, format("FAILING   %-52s C++ %s failure: %s\n",
                                           ("random_seed" + std::to_string(random_seed) + "_" + std::to_string(i)).c_str(),
                                           fz::to_string(f->kind), f->message.c_str()));
        if (keep_outside) {  // shrunk and rendered with outputs, as the harness does
          fz::shrink<protocol::model::cluster>(*f, o);
          std::ofstream(t.workdir / ("failing_" + std::to_string(i) + ".txt")) << fz::render_scenario<protocol::model::cluster>(*f, o);
        }
        continue;
      }
      auto tr = st::translate_scenario(scenario);
      if (tr.skip) {  // outside the shared abstraction: try the next one
        ++outside;
        ++outside_reasons[reason_kind(*tr.skip)];
        if (keep_outside)  // for whoever extends the model: the run and why it could not be judged
          std::ofstream(t.workdir / ("outside_" + std::to_string(i) + ".txt")) << "# outside: " << *tr.skip << "\n"
                                                                             << scenario;
        continue;
      }
      ++judged;
      lost_join_runs += stt.live_joins_dropped > 0;
      std::ofstream(t.workdir / ("random_" + std::to_string(i) + ".txt")) << scenario;
      runs.judge_later("random_seed" + std::to_string(random_seed) + "_" + std::to_string(i), std::move(tr));
    }
    runs.run_and_print(t, jobs, n);
    std::printf("random: %d judged of %llu drawn (%d outside the shared abstraction, %d failing in the C++ world); "
                "%d judged runs lost a live receiver's join\n",
                judged, (unsigned long long)i, outside, failing, lost_join_runs);
    for (const auto& [why, count] : outside_reasons) std::printf("  outside %4d x %s\n", count, why.c_str());
  }
  runs.run_and_print(t, jobs, n);  // without --random: every run is still to judge
  std::printf("summary: %d agree, %d disagree, %d skipped (outside the shared abstraction), %d errors\n", n.agree,
              n.disagree, n.skipped, n.errors);
  return n.disagree || n.errors ? 1 : 0;
}
