// Example-based tests of the codec: frame layout, location codings, apply rules, attestation,
// bundles. Properties over random inputs live in test_codec_properties.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "bitrefit/codec/codec.hpp"

using namespace bitrefit;
using namespace bitrefit::codec;

namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

struct one_tensor {
  std::string name = "w";
  dtype type = dtype::BF16;
  std::vector<std::byte> old_b, new_b;
  std::uint64_t n() const { return old_b.size() / element_size(type); }
  chunk_piece piece() const { return {name, type, n(), 0, n(), old_b, new_b}; }
};

std::vector<std::byte> encode_one(const one_tensor& t, mode_policy p, encode_stats* st = nullptr) {
  chunk_encoder<> enc(encode_options{.policy = p});
  byte_buffer out;
  chunk_piece pc = t.piece();
  enc.encode(frame_header{frame_kind::delta, payload_id{{1, 2}, 3, 4}, 7, 8}, std::span(&pc, 1), out, st);
  return {out.data(), out.data() + out.size()};
}

}  // namespace

TEST(Frame, HeaderFieldsRoundTrip) {
  one_tensor t;
  t.old_b = random_bytes(2000, 1);
  t.new_b = t.old_b;
  t.new_b[10] ^= std::byte{1};
  auto f = encode_one(t, mode_policy::xor_allowed);
  auto v = frame_view::parse(f);
  EXPECT_EQ(v.header().id, (payload_id{{1, 2}, 3, 4}));
  EXPECT_EQ(v.header().base_version, 7u);
  EXPECT_EQ(v.header().target_version, 8u);
  ASSERT_EQ(v.items().size(), 1u);
  EXPECT_EQ(v.items()[0].changed, 1u);
  EXPECT_EQ(v.items()[0].tensor, "w");
  EXPECT_EQ(std::memcmp(f.data(), "BRFP", 4), 0);
}

TEST(Frame, ApplyXorAndOverwrite) {
  for (auto p : {mode_policy::xor_allowed, mode_policy::xor_only, mode_policy::overwrite_only}) {
    one_tensor t;
    t.old_b = random_bytes(4096, 2);
    t.new_b = t.old_b;
    for (int i = 0; i < 4096; i += 37) t.new_b[i] ^= std::byte{0x5a};
    auto f = encode_one(t, p);
    auto target = t.old_b;
    target_map tm({mutable_tensor_view("w", dtype::BF16, {2048}, target)});
    frame_applier<> ap;
    ap.apply(f, tm);
    EXPECT_EQ(target, t.new_b);
  }
}

TEST(Frame, OverwriteTwiceEqualsOnce) {
  one_tensor t;
  t.old_b = random_bytes(1024, 3);
  t.new_b = random_bytes(1024, 4);
  auto f = encode_one(t, mode_policy::overwrite_only);
  auto target = t.old_b;
  target_map tm({mutable_tensor_view("w", dtype::BF16, {512}, target)});
  frame_applier<> ap;
  ap.apply(f, tm);
  ap.apply(f, tm);
  EXPECT_EQ(target, t.new_b);
}

TEST(Frame, RejectsWrongTargetWithoutWriting) {
  one_tensor t;
  t.old_b = random_bytes(1024, 5);
  t.new_b = random_bytes(1024, 6);
  auto f = encode_one(t, mode_policy::overwrite_only);
  auto target = t.old_b;
  frame_applier<> ap;
  {
    target_map tm({mutable_tensor_view("other", dtype::BF16, {512}, target)});
    EXPECT_THROW(ap.apply(f, tm), error);
  }
  {
    target_map tm({mutable_tensor_view("w", dtype::F16, {512}, target)});
    try {
      ap.apply(f, tm);
      FAIL();
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::mismatch);
      EXPECT_EQ(e.where().tensor, "w");
    }
  }
  EXPECT_EQ(target, t.old_b);
}

