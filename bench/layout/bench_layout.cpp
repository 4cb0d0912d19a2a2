// bitrefit-bench-layout — the delta build the sender's owners run, direct projection of trainer
// shards (layout::direct_delta::changes_into, per canonical tensor, called by
// refit::sharded_projection::changes when an owner freezes a transition), vs the materialising
// REFERENCE (bench/layout/materialising_reference.hpp: canonical tensors gathered first, then
// diffed; not in the library), on a Qwen3-30B-A3B-shaped model scaled to about 1 GiB (fewer
// layers, experts and vocabulary; hidden size, heads, KV heads, head dim and expert width as the
// real model), trainer TP=2, EP=2.
//
//   bitrefit-bench-layout [--json] [--layers 4] [--experts 16] [--vocab 32768] [--tp 2] [--ep 2]
//                         [--change 0.03] [--reps 3]
//   bitrefit-bench-layout --serving-report   (fraction of serving bytes by direct projection vs
//                                             FP8 conversion for Llama-3-8B and Qwen3-30B-A3B at
//                                             several TP/PP/EP; one JSON object per line)
//
// direct_s: every canonical tensor's changes through direct_delta::changes_into in overwrite mode
// (positions + new bits: the owner's frozen change set), exactly the engine's call.
// materialise_s is the reference path as a gathered state dict builds it: the whole canonical model
// gathered into freshly allocated tensors each refit, then diffed. materialise_per_tensor_s is
// the strongest materialising variant: one tensor at a time through a scratch buffer kept (and
// already faulted in) across refits. speedup_ratio = materialise_s / direct_s.
//
// All paths run single-threaded on the same shards and the same canonical baseline, alternating,
// `reps` times each, and their change sets are checked to be identical. Reported times are the
// minimum over reps of the building thread's CPU time (the cores are shared with other jobs, so
// wall time mostly measures waiting); wall-clock minima are reported next to them. Changes are uniform at --change per element (low mantissa bits XORed,
// as BF16 rounding of small updates does), consistent across replicas. Each path writes its change
// set into workspaces reused across reps, so the first rep (page faults) is never the minimum.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <time.h>
#include <vector>

#include "../common/process_memory.hpp"
#include "bitrefit/layout/delta_build.hpp"
#include "materialising_reference.hpp"
#include "bitrefit/layout/megatron.hpp"
#include "bitrefit/layout/serving_report.hpp"

using namespace bitrefit;
using namespace bitrefit::layout;
using bitrefit::bench::materialising_delta;

