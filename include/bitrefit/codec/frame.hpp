// bitrefit/codec/frame.hpp — the payload frame: layout, writer and verifying parser.
//
// Frame format version 2, every integer little-endian:
//
//   header (64 bytes)
//     0  magic "BRFP"            4  u16 format_version (= 2)    6  u8 frame_kind    7  u8 0
//     8  u64 attempt.epoch      16  u64 attempt.counter       24  u32 owner        28  u32 seq
//    32  u64 base_version       40  u64 target_version        48  u32 item_count   52  u32 0
//    56  u64 frame_size (total bytes, digest included)
//   item descriptors, item_count times
//     u16 name_len, name bytes (the canonical tensor name)
//     u8 dtype (core/dtype.hpp code), u8 value_mode, u8 location_coding, u8 value_coding,
//     u8 location section compression, u8 value section compression, u16 0
//     u64 tensor_elements, u64 range_begin, u64 range_end, u64 changed,
//     u64 location_raw_size, u64 location_stored_size, u64 value_raw_size, u64 value_stored_size
//   sections, in item order: location section then value section of each item
//   digest (16 bytes): XXH3-128 (seed 0) of every byte before it, low64 then high64
//
// Positions of an item are relative to range_begin and lie in [0, range_end - range_begin);
// value_raw_size = changed * element_size(dtype), except for base-conditioned items (value_mode 2:
// location_coding class_gaps, value_coding ulp_distance, float dtypes only, both sections raw, see
// conditioned.hpp), whose sections are rANS streams with tables. Items of one tensor never overlap.
// Resource bound: the items' ranges cover at most frame_input_bytes_limit (64 MiB) of canonical
// input (sum of (range_end - range_begin) * element size); every raw size is bounded by its
// item's range, so what a decoder allocates for one frame is bounded by that limit (apply.hpp).
//
// Versions: 1 had no base-conditioned items; 2 added them (value_mode, location_coding and
// value_coding values at the end). A reader accepts only its own version and says which one it
// reads, so an old receiver refuses a new frame (and a new one an old frame) by name instead of
// misreading it: both ends of a refit must run builds with the same frame format.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/codec/ulp.hpp"
#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/ids.hpp"

namespace bitrefit::codec {

inline constexpr char frame_magic[4] = {'B', 'R', 'F', 'P'};
inline constexpr std::uint16_t frame_format_version = 2;
inline constexpr std::size_t frame_header_size = 64;
inline constexpr std::size_t frame_digest_size = 16;
inline constexpr std::size_t item_descriptor_fixed_size = 2 + 8 + 8 * 8;

struct frame_header {
  frame_kind kind = frame_kind::delta;
  payload_id id;
  version_t base_version = 0;
  version_t target_version = 0;
  friend bool operator==(const frame_header&, const frame_header&) = default;
};

/// One item's descriptor as stored in the frame.
struct frame_item {
  std::string tensor;
  dtype type = dtype::U8;
  value_mode mode = value_mode::overwrite;
  location_coding locations = location_coding::gaps8;
  value_coding values = value_coding::interleaved;
  section_compression location_compression = section_compression::raw;
  section_compression value_compression = section_compression::raw;
  std::uint64_t tensor_elements = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t changed = 0;
  std::uint64_t location_raw_size = 0;
  std::uint64_t location_stored_size = 0;
  std::uint64_t value_raw_size = 0;
  std::uint64_t value_stored_size = 0;

  std::uint64_t range_elements() const noexcept { return end - begin; }
  friend bool operator==(const frame_item&, const frame_item&) = default;
};

namespace detail {

inline void put_u8(std::byte*& p, std::uint8_t v) noexcept { *p++ = static_cast<std::byte>(v); }
inline void put_u16(std::byte*& p, std::uint16_t v) noexcept {
  for (int i = 0; i < 2; ++i) *p++ = static_cast<std::byte>(v >> (8 * i));
}
inline void put_u32(std::byte*& p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) *p++ = static_cast<std::byte>(v >> (8 * i));
}
inline void put_u64(std::byte*& p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) *p++ = static_cast<std::byte>(v >> (8 * i));
}
template <class T>
inline T get_le(const std::byte* p) noexcept {
  T v = 0;
  for (std::size_t i = sizeof(T); i-- > 0;) v = static_cast<T>((v << 8) | static_cast<T>(static_cast<std::uint8_t>(p[i])));
  return v;
}

