// Tests of the Thrust backend against the host backend, bit for bit.
//
// This one source is built three times (tests/thrust/CMakeLists.txt): by g++ with
// THRUST_DEVICE_SYSTEM CPP and OMP (label codec), and by nvcc for sm_90 through
// test_thrust_cuda.cu (label gpu). `sut` is the backend of the translation unit's default system;
// tensor bytes are placed in that system's memory (device memory under CUDA) before each call.
#include <gtest/gtest.h>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/codec/thrust/backend.hpp"
#include "bitrefit/codec/thrust/locations.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/thrust/xxh3.hpp"
#include "bitrefit/core/dtype.hpp"
#include "../fixtures/float_deltas.hpp"

namespace {

using namespace bitrefit;
using namespace bitrefit::codec;
using sys = thrust_systems::default_system;
using sut = thrust_backend<sys>;
using bytes = std::vector<std::byte>;

/// Bytes held in the system's memory (host vector for CPP/OMP, device vector for CUDA).
class system_bytes {
 public:
  explicit system_bytes(const bytes& host) : n_(host.size()), v_((host.size() + 7) / 8 + 1) {
    sys::from_host(raw(), host.data(), n_);
  }
  std::span<const std::byte> cspan() const { return {static_cast<const std::byte*>(craw()), n_}; }
  std::span<std::byte> span() { return {static_cast<std::byte*>(raw()), n_}; }
  bytes download() const {
    bytes out(n_);
    sys::to_host(out.data(), craw(), n_);
    return out;
  }

 private:
  void* raw() { return thrust::raw_pointer_cast(v_.data()); }
  const void* craw() const { return thrust::raw_pointer_cast(v_.data()); }
  std::size_t n_;
  sys::vector<std::uint64_t> v_;  // 8-byte aligned storage
};

enum class pattern { none, one, all, runs, sparse, dense };
constexpr pattern all_patterns[] = {pattern::none, pattern::runs, pattern::one, pattern::all, pattern::sparse, pattern::dense};
const char* to_cstr(pattern p) {
  switch (p) {
    case pattern::none: return "none";
    case pattern::one: return "one";
    case pattern::all: return "all";
    case pattern::runs: return "runs";
    case pattern::sparse: return "sparse";
    case pattern::dense: return "dense";
  }
  return "?";
}

/// Special bit patterns of a floating dtype (little-endian element bytes): +-0, +-inf, NaNs with
/// different payloads, a subnormal, the smallest/largest normal.
std::vector<std::uint64_t> specials(dtype t) {
  switch (t) {
    case dtype::BF16: return {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFFF, 0x0001, 0x8001, 0x0080, 0x7F7F};
    case dtype::F16: return {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7E01, 0xFFFF, 0x0001, 0x8001, 0x0400, 0x7BFF};
    case dtype::F32:
      return {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0xFFFFFFFF, 0x00000001,
              0x80000001, 0x00800000, 0x7F7FFFFF};
    case dtype::F64:
      return {0x0ull, 0x8000000000000000ull, 0x7FF0000000000000ull, 0xFFF0000000000000ull, 0x7FF8000000000000ull,
              0x7FF8000000000001ull, 0xFFFFFFFFFFFFFFFFull, 0x1ull, 0x8000000000000001ull, 0x0010000000000000ull};
    case dtype::F8_E4M3: return {0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x08, 0x7E};
    case dtype::F8_E5M2: return {0x00, 0x80, 0x7C, 0xFC, 0x7D, 0x7E, 0xFF, 0x01, 0x04};
    default: return {};
  }
}

struct case_data {
  bytes old_bytes, new_bytes;
};

/// Random old tensor of `m` elements of dtype t (with special values mixed in for floats), and a
/// new tensor that differs from it exactly where pattern p says, by random nonzero XOR words
/// (often only a sign bit or a NaN payload bit, which value comparison would miss).
case_data make_case(dtype t, pattern p, std::size_t m, std::mt19937_64& rng) {
  const std::size_t E = element_size(t);
  const auto sp = specials(t);
  const std::uint64_t mask = E == 8 ? ~0ull : ((1ull << (8 * E)) - 1);
  case_data d{bytes(m * E), bytes(m * E)};
  auto put = [&](bytes& b, std::size_t i, std::uint64_t v) { std::memcpy(b.data() + i * E, &v, E); };
  auto get = [&](const bytes& b, std::size_t i) {
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + i * E, E);
    return v;
  };
  for (std::size_t i = 0; i < m; ++i) {
    std::uint64_t v = rng() & mask;
    if (!sp.empty() && rng() % 4 == 0) v = sp[rng() % sp.size()] & mask;
    if (t == dtype::BOOL) v &= 1;
    put(d.old_bytes, i, v);
  }
  d.new_bytes = d.old_bytes;
  std::vector<bool> change(m, false);
  switch (p) {
    case pattern::none: break;
    case pattern::one:
      if (m) change[rng() % m] = true;
      break;
    case pattern::all: std::fill(change.begin(), change.end(), true); break;
    case pattern::runs:
      for (std::size_t i = 0; i < m;) {
        const std::size_t gap = rng() % 300, len = 1 + rng() % 40;
        i += gap;
        for (std::size_t j = i; j < std::min(m, i + len); ++j) change[j] = true;
        i += len;
      }
      break;
    case pattern::sparse:
      for (std::size_t i = 0; i < m; ++i) change[i] = rng() % 100 == 0;
      break;
    case pattern::dense:
      for (std::size_t i = 0; i < m; ++i) change[i] = rng() % 3 != 0;
      break;
  }
  for (std::size_t i = 0; i < m; ++i) {
    if (!change[i]) continue;
    std::uint64_t x;
    switch (rng() % 3) {
      case 0: x = 1ull << (8 * E - 1); break;  // sign bit only: +0.0 <-> -0.0, NaN sign
      case 1: x = 1; break;                   // lowest bit: NaN payload, subnormal
      default: x = rng() & mask;
    }
    if (t == dtype::BOOL) x = 1;
    if (x == 0) x = 1;
    put(d.new_bytes, i, get(d.old_bytes, i) ^ x);
  }
  return d;
}

