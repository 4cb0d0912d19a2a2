// Loader laws and the receiver operations of layout/apply.hpp, on the canonical store.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "bitrefit/layout/apply.hpp"
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

  auto st = apply_positions(s, t.name, write_mode::xor_mask, pos, vals);
  RC_ASSERT(st.applied == pos.size());
  RC_ASSERT(st.not_held == 0u);
  for (std::size_t k = 0; k < pos.size(); ++k)
    for (int b = 0; b < 2; ++b)
      RC_ASSERT(s.bytes(t.name)[pos[k] * 2 + b] == (init[pos[k] * 2 + b] ^ vals[k * 2 + b]));
  apply_positions(s, t.name, write_mode::xor_mask, pos, vals);
  RC_ASSERT(std::equal(init.begin(), init.end(), s.bytes(t.name).begin()));

  apply_positions(s, t.name, write_mode::overwrite, pos, vals);
  std::vector<std::byte> once(s.bytes(t.name).begin(), s.bytes(t.name).end());
  apply_positions(s, t.name, write_mode::overwrite, pos, vals);
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
  EXPECT_EQ(apply_runs(a, "d.ids", write_mode::overwrite, std::span<const index_range>(runs.data(), 2), std::span(vals).first(4 * 8)).applied, 4u);
  (void)apply_runs(b, "d.ids", write_mode::overwrite, std::span<const index_range>(runs.data(), 2), std::span(vals).first(4 * 8));
  EXPECT_TRUE(bit_equal(a, b));
  canonical_store c(small_manifest()), d(small_manifest());
  std::vector<std::byte> v16(pos.size() * 2);
  std::memcpy(v16.data(), vals.data(), v16.size());
  (void)apply_runs(c, "b.weight", write_mode::xor_mask, runs, v16);
  (void)apply_positions(d, "b.weight", write_mode::xor_mask, pos, v16);
  EXPECT_TRUE(bit_equal(c, d));
}

TEST(Apply, RejectsBadItemsWithoutWriting) {
  canonical_store s(small_manifest());
  auto init = random_bytes(60, 3);
  std::memcpy(s.bytes("b.weight").data(), init.data(), 60);
  std::vector<std::byte> two(4, std::byte{0xFF});
  auto expect_untouched = [&] { EXPECT_TRUE(std::equal(init.begin(), init.end(), s.bytes("b.weight").begin())); };
  std::vector<std::uint64_t> unsorted{3, 1};
  EXPECT_THROW(apply_positions(s, "b.weight", write_mode::overwrite, unsorted, two), error);
  expect_untouched();
  std::vector<std::uint64_t> out_of_range{1, 30};
  try {
    apply_positions(s, "b.weight", write_mode::overwrite, out_of_range, two);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_EQ(e.where().tensor, "b.weight");
  }
  expect_untouched();
  std::vector<std::uint64_t> ok{1, 2};
  EXPECT_THROW(apply_positions(s, "b.weight", write_mode::overwrite, ok, std::span(two).first(3)), error);
  EXPECT_THROW(apply_positions(s, "zz", write_mode::overwrite, ok, two), error);
  std::vector<index_range> overlapping{{0, 2}, {1, 3}};
  EXPECT_THROW(apply_runs(s, "b.weight", write_mode::overwrite, overlapping, random_bytes(8, 1)), error);
  expect_untouched();
  std::vector<std::byte> out(4);
  EXPECT_THROW(read_canonical(s, "b.weight", {29, 31}, out), error);
}