namespace {

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// CPU seconds of the calling thread: on a machine whose cores are shared with other jobs, the
/// work a path does, without the time it waited for a core.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::uint64_t peak_rss_bytes() {
  const long kib = bitrefit_bench::status_kib("VmHWM:");
  return kib < 0 ? 0 : static_cast<std::uint64_t>(kib) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::uint64_t layers = 4, experts = 16, vocab = 32768;
  std::uint32_t tp = 2, ep = 2, reps = 3;
  double change = 0.03;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bitrefit-bench-layout: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") json = true;
    else if (a == "--serving-report") {
      struct row {
        model_spec m;
        trainer_parallel p;
      };
      const std::vector<row> rows{
          {model_spec::llama3_8b(), {.tp = 1}},
          {model_spec::llama3_8b(), {.tp = 4, .pp = 2}},
          {model_spec::llama3_8b(), {.tp = 8, .pp = 4}},
          {model_spec::qwen3_30b_a3b(), {.tp = 2, .dp = 1, .ep = 2}},
          {model_spec::qwen3_30b_a3b(), {.tp = 4, .pp = 4, .dp = 2, .ep = 8}},
          {model_spec::qwen3_30b_a3b(), {.tp = 4, .pp = 2, .dp = 1, .ep = 1, .etp = 4}},
      };
      for (const row& r : rows)
        for (bool fp8 : {false, true}) {
          const auto b = serving_report(r.m, r.p, fp8);
          std::printf("{\"model\": \"%s\", \"tp\": %u, \"pp\": %u, \"dp\": %u, \"ep\": %u, \"etp\": %u, \"fp8_serving\": %s, "
                      "\"serving_bytes\": %llu, \"direct_bytes\": %llu, \"converted_bytes\": %llu, \"converted_gathered_bytes\": %llu, "
                      "\"direct_fraction\": %.4f, \"conversion_fraction\": %.4f}\n",
                      r.m.name.c_str(), r.p.tp, r.p.pp, r.p.dp, r.p.ep, r.p.etp, fp8 ? "true" : "false", (unsigned long long)b.total(),
                      (unsigned long long)b.direct_bytes, (unsigned long long)b.converted_bytes, (unsigned long long)b.converted_gathered_bytes,
                      b.direct_fraction(), b.conversion_fraction());
        }
      return 0;
    }
    else if (a == "--layers") layers = std::stoull(next());
    else if (a == "--experts") experts = std::stoull(next());
    else if (a == "--vocab") vocab = std::stoull(next());
    else if (a == "--tp") tp = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--ep") ep = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--change") change = std::stod(next());
    else if (a == "--reps") reps = static_cast<std::uint32_t>(std::stoul(next()));
    else {
      std::fprintf(stderr, "usage: bitrefit-bench-layout [--json] [--layers N] [--experts E] [--vocab V] [--tp T] [--ep E] [--change p] [--reps r]\n");
      return 2;
    }
  }
  if (!(change > 0 && change < 1) || reps == 0) {
    std::fprintf(stderr, "bitrefit-bench-layout: --change must be in (0, 1) and --reps positive\n");
    return 2;
  }
  try {
    model_spec m = model_spec::qwen3_30b_a3b();
    m.name = "qwen3-30b-a3b-scaled";
    m.layers = layers, m.experts = experts, m.vocab = vocab;
    std::uint32_t dp = 1;
    while ((tp * dp) % ep) ++dp;
    const trainer_parallel par{.tp = tp, .pp = 1, .dp = dp, .ep = ep};
    const double t0 = now();
    auto manifest = std::make_shared<const model_manifest>(canonical_manifest(m));
    canonical_store baseline(*manifest);
    std::uint64_t seed = 1;
    for (const auto& t : manifest->tensors()) {
      auto b = baseline.bytes(t.name);
      for (std::size_t o = 0; o + 8 <= b.size(); o += 8) {
        const std::uint64_t w = splitmix(seed);
        std::memcpy(b.data() + o, &w, 8);
      }
    }
    // Shards at the new version: scatter the baseline through every run, then change elements at
    // rate `change` chosen by canonical coordinate (so replicas agree).
    std::vector<megatron_projection> projs;
    std::vector<std::vector<std::vector<std::byte>>> data;
    const double log_keep = std::log1p(-change);
    for (const trainer_rank& r : all_ranks(par)) {
      projs.emplace_back(manifest, m, par, r);
      auto& d = data.emplace_back();
      for (const shard_tensor& st : projs.back().tensors()) {
        auto& buf = d.emplace_back(st.elements() * 2, std::byte{0});
        for (const run_block& b : st.runs) {
          const std::byte* src = baseline.bytes(manifest->tensors()[b.tensor].name).data();
          for_each_run(b, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
            std::memcpy(buf.data() + lb * 2, src + cb * 2, len * 2);
            std::uint64_t s = (static_cast<std::uint64_t>(b.tensor) << 40) ^ cb;  // seeded by canonical coordinate
            for (std::uint64_t o = 0;;) {
              const double u = (static_cast<double>(splitmix(s) >> 11) + 0.5) * 0x1p-53;
              o += static_cast<std::uint64_t>(std::log(u) / log_keep);
              if (o >= len) break;
              buf[(lb + o) * 2] ^= std::byte(1 + splitmix(s) % 255);  // low mantissa byte
              ++o;
            }
          });
        }
      }
    }
    std::vector<std::vector<std::span<const std::byte>>> spans(data.size());
    for (std::size_t k = 0; k < data.size(); ++k)
      for (auto& b : data[k]) spans[k].emplace_back(b);
    materialising_delta mat(*manifest, materialising_delta::scope::whole_model_fresh);
    materialising_delta streamed(*manifest, materialising_delta::scope::per_tensor);
    for (std::size_t k = 0; k < projs.size(); ++k) mat.add_shard(projs[k], spans[k]), streamed.add_shard(projs[k], spans[k]);
    const double setup_s = now() - t0;

    // Each sample records thread CPU seconds and wall seconds; the paths alternate within a rep.
    struct samples {
      std::vector<double> cpu, wall;
      double best_cpu() const { return *std::min_element(cpu.begin(), cpu.end()); }
      double best_wall() const { return *std::min_element(wall.begin(), wall.end()); }
    } direct_t, mat_t, streamed_t;
    auto timed = [](samples& s, auto&& f) {
      const double c = cpu_now(), w = now();
      f();
      s.cpu.push_back(cpu_now() - c);
      s.wall.push_back(now() - w);
    };
    // Output workspaces are reused across reps by every path (a steady-state owner allocates
    // nothing per refit), so no path pays page faults for its change set after the first rep.
    const direct_delta direct{std::span<const megatron_projection>(projs)};
    const auto local = [&](std::size_t shard, std::size_t k) { return spans.at(shard).at(k); };
    std::vector<change_item> direct_ws(manifest->size()), mat_ws, streamed_ws;
    for (std::size_t t = 0; t < manifest->size(); ++t) direct_ws[t].tensor = manifest->tensors()[t].name;
    for (std::uint32_t rep = 0; rep < reps; ++rep) {
      timed(direct_t, [&] {
        for (std::size_t t = 0; t < manifest->size(); ++t)
          direct.changes_into(t, local, baseline.bytes(manifest->tensors()[t].name), value_mode::overwrite, direct_ws[t]);
      });
      timed(mat_t, [&] { mat.build_into(baseline, value_mode::overwrite, mat_ws); });
      timed(streamed_t, [&] { streamed.build_into(baseline, value_mode::overwrite, streamed_ws); });
    }
    auto compact = [](std::vector<change_item>& ws) {
      std::vector<change_item> out;
      for (auto& it : ws)
        if (!it.positions.empty()) out.push_back(std::move(it));
      return out;
    };
    const std::vector<change_item> direct_items = compact(direct_ws), mat_items = compact(mat_ws), streamed_items = compact(streamed_ws);
    std::uint64_t changed = 0;
    for (auto& it : mat_items) changed += it.positions.size();
    const bool identical = direct_items == mat_items && streamed_items == mat_items;
    const double direct_s = direct_t.best_cpu(), mat_s = mat_t.best_cpu(), streamed_s = streamed_t.best_cpu();
    auto list = [](const std::vector<double>& v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    if (json) {
      std::printf(
          "{\"model\": \"%s\", \"layers\": %llu, \"experts\": %llu, \"vocab\": %llu, \"tp\": %u, \"ep\": %u, \"dp\": %u, "
          "\"elements\": %llu, \"bytes\": %llu, \"change_rate\": %.4f, \"changed\": %llu, \"reps\": %u, \"threads\": 1, "
          "\"clock\": \"thread_cpu_min\", \"direct_function\": \"layout::direct_delta::changes_into\", \"direct_s\": %.6f, \"materialise_s\": %.6f, \"speedup_ratio\": %.4f, \"identical\": %s, "
          "\"materialise_per_tensor_s\": %.6f, \"speedup_vs_per_tensor\": %.4f, "
          "\"direct_wall_s\": %.6f, \"materialise_wall_s\": %.6f, \"materialise_per_tensor_wall_s\": %.6f, \"speedup_ratio_wall\": %.4f, "
          "\"direct_cpu_samples_s\": %s, \"materialise_cpu_samples_s\": %s, \"materialise_per_tensor_cpu_samples_s\": %s, "
          "\"setup_s\": %.3f, \"peak_rss_bytes\": %llu}\n",
          m.name.c_str(), (unsigned long long)layers, (unsigned long long)experts, (unsigned long long)vocab, tp, ep, dp,
          (unsigned long long)manifest->total_elements(), (unsigned long long)manifest->total_bytes(), change,
          (unsigned long long)changed, reps, direct_s, mat_s, mat_s / direct_s, identical ? "true" : "false", streamed_s, streamed_s / direct_s, direct_t.best_wall(), mat_t.best_wall(), streamed_t.best_wall(), mat_t.best_wall() / direct_t.best_wall(),
          list(direct_t.cpu).c_str(), list(mat_t.cpu).c_str(), list(streamed_t.cpu).c_str(), setup_s, (unsigned long long)peak_rss_bytes());
    } else {
      std::printf("model %s: %llu elements, %.3f GiB BF16, TP=%u EP=%u DP=%u, %llu changed (%.2f%%)\n", m.name.c_str(),
                  (unsigned long long)manifest->total_elements(), manifest->total_bytes() / 1073741824.0, tp, ep, dp,
                  (unsigned long long)changed, 100.0 * changed / manifest->total_elements());
      std::printf("                    cpu s (min)  wall s (min)  cpu samples\n");
      std::printf("direct projection   %8.3f     %8.3f     %s\n", direct_s, direct_t.best_wall(), list(direct_t.cpu).c_str());
      std::printf("materialise + diff  %8.3f     %8.3f     %s   (whole model gathered into fresh tensors, diffed)\n", mat_s, mat_t.best_wall(),
                  list(mat_t.cpu).c_str());
      std::printf("  per tensor        %8.3f     %8.3f     %s   (gather one tensor into a scratch kept across refits, diff, next)\n", streamed_s, streamed_t.best_wall(),
                  list(streamed_t.cpu).c_str());
      std::printf("speedup %.2fx cpu, %.2fx wall (%.2fx cpu vs per tensor); change sets identical: %s; setup %.1f s; peak RSS %.2f GiB\n",
                  mat_s / direct_s, mat_t.best_wall() / direct_t.best_wall(), streamed_s / direct_s, identical ? "yes" : "NO", setup_s,
                  peak_rss_bytes() / 1073741824.0);
    }
    return identical ? 0 : 1;
  } catch (const error& e) {
    std::fprintf(stderr, "bitrefit-bench-layout: %s\n", e.what());
    return 1;
  }
}
