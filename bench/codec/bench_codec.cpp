// bitrefit-bench-codec — payload bytes and single-thread speed of the codec on a BF16 model.
//
//   bitrefit-bench-codec --size-mib 1024 --change adamw --json [--backend host]
//
// Model: BF16 tensors of up to 64 MiB each, `--size-mib` in total. `--change adamw` simulates a
// trainer with FP32 master weights (init N(0, 0.02), AdamW lr 1e-6, betas (0.9, 0.999), synthetic
// gradients) and takes the delta of its last step (`--adamw-steps`, default 3: version 2 -> 3), so
// BF16 rounding decides which elements change. `--change P` (0.01, 0.03, 0.05, ...) starts from
// N(0, 0.02) BF16 weights and moves each element with probability P to an adjacent BF16 value
// (bits +1 or -1), the way a rounding flip moves it.
//
// Measured side by side in one run, one thread (thread CPU time; wall time beside): memcpy_s (copy of the model: the receiver's work
// copy), memcmp_s (full memcmp of two equal buffers of the model's size), encode_s (change
// detection + encoding of every chunk, chosen mode), apply_s (verify + decode + apply every frame
// in place). Sizes: dense_bytes, overwrite_only_bytes (positions + absolute values, same encoder,
// same zstd level), xor_bytes (XOR masks only), chosen_bytes (per item the smaller, the default),
// entropy_bytes = n·H(c/n) + c·H(XOR words). peak_extra_bytes: receiver scratch beyond the model
// (decoder scratch + the largest frame held). The applied copy is compared with the target bytes
// (bit_exact). encode_known_s: the sender's path since codec3 (refit::owner_shard::encode), the
// same chunks encoded from each tensor's known change set (encode_known, no change detection),
// frames checked byte-identical to encode_s's; ratio_encode_known_vs_encode compares the two.
//
// `--encode-only`: the chosen encode and the memcmp alone, paired per repetition, then one
// bit-exact apply check (measure_encode_only): the run to profile the encoder with.
//
// Backends: `--backend NAME` picks an entry of backend_registry(); a backend that keeps tensors
// elsewhere (device memory) registers a runner that stages the model and reuses measure().
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/codec.hpp"
#include "bitrefit/durability/change_set.hpp"
#if defined(BITREFIT_BENCH_THRUST)
#include "bitrefit/codec/thrust/backend.hpp"
#endif
#include "sim_stream.hpp"

using namespace bitrefit;
using namespace bitrefit::codec;

namespace {

struct bench_args {
  std::uint64_t size_mib = 1024;
  std::string change = "adamw";
  bool json = false;
  std::string backend = "host";
  int zstd_level = default_zstd_level;
  std::uint64_t frame_mib = 64;
  int adamw_steps = 3;
  std::uint64_t seed = 42;
  int repeat = 1;  // timing repetitions (best of)
  unsigned threads = 2;  // thread-scaling measurement
  bool encode_only = false;  // --encode-only: memcmp and the chosen encode alternately, nothing else
};

struct model {
  std::vector<tensor_info> infos;
  std::unique_ptr<std::byte[]> old_b, new_b, work;
  std::uint64_t bytes = 0;
  std::vector<std::uint64_t> offsets;  // byte offset of each tensor (in infos order = name order)
};

// Timing: CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID). The build machine is shared
// (load far above its core count), so wall time would mostly measure the scheduler; every phase
// here is single-threaded and CPU/memory bound, so thread CPU time is the work it costs. Wall
// times are reported beside (…_wall_s).
struct stamp {
  double cpu, wall;
};
inline stamp now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return {static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec),
          std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()};
}
struct elapsed {
  double cpu = 1e300, wall = 1e300;
  void keep_min(stamp t0) {
    const stamp t1 = now();
    cpu = std::min(cpu, t1.cpu - t0.cpu);
    wall = std::min(wall, t1.wall - t0.wall);
  }
};
using clock_t_ = std::chrono::steady_clock;
double seconds_since(clock_t_::time_point t0) {
  return std::chrono::duration<double>(clock_t_::now() - t0).count();
}

