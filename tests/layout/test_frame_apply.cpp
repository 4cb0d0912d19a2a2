// Codec payload frames applied through Loaders (layout/frame_apply.hpp): a TP-sharded serving rank
// ends with exactly the canonical bits a dense copy gives it; bad frames write nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "bitrefit/codec/codec.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/frame_apply.hpp"
#include "bitrefit/layout/vllm_layout.hpp"

using namespace bitrefit;
using namespace bitrefit::layout;

namespace {

model_spec tiny() {
  return {.name = "tiny-gqa", .hidden = 6, .heads = 8, .kv_heads = 4, .head_dim = 3, .layers = 2, .intermediate = 8, .vocab = 29,
          .qk_norm = true};
}

struct versions {
  std::shared_ptr<const model_manifest> manifest;
  canonical_store old_c, new_c;
};

versions make_versions(const model_spec& m, std::uint64_t seed) {
  auto man = std::make_shared<const model_manifest>(canonical_manifest(m));
  versions v{man, canonical_store(*man), canonical_store(*man)};
  std::mt19937_64 g(seed);
  for (auto& t : man->tensors()) {
    for (auto& b : v.old_c.bytes(t.name)) b = std::byte(g() & 0xFF);
    std::memcpy(v.new_c.bytes(t.name).data(), v.old_c.bytes(t.name).data(), t.bytes());
    for (std::uint64_t i = 0; i < t.elements(); ++i)
      if (g() % 10 == 0) v.new_c.bytes(t.name)[i * 2] ^= std::byte(1 + g() % 255);
  }
  return v;
}

std::vector<std::byte> encode(const versions& v, codec::mode_policy p) {
  std::vector<codec::chunk_piece> pieces;
  for (auto& t : v.manifest->tensors())
    pieces.push_back({t.name, t.type, t.elements(), 0, t.elements(), v.old_c.bytes(t.name), v.new_c.bytes(t.name)});
  codec::chunk_encoder<> enc(codec::encode_options{.policy = p});
  codec::byte_buffer out;
  enc.encode(codec::frame_header{codec::frame_kind::delta, payload_id{{1, 1}, 0, 0}, 1, 2}, pieces, out);
  return {out.data(), out.data() + out.size()};
}

template <class L>
void load(L& l, const canonical_store& src) {
  for (const auto& r : held_ranges(l)) {
    const std::size_t es = element_size(src.canonical().at(r.tensor).type);
    write_canonical(l, r.tensor, {r.begin, r.end}, src.bytes(r.tensor).subspan(r.begin * es, r.size() * es));
  }
}

template <class L>
bool holds_exactly(const L& l, const canonical_store& want) {
  for (const auto& r : held_ranges(l)) {
    const std::size_t es = element_size(want.canonical().at(r.tensor).type);
    std::vector<std::byte> got(r.size() * es);
    read_canonical(l, r.tensor, {r.begin, r.end}, got);
    if (std::memcmp(got.data(), want.bytes(r.tensor).data() + r.begin * es, got.size()) != 0) return false;
  }
  return true;
}

std::vector<std::vector<std::byte>> engine_bytes(const vllm_rank_loader& l) {
  std::vector<std::vector<std::byte>> out;
  for (std::size_t k = 0; k < l.tensors().size(); ++k) out.emplace_back(l.bytes(k).begin(), l.bytes(k).end());
  return out;
}

}  // namespace

TEST(FrameApply, XorFrameOnEveryTpRankGivesTheNewVersion) {
  const model_spec m = tiny();
  auto v = make_versions(m, 1);
  const auto frame = encode(v, codec::mode_policy::xor_only);
  loader_frame_applier applier;
  std::uint64_t changed = 0;
  const auto view = codec::frame_view::parse(frame);
  for (auto& it : view.items()) changed += it.changed;
  std::uint64_t applied = 0;
  for (std::uint32_t r = 0; r < 2; ++r) {
    vllm_rank_loader eng(v.manifest, m, {.tp = 2, .vocab_multiple = 4}, r);
    load(eng, v.old_c);
    const auto res = applier.apply(eng, frame);
    EXPECT_EQ(res.applied + res.not_held, changed);
    applied += res.applied;
    EXPECT_TRUE(holds_exactly(eng, v.new_c));
  }
  EXPECT_GE(applied, changed);  // replicated norms are applied on both ranks
  canonical_store store(*v.manifest);
  load(store, v.old_c);
  EXPECT_EQ(applier.apply(store, frame).applied, changed);
  EXPECT_TRUE(bit_equal(store, v.new_c));
}

