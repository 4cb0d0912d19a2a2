// bitrefit/codec/encoder.hpp — chunk planning and per-chunk encoding into payload frames.
//
// A chunk is a list of canonical ranges holding at most `max_frame_input_bytes` of input; it
// becomes exactly one frame whose payload id has seq = chunk index. Encoding is a pure function of
// (header, pieces' bytes, options): no clocks, no randomness, no dependence on threads, so
// re-encoding a chunk yields the same bytes under the same payload id.
//
// Per piece (one canonical range of one tensor), the encoder:
//   1. asks the backend for the changed positions and XOR masks and/or new values (one fused pass);
//   2. chooses the value mode (XOR or overwrite, when the policy allows both) and the value coding
//      (interleaved or byte planes) by estimated size: order-0 entropy of each byte plane on a
//      deterministic sample of the values — cheap next to compressing every candidate;
//   3. chooses the location coding (location.hpp) and writes the location stream;
//   4. compresses both sections with zstd (literals profile or the configured level, whichever is
//      smaller when the fast one looks poor; see store_section), keeping a section raw when zstd
//      does not make it smaller.
// No floating-point arithmetic touches weights: estimates are computed on byte histograms.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/entropy.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/codec/zstd.hpp"
#include "bitrefit/core/canonical.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit::codec {

/// One canonical range of one tensor with its old and new bits (bytes of [begin, end) only, in
/// the backend's memory space). For encode_dense, `old_bytes` may be empty.
struct chunk_piece {
  std::string_view tensor;
  dtype type = dtype::U8;
  std::uint64_t tensor_elements = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::span<const std::byte> old_bytes;
  std::span<const std::byte> new_bytes;
};

/// A chunk bound outside [8, frame_input_bytes_limit] is errc::invalid_argument: every frame must
/// stay decodable by any receiver (types.hpp).
inline void check_max_frame_input_bytes(std::uint64_t max_bytes) {
  if (max_bytes < 8 || max_bytes > frame_input_bytes_limit)
    throw error(errc::invalid_argument,
                "max_frame_input_bytes " + std::to_string(max_bytes) + " is outside [8, " + std::to_string(frame_input_bytes_limit) + "] (the frame format's limit)",
                {.file = {}, .tensor = {}, .field = "max_frame_input_bytes"});
}

/// Splits `ranges` (of tensors in `manifest`) into chunks of at most `max_bytes` input bytes each,
/// in canonical order (tensor name, begin). Ranges are normalized first; a range larger than the
/// bound is cut at element boundaries. Deterministic: the plan depends only on its arguments.
inline std::vector<std::vector<canonical_range>> plan_chunks(std::vector<canonical_range> ranges,
                                                             const model_manifest& manifest,
                                                             std::uint64_t max_bytes = default_max_frame_input_bytes) {
  check_max_frame_input_bytes(max_bytes);
  ranges = normalize(std::move(ranges));
  std::vector<std::vector<canonical_range>> chunks;
  std::vector<canonical_range> cur;
  std::uint64_t cur_bytes = 0;
  for (auto& r : ranges) {
    const tensor_info& t = manifest.at(r.tensor);
    if (r.end > t.elements())
      throw error(errc::invalid_argument, "range ends past the tensor's " + std::to_string(t.elements()) + " elements", {.file = {}, .tensor = r.tensor, .field = "range"});
    const std::uint64_t E = element_size(t.type);
    const std::uint64_t max_elems = std::min<std::uint64_t>(max_bytes / E, (1ull << 32) - 1);
    std::uint64_t b = r.begin;
    while (b < r.end) {
      std::uint64_t room = (max_bytes - cur_bytes) / E;
      if (room == 0) {
        chunks.push_back(std::move(cur));
        cur.clear();
        cur_bytes = 0;
        room = max_elems;
      }
      const std::uint64_t take = std::min({room, r.end - b, max_elems});
      cur.push_back({r.tensor, b, b + take});
      cur_bytes += take * E;
      b += take;
    }
  }
  if (!cur.empty()) chunks.push_back(std::move(cur));
  return chunks;
}

