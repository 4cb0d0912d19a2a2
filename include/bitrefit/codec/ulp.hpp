// bitrefit/codec/ulp.hpp — floating-point bit patterns as sign-magnitude integers: magnitude
// classes of a base value and the signed ULP distance between two patterns.
//
// Why: when a BF16 weight trained with FP32 master weights changes, it usually moves by exactly one
// unit in the last place (89 % of changes on a real PyTorch AdamW run), and how likely it is to
// change at all depends on its exponent (an update of fixed size crosses a rounding boundary more
// often where the spacing of representable values is small). Both are properties of the bit
// pattern read as a sign-magnitude integer: the magnitude field (all bits but the sign) is
// monotonic in |value| and its top bits are the exponent, and stepping the magnitude by one steps
// the value by one ULP. So everything here is integer arithmetic on bit patterns; no value is
// ever converted to a floating-point number (which would also lose NaN payloads and -0.0).
//
// Distance: for old pattern o and new pattern n of the same sign with finite values,
//   d = (mag(n) - mag(o)) for a positive sign, (mag(o) - mag(n)) for a negative one,
// i.e. the difference of the patterns as signed integers in sign-magnitude order (key(x) = +-mag).
// d == 0 iff o == n. Everything else — a sign change (including +0.0 <-> -0.0), a NaN or infinity
// on either side — is an escape that carries the new pattern verbatim.
#pragma once

#include <cstdint>
#include <optional>

#include "bitrefit/core/dtype.hpp"

namespace bitrefit::codec {

/// The layout of a floating-point dtype's bits (element size E bytes, little-endian).
struct float_format {
  unsigned element_size = 0;
  unsigned mantissa_bits = 0;  // the exponent starts here
  unsigned exponent_bits = 0;
  std::uint64_t sign_bit = 0;       // 1 << (8E - 1)
  std::uint64_t magnitude_mask = 0;  // sign_bit - 1
  std::uint64_t special = 0;         // first magnitude that is not a finite value (inf/NaN)

  constexpr std::uint64_t magnitude(std::uint64_t bits) const noexcept { return bits & magnitude_mask; }
  constexpr bool negative(std::uint64_t bits) const noexcept { return (bits & sign_bit) != 0; }
  constexpr bool finite(std::uint64_t bits) const noexcept { return magnitude(bits) < special; }
  constexpr std::uint64_t exponent(std::uint64_t bits) const noexcept { return magnitude(bits) >> mantissa_bits; }
  /// Number of distinct exponent field values.
  constexpr std::uint64_t exponents() const noexcept { return std::uint64_t{1} << exponent_bits; }
};

/// The format of a floating-point dtype; nullopt for integers and BOOL (they are never
/// base-conditioned: the codec falls back to XOR or overwrite for them).
constexpr std::optional<float_format> float_format_of(dtype t) noexcept {
  auto ieee = [](unsigned E, unsigned man, unsigned exp) {
    float_format f;
    f.element_size = E;
    f.mantissa_bits = man;
    f.exponent_bits = exp;
    f.sign_bit = std::uint64_t{1} << (8 * E - 1);
    f.magnitude_mask = f.sign_bit - 1;
    f.special = ((std::uint64_t{1} << exp) - 1) << man;  // exponent all ones: inf and NaN
    return f;
  };
  switch (t) {
    case dtype::F16: return ieee(2, 10, 5);
    case dtype::BF16: return ieee(2, 7, 8);
    case dtype::F32: return ieee(4, 23, 8);
    case dtype::F64: return ieee(8, 52, 11);
    case dtype::F8_E5M2: return ieee(1, 2, 5);
    case dtype::F8_E4M3: {
      // float8_e4m3fn: no infinities; exponent 15 holds finite values, only S.1111.111 is NaN.
      float_format f = ieee(1, 3, 4);
      f.special = 0x7F;
      return f;
    }
    default: return std::nullopt;
  }
}

/// Signed ULP distance from `o` to `n` (see the header comment), or nullopt for an escape
/// (sign change, non-finite on either side). @pre o != n, both masked to the element width.
constexpr std::optional<std::int64_t> ulp_distance(const float_format& f, std::uint64_t o, std::uint64_t n) noexcept {
  if (((o ^ n) & f.sign_bit) || !f.finite(o) || !f.finite(n)) return std::nullopt;
  const auto mo = static_cast<std::int64_t>(f.magnitude(o)), mn = static_cast<std::int64_t>(f.magnitude(n));
  return f.negative(o) ? mo - mn : mn - mo;
}

/// The pattern at signed ULP distance `d` from `o`, or nullopt when d == 0 or the step leaves o's
/// sign or the finite range (what a decoder must refuse). @pre o finite, d != INT64_MIN.
constexpr std::optional<std::uint64_t> ulp_step(const float_format& f, std::uint64_t o, std::int64_t d) noexcept {
  if (d == 0 || d == INT64_MIN) return std::nullopt;
  const std::uint64_t mo = f.magnitude(o);
  const std::uint64_t steps = d < 0 ? static_cast<std::uint64_t>(-d) : static_cast<std::uint64_t>(d);
  const bool grow = (d > 0) != f.negative(o);  // away from zero
  if (grow ? steps >= f.special - mo : steps > mo) return std::nullopt;
  return (o & f.sign_bit) | (grow ? mo + steps : mo - steps);
}

}  // namespace bitrefit::codec