TEST(FrameApply, XorOnNonBitPreservingPlacementIsRefusedBeforeAnyWrite) {
  const model_spec m = tiny();
  auto v = make_versions(m, 2);
  vllm_rank_loader eng(v.manifest, m, {.tp = 2, .vocab_multiple = 4, .norms_as_f32 = true}, 0);
  load(eng, v.old_c);
  const auto before = engine_bytes(eng);
  loader_frame_applier applier;
  try {
    applier.apply(eng, encode(v, codec::mode_policy::xor_only));
    FAIL() << "XOR frame accepted on F32-upcast norms";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_EQ(e.where().field, "mode");
    EXPECT_NE(e.where().tensor.find("norm"), std::string::npos);
  }
  EXPECT_EQ(engine_bytes(eng), before);  // items before the norm were not written either
  // The same delta as overwrite lands, norms included.
  applier.apply(eng, encode(v, codec::mode_policy::overwrite_only));
  EXPECT_TRUE(holds_exactly(eng, v.new_c));
}

TEST(FrameApply, CorruptOrForeignFramesWriteNothing) {
  const model_spec m = tiny();
  auto v = make_versions(m, 3);
  vllm_rank_loader eng(v.manifest, m, {.tp = 2, .vocab_multiple = 4}, 1);
  load(eng, v.old_c);
  const auto before = engine_bytes(eng);
  loader_frame_applier applier;
  auto frame = encode(v, codec::mode_policy::xor_allowed);
  for (std::size_t at : {std::size_t{0}, frame.size() / 2, frame.size() - 1}) {
    auto bad = frame;
    bad[at] ^= std::byte{0x40};
    EXPECT_THROW(applier.apply(eng, bad), error);
    EXPECT_EQ(engine_bytes(eng), before);
  }
  EXPECT_THROW(applier.apply(eng, std::span(frame).first(frame.size() - 3)), error);
  // A frame of another model (different vocabulary): the item shapes do not match.
  model_spec other = m;
  other.vocab = 31;
  auto w = make_versions(other, 4);
  try {
    applier.apply(eng, encode(w, codec::mode_policy::xor_allowed));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_EQ(e.where().tensor, hf_lm_head);  // the first vocab-shaped tensor in name order
    EXPECT_EQ(e.where().field, "tensor_elements");
  }
  EXPECT_EQ(engine_bytes(eng), before);
}

// The attestation a serving rank acks with equals the owners' digest over the same declared
// ranges of the canonical bits, for in-place segments and for read-back (upcast) placements.
TEST(FrameApply, LoaderAttestationEqualsDigestOfCanonicalBitsOverHeldRanges) {
  const model_spec m = tiny();
  auto v = make_versions(m, 5);
  for (bool f32 : {false, true})
    for (std::uint32_t r = 0; r < 2; ++r) {
      vllm_rank_loader eng(v.manifest, m, {.tp = 2, .vocab_multiple = 4, .norms_as_f32 = f32}, r);
      load(eng, v.new_c);
      std::vector<codec::attested_range> expect;
      for (const auto& cr : held_ranges(eng)) {
        const tensor_info& t = v.manifest->at(cr.tensor);
        expect.push_back({t.name, t.type, &t.shape, cr.begin, cr.end, v.new_c.bytes(t.name).subspan(cr.begin * 2, cr.size() * 2)});
      }
      const digest128 d = loader_attestation_digest(eng);
      EXPECT_EQ(d, codec::attestation_digest(std::span<const codec::attested_range>(expect)));
      // One flipped bit anywhere held changes it.
      const auto cr = held_ranges(eng).back();
      std::vector<std::byte> one(2);
      read_canonical(eng, cr.tensor, {cr.begin, cr.begin + 1}, one);
      one[1] ^= std::byte{0x01};
      write_canonical(eng, cr.tensor, {cr.begin, cr.begin + 1}, one);
      EXPECT_NE(loader_attestation_digest(eng), d);
    }
  canonical_store store(*v.manifest);
  load(store, v.new_c);
  std::vector<tensor_view> views;
  for (auto& t : v.manifest->tensors()) views.push_back(v.new_c.view(t.name));
  EXPECT_EQ(loader_attestation_digest(store), codec::attestation_digest(std::span<const tensor_view>(views)));
}