std::size_t random_size(std::mt19937_64& rng) {
  static constexpr std::size_t sizes[] = {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099, 65536 + 3};
  return rng() % 3 == 0 ? sizes[rng() % std::size(sizes)] : 1 + rng() % 20000;
}

// --- XXH3-128 written behind BITREFIT_HD equals libxxhash, bit for bit ------------------------

TEST(xxh3_hd, equals_libxxhash_for_every_length_up_to_5000_and_every_alignment) {
  std::mt19937_64 rng(42);
  std::vector<unsigned char> buf(5000 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (std::size_t len = 0; len <= 5000; ++len)
    for (std::size_t off : {0, 1, 3, 8}) {
      if (off != 0 && len % 7 != 0 && len > 300) continue;  // all offsets where it matters, sampled beyond
      const digest128 d = xxh3_128_hd(buf.data() + off, len);
      const XXH128_hash_t r = XXH3_128bits(buf.data() + off, len);
      ASSERT_EQ(d.low64, r.low64) << "len " << len << " offset " << off;
      ASSERT_EQ(d.high64, r.high64) << "len " << len << " offset " << off;
    }
}

TEST(xxh3_hd, equals_libxxhash_on_64k_slices_and_around_block_boundaries) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf((1u << 20) + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (std::size_t len : {1023u, 1024u, 1025u, 2048u, 2049u, 16383u, 65535u, 65536u, 65537u, 1u << 20})
    for (std::size_t off : {0, 5}) {
      const digest128 d = xxh3_128_hd(buf.data() + off, len);
      const XXH128_hash_t r = XXH3_128bits(buf.data() + off, len);
      ASSERT_EQ(d, (digest128{r.low64, r.high64})) << "len " << len << " offset " << off;
    }
}

// The eight accumulators hashed one lane at a time (as hash_slices runs them: one thread a lane)
// and merged give libxxhash's digest for every long length, around every block and stripe edge.
TEST(xxh3_hd, long_inputs_hashed_lane_by_lane_equal_libxxhash) {
  namespace x = xxh3_hd_detail;
  std::mt19937_64 rng(11);
  std::vector<unsigned char> buf((1u << 16) + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  std::vector<std::size_t> lens;
  for (std::size_t len = x::long_input + 1; len <= 5000; ++len) lens.push_back(len);
  for (std::size_t len : {16383u, 16384u, 16385u, 65535u, 65536u}) lens.push_back(len);
  for (std::size_t len : lens)
    for (std::size_t off : {0, 3}) {
      const auto* in = buf.data() + off;
      std::uint64_t acc[8];
      for (int lane = 0; lane < 8; ++lane) acc[lane] = x::hash_long_lane(in, len, x::secret(), lane);
      const x::u128 h = x::hash_long_merge(acc, len, x::secret());
      const XXH128_hash_t r = XXH3_128bits(in, len);
      ASSERT_EQ(h.low64, r.low64) << "len " << len << " offset " << off;
      ASSERT_EQ(h.high64, r.high64) << "len " << len << " offset " << off;
    }
}

// --- the seam's primitives equal the host backend's ------------------------------------------

TEST(thrust_backend, collect_changes_equals_host_backend_for_every_dtype_and_pattern) {
  std::mt19937_64 rng(1234);
  host_backend host;
  sut dev;
  for (dtype t : all_dtypes)
    for (pattern p : all_patterns)
      for (int rep = 0; rep < 3; ++rep) {
        const std::size_t E = element_size(t), m = random_size(rng);
        const case_data d = make_case(t, p, m, rng);
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + to_cstr(p) + " m=" + std::to_string(m));
        std::vector<std::uint32_t> hp(m), tp(m);
        bytes hx(m * E), hn(m * E), tx(m * E), tn(m * E);
        const std::size_t hc = host.collect_changes(d.old_bytes, d.new_bytes, E, hp, hx, hn);
        system_bytes so(d.old_bytes), sn(d.new_bytes);
        const std::size_t tc = dev.collect_changes(so.cspan(), sn.cspan(), E, tp, tx, tn);
        ASSERT_EQ(tc, hc);
        ASSERT_EQ(dev.count_changes(so.cspan(), sn.cspan(), E), hc);
        hp.resize(hc), tp.resize(tc), hx.resize(hc * E), tx.resize(tc * E), hn.resize(hc * E), tn.resize(tc * E);
        ASSERT_EQ(tp, hp);
        ASSERT_EQ(tx, hx);
        ASSERT_EQ(tn, hn);
        // Only XOR, only new, only positions: same streams.
        std::vector<std::uint32_t> tp2(m);
        bytes tx2(m * E);
        ASSERT_EQ(dev.collect_changes(so.cspan(), sn.cspan(), E, tp2, tx2, {}), hc);
        tx2.resize(hc * E);
        ASSERT_EQ(tx2, hx);
        ASSERT_EQ(dev.collect_changes(so.cspan(), sn.cspan(), E, tp2, {}, {}), hc);
        tp2.resize(hc);
        ASSERT_EQ(tp2, hp);
        tp2.assign(m, 0);
        // Byte planes produced on the system == host transpose of the interleaved values.
        bytes px(m * E), pn(m * E);
        ASSERT_EQ(dev.collect_changes_planes(so.cspan(), sn.cspan(), E, tp2, px, pn), hc);
        for (std::size_t k = 0; k < hc; ++k)
          for (std::size_t j = 0; j < E; ++j) {
            ASSERT_EQ(px[j * hc + k], hx[k * E + j]);
            ASSERT_EQ(pn[j * hc + k], hn[k * E + j]);
          }
      }
}

TEST(thrust_backend, collect_changes_on_tensors_not_aligned_to_their_element_size) {
  // A tensor inside a packed buffer (safetensors offsets need not be aligned) takes the
  // byte-wise compare path; results must not change.
  std::mt19937_64 rng(77);
  host_backend host;
  sut dev;
  for (dtype t : {dtype::BF16, dtype::F32, dtype::F64})
    for (pattern p : {pattern::sparse, pattern::dense}) {
      const std::size_t E = element_size(t), m = 3001;
      const case_data d = make_case(t, p, m, rng);
      bytes po(1), pn(3);
      po.insert(po.end(), d.old_bytes.begin(), d.old_bytes.end());
      pn.insert(pn.end(), d.new_bytes.begin(), d.new_bytes.end());
      system_bytes so(po), sn(pn);
      std::vector<std::uint32_t> hp(m), tp(m);
      bytes hx(m * E), tx(m * E);
      const std::size_t hc = host.collect_changes(d.old_bytes, d.new_bytes, E, hp, hx, {});
      const std::size_t tc = dev.collect_changes(so.cspan().subspan(1), sn.cspan().subspan(3), E, tp, tx, {});
      ASSERT_EQ(tc, hc);
      ASSERT_EQ(tp, hp);
      ASSERT_EQ(tx, hx);
    }
}

TEST(thrust_backend, apply_changes_equals_host_backend_and_reaches_new_bits) {
  std::mt19937_64 rng(99);
  host_backend host;
  sut dev;
  for (dtype t : all_dtypes)
    for (pattern p : all_patterns) {
      const std::size_t E = element_size(t), m = random_size(rng);
      const case_data d = make_case(t, p, m, rng);
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + to_cstr(p) + " m=" + std::to_string(m));
      std::vector<std::uint32_t> pos(m);
      bytes x(m * E), n(m * E);
      const std::size_t c = host.collect_changes(d.old_bytes, d.new_bytes, E, pos, x, n);
      pos.resize(c), x.resize(c * E), n.resize(c * E);
      for (value_mode mode : {value_mode::xor_mask, value_mode::overwrite}) {
        const bytes& vals = mode == value_mode::xor_mask ? x : n;
        bytes host_target = d.old_bytes;
        host.apply_changes(host_target, E, mode, pos, vals);
        system_bytes target(d.old_bytes);
        dev.apply_changes(target.span(), E, mode, pos, vals);
        const bytes got = target.download();
        ASSERT_EQ(got, host_target);
        ASSERT_EQ(got, d.new_bytes);
        if (mode == value_mode::overwrite) {  // idempotent: twice == once
          dev.apply_changes(target.span(), E, mode, pos, vals);
          ASSERT_EQ(target.download(), d.new_bytes);
        }
      }
    }
}

