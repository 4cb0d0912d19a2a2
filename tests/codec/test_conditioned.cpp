// Base-conditioned coding: the rANS coder, integer log2, ULP distances (exhaustive on the 8-bit
// formats), class ranks against a naive reference, and whole items through the encoder and the
// applier: round trips, the choice on training-like deltas, version mismatch, wrong bases and
// malformed sections refused with the target untouched.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <sys/mman.h>
#include <unistd.h>

#include "bitrefit/codec/codec.hpp"
#include "../fixtures/float_deltas.hpp"

using namespace bitrefit;
using namespace bitrefit::codec;

namespace {

constexpr std::array<dtype, 6> float_dtypes{dtype::F16, dtype::BF16, dtype::F32, dtype::F64, dtype::F8_E4M3, dtype::F8_E5M2};

std::uint64_t load(const std::vector<std::byte>& v, std::size_t i, std::size_t E) {
  std::uint64_t x = 0;
  std::memcpy(&x, v.data() + i * E, E);
  return x;
}
void store(std::vector<std::byte>& v, std::size_t i, std::size_t E, std::uint64_t x) { std::memcpy(v.data() + i * E, &x, E); }

// A training-like tensor (tests/fixtures/float_deltas.hpp): several classes.
using delta_case = test_fixtures::float_delta;
using test_fixtures::training_like;

// Changes that ignore the base value: each element moves one ULP up or down with probability
// 1/`one_in` (ulp_step: never across zero or out of the finite range), whatever its exponent; a
// sixteenth of the base elements are special (+-0, +-inf, NaN with a random payload, subnormals),
// and a changed special element takes a random new pattern (an escape). The class choice gives
// such an item one class (the decoder's one-class path).
delta_case independent_changes(dtype t, std::size_t n, std::uint64_t seed, unsigned one_in) {
  const auto f = *float_format_of(t);
  const std::size_t E = f.element_size;
  const std::uint64_t all = E == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * E)) - 1;
  delta_case d = training_like(t, n, seed);
  d.new_b = d.old_b;
  std::mt19937_64 g(seed ^ 0x5EED);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t o = load(d.old_b, i, E);
    const bool special = g() % 16 == 0;
    if (special) {
      const std::uint64_t sign = (g() & 1) ? f.sign_bit : 0;
      switch (g() % 4) {
        case 0: o = sign; break;                                                             // +-0
        case 1: o = sign | (f.special < f.magnitude_mask ? f.special : f.magnitude_mask); break;  // +-inf (E4M3: NaN)
        case 2: o = sign | f.magnitude_mask; break;                                          // NaN, all payload bits
        default: o = sign | (1 + g() % ((std::uint64_t{1} << f.mantissa_bits) - 1)); break;  // subnormal
      }
      store(d.old_b, i, E, o);
    }
    std::uint64_t nw = o;
    if (g() % one_in == 0) {
      if (special || !f.finite(o)) {
        nw = g() & all;
      } else if (const auto s = ulp_step(f, o, (g() & 1) ? 1 : -1)) {
        nw = *s;
      }
    }
    store(d.new_b, i, E, nw);
  }
  return d;
}

std::vector<std::byte> encode_one(const delta_case& d, mode_policy p, encode_stats* st = nullptr) {
  chunk_encoder<> enc(encode_options{.policy = p});
  const chunk_piece pc{"w", d.type, d.n(), 0, d.n(), d.old_b, d.new_b};
  byte_buffer out;
  enc.encode({frame_kind::delta, payload_id{{1, 0}, 0, 0}, 0, 1}, std::span(&pc, 1), out, st);
  return {out.data(), out.data() + out.size()};
}

// The same changes handed over as a known change set (encode_known, the owners' path): the list
// of changed positions and their new bits.
std::vector<std::byte> encode_known_one(const delta_case& d, mode_policy p) {
  const std::size_t E = element_size(d.type), n = d.n();
  std::vector<std::uint64_t> positions;
  std::vector<std::byte> values;
  for (std::size_t i = 0; i < n; ++i)
    if (load(d.old_b, i, E) != load(d.new_b, i, E)) {
      positions.push_back(i);
      values.insert(values.end(), d.new_b.begin() + static_cast<std::ptrdiff_t>(i * E), d.new_b.begin() + static_cast<std::ptrdiff_t>((i + 1) * E));
    }
  chunk_encoder<> enc(encode_options{.policy = p});
  const known_changes_piece kp{"w", d.type, n, 0, n, d.old_b, positions, values};
  byte_buffer out;
  enc.encode_known({frame_kind::delta, payload_id{{1, 0}, 0, 0}, 0, 1}, std::span(&kp, 1), out);
  return {out.data(), out.data() + out.size()};
}

// Applies `frame` to a copy of `base`; returns the result, or nullopt if apply threw (then the copy
// must still equal base: checked here).
std::optional<std::vector<std::byte>> apply_to(const std::vector<std::byte>& frame, dtype t, const std::vector<std::byte>& base) {
  std::vector<std::byte> work = base;
  const std::uint64_t n = base.size() / element_size(t);
  target_map tm({mutable_tensor_view("w", t, shape_t{n}, std::span<std::byte>(work))});
  frame_applier<> ap;
  try {
    ap.apply(frame, tm);
  } catch (const error&) {
    EXPECT_EQ(work, base) << "a refused frame changed the target";
    return std::nullopt;
  }
  return work;
}

// Per nonempty class of a base-conditioned location section: whether its streams are 16-lane
// streams (the shift byte's conditioned_detail::lanes_flag).
std::vector<bool> lanes_flags(std::span<const std::byte> loc) {
  const error_context where{};
  rans::reader r(loc, where);
  const unsigned K = r.u8();
  for (unsigned j = 0; j + 1 < K; ++j) (void)r.varint(~0ull, "threshold");
  std::vector<bool> flags;
  for (unsigned k = 0; k < K; ++k) {
    if (r.varint(~0ull, "count") == 0) continue;
    const unsigned shift_byte = r.u8();
    flags.push_back((shift_byte & conditioned_detail::lanes_flag) != 0);
    if (shift_byte & conditioned_detail::predicted_tables_flag)
      (void)rans::read_predicted_codes(r, conditioned_detail::gap_alphabet, conditioned_detail::gap_code_prediction, "gap table");
    else
      (void)rans::read_table(r, conditioned_detail::gap_alphabet, "gap table");
    (void)r.varint(~0ull, "gap stream length");
  }
  return flags;
}

void refresh_digest(std::vector<std::byte>& f) {
  store_digest_le(xxh3_128(std::span<const std::byte>(f).first(f.size() - frame_digest_size)), f.data() + f.size() - frame_digest_size);
}

}  // namespace

// ---- rANS ------------------------------------------------------------------------------------

TEST(Rans, NormaliseKeepsEverySymbolAndSumsToTheScale) {
  std::mt19937_64 g(1);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::uint64_t> h(1 + g() % 100);
    for (auto& v : h) v = (g() % 3 == 0) ? 0 : g() % (1u << (g() % 30));
    h[g() % h.size()] += 1;
    std::size_t used = 0;
    for (auto v : h) used += v != 0;
    const unsigned S = std::max<unsigned>(static_cast<unsigned>(std::bit_width(used)), 1 + static_cast<unsigned>(g() % 15));
    if (S > rans::max_scale_bits) continue;
    const auto t = rans::table::normalise(h, S);
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      sum += t.freq[i];
      EXPECT_EQ(t.freq[i] == 0, h[i] == 0) << "symbol " << i;
    }
    EXPECT_EQ(sum, std::uint64_t{1} << S);
  }
}

TEST(Rans, RoundTripOfSymbolsAndRawBits) {
  std::mt19937_64 g(2);
  for (int round = 0; round < 50; ++round) {
    const std::size_t A = 2 + g() % 300;
    std::vector<std::uint64_t> h(A);
    for (auto& v : h) v = 1 + g() % 1000;
    h[0] = 100000;  // a skewed alphabet, like +-1 ULP
    const auto t = rans::table::normalise(h, 9 + static_cast<unsigned>(g() % 7));
    const auto es = rans::encoder_symbols(t);
    // a sequence of (symbol, raw bits, raw width)
    struct step {
      std::uint32_t sym;
      std::uint64_t raw;
      unsigned bits;
    };
    std::vector<step> seq(g() % 5000);
    std::discrete_distribution<std::uint32_t> pick(h.begin(), h.end());
    for (auto& s : seq) {
      s.sym = pick(g);
      s.bits = static_cast<unsigned>(g() % 65);
      s.raw = s.bits == 64 ? g() : g() & ((std::uint64_t{1} << s.bits) - 1);
    }
    rans::encoder enc;
    auto w = enc.begin(seq.size() * 6);
    for (std::size_t i = seq.size(); i-- > 0;) {
      w.put_raw64(seq[i].raw, seq[i].bits);
      w.put(es[seq[i].sym]);
    }
    const auto bytes = enc.finish(w);
    const error_context where{};
    rans::decoder d(bytes, where);
    const rans::dec_table dt(t);
    for (const auto& s : seq) {
      ASSERT_EQ(d.get(dt), s.sym);
      ASSERT_EQ(d.get_raw64(s.bits), s.raw);
    }
    EXPECT_NO_THROW(d.finish());
    // the stream's length is close to the ideal code length
    if (seq.size() > 1000) {
      double ideal = 0;
      for (const auto& s : seq) ideal += s.bits + std::log2(double(std::uint64_t{1} << t.scale_bits) / t.freq[s.sym]);
      EXPECT_LT(bytes.size(), ideal / 8 * 1.02 + 16);
    }
  }
}

TEST(Rans, TruncatedPaddedAndBadTablesAreRefused) {
  const auto t = rans::table::normalise(std::vector<std::uint64_t>{5, 3, 1}, 8);
  const auto es = rans::encoder_symbols(t);
  rans::encoder enc;
  auto w = enc.begin(1000);
  for (int i = 0; i < 999; ++i) w.put(es[i % 3]);
  const auto s = enc.finish(w);
  const std::vector<std::byte> bytes(s.begin(), s.end());
  const rans::dec_table dt(t);
  const error_context where{};
  auto decode_all = [&](std::span<const std::byte> b) {
    rans::decoder d(b, where);
    for (int i = 0; i < 999; ++i) d.get(dt);
    d.finish();
  };
  EXPECT_NO_THROW(decode_all(bytes));
  EXPECT_THROW(decode_all(std::span(bytes).first(bytes.size() - 1)), error);
  auto padded = bytes;
  padded.push_back(std::byte{0});
  EXPECT_THROW(decode_all(padded), error);
  EXPECT_THROW(decode_all(std::span(bytes).first(3)), error);
  // tables: the decoder rebuilds exactly the encoder's table from the compact form
  std::mt19937_64 g(5);
  for (int round = 0; round < 100; ++round) {
    std::vector<std::uint64_t> h(1 + g() % 80);
    for (auto& v : h) v = (g() % 4 == 0) ? 0 : g() % (1u << (g() % 25));
    h[g() % h.size()] += 1;
    std::size_t used = 0;
    for (auto v : h) used += v != 0;
    const unsigned S = std::max<unsigned>(7, static_cast<unsigned>(std::bit_width(used)));
    byte_buffer tb;
    rans::write_table(h, S, tb);
    const std::vector<std::byte> wire(tb.data(), tb.data() + tb.size());
    rans::reader r(wire, where);
    EXPECT_EQ(rans::read_table(r, 80, "table"), rans::table_of(h, S));
    EXPECT_TRUE(r.rest().empty());
  }
  auto refused = [&](std::vector<std::uint8_t> bytes, std::size_t alphabet) {
    std::vector<std::byte> b;
    for (auto x : bytes) b.push_back(static_cast<std::byte>(x));
    rans::reader r(b, where);
    EXPECT_THROW(rans::read_table(r, alphabet, "table"), error);
  };
  refused({0, 2, 5, 5}, 16);          // scale 0
  refused({16, 2, 5, 5}, 16);         // scale 16
  refused({8, 3, 5, 5, 5}, 2);        // more symbols than the alphabet
  refused({8, 2, 0, 0}, 16);          // no symbol used
  refused({1, 3, 5, 5, 5}, 16);       // 3 symbols in 2 slots
  refused({8, 3, 5, 5}, 16);          // ends early
}

