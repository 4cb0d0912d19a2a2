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
#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/base_classes.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/conditioned.hpp"
#include "bitrefit/codec/fixed_log2.hpp"
#include "bitrefit/codec/entropy.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/codec/value_planes.hpp"
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

/// One canonical range of one tensor whose changes are already KNOWN (the owner's frozen change
/// set): the base bits of [begin, end) plus the changed elements there, so the encoder skips
/// change detection (encode_known). The frame is byte-identical to encode() of the same range
/// with old = the base and new = the base with the changes applied: XOR values and the
/// base-conditioned classes need the base bits, which is why the whole range's base comes along.
struct known_changes_piece {
  std::string_view tensor;
  dtype type = dtype::U8;
  std::uint64_t tensor_elements = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::span<const std::byte> old_bytes;      // base bits of [begin, end), in the backend's memory space
  std::span<const std::uint64_t> positions;  // strictly ascending TENSOR element indices in [begin, end)
  std::span<const std::byte> new_values;     // positions.size() * element_size bytes: the new bits, host memory
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
  std::uint64_t conditioned_items = 0;
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
    conditioned_items += o.conditioned_items;
    frame_bytes += o.frame_bytes;
    location_bytes += o.location_bytes;
    value_bytes += o.value_bytes;
    for (std::size_t i = 0; i < location_codings.size(); ++i) location_codings[i] += o.location_codings[i];
    return *this;
  }
};

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

  /// Encodes the delta base -> base + changes of `pieces` as one frame, from changes already
  /// known (no change detection): byte for byte the frame encode() writes for the same ranges with
  /// old = base and new = base with the changes applied (same mode choice, sample and sections).
  /// A listed change whose new bits equal the base's is no change and is skipped, as encode() would
  /// never see it. Retries under overwrite_only stay absolute (new bits), as in encode().
  /// Work is O(changes) plus the passes over the base that the chosen coding itself needs
  /// (base-conditioned class ranks); memory is the encoder's scratch, O(changes in the chunk).
  /// @throws errc::invalid_argument when a piece's positions are not strictly ascending inside
  ///         [begin, end) or its value or base spans have the wrong size (naming the tensor).
  void encode_known(const frame_header& header, std::span<const known_changes_piece> pieces, byte_buffer& out,
                    encode_stats* stats = nullptr) {
    if (header.kind != frame_kind::delta) throw error(errc::invalid_argument, "encode_known writes delta frames; use encode_dense");
    begin_frame();
    encode_stats local;
    for (const auto& kp : pieces) {
      check_known(kp);
      const chunk_piece pc{.tensor = kp.tensor, .type = kp.type, .tensor_elements = kp.tensor_elements, .begin = kp.begin, .end = kp.end,
                           .old_bytes = kp.old_bytes, .new_bytes = {}};
      known_ = known_view{kp.positions, kp.new_values, backend_.host_bytes(kp.old_bytes, known_base_)};
      struct reset {
        std::optional<known_view>& k;
        ~reset() { k.reset(); }
      } guard{known_};
      encode_piece(pc, local, stats ? stats->entropy : nullptr);
    }
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

  /// Bytes of scratch memory currently held (slices, gathered changes, planes, sections, coder).
  std::size_t scratch_bytes() const noexcept {
    return positions_.capacity_bytes() + vals_.capacity_bytes() + old_vals_.capacity_bytes() + classes_.capacity_bytes() +
           ranks_.capacity_bytes() + slice_pos_.capacity_bytes() + slice_xor_.capacity_bytes() + slice_new_.capacity_bytes() +
           sample_pos_.capacity_bytes() + sample_xor_.capacity_bytes() + sample_new_.capacity_bytes() +
           sample_old_.capacity_bytes() + sample_cls_.capacity_bytes() + sample_base_.capacity_bytes() +
           planes_.capacity_bytes() + loc_raw_.capacity_bytes() + sections_.capacity_bytes() + known_base_.capacity_bytes() +
           conditioned_.scratch_bytes();
  }

 private:
  void check_piece(const chunk_piece& pc, bool need_old) const {
    const error_context where{.file = {}, .tensor = std::string(pc.tensor), .field = "range"};
    if (pc.tensor.empty()) throw error(errc::invalid_argument, "piece without a tensor name", where);
    if (pc.begin > pc.end || pc.end > pc.tensor_elements) throw error(errc::invalid_argument, "piece range outside its tensor", where);
    const std::uint64_t m = pc.end - pc.begin;
    const std::size_t E = element_size(pc.type);
    if (m >= (1ull << 32)) throw error(errc::invalid_argument, "piece of 2^32 or more elements (plan chunks first)", where);
    if ((!known_ && pc.new_bytes.size() != m * E) || (need_old && pc.old_bytes.size() != m * E))
      throw error(errc::invalid_argument, "piece byte spans do not hold (end - begin) elements", where);
  }

  void check_known(const known_changes_piece& kp) const {
    const error_context where{.file = {}, .tensor = std::string(kp.tensor), .field = "changes"};
    const std::size_t E = element_size(kp.type);
    if (kp.new_values.size() != kp.positions.size() * E)
      throw error(errc::invalid_argument, "known changes: value bytes do not match the position count", where);
    for (std::size_t k = 0; k < kp.positions.size(); ++k)
      if (kp.positions[k] < kp.begin || kp.positions[k] >= kp.end || (k > 0 && kp.positions[k] <= kp.positions[k - 1]))
        throw error(errc::invalid_argument, "known changes: positions not strictly ascending inside the piece's range", where);
  }

  // The changes of a known_changes_piece while it is encoded (encode_known): its positions, new
  // bits and the base bits of its range in host memory.
  struct known_view {
    std::span<const std::uint64_t> positions;
    std::span<const std::byte> values;
    std::span<const std::byte> base;  // host copy (or the bytes themselves) of the range's base bits
  };

  // Change detection of elements [at, at + n) of the piece (relative to its begin), with
  // collect_changes' contract (positions relative to `at`, XOR masks and/or new bits): by the
  // backend from old/new bytes, or read off the known changes (encode_known). One source for
  // both, so every later step, and so every frame byte, is the same for the same old/new.
  std::size_t collect(const chunk_piece& pc, std::uint64_t at, std::size_t n, std::size_t E, std::span<std::uint32_t> pos,
                      std::span<std::byte> xor_out, std::span<std::byte> new_out) {
    if (!known_)
      return backend_.collect_changes(pc.old_bytes.subspan(at * E, n * E), pc.new_bytes.subspan(at * E, n * E), E, pos, xor_out, new_out);
    const auto& kv = *known_;
    const std::uint64_t lo = pc.begin + at;
    const std::size_t k0 = static_cast<std::size_t>(std::lower_bound(kv.positions.begin(), kv.positions.end(), lo) - kv.positions.begin());
    const std::size_t k1 = static_cast<std::size_t>(std::lower_bound(kv.positions.begin() + k0, kv.positions.end(), lo + n) - kv.positions.begin());
    switch (E) {  // element-width loops the compiler unrolls to integer loads (E is 1, 2, 4 or 8)
      case 1: return gather_known<std::uint8_t>(kv, pc.begin, lo, k0, k1, pos, xor_out, new_out);
      case 2: return gather_known<std::uint16_t>(kv, pc.begin, lo, k0, k1, pos, xor_out, new_out);
      case 4: return gather_known<std::uint32_t>(kv, pc.begin, lo, k0, k1, pos, xor_out, new_out);
      default: return gather_known<std::uint64_t>(kv, pc.begin, lo, k0, k1, pos, xor_out, new_out);
    }
  }

  // The old and new bits of the c changed elements at `pos` of a slice (old, neu: its bytes).
  template <class W>
  static void gather_changed(const std::byte* old, const std::byte* neu, const std::uint32_t* pos, std::size_t c, std::byte* old_out,
                             std::byte* new_out) noexcept {
    constexpr std::size_t E = sizeof(W);
    for (std::size_t k = 0; k < c; ++k) {
      W o, v;
      std::memcpy(&o, old + std::size_t{pos[k]} * E, E);
      std::memcpy(&v, neu + std::size_t{pos[k]} * E, E);
      std::memcpy(old_out + k * E, &o, E);
      std::memcpy(new_out + k * E, &v, E);
    }
  }

  // Known changes [k0, k1) as collect_changes would report them for elements from tensor index
  // `lo` on: positions relative to lo, XOR masks and/or new bits; an entry equal to its base is
  // skipped (no change).
  template <class W>
  static std::size_t gather_known(const known_view& kv, std::uint64_t begin, std::uint64_t lo, std::size_t k0, std::size_t k1,
                                  std::span<std::uint32_t> pos, std::span<std::byte> xor_out, std::span<std::byte> new_out) {
    constexpr std::size_t E = sizeof(W);
    const std::byte* base = kv.base.data();
    const std::byte* vals = kv.values.data();
    std::byte* xo = xor_out.empty() ? nullptr : xor_out.data();
    std::byte* no = new_out.empty() ? nullptr : new_out.data();
    std::size_t c = 0;
    for (std::size_t k = k0; k < k1; ++k) {
      const std::uint64_t p = kv.positions[k];
      // the base word 32 changes ahead, requested now: these reads are scattered over a base in
      // memory (not a slice in cache as after detection), and this loop alone kept too few misses
      // in flight (bench 256 MiB, four alternated runs: encode_known_s 0.048-0.049 -> 0.044-0.045 s
      // at 5 %, 0.057-0.060 -> 0.052 s at adamw)
      if (k + 32 < k1) __builtin_prefetch(base + (kv.positions[k + 32] - begin) * E);
      W o, v;
      std::memcpy(&o, base + (p - begin) * E, E);
      std::memcpy(&v, vals + k * E, E);
      if (o == v) [[unlikely]] continue;  // not a change: encode() would not see it
      pos[c] = static_cast<std::uint32_t>(p - lo);
      if (xo) {
        const W x = static_cast<W>(o ^ v);
        std::memcpy(xo + c * E, &x, E);
      }
      if (no) std::memcpy(no + c * E, &v, E);
      ++c;
    }
    return c;
  }

  void begin_frame() {
    items_.clear();
    section_offsets_.clear();
    sections_.clear();
  }

  // Changed elements are gathered slice by slice (slice_bytes of input per side, small enough to
  // stay in cache between change detection and class ranking), appended to buffers that grow with
  // the number of CHANGED elements only: the encoder's scratch is O(changes in the chunk), not
  // O(chunk) (it was 4.3x the chunk's input with whole-chunk position/value buffers).
  static constexpr std::size_t slice_bytes = std::size_t{128} << 10;

  // The mode decision looks at a sample: `sample_blocks` evenly spaced runs of `sample_run`
  // elements (the whole piece when it is smaller), so a piece whose statistics drift along its
  // range is judged by all of it. Deterministic.
  static constexpr std::size_t sample_blocks = 64, sample_run = 1024;

  // Cost of one more base class in the sample's units (1/256 bits), against sampling noise (see
  // choose_mode). 8 bits: on bitrefit-bench-codec --change 0.01..0.1 (seeds 2-5) the bytes are the
  // same at 8 as at 64 bits, while at 0 or 4 bits some items keep 2-4 classes; AdamW bytes are the
  // same at 0, 8, 16 and 32 bits (bench/codec/README.md, "One class when ...").
  static constexpr std::uint64_t class_noise_q8 = 8 * 256;

  struct mode_choice {
    value_mode mode = value_mode::xor_mask;
    class_spec spec;
  };

  // Estimated sizes (1/256 bits) of the sample under each mode, extrapolated to the piece; the
  // smallest allowed one wins. XOR and overwrite: n·H(c/n) for the gap-coded positions (zstd's
  // Huffman coder spends about 1/32 more) + the value estimate of the existing byte-plane model;
  // base-conditioned: conditioned_cost_q8 + its per-class tables.
  mode_choice choose_mode(const chunk_piece& pc, std::size_t E, std::uint64_t m) {
    mode_choice r;
    r.mode = options_.policy == mode_policy::overwrite_only ? value_mode::overwrite : value_mode::xor_mask;
    const auto fmt = float_format_of(pc.type);
    const bool cond_ok = fmt && ((options_.policy == mode_policy::xor_allowed && options_.base_conditioned) ||
                                 options_.policy == mode_policy::conditioned_only);
    if (options_.policy == mode_policy::conditioned_only && !fmt) return r;  // non-float: XOR
    if (options_.policy != mode_policy::xor_allowed && !cond_ok) return r;
    // gather the sample: positions (relative to the run), XOR and new values
    const std::size_t runs = m <= sample_blocks * sample_run ? 1 : sample_blocks;
    const std::size_t run = runs == 1 ? static_cast<std::size_t>(m) : sample_run;
    const std::uint64_t stride = runs == 1 ? 0 : (m - run) / (runs - 1);
    sample_pos_.resize_uninit(runs * run);
    sample_xor_.resize_uninit(runs * run * E);
    sample_new_.resize_uninit(runs * run * E);
    slice_pos_.resize_uninit(run);
    std::size_t cs = 0;
    std::uint64_t n_sample = 0;
    std::vector<std::uint64_t> base_exp, changed_exp;
    if (cond_ok) base_exp.assign(fmt->exponents(), 0), changed_exp.assign(fmt->exponents(), 0);
    for (std::size_t k = 0; k < runs; ++k) {
      const std::uint64_t at = k * stride;
      const std::size_t c = collect(pc, at, run, E, slice_pos_.span(), {sample_xor_.data() + cs * E, run * E},
                                    {sample_new_.data() + cs * E, run * E});
      n_sample += run;
      if (cond_ok) {
        const std::span<const std::byte> base = backend_.host_bytes(pc.old_bytes.subspan(at * E, run * E), sample_base_);
        // typed loads (a load of runtime width E was a memcpy call per element: ~6 % of encode at 1 %)
        detail::with_word(E, [&](auto w) {
          using W = decltype(w);
          for (std::size_t i = 0; i < run; ++i) ++base_exp[fmt->exponent(detail::load_word<W>(base.data(), i))];
          const std::byte* x = sample_xor_.data() + cs * E;
          const std::byte* nw = sample_new_.data() + cs * E;
          for (std::size_t i = 0; i < c; ++i) ++changed_exp[fmt->exponent(static_cast<std::uint64_t>(detail::load_word<W>(x, i) ^ detail::load_word<W>(nw, i)))];
        });
      }
      cs += c;
    }
    const std::span<const std::byte> sx{sample_xor_.data(), cs * E}, sn{sample_new_.data(), cs * E};
    // value estimates of the existing coder (bytes), positions as ideal gap coding
    const auto ex = detail::estimate_value_bytes(sx, E), en = detail::estimate_value_bytes(sn, E);
    const auto q8 = [](double bytes) { return static_cast<std::uint64_t>(bytes * 2048.0); };
    const std::uint64_t pos_q8 = binary_entropy_q8(n_sample, cs) + binary_entropy_q8(n_sample, cs) / 32;
    const std::uint64_t xor_q8 = pos_q8 + q8(std::min(ex[0], ex[1]));
    const std::uint64_t ow_q8 = pos_q8 + q8(std::min(en[0], en[1]));
    if (options_.policy == mode_policy::xor_allowed && ow_q8 < xor_q8) r.mode = value_mode::overwrite;
    if (!cond_ok || (cs == 0 && options_.policy != mode_policy::conditioned_only)) return r;
    // base-conditioned: classes from the sample, then its estimated cost (per class about 40
    // bytes: its two predicted tables, 26 bytes on average over a real AdamW run's BF16 classes
    // (bench/codec/README.md, "Predicted tables"), the two streams' final states (8) and its
    // counts, shift and lengths (~6))
    // Each class also pays `class_noise_q8` in sample units: the class choice fits its cuts to the
    // sample, and on changes that do not depend on the base value at all (1-5 % synthetic flips)
    // the best of ~63 cuts still "gains" a few bits from sampling noise, so noise-only classes were
    // chosen (K = 3-4 at 3 %). They saved no bytes at full size but made the encoder and decoder
    // scan the whole base for class ranks, which one class does not need (rank_by_class).
    const std::uint64_t table_q8 = 40 * 8 * 256;
    r.spec = choose_class_spec(*fmt, base_exp, changed_exp, options_.max_base_classes, 1, 1, table_q8 * n_sample / m + class_noise_q8);
    if (options_.policy == mode_policy::conditioned_only) {
      r.mode = value_mode::base_conditioned;
      return r;
    }
    std::array<std::uint64_t, max_base_classes> n_k{};
    for (std::size_t e = 0; e < base_exp.size(); ++e) n_k[r.spec.class_of_exponent(e)] += base_exp[e];
    sample_cls_.resize_uninit(cs);
    sample_old_.resize_uninit(cs * E);
    for (std::size_t i = 0; i < cs; ++i) {
      const std::uint64_t o = conditioned_detail::load_bits(sx.data() + i * E, static_cast<unsigned>(E)) ^
                              conditioned_detail::load_bits(sn.data() + i * E, static_cast<unsigned>(E));
      conditioned_detail::store_bits(sample_old_.data() + i * E, o, static_cast<unsigned>(E));
      sample_cls_[i] = static_cast<std::uint8_t>(r.spec.class_of_exponent(fmt->exponent(o)));
    }
    const std::uint64_t cond_q8 = conditioned_cost_q8(*fmt, r.spec, n_k, sample_cls_.span(), {sample_old_.data(), cs * E}, sn);
    // extrapolate the sample to the piece, add the conditioned item's fixed overhead
    const auto scale = [&](std::uint64_t v) { return static_cast<std::uint64_t>(static_cast<unsigned __int128>(v) * m / n_sample); };
    const std::uint64_t best_other = scale(std::min(xor_q8, ow_q8));
    if (scale(cond_q8) + r.spec.count * table_q8 < best_other) r.mode = value_mode::base_conditioned;
    return r;
  }

  void encode_piece(const chunk_piece& pc, encode_stats& st, entropy_accumulator* entropy) {
    check_piece(pc, /*need_old=*/true);
    const std::size_t E = element_size(pc.type);
    const std::uint64_t m = pc.end - pc.begin;
    st.elements += m;
    st.input_bytes += m * E;
    if (m == 0) return;
    const mode_choice choice = choose_mode(pc, E, m);
    const value_mode mode = choice.mode;
    const bool cond = mode == value_mode::base_conditioned;
    // Base-conditioned items detected here read the changed elements' old and new bits back from
    // the slice by position after detection (from L2): at a few % changes that is ~2 loads and 2
    // stores per change, where compressing XOR words and new bits out of every 64-byte block cost
    // two vpcompress and two 64-byte stores per block. Known changes and the entropy statistics
    // still take the XOR words from the collection.
    const bool values_by_position = cond && !known_ && entropy == nullptr;
    const bool want_xor = !values_by_position && (mode == value_mode::xor_mask || cond || entropy != nullptr);
    const bool want_new = !values_by_position && (mode == value_mode::overwrite || cond);
    const auto fmt = float_format_of(pc.type);
    if constexpr (preparing_backend<Backend>) {
      // the backend prepares the whole item where its tensors live; positions never leave it
      // (known changes are host data already: they take the host path below, same bytes by law 7/8)
      if (known_) {
      } else if (cond) {
        const std::size_t c = backend_.prepare_conditioned(pc.old_bytes, pc.new_bytes, *fmt, choice.spec, prepared_cond_, entropy);
        if (c) emit_conditioned(pc, *fmt, choice.spec, prepared_cond_.classes.span(), prepared_cond_.ranks.span(),
                                prepared_cond_.old_values.span(), prepared_cond_.new_values.span(), c, st);
      } else {
        const std::size_t c = backend_.prepare_plain(pc.old_bytes, pc.new_bytes, E, mode, prepared_plain_, entropy);
        if (c) emit_sections(pc, mode, prepared_plain_.locations, prepared_plain_.location_raw.span(), prepared_plain_.values,
                             prepared_plain_.value_raw.span(), c, st);
      }
      if (!known_) return;
    }
    // gather the changes slice by slice
    const std::size_t slice = std::max<std::size_t>(64, slice_bytes / E);
    slice_pos_.resize_uninit(std::min<std::uint64_t>(slice, m));
    slice_xor_.resize_uninit(want_xor ? std::min<std::uint64_t>(slice, m) * E : 0);
    slice_new_.resize_uninit(want_new ? std::min<std::uint64_t>(slice, m) * E : 0);
    positions_.clear();
    vals_.clear();
    old_vals_.clear();
    classes_.clear();
    ranks_.clear();
    std::array<std::uint64_t, max_base_classes> totals{};
    for (std::uint64_t off = 0; off < m; off += slice) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(slice, m - off));
      const auto old_s = pc.old_bytes.subspan(off * E, n * E);
      const std::size_t c = collect(pc, off, n, E, slice_pos_.span().first(n),
                                    want_xor ? slice_xor_.span().first(n * E) : std::span<std::byte>{},
                                    want_new ? slice_new_.span().first(n * E) : std::span<std::byte>{});
      if (entropy) entropy->add(E, n, {slice_xor_.data(), c * E});
      // A base-conditioned item's slice goes to rank_by_class even without changes: its elements
      // are in the class totals that later slices' ranks start from, as the decoder, which ranks
      // over the whole range, counts them (skipped, every later change was ranked short and landed
      // on the wrong element).
      if (c == 0 && !cond) continue;
      const std::size_t at = cond ? classes_.size() : positions_.size();
      if (!cond) {  // base-conditioned items are coded from class ranks: no positions kept
        positions_.resize_uninit(at + c);
        for (std::size_t k = 0; k < c; ++k) positions_[at + k] = static_cast<std::uint32_t>(off + slice_pos_[k]);
      }
      if (cond) {
        // the changes' old and new bits first: the class ranks read the classes from the old bits
        // (one load per sixteen changes) instead of gathering them from the base slice again
        old_vals_.resize_uninit((at + c) * E);
        if (values_by_position) {
          vals_.resize_uninit((at + c) * E);
          detail::with_word(E, [&](auto w) {
            gather_changed<decltype(w)>(old_s.data(), pc.new_bytes.data() + off * E, slice_pos_.data(), c, old_vals_.data() + at * E,
                                        vals_.data() + at * E);
          });
        } else {
          vals_.append({slice_new_.data(), c * E});
          // plain pointers: through the members, each byte store could alias them (no vectorising)
          std::byte* o = old_vals_.data() + at * E;
          const std::byte* x = slice_xor_.data();
          const std::byte* nw = slice_new_.data();
          for (std::size_t k = 0; k < c * E; ++k) o[k] = x[k] ^ nw[k];
        }
        classes_.resize_uninit(at + c);
        ranks_.resize_uninit(at + c);
        backend_.rank_by_class(old_s, *fmt, choice.spec, slice_pos_.span().first(c), {old_vals_.data() + at * E, c * E},
                               classes_.span().subspan(at, c), ranks_.span().subspan(at, c), totals);
      } else {
        vals_.append({(mode == value_mode::xor_mask ? slice_xor_ : slice_new_).data(), c * E});
      }
    }
    const std::size_t c = cond ? classes_.size() : positions_.size();
    if (c == 0) return;
    const std::span<const std::uint32_t> pos{positions_.data(), cond ? 0 : c};
    if (cond) {
      emit_conditioned(pc, *fmt, choice.spec, classes_.span(), ranks_.span(), old_vals_.span(), vals_.span(), c, st);
      return;
    }
    emit_item(pc, mode, choose_location_coding(pos, m), pos, vals_.span(), c, st);
  }

  void emit_conditioned(const chunk_piece& pc, const float_format& fmt, const class_spec& spec, std::span<const std::uint8_t> classes,
                        std::span<const std::uint32_t> ranks, std::span<const std::byte> old_vals, std::span<const std::byte> new_vals,
                        std::uint64_t c, encode_stats& st) {
    frame_item it;
    it.tensor = std::string(pc.tensor);
    it.type = pc.type;
    it.mode = value_mode::base_conditioned;
    it.locations = location_coding::class_gaps;
    it.values = value_coding::ulp_distance;
    it.tensor_elements = pc.tensor_elements;
    it.begin = pc.begin;
    it.end = pc.end;
    it.changed = c;
    loc_raw_.clear();
    planes_.clear();
    conditioned_.encode(fmt, spec, classes, ranks, old_vals, new_vals, loc_raw_, planes_);
    section_offsets_.push_back(sections_.size());
    sections_.append(loc_raw_.span());
    section_offsets_.push_back(sections_.size());
    sections_.append(planes_.span());
    it.location_raw_size = it.location_stored_size = loc_raw_.size();
    it.value_raw_size = it.value_stored_size = planes_.size();
    st.changed += c;
    st.items += 1;
    st.conditioned_items += 1;
    st.location_bytes += it.location_stored_size;
    st.value_bytes += it.value_stored_size;
    st.location_codings[static_cast<std::size_t>(location_coding::class_gaps)] += 1;
    items_.push_back(std::move(it));
  }

  // Host path: location section and value section (interleaved or byte planes) from the gathered
  // positions and values, then emit_sections.
  void emit_item(const chunk_piece& pc, value_mode mode, location_coding lc, std::span<const std::uint32_t> pos,
                 std::span<const std::byte> vals, std::uint64_t c, encode_stats& st) {
    const std::size_t E = element_size(pc.type);
    loc_raw_.clear();
    encode_locations(lc, pos, pc.end - pc.begin, loc_raw_);
    std::span<const std::byte> raw_vals = vals;
    value_coding vc = value_coding::interleaved;
    if (E > 1) {
      auto est = detail::estimate_value_bytes(vals, E);  // same choice as choose_byte_planes on the value_sample
      if (est[1] < est[0]) {
        planes_.resize_uninit(vals.size());
        detail::split_planes(vals, E, planes_.data());
        raw_vals = planes_.span();
        vc = value_coding::byte_planes;
      }
    }
    emit_sections(pc, mode, lc, loc_raw_.span(), vc, raw_vals, c, st);
  }

  // One XOR or overwrite item from its raw sections (however they were prepared): compression,
  // descriptor, stats.
  void emit_sections(const chunk_piece& pc, value_mode mode, location_coding lc, std::span<const std::byte> loc_raw,
                     value_coding vc, std::span<const std::byte> val_raw, std::uint64_t c, encode_stats& st) {
    const std::size_t E = element_size(pc.type);
    frame_item it;
    it.tensor = std::string(pc.tensor);
    it.type = pc.type;
    it.mode = mode;
    it.locations = lc;
    it.tensor_elements = pc.tensor_elements;
    it.begin = pc.begin;
    it.end = pc.end;
    it.changed = c;
    it.location_raw_size = loc_raw.size();
    it.location_stored_size = store_section(loc_raw, it.location_compression);
    it.values = vc;
    it.value_raw_size = val_raw.size();
    it.value_stored_size = store_section(val_raw, it.value_compression, vc == value_coding::byte_planes ? E : 1);
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
  conditioned_encoder conditioned_;
  scratch_buffer<std::uint32_t> positions_, slice_pos_, sample_pos_, ranks_;
  scratch_buffer<std::uint8_t> classes_, sample_cls_;
  byte_buffer vals_, old_vals_, slice_xor_, slice_new_, sample_xor_, sample_new_, sample_old_, sample_base_;
  byte_buffer planes_, loc_raw_, sections_;
  prepared_plain prepared_plain_;               // preparing backends only
  prepared_conditioned prepared_cond_;
  std::vector<frame_item> items_;
  std::vector<std::size_t> section_offsets_;
  std::optional<known_view> known_;  // set while encode_known encodes a piece
  byte_buffer known_base_;           // host copy of a known piece's base (device backends only)
};

}  // namespace bitrefit::codec
