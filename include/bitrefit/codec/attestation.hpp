// bitrefit/codec/attestation.hpp — the model-wide attestation digest a receiver acks with.
//
// Definition (attestation version 1). Let S be a streaming XXH3-128 (seed 0). For each tensor in
// byte-wise name order, feed S with
//   name    : u64 LE byte length, then the name bytes
//   dtype   : u64 LE byte length, then its safetensors spelling ("BF16", ...)
//   shape   : u64 LE rank, then each extent as u64 LE
//   ranges  : u64 LE count, then for each held range in ascending order
//               u64 LE begin, u64 LE end (elements, row-major flat indices),
//               u64 LE leaf count L, then L leaf digests (16 bytes each: low64 LE, high64 LE),
//               leaf j = XXH3-128 of the range's bytes [j·64 KiB, min((j+1)·64 KiB, size)).
// The digest is S's final value. A whole tensor is the single range [0, elements); a receiver
// that holds part of a tensor declares its ranges (as at join) and owners compute the same
// digest over the same declaration. Leaves are independent, so a backend hashes them in parallel
// (hash_slices); only the leaf digests (16 bytes per 64 KiB) reach the host.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit::codec {

inline constexpr std::size_t attestation_slice_bytes = 64 * 1024;

/// A held range [begin, end) of one tensor with its bytes (in the backend's memory space).
struct attested_range {
  std::string_view tensor;
  dtype type = dtype::U8;
  const shape_t* shape = nullptr;  // the whole tensor's shape
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::span<const std::byte> bytes;  // (end - begin) * element_size(type) bytes
  /// Optional: elements whose bits are not those of `bytes` — the range is digested as `bytes`
  /// with these applied (a sender's frozen target = its baseline B^v + the change set, never
  /// materialised). Ascending TENSOR element indices inside [begin, end), and element_size bits each.
  std::span<const std::uint64_t> patch_positions = {};
  std::span<const std::byte> patch_values = {};
};

/// Bytes of one tensor as a base plus patched elements (see attested_range::patch_positions).
struct patched_bytes {
  std::span<const std::byte> base;
  std::span<const std::uint64_t> positions;  // ascending tensor element indices
  std::span<const std::byte> values;         // element_size bytes per position
};

namespace detail {
// Leaf digests [first, first + out.size()) of range r, whose leaves holding patched elements are
// hashed from a patched host copy of the leaf (64 KiB); runs of unpatched leaves go to the backend
// in one call, as without a patch. Same digests as hashing the patched range.
template <execution_backend Backend>
void patched_leaves(const attested_range& r, std::size_t first, std::span<digest128> out, Backend& backend, byte_buffer& scratch,
                    std::size_t& next_patch) {
  const std::size_t E = element_size(r.type);
  const std::size_t per_leaf = attestation_slice_bytes / E;  // element sizes divide 64 KiB
  const auto& pos = r.patch_positions;
  std::size_t j = 0;
  while (j < out.size()) {
    const std::uint64_t leaf_begin = r.begin + (first + j) * per_leaf;
    const std::uint64_t leaf_end = std::min<std::uint64_t>(leaf_begin + per_leaf, r.end);
    while (next_patch < pos.size() && pos[next_patch] < leaf_begin) ++next_patch;
    if (next_patch < pos.size() && pos[next_patch] < leaf_end) {
      const std::size_t off = (first + j) * attestation_slice_bytes;
      const std::span<const std::byte> src = r.bytes.subspan(off, (leaf_end - leaf_begin) * E);
      byte_buffer host;
      const std::span<const std::byte> h = backend.host_bytes(src, host);
      scratch.resize_uninit(h.size());
      std::memcpy(scratch.data(), h.data(), h.size());
      for (; next_patch < pos.size() && pos[next_patch] < leaf_end; ++next_patch)
        std::memcpy(scratch.data() + (pos[next_patch] - leaf_begin) * E, r.patch_values.data() + next_patch * E, E);
      out[j++] = xxh3_128(scratch.span());
      continue;
    }
    std::size_t k = j + 1;  // unpatched leaves up to the next patched one
    const std::uint64_t next_at = next_patch < pos.size() ? pos[next_patch] : r.end;
    while (k < out.size() && next_at >= std::min<std::uint64_t>(r.begin + (first + k + 1) * per_leaf, r.end)) ++k;
    const std::size_t off = (first + j) * attestation_slice_bytes;
    const std::size_t len = std::min((k - j) * attestation_slice_bytes, r.bytes.size() - off);
    backend.hash_slices(r.bytes.subspan(off, len), attestation_slice_bytes, out.subspan(j, k - j));
    j = k;
  }
}
}  // namespace detail

