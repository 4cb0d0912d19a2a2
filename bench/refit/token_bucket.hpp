// bench/refit/token_bucket.hpp — a rate limiter for the loopback fallback (no network namespaces).
//
// Why: with root, the bench puts a `tc ... tbf` qdisc on the trainer's end of a veth pair and the
// kernel paces the bytes on the wire. Without root there is no link to shape, so the trainer's
// transport paces what it writes itself with this bucket: `rate` bytes per second on average,
// bursts of at most `burst` bytes (tbf's model, but counted in application bytes, without TCP/IP
// headers — about 3-5 % more generous than tbf at the same nominal rate; results say which limiter
// produced them). Thread-safe: one bucket is shared by every connection of one side, as one link is.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

namespace bench {

class token_bucket {
 public:
  using clock = std::chrono::steady_clock;

  /// @param rate_bytes_per_s 0 means unlimited.
  explicit token_bucket(double rate_bytes_per_s = 0, double burst_bytes = 64 * 1024)
      : rate_(rate_bytes_per_s), burst_(std::max(burst_bytes, 1.0)), tokens_(burst_), last_(clock::now()) {}

  /// Changes the rate (0: unlimited); the bucket starts full again, as a freshly configured tbf does.
  void set_rate(double rate_bytes_per_s, double burst_bytes) {
    std::lock_guard lock(mu_);
    rate_ = rate_bytes_per_s;
    burst_ = std::max(burst_bytes, 1.0);
    tokens_ = burst_;
    last_ = clock::now();
  }
  double rate() const {
    std::lock_guard lock(mu_);
    return rate_;
  }

  /// Blocks until `n` bytes may be sent. Requests above the burst size are taken in burst-sized
  /// pieces, so a large write is paced, never refused.
  void acquire(std::uint64_t n) {
    while (n > 0) {
      std::unique_lock lock(mu_);
      if (rate_ <= 0) return;
      const double want = std::min<double>(static_cast<double>(n), burst_);
      refill();
      if (tokens_ >= want) {
        tokens_ -= want;
        n -= static_cast<std::uint64_t>(want);
        continue;
      }
      const auto wait = std::chrono::duration<double>((want - tokens_) / rate_);
      lock.unlock();
      std::this_thread::sleep_for(wait);
    }
  }

 private:
  void refill() {
    const auto now = clock::now();
    tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
  }

  mutable std::mutex mu_;
  double rate_, burst_, tokens_;
  clock::time_point last_;
};

}  // namespace bench