model make_model(const bench_args& a) {
  model m;
  m.bytes = a.size_mib << 20;
  const std::uint64_t per = 64ull << 20;
  for (std::uint64_t off = 0, i = 0; off < m.bytes; off += per, ++i) {
    const std::uint64_t b = std::min(per, m.bytes - off);
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%04llu.weight", static_cast<unsigned long long>(i));
    m.infos.push_back({name, dtype::BF16, {b / 2}});
  }
  model_manifest man(m.infos);  // name order
  m.infos = man.tensors();
  std::uint64_t off = 0;
  for (auto& t : m.infos) {
    m.offsets.push_back(off);
    off += t.bytes();
  }
  m.old_b.reset(new std::byte[m.bytes]);
  m.new_b.reset(new std::byte[m.bytes]);
  m.work.reset(new std::byte[m.bytes]);
  auto* o = reinterpret_cast<std::uint16_t*>(m.old_b.get());
  auto* n = reinterpret_cast<std::uint16_t*>(m.new_b.get());
  const std::uint64_t elems = m.bytes / 2;
  if (a.change == "adamw") {
    bitrefit_bench::adamw_stream sim;
    sim.seed = a.seed;
    sim.steps = a.adamw_steps;
    const std::size_t blk = 1 << 16;
    for (std::uint64_t s = 0; s < elems; s += blk) sim.fill(s, std::min<std::uint64_t>(blk, elems - s), o + s, n + s);
  } else {
    const double p = std::strtod(a.change.c_str(), nullptr);
    if (!(p >= 0.0 && p <= 1.0)) throw error(errc::invalid_argument, "--change must be adamw or a rate in [0, 1]");
    const std::uint64_t thresh = static_cast<std::uint64_t>(p * 18446744073709551615.0);
    const std::uint64_t k_init = bitrefit_bench::mix64(a.seed * 4 + 1), k_pick = bitrefit_bench::mix64(a.seed * 4 + 2);
    for (std::uint64_t j = 0; j < elems; ++j) {
      o[j] = bitrefit_bench::bf16_rne(0.02f * bitrefit_bench::approx_normal(k_init, j));
      const std::uint64_t r = bitrefit_bench::mix64(k_pick + 0x9E3779B97F4A7C15ull * (j + 1));
      n[j] = o[j];
      if (r < thresh) n[j] = static_cast<std::uint16_t>((r & 1) ? o[j] + 1 : o[j] - 1);
    }
  }
  return m;
}

std::vector<chunk_piece> pieces_of(const model& m, const std::vector<canonical_range>& chunk, const model_manifest& man) {
  std::vector<chunk_piece> ps;
  for (auto& r : chunk) {
    const std::size_t ti = *man.index_of(r.tensor);
    const auto& t = m.infos[ti];
    const std::uint64_t off = m.offsets[ti] + r.begin * 2;
    const std::size_t len = r.size() * 2;
    ps.push_back({t.name, t.type, t.elements(), r.begin, r.end, {m.old_b.get() + off, len}, {m.new_b.get() + off, len}});
  }
  return ps;
}

// The frames of a run, copied out after its timing. The encoders write each chunk's frame into a
// buffer of its own that keeps its capacity across repetitions: copying frames out inside the timed
// loop (into vectors freshly allocated each repetition, so fresh pages) added ~25 % to encode_s at
// 5 % change (0.048 s against 0.037 s, 256 MiB) and counted work no sender does.
void copy_frames(const std::vector<byte_buffer>& outs, std::vector<std::vector<std::byte>>& frames) {
  frames.clear();
  for (const auto& o : outs) frames.emplace_back(o.data(), o.data() + o.size());
}

// Every chunk of `plan` encoded by `enc` into its own buffer of `outs` (chunk i: payload seq i).
template <class Backend>
void encode_chunks(chunk_encoder<Backend>& enc, const model& m, const model_manifest& man, const std::vector<std::vector<canonical_range>>& plan,
                   std::vector<byte_buffer>& outs, encode_stats* st) {
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const auto ps = pieces_of(m, plan[i], man);
    enc.encode({frame_kind::delta, payload_id{{1, 0}, 0, static_cast<std::uint32_t>(i)}, 0, 1}, ps, outs[i], st);
  }
}

// The model's work copy (m.work) as the target of frame_applier::apply, one view per tensor.
target_map work_targets(model& m) {
  std::vector<mutable_tensor_view> views;
  for (std::size_t i = 0; i < m.infos.size(); ++i)
    views.emplace_back(m.infos[i].name, m.infos[i].type, m.infos[i].shape, std::span<std::byte>(m.work.get() + m.offsets[i], m.infos[i].bytes()));
  return target_map(std::move(views));
}

// Encodes the whole model under `opt` (best of a.repeat when frames are kept); returns (seconds,
// stats) and keeps frames if asked.
template <class Backend>
std::pair<elapsed, encode_stats> encode_model(const model& m, const model_manifest& man, const bench_args& a, encode_options opt,
                                             std::vector<std::vector<std::byte>>* frames, entropy_accumulator* ent) {
  opt.zstd_level = a.zstd_level;
  opt.max_frame_input_bytes = a.frame_mib << 20;
  chunk_encoder<Backend> enc(opt);
  const auto plan = plan_chunks(man, a.frame_mib << 20);
  encode_stats st;
  std::vector<byte_buffer> outs(plan.size());  // one per chunk, kept across repetitions
  elapsed best;
  for (int rep = 0; rep < (frames ? a.repeat : 1); ++rep) {
    encode_stats s;
    s.entropy = rep == 0 ? ent : nullptr;
    const auto t0 = now();
    encode_chunks(enc, m, man, plan, outs, &s);
    best.keep_min(t0);
    if (rep == 0) st = s;
  }
  if (frames) copy_frames(outs, *frames);
  return {best, st};
}

