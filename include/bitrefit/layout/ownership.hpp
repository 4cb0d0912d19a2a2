// bitrefit/layout/ownership.hpp — one stable owner per replicated canonical tensor.
//
// Replicas (data-parallel copies, TP-replicated norms and routers, expert-data-parallel copies,
// the two halves of a tied embedding) must not all send the same elements. The owner is chosen by
// a stable hash of the canonical name within the replica group: the same on every rank, every
// process, every attempt and every build (FNV-1a 64 with a murmur finaliser; no std::hash, whose
// values may differ between standard libraries).
#pragma once

#include <cstdint>
#include <string_view>

namespace bitrefit::layout {

/// FNV-1a 64 of the bytes of `s`, finalised so that nearby names spread over small groups.
constexpr std::uint64_t stable_hash(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/// The member of a replica group of `group_size` that owns canonical tensor `name`.
/// @pre group_size > 0. @post result < group_size, and depends only on (name, group_size).
constexpr std::uint32_t stable_owner(std::string_view name, std::uint32_t group_size) noexcept {
  return static_cast<std::uint32_t>(stable_hash(name) % group_size);
}

static_assert(stable_hash("") == stable_hash(""));
static_assert(stable_owner("model.norm.weight", 1) == 0);

}  // namespace bitrefit::layout
