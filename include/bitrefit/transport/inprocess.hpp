// bitrefit/transport/inprocess.hpp — the in-process transport: threads of one process share a hub.
//
// Every participant holds an `inprocess_transport` handle to one shared `inprocess_hub`; frames
// and mailboxes live in the hub's memory behind one mutex. Delivery is reliable and in order;
// wrap it in fault::faulty_transport to test lossy networks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport {

class inprocess_hub {
 public:
  void publish(const frame_key& k, std::span<const std::byte> b) {
    std::lock_guard lock(mu_);
    streams_[k.stream][{k.owner, k.seq}] = bytes(b.begin(), b.end());
  }
  std::vector<frame_key> list(const stream_key& s) const {
    std::lock_guard lock(mu_);
    std::vector<frame_key> out;
    if (auto it = streams_.find(s); it != streams_.end())
      for (auto& [os, _] : it->second) out.push_back({s, os.first, os.second});
    return out;
  }
  std::optional<bytes> fetch(const frame_key& k) const {
    std::lock_guard lock(mu_);
    auto it = streams_.find(k.stream);
    if (it == streams_.end()) return std::nullopt;
    auto f = it->second.find({k.owner, k.seq});
    if (f == it->second.end()) return std::nullopt;
    return f->second;
  }
  void discard(const stream_key& s) {
    std::lock_guard lock(mu_);
    streams_.erase(s);
  }
  void post(const std::string& mailbox, std::span<const std::byte> b) {
    {
      std::lock_guard lock(mu_);
      mailboxes_[mailbox].emplace_back(b.begin(), b.end());
    }
    cv_.notify_all();
  }
  std::vector<bytes> receive(const std::string& mailbox, std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    auto& q = mailboxes_[mailbox];
    cv_.wait_for(lock, wait, [&] { return !q.empty(); });
    std::vector<bytes> out(std::make_move_iterator(q.begin()), std::make_move_iterator(q.end()));
    q.clear();
    return out;
  }
  /// Bytes currently held in frames (for tests that check cleanup).
  std::size_t stream_count() const {
    std::lock_guard lock(mu_);
    return streams_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<stream_key, std::map<std::pair<std::uint32_t, std::uint32_t>, bytes>> streams_;
  std::map<std::string, std::deque<bytes>> mailboxes_;
};

/// A cheap, copyable handle; all handles of one hub see the same frames and mailboxes.
class inprocess_transport {
 public:
  inprocess_transport() : hub_(std::make_shared<inprocess_hub>()) {}
  explicit inprocess_transport(std::shared_ptr<inprocess_hub> hub) : hub_(std::move(hub)) {}

  void publish(const frame_key& k, std::span<const std::byte> b) { hub_->publish(k, b); }
  std::vector<frame_key> list(const stream_key& s) { return hub_->list(s); }
  std::optional<bytes> fetch(const frame_key& k) { return hub_->fetch(k); }
  void discard(const stream_key& s) { hub_->discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { hub_->post(m, b); }
  std::vector<bytes> receive(const std::string& m, std::chrono::milliseconds wait) { return hub_->receive(m, wait); }

  const std::shared_ptr<inprocess_hub>& hub() const { return hub_; }

 private:
  std::shared_ptr<inprocess_hub> hub_;
};

static_assert(Transport<inprocess_transport>);

}  // namespace bitrefit::transport
