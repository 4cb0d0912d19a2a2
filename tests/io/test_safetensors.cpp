// io/safetensors: bit-exact round trips against an independent Python implementation, every
// strict-validation rule with its named error, and atomic writes that leave nothing on failure.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "io_test_util.hpp"

namespace bitrefit::io::test {
namespace {

using nlohmann::json;

/// Owned tensors for writing: the bytes live here, views point into them.
struct tensor_set {
  struct item {
    std::string name;
    dtype type;
    shape_t shape;
    std::vector<std::byte> bytes;
  };
  std::vector<item> items;
  std::vector<tensor_view> views() const {
    std::vector<tensor_view> v;
    for (auto& i : items) v.emplace_back(i.name, i.type, i.shape, std::span<const std::byte>(i.bytes));
    return v;
  }
};

template <class T>
void put(std::vector<std::byte>& out, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xFF));
}

/// Every dtype, with special float bit patterns first, then a deterministic filler.
tensor_set every_dtype_set() {
  tensor_set s;
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (dtype t : all_dtypes) {
    tensor_set::item it{"layer." + std::string(dtype_name(t)), t, {3, 5}, {}};
    const std::size_t es = element_size(t);
    std::vector<std::uint64_t> special;
    switch (t) {
      case dtype::F16: special = {0x8000, 0x7C00, 0xFC00, 0x7E01, 0x7C01, 0x0001, 0x03FF}; break;
      case dtype::BF16: special = {0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x7F81, 0x0001, 0x007F}; break;
      case dtype::F32: special = {0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x7F800001, 0x00000001, 0x007FFFFF}; break;
      case dtype::F64: special = {0x8000000000000000, 0x7FF0000000000000, 0x7FF8000000000001, 0x7FF0000000000001, 1}; break;
      case dtype::F8_E4M3: special = {0x80, 0x7F, 0xFF, 0x01, 0x7E}; break;
      case dtype::F8_E5M2: special = {0x80, 0x7C, 0xFC, 0x7D, 0x7F, 0x01}; break;
      default: break;
    }
    for (std::size_t i = 0; i < 15; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::uint64_t v = i < special.size() ? special[i] : (t == dtype::BOOL ? (x >> 63) : (x >> (64 - 8 * es)));
      if (es == 8 && i >= special.size()) v = x;
      for (std::size_t b = 0; b < es; ++b) it.bytes.push_back(static_cast<std::byte>((v >> (8 * b)) & 0xFF));
    }
    s.items.push_back(std::move(it));
  }
  s.items.push_back({"scalar.f64", dtype::F64, {}, {}});
  put<std::uint64_t>(s.items.back().bytes, 0x7FF4000000000abcull);
  s.items.push_back({"empty.bf16", dtype::BF16, {0}, {}});
  s.items.push_back({"empty.i32", dtype::I32, {2, 0, 7}, {}});
  return s;
}

void expect_matches_description(const std::vector<tensor_view>& got, const metadata_map& meta, const json& want) {
  ASSERT_EQ(got.size(), want["tensors"].size());
  for (const auto& t : got) {
    SCOPED_TRACE(t.name());
    ASSERT_TRUE(want["tensors"].contains(t.name()));
    const json& w = want["tensors"][t.name()];
    EXPECT_EQ(dtype_name(t.type()), w["dtype"].get<std::string>());
    EXPECT_EQ(t.shape(), w["shape"].get<shape_t>());
    EXPECT_EQ(to_hex(t.bytes()), w["hex"].get<std::string>());
  }
  EXPECT_EQ(meta, want["metadata"].get<metadata_map>());
}

TEST(Safetensors, PythonWrittenFileReadsBackBitExactly) {
  const fs::path& ref = reference_files();
  const json expected = json::parse(read_bytes(ref / "expected.json"));
  safetensors_file f(ref / "all_dtypes.safetensors");
  expect_matches_description(f.tensors(), f.metadata(), expected["all_dtypes.safetensors"]);

  std::set<dtype> seen;
  for (const auto& t : f.manifest().tensors()) seen.insert(t.type);
  EXPECT_EQ(seen.size(), dtype_count) << "the reference file must carry every dtype";
  EXPECT_EQ(f.tensor("scalar.f32").shape(), shape_t{});
  EXPECT_EQ(f.tensor("scalar.f32").bytes().size(), 4u);
  EXPECT_EQ(f.tensor("empty.f32").bytes().size(), 0u);
  // Tensor views point into the mapping, not into copies.
  const auto data = f.view().data();
  const auto u8 = f.tensor("t.u8").bytes();
  EXPECT_GE(u8.data(), data.data());
  EXPECT_LE(u8.data() + u8.size(), data.data() + data.size());
}

