// Hostile inputs to the codec's decoders (label codec): the hardening findings kept in the fuzz
// corpus (tests/fuzz/corpus/*/crash-*) and each resource bound of codec/frame.hpp, codec/apply.hpp
// and codec/bundle.hpp. Every one is refused by name, with a bounded allocation measured by an
// allocation meter (this binary's operator new), the target untouched and no scratch kept.
#include <gtest/gtest.h>
#include <zstd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "../fuzz/reseal.hpp"
#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/bundle.hpp"
#include "bitrefit/codec/encoder.hpp"

// ---- allocation meter: every operator new of this test binary is counted --------------------------
namespace {
std::atomic<std::size_t> live_bytes{0}, peak_bytes{0};
std::atomic<std::size_t> fail_above{~std::size_t{0}};  // simulated allocation failure for larger requests
constexpr std::size_t header = 16;                     // keeps malloc's 16-byte alignment

void* metered_new(std::size_t n) {
  if (n > fail_above.load()) throw std::bad_alloc();
  void* p = std::malloc(n + header);
  if (!p) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = n;
  const std::size_t now = live_bytes += n;
  for (std::size_t old = peak_bytes.load(); now > old && !peak_bytes.compare_exchange_weak(old, now);) {
  }
  return static_cast<char*>(p) + header;
}
void metered_delete(void* p) noexcept {
  if (!p) return;
  char* b = static_cast<char*>(p) - header;
  live_bytes -= *reinterpret_cast<std::size_t*>(b);
  std::free(b);
}
}  // namespace

