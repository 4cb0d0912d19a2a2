// Projection laws over every coordinate, for every TP/PP/EP (and expert-TP) combination up to 4,
// on small dense, tied and MoE shapes. Shards are built by an independent reference that applies
// Megatron's sharding rules element by element ((row, col) arithmetic per local tensor name), not
// by the run blocks under test.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/delta_build.hpp"
#include "bitrefit/layout/megatron.hpp"
#include "bitrefit/layout/serving_report.hpp"

using namespace bitrefit;
using namespace bitrefit::layout;

namespace {

model_spec small_dense(bool tied) {
  return {.name = tied ? "tiny-llama-tied" : "tiny-llama", .hidden = 8, .heads = 24, .kv_heads = 12, .head_dim = 2,
          .layers = 4, .intermediate = 12, .vocab = 37, .tied_embeddings = tied};
}
model_spec small_gqa() {  // 4 query heads per group, groups divisible by 1, 2, 4
  return {.name = "tiny-gqa", .hidden = 6, .heads = 16, .kv_heads = 4, .head_dim = 3, .layers = 3,
          .intermediate = 8, .vocab = 29, .tied_embeddings = true};
}
model_spec small_moe() {
  return {.name = "tiny-qwen3-moe", .hidden = 8, .heads = 24, .kv_heads = 12, .head_dim = 2, .layers = 4,
          .experts = 12, .moe_intermediate = 12, .vocab = 37, .qk_norm = true};
}

using source = std::optional<std::pair<std::string_view, std::uint64_t>>;

bool starts(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

/// Where Megatron's sharding puts canonical data: for local tensor `name` on rank r, the canonical
/// (name, index) of each local element i by (row, col) arithmetic; nullopt for padding. The local
/// name is parsed once, here; operator() is the per-element arithmetic. (Parsing it per element,
/// with its string building, made this file's AddressSanitizer run take 137 s.) The returned names
/// view strings this object owns.
class reference_source {
 public:
  reference_source(const model_spec& m, const trainer_parallel& p, const trainer_rank& r, const megatron_projection& proj,
                   const std::string& name)
      : m_(m), p_(p), r_(r), etp_rank_(proj.etp_rank()) {
    parse(m, p, r, proj, name);
  }

  source operator()(std::uint64_t i) const;

 private:
  enum class rule { vocab, same_index, qkv, attention_out, fc1, fc2, expert_fc1, expert_fc2, none };

  void parse(const model_spec& m, const trainer_parallel& p, const trainer_rank& r, const megatron_projection& proj,
             const std::string& name) {
    if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") {
      const bool lm = name == "output_layer.weight" && !m.tied_embeddings;
      set(rule::vocab, {lm ? hf_lm_head : hf_embed});
      return;
    }
    if (name == "decoder.final_layernorm.weight") return set(rule::same_index, {hf_final_norm});
    EXPECT_TRUE(starts(name, "decoder.layers.")) << name;
    const std::size_t dot = name.find('.', 15);
    const std::uint64_t g = p.stage_layers(m.layers, r.pp).begin + std::stoull(name.substr(15, dot - 15));
    const std::string rest = name.substr(dot + 1), hp = hf_layer(g);
    if (rest == "input_layernorm.weight") return set(rule::same_index, {hp + rest});
    if (rest == "pre_mlp_layernorm.weight") return set(rule::same_index, {hp + "post_attention_layernorm.weight"});
    if (rest == "self_attention.q_layernorm.weight") return set(rule::same_index, {hp + "self_attn.q_norm.weight"});
    if (rest == "self_attention.k_layernorm.weight") return set(rule::same_index, {hp + "self_attn.k_norm.weight"});
    if (rest == "mlp.router.weight") return set(rule::same_index, {hp + "mlp.gate.weight"});
    if (rest == "self_attention.linear_qkv.weight")
      return set(rule::qkv, {hp + "self_attn.q_proj.weight", hp + "self_attn.k_proj.weight", hp + "self_attn.v_proj.weight"});
    if (rest == "self_attention.linear_proj.weight") return set(rule::attention_out, {hp + "self_attn.o_proj.weight"});
    if (rest == "mlp.linear_fc1.weight") return set(rule::fc1, {hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"});
    if (rest == "mlp.linear_fc2.weight") return set(rule::fc2, {hp + "mlp.down_proj.weight"});
    const bool fc1 = rest == "mlp.experts.linear_fc1.weight";
    if (!fc1 && rest != "mlp.experts.linear_fc2.weight") {
      ADD_FAILURE() << "unexpected local tensor " << name;
      return set(rule::none, {});
    }
    // local expert j is global expert ep_rank * El + j: names_[2j] gate (fc1) or down (fc2), names_[2j + 1] up
    const std::uint64_t El = m.experts / p.ep;
    std::vector<std::string> names;
    for (std::uint64_t j = 0; j < El; ++j) {
      const std::string x = hf_expert(g, proj.ep_rank() * El + j);
      names.push_back(x + (fc1 ? "gate_proj.weight" : "down_proj.weight"));
      names.push_back(x + "up_proj.weight");
    }
    set(fc1 ? rule::expert_fc1 : rule::expert_fc2, std::move(names));
  }

  void set(rule k, std::vector<std::string> names) {
    kind_ = k;
    names_ = std::move(names);
  }
  source at(std::size_t name, std::uint64_t index) const {
    if (name >= names_.size()) {  // an index past the local expert count: the reference's own bug
      ADD_FAILURE() << "reference name " << name << " of " << names_.size();
      return std::nullopt;
    }
    return std::pair{std::string_view(names_[name]), index};
  }

  model_spec m_;
  trainer_parallel p_;
  trainer_rank r_;
  std::uint64_t etp_rank_;
  rule kind_ = rule::none;
  std::vector<std::string> names_;
};

source reference_source::operator()(std::uint64_t i) const {
  const std::uint64_t H = m_.hidden, hd = m_.head_dim;
  switch (kind_) {
    case rule::vocab: {
      const std::uint64_t per = p_.padded_vocab(m_.vocab) / p_.tp, row = r_.tp * per + i / H;
      if (row >= m_.vocab) return std::nullopt;
      return at(0, row * H + i % H);
    }
    case rule::same_index: return at(0, i);
    case rule::qkv: {
      const std::uint64_t qpg = m_.heads / m_.kv_heads, row = i / H, col = i % H, per_group = (qpg + 2) * hd;
      const std::uint64_t G = r_.tp * (m_.kv_heads / p_.tp) + row / per_group, w = row % per_group;
      if (w < qpg * hd) return at(0, (G * qpg * hd + w) * H + col);
      if (w < (qpg + 1) * hd) return at(1, (G * hd + w - qpg * hd) * H + col);
      return at(2, (G * hd + w - (qpg + 1) * hd) * H + col);
    }
    case rule::attention_out: {
      const std::uint64_t q = m_.heads * hd, ql = q / p_.tp, row = i / ql, col = r_.tp * ql + i % ql;
      return at(0, row * q + col);
    }
    case rule::fc1: {
      const std::uint64_t Il = m_.intermediate / p_.tp, row = i / H, col = i % H;
      return at(row >= Il ? 1 : 0, (r_.tp * Il + row % Il) * H + col);
    }
    case rule::fc2: {
      const std::uint64_t Il = m_.intermediate / p_.tp, row = i / Il, col = r_.tp * Il + i % Il;
      return at(0, row * m_.intermediate + col);
    }
    case rule::expert_fc1: {
      const std::uint64_t Iml = m_.moe_intermediate / p_.etp;
      const std::uint64_t j = i / (2 * Iml * H), w = i % (2 * Iml * H), row = w / H, col = w % H;
      return at(2 * j + (row >= Iml ? 1 : 0), (etp_rank_ * Iml + row % Iml) * H + col);
    }
    case rule::expert_fc2: {
      const std::uint64_t Iml = m_.moe_intermediate / p_.etp;
      const std::uint64_t j = i / (H * Iml), w = i % (H * Iml), row = w / Iml, col = etp_rank_ * Iml + w % Iml;
      return at(2 * j, row * m_.moe_intermediate + col);
    }
    case rule::none: break;
  }
  return std::nullopt;
}

void fill_random(canonical_store& s, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  for (auto& t : s.canonical().tensors())
    for (auto& b : s.bytes(t.name)) b = std::byte(g() & 0xFF);
}

/// Checks every law for one model and one parallel configuration.
void check_config(const model_spec& m, const trainer_parallel& p) {
  SCOPED_TRACE(m.name + " tp=" + std::to_string(p.tp) + " pp=" + std::to_string(p.pp) + " dp=" + std::to_string(p.dp) +
               " ep=" + std::to_string(p.ep) + " etp=" + std::to_string(p.etp));
  auto manifest = std::make_shared<const model_manifest>(canonical_manifest(m));
  canonical_store reference(*manifest);
  fill_random(reference, p.tp * 1000 + p.pp * 100 + p.ep * 10 + p.etp);
  canonical_store rebuilt(*manifest);
  const auto& ts = manifest->tensors();
  std::vector<std::vector<std::uint8_t>> owners(ts.size());
  for (std::size_t k = 0; k < ts.size(); ++k) owners[k].assign(ts[k].elements(), 0);
  std::uint64_t padding = 0;

  for (const trainer_rank& r : all_ranks(p)) {
    megatron_projection proj(manifest, m, p, r);
    std::vector<std::vector<std::uint8_t>> seen(ts.size());  // law 2 within this shard
    for (std::size_t k = 0; k < ts.size(); ++k) seen[k].assign(ts[k].elements(), 0);
    for (const shard_tensor& st : proj.tensors()) {
      const std::uint64_t n = st.elements();
      const std::size_t es = element_size(st.type);
      // The shard's bytes, built by the reference rule; padding gets a recognisable pattern.
      std::vector<std::byte> local(n * es, std::byte{0xA5});
      const reference_source ref(m, p, r, proj, st.name);
      std::vector<source> src(n);
      std::string_view looked_up;  // the store is searched once per run of one name, not per element
      std::span<const std::byte> canonical;
      for (std::uint64_t i = 0; i < n; ++i) {
        src[i] = ref(i);
        if (!src[i]) continue;
        if (src[i]->first.data() != looked_up.data()) canonical = std::as_const(reference).bytes(looked_up = src[i]->first);
        std::memcpy(&local[i * es], canonical.data() + src[i]->second * es, es);
      }
      // Law 1 + 2 + 5: run bounds, disjointness, project == reference, inverse.
      std::vector<std::uint8_t> covered(n, 0);
      for (const run_block& b : st.runs) {
        ASSERT_LT(b.tensor, ts.size());
        ASSERT_EQ(ts[b.tensor].type, st.type);
        ASSERT_LE(b.local_end(), n) << st.name;
        ASSERT_LE(b.canonical_begin(b.count - 1) + b.length, ts[b.tensor].elements()) << st.name;
        for_each_run(b, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
          for (std::uint64_t o = 0; o < len; ++o) {
            ASSERT_EQ(covered[lb + o]++, 0) << st.name << " local " << lb + o << " reached twice";
            ASSERT_EQ(seen[b.tensor][cb + o]++, 0) << ts[b.tensor].name << " reached twice in one shard";
            if (b.owned) ++owners[b.tensor][cb + o];
          }
          // Copies (owned or not) carry the canonical bits; owned runs rebuild the model.
          ASSERT_EQ(0, std::memcmp(&local[lb * es], reference.bytes(ts[b.tensor].name).data() + cb * es, len * es)) << st.name;
          if (b.owned) std::memcpy(rebuilt.bytes(ts[b.tensor].name).data() + cb * es, &local[lb * es], len * es);
        });
      }
      // Range projection: random local ranges project, run by run, to what elements project to.
      std::mt19937_64 rg(n);
      for (int trial = 0; trial < 4 && n > 0; ++trial) {
        std::uint64_t a = rg() % n, b = rg() % (n + 1);
        if (a > b) std::swap(a, b);
        std::uint64_t next = a, reached = 0;
        for (const projected_run& pr : st.project_range({a, b})) {
          ASSERT_GE(pr.local, next);
          for (std::uint64_t o = 0; o < pr.length; ++o) {
            const auto pj = st.project(pr.local + o);
            ASSERT_TRUE(pj && pj->first == pr.tensor && pj->second == pr.canonical + o);
          }
          next = pr.local + pr.length;
          reached += pr.length;
        }
        std::uint64_t expect = 0;
        for (std::uint64_t i = a; i < b; ++i) expect += st.project(i).has_value();
        ASSERT_EQ(reached, expect) << st.name;
      }
      for (std::uint64_t i = 0; i < n; ++i) {
        const auto pj = st.project(i);
        ASSERT_EQ(pj.has_value(), src[i].has_value()) << st.name << " local " << i;
        if (!pj) {
          ++padding;
          continue;
        }
        ASSERT_EQ(ts[pj->first].name, src[i]->first) << st.name << " local " << i;
        ASSERT_EQ(pj->second, src[i]->second) << st.name << " local " << i;
        ASSERT_EQ(st.locate(pj->first, pj->second), std::optional<std::uint64_t>(i));
      }
    }
  }
  // Law 3: exactly one owner per canonical element.
  for (std::size_t k = 0; k < ts.size(); ++k)
    for (std::uint64_t j = 0; j < ts[k].elements(); ++j) ASSERT_EQ(owners[k][j], 1) << ts[k].name << " element " << j;
  // Law 4: reconstruction is bit-exact.
  EXPECT_TRUE(bit_equal(reference, rebuilt));
  const std::uint64_t pad_rows = p.padded_vocab(m.vocab) - m.vocab;
  const std::uint64_t vocab_tensors = 1 + (!m.tied_embeddings || p.pp > 1 ? 1 : 0);
  EXPECT_EQ(padding, pad_rows * m.hidden * p.dp * vocab_tensors);
}

}  // namespace

TEST(MegatronProjection, DenseEveryTpPpDpUpTo4) {
  for (bool tied : {false, true})
    for (std::uint32_t tp = 1; tp <= 4; ++tp)
      for (std::uint32_t pp = 1; pp <= 4; ++pp)
        for (std::uint32_t dp : {1u, 2u}) check_config(small_dense(tied), {.tp = tp, .pp = pp, .dp = dp, .vocab_multiple = 4});
}

TEST(MegatronProjection, GroupedQueryInterleave) {
  for (std::uint32_t tp : {1u, 2u, 4u})
    for (std::uint32_t pp = 1; pp <= 3; ++pp) check_config(small_gqa(), {.tp = tp, .pp = pp, .dp = 1, .vocab_multiple = 3});
}

TEST(MegatronProjection, MoeEveryTpPpEpUpTo4) {
  for (std::uint32_t tp = 1; tp <= 4; ++tp)
    for (std::uint32_t pp = 1; pp <= 4; ++pp)
      for (std::uint32_t ep = 1; ep <= 4; ++ep)
        for (std::uint32_t etp : {1u, 2u}) {
          std::uint32_t dp = 1;
          while ((tp * dp) % (ep * etp)) ++dp;  // smallest data-parallel size that folds ep x etp
          check_config(small_moe(), {.tp = tp, .pp = pp, .dp = dp, .ep = ep, .etp = etp, .vocab_multiple = 4});
        }
}

TEST(MegatronProjection, RejectsConfigsThatDoNotFit) {
  EXPECT_THROW(megatron_projection(small_moe(), {.tp = 1, .dp = 1, .ep = 5}, {}), error);  // 12 experts % 5
  EXPECT_THROW(megatron_projection(small_moe(), {.tp = 1, .dp = 1, .ep = 2}, {}), error);  // ep does not fold
  EXPECT_THROW(megatron_projection(small_gqa(), {.tp = 3}, {}), error);                    // 4 groups % 3
  EXPECT_THROW(megatron_projection(small_dense(false), {.tp = 2}, {.tp = 2}), error);      // rank outside
  try {
    megatron_projection(small_dense(false), {.pp = 5}, {});
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.where().field, "pp");
  }
}

