// bench/refit/workload.hpp — the model and the sequence of versions every method replays.
//
// Same model, same change sets for every method: each session (one method over one link) starts
// from the same version 0 and walks the same deterministic sequence of versions, so dense,
// overwrite and bitrefit all move exactly the same bits.
//   adamw:K    K real AdamW steps of the library's simulator (sim/adamw.hpp: FP32 master weights,
//              lr 1e-6, synthetic gradients, round-to-nearest-even BF16 export) — BF16 rounding
//              decides which elements change, as in a mixed-precision trainer. 12 bytes of
//              simulator state per parameter, freed after the last AdamW step.
//   P          (0, 0.01, 0.03, ...) each element moves, with probability P, to an adjacent BF16 value
//              (bits +1 or -1, the way a rounding flip moves it) — bench/codec's synthetic deltas.
//              Chosen by a counter-based hash of (seed, tensor, version, element): deterministic.
// The model: a Llama-shaped decoder (Hugging Face names) of about --model-mib MiB of BF16.
#pragma once

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bitrefit/core/manifest.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/projection.hpp"
#include "options.hpp"

// The library's AdamW simulator (testing/adamw.hpp), called `sim` here.
#include "bitrefit/testing/adamw.hpp"
namespace bench { namespace sim = bitrefit::testing; }

namespace bench {

using namespace bitrefit;

struct change_step {
  enum class kind { adamw, synthetic } k = kind::synthetic;
  double rate = 0;     // synthetic: probability that an element moves
  int adamw_step = 0;  // adamw: the optimizer step this version is the result of
  std::string label() const {
    if (k == kind::adamw) return "adamw-" + std::to_string(adamw_step);
    char b[32];
    std::snprintf(b, sizeof b, "synthetic-%g", rate);
    return b;
  }
};

/// "adamw:3,0,0.01,0.03,0.05" -> adamw steps 1..3, then synthetic 0, 1 %, 3 %, 5 %. AdamW steps
/// must come first (the simulator knows nothing of synthetic moves made after it).
inline std::vector<change_step> parse_changes(const std::string& spec) {
  std::vector<change_step> out;
  bool synthetic_seen = false;
  for (const auto& part : split(spec, ',')) {
    if (part.rfind("adamw", 0) == 0) {
      if (synthetic_seen) usage("--changes: adamw steps must come before synthetic rates");
      int k = 1;
      if (part.size() > 5) {
        if (part[5] != ':') usage("--changes: adamw or adamw:K");
        k = static_cast<int>(parse_uint(part.substr(6), "--changes adamw:K"));
      }
      const int first = out.empty() ? 1 : out.back().adamw_step + 1;
      for (int s = 0; s < k; ++s) out.push_back({change_step::kind::adamw, 0, first + s});
    } else {
      double p = -1;
      try {
        std::size_t used = 0;
        p = std::stod(part, &used);
        if (used != part.size()) p = -1;
      } catch (const std::exception&) {
      }
      if (!(p >= 0 && p <= 1)) usage("--changes: '" + part + "' is neither adamw[:K] nor a rate in [0, 1]");
      out.push_back({change_step::kind::synthetic, p, 0});
      synthetic_seen = true;
    }
  }
  if (out.empty()) usage("--changes is empty");
  return out;
}

/// A Llama-shaped decoder of about `bytes` of BF16: width by size class, then as many layers as fit.
inline sim::llama_dims dims_for_bytes(std::uint64_t bytes) {
  const std::uint64_t p = bytes / 2;
  sim::llama_dims d;
  if (p < 1'000'000) d = {1, 64, 172, 256, 4, 2, false};
  else if (p < 40'000'000) d = {1, 256, 688, 4096, 8, 4, false};
  else if (p < 300'000'000) d = {1, 768, 2048, 32000, 12, 4, false};
  else d = {1, 2048, 5632, 32000, 16, 4, false};
  const std::uint64_t head = d.hidden / d.heads, kv = d.kv_heads * head;
  const std::uint64_t embed = 2 * d.vocab * d.hidden + d.hidden;
  const std::uint64_t layer = 2 * d.hidden * d.hidden + 2 * kv * d.hidden + 3 * d.hidden * d.intermediate + 2 * d.hidden;
  d.layers = p > embed ? std::max<std::uint64_t>(1, (p - embed + layer / 2) / layer) : 1;
  return d;
}

inline model_manifest manifest_of(const std::vector<sim::tensor_spec>& specs) {
  std::vector<tensor_info> ts;
  for (const auto& s : specs) ts.push_back({s.name, dtype::BF16, s.shape});
  return model_manifest(std::move(ts));
}

/// The trainer's side of the workload: its current canonical BF16 bits and how the next version
/// is made.
class workload {
 public:
  workload(std::uint64_t model_bytes, std::uint64_t seed, std::vector<change_step> steps, unsigned threads)
      : dims_(dims_for_bytes(model_bytes)), specs_(sim::llama_like(dims_)), manifest_(manifest_of(specs_)),
        bits_(manifest_), seed_(seed), steps_(std::move(steps)), threads_(threads ? threads : 1) {
    for (const auto& s : steps_)
      if (s.k == change_step::kind::adamw) {
        sim::adamw_config cfg;
        cfg.lr = 1e-6f;
        cfg.threads = threads_;
        sim_ = std::make_unique<sim::adamw_sim>(specs_, seed_, cfg);
        break;
      }
    if (sim_) export_sim();
    else init_without_sim();
  }