TEST(Location, EveryCodingRoundTrips) {
  std::vector<std::uint32_t> pos{0, 1, 2, 300, 301, 70000, 70001, 70002, 99999};
  const std::uint64_t m = 100000;
  for (auto c : {location_coding::runs, location_coding::gaps8, location_coding::gaps16, location_coding::gaps32,
                 location_coding::bitmap}) {
    byte_buffer raw;
    encode_locations(c, pos, m, raw);
    EXPECT_LE(raw.size(), max_location_raw_size(c, m, pos.size()));
    std::vector<std::uint32_t> back(pos.size());
    decode_locations(c, raw.span(), m, back, {});
    EXPECT_EQ(back, pos) << to_string(c);
  }
}

TEST(Location, ChoosesByDensity) {
  std::vector<std::uint32_t> all(100);
  for (std::uint32_t i = 0; i < 100; ++i) all[i] = i;
  EXPECT_EQ(choose_location_coding(all, 100), location_coding::all);
  EXPECT_EQ(choose_location_coding(std::span(all).first(50), 100), location_coding::runs);
  std::vector<std::uint32_t> dense;
  for (std::uint32_t i = 0; i < 1000; i += 3) dense.push_back(i);
  EXPECT_EQ(choose_location_coding(dense, 1000), location_coding::bitmap);
  std::vector<std::uint32_t> sparse;
  for (std::uint32_t i = 0; i < 100000; i += 31) sparse.push_back(i);
  EXPECT_EQ(choose_location_coding(sparse, 100000), location_coding::gaps8);
  std::vector<std::uint32_t> very_sparse;
  for (std::uint32_t i = 0; i < 10000000; i += 3001) very_sparse.push_back(i);
  EXPECT_EQ(choose_location_coding(very_sparse, 10000000), location_coding::gaps16);
}

TEST(Attestation, DigestDependsOnEveryField) {
  auto a = random_bytes(200000, 7);
  tensor_view t1("a", dtype::BF16, {100000}, a);
  const digest128 d = attestation_digest(std::span(&t1, 1));
  EXPECT_EQ(d, attestation_digest(std::span(&t1, 1)));
  auto b = a;
  b[150000] ^= std::byte{1};
  tensor_view t2("a", dtype::BF16, {100000}, b);
  EXPECT_NE(d, attestation_digest(std::span(&t2, 1)));
  tensor_view t3("a", dtype::F16, {100000}, a);
  EXPECT_NE(d, attestation_digest(std::span(&t3, 1)));
  tensor_view t4("a", dtype::BF16, {1000, 100}, a);
  EXPECT_NE(d, attestation_digest(std::span(&t4, 1)));
  tensor_view t5("b", dtype::BF16, {100000}, a);
  EXPECT_NE(d, attestation_digest(std::span(&t5, 1)));
}

TEST(Attestation, MatchesIndependentComputation) {
  // Independent re-statement of the definition with XXH3 one-shot over a concatenation.
  auto a = random_bytes(3 * 65536 + 100, 8);
  shape_t shape{static_cast<std::uint64_t>(a.size())};
  tensor_view t("x", dtype::U8, shape, a);
  std::vector<std::byte> msg;
  auto u64 = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) msg.push_back(static_cast<std::byte>(v >> (8 * i)));
  };
  auto str = [&](std::string_view s) {
    u64(s.size());
    for (char c : s) msg.push_back(static_cast<std::byte>(c));
  };
  str("x");
  str("U8");
  u64(1);
  u64(a.size());
  u64(1);
  u64(0);
  u64(a.size());
  u64(4);
  for (std::size_t off = 0; off < a.size(); off += 65536) {
    XXH128_hash_t h = XXH3_128bits(a.data() + off, std::min<std::size_t>(65536, a.size() - off));
    u64(h.low64);
    u64(h.high64);
  }
  EXPECT_EQ(attestation_digest(std::span(&t, 1)), xxh3_128(msg));
}

