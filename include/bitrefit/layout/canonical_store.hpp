// bitrefit/layout/canonical_store.hpp — the identity Loader: canonical tensors in host memory.
//
// Every tensor is one contiguous buffer in canonical row-major order, so placement is the identity,
// every tensor is bit-preserving (XOR allowed) and held ranges are whole tensors. It is the
// receiver of the CLI and of tests, the owners' baseline shape, and the reference every other
// loader is compared with. It is a borrowed_store (one home for the identity Loader's rules) over
// buffers it owns itself.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/layout/borrowed_store.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

namespace detail {

/// The bytes a canonical_store owns, one buffer per tensor in manifest order. A base class so that
/// the buffers exist before the borrowed_store that points into them is constructed.
struct owned_tensors {
  std::vector<std::vector<std::byte>> data;

  std::vector<mutable_tensor_view> views(const model_manifest& m) {
    std::vector<mutable_tensor_view> out;
    out.reserve(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) {
      const tensor_info& t = m.tensors()[i];
      out.emplace_back(t.name, t.type, t.shape, std::span<std::byte>(data[i]));
    }
    return out;
  }
  static std::vector<std::vector<std::byte>> zeros(const model_manifest& m) {
    std::vector<std::vector<std::byte>> d;
    d.reserve(m.size());
    for (const auto& t : m.tensors()) d.emplace_back(t.bytes(), std::byte{0});
    return d;
  }
};

}  // namespace detail

class canonical_store : private detail::owned_tensors, public borrowed_store {
 public:
  canonical_store() = default;

  /// Allocates every tensor of `m`, zero-filled.
  explicit canonical_store(const model_manifest& m) : detail::owned_tensors{zeros(m)}, borrowed_store(views(m)) {}

  // Move-only like borrowed_store; vector moves keep buffer addresses, so the views stay valid.
  canonical_store(canonical_store&&) noexcept = default;
  canonical_store& operator=(canonical_store&&) noexcept = default;

  // --- direct access (the Loader is borrowed_store's) ----------------------------------------
  tensor_view view(std::string_view t) const { return tensor(t); }
  std::span<std::byte> bytes(std::string_view t) { return tensor(t).bytes(); }
  std::span<const std::byte> bytes(std::string_view t) const { return tensor(t).bytes(); }

  /// True when both stores have the same manifest and identical bits in every tensor.
  friend bool bit_equal(const canonical_store& a, const canonical_store& b) {
    return a.canonical() == b.canonical() && a.data == b.data;
  }
};

static_assert(Loader<canonical_store>);

}  // namespace bitrefit::layout
