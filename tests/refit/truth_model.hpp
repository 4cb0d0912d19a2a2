// tests/refit/truth_model.hpp — the trainer's truth for end-to-end refit tests: a small model with
// every dtype a checkpoint carries, stepped ~3% at a time with the special bit patterns of floats
// (-0.0, NaN payloads, infinities, subnormals). Shared by test_refit.cpp (in-process) and
// test_refit_dist.cpp (over S3 + etcd).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/refit/projection.hpp"

namespace bitrefit::testing {

inline model_manifest test_model() {
  return model_manifest({{"model.embed.weight", dtype::BF16, {64, 96}},
                         {"model.mlp.weight", dtype::BF16, {128, 40}},
                         {"model.norm.bias", dtype::F32, {300}},
                         {"model.steps", dtype::I64, {16}},
                         {"model.fp8.weight", dtype::F8_E4M3, {200}},
                         {"model.half", dtype::F16, {77}},
                         {"model.empty", dtype::BF16, {0, 4}}});
}

/// The trainer's truth: version k of every tensor. Each step changes ~3% of elements to random bit
/// patterns, with special values (-0.0, NaN payloads, infinities, subnormals) mixed in.
struct truth_model {
  model_manifest m = test_model();
  std::map<std::string, std::vector<std::byte>> bits;
  std::mt19937_64 rng{12345};

  truth_model() {
    for (auto& t : m.tensors()) {
      auto& b = bits[t.name];
      b.resize(t.bytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
    }
  }
  void step() {
    for (auto& t : m.tensors()) {
      auto& b = bits[t.name];
      const std::size_t E = element_size(t.type);
      for (std::uint64_t i = 0; i < t.elements(); ++i) {
        if (rng() % 100 >= 3) continue;
        std::byte* p = b.data() + i * E;
        switch (rng() % 6) {
          case 0: std::memset(p, 0, E); p[E - 1] = std::byte{0x80}; break;          // -0.0
          case 1: std::memset(p, 0xFF, E); p[0] = std::byte(rng() | 1); break;     // NaN with payload
          case 2: std::memset(p, 0, E); p[0] = std::byte{1}; break;                // smallest subnormal
          default:
            for (std::size_t k = 0; k < E; ++k) p[k] = static_cast<std::byte>(rng());
        }
      }
    }
  }
  refit::tensor_source source() const {
    return refit::copy_from([this](const tensor_info& t) { return std::span<const std::byte>(bits.at(t.name)); });
  }
  /// Every tensor of `store` equals the truth bit for bit, and so does its attestation digest.
  template <class Store>
  void expect_held_by(const Store& store, const std::string& who) const {
    std::vector<tensor_view> vs;
    for (auto& t : m.tensors()) {
      const auto got = store.bytes(t.name);
      const auto& want = bits.at(t.name);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_TRUE(want.empty() || std::memcmp(got.data(), want.data(), want.size()) == 0)
          << who << ": tensor " << t.name << " differs from the dense reference";
      vs.push_back(store.view(t.name));
    }
    EXPECT_EQ(codec::attestation_digest(std::span<const tensor_view>(vs)), attestation()) << who;
  }
  digest128 attestation() const {
    std::vector<tensor_view> vs;
    for (auto& t : m.tensors()) vs.emplace_back(t.name, t.type, t.shape, std::span<const std::byte>(bits.at(t.name)));
    return codec::attestation_digest(std::span<const tensor_view>(vs));
  }
};

}  // namespace bitrefit::testing
