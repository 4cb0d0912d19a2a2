// io/checkpoint: sharded directories with model.safetensors.index.json, read and written; the
// index/shard consistency rules with their named errors; whole-directory atomic writes.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>

#include "io_test_util.hpp"

namespace bitrefit::io::test {
namespace {

using nlohmann::json;

TEST(Checkpoint, PythonWrittenShardedDirectoryReadsBackBitExactly) {
  const fs::path& ref = reference_files();
  const json expected = json::parse(read_bytes(ref / "expected.json"))["sharded"];
  for (const fs::path& p : {ref / "sharded", ref / "sharded" / "model.safetensors.index.json"}) {
    SCOPED_TRACE(p.string());
    checkpoint ck(p);
    EXPECT_TRUE(ck.is_sharded());
    EXPECT_EQ(ck.shards().size(), 3u);
    EXPECT_EQ(ck.index_metadata()["total_size"], expected["total_size"]);
    EXPECT_EQ(ck.metadata(), expected["metadata"].get<metadata_map>());
    EXPECT_EQ(ck.manifest().size(), expected["tensors"].size());
    EXPECT_EQ(ck.manifest().total_bytes(), expected["total_size"].get<std::uint64_t>());
    for (const auto& t : ck.tensors()) {
      SCOPED_TRACE(t.name());
      const json& w = expected["tensors"][t.name()];
      EXPECT_EQ(dtype_name(t.type()), w["dtype"].get<std::string>());
      EXPECT_EQ(t.shape(), w["shape"].get<shape_t>());
      EXPECT_EQ(to_hex(t.bytes()), w["hex"].get<std::string>());
    }
    // Names come back in byte-wise order across shards.
    const auto& ts = ck.manifest().tensors();
    for (std::size_t i = 1; i < ts.size(); ++i) EXPECT_LT(ts[i - 1].name, ts[i].name);
    EXPECT_EQ(ck.shards()[*ck.shard_of("lm_head.weight")].path().filename(), "model-00003-of-00003.safetensors");
    EXPECT_FALSE(ck.find("absent"));
    EXPECT_THROW(ck.tensor("absent"), error);
  }
}

TEST(Checkpoint, OpensSingleFilesAndModelDirectories) {
  scratch_dir dir;
  fs::copy_file(reference_files() / "all_dtypes.safetensors", dir / "all_dtypes.safetensors");
  checkpoint file(dir / "all_dtypes.safetensors");
  EXPECT_FALSE(file.is_sharded());
  fs::create_directory(dir / "single");
  fs::copy_file(dir / "all_dtypes.safetensors", dir / "single" / "model.safetensors");
  checkpoint in_dir(dir / "single");
  EXPECT_FALSE(in_dir.is_sharded());
  EXPECT_EQ(in_dir.manifest(), file.manifest());
  for (const auto& t : file.tensors()) EXPECT_EQ(to_hex(in_dir.tensor(t.name()).bytes()), to_hex(t.bytes()));

  fs::create_directory(dir / "nothing");
  expect_problem([&] { checkpoint c(dir / "nothing"); }, checkpoint_errc::not_a_checkpoint, (dir / "nothing").string());
  try {
    checkpoint c(dir / "absent");
    ADD_FAILURE();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::io);
  }
}

// ---- index/shard consistency -----------------------------------------------------------------

/// Rewrites the Python-written sharded checkpoint's index with `edit`, then expects `problem`.
class BadIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy(reference_files() / "sharded", dir / "sharded");
    index_path = dir / "sharded" / "model.safetensors.index.json";
    index = json::parse(read_bytes(index_path));
  }
  void expect(checkpoint_errc problem, const std::string& file, const std::string& tensor = {}) {
    const auto before = dir.entries();
    expect_problem([&] { checkpoint c(dir / "sharded"); }, problem, file, tensor);
    EXPECT_EQ(dir.entries(), before) << "opening must not write";
  }
  void save() { write_bytes(index_path, index.dump()); }
  std::string shard(int i) const { return (dir / "sharded" / shard_file_name(static_cast<std::size_t>(i), 3)).string(); }

  scratch_dir dir;
  fs::path index_path;
  json index;
};

