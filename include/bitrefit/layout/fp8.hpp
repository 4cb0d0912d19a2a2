// bitrefit/layout/fp8.hpp — the FP8 E4M3 conversion with 128x128 block scales.
//
// The serving format of DeepSeek-V3 and Kimi-K2 FP8 checkpoints: each 2-D linear weight W [R, C]
// is stored as F8_E4M3 bits plus `weight_scale_inv` F32 [ceil(R/128), ceil(C/128)], one scale per
// 128x128 block, with W ≈ fp8 * weight_scale_inv. It is produced here from BF16 master weights:
//   amax  = max |x| over the block's finite elements (exact: compared as magnitude bits)
//   scale = amax / 448   (one IEEE-754 binary32 division; 1.0 when amax == 0)
//   q     = E4M3(x / scale)  (one binary32 division, then round-to-nearest-even to E4M3,
//           saturating to ±448; NaN stays NaN with its sign; ±inf saturates)
// Every step is a single correctly rounded IEEE operation or integer bit manipulation, so the
// output bits are a function of the input bits alone, on every machine (no fused multiply-add is
// possible: no multiply feeds an add).
//
// This is a Conversion, not a Projection: values change, so the refit compares the converted bits
// with a residual baseline of converted bits, and sends the changes as overwrite only. A changed
// block amax changes the block's scale and, through it, most of the block's elements; all of them
// are found by the bitwise comparison.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/change_set.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace bitrefit::layout {

inline constexpr float e4m3_max = 448.0f;
inline constexpr std::uint64_t fp8_block = 128;

/// float -> E4M3FN bits, round to nearest even, saturating to ±448; NaN -> 0x7F | sign.
constexpr std::uint8_t e4m3_from_float(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint8_t sign = static_cast<std::uint8_t>((bits >> 24) & 0x80);
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7F;  // NaN
  if (a >= 0x43E00000u) return sign | 0x7E;  // >= 448 (incl. inf): saturate (448 itself is 0x7E)
  const int e = static_cast<int>(a >> 23) - 127;
  if (e >= -6) {
    // Normal in E4M3: keep 3 mantissa bits, round to nearest even on the 20 dropped bits; a carry
    // into the exponent is the correct next binade. Re-bias 127 -> 7.
    const std::uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
    const std::uint32_t q = (r >> 20) - ((127u - 7u) << 3);
    return sign | static_cast<std::uint8_t>(q > 0x7E ? 0x7E : q);
  }
  // Subnormal in E4M3: units of 2^-9. q = m * 2^(e-23+9) with m the 24-bit significand.
  if (e < -10 - 1) return sign;  // below half the smallest subnormal (2^-10): rounds to zero
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const int shift = 14 - e;  // 21..25
  const std::uint32_t half = 1u << (shift - 1), rem = m & ((1u << shift) - 1u);
  std::uint32_t q = m >> shift;
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 8 is 2^-6, the smallest normal: still right
  return sign | static_cast<std::uint8_t>(q);
}

/// E4M3FN bits -> float (exact).
constexpr float e4m3_to_float(std::uint8_t v) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(v & 0x80) << 24;
  const std::uint32_t e = (v >> 3) & 0xF, m = v & 7u;
  if (e == 0xF && m == 7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (e == 0) {  // subnormal: m * 2^-9
    if (m == 0) return std::bit_cast<float>(sign);
    int shift = 0;
    std::uint32_t mm = m;
    while (!(mm & 8u)) mm <<= 1, ++shift;  // normalise into 1.xxx
    const std::uint32_t exp = static_cast<std::uint32_t>(127 - 6 - shift);
    return std::bit_cast<float>(sign | (exp << 23) | ((mm & 7u) << 20));
  }
  return std::bit_cast<float>(sign | ((e + 120u) << 23) | (m << 20));
}

static_assert(e4m3_from_float(448.0f) == 0x7E && e4m3_from_float(-448.0f) == 0xFE);
static_assert(e4m3_from_float(1.0f) == 0x38 && e4m3_to_float(0x38) == 1.0f);
static_assert(e4m3_from_float(0x1p-9f) == 0x01 && e4m3_to_float(0x01) == 0x1p-9f);
static_assert(e4m3_from_float(-0.0f) == 0x80);

/// Which canonical tensors an FP8 serving checkpoint stores as FP8 (DeepSeek-V3 policy: the 2-D
/// linear weights of attention and MLP/experts; embeddings, lm_head, norms and routers stay BF16).
inline bool fp8_serves(const tensor_info& t) {
  if (t.shape.size() != 2 || t.type != dtype::BF16) return false;
  for (std::string_view s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                             "up_proj.weight", "down_proj.weight"})
    if (t.name.ends_with(s)) return true;
  return false;
}

