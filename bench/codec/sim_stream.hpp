// bench/codec/sim_stream.hpp — a streaming AdamW BF16 trainer for the codec bench.
//
// Each element's trajectory is independent, so two consecutive versions (after steps K-1 and K)
// are produced block by block without storing FP32 master weights or moments: memory is only the
// two BF16 exports. Per element j: p0 ~ N(0, init_std); gradient at step t is
// grad_scale * (0.5 s_j + sqrt(0.75) n_{j,t}) (a persistent direction plus minibatch noise), with
// approximately normal draws (Irwin-Hall sums of four 16-bit uniforms from a counter-based mixer);
// AdamW with bias correction in float32, exported by round-to-nearest-even to BF16. The same
// process as include/bitrefit/testing/adamw.hpp (branch cli) in spirit, but memory-free, so a 1 GiB
// model fits next to its copies.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace bitrefit_bench {

inline std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Irwin-Hall(4) of 16-bit uniforms, centred and scaled to unit variance.
inline float approx_normal(std::uint64_t key, std::uint64_t i) noexcept {
  const std::uint64_t r = mix64(key + 0x9E3779B97F4A7C15ull * (i + 1));
  const std::int64_t s = static_cast<std::int64_t>(r & 0xFFFF) + static_cast<std::int64_t>((r >> 16) & 0xFFFF) +
                         static_cast<std::int64_t>((r >> 32) & 0xFFFF) + static_cast<std::int64_t>(r >> 48);
  // mean 4*32767.5, sd = 65536*sqrt(4/12)
  return static_cast<float>((static_cast<double>(s) - 131070.0) / 37837.23);
}
inline std::uint16_t bf16_rne(float x) noexcept {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(x);
  if ((f & 0x7F800000u) == 0x7F800000u && (f & 0x007FFFFFu)) return static_cast<std::uint16_t>((f >> 16) | 0x40);
  return static_cast<std::uint16_t>((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);
}

struct adamw_stream {
  std::uint64_t seed = 42;
  int steps = 3;  // the delta is version steps-1 -> steps
  float lr = 1e-6f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, init_std = 0.02f, grad_scale = 1e-3f;

  /// Fills old_out/new_out (n BF16 elements each) for global elements [first, first + n).
  void fill(std::uint64_t first, std::size_t n, std::uint16_t* old_out, std::uint16_t* new_out) const {
    const std::uint64_t k_init = mix64(seed * 4 + 1), k_dir = mix64(seed * 4 + 2), k_noise = mix64(seed * 4 + 3);
    const float noise_w = std::sqrt(0.75f);
    float bc1[64], bc2[64];
    for (int t = 1; t <= steps && t < 64; ++t) {
      bc1[t] = 1.0f - std::pow(beta1, static_cast<float>(t));
      bc2[t] = 1.0f - std::pow(beta2, static_cast<float>(t));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t j = first + i;
      float p = init_std * approx_normal(k_init, j);
      const float dir = 0.5f * approx_normal(k_dir, j);
      float m = 0.0f, v = 0.0f;
      std::uint16_t prev = bf16_rne(p);
      for (int t = 1; t <= steps; ++t) {
        const float g = grad_scale * (dir + noise_w * approx_normal(k_noise ^ static_cast<std::uint64_t>(t) * 0xD1B54A32D192ED03ull, j));
        m = beta1 * m + (1.0f - beta1) * g;
        v = beta2 * v + (1.0f - beta2) * g * g;
        const float mh = m / bc1[t], vh = v / bc2[t];
        p -= lr * (mh / (std::sqrt(vh) + eps));
        const std::uint16_t b = bf16_rne(p);
        if (t == steps - 1) prev = b;
        if (t == steps) {
          old_out[i] = steps == 1 ? bf16_rne(init_std * approx_normal(k_init, j)) : prev;
          new_out[i] = b;
        }
      }
    }
  }
};

}  // namespace bitrefit_bench
