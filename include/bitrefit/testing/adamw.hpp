// bitrefit/testing/adamw.hpp — a deterministic simulated training process (tests, benches, demos).
//
// Why it exists: delta refit pays off because, with FP32 master weights exported as BF16, most
// optimizer updates are smaller than half a BF16 ulp and round away. Uniformly injected changes
// do not reproduce that structure (which elements change, how their bits move), so tests and
// benchmarks need a training-like process. This one keeps FP32 master weights, draws synthetic
// gradients, applies the real AdamW arithmetic and exports BF16 by round-to-nearest-even of the
// FP32 bits, exactly like a BF16 checkpoint written from a mixed-precision trainer.
//
// Determinism (why no <random>): std::normal_distribution's output is implementation-defined and
// Box-Muller needs log/sin/cos whose libm results differ between platforms. Every random number here
// comes from a counter-based generator (splitmix64 finalizer over (seed, tensor-name hash, step,
// element)) and normals are Irwin-Hall sums of 12 uniform 16-bit integers, computed in integers
// and scaled by one exactly representable division: bit-identical on every platform, in any order,
// and only approximately normal (bounded at ±6 sigma), which is all a simulation needs.
// The AdamW update uses separately rounded IEEE float32 operations (sqrt is correctly rounded);
// a compiler that contracts a*b+c into one FMA (GCC's default -ffp-contract=fast on targets with FMA
// in their baseline, e.g. aarch64) may change last bits — build with -ffp-contract=off for chains
// identical across architectures. On x86-64 without -mfma the default build is already exact.
//
// Memory: 12 bytes per parameter (master, first and second moment), plus what you export into.
//
// Usage:
//   auto specs = bitrefit::testing::llama_like({.layers = 2, .hidden = 64, ...});
//   bitrefit::testing::adamw_sim sim(specs, /*seed=*/42, {.lr = 1e-6f});
//   std::vector<std::byte> v0(sim.bf16_bytes(0));   // version 0 of tensor 0, little-endian BF16
//   sim.step();                                      // version 1
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <string_view>
#include <utility>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit::testing {

// ---- bit-level BF16 conversion ------------------------------------------------------------

/// BF16 bits of the FP32 value with bits `f32`, rounded to nearest, ties to even.
/// NaN stays NaN: sign and the top 7 payload bits are kept and the quiet bit is set (so a
/// signalling NaN whose payload lives only in the low 16 bits cannot turn into an infinity).
/// ±inf, ±0 and subnormals follow plain RNE (subnormals may round to ±0 or to the smallest normal).
constexpr std::uint16_t bf16_from_f32_bits(std::uint32_t f32) noexcept {
  if ((f32 & 0x7F800000u) == 0x7F800000u && (f32 & 0x007FFFFFu) != 0)
    return static_cast<std::uint16_t>((f32 >> 16) | 0x0040u);
  const std::uint32_t lsb = (f32 >> 16) & 1u;
  return static_cast<std::uint16_t>((f32 + 0x7FFFu + lsb) >> 16);
}

/// BF16 bits of `x` (see bf16_from_f32_bits).
constexpr std::uint16_t bf16_round(float x) noexcept { return bf16_from_f32_bits(std::bit_cast<std::uint32_t>(x)); }

/// The FP32 value a BF16 bit pattern denotes (exact: BF16 is the top half of FP32).
constexpr float bf16_to_f32(std::uint16_t b) noexcept { return std::bit_cast<float>(std::uint32_t{b} << 16); }

// ---- deterministic random numbers -----------------------------------------------------------

