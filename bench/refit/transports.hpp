// bench/refit/transports.hpp — the transports the bench can measure, behind one switch.
//
// The harness is written once against the transport::Transport concept; a transport is plugged in
// by saying three things here:
//   1. service_command(): what runs on the ROLLOUT side of the link before anyone connects, writing
//      the TCP port it listens on to a file;
//   2. with_transport(): how the trainer and each receiver build their Transport value, given the
//      address of that service as seen from their side (the trainer crosses the shaped link, the
//      receivers stay inside the rollout namespace);
//   3. its name in `known_transports` (and, when it needs something the machine may lack, in
//      transport_unavailable()).
// The three:
//   dir    the directory object store, served over TCP from the rollout side (object_server.hpp),
//          reached through transport::object_store_transport;
//   relay  the relay tree (transport/relay/): the service is the ROOT relay (role relay-root, with a
//          throwaway cluster CA in the session directory); the trainer is an owner attached to it
//          across the link, each rollout process a member below it (mutual TLS on every link);
//   s3     S3 (transport/s3_store.hpp) on moto's server (role s3-server: starts
//          `python3 -m moto.server` on a free port of the rollout side, creates the bucket, stops
//          moto when stopped); both sides use object_store_transport<s3_store>.
// The loopback fallback (no namespaces) paces the trainer's sends with a token bucket: inside the
// `dir` client (it counts every byte it writes), and for relay and s3 by paced_transport below
// (payload frames and control messages the trainer publishes/posts).
//
// probed_transport wraps any Transport to time the data plane: the window from the start of the
// first payload publish to the end of the last one, and the bytes published. For dir and s3 a
// publish returns once the service holds the frame, i.e. after it crossed the link; the relay
// owner's publish returns once the frame is queued for the root (relay_owner_queue_bytes below
// bounds how far the queue runs ahead of the wire).
#pragma once

#include <utility>  // before Asio (Boost 1.74's Asio needs it for its coroutine support)

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/any_transport.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/directory_store.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "bitrefit/transport/relay/pki.hpp"
#include "bitrefit/transport/relay/tree_transport.hpp"
#include "bitrefit/transport/s3_store.hpp"
#include "object_server.hpp"
#include "options.hpp"

namespace bench {

namespace transport = bitrefit::transport;
namespace relay = bitrefit::transport::relay;

inline const std::vector<std::string> known_transports{"dir", "relay", "s3"};

/// Where a role reaches the rollout-side service, and how its sends are paced.
struct transport_endpoint {
  std::string kind = "dir";
  std::string host = "127.0.0.1";
  int port = 0;
  std::shared_ptr<token_bucket> limiter;  // loopback fallback, trainer side only
  std::chrono::milliseconds poll{5};
  std::string session;  // relay: the session directory (certificates, the attach rendezvous)
  int index = -1;       // -1: the trainer; else the rollout process's receiver index
  int receivers = 0;
};

/// The Python that can run moto's server ($BITREFIT_PYTHON, python3, /usr/bin/python3), or "".
inline std::string moto_python() {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("BITREFIT_PYTHON"); p && *p) candidates.push_back(p);
  candidates.insert(candidates.end(), {"python3", "/usr/bin/python3"});
  for (const auto& py : candidates) {
    const std::string cmd = "'" + py + "' -c 'import moto.server, sys; print(sys.executable)' 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> f(::popen(cmd.c_str(), "r"), ::pclose);
    if (!f) continue;
    char buf[4096];
    std::string exe;
    while (std::fgets(buf, sizeof buf, f.get())) exe += buf;
    while (!exe.empty() && (exe.back() == '\n' || exe.back() == '\r')) exe.pop_back();
    if (!exe.empty()) return exe;
  }
  return {};
}

/// Why `kind` cannot run on this machine, or "" (the orchestrator skips it and says why).
inline std::string transport_unavailable(const std::string& kind) {
  if (kind == "s3" && moto_python().empty())
    return "moto is not installed (no Python among $BITREFIT_PYTHON, python3, /usr/bin/python3 can import moto.server; "
           "scripts/install-deps.sh installs it)";
  return {};
}

/// The rollout-side service of `kind` as a command line of this binary, run inside the rollout
/// namespace. It writes the TCP port it listens on to `port_file` once clients may connect.
inline std::vector<std::string> service_command(const options& o, const std::string& kind, const std::string& self, const std::string& dir,
                                                const std::string& port_file) {
  if (kind == "dir") return {self, "--role", "store", "--session", dir, "--port", "0", "--port-file", port_file};
  if (kind == "relay" || kind == "s3")
    return {self, "--role", kind == "relay" ? "relay-root" : "s3-server", "--session", dir, "--port-file", port_file,
            "--receivers", std::to_string(o.receivers)};
  usage("unknown transport '" + kind + "' (known: dir, relay, s3)");
}