/// Attestation digest over declared ranges (see the definition above). Ranges may come in any
/// order; per tensor they must not overlap and must agree on dtype and shape.
/// Throws errc::invalid_argument naming the tensor otherwise.
template <execution_backend Backend>
digest128 attestation_digest(std::span<const attested_range> ranges, Backend& backend) {
  std::vector<const attested_range*> order;
  order.reserve(ranges.size());
  for (auto& r : ranges) {
    const error_context where{.file = {}, .tensor = std::string(r.tensor), .field = "range"};
    if (!r.shape) throw error(errc::invalid_argument, "attested range without a shape", where);
    const std::uint64_t n = element_count(*r.shape, r.tensor);
    if (r.begin > r.end || r.end > n) throw error(errc::invalid_argument, "attested range outside its tensor", where);
    if (r.bytes.size() != (r.end - r.begin) * element_size(r.type))
      throw error(errc::invalid_argument, "attested range bytes do not hold (end - begin) elements", where);
    if (r.patch_values.size() != r.patch_positions.size() * element_size(r.type))
      throw error(errc::invalid_argument, "attested range patch: value bytes do not match the position count", where);
    for (std::size_t k = 0; k < r.patch_positions.size(); ++k)
      if (r.patch_positions[k] < r.begin || r.patch_positions[k] >= r.end || (k > 0 && r.patch_positions[k] <= r.patch_positions[k - 1]))
        throw error(errc::invalid_argument, "attested range patch: positions not strictly ascending inside the range", where);
    order.push_back(&r);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->tensor != b->tensor ? a->tensor < b->tensor : a->begin < b->begin;
  });
  xxh3_128_stream s;
  std::vector<digest128> leaves;
  byte_buffer patch_scratch;  // one leaf (64 KiB) when a range carries a patch
  constexpr std::size_t batch_leaves = 4096;  // 256 MiB of tensor bytes per backend call
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j < order.size() && order[j]->tensor == order[i]->tensor) ++j;
    const attested_range& first = *order[i];
    s.update_string(first.tensor);
    s.update_string(dtype_name(first.type));
    s.update_u64(first.shape->size());
    for (auto d : *first.shape) s.update_u64(d);
    s.update_u64(j - i);
    for (std::size_t k = i; k < j; ++k) {
      const attested_range& r = *order[k];
      const error_context where{.file = {}, .tensor = std::string(r.tensor), .field = "range"};
      if (r.type != first.type || *r.shape != *first.shape)
        throw error(errc::invalid_argument, "attested ranges of one tensor disagree on dtype or shape", where);
      if (k > i && r.begin < order[k - 1]->end) throw error(errc::invalid_argument, "attested ranges of one tensor overlap", where);
      s.update_u64(r.begin);
      s.update_u64(r.end);
      const std::size_t L = (r.bytes.size() + attestation_slice_bytes - 1) / attestation_slice_bytes;
      s.update_u64(L);
      std::size_t next_patch = 0;
      for (std::size_t b = 0; b < L; b += batch_leaves) {
        const std::size_t nl = std::min(batch_leaves, L - b);
        const std::size_t off = b * attestation_slice_bytes;
        leaves.resize(nl);
        if (r.patch_positions.empty())
          backend.hash_slices(r.bytes.subspan(off, std::min(nl * attestation_slice_bytes, r.bytes.size() - off)),
                              attestation_slice_bytes, leaves);
        else
          detail::patched_leaves(r, b, leaves, backend, patch_scratch, next_patch);
        for (auto& d : leaves) s.update_digest(d);
      }
    }
    i = j;
  }
  return s.digest();
}

inline digest128 attestation_digest(std::span<const attested_range> ranges) {
  host_backend b;
  return attestation_digest(ranges, b);
}

/// Attestation digest of whole tensors (each the single range [0, elements)). Duplicate names
/// are rejected (as overlapping ranges).
template <execution_backend Backend>
digest128 attestation_digest(std::span<const tensor_view> tensors, Backend& backend) {
  std::vector<attested_range> rs;
  rs.reserve(tensors.size());
  for (auto& t : tensors) rs.push_back({t.name(), t.type(), &t.shape(), 0, t.elements(), t.bytes()});
  std::sort(rs.begin(), rs.end(), [](auto& a, auto& b) { return a.tensor < b.tensor; });
  for (std::size_t k = 1; k < rs.size(); ++k)
    if (rs[k].tensor == rs[k - 1].tensor)
      throw error(errc::invalid_argument, "duplicate tensor in attestation", {.file = {}, .tensor = std::string(rs[k].tensor), .field = {}});
  return attestation_digest(std::span<const attested_range>(rs), backend);
}
inline digest128 attestation_digest(std::span<const tensor_view> tensors) {
  host_backend b;
  return attestation_digest(tensors, b);
}

}  // namespace bitrefit::codec