// ---- 16-lane rANS (rans_lanes.hpp) -------------------------------------------------------------
namespace {
// A schedule of groups of up to 16 lanes; per group two operations: a symbol, then raw bits.
struct lane_case {
  rans::table t;
  std::vector<std::uint32_t> sym, raw, bits;  // per change
};
lane_case random_lane_case(std::mt19937_64& g, std::size_t n) {
  lane_case c;
  std::vector<std::uint64_t> h(1 + g() % 90);
  for (auto& v : h) v = g() % 3 == 0 ? 0 : 1 + g() % 1000;
  h[g() % h.size()] = 100000;  // skewed, like +-1 ULP
  std::size_t used = 0;
  for (auto v : h) used += v != 0;
  const unsigned S = std::max<unsigned>(static_cast<unsigned>(std::bit_width(used)), 1 + static_cast<unsigned>(g() % rans::max_scale_bits));
  c.t = rans::table::normalise(h, std::min(S, rans::max_scale_bits));
  std::discrete_distribution<std::uint32_t> pick(h.begin(), h.end());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned b = static_cast<unsigned>(g() % (rans_lanes::max_raw_bits + 1));
    c.sym.push_back(pick(g)), c.bits.push_back(b), c.raw.push_back(static_cast<std::uint32_t>(g() & ((1u << b) - 1)));
  }
  return c;
}
std::vector<std::byte> encode_lanes(const lane_case& c) {
  const auto et = rans_lanes::encoder_table(c.t);
  rans_lanes::encoder e;
  e.begin(2 * c.sym.size());
  const std::size_t n = c.sym.size();
  for (std::size_t g0 = (n + 15) / 16 * 16; g0 > 0;) {  // groups backwards; operations backwards; lanes ascending
    g0 -= 16;
    const unsigned r = static_cast<unsigned>(std::min<std::size_t>(16, n - g0));
    for (unsigned l = 0; l < r; ++l) e.put_raw(l, c.raw[g0 + l], c.bits[g0 + l]);
    for (unsigned l = 0; l < r; ++l) e.put(l, et, c.sym[g0 + l]);
  }
  const auto s = e.finish();
  return {s.begin(), s.end()};
}
// Decodes c's schedule from `bytes`; false when a symbol or raw field differs (throws on a format error).
bool decode_lanes(const lane_case& c, std::span<const std::byte> bytes) {
  const error_context where{};
  rans_lanes::decoder d(bytes, where);
  const rans::dec_table dt(c.t);
  const std::size_t n = c.sym.size();
  bool same = true;
  for (std::size_t g0 = 0; g0 < n; g0 += 16) {  // lanes descending
    const unsigned r = static_cast<unsigned>(std::min<std::size_t>(16, n - g0));
    for (unsigned l = r; l-- > 0;) same &= d.get(l, dt) == c.sym[g0 + l];
    for (unsigned l = r; l-- > 0;) same &= d.get_raw(l, c.bits[g0 + l]) == c.raw[g0 + l];
  }
  d.finish();
  return same;
}
}  // namespace

// Predicted tables (write_predicted_table): with either predictor of the base-conditioned coding,
// the decoder rebuilds exactly the table the encoder coded with, from fewer bytes than
// write_table's form on smooth histograms, and refuses codes that no encoder writes.
TEST(Rans, PredictedTablesRoundTripAndRefuseBadCodes) {
  const error_context where{};
  using conditioned_detail::gap_code_prediction;
  using conditioned_detail::value_code_prediction;
  using predictor = int (*)(const std::uint8_t*, std::size_t) noexcept;
  std::mt19937_64 g(7);
  std::size_t predicted_bytes = 0, plain_bytes = 0;
  for (int round = 0; round < 400; ++round) {
    const predictor predict = round % 2 ? predictor{value_code_prediction} : predictor{gap_code_prediction};
    std::vector<std::uint64_t> h(1 + g() % 72);
    if (round % 4 < 2) {  // geometric, as gaps and distances are: smooth codes
      double c = double(1 + g() % 100000);
      for (auto& v : h) v = static_cast<std::uint64_t>(c), c *= 0.55 + 0.4 * double(g() % 1000) / 1000.0;
    } else {  // anything: zeros, huge jumps, the largest codes
      for (auto& v : h) v = (g() % 4 == 0) ? 0 : (g() % 8 == 0 ? ~0ull >> (g() % 3) : g() % (1u << (g() % 25)));
    }
    h[g() % h.size()] += 1;
    std::uint64_t count = 0;
    std::size_t used = 0;
    for (auto v : h) count += std::min<std::uint64_t>(v, 1u << 20), used += v != 0;
    const auto scale_of = [count](std::size_t u) { return conditioned_detail::scale_bits_for(count, u); };
    byte_buffer tb, plain;
    rans::write_predicted_table(h, predict, tb);
    rans::write_table(h, scale_of(used), plain);
    const std::vector<std::byte> wire(tb.data(), tb.data() + tb.size());
    rans::reader r(wire, where);
    EXPECT_EQ(rans::read_predicted_table(r, 80, predict, scale_of, "table"), rans::table_of(h, scale_of(used))) << round;
    EXPECT_TRUE(r.rest().empty()) << round;
    // the codes themselves, one per symbol up to the last used one
    rans::reader rc(wire, where);
    const auto codes = rans::read_predicted_codes(rc, 80, predict, "table");
    std::size_t last = h.size();
    while (h[last - 1] == 0) --last;
    ASSERT_EQ(codes.size(), last);
    for (std::size_t i = 0; i < last; ++i) EXPECT_EQ(codes[i], rans::count_code(h[i])) << round << " symbol " << i;
    if (round % 4 < 2) predicted_bytes += tb.size(), plain_bytes += plain.size();
  }
  EXPECT_LT(predicted_bytes * 10, plain_bytes * 8) << "smooth tables: predicted " << predicted_bytes << " B, one byte per code " << plain_bytes << " B";
  auto refused = [&](std::vector<std::uint8_t> bytes, const char* why) {
    std::vector<std::byte> b;
    for (auto x : bytes) b.push_back(static_cast<std::byte>(x));
    rans::reader r(b, where);
    try {
      (void)rans::read_predicted_table(r, 80, gap_code_prediction, [](std::size_t) { return 10u; }, "table");
      ADD_FAILURE() << "accepted: " << why;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format) << why;
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  // codes: 200 raw, then the prediction 198 + 200 (zigzag 400, + 4 = 404, nine bits wide: six zero
  // bits, a one, its low eight bits): 398 > 255
  refused({2, 200, 0x40, 0x4a}, "outside [0, 255]");
  refused({2, 200, 0x00, 0x00}, "longer than any code");  // nine zero bits and more
  // 200, then 198 (difference 0: bits 1, 0, 0), then a set bit in the padding
  refused({2, 200, 0x81}, "nonzero bits after the last code");
  refused({2, 200}, "section ends early");  // the second code is missing
  refused({1, 0}, "table without symbols");
  refused({81, 0}, "exceeds its bound");  // more symbols than the alphabet
  {  // and the same bytes without the set padding bit are the table {200, 198}
    const std::vector<std::byte> b{std::byte{2}, std::byte{200}, std::byte{0x01}};
    rans::reader r(b, where);
    EXPECT_EQ(rans::read_predicted_codes(r, 80, gap_code_prediction, "table"), (std::vector<std::uint8_t>{200, 198}));
  }
}

TEST(Lanes, RoundTripOfSymbolsAndRawBitsInEveryLane) {
  std::mt19937_64 g(21);
  for (int round = 0; round < 60; ++round) {
    const std::size_t n = round < 6 ? std::size_t{round == 0 ? 0u : round == 1 ? 1u : round == 2 ? 15u : round == 3 ? 16u : round == 4 ? 17u : 33u}
                                    : g() % 6000;
    const auto c = random_lane_case(g, n);
    const auto bytes = encode_lanes(c);
    ASSERT_TRUE(decode_lanes(c, bytes)) << "n=" << n;
    // close to the ideal code length: 16 states of 4 bytes, then at most 2 % above the entropy
    double ideal = 0;
    for (std::size_t i = 0; i < n; ++i) ideal += c.bits[i] + std::log2(double(std::uint64_t{1} << c.t.scale_bits) / c.t.freq[c.sym[i]]);
    if (n > 1000) {
      EXPECT_LT(double(bytes.size()), rans_lanes::header_bytes + ideal / 8 * 1.02 + 32) << "n=" << n;
    }
  }
}

TEST(Lanes, TruncatedPaddedAndAlteredStreamsAreRefused) {
  std::mt19937_64 g(22);
  const auto c = random_lane_case(g, 3001);
  const auto bytes = encode_lanes(c);
  ASSERT_TRUE(decode_lanes(c, bytes));
  EXPECT_THROW(decode_lanes(c, std::span(bytes).first(bytes.size() - 1)), error);
  EXPECT_THROW(decode_lanes(c, std::span(bytes).first(bytes.size() - 2)), error);
  EXPECT_THROW(decode_lanes(c, std::span(bytes).first(rans_lanes::header_bytes - 1)), error);
  auto padded = bytes;
  padded.push_back(std::byte{0}), padded.push_back(std::byte{0});
  EXPECT_THROW(decode_lanes(c, padded), error);
  auto big_state = bytes;
  big_state[4 * 7 + 3] = std::byte{0x80};  // lane 7's initial state >= 2^31
  EXPECT_THROW(decode_lanes(c, big_state), error);
  // any one byte altered: refused by name, or decoded to other symbols, never read out of bounds
  // (the sanitizer builds run this). rANS states resynchronise after a low-bit error, so most
  // alterations of a word decode to end without complaint; the frame digest is what detects them.
  int refused = 0, wrong = 0;
  for (int i = 0; i < 300; ++i) {
    auto b = bytes;
    b[g() % b.size()] ^= static_cast<std::byte>(1 + g() % 255);
    try {
      wrong += !decode_lanes(c, b);
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format);
      ++refused;
    }
  }
  EXPECT_EQ(refused + wrong, 300) << "an altered stream decoded to the same symbols";
}

#ifdef BITREFIT_CODEC_X86
namespace {
// Whole groups of c with the vector decoder while 64 bytes are left (two loads per group), from
// d's state; hands back to d. `g0`: the first change not decoded. False on the first difference.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512cd,popcnt"))) bool vector_decode_lanes(const lane_case& c, rans_lanes::decoder& d,
                                                                                               const rans_lanes::dec_table16& t16, std::size_t& g0) {
  rans_lanes::vector_decoder v;
  v.load(d);
  alignas(64) std::uint32_t sym[16], raw[16], bits[16];
  bool same = true;
  for (const std::size_t n = c.sym.size(); same && n - g0 >= 16 && d.end() - v.p >= 64; g0 += 16) {
    for (unsigned l = 0; l < 16; ++l) bits[15 - l] = c.bits[g0 + l];  // vector lane 15 - l is lane l
    _mm512_store_si512(sym, v.get(t16));
    _mm512_store_si512(raw, v.get_raw(_mm512_load_si512(bits)));
    for (unsigned l = 0; l < 16; ++l) same &= sym[15 - l] == c.sym[g0 + l] && raw[15 - l] == c.raw[g0 + l];
  }
  v.store(d);
  return same;
}
}  // namespace
#endif

