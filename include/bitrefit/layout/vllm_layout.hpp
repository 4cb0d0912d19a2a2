// bitrefit/layout/vllm_layout.hpp — a vLLM-like serving rank as a Loader.
//
// One tensor-parallel rank of a serving engine laid out the way vLLM's model runners lay out
// Llama and Qwen3-MoE weights, placing canonical values in place (the role of vLLM's
// weight_loader, without its full reloads):
//   model.embed_tokens.weight, lm_head.weight       [Vp/tp, H]  vocab-parallel, padding rows
//                                                    (Vp = V padded to vocab_multiple * tp) hold no
//                                                    canonical element; tied models have no lm_head
//   model.layers.L.self_attn.qkv_proj.weight        [(nq/tp + 2*kvl) * hd, H] merged [q; k; v] of
//                                                    this rank's heads; with kv_heads < tp each kv
//                                                    head is replicated on tp/kv_heads ranks
//   model.layers.L.self_attn.o_proj.weight          [H, nq*hd/tp]  row-parallel
//   model.layers.L.mlp.gate_up_proj.weight          [2*I/tp, H] merged [gate; up]   (dense)
//   model.layers.L.mlp.down_proj.weight             [H, I/tp]      row-parallel     (dense)
//   model.layers.L.mlp.gate.weight                  [E, H]         replicated router (MoE)
//   model.layers.L.mlp.experts.w13_weight           [El, 2*Il, H]  stacked experts, merged gate/up
//   model.layers.L.mlp.experts.w2_weight            [El, H, Il]    stacked experts
//        (expert_parallel: El = E/tp whole experts per rank; otherwise El = E and Il = Im/tp)
//   norms (input/post_attention/q/k/final)          replicated on every rank
// The placement is built from the same run blocks as trainer projections; per canonical tensor it
// becomes a sorted list of placement segments (held ranges = their union).
//
// Option norms_as_f32 stores the RMSNorm weights upcast to F32 (as some engines keep them). That
// placement is exact and invertible (a BF16 value is the top half of its F32), but it is not
// bit-preserving: those tensors declare bit_preserving == false, have no segments, and accept
// overwrite only — the case the refit protocol must detect to keep XOR off.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/model_spec.hpp"
#include "bitrefit/layout/runs.hpp"

namespace bitrefit::layout {

struct serving_parallel {
  std::uint32_t tp = 1;
  bool expert_parallel = false;       // whole experts per rank (vLLM --enable-expert-parallel)
  std::uint64_t vocab_multiple = 64;  // vLLM pads the vocabulary to a multiple of 64 per rank group
  bool norms_as_f32 = false;          // store RMSNorm weights upcast to F32 (not bit-preserving)

  std::uint64_t padded_vocab(std::uint64_t v) const noexcept {
    const std::uint64_t m = vocab_multiple * tp;
    return (v + m - 1) / m * m;
  }
  void validate(const model_spec& m) const {
    auto bad = [&](const char* field, std::string why) {
      throw error(errc::invalid_argument, "serving config for '" + m.name + "': " + why, {.file = {}, .tensor = {}, .field = field});
    };
    if (!tp || !vocab_multiple) bad("tp", "tp and vocab_multiple must be positive");
    if (m.heads % tp) bad("tp", "heads must be a multiple of tp");
    if (m.kv_heads % tp && tp % m.kv_heads) bad("tp", "kv_heads must divide or be a multiple of tp");
    if (!m.moe() && m.intermediate % tp) bad("tp", "intermediate must be a multiple of tp");
    if (m.moe() && expert_parallel && m.experts % tp) bad("expert_parallel", "experts must be a multiple of tp");
    if (m.moe() && !expert_parallel && m.moe_intermediate % tp) bad("tp", "moe_intermediate must be a multiple of tp");
    if (norms_as_f32 && m.type != dtype::BF16) bad("norms_as_f32", "the exact F32 upcast is defined for BF16 canonical norms only");
  }
};

class vllm_rank_loader {
 public:
  vllm_rank_loader(const model_spec& m, serving_parallel p, std::uint32_t rank)
      : vllm_rank_loader(std::make_shared<const model_manifest>(canonical_manifest(m)), m, p, rank) {}

