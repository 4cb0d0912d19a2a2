// bench/common/process_memory.hpp — what the benches read about their own process's memory, and the
// fork-and-measure shape the memory benches share. Bench-only (no CMakeLists here: bench/CMakeLists
// adds only folders that have one); a bench includes it as "../common/process_memory.hpp".
//
// Why a child per measured path: VmHWM (peak resident set) only grows, and a freed heap block stays
// resident in the allocator, so two paths measured in one process would see each other's peaks.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>

namespace bitrefit_bench {

/// A "Key:" field of /proc/self/status in KiB (e.g. "VmRSS:", "VmHWM:"); -1 when the field is absent.
inline long status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::size_t n = std::strlen(key);
  for (std::string l; std::getline(f, l);)
    if (l.compare(0, n, key) == 0) return std::stol(l.substr(n));
  return -1;
}

/// Resets VmHWM to the current VmRSS, so the next status_kib("VmHWM:") is the peak since this call.
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// Runs `measure()` (returning the text to report) in a forked child with a fresh peak and returns
/// that text. The child's failure (a nonzero status, a signal, or a throw) ends this process with a
/// message naming `what`: a bench never reports a path that did not run.
template <class Measure>
std::string in_child(const char* bench, const std::string& what, Measure measure) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::fprintf(stderr, "%s: pipe: %s\n", bench, std::strerror(errno));
    std::exit(2);
  }
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "%s: fork: %s\n", bench, std::strerror(errno));
    std::exit(2);
  }
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    try {
      out = measure();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s: %s\n", bench, what.c_str(), e.what());
      std::_Exit(3);
    }
    for (std::size_t at = 0; at < out.size();) {
      const ssize_t w = write(fds[1], out.data() + at, out.size() - at);
      if (w <= 0) std::_Exit(4);
      at += static_cast<std::size_t>(w);
    }
    std::_Exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "%s: the %s child failed (status %d)\n", bench, what.c_str(), st);
    std::exit(1);
  }
  return out;
}

}  // namespace bitrefit_bench
