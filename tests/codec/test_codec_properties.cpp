// RapidCheck properties of the codec: for random tensors of every dtype (with -0.0, NaN payloads,
// infinities and subnormals) and every change pattern, decode+apply(encode(old -> new)) on old
// gives new bit for bit in every mode; overwrite is idempotent; encoding is deterministic; any
// single corrupted byte or truncation is rejected with the target untouched.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstring>

#include "bitrefit/codec/codec.hpp"

using namespace bitrefit;
using namespace bitrefit::codec;

namespace {

// Bit patterns the float formats treat specially (little-endian element bytes come from these).
std::vector<std::uint64_t> special_patterns(dtype t) {
  switch (t) {
    case dtype::F64: return {0x8000000000000000ull, 0x7FF8000000000001ull, 0xFFF0000000000001ull, 0x7FF0000000000000ull, 0xFFF0000000000000ull, 0x1ull, 0x800FFFFFFFFFFFFFull, 0};
    case dtype::F32: return {0x80000000u, 0x7FC00001u, 0xFF800001u, 0x7F800000u, 0xFF800000u, 0x1u, 0x807FFFFFu, 0};
    case dtype::F16: return {0x8000, 0x7E01, 0xFC01, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0};
    case dtype::BF16: return {0x8000, 0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x0001, 0x807F, 0};
    case dtype::F8_E4M3: return {0x80, 0x7F, 0xFF, 0x01, 0x87, 0};
    case dtype::F8_E5M2: return {0x80, 0x7D, 0xFE, 0x7C, 0xFC, 0x01, 0x83, 0};
    default: return {0, ~0ull, 1, 0x80};
  }
}

enum class pattern { none, one, all, runs, sparse, dense, ulp_steps };

struct tensor_case {
  std::string name;
  dtype type;
  std::vector<std::byte> old_b, new_b;
  std::uint64_t n() const { return old_b.size() / element_size(type); }
};

rc::Gen<tensor_case> gen_tensor(std::string name) {
  return rc::gen::exec([name] {
    tensor_case t;
    t.name = name;
    t.type = *rc::gen::elementOf(all_dtypes);
    const std::size_t E = element_size(t.type);
    const std::size_t n = *rc::gen::inRange<std::size_t>(0, 2500);
    const auto specials = special_patterns(t.type);
    auto value = [&](std::byte* out) {
      if (*rc::gen::inRange(0, 4) == 0) {
        const std::uint64_t v = specials[*rc::gen::inRange<std::size_t>(0, specials.size())];
        std::memcpy(out, &v, E);
      } else {
        const auto v = *rc::gen::arbitrary<std::uint64_t>();
        std::memcpy(out, &v, E);
      }
    };
    t.old_b.resize(n * E);
    for (std::size_t i = 0; i < n; ++i) value(t.old_b.data() + i * E);
    t.new_b = t.old_b;
    const auto pat = *rc::gen::element(pattern::none, pattern::one, pattern::all, pattern::runs, pattern::sparse, pattern::dense,
                                       pattern::ulp_steps);
    auto change = [&](std::size_t i) {
      std::byte* p = t.new_b.data() + i * E;
      value(p);
      if (std::memcmp(p, t.old_b.data() + i * E, E) == 0) {
        // same pattern drawn: flip the sign bit, which turns +0.0 into -0.0 and NaN into NaN
        p[E - 1] ^= std::byte{0x80};
      }
    };
    if (n > 0) switch (pat) {
        case pattern::none: break;
        case pattern::one: change(*rc::gen::inRange<std::size_t>(0, n)); break;
        case pattern::all:
          for (std::size_t i = 0; i < n; ++i) change(i);
          break;
        case pattern::runs: {
          const int k = *rc::gen::inRange(1, 5);
          for (int r = 0; r < k; ++r) {
            const std::size_t b = *rc::gen::inRange<std::size_t>(0, n);
            const std::size_t len = *rc::gen::inRange<std::size_t>(1, 300);
            for (std::size_t i = b; i < std::min(n, b + len); ++i) change(i);
          }
          break;
        }
        case pattern::sparse:
          for (std::size_t i = 0; i < n; ++i)
            if (*rc::gen::inRange(0, 100) == 0) change(i);
          break;
        case pattern::dense:
          for (std::size_t i = 0; i < n; ++i)
            if (*rc::gen::inRange(0, 2) == 0) change(i);
          break;
        case pattern::ulp_steps:
          // what a trainer's rounding does: the stored pattern moves by a few units (as an integer
          // of the element's width; crossing into the sign bit or NaN/inf happens too)
          for (std::size_t i = 0; i < n; ++i)
            if (*rc::gen::inRange(0, 8) == 0) {
              std::uint64_t v = 0;
              std::memcpy(&v, t.new_b.data() + i * E, E);
              const int d = *rc::gen::element(-3, -2, -1, 1, 1, 1, 2, 40000);
              v += static_cast<std::uint64_t>(static_cast<std::int64_t>(d));
              std::memcpy(t.new_b.data() + i * E, &v, E);
            }
          break;
      }
    return t;
  });
}

struct model_case {
  std::vector<tensor_case> tensors;
  mode_policy policy;
  std::uint64_t max_bytes;
};

model_case gen_model() {
  model_case m;
  const int k = *rc::gen::inRange(1, 4);
  for (int i = 0; i < k; ++i) m.tensors.push_back(*gen_tensor("model.layers." + std::to_string(i) + ".w"));
  m.policy = *rc::gen::element(mode_policy::xor_allowed, mode_policy::xor_only, mode_policy::overwrite_only,
                               mode_policy::conditioned_only);
  m.max_bytes = *rc::gen::element<std::uint64_t>(8, 1000, 4096, default_max_frame_input_bytes);
  return m;
}

model_manifest manifest_of(const model_case& m) {
  std::vector<tensor_info> ti;
  for (auto& t : m.tensors) ti.push_back({t.name, t.type, {t.n()}});
  return model_manifest(ti);
}

const tensor_case& by_name(const model_case& m, std::string_view n) {
  for (auto& t : m.tensors)
    if (t.name == n) return t;
  throw std::logic_error("no tensor");
}

std::vector<std::vector<std::byte>> encode_all(const model_case& m, bool dense = false) {
  const auto man = manifest_of(m);
  chunk_encoder<> enc(encode_options{.policy = m.policy, .max_frame_input_bytes = m.max_bytes});
  std::vector<std::vector<std::byte>> frames;
  byte_buffer out;
  const auto plan = plan_chunks(man, m.max_bytes);
  for (std::size_t s = 0; s < plan.size(); ++s) {
    std::vector<chunk_piece> pieces;
    for (auto& r : plan[s]) {
      const auto& t = by_name(m, r.tensor);
      const std::size_t E = element_size(t.type);
      pieces.push_back({t.name, t.type, t.n(), r.begin, r.end,
                        std::span<const std::byte>(t.old_b).subspan(r.begin * E, r.size() * E),
                        std::span<const std::byte>(t.new_b).subspan(r.begin * E, r.size() * E)});
    }
    const payload_id id{{1, 1}, 0, static_cast<std::uint32_t>(s)};
    if (dense) enc.encode_dense({frame_kind::dense, id, 0, 1}, pieces, out);
    else enc.encode({frame_kind::delta, id, 0, 1}, pieces, out);
    frames.emplace_back(out.data(), out.data() + out.size());
  }
  return frames;
}

struct receiver {
  std::vector<std::vector<std::byte>> data;
  target_map tm;
  explicit receiver(const model_case& m) {
    std::vector<mutable_tensor_view> v;
    for (auto& t : m.tensors) data.push_back(t.old_b);
    for (std::size_t i = 0; i < m.tensors.size(); ++i)
      v.emplace_back(m.tensors[i].name, m.tensors[i].type, shape_t{m.tensors[i].n()}, std::span<std::byte>(data[i]));
    tm = target_map(std::move(v));
  }
  bool equals_new(const model_case& m) const {
    for (std::size_t i = 0; i < m.tensors.size(); ++i)
      if (data[i] != m.tensors[i].new_b) return false;
    return true;
  }
};

}  // namespace