TEST(StableOwner, IsStableAndSpreads) {
  // Pinned values: the owner must never change between builds (ownership is fixed across attempts).
  EXPECT_EQ(stable_hash("model.norm.weight"), 0xcd02223323398dd1ull);
  EXPECT_EQ(stable_owner("model.embed_tokens.weight", 8), 5u);
  std::vector<int> hits(4, 0);
  for (int l = 0; l < 64; ++l) ++hits[stable_owner(hf_layer(l) + "input_layernorm.weight", 4)];
  for (int h : hits) EXPECT_GT(h, 4);
}

// Delta build: the direct projection of every shard (what the sender's owners run per owned
// tensor) gives, tensor by tensor, exactly the diff of the canonical checkpoints, reuses a stale
// workspace correctly, gathers the canonical tensor bit for bit, and turns the old checkpoint into
// the new one.
TEST(DeltaBuild, DirectEqualsCanonicalDiff) {
  for (auto [m, p] : {std::pair{small_moe(), trainer_parallel{.tp = 2, .pp = 2, .dp = 1, .ep = 2, .vocab_multiple = 4}},
                      std::pair{small_dense(true), trainer_parallel{.tp = 3, .pp = 2, .dp = 2, .vocab_multiple = 4}}}) {
    SCOPED_TRACE(m.name);
    auto manifest = std::make_shared<const model_manifest>(canonical_manifest(m));
    canonical_store old_c(*manifest), new_c(*manifest);
    fill_random(old_c, 11);
    std::mt19937_64 g(12);
    for (auto& t : manifest->tensors()) {
      std::memcpy(new_c.bytes(t.name).data(), old_c.bytes(t.name).data(), t.bytes());
      for (std::uint64_t i = 0; i < t.elements(); ++i)
        if (g() % 25 == 0) new_c.bytes(t.name)[i * 2 + g() % 2] ^= std::byte(1 + g() % 255);
    }
    for (value_mode mode : {value_mode::xor_mask, value_mode::overwrite}) {
      std::vector<megatron_projection> projs;
      std::vector<std::vector<std::vector<std::byte>>> data;
      for (const trainer_rank& r : all_ranks(p)) {
        projs.emplace_back(manifest, m, p, r);
        auto& d = data.emplace_back();
        for (const shard_tensor& st : projs.back().tensors()) {
          auto& buf = d.emplace_back(st.elements() * 2, std::byte{0x5A});
          const reference_source ref(m, p, r, projs.back(), st.name);
          for (std::uint64_t i = 0; i < st.elements(); ++i)
            if (auto s = ref(i))
              std::memcpy(&buf[i * 2], new_c.bytes(s->first).data() + s->second * 2, 2);
        }
      }
      const auto local = [&](std::size_t shard, std::size_t k) { return std::span<const std::byte>(data.at(shard).at(k)); };
      const direct_delta direct{std::span<const megatron_projection>(projs)};
      std::vector<change_item> merged, expect;
      change_item ws;  // one workspace reused across tensors: stale content must be fully replaced
      ws.positions = {1, 2, 3};
      for (std::size_t t = 0; t < manifest->size(); ++t) {
        const tensor_info& ti = manifest->tensors()[t];
        direct.changes_into(t, local, old_c.bytes(ti.name), mode, ws);
        if (!ws.positions.empty()) merged.push_back({ti.name, mode, ws.positions, ws.values});
        change_item it{ti.name, mode, {}, {}};
        collect_changed(old_c.bytes(ti.name).data(), new_c.bytes(ti.name).data(), ti.elements(), 2, 0, mode == value_mode::xor_mask, it);
        if (!it.positions.empty()) expect.push_back(std::move(it));
        std::vector<std::byte> gathered(ti.bytes(), std::byte{0xEE});
        direct.gather(t, local, gathered);
        EXPECT_EQ(0, std::memcmp(gathered.data(), new_c.bytes(ti.name).data(), ti.bytes())) << ti.name;
      }
      EXPECT_EQ(merged, expect);
      // a shard tensor of the wrong size is refused by name
      auto bad = [&](std::size_t shard, std::size_t k) {
        auto s = local(shard, k);
        return shard == direct.sources(0).front().shard && k == direct.sources(0).front().tensor ? s.first(s.size() - 2) : s;
      };
      try {
        direct.changes_into(0, bad, old_c.bytes(manifest->tensors()[0].name), mode, ws);
        ADD_FAILURE() << "a short shard tensor was accepted";
      } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::mismatch);
        EXPECT_EQ(e.where().tensor, direct.sources(0).front().local_name);
      }
      canonical_store receiver(*manifest);
      for (auto& t : manifest->tensors()) std::memcpy(receiver.bytes(t.name).data(), old_c.bytes(t.name).data(), t.bytes());
      for (auto& it : merged) (void)apply_positions(receiver, it.tensor, it.mode, it.positions, it.values);
      EXPECT_TRUE(bit_equal(receiver, new_c));
    }
  }
}

