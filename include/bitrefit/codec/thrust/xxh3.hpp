// bitrefit/codec/thrust/xxh3.hpp — XXH3-128 (seed 0, default secret) callable on host and device.
//
// Why not xxhash.h: its implementation is host-only (SIMD dispatch, static tables, no
// __device__), so the GPU cannot call it. This is the scalar algorithm of XXH3 0.8 written once
// behind BITREFIT_HD, so the attestation digest's per-slice leaves are computed where the weights
// live. Law (tested bit for bit against libxxhash's XXH3_128bits over lengths 0..several KiB and
// 64 KiB slices, every input alignment): xxh3_128_hd(p, n) == XXH3_128bits(p, n).
//
// Only seed 0 and the default 192-byte secret are implemented: that is the only variant bitrefit
// uses. Little-endian hosts only (static_assert below); CUDA devices are little-endian.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/hd.hpp"

static_assert(std::endian::native == std::endian::little, "xxh3_128_hd assumes a little-endian host");

namespace bitrefit::codec {

namespace xxh3_hd_detail {

using u8 = std::uint8_t;
using u32 = std::uint32_t;
using u64 = std::uint64_t;

inline constexpr u64 prime32_1 = 0x9E3779B1u;
inline constexpr u64 prime32_2 = 0x85EBCA77u;
inline constexpr u64 prime32_3 = 0xC2B2AE3Du;
inline constexpr u64 prime64_1 = 0x9E3779B185EBCA87ull;
inline constexpr u64 prime64_2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr u64 prime64_3 = 0x165667B19E3779F9ull;
inline constexpr u64 prime64_4 = 0x85EBCA77C2B2AE63ull;
inline constexpr u64 prime64_5 = 0x27D4EB2F165667C5ull;

inline constexpr std::size_t secret_size = 192;
inline constexpr std::size_t stripe_len = 64;
inline constexpr std::size_t secret_consume_rate = 8;
inline constexpr std::size_t stripes_per_block = (secret_size - stripe_len) / secret_consume_rate;  // 16
inline constexpr std::size_t block_len = stripe_len * stripes_per_block;                         // 1024

// The default secret (XXH3_kSecret), written once and instantiated twice: in host memory, and
// in device constant memory under nvcc (broadcast reads: every thread of a warp reads the same
// secret offset at the same time).
#define BITREFIT_XXH3_SECRET_BYTES                                                                      \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, \
      0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6,    \
      0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74,    \
      0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91,    \
      0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d,    \
      0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34,    \
      0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,    \
      0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5,    \
      0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16,    \
      0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8,    \
      0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca,    \
      0xbb, 0x4b, 0x40, 0x7e

alignas(64) inline constexpr u8 secret_host[secret_size] = {BITREFIT_XXH3_SECRET_BYTES};
#if defined(__CUDACC__)
alignas(64) static __constant__ u8 secret_device[secret_size] = {BITREFIT_XXH3_SECRET_BYTES};
#endif
#undef BITREFIT_XXH3_SECRET_BYTES

BITREFIT_HD inline const u8* secret() noexcept {
#if defined(__CUDA_ARCH__)
  return secret_device;
#else
  return secret_host;
#endif
}

BITREFIT_HD inline u64 read64(const u8* p) noexcept {
  u64 v;
  std::memcpy(&v, p, 8);
  return v;
}
BITREFIT_HD inline u32 read32(const u8* p) noexcept {
  u32 v;
  std::memcpy(&v, p, 4);
  return v;
}
BITREFIT_HD inline u32 swap32(u32 x) noexcept {
  return ((x << 24) & 0xff000000u) | ((x << 8) & 0x00ff0000u) | ((x >> 8) & 0x0000ff00u) | ((x >> 24) & 0xffu);
}
BITREFIT_HD inline u64 swap64(u64 x) noexcept {
  return (u64{swap32(static_cast<u32>(x))} << 32) | swap32(static_cast<u32>(x >> 32));
}
BITREFIT_HD inline u32 rotl32(u32 x, int r) noexcept { return (x << r) | (x >> (32 - r)); }
BITREFIT_HD inline u64 rotl64(u64 x, int r) noexcept { return (x << r) | (x >> (64 - r)); }
BITREFIT_HD inline u64 xorshift64(u64 v, int s) noexcept { return v ^ (v >> s); }

struct u128 {
  u64 low64, high64;
};

BITREFIT_HD inline u128 mult64to128(u64 a, u64 b) noexcept {
#if defined(__CUDA_ARCH__)
  return {a * b, __umul64hi(a, b)};
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return {static_cast<u64>(p), static_cast<u64>(p >> 64)};
#endif
}
BITREFIT_HD inline u64 mul128_fold64(u64 a, u64 b) noexcept {
  const u128 p = mult64to128(a, b);
  return p.low64 ^ p.high64;
}

BITREFIT_HD inline u64 xxh64_avalanche(u64 h) noexcept {
  h ^= h >> 33;
  h *= prime64_2;
  h ^= h >> 29;
  h *= prime64_3;
  h ^= h >> 32;
  return h;
}
BITREFIT_HD inline u64 avalanche(u64 h) noexcept {
  h = xorshift64(h, 37);
  h *= 0x165667919E3779F9ull;
  return xorshift64(h, 32);
}

BITREFIT_HD inline u128 len_1to3(const u8* in, std::size_t len, const u8* s) noexcept {
  const u8 c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
  const u32 combinedl = (u32{c1} << 16) | (u32{c2} << 24) | (u32{c3} << 0) | (static_cast<u32>(len) << 8);
  const u32 combinedh = rotl32(swap32(combinedl), 13);
  const u64 bitflipl = u64{read32(s) ^ read32(s + 4)};
  const u64 bitfliph = u64{read32(s + 8) ^ read32(s + 12)};
  return {xxh64_avalanche(u64{combinedl} ^ bitflipl), xxh64_avalanche(u64{combinedh} ^ bitfliph)};
}

BITREFIT_HD inline u128 len_4to8(const u8* in, std::size_t len, const u8* s) noexcept {
  const u32 input_lo = read32(in), input_hi = read32(in + len - 4);
  const u64 input64 = input_lo + (u64{input_hi} << 32);
  const u64 keyed = input64 ^ (read64(s + 16) ^ read64(s + 24));
  u128 m = mult64to128(keyed, prime64_1 + (static_cast<u64>(len) << 2));
  m.high64 += m.low64 << 1;
  m.low64 ^= m.high64 >> 3;
  m.low64 = xorshift64(m.low64, 35);
  m.low64 *= 0x9FB21C651E98DF25ull;
  m.low64 = xorshift64(m.low64, 28);
  m.high64 = avalanche(m.high64);
  return m;
}

BITREFIT_HD inline u128 len_9to16(const u8* in, std::size_t len, const u8* s) noexcept {
  const u64 bitflipl = read64(s + 32) ^ read64(s + 40);
  const u64 bitfliph = read64(s + 48) ^ read64(s + 56);
  const u64 input_lo = read64(in);
  u64 input_hi = read64(in + len - 8);
  u128 m = mult64to128(input_lo ^ input_hi ^ bitflipl, prime64_1);
  m.low64 += static_cast<u64>(len - 1) << 54;
  input_hi ^= bitfliph;
  m.high64 += input_hi + u64{static_cast<u32>(input_hi)} * (prime32_2 - 1);
  m.low64 ^= swap64(m.high64);
  u128 h = mult64to128(m.low64, prime64_2);
  h.high64 += m.high64 * prime64_2;
  return {avalanche(h.low64), avalanche(h.high64)};
}

BITREFIT_HD inline u64 mix16B(const u8* in, const u8* s) noexcept {
  return mul128_fold64(read64(in) ^ read64(s), read64(in + 8) ^ read64(s + 8));
}

BITREFIT_HD inline u128 mix32B(u128 acc, const u8* in1, const u8* in2, const u8* s) noexcept {
  acc.low64 += mix16B(in1, s);
  acc.low64 ^= read64(in2) + read64(in2 + 8);
  acc.high64 += mix16B(in2, s + 16);
  acc.high64 ^= read64(in1) + read64(in1 + 8);
  return acc;
}

BITREFIT_HD inline u128 finish_mid(u128 acc, std::size_t len) noexcept {
  u128 h;
  h.low64 = acc.low64 + acc.high64;
  h.high64 = acc.low64 * prime64_1 + acc.high64 * prime64_4 + static_cast<u64>(len) * prime64_2;
  h.low64 = avalanche(h.low64);
  h.high64 = u64{0} - avalanche(h.high64);
  return h;
}

BITREFIT_HD inline u128 len_17to128(const u8* in, std::size_t len, const u8* s) noexcept {
  u128 acc{static_cast<u64>(len) * prime64_1, 0};
  if (len > 32) {
    if (len > 64) {
      if (len > 96) acc = mix32B(acc, in + 48, in + len - 64, s + 96);
      acc = mix32B(acc, in + 32, in + len - 48, s + 64);
    }
    acc = mix32B(acc, in + 16, in + len - 32, s + 32);
  }
  acc = mix32B(acc, in, in + len - 16, s);
  return finish_mid(acc, len);
}

BITREFIT_HD inline u128 len_129to240(const u8* in, std::size_t len, const u8* s) noexcept {
  constexpr std::size_t midsize_startoffset = 3, midsize_lastoffset = 17, secret_size_min = 136;
  const int rounds = static_cast<int>(len / 32);
  u128 acc{static_cast<u64>(len) * prime64_1, 0};
  for (int i = 0; i < 4; ++i) acc = mix32B(acc, in + 32 * i, in + 32 * i + 16, s + 32 * i);
  acc.low64 = avalanche(acc.low64);
  acc.high64 = avalanche(acc.high64);
  for (int i = 4; i < rounds; ++i)
    acc = mix32B(acc, in + 32 * i, in + 32 * i + 16, s + midsize_startoffset + 32 * (i - 4));
  acc = mix32B(acc, in + len - 16, in + len - 32, s + secret_size_min - midsize_lastoffset - 16);
  return finish_mid(acc, len);
}

BITREFIT_HD inline u64 merge_accs(const u64* acc, const u8* s, u64 start) noexcept {
  u64 r = start;
  for (int i = 0; i < 4; ++i) r += mul128_fold64(acc[2 * i] ^ read64(s + 16 * i), acc[2 * i + 1] ^ read64(s + 16 * i + 8));
  return avalanche(r);
}

// The accumulators' initial values (XXH3_INIT_ACC), as a function: a namespace-scope array would
// live in host memory only, out of a kernel's reach.
BITREFIT_HD constexpr u64 acc_init(int lane) noexcept {
  switch (lane) {
    case 0: return prime32_3;
    case 1: return prime64_1;
    case 2: return prime64_2;
    case 3: return prime64_3;
    case 4: return prime64_4;
    case 5: return prime32_2;
    case 6: return prime64_5;
    default: return prime32_1;
  }
}

/// The 128-bit result of a long input (len > 240) from its eight accumulators after every stripe.
BITREFIT_HD inline u128 hash_long_merge(const u64* acc, std::size_t len, const u8* s) noexcept {
  constexpr std::size_t mergeaccs_start = 11;
  return {merge_accs(acc, s + mergeaccs_start, static_cast<u64>(len) * prime64_1),
          merge_accs(acc, s + secret_size - 64 - mergeaccs_start, ~(static_cast<u64>(len) * prime64_2))};
}

/// One stripe of 64 bytes into accumulator `lane`: its data word i^1 and the keyed product of
/// its data word i (XXH3_accumulate_512, one lane of it).
BITREFIT_HD inline u64 lane_accumulate(u64 acc, const u8* stripe, const u8* s, int lane) noexcept {
  const u64 data_key = read64(stripe + 8 * lane) ^ read64(s + 8 * lane);
  return acc + read64(stripe + 8 * (lane ^ 1)) + (data_key & 0xFFFFFFFFu) * (data_key >> 32);
}

// Inputs longer than 240 bytes, one accumulator ("lane") at a time. Why: XXH3's stripe step adds
// data word i^1 and the keyed product of data word i into accumulator i, and its scramble works
// lane by lane, so the eight accumulators never meet before hash_long_merge. A GPU can then give
// each 64 KiB leaf eight threads instead of one: the eight read one stripe's 64 contiguous bytes
// together (coalesced), and eight times as many threads are in flight. hash_long runs the eight
// lanes one after the other, so the stripe walk has this one home. Law:
// hash_long_merge({hash_long_lane(in, len, s, i) for i in 0..7}, len, s) == XXH3_128bits(in, len)
// for every len > 240 (tested against libxxhash).
BITREFIT_HD inline u64 hash_long_lane(const u8* in, std::size_t len, const u8* s, int lane) noexcept {
  u64 acc = acc_init(lane);
  const std::size_t blocks = (len - 1) / block_len;
  for (std::size_t b = 0; b < blocks; ++b) {
    const u8* block = in + b * block_len;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::size_t n = 0; n < stripes_per_block; ++n)
      acc = lane_accumulate(acc, block + n * stripe_len, s + n * secret_consume_rate, lane);
    acc = (xorshift64(acc, 47) ^ read64(s + secret_size - stripe_len + 8 * lane)) * prime32_1;  // scramble
  }
  const std::size_t stripes = ((len - 1) - block_len * blocks) / stripe_len;
  const u8* tail = in + blocks * block_len;
  for (std::size_t n = 0; n < stripes; ++n) acc = lane_accumulate(acc, tail + n * stripe_len, s + n * secret_consume_rate, lane);
  constexpr std::size_t lastacc_start = 7;
  return lane_accumulate(acc, in + len - stripe_len, s + secret_size - stripe_len - lastacc_start, lane);
}

/// The 128-bit XXH3 of a long input (len > 240).
BITREFIT_HD inline u128 hash_long(const u8* in, std::size_t len, const u8* s) noexcept {
  u64 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = hash_long_lane(in, len, s, i);
  return hash_long_merge(acc, len, s);
}

/// Inputs longer than this take hash_long (and so can be hashed lane by lane).
inline constexpr std::size_t long_input = 240;

}  // namespace xxh3_hd_detail

/// XXH3-128 with seed 0 of the `len` bytes at `data`, on host or device; equals XXH3_128bits.
/// @pre data points to `len` readable bytes (any alignment); data may be null when len == 0.
BITREFIT_HD inline digest128 xxh3_128_hd(const void* data, std::size_t len) noexcept {
  using namespace xxh3_hd_detail;
  const u8* in = static_cast<const u8*>(data);
  const u8* s = secret();
  u128 h;
  if (len <= 16) {
    if (len > 8) h = len_9to16(in, len, s);
    else if (len >= 4) h = len_4to8(in, len, s);
    else if (len > 0) h = len_1to3(in, len, s);
    else h = {xxh64_avalanche(read64(s + 64) ^ read64(s + 72)), xxh64_avalanche(read64(s + 80) ^ read64(s + 88))};
  } else if (len <= 128) {
    h = len_17to128(in, len, s);
  } else if (len <= long_input) {
    h = len_129to240(in, len, s);
  } else {
    h = hash_long(in, len, s);
  }
  return digest128{h.low64, h.high64};
}

}  // namespace bitrefit::codec
