// tests/durability/durability_laws.hpp — the conformance checks of durability/concepts.hpp, shared
// by every model's tests: memory and filesystem (test_durability.cpp), etcd and S3
// (test_dist_durability.cpp) pass the very same checks.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/protocol/commit_log.hpp"

namespace bitrefit::durability::laws {

using namespace bitrefit::protocol;

inline prepare_record prep(std::uint64_t epoch, std::uint64_t counter, commit_record base) {
  prepare_record p;
  p.attempt = {epoch, counter};
  p.base = base;
  p.target = base.version + 1;
  p.next = baseline_of(p.attempt);
  p.mode = counter > 1 ? mode::overwrite : mode::xor_mask;
  p.xor_allowed = true;
  p.members = {{0, 1}, {1, 1}};
  p.expected = {digest128{1, 2}, digest128{1, 2}};
  return p;
}

log_snapshot snapshot_of(auto& log) {
  auto r = log.apply(read_request{});
  EXPECT_EQ(r.outcome, log_outcome::ok);
  return r.snapshot;
}

/// Every request gives exactly what the pure protocol::commit_log gives, and a second handle (a
/// restarted process) sees the same state.
template <class L>
void check_log_laws(L log, L other) {
  protocol::commit_log pure;
  auto both = [&](const log_request& q) {
    const log_reply want = pure.apply(q);
    const log_reply got = log.apply(q);
    EXPECT_EQ(got.outcome, want.outcome);
    EXPECT_EQ(got.snapshot, want.snapshot);
    EXPECT_EQ(snapshot_of(other), pure.state);
    return got.outcome;
  };
  EXPECT_EQ(both(claim_epoch_request{1}), log_outcome::ok);
  EXPECT_EQ(both(claim_epoch_request{1}), log_outcome::fenced);  // not larger: refused
  const commit_record k0{};
  EXPECT_EQ(both(persist_prepare_request{1, prep(1, 1, k0)}), log_outcome::ok);
  const commit_record k1{1, baseline_of({1, 1})};
  EXPECT_EQ(both(compare_and_set_request{1, {1, 1}, k0, k1}), log_outcome::ok);
  EXPECT_EQ(both(compare_and_set_request{1, {1, 2}, k0, {1, baseline_id{77}}}), log_outcome::conflict);
  // A newer coordinator fences the old one, which then changes nothing.
  EXPECT_EQ(both(claim_epoch_request{2}), log_outcome::ok);
  const auto before = snapshot_of(log);
  EXPECT_EQ(both(persist_prepare_request{1, prep(1, 3, k1)}), log_outcome::fenced);
  EXPECT_EQ(both(compare_and_set_request{1, {1, 3}, k1, {2, baseline_id{5}}}), log_outcome::fenced);
  EXPECT_EQ(snapshot_of(log), before);
  EXPECT_EQ(both(persist_prepare_request{2, prep(2, 1, k1)}), log_outcome::ok);
  EXPECT_EQ(both(compare_and_set_request{2, {2, 1}, k1, {2, baseline_of({2, 1})}}), log_outcome::ok);
}

/// BaselineStore laws 1-3 on images of versions 10 and 11.
template <class S>
void check_baseline_laws(S s, S restarted) {
  baseline_image v0{{"a", {std::byte{1}, std::byte{2}}}, {"b", {}}};
  baseline_image v1{{"a", {std::byte{1}, std::byte{3}}}, {"b", {}}};
  s.save(10, v0);
  EXPECT_EQ(*restarted.load(10), v0);
  // Law 2: the next image is saved under g' before commit; both coexist until K names g'.
  s.save(11, v1);
  EXPECT_EQ(*restarted.load(10), v0);
  EXPECT_EQ(*restarted.load(11), v1);
  s.retain_only(11);
  EXPECT_FALSE(restarted.load(10));
  EXPECT_EQ(*restarted.load(11), v1);
  s.retain_only(11);  // idempotent
  EXPECT_EQ(*restarted.load(11), v1);
  EXPECT_FALSE(restarted.load(12));
}

/// A small owner image covering every element width a checkpoint carries: FP8 (1 byte), BF16/F16
/// (2), F32 (4), integer buffers (8); an empty tensor too.
struct image_model {
  std::map<std::string, std::size_t> widths{{"fp8", 1}, {"bf16", 2}, {"f16", 2}, {"f32", 4}, {"i64", 8}, {"empty", 2}};
  std::map<std::string, std::size_t> elements{{"fp8", 1500}, {"bf16", 2048}, {"f16", 777}, {"f32", 1000}, {"i64", 300}, {"empty", 0}};
  std::mt19937_64 rng{1234};

