// Loader laws and the receiver operations of layout/apply.hpp, on the canonical store.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "bitrefit/layout/apply.hpp"
#include "bitrefit/layout/borrowed_store.hpp"
#include "bitrefit/layout/canonical_store.hpp"

using namespace bitrefit;
using namespace bitrefit::layout;

namespace {

model_manifest small_manifest() {
  return model_manifest({{"b.weight", dtype::BF16, {6, 5}},
                         {"a.scale", dtype::F32, {3}},
                         {"c.fp8", dtype::F8_E4M3, {4, 4}},
                         {"d.ids", dtype::I64, {7}}});
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(g() & 0xFF);
  return v;
}

}  // namespace

TEST(CanonicalStore, HoldsWholeTensorsAndIsBitPreserving) {
  canonical_store s(small_manifest());
  auto rs = held_ranges(s);
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[0], (canonical_range{"a.scale", 0, 3}));
  EXPECT_EQ(rs[1], (canonical_range{"b.weight", 0, 30}));
  EXPECT_EQ(held_bytes(s), 3 * 4 + 30 * 2 + 16 + 7 * 8u);
  for (auto& t : s.canonical().tensors()) EXPECT_TRUE(s.bit_preserving(t.name));
  EXPECT_THROW((void)s.held("nope"), error);
}

// The borrowed store writes into the caller's buffers (no copy of the model) and is a Loader with
// the same laws as the canonical store: law 1 at every coordinate, law 2 (segments are the caller's
// memory), whole tensors held.
TEST(BorrowedStore, WritesInPlaceIntoTheCallersMemory) {
  const model_manifest m = small_manifest();
  std::vector<std::vector<std::byte>> memory;
  std::vector<mutable_tensor_view> views;
  for (auto& t : m.tensors()) memory.emplace_back(t.bytes(), std::byte{0});
  for (std::size_t i = 0; i < m.size(); ++i)  // handed over in reverse order: the store sorts by name
    views.emplace_back(m.tensors()[m.size() - 1 - i].name, m.tensors()[m.size() - 1 - i].type,
                       m.tensors()[m.size() - 1 - i].shape, std::span<std::byte>(memory[m.size() - 1 - i]));
  borrowed_store s(views);
  EXPECT_EQ(s.canonical(), m);
  for (std::size_t k = 0; k < m.size(); ++k) {
    const tensor_info& t = m.tensors()[k];
    ASSERT_EQ(s.segments(t.name).size(), 1u);
    EXPECT_EQ(s.segments(t.name)[0].data, memory[k].data());
    const std::size_t es = element_size(t.type);
    for (std::uint64_t i = 0; i < t.elements(); ++i) {
      auto v = random_bytes(es, i * 17 + k);
      write_canonical(s, t.name, {i, i + 1}, v);
      ASSERT_EQ(0, std::memcmp(memory[k].data() + i * es, v.data(), es)) << t.name << " " << i;
      std::vector<std::byte> back(es);
      read_canonical(s, t.name, {i, i + 1}, back);
      ASSERT_EQ(back, v);
    }
  }
  EXPECT_EQ(held_bytes(s), m.total_bytes());
  EXPECT_THROW((void)s.held("nope"), error);
}

TEST(BorrowedStore, RefusesTensorsThatShareMemory) {
  std::vector<std::byte> memory(64);
  std::vector<mutable_tensor_view> tied = {
      mutable_tensor_view("lm_head.weight", dtype::BF16, {16}, std::span<std::byte>(memory).subspan(0, 32)),
      mutable_tensor_view("embed.weight", dtype::BF16, {16}, std::span<std::byte>(memory).subspan(30, 32))};
  try {
    borrowed_store s(tied);
    FAIL() << "overlapping tensors accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(e.message().find("share memory"), std::string::npos);
  }
  tied[1] = mutable_tensor_view("embed.weight", dtype::BF16, {16}, std::span<std::byte>(memory).subspan(32, 32));
  EXPECT_NO_THROW(borrowed_store{tied});  // adjacent is fine
}

// Law 1: read after write gives the written bits, every element, every dtype in the manifest.
TEST(CanonicalStore, WriteReadRoundTripEveryCoordinate) {
  canonical_store s(small_manifest());
  for (auto& t : s.canonical().tensors()) {
    const std::size_t es = element_size(t.type);
    for (std::uint64_t i = 0; i < t.elements(); ++i) {
      auto v = random_bytes(es, i * 31 + t.name.size());
      write_canonical(s, t.name, {i, i + 1}, v);
      std::vector<std::byte> back(es);
      read_canonical(s, t.name, {i, i + 1}, back);
      ASSERT_EQ(back, v) << t.name << " " << i;
      ASSERT_EQ(0, std::memcmp(s.bytes(t.name).data() + i * es, v.data(), es));
    }
  }
}

