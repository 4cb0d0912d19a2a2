// bitrefit/layout/frame_apply.hpp — applying codec payload frames through any Loader.
//
// The bridge between codec/ (frames, decoded items) and layout/ (where a receiver keeps its
// values). A receiver whose tensors are not canonical tensors — a tensor-parallel serving rank
// with merged qkv_proj, stacked experts, padded vocabularies — applies frames here instead of
// through codec::frame_applier's canonical target_map. Same rule: everything is verified (frame
// digest and structure, every section decoded, every item matched to the loader's canonical
// manifest by dtype and element count, XOR only where placement is bit-preserving) before the
// first byte is written; a rejected frame leaves the engine bit-identical to before.
// Positions outside the loader's held ranges are skipped (a TP rank takes its part).
// The refit receiver (refit/receiver_store.hpp) applies through this class too: one home for frame
// apply with held ranges. Also here: the attestation digest of what a Loader holds (codec's definition over its declared
// held ranges), read in place where a range is one contiguous segment.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <span>
#include <vector>
#include <string>
#include <string_view>

#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/layout/apply.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

/// What verification learned about a frame: enough to tell the protocol about it.
struct frame_check {
  codec::frame_header header;
  digest128 content;         // the frame's own XXH3-128 (identical bytes <=> identical digest)
  bool any_xor = false;      // some item is XOR (the payload's mode is XOR)
  std::uint64_t changed = 0; // elements the frame carries
};

struct frame_apply_result {
  codec::frame_header header;
  std::uint64_t items = 0;
  std::uint64_t applied = 0;   // elements written into this loader
  std::uint64_t not_held = 0;  // elements of the frame this loader does not hold
};

/// The base bits a base-conditioned item decodes against (codec::base_reader), read from a Loader:
/// nullopt when the loader holds none of the item's range (a tensor-parallel rank skips the item);
/// the range's canonical bits when it holds all of it — in place when one bit-preserving segment
/// holds the range, else read back into `scratch` (O(one item range), i.e. O(frame input bound));
/// errc::mismatch when it holds only part of it (the sender cuts items at every receiver's
/// held-range boundaries, refit::item_cuts, so this means the declarations disagree).
template <Loader L>
std::optional<std::span<const std::byte>> base_bits(const L& l, const codec::frame_item& it, std::vector<std::byte>& scratch,
                                                    std::string_view source = {}) {
  const tensor_info* t = l.canonical().find(it.tensor);
  error_context where{.file = std::string(source), .tensor = it.tensor, .field = "range"};
  if (!t) throw error(errc::mismatch, "frame names a tensor this engine does not serve", where);
  const std::size_t es = element_size(t->type);
  std::uint64_t held = 0;
  for (const index_range& r : l.held(it.tensor)) {
    const std::uint64_t b = std::max(r.begin, it.begin), e = std::min(r.end, it.end);
    if (b < e) held += e - b;
  }
  if (held == 0) return std::nullopt;
  if (held != it.end - it.begin)
    throw error(errc::mismatch, "base-conditioned item over a range this engine holds only in part (items must be cut at held-range boundaries)", where);
  if (l.bit_preserving(it.tensor))
    for (const placement_segment& s : l.segments(it.tensor))
      if (s.begin <= it.begin && it.end <= s.end)
        return std::span<const std::byte>(s.data + (it.begin - s.begin) * es, (it.end - it.begin) * es);
  scratch.resize((it.end - it.begin) * es);
  read_canonical(l, it.tensor, index_range{it.begin, it.end}, scratch);
  return std::span<const std::byte>(scratch);
}