RC_GTEST_PROP(CodecProperties, ApplyOfEncodeGivesNewBitExactly, ()) {
  const auto m = gen_model();
  const auto frames = encode_all(m);
  RC_ASSERT(frames == encode_all(m));  // deterministic
  receiver r(m);
  frame_applier<> ap;
  for (auto& f : frames) ap.apply(f, r.tm);
  RC_ASSERT(r.equals_new(m));
  if (m.policy == mode_policy::overwrite_only) {  // idempotent
    for (auto& f : frames) ap.apply(f, r.tm);
    RC_ASSERT(r.equals_new(m));
  }
  // changed counts are exact
  std::uint64_t changed = 0, expect = 0;
  for (auto& f : frames) {
    const frame_view v = frame_view::parse(f);
    for (auto& it : v.items()) changed += it.changed;
  }
  for (auto& t : m.tensors) {
    const std::size_t E = element_size(t.type);
    for (std::size_t i = 0; i < t.n(); ++i) expect += std::memcmp(&t.old_b[i * E], &t.new_b[i * E], E) != 0;
  }
  RC_ASSERT(changed == expect);
}

RC_GTEST_PROP(CodecProperties, DenseFramesRestoreFromAnything, ()) {
  const auto m = gen_model();
  const auto frames = encode_all(m, /*dense=*/true);
  receiver r(m);
  frame_applier<> ap;
  for (auto& f : frames) ap.apply(f, r.tm);
  RC_ASSERT(r.equals_new(m));
}