TEST(Attestation, SubsetOfRanges) {
  auto a = random_bytes(400000, 9);
  shape_t s{200000};
  // a receiver holding [0,50000) and [120000,200000) attests over exactly those
  std::vector<attested_range> rs{{"t", dtype::BF16, &s, 120000, 200000, std::span<const std::byte>(a).subspan(240000)},
                                 {"t", dtype::BF16, &s, 0, 50000, std::span<const std::byte>(a).first(100000)}};
  const auto d = attestation_digest(rs);
  auto b = a;
  b[150000] ^= std::byte{1};  // element 75000: not held
  std::vector<attested_range> rs2{{"t", dtype::BF16, &s, 0, 50000, std::span<const std::byte>(b).first(100000)},
                                  {"t", dtype::BF16, &s, 120000, 200000, std::span<const std::byte>(b).subspan(240000)}};
  EXPECT_EQ(d, attestation_digest(rs2));
  b[250000] ^= std::byte{1};  // element 125000: held
  EXPECT_NE(d, attestation_digest(rs2));
  // the whole tensor equals the single declared range [0, n)
  tensor_view tv("t", dtype::BF16, s, a);
  std::vector<attested_range> whole{{"t", dtype::BF16, &s, 0, 200000, a}};
  EXPECT_EQ(attestation_digest(std::span(&tv, 1)), attestation_digest(whole));
}

TEST(Chunks, PlanRespectsBoundAndCoversEverything) {
  model_manifest m({{"a", dtype::F32, {1000}}, {"b", dtype::BF16, {10, 333}}, {"c", dtype::U8, {7}}});
  auto plan = plan_chunks(m, 1024);
  std::uint64_t covered = 0;
  for (auto& ch : plan) {
    std::uint64_t bytes = 0;
    for (auto& r : ch) bytes += r.size() * element_size(m.at(r.tensor).type);
    EXPECT_LE(bytes, 1024u);
    covered += bytes;
  }
  EXPECT_EQ(covered, m.total_bytes());
  EXPECT_EQ(plan, plan_chunks(m, 1024));
}

