// bitrefit/layout/model_spec.hpp — real architectures described by their config, and their
// canonical (Hugging Face) tensor set.
//
// Two families: Llama-3-style dense decoders (model.layers.N.mlp.{gate,up,down}_proj) and
// Qwen3-MoE-style decoders (q_norm/k_norm, a router `mlp.gate` and per-expert
// `mlp.experts.E.{gate,up,down}_proj`). Names, shapes and row-major order are exactly those of
// the Hugging Face checkpoints, because canonical coordinates are those checkpoints' coordinates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"

namespace bitrefit::layout {

struct model_spec {
  std::string name;
  std::uint64_t hidden = 0;
  std::uint64_t heads = 0;      // query heads
  std::uint64_t kv_heads = 0;   // key/value heads (query groups)
  std::uint64_t head_dim = 0;
  std::uint64_t layers = 0;
  std::uint64_t intermediate = 0;      // dense MLP width (ignored when experts > 0)
  std::uint64_t experts = 0;           // 0: dense MLP; otherwise MoE in every layer
  std::uint64_t moe_intermediate = 0;  // per-expert MLP width
  std::uint64_t vocab = 0;
  bool tied_embeddings = false;  // lm_head shares model.embed_tokens.weight (no lm_head tensor)
  bool qk_norm = false;          // Qwen3: per-head RMSNorm on q and k (self_attn.{q,k}_norm.weight)
  dtype type = dtype::BF16;

  bool moe() const noexcept { return experts > 0; }

  /// Meta-Llama-3-8B config.json.
  static model_spec llama3_8b() {
    return {.name = "llama3-8b", .hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128, .layers = 32,
            .intermediate = 14336, .vocab = 128256, .tied_embeddings = false};
  }
  /// Llama-3.2-1B config.json (tied embeddings).
  static model_spec llama3_2_1b() {
    return {.name = "llama3.2-1b", .hidden = 2048, .heads = 32, .kv_heads = 8, .head_dim = 64, .layers = 16,
            .intermediate = 8192, .vocab = 128256, .tied_embeddings = true};
  }
  /// Qwen3-30B-A3B config.json: 48 layers, 128 experts (8 active), moe_intermediate 768.
  static model_spec qwen3_30b_a3b() {
    return {.name = "qwen3-30b-a3b", .hidden = 2048, .heads = 32, .kv_heads = 4, .head_dim = 128, .layers = 48,
            .intermediate = 6144, .experts = 128, .moe_intermediate = 768, .vocab = 151936,
            .tied_embeddings = false, .qk_norm = true};
  }

  /// Throws errc::invalid_argument naming the first inconsistent field.
  void validate() const {
    auto bad = [&](const char* field, const char* why) {
      throw error(errc::invalid_argument, std::string("model spec '") + name + "': " + why, {.file = {}, .tensor = {}, .field = field});
    };
    if (hidden == 0) bad("hidden", "must be positive");
    if (heads == 0 || kv_heads == 0) bad("heads", "heads and kv_heads must be positive");
    if (heads % kv_heads != 0) bad("kv_heads", "heads must be a multiple of kv_heads");
    if (head_dim == 0) bad("head_dim", "must be positive");
    if (layers == 0) bad("layers", "must be positive");
    if (vocab == 0) bad("vocab", "must be positive");
    if (moe() ? moe_intermediate == 0 : intermediate == 0) bad("intermediate", "MLP width must be positive");
  }
};

// --- canonical names (Hugging Face) ----------------------------------------------------------
inline std::string hf_layer(std::uint64_t l) { return "model.layers." + std::to_string(l) + "."; }
inline std::string hf_expert(std::uint64_t l, std::uint64_t e) {
  return hf_layer(l) + "mlp.experts." + std::to_string(e) + ".";
}
inline const std::string hf_embed = "model.embed_tokens.weight";
inline const std::string hf_final_norm = "model.norm.weight";
inline const std::string hf_lm_head = "lm_head.weight";

/// The canonical manifest of `s`: every tensor of its Hugging Face checkpoint.
inline model_manifest canonical_manifest(const model_spec& s) {
  s.validate();
  const std::uint64_t H = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  std::vector<tensor_info> ts;
  auto add = [&](std::string n, shape_t shape) { ts.push_back({std::move(n), s.type, std::move(shape)}); };
  add(hf_embed, {s.vocab, H});
  add(hf_final_norm, {H});
  if (!s.tied_embeddings) add(hf_lm_head, {s.vocab, H});
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = hf_layer(l);
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {q, H});
    add(p + "self_attn.k_proj.weight", {kv, H});
    add(p + "self_attn.v_proj.weight", {kv, H});
    add(p + "self_attn.o_proj.weight", {H, q});
    if (s.qk_norm) {
      add(p + "self_attn.q_norm.weight", {s.head_dim});
      add(p + "self_attn.k_norm.weight", {s.head_dim});
    }
    if (s.moe()) {
      add(p + "mlp.gate.weight", {s.experts, H});
      for (std::uint64_t e = 0; e < s.experts; ++e) {
        const std::string x = hf_expert(l, e);
        add(x + "gate_proj.weight", {s.moe_intermediate, H});
        add(x + "up_proj.weight", {s.moe_intermediate, H});
        add(x + "down_proj.weight", {H, s.moe_intermediate});
      }
    } else {
      add(p + "mlp.gate_proj.weight", {s.intermediate, H});
      add(p + "mlp.up_proj.weight", {s.intermediate, H});
      add(p + "mlp.down_proj.weight", {H, s.intermediate});
    }
  }
  return model_manifest(std::move(ts));
}

}  // namespace bitrefit::layout
