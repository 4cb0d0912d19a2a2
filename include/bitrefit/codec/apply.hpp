// bitrefit/codec/apply.hpp — decode a payload frame and apply it in place, verify-then-write.
//
// Rule: nothing is written until the whole frame verified — magic, version, size, digest, every
// descriptor (frame.hpp), every section decompressed to its declared size, every location stream
// decoded with every position inside its range, and every item matched to a target tensor of the
// same dtype and element count. Only then does the backend scatter the values. A bad frame throws
// bitrefit::error naming the problem and leaves every target bit-identical to before.
//
// Receiver memory: the decoder's scratch holds one frame's decoded positions and values, so it is
// bounded by the frame's canonical input (frame_input_bytes_limit, types.hpp), never by the model
// or by what a frame claims. Every size is checked before anything is allocated: frame_view::parse
// bounds the declared ranges, and the frame headers of every zstd section must record exactly the
// raw size its item declares (zstd_decompressor::check_frames) — a decompression bomb is refused
// unread.
// Worst case, one frame of a 1-byte dtype with every element changed and located by runs:
// 4 (positions) + 1 (values) + 2 (raw section) bytes per covered input byte. Scratch is released
// when a frame is refused, so a hostile frame leaves nothing behind. Allocation failure is
// errc::integrity (field "scratch"), never std::bad_alloc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/conditioned.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/zstd.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit::codec {

/// One decoded item: positions relative to item.begin (strictly ascending, < range size) and the
/// values interleaved (element_size bytes each), to be written with `apply` (the item's mode for
/// XOR and overwrite items; overwrite for base-conditioned ones, which decode to absolute values).
/// `skipped`: a base-conditioned item whose base this receiver does not hold (decode_options'
/// base reader said so): its sections were not decoded and it must not be applied.
struct decoded_item {
  const frame_item* item = nullptr;
  std::span<const std::uint32_t> positions;
  std::span<const std::byte> values;
  value_mode apply = value_mode::overwrite;
  bool skipped = false;
};

/// Where the decoder finds the base bits of a base-conditioned item's range: host memory holding
/// exactly (end - begin) · element_size bytes, or nullopt when this receiver holds none of the
/// item's range (the item is then skipped, see decoded_item). A reader that holds only part of
/// the range must throw (errc::mismatch): such an item cannot be decoded there.
using base_reader = std::function<std::optional<std::span<const std::byte>>(const frame_item&)>;

/// Decompresses and decodes frames into reusable scratch. Views returned by decode() stay valid
/// until the next decode() on the same decoder (and while the frame's bytes and the base live).
class frame_decoder {
 public:
  /// @pre `f` came from frame_view::parse (structure and digest verified).
  /// Throws errc::format naming the tensor and field on any inconsistency in the sections, and
  /// errc::mismatch for a base-conditioned item when `base` is empty (nothing to decode it with).
  /// A refused frame keeps no scratch (release()); a frame whose scratch cannot be allocated is
  /// errc::integrity.
  std::span<const decoded_item> decode(const frame_view& f, std::string_view source = {}, const base_reader& base = {}) {
    try {
      return decode_bounded(f, source, base);
    } catch (const std::bad_alloc&) {
      release();
      throw error(errc::integrity, "cannot allocate the decode scratch of this frame", {.file = std::string(source), .tensor = {}, .field = "scratch"});
    } catch (...) {
      release();  // a refused frame keeps no scratch
      throw;
    }
  }

  /// Bytes of scratch currently held (the receiver's extra memory beyond the model).
  std::size_t scratch_bytes() const noexcept {
    return positions_.capacity_bytes() + values_.capacity_bytes() + raw_.capacity_bytes() +
           out_.capacity() * sizeof(decoded_item) + conditioned_.scratch_bytes();
  }

  /// Frees all scratch (the next decode allocates again).
  void release() noexcept {
    positions_ = {};
    values_ = {};
    raw_ = {};
    conditioned_ = conditioned_decoder{};
    std::vector<decoded_item>().swap(out_);  // (out_ = {} would keep the capacity)
  }

