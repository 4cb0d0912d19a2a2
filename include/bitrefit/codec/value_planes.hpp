// bitrefit/codec/value_planes.hpp — value sections: interleaved or split into byte planes, and the
// estimate that chooses between them.
//
// The choice is made on a deterministic sample of the values (value_sample: at most 65536, evenly
// spaced by index), from order-0 entropy estimates of the byte histograms: a backend that keeps the
// values where its tensors live gathers the same sample there and makes the same choice, so the
// bytes on the wire do not depend on the backend.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/types.hpp"

namespace bitrefit::codec {

/// The sample the value-coding choice looks at: `count` values at indices k·stride.
struct value_sample {
  std::size_t count = 0, stride = 1;
};
inline value_sample value_sample_of(std::size_t c) noexcept {
  if (c == 0) return {};
  const std::size_t n = std::min<std::size_t>(c, 65536);
  return {n, c / n};
}

namespace detail {

/// Estimated compressed bytes of `c` values of E bytes, {interleaved, byte planes}, from the
/// byte histograms of their value_sample (`sampled`: the sample's values, interleaved).
inline std::array<double, 2> estimate_sampled_value_bytes(std::span<const std::byte> sampled, std::size_t c, std::size_t E) {
  if (c == 0) return {0.0, 0.0};
  const std::size_t sample = sampled.size() / E;
  std::array<std::array<std::uint64_t, 256>, 8> h{};
  for (std::size_t s = 0; s < sample; ++s)
    for (std::size_t b = 0; b < E; ++b) ++h[b][static_cast<std::uint8_t>(sampled[s * E + b])];
  std::array<std::uint64_t, 256> all{};
  double planes = 0.0;
  for (std::size_t b = 0; b < E; ++b) {
    planes += entropy_bytes(h[b]);
    for (int i = 0; i < 256; ++i) all[i] += h[b][i];
  }
  const double scale = static_cast<double>(c) / static_cast<double>(sample);
  return {entropy_bytes(all) * scale, planes * scale};
}

/// The same estimate over all c values (their value_sample taken here).
inline std::array<double, 2> estimate_value_bytes(std::span<const std::byte> vals, std::size_t E) {
  const std::size_t c = vals.size() / E;
  const value_sample vs = value_sample_of(c);
  std::array<std::array<std::uint64_t, 256>, 8> h{};
  if (c == 0) return {0.0, 0.0};
  for (std::size_t s = 0, k = 0; s < vs.count; ++s, k += vs.stride)
    for (std::size_t b = 0; b < E; ++b) ++h[b][static_cast<std::uint8_t>(vals[k * E + b])];
  std::array<std::uint64_t, 256> all{};
  double planes = 0.0;
  for (std::size_t b = 0; b < E; ++b) {
    planes += entropy_bytes(h[b]);
    for (int i = 0; i < 256; ++i) all[i] += h[b][i];
  }
  const double scale = static_cast<double>(c) / static_cast<double>(vs.count);
  return {entropy_bytes(all) * scale, planes * scale};
}

/// Order-0 entropy estimate (bytes) of a byte stream from a deterministic sample.
inline double estimate_stream_bytes(std::span<const std::byte> s) {
  if (s.empty()) return 0.0;
  const std::size_t sample = std::min<std::size_t>(s.size(), 65536);
  const std::size_t stride = s.size() / sample;
  std::array<std::uint64_t, 256> h{};
  for (std::size_t k = 0, i = 0; k < sample; ++k, i += stride) ++h[static_cast<std::uint8_t>(s[i])];
  return entropy_bytes(h) * static_cast<double>(s.size()) / static_cast<double>(sample);
}

inline void split_planes(std::span<const std::byte> vals, std::size_t E, std::byte* out) {
  const std::size_t c = vals.size() / E;
  const std::byte* v = vals.data();
  if (E == 2) {
    std::byte* p0 = out;
    std::byte* p1 = out + c;
    for (std::size_t k = 0; k < c; ++k) {
      p0[k] = v[2 * k];
      p1[k] = v[2 * k + 1];
    }
    return;
  }
  for (std::size_t k = 0; k < c; ++k)
    for (std::size_t b = 0; b < E; ++b) out[b * c + k] = v[k * E + b];
}

inline void merge_planes(std::span<const std::byte> planes, std::size_t E, std::byte* out) {
  const std::size_t c = planes.size() / E;
  const std::byte* p = planes.data();
  if (E == 2) {
    for (std::size_t k = 0; k < c; ++k) {
      out[2 * k] = p[k];
      out[2 * k + 1] = p[c + k];
    }
    return;
  }
  for (std::size_t k = 0; k < c; ++k)
    for (std::size_t b = 0; b < E; ++b) out[k * E + b] = p[b * c + k];
}

}  // namespace detail

/// Whether c values of E bytes whose value_sample is `sampled` are coded as byte planes.
inline bool choose_byte_planes(std::span<const std::byte> sampled, std::size_t c, std::size_t E) {
  if (E <= 1) return false;
  const auto est = detail::estimate_sampled_value_bytes(sampled, c, E);
  return est[1] < est[0];
}

}  // namespace bitrefit::codec