// The vector decoder (rans_lanes::vector_decoder, used by the conditioned decoder for whole groups)
// reads what the scalar decoder reads: the same symbols and raw fields, the same cursor and states
// when it hands over, so the scalar decoder finishes the stream (the last groups, within 64 bytes
// of the end here) and ends in the initial states.
TEST(Lanes, TheVectorDecoderReadsWhatTheScalarOneReads) {
#ifdef BITREFIT_CODEC_X86
  if (!cpu_avx512_lzcnt()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937_64 g(24);
  for (int round = 0; round < 40; ++round) {
    const std::size_t n = 16 * (1 + g() % 300) + (round % 2 ? g() % 16 : 0);
    const auto c = random_lane_case(g, n);
    const auto bytes = encode_lanes(c);
    const error_context where{};
    rans_lanes::decoder d(bytes, where);
    const rans_lanes::dec_table16 t16(c.t);
    std::size_t g0 = 0;
    ASSERT_TRUE(vector_decode_lanes(c, d, t16, g0)) << "n=" << n << ": a symbol or raw field differs before change " << g0;
    ASSERT_GT(g0, 0u) << "the vector decoder ran";
    const rans::dec_table dt(c.t);
    for (; g0 < n; g0 += 16) {
      const unsigned r = static_cast<unsigned>(std::min<std::size_t>(16, n - g0));
      for (unsigned l = r; l-- > 0;) ASSERT_EQ(d.get(l, dt), c.sym[g0 + l]);
      for (unsigned l = r; l-- > 0;) ASSERT_EQ(d.get_raw(l, c.bits[g0 + l]), c.raw[g0 + l]);
    }
    EXPECT_NO_THROW(d.finish()) << "n=" << n;
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

TEST(FixedLog2, ExactPowersAndCloseElsewhere) {
  for (unsigned k = 0; k < 64; ++k) EXPECT_EQ(log2_q32(std::uint64_t{1} << k), std::uint64_t{k} << 32);
  std::mt19937_64 g(3);
  std::uint64_t prev = 0;
  for (std::uint64_t v = 1; v < 5000; ++v) {
    const std::uint64_t l = log2_q32(v);
    EXPECT_GE(l, prev);
    prev = l;
    EXPECT_NEAR(static_cast<double>(l) / 4294967296.0, std::log2(static_cast<double>(v)), 1e-6);
  }
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t v = g() >> (g() % 60);
    if (v) {
      EXPECT_NEAR(static_cast<double>(log2_q32(v)) / 4294967296.0, std::log2(static_cast<double>(v)), 1e-6);
    }
  }
  // n·H(c/n) against the floating-point formula
  EXPECT_NEAR(binary_entropy_q8(1000000, 25000) / 256.0, 1000000 * (-(0.025 * std::log2(0.025)) - 0.975 * std::log2(0.975)), 2.0);
}

// ---- ULP distance ----------------------------------------------------------------------------

TEST(Ulp, ExhaustiveOnTheEightBitFormats) {
  for (dtype t : {dtype::F8_E4M3, dtype::F8_E5M2}) {
    const auto f = *float_format_of(t);
    for (std::uint64_t o = 0; o < 256; ++o)
      for (std::uint64_t n = 0; n < 256; ++n) {
        if (o == n) continue;
        const auto d = ulp_distance(f, o, n);
        const bool escape = ((o ^ n) & 0x80) || !f.finite(o) || !f.finite(n);
        ASSERT_EQ(!d.has_value(), escape) << dtype_name(t) << " " << o << " -> " << n;
        if (d) {
          const auto back = ulp_step(f, o, *d);
          ASSERT_TRUE(back.has_value());
          ASSERT_EQ(*back, n);
          // the distance is the difference in sign-magnitude order
          const std::int64_t ko = (o & 0x80) ? -static_cast<std::int64_t>(o & 0x7F) : static_cast<std::int64_t>(o);
          const std::int64_t kn = (n & 0x80) ? -static_cast<std::int64_t>(n & 0x7F) : static_cast<std::int64_t>(n);
          ASSERT_EQ(*d, kn - ko);
        }
      }
  }
  // float8_e4m3fn: only S.1111.111 is NaN; 0x7E (448) is finite
  const auto e4 = *float_format_of(dtype::F8_E4M3);
  EXPECT_TRUE(e4.finite(0x7E));
  EXPECT_FALSE(e4.finite(0x7F));
  EXPECT_FALSE(e4.finite(0xFF));
}

TEST(Ulp, StepsNeverLeaveTheSignOrTheFiniteRange) {
  const auto f = *float_format_of(dtype::BF16);
  EXPECT_FALSE(ulp_step(f, 0x0000, -1));  // +0 cannot step below zero
  EXPECT_EQ(ulp_step(f, 0x8001, 1), 0x8000u);  // -tiny -> -0.0 (toward +: magnitude falls)
  EXPECT_FALSE(ulp_step(f, 0x8000, 1));        // -0.0 has nowhere to go toward +
  EXPECT_FALSE(ulp_step(f, 0x7F7F, 1));        // max finite -> inf is an escape
  EXPECT_EQ(ulp_step(f, 0xFF7F, 1), 0xFF7Eu);
  EXPECT_FALSE(ulp_distance(f, 0x0000, 0x8000));  // +0 -> -0: sign change
  EXPECT_FALSE(ulp_distance(f, 0x7FC1, 0x7FC2));  // NaN payloads
  EXPECT_FALSE(ulp_distance(f, 0x3F80, 0x7F80));  // 1.0 -> inf
  EXPECT_EQ(ulp_distance(f, 0x0001, 0x0000), -1);  // smallest subnormal -> +0
}

// ---- class ranks -----------------------------------------------------------------------------

RC_GTEST_PROP(BaseClasses, RanksMatchANaiveCountInAnySlicing, ()) {
  const dtype t = *rc::gen::elementOf(float_dtypes);
  const auto f = *float_format_of(t);
  const std::size_t E = f.element_size;
  const std::size_t n = *rc::gen::inRange<std::size_t>(0, 3000);
  std::vector<std::byte> base(n * E);
  for (std::size_t i = 0; i < n; ++i) store(base, i, E, *rc::gen::arbitrary<std::uint64_t>());
  class_spec spec;
  spec.count = static_cast<std::uint8_t>(*rc::gen::inRange<unsigned>(1, std::min<unsigned>(16, static_cast<unsigned>(f.exponents()))));
  {
    std::vector<std::uint16_t> th;
    while (th.size() + 1 < spec.count) {
      const auto v = static_cast<std::uint16_t>(*rc::gen::inRange<std::uint64_t>(1, f.exponents()));
      if (std::find(th.begin(), th.end(), v) == th.end()) th.push_back(v);
    }
    std::sort(th.begin(), th.end());
    std::copy(th.begin(), th.end(), spec.thresholds.begin());
  }
  RC_ASSERT(valid_class_spec(spec, f));
  std::vector<std::uint32_t> pos;
  for (std::size_t i = 0; i < n; ++i)
    if (*rc::gen::inRange(0, 4) == 0) pos.push_back(static_cast<std::uint32_t>(i));
  // reference
  std::vector<std::uint8_t> rc_cls(pos.size());
  std::vector<std::uint32_t> rc_rank(pos.size());
  {
    std::vector<std::uint64_t> seen(spec.count, 0);
    std::size_t k = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned c = spec.class_of_exponent(f.exponent(load(base, i, E)));
      if (k < pos.size() && pos[k] == i) rc_cls[k] = static_cast<std::uint8_t>(c), rc_rank[k] = static_cast<std::uint32_t>(seen[c]), ++k;
      ++seen[c];
    }
  }
  // slices of random sizes, totals carried; each slice with or without the changes' base values
  // (the encoder's hint: classes read from them instead of the base)
  std::vector<std::uint8_t> cls(pos.size());
  std::vector<std::uint32_t> rank(pos.size());
  std::vector<std::uint64_t> totals(spec.count, 0);
  std::size_t at = 0, k = 0;
  while (at < n) {
    const std::size_t len = std::min(n - at, *rc::gen::inRange<std::size_t>(1, 700));
    std::vector<std::uint32_t> rel;
    const std::size_t k0 = k;
    while (k < pos.size() && pos[k] < at + len) rel.push_back(static_cast<std::uint32_t>(pos[k++] - at));
    const std::span<const std::byte> slice = std::span<const std::byte>(base).subspan(at * E, len * E);
    std::vector<std::byte> values;
    if (*rc::gen::arbitrary<bool>())
      for (std::uint32_t p : rel) values.insert(values.end(), slice.begin() + p * E, slice.begin() + (p + 1) * E);
    rank_by_class(slice, f, spec, rel, values, std::span(cls).subspan(k0), std::span(rank).subspan(k0), totals);
    at += len;
  }
  RC_ASSERT(cls == rc_cls);
  RC_ASSERT(rank == rc_rank);
  std::uint64_t sum = 0;
  for (auto v : totals) sum += v;
  RC_ASSERT(sum == n);
}

// ---- whole items -------------------------------------------------------------------------------

TEST(Conditioned, TrainingLikeDeltasChooseItAndRoundTripInEveryFloatFormat) {
  for (dtype t : float_dtypes) {
    const auto d = training_like(t, 200000, 7);
    encode_stats chosen, xr;
    const auto f = encode_one(d, mode_policy::xor_allowed, &chosen);
    const auto fx = encode_one(d, mode_policy::xor_only, &xr);
    EXPECT_EQ(chosen.conditioned_items, 1u) << dtype_name(t);
    EXPECT_LT(f.size(), fx.size() * 9 / 10) << dtype_name(t) << ": base-conditioned should be well below XOR here";
    const auto out = apply_to(f, t, d.old_b);
    ASSERT_TRUE(out.has_value()) << dtype_name(t);
    EXPECT_EQ(*out, d.new_b) << dtype_name(t);
    EXPECT_EQ(f, encode_one(d, mode_policy::xor_allowed)) << "deterministic";
    const frame_view v = frame_view::parse(f);
    ASSERT_EQ(v.items().size(), 1u);
    EXPECT_EQ(v.items()[0].mode, value_mode::base_conditioned);
    EXPECT_EQ(v.items()[0].locations, location_coding::class_gaps);
    EXPECT_EQ(v.items()[0].values, value_coding::ulp_distance);
  }
}

// The encoder detects and ranks an item's changes slice by slice (chunk_encoder's slice_bytes of
// input, 128 KiB), carrying each class's element count from slice to slice, while the decoder ranks
// over the whole range. A slice without a change must still be counted: it was skipped, so every
// later change was ranked short and applied to the wrong element, a wrong result and no refusal
// (as when a block of rows, or an embedding's unused tokens, keep their bits for a step). Two
// unchanged runs of 300,000 elements hold whole slices for every element size; encode() and
// encode_known() (the owners' path) must give the same frame and both must round-trip, with
// several classes (training-like changes) and with one (changes that ignore the base).
TEST(Conditioned, SlicesWithoutChangesStillCountTowardLaterRanks) {
  constexpr std::size_t n = std::size_t{1} << 20;
  for (dtype t : float_dtypes) {
    const std::size_t E = element_size(t);
    for (const bool several : {true, false}) {
      delta_case d = several ? training_like(t, n, 11) : independent_changes(t, n, 11, 20);
      for (const std::size_t from : {std::size_t{0}, std::size_t{500000}})
        std::copy_n(d.old_b.begin() + static_cast<std::ptrdiff_t>(from * E), 300000 * E, d.new_b.begin() + static_cast<std::ptrdiff_t>(from * E));
      const std::string what = std::string(dtype_name(t)) + (several ? ", several classes" : ", one class");
      encode_stats st;
      const auto f = encode_one(d, mode_policy::xor_allowed, &st);
      ASSERT_EQ(st.conditioned_items, 1u) << what;
      const frame_view v = frame_view::parse(f);
      const unsigned classes = std::to_integer<unsigned>(v.location_section(0)[0]);
      if (several) EXPECT_GT(classes, 1u) << what;
      else EXPECT_EQ(classes, 1u) << what;
      const auto out = apply_to(f, t, d.old_b);
      ASSERT_TRUE(out.has_value()) << what;
      EXPECT_TRUE(*out == d.new_b) << what << ": the changes after an unchanged slice landed elsewhere";
      EXPECT_TRUE(encode_known_one(d, mode_policy::xor_allowed) == f) << what << ": encode_known and encode differ";
    }
  }
}

// The same in any slicing of the encoder's walk: items of two to three slices of every element
// width, training-like or base-independent changes, one to three unchanged runs of any length and
// place (smaller items: the properties above); encode() and encode_known() give one frame and it
// round-trips. (A throwaway harness of this shape had 41 bad items in 150 before the fix above,
// none in 2,150 after.)
RC_GTEST_PROP(Conditioned, ItemsWithUnchangedRunsRoundTripInAnySlicing, ()) {
  const dtype t = *rc::gen::elementOf(float_dtypes);
  const std::size_t E = element_size(t);
  const std::size_t n = *rc::gen::inRange<std::size_t>((std::size_t{256} << 10) / E, (std::size_t{384} << 10) / E);  // 2-3 slices
  const auto seed = *rc::gen::arbitrary<std::uint32_t>();
  delta_case d = *rc::gen::arbitrary<bool>() ? training_like(t, n, seed) : independent_changes(t, n, seed, *rc::gen::inRange(2u, 200u));
  // places and lengths from a generated seed: rc::gen::inRange scales with the test's size, which
  // kept the runs short and near the start for most of the hundred tests
  std::mt19937_64 g(*rc::gen::arbitrary<std::uint64_t>());
  const int runs = *rc::gen::inRange(1, 4);
  for (int r = 0; r < runs; ++r) {
    const std::size_t from = g() % n, len = g() % (n - from + 1);
    std::copy_n(d.old_b.begin() + static_cast<std::ptrdiff_t>(from * E), len * E, d.new_b.begin() + static_cast<std::ptrdiff_t>(from * E));
  }
  RC_PRE(d.old_b != d.new_b);
  const auto f = encode_one(d, mode_policy::conditioned_only);
  const auto out = apply_to(f, t, d.old_b);
  RC_ASSERT(out.has_value());
  RC_ASSERT(*out == d.new_b);
  RC_ASSERT(encode_known_one(d, mode_policy::conditioned_only) == f);
}

// Changes that do not depend on the base value (each BF16 element of a N(0, 0.02)-like base moves
// one ULP up or down with probability `rate`, as bitrefit-bench-codec --change RATE does): the class
// choice must not fit classes to sampling noise (it picked K = 3-4 at 3 % before class_noise_q8),
// since they save nothing and make both ends scan the whole base. The one-class item also takes the
// decoder's one-class path: bits round trip, and a wrong base is refused with the target untouched.
TEST(Conditioned, ChangesIndependentOfTheBaseGetOneClass) {
  const std::size_t n = std::size_t{8} << 20;  // 16 MiB: large enough that the choice runs on a sample
  for (const double rate : {0.01, 0.03, 0.05}) {
    delta_case d{dtype::BF16, std::vector<std::byte>(n * 2), {}};
    std::mt19937_64 g(static_cast<std::uint64_t>(rate * 1000));
    std::normal_distribution<float> w(0.0f, 0.02f);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = w(g);
      std::uint32_t b;
      std::memcpy(&b, &x, 4);
      store(d.old_b, i, 2, b >> 16);  // truncation: the distribution of exponents is what matters
    }
    d.new_b = d.old_b;
    const auto cut = static_cast<std::uint64_t>(rate * 18446744073709551615.0);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t r = g();
      const std::uint64_t o = load(d.old_b, i, 2);
      if (r < cut && (o & 0x7FFF) != 0 && (o & 0x7F80) != 0x7F80) store(d.new_b, i, 2, (r & 1) ? o + 1 : o - 1);
    }
    encode_stats st;
    const auto f = encode_one(d, mode_policy::xor_allowed, &st);
    EXPECT_EQ(st.conditioned_items, 1u) << rate;  // the ULP values still beat XOR
    const frame_view v = frame_view::parse(f);
    ASSERT_EQ(v.items().size(), 1u);
    ASSERT_EQ(v.items()[0].mode, value_mode::base_conditioned);
    EXPECT_EQ(std::to_integer<unsigned>(v.location_section(0)[0]), 1u) << "classes at rate " << rate;
    EXPECT_EQ(lanes_flags(v.location_section(0)), std::vector<bool>{true}) << "a class of 84k-420k changes: 16-lane streams";
    const auto out = apply_to(f, dtype::BF16, d.old_b);
    ASSERT_TRUE(out.has_value()) << rate;
    EXPECT_TRUE(*out == d.new_b) << rate;
    // every element at +0: the -1 ULP steps leave the finite range, so the item is refused whole
    std::vector<std::byte> zeros(d.old_b.size());
    EXPECT_FALSE(apply_to(f, dtype::BF16, zeros).has_value()) << rate;
  }
}

