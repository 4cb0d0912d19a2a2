// bitrefit/refit/faults.hpp — deterministic crash points inside the engine.
//
// Tests and the demo arm a point with a count; when the engine passes the point for the n-th time
// it "crashes": by default it throws refit::injected_crash (the in-process tests catch it where a
// process would die and drop every bit of volatile state), or the demo installs `crash` = _exit so
// a real OS process dies there. Points:
//   receiver_applied        a receiver, after its n-th applied (or staged) payload of an attempt
//   coordinator_before_ack  the coordinator, on its n-th ack of a transition, before stepping it:
//                           receivers applied (n of them acked), no compare-and-set yet
//   coordinator_stopping    the coordinator, on its n-th obsolete message (mid stop_and_wait)
//   coordinator_after_cas   the coordinator, after a successful compare-and-set, before announcing
//   owner_mid_stream        an owner, after publishing its n-th frame of an attempt
// Payload-object faults (duplicate, reorder, delay, corrupt) live in transport/faulty.hpp.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace bitrefit::refit {

struct injected_crash : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class fault_point { receiver_applied, coordinator_after_cas, owner_mid_stream, coordinator_before_ack, coordinator_stopping };

constexpr const char* fault_point_name(fault_point p) {
  switch (p) {
    case fault_point::receiver_applied: return "receiver_applied";
    case fault_point::coordinator_after_cas: return "coordinator_after_cas";
    case fault_point::owner_mid_stream: return "owner_mid_stream";
    case fault_point::coordinator_before_ack: return "coordinator_before_ack";
    case fault_point::coordinator_stopping: return "coordinator_stopping";
  }
  return "?";
}

/// Shared by every component of one process (or one test). Arming is one-shot: a point fires
/// once, at the n-th pass after it was armed, then disarms itself.
class fault_injector {
 public:
  std::function<void(const std::string&)> crash = [](const std::string& what) { throw injected_crash(what); };

  /// Fires at the n-th pass (n >= 1) of `p` by the component called `who` ("" = any component).
  void arm(fault_point p, std::uint64_t n, std::string who = {}) {
    std::lock_guard lock(mu_);
    armed_[{p, who}] = n;
  }
  void disarm_all() {
    std::lock_guard lock(mu_);
    armed_.clear();
  }
  std::uint64_t fired() const { return fired_.load(); }

  /// Called by the engine at each point; crashes when an armed count reaches zero.
  void pass(fault_point p, const std::string& who) {
    bool fire = false;
    {
      std::lock_guard lock(mu_);
      for (auto key : {std::pair{p, who}, std::pair{p, std::string()}}) {
        auto it = armed_.find(key);
        if (it != armed_.end() && --it->second == 0) {
          armed_.erase(it);
          fire = true;
          break;
        }
      }
    }
    if (fire) {
      ++fired_;
      crash(std::string("injected crash at ") + fault_point_name(p) + " in " + who);
    }
  }

 private:
  std::mutex mu_;
  std::map<std::pair<fault_point, std::string>, std::uint64_t> armed_;
  std::atomic<std::uint64_t> fired_{0};
};

}  // namespace bitrefit::refit
