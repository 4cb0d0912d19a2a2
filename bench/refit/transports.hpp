// bench/refit/transports.hpp — the transports the bench can measure, behind one switch.
//
// The harness is written once against the transport::Transport concept; a transport is plugged in
// by saying three things here:
//   1. service_command(): what runs on the ROLLOUT side of the link before anyone connects (the
//      `dir` transport's object server; a relay tree's root relay; an S3 server), or nothing;
//   2. with_transport(): how the trainer and each receiver build their Transport value, given the
//      address of that service as seen from their side (the trainer crosses the shaped link, the
//      receivers stay inside the rollout namespace);
//   3. its name in `known_transports`.
// Measured today: `dir` — the directory object store, served over TCP from the rollout side
// (object_server.hpp), reached through transport::object_store_transport. `relay` and `s3` plug in
// here when their branches land (see README: what each needs).
//
// probed_transport wraps any Transport to time the data plane: the window from the start of the
// first payload publish to the end of the last one, and the bytes published (a publish returns once
// the service took the frame, i.e. after it crossed the link).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/directory_store.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "object_server.hpp"
#include "options.hpp"

namespace bench {

namespace transport = bitrefit::transport;

inline const std::vector<std::string> known_transports{"dir"};

/// Where a role reaches the rollout-side service, and how its sends are paced.
struct transport_endpoint {
  std::string kind = "dir";
  std::string host = "127.0.0.1";
  int port = 0;
  std::shared_ptr<token_bucket> limiter;  // loopback fallback, trainer side only
  std::chrono::milliseconds poll{5};
};

/// The rollout-side service of `kind` as a command line of this binary (or another program), run
/// inside the rollout namespace. It must write the TCP port it listens on to `port_file`.
inline std::vector<std::string> service_command(const std::string& kind, const std::string& self, const std::string& dir,
                                                const std::string& port_file) {
  if (kind == "dir") return {self, "--role", "store", "--session", dir, "--port", "0", "--port-file", port_file};
  usage("transport '" + kind + "' is not built on this branch (known: dir)");
}

/// Calls fn(transport) with the Transport of `ep.kind`; returns fn's result.
template <class Fn>
decltype(auto) with_transport(const transport_endpoint& ep, Fn&& fn) {
  if (ep.kind == "dir") {
    tcp_object_store store(ep.host, static_cast<std::uint16_t>(ep.port), ep.limiter);
    transport::object_store_transport_options to;
    to.max_poll_interval = ep.poll;
    return fn(transport::object_store_transport<tcp_object_store>(std::move(store), to));
  }
  usage("transport '" + ep.kind + "' is not built on this branch (known: dir)");
}

// ---- data-plane timing ---------------------------------------------------------------------

struct publish_probe {
  using clock = std::chrono::steady_clock;
  std::mutex mu;
  std::optional<clock::time_point> first_start, last_end;
  std::uint64_t bytes = 0, frames = 0;

  void reset() {
    std::lock_guard lock(mu);
    first_start.reset();
    last_end.reset();
    bytes = frames = 0;
  }
  /// Seconds from the first publish's start to the last publish's end (0 when nothing was published).
  double window_s() {
    std::lock_guard lock(mu);
    if (!first_start || !last_end) return 0;
    return std::chrono::duration<double>(*last_end - *first_start).count();
  }
};

template <transport::Transport T>
class probed_transport {
 public:
  probed_transport(T inner, std::shared_ptr<publish_probe> p) : inner_(std::move(inner)), p_(std::move(p)) {}

  void publish(const transport::frame_key& k, std::span<const std::byte> b) {
    const auto t0 = publish_probe::clock::now();
    inner_.publish(k, b);
    const auto t1 = publish_probe::clock::now();
    std::lock_guard lock(p_->mu);
    if (!p_->first_start || t0 < *p_->first_start) p_->first_start = t0;
    if (!p_->last_end || t1 > *p_->last_end) p_->last_end = t1;
    p_->bytes += b.size();
    p_->frames += 1;
  }
  std::vector<transport::frame_key> list(const transport::stream_key& s) { return inner_.list(s); }
  std::optional<transport::bytes> fetch(const transport::frame_key& k) { return inner_.fetch(k); }
  void discard(const transport::stream_key& s) { inner_.discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { inner_.post(m, b); }
  std::vector<transport::bytes> receive(const std::string& m, std::chrono::milliseconds wait) { return inner_.receive(m, wait); }

  T& inner() noexcept { return inner_; }

 private:
  T inner_;
  std::shared_ptr<publish_probe> p_;
};

}  // namespace bench