TEST(thrust_backend, hash_slices_equals_host_backend) {
  std::mt19937_64 rng(5);
  host_backend host;
  sut dev;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{240}, std::size_t{241},
                           std::size_t{65536}, std::size_t{65537}, std::size_t{3 * 65536 + 1000}}) {
    bytes b(size);
    for (auto& x : b) x = static_cast<std::byte>(rng());
    for (std::size_t slice : {std::size_t{1000}, std::size_t{65536}}) {
      const std::size_t n = (size + slice - 1) / slice;
      std::vector<digest128> h(n), g(n);
      host.hash_slices(b, slice, h);
      system_bytes sb(b);
      dev.hash_slices(sb.cspan(), slice, g);
      ASSERT_EQ(g, h) << "size " << size << " slice " << slice;
    }
  }
}

// --- location-coding preparation on the system equals codec/location.hpp ----------------------

void check_locations(const std::vector<std::uint32_t>& pos, std::uint64_t m, thrust_location_preparer<sys>& prep) {
  SCOPED_TRACE("m=" + std::to_string(m) + " c=" + std::to_string(pos.size()));
  bytes pb(pos.size() * 4);
  if (!pos.empty()) std::memcpy(pb.data(), pos.data(), pb.size());
  system_bytes sp(pb);
  const std::span<const std::uint32_t> dpos(reinterpret_cast<const std::uint32_t*>(sp.cspan().data()), pos.size());
  const location_sizes sz = prep.sizes(dpos, m);
  for (location_coding lc : {location_coding::gaps8, location_coding::gaps16, location_coding::gaps32,
                             location_coding::runs, location_coding::bitmap}) {
    byte_buffer expect;
    encode_locations(lc, pos, m, expect);
    std::vector<std::byte> got;
    prep.encode(lc, dpos, m, got);
    ASSERT_EQ(got.size(), expect.size()) << to_string(lc);
    ASSERT_TRUE(std::ranges::equal(got, expect.span())) << to_string(lc);  // (memcmp of empty buffers' null data() is UB)
    const std::uint64_t size = lc == location_coding::gaps8    ? sz.gaps8
                               : lc == location_coding::gaps16 ? sz.gaps16
                               : lc == location_coding::gaps32 ? sz.gaps32
                               : lc == location_coding::runs   ? sz.runs
                                                               : sz.bitmap;
    ASSERT_EQ(size, expect.size()) << to_string(lc);
  }
  if (pos.size() == m) {
    std::vector<std::byte> got;
    prep.encode(location_coding::all, dpos, m, got);
    EXPECT_TRUE(got.empty());
  }
}

