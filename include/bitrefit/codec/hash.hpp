// bitrefit/codec/hash.hpp — XXH3-128 over bytes, one shot and streaming, as digest128 values.
//
// xxhash is used header-only (XXH_INLINE_ALL) so no library has to be linked and every include
// site gets the inlined, vectorised implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "bitrefit/core/digest.hpp"

namespace bitrefit::codec {

inline digest128 to_digest(XXH128_hash_t h) noexcept { return digest128{h.low64, h.high64}; }

/// XXH3-128 (seed 0) of `bytes`.
inline digest128 xxh3_128(std::span<const std::byte> bytes) noexcept {
  return to_digest(XXH3_128bits(bytes.data(), bytes.size()));
}

/// Writes `d` as 16 bytes: low64 little-endian, then high64 little-endian (the frame and the
/// attestation digest use this order).
inline void store_digest_le(const digest128& d, std::byte* out) noexcept {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(d.low64 >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<std::byte>(d.high64 >> (8 * i));
}
inline digest128 load_digest_le(const std::byte* in) noexcept {
  digest128 d;
  for (int i = 7; i >= 0; --i) d.low64 = (d.low64 << 8) | static_cast<std::uint8_t>(in[i]);
  for (int i = 7; i >= 0; --i) d.high64 = (d.high64 << 8) | static_cast<std::uint8_t>(in[8 + i]);
  return d;
}

/// Streaming XXH3-128; the result equals xxh3_128 of the concatenation of all updates.
class xxh3_128_stream {
 public:
  xxh3_128_stream() noexcept { XXH3_128bits_reset(&state_); }
  void update(std::span<const std::byte> b) noexcept { XXH3_128bits_update(&state_, b.data(), b.size()); }
  void update_u64(std::uint64_t v) noexcept {
    std::byte b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<std::byte>(v >> (8 * i));
    update(b);
  }
  void update_u8(std::uint8_t v) noexcept {
    std::byte b{v};
    update({&b, 1});
  }
  /// u64 little-endian length followed by the bytes (unambiguous concatenation).
  void update_string(std::string_view s) noexcept {
    update_u64(s.size());
    update(std::as_bytes(std::span(s.data(), s.size())));
  }
  void update_digest(const digest128& d) noexcept {
    std::byte b[16];
    store_digest_le(d, b);
    update(b);
  }
  digest128 digest() const noexcept { return to_digest(XXH3_128bits_digest(&state_)); }

 private:
  XXH3_state_t state_;
};

}  // namespace bitrefit::codec