// The engine's path (refit::owner_shard::encode): each tensor's change set against the base
// (positions + new bits, as the owner freezes it), and the whole model encoded from those KNOWN
// changes (chunk_encoder::encode_known: no change detection) — vs encode() of base and a dense
// frozen copy, which is what the owners ran before. Frames must be byte-identical.
struct change_sets {
  std::vector<durability::tensor_changes> per_tensor;  // by tensor index
};
change_sets change_sets_of(const model& m) {
  change_sets cs;
  for (std::size_t i = 0; i < m.infos.size(); ++i) {
    auto& c = cs.per_tensor.emplace_back();
    c.element_size = 2;
    c.elements = m.infos[i].elements();
    durability::diff_tensor({m.old_b.get() + m.offsets[i], m.infos[i].bytes()}, {m.new_b.get() + m.offsets[i], m.infos[i].bytes()}, 2, c);
  }
  return cs;
}

template <class Backend>
std::pair<elapsed, encode_stats> encode_known_model(const model& m, const model_manifest& man, const change_sets& cs, const bench_args& a,
                                                   std::vector<std::vector<std::byte>>* frames) {
  chunk_encoder<Backend> enc(encode_options{.zstd_level = a.zstd_level, .max_frame_input_bytes = a.frame_mib << 20});
  const auto plan = plan_chunks(man, a.frame_mib << 20);
  encode_stats st;
  std::vector<byte_buffer> outs(plan.size());  // one per chunk, kept across repetitions
  elapsed best;
  for (int rep = 0; rep < a.repeat; ++rep) {
    encode_stats s;
    const auto t0 = now();
    for (std::size_t i = 0; i < plan.size(); ++i) {
      std::vector<known_changes_piece> ps;
      for (auto& r : plan[i]) {
        const std::size_t ti = *man.index_of(r.tensor);
        const auto& t = m.infos[ti];
        const auto& c = cs.per_tensor[ti];
        const auto lo = std::lower_bound(c.positions.begin(), c.positions.end(), r.begin);
        const auto hi = std::lower_bound(lo, c.positions.end(), r.end);
        const std::size_t k = static_cast<std::size_t>(lo - c.positions.begin()), n = static_cast<std::size_t>(hi - lo);
        ps.push_back({t.name, t.type, t.elements(), r.begin, r.end, {m.old_b.get() + m.offsets[ti] + r.begin * 2, r.size() * 2},
                      std::span<const std::uint64_t>(c.positions).subspan(k, n), std::span<const std::byte>(c.values).subspan(k * 2, n * 2)});
      }
      enc.encode_known({frame_kind::delta, payload_id{{1, 0}, 0, static_cast<std::uint32_t>(i)}, 0, 1}, ps, outs[i], &s);
    }
    best.keep_min(t0);
    if (rep == 0) st = s;
  }
  if (frames) copy_frames(outs, *frames);
  return {best, st};
}

// Thread scaling of the chosen encoding: the whole model encoded with one thread and with
// `threads` threads (each worker takes the next chunk not yet taken, with its own encoder, as the
// sender's pool does: refit/thread_pool.hpp). Each worker keeps its encoder and output buffer
// across repetitions, as the sender's workers keep theirs, so the best repetition runs on warm
// scratch. The one-thread and the N-thread runs alternate within each repetition (at least 3,
// whatever --repeat says): on a shared VM the machine's speed drifts by up to 25 % within a
// minute, and two series timed one after the other measured that drift as much as the scaling.
struct scaling {
  double wall1 = 1e300, cpu1 = 0;  // best one-thread wall time, and its thread's CPU time
  double wallN = 1e300, cpuN = 0;  // best N-thread wall time, and the largest per-thread CPU time of that run
  // Controls timed in the same repetitions, so a reader can tell the encoder's scaling from the
  // machine's: on this project's 2-vCPU VMs a loop that touches no memory at all scaled 1.5-2.0x
  // from run to run. memcmp: the model against an equal copy, split into N contiguous parts (best
  // wall times, one thread and N); compute: a fixed register-only integer loop on every thread.
  double memcmp1 = 1e300, memcmpN = 1e300;
  double compute1 = 1e300, computeN = 1e300;
};

// The compute control's work: eight independent xorshift chains, no memory traffic; about 0.1 s
// on one core of the build machine. Returns a value the caller keeps so the loop is not removed.
std::uint64_t control_compute() {
  std::uint64_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < 40'000'000; ++i)
    for (auto& v : x) v ^= v << 13, v ^= v >> 7, v ^= v << 17;
  return x[0] ^ x[1] ^ x[2] ^ x[3] ^ x[4] ^ x[5] ^ x[6] ^ x[7];
}