TEST(thrust_locations, sizes_and_bytes_equal_codec_encode_locations_for_every_pattern) {
  std::mt19937_64 rng(606);
  host_backend host;
  thrust_location_preparer<sys> prep;
  for (pattern p : all_patterns)
    for (int rep = 0; rep < 4; ++rep) {
      const std::size_t m = random_size(rng);
      const case_data d = make_case(dtype::BF16, p, m, rng);
      std::vector<std::uint32_t> pos(m);
      pos.resize(host.collect_changes(d.old_bytes, d.new_bytes, 2, pos, {}, {}));
      check_locations(pos, m, prep);
    }
  // Gaps that need escapes in every width, runs of one and of many, a gap of exactly 255/65535.
  check_locations({0, 1, 2, 258, 65794, 65795, 65796, 299999}, 300000, prep);
  check_locations({}, 100, prep);
  std::vector<std::uint32_t> every(50);
  for (std::uint32_t i = 0; i < 50; ++i) every[i] = i;
  check_locations(every, 50, prep);
}

// --- whole frames: the codec over the Thrust backend writes the host backend's bytes ----------

/// A small model: one tensor per dtype, each with its own old/new bytes under one change pattern;
/// the last tensor is encoded as two pieces (two canonical ranges) to cover begin > 0.
struct model_case {
  std::vector<std::string> names;
  std::vector<dtype> types;
  std::vector<case_data> data;
};