 private:
  std::span<const decoded_item> decode_bounded(const frame_view& f, std::string_view source, const base_reader& base) {
    const auto& items = f.items();
    // Nothing is allocated before every section's declared raw size is confirmed by its own zstd
    // header (raw sections: parse() already checked stored == raw).
    std::uint64_t total_pos = 0, total_val = 0, max_raw = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const frame_item& it = items[i];
      error_context where{.file = std::string(source), .tensor = it.tensor, .field = "locations"};
      if (it.location_compression == section_compression::zstd) {
        zstd_decompressor::check_frames(f.location_section(i), it.location_raw_size, where);
        max_raw = std::max(max_raw, it.location_raw_size);
      }
      where.field = "values";
      if (it.value_compression == section_compression::zstd) {
        zstd_decompressor::check_frames(f.value_section(i), it.value_raw_size, where);
        if (it.values == value_coding::byte_planes && element_size(it.type) > 1) max_raw = std::max(max_raw, it.value_raw_size);
      }
      total_pos += it.changed;
      total_val += it.changed * element_size(it.type);
    }
    positions_.resize_uninit(total_pos);
    values_.resize_uninit(total_val);
    raw_.resize_uninit(max_raw);
    out_.clear();
    out_.reserve(items.size());
    std::uint64_t pos_off = 0, val_off = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const frame_item& it = items[i];
      error_context where{.file = std::string(source), .tensor = it.tensor, .field = "locations"};
      const std::uint64_t m = it.range_elements();
      const std::size_t E = element_size(it.type);
      std::span<std::uint32_t> pos{positions_.data() + pos_off, it.changed};
      std::span<std::byte> vals{values_.data() + val_off, it.changed * E};
      pos_off += it.changed;
      val_off += it.changed * E;
      if (it.mode == value_mode::base_conditioned) {
        if (!base) throw error(errc::mismatch, "base-conditioned item, but no base to decode it against", where);
        const auto b = base(it);
        if (!b) {
          out_.push_back({&it, {}, {}, value_mode::overwrite, true});
          continue;
        }
        where.field = "base";
        if (b->size() != m * E) throw error(errc::invalid_argument, "base bytes do not cover the item's range", where);
        where.field = "base_conditioned";
        conditioned_.decode(*float_format_of(it.type), m, it.changed, f.location_section(i), f.value_section(i), *b, pos, vals, where);
        out_.push_back({&it, pos, vals, value_mode::overwrite, false});
        continue;
      }
      // locations
      std::span<const std::byte> loc_raw = f.location_section(i);
      if (it.location_compression == section_compression::zstd) {
        raw_.resize_uninit(it.location_raw_size);
        zstd_.decompress_exact(loc_raw, raw_.span(), where);
        loc_raw = raw_.span();
      }
      decode_locations(it.locations, loc_raw, m, pos, where);
      // values
      where.field = "values";
      const bool planes = it.values == value_coding::byte_planes && E > 1;
      std::span<const std::byte> val_src = f.value_section(i);
      if (it.value_compression == section_compression::zstd) {
        std::span<std::byte> dst = vals;
        if (planes) {
          raw_.resize_uninit(it.value_raw_size);
          dst = raw_.span();
        }
        zstd_.decompress_exact(val_src, dst, where);
        val_src = dst;
      }
      if (planes) detail::merge_planes(val_src, E, vals.data());
      else if (val_src.data() != vals.data() && !vals.empty()) std::memcpy(vals.data(), val_src.data(), vals.size());
      out_.push_back({&it, pos, vals, it.mode, false});
    }
    return out_;
  }

  zstd_decompressor zstd_;
  conditioned_decoder conditioned_;
  scratch_buffer<std::uint32_t> positions_;
  byte_buffer values_, raw_;
  std::vector<decoded_item> out_;
};

/// The receiver's tensors by canonical name (views; bytes in the backend's memory space).
class target_map {
 public:
  target_map() = default;
  explicit target_map(std::vector<mutable_tensor_view> tensors) : tensors_(std::move(tensors)) {
    std::sort(tensors_.begin(), tensors_.end(), [](auto& a, auto& b) { return a.name() < b.name(); });
    for (std::size_t i = 1; i < tensors_.size(); ++i)
      if (tensors_[i - 1].name() == tensors_[i].name())
        throw error(errc::invalid_argument, "duplicate tensor in target", {.file = {}, .tensor = tensors_[i].name(), .field = {}});
  }
  const mutable_tensor_view* find(std::string_view name) const {
    auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name, [](auto& t, std::string_view n) { return t.name() < n; });
    return it != tensors_.end() && it->name() == name ? &*it : nullptr;
  }
  const std::vector<mutable_tensor_view>& tensors() const noexcept { return tensors_; }

 private:
  std::vector<mutable_tensor_view> tensors_;
};