/// splitmix64's output function: a bijective 64-bit mixer (Steele, Lea, Flood 2014).
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// FNV-1a 64 of a name: keys each tensor's random streams by its name, so adding, removing or
/// reordering tensors never changes another tensor's numbers.
constexpr std::uint64_t name_hash(std::string_view s) noexcept {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

/// A counter-based stream: `at(i)` is the i-th 64-bit number of stream `key`, in any order.
struct counter_rng {
  std::uint64_t key;
  constexpr std::uint64_t at(std::uint64_t i) const noexcept {
    return mix64(key + 0x9E3779B97F4A7C15ull * (i + 1));
  }
  /// Approximately standard normal: Irwin-Hall sum of twelve uniform 16-bit integers (three 64-bit
  /// draws at 3i, 3i+1, 3i+2), centred and scaled exactly. Mean 0, variance 1 - 1/65536^2, |z| < 6.
  constexpr double normal(std::uint64_t i) const noexcept {
    std::int64_t s = 0;
    for (std::uint64_t k = 0; k < 3; ++k) {
      const std::uint64_t r = at(3 * i + k);
      s += static_cast<std::int64_t>(r & 0xFFFF) + static_cast<std::int64_t>((r >> 16) & 0xFFFF) +
           static_cast<std::int64_t>((r >> 32) & 0xFFFF) + static_cast<std::int64_t>(r >> 48);
    }
    // sum of 12 uniforms on {0..65535} has mean 12 * 32767.5 and standard deviation ~65536.
    return static_cast<double>(2 * s - 786420) / 131072.0;  // exact: |2s - 786420| < 2^21
  }
};

// ---- what is trained --------------------------------------------------------------------------

enum class init_kind : std::uint8_t {
  normal,  // N(0, init_std) (embeddings, projections)
  ones,    // 1.0 (RMSNorm weights, as Llama initialises them)
};

struct tensor_spec {
  std::string name;  // canonical (Hugging Face) tensor name
  shape_t shape;
  init_kind init = init_kind::normal;
};

struct adamw_config {
  float lr = 1e-6f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW): p *= 1 - lr * weight_decay before the update
  float init_std = 0.02f;
  /// Synthetic gradient of element j at step t: grad_scale * (persistent_fraction * s_j +
  /// sqrt(1 - persistent_fraction^2) * n_{j,t}) with s_j, n_{j,t} independent standard normals:
  /// a fixed per-element direction (what training pushes towards) plus per-step minibatch noise.
  float grad_scale = 1e-3f;
  float persistent_fraction = 0.5f;
  /// Worker threads for step() and the constructor (0: std::thread::hardware_concurrency()). The
  /// result does not depend on it: every number is a pure function of (seed, name, step, element).
  unsigned threads = 1;
};

/// Shapes of a small Llama-like decoder, named as Hugging Face's LlamaForCausalLM names them.
struct llama_dims {
  std::uint64_t layers = 2;
  std::uint64_t hidden = 64;
  std::uint64_t intermediate = 172;
  std::uint64_t vocab = 256;
  std::uint64_t heads = 4;
  std::uint64_t kv_heads = 2;
  bool tie_embeddings = false;  // when false, an lm_head.weight [vocab, hidden] is added
};

/// @pre hidden % heads == 0 and heads % kv_heads == 0 (throws errc::invalid_argument otherwise).
inline std::vector<tensor_spec> llama_like(const llama_dims& d) {
  if (d.heads == 0 || d.kv_heads == 0 || d.hidden % d.heads != 0 || d.heads % d.kv_heads != 0)
    throw error(errc::invalid_argument, "llama_like needs hidden % heads == 0 and heads % kv_heads == 0",
                {.file = {}, .tensor = {}, .field = "llama_dims"});
  const std::uint64_t head_dim = d.hidden / d.heads, kv = d.kv_heads * head_dim;
  std::vector<tensor_spec> t;
  t.push_back({"model.embed_tokens.weight", {d.vocab, d.hidden}});
  for (std::uint64_t i = 0; i < d.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {d.hidden}, init_kind::ones});
    t.push_back({p + "self_attn.q_proj.weight", {d.hidden, d.hidden}});
    t.push_back({p + "self_attn.k_proj.weight", {kv, d.hidden}});
    t.push_back({p + "self_attn.v_proj.weight", {kv, d.hidden}});
    t.push_back({p + "self_attn.o_proj.weight", {d.hidden, d.hidden}});
    t.push_back({p + "post_attention_layernorm.weight", {d.hidden}, init_kind::ones});
    t.push_back({p + "mlp.gate_proj.weight", {d.intermediate, d.hidden}});
    t.push_back({p + "mlp.up_proj.weight", {d.intermediate, d.hidden}});
    t.push_back({p + "mlp.down_proj.weight", {d.hidden, d.intermediate}});
  }
  t.push_back({"model.norm.weight", {d.hidden}, init_kind::ones});
  if (!d.tie_embeddings) t.push_back({"lm_head.weight", {d.vocab, d.hidden}});
  return t;
}

// ---- the process ------------------------------------------------------------------------------