  const sim::llama_dims& dims() const noexcept { return dims_; }
  const model_manifest& manifest() const noexcept { return manifest_; }
  const std::vector<change_step>& steps() const noexcept { return steps_; }
  const layout::canonical_store& bits() const noexcept { return bits_; }
  std::uint64_t version() const noexcept { return version_; }
  /// Elements whose bits differ between version()-1 and version() (counted by advance()).
  std::uint64_t last_changed() const noexcept { return last_changed_; }

  /// The current version's canonical bits for the sender's identity projection.
  refit::tensor_source source() const {
    return refit::copy_from([this](const tensor_info& t) { return std::span<const std::byte>(bits_.bytes(t.name)); });
  }

  /// Makes version()+1 with the same bits: the unrecorded warm-up refit every session starts with
  /// (first-touch page faults, connection setup and allocator growth are not part of any record).
  void warm_up() {
    ++version_;
    last_changed_ = 0;
  }

  /// Makes version()+1 with step `k` of the sequence ("training"; not part of any refit's time).
  void advance(std::size_t k) {
    const change_step& s = steps_.at(k);
    ++version_;
    last_changed_ = 0;
    if (s.k == change_step::kind::adamw) {
      if (!sim_ || sim_->steps() + 1 != static_cast<std::uint64_t>(s.adamw_step))
        throw error(errc::invalid_argument, "AdamW steps must come first and in order", {.file = {}, .tensor = {}, .field = "--changes"});
      sim_->step();
      export_sim();
      bool more = false;
      for (std::size_t j = k + 1; j < steps_.size(); ++j) more |= steps_[j].k == change_step::kind::adamw;
      if (!more) sim_.reset();  // 12 bytes per parameter back to the machine
      return;
    }
    sim_.reset();
    move_synthetic(s.rate);
  }

 private:
  void export_sim() {
    std::vector<std::uint16_t> next;
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      auto b = bits_.bytes(specs_[i].name);
      next.resize(b.size() / 2);
      sim_->export_bf16(i, std::span<std::uint16_t>(next));
      for (std::size_t e = 0; e < next.size(); ++e) {
        last_changed_ += load_bf16(b, e) != next[e];
        store_bf16(b, e, next[e]);
      }
    }
  }
  /// Version 0 without the simulator: N(0, 0.02) weights (ones for norms), as the simulator starts.
  void init_without_sim() {
    for (const auto& s : specs_) {
      auto b = bits_.bytes(s.name);
      const sim::counter_rng rng{sim::mix64(seed_ ^ sim::name_hash(s.name))};
      for (std::size_t e = 0; e < b.size() / 2; ++e) {
        const float x = s.init == sim::init_kind::ones ? 1.0f : static_cast<float>(rng.normal(e) * 0.02);
        store_bf16(b, e, sim::bf16_round(x));
      }
    }
  }
  void move_synthetic(double p) {
    if (p <= 0) return;
    const auto threshold = static_cast<std::uint64_t>(p * 18446744073709551615.0);
    std::vector<std::uint64_t> moved(threads_, 0);
    {
    std::vector<std::jthread> pool;
    for (unsigned w = 0; w < threads_; ++w)
      pool.emplace_back([&, w] {
        for (std::size_t ti = w; ti < specs_.size(); ti += threads_) {
          const auto& s = specs_[ti];
          auto b = bits_.bytes(s.name);
          const std::uint64_t key = sim::mix64(sim::mix64(seed_ ^ sim::name_hash(s.name)) + version_);
          for (std::size_t e = 0; e < b.size() / 2; ++e) {
            const std::uint64_t h = sim::mix64(key + 0x9E3779B97F4A7C15ull * (e + 1));
            if (h >= threshold) continue;
            std::uint16_t v = load_bf16(b, e);
            const bool up = (h & 1) != 0 || (v & 0x7FFF) == 0;  // from +-0 only up in magnitude
            v = static_cast<std::uint16_t>(up ? v + 1 : v - 1);
            store_bf16(b, e, v);
            ++moved[w];
          }
        }
      });
    }
    for (auto n : moved) last_changed_ += n;
  }
  static std::uint16_t load_bf16(std::span<std::byte> b, std::size_t e) {
    return static_cast<std::uint16_t>(std::to_integer<unsigned>(b[2 * e]) | (std::to_integer<unsigned>(b[2 * e + 1]) << 8));
  }
  static void store_bf16(std::span<std::byte> b, std::size_t e, std::uint16_t v) {
    b[2 * e] = static_cast<std::byte>(v & 0xFF);
    b[2 * e + 1] = static_cast<std::byte>(v >> 8);
  }

  sim::llama_dims dims_;
  std::vector<sim::tensor_spec> specs_;
  model_manifest manifest_;
  layout::canonical_store bits_;
  std::uint64_t seed_;
  std::vector<change_step> steps_;
  unsigned threads_;
  std::unique_ptr<sim::adamw_sim> sim_;
  std::uint64_t version_ = 0;
  std::uint64_t last_changed_ = 0;
};

/// Raw chunks of the dense baseline: the model's bytes, tensor by tensor, in pieces of at most
/// `max_bytes` (both sides compute the same plan from the manifest).
struct dense_chunk {
  std::size_t tensor;
  std::uint64_t offset, size;
};
inline std::vector<dense_chunk> dense_plan(const model_manifest& m, std::uint64_t max_bytes) {
  std::vector<dense_chunk> out;
  for (std::size_t i = 0; i < m.size(); ++i)
    for (std::uint64_t off = 0, n = m.tensors()[i].bytes(); off < n; off += max_bytes)
      out.push_back({i, off, std::min(max_bytes, n - off)});
  return out;
}

}  // namespace bench
