// The FP8 E4M3 block-scale conversion: exact rounding, bit-determinism, and the residual delta
// (overwrite items that turn convert(old) into convert(new), bit for bit).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bitrefit/layout/apply.hpp"
#include "bitrefit/layout/fp8.hpp"

using namespace bitrefit;
using namespace bitrefit::layout;

namespace {

/// Reference: the E4M3 code nearest to x by exhaustive search in double, ties to the even code,
/// saturating to ±448, NaN to 0x7F|sign. Independent of the bit manipulation under test.
std::uint8_t reference_e4m3(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= 448.0) return sign | 0x7E;
  std::uint8_t best = 0;
  double best_d = 1e300;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(static_cast<double>(e4m3_to_float(static_cast<std::uint8_t>(c))) - ax);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = static_cast<std::uint8_t>(c), best_d = d;
  }
  return sign | best;
}

std::uint16_t bf16_bits(float f) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16); }

/// A BF16 master tensor of random normal-ish weights with the special values a checkpoint can hold.
std::vector<std::byte> master_bits(std::uint64_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n * 2);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint16_t b = static_cast<std::uint16_t>(((g() & 1) << 15) | ((118 + g() % 8) << 7) | (g() & 0x7F));
    switch (g() % 200) {
      case 0: b = 0x8000; break;                // -0.0
      case 1: b = 0x0001 | (g() & 0x8000); break;  // BF16 subnormal
      case 2: b = 0x7FC1; break;                // NaN with a payload
      case 3: b = 0xFF80; break;                // -inf
      default: break;
    }
    std::memcpy(&v[i * 2], &b, 2);
  }
  return v;
}

}  // namespace

TEST(E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(code)));
      EXPECT_EQ(e4m3_from_float(e4m3_to_float(code)), code);  // NaN keeps its sign
      continue;
    }
    EXPECT_EQ(e4m3_from_float(e4m3_to_float(code)), code) << c;
  }
}

TEST(E4M3, RoundsToNearestEvenOnEveryMidpointAndNeighbour) {
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_float(static_cast<std::uint8_t>(c)), hi = e4m3_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact in binary32
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid})
      EXPECT_EQ(e4m3_from_float(x), reference_e4m3(x)) << x;
  }
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float(-INFINITY), 0xFE);
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(0x1p-10f), 0x00);         // tie between 0 and the smallest subnormal
  EXPECT_EQ(e4m3_from_float(0x1.000002p-10f), 0x01);  // just above it
  EXPECT_EQ(e4m3_from_float(std::bit_cast<float>(0x00000001u)), 0x00);
}

RC_GTEST_PROP(E4M3, MatchesExhaustiveReference, (std::uint32_t bits)) {
  const float x = std::bit_cast<float>(bits);
  RC_ASSERT(e4m3_from_float(x) == reference_e4m3(x));
}

// Most random bit patterns are far outside E4M3's range; this one stays within 2^-12 .. 480.
RC_GTEST_PROP(E4M3, MatchesExhaustiveReferenceInRange, (bool negative)) {
  const std::uint32_t bits = *rc::gen::inRange<std::uint32_t>(0x39800000u, 0x43F00001u) | (negative ? 0x80000000u : 0u);
  const float x = std::bit_cast<float>(bits);
  RC_ASSERT(e4m3_from_float(x) == reference_e4m3(x));
}

TEST(Fp8BlockConversion, ShapesNamesAndKnownBlock) {
  fp8_block_conversion c;
  const auto outs = c.outputs({"model.layers.0.self_attn.q_proj.weight", dtype::BF16, {300, 129}});
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].type, dtype::F8_E4M3);
  EXPECT_EQ(outs[1].name, "model.layers.0.self_attn.q_proj.weight_scale_inv");
  EXPECT_EQ(outs[1].shape, (shape_t{3, 2}));
  EXPECT_THROW(c.outputs({"x", dtype::F32, {4, 4}}), error);

  // One 2x3 block: amax 896 -> scale 2, so each element is E4M3(x / 2).
  const std::vector<float> xs{896.0f, -3.0f, 0.5f, -0.0f, 100.0f, 1.0f / 1024};
  std::vector<std::byte> in(12);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::uint16_t b = bf16_bits(xs[i]);
    std::memcpy(&in[i * 2], &b, 2);
  }
  canonical_store out(model_manifest(c.outputs({"w", dtype::BF16, {2, 3}})));
  convert_into(c, tensor_view("w", dtype::BF16, {2, 3}, in), out);
  float scale;
  std::memcpy(&scale, out.bytes("w_scale_inv").data(), 4);
  EXPECT_EQ(scale, 2.0f);
  const std::vector<std::uint8_t> want{0x7E, 0xBC, 0x28, 0x80, e4m3_from_float(50.0f), 0x00};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::to_integer<std::uint8_t>(out.bytes("w")[i]), want[i]) << i;
}