RC_GTEST_PROP(Apply, XorThenXorRestoresAndOverwriteIsIdempotent, ()) {
  canonical_store s(small_manifest());
  const auto& t = s.canonical().at("b.weight");
  const auto init = random_bytes(t.bytes(), *rc::gen::arbitrary<std::uint32_t>());
  std::memcpy(s.bytes(t.name).data(), init.data(), init.size());
  // a random ascending subset of positions
  std::vector<std::uint64_t> pos;
  const auto mask = *rc::gen::container<std::vector<bool>>(t.elements(), rc::gen::arbitrary<bool>());
  for (std::uint64_t i = 0; i < t.elements(); ++i)
    if (mask[i]) pos.push_back(i);
  const auto vals = random_bytes(pos.size() * 2, *rc::gen::arbitrary<std::uint32_t>());

  auto st = apply_positions(s, t.name, value_mode::xor_mask, pos, vals);
  RC_ASSERT(st.applied == pos.size());
  RC_ASSERT(st.not_held == 0u);
  for (std::size_t k = 0; k < pos.size(); ++k)
    for (int b = 0; b < 2; ++b)
      RC_ASSERT(s.bytes(t.name)[pos[k] * 2 + b] == (init[pos[k] * 2 + b] ^ vals[k * 2 + b]));
  apply_positions(s, t.name, value_mode::xor_mask, pos, vals);
  RC_ASSERT(std::equal(init.begin(), init.end(), s.bytes(t.name).begin()));

  apply_positions(s, t.name, value_mode::overwrite, pos, vals);
  std::vector<std::byte> once(s.bytes(t.name).begin(), s.bytes(t.name).end());
  apply_positions(s, t.name, value_mode::overwrite, pos, vals);
  RC_ASSERT(std::equal(once.begin(), once.end(), s.bytes(t.name).begin()));
  for (std::size_t k = 0; k < pos.size(); ++k)
    RC_ASSERT(0 == std::memcmp(&once[pos[k] * 2], &vals[k * 2], 2));
}

TEST(Apply, RunsEqualPositions) {
  canonical_store a(small_manifest()), b(small_manifest());
  std::vector<index_range> runs{{0, 3}, {5, 6}, {10, 16}};
  std::vector<std::uint64_t> pos;
  for (auto r : runs)
    for (auto i = r.begin; i < r.end; ++i) pos.push_back(i);
  auto vals = random_bytes(pos.size() * 8, 7);
  EXPECT_EQ(apply_runs(a, "d.ids", value_mode::overwrite, std::span<const index_range>(runs.data(), 2), std::span(vals).first(4 * 8)).applied, 4u);
  (void)apply_runs(b, "d.ids", value_mode::overwrite, std::span<const index_range>(runs.data(), 2), std::span(vals).first(4 * 8));
  EXPECT_TRUE(bit_equal(a, b));
  canonical_store c(small_manifest()), d(small_manifest());
  std::vector<std::byte> v16(pos.size() * 2);
  std::memcpy(v16.data(), vals.data(), v16.size());
  (void)apply_runs(c, "b.weight", value_mode::xor_mask, runs, v16);
  (void)apply_positions(d, "b.weight", value_mode::xor_mask, pos, v16);
  EXPECT_TRUE(bit_equal(c, d));
}

TEST(Apply, RejectsBadItemsWithoutWriting) {
  canonical_store s(small_manifest());
  auto init = random_bytes(60, 3);
  std::memcpy(s.bytes("b.weight").data(), init.data(), 60);
  std::vector<std::byte> two(4, std::byte{0xFF});
  auto expect_untouched = [&] { EXPECT_TRUE(std::equal(init.begin(), init.end(), s.bytes("b.weight").begin())); };
  std::vector<std::uint64_t> unsorted{3, 1};
  EXPECT_THROW(apply_positions(s, "b.weight", value_mode::overwrite, unsorted, two), error);
  expect_untouched();
  std::vector<std::uint64_t> out_of_range{1, 30};
  try {
    apply_positions(s, "b.weight", value_mode::overwrite, out_of_range, two);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_EQ(e.where().tensor, "b.weight");
  }
  expect_untouched();
  std::vector<std::uint64_t> ok{1, 2};
  EXPECT_THROW(apply_positions(s, "b.weight", value_mode::overwrite, ok, std::span(two).first(3)), error);
  EXPECT_THROW(apply_positions(s, "zz", value_mode::overwrite, ok, two), error);
  std::vector<index_range> overlapping{{0, 2}, {1, 3}};
  EXPECT_THROW(apply_runs(s, "b.weight", value_mode::overwrite, overlapping, random_bytes(8, 1)), error);
  expect_untouched();
  std::vector<std::byte> out(4);
  EXPECT_THROW(read_canonical(s, "b.weight", {29, 31}, out), error);
}

