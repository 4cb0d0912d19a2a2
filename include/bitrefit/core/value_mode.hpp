// bitrefit/core/value_mode.hpp — how a payload's values are applied: the one XOR/overwrite type.
//
// The codec writes it into every frame item (one byte: its numeric values are part of the frame
// format and never renumbered; new values go at the end), the layout's loaders write with it, and
// the protocol names the mode of an attempt and of each payload with it.
//   xor_mask          target[i] ^= value  only on a receiver that holds exactly the base version in
//                                         every position it touches, placed bit-preservingly, and
//                                         only once
//   overwrite         target[i]  = value  absolute new bits: idempotent, correct whatever the
//                                         receiver holds
//   base_conditioned  positions coded per class of the base value and values as signed ULP
//                     distances from it (codec/conditioned.hpp). Like XOR it is only correct on a
//                     receiver exactly at the base version, placed bit-preservingly; the decoder
//                     reads the base bits of the item's range and yields absolute new values
//                     (written as overwrite). A codec item mode only.
// The protocol uses two of them: an attempt is xor_mask (exact-base payloads allowed) or
// overwrite, and a payload is xor_mask when any of its items needs the exact base
// (needs_exact_base), else overwrite. The machines never see base_conditioned.
#pragma once

#include <cstdint>
#include <string_view>

namespace bitrefit {

enum class value_mode : std::uint8_t { xor_mask = 0, overwrite = 1, base_conditioned = 2 };
inline constexpr std::uint8_t value_mode_count = 3;

/// True for the modes whose items are only correct on the exact base version (never applied twice,
/// never on another base): the protocol's xor_mask payloads.
constexpr bool needs_exact_base(value_mode m) noexcept { return m != value_mode::overwrite; }

constexpr std::string_view to_string(value_mode m) noexcept {
  switch (m) {
    case value_mode::xor_mask: return "xor";
    case value_mode::overwrite: return "overwrite";
    case value_mode::base_conditioned: return "base_conditioned";
  }
  return "?";
}

}  // namespace bitrefit
