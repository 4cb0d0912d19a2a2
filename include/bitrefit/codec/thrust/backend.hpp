// bitrefit/codec/thrust/backend.hpp — the codec's execution backend written with Thrust.
//
// One source for the GPU (nvcc, thrust_systems::cuda) and for Thrust's CPU systems under g++
// (thrust_systems::cpp, thrust_systems::omp), so CI without a GPU runs the very code the GPU runs.
// It implements the seam of codec/concepts.hpp; the frame format, location coding, zstd and the
// apply rules stay in the shared host code, so the bytes on the wire cannot depend on the backend.
//
// How each primitive maps onto Thrust (all functors are BITREFIT_HD, written once):
//  - collect_changes: (1) count_if over element indices with a bitwise "differs" predicate gives
//    the chunk's change count c (device systems size their scratch from it); (2) copy_if of the
//    indices by the same predicate compacts the positions (stream compaction, ascending by
//    construction); (3) for_each over the c positions gathers XOR words and/or absolute values,
//    interleaved or split into byte planes. Only the compacted streams cross to host memory.
//  - apply_changes: the (verified) positions and values cross to the system's memory, then one
//    for_each scatters them into the target tensor in place; positions are distinct, so the
//    writes never race. Synchronises before returning.
//  - hash_slices: XXH3-128 (xxh3_128_hd) per 64 KiB leaf in two transforms: the eight
//    accumulators of every leaf, one thread each (xxh3.hpp, hash_long_lane), then one merge per
//    leaf. One thread per leaf read its 64 KiB alone and left the GPU mostly idle: 7.7 GB/s of
//    model bytes on an H200, where the other primitives run at 55-580 GB/s.
// Element size is a runtime value inside the functors (a uniform branch) rather than a template
// parameter, so each Thrust algorithm is instantiated once: nvcc compile time stays small.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

// systems.hpp first: it picks Thrust's device system for host compilers before any Thrust header.
#include "bitrefit/codec/thrust/systems.hpp"

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/count.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/scan.h>
#include <thrust/functional.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include "bitrefit/codec/base_classes.hpp"
#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/entropy.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/thrust/locations.hpp"
#include "bitrefit/codec/value_planes.hpp"
#include "bitrefit/codec/thrust/xxh3.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/hd.hpp"