// Wall time of running body(w) on threads w = 0..n-1 side by side.
template <class Body>
double side_by_side(unsigned n, Body body) {
  const auto t0 = clock_t_::now();
  std::vector<std::thread> ts;
  for (unsigned w = 0; w < n; ++w) ts.emplace_back([&, w] { body(w); });
  for (auto& t : ts) t.join();
  return seconds_since(t0);
}
template <class Backend>
scaling encode_scaling(const model& m, const model_manifest& man, const bench_args& a, unsigned threads) {
  encode_options opt;
  opt.zstd_level = a.zstd_level;
  opt.max_frame_input_bytes = a.frame_mib << 20;
  const auto plan = plan_chunks(man, a.frame_mib << 20);
  std::vector<chunk_encoder<Backend>> encoders;
  for (unsigned w = 0; w < threads; ++w) encoders.emplace_back(opt);
  std::vector<byte_buffer> outs(threads);
  // one run with n threads: wall time and the largest per-thread CPU time
  const auto run = [&](unsigned n) {
    std::vector<double> cpu(n, 0.0);
    std::atomic<std::size_t> next{0};
    const auto t0 = clock_t_::now();
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < n; ++w)
      ts.emplace_back([&, w] {
        const stamp s0 = now();
        for (std::size_t i; (i = next.fetch_add(1)) < plan.size();) {
          const auto ps = pieces_of(m, plan[i], man);
          encoders[w].encode({frame_kind::delta, payload_id{{1, 0}, 0, static_cast<std::uint32_t>(i)}, 0, 1}, ps, outs[w]);
        }
        cpu[w] = now().cpu - s0.cpu;
      });
    for (auto& t : ts) t.join();
    return std::pair{seconds_since(t0), *std::max_element(cpu.begin(), cpu.end())};
  };
  // controls: m.work holds the new bits here (apply ran before), so memcmp scans the whole model
  std::atomic<int> differ{0};
  std::atomic<std::uint64_t> sink{0};
  const auto memcmp_run = [&](unsigned n) {
    return side_by_side(n, [&](unsigned w) {
      const std::uint64_t lo = m.bytes * w / n, hi = m.bytes * (w + 1) / n;
      differ |= std::memcmp(m.work.get() + lo, m.new_b.get() + lo, hi - lo) != 0;
    });
  };
  const auto compute_run = [&](unsigned n) { return side_by_side(n, [&](unsigned) { sink ^= control_compute(); }); };
  scaling r;
  // one extra, untimed round first: every worker's scratch grows to its chunks' size
  for (int rep = -1; rep < std::max(a.repeat, 3); ++rep) {
    const auto [w1, c1] = run(1);
    const auto [wn, cn] = run(threads);
    const double m1 = memcmp_run(1), mn = memcmp_run(threads);
    const double k1 = compute_run(1), kn = compute_run(threads);
    if (rep < 0) continue;
    if (w1 < r.wall1) r.wall1 = w1, r.cpu1 = c1;
    if (wn < r.wallN) r.wallN = wn, r.cpuN = cn;
    r.memcmp1 = std::min(r.memcmp1, m1), r.memcmpN = std::min(r.memcmpN, mn);
    r.compute1 = std::min(r.compute1, k1), r.computeN = std::min(r.computeN, kn);
  }
  if (differ) throw std::logic_error("thread-scaling control: the applied copy differs from the target");
  (void)sink.load();
  return r;
}

// What base-conditioned coding could reach at best, for reference: the entropy of the changed
// positions given each base element's exponent (every exponent its own class) plus that of the
// signed ULP distances given the exponent (escapes counted at 2 bytes). BF16 only.
double conditional_entropy_bytes(const model& m) {
  const auto f = *float_format_of(dtype::BF16);
  std::vector<double> n(256, 0), c(256, 0);
  std::vector<std::map<std::int64_t, double>> d(256);
  const auto* o = reinterpret_cast<const std::uint16_t*>(m.old_b.get());
  const auto* w = reinterpret_cast<const std::uint16_t*>(m.new_b.get());
  double escape_bits = 0;
  for (std::uint64_t i = 0; i < m.bytes / 2; ++i) {
    const unsigned e = static_cast<unsigned>(f.exponent(o[i]));
    n[e] += 1;
    if (o[i] == w[i]) continue;
    c[e] += 1;
    const auto u = ulp_distance(f, o[i], w[i]);
    d[e][u ? *u : INT64_MIN] += 1;
    if (!u) escape_bits += 16;
  }
  double bits = escape_bits;
  for (int e = 0; e < 256; ++e) {
    if (c[e] > 0 && c[e] < n[e]) bits += -c[e] * std::log2(c[e] / n[e]) - (n[e] - c[e]) * std::log2((n[e] - c[e]) / n[e]);
    for (auto& [k, v] : d[e]) bits -= v * std::log2(v / c[e]);
  }
  return bits / 8;
}