/// Chunks covering every element of every tensor of `manifest` (the whole model).
inline std::vector<std::vector<canonical_range>> plan_chunks(const model_manifest& manifest,
                                                             std::uint64_t max_bytes = default_max_frame_input_bytes) {
  std::vector<canonical_range> all;
  for (auto& t : manifest.tensors())
    if (t.elements() > 0) all.push_back({t.name, 0, t.elements()});
  return plan_chunks(std::move(all), manifest, max_bytes);
}

/// What one encode call produced (summed by callers across frames).
struct encode_stats {
  std::uint64_t frames = 0;
  std::uint64_t elements = 0;         // canonical input elements covered
  std::uint64_t input_bytes = 0;      // canonical input bytes covered (the dense size)
  std::uint64_t changed = 0;
  std::uint64_t items = 0;
  std::uint64_t xor_items = 0;
  std::uint64_t frame_bytes = 0;      // total bytes of the frames written
  std::uint64_t location_bytes = 0;   // stored location sections
  std::uint64_t value_bytes = 0;      // stored value sections
  std::array<std::uint64_t, location_coding_count> location_codings{};
  /// When set, receives every changed element's XOR mask (for the entropy bound); costs an extra
  /// XOR gather when the chosen mode is overwrite.
  entropy_accumulator* entropy = nullptr;

  encode_stats& operator+=(const encode_stats& o) {
    frames += o.frames;
    elements += o.elements;
    input_bytes += o.input_bytes;
    changed += o.changed;
    items += o.items;
    xor_items += o.xor_items;
    frame_bytes += o.frame_bytes;
    location_bytes += o.location_bytes;
    value_bytes += o.value_bytes;
    for (std::size_t i = 0; i < location_codings.size(); ++i) location_codings[i] += o.location_codings[i];
    return *this;
  }
};

namespace detail {

/// Estimated compressed bytes of `c` values of E bytes: {interleaved, byte planes}, from byte
/// histograms of a deterministic evenly spaced sample of at most 65536 values.
inline std::array<double, 2> estimate_value_bytes(std::span<const std::byte> vals, std::size_t E) {
  const std::size_t c = vals.size() / E;
  if (c == 0) return {0.0, 0.0};
  const std::size_t sample = std::min<std::size_t>(c, 65536);
  const std::size_t stride = c / sample;
  std::array<std::array<std::uint64_t, 256>, 8> h{};
  for (std::size_t s = 0, k = 0; s < sample; ++s, k += stride)
    for (std::size_t b = 0; b < E; ++b) ++h[b][static_cast<std::uint8_t>(vals[k * E + b])];
  std::array<std::uint64_t, 256> all{};
  double planes = 0.0;
  for (std::size_t b = 0; b < E; ++b) {
    planes += entropy_bytes(h[b]);
    for (int i = 0; i < 256; ++i) all[i] += h[b][i];
  }
  const double scale = static_cast<double>(c) / static_cast<double>(sample);
  return {entropy_bytes(all) * scale, planes * scale};
}

/// Order-0 entropy estimate (bytes) of a byte stream from a deterministic sample.
inline double estimate_stream_bytes(std::span<const std::byte> s) {
  if (s.empty()) return 0.0;
  const std::size_t sample = std::min<std::size_t>(s.size(), 65536);
  const std::size_t stride = s.size() / sample;
  std::array<std::uint64_t, 256> h{};
  for (std::size_t k = 0, i = 0; k < sample; ++k, i += stride) ++h[static_cast<std::uint8_t>(s[i])];
  return entropy_bytes(h) * static_cast<double>(s.size()) / static_cast<double>(sample);
}

inline void split_planes(std::span<const std::byte> vals, std::size_t E, std::byte* out) {
  const std::size_t c = vals.size() / E;
  const std::byte* v = vals.data();
  if (E == 2) {
    std::byte* p0 = out;
    std::byte* p1 = out + c;
    for (std::size_t k = 0; k < c; ++k) {
      p0[k] = v[2 * k];
      p1[k] = v[2 * k + 1];
    }
    return;
  }
  for (std::size_t k = 0; k < c; ++k)
    for (std::size_t b = 0; b < E; ++b) out[b * c + k] = v[k * E + b];
}

inline void merge_planes(std::span<const std::byte> planes, std::size_t E, std::byte* out) {
  const std::size_t c = planes.size() / E;
  const std::byte* p = planes.data();
  if (E == 2) {
    for (std::size_t k = 0; k < c; ++k) {
      out[2 * k] = p[k];
      out[2 * k + 1] = p[c + k];
    }
    return;
  }
  for (std::size_t k = 0; k < c; ++k)
    for (std::size_t b = 0; b < E; ++b) out[k * E + b] = p[b * c + k];
}

}  // namespace detail

