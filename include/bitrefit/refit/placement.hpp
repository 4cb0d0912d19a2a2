// bitrefit/refit/placement.hpp — what a receiver's Loader declares, as the sender needs it.
//
// A layout::Loader says per canonical tensor which ranges it holds and whether its placement is
// bit-preserving (layout/concepts.hpp, law 3: stable for the life of the loader). The sender needs
// both BEFORE a transition starts, because the protocol binds them at prepare:
//   - per-tensor modes: XOR is allowed for tensor t only when every receiver that holds any element
//     of t places it bit-preservingly (DESIGN, prepare: "XOR only for tensors every member places
//     bit-preservingly"); every other tensor is sent as OVERWRITE, in every attempt;
//   - expected attestation digests: receiver r attests over its held ranges only (DESIGN,
//     attestation), so the owners compute r's digest over the same ranges of the target bits.
// Design: a receiver slot's placement is part of the deployment, like its index: the trainer is
// configured with `declare(loader)` of each slot's engine layout (sender_options::placements;
// empty = every receiver holds every tensor bit-preservingly). Each receiver announces the digest
// of its own declaration when it (re)starts (engine/placement mailbox) and the sender refuses to
// run a transition while an announcement differs from its configuration, with an error naming the
// receiver — a misconfigured slot never causes a wrong commit (XOR to a non-bit-preserving
// placement is refused by the receiver's verification, a wrong held set fails attestation), and
// the check turns the endless retries it would cause into a clear error.
#pragma once

#include <algorithm>
#include <type_traits>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/runs.hpp"

namespace bitrefit::refit {

/// One receiver's declaration. A tensor absent from `tensors` is held whole and bit-preservingly
/// (so the default-constructed placement is a full, bit-preserving holder).
struct placement {
  struct tensor_placement {
    std::vector<layout::index_range> held;  // sorted, disjoint, non-empty ranges
    bool bit_preserving = true;
    friend bool operator==(const tensor_placement&, const tensor_placement&) = default;
  };
  std::map<std::string, tensor_placement, std::less<>> tensors;

  /// Held ranges of `t` (whole tensor when not listed; nothing for an empty tensor).
  std::vector<layout::index_range> held(const tensor_info& t) const {
    if (auto it = tensors.find(t.name); it != tensors.end()) return it->second.held;
    if (t.elements() == 0) return {};
    return {layout::index_range{0, t.elements()}};
  }
  bool holds_any(const tensor_info& t) const { return !held(t).empty(); }
  bool bit_preserving(std::string_view t) const {
    auto it = tensors.find(t);
    return it == tensors.end() || it->second.bit_preserving;
  }
  bool full() const { return tensors.empty(); }

  /// A stable digest of the declaration (what a receiver announces).
  digest128 digest() const {
    std::string s;
    for (const auto& [name, tp] : tensors) {
      s += name;
      s.push_back('\0');
      s.push_back(tp.bit_preserving ? '1' : '0');
      for (const auto& r : tp.held) s += std::to_string(r.begin) + ":" + std::to_string(r.end) + ",";
      s.push_back('\n');
    }
    return codec::xxh3_128(std::as_bytes(std::span(s.data(), s.size())));
  }

  friend bool operator==(const placement&, const placement&) = default;
};

/// The declaration of a Loader: every tensor whose placement is not "whole and bit-preserving".
template <layout::Loader L>
placement declare(const L& l) {
  placement p;
  for (const tensor_info& t : l.canonical().tensors()) {
    const auto held = l.held(t.name);
    const bool bp = l.bit_preserving(t.name);
    const bool whole = t.elements() == 0 ? held.empty() : (held.size() == 1 && held[0].begin == 0 && held[0].end == t.elements());
    if (whole && bp) continue;
    p.tensors[t.name] = {std::vector<layout::index_range>(held.begin(), held.end()), bp};
  }
  return p;
}

/// Tensors that must be sent as OVERWRITE in every attempt: some receiver holds part of them and
/// does not place them bit-preservingly.
inline std::set<std::string, std::less<>> overwrite_only_tensors(const model_manifest& m, std::span<const placement> receivers) {
  std::set<std::string, std::less<>> out;
  for (const tensor_info& t : m.tensors())
    for (const placement& p : receivers)
      if (!p.bit_preserving(t.name) && p.holds_any(t)) {
        out.insert(t.name);
        break;
      }
  return out;
}

/// Where items of tensor `t` must be cut so that no item straddles a boundary of any receiver's
/// held ranges (ascending, strictly inside (0, t.elements())): a base-conditioned item is decoded
/// against the base bits of its whole range, so every receiver must hold all of it or none of it
/// (codec/conditioned.hpp, layout::base_bits). Empty for a tensor every receiver holds whole.
inline std::vector<std::uint64_t> item_cuts(const tensor_info& t, std::span<const placement> receivers) {
  std::vector<std::uint64_t> cuts;
  for (const placement& p : receivers)
    for (const auto& r : p.held(t))
      for (std::uint64_t x : {r.begin, r.end})
        if (x > 0 && x < t.elements()) cuts.push_back(x);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

/// The attestation digest a receiver with placement `p` reports when it holds `bits` (the canonical
/// bytes of every tensor, by name). Same ranges, same order, same function as receiver_store::attest.
/// bits(t) returns the tensor's bytes, or a codec::patched_bytes (a base plus changed elements: a
/// sender's frozen target as B^v + its change set, digested without building the target).
template <class Bits>
digest128 expected_attestation(const model_manifest& m, const placement& p, Bits&& bits) {
  std::vector<codec::attested_range> rs;
  std::vector<std::vector<layout::index_range>> helds;
  helds.reserve(m.size());
  for (const tensor_info& t : m.tensors()) {
    helds.push_back(p.held(t));
    if (helds.back().empty()) continue;
    codec::patched_bytes all;
    if constexpr (std::is_convertible_v<decltype(bits(t)), std::span<const std::byte>>) all.base = bits(t);
    else all = bits(t);
    const std::size_t E = element_size(t.type);
    for (const auto& r : helds.back()) {
      const auto lo = std::lower_bound(all.positions.begin(), all.positions.end(), r.begin);
      const auto hi = std::lower_bound(lo, all.positions.end(), r.end);
      const std::size_t k = static_cast<std::size_t>(lo - all.positions.begin()), n = static_cast<std::size_t>(hi - lo);
      rs.push_back({t.name, t.type, &t.shape, r.begin, r.end, all.base.subspan(r.begin * E, r.size() * E), all.positions.subspan(k, n),
                    all.values.subspan(k * E, n * E)});
    }
  }
  return codec::attestation_digest(std::span<const codec::attested_range>(rs));
}

}  // namespace bitrefit::refit
