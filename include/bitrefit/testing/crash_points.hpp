// bitrefit/testing/crash_points.hpp — deterministic crash points for tests and the demo (a
// CrashPoints policy, core/crash_points.hpp). Test machinery: not installed as public API.
//
// Tests arm a named point with a count; when a component passes the point for the n-th time it
// "crashes": by default it throws testing::injected_crash (the in-process tests catch it where a
// process would die and drop every bit of volatile state), or the demo sets `on_fire` to kill the
// process for real. Copies share their state (a handle), so one object can be handed to a sender,
// its receivers and their stores. Points the library passes:
//   receiver_applied          a receiver, after its n-th applied payload           who: receiver/<r>
//   coordinator_after_cas     the coordinator, after a successful compare-and-set,
//                             before anyone is told                                who: coordinator
//   owner_mid_stream          an owner, after publishing its n-th frame             who: owner/<o>
//   commit_log.after_temp     the filesystem commit log: temp written, before rename
//   commit_log.after_rename   ...: renamed, before the directory fsync
//   baseline.<kind>_after_temp / baseline.<kind>_after_rename (kind: full, delta, fold),
//   baseline.delta_after_unlink, baseline.fold_before_cleanup   the filesystem baseline store
//                                                                                  who: its directory
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

#include "bitrefit/core/crash_points.hpp"

namespace bitrefit::testing {

/// The one exception a simulated death throws.
struct injected_crash : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Arming is one-shot: a point fires once, at the n-th pass after it was armed, then disarms.
class crash_points {
 public:
  using crash = injected_crash;

  /// Called when a point fires (default: throw injected_crash naming the point).
  void set_on_fire(std::function<void(const std::string&)> f) { state_->on_fire = std::move(f); }

  /// Fires at the n-th pass (n >= 1) of `point` by the component called `who` ("" = any component).
  void arm(std::string point, std::uint64_t n, std::string who = {}) {
    std::lock_guard lock(state_->mu);
    state_->armed[{std::move(point), std::move(who)}] = n;
  }
  void disarm_all() {
    std::lock_guard lock(state_->mu);
    state_->armed.clear();
  }
  std::uint64_t fired() const { return state_->fired.load(); }

  /// Called by the library at each point; fires when an armed count reaches zero.
  void pass(std::string_view point, std::string_view who) {
    bool fire = false;
    {
      std::lock_guard lock(state_->mu);
      for (auto key : {std::pair{std::string(point), std::string(who)}, std::pair{std::string(point), std::string()}}) {
        auto it = state_->armed.find(key);
        if (it != state_->armed.end() && --it->second == 0) {
          state_->armed.erase(it);
          fire = true;
          break;
        }
      }
    }
    if (!fire) return;
    ++state_->fired;
    const std::string what = "injected crash at " + std::string(point) + " in " + std::string(who);
    if (state_->on_fire) state_->on_fire(what);
    throw injected_crash(what);
  }

 private:
  struct shared {
    std::mutex mu;
    std::map<std::pair<std::string, std::string>, std::uint64_t> armed;
    std::atomic<std::uint64_t> fired{0};
    std::function<void(const std::string&)> on_fire;
  };
  std::shared_ptr<shared> state_ = std::make_shared<shared>();
};

static_assert(CrashPoints<crash_points>);

}  // namespace bitrefit::testing