TEST(Safetensors, CppWrittenFileReadsBackInPythonAndCpp) {
  scratch_dir dir;
  const tensor_set s = every_dtype_set();
  const metadata_map meta{{"format", "pt"}, {"step", "41"}, {"unicode", "\xc3\xa9t\xc3\xa9"}};
  const auto views = s.views();
  write_safetensors(dir / "m.safetensors", views, meta);

  const json dumped = json::parse(run_reference("dump '" + (dir / "m.safetensors").string() + "'"));
  safetensors_file f(dir / "m.safetensors");
  expect_matches_description(f.tensors(), f.metadata(), dumped);
  for (const auto& item : s.items) {
    auto t = f.tensor(item.name);
    ASSERT_EQ(t.bytes().size(), item.bytes.size());
    EXPECT_TRUE(same_bytes(t.bytes(), item.bytes)) << item.name;
    EXPECT_EQ(t.type(), item.type);
    EXPECT_EQ(t.shape(), item.shape);
  }
  // The data section starts 8-byte aligned, and the in-memory serializer gives the same bytes.
  EXPECT_EQ(f.view().data_start() % 8, 0u);
  const auto mem = serialize_safetensors(views, meta);
  const auto disk = read_bytes(dir / "m.safetensors");
  EXPECT_EQ(mem, disk);
  EXPECT_EQ(dir.entries(), std::set<std::string>{"m.safetensors"});
}

// ---- strict validation: each rule, its named error, the file named ----------------------------

struct bad_case {
  std::string label;
  std::string bytes;
  checkpoint_errc problem;
  std::string tensor;  // the tensor the error must name, when there is one
};

std::string entry(const std::string& dtype, const std::string& shape, std::uint64_t b, std::uint64_t e) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":[)" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

std::vector<bad_case> bad_cases() {
  const std::string ok_a = R"("a":)" + entry("F32", "[2]", 0, 8);
  return {
      {"empty file", "", checkpoint_errc::file_too_short, {}},
      {"five bytes", std::string("\x10\0\0\0\0", 5), checkpoint_errc::file_too_short, {}},
      {"header length beyond the file", raw_safetensors("{" + ok_a + "}", 8, 4096), checkpoint_errc::header_length_past_end, {}},
      {"header length absurd", raw_safetensors("{}", 0, std::uint64_t{1} << 40), checkpoint_errc::header_length_absurd, {}},
      {"header length all ones", raw_safetensors("{}", 0, ~std::uint64_t{0}), checkpoint_errc::header_length_absurd, {}},
      {"truncated JSON", raw_safetensors(R"({"a":{"dtype":"F32")", 0), checkpoint_errc::malformed_json, {}},
      {"JSON array", raw_safetensors("[1,2]", 0), checkpoint_errc::malformed_json, {}},
      {"trailing NUL padding", raw_safetensors(std::string("{}\0\0", 4), 0), checkpoint_errc::malformed_json, {}},
      {"missing dtype", raw_safetensors(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), checkpoint_errc::malformed_entry, "a"},
      {"negative shape", raw_safetensors(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), checkpoint_errc::malformed_entry, "a"},
      {"three offsets", raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8), checkpoint_errc::malformed_entry, "a"},
      {"entry not an object", raw_safetensors(R"({"a":[1]})", 0), checkpoint_errc::malformed_entry, "a"},
      {"metadata value not a string", raw_safetensors(R"({"__metadata__":{"k":1}})", 0), checkpoint_errc::malformed_entry, {}},
      {"unknown dtype", raw_safetensors(R"({"a":)" + entry("F4", "[2]", 0, 8) + "}", 8), checkpoint_errc::unknown_dtype, "a"},
      {"shape/size mismatch", raw_safetensors(R"({"a":)" + entry("F32", "[3]", 0, 8) + "}", 8), checkpoint_errc::shape_size_mismatch, "a"},
      {"shape overflow", raw_safetensors(R"({"a":)" + entry("F32", "[4294967296,4294967296]", 0, 8) + "}", 8), checkpoint_errc::shape_size_mismatch, "a"},
      {"offsets reversed", raw_safetensors(R"({"a":)" + entry("U8", "[4]", 8, 4) + "}", 8), checkpoint_errc::offsets_reversed, "a"},
      {"offsets overlap", raw_safetensors("{" + ok_a + R"(,"b":)" + entry("F32", "[2]", 4, 12) + "}", 12), checkpoint_errc::offsets_overlap, "b"},
      {"empty tensor inside another", raw_safetensors("{" + ok_a + R"(,"b":)" + entry("F32", "[0]", 4, 4) + "}", 8), checkpoint_errc::offsets_overlap, "b"},
      {"gap between tensors", raw_safetensors("{" + ok_a + R"(,"b":)" + entry("F32", "[1]", 12, 16) + "}", 16), checkpoint_errc::offsets_gap, "b"},
      {"gap at the start", raw_safetensors(R"({"a":)" + entry("F32", "[1]", 4, 8) + "}", 8), checkpoint_errc::offsets_gap, "a"},
      {"bytes after the last tensor", raw_safetensors("{" + ok_a + "}", 9), checkpoint_errc::offsets_gap, {}},
      {"offsets past the end", raw_safetensors(R"({"a":)" + entry("F32", "[4]", 0, 16) + "}", 8), checkpoint_errc::offsets_past_end, "a"},
      {"duplicate tensor name", raw_safetensors("{" + ok_a + "," + ok_a + "}", 8), checkpoint_errc::duplicate_tensor, "a"},
      {"field given twice", raw_safetensors(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), checkpoint_errc::malformed_entry, "a"},
      {"metadata key twice", raw_safetensors(R"({"__metadata__":{"k":"1","k":"2"}})", 0), checkpoint_errc::malformed_entry, {}},
      {"float in shape", raw_safetensors(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), checkpoint_errc::malformed_entry, "a"},
      {"offset past 2^64", raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})", 8), checkpoint_errc::malformed_entry, "a"},
      {"nesting past the limit in an unknown field",
       raw_safetensors(R"({"a":{"x":)" + std::string(max_header_depth, '[') + std::string(max_header_depth, ']') + "," + entry("F32", "[2]", 0, 8).substr(1) + "}", 8),
       checkpoint_errc::header_too_deep, {}},
  };
}

