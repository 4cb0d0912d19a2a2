// bitrefit/core/value_mode.hpp — how a payload's values are applied: the one XOR/overwrite type.
//
// The codec writes it into every frame item (one byte: its numeric values are part of the frame
// format and never renumbered), the layout's loaders write with it, and the protocol names the
// mode of an attempt and of each payload with it.
//   xor_mask   target[i] ^= value  only on a receiver that holds exactly the base version in every
//                                  position it touches, placed bit-preservingly, and only once
//   overwrite  target[i]  = value  absolute new bits: idempotent, correct whatever the receiver holds
#pragma once

#include <cstdint>
#include <string_view>

namespace bitrefit {

enum class value_mode : std::uint8_t { xor_mask = 0, overwrite = 1 };

constexpr std::string_view to_string(value_mode m) noexcept { return m == value_mode::xor_mask ? "xor" : "overwrite"; }

}  // namespace bitrefit
