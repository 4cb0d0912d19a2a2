// bitrefit/refit/thread_pool.hpp — a fixed set of worker threads with a bounded queue.
//
// Owners encode chunks here. The queue is bounded so a fast producer cannot buffer the whole
// model's frames in memory: submit() blocks while `max_queued` tasks wait. Each worker keeps
// its own per-thread state (an encoder with its scratch and zstd context), passed by index.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bitrefit::refit {

class thread_pool {
 public:
  using task = std::function<void(std::size_t worker)>;

  /// @pre threads >= 1. max_queued = 0 means 2 * threads.
  explicit thread_pool(std::size_t threads, std::size_t max_queued = 0)
      : max_queued_(max_queued ? max_queued : 2 * threads) {
    for (std::size_t i = 0; i < (threads ? threads : 1); ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  std::size_t size() const noexcept { return workers_.size(); }

  /// Queues `t`; blocks while the queue is full.
  void submit(task t) {
    std::unique_lock lock(mu_);
    space_.wait(lock, [&] { return queue_.size() < max_queued_; });
    queue_.push_back(std::move(t));
    ++pending_;
    cv_.notify_one();
  }

  /// Waits until every submitted task finished; rethrows the first exception a task threw.
  void wait() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    if (first_error_) {
      auto e = first_error_;
      first_error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop(std::size_t index) {
    for (;;) {
      task t;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        t = std::move(queue_.front());
        queue_.pop_front();
        space_.notify_one();
      }
      try {
        t(index);
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!first_error_) first_error_ = std::current_exception();
      }
      {
        std::lock_guard lock(mu_);
        if (--pending_ == 0) done_.notify_all();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, space_, done_;
  std::deque<task> queue_;
  std::vector<std::thread> workers_;
  std::size_t max_queued_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::exception_ptr first_error_;
};

}  // namespace bitrefit::refit
