// bitrefit/ops/progress.hpp — how long checkpoint operations report progress and phase times.
//
// The operations (ops/checkpoint_ops.hpp) run for seconds to minutes on real checkpoints, so they
// report two things: which phase runs and how many of its bytes are done (a `progress` sink: the
// CLI draws a bar on a terminal, the Python binding calls back into Python or stays silent), and
// how long each named phase took (`phase_timer`, returned with every result). The library never
// writes to a terminal itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bitrefit::ops {

/// Receives the progress of one operation. Phases do not nest: begin, updates, end, then the next.
/// `counted` is false for a phase whose bytes the library cannot count as it goes (encoding,
/// verify+apply): it gets begin and end only, with `total_bytes` the bytes the phase processes.
/// Calls come from the thread that runs the operation; an exception thrown by a sink aborts the
/// operation (nothing is written, as for any other failure).
class progress {
 public:
  virtual ~progress() = default;
  virtual void begin(std::string_view /*phase*/, std::uint64_t /*total_bytes*/, bool /*counted*/) {}
  /// `done` grows monotonically within a phase and never exceeds its total.
  virtual void update(std::uint64_t /*done*/) {}
  /// `ok` is false when the phase ends by an exception.
  virtual void end(bool /*ok*/) {}
};

/// The sink that reports nothing (the default).
inline progress& no_progress() {
  static progress silent;
  return silent;
}

/// One phase on a sink: begin at construction, end (ok unless unwinding) at destruction.
class progress_phase {
 public:
  progress_phase(progress& sink, std::string_view phase, std::uint64_t total_bytes, bool counted = true)
      : sink_(sink), total_(total_bytes) {
    sink_.begin(phase, total_bytes, counted);
  }
  progress_phase(const progress_phase&) = delete;
  progress_phase& operator=(const progress_phase&) = delete;
  ~progress_phase() { sink_.end(std::uncaught_exceptions() == exceptions_); }

  void update(std::uint64_t done) { sink_.update(done < total_ ? done : total_); }

 private:
  progress& sink_;
  std::uint64_t total_;
  int exceptions_ = std::uncaught_exceptions();
};

struct phase_time {
  std::string name;
  double seconds = 0;
};

/// Measures named phases: `auto p = t.phase("read");` ... the phase ends when p is destroyed.
class phase_timer {
 public:
  class scope {
   public:
    scope(std::vector<phase_time>& out, std::string name)
        : out_(out), name_(std::move(name)), start_(std::chrono::steady_clock::now()) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() {
      out_.push_back({name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()});
    }

   private:
    std::vector<phase_time>& out_;
    std::string name_;
    std::chrono::steady_clock::time_point start_;
  };
  scope phase(std::string name) { return scope(phases, std::move(name)); }
  std::vector<phase_time> phases;
};

}  // namespace bitrefit::ops
