// bitrefit/durability/memory.hpp — commit log and baseline store in host memory.
//
// For tests and single-process deployments: same laws as the filesystem models except law 4
// (nothing survives the process). Handles are copyable and share one state, so a "restarted"
// coordinator or owner in a test sees what its predecessor committed.
#pragma once

#include <memory>
#include <mutex>

#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"

namespace bitrefit::durability {

class memory_commit_log {
 public:
  explicit memory_commit_log(protocol::commit_record initial = {}) : s_(std::make_shared<shared>(initial)) {}

  protocol::log_reply apply(const protocol::log_request& req) {
    std::lock_guard lock(s_->mu);
    return s_->log.apply(req);
  }

 private:
  struct shared {
    explicit shared(protocol::commit_record k) : log(k) {}
    std::mutex mu;
    protocol::commit_log log;
  };
  std::shared_ptr<shared> s_;
};

static_assert(CommitLog<memory_commit_log>);

class memory_baseline_store {
 public:
  memory_baseline_store() : s_(std::make_shared<shared>()) {}

  void save(version_t v, const baseline_image& img) {
    std::lock_guard lock(s_->mu);
    s_->images[v] = img;
  }
  /// Law 4: the target is the base image with the changes applied (kept whole: memory costs no
  /// durable write). Throws errc::mismatch, changing nothing, when `base` is absent or cs does not fit.
  void save_changes(version_t base, version_t target, const change_set& cs) {
    std::lock_guard lock(s_->mu);
    auto it = s_->images.find(base);
    if (it == s_->images.end())
      throw error(errc::mismatch, "save_changes: no image of base version " + std::to_string(base), {.file = {}, .tensor = {}, .field = "base"});
    baseline_image img = it->second;
    apply_changes(img, cs);
    s_->images[target] = std::move(img);
  }
  std::optional<baseline_image> load(version_t v) {
    std::lock_guard lock(s_->mu);
    auto it = s_->images.find(v);
    if (it == s_->images.end()) return std::nullopt;
    return it->second;
  }
  void retain_only(version_t v) {
    std::lock_guard lock(s_->mu);
    std::erase_if(s_->images, [&](const auto& kv) { return kv.first != v; });
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

static_assert(DeltaBaselineStore<memory_baseline_store>);

}  // namespace bitrefit::durability

namespace bitrefit::durability {

/// Keeps nothing: an owner that restarts always reports lost state (for deployments whose trainer
/// reloads a checkpoint instead, and for tests of that report).
struct no_baseline_store {
  void save(version_t, const baseline_image&) {}
  std::optional<baseline_image> load(version_t) { return std::nullopt; }
  void retain_only(version_t) {}
};
static_assert(BaselineStore<no_baseline_store>);

}  // namespace bitrefit::durability