RC_GTEST_PROP(CodecProperties, CorruptionAndTruncationRejectedTargetIntact, ()) {
  const auto m = gen_model();
  const auto frames = encode_all(m);
  const std::size_t fi = *rc::gen::inRange<std::size_t>(0, frames.size());
  auto bad = frames[fi];
  const bool truncate = *rc::gen::arbitrary<bool>();
  if (truncate) bad.resize(*rc::gen::inRange<std::size_t>(0, bad.size()));
  else bad[*rc::gen::inRange<std::size_t>(0, bad.size())] ^= static_cast<std::byte>(*rc::gen::inRange(1, 256));
  receiver r(m);
  const auto before = r.data;
  frame_applier<> ap;
  bool threw = false;
  try {
    ap.apply(bad, r.tm);
  } catch (const error& e) {
    threw = true;
    RC_ASSERT(std::string(e.what()).size() > 0);
  }
  RC_ASSERT(threw);
  RC_ASSERT(r.data == before);
}

RC_GTEST_PROP(CodecProperties, XorOnlyValuesAreOldXorNew, ()) {
  // the backend primitive's law, checked against a byte-wise reference
  const auto t = *gen_tensor("t");
  const std::size_t E = element_size(t.type);
  host_backend b;
  std::vector<std::uint32_t> pos(t.n());
  std::vector<std::byte> xo(t.n() * E), no(t.n() * E);
  const std::size_t c = b.collect_changes(t.old_b, t.new_b, E, pos, xo, no);
  std::size_t k = 0;
  for (std::size_t i = 0; i < t.n(); ++i) {
    if (std::memcmp(&t.old_b[i * E], &t.new_b[i * E], E) == 0) continue;
    RC_ASSERT(k < c);
    RC_ASSERT(pos[k] == i);
    for (std::size_t j = 0; j < E; ++j) {
      RC_ASSERT(xo[k * E + j] == (t.old_b[i * E + j] ^ t.new_b[i * E + j]));
      RC_ASSERT(no[k * E + j] == t.new_b[i * E + j]);
    }
    ++k;
  }
  RC_ASSERT(k == c);
}

// ---- encode_known: the entry the owners call with their frozen change set ------------------------

