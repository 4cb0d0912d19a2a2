// bitrefit/transport/faulty.hpp — deterministic fault injection around any Transport.
//
// Wraps a transport and, by fixed rules or by a seeded hash of the key (never by a clock), makes
// payload frames arrive corrupted, duplicated, reordered or late, and control messages lost or
// duplicated. The same seed and the same calls give the same faults, so a failing test replays.
//  * corrupt: the first `corrupt_copies` fetches of a chosen frame return it with one byte
//    flipped (a bad copy, which the receiver must treat as undelivered and fetch again).
//  * duplicate: list() names a chosen frame twice (the receiver ingests a second, equal copy).
//  * reorder: list() returns frames in a seeded permutation instead of (owner, seq) order.
//  * delay: a chosen frame is hidden from the first `delay_lists` list() calls of its stream.
//  * drop_posts / duplicate_posts: the n-th post (1-based, counted over all mailboxes) is lost or
//    sent twice.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport {

struct fault_rules {
  std::uint64_t seed = 1;
  unsigned corrupt_one_in = 0;    // 0 = off; else frames whose hash % n == 0 are corrupted
  unsigned corrupt_copies = 1;
  unsigned duplicate_one_in = 0;
  bool reorder = false;
  unsigned delay_one_in = 0;
  unsigned delay_lists = 2;
  std::set<std::uint64_t> drop_posts;
  std::set<std::uint64_t> duplicate_posts;
};

struct fault_counters {
  std::uint64_t corrupted = 0, duplicated = 0, delayed = 0, dropped_posts = 0, duplicated_posts = 0;
};

template <Transport T>
class faulty_transport {
 public:
  faulty_transport(T inner, fault_rules r) : inner_(std::move(inner)), r_(std::move(r)), st_(std::make_shared<state>()) {}

  void publish(const frame_key& k, std::span<const std::byte> b) { inner_.publish(k, b); }

  std::vector<frame_key> list(const stream_key& s) {
    auto keys = inner_.list(s);
    std::lock_guard lock(st_->mu);
    const unsigned calls = ++st_->list_calls[s];
    std::vector<frame_key> out;
    for (auto& k : keys) {
      if (chosen(k, r_.delay_one_in, 3) && calls <= r_.delay_lists) { ++st_->c.delayed; continue; }
      out.push_back(k);
      if (chosen(k, r_.duplicate_one_in, 2)) { out.push_back(k); ++st_->c.duplicated; }
    }
    if (r_.reorder) {
      std::sort(out.begin(), out.end(), [&](const frame_key& a, const frame_key& b) { return mix(a, 4) < mix(b, 4); });
    }
    return out;
  }

  std::optional<bytes> fetch(const frame_key& k) {
    auto b = inner_.fetch(k);
    if (!b || b->empty()) return b;
    std::lock_guard lock(st_->mu);
    if (chosen(k, r_.corrupt_one_in, 1) && st_->corrupted_copies[k] < r_.corrupt_copies) {
      ++st_->corrupted_copies[k];
      ++st_->c.corrupted;
      (*b)[mix(k, 5) % b->size()] ^= std::byte{0x5A};
    }
    return b;
  }

  void discard(const stream_key& s) { inner_.discard(s); }

  void post(const std::string& m, std::span<const std::byte> b) {
    std::uint64_t n;
    {
      std::lock_guard lock(st_->mu);
      n = ++st_->posts;
      if (r_.drop_posts.count(n)) { ++st_->c.dropped_posts; return; }
      if (r_.duplicate_posts.count(n)) ++st_->c.duplicated_posts;
    }
    inner_.post(m, b);
    if (r_.duplicate_posts.count(n)) inner_.post(m, b);
  }

  std::vector<bytes> receive(const std::string& m, std::chrono::milliseconds wait) { return inner_.receive(m, wait); }

  fault_counters counters() const {
    std::lock_guard lock(st_->mu);
    return st_->c;
  }
  T& inner() { return inner_; }

 private:
  std::uint64_t mix(const frame_key& k, std::uint64_t salt) const {
    std::uint64_t h = r_.seed * 0x9E3779B97F4A7C15ull ^ salt * 0xBF58476D1CE4E5B9ull;
    for (char c : k.stream.name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
    h ^= (std::uint64_t(k.owner) << 32 | k.seq) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    h *= 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
  }
  bool chosen(const frame_key& k, unsigned one_in, std::uint64_t salt) const {
    return one_in != 0 && mix(k, salt) % one_in == 0;
  }

  struct state {
    mutable std::mutex mu;
    std::map<stream_key, unsigned> list_calls;
    std::map<frame_key, unsigned> corrupted_copies;
    std::uint64_t posts = 0;
    fault_counters c;
  };
  T inner_;
  fault_rules r_;
  std::shared_ptr<state> st_;
};

}  // namespace bitrefit::transport
