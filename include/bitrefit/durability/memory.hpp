// bitrefit/durability/memory.hpp — commit log and baseline store in host memory.
//
// For tests and single-process deployments: same laws as the filesystem models except law 4
// (nothing survives the process). Handles are copyable and share one state, so a "restarted"
// coordinator or owner in a test sees what its predecessor committed.
#pragma once

#include <memory>
#include <mutex>

#include "bitrefit/durability/concepts.hpp"

namespace bitrefit::durability {

class memory_commit_log {
 public:
  memory_commit_log() : s_(std::make_shared<shared>()) {}

  log_state read() {
    std::lock_guard lock(s_->mu);
    return s_->state;
  }
  std::uint64_t begin_epoch() {
    std::lock_guard lock(s_->mu);
    return ++s_->state.epoch;
  }
  cas_outcome prepare(std::uint64_t epoch, const attempt_record& a) {
    std::lock_guard lock(s_->mu);
    if (epoch != s_->state.epoch) return cas_outcome::fenced;
    if (a.base_version != s_->state.committed.version || a.base != s_->state.committed.baseline)
      return cas_outcome::conflict;
    s_->state.prepared = a;
    return cas_outcome::success;
  }
  cas_outcome compare_and_set(std::uint64_t epoch, const commit_record& expected, const commit_record& desired) {
    std::lock_guard lock(s_->mu);
    if (epoch != s_->state.epoch) return cas_outcome::fenced;
    if (!(s_->state.committed == expected)) return cas_outcome::conflict;
    s_->state.committed = desired;
    s_->state.prepared.reset();
    return cas_outcome::success;
  }

 private:
  struct shared {
    std::mutex mu;
    log_state state;
  };
  std::shared_ptr<shared> s_;
};

static_assert(CommitLog<memory_commit_log>);

class memory_baseline_store {
 public:
  memory_baseline_store() : s_(std::make_shared<shared>()) {}

  void save(baseline_id g, const baseline_image& img) {
    std::lock_guard lock(s_->mu);
    s_->images[g.value] = img;
  }
  std::optional<baseline_image> load(baseline_id g) {
    std::lock_guard lock(s_->mu);
    auto it = s_->images.find(g.value);
    if (it == s_->images.end()) return std::nullopt;
    return it->second;
  }
  void retain_only(baseline_id g) {
    std::lock_guard lock(s_->mu);
    std::erase_if(s_->images, [&](const auto& kv) { return kv.first != g.value; });
  }
  std::size_t size() const {
    std::lock_guard lock(s_->mu);
    return s_->images.size();
  }

 private:
  struct shared {
    mutable std::mutex mu;
    std::map<std::uint64_t, baseline_image> images;
  };
  std::shared_ptr<shared> s_;
};

static_assert(BaselineStore<memory_baseline_store>);

}  // namespace bitrefit::durability