model_case make_model(pattern p, std::mt19937_64& rng) {
  model_case mc;
  for (dtype t : all_dtypes) {
    mc.names.push_back("model.layers.0." + std::string(dtype_name(t)));
    mc.types.push_back(t);
    mc.data.push_back(make_case(t, p, 1 + rng() % 6000, rng));
  }
  return mc;
}

/// Pieces over `olds`/`news` (one span per tensor, in whatever memory the backend reads).
std::vector<chunk_piece> pieces_of(const model_case& mc, const std::vector<std::span<const std::byte>>& olds,
                                   const std::vector<std::span<const std::byte>>& news) {
  std::vector<chunk_piece> ps;
  for (std::size_t i = 0; i < mc.names.size(); ++i) {
    const std::size_t E = element_size(mc.types[i]);
    const std::uint64_t n = mc.data[i].old_bytes.size() / E;
    if (i + 1 < mc.names.size() || n < 2) {
      ps.push_back({mc.names[i], mc.types[i], n, 0, n, olds[i], news[i]});
    } else {
      const std::uint64_t h = n / 2;
      ps.push_back({mc.names[i], mc.types[i], n, 0, h, olds[i].subspan(0, h * E), news[i].subspan(0, h * E)});
      ps.push_back({mc.names[i], mc.types[i], n, h, n, olds[i].subspan(h * E), news[i].subspan(h * E)});
    }
  }
  return ps;
}

