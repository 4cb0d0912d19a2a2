// bitrefit/durability/change_set.hpp — a transition's frozen change set as the owners persist it:
// per tensor, the positions (element indices) whose stored bits differ from the baseline and the
// absolute new bits there (DESIGN: "the change set (positions and absolute new values against its
// baseline)").
//
// Laws (checked by tests/durability):
//  - apply_changes(base, diff_images(base, target, E)) == target, bit for bit, for any two images
//    with the same tensors and sizes (dtype-agnostic: bits are compared, never values).
//  - A change set refers to a base by shape only; WHICH base it belongs to is the store's business
//    (the filesystem store links each delta to the digest of its base's file).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/bit_diff.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit::durability {

/// An owner's baseline image: tensor name -> stored bytes of the canonical elements it owns.
using baseline_image = std::map<std::string, std::vector<std::byte>>;

/// The changes of one tensor. positions are strictly increasing element indices < elements;
/// values holds positions.size() * element_size bytes: the new bits, in position order.
struct tensor_changes {
  std::uint32_t element_size = 0;
  std::uint64_t elements = 0;  // the tensor's element count (must match the base)
  std::vector<std::uint64_t> positions;
  std::vector<std::byte> values;
  friend bool operator==(const tensor_changes&, const tensor_changes&) = default;
};

/// Tensors without a change may be absent.
using change_set = std::map<std::string, tensor_changes, std::less<>>;

inline std::uint64_t changed_elements(const change_set& cs) {
  std::uint64_t n = 0;
  for (const auto& [_, c] : cs) n += c.positions.size();
  return n;
}

/// Appends to `out` the elements of E-byte tensors a -> b that differ bitwise (the one diff
/// kernel, core/bit_diff.hpp), then gathers their new bits from the (few) positions found.
inline void diff_tensor(std::span<const std::byte> a, std::span<const std::byte> b, std::size_t E, tensor_changes& out) {
  const std::size_t p0 = out.positions.size();
  for_each_changed(a.data(), b.data(), a.size() / E, E, [&](std::size_t i) { out.positions.push_back(i); });
  const std::size_t v0 = out.values.size();
  out.values.resize(v0 + (out.positions.size() - p0) * E);
  std::byte* val = out.values.data() + v0;
  for (std::size_t k = p0; k < out.positions.size(); ++k, val += E) std::memcpy(val, b.data() + out.positions[k] * E, E);
}

/// The change set base -> target. `element_size(name)` gives each tensor's element width in bytes.
/// Throws errc::mismatch when the two images do not hold the same tensors with the same sizes.
inline change_set diff_images(const baseline_image& base, const baseline_image& target,
                              const std::function<std::size_t(const std::string&)>& element_size) {
  if (base.size() != target.size())
    throw error(errc::mismatch, "change set: base and target hold different tensor sets", {.file = {}, .tensor = {}, .field = "image"});
  change_set cs;
  for (const auto& [name, t] : target) {
    auto it = base.find(name);
    const std::size_t E = element_size(name);
    if (it == base.end() || it->second.size() != t.size() || E == 0 || t.size() % E != 0)
      throw error(errc::mismatch, "change set: tensor absent from the base or of another size", {.file = {}, .tensor = name, .field = "image"});
    tensor_changes c;
    c.element_size = static_cast<std::uint32_t>(E);
    c.elements = t.size() / E;
    diff_tensor(it->second, t, E, c);
    if (!c.positions.empty()) cs.emplace(name, std::move(c));
  }
  return cs;
}

/// Checks that `cs` fits `img` (tensors present, sizes, strictly increasing in-range positions);
/// throws errc::mismatch naming the tensor otherwise. Nothing is written.
inline void check_fits(const baseline_image& img, const change_set& cs, const std::string& file = {}) {
  for (const auto& [name, c] : cs) {
    auto it = img.find(name);
    if (it == img.end())
      throw error(errc::mismatch, "change set names a tensor the base image does not hold", {.file = file, .tensor = name, .field = {}});
    // never the product elements * element_size: from a file, the two can wrap to the image's size
    // (2^61 + 8 elements of 8 bytes "are" 64 bytes); the image's size is divided instead
    if (c.element_size == 0 || it->second.size() % c.element_size != 0 || c.elements != it->second.size() / c.element_size)
      throw error(errc::mismatch, "change set: tensor size differs from the base image", {.file = file, .tensor = name, .field = "elements"});
    if (c.values.size() != c.positions.size() * c.element_size)
      throw error(errc::mismatch, "change set: value bytes do not match the position count", {.file = file, .tensor = name, .field = "values"});
    for (std::size_t k = 0; k < c.positions.size(); ++k)
      if (c.positions[k] >= c.elements || (k > 0 && c.positions[k] <= c.positions[k - 1]))
        throw error(errc::mismatch, "change set: positions not strictly increasing within the tensor", {.file = file, .tensor = name, .field = "positions"});
  }
}

/// img := img + cs (every change set position takes its absolute new bits). All-or-nothing: the
/// whole set is checked before the first byte is written.
inline void apply_changes(baseline_image& img, const change_set& cs, const std::string& file = {}) {
  check_fits(img, cs, file);
  for (const auto& [name, c] : cs) {
    std::byte* dst = img.find(name)->second.data();
    const std::byte* src = c.values.data();
    for (std::uint64_t p : c.positions) {
      std::memcpy(dst + p * c.element_size, src, c.element_size);
      src += c.element_size;
    }
  }
}

}  // namespace bitrefit::durability