// ------------------------------------------------------------------------------------------------
// vLLM-like serving ranks: placement checked against an independent reference built element by
// element from vLLM's layout rules, and canonical -> serving -> canonical is the identity.
#include "bitrefit/layout/vllm_layout.hpp"

namespace {

model_spec mqa_dense(bool tied) {  // one kv head: replicated on every rank for tp > 1
  return {.name = "tiny-mqa", .hidden = 8, .heads = 12, .kv_heads = 1, .head_dim = 2, .layers = 2, .intermediate = 12,
          .vocab = 37, .tied_embeddings = tied};
}
model_spec gqa_dense() {
  return {.name = "tiny-gqa", .hidden = 6, .heads = 8, .kv_heads = 4, .head_dim = 3, .layers = 2, .intermediate = 8, .vocab = 29};
}
model_spec tiny_moe() {
  return {.name = "tiny-moe", .hidden = 8, .heads = 8, .kv_heads = 4, .head_dim = 2, .layers = 2, .experts = 4,
          .moe_intermediate = 12, .vocab = 37, .qk_norm = true};
}

using source = std::optional<std::pair<std::string, std::uint64_t>>;

source vllm_source(const model_spec& m, const serving_parallel& p, std::uint32_t r, const std::string& name, std::uint64_t i) {
  const std::uint64_t H = m.hidden, hd = m.head_dim, tp = p.tp;
  if (name == hf_embed || name == hf_lm_head) {
    const std::uint64_t per = p.padded_vocab(m.vocab) / tp, row = r * per + i / H;
    if (row >= m.vocab) return std::nullopt;
    return std::pair{name, row * H + i % H};
  }
  auto ends = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  if (name.rfind("model.layers.", 0) != 0) return std::pair{name, i};  // final norm
  const std::string layer = name.substr(0, name.find('.', 13) + 1);  // "model.layers.L."
  if (ends("self_attn.qkv_proj.weight")) {
    const std::uint64_t nql = m.heads / tp, row = i / H, col = i % H;
    const std::uint64_t kv_head_of_rank = m.kv_heads >= tp ? r * (m.kv_heads / tp) : r / (tp / m.kv_heads);
    const std::uint64_t kvl = m.kv_heads >= tp ? m.kv_heads / tp : 1;
    if (row < nql * hd) return std::pair{layer + "self_attn.q_proj.weight", (r * nql * hd + row) * H + col};
    if (row < (nql + kvl) * hd) return std::pair{layer + "self_attn.k_proj.weight", (kv_head_of_rank * hd + row - nql * hd) * H + col};
    return std::pair{layer + "self_attn.v_proj.weight", (kv_head_of_rank * hd + row - (nql + kvl) * hd) * H + col};
  }
  if (ends("self_attn.o_proj.weight")) {
    const std::uint64_t q = m.heads * hd, ql = q / tp;
    return std::pair{name, (i / ql) * q + r * ql + i % ql};
  }
  if (ends("mlp.gate_up_proj.weight")) {
    const std::uint64_t Il = m.intermediate / tp, row = i / H;
    return std::pair{layer + (row < Il ? "mlp.gate_proj.weight" : "mlp.up_proj.weight"), (r * Il + row % Il) * H + i % H};
  }
  if (ends("mlp.down_proj.weight")) {
    const std::uint64_t Il = m.intermediate / tp;
    return std::pair{name, (i / Il) * m.intermediate + r * Il + i % Il};
  }
  const bool ep = p.expert_parallel;
  const std::uint64_t El = ep ? m.experts / tp : m.experts, Il = ep ? m.moe_intermediate : m.moe_intermediate / tp;
  const std::uint64_t e0 = ep ? r * El : 0, i0 = ep ? 0 : r * Il;
  const std::uint64_t l = std::stoull(layer.substr(13));
  if (ends("mlp.experts.w13_weight")) {
    const std::uint64_t j = i / (2 * Il * H), w = i % (2 * Il * H), row = w / H;
    return std::pair{hf_expert(l, e0 + j) + (row < Il ? "gate_proj.weight" : "up_proj.weight"), (i0 + row % Il) * H + w % H};
  }
  if (ends("mlp.experts.w2_weight")) {
    const std::uint64_t j = i / (H * Il), w = i % (H * Il);
    return std::pair{hf_expert(l, e0 + j) + "down_proj.weight", (w / Il) * m.moe_intermediate + i0 + w % Il};
  }
  return std::pair{name, i};  // norms, router: replicated identity
}

void fill(canonical_store& s, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  for (auto& t : s.canonical().tensors())
    for (auto& b : s.bytes(t.name)) b = std::byte(g() & 0xFF);
}

void check_serving(const model_spec& m, const serving_parallel& p) {
  SCOPED_TRACE(m.name + " tp=" + std::to_string(p.tp) + (p.expert_parallel ? " ep" : "") + (p.norms_as_f32 ? " f32norms" : ""));
  auto manifest = std::make_shared<const model_manifest>(canonical_manifest(m));
  canonical_store ref(*manifest);
  fill(ref, p.tp * 7 + p.expert_parallel);
  std::vector<std::vector<std::uint32_t>> holders(manifest->size());
  for (std::size_t k = 0; k < manifest->size(); ++k) holders[k].assign(manifest->tensors()[k].elements(), 0);
  for (std::uint32_t r = 0; r < p.tp; ++r) {
    vllm_rank_loader eng(manifest, m, p, r);
    // Dense load through the Loader: every held range, canonical values in.
    for (const auto& cr : held_ranges(eng)) {
      const std::size_t es = element_size(manifest->at(cr.tensor).type);
      write_canonical(eng, cr.tensor, {cr.begin, cr.end}, ref.bytes(cr.tensor).subspan(cr.begin * es, cr.size() * es));
      for (auto j = cr.begin; j < cr.end; ++j) ++holders[*manifest->index_of(cr.tensor)][j];
    }
    // The engine tensors equal the reference placement, element by element (padding stays zero).
    for (std::size_t k = 0; k < eng.tensors().size(); ++k) {
      const shard_tensor& st = eng.tensors()[k];
      const std::size_t es = element_size(st.type);
      for (std::uint64_t i = 0; i < st.elements(); ++i) {
        const source s = vllm_source(m, p, r, st.name, i);
        const std::byte* got = eng.bytes(k).data() + i * es;
        std::vector<std::byte> want(es, std::byte{0});
        if (s) {
          const std::size_t ces = element_size(manifest->at(s->first).type);
          if (es == ces) std::memcpy(want.data(), ref.bytes(s->first).data() + s->second * ces, ces);
          else std::memcpy(want.data() + 2, ref.bytes(s->first).data() + s->second * 2, 2);  // F32 upcast, little-endian
        }
        ASSERT_EQ(0, std::memcmp(got, want.data(), es)) << st.name << " element " << i << " rank " << r;
        ASSERT_EQ(st.project(i).has_value(), s.has_value());
      }
    }
    // Canonical -> serving -> canonical is the identity on every held coordinate.
    for (const auto& cr : held_ranges(eng)) {
      const std::size_t es = element_size(manifest->at(cr.tensor).type);
      std::vector<std::byte> back(cr.size() * es);
      read_canonical(eng, cr.tensor, {cr.begin, cr.end}, back);
      ASSERT_EQ(0, std::memcmp(back.data(), ref.bytes(cr.tensor).data() + cr.begin * es, back.size())) << cr.tensor;
    }
  }
  // Together the ranks hold every canonical element; replicated tensors are on every rank.
  for (std::size_t k = 0; k < manifest->size(); ++k) {
    const std::string& n = manifest->tensors()[k].name;
    const bool replicated = n.find("norm") != std::string::npos || n.ends_with("mlp.gate.weight");
    for (std::uint32_t c : holders[k]) {
      ASSERT_GE(c, 1u) << n;
      if (replicated) {
        ASSERT_EQ(c, p.tp) << n;
      }
    }
  }
}

}  // namespace

