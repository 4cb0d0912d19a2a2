// bitrefit/codec/types.hpp — the small vocabulary of the codec: modes, codings, options.
//
// Every enum here is written into payload frames as one byte, so its numeric values are part of
// the frame format (version 2) and must never be renumbered; add new values at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "bitrefit/core/value_mode.hpp"

namespace bitrefit::codec {

/// How the values of one frame item are applied (one byte in the frame): core/value_mode.hpp
/// (xor_mask, overwrite, base_conditioned; needs_exact_base).
using bitrefit::value_mode;
using bitrefit::value_mode_count;
using bitrefit::needs_exact_base;

/// What an attempt allows the encoder to do (bound at prepare): `xor_allowed` lets the encoder
/// choose per item among XOR, overwrite and (where encode_options::base_conditioned allows it and
/// the dtype is a float format) base-conditioned, whichever is estimated smallest;
/// `overwrite_only` forbids everything but overwrite (the retry path); `xor_only` forces XOR
/// (benches); `conditioned_only` forces base-conditioned for every float item (benches, tests;
/// other dtypes fall back to XOR).
enum class mode_policy : std::uint8_t { xor_allowed = 0, overwrite_only = 1, xor_only = 2, conditioned_only = 3 };

/// Location coding of the changed positions of one item (positions are relative to the item's
/// range begin and strictly ascending).
enum class location_coding : std::uint8_t {
  all = 0,     // every element of the range: no location section (dense items)
  runs = 1,    // LEB128 pairs (gap since the end of the previous run, run length - 1)
  gaps8 = 2,   // gap = pos - prev - 1 (prev = -1 at start) as u8; 0xFF escapes: add 255 and continue
  gaps16 = 3,  // same with u16 little-endian, escape 0xFFFF
  gaps32 = 4,  // same with u32 little-endian, escape 0xFFFFFFFF
  bitmap = 5,  // ceil(m/8) bytes, bit i (LSB first) set iff position i changed; padding bits zero
  class_gaps = 6,  // base_conditioned items only: per-class rANS-coded gaps in class rank order
};
inline constexpr std::uint8_t location_coding_count = 7;

/// Value coding: values (XOR masks or absolute new bits, `element_size` bytes each, little-endian
/// as stored) either interleaved or split into byte planes (plane k = byte k of every value);
/// ulp_distance (base_conditioned items only): rANS-coded signed ULP distances from the base value.
enum class value_coding : std::uint8_t { interleaved = 0, byte_planes = 1, ulp_distance = 2 };
inline constexpr std::uint8_t value_coding_count = 3;

/// How one section is stored in the frame.
enum class section_compression : std::uint8_t { raw = 0, zstd = 1 };
inline constexpr std::uint8_t section_compression_count = 2;

/// Frame kind: a delta against a base version, or a dense frame (every element, overwrite) that
/// restores a receiver without a usable base.
enum class frame_kind : std::uint8_t { delta = 0, dense = 1 };

using bitrefit::to_string;
constexpr std::string_view to_string(location_coding c) noexcept {
  switch (c) {
    case location_coding::all: return "all";
    case location_coding::runs: return "runs";
    case location_coding::gaps8: return "gaps8";
    case location_coding::gaps16: return "gaps16";
    case location_coding::gaps32: return "gaps32";
    case location_coding::bitmap: return "bitmap";
    case location_coding::class_gaps: return "class_gaps";
  }
  return "?";
}
constexpr std::string_view to_string(value_coding c) noexcept {
  switch (c) {
    case value_coding::interleaved: return "interleaved";
    case value_coding::byte_planes: return "byte_planes";
    case value_coding::ulp_distance: return "ulp_distance";
  }
  return "?";
}
constexpr std::string_view to_string(frame_kind k) noexcept { return k == frame_kind::delta ? "delta" : "dense"; }

/// The format's bound of canonical input bytes one frame covers (the sum over its items of range
/// elements x element size). Encoders refuse larger chunks; decoders refuse a frame declaring more
/// before allocating anything (errc::format, field "range"). Every size a decoder allocates is
/// derived from the declared ranges, so a receiver's scratch is bounded by this constant, never by
/// the model or by what a hostile frame claims (see frame_decoder in apply.hpp).
inline constexpr std::uint64_t frame_input_bytes_limit = 64ull << 20;
/// Default bound of canonical input bytes (old range bytes) that one frame covers: the format's limit.
inline constexpr std::uint64_t default_max_frame_input_bytes = frame_input_bytes_limit;
inline constexpr int default_zstd_level = 3;

struct encode_options {
  mode_policy policy = mode_policy::xor_allowed;
  int zstd_level = default_zstd_level;
  /// Canonical input bytes per frame (chunk). Must be in [8, frame_input_bytes_limit].
  std::uint64_t max_frame_input_bytes = default_max_frame_input_bytes;
  /// Under xor_allowed: may the encoder choose base-conditioned coding for float items? Needs
  /// every receiver of the item to hold its whole range (it reads the base bits of the range).
  bool base_conditioned = true;
  /// Most base classes (exponent buckets) the encoder uses per item, 1..16 (base_classes.hpp).
  unsigned max_base_classes = 4;
};

}  // namespace bitrefit::codec
