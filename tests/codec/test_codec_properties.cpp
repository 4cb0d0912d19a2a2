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