// --encode-only: the chosen encode and a memcmp of two equal buffers of the model's size, timed
// back to back in every repetition (which goes first alternates), and nothing else, so a profiler
// attached to the process sees the encoder and its yardstick only (`perf record
// bitrefit-bench-codec --encode-only --repeat 30`: each kernel's share over memcmp's share is its
// cost in memcmp units). Reports the best-of ratio as measure() does and the median and quartiles
// of the per-repetition ratios: a slow spell of the shared VM slows both halves of a pair, where
// two best-ofs taken minutes apart can come from different spells. One untimed repetition first
// (the encoder's scratch grows to its chunks' size). The frames are then applied to a copy of the
// base and compared with the target bit for bit (the exit status says whether they matched).
template <class Backend>
nlohmann::json measure_encode_only(const bench_args& a, model& m) {
  model_manifest man(m.infos);
  encode_options opt;
  opt.zstd_level = a.zstd_level;
  opt.max_frame_input_bytes = a.frame_mib << 20;
  chunk_encoder<Backend> enc(opt);
  const auto plan = plan_chunks(man, a.frame_mib << 20);
  std::vector<byte_buffer> outs(plan.size());
  std::memcpy(m.work.get(), m.old_b.get(), m.bytes);  // the memcmp's equal copy (and apply's base below)
  elapsed encode_t, memcmp_t;
  std::vector<double> ratios;
  encode_stats st;
  int cmp = 0;
  for (int rep = -1; rep < a.repeat; ++rep) {
    double enc_cpu = 0, cmp_cpu = 0;
    const auto time_memcmp = [&] {
      const auto t0 = now();
      cmp |= std::memcmp(m.work.get(), m.old_b.get(), m.bytes);
      cmp_cpu = now().cpu - t0.cpu;
      if (rep >= 0) memcmp_t.keep_min(t0);
    };
    if (rep % 2 == 0) time_memcmp();
    encode_stats s;
    const auto t0 = now();
    encode_chunks(enc, m, man, plan, outs, &s);
    enc_cpu = now().cpu - t0.cpu;
    if (rep >= 0) encode_t.keep_min(t0);
    if (rep % 2 != 0) time_memcmp();
    if (rep < 0) continue;
    st = s;
    ratios.push_back(enc_cpu / cmp_cpu);
  }
  if (cmp != 0) throw std::logic_error("memcpy copy differs");
  std::sort(ratios.begin(), ratios.end());
  const auto quantile = [&](double q) { return ratios[static_cast<std::size_t>(q * static_cast<double>(ratios.size() - 1) + 0.5)]; };
  // bit-exactness of what was timed: the frames applied to the base copy, compared with the target
  const target_map tm = work_targets(m);
  frame_applier<Backend> ap;
  for (auto& f : outs) ap.apply(f.span(), tm);
  const bool exact = std::memcmp(m.work.get(), m.new_b.get(), m.bytes) == 0;
  nlohmann::json j;
  j["backend"] = std::string(Backend::name());
  j["mode"] = "encode_only";
  j["size_mib"] = a.size_mib;
  j["change"] = a.change;
  j["elements"] = st.elements;
  j["changed"] = st.changed;
  j["change_rate"] = st.elements ? static_cast<double>(st.changed) / static_cast<double>(st.elements) : 0.0;
  j["chosen_bytes"] = st.frame_bytes;
  j["repeat"] = a.repeat;
  j["timing"] = "thread_cpu";
  j["encode_s"] = encode_t.cpu;
  j["memcmp_s"] = memcmp_t.cpu;
  j["ratio_encode_vs_memcmp"] = encode_t.cpu / memcmp_t.cpu;
  j["ratio_encode_vs_memcmp_paired_median"] = quantile(0.5);
  j["ratio_encode_vs_memcmp_paired_q1"] = quantile(0.25);
  j["ratio_encode_vs_memcmp_paired_q3"] = quantile(0.75);
  j["bit_exact"] = exact;
  return j;
}

