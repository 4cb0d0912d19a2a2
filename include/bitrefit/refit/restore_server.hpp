// bitrefit/refit/restore_server.hpp — dense restores for restarted receivers, beside the protocol.
//
// A restarted receiver (protocol: dense_restore_action) posts a wire::restore_request; the sender
// answers with a wire::restore_offer naming K and, per owner, the dense frames of its part of K.v,
// published under transport::restore_stream(K). The one rule that makes those bits K's bits is
// protocol::serves_dense_restore (owner.hpp): serve K only while every owner's baseline is exactly
// K — never between a commit and an owner's advance. This class holds nothing else: who waits, and
// which K's frames are published (once per K; the previous K's are discarded).
#pragma once

#include <functional>

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/wire/engine.hpp"

namespace bitrefit::refit {

template <transport::Transport T>
class restore_server {
 public:
  /// Takes the requests that arrived; an undecodable one is counted, logged and dropped.
  /// Takes the waiting restore requests; one that does not decode, or names no receiver of this
  /// configuration (receiver >= receivers), is counted in `undecodable` and refused by name.
  void take_requests(T& transport, std::uint64_t& undecodable, std::uint32_t receivers,
                     const std::function<void(const error&)>& refused = {}) {
    wire::for_each_decoded(transport.receive(wire::restore_mailbox, std::chrono::milliseconds(0)), wire::restore_mailbox,
                           undecodable, [receivers](const auto& b) {
                             auto q = wire::decode<wire::restore_request>(b);
                             if (q.receiver >= receivers)
                               throw error(errc::format, "no such receiver", {.file = {}, .tensor = {}, .field = "receiver"});
                             return q;
                           },
                           [&](const wire::restore_request& q) { waiting_.insert(q.receiver); }, refused);
  }

  bool pending() const noexcept { return !waiting_.empty(); }

  /// Serves every waiting receiver with K when the rule allows it; returns whether it did.
  /// `publish_dense(stream)` publishes every owner's dense frames of K under `stream`;
  /// `chunks[o]` is owner o's frame count.
  template <class PublishDense>
  bool serve(T& transport, const protocol::commit_record& k, const std::vector<protocol::commit_record>& owner_baselines,
             const std::vector<std::uint32_t>& chunks, PublishDense publish_dense) {
    if (waiting_.empty() || !protocol::serves_dense_restore(k, owner_baselines)) return false;  // owners still advancing: later
    if (published_ != k) {
      if (published_) transport.discard(transport::restore_stream(published_->version, published_->baseline));
      publish_dense(transport::restore_stream(k.version, k.baseline));
      published_ = k;
    }
    const auto offer = wire::encode(wire::restore_offer{k, chunks});
    for (std::uint32_t r : waiting_) transport.post(wire::restore_reply_mailbox(r), offer);
    waiting_.clear();
    return true;
  }

 private:
  std::set<std::uint32_t> waiting_;
  std::optional<protocol::commit_record> published_;
};

}  // namespace bitrefit::refit