TEST(Fp8BlockConversion, ElementsMatchReferenceAndAreBitDeterministic) {
  fp8_block_conversion c;
  const tensor_info m{"w", dtype::BF16, {260, 200}};
  const auto in = master_bits(m.elements(), 1);
  canonical_store a(model_manifest(c.outputs(m))), b(model_manifest(c.outputs(m)));
  convert_into(c, tensor_view("w", m.type, m.shape, in), a);
  convert_into(c, tensor_view("w", m.type, m.shape, in), b);
  EXPECT_TRUE(bit_equal(a, b));
  // Pinned: the converted bits of this fixed input never change across builds and machines.
  auto fnv = [](std::span<const std::byte> bytes) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte x : bytes) h = (h ^ std::to_integer<std::uint64_t>(x)) * 0x100000001b3ull;
    return h;
  };
  EXPECT_EQ(fnv(a.bytes("w")), 0x009c3e3855368659ull);
  EXPECT_EQ(fnv(a.bytes("w_scale_inv")), 0x6a36b1ff10a29431ull);
  // Every element: the reference rounding of x / scale with the block's stored scale.
  for (std::uint64_t r = 0; r < 260; ++r)
    for (std::uint64_t col = 0; col < 200; ++col) {
      float scale;
      std::memcpy(&scale, a.bytes("w_scale_inv").data() + ((r / 128) * 2 + col / 128) * 4, 4);
      std::uint16_t xb;
      std::memcpy(&xb, &in[(r * 200 + col) * 2], 2);
      const float x = std::bit_cast<float>(static_cast<std::uint32_t>(xb) << 16);
      ASSERT_EQ(std::to_integer<std::uint8_t>(a.bytes("w")[r * 200 + col]), reference_e4m3(x / scale)) << r << "," << col;
    }
}

// The acceptance law: a delta built from the conversion, applied to the previous converted
// checkpoint, equals converting the new master weights, bit for bit — including a block whose amax
// (and so its scale) changed, which must carry the scale and the elements it changed.
TEST(Fp8BlockConversion, ResidualDeltaAppliedToPreviousEqualsConvertingNew) {
  fp8_block_conversion c;
  const tensor_info m{"model.layers.3.mlp.down_proj.weight", dtype::BF16, {256, 384}};
  auto old_master = master_bits(m.elements(), 2);
  auto new_master = old_master;
  std::mt19937_64 g(3);
  for (int k = 0; k < 500; ++k) new_master[(g() % m.elements()) * 2] ^= std::byte{1};  // small updates
  const std::uint16_t big = bf16_bits(100.0f);  // raises the amax of block (1, 2)
  std::memcpy(&new_master[(130 * 384 + 260) * 2], &big, 2);

  const model_manifest outs(c.outputs(m));
  canonical_store residual(outs), converted(outs), receiver(outs), expect(outs);
  convert_into(c, tensor_view(m.name, m.type, m.shape, old_master), residual);
  convert_into(c, tensor_view(m.name, m.type, m.shape, old_master), receiver);
  convert_into(c, tensor_view(m.name, m.type, m.shape, new_master), expect);

  const auto items = conversion_delta(c, tensor_view(m.name, m.type, m.shape, new_master), residual, converted);
  EXPECT_TRUE(bit_equal(converted, expect));
  ASSERT_EQ(items.size(), 2u);
  bool scale_item = false;
  for (const change_item& it : items) {
    EXPECT_EQ(it.mode, value_mode::overwrite);
    if (it.tensor == m.name + "_scale_inv") {
      scale_item = true;
      EXPECT_NE(std::find(it.positions.begin(), it.positions.end(), 1 * 3 + 2), it.positions.end());
    } else {
      std::uint64_t in_block = 0;  // the rescaled block changes far more than one element
      for (auto p : it.positions) in_block += (p / 384) / 128 == 1 && (p % 384) / 128 == 2;
      EXPECT_GT(in_block, 1000u);
    }
    (void)apply_positions(receiver, it.tensor, it.mode, it.positions, it.values);
  }
  EXPECT_TRUE(scale_item);
  EXPECT_TRUE(bit_equal(receiver, expect));
}

// The bitwise change collector behind both delta paths and the conversion residual: equal to a
// per-element memcmp for every element size, any length (tails), any pattern, split into runs.
RC_GTEST_PROP(CollectChanged, EqualsPerElementComparison, ()) {
  const std::size_t es = *rc::gen::element<std::size_t>(1, 2, 4, 8);
  const std::uint64_t len = *rc::gen::inRange<std::uint64_t>(0, 300);
  const bool x = *rc::gen::arbitrary<bool>();
  std::mt19937_64 g(*rc::gen::arbitrary<std::uint64_t>());
  const unsigned density = *rc::gen::element<unsigned>(0u, 2u, 30u, 100u);  // percent of elements changed
  std::vector<std::byte> a(len * es), b;
  for (auto& v : a) v = std::byte(g() & 0xFF);
  b = a;
  for (std::uint64_t e = 0; e < len; ++e)
    if (g() % 100 < density) b[e * es + g() % es] ^= std::byte(1u << (g() % 8));  // one flipped bit: -0.0/+0.0 style
  change_item want{"t", value_mode::overwrite, {}, {}};
  for (std::uint64_t e = 0; e < len; ++e)
    if (std::memcmp(&a[e * es], &b[e * es], es) != 0) {
      want.positions.push_back(1000 + e);
      for (std::size_t k = 0; k < es; ++k) want.values.push_back(x ? a[e * es + k] ^ b[e * es + k] : b[e * es + k]);
    }
  // In two runs through one cursor, as the delta builders call it.
  change_item got{"t", value_mode::overwrite, {}, {}};
  change_cursor c = change_cursor::at_end(got);
  const std::uint64_t split = len ? g() % (len + 1) : 0;
  collect_changed(a.data(), b.data(), split, es, 1000, x, got, c);
  collect_changed(a.data() + split * es, b.data() + split * es, len - split, es, 1000 + split, x, got, c);
  c.finish(got);
  RC_ASSERT(got == want);
}
