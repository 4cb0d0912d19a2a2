// bitrefit_proofs/packed_frontier.hpp — one BFS level of encoded states, compressed in blocks, for
// the checker's compact frontier (checker.hpp, compact_world; proofs/README.md "Speed": memory).
//
// Why: on the big worlds the frontier, not the fingerprint table, is what runs out of memory. The
// receiver crash across 2 transitions has levels of more than 5 million states; at about 700 bytes
// an encoding (compact.hpp) one level is 3.8 GB and two are held at once (the level expanded and
// the next). Encodings of one level are alike (same machines, mostly the same small counters), so
// zstd at a fast level (-1) shrinks a block of them about 40 times (proofs/README.md "Speed") for
// a small fraction of the time it takes to expand those states.
//
// Layout: states are appended in order into an open block; every `states_per_block` states the
// block is compressed and kept with the offsets of its states. A reader (one per thread) keeps the
// last block it decompressed, and the checker's threads visit states in increasing order, so each
// thread decompresses each block at most once per level.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <zstd.h>

namespace bitrefit::proofs {

class packed_frontier {
 public:
  /// `compress` false: blocks are kept raw (same interface; for measuring what compression costs).
  explicit packed_frontier(bool compress = true, std::size_t states_per_block = 256)
      : compress_(compress), per_block_(states_per_block), id_(fresh_id()) {}

  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  /// Bytes held: the sealed blocks as stored plus the open block.
  std::size_t bytes_held() const noexcept { return held_ + open_.size(); }

  /// Appends one state's encoding.
  void push(const std::uint8_t* p, std::size_t size) {
    if (open_offsets_.empty()) open_offsets_.push_back(0);
    open_.insert(open_.end(), p, p + size);
    open_offsets_.push_back(static_cast<std::uint32_t>(open_.size()));
    ++n_;
    if (open_offsets_.size() - 1 == per_block_) seal();
  }
  /// Closes the open block; call once the level is complete (before reading it).
  void seal() {
    if (open_offsets_.size() <= 1) return;
    block b;
    b.raw_size = open_.size();
    b.offsets = std::move(open_offsets_);
    if (compress_) {
      b.bytes.resize(ZSTD_compressBound(open_.size()));
      if (!cctx_) cctx_.reset(ZSTD_createCCtx());
      const std::size_t z = ZSTD_compressCCtx(cctx_.get(), b.bytes.data(), b.bytes.size(), open_.data(), open_.size(), -1);
      if (ZSTD_isError(z)) throw std::runtime_error(std::string("packed_frontier: zstd: ") + ZSTD_getErrorName(z));
      b.bytes.resize(z);
      b.bytes.shrink_to_fit();
    } else {
      b.bytes.swap(open_);  // kept as it is; open_ starts empty again below
    }
    held_ += b.bytes.size() + b.offsets.size() * sizeof(std::uint32_t);
    blocks_.push_back(std::move(b));
    open_.clear();
    open_offsets_.clear();
  }
  void clear() {
    blocks_.clear();
    open_.clear();
    open_offsets_.clear();
    n_ = held_ = 0;
    id_ = fresh_id();  // readers' cached blocks belong to the old contents
  }

  /// Per-thread decompression state.
  class reader {
   public:
    /// The encoding of state k (of a sealed frontier), valid until the next call.
    std::pair<const std::uint8_t*, const std::uint8_t*> at(const packed_frontier& f, std::size_t k) {
      const std::size_t bi = k / f.per_block_, i = k % f.per_block_;
      const block& b = f.blocks_.at(bi);
      const std::uint8_t* base;
      if (!f.compress_) {
        base = b.bytes.data();
      } else {
        if (bi != cached_ || from_ != f.id_) {
          raw_.resize(b.raw_size);
          if (!dctx_) dctx_.reset(ZSTD_createDCtx());
          const std::size_t r = ZSTD_decompressDCtx(dctx_.get(), raw_.data(), raw_.size(), b.bytes.data(), b.bytes.size());
          if (ZSTD_isError(r) || r != b.raw_size) throw std::runtime_error("packed_frontier: a block does not decompress");
          cached_ = bi;
          from_ = f.id_;
        }
        base = raw_.data();
      }
      return {base + b.offsets[i], base + b.offsets[i + 1]};
    }

   private:
    struct dctx_free { void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); } };
    std::unique_ptr<ZSTD_DCtx, dctx_free> dctx_;
    std::vector<std::uint8_t> raw_;
    std::size_t cached_ = ~std::size_t{0};
    std::uint64_t from_ = 0;  // id of the contents the cached block came from
  };

 private:
  struct block {
    std::vector<std::uint8_t> bytes;      // compressed (or raw)
    std::vector<std::uint32_t> offsets;   // per state, into the raw block, plus its end
    std::size_t raw_size = 0;
  };
  // Contents are named by a process-wide id (renewed by clear()), not by address: the checker swaps
  // its two levels, so one address holds different contents over time.
  static std::uint64_t fresh_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  struct cctx_free { void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); } };

  bool compress_;
  std::size_t per_block_;
  std::vector<block> blocks_;
  std::vector<std::uint8_t> open_;
  std::vector<std::uint32_t> open_offsets_;
  std::size_t n_ = 0, held_ = 0;
  std::uint64_t id_;
  std::unique_ptr<ZSTD_CCtx, cctx_free> cctx_;
};

}  // namespace bitrefit::proofs