// Classes of at least conditioned_detail::lanes_min_changes changes in formats of up to 2 bytes
// take 16-lane streams, the others the one-state streams, in the same item: both round trip, and
// special values escape exactly in either. A wrong base is refused with the target untouched.
TEST(Conditioned, LargeClassesTakeSixteenLanesInEveryPackedFormat) {
  for (dtype t : {dtype::BF16, dtype::F16, dtype::F8_E4M3, dtype::F8_E5M2}) {
    auto d = training_like(t, std::size_t{3} << 19, 17);
    const auto f = *float_format_of(t);
    // special values among the changes: +-0 sign flips, NaN payloads, infinities, subnormals
    std::mt19937_64 g(18);
    for (std::size_t i = 0; i < d.n(); i += 97) {
      const std::uint64_t sign = (g() & 1) ? f.sign_bit : 0;
      const std::uint64_t inf = f.special < f.magnitude_mask ? f.special : f.magnitude_mask;
      const std::uint64_t pats[] = {sign, sign | inf, sign | f.magnitude_mask, sign | 1};
      store(d.old_b, i, f.element_size, pats[g() % 4]);
      store(d.new_b, i, f.element_size, pats[g() % 4] ^ ((g() & 1) ? f.sign_bit : 0));
    }
    encode_stats st;
    const auto fr = encode_one(d, mode_policy::conditioned_only, &st);
    ASSERT_EQ(st.conditioned_items, 1u) << dtype_name(t);
    const auto flags = lanes_flags(frame_view::parse(fr).location_section(0));
    EXPECT_NE(std::count(flags.begin(), flags.end(), true), 0) << dtype_name(t);
    EXPECT_NE(std::count(flags.begin(), flags.end(), false), 0) << dtype_name(t) << ": the small classes keep one state";
    const auto out = apply_to(fr, t, d.old_b);
    ASSERT_TRUE(out.has_value()) << dtype_name(t);
    EXPECT_TRUE(*out == d.new_b) << dtype_name(t);
    std::vector<std::byte> zeros(d.old_b.size());
    EXPECT_FALSE(apply_to(fr, t, zeros).has_value()) << dtype_name(t);
  }
}

TEST(Conditioned, NonFloatDtypesFallBack) {
  for (dtype t : all_dtypes) {
    if (is_floating(t)) continue;
    const std::size_t E = element_size(t), n = 5000;
    delta_case d{t, std::vector<std::byte>(n * E), {}};
    std::mt19937_64 g(4);
    for (auto& b : d.old_b) b = static_cast<std::byte>(g());
    d.new_b = d.old_b;
    for (std::size_t i = 0; i < n; i += 7) d.new_b[i * E] ^= std::byte{1};
    encode_stats st;
    const auto f = encode_one(d, mode_policy::conditioned_only, &st);
    EXPECT_EQ(st.conditioned_items, 0u) << dtype_name(t);
    EXPECT_EQ(*apply_to(f, t, d.old_b), d.new_b) << dtype_name(t);
  }
}

TEST(Conditioned, SpecialValuesEscapeExactly) {
  // every kind of special change in one BF16 item: sign flips of zeros, NaN payloads, infinities,
  // subnormals, and ordinary ULP steps around them
  const std::vector<std::pair<std::uint16_t, std::uint16_t>> pairs = {
      {0x0000, 0x8000}, {0x8000, 0x0000}, {0x7FC1, 0x7FC2}, {0xFFC1, 0x7FC1}, {0x7F80, 0xFF80}, {0x3F80, 0x7F80},
      {0x7F80, 0x3F80}, {0x0001, 0x0000}, {0x8001, 0x8000}, {0x007F, 0x0080}, {0x3F80, 0x3F81}, {0xBF80, 0xBF7F},
      {0x3F80, 0xBF80}, {0x0001, 0x8001}, {0x7F7F, 0x7F7E}, {0x1234, 0x4321}};
  delta_case d{dtype::BF16, std::vector<std::byte>(pairs.size() * 40 * 2), {}};
  d.new_b = d.old_b;
  for (std::size_t i = 0; i < pairs.size() * 40; ++i) {
    const auto& [o, n] = pairs[i % pairs.size()];
    store(d.old_b, i, 2, o);
    store(d.new_b, i, 2, (i / pairs.size()) % 3 == 0 ? o : n);  // a third unchanged
  }
  encode_stats st;
  const auto f = encode_one(d, mode_policy::conditioned_only, &st);
  EXPECT_EQ(st.conditioned_items, 1u);
  EXPECT_EQ(*apply_to(f, dtype::BF16, d.old_b), d.new_b);
}

TEST(Conditioned, AWrongBaseIsRefusedOrDetectedNeverHalfApplied) {
  const auto d = training_like(dtype::BF16, 100000, 9);
  const auto f = encode_one(d, mode_policy::conditioned_only);
  // a base in which every element sits in the lowest class: class ranks run past class sizes
  std::vector<std::byte> other(d.old_b.size());
  for (std::size_t i = 0; i < d.n(); ++i) store(other, i, 2, 0x0001);
  EXPECT_FALSE(apply_to(f, dtype::BF16, other).has_value());
  // the receiver already at the target: -1 ULP steps from +0 etc. leave the range or it decodes
  // something else; either way it is not the target and nothing is half-written
  std::vector<std::byte> zeros(d.old_b.size());
  EXPECT_FALSE(apply_to(f, dtype::BF16, zeros).has_value());
}