/// Encodes chunks into frames. Holds reusable scratch (bounded by the chunk size) and zstd
/// contexts; one encoder per thread. `Backend` performs the memory-touching primitives
/// (concepts.hpp); everything that decides bytes on the wire is here and identical for all.
template <execution_backend Backend = host_backend>
class chunk_encoder {
 public:
  explicit chunk_encoder(encode_options options = {}, Backend backend = {})
      : options_(options), backend_(std::move(backend)) {
    check_max_frame_input_bytes(options_.max_frame_input_bytes);
  }

  const encode_options& options() const noexcept { return options_; }
  Backend& backend() noexcept { return backend_; }

  /// Encodes the delta old -> new of `pieces` as one frame (kind delta) into `out` (replacing its
  /// content). Pieces with no changed element produce no item; a chunk without changes still
  /// yields a (small) frame, so every seq of a plan exists.
  /// @pre pieces are disjoint, old/new spans hold (end-begin)*element_size bytes each.
  void encode(const frame_header& header, std::span<const chunk_piece> pieces, byte_buffer& out,
              encode_stats* stats = nullptr) {
    if (header.kind != frame_kind::delta) throw error(errc::invalid_argument, "encode writes delta frames; use encode_dense");
    begin_frame();
    encode_stats local;
    for (const auto& pc : pieces) encode_piece(pc, local, stats ? stats->entropy : nullptr);
    finish_frame(header, out, local, stats);
  }

  /// Encodes the new bits of `pieces` as a dense frame (every element, overwrite): what a
  /// restarted receiver needs without a base.
  void encode_dense(const frame_header& header, std::span<const chunk_piece> pieces, byte_buffer& out,
                    encode_stats* stats = nullptr) {
    if (header.kind != frame_kind::dense) throw error(errc::invalid_argument, "encode_dense writes dense frames");
    begin_frame();
    encode_stats local;
    for (const auto& pc : pieces) {
      check_piece(pc, /*need_old=*/false);
      const std::size_t E = element_size(pc.type);
      const std::uint64_t m = pc.end - pc.begin;
      local.elements += m;
      local.input_bytes += m * E;
      if (m == 0) continue;
      // dense values come straight from the tensor's bytes; a device backend stages them on host
      // through collect_changes against nothing would cost more, so dense input must be host memory.
      emit_item(pc, value_mode::overwrite, location_coding::all, {}, pc.new_bytes, m, local);
    }
    finish_frame(header, out, local, stats);
  }

  /// Bytes of scratch memory currently held (positions, values, planes, sections).
  std::size_t scratch_bytes() const noexcept {
    return positions_.capacity_bytes() + xor_vals_.capacity_bytes() + new_vals_.capacity_bytes() +
           planes_.capacity_bytes() + loc_raw_.capacity_bytes() + sections_.capacity_bytes();
  }

