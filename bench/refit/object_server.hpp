// bench/refit/object_server.hpp — an ObjectStore served over TCP, so the directory store can sit
// behind a network link.
//
// Why it exists: the directory object store (transport/directory_store.hpp) is a filesystem, and
// processes in different network namespaces still share one filesystem — a trainer writing frames
// into the directory would never touch the rate-limited veth link. To measure the `dir` transport
// over a link, the bench runs this server on the ROLLOUT side of the link, holding a
// directory_store, and both sides reach it through `tcp_object_store` (a client that models the
// ObjectStore concept). The trainer's PUTs cross the shaped trainer->rollout link exactly once per
// frame (as with a bucket in the rollout cluster's region, or a relay tree's root); receivers GET
// over the unshaped rollout-side loopback. The engine is unchanged: it sees
// transport::object_store_transport<tcp_object_store>, a Transport like any other.
//
// Wire format (little-endian), one request at a time per connection:
//   request:  u8 op ('P' put, 'G' get, 'L' list, 'R' remove, 'X' prune) | u32 key length |
//             u64 body length | key | body (put only)
//   response: u8 status (0 ok, 1 absent, 2 error) | u64 body length | body
//             (get: the object; list: keys joined by '\n'; error: the server's message)
// It is bench machinery: no authentication (the link is a veth pair between namespaces the bench
// created, or loopback), request sizes bounded, one thread per connection.
#pragma once

#include <utility>  // before Asio (Boost 1.74's Asio needs it for its coroutine support)

#include <boost/asio.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "token_bucket.hpp"

