#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "bitrefit/core/bit_diff.hpp"
#include "bitrefit/core/core.hpp"

using namespace bitrefit;

TEST(Dtype, NamesRoundTripAndSizes) {
  for (dtype t : all_dtypes) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(element_size(dtype::BF16), 2u);
  EXPECT_EQ(element_size(dtype::F8_E4M3), 1u);
  EXPECT_EQ(element_size(dtype::F64), 8u);
  EXPECT_FALSE(parse_dtype("F4").has_value());
}

RC_GTEST_PROP(Digest, HexRoundTrip, (std::uint64_t lo, std::uint64_t hi)) {
  digest128 d{lo, hi};
  auto back = digest128::from_hex(d.to_hex());
  RC_ASSERT(back.has_value());
  RC_ASSERT(*back == d);
}

TEST(Digest, RejectsBadHex) {
  EXPECT_FALSE(digest128::from_hex("xyz").has_value());
  EXPECT_FALSE(digest128::from_hex(std::string(32, 'g')).has_value());
  EXPECT_EQ(digest128::from_hex("000000000000000a000000000000000b")->high64, 10u);
}

TEST(TensorView, CheckedConstruction) {
  std::vector<std::byte> buf(12);
  EXPECT_NO_THROW(tensor_view("w", dtype::F32, {3}, buf));
  try {
    mutable_tensor_view("w.bad", dtype::BF16, {2, 2}, buf);
    FAIL() << "expected a size mismatch";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_NE(std::string(e.what()).find("w.bad"), std::string::npos);
  }
  tensor_view scalar("s", dtype::F32, {}, std::span<const std::byte>(buf).first(4));
  EXPECT_EQ(scalar.elements(), 1u);
  tensor_view empty("e", dtype::F32, {0, 5}, std::span<const std::byte>{});
  EXPECT_EQ(empty.elements(), 0u);
}

TEST(Manifest, SortedLookupAndDuplicates) {
  model_manifest m({{"b", dtype::BF16, {2, 3}}, {"a", dtype::F32, {4}}});
  EXPECT_EQ(m.tensors()[0].name, "a");
  EXPECT_EQ(m.total_elements(), 10u);
  EXPECT_EQ(m.total_bytes(), 28u);
  EXPECT_EQ(m.at("b").bytes(), 12u);
  EXPECT_THROW(m.at("c"), error);
  EXPECT_THROW(model_manifest({{"a", dtype::U8, {1}}, {"a", dtype::U8, {1}}}), error);
}

TEST(Canonical, NormalizeMerges) {
  auto r = normalize({{"t", 5, 9}, {"t", 0, 5}, {"s", 1, 2}, {"t", 20, 20}});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (canonical_range{"s", 1, 2}));
  EXPECT_EQ(r[1], (canonical_range{"t", 0, 9}));
}

// ---- the one diff kernel -----------------------------------------------------------------------

namespace {
std::vector<std::size_t> naive_changed(const std::vector<std::byte>& a, const std::vector<std::byte>& b, std::size_t es) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < a.size() / es; ++i)
    if (std::memcmp(a.data() + i * es, b.data() + i * es, es) != 0) out.push_back(i);
  return out;
}
}  // namespace

TEST(BitDiff, EveryPathFindsExactlyTheElementsWhoseBitsDiffer) {
  std::mt19937_64 rng(13);
  for (std::size_t es : {1u, 2u, 4u, 8u})
    for (std::size_t n : {0u, 1u, 7u, 63u, 64u, 65u, 1000u, 4099u}) {
      std::vector<std::byte> a(n * es), b;
      for (auto& x : a) x = std::byte(rng());
      b = a;
      for (std::size_t k = 0; k < n / 9 + 1 && n; ++k) b[rng() % b.size()] ^= std::byte(1u << (rng() % 8));  // one bit
      if (es == 4 && n >= 2) {  // -0.0 vs +0.0 and two NaN payloads: equal values, different bits
        const std::uint32_t pz = 0, nz = 0x80000000u, nan1 = 0x7fc00001u, nan2 = 0x7fc00002u;
        std::memcpy(a.data(), &pz, 4), std::memcpy(b.data(), &nz, 4);
        std::memcpy(a.data() + 4, &nan1, 4), std::memcpy(b.data() + 4, &nan2, 4);
      }
      const auto want = naive_changed(a, b, es);
      std::vector<std::size_t> got;
      for_each_changed(a.data(), b.data(), n, es, [&](std::size_t i) { got.push_back(i); });
      EXPECT_EQ(got, want) << "es " << es << " n " << n;
      EXPECT_EQ(count_changed(a.data(), b.data(), n, es), want.size());
      std::vector<std::size_t> portable;
      auto emit = [&](std::size_t i) { portable.push_back(i); };
      switch (es) {  // the portable path too, whatever this CPU picks by default
        case 1: bit_diff_detail::portable<1>(a.data(), b.data(), n, emit); break;
        case 2: bit_diff_detail::portable<2>(a.data(), b.data(), n, emit); break;
        case 4: bit_diff_detail::portable<4>(a.data(), b.data(), n, emit); break;
        default: bit_diff_detail::portable<8>(a.data(), b.data(), n, emit); break;
      }
      EXPECT_EQ(portable, want) << "portable, es " << es << " n " << n;
    }
  EXPECT_THROW(for_each_changed(nullptr, nullptr, 0, 3, [](std::size_t) {}), error);
}