TEST(thrust_backend, frames_are_byte_identical_to_the_host_backend_and_apply_to_the_new_bits) {
  std::mt19937_64 rng(2024);
  const frame_header header{frame_kind::delta, payload_id{{3, 1}, 2, 5}, 10, 11};
  for (pattern p : all_patterns)
    for (mode_policy policy : {mode_policy::xor_allowed, mode_policy::overwrite_only, mode_policy::xor_only,
                               mode_policy::conditioned_only}) {
      SCOPED_TRACE(std::string(to_cstr(p)) + " policy " + std::to_string(static_cast<int>(policy)));
      const model_case mc = make_model(p, rng);
      std::vector<system_bytes> so, sn;
      std::vector<std::span<const std::byte>> ho, hn, do_, dn;
      for (const auto& d : mc.data) {
        so.emplace_back(d.old_bytes);
        sn.emplace_back(d.new_bytes);
        ho.push_back(d.old_bytes);
        hn.push_back(d.new_bytes);
      }
      for (std::size_t i = 0; i < mc.data.size(); ++i) do_.push_back(so[i].cspan()), dn.push_back(sn[i].cspan());

      chunk_encoder<host_backend> host_enc(encode_options{.policy = policy});
      chunk_encoder<sut> dev_enc(encode_options{.policy = policy});
      byte_buffer hf, df;
      encode_stats hs, ds;
      const auto hp = pieces_of(mc, ho, hn);
      const auto dp = pieces_of(mc, do_, dn);
      host_enc.encode(header, hp, hf, &hs);
      dev_enc.encode(header, dp, df, &ds);
      ASSERT_EQ(df.size(), hf.size());
      ASSERT_EQ(std::memcmp(df.data(), hf.data(), hf.size()), 0) << "frames differ";
      EXPECT_EQ(ds.changed, hs.changed);

      // Verified apply through the Thrust backend, into tensors in the system's memory.
      std::vector<system_bytes> targets;
      for (const auto& d : mc.data) targets.emplace_back(d.old_bytes);
      std::vector<mutable_tensor_view> views;
      for (std::size_t i = 0; i < mc.data.size(); ++i)
        views.emplace_back(mc.names[i], mc.types[i], shape_t{mc.data[i].old_bytes.size() / element_size(mc.types[i])},
                           targets[i].span());
      target_map tm(std::move(views));
      frame_applier<sut> applier;
      applier.apply({df.data(), df.size()}, tm);
      for (std::size_t i = 0; i < mc.data.size(); ++i) ASSERT_EQ(targets[i].download(), mc.data[i].new_bytes) << mc.names[i];

      // A corrupted frame is rejected before any write: targets stay at the new bits.
      std::vector<std::byte> bad(df.data(), df.data() + df.size());
      bad[bad.size() / 2] ^= std::byte{0x10};
      EXPECT_THROW(applier.apply(bad, tm), bitrefit::error);
      for (std::size_t i = 0; i < mc.data.size(); ++i) ASSERT_EQ(targets[i].download(), mc.data[i].new_bytes) << mc.names[i];
    }
}