/// Verifies and applies frames to a Loader: the one place a payload frame reaches an engine's
/// weights (the refit receiver's payloads and dense restores, the layout tests). Holds the
/// decoder's scratch (bounded by one frame's canonical input), so keep one per receiver thread.
///
/// Held ranges: positions a loader does not hold are skipped (a tensor-parallel rank takes its
/// part); an item of a tensor the loader holds nothing of is checked but touches nothing (so an
/// XOR item for it is no error). XOR on a tensor the loader holds but places non-bit-preservingly
/// is refused.
///
/// Parse once, decode once. inspect() parses a frame (size, digest, every descriptor) and matches
/// its items to the loader without decompressing anything: what a receiver needs to accept a
/// payload when it arrives. apply_parsed() later decodes that parsed frame once, checks the decoded
/// positions and values, and only then writes. verify() and apply() do both steps on raw bytes.
/// decodes() counts decodes, so tests can see that a payload was decoded once.
///
/// Base-conditioned items (codec/conditioned.hpp) decode against the loader's current bits of the
/// item's range (base_bits above): a payload is applied on the base it names, which the protocol
/// guarantees for every exact-base (xor_mask) payload; the decoded values are absolute.
/// An item over a range this loader holds none of is skipped (`skipped`).
class loader_frame_applier {
 public:
  /// Parses `bytes` and matches every item to the loader; nothing is decompressed or written.
  /// The view refers to `bytes`, which must stay alive and unchanged while it is used.
  template <Loader L>
  std::pair<codec::frame_view, frame_check> inspect(const L& l, std::span<const std::byte> bytes, std::string_view source = {}) const {
    codec::frame_view f = codec::frame_view::parse(bytes, source);
    const frame_check c = check_items(l, f, source);
    return {std::move(f), c};
  }

  /// Full verification without writing (every section decoded). Throws bitrefit::error naming the
  /// tensor and field.
  template <Loader L>
  frame_check verify(const L& l, std::span<const std::byte> bytes, std::string_view source = {}) {
    auto [f, c] = inspect(l, bytes, source);
    decode_checked(l, f, source);
    return c;
  }

  /// Decodes a frame that inspect() accepted, checks the decoded items, then writes every item.
  /// On any error the loader's tensors are untouched.
  template <Loader L>
  frame_apply_result apply_parsed(L& l, const codec::frame_view& f, std::string_view source = {}) {
    const auto decoded = decode_checked(l, f, source);
    frame_apply_result r{f.header(), 0, 0, 0};
    for (const codec::decoded_item& d : decoded) {
      const codec::frame_item& it = *d.item;
      if (d.skipped) {  // base-conditioned item of a range this loader does not hold
        r.not_held += it.changed;
        continue;
      }
      r.items += 1;
      if (l.held(it.tensor).empty()) {  // a partial holder: nothing of this tensor here
        r.not_held += it.changed;
        continue;
      }
      apply_stats st;
      if (it.locations == codec::location_coding::all) {  // every element of the range: one run
        const index_range run[1] = {{it.begin, it.end}};
        st = apply_runs(l, it.tensor, d.apply, std::span<const index_range>(run), d.values);
      } else {
        st = apply_positions(l, it.tensor, d.apply, d.positions, d.values, it.begin);
      }
      r.applied += st.applied;
      r.not_held += st.not_held;
    }
    return r;
  }

  /// Verify everything, then write. On any error the loader's tensors are untouched.
  template <Loader L>
  frame_apply_result apply(L& l, std::span<const std::byte> bytes, std::string_view source = {}) {
    auto [f, c] = inspect(l, bytes, source);
    return apply_parsed(l, f, source);
  }

  std::size_t scratch_bytes() const noexcept { return decoder_.scratch_bytes() + base_.capacity(); }
  std::uint64_t decodes() const noexcept { return decodes_; }