 private:
  void check_piece(const chunk_piece& pc, bool need_old) const {
    const error_context where{.file = {}, .tensor = std::string(pc.tensor), .field = "range"};
    if (pc.tensor.empty()) throw error(errc::invalid_argument, "piece without a tensor name", where);
    if (pc.begin > pc.end || pc.end > pc.tensor_elements) throw error(errc::invalid_argument, "piece range outside its tensor", where);
    const std::uint64_t m = pc.end - pc.begin;
    const std::size_t E = element_size(pc.type);
    if (m >= (1ull << 32)) throw error(errc::invalid_argument, "piece of 2^32 or more elements (plan chunks first)", where);
    if (pc.new_bytes.size() != m * E || (need_old && pc.old_bytes.size() != m * E))
      throw error(errc::invalid_argument, "piece byte spans do not hold (end - begin) elements", where);
  }

  void begin_frame() {
    items_.clear();
    section_offsets_.clear();
    sections_.clear();
  }

  void encode_piece(const chunk_piece& pc, encode_stats& st, entropy_accumulator* entropy) {
    check_piece(pc, /*need_old=*/true);
    const std::size_t E = element_size(pc.type);
    const std::uint64_t m = pc.end - pc.begin;
    st.elements += m;
    st.input_bytes += m * E;
    if (m == 0) return;
    positions_.resize_uninit(m);
    xor_vals_.resize_uninit(m * E);
    new_vals_.resize_uninit(m * E);
    auto collect = [&](std::uint64_t elems, bool want_xor, bool want_new) {
      return backend_.collect_changes(pc.old_bytes.first(elems * E), pc.new_bytes.first(elems * E), E,
                                      positions_.span().first(elems),
                                      want_xor ? xor_vals_.span().first(elems * E) : std::span<std::byte>{},
                                      want_new ? new_vals_.span().first(elems * E) : std::span<std::byte>{});
    };
    value_mode mode = options_.policy == mode_policy::overwrite_only ? value_mode::overwrite : value_mode::xor_mask;
    if (options_.policy == mode_policy::xor_allowed) {
      // Decide XOR vs overwrite on a deterministic prefix sample (both value kinds gathered for
      // it only), then gather just the chosen kind for the whole piece.
      const std::uint64_t sample = std::min<std::uint64_t>(m, std::max<std::uint64_t>(1u << 16, m / 32));
      const std::size_t cs = collect(sample, true, true);
      if (cs > 0) {
        auto ex = detail::estimate_value_bytes({xor_vals_.data(), cs * E}, E);
        auto en = detail::estimate_value_bytes({new_vals_.data(), cs * E}, E);
        if (std::min(en[0], en[1]) < std::min(ex[0], ex[1])) mode = value_mode::overwrite;
      }
    }
    const bool want_xor = mode == value_mode::xor_mask || entropy != nullptr;
    const bool want_new = mode == value_mode::overwrite;
    const std::size_t c = collect(m, want_xor, want_new);
    if (entropy) entropy->add(E, m, {xor_vals_.data(), c * E});
    if (c == 0) return;
    const std::span<const std::uint32_t> pos{positions_.data(), c};
    const std::span<const std::byte> vals{(mode == value_mode::xor_mask ? xor_vals_ : new_vals_).data(), c * E};
    emit_item(pc, mode, choose_location_coding(pos, m), pos, vals, c, st);
  }

  void emit_item(const chunk_piece& pc, value_mode mode, location_coding lc, std::span<const std::uint32_t> pos,
                 std::span<const std::byte> vals, std::uint64_t c, encode_stats& st) {
    const std::size_t E = element_size(pc.type);
    const std::uint64_t m = pc.end - pc.begin;
    frame_item it;
    it.tensor = std::string(pc.tensor);
    it.type = pc.type;
    it.mode = mode;
    it.locations = lc;
    it.tensor_elements = pc.tensor_elements;
    it.begin = pc.begin;
    it.end = pc.end;
    it.changed = c;

    loc_raw_.clear();
    encode_locations(lc, pos, m, loc_raw_);
    it.location_raw_size = loc_raw_.size();
    it.location_stored_size = store_section(loc_raw_.span(), it.location_compression);

    std::span<const std::byte> raw_vals = vals;
    it.values = value_coding::interleaved;
    if (E > 1) {
      auto est = detail::estimate_value_bytes(vals, E);
      if (est[1] < est[0]) {
        planes_.resize_uninit(vals.size());
        detail::split_planes(vals, E, planes_.data());
        raw_vals = planes_.span();
        it.values = value_coding::byte_planes;
      }
    }
    it.value_raw_size = raw_vals.size();
    it.value_stored_size = store_section(raw_vals, it.value_compression, it.values == value_coding::byte_planes ? E : 1);

    st.changed += c;
    st.items += 1;
    st.xor_items += mode == value_mode::xor_mask;
    st.location_bytes += it.location_stored_size;
    st.value_bytes += it.value_stored_size;
    st.location_codings[static_cast<std::size_t>(lc)] += 1;
    items_.push_back(std::move(it));
  }