namespace {

// A tensor large enough for the encoder's sampled mode choice (more than 64 runs of 1024
// elements): weight-like bit patterns of a seed (a few exponents, so base-conditioned coding is
// chosen too), changed by ULP steps at a drawn rate, with special patterns (-0.0, NaN payloads,
// ±inf, subnormals) sprinkled into both versions.
tensor_case big_tensor(std::string name, dtype type, std::uint64_t seed, std::size_t n, unsigned per_mille) {
  tensor_case t;
  t.name = std::move(name);
  t.type = type;
  const std::size_t E = element_size(type);
  auto next = [&seed] {  // splitmix64
    std::uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const auto specials = special_patterns(type);
  const auto fmt = float_format_of(type);
  t.old_b.resize(n * E);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = next();
    if (fmt && E >= 2) {  // sign, one of a few exponents near 1.0 / 2^-6, random mantissa
      const unsigned mb = E == 2 ? (type == dtype::BF16 ? 7 : 10) : (E == 4 ? 23 : 52);
      const std::uint64_t bias = (std::uint64_t{1} << (E * 8 - 2 - mb)) - 1;
      const std::uint64_t ex = bias - 1 - (v >> 60) % 6;
      v = ((v >> 59) & 1) << (E * 8 - 1) | ex << mb | (v & ((std::uint64_t{1} << mb) - 1));
    }
    if (next() % 97 == 0) v = specials[next() % specials.size()];
    std::memcpy(&t.old_b[i * E], &v, E);
  }
  t.new_b = t.old_b;
  for (std::size_t i = 0; i < n; ++i)
    if (next() % 1000 < per_mille) {
      std::uint64_t v = 0;
      std::memcpy(&v, &t.new_b[i * E], E);
      const std::uint64_t r = next();
      if (r % 50 == 0) v = specials[r / 50 % specials.size()];
      else v += (r & 1) ? 1 : ~std::uint64_t{0};
      std::memcpy(&t.new_b[i * E], &v, E);
    }
  return t;
}

// The changes of [b, e) of `t`: tensor positions and new bits (what owner_shard's change set holds),
// plus `extra` positions whose "new" bits equal the base (not changes: encode_known must skip them).
struct known_range {
  std::vector<std::uint64_t> positions;
  std::vector<std::byte> values;
};
known_range known_of(const tensor_case& t, std::uint64_t b, std::uint64_t e, bool with_non_changes) {
  const std::size_t E = element_size(t.type);
  known_range k;
  for (std::uint64_t i = b; i < e; ++i) {
    const bool changed = std::memcmp(&t.old_b[i * E], &t.new_b[i * E], E) != 0;
    if (!changed && !(with_non_changes && i % 7 == 3)) continue;
    k.positions.push_back(i);
    k.values.insert(k.values.end(), t.new_b.begin() + static_cast<std::ptrdiff_t>(i * E), t.new_b.begin() + static_cast<std::ptrdiff_t>((i + 1) * E));
  }
  return k;
}

}  // namespace

RC_GTEST_PROP(CodecProperties, EncodeKnownFramesEqualEncodeByteForByte, ()) {
  auto m = gen_model();
  if (*rc::gen::inRange(0, 3) == 0) {  // a sampled piece: mode choice from 64 runs of the range
    const dtype type = *rc::gen::element(dtype::BF16, dtype::F16, dtype::F32, dtype::F64, dtype::F8_E4M3, dtype::I32);
    m.tensors.push_back(big_tensor("model.big", type, *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange<std::size_t>(65537, 160000),
                                   *rc::gen::element(5u, 30u, 300u)));
    m.max_bytes = *rc::gen::element<std::uint64_t>(200000, default_max_frame_input_bytes);
  }
  const bool with_non_changes = *rc::gen::arbitrary<bool>();
  const auto man = manifest_of(m);
  chunk_encoder<> enc(encode_options{.policy = m.policy, .max_frame_input_bytes = m.max_bytes});
  chunk_encoder<> known_enc(encode_options{.policy = m.policy, .max_frame_input_bytes = m.max_bytes});
  byte_buffer a, b;
  encode_stats total;
  const auto plan = plan_chunks(man, m.max_bytes);
  for (std::size_t s = 0; s < plan.size(); ++s) {
    std::vector<chunk_piece> pieces;
    std::vector<known_changes_piece> known;
    std::vector<known_range> ks;
    ks.reserve(plan[s].size());
    for (auto& r : plan[s]) {
      const auto& t = by_name(m, r.tensor);
      const std::size_t E = element_size(t.type);
      const auto old_r = std::span<const std::byte>(t.old_b).subspan(r.begin * E, r.size() * E);
      pieces.push_back({t.name, t.type, t.n(), r.begin, r.end, old_r, std::span<const std::byte>(t.new_b).subspan(r.begin * E, r.size() * E)});
      ks.push_back(known_of(t, r.begin, r.end, with_non_changes));
      known.push_back({t.name, t.type, t.n(), r.begin, r.end, old_r, ks.back().positions, ks.back().values});
    }
    const payload_id id{{1, 1}, 0, static_cast<std::uint32_t>(s)};
    encode_stats sa, sb;
    enc.encode({frame_kind::delta, id, 0, 1}, pieces, a, &sa);
    known_enc.encode_known({frame_kind::delta, id, 0, 1}, known, b, &sb);
    RC_ASSERT(a.size() == b.size());
    RC_ASSERT(std::memcmp(a.data(), b.data(), a.size()) == 0);
    RC_ASSERT(sa.changed == sb.changed);
    RC_ASSERT(sa.conditioned_items == sb.conditioned_items);
    total += sb;
  }
  // the distribution (shown by RapidCheck): every item kind must occur across the cases
  RC_CLASSIFY(total.conditioned_items > 0, "base-conditioned");
  RC_CLASSIFY(total.xor_items > 0, "xor");
  RC_CLASSIFY(total.items > total.xor_items + total.conditioned_items, "overwrite");
  RC_CLASSIFY(m.tensors.back().n() > 65536, "sampled");
}