// A base-conditioned item whose changes leave whole slices of the host encoder's walk untouched
// (it ranks 128 KiB of input at a time; the system ranks the item at once): byte-identical frames
// and the new bits. Before the host encoder counted unchanged slices toward later ranks, its frame
// differed here (and applied to the wrong elements: tests/codec, SlicesWithoutChangesStillCount...).
TEST(thrust_backend, frames_of_items_with_unchanged_slices_are_byte_identical_to_the_host_backend) {
  const frame_header header{frame_kind::delta, payload_id{{3, 1}, 2, 5}, 10, 11};
  for (dtype t : {dtype::BF16, dtype::F32}) {
    const auto f = *float_format_of(t);
    const std::size_t E = f.element_size, m = 600000;
    auto d = test_fixtures::training_like(t, m, 5 + E);
    const bytes old_b = std::move(d.old_b);
    bytes new_b = std::move(d.new_b);
    // unchanged runs: whole slices of the host encoder's walk at 2 and 4 bytes
    for (std::size_t i : {std::size_t{0}, std::size_t{300000}})
      std::memcpy(new_b.data() + i * E, old_b.data() + i * E, 200000 * E);
    SCOPED_TRACE(dtype_name(t));
    const system_bytes so(old_b), sn(new_b);
    const chunk_piece hp{"w", t, m, 0, m, old_b, new_b};
    const chunk_piece dp{"w", t, m, 0, m, so.cspan(), sn.cspan()};
    chunk_encoder<host_backend> host_enc(encode_options{.policy = mode_policy::conditioned_only});
    chunk_encoder<sut> dev_enc(encode_options{.policy = mode_policy::conditioned_only});
    byte_buffer hf, df;
    encode_stats hs, ds;
    host_enc.encode(header, std::span(&hp, 1), hf, &hs);
    dev_enc.encode(header, std::span(&dp, 1), df, &ds);
    ASSERT_EQ(hs.conditioned_items, 1u);
    EXPECT_GT(std::to_integer<unsigned>(frame_view::parse({hf.data(), hf.size()}).location_section(0)[0]), 1u) << "several classes";
    ASSERT_EQ(df.size(), hf.size());
    ASSERT_EQ(std::memcmp(df.data(), hf.data(), hf.size()), 0) << "frames differ";
    bytes target = old_b;
    target_map tm({mutable_tensor_view("w", t, shape_t{m}, std::span<std::byte>(target))});
    frame_applier<> applier;
    applier.apply({hf.data(), hf.size()}, tm);
    EXPECT_TRUE(target == new_b);
  }
}

// Class ranks of base-conditioned coding: the system's implementation (block masks, scan, one
// functor per change) equals the host's, for every float format, class count and slicing; the
// host's with the changes' base values given as its hint (classes read from them) too.
TEST(thrust_backend, rank_by_class_equals_the_host_backend) {
  std::mt19937_64 rng(77);
  for (dtype t : {dtype::F16, dtype::BF16, dtype::F32, dtype::F64, dtype::F8_E4M3, dtype::F8_E5M2}) {
    const auto f = *float_format_of(t);
    const std::size_t E = f.element_size;
    for (unsigned k : {1u, 2u, 4u, 9u}) {
      const std::size_t m = 3000 + rng() % 5000;
      bytes base(m * E);
      for (auto& b : base) b = static_cast<std::byte>(rng());
      class_spec spec;
      spec.count = static_cast<std::uint8_t>(std::min<std::uint64_t>(k, f.exponents()));
      for (unsigned j = 0; j + 1 < spec.count; ++j) spec.thresholds[j] = static_cast<std::uint16_t>(1 + j * (f.exponents() - 1) / spec.count);
      ASSERT_TRUE(valid_class_spec(spec, f));
      std::vector<std::uint32_t> pos;
      for (std::uint32_t i = 0; i < m; i += 1 + static_cast<std::uint32_t>(rng() % 13)) pos.push_back(i);
      std::vector<std::uint8_t> hc(pos.size()), dc(pos.size());
      std::vector<std::uint32_t> hr(pos.size()), dr(pos.size());
      std::vector<std::uint64_t> ht(spec.count, 5), dt(spec.count, 5);  // nonzero totals carry in
      host_backend hb;
      hb.rank_by_class(base, f, spec, pos, {}, hc, hr, ht);
      const system_bytes sb(base);
      sut dev;
      dev.rank_by_class(sb.cspan(), f, spec, pos, {}, dc, dr, dt);
      EXPECT_EQ(dc, hc) << dtype_name(t) << " K=" << k;
      EXPECT_EQ(dr, hr) << dtype_name(t) << " K=" << k;
      EXPECT_EQ(dt, ht) << dtype_name(t) << " K=" << k;
      bytes values;  // the base elements at the positions
      for (std::uint32_t p : pos) values.insert(values.end(), base.begin() + p * E, base.begin() + (p + 1) * E);
      std::vector<std::uint8_t> vc(pos.size());
      std::vector<std::uint32_t> vr(pos.size());
      std::vector<std::uint64_t> vt(spec.count, 5);
      hb.rank_by_class(base, f, spec, pos, values, vc, vr, vt);
      EXPECT_EQ(vc, hc) << dtype_name(t) << " K=" << k << " with values";
      EXPECT_EQ(vr, hr) << dtype_name(t) << " K=" << k << " with values";
      EXPECT_EQ(vt, ht) << dtype_name(t) << " K=" << k << " with values";
    }
  }
}