TEST_F(BadIndex, NotJson) {
  write_bytes(index_path, "{\"weight_map\": ");
  expect(checkpoint_errc::malformed_index, index_path.string());
}
TEST_F(BadIndex, NoWeightMap) {
  index.erase("weight_map");
  save();
  expect(checkpoint_errc::malformed_index, index_path.string());
}
TEST_F(BadIndex, ShardNameLeavesTheDirectory) {
  index["weight_map"]["lm_head.weight"] = "../all_dtypes.safetensors";
  save();
  expect(checkpoint_errc::malformed_index, index_path.string(), "lm_head.weight");
}
TEST_F(BadIndex, MissingShard) {
  fs::remove(shard(1));
  expect(checkpoint_errc::index_missing_shard, index_path.string());
}
TEST_F(BadIndex, IndexNamesATensorItsShardLacks) {
  index["weight_map"]["model.ghost.weight"] = shard_file_name(0, 3);
  save();
  expect(checkpoint_errc::index_missing_tensor, index_path.string(), "model.ghost.weight");
}
TEST_F(BadIndex, TensorPlacedInTheWrongShard) {
  index["weight_map"]["lm_head.weight"] = shard_file_name(0, 3);
  save();
  expect(checkpoint_errc::index_missing_tensor, index_path.string(), "lm_head.weight");
}
TEST_F(BadIndex, ShardHoldsAnUnlistedTensor) {
  index["weight_map"].erase("lm_head.weight");
  save();
  expect(checkpoint_errc::index_unlisted_tensor, shard(2), "lm_head.weight");
}
TEST_F(BadIndex, TensorInTwoShards) {
  // Copy shard 3's tensors into a new file that also holds lm_head.weight, listed as shard 4.
  checkpoint ok(dir / "sharded");
  std::vector<tensor_view> dup{ok.tensor("lm_head.weight")};
  std::vector<std::byte> b(4, std::byte{1});
  dup.emplace_back("extra.bias", dtype::F32, shape_t{1}, std::span<const std::byte>(b));
  write_safetensors(dir / "sharded" / "model-extra.safetensors", dup);
  index["weight_map"]["extra.bias"] = "model-extra.safetensors";
  save();
  expect(checkpoint_errc::duplicate_tensor, (dir / "sharded" / "model-extra.safetensors").string(), "lm_head.weight");
}
TEST_F(BadIndex, DamagedShardIsNamed) {
  const auto bytes = read_bytes(shard(1));
  std::string cut(reinterpret_cast<const char*>(bytes.data()), bytes.size() - 1);
  write_bytes(shard(1), cut);
  expect(checkpoint_errc::offsets_past_end, shard(1));
}

// ---- writing sharded checkpoints -------------------------------------------------------------

struct owned {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<tensor_view> views;
  void add(std::string name, dtype t, shape_t shape, std::uint8_t seed) {
    std::vector<std::byte> b(byte_size(t, shape));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(seed + i * 13);
    buffers.push_back(std::move(b));
    views.emplace_back(std::move(name), t, std::move(shape), std::span<const std::byte>(buffers.back()));
  }
  owned() { buffers.reserve(64); }
};

owned small_model() {
  owned m;
  m.add("model.embed_tokens.weight", dtype::BF16, {16, 8}, 1);   // 256 bytes
  m.add("model.layers.0.mlp.weight", dtype::F8_E4M3, {16, 16}, 2);  // 256 bytes
  m.add("model.layers.0.norm.weight", dtype::F32, {8}, 3);        // 32 bytes
  m.add("model.layers.0.step", dtype::I64, {}, 4);                // 8 bytes
  m.add("model.layers.0.empty", dtype::F16, {0}, 5);              // 0 bytes
  m.add("lm_head.weight", dtype::BF16, {16, 8}, 6);               // 256 bytes
  return m;
}

TEST(CheckpointWrite, ShardedRoundTripReadsInPythonAndCpp) {
  scratch_dir dir;
  owned m = small_model();
  write_options opt;
  opt.max_shard_bytes = 300;
  std::vector<std::uint64_t> progress;
  opt.progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, 808u);
    progress.push_back(done);
  };
  write_checkpoint(dir / "ck", m.views, {{"format", "pt"}}, opt);
  EXPECT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), 808u);

  checkpoint ck(dir / "ck");
  EXPECT_TRUE(ck.is_sharded());
  EXPECT_EQ(ck.shards().size(), 3u) << "256+... greedy in name order with 300-byte shards";
  EXPECT_EQ(ck.index_metadata()["total_size"], 808);
  for (const auto& s : ck.shards()) EXPECT_EQ(s.metadata(), (metadata_map{{"format", "pt"}}));
  for (const auto& v : m.views) {
    auto t = ck.tensor(v.name());
    EXPECT_EQ(t.type(), v.type());
    EXPECT_EQ(t.shape(), v.shape());
    ASSERT_EQ(t.bytes().size(), v.bytes().size());
    EXPECT_TRUE(same_bytes(t.bytes(), v.bytes())) << v.name();
  }
  const json dumped = json::parse(run_reference("dump '" + (dir / "ck").string() + "'"));
  EXPECT_EQ(dumped["total_size"], 808);
  EXPECT_EQ(dumped["tensors"].size(), m.views.size());
  for (const auto& v : m.views) EXPECT_EQ(dumped["tensors"][v.name()]["hex"].get<std::string>(), to_hex(v.bytes()));
  EXPECT_EQ(dir.entries(), (std::set<std::string>{"ck", "ck/model-00001-of-00003.safetensors", "ck/model-00002-of-00003.safetensors",
                                                  "ck/model-00003-of-00003.safetensors", "ck/model.safetensors.index.json"}));
}

