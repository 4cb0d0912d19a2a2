// bitrefit/refit/encode_pipeline.hpp — the owners' encoders: chunks encoded on a bounded pool of
// worker threads, each frame published the moment it is built, so encoding overlaps transfer.
//
// One encoder per worker and mode policy (XOR-or-overwrite for first attempts, overwrite only for
// retries and for tensors some receiver places non-bit-preservingly) and one frame buffer per
// worker: memory is bounded by the chunks in flight (the pool's queue), never by the model.
// Workers report each chunk as a `chunk_done`; the sender steps the owner machine with them in seq
// order (the pipeline does not know the protocol). A chunk whose job was cancelled before it was
// published is dropped silently (cancel_encoding_action); a crash of the owner process at a crash
// point (C::crash, core/crash_points.hpp) and any other failure are reported, not thrown, so the
// stepping thread decides (recover the owner / stop with the error).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/protocol/types.hpp"
#include "bitrefit/refit/owner_shard.hpp"
#include "bitrefit/refit/thread_pool.hpp"

namespace bitrefit::refit {

/// What a worker reports for one encoded chunk.
struct chunk_done {
  enum class result : std::uint8_t { published, crashed, failed };
  std::uint32_t owner = 0;
  std::uint64_t generation = 0;  // the owner's job the chunk belongs to (older ones are stale)
  attempt_id attempt{};
  std::uint32_t seq = 0;
  digest128 content{};                              // the frame's own digest
  protocol::mode mode = protocol::mode::overwrite;  // xor_mask iff some item needs the exact base
  std::uint64_t bytes = 0;
  double encode_s = 0;
  std::chrono::steady_clock::time_point published{};
  result outcome = result::published;
  std::string what;  // crashed / failed: why
};

template <codec::execution_backend Backend = codec::host_backend, CrashPoints Crash = no_crash_points>
class encode_pipeline {
 public:
  struct options {
    unsigned threads = 2;
    int zstd_level = codec::default_zstd_level;
    std::uint64_t max_frame_input_bytes = codec::default_max_frame_input_bytes;
  };

  explicit encode_pipeline(options o, Crash crash = {}) : crash_(std::move(crash)) {
    const unsigned threads = o.threads ? o.threads : 1;
    for (unsigned w = 0; w < threads; ++w) {
      for (auto policy : {codec::mode_policy::xor_allowed, codec::mode_policy::overwrite_only})
        encoders_.push_back(std::make_unique<codec::chunk_encoder<Backend>>(
            codec::encode_options{policy, o.zstd_level, o.max_frame_input_bytes}));
      buffers_.push_back(std::make_unique<codec::byte_buffer>());
    }
    pool_ = std::make_unique<thread_pool>(threads, std::size_t(1) << 30);
  }
  encode_pipeline(const encode_pipeline&) = delete;
  ~encode_pipeline() { pool_.reset(); }  // joins the workers before anything they reference goes

  /// Queues chunk `seq` of `shard`'s frozen change set as the delta frame `h`, under `policy`.
  /// The worker skips it when `live()` is false (cancelled) before it starts or before it
  /// publishes; otherwise it hands the frame to `publish(key, bytes)`, passes the owner's crash
  /// point, and reports a chunk_done. `shard` must outlive the job (pipeline destroyed first or
  /// wait() called).
  /// `in_flight` counts the owner's tasks past their first live() check (entered before it, left
  /// when the task ends), so that the sender can wait for them before it replaces the shard's
  /// images (sender::quiesce): a task either sees the new generation and leaves, or is waited for.
  template <class Live, class Publish>
  void submit(const owner_shard& shard, std::uint64_t generation, const codec::frame_header& h, codec::mode_policy policy,
              std::atomic<std::uint32_t>& in_flight, Live live, Publish publish) {
    pool_->submit([this, &shard, generation, h, policy, &in_flight, live, publish](std::size_t w) {
      ++in_flight;  // before the generation check: see sender::quiesce()
      struct leave {
        std::atomic<std::uint32_t>& n;
        ~leave() { --n; }
      } in_flight_guard{in_flight};
      if (!live()) return;
      chunk_done c{shard.index(), generation, h.id.attempt, h.id.seq, {}, protocol::mode::overwrite, 0, 0, {}, chunk_done::result::published, {}};
      try {
        const auto te = std::chrono::steady_clock::now();
        auto& enc = *encoders_[2 * w + (policy == codec::mode_policy::overwrite_only ? 1 : 0)];
        codec::byte_buffer& out = *buffers_[w];
        const auto st = shard.encode(h.id.seq, h, enc, out);
        if (!live()) return;
        publish(out.span());
        c.published = std::chrono::steady_clock::now();
        c.content = codec::load_digest_le(out.data() + out.size() - codec::frame_digest_size);
        // XOR and base-conditioned items are only correct on the exact base: an xor_mask payload
        c.mode = st.xor_items + st.conditioned_items > 0 ? protocol::mode::xor_mask : protocol::mode::overwrite;
        c.bytes = out.size();
        c.encode_s = std::chrono::duration<double>(c.published - te).count();
        crash_.pass("owner_mid_stream", "owner/" + std::to_string(shard.index()));
      } catch (const typename Crash::crash& e) {
        c.outcome = chunk_done::result::crashed;
        c.what = e.what();
      } catch (const std::exception& e) {
        c.outcome = chunk_done::result::failed;
        c.what = e.what();
      }
      std::lock_guard lock(mu_);
      done_.push_back(std::move(c));
    });
  }

  /// Every chunk of `shard`'s baseline as dense frames of K = (v, g) (header ids: attempt 0, the
  /// owner, seq), each handed to publish(seq, bytes). Blocks until all are published.
  template <class Publish>
  void dense(const owner_shard& shard, version_t v, Publish publish) {
    for (std::uint32_t seq = 0; seq < shard.chunk_count(); ++seq)
      pool_->submit([this, &shard, seq, v, publish](std::size_t w) {
        codec::byte_buffer& out = *buffers_[w];
        const codec::frame_header h{codec::frame_kind::dense, payload_id{attempt_id{}, shard.index(), seq}, v, v};
        shard.encode_dense(seq, h, *encoders_[2 * w], out);
        publish(seq, out.span());
      });
    pool_->wait();
  }

  /// The chunks reported since the last call, in completion order.
  std::deque<chunk_done> take() {
    std::deque<chunk_done> got;
    std::lock_guard lock(mu_);
    got.swap(done_);
    return got;
  }

 private:
  Crash crash_;
  std::vector<std::unique_ptr<codec::chunk_encoder<Backend>>> encoders_;
  std::vector<std::unique_ptr<codec::byte_buffer>> buffers_;
  std::unique_ptr<thread_pool> pool_;
  std::mutex mu_;
  std::deque<chunk_done> done_;
};

}  // namespace bitrefit::refit
