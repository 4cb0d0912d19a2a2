// bitrefit/layout/canonical_store.hpp — the identity Loader: canonical tensors in host memory.
//
// Every tensor is one contiguous buffer in canonical row-major order, so placement is the identity,
// every tensor is bit-preserving (XOR allowed) and held ranges are whole tensors. It is the
// receiver of the CLI and of tests, the owners' baseline shape, and the reference every other
// loader is compared with.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

class canonical_store {
 public:
  canonical_store() = default;

  /// Allocates every tensor of `m`, zero-filled.
  explicit canonical_store(model_manifest m) : manifest_(std::move(m)) {
    const auto& ts = manifest_.tensors();
    data_.resize(ts.size());
    held_.resize(ts.size());
    segs_.resize(ts.size());
    for (std::size_t i = 0; i < ts.size(); ++i) {
      data_[i].assign(ts[i].bytes(), std::byte{0});
      held_[i] = index_range{0, ts[i].elements()};
      segs_[i] = placement_segment{0, ts[i].elements(), data_[i].data()};
    }
  }

  // Segments point into data_: copying would alias the source, so the store is move-only.
  canonical_store(const canonical_store&) = delete;
  canonical_store& operator=(const canonical_store&) = delete;
  canonical_store(canonical_store&&) noexcept = default;  // vector moves keep buffer addresses
  canonical_store& operator=(canonical_store&&) noexcept = default;

  // --- Loader -------------------------------------------------------------------------------
  const model_manifest& canonical() const noexcept { return manifest_; }

  std::span<const index_range> held(std::string_view t) const {
    const std::size_t i = index(t);
    return held_[i].empty() ? std::span<const index_range>{} : std::span<const index_range>(&held_[i], 1);
  }
  bool bit_preserving(std::string_view t) const { return (void)index(t), true; }
  std::span<const placement_segment> segments(std::string_view t) const {
    const std::size_t i = index(t);
    return segs_[i].size() == 0 ? std::span<const placement_segment>{} : std::span<const placement_segment>(&segs_[i], 1);
  }
  void write(std::string_view t, index_range r, std::span<const std::byte> in) {
    auto bytes = span_of(t, r, in.size());
    if (!in.empty()) std::memcpy(bytes.data(), in.data(), in.size());
  }
  void read(std::string_view t, index_range r, std::span<std::byte> out) const {
    auto bytes = const_cast<canonical_store*>(this)->span_of(t, r, out.size());
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size());
  }

  // --- direct access ------------------------------------------------------------------------
  mutable_tensor_view tensor(std::string_view t) {
    const std::size_t i = index(t);
    const tensor_info& ti = manifest_.tensors()[i];
    return mutable_tensor_view(ti.name, ti.type, ti.shape, std::span<std::byte>(data_[i]));
  }
  tensor_view view(std::string_view t) const {
    const std::size_t i = index(t);
    const tensor_info& ti = manifest_.tensors()[i];
    return tensor_view(ti.name, ti.type, ti.shape, std::span<const std::byte>(data_[i]));
  }
  std::span<std::byte> bytes(std::string_view t) { return data_[index(t)]; }
  std::span<const std::byte> bytes(std::string_view t) const { return data_[index(t)]; }

  /// True when both stores have the same manifest and identical bits in every tensor.
  friend bool bit_equal(const canonical_store& a, const canonical_store& b) {
    return a.manifest_ == b.manifest_ && a.data_ == b.data_;
  }

 private:
  std::size_t index(std::string_view t) const {
    if (auto i = manifest_.index_of(t)) return *i;
    throw error(errc::mismatch, "tensor is not in the canonical store", {.file = {}, .tensor = std::string(t), .field = {}});
  }
  std::span<std::byte> span_of(std::string_view t, index_range r, std::size_t bytes) {
    const std::size_t i = index(t);
    const tensor_info& ti = manifest_.tensors()[i];
    const std::size_t es = element_size(ti.type);
    if (r.begin > r.end || r.end > ti.elements() || bytes != r.size() * es)
      throw error(errc::invalid_argument,
                  "range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") with " + std::to_string(bytes) +
                      " bytes does not fit a tensor of " + std::to_string(ti.elements()) + " elements",
                  {.file = {}, .tensor = ti.name, .field = "range"});
    return std::span<std::byte>(data_[i]).subspan(r.begin * es, bytes);
  }

  model_manifest manifest_;
  std::vector<std::vector<std::byte>> data_;
  std::vector<index_range> held_;
  std::vector<placement_segment> segs_;
};

static_assert(Loader<canonical_store>);

}  // namespace bitrefit::layout