// ---- relay --------------------------------------------------------------------------------------

/// How far the owner's queue may run ahead of the link: small, so that a publish returning means
/// the frame is at most this many bytes from having crossed (the probe's wire window), yet enough
/// to keep a 1 Gbit/s link busy (8 MiB = 67 ms at 1 Gbit/s).
inline constexpr std::uint64_t relay_owner_queue_bytes = 8ull << 20;

inline std::string relay_node_name(int index) { return index < 0 ? "trainer" : "receiver-" + std::to_string(index); }

inline relay::node_options relay_options(const std::string& session, relay::node_role role, const std::string& name) {
  relay::node_options n;
  n.role = role;
  n.name = name;
  n.cluster = "bitrefit-bench-refit";
  n.tls = relay::pki::files(std::filesystem::path(session) / "pki", name);
  n.fanout = 4;
  n.owner_queue_bytes = relay_owner_queue_bytes;
  n.publish_timeout = std::chrono::milliseconds(120'000);  // a dense version at 200 Mbit/s queues behind its predecessors
  const auto log = std::filesystem::path(session) / "relay.log";
  n.log = [log](std::string_view line) {
    if (FILE* f = std::fopen(log.c_str(), "a")) {
      std::fprintf(f, "%.*s\n", static_cast<int>(line.size()), line.data());
      std::fclose(f);
    }
  };
  return n;
}

/// The root relay, in the rollout namespace: issues the cluster's certificates (CA, root, trainer,
/// receivers), listens on every address of the namespace (the trainer comes in over the veth, the
/// members over loopback), writes its port, and serves until stopped.
inline int run_relay_root(const options& o, const std::atomic<bool>& stop) {
  const auto pki = std::filesystem::path(o.session) / "pki";
  relay::pki::make_cluster_ca(pki, "bitrefit-bench-refit");
  relay::pki::issue(pki, "root");
  relay::pki::issue(pki, "trainer");
  for (int r = 0; r < o.receivers; ++r) relay::pki::issue(pki, relay_node_name(r));
  auto n = relay_options(o.session, relay::node_role::root, "root");
  n.listen_host = "0.0.0.0";
  n.advertise_host = "127.0.0.1";  // children of members are in the rollout namespace too
  relay::tree_transport root(n);
  const std::string port = std::to_string(root.listening().port);
  bitrefit::io::write_file_atomically(o.port_file, std::as_bytes(std::span(port.data(), port.size())), false);
  while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  root.stop();
  return 0;
}

/// The relay tree routes a control message only along links that exist: a message for the trainer
/// side posted before the owner attached, or for a receiver before its member attached, is dropped
/// at the root. So the trainer and the rollout processes meet before any of them posts: each
/// member writes <session>/attached/<name> once attached; the trainer waits for all of them, then
/// writes attached/trainer after its own attach; the members wait for that.
inline void relay_rendezvous(const transport_endpoint& ep, relay::tree_transport& t) {
  const auto dir = std::filesystem::path(ep.session) / "attached";
  std::filesystem::create_directories(dir);
  if (!t.wait_attached(std::chrono::seconds(60)))
    throw bitrefit::error(bitrefit::errc::io, relay_node_name(ep.index) + " could not attach to the root relay",
                          {.file = (std::filesystem::path(ep.session) / "relay.log").string(), .tensor = {}, .field = "relay"});
  auto wait_for = [&](const std::string& name) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (!std::filesystem::exists(dir / name)) {
      if (std::chrono::steady_clock::now() > until)
        throw bitrefit::error(bitrefit::errc::io, "relay rendezvous: " + name + " never attached", {.file = dir.string(), .tensor = {}, .field = "relay"});
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  auto mark = [&](const std::string& name) { std::ofstream(dir / name) << "attached\n"; };
  if (ep.index < 0) {
    for (int r = 0; r < ep.receivers; ++r) wait_for(relay_node_name(r));
    mark("trainer");
  } else {
    mark(relay_node_name(ep.index));
    wait_for("trainer");
  }
}

// ---- s3 (moto) ----------------------------------------------------------------------------------

inline const std::string bench_bucket = "bitrefit-bench-refit";

inline transport::s3_options bench_s3_options(const std::string& host, int port) {
  transport::s3_options s;
  s.endpoint = "http://" + host + ":" + std::to_string(port);
  s.bucket = bench_bucket;
  s.region = "us-east-1";
  s.credentials = transport::s3_credentials{"bench", "bench", ""};  // moto without IAM accepts any key
  return s;
}

/// moto's S3 server on a free port of the rollout side: started, the bench's bucket created (which
/// is also the readiness check), its port written; stopped (SIGTERM, then SIGKILL) when this
/// process is stopped.
inline int run_s3_server(const options& o, const std::atomic<bool>& stop) {
  const std::string py = moto_python();
  if (py.empty()) throw bitrefit::error(bitrefit::errc::io, transport_unavailable("s3"), {.file = {}, .tensor = {}, .field = "s3"});
  int port = 0;
  {  // a free port: bind port 0, read it, close (nothing else binds in a fresh namespace)
    asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::any(), 0));
    port = a.local_endpoint().port();
  }
  const auto log = std::filesystem::path(o.session) / "moto.log";
  const pid_t pid = ::fork();
  if (pid < 0) throw bitrefit::error(bitrefit::errc::io, "fork failed");
  if (pid == 0) {
    if (FILE* f = std::fopen(log.c_str(), "a")) {
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
    }
    const std::string p = std::to_string(port);
    ::execl(py.c_str(), py.c_str(), "-m", "moto.server", "-H", "0.0.0.0", "-p", p.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  auto kill_moto = [&] {
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  };
  try {
    auto so = bench_s3_options("127.0.0.1", port);
    so.retry.max_attempts = 1;
    so.connect_timeout = std::chrono::milliseconds(500);
    transport::s3_store store(so);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    for (;;) {
      try {
        store.create_bucket();
        break;
      } catch (const std::exception& e) {
        if (::waitpid(pid, nullptr, WNOHANG) == pid)
          throw bitrefit::error(bitrefit::errc::io, "moto exited at start", {.file = log.string(), .tensor = {}, .field = "s3"});
        if (std::chrono::steady_clock::now() > until)
          throw bitrefit::error(bitrefit::errc::io, std::string("moto did not answer within 90 s: ") + e.what(), {.file = log.string(), .tensor = {}, .field = "s3"});
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    const std::string ps = std::to_string(port);
    bitrefit::io::write_file_atomically(o.port_file, std::as_bytes(std::span(ps.data(), ps.size())), false);
    while (!stop && ::waitpid(pid, nullptr, WNOHANG) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } catch (...) {
    kill_moto();
    throw;
  }
  kill_moto();
  return 0;
}

// ---- pacing for the loopback fallback -----------------------------------------------------------

/// The trainer's sends through a token bucket (loopback fallback for transports whose client has
/// no limiter of its own): payload frames and control messages, counted in application bytes.
template <transport::Transport T>
class paced_transport {
 public:
  paced_transport(T inner, std::shared_ptr<token_bucket> b) : inner_(std::move(inner)), b_(std::move(b)) {}
  void publish(const transport::frame_key& k, std::span<const std::byte> b) {
    b_->acquire(b.size());
    inner_.publish(k, b);
  }
  std::vector<transport::frame_key> list(const transport::stream_key& s) { return inner_.list(s); }
  std::optional<transport::bytes> fetch(const transport::frame_key& k) { return inner_.fetch(k); }
  void discard(const transport::stream_key& s) { inner_.discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) {
    b_->acquire(b.size());
    inner_.post(m, b);
  }
  std::vector<transport::bytes> receive(const std::string& m, std::chrono::milliseconds wait) { return inner_.receive(m, wait); }

 private:
  T inner_;
  std::shared_ptr<token_bucket> b_;
};

/// `net` type-erased (one instantiation of the engine serves relay and s3), paced by `limiter` when
/// there is one.
template <class Net>
transport::any_transport erased(Net net, const std::shared_ptr<token_bucket>& limiter) {
  if (limiter) return transport::any_transport(paced_transport<Net>(std::move(net), limiter));
  return transport::any_transport(std::move(net));
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
  if (ep.kind == "relay") {
    auto n = relay_options(ep.session, ep.index < 0 ? relay::node_role::owner : relay::node_role::member, relay_node_name(ep.index));
    n.root = {ep.host, static_cast<std::uint16_t>(ep.port)};
    if (ep.index >= 0) {
      const auto r = static_cast<std::uint32_t>(ep.index);
      n.mailboxes = {"receiver/" + std::to_string(r), bitrefit::wire::restore_reply_mailbox(r), "bench/dense/" + std::to_string(r)};
    }
    relay::tree_transport t(n);
    relay_rendezvous(ep, t);
    return fn(erased(std::move(t), ep.limiter));
  }
  if (ep.kind == "s3") {
    auto so = bench_s3_options(ep.host, ep.port);
    so.prefix = std::filesystem::path(ep.session).filename().string() + "/";  // the session's own keys
    transport::object_store_transport_options to;
    to.max_poll_interval = ep.poll;
    return fn(erased(transport::object_store_transport<transport::s3_store>(transport::s3_store(so), to), ep.limiter));
  }
  usage("unknown transport '" + ep.kind + "' (known: dir, relay, s3)");
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
