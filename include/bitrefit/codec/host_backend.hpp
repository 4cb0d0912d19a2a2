// bitrefit/codec/host_backend.hpp — the reference execution backend: plain C++ on host memory.
//
// Change detection is the one diff kernel (core/bit_diff.hpp: 64-byte blocks, one branch per equal
// block, AVX2 where the CPU has it), so the pass is bound by memory bandwidth, like memcmp; the
// values of the few changed elements are gathered as they are found.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/core/bit_diff.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit::codec {

namespace detail {

template <class T>
inline T load_lane(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Scans [0, m) elements of width sizeof(T) with the one diff kernel (core/bit_diff.hpp) and emits
// changed positions (and optionally XOR / new values). WantXor / WantNew are template parameters
// so the per-change work has no branch.
template <class T, bool WantXor, bool WantNew>
std::size_t collect_dispatch(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos, std::byte* xo,
                             std::byte* no) {
  constexpr std::size_t E = sizeof(T);
  std::size_t c = 0;
  for_each_changed(a, b, m, E, [&](std::size_t i) {
    pos[c] = static_cast<std::uint32_t>(i);
    if constexpr (WantXor) {
      const T x = static_cast<T>(load_lane<T>(a + i * E) ^ load_lane<T>(b + i * E));
      std::memcpy(xo + c * E, &x, E);
    }
    if constexpr (WantNew) std::memcpy(no + c * E, b + i * E, E);
    ++c;
  });
  return c;
}

template <class T>
std::size_t collect_typed(const std::byte* a, const std::byte* b, std::size_t m, std::uint32_t* pos,
                          std::byte* xo, std::byte* no) {
  if (xo && no) return collect_dispatch<T, true, true>(a, b, m, pos, xo, no);
  if (xo) return collect_dispatch<T, true, false>(a, b, m, pos, xo, no);
  if (no) return collect_dispatch<T, false, true>(a, b, m, pos, xo, no);
  return collect_dispatch<T, false, false>(a, b, m, pos, xo, no);
}

template <class T>
void apply_typed(std::byte* t, value_mode mode, const std::uint32_t* pos, std::size_t c,
                 const std::byte* v) noexcept {
  constexpr std::size_t E = sizeof(T);
  if (mode == value_mode::overwrite) {
    for (std::size_t k = 0; k < c; ++k) std::memcpy(t + std::size_t{pos[k]} * E, v + k * E, E);
  } else {
    for (std::size_t k = 0; k < c; ++k) {
      std::byte* p = t + std::size_t{pos[k]} * E;
      const T x = static_cast<T>(load_lane<T>(p) ^ load_lane<T>(v + k * E));
      std::memcpy(p, &x, E);
    }
  }
}

}  // namespace detail

/// Reference backend on host memory, single-threaded (callers parallelise across chunks).
struct host_backend {
  static constexpr std::string_view name() noexcept { return "host"; }

  std::size_t collect_changes(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E,
                              std::span<std::uint32_t> positions, std::span<std::byte> xor_out,
                              std::span<std::byte> new_out) {
    check_element_size(E);
    if (old.size() != neu.size() || old.size() % E != 0)
      throw error(errc::invalid_argument, "collect_changes: old and new must be equal whole-element spans");
    const std::size_t m = old.size() / E;
    if (m >= (1ull << 32)) throw error(errc::invalid_argument, "collect_changes: chunk must hold < 2^32 elements");
    if (positions.size() < m || (!xor_out.empty() && xor_out.size() < m * E) ||
        (!new_out.empty() && new_out.size() < m * E))
      throw error(errc::invalid_argument, "collect_changes: output spans smaller than the chunk");
    std::byte* xo = xor_out.empty() ? nullptr : xor_out.data();
    std::byte* no = new_out.empty() ? nullptr : new_out.data();
    switch (E) {
      case 1: return detail::collect_typed<std::uint8_t>(old.data(), neu.data(), m, positions.data(), xo, no);
      case 2: return detail::collect_typed<std::uint16_t>(old.data(), neu.data(), m, positions.data(), xo, no);
      case 4: return detail::collect_typed<std::uint32_t>(old.data(), neu.data(), m, positions.data(), xo, no);
      default: return detail::collect_typed<std::uint64_t>(old.data(), neu.data(), m, positions.data(), xo, no);
    }
  }

  void apply_changes(std::span<std::byte> target, std::size_t E, value_mode mode,
                     std::span<const std::uint32_t> positions, std::span<const std::byte> values) {
    check_element_size(E);
    if (values.size() != positions.size() * E)
      throw error(errc::invalid_argument, "apply_changes: values must hold one element per position");
    switch (E) {
      case 1: return detail::apply_typed<std::uint8_t>(target.data(), mode, positions.data(), positions.size(), values.data());
      case 2: return detail::apply_typed<std::uint16_t>(target.data(), mode, positions.data(), positions.size(), values.data());
      case 4: return detail::apply_typed<std::uint32_t>(target.data(), mode, positions.data(), positions.size(), values.data());
      default: return detail::apply_typed<std::uint64_t>(target.data(), mode, positions.data(), positions.size(), values.data());
    }
  }

  void hash_slices(std::span<const std::byte> bytes, std::size_t slice_bytes, std::span<digest128> out) {
    if (slice_bytes == 0) throw error(errc::invalid_argument, "hash_slices: slice size must be positive");
    const std::size_t n = (bytes.size() + slice_bytes - 1) / slice_bytes;
    if (out.size() != n) throw error(errc::invalid_argument, "hash_slices: one output digest per slice");
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t off = j * slice_bytes;
      out[j] = xxh3_128(bytes.subspan(off, std::min(slice_bytes, bytes.size() - off)));
    }
  }

 private:
  static void check_element_size(std::size_t E) {
    if (E != 1 && E != 2 && E != 4 && E != 8)
      throw error(errc::invalid_argument, "element size must be 1, 2, 4 or 8 bytes");
  }
};

static_assert(execution_backend<host_backend>);

}  // namespace bitrefit::codec