TEST(Bundle, FileAndDirectoryRoundTripAndApply) {
  std::vector<std::vector<std::byte>> old_b{random_bytes(300000, 10), random_bytes(1000, 11)};
  auto new_b = old_b;
  for (std::size_t i = 0; i < new_b[0].size(); i += 101) new_b[0][i] ^= std::byte{3};
  new_b[1][5] ^= std::byte{0x80};
  std::vector<tensor_view> base{tensor_view("layer.w", dtype::BF16, {150000}, old_b[0]),
                                tensor_view("layer.b", dtype::F32, {250}, old_b[1])};
  std::vector<tensor_view> target{tensor_view("layer.w", dtype::BF16, {150000}, new_b[0]),
                                  tensor_view("layer.b", dtype::F32, {250}, new_b[1])};
  auto b = make_delta_bundle(base, target, 4, 5, encode_options{.max_frame_input_bytes = 65536}, 2);
  EXPECT_GT(b.frames.size(), 4u);
  auto b1 = make_delta_bundle(base, target, 4, 5, encode_options{.max_frame_input_bytes = 65536}, 1);
  EXPECT_EQ(b.frames, b1.frames);  // thread count does not change bytes
  const auto dir = std::filesystem::temp_directory_path() / ("bitrefit_codec_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  write_bundle_file(b, dir / "delta.brfb");
  write_bundle_directory(b, dir / "delta.d");
  for (auto p : {dir / "delta.brfb", dir / "delta.d"}) {
    auto r = read_bundle(p);
    EXPECT_EQ(r.manifest, b.manifest);
    EXPECT_EQ(r.frames, b.frames);
    auto work = old_b;
    std::vector<mutable_tensor_view> tv{mutable_tensor_view("layer.w", dtype::BF16, {150000}, work[0]),
                                        mutable_tensor_view("layer.b", dtype::F32, {250}, work[1])};
    apply_bundle(r, tv);
    EXPECT_EQ(work, new_b);
    // applying again: base digest no longer matches -> refused, nothing written
    auto before = work;
    EXPECT_THROW(apply_bundle(r, tv), error);
    EXPECT_EQ(work, before);
  }
  // corrupt one byte of the file: read refuses
  auto bytes = detail::read_all(dir / "delta.brfb");
  bytes[bytes.size() - 10] ^= std::byte{1};
  {
    std::ofstream o(dir / "bad.brfb", std::ios::binary);
    o.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_THROW(read_bundle(dir / "bad.brfb"), error);
  std::filesystem::remove_all(dir);
}

TEST(Bundle, RefusesBadInputsWithTargetUntouched) {
  std::vector<std::byte> o = random_bytes(20000, 20), n = o;
  for (std::size_t i = 0; i < n.size(); i += 50) n[i] ^= std::byte{1};
  std::vector<tensor_view> base{tensor_view("t", dtype::BF16, {10000}, o)};
  std::vector<tensor_view> target{tensor_view("t", dtype::BF16, {10000}, n)};
  const auto b = make_delta_bundle(base, target, 0, 1, encode_options{.max_frame_input_bytes = 4096});
  auto expect_refused = [&](const delta_bundle& bad, std::vector<mutable_tensor_view> tv, errc code) {
    std::vector<std::vector<std::byte>> before;
    for (auto& t : tv) before.emplace_back(t.bytes().begin(), t.bytes().end());
    try {
      apply_bundle(bad, tv);
      ADD_FAILURE() << "accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
    for (std::size_t i = 0; i < tv.size(); ++i)
      EXPECT_TRUE(std::equal(tv[i].bytes().begin(), tv[i].bytes().end(), before[i].begin()));
  };
  auto w = o;
  {  // a frame truncated
    auto bad = b;
    bad.frames[1].pop_back();
    expect_refused(bad, {mutable_tensor_view("t", dtype::BF16, {10000}, w)}, errc::integrity);
  }
  {  // a frame corrupted in the last frame only: nothing of the earlier frames may be written
    auto bad = b;
    bad.frames.back()[70] ^= std::byte{4};
    expect_refused(bad, {mutable_tensor_view("t", dtype::BF16, {10000}, w)}, errc::integrity);
    bad.manifest.frames.back().digest = xxh3_128(bad.frames.back());  // manifest agrees; frame digest does not
    bad.manifest.frames.back().size = bad.frames.back().size();
    expect_refused(bad, {mutable_tensor_view("t", dtype::BF16, {10000}, w)}, errc::integrity);
  }
  {  // wrong base
    auto other = w;
    other[3] ^= std::byte{1};
    expect_refused(b, {mutable_tensor_view("t", dtype::BF16, {10000}, other)}, errc::mismatch);
  }
  {  // another tensor set
    expect_refused(b, {mutable_tensor_view("u", dtype::BF16, {10000}, w)}, errc::mismatch);
    expect_refused(b, {mutable_tensor_view("t", dtype::F16, {10000}, w)}, errc::mismatch);
    expect_refused(b, {mutable_tensor_view("t", dtype::BF16, {100, 100}, w)}, errc::mismatch);
  }
  EXPECT_EQ(w, o);
  apply_bundle(b, std::vector<mutable_tensor_view>{mutable_tensor_view("t", dtype::BF16, {10000}, w)});
  EXPECT_EQ(w, n);
}

TEST(Frame, ErrorsNameTheProblem) {
  one_tensor t;
  t.old_b = random_bytes(2000, 30);
  t.new_b = random_bytes(2000, 31);
  auto f = encode_one(t, mode_policy::xor_allowed);
  auto expect = [&](std::vector<std::byte> bad, errc code, std::string_view field) {
    try {
      (void)frame_view::parse(bad, "payload-0");
      ADD_FAILURE() << "accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_EQ(e.where().field, field) << e.what();
      EXPECT_EQ(e.where().file, "payload-0");
    }
  };
  auto bad = f;
  bad[0] = std::byte{'X'};
  expect(bad, errc::format, "magic");
  bad = f;
  bad[4] = std::byte{9};
  expect(bad, errc::unsupported, "format_version");
  bad = f;
  bad.pop_back();
  expect(bad, errc::integrity, "frame_size");
  bad = f;
  bad[100] ^= std::byte{1};
  expect(bad, errc::integrity, "digest");
  bad = f;
  bad.resize(10);
  expect(bad, errc::integrity, "size");
}
