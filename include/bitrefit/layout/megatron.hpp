// bitrefit/layout/megatron.hpp — the Projection of a Megatron-style trainer rank.
//
// One rank of a trainer with tensor (tp), pipeline (pp), data (dp) parallelism and, for MoE,
// expert parallelism (ep) with expert tensor parallelism (etp) folded over the tp x dp ranks of
// a stage (Megatron's "MoE parallel folding"). The rank stores:
//   embedding.word_embeddings.weight          [Vp/tp, H]  vocab-parallel, Vp = V padded (first stage)
//   decoder.layers.L.input_layernorm.weight   [H]         replicated (L = local layer index)
//   decoder.layers.L.self_attention.linear_qkv.weight
//        [ng/tp * (nq/ng + 2) * hd, H]  fused QKV, grouped-query interleave: per query group, that
//                                       group's query heads, then its key head, then its value head
//   decoder.layers.L.self_attention.{q,k}_layernorm.weight [hd]   (Qwen3 qk-norm) replicated
//   decoder.layers.L.self_attention.linear_proj.weight  [H, nq*hd/tp]   row-parallel
//   decoder.layers.L.pre_mlp_layernorm.weight  [H]        replicated
//   dense:  decoder.layers.L.mlp.linear_fc1.weight [2*I/tp, H]  fused [gate shard; up shard]
//           decoder.layers.L.mlp.linear_fc2.weight [H, I/tp]    row-parallel
//   MoE:    decoder.layers.L.mlp.router.weight [E, H]            replicated
//           decoder.layers.L.mlp.experts.linear_fc1.weight [E/ep, 2*Im/etp, H]  stacked, fused gate/up
//           decoder.layers.L.mlp.experts.linear_fc2.weight [E/ep, H, Im/etp]    stacked, row-parallel
//   decoder.final_layernorm.weight [H]   (last stage)
//   output_layer.weight [Vp/tp, H]       (last stage; with tied embeddings only when pp > 1, as a
//                                         non-owning copy of model.embed_tokens.weight)
// Pipeline stage s holds global layers [s*L/pp, (s+1)*L/pp): local layer l is global l + offset.
// Replicated tensors have one owner per replica group, chosen by stable_owner(canonical name).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/model_spec.hpp"
#include "bitrefit/layout/ownership.hpp"
#include "bitrefit/layout/runs.hpp"

namespace bitrefit::layout {

struct trainer_parallel {
  std::uint32_t tp = 1, pp = 1, dp = 1, ep = 1, etp = 1;
  std::uint64_t vocab_multiple = 128;  // vocab is padded to a multiple of vocab_multiple * tp

  std::uint32_t stage_ranks() const noexcept { return tp * dp; }          // ranks per pipeline stage
  std::uint32_t world() const noexcept { return tp * pp * dp; }
  std::uint32_t edp() const noexcept { return tp * dp / (ep * etp); }     // expert-data-parallel replicas
  std::uint64_t padded_vocab(std::uint64_t v) const noexcept {
    const std::uint64_t m = vocab_multiple * tp;
    return (v + m - 1) / m * m;
  }
  /// Global layers [first, end) of pipeline stage s.
  index_range stage_layers(std::uint64_t layers, std::uint32_t s) const noexcept {
    return {s * layers / pp, (s + 1ull) * layers / pp};
  }

  /// Throws errc::invalid_argument naming the field that does not fit `m`.
  void validate(const model_spec& m) const {
    auto bad = [&](const char* field, std::string why) {
      throw error(errc::invalid_argument, "parallel config for '" + m.name + "': " + why, {.file = {}, .tensor = {}, .field = field});
    };
    if (!tp || !pp || !dp || !ep || !etp || !vocab_multiple) bad("tp", "every parallel size must be positive");
    if (m.kv_heads % tp) bad("tp", "kv_heads (query groups) must be a multiple of tp");
    if (!m.moe() && m.intermediate % tp) bad("tp", "intermediate must be a multiple of tp");
    if (pp > m.layers) bad("pp", "more pipeline stages than layers");
    if (m.moe()) {
      if (m.experts % ep) bad("ep", "experts must be a multiple of ep");
      if (m.moe_intermediate % etp) bad("etp", "moe_intermediate must be a multiple of etp");
      if ((tp * dp) % (ep * etp)) bad("ep", "ep * etp must divide tp * dp (ranks of a stage)");
    } else if (ep != 1 || etp != 1) {
      bad("ep", "expert parallelism on a dense model");
    }
  }
};

struct trainer_rank {
  std::uint32_t tp = 0, pp = 0, dp = 0;
  friend bool operator==(const trainer_rank&, const trainer_rank&) = default;
};

/// Every rank of a configuration, in (pp, dp, tp) order.
inline std::vector<trainer_rank> all_ranks(const trainer_parallel& p) {
  std::vector<trainer_rank> r;
  for (std::uint32_t s = 0; s < p.pp; ++s)
    for (std::uint32_t d = 0; d < p.dp; ++d)
      for (std::uint32_t t = 0; t < p.tp; ++t) r.push_back({t, s, d});
  return r;
}

class megatron_projection {
 public:
  megatron_projection(const model_spec& m, trainer_parallel p, trainer_rank r)
      : megatron_projection(std::make_shared<const model_manifest>(canonical_manifest(m)), m, p, r) {}

