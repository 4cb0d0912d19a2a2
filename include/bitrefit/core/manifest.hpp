// bitrefit/core/manifest.hpp — the canonical model manifest: which tensors a model has.
//
// The manifest is the canonical address space: tensors are kept in byte-wise name order (the
// order attestation digests use), and every tensor is addressed by (name, row-major flat index).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit {

struct tensor_info {
  std::string name;
  dtype type = dtype::U8;
  shape_t shape;

  std::uint64_t elements() const { return element_count(shape, name); }
  std::uint64_t bytes() const { return byte_size(type, shape, name); }
  friend bool operator==(const tensor_info&, const tensor_info&) = default;
};

class model_manifest {
 public:
  model_manifest() = default;

  /// Builds a manifest from tensors in any order; they are sorted by byte-wise name order.
  /// Throws errc::invalid_argument naming the tensor on a duplicate or empty name.
  explicit model_manifest(std::vector<tensor_info> tensors) : tensors_(std::move(tensors)) {
    std::sort(tensors_.begin(), tensors_.end(),
              [](const tensor_info& a, const tensor_info& b) { return a.name < b.name; });
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name.empty())
        throw error(errc::invalid_argument, "tensor with an empty name", {.file = {}, .tensor = {}, .field = "name"});
      if (i > 0 && tensors_[i - 1].name == tensors_[i].name)
        throw error(errc::invalid_argument, "duplicate tensor name", {.file = {}, .tensor = tensors_[i].name, .field = "name"});
      (void)tensors_[i].bytes();  // validates the shape against overflow
    }
  }

  const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  std::size_t size() const noexcept { return tensors_.size(); }

  /// Index of `name` in name order, or nullopt.
  std::optional<std::size_t> index_of(std::string_view name) const {
    auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                               [](const tensor_info& t, std::string_view n) { return t.name < n; });
    if (it == tensors_.end() || it->name != name) return std::nullopt;
    return static_cast<std::size_t>(it - tensors_.begin());
  }

  const tensor_info* find(std::string_view name) const {
    auto i = index_of(name);
    return i ? &tensors_[*i] : nullptr;
  }

  /// Like find, but throws errc::mismatch naming the tensor when it is absent.
  const tensor_info& at(std::string_view name) const {
    if (auto* t = find(name)) return *t;
    throw error(errc::mismatch, "tensor is not in the model manifest", {.file = {}, .tensor = std::string(name), .field = {}});
  }

  std::uint64_t total_elements() const {
    std::uint64_t n = 0;
    for (auto& t : tensors_) n += t.elements();
    return n;
  }
  std::uint64_t total_bytes() const {
    std::uint64_t n = 0;
    for (auto& t : tensors_) n += t.bytes();
    return n;
  }

  friend bool operator==(const model_manifest&, const model_manifest&) = default;

 private:
  std::vector<tensor_info> tensors_;
};

}  // namespace bitrefit