// Class ranks that cannot fit the range (their classes' last ranks + 1 sum past m, where valid
// ranks sum to at most the class sizes, m in all) are refused before the receiver sizes its rank
// bitmaps from them: a hostile item cannot make it take more than m bits for them.
TEST(Conditioned, ClassRanksPastTheRangeAreRefusedBeforeTheScan) {
  const auto f = *float_format_of(dtype::BF16);
  class_spec spec;
  spec.count = 2;
  spec.thresholds = {127};  // class 0: |x| < 1, class 1: |x| >= 1
  const std::size_t m = 1000, per_class = 31;
  std::vector<std::uint8_t> classes;
  std::vector<std::uint32_t> ranks;
  std::vector<std::byte> olds, news;
  for (std::size_t k = 0; k < 2 * per_class; ++k) {  // each class's ranks 0, 30, ..., 900
    const auto cls = static_cast<std::uint8_t>(k % 2);
    const std::uint16_t o = cls ? 0x3F80 : 0x3C00, n = static_cast<std::uint16_t>(o + 1);
    classes.push_back(cls);
    ranks.push_back(static_cast<std::uint32_t>(30 * (k / 2)));
    olds.insert(olds.end(), {std::byte(o & 0xFF), std::byte(o >> 8)});
    news.insert(news.end(), {std::byte(n & 0xFF), std::byte(n >> 8)});
  }
  conditioned_encoder enc;
  byte_buffer loc, val;
  enc.encode(f, spec, classes, ranks, olds, news, loc, val);
  std::vector<std::byte> base(2 * m);
  for (std::size_t i = 0; i < m; ++i) {  // 0x3C00 and 0x3F80 in turn: 500 elements a class
    base[2 * i] = std::byte(i % 2 ? 0x80 : 0x00);
    base[2 * i + 1] = std::byte(i % 2 ? 0x3F : 0x3C);
  }
  std::vector<std::uint32_t> pos(classes.size());
  std::vector<std::byte> out(2 * classes.size());
  conditioned_decoder dec;
  try {
    dec.decode(f, m, classes.size(), loc.span(), val.span(), base, pos, out, {});
    FAIL() << "decoded class ranks up to 900 in two classes of a 1000-element range";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("class ranks past their classes' element counts"), std::string::npos) << e.what();
  }
  // the same changes with ranks that fit (each class's last rank 450 < 500) decode to their positions
  for (auto& r : ranks) r /= 2;
  conditioned_encoder enc2;
  byte_buffer loc2, val2;
  enc2.encode(f, spec, classes, ranks, olds, news, loc2, val2);
  dec.decode(f, m, classes.size(), loc2.span(), val2.span(), base, pos, out, {});
  for (std::size_t k = 0; k < classes.size(); ++k) EXPECT_EQ(pos[k], 2 * ranks[k] + classes[k]) << k;
}

// Items written before predicted tables (conditioned_detail::predicted_tables_flag) carry
// write_table's tables: a scale byte and one byte per code. The decoder still reads them, to the
// same changes: each item's sections are rewritten here into that form (flag cleared, the same
// codes) and decoded beside the original.
TEST(Conditioned, ItemsWithTheOlderTablesStillDecode) {
  using namespace conditioned_detail;
  const error_context where{};
  for (dtype t : float_dtypes) {
    const auto d = training_like(t, 30000, 21);
    const auto fr = encode_one(d, mode_policy::conditioned_only);
    const frame_view v = frame_view::parse(fr);
    ASSERT_EQ(v.items().size(), 1u);
    const auto f = *float_format_of(t);
    const std::uint64_t changed = v.items()[0].changed;
    const auto loc = v.location_section(0), val = v.value_section(0);
    // the rewrite: headers with the older tables, then the same streams
    rans::reader lr(loc, where), vr(val, where);
    byte_buffer old_loc, old_val;
    const unsigned K = lr.u8();
    old_loc.push_back(static_cast<std::byte>(K));
    for (unsigned j = 0; j + 1 < K; ++j) rans::detail::put_varint(old_loc, lr.varint(~0ull, "threshold"));
    std::vector<std::uint64_t> counts;
    unsigned predicted = 0;
    auto older_table = [](const std::vector<std::uint8_t>& codes, std::uint64_t c, byte_buffer& out) {
      std::size_t used = 0;
      for (auto q : codes) used += q != 0;
      out.push_back(static_cast<std::byte>(scale_bits_for(c, used)));
      rans::detail::put_varint(out, codes.size());
      for (auto q : codes) out.push_back(static_cast<std::byte>(q));
    };
    for (unsigned k = 0; k < K; ++k) {
      const std::uint64_t c = lr.varint(~0ull, "count");
      rans::detail::put_varint(old_loc, c);
      counts.push_back(c);
      if (!c) continue;
      const unsigned shift_byte = lr.u8();
      predicted += (shift_byte & predicted_tables_flag) != 0;
      old_loc.push_back(static_cast<std::byte>(shift_byte & ~predicted_tables_flag));
      older_table(rans::read_predicted_codes(lr, gap_alphabet, gap_code_prediction, "gap table"), c, old_loc);
      rans::detail::put_varint(old_loc, lr.varint(~0ull, "gap stream length"));
    }
    for (unsigned k = 0; k < K; ++k)
      if (counts[k]) {
        older_table(rans::read_predicted_codes(vr, value_alphabet(f), value_code_prediction, "value table"), counts[k], old_val);
        rans::detail::put_varint(old_val, vr.varint(~0ull, "value stream length"));
      }
    old_loc.append(lr.rest());
    old_val.append(vr.rest());
    std::size_t nonempty = 0;
    for (auto c : counts) nonempty += c != 0;
    EXPECT_EQ(predicted, nonempty) << dtype_name(t) << ": every class of a new item has predicted tables";
    EXPECT_LT(loc.size() + val.size(), old_loc.size() + old_val.size()) << dtype_name(t);
    conditioned_decoder dec;
    std::vector<std::uint32_t> pos(changed), old_pos(changed);
    std::vector<std::byte> out(changed * f.element_size), old_out(changed * f.element_size);
    dec.decode(f, d.n(), changed, loc, val, d.old_b, pos, out, where);
    dec.decode(f, d.n(), changed, old_loc.span(), old_val.span(), d.old_b, old_pos, old_out, where);
    EXPECT_EQ(old_pos, pos) << dtype_name(t);
    EXPECT_EQ(old_out, out) << dtype_name(t);
    // and they are the changes
    std::size_t i = 0;
    for (std::size_t e = 0; e < d.n(); ++e)
      if (load(d.old_b, e, f.element_size) != load(d.new_b, e, f.element_size)) {
        ASSERT_LT(i, changed);
        EXPECT_EQ(pos[i], e);
        EXPECT_EQ(std::memcmp(out.data() + i * f.element_size, d.new_b.data() + e * f.element_size, f.element_size), 0);
        ++i;
      }
    EXPECT_EQ(i, changed) << dtype_name(t);
  }
}

TEST(Conditioned, DecodingWithoutABaseIsAMismatch) {
  const auto d = training_like(dtype::BF16, 10000, 10);
  const auto f = encode_one(d, mode_policy::conditioned_only);
  frame_decoder dec;
  const frame_view v = frame_view::parse(f);
  try {
    dec.decode(v);
    FAIL() << "decoded a base-conditioned item without its base";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
  }
  // a receiver that holds none of the range skips it (verified structure only)
  const auto items = dec.decode(v, {}, [](const frame_item&) { return std::optional<std::span<const std::byte>>{}; });
  ASSERT_EQ(items.size(), 1u);
  EXPECT_TRUE(items[0].skipped);
}

TEST(FrameVersion, OldAndNewFramesAreRefusedByName) {
  const auto d = training_like(dtype::BF16, 1000, 11);
  auto f = encode_one(d, mode_policy::xor_allowed);
  ASSERT_EQ(detail::get_le<std::uint16_t>(f.data() + 4), 2);
  for (std::uint16_t ver : {1, 3}) {
    auto g = f;
    g[4] = static_cast<std::byte>(ver);
    refresh_digest(g);
    try {
      (void)frame_view::parse(g);
      FAIL() << "version " << ver << " accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::unsupported);
      EXPECT_NE(std::string(e.what()).find(ver == 1 ? "older" : "newer"), std::string::npos) << e.what();
    }
  }
}

// Any byte of a base-conditioned frame's sections altered (and the digest recomputed, as a
// malicious or buggy sender could): the applier throws with the target untouched, or applies a
// frame that decodes completely. It never reads or writes out of bounds (the sanitizer builds run
// this too).
// One byte of the one item's sections of frame f altered by a generated nonzero mask, the digest
// recomputed, then applied to the base: throws (apply_to checks the target untouched) or applies;
// it must not crash.
namespace {
void apply_with_one_section_byte_altered(std::vector<std::byte> f, dtype t, const std::vector<std::byte>& base) {
  const frame_view v = frame_view::parse(f);
  const std::size_t body_end = f.size() - frame_digest_size;
  const std::size_t sections = body_end - v.items()[0].location_stored_size - v.items()[0].value_stored_size;
  f[*rc::gen::inRange(sections, body_end)] ^= static_cast<std::byte>(*rc::gen::inRange(1, 256));
  refresh_digest(f);
  (void)apply_to(f, t, base);
}
}  // namespace

// The same for an item whose one class has 16-lane streams (about 105 000 changes): the vector
// decoder's groups, the scalar decoder's last groups, the tables and the flag byte.
RC_GTEST_PROP(Conditioned, AlteredSixteenLaneSectionsAreRefusedOrDecodedWhole, ()) {
  static const auto d = independent_changes(dtype::BF16, std::size_t{1} << 21, 31, 20);
  static const auto f = encode_one(d, mode_policy::conditioned_only);
  static const bool lanes = lanes_flags(frame_view::parse(f).location_section(0)) == std::vector<bool>{true};
  RC_ASSERT(lanes);
  apply_with_one_section_byte_altered(f, dtype::BF16, d.old_b);
}

RC_GTEST_PROP(Conditioned, AlteredSectionsAreRefusedOrDecodedWhole, ()) {
  const dtype t = *rc::gen::elementOf(float_dtypes);
  const auto d = training_like(t, *rc::gen::inRange<std::size_t>(64, 3000), *rc::gen::arbitrary<std::uint32_t>());
  const auto f = encode_one(d, mode_policy::conditioned_only);
  RC_PRE(!frame_view::parse(f).items().empty());
  apply_with_one_section_byte_altered(f, t, d.old_b);
}

// Items whose changes ignore the base value get one class and take the decoder's one-class path:
// bits round trip in every float format, specials included, and altered sections are refused with
// the target untouched or decode whole, as for items of several classes.
RC_GTEST_PROP(Conditioned, OneClassItemsRoundTripAndRefuseAlterations, ()) {
  const dtype t = *rc::gen::elementOf(float_dtypes);
  const auto d = independent_changes(t, *rc::gen::inRange<std::size_t>(64, 5000), *rc::gen::arbitrary<std::uint32_t>(),
                                     *rc::gen::inRange(2u, 40u));
  RC_PRE(d.old_b != d.new_b);
  const auto f = encode_one(d, mode_policy::conditioned_only);
  const frame_view v = frame_view::parse(f);
  RC_ASSERT(v.items().size() == 1u);
  RC_ASSERT(v.items()[0].mode == value_mode::base_conditioned);
  RC_ASSERT(std::to_integer<unsigned>(v.location_section(0)[0]) == 1u);
  const auto out = apply_to(f, t, d.old_b);
  RC_ASSERT(out.has_value());
  RC_ASSERT(*out == d.new_b);
  apply_with_one_section_byte_altered(f, t, d.old_b);
}

// ---- every instruction-set variant gives the same bits -------------------------------------------
// (the dispatch picks one per CPU; these run every variant the test machine can execute)

