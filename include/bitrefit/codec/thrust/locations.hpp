// bitrefit/codec/thrust/locations.hpp — location-coding preparation on a Thrust system.
//
// From compacted positions that are still in the system's memory (device memory under CUDA),
// computes the raw size of every location coding (what the encoder compares to choose one) and
// writes the chosen coding's bytes, so only the location section — about one byte per change
// for gaps8, versus four for a u32 position — has to cross to host memory for zstd. The byte
// formats are codec/location.hpp's (the tests compare with encode_locations byte for byte):
//   gapsW: gap_k = p_k - p_{k-1} - 1 (p_{-1} = -1), as floor(gap/F) escapes F then gap mod F,
//          F = the width's all-ones value, little-endian words;
//   runs:  per maximal run of consecutive positions, LEB128(gap from the previous run's end, or
//          from 0) then LEB128(length - 1); the run's gap equals gap_k of its first position;
//   bitmap: ceil(m/8) bytes, bit p (LSB first) set for each position.
// Every step is a Thrust algorithm over positions or runs (transform_reduce, copy_if,
// exclusive_scan, for_each) with BITREFIT_HD functors, so it is one source for GPU and CPU.
#pragma once

#include "bitrefit/codec/thrust/systems.hpp"  // first: Thrust's device system for host compilers

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scan.h>
#include <thrust/transform_reduce.h>

#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/hd.hpp"

namespace bitrefit::codec {


namespace thrust_loc_detail {

using u8 = std::uint8_t;
using u32 = std::uint32_t;
using u64 = std::uint64_t;

BITREFIT_HD inline u64 gap_at(const u32* pos, u32 k) noexcept {
  return k == 0 ? u64{pos[0]} : u64{pos[k]} - u64{pos[k - 1]} - 1;
}
BITREFIT_HD inline u32 varint_size(u64 v) noexcept {
  u32 n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}
BITREFIT_HD inline u8* put_varint(u8* o, u64 v) noexcept {
  while (v >= 0x80) *o++ = static_cast<u8>((v & 0x7F) | 0x80), v >>= 7;
  *o++ = static_cast<u8>(v);
  return o;
}

struct gap_sums {
  u64 g8, g16, g32;
};
struct gap_units {
  const u32* pos;
  BITREFIT_HD gap_sums operator()(u32 k) const noexcept {
    const u64 g = gap_at(pos, k);
    return {g / 0xFFu + 1, 2 * (g / 0xFFFFu + 1), 4 * (g / 0xFFFFFFFFull + 1)};
  }
};
struct add_gap_sums {
  BITREFIT_HD gap_sums operator()(const gap_sums& a, const gap_sums& b) const noexcept {
    return {a.g8 + b.g8, a.g16 + b.g16, a.g32 + b.g32};
  }
};

struct starts_run {
  const u32* pos;
  BITREFIT_HD bool operator()(u32 k) const noexcept { return k == 0 || pos[k] != pos[k - 1] + 1; }
};

/// Raw bytes of run r: LEB128(gap) + LEB128(length - 1).
struct run_bytes {
  const u32* pos;
  const u32* starts;
  u32 runs, c;
  BITREFIT_HD u64 operator()(u32 r) const noexcept {
    if (r >= runs) return 0;  // one past the end: the exclusive scan's total
    const u32 k = starts[r], end = r + 1 < runs ? starts[r + 1] : c;
    return varint_size(gap_at(pos, k)) + varint_size(end - k - 1);
  }
};
struct write_runs {
  const u32* pos;
  const u32* starts;
  const u64* offsets;
  u8* out;
  u32 runs, c;
  BITREFIT_HD void operator()(u32 r) const noexcept {
    const u32 k = starts[r], end = r + 1 < runs ? starts[r + 1] : c;
    put_varint(put_varint(out + offsets[r], gap_at(pos, k)), end - k - 1);
  }
};

/// Words (of the coding's width) that position k's gap takes; 0 at k == c (the scan's total).
struct gap_words {
  const u32* pos;
  u64 all_ones;
  u32 c;
  BITREFIT_HD u64 operator()(u32 k) const noexcept { return k < c ? gap_at(pos, k) / all_ones + 1 : 0; }
};
struct write_gaps {
  const u32* pos;
  const u64* offsets;  // in words
  u8* out;
  u64 all_ones;
  u32 width;
  BITREFIT_HD void operator()(u32 k) const noexcept {
    u64 g = gap_at(pos, k);
    u8* o = out + offsets[k] * width;
    for (; g >= all_ones; g -= all_ones, o += width)
      for (u32 b = 0; b < width; ++b) o[b] = 0xFF;
    for (u32 b = 0; b < width; ++b) o[b] = static_cast<u8>(g >> (8 * b));
  }
};

/// The first position of each bitmap byte writes that whole byte (positions ascend, so the
/// others of the byte follow it): no two threads write the same byte, no atomics.
struct write_bitmap {
  const u32* pos;
  u8* out;
  u32 c;
  BITREFIT_HD void operator()(u32 k) const noexcept {
    const u32 byte = pos[k] >> 3;
    if (k > 0 && (pos[k - 1] >> 3) == byte) return;
    u8 v = 0;
    for (u32 j = k; j < c && (pos[j] >> 3) == byte; ++j) v = static_cast<u8>(v | (1u << (pos[j] & 7)));
    out[byte] = v;
  }
};

}  // namespace thrust_loc_detail

/// Location-coding preparation on `System`. Holds scratch sized by the largest item seen.
template <class System = thrust_systems::default_system>
class thrust_location_preparer {
 public:
  /// Raw sizes of every coding for `positions` (strictly ascending, in the system's memory) of an
  /// item of m elements. @post equal to the sizes of codec::encode_locations's outputs.
  location_sizes sizes(std::span<const std::uint32_t> positions, std::uint64_t m) {
    using namespace thrust_loc_detail;
    location_sizes s;
    s.bitmap = (m + 7) / 8;
    const u32 c = checked_count(positions, m);
    if (c == 0) return s;
    const u32* pos = positions.data();
    const gap_sums g = thrust::transform_reduce(System::policy(), thrust::counting_iterator<u32>(0),
                                                thrust::counting_iterator<u32>(c), gap_units{pos}, gap_sums{0, 0, 0},
                                                add_gap_sums{});
    s.gaps8 = g.g8, s.gaps16 = g.g16, s.gaps32 = g.g32;
    const u32 runs = find_runs(pos, c);
    s.run_count = runs;
    s.runs = thrust::transform_reduce(System::policy(), thrust::counting_iterator<u32>(0),
                                      thrust::counting_iterator<u32>(runs),
                                      run_bytes{pos, raw(starts_), runs, c}, u64{0}, thrust::plus<u64>());
    return s;
  }

