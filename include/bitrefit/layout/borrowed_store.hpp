// bitrefit/layout/borrowed_store.hpp — the identity Loader over tensors the engine owns.
//
// A rollout engine that keeps each canonical tensor as one contiguous row-major buffer in the
// canonical dtype (a PyTorch model's parameters, a numpy array per tensor) needs no placement
// logic: refits are written straight into its own memory, in place, with no copy of the model.
// canonical_store is this store over buffers it owns. Here the store holds views, the engine the bytes.
// Every tensor is bit-preserving (XOR allowed) and held whole.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

class borrowed_store {
 public:
  borrowed_store() = default;

  /// @pre every view's memory outlives the store and is written by nobody else while a refit
  ///      applies (the engine's request gate).
  /// @throws errc::invalid_argument naming the tensors when two views share a byte: an element
  ///         reached twice would be XORed twice (tied weights must be passed once), or naming
  ///         the tensor for a duplicate or empty name.
  explicit borrowed_store(std::vector<mutable_tensor_view> views) {
    std::vector<tensor_info> infos;
    infos.reserve(views.size());
    for (const auto& v : views) infos.push_back({v.name(), v.type(), v.shape()});
    manifest_ = model_manifest(std::move(infos));
    std::sort(views.begin(), views.end(), [](const auto& a, const auto& b) { return a.name() < b.name(); });
    check_disjoint(views);
    views_ = std::move(views);
    held_.resize(views_.size());
    segs_.resize(views_.size());
    for (std::size_t i = 0; i < views_.size(); ++i) {
      held_[i] = index_range{0, views_[i].elements()};
      segs_[i] = placement_segment{0, views_[i].elements(), views_[i].bytes().data()};
    }
  }

  // Segments point into the engine's memory, not into the store: copies would be two writers of
  // one model, so the store is move-only like canonical_store.
  borrowed_store(const borrowed_store&) = delete;
  borrowed_store& operator=(const borrowed_store&) = delete;
  borrowed_store(borrowed_store&&) noexcept = default;
  borrowed_store& operator=(borrowed_store&&) noexcept = default;

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
    auto bytes = span_of(t, r, out.size());
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size());
  }

  // --- direct access ------------------------------------------------------------------------
  mutable_tensor_view tensor(std::string_view t) { return views_[index(t)]; }
  tensor_view tensor(std::string_view t) const { return views_[index(t)]; }

 private:
  static void check_disjoint(const std::vector<mutable_tensor_view>& views) {
    std::vector<const mutable_tensor_view*> by_address;
    for (const auto& v : views)
      if (!v.bytes().empty()) by_address.push_back(&v);
    std::sort(by_address.begin(), by_address.end(),
              [](auto* a, auto* b) { return std::less<>()(a->bytes().data(), b->bytes().data()); });
    for (std::size_t i = 1; i < by_address.size(); ++i) {
      const auto& prev = *by_address[i - 1];
      const auto& next = *by_address[i];
      if (std::less<>()(next.bytes().data(), prev.bytes().data() + prev.bytes().size()))
        throw error(errc::invalid_argument,
                    "tensors '" + prev.name() + "' and '" + next.name() +
                        "' share memory (tied weights?); pass each storage under one canonical name",
                    {.file = {}, .tensor = next.name(), .field = "data"});
    }
  }
  std::size_t index(std::string_view t) const {
    if (auto i = manifest_.index_of(t)) return *i;
    throw error(errc::mismatch, "tensor is not in this loader's model", {.file = {}, .tensor = std::string(t), .field = {}});
  }
  std::span<std::byte> span_of(std::string_view t, index_range r, std::size_t bytes) const {
    const mutable_tensor_view& v = views_[index(t)];
    const std::size_t es = v.elem_size();
    if (r.begin > r.end || r.end > v.elements() || bytes != r.size() * es)
      throw error(errc::invalid_argument,
                  "range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") with " + std::to_string(bytes) +
                      " bytes does not fit a tensor of " + std::to_string(v.elements()) + " elements",
                  {.file = {}, .tensor = v.name(), .field = "range"});
    return v.bytes().subspan(r.begin * es, bytes);
  }

  model_manifest manifest_;
  std::vector<mutable_tensor_view> views_;  // manifest order
  std::vector<index_range> held_;
  std::vector<placement_segment> segs_;
};

static_assert(Loader<borrowed_store>);

}  // namespace bitrefit::layout