  /// Shares one canonical manifest between the ranks of a configuration.
  megatron_projection(std::shared_ptr<const model_manifest> canonical, const model_spec& m, trainer_parallel p, trainer_rank r)
      : canonical_(std::move(canonical)), spec_(m), par_(p), rank_(r) {
    m.validate();
    p.validate(m);
    if (r.tp >= p.tp || r.pp >= p.pp || r.dp >= p.dp)
      throw error(errc::invalid_argument, "rank outside the parallel config", {.file = {}, .tensor = {}, .field = "rank"});
    build();
  }

  const model_manifest& canonical() const noexcept { return *canonical_; }
  const std::vector<shard_tensor>& tensors() const noexcept { return tensors_; }
  const trainer_parallel& parallel() const noexcept { return par_; }
  const trainer_rank& rank() const noexcept { return rank_; }
  const model_spec& spec() const noexcept { return spec_; }

  /// Expert coordinates of this rank under MoE parallel folding.
  std::uint32_t etp_rank() const noexcept { return stage_index() % par_.etp; }
  std::uint32_t ep_rank() const noexcept { return (stage_index() / par_.etp) % par_.ep; }
  std::uint32_t edp_rank() const noexcept { return stage_index() / (par_.etp * par_.ep); }

 private:
  std::uint32_t stage_index() const noexcept { return rank_.dp * par_.tp + rank_.tp; }

  std::uint32_t tensor_index(const std::string& name) const {
    if (auto i = canonical_->index_of(name)) return static_cast<std::uint32_t>(*i);
    throw error(errc::mismatch, "projection names a tensor missing from the canonical manifest", {.file = {}, .tensor = name, .field = {}});
  }
  // Ownership rules, by replica group.
  bool own_tp_sharded(const std::string& c) const { return rank_.dp == stable_owner(c, par_.dp); }
  bool own_replicated(const std::string& c) const { return stage_index() == stable_owner(c, par_.stage_ranks()); }
  bool own_expert(const std::string& c) const { return edp_rank() == stable_owner(c, par_.edp()); }

  shard_tensor& add(std::string name, shape_t shape) {
    tensors_.push_back({std::move(name), spec_.type, std::move(shape), {}});
    return tensors_.back();
  }
  run_block run(const std::string& canonical, std::uint64_t local, std::uint64_t cbegin, std::uint64_t length, bool owned) const {
    return run_block{.tensor = tensor_index(canonical), .local = local, .canonical = cbegin, .length = length, .owned = owned};
  }
  void replicated(std::string local, const std::string& canonical) {
    const std::uint64_t n = canonical_->at(canonical).elements();
    add(std::move(local), canonical_->at(canonical).shape).runs.push_back(run(canonical, 0, 0, n, own_replicated(canonical)));
  }
  void vocab_parallel(std::string local, const std::string& canonical, bool owner_side) {
    const std::uint64_t H = spec_.hidden, per = par_.padded_vocab(spec_.vocab) / par_.tp;
    const std::uint64_t r0 = rank_.tp * per, r1 = std::min<std::uint64_t>(r0 + per, spec_.vocab);
    auto& t = add(std::move(local), {per, H});
    if (r1 > r0) t.runs.push_back(run(canonical, 0, r0 * H, (r1 - r0) * H, owner_side && own_tp_sharded(canonical)));
  }
  /// Row-parallel slice: local [rows, cols_local] at `local` ↔ canonical [rows, cols] columns [c0, c0 + cols_local).
  run_block row_parallel(const std::string& canonical, std::uint64_t local, std::uint64_t rows, std::uint64_t cols,
                         std::uint64_t cols_local, std::uint64_t c0, bool owned) const {
    run_block b = run(canonical, local, c0, cols_local, owned);
    b.count = rows;
    b.local_stride = cols_local;
    b.canonical_stride = cols;
    return coalesced(b);
  }