void* operator new(std::size_t n) { return metered_new(n); }
void* operator new[](std::size_t n) { return metered_new(n); }
void operator delete(void* p) noexcept { metered_delete(p); }
void operator delete[](void* p) noexcept { metered_delete(p); }
void operator delete(void* p, std::size_t) noexcept { metered_delete(p); }
void operator delete[](void* p, std::size_t) noexcept { metered_delete(p); }
// the nothrow forms too (std::get_temporary_buffer, e.g. under stable_sort, allocates with them and
// frees with the plain delete above; under ASan they would otherwise be the sanitizer's own)
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return metered_new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return metered_new(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { metered_delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { metered_delete(p); }

namespace {

using namespace bitrefit;
using namespace bitrefit::codec;
namespace fs = std::filesystem;

/// Bytes allocated at the peak of f(), beyond what was live when it started.
template <class F>
std::size_t peak_during(F&& f) {
  const std::size_t base = live_bytes.load();
  peak_bytes = base;
  f();
  return peak_bytes.load() - base;
}

std::vector<std::byte> corpus_file(const std::string& target, const std::string& name) {
  const fs::path p = fs::path(BITREFIT_SOURCE_DIR) / "tests/fuzz/corpus" / target / name;
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto b = std::as_bytes(std::span(c));
  return {b.begin(), b.end()};
}

/// A one-tensor model (pattern bytes) as a target map.
struct model {
  std::vector<std::byte> bytes;
  target_map targets;
  model(std::string name, dtype t, std::uint64_t elements) : bytes(elements * element_size(t)) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
    targets = target_map({mutable_tensor_view(std::move(name), t, {elements}, bytes)});
  }
};

/// The applier's outcome on `frame`: the error (code, field), the peak bytes allocated, and that the
/// target kept its bits and the applier kept no scratch.
struct refusal {
  errc code{};
  std::string field, message;
  std::size_t peak = 0;
};
refusal refuse(frame_applier<>& ap, std::span<const std::byte> frame, model& m) {
  const auto before = m.bytes;
  refusal r;
  bool threw = false;
  r.peak = peak_during([&] {
    try {
      ap.apply(frame, m.targets, "hostile.frame");
    } catch (const error& e) {
      threw = true;
      r.code = e.code();
      r.field = e.where().field;
      r.message = e.what();
      EXPECT_EQ(e.where().file, "hostile.frame");
    }
  });
  EXPECT_TRUE(threw) << "frame accepted";
  EXPECT_TRUE(m.bytes == before) << "a refused frame wrote to the target";
  EXPECT_EQ(ap.scratch_bytes(), 0u) << "a refused frame left scratch behind";
  return r;
}

/// A frame of one item assembled by write_frame: `it` with its value section `values` (location
/// section empty: coding `all`).
std::vector<std::byte> one_item_frame(frame_item it, std::span<const std::byte> values) {
  it.location_raw_size = it.location_stored_size = 0;
  it.value_stored_size = values.size();
  const std::span<const std::byte> sections[] = {{}, values};
  byte_buffer out;
  write_frame({frame_kind::delta, payload_id{{1, 1}, 0, 0}, 0, 1}, std::span(&it, 1), sections, out);
  return {out.data(), out.data() + out.size()};
}

std::vector<std::byte> zstd_of_zeros(std::size_t n) {
  const std::vector<std::byte> zeros(n);
  std::vector<std::byte> out(ZSTD_compressBound(n));
  const std::size_t c = ZSTD_compress(out.data(), out.size(), zeros.data(), n, 3);
  EXPECT_FALSE(ZSTD_isError(c));
  out.resize(c);
  return out;
}

/// A dense F32 item covering 2^24 elements (64 MiB of input: exactly the format's limit).
frame_item limit_item() {
  frame_item it;
  it.tensor = "w";
  it.type = dtype::F32;
  it.mode = value_mode::overwrite;
  it.locations = location_coding::all;
  it.value_compression = section_compression::zstd;
  it.tensor_elements = it.end = it.changed = std::uint64_t{1} << 24;
  it.value_raw_size = it.changed * 4;
  return it;
}

// ---- the findings --------------------------------------------------------------------------------

TEST(HostileFrames, FindingBombFramesAreRefusedByNameBeforeAnyAllocation) {
  frame_applier<> ap;
  model m("t0", dtype::F64, 16);
  for (const char* name : {"crash-frame_bomb_1GiB", "crash-frame_bomb_16GiB", "crash-frame_bomb_64items"}) {
    SCOPED_TRACE(name);
    const auto raw = corpus_file("fuzz_frame", name);
    const refusal as_is = refuse(ap, raw, m);
    EXPECT_FALSE(as_is.field.empty()) << as_is.message;
    // resealed (declared size and digest made valid, as the fuzz target does): the declared
    // element counts are refused by the input bound before a byte of scratch exists
    const refusal sealed = refuse(ap, fuzz::reseal_frame(raw), m);
    EXPECT_EQ(sealed.code, errc::format) << sealed.message;
    EXPECT_EQ(sealed.field, "range") << sealed.message;
    EXPECT_LT(sealed.peak, 64u << 10) << sealed.message;
  }
}

TEST(HostileBundles, FindingFloatSizeIsRefusedByName) {
  const auto raw = fuzz::reseal_bundle(corpus_file("fuzz_bundle", "crash-bundle_manifest_float_size"));
  try {
    read_bundle_bytes(raw, "crash.bundle");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format) << e.what();
    EXPECT_EQ(e.where().field, "frames.size") << e.what();
    EXPECT_EQ(e.where().file, "crash.bundle");
  }
}

// ---- frame bounds --------------------------------------------------------------------------------

TEST(HostileFrames, InputAboveTheFormatLimitIsRefusedByParse) {
  const auto sec = zstd_of_zeros(16);
  frame_item it = limit_item();
  const auto at_limit = one_item_frame(it, sec);
  // one element more than the limit: write_frame refuses to make it, parse refuses to read it
  it.tensor_elements = it.end = it.changed = it.changed + 1;
  it.value_raw_size = it.changed * 4;
  EXPECT_THROW(one_item_frame(it, sec), error);
  auto over = at_limit;
  for (std::size_t off : {std::size_t{64 + 2 + 1 + 8}, std::size_t{64 + 2 + 1 + 8 + 16}, std::size_t{64 + 2 + 1 + 8 + 24}})
    fuzz::put_u64_le(over.data() + off, (std::uint64_t{1} << 24) + 1);  // tensor_elements, end, changed
  fuzz::put_u64_le(over.data() + 64 + 2 + 1 + 8 + 48, ((std::uint64_t{1} << 24) + 1) * 4);  // value_raw_size
  try {
    frame_view::parse(fuzz::reseal_frame(over));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where().field, "range") << e.what();
  }
  EXPECT_NO_THROW(frame_view::parse(at_limit));
}