/// FP32 master weights trained by AdamW on synthetic gradients. Version k (after k calls to
/// step()) is a pure function of (specs, seed, config, k): two instances built alike agree bit for bit.
class adamw_sim {
 public:
  /// @pre tensor names are unique and non-empty (throws errc::invalid_argument otherwise).
  adamw_sim(std::vector<tensor_spec> specs, std::uint64_t seed, adamw_config config = {})
      : specs_(std::move(specs)), seed_(seed), cfg_(config) {
    state_.resize(specs_.size());
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const tensor_spec& s = specs_[i];
      if (s.name.empty())
        throw error(errc::invalid_argument, "tensor spec has an empty name", {.file = {}, .tensor = {}, .field = "name"});
      for (std::size_t j = 0; j < i; ++j)
        if (specs_[j].name == s.name)
          throw error(errc::invalid_argument, "duplicate tensor name", {.file = {}, .tensor = s.name, .field = "name"});
      const std::uint64_t n = element_count(s.shape, s.name);
      tensor_state& st = state_[i];
      st.master.resize(n);
      st.m.assign(n, 0.0f);
      st.v.assign(n, 0.0f);
    }
    for_each_range([this](std::size_t i, std::uint64_t begin, std::uint64_t end) {
      const tensor_spec& s = specs_[i];
      float* master = state_[i].master.data();
      const counter_rng init{stream_key(s.name, stream_init, 0)};
      for (std::uint64_t e = begin; e < end; ++e)
        master[e] = s.init == init_kind::ones ? 1.0f : static_cast<float>(init.normal(e) * cfg_.init_std);
    });
  }

  /// One AdamW step (PyTorch's torch.optim.AdamW arithmetic, foreach=False, amsgrad=False):
  ///   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
  ///   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  /// Bias corrections are computed in double by repeated multiplication (no pow), then used as float.
  void step() {
    ++t_;
    double b1t = 1.0, b2t = 1.0;
    for (std::uint64_t k = 0; k < t_; ++k) {
      b1t *= static_cast<double>(cfg_.beta1);
      b2t *= static_cast<double>(cfg_.beta2);
    }
    const float step_size = static_cast<float>(static_cast<double>(cfg_.lr) / (1.0 - b1t));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - b2t));
    const float decay = 1.0f - cfg_.lr * cfg_.weight_decay;
    const float b1 = cfg_.beta1, one_b1 = 1.0f - cfg_.beta1, b2 = cfg_.beta2, one_b2 = 1.0f - cfg_.beta2;
    const double pf = static_cast<double>(cfg_.persistent_fraction);
    const double noise_w = std::sqrt(1.0 - pf * pf);
    const double gs = static_cast<double>(cfg_.grad_scale);
    for_each_range([&](std::size_t i, std::uint64_t begin, std::uint64_t end) {
      tensor_state& st = state_[i];
      const counter_rng sig{stream_key(specs_[i].name, stream_signal, 0)};
      const counter_rng noise{stream_key(specs_[i].name, stream_noise, t_)};
      for (std::uint64_t e = begin; e < end; ++e) {
        const float g = gradient_value(sig, noise, e, gs, pf, noise_w);
        float p = st.master[e];
        if (cfg_.weight_decay != 0.0f) p = p * decay;
        const float m = b1 * st.m[e] + one_b1 * g;
        const float gg = g * g;
        const float v = b2 * st.v[e] + one_b2 * gg;
        const float denom = std::sqrt(v) / bc2_sqrt + cfg_.eps;
        const float upd = step_size * (m / denom);
        st.m[e] = m;
        st.v[e] = v;
        st.master[e] = p - upd;
      }
    });
  }

  /// The synthetic gradient of element e of tensor i at step t (t >= 1), as step() uses it.
  float gradient(std::size_t i, std::uint64_t t, std::uint64_t e) const {
    const double pf = static_cast<double>(cfg_.persistent_fraction);
    return gradient_value(counter_rng{stream_key(specs_.at(i).name, stream_signal, 0)},
                          counter_rng{stream_key(specs_.at(i).name, stream_noise, t)}, e,
                          static_cast<double>(cfg_.grad_scale), pf, std::sqrt(1.0 - pf * pf));
  }

  /// Steps taken so far (the version number of what export_* returns).
  std::uint64_t steps() const noexcept { return t_; }
  std::uint64_t seed() const noexcept { return seed_; }
  const adamw_config& config() const noexcept { return cfg_; }
  std::size_t tensor_count() const noexcept { return specs_.size(); }
  const std::vector<tensor_spec>& specs() const noexcept { return specs_; }
  const tensor_spec& spec(std::size_t i) const { return specs_.at(i); }
  std::uint64_t elements(std::size_t i) const { return state_.at(i).master.size(); }
  std::uint64_t total_elements() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : state_) n += s.master.size();
    return n;
  }

  /// The FP32 master weights of tensor i.
  std::span<const float> master(std::size_t i) const { return state_.at(i).master; }

  /// BF16 bit patterns of tensor i. @pre out.size() == elements(i) (errc::invalid_argument otherwise).
  void export_bf16(std::size_t i, std::span<std::uint16_t> out) const {
    const auto& src = state_.at(i).master;
    check_size(i, out.size(), src.size(), "bf16 element");
    for (std::size_t e = 0; e < src.size(); ++e) out[e] = bf16_round(src[e]);
  }

  /// Little-endian BF16 bytes of tensor i, as a safetensors file stores them.
  /// @pre out.size() == 2 * elements(i).
  void export_bf16(std::size_t i, std::span<std::byte> out) const {
    const auto& src = state_.at(i).master;
    check_size(i, out.size(), 2 * src.size(), "bf16 byte");
    for (std::size_t e = 0; e < src.size(); ++e) {
      const std::uint16_t b = bf16_round(src[e]);
      out[2 * e] = static_cast<std::byte>(b & 0xFF);
      out[2 * e + 1] = static_cast<std::byte>(b >> 8);
    }
  }
  std::vector<std::byte> bf16_bytes(std::size_t i) const {
    std::vector<std::byte> out(2 * elements(i));
    export_bf16(i, std::span<std::byte>(out));
    return out;
  }

  /// Little-endian FP32 bytes of the master weights of tensor i. @pre out.size() == 4 * elements(i).
  void export_f32(std::size_t i, std::span<std::byte> out) const {
    const auto& src = state_.at(i).master;
    check_size(i, out.size(), 4 * src.size(), "f32 byte");
    for (std::size_t e = 0; e < src.size(); ++e) {
      const std::uint32_t b = std::bit_cast<std::uint32_t>(src[e]);
      for (int k = 0; k < 4; ++k) out[4 * e + k] = static_cast<std::byte>((b >> (8 * k)) & 0xFF);
    }
  }

 private:
  enum : std::uint64_t { stream_init = 1, stream_signal = 2, stream_noise = 3 };
  struct tensor_state {
    std::vector<float> master, m, v;
  };

  /// Calls fn(tensor, begin, end) over every element range of at most `grain` elements, on
  /// cfg_.threads workers taking ranges round-robin. Ranges are disjoint, so order never matters.
  void for_each_range(const std::function<void(std::size_t, std::uint64_t, std::uint64_t)>& fn) const {
    constexpr std::uint64_t grain = 1u << 16;
    struct piece {
      std::size_t tensor;
      std::uint64_t begin, end;
    };
    std::vector<piece> pieces;
    for (std::size_t i = 0; i < state_.size(); ++i)
      for (std::uint64_t b = 0, n = state_[i].master.size(); b < n; b += grain)
        pieces.push_back({i, b, std::min<std::uint64_t>(n, b + grain)});
    unsigned workers = cfg_.threads != 0 ? cfg_.threads : std::max(1u, std::thread::hardware_concurrency());
    workers = static_cast<unsigned>(std::min<std::size_t>(workers, pieces.size()));
    auto run = [&](unsigned w) {
      for (std::size_t k = w; k < pieces.size(); k += workers) fn(pieces[k].tensor, pieces[k].begin, pieces[k].end);
    };
    if (workers <= 1) {
      if (workers == 1) run(0);
      return;
    }
    std::vector<std::jthread> pool;
    for (unsigned w = 1; w < workers; ++w) pool.emplace_back(run, w);
    run(0);
  }

  static float gradient_value(const counter_rng& sig, const counter_rng& noise, std::uint64_t e, double gs,
                              double pf, double noise_w) noexcept {
    return static_cast<float>(gs * (pf * sig.normal(e) + noise_w * noise.normal(e)));
  }
  std::uint64_t stream_key(std::string_view name, std::uint64_t kind, std::uint64_t step) const noexcept {
    return mix64(mix64(mix64(seed_ ^ name_hash(name)) + kind) + step);
  }
  void check_size(std::size_t i, std::size_t got, std::size_t want, const char* what) const {
    if (got != want)
      throw error(errc::invalid_argument,
                  std::string("export buffer holds ") + std::to_string(got) + " " + what + "s, tensor needs " +
                      std::to_string(want),
                  {.file = {}, .tensor = specs_[i].name, .field = "out"});
  }

  std::vector<tensor_spec> specs_;
  std::uint64_t seed_;
  adamw_config cfg_;
  std::vector<tensor_state> state_;
  std::uint64_t t_ = 0;
};

}  // namespace bitrefit::testing