TEST(Safetensors, EveryBadInputGetsItsNamedError) {
  scratch_dir dir;
  std::set<checkpoint_errc> covered;
  for (const auto& c : bad_cases()) {
    SCOPED_TRACE(c.label);
    const fs::path p = dir / "bad.safetensors";
    write_bytes(p, c.bytes);
    expect_problem([&] { safetensors_file f(p); }, c.problem, p.string(), c.tensor);
    expect_problem([&] { checkpoint ck(p); }, c.problem, p.string(), c.tensor);
    // The same rules hold for an in-memory buffer, and reading writes nothing.
    const std::vector<std::byte> mem = bytes_of(c.bytes);
    expect_problem([&] { safetensors_view v(mem, "buffer"); }, c.problem, "buffer", c.tensor);
    EXPECT_EQ(dir.entries(), std::set<std::string>{"bad.safetensors"});
    covered.insert(c.problem);
  }
  for (auto p : {checkpoint_errc::file_too_short, checkpoint_errc::header_length_past_end, checkpoint_errc::header_length_absurd,
                 checkpoint_errc::malformed_json, checkpoint_errc::malformed_entry, checkpoint_errc::unknown_dtype,
                 checkpoint_errc::shape_size_mismatch, checkpoint_errc::offsets_reversed, checkpoint_errc::offsets_overlap,
                 checkpoint_errc::offsets_gap, checkpoint_errc::offsets_past_end, checkpoint_errc::duplicate_tensor,
                 checkpoint_errc::header_too_deep})
    EXPECT_TRUE(covered.count(p)) << checkpoint_errc_name(p);
}

TEST(Safetensors, UnknownFieldsNestedWithinTheLimitAreSkipped) {
  const std::string nested = std::string(max_header_depth - 3, '[') + std::string(max_header_depth - 3, ']');
  const std::string bytes = raw_safetensors(R"({"a":{"x":)" + nested + R"(,"y":{"z":[1,{"w":null}]},)" + entry("F32", "[2]", 0, 8).substr(1) + "}", 8);
  const std::vector<std::byte> mem = bytes_of(bytes);
  const safetensors_view v(mem, "nested");
  EXPECT_EQ(v.manifest().size(), 1u);
  EXPECT_EQ(v.tensor("a").shape(), (shape_t{2}));
}