// Serving bytes: direct projection vs FP8 conversion, and which converted blocks straddle shards.
TEST(ServingReport, BF16ServingIsAllDirect) {
  const model_spec m = model_spec::llama3_2_1b();
  const auto r = serving_report(m, {.tp = 2, .pp = 2}, false);
  EXPECT_EQ(r.direct_bytes, canonical_manifest(m).total_bytes());
  EXPECT_EQ(r.converted_bytes, 0u);
  EXPECT_EQ(r.direct_fraction(), 1.0);
}

TEST(ServingReport, Qwen3MoeFp8ExpertWidthSplitFourWaysStraddlesBlocks) {
  model_spec m = model_spec::qwen3_30b_a3b();
  m.layers = 2;  // per-layer fractions are those of the full model
  const model_manifest man = canonical_manifest(m);
  std::uint64_t direct = 0, converted = 0, expert_converted = 0;
  for (const auto& t : man.tensors()) {
    if (!fp8_serves(t)) {
      direct += t.bytes();
      continue;
    }
    const std::uint64_t blocks = ((t.shape[0] + 127) / 128) * ((t.shape[1] + 127) / 128);
    converted += t.elements() + 4 * blocks;
    if (t.name.find(".experts.") != std::string::npos) expert_converted += t.elements() + 4 * blocks;
  }
  // TP=2, EP=2 (whole experts per rank, 128-aligned head splits): every block converts locally.
  const auto a = serving_report(m, {.tp = 2, .pp = 2, .dp = 1, .ep = 2}, true);
  EXPECT_EQ(a.direct_bytes, direct);
  EXPECT_EQ(a.converted_bytes, converted);
  EXPECT_EQ(a.converted_gathered_bytes, 0u);
  EXPECT_NEAR(a.direct_fraction() + a.conversion_fraction(), 1.0, 1e-12);
  // Expert TP=4: 768 rows / 4 = 192, so 2 of the 6 block rows (gate/up) or block columns (down)
  // straddle two shards: exactly a third of the experts' converted bytes need a gather.
  const auto b = serving_report(m, {.tp = 4, .pp = 1, .dp = 1, .ep = 1, .etp = 4}, true);
  EXPECT_EQ(b.converted_bytes, converted);
  EXPECT_EQ(b.converted_gathered_bytes * 3, expert_converted);
}