inline std::uint64_t descriptor_size(const frame_item& it) noexcept { return item_descriptor_fixed_size + it.tensor.size(); }

}  // namespace detail

/// Assembles a frame from descriptors and their stored sections.
/// @pre sections.size() == 2 * items.size() (location, value per item), sizes matching the
/// descriptors' stored sizes. Output is fully determined by the inputs.
inline void write_frame(const frame_header& h, std::span<const frame_item> items,
                        std::span<const std::span<const std::byte>> sections, byte_buffer& out) {
  if (sections.size() != 2 * items.size()) throw error(errc::invalid_argument, "write_frame: two sections per item");
  std::uint64_t total = frame_header_size + frame_digest_size;
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    if (it.tensor.size() > 0xFFFF) throw error(errc::invalid_argument, "tensor name longer than 65535 bytes", {.file = {}, .tensor = it.tensor, .field = "name"});
    covered += it.range_elements() * element_size(it.type);
    if (covered > frame_input_bytes_limit)
      throw error(errc::invalid_argument, "frame would cover more than the format's " + std::to_string(frame_input_bytes_limit) + " bytes of input (plan smaller chunks)", {.file = {}, .tensor = it.tensor, .field = "range"});
    if (sections[2 * i].size() != it.location_stored_size || sections[2 * i + 1].size() != it.value_stored_size)
      throw error(errc::invalid_argument, "write_frame: section sizes differ from the descriptor", {.file = {}, .tensor = it.tensor, .field = {}});
    total += detail::descriptor_size(it) + it.location_stored_size + it.value_stored_size;
  }
  if (items.size() > 0xFFFFFFFFull) throw error(errc::invalid_argument, "too many items in one frame");
  out.resize_uninit(total);
  std::byte* p = out.data();
  std::memcpy(p, frame_magic, 4);
  p += 4;
  detail::put_u16(p, frame_format_version);
  detail::put_u8(p, static_cast<std::uint8_t>(h.kind));
  detail::put_u8(p, 0);
  detail::put_u64(p, h.id.attempt.epoch);
  detail::put_u64(p, h.id.attempt.counter);
  detail::put_u32(p, h.id.owner);
  detail::put_u32(p, h.id.seq);
  detail::put_u64(p, h.base_version);
  detail::put_u64(p, h.target_version);
  detail::put_u32(p, static_cast<std::uint32_t>(items.size()));
  detail::put_u32(p, 0);
  detail::put_u64(p, total);
  for (const auto& it : items) {
    detail::put_u16(p, static_cast<std::uint16_t>(it.tensor.size()));
    std::memcpy(p, it.tensor.data(), it.tensor.size());
    p += it.tensor.size();
    detail::put_u8(p, static_cast<std::uint8_t>(it.type));
    detail::put_u8(p, static_cast<std::uint8_t>(it.mode));
    detail::put_u8(p, static_cast<std::uint8_t>(it.locations));
    detail::put_u8(p, static_cast<std::uint8_t>(it.values));
    detail::put_u8(p, static_cast<std::uint8_t>(it.location_compression));
    detail::put_u8(p, static_cast<std::uint8_t>(it.value_compression));
    detail::put_u16(p, 0);
    for (std::uint64_t v : {it.tensor_elements, it.begin, it.end, it.changed, it.location_raw_size,
                            it.location_stored_size, it.value_raw_size, it.value_stored_size})
      detail::put_u64(p, v);
  }
  for (auto s : sections) {
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  store_digest_le(xxh3_128({out.data(), total - frame_digest_size}), p);
}