  vllm_rank_loader(std::shared_ptr<const model_manifest> canonical, const model_spec& m, serving_parallel p, std::uint32_t rank)
      : canonical_(std::move(canonical)), spec_(m), par_(p), rank_(rank) {
    m.validate();
    p.validate(m);
    if (rank >= p.tp) throw error(errc::invalid_argument, "rank outside the serving tp size", {.file = {}, .tensor = {}, .field = "rank"});
    build();
    place();
  }

  vllm_rank_loader(const vllm_rank_loader&) = delete;  // segments point into storage_
  vllm_rank_loader& operator=(const vllm_rank_loader&) = delete;
  vllm_rank_loader(vllm_rank_loader&&) noexcept = default;
  vllm_rank_loader& operator=(vllm_rank_loader&&) noexcept = default;

  // --- Loader -------------------------------------------------------------------------------
  const model_manifest& canonical() const noexcept { return *canonical_; }
  std::span<const index_range> held(std::string_view t) const { return per_[index(t)].held; }
  bool bit_preserving(std::string_view t) const { return !per_[index(t)].upcast; }
  std::span<const placement_segment> segments(std::string_view t) const {
    const auto& c = per_[index(t)];
    return c.upcast ? std::span<const placement_segment>{} : std::span<const placement_segment>(c.segments);
  }
  void write(std::string_view t, index_range r, std::span<const std::byte> in) { transfer(t, r, const_cast<std::byte*>(in.data()), in.size(), true); }
  void read(std::string_view t, index_range r, std::span<std::byte> out) const {
    const_cast<vllm_rank_loader*>(this)->transfer(t, r, out.data(), out.size(), false);
  }

  // --- the engine's own tensors ---------------------------------------------------------------
  /// Engine tensors with their run blocks to canonical tensors (dtype F32 for upcast norms).
  const std::vector<shard_tensor>& tensors() const noexcept { return tensors_; }
  std::span<std::byte> bytes(std::size_t engine_tensor) noexcept { return storage_[engine_tensor]; }
  std::span<const std::byte> bytes(std::size_t engine_tensor) const noexcept { return storage_[engine_tensor]; }
  const serving_parallel& parallel() const noexcept { return par_; }
  std::uint32_t rank() const noexcept { return rank_; }

 private:
  struct per_canonical {
    std::vector<placement_segment> segments;  // sorted by begin; for upcast tensors data points to F32 storage
    std::vector<index_range> held;
    bool upcast = false;
  };

  std::size_t index(std::string_view t) const {
    if (auto i = canonical_->index_of(t)) return *i;
    throw error(errc::mismatch, "tensor is not in this engine's canonical manifest", {.file = {}, .tensor = std::string(t), .field = {}});
  }
  std::uint32_t tensor_index(const std::string& name) const { return static_cast<std::uint32_t>(index(name)); }

  shard_tensor& add(std::string name, shape_t shape, dtype type) {
    tensors_.push_back({std::move(name), type, std::move(shape), {}});
    return tensors_.back();
  }
  run_block run(const std::string& c, std::uint64_t local, std::uint64_t cb, std::uint64_t len) const {
    return run_block{.tensor = tensor_index(c), .local = local, .canonical = cb, .length = len};
  }
  run_block row_parallel(const std::string& c, std::uint64_t local, std::uint64_t rows, std::uint64_t cols, std::uint64_t cols_l, std::uint64_t c0) const {
    run_block b = run(c, local, c0, cols_l);
    b.count = rows;
    b.local_stride = cols_l;
    b.canonical_stride = cols;
    return coalesced(b);
  }
  void identity(const std::string& name, bool norm) {
    const tensor_info& t = canonical_->at(name);
    add(name, t.shape, norm && par_.norms_as_f32 ? dtype::F32 : t.type).runs.push_back(run(name, 0, 0, t.elements()));
  }
  void vocab(const std::string& name) {
    const std::uint64_t H = spec_.hidden, per = par_.padded_vocab(spec_.vocab) / par_.tp;
    const std::uint64_t r0 = rank_ * per, r1 = std::min<std::uint64_t>(r0 + per, spec_.vocab);
    auto& t = add(name, {per, H}, spec_.type);
    if (r1 > r0) t.runs.push_back(run(name, 0, r0 * H, (r1 - r0) * H));
  }