namespace bench {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using bitrefit::errc;
using bitrefit::error;
using bytes = bitrefit::transport::bytes;

namespace wire_detail {

inline constexpr std::uint32_t max_key = 4096;
inline constexpr std::uint64_t max_body = 8ull << 30;
inline constexpr std::size_t request_header_size = 1 + 4 + 8;
inline constexpr std::size_t response_header_size = 1 + 8;

inline void put_le(std::byte* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}
inline std::uint64_t get_le(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace wire_detail

/// Serves `store` on `acceptor` until the process ends (the bench stops the server with SIGTERM).
/// Every connection gets its own thread; a malformed request closes that connection only.
template <bitrefit::transport::ObjectStore Store>
void serve_objects(Store& store, tcp::acceptor& acceptor) {
  using namespace wire_detail;
  for (;;) {
    auto sock = std::make_shared<tcp::socket>(acceptor.get_executor());
    boost::system::error_code ec;
    acceptor.accept(*sock, ec);
    if (ec) continue;
    sock->set_option(tcp::no_delay(true), ec);
    std::thread([&store, sock] {
      bytes body;
      try {
        for (;;) {
          std::byte h[request_header_size];
          asio::read(*sock, asio::buffer(h, sizeof h));
          const char op = static_cast<char>(h[0]);
          const auto klen = static_cast<std::uint32_t>(get_le(h + 1, 4));
          const std::uint64_t blen = get_le(h + 5, 8);
          if (klen > max_key || blen > max_body) return;  // not our client: drop the connection
          std::string key(klen, '\0');
          asio::read(*sock, asio::buffer(key.data(), klen));
          body.resize(blen);
          if (blen) asio::read(*sock, asio::buffer(body.data(), blen));
          std::uint8_t status = 0;
          std::optional<bytes> got;
          std::string text;
          try {
            switch (op) {
              case 'P': store.put(key, body); break;
              case 'G': got = store.get(key); status = got ? 0 : 1; break;
              case 'L':
                for (const auto& k : store.list(key)) text += k + "\n";
                break;
              case 'R': store.remove(key); break;
              case 'X':
                if constexpr (requires { store.prune(key); }) store.prune(key);
                break;
              default: return;
            }
          } catch (const std::exception& e) {
            status = 2;
            text = e.what();
          }
          std::span<const std::byte> out = got ? std::span<const std::byte>(*got) : std::as_bytes(std::span(text.data(), text.size()));
          std::byte rh[response_header_size];
          rh[0] = static_cast<std::byte>(status);
          put_le(rh + 1, out.size(), 8);
          const std::array<asio::const_buffer, 2> bufs{asio::buffer(rh, sizeof rh), asio::buffer(out.data(), out.size())};
          asio::write(*sock, bufs);
        }
      } catch (const std::exception&) {
        // peer closed or sent garbage: this connection ends, the server goes on
      }
    }).detach();
  }
}

/// Byte counters of one client (what it wrote and read on its sockets, application bytes).
struct wire_counters {
  std::atomic<std::uint64_t> sent{0}, received{0}, requests{0};
};

/// An ObjectStore whose objects live in a `serve_objects` server. Copies share one connection
/// pool, counters and limiter (the engine moves its transport around; all copies are one client).
/// Thread-safe: each request borrows a connection of its own (the sender's encode workers publish
/// concurrently while its driver thread polls the control plane).
class tcp_object_store {
 public:
  /// @param limiter paces what this client SENDS (the loopback fallback's link); null: unpaced.
  tcp_object_store(std::string host, std::uint16_t port, std::shared_ptr<token_bucket> limiter = nullptr)
      : s_(std::make_shared<shared>()) {
    s_->endpoint = tcp::endpoint(asio::ip::make_address(host), port);
    s_->limiter = std::move(limiter);
  }

  void put(const std::string& key, std::span<const std::byte> b) { call('P', key, b, nullptr); }
  std::optional<bytes> get(const std::string& key) {
    bytes out;
    if (call('G', key, {}, &out) == 1) return std::nullopt;
    return out;
  }
  std::vector<std::string> list(const std::string& prefix) {
    bytes out;
    call('L', prefix, {}, &out);
    std::vector<std::string> keys;
    std::string cur;
    for (std::byte c : out) {
      if (static_cast<char>(c) == '\n') keys.push_back(std::exchange(cur, {}));
      else cur.push_back(static_cast<char>(c));
    }
    return keys;
  }
  void remove(const std::string& key) { call('R', key, {}, nullptr); }
  void prune(const std::string& key) { call('X', key, {}, nullptr); }

  const wire_counters& counters() const noexcept { return s_->counters; }
  const std::shared_ptr<token_bucket>& limiter() const noexcept { return s_->limiter; }

 private:
  struct shared {
    asio::io_context io;
    tcp::endpoint endpoint;
    std::mutex mu;
    std::vector<std::unique_ptr<tcp::socket>> idle;
    std::shared_ptr<token_bucket> limiter;
    wire_counters counters;
  };

  std::unique_ptr<tcp::socket> borrow() {
    {
      std::lock_guard lock(s_->mu);
      if (!s_->idle.empty()) {
        auto s = std::move(s_->idle.back());
        s_->idle.pop_back();
        return s;
      }
    }
    auto s = std::make_unique<tcp::socket>(s_->io);
    boost::system::error_code ec;
    for (int attempt = 0; attempt < 50; ++attempt) {  // the server may still be starting
      s->connect(s_->endpoint, ec);
      if (!ec) break;
      s->close();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (ec)
      throw error(errc::io, "cannot connect to the object server: " + ec.message(),
                  {.file = s_->endpoint.address().to_string() + ":" + std::to_string(s_->endpoint.port()), .tensor = {}, .field = {}});
    s->set_option(tcp::no_delay(true));
    return s;
  }
  void give_back(std::unique_ptr<tcp::socket> s) {
    std::lock_guard lock(s_->mu);
    s_->idle.push_back(std::move(s));
  }

  /// One request/response; returns the status (0 ok, 1 absent); throws errc::io on errors.
  int call(char op, const std::string& key, std::span<const std::byte> body, bytes* out) {
    using namespace wire_detail;
    auto sock = borrow();
    std::uint8_t status = 0;
    try {
      std::vector<std::byte> head(request_header_size + key.size());
      head[0] = static_cast<std::byte>(op);
      put_le(head.data() + 1, key.size(), 4);
      put_le(head.data() + 5, body.size(), 8);
      std::memcpy(head.data() + request_header_size, key.data(), key.size());
      send(*sock, head);
      for (std::size_t off = 0; off < body.size(); off += piece) send(*sock, body.subspan(off, std::min(piece, body.size() - off)));
      std::byte rh[response_header_size];
      asio::read(*sock, asio::buffer(rh, sizeof rh));
      status = std::to_integer<std::uint8_t>(rh[0]);
      const std::uint64_t n = get_le(rh + 1, 8);
      bytes tmp;
      bytes& dst = out ? *out : tmp;
      dst.resize(n);
      if (n) asio::read(*sock, asio::buffer(dst.data(), n));
      s_->counters.received += sizeof rh + n;
      s_->counters.requests += 1;
      if (status == 2)
        throw error(errc::io, "object server: " + std::string(reinterpret_cast<const char*>(dst.data()), dst.size()),
                    {.file = key, .tensor = {}, .field = {}});
    } catch (const boost::system::system_error& e) {
      throw error(errc::io, std::string("object server connection failed: ") + e.what(), {.file = key, .tensor = {}, .field = {}});
    }
    give_back(std::move(sock));
    return status;
  }

  static constexpr std::size_t piece = 64 * 1024;  // pacing granularity of the limiter

  void send(tcp::socket& sock, std::span<const std::byte> b) {
    if (s_->limiter) s_->limiter->acquire(b.size());
    asio::write(sock, asio::buffer(b.data(), b.size()));
    s_->counters.sent += b.size();
  }

  std::shared_ptr<shared> s_;
};

static_assert(bitrefit::transport::ObjectStore<tcp_object_store>);

}  // namespace bench