/// A parsed, structurally verified frame over borrowed bytes. parse() checks, in this order:
/// size >= header + digest, magic, format version, declared frame size == actual size (catches
/// truncation and trailing garbage), the XXH3-128 digest (catches any corrupted byte), then every
/// descriptor field (dtype code, mode, codings, ranges inside the tensor, the frame's covered input
/// within frame_input_bytes_limit, value sizes, raw-size bounds, sections exactly filling the
/// frame, items of one tensor disjoint). Sections are not decompressed here (see apply.hpp).
/// Memory: the item list only (bounded by the frame's size). Errors are errc::integrity (size,
/// digest) or errc::format / errc::unsupported, with `source` as the error's file field and the
/// tensor named when known.
class frame_view {
 public:
  static frame_view parse(std::span<const std::byte> bytes, std::string_view source = {}) {
    frame_view f;
    f.bytes_ = bytes;
    error_context where{.file = std::string(source), .tensor = {}, .field = {}};
    auto fail = [&](errc c, std::string msg, std::string field) {
      where.field = std::move(field);
      throw error(c, std::move(msg), where);
    };
    if (bytes.size() < frame_header_size + frame_digest_size)
      fail(errc::integrity, "frame of " + std::to_string(bytes.size()) + " bytes is shorter than header + digest (truncated?)", "size");
    if (std::memcmp(bytes.data(), frame_magic, 4) != 0) fail(errc::format, "bad magic (not a bitrefit payload frame)", "magic");
    const std::byte* p = bytes.data();
    const auto ver = detail::get_le<std::uint16_t>(p + 4);
    if (ver != frame_format_version)
      fail(errc::unsupported,
           "frame format version " + std::to_string(ver) + ", but this build reads only version " + std::to_string(frame_format_version) +
               (ver < frame_format_version ? " (the sender runs an older bitrefit: upgrade it)" : " (the sender runs a newer bitrefit: upgrade this receiver)"),
           "format_version");
    const auto declared = detail::get_le<std::uint64_t>(p + 56);
    if (declared != bytes.size())
      fail(errc::integrity, "frame is " + std::to_string(bytes.size()) + " bytes but its header declares " + std::to_string(declared) + " (truncated or padded)", "frame_size");
    const digest128 stored = load_digest_le(p + bytes.size() - frame_digest_size);
    const digest128 actual = xxh3_128(bytes.first(bytes.size() - frame_digest_size));
    if (stored != actual)
      fail(errc::integrity, "digest mismatch: frame says " + stored.to_hex() + ", content hashes to " + actual.to_hex() + " (corrupted)", "digest");
    const auto kind = static_cast<std::uint8_t>(p[6]);
    if (kind > 1) fail(errc::format, "unknown frame kind " + std::to_string(kind), "frame_kind");
    if (p[7] != std::byte{0} || detail::get_le<std::uint32_t>(p + 52) != 0) fail(errc::format, "reserved header bytes are not zero", "reserved");
    f.header_.kind = static_cast<frame_kind>(kind);
    f.header_.id.attempt.epoch = detail::get_le<std::uint64_t>(p + 8);
    f.header_.id.attempt.counter = detail::get_le<std::uint64_t>(p + 16);
    f.header_.id.owner = detail::get_le<std::uint32_t>(p + 24);
    f.header_.id.seq = detail::get_le<std::uint32_t>(p + 28);
    f.header_.base_version = detail::get_le<std::uint64_t>(p + 32);
    f.header_.target_version = detail::get_le<std::uint64_t>(p + 40);
    const auto n_items = detail::get_le<std::uint32_t>(p + 48);

    const std::size_t body_end = bytes.size() - frame_digest_size;
    std::size_t off = frame_header_size;
    // every item needs at least its fixed descriptor: bound the count before reserving
    if (n_items > (body_end - off) / item_descriptor_fixed_size) fail(errc::format, "item count " + std::to_string(n_items) + " cannot fit in the frame", "item_count");
    f.items_.reserve(n_items);
    std::uint64_t covered = 0;  // canonical input bytes of the items so far
    for (std::uint32_t i = 0; i < n_items; ++i) {
      where.tensor.clear();
      if (body_end - off < 2) fail(errc::format, "item descriptor runs past the frame end", "item");
      const auto name_len = detail::get_le<std::uint16_t>(p + off);
      if (body_end - off < item_descriptor_fixed_size + name_len) fail(errc::format, "item descriptor runs past the frame end", "item");
      frame_item it;
      it.tensor.assign(reinterpret_cast<const char*>(p + off + 2), name_len);
      where.tensor = it.tensor;
      if (it.tensor.empty()) fail(errc::format, "item with an empty tensor name", "name");
      const std::byte* q = p + off + 2 + name_len;
      const auto dt = static_cast<std::uint8_t>(q[0]), md = static_cast<std::uint8_t>(q[1]),
                 lc = static_cast<std::uint8_t>(q[2]), vc = static_cast<std::uint8_t>(q[3]),
                 lz = static_cast<std::uint8_t>(q[4]), vz = static_cast<std::uint8_t>(q[5]);
      if (!is_valid_dtype_code(dt)) fail(errc::format, "unknown dtype code " + std::to_string(dt), "dtype");
      if (md >= value_mode_count) fail(errc::format, "unknown value mode " + std::to_string(md), "mode");
      if (lc >= location_coding_count) fail(errc::format, "unknown location coding " + std::to_string(lc), "location_coding");
      if (vc >= value_coding_count) fail(errc::format, "unknown value coding " + std::to_string(vc), "value_coding");
      if (lz >= section_compression_count || vz >= section_compression_count) fail(errc::format, "unknown section compression", "compression");
      if (detail::get_le<std::uint16_t>(q + 6) != 0) fail(errc::format, "reserved item bytes are not zero", "reserved");
      it.type = static_cast<dtype>(dt);
      it.mode = static_cast<value_mode>(md);
      it.locations = static_cast<location_coding>(lc);
      it.values = static_cast<value_coding>(vc);
      it.location_compression = static_cast<section_compression>(lz);
      it.value_compression = static_cast<section_compression>(vz);
      q += 8;
      std::uint64_t* fields[] = {&it.tensor_elements, &it.begin, &it.end, &it.changed, &it.location_raw_size,
                                 &it.location_stored_size, &it.value_raw_size, &it.value_stored_size};
      for (auto* fld : fields) {
        *fld = detail::get_le<std::uint64_t>(q);
        q += 8;
      }
      off += item_descriptor_fixed_size + name_len;
      const std::uint64_t E = element_size(it.type);
      if (it.begin > it.end || it.end > it.tensor_elements)
        fail(errc::format, "range [" + std::to_string(it.begin) + ", " + std::to_string(it.end) + ") outside the tensor's " + std::to_string(it.tensor_elements) + " elements", "range");
      const std::uint64_t m = it.end - it.begin;
      if (m >= (1ull << 32)) fail(errc::format, "item range of 2^32 or more elements", "range");
      // m < 2^32 and E <= 8: no overflow; checked per item, so the sum cannot overflow either
      covered += m * E;
      if (covered > frame_input_bytes_limit)
        fail(errc::format, "items cover " + std::to_string(covered) + "+ bytes of input, more than the format's limit of " + std::to_string(frame_input_bytes_limit), "range");
      if (it.changed > m) fail(errc::format, "changed count exceeds the range", "changed");
      const bool conditioned = it.mode == value_mode::base_conditioned;
      if (conditioned != (it.locations == location_coding::class_gaps) || conditioned != (it.values == value_coding::ulp_distance))
        fail(errc::format, "base-conditioned items, and only they, use class_gaps locations and ulp_distance values", "mode");
      if (conditioned) {
        if (!float_format_of(it.type)) fail(errc::format, "base-conditioned item of a non-float dtype", "dtype");
        if (f.header_.kind != frame_kind::delta) fail(errc::format, "base-conditioned item in a dense frame", "mode");
        if (it.changed == 0) fail(errc::format, "base-conditioned item without changes", "changed");
        if (it.location_compression != section_compression::raw || it.value_compression != section_compression::raw ||
            it.location_stored_size != it.location_raw_size || it.value_stored_size != it.value_raw_size)
          fail(errc::format, "base-conditioned sections must be stored raw", "compression");
      } else {
        if (it.value_raw_size != it.changed * E) fail(errc::format, "value section raw size is not changed * element size", "value_raw_size");
        if (it.location_raw_size > max_location_raw_size(it.locations, m, it.changed))
          fail(errc::format, "location section raw size exceeds what its coding can need", "location_raw_size");
      }
      if (f.header_.kind == frame_kind::dense && (it.mode != value_mode::overwrite || it.changed != m))
        fail(errc::format, "dense frame item is not a full overwrite of its range", "mode");
      for (auto [stored, raw, comp] : {std::tuple{it.location_stored_size, it.location_raw_size, it.location_compression},
                                       std::tuple{it.value_stored_size, it.value_raw_size, it.value_compression}})
        if (comp == section_compression::raw && stored != raw) fail(errc::format, "raw section whose stored size differs from its raw size", "section_size");
      f.items_.push_back(std::move(it));
    }
    where.tensor.clear();
    std::uint64_t sec_total = 0;
    for (auto& it : f.items_) {
      if (it.location_stored_size > body_end || it.value_stored_size > body_end) fail(errc::format, "section larger than the frame", "section_size");
      sec_total += it.location_stored_size + it.value_stored_size;
    }
    if (sec_total != body_end - off)
      fail(errc::format, "sections hold " + std::to_string(body_end - off) + " bytes, descriptors declare " + std::to_string(sec_total), "section_size");
    f.sections_.reserve(2 * f.items_.size());
    for (auto& it : f.items_) {
      f.sections_.push_back(bytes.subspan(off, it.location_stored_size));
      off += it.location_stored_size;
      f.sections_.push_back(bytes.subspan(off, it.value_stored_size));
      off += it.value_stored_size;
    }
    // items of one tensor must be disjoint
    std::vector<std::size_t> order(f.items_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const auto& x = f.items_[a];
      const auto& y = f.items_[b];
      return x.tensor != y.tensor ? x.tensor < y.tensor : x.begin < y.begin;
    });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const auto& x = f.items_[order[k - 1]];
      const auto& y = f.items_[order[k]];
      if (x.tensor == y.tensor) {
        where.tensor = y.tensor;
        if (x.type != y.type || x.tensor_elements != y.tensor_elements) fail(errc::format, "items of one tensor disagree on dtype or size", "dtype");
        if (y.begin < x.end) fail(errc::format, "items of one tensor overlap", "range");
      }
    }
    f.digest_ = stored;
    return f;
  }

  const frame_header& header() const noexcept { return header_; }
  const std::vector<frame_item>& items() const noexcept { return items_; }
  std::span<const std::byte> location_section(std::size_t i) const noexcept { return sections_[2 * i]; }
  std::span<const std::byte> value_section(std::size_t i) const noexcept { return sections_[2 * i + 1]; }
  std::span<const std::byte> bytes() const noexcept { return bytes_; }
  /// The frame's own trailing digest (XXH3-128 of everything before it).
  const digest128& digest() const noexcept { return digest_; }
  /// Canonical input elements the frame covers (sum of item ranges).
  std::uint64_t covered_elements() const noexcept {
    std::uint64_t n = 0;
    for (auto& it : items_) n += it.range_elements();
    return n;
  }

 private:
  std::span<const std::byte> bytes_;
  frame_header header_;
  std::vector<frame_item> items_;
  std::vector<std::span<const std::byte>> sections_;
  digest128 digest_;
};

}  // namespace bitrefit::codec