TEST(HostileFrames, ZstdSectionMustRecordTheDeclaredSizeAndIsCheckedBeforeAllocating) {
  // declares 64 MiB of values, carries a zstd frame of 16 bytes: refused from the zstd header alone
  const auto frame = one_item_frame(limit_item(), zstd_of_zeros(16));
  frame_applier<> ap;
  model m("w", dtype::F32, std::uint64_t{1} << 24);
  const refusal r = refuse(ap, frame, m);
  EXPECT_EQ(r.code, errc::format);
  EXPECT_EQ(r.field, "values");
  EXPECT_NE(r.message.find("zstd"), std::string::npos) << r.message;
  EXPECT_LT(r.peak, 64u << 10) << "scratch was allocated for the declared size before the section was checked";
  // a section that is not a zstd frame at all, or has bytes after its frame
  frame_item it = limit_item();
  it.tensor_elements = it.end = it.changed = 4;
  it.value_raw_size = 16;
  auto sec = zstd_of_zeros(16);
  sec.push_back(std::byte{0});
  model small("w", dtype::F32, 4);
  EXPECT_EQ(refuse(ap, one_item_frame(it, sec), small).field, "values");
  const std::byte junk[8] = {};
  EXPECT_EQ(refuse(ap, one_item_frame(it, junk), small).field, "values");
}

TEST(HostileFrames, TargetIsMatchedBeforeAnySectionIsDecoded) {
  // an honest decompression bomb inside the bound: 64 MiB of zeros in a ~2 KiB section, for a
  // tensor this target does not have. Refused by name, nothing decoded, nothing allocated.
  const auto frame = one_item_frame(limit_item(), zstd_of_zeros(std::size_t{64} << 20));
  EXPECT_LT(frame.size(), 16u << 10);
  frame_applier<> ap;
  model other("not_w", dtype::F32, 4);
  const refusal r = refuse(ap, frame, other);
  EXPECT_EQ(r.code, errc::mismatch);
  EXPECT_LT(r.peak, 64u << 10) << "the frame was decoded before its target was checked";
  EXPECT_THROW(ap.verify(frame, other.targets), error);
  EXPECT_EQ(ap.scratch_bytes(), 0u);
}

TEST(HostileFrames, RefusedFrameReleasesScratchAndAllocationFailureIsANamedError) {
  // a frame whose raw gap section is nothing but escapes: refused while decoding, i.e. after the
  // scratch was allocated; the scratch must not outlive the refusal
  frame_item it;
  it.tensor = "w";
  it.type = dtype::BF16;
  it.mode = value_mode::overwrite;
  it.locations = location_coding::gaps8;
  it.tensor_elements = it.end = 4096;
  it.changed = 2;
  it.value_raw_size = it.value_stored_size = 4;
  const std::byte escapes[3] = {std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}};
  const std::byte values[4] = {};
  it.location_raw_size = it.location_stored_size = sizeof escapes;
  const std::span<const std::byte> sections[] = {escapes, values};
  byte_buffer bad;
  write_frame({frame_kind::delta, payload_id{{1, 1}, 0, 0}, 0, 1}, std::span(&it, 1), sections, bad);
  frame_applier<> ap;
  model m("w", dtype::BF16, 4096);
  const refusal r = refuse(ap, bad.span(), m);
  EXPECT_EQ(r.code, errc::format);
  EXPECT_EQ(r.field, "locations");
  // a real frame of 4096 BF16 elements, every 13th changed
  std::vector<std::byte> old_b(4096 * 2), new_b(4096 * 2);
  for (std::size_t i = 0; i < old_b.size(); ++i) old_b[i] = new_b[i] = static_cast<std::byte>(i);
  for (std::size_t i = 0; i < new_b.size(); i += 26) new_b[i] ^= std::byte{1};
  chunk_encoder<> enc;
  const chunk_piece pc{"w", dtype::BF16, 4096, 0, 4096, old_b, new_b};
  byte_buffer out;
  enc.encode({frame_kind::delta, payload_id{{1, 1}, 0, 0}, 0, 1}, std::span(&pc, 1), out);
  const std::vector<std::byte> good(out.data(), out.data() + out.size());
  // the intact frame applies; with allocations above 1 KiB failing, it is refused by name instead
  EXPECT_NO_THROW(ap.apply(good, m.targets));
  m.bytes.assign(old_b.begin(), old_b.end());
  frame_applier<> cold;
  fail_above = 1024;
  try {
    cold.apply(good, m.targets, "cold.frame");
    fail_above = ~std::size_t{0};
    FAIL() << "no allocation failed";
  } catch (const error& e) {
    fail_above = ~std::size_t{0};
    EXPECT_EQ(e.code(), errc::integrity);
    EXPECT_EQ(e.where().field, "scratch");
  } catch (...) {
    fail_above = ~std::size_t{0};
    FAIL() << "an allocation failure escaped as something other than bitrefit::error";
  }
  EXPECT_TRUE(m.bytes == old_b);
  EXPECT_EQ(cold.scratch_bytes(), 0u);
}