  /// Writes the location section of `coding` for `positions` (system memory) into `out` (host
  /// memory, replaced). @post out == what codec::encode_locations(coding, positions, m) appends.
  void encode(location_coding coding, std::span<const std::uint32_t> positions, std::uint64_t m,
              std::vector<std::byte>& out) {
    using namespace thrust_loc_detail;
    const u32 c = checked_count(positions, m);
    const u32* pos = positions.data();
    out.clear();
    switch (coding) {
      case location_coding::all:
        if (c != m) throw error(errc::invalid_argument, "location coding 'all' needs every element changed");
        return;
      case location_coding::bitmap: {
        const std::size_t nb = static_cast<std::size_t>((m + 7) / 8);
        bytes_.resize(nb / 8 + 1);
        u8* o = reinterpret_cast<u8*>(raw(bytes_));
        thrust::fill(System::policy(), o, o + nb, u8{0});
        thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(c),
                         write_bitmap{pos, o, c});
        return download(o, nb, out);
      }
      case location_coding::gaps8: return encode_gaps(pos, c, 0xFFull, 1, out);
      case location_coding::gaps16: return encode_gaps(pos, c, 0xFFFFull, 2, out);
      case location_coding::gaps32: return encode_gaps(pos, c, 0xFFFFFFFFull, 4, out);
      case location_coding::runs: {
        if (c == 0) return;
        const u32 runs = find_runs(pos, c);
        offsets_.resize(runs + 1);
        auto sizes = thrust::make_transform_iterator(thrust::counting_iterator<u32>(0), run_bytes{pos, raw(starts_), runs, c});
        thrust::exclusive_scan(System::policy(), sizes, sizes + (runs + 1), offsets_.begin());
        const u64 total = offset_at(runs);
        bytes_.resize(total / 8 + 1);
        u8* o = reinterpret_cast<u8*>(raw(bytes_));
        thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(runs),
                         write_runs{pos, raw(starts_), raw(offsets_), o, runs, c});
        return download(o, total, out);
      }
      case location_coding::class_gaps: break;  // base-conditioned items are prepared by prepare_conditioned
    }
    throw error(errc::invalid_argument, "location coding not prepared here");
  }

 private:
  template <class V>
  static auto raw(V& v) {
    return thrust::raw_pointer_cast(v.data());
  }

  static std::uint32_t checked_count(std::span<const std::uint32_t> positions, std::uint64_t m) {
    if (m >= (std::uint64_t{1} << 32) || positions.size() > m)
      throw error(errc::invalid_argument, "location preparation: item must hold < 2^32 elements and at most m positions");
    return static_cast<std::uint32_t>(positions.size());
  }

  std::uint32_t find_runs(const std::uint32_t* pos, std::uint32_t c) {
    starts_.resize(c);
    auto e = thrust::copy_if(System::policy(), thrust::counting_iterator<std::uint32_t>(0),
                             thrust::counting_iterator<std::uint32_t>(c), starts_.begin(),
                             thrust_loc_detail::starts_run{pos});
    return static_cast<std::uint32_t>(e - starts_.begin());
  }

  std::uint64_t offset_at(std::uint32_t n) {
    std::uint64_t v = 0;
    System::to_host(&v, raw(offsets_) + n, sizeof v);
    return v;
  }

  void encode_gaps(const std::uint32_t* pos, std::uint32_t c, std::uint64_t all_ones, std::uint32_t width,
                   std::vector<std::byte>& out) {
    using namespace thrust_loc_detail;
    if (c == 0) return;
    offsets_.resize(c + 1);
    auto words = thrust::make_transform_iterator(thrust::counting_iterator<u32>(0), gap_words{pos, all_ones, c});
    thrust::exclusive_scan(System::policy(), words, words + (c + 1), offsets_.begin());
    const u64 total_words = offset_at(c);
    bytes_.resize(total_words * width / 8 + 1);
    u8* o = reinterpret_cast<u8*>(raw(bytes_));
    thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(c),
                     write_gaps{pos, raw(offsets_), o, all_ones, width});
    download(o, total_words * width, out);
  }

  static void download(const std::uint8_t* src, std::size_t n, std::vector<std::byte>& out) {
    out.resize(n);
    System::to_host(out.data(), src, n);
  }

  typename System::template vector<std::uint32_t> starts_;
  typename System::template vector<std::uint64_t> offsets_;
  typename System::template vector<std::uint64_t> bytes_;  // u64 words: aligned byte scratch
};

}  // namespace bitrefit::codec
