// bitrefit/core/ids.hpp — identities shared by the protocol, the codec and the transports.
//
// version v: the policy version a commit record names. attempt id τ = (epoch, counter): unique
// across coordinator restarts because every new coordinator bumps the epoch. payload id
// (τ, owner, seq): seq is the chunk index, so re-encoding a chunk yields the same id and bytes.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "bitrefit/core/fields.hpp"

namespace bitrefit {

using version_t = std::uint64_t;

/// Baseline id g: fresh per attempt; the commit record K = (v, g) names the shared baseline.
struct baseline_id {
  std::uint64_t value = 0;
  friend constexpr auto operator<=>(const baseline_id&, const baseline_id&) = default;
};

struct attempt_id {
  std::uint64_t epoch = 0;
  std::uint64_t counter = 0;
  friend constexpr auto operator<=>(const attempt_id&, const attempt_id&) = default;
  std::string to_string() const { return std::to_string(epoch) + "." + std::to_string(counter); }
};

struct payload_id {
  attempt_id attempt;
  std::uint32_t owner = 0;
  std::uint32_t seq = 0;  // chunk index within the owner's manifest for this attempt
  friend constexpr auto operator<=>(const payload_id&, const payload_id&) = default;
  std::string to_string() const {
    return attempt.to_string() + "/" + std::to_string(owner) + "/" + std::to_string(seq);
  }
};

BITREFIT_FIELDS(baseline_id, value)
BITREFIT_FIELDS(attempt_id, epoch, counter)
BITREFIT_FIELDS(payload_id, attempt, owner, seq)

}  // namespace bitrefit

template <>
struct std::hash<bitrefit::attempt_id> {
  std::size_t operator()(const bitrefit::attempt_id& a) const noexcept {
    return static_cast<std::size_t>(a.epoch * 0x9E3779B97F4A7C15ull ^ a.counter);
  }
};
template <>
struct std::hash<bitrefit::payload_id> {
  std::size_t operator()(const bitrefit::payload_id& p) const noexcept {
    std::size_t h = std::hash<bitrefit::attempt_id>{}(p.attempt);
    return h ^ ((static_cast<std::size_t>(p.owner) << 32 | p.seq) * 0xC2B2AE3D27D4EB4Full);
  }
};