  void build() {
    const std::uint64_t H = spec_.hidden, hd = spec_.head_dim, tp = par_.tp;
    const std::uint64_t nql = spec_.heads / tp, kvl = spec_.kv_heads >= tp ? spec_.kv_heads / tp : 1;
    const std::uint64_t kv0 = spec_.kv_heads >= tp ? rank_ * kvl : rank_ * spec_.kv_heads / tp;  // first kv head held
    vocab(hf_embed);
    identity(hf_final_norm, true);
    if (!spec_.tied_embeddings) vocab(hf_lm_head);
    for (std::uint64_t l = 0; l < spec_.layers; ++l) {
      const std::string p = hf_layer(l);
      identity(p + "input_layernorm.weight", true);
      identity(p + "post_attention_layernorm.weight", true);
      {
        auto& t = add(p + "self_attn.qkv_proj.weight", {(nql + 2 * kvl) * hd, H}, spec_.type);
        t.runs.push_back(run(p + "self_attn.q_proj.weight", 0, rank_ * nql * hd * H, nql * hd * H));
        t.runs.push_back(run(p + "self_attn.k_proj.weight", nql * hd * H, kv0 * hd * H, kvl * hd * H));
        t.runs.push_back(run(p + "self_attn.v_proj.weight", (nql + kvl) * hd * H, kv0 * hd * H, kvl * hd * H));
      }
      {
        const std::uint64_t q = spec_.heads * hd, ql = q / tp;
        add(p + "self_attn.o_proj.weight", {H, ql}, spec_.type).runs.push_back(row_parallel(p + "self_attn.o_proj.weight", 0, H, q, ql, rank_ * ql));
      }
      if (spec_.qk_norm) {
        identity(p + "self_attn.q_norm.weight", true);
        identity(p + "self_attn.k_norm.weight", true);
      }
      if (!spec_.moe()) {
        const std::uint64_t I = spec_.intermediate, Il = I / tp;
        auto& gu = add(p + "mlp.gate_up_proj.weight", {2 * Il, H}, spec_.type);
        gu.runs.push_back(run(p + "mlp.gate_proj.weight", 0, rank_ * Il * H, Il * H));
        gu.runs.push_back(run(p + "mlp.up_proj.weight", Il * H, rank_ * Il * H, Il * H));
        add(p + "mlp.down_proj.weight", {H, Il}, spec_.type).runs.push_back(row_parallel(p + "mlp.down_proj.weight", 0, H, I, Il, rank_ * Il));
      } else {
        identity(p + "mlp.gate.weight", false);
        const bool ep = par_.expert_parallel;
        const std::uint64_t El = ep ? spec_.experts / tp : spec_.experts, Im = spec_.moe_intermediate, Il = ep ? Im : Im / tp;
        const std::uint64_t e0 = ep ? rank_ * El : 0, i0 = ep ? 0 : rank_ * Il;
        auto& w13 = add(p + "mlp.experts.w13_weight", {El, 2 * Il, H}, spec_.type);
        for (std::uint64_t j = 0; j < El; ++j) {
          const std::string x = hf_expert(l, e0 + j);
          w13.runs.push_back(run(x + "gate_proj.weight", j * 2 * Il * H, i0 * H, Il * H));
          w13.runs.push_back(run(x + "up_proj.weight", (j * 2 + 1) * Il * H, i0 * H, Il * H));
        }
        auto& w2 = add(p + "mlp.experts.w2_weight", {El, H, Il}, spec_.type);
        for (std::uint64_t j = 0; j < El; ++j)
          w2.runs.push_back(row_parallel(hf_expert(l, e0 + j) + "down_proj.weight", j * H * Il, H, Im, Il, i0));
      }
    }
  }