/// What apply() did.
struct apply_result {
  frame_header header;
  std::uint64_t items = 0;
  std::uint64_t changed = 0;  // elements written
};

/// Verifies and applies frames to a target_map through `Backend`.
template <execution_backend Backend = host_backend>
class frame_applier {
 public:
  explicit frame_applier(Backend backend = {}) : backend_(std::move(backend)) {}

  /// Full verification without writing: parse + digest, match every item to `targets` (before
  /// any section is decompressed: a frame for tensors this target lacks costs no decoding), decode
  /// every section. Returns the parsed view (borrowing `bytes`). Throws on the first problem.
  frame_view verify(std::span<const std::byte> bytes, const target_map& targets, std::string_view source = {}) {
    frame_view f = frame_view::parse(bytes, source);
    const auto tensors = match_targets(f, targets, source);
    decode(f, tensors, source);
    return f;
  }

  /// Verify-everything-then-write. On any error the targets are untouched. Base-conditioned items
  /// decode against the targets' current bits (which must be the frame's base version).
  apply_result apply(std::span<const std::byte> bytes, const target_map& targets, std::string_view source = {}) {
    frame_view f = frame_view::parse(bytes, source);
    auto tensors = match_targets(f, targets, source);
    auto decoded = decode(f, tensors, source);
    apply_result r{f.header(), 0, 0};
    for (std::size_t i = 0; i < decoded.size(); ++i) {
      const auto& d = decoded[i];
      const std::size_t E = element_size(d.item->type);
      auto dst = tensors[i]->bytes().subspan(d.item->begin * E, d.item->range_elements() * E);
      backend_.apply_changes(dst, E, d.apply, d.positions, d.values);
      r.items += 1;
      r.changed += d.item->changed;
    }
    return r;
  }

  /// Receiver scratch beyond the model (decoded positions and values of one frame).
  std::size_t scratch_bytes() const noexcept { return decoder_.scratch_bytes(); }
  frame_decoder& decoder() noexcept { return decoder_; }
  Backend& backend() noexcept { return backend_; }

 private:
  std::vector<const mutable_tensor_view*> match_targets(const frame_view& f, const target_map& targets,
                                                        std::string_view source) {
    std::vector<const mutable_tensor_view*> out;
    out.reserve(f.items().size());
    for (const auto& it : f.items()) {
      error_context where{.file = std::string(source), .tensor = it.tensor, .field = {}};
      const mutable_tensor_view* t = targets.find(it.tensor);
      if (!t) throw error(errc::mismatch, "frame names a tensor the target does not have", where);
      if (t->type() != it.type) {
        where.field = "dtype";
        throw error(errc::mismatch, "frame item is " + std::string(dtype_name(it.type)) + " but the target tensor is " + std::string(dtype_name(t->type())), where);
      }
      if (t->elements() != it.tensor_elements) {
        where.field = "tensor_elements";
        throw error(errc::mismatch, "frame item's tensor has " + std::to_string(it.tensor_elements) + " elements but the target has " + std::to_string(t->elements()), where);
      }
      out.push_back(t);
    }
    return out;
  }

  std::span<const decoded_item> decode(const frame_view& f, const std::vector<const mutable_tensor_view*>& tensors,
                                       std::string_view source) {
    const auto& items = f.items();
    return decoder_.decode(f, source, [&](const frame_item& it) -> std::optional<std::span<const std::byte>> {
      const std::size_t i = static_cast<std::size_t>(&it - items.data());
      const std::size_t E = element_size(it.type);
      return backend_.host_bytes(tensors[i]->bytes().subspan(it.begin * E, it.range_elements() * E), base_copy_);
    });
  }

  Backend backend_;
  frame_decoder decoder_;
  byte_buffer base_copy_;  // base bits of one item range, for backends whose tensors are not in host memory
};

}  // namespace bitrefit::codec
