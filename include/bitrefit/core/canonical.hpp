// bitrefit/core/canonical.hpp — canonical coordinates: (Hugging Face tensor name, flat index).
//
// Every trainer layout and every serving layout maps to and from this one address space, so
// payloads, ownership and attestation all speak it. Ranges are half-open [begin, end) in elements.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

namespace bitrefit {

struct canonical_key {
  std::string tensor;
  std::uint64_t index = 0;  // row-major flat element index
  friend auto operator<=>(const canonical_key&, const canonical_key&) = default;
};

/// Elements [begin, end) of one canonical tensor.
struct canonical_range {
  std::string tensor;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  std::uint64_t size() const noexcept { return end - begin; }
  bool empty() const noexcept { return end <= begin; }
  friend auto operator<=>(const canonical_range&, const canonical_range&) = default;
};

/// Sorts ranges by (tensor, begin) and merges touching or overlapping ones of the same tensor.
/// @post the result is sorted, and no two ranges of one tensor touch or overlap.
inline std::vector<canonical_range> normalize(std::vector<canonical_range> rs) {
  std::erase_if(rs, [](const canonical_range& r) { return r.empty(); });
  std::sort(rs.begin(), rs.end());
  std::vector<canonical_range> out;
  for (auto& r : rs) {
    if (!out.empty() && out.back().tensor == r.tensor && r.begin <= out.back().end)
      out.back().end = std::max(out.back().end, r.end);
    else
      out.push_back(std::move(r));
  }
  return out;
}

}  // namespace bitrefit