  std::size_t width(const std::string& n) const { return widths.at(n); }
  baseline_image initial() {
    baseline_image img;
    for (auto& [n, e] : elements) {
      auto& b = img[n];
      b.resize(e * widths.at(n));
      for (auto& x : b) x = static_cast<std::byte>(rng());
    }
    return img;
  }
  /// The next version: ~3% of elements take new bits, among them the special patterns of floats
  /// (-0.0 vs +0.0 differ in one byte only, NaN payloads, infinities, subnormals).
  baseline_image step(baseline_image img) {
    static const std::uint64_t special[] = {0x8000, 0x0000, 0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0001, 0x7FA5, 0x80000000, 0x7FC00001};
    for (auto& [n, b] : img) {
      const std::size_t E = widths.at(n), count = b.size() / E;
      for (std::size_t k = 0; k < count / 33 + 1 && count; ++k) {
        const std::size_t i = rng() % count;
        std::uint64_t x = rng() % 4 == 0 ? special[rng() % std::size(special)] : rng();
        std::memcpy(b.data() + i * E, &x, E);
      }
    }
    return img;
  }
};

inline bool same_bits(const std::optional<baseline_image>& got, const baseline_image& want) {
  if (!got || got->size() != want.size()) return false;
  for (auto& [n, b] : want) {
    auto it = got->find(n);
    // byte vectors: compares bits (memcmp of an empty one would pass null pointers: UBSan)
    if (it == got->end() || it->second.size() != b.size() || (!b.empty() && std::memcmp(it->second.data(), b.data(), b.size()) != 0)) return false;
  }
  return true;
}

/// Law 4 across many versions: each transition saved as its change set, the baseline advanced by
/// retain_only as the sender does; every version loads bit-identically, from this handle and from a
/// fresh one (a restarted owner).
template <class S>
void check_change_set_chain(S s, S restarted, int versions) {
  image_model m;
  std::vector<baseline_image> ref{m.initial()};
  s.save(0, ref[0]);
  for (int v = 1; v <= versions; ++v) {
    ref.push_back(m.step(ref.back()));
    const change_set cs = diff_images(ref[v - 1], ref[v], [&](const std::string& n) { return m.width(n); });
    ASSERT_GT(changed_elements(cs), 0u);
    s.save_changes(version_t(v - 1), version_t(v), cs);
    ASSERT_TRUE(same_bits(restarted.load(v), ref[v])) << "v" << v;
    ASSERT_TRUE(same_bits(restarted.load(v - 1), ref[v - 1])) << "K.v stays loadable until K names v+1 (law 2), v" << v;
    s.retain_only(version_t(v));
    ASSERT_TRUE(same_bits(restarted.load(v), ref[v])) << "after retain_only, v" << v;
    ASSERT_FALSE(restarted.load(v + 1));
  }
}


/// ChangeSetStore law 6: load_changes(b, t) is the saved change set exactly while t is held as a
/// delta on b's current image (on a full image and on a delta), and applies to load(b) to give
/// load(t); nullopt for another base, an absent version, a full image of t, and a replaced base.
template <class S>
void check_load_changes(S s, S restarted) {
  image_model m;
  auto width = [&](const std::string& n) { return m.width(n); };
  const baseline_image a = m.initial(), b = m.step(a), c = m.step(b);
  const change_set ab = diff_images(a, b, width), bc = diff_images(b, c, width);
  s.save(0, a);
  s.save_changes(0, 1, ab);
  s.save_changes(1, 2, bc);
  auto got = restarted.load_changes(0, 1);
  ASSERT_TRUE(got) << "a delta on a full image";
  EXPECT_EQ(*got, ab);
  got = restarted.load_changes(1, 2);
  ASSERT_TRUE(got) << "a delta on a delta";
  EXPECT_EQ(*got, bc);
  auto img = restarted.load(1);
  ASSERT_TRUE(img);
  apply_changes(*img, *got);
  EXPECT_TRUE(same_bits(img, c));
  EXPECT_FALSE(restarted.load_changes(0, 2)) << "another base";
  EXPECT_FALSE(restarted.load_changes(2, 3)) << "absent";
  s.save(2, c);
  EXPECT_FALSE(restarted.load_changes(1, 2)) << "a full image of the target";
  s.save_changes(1, 2, bc);
  EXPECT_TRUE(restarted.load_changes(1, 2));
  s.save(1, m.step(a));  // version 1 replaced by other bits: delta 2 was built on the old ones
  EXPECT_FALSE(restarted.load_changes(1, 2)) << "a replaced base (law 5)";
  EXPECT_FALSE(restarted.load(2));
}

}  // namespace bitrefit::durability::laws
