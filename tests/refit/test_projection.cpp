// refit/projection.hpp: the identity projection reads a tensor in bounded blocks when it freezes
// (tensor_source gets element ranges of at most change_block_bytes, each element exactly once, in
// order), and the change set it builds is bit for bit durability::diff_tensor of the whole tensor
// (law 4 of TrainerProjection) — for every dtype, tensors of 0, 1, block - 1, block, block + 1 and
// 2.5 blocks elements, with changes on both sides of every block boundary and -0.0, NaN payloads,
// infinities and subnormals among the new bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/refit/projection.hpp"

using namespace bitrefit;

namespace {

/// Bits for element i's special value of width `es` (little-endian): -0.0, a NaN with payload,
/// +infinity and the smallest subnormal of the IEEE-like format of that width; integer dtypes just
/// get these bit patterns too (the diff never interprets bits).
void special(std::byte* p, std::size_t es, unsigned kind) {
  std::memset(p, 0, es);
  const std::size_t top = es - 1;
  switch (kind % 4) {
    case 0: p[top] = std::byte{0x80}; break;                                       // -0.0
    case 1: std::memset(p, 0xFF, es), p[0] = std::byte{0x5A}, p[top] = std::byte{0x7F}; break;  // NaN, payload
    case 2:                                                                        // +inf (exponent all ones)
      if (es == 1) p[0] = std::byte{0x7C};
      else if (es == 2) p[1] = std::byte{0x7F}, p[0] = std::byte{0x80};
      else if (es == 4) p[3] = std::byte{0x7F}, p[2] = std::byte{0x80};
      else p[7] = std::byte{0x7F}, p[6] = std::byte{0xF0};
      break;
    default: p[0] = std::byte{1}; break;                                           // smallest subnormal
  }
}

}  // namespace

TEST(IdentityProjection, FreezeReadsBoundedBlocksAndEqualsTheWholeTensorDiff) {
  std::mt19937_64 rng(20261201);
  for (const dtype type : all_dtypes) {
    const std::size_t es = element_size(type);
    const std::uint64_t block = refit::change_block_bytes / es;
    std::vector<tensor_info> tensors;
    for (const std::uint64_t n : {std::uint64_t{0}, std::uint64_t{1}, block - 1, block, block + 1, 5 * block / 2})
      tensors.push_back({"t" + std::to_string(n), type, {n}});
    const model_manifest m(tensors);
    const refit::identity_projection p(m);

    std::map<std::string, std::vector<std::byte>> base, next;
    for (const auto& t : m.tensors()) {
      auto& b = base[t.name];
      b.resize(t.bytes());
      for (std::size_t k = 0; k < b.size(); k += 8) {  // random bits, eight bytes per draw
        const std::uint64_t w = rng();
        std::memcpy(b.data() + k, &w, std::min<std::size_t>(8, b.size() - k));
      }
      auto& n = next[t.name];
      n = b;
      const std::uint64_t count = t.elements();
      std::vector<std::uint64_t> at;
      for (std::uint64_t edge = 0; edge <= count; edge += block)  // both sides of every boundary
        for (const std::uint64_t i : {edge == 0 ? 0 : edge - 1, edge})
          if (i < count) at.push_back(i);
      if (count > 0) at.push_back(count - 1);
      for (std::uint64_t k = 0; k < count / 100; ++k) at.push_back(rng() % count);  // ~1 % more
      for (const std::uint64_t i : at) {
        std::byte* e = n.data() + i * es;
        special(e, es, static_cast<unsigned>(rng()));
        if (std::memcmp(e, b.data() + i * es, es) == 0) e[0] ^= std::byte{1};  // a change, always
      }
    }

    for (const auto& t : m.tensors()) {
      std::vector<layout::index_range> reads;
      const refit::tensor_source bits = refit::copy_from([&](const tensor_info& x) { return std::span<const std::byte>(next.at(x.name)); });
      const refit::tensor_source recording = [&](const tensor_info& x, layout::index_range r, std::span<std::byte> out) {
        reads.push_back(r);
        bits(x, r, out);
      };
      durability::tensor_changes got;
      got.positions = {7, 8};  // replaced, not appended to
      got.values.assign(2 * es, std::byte{1});
      p.changes(recording, t, base.at(t.name), got);

      durability::tensor_changes want;
      durability::diff_tensor(base.at(t.name), next.at(t.name), es, want);
      ASSERT_EQ(got.positions, want.positions) << t.name << " " << dtype_name(type);
      ASSERT_EQ(got.values.size(), want.values.size()) << t.name;
      if (!want.values.empty()) {  // (memcmp of an empty vector's null data is undefined)
        EXPECT_EQ(std::memcmp(got.values.data(), want.values.data(), want.values.size()), 0) << t.name << " " << dtype_name(type);
      }
      if (t.elements() > 0) {
        EXPECT_FALSE(want.positions.empty()) << "the fixture changes every tensor";
      }

      std::uint64_t covered = 0;  // ranges in order, back to back, each at most one block of bytes
      for (const auto& r : reads) {
        EXPECT_EQ(r.begin, covered) << t.name;
        EXPECT_GT(r.size(), 0u) << t.name;
        EXPECT_LE(r.size() * es, refit::change_block_bytes) << t.name << ": a freeze read more than one block at once";
        covered = r.end;
      }
      EXPECT_EQ(covered, t.elements()) << t.name;
    }
  }
}

TEST(IdentityProjection, CopyFromRefusesBitsOfAnotherSizeAndReadsOutsideTheTensor) {
  const tensor_info t{"w", dtype::BF16, {10}};
  std::vector<std::byte> held(18);  // 9 elements: not this tensor's 10
  const auto src = refit::copy_from([&](const tensor_info&) { return std::span<const std::byte>(held); });
  std::vector<std::byte> out(4);
  EXPECT_THROW(src(t, layout::index_range{0, 2}, out), error);
  held.resize(20);
  EXPECT_THROW(src(t, layout::index_range{9, 11}, out), error);  // past the end
  EXPECT_THROW(src(t, layout::index_range{0, 3}, out), error);   // out of another size
  for (std::size_t i = 0; i < held.size(); ++i) held[i] = static_cast<std::byte>(i);
  src(t, layout::index_range{8, 10}, out);
  EXPECT_EQ(std::memcmp(out.data(), held.data() + 16, 4), 0);
}

// A version whose canonical bits were never given (an empty tensor_source) is refused by every
// read through it, freeze and dense load alike, with the same error naming the tensor.
TEST(IdentityProjection, EveryReadRefusesAMissingSourceNamingTheTensor) {
  const tensor_info t{"layers.0.w", dtype::BF16, {10}};
  const refit::identity_projection p(model_manifest({t}));
  const refit::tensor_source none;
  std::vector<std::byte> base(t.bytes()), out(t.bytes());
  durability::tensor_changes changes;
  const auto expect_refused = [&](auto&& read, const char* what) {
    try {
      read();
      ADD_FAILURE() << what << " accepted a missing source";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument) << what;
      EXPECT_NE(std::string(e.what()).find("no canonical bits given"), std::string::npos) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("layers.0.w"), std::string::npos) << what << ": " << e.what();
    }
  };
  expect_refused([&] { p.changes(none, t, base, changes); }, "changes()");
  expect_refused([&] { p.project(none, t, out); }, "project()");
  expect_refused([&] { refit::changes_of(none)(t, base, changes); }, "changes_of");
  expect_refused([&] { refit::whole_tensors(none)(t, out); }, "whole_tensors");
}
