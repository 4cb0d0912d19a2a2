// Structure-aware fix-ups shared by the fuzz targets and the hostile-input tests: they recompute
// what a checksum or a declared size would otherwise refuse first, so mutated bytes reach the
// decoders behind those checks (a fuzzer alone almost never forges an XXH3 digest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "bitrefit/codec/bundle.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/codec/hash.hpp"

namespace bitrefit::fuzz {

inline void put_u64_le(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint64_t get_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

/// Builds little-endian records by hand (hostile files in tests).
struct byte_writer {
  std::vector<std::byte> out;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
  void u64(std::uint64_t v) {
    out.resize(out.size() + 8);
    put_u64_le(out.data() + out.size() - 8, v);
  }
  void leb128(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    out.push_back(static_cast<std::byte>(v));
  }
};

/// A payload frame whose format version is this build's and whose header frame_size and trailing
/// XXH3-128 digest match its bytes (the magic as it is), so inputs kept from an older frame format
/// still reach the descriptor checks. Frames shorter than header + digest are returned unchanged.
inline std::vector<std::byte> reseal_frame(std::span<const std::byte> in) {
  std::vector<std::byte> f(in.begin(), in.end());
  if (f.size() < codec::frame_header_size + codec::frame_digest_size) return f;
  f[4] = static_cast<std::byte>(codec::frame_format_version & 0xFF);
  f[5] = static_cast<std::byte>(codec::frame_format_version >> 8);
  put_u64_le(f.data() + 56, f.size());
  codec::store_digest_le(codec::xxh3_128({f.data(), f.size() - codec::frame_digest_size}), f.data() + f.size() - codec::frame_digest_size);
  return f;
}

/// A delta bundle file whose manifest digest matches its manifest bytes (the manifest length as
/// declared, when it fits in the file).
inline std::vector<std::byte> reseal_bundle(std::span<const std::byte> in) {
  std::vector<std::byte> b(in.begin(), in.end());
  if (b.size() < codec::bundle_file_header_size) return b;
  const std::uint64_t jlen = get_u64_le(b.data() + 12);
  if (jlen > b.size() - codec::bundle_file_header_size) return b;
  codec::store_digest_le(codec::xxh3_128({b.data() + codec::bundle_file_header_size, jlen}), b.data() + 20);
  return b;
}

/// A baseline store file (durability/filesystem.hpp): `body` followed by its XXH3-64 trailer
/// (xxhash comes inlined with codec/hash.hpp).
inline std::vector<std::byte> seal_baseline_file(std::vector<std::byte> body) {
  const std::uint64_t d = XXH3_64bits(body.data(), body.size());
  body.resize(body.size() + 8);
  put_u64_le(body.data() + body.size() - 8, d);
  return body;
}

/// A delta record body made to load as delta-v2.bin over full-v1.bin whose stored digest is `link`:
/// magic, target 2, base 1 and the link written over its first 32 bytes (padded when shorter),
/// then sealed. What follows the header — the records — is the input's own.
inline std::vector<std::byte> seal_delta_v2(std::vector<std::byte> body, std::uint64_t link) {
  if (body.size() < 32) body.resize(32);
  std::memcpy(body.data(), "BRDELT01", 8);
  put_u64_le(body.data() + 8, 2);
  put_u64_le(body.data() + 16, 1);
  put_u64_le(body.data() + 24, link);
  return seal_baseline_file(std::move(body));
}

}  // namespace bitrefit::fuzz
