// bitrefit/core/dtype.hpp — the element types a safetensors checkpoint can carry.
//
// bitrefit never does arithmetic on weights: a dtype only tells how many bytes one element
// occupies and how it is spelled in a safetensors header. Comparison is always on stored bits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bitrefit {

enum class dtype : std::uint8_t {
  BOOL = 0,
  U8,
  I8,
  I16,
  U16,
  I32,
  U32,
  I64,
  U64,
  F16,
  BF16,
  F32,
  F64,
  F8_E4M3,  // float8_e4m3fn: no infinities, one NaN pattern per sign
  F8_E5M2,
};

inline constexpr std::size_t dtype_count = 15;

inline constexpr std::array<dtype, dtype_count> all_dtypes{
    dtype::BOOL, dtype::U8,  dtype::I8,  dtype::I16, dtype::U16,     dtype::I32,    dtype::U32, dtype::I64,
    dtype::U64,  dtype::F16, dtype::BF16, dtype::F32, dtype::F64, dtype::F8_E4M3, dtype::F8_E5M2};

/// Bytes per element. @post result is 1, 2, 4 or 8.
constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::BOOL:
    case dtype::U8:
    case dtype::I8:
    case dtype::F8_E4M3:
    case dtype::F8_E5M2: return 1;
    case dtype::I16:
    case dtype::U16:
    case dtype::F16:
    case dtype::BF16: return 2;
    case dtype::I32:
    case dtype::U32:
    case dtype::F32: return 4;
    case dtype::I64:
    case dtype::U64:
    case dtype::F64: return 8;
  }
  return 0;
}

/// The spelling used in safetensors headers ("BF16", "F8_E4M3", ...).
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::BOOL: return "BOOL";
    case dtype::U8: return "U8";
    case dtype::I8: return "I8";
    case dtype::I16: return "I16";
    case dtype::U16: return "U16";
    case dtype::I32: return "I32";
    case dtype::U32: return "U32";
    case dtype::I64: return "I64";
    case dtype::U64: return "U64";
    case dtype::F16: return "F16";
    case dtype::BF16: return "BF16";
    case dtype::F32: return "F32";
    case dtype::F64: return "F64";
    case dtype::F8_E4M3: return "F8_E4M3";
    case dtype::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

/// Parses a safetensors dtype spelling. Law: parse_dtype(dtype_name(t)) == t for every t.
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (dtype t : all_dtypes)
    if (dtype_name(t) == s) return t;
  return std::nullopt;
}

/// True for a value that fits the dtype's enum range (used when decoding untrusted bytes).
constexpr bool is_valid_dtype_code(std::uint8_t code) noexcept { return code < dtype_count; }

/// True for floating-point dtypes (for test generators that want -0.0, NaN payloads, ...).
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::F16 || t == dtype::BF16 || t == dtype::F32 || t == dtype::F64 || t == dtype::F8_E4M3 ||
         t == dtype::F8_E5M2;
}

}  // namespace bitrefit