TEST(CodecKnownChanges, MalformedChangeListsAreRefusedByName) {
  const std::vector<std::byte> base(8 * 2, std::byte{0});
  const std::vector<std::byte> vals(2 * 2, std::byte{1});
  chunk_encoder<> enc;
  byte_buffer out;
  const frame_header h{frame_kind::delta, payload_id{{1, 1}, 0, 0}, 0, 1};
  auto refused = [&](std::vector<std::uint64_t> pos, std::span<const std::byte> v, std::uint64_t b, std::uint64_t e) {
    const known_changes_piece p{"w", dtype::BF16, 8, b, e, std::span<const std::byte>(base).first((e - b) * 2), pos, v};
    try {
      enc.encode_known(h, std::span<const known_changes_piece>(&p, 1), out);
    } catch (const error& err) {
      return err.code() == errc::invalid_argument && err.where().tensor == "w";
    }
    return false;
  };
  EXPECT_TRUE(refused({3, 2}, vals, 0, 8));                                   // not ascending
  EXPECT_TRUE(refused({2, 2}, vals, 0, 8));                                   // repeated
  EXPECT_TRUE(refused({1, 5}, vals, 2, 8));                                   // before the range
  EXPECT_TRUE(refused({2, 8}, vals, 0, 8));                                   // past the range
  EXPECT_TRUE(refused({2, 3}, std::span<const std::byte>(vals).first(3), 0, 8));  // value bytes
}

// The attestation digest of a range given as base + patched elements (how a sender digests its
// frozen target without building it) equals the digest of the patched bytes themselves, for any
// range of any dtype, patches in any leaf (64 KiB), at leaf edges, in runs of leaves, or none.
RC_GTEST_PROP(CodecProperties, PatchedAttestationEqualsDigestOfPatchedBytes, ()) {
  const dtype type = *rc::gen::elementOf(all_dtypes);
  const std::size_t E = element_size(type);
  const std::uint64_t n = *rc::gen::element<std::uint64_t>(0, 1, 100, 32768, 65536 + 3, 300000);
  const auto t = big_tensor("w", type, *rc::gen::arbitrary<std::uint64_t>(), n, *rc::gen::element(0u, 1u, 30u, 1000u));
  const std::uint64_t begin = n ? *rc::gen::inRange<std::uint64_t>(0, n) : 0;
  const std::uint64_t end = n ? *rc::gen::inRange<std::uint64_t>(begin, n + 1) : 0;
  const known_range k = known_of(t, begin, end, *rc::gen::arbitrary<bool>());
  const shape_t shape{n};
  const attested_range dense{"w", type, &shape, begin, end, std::span<const std::byte>(t.new_b).subspan(begin * E, (end - begin) * E)};
  const attested_range patched{"w", type, &shape, begin, end, std::span<const std::byte>(t.old_b).subspan(begin * E, (end - begin) * E),
                               k.positions, k.values};
  RC_ASSERT(attestation_digest(std::span<const attested_range>(&dense, 1)) == attestation_digest(std::span<const attested_range>(&patched, 1)));
  RC_CLASSIFY(!k.positions.empty(), "patched");
}