// The class choice reads one histogram entry per exponent of the format: histograms of another
// length are refused by name (they would be read past their end), and a valid choice is a valid spec.
TEST(ClassChoice, HistogramsMustHaveOneEntryPerExponent) {
  for (dtype t : {dtype::BF16, dtype::F16, dtype::F32, dtype::F64, dtype::F8_E4M3, dtype::F8_E5M2}) {
    const auto f = *float_format_of(t);
    std::vector<std::uint64_t> base(f.exponents()), changed(f.exponents());
    for (std::size_t e = 0; e < base.size(); ++e) base[e] = 1000 + e % 7, changed[e] = e < base.size() / 2 ? 500 : 3;
    const class_spec spec = choose_class_spec(f, base, changed, 8, 1, 1, 1);
    EXPECT_GT(spec.count, 1u) << dtype_name(t) << ": two change rates, so more than one class pays";
    EXPECT_TRUE(valid_class_spec(spec, f)) << dtype_name(t);
    const std::vector<std::uint64_t> short_one(f.exponents() - 1, 1);
    EXPECT_THROW(choose_class_spec(f, short_one, changed, 8, 1, 1, 1), error) << dtype_name(t);
    EXPECT_THROW(choose_class_spec(f, base, short_one, 8, 1, 1, 1), error) << dtype_name(t);
  }
}

TEST(Kernels, ClassMasksOfEveryVariantEqualTheScalarOnes) {
  std::mt19937_64 g(12);
  for (dtype t : {dtype::BF16, dtype::F16, dtype::F32}) {
    const auto f = *float_format_of(t);
    const std::size_t E = f.element_size, blocks = 37;
    std::vector<std::byte> base(blocks * 64 * E);
    for (auto& b : base) b = static_cast<std::byte>(g());
    class_spec spec;
    spec.count = 5;
    spec.thresholds = {1, 3, static_cast<std::uint16_t>(f.exponents() / 2), static_cast<std::uint16_t>(f.exponents() - 1)};
    const auto c = detail::thresholds_of(f, spec);
    const unsigned T = c.T;
    std::vector<std::uint64_t> ref(blocks * T), got(blocks * T);
    for (std::size_t b = 0; b < blocks; ++b)
      detail::with_word(E, [&](auto w) { detail::block_masks_scalar<decltype(w)>(base.data() + b * 64 * E, 64, c, ref.data() + b * T); });
#ifdef BITREFIT_CODEC_X86
    if (__builtin_cpu_supports("avx2")) {
      std::fill(got.begin(), got.end(), 0);
      if (E == 2) detail::block_masks_16_avx2(base.data(), blocks, c, got.data(), T);
      else detail::block_masks_32_avx2(base.data(), blocks, c, got.data(), T);
      EXPECT_EQ(got, ref) << "avx2 " << dtype_name(t);
    }
    if (cpu_avx512bw()) {
      std::fill(got.begin(), got.end(), 0);
      if (E == 2) detail::block_masks_16_avx512(base.data(), blocks, c, got.data(), T);
      else detail::block_masks_32_avx512(base.data(), blocks, c, got.data(), T);
      EXPECT_EQ(got, ref) << "avx512 " << dtype_name(t);
    }
    // the generic (non-v3) rank path against the dispatched one
    std::vector<std::uint32_t> pos;
    for (std::uint32_t i = 0; i < blocks * 64; i += 1 + g() % 9) pos.push_back(i);
    std::vector<std::uint8_t> c1(pos.size()), c2(pos.size());
    std::vector<std::uint32_t> r1(pos.size()), r2(pos.size());
    std::vector<std::uint64_t> t1(spec.count, 0), t2(spec.count, 0);
    detail::with_word(E, [&](auto w) {
      detail::rank_generic<decltype(w)>(base.data(), blocks * 64, c, pos.data(), nullptr, pos.size(), c1.data(), r1.data(), t1.data());
    });
    rank_by_class(base, f, spec, pos, {}, c2, r2, t2);
    EXPECT_EQ(c1, c2);
    EXPECT_EQ(r1, r2);
    EXPECT_EQ(t1, t2);
#endif
  }
}