namespace bitrefit::codec {

namespace thrust_detail {

using u8 = std::uint8_t;
using u32 = std::uint32_t;
using u64 = std::uint64_t;

template <class T>
BITREFIT_HD inline T load(const u8* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// True iff element i's stored bytes differ (so -0.0 vs +0.0 and NaN payloads count).
/// `aligned`: both bases are aligned to E, so whole-element loads are legal on the device.
struct element_differs {
  const u8* a;
  const u8* b;
  u32 E;
  bool aligned;
  BITREFIT_HD bool operator()(u32 i) const noexcept {
    const std::size_t o = std::size_t{i} * E;
    if (aligned) {
      switch (E) {
        case 1: return a[o] != b[o];
        case 2: return *reinterpret_cast<const std::uint16_t*>(a + o) != *reinterpret_cast<const std::uint16_t*>(b + o);
        case 4: return *reinterpret_cast<const u32*>(a + o) != *reinterpret_cast<const u32*>(b + o);
        default: return *reinterpret_cast<const u64*>(a + o) != *reinterpret_cast<const u64*>(b + o);
      }
    }
    u8 x = 0;
    for (u32 j = 0; j < E; ++j) x |= static_cast<u8>(a[o + j] ^ b[o + j]);
    return x != 0;
  }
};

/// For the k-th changed element: XOR word and/or new value, byte by byte. `plane_stride` 0 writes
/// values interleaved (value k at k*E); otherwise byte j of value k goes to j*plane_stride + k
/// (byte planes, plane_stride = c).
struct gather_values {
  const u8* a;
  const u8* b;
  const u32* pos;
  u8* xor_out;  // may be null
  u8* new_out;  // may be null
  u32 E;
  std::size_t plane_stride;
  BITREFIT_HD void operator()(u32 k) const noexcept {
    const std::size_t o = std::size_t{pos[k]} * E;
    for (u32 j = 0; j < E; ++j) {
      const std::size_t d = plane_stride ? std::size_t{j} * plane_stride + k : std::size_t{k} * E + j;
      const u8 nb = b[o + j];
      if (xor_out) xor_out[d] = static_cast<u8>(a[o + j] ^ nb);
      if (new_out) new_out[d] = nb;
    }
  }
};

/// Scatter of value k into element pos[k] of the target: overwrite or XOR, byte by byte.
struct scatter_values {
  u8* t;
  const u32* pos;
  const u8* v;
  u32 E;
  bool is_xor;
  BITREFIT_HD void operator()(u32 k) const noexcept {
    u8* p = t + std::size_t{pos[k]} * E;
    const u8* s = v + std::size_t{k} * E;
    if (is_xor)
      for (u32 j = 0; j < E; ++j) p[j] = static_cast<u8>(p[j] ^ s[j]);
    else
      for (u32 j = 0; j < E; ++j) p[j] = s[j];
  }
};

/// Host-memory systems compact in blocks: count per block, exclusive scan of the counts, then
/// each block writes its positions at its offset. Two parallel passes with no per-element
/// temporaries (Thrust's generic copy_if on the CPU systems allocates flag and index arrays of
/// the chunk's size and was measured 6x slower here); CUDA keeps CUB's single-pass copy_if.
inline constexpr std::uint32_t compact_block = 1u << 16;

/// Calls emit(i) for every changed element i in [i, e), ascending. Compares 8 bytes at a time and
/// skips equal words with one branch (the common case of a sparse delta), like the host backend.
template <class T, class Emit>
BITREFIT_HD inline void scan_changes(const u8* a, const u8* b, u32 i, u32 e, Emit& emit) noexcept {
  constexpr u32 per = 8 / sizeof(T);
  for (; i + per <= e; i += per) {
    const std::size_t o = std::size_t{i} * sizeof(T);
    if (load<u64>(a + o) == load<u64>(b + o)) continue;
    for (u32 j = 0; j < per; ++j)
      if (load<T>(a + o + j * sizeof(T)) != load<T>(b + o + j * sizeof(T))) emit(i + j);
  }
  for (; i < e; ++i)
    if (load<T>(a + std::size_t{i} * sizeof(T)) != load<T>(b + std::size_t{i} * sizeof(T))) emit(i);
}

template <class Emit>
BITREFIT_HD inline void scan_changes(const element_differs& p, u32 i, u32 e, Emit& emit) noexcept {
  switch (p.E) {
    case 1: return scan_changes<u8>(p.a, p.b, i, e, emit);
    case 2: return scan_changes<std::uint16_t>(p.a, p.b, i, e, emit);
    case 4: return scan_changes<u32>(p.a, p.b, i, e, emit);
    default: return scan_changes<u64>(p.a, p.b, i, e, emit);
  }
}

struct count_emit {
  u32 n;
  BITREFIT_HD void operator()(u32) noexcept { ++n; }
};
struct store_emit {
  u32* o;
  BITREFIT_HD void operator()(u32 i) noexcept { *o++ = i; }
};

struct count_block {
  element_differs pred;
  u32 m;
  BITREFIT_HD u32 operator()(u32 blk) const noexcept {
    const u32 b = blk * compact_block, e = m - b < compact_block ? m : b + compact_block;
    count_emit c{0};
    scan_changes(pred, b, e, c);
    return c.n;
  }
};

struct compact_blocks {
  element_differs pred;
  u32 m;
  const u32* offsets;
  u32* out;
  BITREFIT_HD void operator()(u32 blk) const noexcept {
    const u32 b = blk * compact_block, e = m - b < compact_block ? m : b + compact_block;
    store_emit s{out + offsets[blk]};
    scan_changes(pred, b, e, s);
  }
};

struct digest_words {
  u64 low64, high64;
};

/// Accumulator t % 8 of slice t / 8 of `bytes` (xxh3.hpp, hash_long_lane): eight threads per
/// slice, so a 64 KiB leaf is read a stripe of 64 contiguous bytes at a time by eight neighbouring
/// threads rather than by one thread alone. Slices short enough for XXH3's short paths get 0 here
/// and are hashed whole by hash_slice_merge.
struct hash_slice_lane {
  const u8* bytes;
  std::size_t size;
  std::size_t slice;
  BITREFIT_HD u64 operator()(std::size_t t) const noexcept {
    const std::size_t off = (t >> 3) * slice;
    const std::size_t len = size - off < slice ? size - off : slice;
    if (len <= xxh3_hd_detail::long_input) return 0;
    return xxh3_hd_detail::hash_long_lane(bytes + off, len, xxh3_hd_detail::secret(), static_cast<int>(t & 7));
  }
};

/// XXH3-128 of slice j of `bytes`: merged from its eight lanes (hash_slice_lane) when it is long,
/// hashed whole otherwise.
struct hash_slice_merge {
  const u8* bytes;
  std::size_t size;
  std::size_t slice;
  const u64* lanes;
  BITREFIT_HD digest_words operator()(std::size_t j) const noexcept {
    const std::size_t off = j * slice;
    const std::size_t len = size - off < slice ? size - off : slice;
    if (len <= xxh3_hd_detail::long_input) {
      const digest128 d = xxh3_128_hd(bytes + off, len);
      return {d.low64, d.high64};
    }
    const xxh3_hd_detail::u128 h = xxh3_hd_detail::hash_long_merge(lanes + 8 * j, len, xxh3_hd_detail::secret());
    return {h.low64, h.high64};
  }
};

// ---- base classes and class ranks (base_classes.hpp's rank_by_class, on the system) -------------

BITREFIT_HD inline unsigned popc64(u64 x) noexcept {
#if BITREFIT_DEVICE_PASS
  return static_cast<unsigned>(__popcll(x));
#else
  unsigned n = 0;  // portable: Thrust's host systems run this in plain (baseline ISA) code
  for (; x; x &= x - 1) ++n;
  return n;
#endif
}

/// Per-threshold counts of one 64-element block (or their prefix sums): T <= 15 used.
struct class_counts {
  u32 v[15];
};
struct add_class_counts {
  BITREFIT_HD class_counts operator()(const class_counts& a, const class_counts& b) const noexcept {
    class_counts r;
    for (int j = 0; j < 15; ++j) r.v[j] = a.v[j] + b.v[j];
    return r;
  }
};

/// Block b: masks[b*T + j] bit l = (magnitude of element 64b + l >= t[j]); counts = their popcounts.
struct class_block_masks {
  const u8* base;
  u64 m;
  u32 E, T;
  u64 mag_mask;
  u64 t[15];
  u64* masks;
  class_counts* counts;
  BITREFIT_HD void operator()(u64 b) const noexcept {
    u64 ge[15] = {};
    const u64 start = b * 64, n = m - start < 64 ? m - start : 64;
    for (u64 l = 0; l < n; ++l) {
      u64 w = 0;
      for (u32 i = 0; i < E; ++i) w |= u64{base[(start + l) * E + i]} << (8 * i);
      const u64 mag = w & mag_mask;
      for (u32 j = 0; j < T && mag >= t[j]; ++j) ge[j] |= u64{1} << l;
    }
    class_counts c{};
    for (u32 j = 0; j < T; ++j) masks[b * T + j] = ge[j], c.v[j] = popc64(ge[j]);
    counts[b] = c;
  }
};

/// Change k: its class and its rank (same-class elements before it, plus totals[class]).
struct rank_changes {
  const u32* pos;
  const u64* masks;
  const class_counts* cum;  // exclusive prefix of the block counts
  u32 T;
  u64 totals[16];
  u8* cls_out;
  u32* rank_out;
  BITREFIT_HD void operator()(u32 k) const noexcept {
    const u64 p = pos[k], b = p >> 6;
    const u32 lane = static_cast<u32>(p & 63);
    const u64 bl = (u64{1} << lane) - 1;
    u32 cls = 0;
    for (u32 j = 0; j < T; ++j) cls += static_cast<u32>((masks[b * T + j] >> lane) & 1);
    const u64 hi = cls == 0 ? p : cum[b].v[cls - 1] + popc64(masks[b * T + cls - 1] & bl);
    const u64 lo = cls == T ? 0 : cum[b].v[cls] + popc64(masks[b * T + cls] & bl);
    cls_out[k] = static_cast<u8>(cls);
    rank_out[k] = static_cast<u32>(totals[cls] + hi - lo);
  }
};

/// Copies values k·stride (k < n) of an interleaved array of E-byte values.
struct gather_strided {
  const u8* src;
  u8* dst;
  u32 E;
  std::size_t stride;
  BITREFIT_HD void operator()(u32 k) const noexcept {
    for (u32 j = 0; j < E; ++j) dst[std::size_t{k} * E + j] = src[std::size_t{k} * stride * E + j];
  }
};

inline void check_element_size(std::size_t E) {
  if (E != 1 && E != 2 && E != 4 && E != 8)
    throw error(errc::invalid_argument, "element size must be 1, 2, 4 or 8 bytes");
}

template <class T>
const u8* bytes_of(std::span<T> s) noexcept {
  return reinterpret_cast<const u8*>(s.data());
}

}  // namespace thrust_detail

/// The Thrust execution backend on `System` (thrust_systems::cpp, ::omp or ::cuda). Tensor bytes
/// live in the system's memory (device memory for cuda); positions, values and digests are host
/// memory, as the seam requires. Holds scratch that grows to the largest chunk seen (bounded by
/// the frame size, never by the model). Not thread-safe: one instance per thread or stream.
template <class System = thrust_systems::default_system>
class thrust_backend {
 public:
  using system = System;
  static constexpr std::string_view name() noexcept { return System::name; }