  /// Allocates the engine tensors and turns their run blocks into per-canonical segments.
  void place() {
    per_.resize(canonical_->size());
    storage_.resize(tensors_.size());
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      const shard_tensor& st = tensors_[k];
      storage_[k].assign(st.elements() * element_size(st.type), std::byte{0});
      const std::size_t es = element_size(st.type);
      for (const run_block& b : st.runs) {
        auto& c = per_[b.tensor];
        c.upcast = st.type != canonical_->tensors()[b.tensor].type;
        for_each_run(b, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
          c.segments.push_back({cb, cb + len, storage_[k].data() + lb * es});
        });
      }
    }
    for (auto& c : per_) {
      std::sort(c.segments.begin(), c.segments.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
      for (const auto& s : c.segments) {
        if (!c.held.empty() && c.held.back().end == s.begin) c.held.back().end = s.end;
        else c.held.push_back({s.begin, s.end});
      }
    }
  }

  /// Copies canonical values of elements r between `buf` and the engine's tensors.
  void transfer(std::string_view t, index_range r, std::byte* buf, std::size_t bytes, bool to_engine) {
    const std::size_t ci = index(t);
    const tensor_info& info = canonical_->tensors()[ci];
    const std::size_t es = element_size(info.type);
    const auto& c = per_[ci];
    std::uint64_t covered = 0;
    for (const auto& s : c.segments) covered += s.end > r.begin && s.begin < r.end ? std::min(s.end, r.end) - std::max(s.begin, r.begin) : 0;
    if (r.begin > r.end || bytes != r.size() * es || covered != r.size())
      throw error(errc::invalid_argument,
                  "elements [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") are not all held by rank " + std::to_string(rank_) +
                      " or the buffer size does not match",
                  {.file = {}, .tensor = info.name, .field = "range"});
    for (const auto& s : c.segments) {
      const std::uint64_t b = std::max(r.begin, s.begin), e = std::min(r.end, s.end);
      if (b >= e) continue;
      std::byte* user = buf + (b - r.begin) * es;
      if (!c.upcast) {
        std::byte* eng = s.data + (b - s.begin) * es;
        to_engine ? std::memcpy(eng, user, (e - b) * es) : std::memcpy(user, eng, (e - b) * es);
        continue;
      }
      // BF16 <-> F32: the BF16 bits are the high half of the F32 bits, the low half is zero.
      for (std::uint64_t i = 0; i < e - b; ++i) {
        std::byte* f32 = s.data + (b - s.begin + i) * 4;
        std::uint16_t h;
        std::uint32_t w;
        if (to_engine) {
          std::memcpy(&h, user + i * 2, 2);
          w = static_cast<std::uint32_t>(h) << 16;
          std::memcpy(f32, &w, 4);
        } else {
          std::memcpy(&w, f32, 4);
          h = static_cast<std::uint16_t>(w >> 16);
          std::memcpy(user + i * 2, &h, 2);
        }
      }
    }
  }

  std::shared_ptr<const model_manifest> canonical_;
  model_spec spec_;
  serving_parallel par_;
  std::uint32_t rank_ = 0;
  std::vector<shard_tensor> tensors_;
  std::vector<std::vector<std::byte>> storage_;
  std::vector<per_canonical> per_;
};

static_assert(Loader<vllm_rank_loader>);

}  // namespace bitrefit::layout