template <class Backend>
nlohmann::json measure(const bench_args& a, model& m) {
  model_manifest man(m.infos);
  nlohmann::json j;
  // memcpy: the receiver's work copy of the base; memcmp: full compare of two equal buffers
  elapsed memcpy_t, memcmp_t;
  int cmp = 0;
  std::memset(m.work.get(), 0, m.bytes);  // fault the pages in: memcpy is timed, not the kernel
  for (int rep = 0; rep < a.repeat; ++rep) {
    auto t0 = now();
    std::memcpy(m.work.get(), m.old_b.get(), m.bytes);
    memcpy_t.keep_min(t0);
    t0 = now();
    cmp |= std::memcmp(m.work.get(), m.old_b.get(), m.bytes);
    memcmp_t.keep_min(t0);
  }
  if (cmp != 0) throw std::logic_error("memcpy copy differs");

  entropy_accumulator ent;
  encode_options v1;  // the codec before base-conditioned coding: XOR or overwrite per item
  v1.base_conditioned = false;
  auto [ow_s, ow] = encode_model<Backend>(m, man, a, encode_options{.policy = mode_policy::overwrite_only}, nullptr, &ent);
  auto [xo_s, xo] = encode_model<Backend>(m, man, a, encode_options{.policy = mode_policy::xor_only}, nullptr, nullptr);
  std::vector<std::vector<std::byte>> frames, frames_v1;
  auto [enc_v1_t, ch_v1] = encode_model<Backend>(m, man, a, v1, &frames_v1, nullptr);
  auto [enc_t, ch] = encode_model<Backend>(m, man, a, encode_options{}, &frames, nullptr);
  // the engine's path, side by side with encode_t (same repeats, same machine state)
  const change_sets cs = change_sets_of(m);
  std::vector<std::vector<std::byte>> frames_known;
  auto [enc_known_t, ch_known] = encode_known_model<Backend>(m, man, cs, a, &frames_known);
  const bool known_identical = frames_known == frames;
  if (!known_identical) throw std::logic_error("encode_known frames differ from encode's");

  // apply: verify + decode + apply every frame to the work copy (which holds the base)
  const target_map tm = work_targets(m);
  frame_applier<Backend> ap;
  std::size_t max_frame = 0;
  elapsed apply_t, apply_v1_t;
  bool exact = true;
  for (auto* fs : {&frames_v1, &frames}) {
    for (int rep = 0; rep < a.repeat; ++rep) {
      std::memcpy(m.work.get(), m.old_b.get(), m.bytes);
      const auto t0 = now();
      for (auto& f : *fs) {
        ap.apply(f, tm);
        max_frame = std::max(max_frame, f.size());
      }
      (fs == &frames ? apply_t : apply_v1_t).keep_min(t0);
      exact = exact && std::memcmp(m.work.get(), m.new_b.get(), m.bytes) == 0;
    }
  }
  // encoder scratch: a fresh encoder's high-water mark over the first chunks
  std::size_t enc_scratch = 0;
  {
    chunk_encoder<Backend> enc(encode_options{.zstd_level = a.zstd_level, .max_frame_input_bytes = a.frame_mib << 20});
    byte_buffer out;
    const auto plan = plan_chunks(man, a.frame_mib << 20);
    for (std::size_t i = 0; i < std::min<std::size_t>(plan.size(), 2); ++i) {
      const auto ps = pieces_of(m, plan[i], man);
      enc.encode({frame_kind::delta, payload_id{{1, 0}, 0, static_cast<std::uint32_t>(i)}, 0, 1}, ps, out);
    }
    enc_scratch = enc.scratch_bytes() + out.capacity();
  }
  // thread scaling of the chosen encoding
  const scaling sc = encode_scaling<Backend>(m, man, a, a.threads);

  const double n = static_cast<double>(ch.elements);
  const double gb = static_cast<double>(m.bytes) / 1e9;
  j["backend"] = std::string(Backend::name());
  j["size_mib"] = a.size_mib;
  j["change"] = a.change;
  j["elements"] = ch.elements;
  j["changed"] = ch.changed;
  j["change_rate"] = n > 0 ? static_cast<double>(ch.changed) / n : 0.0;
  j["zstd_level"] = a.zstd_level;
  j["frame_input_bytes"] = a.frame_mib << 20;
  j["frames"] = frames.size();
  j["dense_bytes"] = m.bytes;
  j["overwrite_only_bytes"] = ow.frame_bytes;
  j["xor_bytes"] = xo.frame_bytes;
  j["chosen_v1_bytes"] = ch_v1.frame_bytes;
  j["chosen_bytes"] = ch.frame_bytes;
  j["entropy_bytes"] = static_cast<std::uint64_t>(std::ceil(ent.bytes()));
  j["conditional_entropy_bytes"] = static_cast<std::uint64_t>(std::ceil(conditional_entropy_bytes(m)));
  j["chosen_bytes_per_changed"] = static_cast<double>(ch.frame_bytes) / std::max<double>(1, static_cast<double>(ch.changed));
  j["chosen_v1_bytes_per_changed"] = static_cast<double>(ch_v1.frame_bytes) / std::max<double>(1, static_cast<double>(ch.changed));
  j["chosen_location_bytes"] = ch.location_bytes;
  j["chosen_value_bytes"] = ch.value_bytes;
  j["chosen_items"] = ch.items;
  j["chosen_xor_items"] = ch.xor_items;
  j["chosen_conditioned_items"] = ch.conditioned_items;
  nlohmann::json lc;
  for (std::uint8_t c = 0; c < location_coding_count; ++c)
    if (ch.location_codings[c]) lc[std::string(to_string(static_cast<location_coding>(c)))] = ch.location_codings[c];
  j["chosen_location_codings"] = lc;
  j["timing"] = "thread_cpu";
  j["encode_s"] = enc_t.cpu;
  j["encode_v1_s"] = enc_v1_t.cpu;
  j["encode_known_s"] = enc_known_t.cpu;  // the engine's path: from the frozen change set, no change detection
  j["encode_known_wall_s"] = enc_known_t.wall;
  j["ratio_encode_known_vs_encode"] = enc_known_t.cpu / enc_t.cpu;
  j["ratio_encode_known_vs_memcmp"] = enc_known_t.cpu / memcmp_t.cpu;
  j["encode_known_frames_identical"] = known_identical;
  j["memcmp_s"] = memcmp_t.cpu;
  j["apply_s"] = apply_t.cpu;
  j["apply_v1_s"] = apply_v1_t.cpu;
  j["memcpy_s"] = memcpy_t.cpu;
  j["apply_GBps"] = gb / apply_t.cpu;
  j["apply_v1_GBps"] = gb / apply_v1_t.cpu;
  j["encode_GBps"] = gb / enc_t.cpu;
  j["encode_wall_s"] = enc_t.wall;
  j["memcmp_wall_s"] = memcmp_t.wall;
  j["apply_wall_s"] = apply_t.wall;
  j["memcpy_wall_s"] = memcpy_t.wall;
  j["threads"] = a.threads;
  j["encode_1t_wall_s"] = sc.wall1;
  j["encode_nt_wall_s"] = sc.wallN;
  j["encode_nt_max_thread_cpu_s"] = sc.cpuN;
  j["ratio_encode_nt_vs_1t_throughput_wall"] = sc.wall1 / sc.wallN;
  // speedup if the threads ran side by side (their CPU time includes memory-bandwidth contention)
  j["ratio_encode_nt_vs_1t_throughput_cpu"] = sc.cpu1 / std::max(1e-12, sc.cpuN);
  // the machine's own scaling in the same repetitions (encode_scaling): memory-bound and compute-only
  j["memcmp_1t_wall_s"] = sc.memcmp1;
  j["memcmp_nt_wall_s"] = sc.memcmpN;
  j["ratio_memcmp_nt_vs_1t_throughput_wall"] = sc.memcmp1 / sc.memcmpN;
  j["compute_1t_wall_s"] = sc.compute1;
  j["compute_nt_wall_s"] = sc.computeN;
  j["ratio_compute_nt_vs_1t_throughput_wall"] = a.threads * sc.compute1 / sc.computeN;
  j["peak_extra_bytes"] = ap.scratch_bytes() + max_frame;
  j["encoder_scratch_bytes"] = enc_scratch;
  j["ratio_chosen_vs_overwrite"] = static_cast<double>(ch.frame_bytes) / static_cast<double>(std::max<std::uint64_t>(1, ow.frame_bytes));
  j["ratio_chosen_vs_entropy"] = static_cast<double>(ch.frame_bytes) / std::max(1.0, ent.bytes());
  j["ratio_chosen_v1_vs_entropy"] = static_cast<double>(ch_v1.frame_bytes) / std::max(1.0, ent.bytes());
  j["ratio_encode_vs_memcmp"] = enc_t.cpu / memcmp_t.cpu;
  j["ratio_encode_v1_vs_memcmp"] = enc_v1_t.cpu / memcmp_t.cpu;
  j["ratio_apply_vs_memcpy"] = apply_t.cpu / memcpy_t.cpu;
  j["ratio_dense_vs_chosen"] = static_cast<double>(m.bytes) / static_cast<double>(std::max<std::uint64_t>(1, ch.frame_bytes));
  j["bit_exact"] = exact;
  return j;
}