TEST(CheckpointWrite, ReplacesAnOldCheckpointWhole) {
  scratch_dir dir;
  owned m = small_model();
  write_options many;
  many.max_shard_bytes = 1;  // one tensor per shard: 6 files
  write_checkpoint(dir / "ck", m.views, {}, many);
  EXPECT_EQ(checkpoint(dir / "ck").shards().size(), 6u);
  std::vector<tensor_view> fewer(m.views.begin(), m.views.begin() + 2);
  write_checkpoint(dir / "ck", fewer);
  checkpoint ck(dir / "ck");
  EXPECT_EQ(ck.shards().size(), 1u);
  EXPECT_EQ(ck.manifest().size(), 2u);
  EXPECT_EQ(dir.entries(), (std::set<std::string>{"ck", "ck/model-00001-of-00001.safetensors", "ck/model.safetensors.index.json"}))
      << "old shards are gone, no temporaries remain";
}

TEST(CheckpointWrite, AbortedWriteLeavesNothingAndKeepsTheOldCheckpoint) {
  scratch_dir dir;
  owned m = small_model();
  struct abort_write {};
  write_options opt;
  opt.max_shard_bytes = 300;
  opt.progress = [](std::uint64_t done, std::uint64_t) {
    if (done > 300) throw abort_write{};  // after the first shard is complete
  };
  EXPECT_THROW(write_checkpoint(dir / "ck", m.views, {}, opt), abort_write);
  EXPECT_EQ(dir.entries(), std::set<std::string>{});

  write_checkpoint(dir / "ck", m.views, {{"v", "1"}});
  const auto before = dir.entries();
  const auto shard_bytes = read_bytes(dir / "ck" / "model-00001-of-00001.safetensors");
  EXPECT_THROW(write_checkpoint(dir / "ck", m.views, {{"v", "2"}}, opt), abort_write);
  EXPECT_EQ(dir.entries(), before);
  EXPECT_EQ(read_bytes(dir / "ck" / "model-00001-of-00001.safetensors"), shard_bytes);
}

TEST(CheckpointWrite, NeverReplacesSomethingThatIsNotACheckpoint) {
  scratch_dir dir;
  owned m = small_model();
  fs::create_directory(dir / "home");
  write_bytes(dir / "home" / "notes.txt", "precious");
  write_bytes(dir / "file", "precious");
  for (const char* target : {"home", "file"}) {
    try {
      write_checkpoint(dir / target, m.views);
      ADD_FAILURE() << target;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
    }
  }
  EXPECT_EQ(dir.entries(), (std::set<std::string>{"home", "home/notes.txt", "file"}));
}

RC_GTEST_PROP(CheckpointProperty, ShardingNeverChangesBits, ()) {
  scratch_dir dir;
  owned m;
  const auto n = *rc::gen::inRange<std::size_t>(0, 8);
  for (std::size_t i = 0; i < n; ++i) {
    const dtype t = all_dtypes[*rc::gen::inRange<std::size_t>(0, dtype_count)];
    shape_t shape = *rc::gen::container<shape_t>(*rc::gen::inRange<std::size_t>(0, 3), rc::gen::inRange<std::uint64_t>(0, 9));
    m.add("t" + std::to_string(*rc::gen::inRange(0, 1000)) + "." + std::to_string(i), t, shape, static_cast<std::uint8_t>(i));
  }
  write_options opt;
  opt.max_shard_bytes = *rc::gen::inRange<std::uint64_t>(1, 600);
  write_checkpoint(dir / "ck", m.views, {}, opt);
  checkpoint ck(dir / "ck");
  RC_ASSERT(ck.manifest().size() == n);
  for (const auto& s : ck.shards()) {
    std::uint64_t bytes = 0;
    for (const auto& t : s.manifest().tensors()) bytes += t.bytes();
    RC_ASSERT(bytes <= opt.max_shard_bytes || s.manifest().size() == 1);
  }
  for (const auto& v : m.views) {
    auto t = ck.tensor(v.name());
    RC_ASSERT(t.type() == v.type());
    RC_ASSERT(t.shape() == v.shape());
    RC_ASSERT(same_bytes(t.bytes(), v.bytes()));
  }
}

}  // namespace
}  // namespace bitrefit::io::test