  /// See concepts.hpp, primitive 1.
  std::size_t collect_changes(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E,
                              std::span<std::uint32_t> positions, std::span<std::byte> xor_out,
                              std::span<std::byte> new_out) {
    const std::size_t m = check_chunk(old, neu, E, positions, xor_out, new_out);
    return collect(old, neu, E, m, positions.data(), xor_out.empty() ? nullptr : xor_out.data(),
                   new_out.empty() ? nullptr : new_out.data(), /*planes=*/false);
  }

  /// Like collect_changes, but the values come out split into byte planes on the system itself:
  /// byte j of the k-th value at [j*c + k] (c = returned count), i.e. exactly what the codec's
  /// value_coding::byte_planes section holds before zstd. Saves the host-side transpose.
  std::size_t collect_changes_planes(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E,
                                     std::span<std::uint32_t> positions, std::span<std::byte> xor_planes,
                                     std::span<std::byte> new_planes) {
    const std::size_t m = check_chunk(old, neu, E, positions, xor_planes, new_planes);
    return collect(old, neu, E, m, positions.data(), xor_planes.empty() ? nullptr : xor_planes.data(),
                   new_planes.empty() ? nullptr : new_planes.data(), /*planes=*/true);
  }

  /// Number of elements whose stored bits differ (the count pass alone; detection throughput).
  std::size_t count_changes(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E) {
    thrust_detail::check_element_size(E);
    const auto pred = differs(old, neu, E);
    if constexpr (System::host_memory) {
      const auto m = static_cast<std::uint32_t>(old.size() / E);
      const auto nb = static_cast<std::uint32_t>((old.size() / E + thrust_detail::compact_block - 1) / thrust_detail::compact_block);
      return thrust::transform_reduce(System::policy(), thrust::counting_iterator<std::uint32_t>(0),
                                      thrust::counting_iterator<std::uint32_t>(nb), thrust_detail::count_block{pred, m},
                                      std::size_t{0}, thrust::plus<std::size_t>());
    }
    return static_cast<std::size_t>(thrust::count_if(System::policy(), thrust::counting_iterator<std::uint32_t>(0),
                                                     thrust::counting_iterator<std::uint32_t>(
                                                         static_cast<std::uint32_t>(old.size() / E)),
                                                     pred));
  }

