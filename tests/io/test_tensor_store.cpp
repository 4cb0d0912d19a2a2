// io/tensor_store: owned, writable tensors that round-trip through checkpoints bit-exactly.
#include <gtest/gtest.h>

#include <cstring>

#include "io_test_util.hpp"

namespace bitrefit::io::test {
namespace {

TEST(TensorStore, CopiesACheckpointChangesBitsAndWritesThemBack) {
  scratch_dir dir;
  checkpoint ref(reference_files() / "sharded");
  tensor_store s = tensor_store::from_checkpoint(ref);
  EXPECT_EQ(s.manifest(), ref.manifest());
  EXPECT_EQ(s.metadata, ref.metadata());
  for (const auto& t : ref.tensors()) {
    auto c = s.tensor(t.name());
    EXPECT_NE(c.bytes().data(), t.bytes().data()) << "a copy, not a view of the mapping";
    EXPECT_EQ(to_hex(c.bytes()), to_hex(t.bytes()));
  }

  // Flip one bit of one BF16 element, and give the 0-d I64 tensor a new value.
  auto w = s.mutable_tensor("lm_head.weight");
  w.bytes()[5] ^= std::byte{0x01};
  auto step = s.mutable_tensor("model.layers.1.step");
  ASSERT_EQ(step.bytes().size(), 8u);
  std::memset(step.bytes().data(), 0xAB, 8);

  write_checkpoint(dir / "out", s.views(), s.metadata);
  checkpoint out(dir / "out");
  EXPECT_EQ(out.manifest(), ref.manifest());
  for (const auto& t : ref.tensors()) {
    auto o = out.tensor(t.name());
    auto expect = std::vector<std::byte>(t.bytes().begin(), t.bytes().end());
    if (t.name() == "lm_head.weight") expect[5] ^= std::byte{0x01};
    if (t.name() == "model.layers.1.step") expect.assign(8, std::byte{0xAB});
    EXPECT_EQ(to_hex(o.bytes()), to_hex(expect)) << t.name();
  }
}

TEST(TensorStore, AddressesAreStableAndNamesUnique) {
  tensor_store s;
  auto a = s.add_zeros("a", dtype::F32, {4});
  const std::byte* where = a.bytes().data();
  for (int i = 0; i < 100; ++i) s.add_zeros("t" + std::to_string(i), dtype::U8, {3});
  EXPECT_EQ(s.tensor("a").bytes().data(), where);
  for (std::byte b : s.tensor("a").bytes()) EXPECT_EQ(b, std::byte{0});
  EXPECT_THROW(s.add_zeros("a", dtype::F32, {4}), error);
  EXPECT_THROW(s.add_zeros("", dtype::F32, {4}), error);
  EXPECT_THROW(s.tensor("absent"), error);
  auto e = s.add_zeros("empty", dtype::BF16, {0, 3});
  EXPECT_EQ(e.bytes().size(), 0u);
  auto names = s.views();
  ASSERT_EQ(names.size(), 102u);
  for (std::size_t i = 1; i < names.size(); ++i) EXPECT_LT(names[i - 1].name(), names[i].name());
}

}  // namespace
}  // namespace bitrefit::io::test