// The header parse is one linear pass (the duplicate-name check once rescanned the object after
// every entry: 100 K tensors took 150 s). Timed against 10 K tensors in the same run, the two sizes
// interleaved so that a busy neighbour slows both:
// - a quadratic duplicate check takes ~370x as long for 10x the entries (217x for a plain scan of
//   the entries per key, tried again when this bound was set);
// - today's linear parse takes 23-25x on an idle machine, not 10x, because the name hash set and the
//   name sort outgrow the caches (1.2 us per entry at 12.5 K, 2.3 us at 100 K, 3.9 us at 400 K); a
//   loaded CI run measured 37x, which failed the old bound of 30x.
// The bound of 100x sits between the two, with a margin of 2-3x on either side.
TEST(Safetensors, HeaderParseIsLinearIn100KTensors) {
  auto header_of = [](std::size_t n) {
    std::string h = "{";
    for (std::size_t i = 0; i < n; ++i)
      h += (i ? "," : "") + std::string(R"("model.layers.)") + std::to_string(i) + R"(.weight":)" + entry("U8", "[1]", i, i + 1);
    return raw_safetensors(h + "}", n);
  };
  auto parse_seconds = [](const std::vector<std::byte>& mem, std::size_t n) {
    const auto t0 = std::chrono::steady_clock::now();
    const safetensors_view v(mem, "big");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(v.manifest().size(), n);
    return s;
  };
  constexpr std::size_t n_small = 10'000, n_big = 100'000;
  const auto small = bytes_of(header_of(n_small)), big = bytes_of(header_of(n_big));
  double t_small = 1e9, t_big = 1e9;
  for (int k = 0; k < 3; ++k) {  // best of 3, interleaved
    t_small = std::min(t_small, parse_seconds(small, n_small));
    t_big = std::min(t_big, parse_seconds(big, n_big));
  }
  std::printf("safetensors header parse: 10 K tensors %.3f s, 100 K tensors %.3f s (%.1fx for 10x the entries)\n", t_small, t_big,
              t_big / t_small);
  EXPECT_LT(t_big, 100 * t_small) << "header parse is not linear in the tensor count";
}

TEST(Safetensors, ErrorsCarryTheirCategory) {
  const std::string bytes = raw_safetensors(R"({"a":)" + entry("F4", "[2]", 0, 8) + "}", 8);
  const std::vector<std::byte> mem = bytes_of(bytes);
  try {
    safetensors_view v(mem, "x.safetensors");
    FAIL();
  } catch (const error& e) {  // catchable as the library's one error type
    EXPECT_EQ(e.code(), errc::unsupported);
    EXPECT_EQ(e.where().field, "dtype");
    EXPECT_NE(std::string(e.what()).find("'F4'"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, MissingFileIsAnIoError) {
  scratch_dir dir;
  try {
    safetensors_file f(dir / "absent.safetensors");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::io);
    EXPECT_EQ(e.where().file, (dir / "absent.safetensors").string());
  }
}

// ---- atomic writes -------------------------------------------------------------------------

TEST(SafetensorsWrite, AbortedWriteLeavesNothingAndKeepsTheOldFile) {
  scratch_dir dir;
  const tensor_set s = every_dtype_set();
  const auto views = s.views();
  const fs::path target = dir / "m.safetensors";
  struct abort_write {};
  auto abort_midway = [](std::uint64_t done, std::uint64_t) {
    if (done > 0) throw abort_write{};
  };
  EXPECT_THROW(write_safetensors(target, views, {}, abort_midway), abort_write);
  EXPECT_EQ(dir.entries(), std::set<std::string>{}) << "no target, no temporary";

  write_safetensors(target, views, {{"v", "1"}});
  const auto before = read_bytes(target);
  std::vector<tensor_view> other(views.begin(), views.begin() + 3);
  EXPECT_THROW(write_safetensors(target, other, {{"v", "2"}}, abort_midway), abort_write);
  EXPECT_EQ(read_bytes(target), before);
  EXPECT_EQ(dir.entries(), std::set<std::string>{"m.safetensors"});
}

TEST(SafetensorsWrite, DiskFullLeavesNothing) {
  // RLIMIT_FSIZE makes write(2) fail with EFBIG past the limit: a real I/O failure mid-file.
  scratch_dir dir;
  std::vector<std::byte> big(1 << 20, std::byte{0x5A});
  std::vector<tensor_view> views{tensor_view("big", dtype::U8, {big.size()}, big)};
  struct rlimit old {};
  ASSERT_EQ(0, ::getrlimit(RLIMIT_FSIZE, &old));
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 * 1024;
  ASSERT_EQ(0, ::setrlimit(RLIMIT_FSIZE, &lim));
  try {
    write_safetensors(dir / "m.safetensors", views);
    ADD_FAILURE() << "write past RLIMIT_FSIZE succeeded";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::io) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(dir.entries(), std::set<std::string>{});
}

TEST(SafetensorsWrite, RefusesBadNamesBeforeWritingAnything) {
  scratch_dir dir;
  std::vector<std::byte> b(4);
  for (auto names : {std::vector<std::string>{"a", "a"}, std::vector<std::string>{""}, std::vector<std::string>{"__metadata__"}}) {
    std::vector<tensor_view> v;
    for (auto& n : names) v.emplace_back(n, dtype::F32, shape_t{1}, std::span<const std::byte>(b));
    try {
      write_safetensors(dir / "m.safetensors", v);
      ADD_FAILURE() << "accepted bad names";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
      EXPECT_EQ(e.where().field, "name");
    }
  }
  EXPECT_EQ(dir.entries(), std::set<std::string>{});
}

TEST(SafetensorsWrite, RefusesInvalidUtf8BeforeWritingAnything) {
  scratch_dir dir;
  std::vector<std::byte> b(4);
  std::vector<tensor_view> v{tensor_view("a", dtype::F32, {1}, b)};
  try {
    write_safetensors(dir / "m.safetensors", v, {{"key", "\xff\xfe"}});
    ADD_FAILURE() << "accepted invalid UTF-8";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_EQ(e.where().file, (dir / "m.safetensors").string());
  }
  EXPECT_EQ(dir.entries(), std::set<std::string>{});
}

// ---- properties ------------------------------------------------------------------------------

tensor_set random_set() {
  tensor_set s;
  const auto n = *rc::gen::inRange<std::size_t>(0, 7);
  for (std::size_t i = 0; i < n; ++i) {
    const dtype t = all_dtypes[*rc::gen::inRange<std::size_t>(0, dtype_count)];
    const auto rank = *rc::gen::inRange<std::size_t>(0, 4);
    shape_t shape = *rc::gen::container<shape_t>(rank, rc::gen::inRange<std::uint64_t>(0, 6));
    std::string name = *rc::gen::container<std::string>(rc::gen::elementOf(std::string("ab.0_")));
    name += "#" + std::to_string(i);  // unique, and exercises byte-wise ordering against digits
    const std::size_t bytes = element_count(shape) * element_size(t);
    auto raw = *rc::gen::container<std::vector<std::uint8_t>>(bytes, rc::gen::arbitrary<std::uint8_t>());
    s.items.push_back({std::move(name), t, std::move(shape), bytes_of(raw)});
  }
  return s;
}

RC_GTEST_PROP(SafetensorsProperty, SerializeParseIsTheIdentityOnBits, ()) {
  const tensor_set s = random_set();
  const auto text = rc::gen::container<std::string>(rc::gen::inRange<char>(0x20, 0x7F));  // JSON escapes '"' and '\\'
  const auto meta = *rc::gen::container<std::map<std::string, std::string>>(text, text);
  const metadata_map m(meta.begin(), meta.end());
  const auto bytes = serialize_safetensors(s.views(), m);
  const safetensors_view v(bytes, "mem");
  RC_ASSERT(v.manifest().size() == s.items.size());
  RC_ASSERT(v.metadata() == m);
  for (const auto& it : s.items) {
    const auto t = v.tensor(it.name);
    RC_ASSERT(t.type() == it.type);
    RC_ASSERT(t.shape() == it.shape);
    RC_ASSERT(t.bytes().size() == it.bytes.size());
    RC_ASSERT(same_bytes(t.bytes(), it.bytes));
  }
}

RC_GTEST_PROP(SafetensorsProperty, EveryTruncationIsRefusedByName, ()) {
  const tensor_set s = random_set();
  const auto bytes = serialize_safetensors(s.views());
  const auto cut = *rc::gen::inRange<std::size_t>(0, bytes.size());
  std::span<const std::byte> prefix(bytes.data(), cut);
  try {
    safetensors_view v(prefix, "cut");
    RC_FAIL("a truncated file was accepted");
  } catch (const checkpoint_error& e) {
    RC_ASSERT(e.where().file == std::string("cut"));
  }
}

}  // namespace
}  // namespace bitrefit::io::test