  /// See concepts.hpp, primitive 2.
  void apply_changes(std::span<std::byte> target, std::size_t E, value_mode mode,
                     std::span<const std::uint32_t> positions, std::span<const std::byte> values) {
    using namespace thrust_detail;
    check_element_size(E);
    if (values.size() != positions.size() * E)
      throw error(errc::invalid_argument, "apply_changes: values must hold one element per position");
    const std::size_t c = positions.size();
    if (c == 0) return;
    const u32* pos = positions.data();
    const u8* val = bytes_of(values);
    if constexpr (!System::host_memory) {
      pos_.resize(c);
      System::from_host(thrust::raw_pointer_cast(pos_.data()), positions.data(), c * sizeof(u32));
      val_.resize((c * E + 7) / 8);
      System::from_host(thrust::raw_pointer_cast(val_.data()), values.data(), c * E);
      pos = thrust::raw_pointer_cast(pos_.data());
      val = reinterpret_cast<const u8*>(thrust::raw_pointer_cast(val_.data()));
    }
    thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0),
                     thrust::counting_iterator<u32>(static_cast<u32>(c)),
                     scatter_values{reinterpret_cast<u8*>(target.data()), pos, val, static_cast<u32>(E),
                                    mode == value_mode::xor_mask});
    System::synchronize();
  }

  /// See concepts.hpp, primitive 5: host memory as is; device memory copied into `scratch`.
  std::span<const std::byte> host_bytes(std::span<const std::byte> bytes, byte_buffer& scratch) {
    if constexpr (System::host_memory) {
      return bytes;
    } else {
      scratch.resize_uninit(bytes.size());
      if (!bytes.empty()) System::to_host(scratch.data(), bytes.data(), bytes.size());
      return scratch.span();
    }
  }

