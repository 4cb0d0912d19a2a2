// bitrefit-paired-encode — encode time of the working tree against a baseline commit, both in one
// process, timed alternately on the same data (paired-encode.sh builds it; README.md "Paired runs").
//
//   bitrefit-paired-encode RATE|adamw [REPS] [encode|apply]
//
// `apply` times the receiver instead: each side applies the frames its own encoder made to a copy
// of the base (frame_applier::apply: verification, decoding, writing), checked bit for bit
// against the new tensors.
//
// Why: on the shared 2-vCPU build VMs one binary's encode time moves by 30 % and more between
// runs minutes apart, so a before/after made of separate bench runs cannot resolve a 5-10 %
// change. Here every repetition times both encoders back to back (which goes first alternates)
// and the figure is the median over repetitions of the per-repetition ratio work/base, with its
// quartiles; a slow spell slows both sides of a pair.
// Data: 4 BF16 tensors of 64 MiB (one frame each, as the bench's default 64 MiB frames), old =
// N(0, 0.02) rounded to BF16; RATE moves each element one ULP up or down with that probability;
// `adamw` keeps an FP32 master a uniform fraction of an ULP from each BF16 value, moves it by
// 0.5-1.5e-6 and rounds again, so small magnitudes change more (several classes, ~4 % changed).
// Also prints memcmp of 256 MiB (best), so encode/memcmp can be read off. The frames' sizes of
// both sides are printed: a change meant to keep the bytes must show the same numbers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

// The interface of one side (side.cpp), declared once for each namespace it is compiled into.
#define PAIRED_SIDE_INTERFACE                                                                                                        \
  using tensors = std::vector<const std::uint16_t*>;                                                                                 \
  void* make_state();                                                                                                                \
  double encode(void*, const tensors&, const tensors&, std::size_t, std::size_t&);                                                   \
  void keep_frames(void*, const tensors&, const tensors&, std::size_t);                                                              \
  double apply(void*, const tensors&, const tensors&, std::size_t, bool&);
namespace base_side {
PAIRED_SIDE_INTERFACE
}  // namespace base_side
namespace work_side {
PAIRED_SIDE_INTERFACE
}  // namespace work_side

namespace {
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}
std::uint16_t bf16_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);  // round to nearest even
}
float float_of(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bitrefit-paired-encode RATE|adamw [REPS] [encode|apply]\n");
    return 2;
  }
  const std::string change = argv[1];
  const bool adamw = change == "adamw";
  const double rate = adamw ? 0.0 : std::atof(argv[1]);
  const int reps = argc > 2 ? std::max(3, std::atoi(argv[2])) : 21;
  const std::string mode = argc > 3 ? argv[3] : "encode";
  if (mode != "encode" && mode != "apply") {
    std::fprintf(stderr, "bitrefit-paired-encode: mode must be encode or apply, not %s\n", mode.c_str());
    return 2;
  }
  const bool applying = mode == "apply";
  const int tensors = 4;
  const std::size_t m = std::size_t{32} << 20;  // 64 MiB of BF16
  std::vector<std::vector<std::uint16_t>> olds(tensors), news(tensors);
  std::vector<const std::uint16_t*> op, np;
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int t = 0; t < tensors; ++t) {
    auto& o = olds[t];
    auto& n = news[t];
    o.resize(m), n.resize(m);
    for (auto& x : o) x = bf16_of(normal(rng));
    for (std::size_t i = 0; i < m; ++i) {
      n[i] = o[i];
      if (!adamw) {
        if (uniform(rng) < rate) n[i] = static_cast<std::uint16_t>((rng() & 1) ? o[i] + 1 : o[i] - 1);
        continue;
      }
      const float f = float_of(o[i]);
      const float ulp = std::ldexp(1.0f, std::ilogb(f) - 7);
      const float master = f + (static_cast<float>(uniform(rng)) - 0.5f) * ulp;
      n[i] = bf16_of(master + ((rng() & 1) ? 1e-6f : -1e-6f) * static_cast<float>(0.5 + uniform(rng)));
    }
    op.push_back(o.data()), np.push_back(n.data());
  }
  const std::vector<std::vector<std::uint16_t>> copies(olds);  // memcmp of 256 MiB against an equal 256 MiB
  void* base = base_side::make_state();
  void* work = work_side::make_state();
  std::size_t base_bytes = 0, work_bytes = 0;
  base_side::encode(base, op, np, m, base_bytes);  // warm-up: scratch grows to its size
  work_side::encode(work, op, np, m, work_bytes);
  if (applying) base_side::keep_frames(base, op, np, m), work_side::keep_frames(work, op, np, m);
  bool exact = true;
  const auto run = [&](bool work_side_run) {
    if (applying) return work_side_run ? work_side::apply(work, op, np, m, exact) : base_side::apply(base, op, np, m, exact);
    return work_side_run ? work_side::encode(work, op, np, m, work_bytes) : base_side::encode(base, op, np, m, base_bytes);
  };
  std::vector<double> tb, tw, ratio;
  double memcmp_best = 1e300;
  int differ = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_now();
    for (int t = 0; t < tensors; ++t) differ |= std::memcmp(olds[t].data(), copies[t].data(), m * 2);
    memcmp_best = std::min(memcmp_best, cpu_now() - t0);
    double b, w;
    if (r & 1) w = run(true), b = run(false);
    else b = run(false), w = run(true);
    tb.push_back(b), tw.push_back(w), ratio.push_back(w / b);
  }
  if (differ) return 1;
  if (!exact) {
    std::fprintf(stderr, "bitrefit-paired-encode: an applied frame did not give the new tensor's bits\n");
    return 1;
  }
  std::sort(ratio.begin(), ratio.end());
  const double bb = *std::min_element(tb.begin(), tb.end()), bw = *std::min_element(tw.begin(), tw.end());
  // the timed keys carry the mode: base_encode_best_s ... or base_apply_best_s ...
  const char* md = mode.c_str();
  std::printf("{\"change\": \"%s\", \"mode\": \"%s\", \"reps\": %d, \"base_bytes\": %zu, \"work_bytes\": %zu, \"ratio_work_vs_base_median\": %.3f, "
              "\"ratio_work_vs_base_q1\": %.3f, \"ratio_work_vs_base_q3\": %.3f, \"base_%s_best_s\": %.4f, \"work_%s_best_s\": %.4f, "
              "\"memcmp_best_s\": %.4f, \"base_%s_vs_memcmp\": %.2f, \"work_%s_vs_memcmp\": %.2f}\n",
              change.c_str(), md, reps, base_bytes, work_bytes, ratio[ratio.size() / 2], ratio[ratio.size() / 4], ratio[3 * ratio.size() / 4], md,
              bb, md, bw, memcmp_best, md, bb / memcmp_best, md, bw / memcmp_best);
}