TEST(VllmLoader, PlacementEqualsReferenceAndRoundTrips) {
  for (bool tied : {false, true})
    for (std::uint32_t tp = 1; tp <= 4; ++tp) check_serving(mqa_dense(tied), {.tp = tp, .vocab_multiple = 4});
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    check_serving(gqa_dense(), {.tp = tp, .vocab_multiple = 4});
    check_serving(gqa_dense(), {.tp = tp, .vocab_multiple = 4, .norms_as_f32 = true});
    for (bool ep : {false, true}) check_serving(tiny_moe(), {.tp = tp, .expert_parallel = ep, .vocab_multiple = 4});
  }
  model_spec moe3 = tiny_moe();  // tp = 3 needs heads, kv heads and experts divisible by 3
  moe3.heads = 6, moe3.kv_heads = 3, moe3.experts = 6;
  for (bool ep : {false, true}) check_serving(moe3, {.tp = 3, .expert_parallel = ep, .vocab_multiple = 4});
}

// A whole-model XOR item applied on every rank gives each rank exactly the canonical result on what
// it holds, and counts what it skipped.
TEST(VllmLoader, XorItemsLandInPlaceOnEveryRank) {
  const model_spec m = tiny_moe();
  const serving_parallel p{.tp = 2, .expert_parallel = true, .vocab_multiple = 4};
  auto manifest = std::make_shared<const model_manifest>(canonical_manifest(m));
  canonical_store ref(*manifest);
  fill(ref, 99);
  std::mt19937_64 g(5);
  for (std::uint32_t r = 0; r < p.tp; ++r) {
    vllm_rank_loader eng(manifest, m, p, r);
    for (const auto& cr : held_ranges(eng)) {
      const std::size_t es = element_size(manifest->at(cr.tensor).type);
      write_canonical(eng, cr.tensor, {cr.begin, cr.end}, ref.bytes(cr.tensor).subspan(cr.begin * es, cr.size() * es));
    }
    canonical_store expect(*manifest);
    for (auto& t : manifest->tensors()) std::memcpy(expect.bytes(t.name).data(), ref.bytes(t.name).data(), t.bytes());
    for (auto& t : manifest->tensors()) {
      std::vector<std::uint64_t> pos;
      for (std::uint64_t i = 0; i < t.elements(); ++i)
        if (g() % 8 == 0) pos.push_back(i);
      auto vals = random_bytes(pos.size() * 2, g());
      const auto st = apply_positions(eng, t.name, value_mode::xor_mask, pos, vals);
      (void)apply_positions(expect, t.name, value_mode::xor_mask, pos, vals);
      std::uint64_t in_held = 0;
      for (auto q : pos)
        for (auto h : eng.held(t.name)) in_held += h.contains(q);
      ASSERT_EQ(st.applied, in_held) << t.name;
      ASSERT_EQ(st.applied + st.not_held, pos.size());
    }
    for (const auto& cr : held_ranges(eng)) {
      std::vector<std::byte> back(cr.size() * 2);
      read_canonical(eng, cr.tensor, {cr.begin, cr.end}, back);
      ASSERT_EQ(0, std::memcmp(back.data(), expect.bytes(cr.tensor).data() + cr.begin * 2, back.size())) << cr.tensor;
    }
  }
}