TEST(thrust_backend, attestation_digest_equals_the_host_backend) {
  std::mt19937_64 rng(31);
  const model_case mc = make_model(pattern::none, rng);
  // Add a tensor of several 64 KiB slices with a partial last one.
  std::vector<std::string> names = mc.names;
  std::vector<dtype> types = mc.types;
  std::vector<bytes> contents;
  for (const auto& d : mc.data) contents.push_back(d.new_bytes);
  names.push_back("model.embed_tokens.weight");
  types.push_back(dtype::BF16);
  contents.push_back(make_case(dtype::BF16, pattern::none, 3 * 32768 + 123, rng).new_bytes);

  std::vector<system_bytes> dev;
  dev.reserve(names.size());  // spans into dev must stay valid
  std::vector<tensor_view> hv, dv;
  for (std::size_t i = 0; i < names.size(); ++i) {
    dev.emplace_back(contents[i]);
    const shape_t shape{contents[i].size() / element_size(types[i])};
    hv.emplace_back(names[i], types[i], shape, std::span<const std::byte>(contents[i]));
    dv.emplace_back(names[i], types[i], shape, dev.back().cspan());
  }
  host_backend hb;
  sut tb;
  const digest128 h = attestation_digest(std::span<const tensor_view>(hv), hb);
  const digest128 t = attestation_digest(std::span<const tensor_view>(dv), tb);
  EXPECT_EQ(t, h);
  // The digest sees every bit: one flipped bit in the big tensor changes it.
  contents.back()[70000] ^= std::byte{0x01};
  system_bytes flipped(contents.back());
  dv.back() = tensor_view(names.back(), types.back(), shape_t{contents.back().size() / 2}, flipped.cspan());
  EXPECT_NE(attestation_digest(std::span<const tensor_view>(dv), tb), h);
}

TEST(thrust_backend, rejects_bad_arguments_with_named_errors) {
  sut dev;
  bytes a(10), b(12);
  std::vector<std::uint32_t> pos(16);
  system_bytes sa(a), sb(b);
  EXPECT_THROW(dev.collect_changes(sa.cspan(), sb.cspan(), 2, pos, {}, {}), bitrefit::error);
  EXPECT_THROW(dev.collect_changes(sa.cspan(), sa.cspan(), 3, pos, {}, {}), bitrefit::error);
  std::vector<digest128> out(2);  // 10 bytes in slices of 4 need 3
  EXPECT_THROW(dev.hash_slices(sa.cspan(), 4, out), bitrefit::error);
  EXPECT_THROW(dev.hash_slices(sa.cspan(), 0, out), bitrefit::error);
}

TEST(thrust_backend, name_names_the_system) {
  EXPECT_EQ(sut::name(), sys::name);
  EXPECT_EQ(sut::name().substr(0, 7), "thrust-");
}

}  // namespace
