// bitrefit/refit/receiver_store.hpp — a receiver's bits: verify, stage and apply payload frames
// into the engine's own layout through a layout::Loader, and attest over what it holds.
//
// The protocol's receiver state machine decides WHAT happens to a payload (drop, ignore as a
// duplicate, fail on conflict, stage, apply, ack); this class does it, through the one frame
// applier (layout/frame_apply.hpp: verify-then-write, held ranges, XOR only where placement is
// bit-preserving) and the one held-range attestation (layout::loader_attestation_digest):
//   inspect(bytes)    a payload as it arrives: parsed (size, digest, every descriptor) and matched
//                     to the loader, nothing decompressed. A copy that fails is "undelivered" (the
//                     caller fetches again); it never reaches the state machine.
//   apply_parsed(f)   the staged, inspected frame decoded once and written (never a partial
//                     frame): each payload is parsed once and decoded once.
//   verify / apply    both steps on raw bytes (dense restores).
//   attest()          the attestation digest over the loader's held ranges.
// Scratch memory is one frame's decoded positions and values (bounded by the frame size).
#pragma once

#include <optional>
#include <utility>
#include <span>
#include <string_view>

#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/frame_apply.hpp"
#include "bitrefit/protocol/types.hpp"

namespace bitrefit::refit {

/// What verification learned about a frame: enough to tell the protocol about it.
struct verified_frame {
  codec::frame_header header;
  digest128 content;  // the frame's own XXH3-128 (identical bytes <=> identical digest)
  protocol::mode mode = protocol::mode::overwrite;  // xor_mask when any item needs the exact base (XOR, base-conditioned)
  std::uint64_t changed = 0;
};

template <layout::Loader L>
class receiver_store {
 public:
  explicit receiver_store(L& loader) : loader_(&loader) {}

  L& loader() noexcept { return *loader_; }
  const L& loader() const noexcept { return *loader_; }

  /// A payload as it arrives: parsed (size, digest, descriptors) and matched to the loader,
  /// nothing decompressed. The view refers to `bytes`; keep both (stage) until apply_parsed.
  std::pair<codec::frame_view, verified_frame> inspect(std::span<const std::byte> bytes, std::string_view source = {}) const {
    auto [f, c] = applier_.inspect(*loader_, bytes, source);
    return {std::move(f), to_verified(c)};
  }

  /// Full verification without writing (every section decoded).
  verified_frame verify(std::span<const std::byte> bytes, std::string_view source = {}) {
    return to_verified(applier_.verify(*loader_, bytes, source));
  }

  /// Decodes a frame inspect() accepted, then writes it (never a partial frame).
  void apply_parsed(const codec::frame_view& f, std::string_view source = {}) { applier_.apply_parsed(*loader_, f, source); }

  /// Verifies everything, then writes. @throws like verify; nothing written when it throws.
  /// Base-conditioned items decode against the loader's current bits (the frame's base version).
  verified_frame apply(std::span<const std::byte> bytes, std::string_view source = {}) {
    auto [f, v] = inspect(bytes, source);
    apply_parsed(f, source);
    return v;
  }

  /// Attestation digest over every held range, in canonical order.
  digest128 attest() const { return layout::loader_attestation_digest(*loader_); }

  std::size_t scratch_bytes() const noexcept { return applier_.scratch_bytes(); }
  /// Frames decoded so far (a payload: once, when it is applied).
  std::uint64_t decodes() const noexcept { return applier_.decodes(); }

 private:
  static verified_frame to_verified(const layout::frame_check& c) {
    return {c.header, c.content, c.any_xor ? protocol::mode::xor_mask : protocol::mode::overwrite, c.changed};
  }

  L* loader_;
  layout::loader_frame_applier applier_;
};

}  // namespace bitrefit::refit