// Class ranks of 2- and 4-byte formats with AVX-512 (rank_avx512) against the scalar path
// (rank_generic): class counts 2, 3, 5, 9 and 16 (one and two vectors of counts), ranges of one element to several 8 192-element
// batches with a partial last block, positions from every element to 1 in 40 (the first and the
// last always among them), and totals carried in from an earlier slice; both paths also with the
// changes' base values given (classes read from them, not gathered from the base).
TEST(Kernels, RanksOfTheVectorAndScalarPathsAreTheSame) {
#ifdef BITREFIT_CODEC_X86
  if (!cpu_avx512_vpopcnt() && !cpu_v3()) GTEST_SKIP() << "neither AVX-512 VPOPCNTDQ nor AVX2 on this CPU";
  std::mt19937_64 g(21);
  for (dtype t : {dtype::BF16, dtype::F16, dtype::F32}) {
    const auto f = *float_format_of(t);
    const std::size_t E = f.element_size;
    for (unsigned K : {2u, 3u, 5u, 9u, 16u}) {
      class_spec spec;
      spec.count = static_cast<std::uint8_t>(K);
      for (unsigned j = 0; j + 1 < K; ++j) spec.thresholds[j] = static_cast<std::uint16_t>(1 + j * (f.exponents() - 2) / (K - 1));
      ASSERT_TRUE(valid_class_spec(spec, f)) << dtype_name(t) << " K=" << K;
      const auto c = detail::thresholds_of(f, spec);
      for (std::size_t m : {std::size_t{1}, std::size_t{17}, std::size_t{64}, std::size_t{65}, std::size_t{8192}, std::size_t{3 * 8192 + 100}}) {
        std::vector<std::byte> base(m * E);
        for (auto& b : base) b = static_cast<std::byte>(g());
        for (unsigned every : {1u, 4u, 40u}) {
          std::vector<std::uint32_t> pos;
          for (std::uint32_t i = 0; i < m; ++i)
            if (i == 0 || i + 1 == m || g() % every == 0) pos.push_back(i);
          std::vector<std::byte> values;  // the base elements at the positions
          for (std::uint32_t p : pos) values.insert(values.end(), base.begin() + p * E, base.begin() + (p + 1) * E);
          const std::string at = std::string(dtype_name(t)) + " K=" + std::to_string(K) + " m=" + std::to_string(m) + " every=" + std::to_string(every);
          std::vector<std::uint8_t> c1(pos.size());
          std::vector<std::uint32_t> r1(pos.size());
          std::vector<std::uint64_t> t1(K);
          for (unsigned k = 0; k < K; ++k) t1[k] = 1000 * k + 7;
          const std::vector<std::uint64_t> t0 = t1;
          detail::with_word(E, [&](auto w) {
            detail::rank_generic<decltype(w)>(base.data(), m, c, pos.data(), nullptr, pos.size(), c1.data(), r1.data(), t1.data());
          });
          for (int path = 0; path < 5; ++path) {  // generic with values; AVX-512 without, with; AVX2 without, with
            if ((path == 1 || path == 2) && !cpu_avx512_vpopcnt()) continue;
            if (path > 2 && !cpu_v3()) continue;
            const std::byte* given = path % 2 == 1 ? nullptr : values.data();
            std::vector<std::uint8_t> c2(pos.size());
            std::vector<std::uint32_t> r2(pos.size());
            std::vector<std::uint64_t> t2 = t0;
            detail::with_word(E, [&](auto w) {
              using W = decltype(w);
              if (path == 0) detail::rank_generic<W>(base.data(), m, c, pos.data(), given, pos.size(), c2.data(), r2.data(), t2.data());
              if constexpr (sizeof(W) == 2 || sizeof(W) == 4)
                if (path == 1 || path == 2) detail::rank_avx512<W>(base.data(), m, c, pos.data(), given, pos.size(), c2.data(), r2.data(), t2.data());
              if (path > 2) detail::rank_v3<W>(base.data(), m, c, pos.data(), given, pos.size(), c2.data(), r2.data(), t2.data());
            });
            EXPECT_EQ(c1, c2) << at << " path " << path;
            EXPECT_EQ(r1, r2) << at << " path " << path;
            EXPECT_EQ(t1, t2) << at << " path " << path;
          }
        }
      }
    }
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// A 4-byte gather at a 2-byte element reads the element after it: rank_avx512 leaves a range's
// last element to its scalar loop. Here the base ends at an inaccessible page and the changes
// fill whole groups of sixteen up to the last element: reading past the range is a fault.
TEST(Kernels, VectorRanksReadNothingPastTheRange) {
#ifdef BITREFIT_CODEC_X86
  if (!cpu_avx512_vpopcnt()) GTEST_SKIP() << "no AVX-512 VPOPCNTDQ on this CPU";
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<std::byte*>(mem) + page, page, PROT_NONE), 0);
  const auto f = *float_format_of(dtype::BF16);
  const std::size_t m = 1000;
  std::byte* base = static_cast<std::byte*>(mem) + page - 2 * m;  // its last byte is the page's last
  std::mt19937_64 g(5);
  for (std::size_t i = 0; i < 2 * m; ++i) base[i] = static_cast<std::byte>(g());
  class_spec spec;
  spec.count = 4;
  spec.thresholds = {100, 120, 130};
  const auto c = detail::thresholds_of(f, spec);
  // 160 changes 3 apart, then the last 64 elements: 14 whole groups of sixteen, the last of them
  // ending at the range's last element
  std::vector<std::uint32_t> pos;
  for (std::uint32_t i = 0; i < 480; i += 3) pos.push_back(i);
  for (auto i = static_cast<std::uint32_t>(m - 64); i < m; ++i) pos.push_back(i);
  ASSERT_EQ(pos.size() % 16, 0u);
  std::vector<std::uint8_t> c1(pos.size()), c2(pos.size());
  std::vector<std::uint32_t> r1(pos.size()), r2(pos.size());
  std::vector<std::uint64_t> t1(4), t2(4);
  detail::rank_generic<std::uint16_t>(base, m, c, pos.data(), nullptr, pos.size(), c1.data(), r1.data(), t1.data());
  detail::rank_avx512<std::uint16_t>(base, m, c, pos.data(), nullptr, pos.size(), c2.data(), r2.data(), t2.data());
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(r1, r2);
  EXPECT_EQ(t1, t2);
  munmap(mem, 2 * page);
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// The several-class scan deposits each class's changed-rank bits on the class's lanes: the portable
// deposit (CPUs without BMI2) must be pdep, including bits past the mask's popcount (dropped),
// an empty mask and a full one.
TEST(Kernels, PortableDepositIsPdep) {
#ifdef BITREFIT_CODEC_X86
  if (!cpu_v3()) GTEST_SKIP() << "no BMI2 on this CPU";
  std::mt19937_64 g(37);
  for (int i = 0; i < 200000; ++i) {
    std::uint64_t mask = g(), bits = g();
    if (i % 3 == 0) mask &= g();
    if (i % 5 == 0) mask &= g() & g();
    if (i % 7 == 0) bits &= (std::uint64_t{1} << (g() % 64)) - 1;
    if (i == 0) mask = 0;
    if (i == 1) mask = ~0ull;
    ASSERT_EQ(conditioned_detail::deposit<false>(bits, mask), conditioned_detail::deposit<true>(bits, mask)) << std::hex << bits << " " << mask;
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// The several-class scan's block step with AVX-512: up to sixteen changed lanes of a block, each
// lane's class from nested threshold words, each change's index the next of its class plus the
// block's earlier changes of that class. Must equal the scalar walk over the lanes, for every count
// 0..16 of changes and 1..15 threshold words.
TEST(Kernels, BlockChangesOfTheVectorAndScalarPathsAreTheSame) {
#ifdef BITREFIT_CODEC_X86
  if (!cpu_avx512_block_changes()) GTEST_SKIP() << "no AVX-512 VBMI2/CD/VPOPCNTDQ on this CPU";
  std::mt19937_64 g(41);
  for (int round = 0; round < 20000; ++round) {
    const unsigned T = 1 + static_cast<unsigned>(g() % 15);
    std::uint64_t e[17] = {};
    e[0] = ~0ull;
    for (unsigned j = 1; j <= T; ++j) e[j] = e[j - 1] & (g() | g());  // nested: e[j] within e[j-1]
    const unsigned n = static_cast<unsigned>(round % 17);
    std::uint64_t hits = 0;
    while (static_cast<unsigned>(std::popcount(hits)) < n) hits |= std::uint64_t{1} << (g() % 64);
    alignas(64) std::uint32_t next[16];
    for (auto& x : next) x = static_cast<std::uint32_t>(g() >> 40);
    const auto start = static_cast<std::uint32_t>(64 * (g() % 1000000));
    std::vector<std::uint32_t> want_pos, want_src, got_pos(16, 7), got_src(16, 7);
    std::uint32_t counts[16] = {};
    for (std::uint64_t h = hits; h; h &= h - 1) {
      const unsigned lane = static_cast<unsigned>(std::countr_zero(h));
      unsigned cls = 0;
      for (unsigned j = 1; j <= T; ++j) cls += static_cast<unsigned>((e[j] >> lane) & 1);
      want_pos.push_back(start + lane);
      want_src.push_back(next[cls] + counts[cls]++);
    }
    conditioned_detail::block_changes_avx512(hits, n, e, T, next, start, got_pos.data(), got_src.data());
    for (unsigned t = 0; t < 16; ++t) {
      if (t < n) {
        ASSERT_EQ(got_pos[t], want_pos[t]) << "round " << round << " change " << t;
        ASSERT_EQ(got_src[t], want_src[t]) << "round " << round << " change " << t;
      } else {  // nothing written past the block's changes
        ASSERT_EQ(got_pos[t], 7u) << "round " << round;
        ASSERT_EQ(got_src[t], 7u) << "round " << round;
      }
    }
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// The receiver's new patterns for 2-byte formats: the AVX-512 kernel (sixteen changes at a time,
// distances and escape patterns loaded in order or gathered through an index) must give the scalar
// new_pattern's bits and its verdict, for every kind of change: ±1 ULP and long steps, escapes
// (sign changes, ±0, NaN payloads, ±inf), and each way a value can be refused (an escape equal to its
// base, a base that is not finite, a step past the finite range or through zero), wherever in a
// group of sixteen it sits. The base ends at a PROT_NONE page and the last change is its last
// element, which the kernel must leave to the scalar loop (its 4-byte gather would fault).
TEST(Kernels, NewPatternsOfTheVectorAndScalarPathsAreTheSame) {
  namespace cd = conditioned_detail;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t m = 1000;
  ASSERT_LE(2 * m, page);
  void* mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<std::byte*>(mem) + page, page, PROT_NONE), 0);
  std::byte* base = static_cast<std::byte*>(mem) + page - 2 * m;
  std::mt19937_64 g(31);
  std::size_t checked_bad = 0, checked_good = 0;
  for (dtype t : {dtype::BF16, dtype::F16}) {
    const auto f = *float_format_of(t);
    // one change kind per draw; `want_bad` says whether new_pattern refuses it
    const auto draw = [&](std::uint16_t& o, std::int64_t& d, std::uint64_t& raw, bool want_bad) {
      for (;;) {
        o = static_cast<std::uint16_t>(g());
        raw = static_cast<std::uint16_t>(g());
        switch (g() % 6) {
          case 0: d = 0; if (g() % 2) raw = o; break;                                       // escape (to itself: refused)
          case 1: d = (g() % 2) ? 1 : -1; break;                                           // one ULP
          case 2: d = static_cast<std::int64_t>(g() % 300) - 150; break;                   // a few ULP, or an escape
          case 3: d = static_cast<std::int64_t>(g() % f.magnitude_mask) * ((g() % 2) ? 1 : -1); break;  // anywhere
          case 4: o = static_cast<std::uint16_t>((g() % 2 ? f.sign_bit : 0) | (f.special + g() % 4)); d = 1; break;  // inf/NaN base
          default: o = static_cast<std::uint16_t>(g() % 3); d = -static_cast<std::int64_t>(g() % 4); break;  // around zero
        }
        bool bad = false;
        (void)cd::new_pattern(f, o, d, raw, bad);
        if (bad == want_bad) return;
      }
    };
    for (int round = 0; round < 400; ++round) {
      // n changes at ascending positions, the last one at m - 1; one bad change or none
      const std::size_t n = 1 + g() % 80;
      std::vector<std::uint32_t> pos(n);
      std::vector<std::uint32_t> all(m - 1);
      for (std::uint32_t i = 0; i < m - 1; ++i) all[i] = i;
      std::shuffle(all.begin(), all.end(), g);
      std::copy_n(all.begin(), n - 1, pos.begin());
      std::sort(pos.begin(), pos.end() - 1);
      pos[n - 1] = static_cast<std::uint32_t>(m - 1);
      for (std::size_t i = 0; i < m; ++i) {
        const auto v = static_cast<std::uint16_t>(g());
        std::memcpy(base + 2 * i, &v, 2);
      }
      const std::size_t bad_at = round % 2 ? g() % n : n;  // n: none
      // distances and escapes in a shuffled order, reached through src (the several-class scan),
      // and the same in change order (one class)
      std::vector<std::uint32_t> src(n);
      for (std::uint32_t k = 0; k < n; ++k) src[k] = k;
      std::shuffle(src.begin(), src.end(), g);
      std::vector<std::int64_t> dist(n), dist_ordered(n);
      std::vector<std::uint64_t> raw(n), raw_ordered(n);
      for (std::size_t k = 0; k < n; ++k) {
        std::uint16_t o;
        draw(o, dist_ordered[k], raw_ordered[k], k == bad_at);
        std::memcpy(base + 2 * std::size_t{pos[k]}, &o, 2);
        dist[src[k]] = dist_ordered[k];
        raw[src[k]] = raw_ordered[k];
      }
      std::vector<std::byte> want(2 * n), got(2 * n), got_ordered(2 * n);
      bool want_bad = false, got_bad = false, got_bad_ordered = false;
      for (std::size_t k = 0; k < n; ++k) {
        std::uint16_t o;
        std::memcpy(&o, base + 2 * std::size_t{pos[k]}, 2);
        const auto w = static_cast<std::uint16_t>(cd::new_pattern(f, o, dist_ordered[k], raw_ordered[k], want_bad));
        std::memcpy(want.data() + 2 * k, &w, 2);
      }
      cd::new_patterns<std::uint16_t>(f, base, m, pos.data(), src.data(), dist.data(), raw.data(), n, got.data(), got_bad);
      cd::new_patterns<std::uint16_t>(f, base, m, pos.data(), nullptr, dist_ordered.data(), raw_ordered.data(), n, got_ordered.data(),
                                      got_bad_ordered);
      ASSERT_EQ(want_bad, bad_at < n);
      ASSERT_EQ(got_bad, want_bad) << dtype_name(t) << " round " << round << " bad change " << bad_at << " of " << n;
      ASSERT_EQ(got_bad_ordered, want_bad) << dtype_name(t) << " round " << round << " bad change " << bad_at << " of " << n;
      // the bits too, refused or not (new_pattern computes them either way)
      ASSERT_EQ(got, want) << dtype_name(t) << " round " << round;
      ASSERT_EQ(got_ordered, want) << dtype_name(t) << " round " << round;
      ++(want_bad ? checked_bad : checked_good);
    }
  }
  EXPECT_EQ(checked_good, 400u);
  EXPECT_EQ(checked_bad, 400u);
  munmap(mem, 2 * page);
}

// Pass 1 of the conditioned encoder (gaps, value codes, histograms) for a 2-byte format: the
// AVX-512 kernels (one class, several classes) plus the scalar tail must give what the scalar pass
// alone gives, on every kind of change (±1 ULP, long jumps, sign changes, ±0, subnormals, ±inf,
// NaN payloads) and gaps from 0 to 2^30, for counts around the kernels' 16-change steps.
TEST(Kernels, ClassCountsOfEveryVariantAreTheCounts) {
  namespace cd = conditioned_detail;
  std::mt19937_64 g(23);
  for (unsigned K : {2u, 4u, 16u})
    for (std::size_t c : {0, 1, 63, 64, 65, 1000, 4099}) {
      std::vector<std::uint8_t> cls(c);
      std::array<std::uint64_t, max_base_classes> want{};
      for (auto& k : cls) k = static_cast<std::uint8_t>(g() % 3 == 0 ? g() % K : K - 1), ++want[k];  // skewed to the last class
      std::array<std::uint64_t, max_base_classes> got{};
      cd::class_counts_scalar(cls.data(), c, K, got.data());
      EXPECT_EQ(got, want) << "scalar K=" << K << " c=" << c;
#ifdef BITREFIT_CODEC_X86
      if (cpu_avx512bw()) {
        got = {};
        cd::class_counts_avx512(cls.data(), c, K, got.data());
        EXPECT_EQ(got, want) << "avx512 K=" << K << " c=" << c;
      }
#endif
    }
}

TEST(Kernels, PassOneOfEveryVariantEqualsTheScalarOne) {
#ifdef BITREFIT_CODEC_X86
  std::vector<bool> variants;  // the kernels this CPU runs: AVX-512 (true), AVX2 (false)
  if (cpu_avx512_lzcnt()) variants.push_back(true);
  if (cpu_v3()) variants.push_back(false);
  if (variants.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512CD on this CPU";
  namespace cd = conditioned_detail;
  std::mt19937_64 g(19);
  for (dtype t : {dtype::BF16, dtype::F16}) {
    const auto f = *float_format_of(t);
    const unsigned VA = cd::value_alphabet(f);
    const std::uint64_t sp = f.special, sg = f.sign_bit;
    const std::array<std::uint64_t, 12> specials{0, sg, 1, sg | 1, (1u << f.mantissa_bits) - 1, sp, sg | sp, sp | 1,
                                                 sg | sp | ((1u << f.mantissa_bits) - 1), sp - 1, sg | (sp - 1), 1u << f.mantissa_bits};
    for (unsigned K : {1u, 3u, 16u})
    for (std::size_t c : {0, 1, 15, 16, 17, 31, 32, 33, 100, 1000, 4099}) {
      std::vector<std::uint32_t> rk(c);
      std::vector<std::uint8_t> cls(c);
      std::vector<std::byte> ov(2 * c), nv(2 * c);
      std::array<std::uint32_t, max_base_classes> rank{};  // next rank per class
      std::array<std::uint64_t, max_base_classes> count{};
      for (unsigned k = 0; k < K; ++k) rank[k] = static_cast<std::uint32_t>(g() % 3);
      for (std::size_t i = 0; i < c; ++i) {
        const unsigned k = g() % 4 == 0 ? static_cast<unsigned>(g() % K) : 0;  // skewed: class 0 most
        cls[i] = static_cast<std::uint8_t>(k), ++count[k];
        rk[i] = rank[k];
        const unsigned kind = g() % 8;
        rank[k] += 1 + static_cast<std::uint32_t>(kind == 0 ? g() % (1u << 20) : kind == 1 ? 0 : g() % 40);
        if (g() % 5000 == 0) rank[k] += 1u << 30;
      }
      for (std::size_t i = 0; i < c; ++i) {
        const unsigned kind = g() % 9;
        std::uint64_t o = kind < 2 ? specials[g() % specials.size()] : g() & 0xFFFF;
        std::uint64_t n = o;
        if (kind < 5) {
          const auto step = ulp_step(f, o, (g() & 1 ? 1 : -1) * static_cast<std::int64_t>(kind == 4 ? 1 + g() % 20000 : 1 + g() % 3));
          n = step ? *step : o ^ 1;
        } else if (kind == 5) {
          n = o ^ sg;  // sign change (also -0.0 <-> +0.0)
        } else if (kind == 6) {
          n = specials[g() % specials.size()];
        } else {
          n = g() & 0xFFFF;
        }
        if (n == o) n = o ^ 1;
        store(ov, i, 2, o), store(nv, i, 2, n);
      }
      std::array<unsigned, max_base_classes> shift{};
      for (unsigned k = 0; k < K; ++k) shift[k] = static_cast<unsigned>(g() % 12);
      struct run {
        std::vector<std::uint32_t> gaps, vcode;
        std::vector<std::uint64_t> gh, vh;
        cd::pass1_out out;
        run(std::size_t c, unsigned K, unsigned VA) : gaps(c), vcode(c), gh(4 * K * cd::gap_alphabet), vh(4 * K * VA) {
          out = {gaps.data(), vcode.data(), nullptr, {}, {}};
          for (std::size_t copy = 0; copy < 4; ++copy) out.gh[copy] = gh.data() + copy * K * cd::gap_alphabet, out.vh[copy] = vh.data() + copy * K * VA;
        }
        std::vector<std::uint64_t> sum(const std::vector<std::uint64_t>& h) const {
          std::vector<std::uint64_t> s(h.size() / 4);
          for (std::size_t i = 0; i < s.size(); ++i) s[i] = h[i] + h[i + s.size()] + h[i + 2 * s.size()] + h[i + 3 * s.size()];
          return s;
        }
      } ref(c + K * cd::class_pad, K, VA);
      // the encoder's layout: class k's changes, then class_pad slots the kernels may overwrite
      cd::pass1_state st_ref;
      for (unsigned k = 1; k < K; ++k) st_ref.slot[k] = st_ref.slot[k - 1] + count[k - 1] + cd::class_pad;
      const cd::pass1_state first = st_ref;
      cd::code_changes<std::uint16_t>(f, shift.data(), cls.data(), rk.data(), ov.data(), nv.data(), 0, c, st_ref, ref.out);
      for (const bool avx512 : variants) {
        run got(c + K * cd::class_pad, K, VA);
        cd::pass1_state st_got = first;
        const std::size_t done = avx512 ? cd::codes_16_avx512(f, K, shift.data(), cls.data(), rk.data(), ov.data(), nv.data(), c, st_got, got.out)
                                        : cd::codes_8_v3(f, K, shift.data(), cls.data(), rk.data(), ov.data(), nv.data(), c, st_got, got.out);
        ASSERT_EQ(done, avx512 ? c / 16 * 16 : c / 8 * 8);
        cd::code_changes<std::uint16_t>(f, shift.data(), cls.data(), rk.data(), ov.data(), nv.data(), done, c, st_got, got.out);
        const std::string what = std::string(dtype_name(t)) + " K=" + std::to_string(K) + " c=" + std::to_string(c) + (avx512 ? " AVX-512" : " AVX2");
        for (unsigned k = 0; k < K; ++k) {
          const auto b = static_cast<std::ptrdiff_t>(first.slot[k]), e = b + static_cast<std::ptrdiff_t>(count[k]);
          EXPECT_TRUE(std::equal(got.gaps.begin() + b, got.gaps.begin() + e, ref.gaps.begin() + b)) << what << " class " << k;
          EXPECT_TRUE(std::equal(got.vcode.begin() + b, got.vcode.begin() + e, ref.vcode.begin() + b)) << what << " class " << k;
        }
        EXPECT_EQ(got.sum(got.gh), ref.sum(ref.gh)) << what;
        EXPECT_EQ(got.sum(got.vh), ref.sum(ref.vh)) << what;
        EXPECT_EQ(st_got.slot, st_ref.slot) << what;
        EXPECT_EQ(st_got.next, st_ref.next) << what;
      }
    }
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// The 16-lane class coding (conditioned_detail::code_class_lanes) with AVX2 and with AVX-512 gives
// the scalar encoder's bytes: gaps from 0 to 2^32 - 1 under shifts 0..12, value codes of every kind (+-1 ULP,
// long jumps, escapes with 16-bit patterns), tables of up to 72 symbols (the gather path) and of
// at most 32 (the register path), counts around the 16-change groups.
TEST(Kernels, SixteenLaneStreamsOfTheVectorAndScalarEncodersAreTheSame) {
#ifdef BITREFIT_CODEC_X86
  namespace cd = conditioned_detail;
  std::vector<cd::lane_kernel> kernels;  // the vector kernels this CPU runs
  if (cpu_v3()) kernels.push_back(cd::lane_kernel::avx2);
  if (cpu_avx512_lzcnt()) kernels.push_back(cd::lane_kernel::avx512);
  if (kernels.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512CD on this CPU";
  const auto f = *float_format_of(dtype::BF16);
  std::mt19937_64 g(23);
  for (std::size_t n : {1u, 15u, 16u, 17u, 32u, 1000u, 4099u, 70001u}) {
    for (const bool wide : {false, true}) {
      const unsigned shift = static_cast<unsigned>(g() % 13);
      std::vector<std::uint32_t> gaps(n), vcode(n);
      std::vector<std::uint64_t> gh(cd::gap_alphabet), vh(cd::value_alphabet(f));
      for (std::size_t i = 0; i < n; ++i) {
        const unsigned kind = static_cast<unsigned>(g() % 16);
        gaps[i] = !wide ? static_cast<std::uint32_t>(g() % (40u << shift)) : kind == 0 ? static_cast<std::uint32_t>(g()) : static_cast<std::uint32_t>(g() % 5000);
        // just below and at powers of two up to 2^32 (the AVX2 bucket's float conversion rounds
        // 2^k - 1 up from k = 26 on)
        if (wide && kind == 3) gaps[i] = static_cast<std::uint32_t>((std::uint64_t{1} << (5 + g() % 28)) - g() % 2);
        std::uint64_t o = 0x3F80 + g() % 0x100, nw = o + 1;
        if (g() & 1) nw = o - 1;
        if (wide && kind == 1) nw = o + 1 + g() % 3000;
        if (wide && kind == 2) nw = g() & 0xFFFF;  // often an escape
        if (nw == o) nw = o ^ 1;
        const auto v = cd::code_value(f, o, nw, 0);
        vcode[i] = v.symbol | (v.extra_bits << 8) | (static_cast<std::uint32_t>(v.extra) << 13);
        ++gh[cd::bucket(gaps[i] >> shift).symbol], ++vh[v.symbol];
      }
      unsigned gs = 0, vs = 0;
      auto table = [&](const std::vector<std::uint64_t>& h, unsigned& scale) {
        std::size_t used = 0, last = 0;
        for (std::size_t i = 0; i < h.size(); ++i)
          if (h[i]) ++used, last = i + 1;
        scale = cd::scale_bits_for(n, used);
        return rans::table_of(std::span(h).first(last), scale);
      };
      const auto gt = rans_lanes::encoder_table(table(gh, gs)), vt = rans_lanes::encoder_table(table(vh, vs));
      if (n >= 1000) {
        EXPECT_EQ(gt.symbols > 32 || vt.symbols > 32, wide) << n;  // both lookup paths run
      }
      const std::uint64_t gap_ops = cd::lane_word_ops(gh, [&](std::uint32_t sym) { return cd::gap_raw_bits(sym, shift); });
      const std::uint64_t value_ops = cd::lane_word_ops(vh, [](std::uint32_t sym) { return cd::value_raw_bits(sym, 16); });
      rans_lanes::encoder g2, v2;
      cd::code_class_lanes(gaps.data(), vcode.data(), n, shift, gt, vt, g2, v2, gap_ops, value_ops, cd::lane_kernel::scalar);
      const auto b = g2.finish(), d = v2.finish();
      for (const auto kernel : kernels) {
        rans_lanes::encoder g1, v1;
        cd::code_class_lanes(gaps.data(), vcode.data(), n, shift, gt, vt, g1, v1, gap_ops, value_ops, kernel);
        const auto a = g1.finish(), c = v1.finish();
        EXPECT_TRUE(std::ranges::equal(a, b)) << "gap stream, n=" << n << " wide=" << wide << " kernel " << static_cast<int>(kernel);
        EXPECT_TRUE(std::ranges::equal(c, d)) << "value stream, n=" << n << " wide=" << wide << " kernel " << static_cast<int>(kernel);
      }
    }
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

TEST(Kernels, ChangeDetectionOfEveryVariantIsTheSame) {
  std::mt19937_64 g(13);
  // sizes around the 2-byte kernel's runs of 4096 elements (and its 64-byte blocks), up to many runs
  for (std::size_t E : {1u, 2u, 4u, 8u})
    for (unsigned rate : {0u, 3u, 40u, 100u})
    for (std::size_t m : {std::size_t{31}, std::size_t{4096}, std::size_t{4097}, std::size_t{8192 + 32}, 5000 + g() % 100, 70000 + g() % 1000}) {
      std::vector<std::byte> a(m * E), b;
      for (auto& x : a) x = static_cast<std::byte>(g());
      b = a;
      for (std::size_t i = 0; i < m; ++i)
        if (g() % 100 < rate) b[i * E + g() % E] ^= static_cast<std::byte>(1 + g() % 255);
      auto run = [&](auto fn) {
        std::vector<std::uint32_t> pos(m);
        std::vector<std::byte> xo(m * E), no(m * E);
        const std::size_t c = fn(pos.data(), xo.data(), no.data());
        pos.resize(c), xo.resize(c * E), no.resize(c * E);
        return std::tuple{pos, xo, no};
      };
      detail::with_word(E, [&](auto w) {
        using T = decltype(w);
        const auto ref = run([&](auto* p, auto* x, auto* n) { return detail::collect_kernel<T, true, true>(a.data(), b.data(), m, p, x, n); });
        EXPECT_EQ(run([&](auto* p, auto* x, auto* n) { return detail::collect_dispatch<T, true, true>(a.data(), b.data(), m, p, x, n); }), ref);
#ifdef BITREFIT_CODEC_X86_AVX2
        if constexpr (sizeof(T) == 2 || sizeof(T) == 4)
          if (detail::cpu_has_avx512_compress()) {
            EXPECT_EQ(run([&](auto* p, auto* x, auto* n) { return detail::collect_avx512<T, true, true>(a.data(), b.data(), m, p, x, n); }), ref);
          }
        if constexpr (sizeof(T) == 2 || sizeof(T) == 4)
          if (cpu_v3()) {
            EXPECT_EQ(run([&](auto* p, auto* x, auto* n) { return detail::collect_avx2<T, true, true>(a.data(), b.data(), m, p, x, n); }), ref);
            // positions alone (the base-conditioned items' call)
            EXPECT_EQ(run([&](auto* p, auto* x, auto* n) { return detail::collect_avx2<T, false, false>(a.data(), b.data(), m, p, x, n); }),
                      run([&](auto* p, auto* x, auto* n) { return detail::collect_kernel<T, false, false>(a.data(), b.data(), m, p, x, n); }));
          }
#endif
      });
    }
}
