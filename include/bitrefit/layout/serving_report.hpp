// bitrefit/layout/serving_report.hpp — how a model's serving bytes reach the rollout engines:
// by direct projection (exact index maps from trainer shards) or by conversion (FP8 with block
// scales, compared against a residual baseline), for a given trainer TP/PP/EP layout.
//
// A converted 128x128 block whose elements all live in one owner's shard can be converted where
// it lives; a block that straddles shards (e.g. an expert width of 768 split 4 ways = 192 rows,
// not a multiple of 128) needs its elements gathered first. The report separates the two.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "bitrefit/layout/fp8.hpp"
#include "bitrefit/layout/megatron.hpp"
#include "bitrefit/layout/model_spec.hpp"

namespace bitrefit::layout {

struct serving_bytes {
  std::uint64_t direct_bytes = 0;              // served as stored (BF16) by direct projection
  std::uint64_t converted_bytes = 0;           // FP8 elements + F32 block scales, by conversion
  std::uint64_t converted_local_bytes = 0;     // ... of blocks owned whole by one shard
  std::uint64_t converted_gathered_bytes = 0;  // ... of blocks that straddle shards
  std::uint64_t total() const noexcept { return direct_bytes + converted_bytes; }
  double direct_fraction() const noexcept { return total() ? static_cast<double>(direct_bytes) / static_cast<double>(total()) : 0.0; }
  double conversion_fraction() const noexcept { return total() ? static_cast<double>(converted_bytes) / static_cast<double>(total()) : 0.0; }
  friend bool operator==(const serving_bytes&, const serving_bytes&) = default;
};

/// Serving bytes of `m` trained with `p`, served in BF16 (fp8_serving = false: everything is
/// direct) or with the DeepSeek-V3 FP8 policy (fp8_serves: 2-D linear weights as FP8 + scales).
inline serving_bytes serving_report(const model_spec& m, const trainer_parallel& p, bool fp8_serving) {
  auto manifest = std::make_shared<const model_manifest>(canonical_manifest(m));
  const auto& ts = manifest->tensors();
  serving_bytes out;
  // Block owner per converted tensor: -1 none yet, -2 straddles, else the rank index.
  std::vector<std::vector<std::int32_t>> owner(ts.size());
  for (std::size_t t = 0; t < ts.size(); ++t) {
    if (fp8_serving && fp8_serves(ts[t])) {
      const std::uint64_t R = ts[t].shape[0], C = ts[t].shape[1];
      owner[t].assign(((R + fp8_block - 1) / fp8_block) * ((C + fp8_block - 1) / fp8_block), -1);
    } else {
      out.direct_bytes += ts[t].bytes();
    }
  }
  if (!fp8_serving) return out;
  auto mark = [&](std::size_t t, std::uint64_t cb, std::uint64_t len, std::int32_t rank) {
    const std::uint64_t C = ts[t].shape[1], Cb = (C + fp8_block - 1) / fp8_block;
    auto mark_rect = [&](std::uint64_t r0, std::uint64_t r1, std::uint64_t c0, std::uint64_t c1) {  // rows [r0,r1], cols [c0,c1)
      for (std::uint64_t br = r0 / fp8_block; br <= r1 / fp8_block; ++br)
        for (std::uint64_t bc = c0 / fp8_block; bc <= (c1 - 1) / fp8_block; ++bc) {
          std::int32_t& o = owner[t][br * Cb + bc];
          o = o == -1 || o == rank ? rank : -2;
        }
    };
    const std::uint64_t ce = cb + len, rb = cb / C, re = (ce - 1) / C;
    if (rb == re) return mark_rect(rb, rb, cb % C, (ce - 1) % C + 1);
    mark_rect(rb, rb, cb % C, C);
    if (re > rb + 1) mark_rect(rb + 1, re - 1, 0, C);
    mark_rect(re, re, 0, (ce - 1) % C + 1);
  };
  std::int32_t rank = 0;
  for (const trainer_rank& r : all_ranks(p)) {
    megatron_projection proj(manifest, m, p, r);
    for (const shard_tensor& st : proj.tensors())
      for (const run_block& b : st.runs)
        if (b.owned && !owner[b.tensor].empty()) for_each_run(b, [&](std::uint64_t, std::uint64_t cb, std::uint64_t len) { mark(b.tensor, cb, len, rank); });
    ++rank;
  }
  for (std::size_t t = 0; t < ts.size(); ++t) {
    if (owner[t].empty()) continue;
    const std::uint64_t R = ts[t].shape[0], C = ts[t].shape[1], Cb = (C + fp8_block - 1) / fp8_block;
    for (std::size_t b = 0; b < owner[t].size(); ++b) {
      const std::uint64_t br = b / Cb, bc = b % Cb;
      const std::uint64_t elems = (std::min(R, (br + 1) * fp8_block) - br * fp8_block) * (std::min(C, (bc + 1) * fp8_block) - bc * fp8_block);
      const std::uint64_t bytes = elems * element_size(dtype::F8_E4M3) + element_size(dtype::F32);  // elements + the block's scale
      out.converted_bytes += bytes;
      (owner[t][b] == -2 ? out.converted_gathered_bytes : out.converted_local_bytes) += bytes;
    }
  }
  return out;
}

}  // namespace bitrefit::layout