using runner = std::function<nlohmann::json(const bench_args&, model&)>;

// A backend's runner for models in host memory: the full measurement, or --encode-only's.
template <class Backend>
nlohmann::json run_backend(const bench_args& a, model& m) {
  return a.encode_only ? measure_encode_only<Backend>(a, m) : measure<Backend>(a, m);
}

/// Backends the bench can run. To add one (e.g. the Thrust systems), add an entry whose runner
/// stages the model where the backend works and calls measure<YourBackend> (or its own variant;
/// run_backend<YourBackend> when the model stays in host memory).
std::map<std::string, runner> backend_registry() {
  std::map<std::string, runner> r;
  r["host"] = run_backend<host_backend>;
#if defined(BITREFIT_BENCH_THRUST)
  // Thrust's host-memory systems run the same source as the GPU build on this machine's CPUs.
  // thrust-cuda needs its model staged in device memory: bitrefit-bench-thrust (nvcc) runs it.
  r["thrust-cpp"] = run_backend<thrust_backend<thrust_systems::cpp>>;
#if BITREFIT_THRUST_HAS_OMP
  r["thrust-omp"] = run_backend<thrust_backend<thrust_systems::omp>>;
#endif
#endif
  return r;
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: bitrefit-bench-codec [--size-mib N] [--change adamw|RATE] [--json] [--backend NAME]\n"
               "                            [--zstd-level L] [--frame-mib M] [--adamw-steps K] [--seed S] [--repeat R]\n"
               "                            [--threads T] [--encode-only]\n"
               "backends:");
  for (auto& [k, v] : backend_registry()) std::fprintf(code ? stderr : stdout, " %s", k.c_str());
  std::fprintf(code ? stderr : stdout, "\n");
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) try {
  bench_args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    if (s == "--size-mib") a.size_mib = std::stoull(next());
    else if (s == "--change") a.change = next();
    else if (s == "--json") a.json = true;
    else if (s == "--backend") a.backend = next();
    else if (s == "--zstd-level") a.zstd_level = std::stoi(next());
    else if (s == "--frame-mib") a.frame_mib = std::stoull(next());
    else if (s == "--adamw-steps") a.adamw_steps = std::stoi(next());
    else if (s == "--seed") a.seed = std::stoull(next());
    else if (s == "--repeat") a.repeat = std::max(1, std::stoi(next()));
    else if (s == "--threads") a.threads = static_cast<unsigned>(std::max(1, std::stoi(next())));
    else if (s == "--encode-only") a.encode_only = true;
    else if (s == "--help" || s == "-h") usage(0);
    else usage(2);
  }
  auto reg = backend_registry();
  auto it = reg.find(a.backend);
  if (it == reg.end()) {
    std::fprintf(stderr, "unknown backend '%s'\n", a.backend.c_str());
    usage(2);
  }
  if (a.size_mib == 0 || a.frame_mib == 0) usage(2);
  const auto t0 = clock_t_::now();
  model m = make_model(a);
  const double gen_s = seconds_since(t0);
  auto j = it->second(a, m);
  j["generate_s"] = gen_s;
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
  else if (a.encode_only) {
    std::printf("%s, %llu MiB BF16, change %s: %llu of %llu elements changed (%.3f%%), chosen %llu bytes, bit-exact %s\n",
                j["backend"].get<std::string>().c_str(), static_cast<unsigned long long>(a.size_mib), a.change.c_str(),
                j["changed"].get<unsigned long long>(), j["elements"].get<unsigned long long>(), 100.0 * j["change_rate"].get<double>(),
                j["chosen_bytes"].get<unsigned long long>(), j["bit_exact"].get<bool>() ? "yes" : "NO");
    std::printf("encode %.4fs, memcmp %.4fs (best of %d): encode/memcmp %.2f; per repetition, paired: median %.2f (q1-q3 %.2f-%.2f)\n",
                j["encode_s"].get<double>(), j["memcmp_s"].get<double>(), a.repeat, j["ratio_encode_vs_memcmp"].get<double>(),
                j["ratio_encode_vs_memcmp_paired_median"].get<double>(), j["ratio_encode_vs_memcmp_paired_q1"].get<double>(),
                j["ratio_encode_vs_memcmp_paired_q3"].get<double>());
  } else {
    std::printf("%s, %llu MiB BF16, change %s: %llu of %llu elements changed (%.3f%%)\n", j["backend"].get<std::string>().c_str(),
                static_cast<unsigned long long>(a.size_mib), a.change.c_str(), j["changed"].get<unsigned long long>(),
                j["elements"].get<unsigned long long>(), 100.0 * j["change_rate"].get<double>());
    std::printf("bytes: dense %llu, overwrite-only %llu, xor %llu, chosen before base-conditioning %llu, chosen %llu, entropy %llu\n",
                j["dense_bytes"].get<unsigned long long>(), j["overwrite_only_bytes"].get<unsigned long long>(),
                j["xor_bytes"].get<unsigned long long>(), j["chosen_v1_bytes"].get<unsigned long long>(),
                j["chosen_bytes"].get<unsigned long long>(), j["entropy_bytes"].get<unsigned long long>());
    std::printf("chosen/overwrite %.3f, chosen/entropy %.3f, encode/memcmp %.2f (without base-conditioning %.2f)\n",
                j["ratio_chosen_vs_overwrite"].get<double>(), j["ratio_chosen_vs_entropy"].get<double>(),
                j["ratio_encode_vs_memcmp"].get<double>(), j["ratio_encode_v1_vs_memcmp"].get<double>());
    std::printf("time: encode %.3fs, memcmp %.3fs, apply %.3fs (%.2f GB/s), memcpy %.3fs; receiver scratch %llu bytes; encoder scratch %llu bytes; bit-exact %s\n",
                j["encode_s"].get<double>(), j["memcmp_s"].get<double>(), j["apply_s"].get<double>(), j["apply_GBps"].get<double>(),
                j["memcpy_s"].get<double>(), j["peak_extra_bytes"].get<unsigned long long>(),
                j["encoder_scratch_bytes"].get<unsigned long long>(), j["bit_exact"].get<bool>() ? "yes" : "NO");
    std::printf("threads: %u threads encode %.2fx the one-thread throughput (wall); the machine in the same runs: memcmp %.2fx, "
                "a register-only loop %.2fx\n",
                a.threads, j["ratio_encode_nt_vs_1t_throughput_wall"].get<double>(), j["ratio_memcmp_nt_vs_1t_throughput_wall"].get<double>(),
                j["ratio_compute_nt_vs_1t_throughput_wall"].get<double>());
  }
  return j["bit_exact"].get<bool>() ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bitrefit-bench-codec: %s\n", e.what());
  return 1;
}
