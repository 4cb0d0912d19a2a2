// bench/refit/session.hpp — what every process of a session shares: clocks, the stop signal,
// bench messages on the control plane ("bench/..." mailboxes, outside the protocol) and the
// attestation digest the bit-exactness check compares.
#pragma once

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/placement.hpp"
#include "transports.hpp"

namespace bench {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using namespace bitrefit;

inline double since(steady::time_point t0) { return std::chrono::duration<double>(steady::now() - t0).count(); }

/// CPU seconds (user + system) this process used so far.
inline double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// The machine's 1-minute load average (context for the noise of a shared machine).
inline double loadavg_1m() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return l;
}

inline std::atomic<bool> stop_requested{false};
inline void install_stop_handler() {
  std::signal(SIGTERM, [](int) { stop_requested = true; });
  std::signal(SIGINT, [](int) { stop_requested = true; });
}

inline std::span<const std::byte> as_span(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }
inline json parse_json(const transport::bytes& b) {
  return json::parse(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}
inline json digest_json(const digest128& d) {
  char b[40];
  std::snprintf(b, sizeof b, "%016llx%016llx", static_cast<unsigned long long>(d.high64), static_cast<unsigned long long>(d.low64));
  return b;
}

inline digest128 attestation_of(const model_manifest& m, const layout::canonical_store& s) {
  return refit::expected_attestation(m, refit::placement{}, [&](const tensor_info& t) { return s.bytes(t.name); });
}

/// Application bytes of the `dir` client (what it wrote / read on its sockets), when the transport
/// has such counters.
template <class T>
std::optional<std::pair<std::uint64_t, std::uint64_t>> app_counters(T& net) {
  if constexpr (requires { net.inner().store().counters(); }) {
    const auto& c = net.inner().store().counters();
    return std::pair{c.sent.load(), c.received.load()};
  } else if constexpr (requires { net.store().counters(); }) {
    const auto& c = net.store().counters();
    return std::pair{c.sent.load(), c.received.load()};
  } else {
    return std::nullopt;
  }
}

}  // namespace bench