  // Appends the section to sections_ and returns its stored size: a sequence of zstd frames, one
  // per part (one part, or one per byte plane), else the raw bytes when zstd does not make the
  // section smaller. zstd decodes concatenated frames as one stream, so the format is unchanged.
  std::uint64_t store_section(std::span<const std::byte> raw, section_compression& how, std::size_t parts = 1) {
    const std::size_t start = sections_.size();
    section_offsets_.push_back(start);
    how = section_compression::raw;
    if (raw.empty()) return 0;
    const std::size_t part = raw.size() / parts;
    for (std::size_t k = 0; k < parts; ++k) compress_best(raw.subspan(k * part, k + 1 == parts ? raw.size() - k * part : part));
    const std::size_t n = sections_.size() - start;
    if (n < raw.size()) {
      how = section_compression::zstd;
      return n;
    }
    sections_.resize_uninit(start);
    sections_.append(raw);
    return raw.size();
  }

  // Appends one zstd frame of `raw`. Candidates: zstd's literals profile (order-0 entropy coding,
  // fast) and zstd at the configured level (matching: wins on skewed or repetitive streams such
  // as a mostly-zero byte plane). The level is tried only when the literals frame is clearly above
  // the stream's order-0 estimate, so memoryless streams cost one fast pass. Deterministic.
  void compress_best(std::span<const std::byte> raw) {
    const std::size_t start = sections_.size();
    const double est = detail::estimate_stream_bytes(raw);
    if (est * 16.0 < static_cast<double>(raw.size())) {
      // under half a bit per byte: an order-0 Huffman coder spends at least one bit per byte, so
      // only matching can get near the estimate (a mostly-zero byte plane); skip the literals try
      zstd_.compress_append(raw, options_.zstd_level, sections_);
      return;
    }
    std::size_t best = zstd_.compress_literals_append(raw, options_.zstd_level, sections_);
    if (static_cast<double>(best) > 1.10 * est + 64.0) {
      const std::size_t alt_start = sections_.size();
      const std::size_t n = zstd_.compress_append(raw, options_.zstd_level, sections_);
      if (n < best) {
        std::memmove(sections_.data() + start, sections_.data() + alt_start, n);
        best = n;
      }
      sections_.resize_uninit(start + best);
    }
  }

  void finish_frame(const frame_header& header, byte_buffer& out, encode_stats& local, encode_stats* stats) {
    std::vector<std::span<const std::byte>> secs;
    secs.reserve(section_offsets_.size());
    for (std::size_t i = 0; i < section_offsets_.size(); ++i) {
      const std::size_t b = section_offsets_[i];
      const std::size_t e = i + 1 < section_offsets_.size() ? section_offsets_[i + 1] : sections_.size();
      secs.emplace_back(sections_.data() + b, e - b);
    }
    write_frame(header, items_, secs, out);
    local.frames = 1;
    local.frame_bytes = out.size();
    if (stats) *stats += local;
  }

  encode_options options_;
  Backend backend_;
  zstd_compressor zstd_;
  scratch_buffer<std::uint32_t> positions_;
  byte_buffer xor_vals_, new_vals_, planes_, loc_raw_, sections_;
  std::vector<frame_item> items_;
  std::vector<std::size_t> section_offsets_;
};

}  // namespace bitrefit::codec
