// bitrefit/codec/entropy.hpp — the order-0 entropy bound a delta is measured against:
//   n·H(c/n) + c·H(XOR words)   (bits; n elements, c changed)
// H(XOR words) is the empirical entropy of the changed elements' XOR masks taken as whole words
// (a 16-bit word for BF16, ...). Words of different widths are counted as distinct symbols.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <unordered_map>
#include <vector>

namespace bitrefit::codec {

class entropy_accumulator {
 public:
  /// Adds a tensor range of `elements` elements whose changed elements have the XOR masks in
  /// `xor_values` (element_size bytes each).
  void add(std::size_t element_size, std::uint64_t elements, std::span<const std::byte> xor_values) {
    n_ += elements;
    const std::size_t c = xor_values.size() / element_size;
    c_ += c;
    if (element_size == 1) {
      if (h8_.empty()) h8_.assign(256, 0);
      for (std::size_t k = 0; k < c; ++k) ++h8_[static_cast<std::uint8_t>(xor_values[k])];
    } else if (element_size == 2) {
      if (h16_.empty()) h16_.assign(65536, 0);
      for (std::size_t k = 0; k < c; ++k) {
        std::uint16_t w;
        std::memcpy(&w, xor_values.data() + 2 * k, 2);
        ++h16_[w];
      }
    } else {
      auto& h = element_size == 4 ? h32_ : h64_;
      for (std::size_t k = 0; k < c; ++k) {
        std::uint64_t w = 0;
        std::memcpy(&w, xor_values.data() + element_size * k, element_size);
        ++h[w];
      }
    }
  }

  std::uint64_t elements() const noexcept { return n_; }
  std::uint64_t changed() const noexcept { return c_; }

  /// The bound in bytes (may be fractional).
  double bytes() const {
    if (n_ == 0) return 0.0;
    double bits = 0.0;
    const double n = static_cast<double>(n_), c = static_cast<double>(c_);
    if (c_ > 0 && c_ < n_) bits += -c * std::log2(c / n) - (n - c) * std::log2((n - c) / n);
    auto add_counts = [&](double cnt) {
      if (cnt > 0) bits -= cnt * std::log2(cnt / c);
    };
    for (auto v : h8_) add_counts(static_cast<double>(v));
    for (auto v : h16_) add_counts(static_cast<double>(v));
    for (auto& [k, v] : h32_) add_counts(static_cast<double>(v));
    for (auto& [k, v] : h64_) add_counts(static_cast<double>(v));
    return bits / 8.0;
  }

 private:
  std::uint64_t n_ = 0, c_ = 0;
  std::vector<std::uint64_t> h8_, h16_;
  std::unordered_map<std::uint64_t, std::uint64_t> h32_, h64_;
};

}  // namespace bitrefit::codec
