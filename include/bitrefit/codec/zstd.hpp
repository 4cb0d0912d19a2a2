// bitrefit/codec/zstd.hpp — owning zstd contexts (one per encoder / decoder, reused per section).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <zstd.h>

#include "bitrefit/codec/buffer.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit::codec {

class zstd_compressor {
 public:
  zstd_compressor() : ctx_(ZSTD_createCCtx()) {
    if (!ctx_) throw error(errc::io, "ZSTD_createCCtx failed");
  }
  /// Appends the zstd frame of `src` (single-threaded, deterministic for a given zstd version and
  /// level) to `out`; returns its size.
  std::size_t compress_append(std::span<const std::byte> src, int level, byte_buffer& out) {
    const std::size_t bound = ZSTD_compressBound(src.size());
    const std::size_t old = out.size();
    out.resize_uninit(old + bound);
    const std::size_t n = ZSTD_compressCCtx(ctx_.get(), out.data() + old, bound, src.data(), src.size(), level);
    check(n);
    out.resize_uninit(old + n);
    return n;
  }

  /// Appends a zstd frame of `src` made by the "literals" profile: the level's parameters with the
  /// fast strategy at maximal acceleration (match finding effectively off) and Huffman-coded
  /// literals forced on. For memoryless streams (gap bytes, XOR byte planes) this is zstd's
  /// order-0 entropy coder alone: smaller than matching (short spurious matches cost more than
  /// the literals they replace) and an order of magnitude faster. Output is a standard zstd frame.
  std::size_t compress_literals_append(std::span<const std::byte> src, int level, byte_buffer& out) {
    if (!lit_) {
      lit_.reset(ZSTD_createCCtx());
      if (!lit_) throw error(errc::io, "ZSTD_createCCtx failed");
    }
    if (lit_level_ != level) {
      ZSTD_CCtx_reset(lit_.get(), ZSTD_reset_session_and_parameters);
      check(ZSTD_CCtx_setParameter(lit_.get(), ZSTD_c_compressionLevel, level));
      check(ZSTD_CCtx_setParameter(lit_.get(), ZSTD_c_strategy, ZSTD_fast));
      check(ZSTD_CCtx_setParameter(lit_.get(), ZSTD_c_minMatch, 7));
      check(ZSTD_CCtx_setParameter(lit_.get(), ZSTD_c_targetLength, 131072));  // max acceleration
      // ZSTD_c_literalCompressionMode = ZSTD_ps_enable (1): Huffman literals even at the fast strategy
      check(ZSTD_CCtx_setParameter(lit_.get(), ZSTD_c_experimentalParam5, 1));
      lit_level_ = level;
    }
    const std::size_t bound = ZSTD_compressBound(src.size());
    const std::size_t old = out.size();
    out.resize_uninit(old + bound);
    const std::size_t n = ZSTD_compress2(lit_.get(), out.data() + old, bound, src.data(), src.size());
    check(n);
    out.resize_uninit(old + n);
    return n;
  }

 private:
  static void check(std::size_t r) {
    if (ZSTD_isError(r)) throw error(errc::invalid_argument, std::string("zstd compression failed: ") + ZSTD_getErrorName(r));
  }
  struct del {
    void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
  };
  std::unique_ptr<ZSTD_CCtx, del> ctx_;
  std::unique_ptr<ZSTD_CCtx, del> lit_;
  int lit_level_ = -1000000;
};

class zstd_decompressor {
 public:
  zstd_decompressor() : ctx_(ZSTD_createDCtx()) {
    if (!ctx_) throw error(errc::io, "ZSTD_createDCtx failed");
  }
  /// Checks, without decompressing or allocating, that `src` is a sequence of complete zstd frames
  /// (the encoder writes one per part: one, or one per byte plane) each recording its content
  /// size, and that those sizes add up to exactly `declared` bytes. A section claiming anything
  /// else — an unknown size, another total, a truncated frame, bytes after the last frame — is
  /// errc::format naming `where`; so no section decompresses past what its item declared.
  static void check_frames(std::span<const std::byte> src, std::uint64_t declared, const error_context& where) {
    std::uint64_t total = 0;
    while (!src.empty()) {
      const unsigned long long content = ZSTD_getFrameContentSize(src.data(), src.size());
      if (content == ZSTD_CONTENTSIZE_ERROR) throw error(errc::format, "zstd section holds bytes that are not a zstd frame", where);
      if (content == ZSTD_CONTENTSIZE_UNKNOWN) throw error(errc::format, "zstd section has a frame that does not record its content size", where);
      if (content > declared - total)
        throw error(errc::format, "zstd section's frames hold more than the " + std::to_string(declared) + " bytes the item declares", where);
      const std::size_t frame = ZSTD_findFrameCompressedSize(src.data(), src.size());
      if (ZSTD_isError(frame)) throw error(errc::format, std::string("zstd section has an incomplete frame: ") + ZSTD_getErrorName(frame), where);
      total += content;
      src = src.subspan(frame);
    }
    if (total != declared)
      throw error(errc::format, "zstd section's frames hold " + std::to_string(total) + " bytes, the item declares " + std::to_string(declared), where);
  }

  /// Decompresses `src` into exactly `dst.size()` bytes; anything else is errc::format naming `where`.
  void decompress_exact(std::span<const std::byte> src, std::span<std::byte> dst, const error_context& where) {
    const std::size_t n = ZSTD_decompressDCtx(ctx_.get(), dst.data(), dst.size(), src.data(), src.size());
    if (ZSTD_isError(n))
      throw error(errc::format, std::string("zstd section does not decompress: ") + ZSTD_getErrorName(n), where);
    if (n != dst.size())
      throw error(errc::format,
                  "zstd section decompresses to " + std::to_string(n) + " bytes, header declares " +
                      std::to_string(dst.size()),
                  where);
  }

 private:
  struct del {
    void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
  };
  std::unique_ptr<ZSTD_DCtx, del> ctx_;
};

}  // namespace bitrefit::codec