  /// See concepts.hpp, primitive 6: computed on the system (block masks, a scan of their counts,
  /// one rank per change); host positions and outputs cross once on a device system. The classes
  /// are read from the base on the system, so the host-side `base_at_positions` hint is not used.
  void rank_by_class(std::span<const std::byte> base, const float_format& f, const class_spec& spec,
                     std::span<const std::uint32_t> positions, std::span<const std::byte> /*base_at_positions*/,
                     std::span<std::uint8_t> classes_out, std::span<std::uint32_t> ranks_out, std::span<std::uint64_t> totals) {
    const std::size_t c = positions.size();
    if constexpr (System::host_memory) {
      rank_on_system(base, f, spec, positions.data(), c, classes_out.data(), ranks_out.data(), totals);
    } else {
      rpos_.resize(c);
      System::from_host(thrust::raw_pointer_cast(rpos_.data()), positions.data(), c * sizeof(std::uint32_t));
      rcls_.resize(c);
      rrank_.resize(c);
      rank_on_system(base, f, spec, thrust::raw_pointer_cast(rpos_.data()), c, thrust::raw_pointer_cast(rcls_.data()),
                     thrust::raw_pointer_cast(rrank_.data()), totals);
      System::to_host(classes_out.data(), thrust::raw_pointer_cast(rcls_.data()), c);
      System::to_host(ranks_out.data(), thrust::raw_pointer_cast(rrank_.data()), c * sizeof(std::uint32_t));
    }
  }

