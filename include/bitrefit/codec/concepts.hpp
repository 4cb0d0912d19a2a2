// bitrefit/codec/concepts.hpp — the execution-backend seam of the codec.
//
// The codec splits into (a) backend-independent host code that owns the payload frame format,
// location coding, byte planes, zstd, verification and the apply rules, and (b) an *execution
// backend* that performs the only operations that touch the tensors' memory. A backend never
// sees a frame and never decides anything about the format, so a new backend (the Thrust one:
// CUDA, OMP, CPP systems) cannot change the bytes on the wire or the apply semantics.
//
// Memory spaces. "Tensor bytes" (`old`, `neu`, `target`, the bytes to hash) live in the backend's
// memory space (host memory for host_backend, device memory for a CUDA backend). Every other span
// (positions, values, digests) is ordinary host memory owned by the caller: compacted streams are
// the only data that crosses between the spaces.
//
// The four primitives and their laws (E = element size in bytes, 1, 2, 4 or 8; m = old.size()/E):
//
//  1. collect_changes(old, neu, E, positions, xor_out, new_out) -> c
//       @pre old.size() == neu.size(), old.size() % E == 0, m < 2^32,
//            positions.size() >= m, xor_out.size() is 0 or >= m*E, new_out.size() is 0 or >= m*E.
//       @post c = number of elements i with bytes(old,i) != bytes(neu,i) (stored bits: -0.0 vs +0.0
//             and NaN payloads differ); positions[0..c) are exactly those i, strictly ascending;
//             if xor_out is non-empty, xor_out[k*E..k*E+E) = bytes(old,p_k) ^ bytes(neu,p_k);
//             if new_out is non-empty, new_out[k*E..k*E+E) = bytes(neu,p_k). Nothing else written,
//             except zeros past entry c inside the outputs' required sizes (m positions, m*E
//             bytes): the vector kernels store whole registers at the output cursor.
//       Law: deterministic (same inputs, same outputs) and identical on every backend.
//
//  2. apply_changes(target, E, mode, positions, values)
//       @pre the frame these came from was fully verified: positions strictly ascending,
//            every p < target.size()/E, values.size() == positions.size()*E.
//       @post for each k: bytes(target,p_k) = values_k (overwrite) or bytes(target,p_k) ^= values_k
//             (xor_mask); every other byte of target unchanged. The call is complete (device
//             synchronised) when it returns.
//       Laws: overwrite applied twice == once; xor applied to bytes(old) with values from
//             collect_changes(old, neu) yields neu.
//
//  3. hash_slices(bytes, slice_bytes, out)
//       @pre slice_bytes > 0, out.size() == ceil(bytes.size() / slice_bytes).
//       @post out[j] = XXH3-128 (seed 0) of bytes[j*slice_bytes, min((j+1)*slice_bytes, size)).
//       Law: bit-identical to the host's XXH3_128bits on every backend.
//
//  4. name() -> a short stable name ("host", "thrust-cpp", ...), used by benches and reports.
//
//  5. host_bytes(bytes, scratch) -> span
//       @post the result holds exactly `bytes`' content in host memory: `bytes` itself when the
//             backend's tensors live in host memory, else a copy in `scratch` (resized to fit).
//       Used by the decoder of base-conditioned items, which reads the base bits of an item range.
//
//  6. rank_by_class(base, format, spec, positions, base_at_positions, classes_out, ranks_out, totals)
//       @pre base holds m elements of `format` (in the backend's memory space), positions strictly
//            ascending and < m, outputs at least positions.size() long, totals.size() >= spec.count;
//            base_at_positions (host memory) is empty or holds the base elements at the positions,
//            in order (a hint: the host backend reads classes from it instead of the base).
//       @post exactly base_classes.hpp's rank_by_class: classes_out[k] = the class of base element
//             p_k, ranks_out[k] = totals[class] + same-class elements before p_k; then totals[k] +=
//             the range's elements of class k. Law: identical on every backend, with or without
//             base_at_positions.
//
// Optional (preparing_backend): a backend whose tensors live elsewhere (device memory) prepares
// whole items there, so positions never cross to host memory — only what goes into the frame:
//
//  7. prepare_plain(old, neu, E, mode, out, entropy) -> c
//       For an XOR (mode xor_mask) or overwrite item of the range: c changed elements; out holds
//       the location coding chosen by choose_location_coding(location sizes, c, m) and its raw
//       section, and the values (XOR masks or new bits) as byte planes iff choose_byte_planes on
//       their value_sample, else interleaved. If `entropy` is set, it gets every XOR mask.
//       Law: byte-identical to what the encoder's host path computes from collect_changes.
//  8. prepare_conditioned(old, neu, format, spec, out, entropy) -> c
//       For a base-conditioned item: per change (ascending position) its class and class rank
//       (as rank_by_class) and its old and new bits. Same law.
//
// Everything else — location coding (runs, gaps, bitmaps) from positions, byte-plane splitting
// and merging of the compacted values, zstd, the frame layout and digest, verification before
// any write, chunk planning — is shared host code in encoder.hpp / apply.hpp / frame.hpp.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "bitrefit/codec/base_classes.hpp"
#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/codec/types.hpp"
#include "bitrefit/codec/ulp.hpp"
#include "bitrefit/core/digest.hpp"

namespace bitrefit::codec {

template <class B>
concept execution_backend = requires(B& b, std::span<const std::byte> cbytes, std::span<std::byte> mbytes,
                                     std::size_t n, std::span<std::uint32_t> pos_out,
                                     std::span<const std::uint32_t> pos, value_mode mode,
                                     std::span<digest128> digests, byte_buffer& scratch, const float_format& fmt,
                                     const class_spec& spec, std::span<std::uint8_t> classes,
                                     std::span<std::uint32_t> ranks, std::span<std::uint64_t> totals) {
  { B::name() } -> std::convertible_to<std::string_view>;
  { b.collect_changes(cbytes, cbytes, n, pos_out, mbytes, mbytes) } -> std::same_as<std::size_t>;
  { b.apply_changes(mbytes, n, mode, pos, cbytes) } -> std::same_as<void>;
  { b.hash_slices(cbytes, n, digests) } -> std::same_as<void>;
  { b.host_bytes(cbytes, scratch) } -> std::same_as<std::span<const std::byte>>;
  { b.rank_by_class(cbytes, fmt, spec, pos, cbytes, classes, ranks, totals) } -> std::same_as<void>;
};

/// What a preparing backend hands the encoder for an XOR or overwrite item (host memory).
struct prepared_plain {
  location_coding locations = location_coding::gaps8;
  byte_buffer location_raw;
  value_coding values = value_coding::interleaved;
  byte_buffer value_raw;
};

/// What a preparing backend hands the encoder for a base-conditioned item (host memory).
struct prepared_conditioned {
  scratch_buffer<std::uint8_t> classes;
  scratch_buffer<std::uint32_t> ranks;
  byte_buffer old_values, new_values;
};

class entropy_accumulator;

template <class B>
concept preparing_backend = execution_backend<B> && requires(B& b, std::span<const std::byte> bytes, std::size_t n, value_mode mode,
                                                             prepared_plain& plain, prepared_conditioned& cond,
                                                             const float_format& fmt, const class_spec& spec,
                                                             entropy_accumulator* ent) {
  { b.prepare_plain(bytes, bytes, n, mode, plain, ent) } -> std::same_as<std::size_t>;
  { b.prepare_conditioned(bytes, bytes, fmt, spec, cond, ent) } -> std::same_as<std::size_t>;
};

}  // namespace bitrefit::codec