TEST(VllmLoader, UpcastNormsAreNotBitPreservingAndRefuseXor) {
  const model_spec m = gqa_dense();
  vllm_rank_loader eng(m, {.tp = 2, .vocab_multiple = 4, .norms_as_f32 = true}, 1);
  EXPECT_FALSE(eng.bit_preserving(hf_final_norm));
  EXPECT_TRUE(eng.segments(hf_final_norm).empty());
  EXPECT_TRUE(eng.bit_preserving("model.layers.0.self_attn.q_proj.weight"));
  std::vector<std::uint64_t> pos{0, 1, 5};
  std::vector<std::byte> vals{std::byte{1}, std::byte{0x80}, std::byte{0}, std::byte{0x80}, std::byte{0xC0}, std::byte{0x7F}};
  try {
    apply_positions(eng, hf_final_norm, value_mode::xor_mask, pos, vals);
    FAIL() << "XOR accepted on a non-bit-preserving placement";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_EQ(e.where().tensor, hf_final_norm);
  }
  EXPECT_EQ(apply_positions(eng, hf_final_norm, value_mode::overwrite, pos, vals).applied, 3u);
  std::vector<std::byte> back(6 * 2);
  read_canonical(eng, hf_final_norm, {0, 6}, back);
  EXPECT_EQ(0, std::memcmp(&back[0], &vals[0], 4));  // -0.0 (0x8000) and a NaN payload (0x7FC0) survive
  EXPECT_EQ(0, std::memcmp(&back[10], &vals[4], 2));
}

TEST(VllmLoader, RejectsConfigsThatDoNotFit) {
  EXPECT_THROW(vllm_rank_loader(gqa_dense(), {.tp = 3}, 0), error);
  EXPECT_THROW(vllm_rank_loader(tiny_moe(), {.tp = 3, .expert_parallel = true}, 0), error);
  EXPECT_THROW(vllm_rank_loader(gqa_dense(), {.tp = 2}, 2), error);
}