/// The Conversion BF16 [R, C] -> { F8_E4M3 [R, C] named as the master, F32 [ceil(R/128),
/// ceil(C/128)] named `<master>_scale_inv` }.
class fp8_block_conversion {
 public:
  std::vector<tensor_info> outputs(const tensor_info& master) const {
    check_master(master.name, master.type, master.shape);
    const std::uint64_t R = master.shape[0], C = master.shape[1];
    return {{master.name, dtype::F8_E4M3, master.shape},
            {master.name + "_scale_inv", dtype::F32, {(R + fp8_block - 1) / fp8_block, (C + fp8_block - 1) / fp8_block}}};
  }

  void convert(tensor_view in, std::span<const mutable_tensor_view> outs) const {
    check_master(in.name(), in.type(), in.shape());
    const auto expect = outputs({in.name(), in.type(), in.shape()});
    if (outs.size() != 2 || outs[0].type() != expect[0].type || outs[0].shape() != expect[0].shape ||
        outs[1].type() != expect[1].type || outs[1].shape() != expect[1].shape)
      throw error(errc::mismatch, "FP8 outputs must be F8_E4M3 " + std::to_string(expect[0].elements()) + " elements and F32 block scales",
                  {.file = {}, .tensor = in.name(), .field = "outputs"});
    const std::uint64_t R = in.shape()[0], C = in.shape()[1], Cb = expect[1].shape[1];
    const std::byte* src = in.bytes().data();
    std::byte* q = outs[0].bytes().data();
    std::byte* sc = outs[1].bytes().data();
    for (std::uint64_t r0 = 0; r0 < R; r0 += fp8_block)
      for (std::uint64_t c0 = 0; c0 < C; c0 += fp8_block) {
        const std::uint64_t r1 = std::min(R, r0 + fp8_block), c1 = std::min(C, c0 + fp8_block);
        std::uint16_t amax_bits = 0;  // magnitude bits of a finite BF16 compare like the values
        for (std::uint64_t r = r0; r < r1; ++r)
          for (std::uint64_t c = c0; c < c1; ++c) {
            const std::uint16_t m = bf16(src, r * C + c) & 0x7FFF;
            if (m < 0x7F80 && m > amax_bits) amax_bits = m;
          }
        const float amax = std::bit_cast<float>(static_cast<std::uint32_t>(amax_bits) << 16);
        const float scale = amax_bits == 0 ? 1.0f : amax / e4m3_max;
        std::memcpy(sc + ((r0 / fp8_block) * Cb + c0 / fp8_block) * 4, &scale, 4);
        for (std::uint64_t r = r0; r < r1; ++r)
          for (std::uint64_t c = c0; c < c1; ++c) {
            const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bf16(src, r * C + c)) << 16);
            q[r * C + c] = std::byte{e4m3_from_float(x / scale)};
          }
      }
  }

 private:
  static std::uint16_t bf16(const std::byte* p, std::uint64_t i) noexcept {
    std::uint16_t v;
    std::memcpy(&v, p + i * 2, 2);
    return v;
  }
  static void check_master(const std::string& name, dtype t, const shape_t& shape) {
    if (t != dtype::BF16 || shape.size() != 2)
      throw error(errc::unsupported, "FP8 block conversion takes a 2-D BF16 master weight, got " + std::string(dtype_name(t)) + " of rank " +
                                         std::to_string(shape.size()),
                  {.file = {}, .tensor = name, .field = "dtype"});
  }
};

static_assert(Conversion<fp8_block_conversion>);

/// Runs `c` on `master` into `out` (a store holding c.outputs(master), e.g. the next residual).
template <Conversion C>
void convert_into(const C& c, tensor_view master, canonical_store& out) {
  std::vector<mutable_tensor_view> outs;
  for (const tensor_info& t : c.outputs({master.name(), master.type(), master.shape()})) outs.push_back(out.tensor(t.name));
  c.convert(master, outs);
}

/// The conversion path of a delta: converts `master` into `converted` (which becomes the residual
/// baseline when the transition commits), compares it bitwise with `residual`, and returns one
/// OVERWRITE item per output tensor that changed. Applying the items to a copy of `residual`
/// gives `converted` bit for bit.
template <Conversion C>
std::vector<change_item> conversion_delta(const C& c, tensor_view master, const canonical_store& residual, canonical_store& converted) {
  convert_into(c, master, converted);
  std::vector<change_item> items;
  for (const tensor_info& t : c.outputs({master.name(), master.type(), master.shape()})) {
    const std::span<const std::byte> old_b = residual.bytes(t.name), new_b = std::as_const(converted).bytes(t.name);
    change_item it{t.name, value_mode::overwrite, {}, {}};
    collect_changed(old_b.data(), new_b.data(), t.elements(), element_size(t.type), 0, false, it);
    if (!it.positions.empty()) items.push_back(std::move(it));
  }
  return items;
}

}  // namespace bitrefit::layout
