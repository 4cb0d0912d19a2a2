// bitrefit/codec/isa.hpp — runtime dispatch of the codec's hot loops to code compiled for the CPU.
//
// bitrefit is header-only and compiled with its user's flags, usually the x86-64 baseline, where
// std::popcount is a libgcc call (measured: 3-7 % of encode time as __popcountdi2) and
// count-trailing-zeros a slow bsf. The hot loops are therefore written once as always-inline
// templates and instantiated twice: in a function compiled for x86-64-v3 (AVX2, BMI1/2, POPCNT,
// LZCNT; `flatten` inlines the whole loop body so every popcount in it is one instruction) and in
// a plain one; `cpu_v3()` picks at run time. Outputs never depend on the choice.
#pragma once

#include <array>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BITREFIT_CODEC_X86 1
#define BITREFIT_TARGET_V3 __attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt"), flatten))
#define BITREFIT_INLINE __attribute__((always_inline)) inline
// The AVX2 kernels' helpers (x86-64-v3 CPUs without AVX-512): inlined into their callers, which
// carry the same target (GCC 12 refuses to inline a helper whose target the caller lacks).
#define BITREFIT_V3_INLINE __attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt"), always_inline)) inline
#include <immintrin.h>
#else
#define BITREFIT_TARGET_V3
#define BITREFIT_INLINE inline
#endif

namespace bitrefit::codec {

/// True when the CPU runs x86-64-v3 code (AVX2, BMI1/2, POPCNT, LZCNT).
inline bool cpu_v3() noexcept {
#ifdef BITREFIT_CODEC_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                          __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  return has;
#else
  return false;
#endif
}

/// True when the CPU has AVX-512F and AVX-512BW.
inline bool cpu_avx512bw() noexcept {
#ifdef BITREFIT_CODEC_X86
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
#else
  return false;
#endif
}

/// True when the CPU has AVX-512F, BW, VL and CD (the lane-wise lzcnt).
inline bool cpu_avx512_lzcnt() noexcept {
#ifdef BITREFIT_CODEC_X86
  static const bool has = cpu_avx512bw() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
  return has;
#else
  return false;
#endif
}

/// True when the CPU has AVX-512F, BW, VL, DQ and VPOPCNTDQ (the lane-wise popcount).
inline bool cpu_avx512_vpopcnt() noexcept {
#ifdef BITREFIT_CODEC_X86
  static const bool has = cpu_avx512bw() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vpopcntdq");
  return has;
#else
  return false;
#endif
}

/// True when the CPU has what conditioned_detail::block_changes_avx512 uses: AVX-512F, BW, VL, CD
/// (conflict detection), VPOPCNTDQ and VBMI2 (byte compress).
inline bool cpu_avx512_block_changes() noexcept {
#ifdef BITREFIT_CODEC_X86
  static const bool has = cpu_avx512_lzcnt() && cpu_avx512_vpopcnt() && __builtin_cpu_supports("avx512vbmi2");
  return has;
#else
  return false;
#endif
}

#ifdef BITREFIT_CODEC_X86
/// AVX2's stand-ins for AVX-512's compress, one table per lane width, indexed by an 8-bit mask of
/// lanes: for eight 16-bit lanes the byte shuffle (_mm_shuffle_epi8) that packs the selected
/// lanes to the front in ascending order (0x80 after them: zeroed); for eight 32-bit lanes the
/// lane numbers for _mm256_permutevar8x32_epi32, one per byte (0 after them).
struct compress16x8_table {
  alignas(16) std::array<std::array<std::uint8_t, 16>, 256> at{};
  constexpr compress16x8_table() {
    for (unsigned m = 0; m < 256; ++m) {
      unsigned k = 0;
      for (unsigned j = 0; j < 8; ++j)
        if (m >> j & 1) at[m][k++] = static_cast<std::uint8_t>(2 * j), at[m][k++] = static_cast<std::uint8_t>(2 * j + 1);
      for (; k < 16; ++k) at[m][k] = 0x80;
    }
  }
};
inline constexpr compress16x8_table compress16x8{};
struct compress32x8_table {
  std::array<std::uint64_t, 256> at{};
  constexpr compress32x8_table() {
    for (unsigned m = 0; m < 256; ++m) {
      unsigned k = 0;
      for (unsigned j = 0; j < 8; ++j)
        if (m >> j & 1) at[m] |= std::uint64_t{j} << (8 * k++);
    }
  }
};
inline constexpr compress32x8_table compress32x8{};

/// 64 bytes from `p` (any alignment) as one AVX-512 register, read as two 32-byte halves. Why:
/// the AVX-512 loops that stream whole tensors from memory (change detection, base classes) ran
/// 15-30 % slower with 64-byte loads than with 32-byte ones on a Zen 5 VM, the work otherwise the
/// same (a scan of two 256 MiB buffers: 1.11-1.27x a memcmp with 64-byte loads, 0.93-0.95x with
/// the halves joined; one buffer: 1.29-1.30x against 1.08-1.13x of half a memcmp; glibc's memcmp
/// reads 32 bytes at a time). Zen 4 splits a 64-byte load in two anyway, and the join is one
/// shuffle. Loops over small arrays already in cache keep plain 64-byte loads.
__attribute__((target("avx512f"), always_inline)) inline __m512i stream_load512(const void* p) noexcept {
  const auto* q = static_cast<const unsigned char*>(p);
  const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  // the masked form with every lane selected: GCC 12's plain _mm512_inserti64x4 (and
  // _mm512_zextsi256_si512, built on it) passes an undefined vector that it then reports as
  // maybe-uninitialized
  return _mm512_mask_inserti64x4(lo, 0xFF, lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32)), 1);
}
/// Sixteen 2- or 4-byte words at `p` (any alignment), zero-extended to 32-bit lanes (the zero-masked
/// conversion with every lane selected, for the same GCC 12 reason as above).
template <class W>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i load16_words(const void* p) noexcept {
  static_assert(sizeof(W) == 2 || sizeof(W) == 4);
  if constexpr (sizeof(W) == 2) return _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(static_cast<const __m256i*>(p)));
  else return _mm512_loadu_si512(p);
}
#endif
}  // namespace bitrefit::codec
