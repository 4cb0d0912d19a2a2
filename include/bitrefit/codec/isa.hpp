// bitrefit/codec/isa.hpp — runtime dispatch of the codec's hot loops to code compiled for the CPU.
//
// bitrefit is header-only and compiled with its user's flags, usually the x86-64 baseline, where
// std::popcount is a libgcc call (measured: 3-7 % of encode time as __popcountdi2) and
// count-trailing-zeros a slow bsf. The hot loops are therefore written once as always-inline
// templates and instantiated twice: in a function compiled for x86-64-v3 (AVX2, BMI1/2, POPCNT,
// LZCNT; `flatten` inlines the whole loop body so every popcount in it is one instruction) and in
// a plain one; `cpu_v3()` picks at run time. Outputs never depend on the choice.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BITREFIT_CODEC_X86 1
#define BITREFIT_TARGET_V3 __attribute__((target("avx2,bmi,bmi2,popcnt,lzcnt"), flatten))
#define BITREFIT_INLINE __attribute__((always_inline)) inline
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

}  // namespace bitrefit::codec
