// examples/cli/progress.hpp — a progress bar for long work, shown only on a terminal.
//
// Shown on stderr when stderr is a TTY (or forced with --progress=always), so pipes, logs and
// --json consumers on stdout never see control characters. It is throttled to ~10 redraws per
// second and shows the phase, a bar, bytes done / total and the average rate of the phase.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "bitrefit/ops/progress.hpp"

namespace bitrefit::cli {

enum class progress_mode { automatic, always, never };

/// "1.50 GiB", "12.0 MiB", "512 B".
inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f %s", b, units[u]);
  else std::snprintf(buf, sizeof buf, "%.*f %s", b < 10 ? 2 : (b < 100 ? 1 : 0), b, units[u]);
  return buf;
}

class progress_bar {
 public:
  using clock = std::chrono::steady_clock;

  progress_bar(std::string phase, std::uint64_t total_bytes, progress_mode mode)
      : phase_(std::move(phase)), total_(total_bytes), start_(clock::now()), last_draw_(start_) {
    enabled_ = mode == progress_mode::always || (mode == progress_mode::automatic && ::isatty(STDERR_FILENO) == 1);
  }
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;
  ~progress_bar() { finish(); }

  /// Records `done` bytes of the phase done (monotonic; larger than total is clamped).
  void update(std::uint64_t done) {
    done_ = done < total_ ? done : total_;
    if (!enabled_) return;
    const auto now = clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100) && done_ != total_) return;
    last_draw_ = now;
    draw(now);
  }
  void advance(std::uint64_t bytes) { update(done_ + bytes); }

  /// Draws the final state and ends the line (once).
  void finish() {
    if (!enabled_ || finished_) return;
    finished_ = true;
    if (!drawn_ || drawn_done_ != done_) draw(clock::now());
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }

  bool enabled() const noexcept { return enabled_; }
  double seconds() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

 private:
  void draw(clock::time_point now) {
    drawn_ = true;
    drawn_done_ = done_;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    constexpr int width = 30;
    const int fill = static_cast<int>(frac * width);
    std::string bar(static_cast<std::size_t>(fill), '#');
    bar.append(static_cast<std::size_t>(width - fill), '-');
    const double rate = s > 0 ? static_cast<double>(done_) / s : 0.0;
    std::fprintf(stderr, "\r%-8s [%s] %3.0f%% %s / %s  %s/s\x1b[K", phase_.c_str(), bar.c_str(), frac * 100.0,
                 human_bytes(static_cast<double>(done_)).c_str(), human_bytes(static_cast<double>(total_)).c_str(),
                 human_bytes(rate).c_str());
    std::fflush(stderr);
  }

  std::string phase_;
  std::uint64_t total_ = 0, done_ = 0;
  clock::time_point start_, last_draw_;
  std::uint64_t drawn_done_ = 0;
  bool enabled_ = false, finished_ = false, drawn_ = false;
};

}  // namespace bitrefit::cli

namespace bitrefit::cli {

/// For a phase whose progress the library does not report (encoding, verify+apply): on a
/// terminal, shows "PHASE ..." while it runs and "PHASE done in S s" when it ends.
class phase_notice {
 public:
  phase_notice(std::string phase, std::uint64_t bytes, progress_mode mode) : phase_(std::move(phase)), bytes_(bytes) {
    enabled_ = mode == progress_mode::always || (mode == progress_mode::automatic && ::isatty(STDERR_FILENO) == 1);
    if (enabled_) {
      std::fprintf(stderr, "%-8s ... (%s)\x1b[K", phase_.c_str(), human_bytes(static_cast<double>(bytes_)).c_str());
      std::fflush(stderr);
    }
  }
  phase_notice(const phase_notice&) = delete;
  phase_notice& operator=(const phase_notice&) = delete;
  ~phase_notice() {
    if (!enabled_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (std::uncaught_exceptions() > exceptions_) {
      std::fprintf(stderr, "\r%-8s failed after %.2f s\x1b[K\n", phase_.c_str(), s);
      return;
    }
    std::fprintf(stderr, "\r%-8s done in %.2f s, %s/s\x1b[K\n", phase_.c_str(), s,
                 human_bytes(s > 0 ? static_cast<double>(bytes_) / s : 0.0).c_str());
    std::fflush(stderr);
  }

 private:
  std::string phase_;
  std::uint64_t bytes_;
  bool enabled_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int exceptions_ = std::uncaught_exceptions();
};

/// The library operations' progress (ops::progress) drawn on a terminal: a bar for counted
/// phases, a "PHASE ... done in S s" notice for the others.
class terminal_progress final : public ops::progress {
 public:
  explicit terminal_progress(progress_mode mode) : mode_(mode) {}
  void begin(std::string_view phase, std::uint64_t total_bytes, bool counted) override {
    if (counted) bar_.emplace(std::string(phase), total_bytes, mode_);
    else notice_.emplace(std::string(phase), total_bytes, mode_);
  }
  void update(std::uint64_t done) override {
    if (bar_) bar_->update(done);
  }
  void end(bool) override {
    bar_.reset();  // finishes the line
    notice_.reset();  // prints "done" or, while unwinding, "failed"
  }

 private:
  progress_mode mode_;
  std::optional<progress_bar> bar_;
  std::optional<phase_notice> notice_;
};

}  // namespace bitrefit::cli
