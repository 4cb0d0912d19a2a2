#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <vector>

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