  /// See concepts.hpp, primitive 7: the item's positions are compacted, location-coded and used to
  /// gather the values on the system; only the location section and the values cross.
  std::size_t prepare_plain(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E, value_mode mode,
                            prepared_plain& out, entropy_accumulator* entropy) {
    using namespace thrust_detail;
    const std::size_t m = check_pair(old, neu, E);
    const std::size_t c = compact_positions(old, neu, E, m);
    if (entropy) add_entropy(old, neu, E, m, c, *entropy);
    if (c == 0) return 0;
    const std::span<const std::uint32_t> pos{thrust::raw_pointer_cast(pos_.data()), c};
    out.locations = choose_location_coding(loc_.sizes(pos, m), c, m);
    loc_.encode(out.locations, pos, m, loc_bytes_);
    out.location_raw.clear();
    out.location_raw.append(loc_bytes_);
    // values: the value_sample decides interleaved vs byte planes, as on the host
    const bool want_xor = mode == value_mode::xor_mask;
    gather(old, neu, E, c, want_xor, /*planes=*/false);
    const value_sample vs = value_sample_of(c);
    sample_dev_.resize((vs.count * E + 7) / 8);
    thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(static_cast<u32>(vs.count)),
                     gather_strided{reinterpret_cast<const u8*>(thrust::raw_pointer_cast((want_xor ? xor_ : val_).data())),
                                    reinterpret_cast<u8*>(thrust::raw_pointer_cast(sample_dev_.data())), static_cast<u32>(E), vs.stride});
    sample_host_.resize_uninit(vs.count * E);
    System::to_host(sample_host_.data(), thrust::raw_pointer_cast(sample_dev_.data()), vs.count * E);
    const bool planes = choose_byte_planes(sample_host_.span(), c, E);
    out.values = planes ? value_coding::byte_planes : value_coding::interleaved;
    if (planes) gather(old, neu, E, c, want_xor, /*planes=*/true);
    out.value_raw.resize_uninit(c * E);
    System::to_host(out.value_raw.data(), thrust::raw_pointer_cast((want_xor ? xor_ : val_).data()), c * E);
    return c;
  }

  /// See concepts.hpp, primitive 8: positions compacted and ranked on the system; the classes,
  /// ranks and old/new bits of the changes cross, the positions do not.
  std::size_t prepare_conditioned(std::span<const std::byte> old, std::span<const std::byte> neu, const float_format& f,
                                  const class_spec& spec, prepared_conditioned& out, entropy_accumulator* entropy) {
    const std::size_t E = f.element_size;
    const std::size_t m = check_pair(old, neu, E);
    const std::size_t c = compact_positions(old, neu, E, m);
    if (entropy) add_entropy(old, neu, E, m, c, *entropy);
    out.classes.resize_uninit(c);
    out.ranks.resize_uninit(c);
    if (c == 0) return 0;
    std::array<std::uint64_t, max_base_classes> totals{};
    const std::uint32_t* pos = thrust::raw_pointer_cast(pos_.data());
    if constexpr (System::host_memory) {
      rank_on_system(old, f, spec, pos, c, out.classes.data(), out.ranks.data(), totals);
    } else {
      rcls_.resize(c);
      rrank_.resize(c);
      rank_on_system(old, f, spec, pos, c, thrust::raw_pointer_cast(rcls_.data()), thrust::raw_pointer_cast(rrank_.data()), totals);
      System::to_host(out.classes.data(), thrust::raw_pointer_cast(rcls_.data()), c);
      System::to_host(out.ranks.data(), thrust::raw_pointer_cast(rrank_.data()), c * sizeof(std::uint32_t));
    }
    gather(old, neu, E, c, /*want_xor=*/true, /*planes=*/false, /*want_new=*/true);
    out.new_values.resize_uninit(c * E);
    out.old_values.resize_uninit(c * E);
    System::to_host(out.new_values.data(), thrust::raw_pointer_cast(val_.data()), c * E);
    System::to_host(out.old_values.data(), thrust::raw_pointer_cast(xor_.data()), c * E);
    for (std::size_t i = 0; i < c * E; ++i) out.old_values[i] ^= out.new_values[i];  // old = (old ^ new) ^ new
    return c;
  }

  /// See concepts.hpp, primitive 3.
  void hash_slices(std::span<const std::byte> bytes, std::size_t slice_bytes, std::span<digest128> out) {
    using namespace thrust_detail;
    if (slice_bytes == 0) throw error(errc::invalid_argument, "hash_slices: slice size must be positive");
    const std::size_t n = (bytes.size() + slice_bytes - 1) / slice_bytes;
    if (out.size() != n) throw error(errc::invalid_argument, "hash_slices: one output digest per slice");
    if (n == 0) return;
    lanes_.resize(8 * n);
    thrust::transform(System::policy(), thrust::counting_iterator<std::size_t>(0),
                      thrust::counting_iterator<std::size_t>(8 * n), lanes_.begin(),
                      hash_slice_lane{bytes_of(bytes), bytes.size(), slice_bytes});
    digests_.resize(n);
    thrust::transform(System::policy(), thrust::counting_iterator<std::size_t>(0),
                      thrust::counting_iterator<std::size_t>(n), digests_.begin(),
                      hash_slice_merge{bytes_of(bytes), bytes.size(), slice_bytes, thrust::raw_pointer_cast(lanes_.data())});
    static_assert(sizeof(digest_words) == 16);
    // digest128 and digest_words are both {low64, high64}; copy field-wise on the host.
    host_digests_.resize(n);
    System::to_host(host_digests_.data(), thrust::raw_pointer_cast(digests_.data()), n * sizeof(digest_words));
    for (std::size_t j = 0; j < n; ++j) out[j] = digest128{host_digests_[j].low64, host_digests_[j].high64};
  }

 private:
  std::size_t check_pair(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E) {
    thrust_detail::check_element_size(E);
    if (old.size() != neu.size() || old.size() % E != 0)
      throw error(errc::invalid_argument, "prepare: old and new must be equal whole-element spans");
    const std::size_t m = old.size() / E;
    if (m >= (std::size_t{1} << 32)) throw error(errc::invalid_argument, "prepare: item must hold < 2^32 elements");
    return m;
  }

  // The item's changed positions into pos_ (system memory), ascending; returns their count.
  std::size_t compact_positions(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E, std::size_t m) {
    using namespace thrust_detail;
    if (m == 0) {
      pos_.resize(0);
      return 0;
    }
    const auto pred = differs(old, neu, E);
    if constexpr (System::host_memory) {
      const u32 mm = static_cast<u32>(m), nb = static_cast<u32>((m + compact_block - 1) / compact_block);
      blocks_.resize(nb + 1);
      thrust::transform(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(nb), blocks_.begin(),
                        count_block{pred, mm});
      blocks_[nb] = 0;
      thrust::exclusive_scan(System::policy(), blocks_.begin(), blocks_.end(), blocks_.begin());
      const std::size_t c = blocks_[nb];
      pos_.resize(c);
      thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(nb),
                       compact_blocks{pred, mm, thrust::raw_pointer_cast(blocks_.data()), thrust::raw_pointer_cast(pos_.data())});
      return c;
    } else {
      const thrust::counting_iterator<u32> first(0), last(static_cast<u32>(m));
      const std::size_t c = static_cast<std::size_t>(thrust::count_if(System::policy(), first, last, pred));
      pos_.resize(c);
      thrust::copy_if(System::policy(), first, last, pos_.begin(), pred);
      return c;
    }
  }

  // XOR words (xor_) and/or new values (val_) of the c changes at pos_, interleaved or as planes.
  void gather(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E, std::size_t c, bool want_xor,
              bool planes, bool want_new = false) {
    using namespace thrust_detail;
    const bool xo = want_xor, no = want_new || !want_xor;
    const std::size_t words = (c * E + 7) / 8;
    if (xo) xor_.resize(words);
    if (no) val_.resize(words);
    thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(static_cast<u32>(c)),
                     gather_values{bytes_of(old), bytes_of(neu), thrust::raw_pointer_cast(pos_.data()),
                                   xo ? reinterpret_cast<u8*>(thrust::raw_pointer_cast(xor_.data())) : nullptr,
                                   no ? reinterpret_cast<u8*>(thrust::raw_pointer_cast(val_.data())) : nullptr,
                                   static_cast<u32>(E), planes ? c : std::size_t{0}});
  }

  // The entropy bound's statistics (benches): every XOR mask of the item, to host.
  void add_entropy(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E, std::size_t m, std::size_t c,
                   entropy_accumulator& ent) {
    gather(old, neu, E, c, /*want_xor=*/true, /*planes=*/false);
    entropy_host_.resize_uninit(c * E);
    if (c) System::to_host(entropy_host_.data(), thrust::raw_pointer_cast(xor_.data()), c * E);
    ent.add(E, m, entropy_host_.span());
  }

  // rank_by_class with positions and outputs in system memory.
  void rank_on_system(std::span<const std::byte> base, const float_format& f, const class_spec& spec, const std::uint32_t* pos,
                      std::size_t c, std::uint8_t* cls_out, std::uint32_t* rank_out, std::span<std::uint64_t> totals) {
    using namespace thrust_detail;
    const std::size_t E = f.element_size, m = base.size() / E;
    const u32 T = spec.boundaries();
    const std::size_t nb = (m + 63) / 64;
    class_block_masks bm{bytes_of(base), m, static_cast<u32>(E), T, f.magnitude_mask, {}, nullptr, nullptr};
    for (u32 j = 0; j < T; ++j) bm.t[j] = std::uint64_t{spec.thresholds[j]} << f.mantissa_bits;
    masks_.resize(nb * (T ? T : 1));
    counts_.resize(nb + 1);
    bm.masks = thrust::raw_pointer_cast(masks_.data());
    bm.counts = thrust::raw_pointer_cast(counts_.data());
    if (T > 0 && nb > 0) {
      thrust::for_each(System::policy(), thrust::counting_iterator<std::uint64_t>(0), thrust::counting_iterator<std::uint64_t>(nb), bm);
      const class_counts zero{};
      thrust::fill(System::policy(), counts_.begin() + static_cast<std::ptrdiff_t>(nb), counts_.end(), zero);
      thrust::exclusive_scan(System::policy(), counts_.begin(), counts_.end(), counts_.begin(), zero, add_class_counts{});
    }
    rank_changes rc{pos, bm.masks, thrust::raw_pointer_cast(counts_.data()), T, {}, cls_out, rank_out};
    for (unsigned k = 0; k < spec.count; ++k) rc.totals[k] = totals[k];
    if (c) thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(static_cast<u32>(c)), rc);
    // class totals: G_j = all elements with magnitude >= t_j (the scan's total)
    class_counts all{};
    if (T > 0 && nb > 0) System::to_host(&all, thrust::raw_pointer_cast(counts_.data()) + nb, sizeof all);
    std::uint64_t prev = m;
    for (u32 j = 0; j <= T; ++j) {
      const std::uint64_t g = j < T ? all.v[j] : 0;
      totals[j] += prev - g;
      prev = g;
    }
  }

  std::size_t check_chunk(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E,
                          std::span<std::uint32_t> positions, std::span<std::byte> xo, std::span<std::byte> no) {
    thrust_detail::check_element_size(E);
    if (old.size() != neu.size() || old.size() % E != 0)
      throw error(errc::invalid_argument, "collect_changes: old and new must be equal whole-element spans");
    const std::size_t m = old.size() / E;
    if (m >= (std::size_t{1} << 32))
      throw error(errc::invalid_argument, "collect_changes: chunk must hold < 2^32 elements");
    if (positions.size() < m || (!xo.empty() && xo.size() < m * E) || (!no.empty() && no.size() < m * E))
      throw error(errc::invalid_argument, "collect_changes: output spans smaller than the chunk");
    return m;
  }

  static thrust_detail::element_differs differs(std::span<const std::byte> old, std::span<const std::byte> neu,
                                                std::size_t E) {
    const auto a = reinterpret_cast<std::uintptr_t>(old.data());
    const auto b = reinterpret_cast<std::uintptr_t>(neu.data());
    return {thrust_detail::bytes_of(old), thrust_detail::bytes_of(neu), static_cast<std::uint32_t>(E),
            a % E == 0 && b % E == 0};
  }

  std::size_t collect(std::span<const std::byte> old, std::span<const std::byte> neu, std::size_t E, std::size_t m,
                      std::uint32_t* positions, std::byte* xo, std::byte* no, bool planes) {
    using namespace thrust_detail;
    if (m == 0) return 0;
    const auto pred = differs(old, neu, E);
    const thrust::counting_iterator<u32> first(0), last(static_cast<u32>(m));
    std::size_t c = 0;
    u32* pos = positions;
    if constexpr (System::host_memory) {
      // Host memory: blocked count + scan + compaction straight into the caller's positions.
      const u32 mm = static_cast<u32>(m), nb = static_cast<u32>((m + compact_block - 1) / compact_block);
      blocks_.resize(nb + 1);
      thrust::transform(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(nb),
                        blocks_.begin(), count_block{pred, mm});
      blocks_[nb] = 0;
      thrust::exclusive_scan(System::policy(), blocks_.begin(), blocks_.end(), blocks_.begin());
      c = blocks_[nb];
      thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(nb),
                       compact_blocks{pred, mm, thrust::raw_pointer_cast(blocks_.data()), positions});
    } else {
      // Device memory: count, size the scratch to c, compact, then only c positions cross.
      c = static_cast<std::size_t>(thrust::count_if(System::policy(), first, last, pred));
      pos_.resize(c);
      thrust::copy_if(System::policy(), first, last, pos_.begin(), pred);
      pos = thrust::raw_pointer_cast(pos_.data());
    }
    if (c == 0 || (!xo && !no)) {
      if constexpr (!System::host_memory) System::to_host(positions, pos, c * sizeof(u32));
      return c;
    }
    u8* xdst = reinterpret_cast<u8*>(xo);
    u8* ndst = reinterpret_cast<u8*>(no);
    if constexpr (!System::host_memory) {
      const std::size_t words = (c * E + 7) / 8;
      if (xo) xor_.resize(words);
      if (no) val_.resize(words);
      xdst = xo ? reinterpret_cast<u8*>(thrust::raw_pointer_cast(xor_.data())) : nullptr;
      ndst = no ? reinterpret_cast<u8*>(thrust::raw_pointer_cast(val_.data())) : nullptr;
    }
    thrust::for_each(System::policy(), thrust::counting_iterator<u32>(0), thrust::counting_iterator<u32>(static_cast<u32>(c)),
                     gather_values{bytes_of(old), bytes_of(neu), pos, xdst, ndst, static_cast<u32>(E),
                                   planes ? c : std::size_t{0}});
    if constexpr (!System::host_memory) {
      System::to_host(positions, pos, c * sizeof(u32));
      if (xo) System::to_host(xo, xdst, c * E);
      if (no) System::to_host(no, ndst, c * E);
    }
    return c;
  }

  typename System::template vector<std::uint32_t> pos_;
  typename System::template vector<std::uint32_t> blocks_;  // per-block counts, then offsets
  typename System::template vector<std::uint64_t> xor_;  // u64 words: 8-byte aligned byte scratch
  typename System::template vector<std::uint64_t> val_;
  typename System::template vector<std::uint64_t> lanes_;  // hash_slices: eight accumulators a slice
  typename System::template vector<thrust_detail::digest_words> digests_;
  std::vector<thrust_detail::digest_words> host_digests_;
  typename System::template vector<std::uint64_t> masks_;        // class masks per block
  typename System::template vector<thrust_detail::class_counts> counts_;
  typename System::template vector<std::uint32_t> rpos_, rrank_;  // rank_by_class staging (device)
  typename System::template vector<std::uint8_t> rcls_;
  typename System::template vector<std::uint64_t> sample_dev_;
  byte_buffer sample_host_, entropy_host_;
  std::vector<std::byte> loc_bytes_;
  thrust_location_preparer<System> loc_;
};

static_assert(preparing_backend<thrust_backend<thrust_systems::cpp>>);
#if BITREFIT_THRUST_HAS_OMP
static_assert(preparing_backend<thrust_backend<thrust_systems::omp>>);
#endif

}  // namespace bitrefit::codec