 private:
  template <Loader L>
  static frame_check check_items(const L& l, const codec::frame_view& f, std::string_view source) {
    frame_check c{f.header(), f.digest(), false, 0};
    for (const codec::frame_item& it : f.items()) {
      error_context where{.file = std::string(source), .tensor = it.tensor, .field = "tensor"};
      const tensor_info* t = l.canonical().find(it.tensor);
      if (!t) throw error(errc::mismatch, "frame names a tensor this engine does not serve", where);
      where.field = {};
      if (t->type != it.type) {
        where.field = "dtype";
        throw error(errc::mismatch, "frame item is " + std::string(dtype_name(it.type)) + " but the engine's canonical tensor is " + std::string(dtype_name(t->type)), where);
      }
      if (t->elements() != it.tensor_elements || it.begin > it.end || it.end > it.tensor_elements) {
        where.field = "tensor_elements";
        throw error(errc::mismatch, "frame item's range does not fit the engine's tensor of " + std::to_string(t->elements()) + " elements", where);
      }
      if (needs_exact_base(it.mode)) c.any_xor = true;  // XOR and base-conditioned: only on the exact base
      if (it.mode == value_mode::xor_mask) {  // base-conditioned items decode to absolute values
        if (!l.bit_preserving(it.tensor) && !l.held(it.tensor).empty()) {
          where.field = "mode";
          throw error(errc::mismatch, "XOR item for a tensor this engine does not place bit-preservingly (the attempt must send it as overwrite)", where);
        }
      }
      c.changed += it.changed;
    }
    return c;
  }

  template <Loader L>
  std::span<const codec::decoded_item> decode_checked(const L& l, const codec::frame_view& f, std::string_view source) {
    const auto decoded = decoder_.decode(f, source, [&](const codec::frame_item& it) { return base_bits(l, it, base_, source); });
    ++decodes_;
    for (const codec::decoded_item& d : decoded) {
      const codec::frame_item& it = *d.item;
      error_context where{.file = std::string(source), .tensor = it.tensor, .field = "values"};
      if (d.values.size() != d.positions.size() * element_size(it.type))
        throw error(errc::format, "decoded values do not match the positions", where);
      for (std::size_t k = 0; k < d.positions.size(); ++k)
        if (d.positions[k] >= it.range_elements() || (k > 0 && d.positions[k] <= d.positions[k - 1])) {
          where.field = "locations";
          throw error(errc::format, "decoded positions are not strictly ascending inside the item's range", where);
        }
    }
    return decoded;
  }

  codec::frame_decoder decoder_;
  std::uint64_t decodes_ = 0;
  std::vector<std::byte> base_;  // base bits of one item range when not readable in place
};

/// The attestation digest (codec/attestation.hpp, version 1) over every range the loader holds:
/// what the receiver acks with, equal to what owners compute from canonical bits over the same
/// declared ranges. A held range that is one bit-preserving segment is hashed in place; any other
/// (upcast placement, or canonically adjacent segments apart in memory) is read back first.
template <Loader L, codec::execution_backend Backend = codec::host_backend>
digest128 loader_attestation_digest(const L& l, Backend backend = {}) {
  std::vector<codec::attested_range> ranges;
  std::vector<std::vector<std::byte>> copies;  // owned bytes of ranges that are not one segment
  std::size_t copy_count = 0;
  for (const tensor_info& t : l.canonical().tensors())
    for (const index_range& r : l.held(t.name)) {
      const auto segs = l.segments(t.name);
      const std::size_t es = element_size(t.type);
      auto it = std::find_if(segs.begin(), segs.end(), [&](const placement_segment& s) { return s.begin == r.begin && s.end == r.end; });
      if (l.bit_preserving(t.name) && it != segs.end()) {
        ranges.push_back({t.name, t.type, &t.shape, r.begin, r.end, std::span<const std::byte>(it->data, r.size() * es)});
      } else {
        ++copy_count;
        ranges.push_back({t.name, t.type, &t.shape, r.begin, r.end, {}});
      }
    }
  copies.reserve(copy_count);  // spans into copies stay valid: no reallocation below
  for (auto& r : ranges)
    if (r.bytes.empty() && r.end > r.begin) {
      auto& buf = copies.emplace_back((r.end - r.begin) * element_size(r.type));
      read_canonical(l, r.tensor, index_range{r.begin, r.end}, buf);
      r.bytes = buf;
    }
  return codec::attestation_digest(std::span<const codec::attested_range>(ranges), backend);
}

}  // namespace bitrefit::layout
