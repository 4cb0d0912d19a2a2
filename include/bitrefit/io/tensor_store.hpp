// bitrefit/io/tensor_store.hpp — named tensors in owned, writable memory.
//
// A checkpoint's views are read-only windows on mapped files. Whoever must change bits — a receiver
// applying a delta, a tool rebuilding NEW from BASE, a test or benchmark making synthetic models —
// needs tensors it owns: a tensor_store holds each tensor's bytes in its own heap block, hands out
// mutable views, and is written back with write_checkpoint(path, store.views(), store.metadata).
// Addresses are stable: adding a tensor never moves another one's bytes.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/io/checkpoint.hpp"

namespace bitrefit::io {

class tensor_store {
 public:
  /// __metadata__ to write with the tensors; copied from a checkpoint by from_checkpoint.
  metadata_map metadata;

  tensor_store() = default;

  /// A copy of every tensor of `ck` and its metadata.
  static tensor_store from_checkpoint(const checkpoint& ck) {
    tensor_store s;
    s.metadata = ck.metadata();
    for (const auto& t : ck.tensors()) s.add(t);
    return s;
  }

  /// Adds a tensor of `type` and `shape` with unspecified bytes (the caller fills them).
  /// Throws errc::invalid_argument naming the tensor when the name is empty or already present.
  mutable_tensor_view add_uninitialized(std::string name, dtype type, shape_t shape) {
    if (name.empty()) throw error(errc::invalid_argument, "tensor with an empty name", {.file = {}, .tensor = {}, .field = "name"});
    if (tensors_.count(name))
      throw error(errc::invalid_argument, "tensor already in the store", {.file = {}, .tensor = name, .field = "name"});
    const std::uint64_t bytes = byte_size(type, shape, name);
    entry e{type, std::move(shape), std::make_unique_for_overwrite<std::byte[]>(bytes ? bytes : 1), bytes};
    auto [it, _] = tensors_.emplace(std::move(name), std::move(e));
    return view_of(it->first, it->second);
  }

  /// Adds a zero-filled tensor.
  mutable_tensor_view add_zeros(std::string name, dtype type, shape_t shape) {
    auto v = add_uninitialized(std::move(name), type, std::move(shape));
    std::memset(v.bytes().data(), 0, v.bytes().size());
    return v;
  }

  /// Adds a copy of `t` (name, dtype, shape and bytes).
  mutable_tensor_view add(const tensor_view& t) {
    auto v = add_uninitialized(t.name(), t.type(), t.shape());
    if (!t.bytes().empty()) std::memcpy(v.bytes().data(), t.bytes().data(), t.bytes().size());
    return v;
  }

  std::size_t size() const noexcept { return tensors_.size(); }
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

  /// Writable view of `name`; throws errc::mismatch naming the tensor when absent.
  mutable_tensor_view mutable_tensor(std::string_view name) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw absent(name);
    return view_of(it->first, it->second);
  }
  tensor_view tensor(std::string_view name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw absent(name);
    return view_of(it->first, it->second);
  }

  /// Every tensor in byte-wise name order (the manifest order), read-only / writable.
  std::vector<tensor_view> views() const {
    std::vector<tensor_view> out;
    out.reserve(tensors_.size());
    for (const auto& [name, e] : tensors_) out.push_back(view_of(name, e));
    return out;
  }
  std::vector<mutable_tensor_view> mutable_views() {
    std::vector<mutable_tensor_view> out;
    out.reserve(tensors_.size());
    for (auto& [name, e] : tensors_) out.push_back(view_of(name, e));
    return out;
  }

  model_manifest manifest() const {
    std::vector<tensor_info> infos;
    infos.reserve(tensors_.size());
    for (const auto& [name, e] : tensors_) infos.push_back({name, e.type, e.shape});
    return model_manifest(std::move(infos));
  }

 private:
  struct entry {
    dtype type;
    shape_t shape;
    std::unique_ptr<std::byte[]> data;  // at least one byte so empty tensors have an address too
    std::uint64_t bytes;
  };

  static mutable_tensor_view view_of(const std::string& name, const entry& e) {
    return mutable_tensor_view(name, e.type, e.shape, std::span<std::byte>(e.data.get(), e.bytes));
  }
  static error absent(std::string_view name) {
    return error(errc::mismatch, "no such tensor in the store", {.file = {}, .tensor = std::string(name), .field = {}});
  }

  std::map<std::string, entry, std::less<>> tensors_;
};

}  // namespace bitrefit::io