  void build() {
    const std::uint64_t H = spec_.hidden, hd = spec_.head_dim, ng = spec_.kv_heads, qpg = spec_.heads / ng;
    const std::uint64_t ng_l = ng / par_.tp;
    const bool first = rank_.pp == 0, last = rank_.pp + 1 == par_.pp;
    if (first) vocab_parallel("embedding.word_embeddings.weight", hf_embed, true);
    const index_range layers = par_.stage_layers(spec_.layers, rank_.pp);
    for (std::uint64_t g = layers.begin; g < layers.end; ++g) {
      const std::string lp = "decoder.layers." + std::to_string(g - layers.begin) + ".";
      const std::string hp = hf_layer(g);
      replicated(lp + "input_layernorm.weight", hp + "input_layernorm.weight");
      {  // fused QKV, grouped-query interleave, column-parallel over query groups
        auto& t = add(lp + "self_attention.linear_qkv.weight", {ng_l * (qpg + 2) * hd, H});
        for (std::uint64_t j = 0; j < ng_l; ++j) {
          const std::uint64_t G = rank_.tp * ng_l + j, base = j * (qpg + 2) * hd * H;
          t.runs.push_back(run(hp + "self_attn.q_proj.weight", base, G * qpg * hd * H, qpg * hd * H, own_tp_sharded(hp + "self_attn.q_proj.weight")));
          t.runs.push_back(run(hp + "self_attn.k_proj.weight", base + qpg * hd * H, G * hd * H, hd * H, own_tp_sharded(hp + "self_attn.k_proj.weight")));
          t.runs.push_back(run(hp + "self_attn.v_proj.weight", base + (qpg + 1) * hd * H, G * hd * H, hd * H, own_tp_sharded(hp + "self_attn.v_proj.weight")));
        }
      }
      if (spec_.qk_norm) {
        replicated(lp + "self_attention.q_layernorm.weight", hp + "self_attn.q_norm.weight");
        replicated(lp + "self_attention.k_layernorm.weight", hp + "self_attn.k_norm.weight");
      }
      {
        const std::uint64_t q = spec_.heads * hd, ql = q / par_.tp;
        const std::string c = hp + "self_attn.o_proj.weight";
        add(lp + "self_attention.linear_proj.weight", {H, ql}).runs.push_back(row_parallel(c, 0, H, q, ql, rank_.tp * ql, own_tp_sharded(c)));
      }
      replicated(lp + "pre_mlp_layernorm.weight", hp + "post_attention_layernorm.weight");
      if (!spec_.moe()) {
        const std::uint64_t I = spec_.intermediate, Il = I / par_.tp;
        const std::string gate = hp + "mlp.gate_proj.weight", up = hp + "mlp.up_proj.weight", down = hp + "mlp.down_proj.weight";
        auto& fc1 = add(lp + "mlp.linear_fc1.weight", {2 * Il, H});
        fc1.runs.push_back(run(gate, 0, rank_.tp * Il * H, Il * H, own_tp_sharded(gate)));
        fc1.runs.push_back(run(up, Il * H, rank_.tp * Il * H, Il * H, own_tp_sharded(up)));
        add(lp + "mlp.linear_fc2.weight", {H, Il}).runs.push_back(row_parallel(down, 0, H, I, Il, rank_.tp * Il, own_tp_sharded(down)));
      } else {
        replicated(lp + "mlp.router.weight", hp + "mlp.gate.weight");
        const std::uint64_t El = spec_.experts / par_.ep, Im = spec_.moe_intermediate, Iml = Im / par_.etp;
        auto& fc1 = add(lp + "mlp.experts.linear_fc1.weight", {El, 2 * Iml, H});  // finished before the next add
        for (std::uint64_t j = 0; j < El; ++j) {
          const std::string x = hf_expert(g, ep_rank() * El + j);
          const std::uint64_t base = j * 2 * Iml * H;
          fc1.runs.push_back(run(x + "gate_proj.weight", base, etp_rank() * Iml * H, Iml * H, own_expert(x + "gate_proj.weight")));
          fc1.runs.push_back(run(x + "up_proj.weight", base + Iml * H, etp_rank() * Iml * H, Iml * H, own_expert(x + "up_proj.weight")));
        }
        auto& fc2 = add(lp + "mlp.experts.linear_fc2.weight", {El, H, Iml});
        for (std::uint64_t j = 0; j < El; ++j) {
          const std::string d = hf_expert(g, ep_rank() * El + j) + "down_proj.weight";
          fc2.runs.push_back(row_parallel(d, j * H * Iml, H, Im, Iml, etp_rank() * Iml, own_expert(d)));
        }
      }
    }
    if (last) {
      replicated("decoder.final_layernorm.weight", hf_final_norm);
      if (!spec_.tied_embeddings)
        vocab_parallel("output_layer.weight", hf_lm_head, true);
      else if (par_.pp > 1)
        vocab_parallel("output_layer.weight", hf_embed, false);  // tied: the first stage's embedding owns it
    }
  }

  std::shared_ptr<const model_manifest> canonical_;
  model_spec spec_;
  trainer_parallel par_;
  trainer_rank rank_;
  std::vector<shard_tensor> tensors_;
};

static_assert(Projection<megatron_projection>);

}  // namespace bitrefit::layout
