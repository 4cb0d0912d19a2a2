// bitrefit/refit/receiver_store.hpp — a receiver's bits: verify, stage and apply payload frames
// into the engine's own layout through a layout::Loader, and attest over what it holds.
//
// The protocol's receiver state machine decides WHAT happens to a payload (drop, ignore as a
// duplicate, fail on conflict, stage, apply, ack); this class does it:
//   verify(bytes)   full verification without writing: frame structure and digest, every section
//                   decoded, every item matched to a tensor the loader serves with the same dtype and
//                   element count, XOR only where placement is bit-preserving. A copy that fails is
//                   "undelivered" (the caller fetches again); it never reaches the state machine.
//   apply(bytes)    verify, then write every item (never a partial frame). Positions the loader
//                   does not hold are skipped (a tensor-parallel rank takes its share); items of
//                   tensors it holds nothing of are verified but not touched.
//   attest()        the attestation digest (codec/attestation.hpp) over the loader's held ranges.
// Scratch memory is one frame's decoded positions and values (bounded by the frame size).
#pragma once

#include <string>
#include <vector>

#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/layout/apply.hpp"
#include "bitrefit/layout/frame_apply.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/protocol/messages.hpp"

namespace bitrefit::refit {

/// What verification learned about a frame: enough to tell the protocol about it.
struct verified_frame {
  codec::frame_header header;
  digest128 content;            // the frame's own XXH3-128 (identical bytes <=> identical digest)
  protocol::mode mode = protocol::mode::overwrite;  // xor_delta when any item is XOR
  std::uint64_t changed = 0;
};

template <layout::Loader L>
class receiver_store {
 public:
  explicit receiver_store(L& loader) : loader_(&loader) {}

  L& loader() noexcept { return *loader_; }

  verified_frame verify(std::span<const std::byte> bytes, std::string_view source = {}) {
    auto f = codec::frame_view::parse(bytes, source);
    verified_frame v = check(f, source);  // before decoding: a frame for tensors not served costs no scratch
    decode(f, source);
    return v;
  }

  /// Verifies everything, then writes. @throws like verify; nothing written when it throws.
  /// Base-conditioned items decode against the loader's current bits (the frame's base version).
  verified_frame apply(std::span<const std::byte> bytes, std::string_view source = {}) {
    auto f = codec::frame_view::parse(bytes, source);
    verified_frame v = check(f, source);
    auto decoded = decode(f, source);
    for (const auto& d : decoded) {
      const codec::frame_item& it = *d.item;
      if (d.skipped || loader_->held(it.tensor).empty()) continue;  // a partial holder: nothing of this here
      const auto mode = d.apply == codec::value_mode::xor_mask ? layout::write_mode::xor_mask : layout::write_mode::overwrite;
      if (it.locations == codec::location_coding::all) {
        const layout::index_range run[1] = {{it.begin, it.end}};
        layout::apply_runs(*loader_, it.tensor, mode, std::span<const layout::index_range>(run), d.values);
      } else {
        abs_.resize(d.positions.size());
        for (std::size_t k = 0; k < abs_.size(); ++k) abs_[k] = it.begin + d.positions[k];
        layout::apply_positions(*loader_, it.tensor, mode, std::span<const std::uint64_t>(abs_), d.values);
      }
    }
    return v;
  }

  /// Attestation digest over every held range, in canonical order.
  digest128 attest() const {
    std::vector<codec::attested_range> rs;
    std::vector<std::vector<std::byte>> copies;  // held ranges not contiguous in the engine's memory
    for (const tensor_info& t : loader_->canonical().tensors()) {
      const auto segs = loader_->bit_preserving(t.name) ? loader_->segments(t.name) : std::span<const layout::placement_segment>{};
      const std::size_t E = element_size(t.type);
      for (const layout::index_range& r : loader_->held(t.name)) {
        std::span<const std::byte> bytes;
        for (const auto& s : segs)
          if (s.begin == r.begin && s.end == r.end) bytes = {s.data, r.size() * E};
        if (bytes.data() == nullptr && r.size() > 0) {
          copies.emplace_back(r.size() * E);
          layout::read_canonical(*loader_, t.name, r, copies.back());
          bytes = copies.back();
        }
        rs.push_back({t.name, t.type, &t.shape, r.begin, r.end, bytes});
      }
    }
    return codec::attestation_digest(std::span<const codec::attested_range>(rs));
  }

  std::size_t scratch_bytes() const noexcept {
    return decoder_.scratch_bytes() + abs_.capacity() * sizeof(std::uint64_t) + base_.capacity();
  }

 private:
  std::span<const codec::decoded_item> decode(const codec::frame_view& f, std::string_view source) {
    return decoder_.decode(f, source, [&](const codec::frame_item& it) { return layout::base_bits(*loader_, it, base_, source); });
  }

  verified_frame check(const codec::frame_view& f, std::string_view source) {
    verified_frame v{f.header(), f.digest(), protocol::mode::overwrite, 0};
    for (const codec::frame_item& it : f.items()) {
      const error_context where{.file = std::string(source), .tensor = it.tensor, .field = "tensor"};
      const tensor_info* t = loader_->canonical().find(it.tensor);
      if (!t) throw error(errc::mismatch, "frame names a tensor this engine does not serve", where);
      if (t->type != it.type || t->elements() != it.tensor_elements)
        throw error(errc::mismatch, "frame item's dtype or element count differs from the engine's tensor", where);
      if (it.mode == codec::value_mode::xor_mask) {
        // XOR needs a bit-preserving placement of what this engine holds of the tensor; a tensor
        // it holds nothing of is not written at all.
        if (!loader_->bit_preserving(it.tensor) && !loader_->held(it.tensor).empty())
          throw error(errc::mismatch, "XOR item for a tensor the engine does not place bit-preservingly", where);
      }
      // XOR and base-conditioned items are only correct on the exact base: the protocol's xor_delta
      if (codec::needs_exact_base(it.mode)) v.mode = protocol::mode::xor_delta;
      v.changed += it.changed;
    }
    return v;
  }

  L* loader_;
  codec::frame_decoder decoder_;
  std::vector<std::uint64_t> abs_;
  std::vector<std::byte> base_;  // base bits of one item range when not readable in place
};

}  // namespace bitrefit::refit