TEST(HostileFrames, EncoderRefusesChunksAboveTheFormatLimit) {
  EXPECT_THROW(chunk_encoder<>(encode_options{.max_frame_input_bytes = frame_input_bytes_limit + 1}), error);
  EXPECT_NO_THROW(chunk_encoder<>(encode_options{.max_frame_input_bytes = frame_input_bytes_limit}));
  const model_manifest mm({{"w", dtype::U8, {16}}});
  EXPECT_THROW(plan_chunks(mm, frame_input_bytes_limit + 1), error);
}

// ---- bundle manifest -----------------------------------------------------------------------------

std::string manifest_text(const std::string& field, const std::string& value) {
  bundle_manifest m;
  m.tensors = model_manifest({{"w", dtype::F32, {4}}});
  m.frames.push_back({0, 100, digest128{1, 2}});
  auto j = m.to_json();
  std::string text = j.dump();
  // replace the value of "field" (a number in the dump) by `value`, textually
  const std::string key = "\"" + field + "\":";
  const auto at = text.find(key);
  EXPECT_NE(at, std::string::npos) << field;
  const auto b = at + key.size();
  const auto e = text.find_first_of(",}]", b);
  return text.substr(0, b) + value + text.substr(e);
}

TEST(HostileBundles, EveryIntegerFieldIsCheckedForTypeSignAndRange) {
  EXPECT_NO_THROW(parse_bundle_manifest(manifest_text("base_version", "3")));
  const std::pair<const char*, const char*> fields[] = {
      {"base_version", "base_version"}, {"target_version", "target_version"}, {"zstd_level", "zstd_level"},
      {"max_frame_input_bytes", "max_frame_input_bytes"}, {"seq", "frames.seq"},  {"size", "frames.size"},
      {"elements", "totals.elements"},  {"changed", "totals.changed"},        {"format_version", "format_version"}};
  for (auto [key, field] : fields)
    for (const char* v : {"1e300", "1.5", "-1", "18446744073709551616", "true", "\"7\"", "null"}) {
      SCOPED_TRACE(std::string(key) + " = " + v);
      if (std::string(key) == "zstd_level" && std::string(v) == "-1") continue;  // a valid (fast) zstd level
      try {
        parse_bundle_manifest(manifest_text(key, v), "m.json");
        FAIL();
      } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::format) << e.what();
        EXPECT_EQ(e.where().field, field) << e.what();
        EXPECT_EQ(e.where().file, "m.json");
      }
    }
  // a shape dimension, and the frame-size bound of the format
  for (const char* bad : {"[4.0]", "[-4]", "[1e30]"}) {
    std::string t = manifest_text("base_version", "3");
    t.replace(t.find("[4]"), 3, bad);
    EXPECT_THROW(parse_bundle_manifest(t), error) << bad;
  }
  EXPECT_THROW(parse_bundle_manifest(manifest_text("max_frame_input_bytes", std::to_string(frame_input_bytes_limit + 1))), error);
}

TEST(HostileBundles, ManifestSizeAndNestingAreBoundedBeforeParsing) {
  // a header declaring a manifest above the limit is refused without reading it
  std::vector<std::byte> file(bundle_file_header_size);
  std::memcpy(file.data(), bundle_magic, 4);
  file[4] = std::byte{1};
  fuzz::put_u64_le(file.data() + 12, bundle_manifest_limits.max_bytes + 1);
  try {
    read_bundle_bytes(file, "big.bundle");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where().field, "manifest");
  }
  // nesting: refused by the bounded parser, whatever the rest says
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  try {
    parse_bundle_manifest(deep, "deep.json");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where().field, "json.depth");
  }
}

}  // namespace
