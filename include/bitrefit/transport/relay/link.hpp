// bitrefit/transport/relay/link.hpp — one authenticated connection between two relay nodes.
//
// A link is a TCP socket under mutual TLS (tls.hpp) that carries framing messages. It knows
// nothing of trees, frames or mailboxes (node.hpp does); it only:
//  * connects (client) or takes an accepted socket (server) and runs the TLS handshake; no byte is
//    decoded before the handshake succeeded, and the whole TLS + hello exchange must finish within
//    handshake_timeout (a slowloris at connect costs one timer);
//  * reads in chunks into the framing decoder and hands each message to the node; the first
//    framing error closes the link with the decoder's reason;
//  * writes two queues: urgent messages (control, routes, want, ...) go out before bulk ones
//    (frame_begin / blocks / abort, in order), so acks never wait behind a payload; small messages
//    are coalesced into one write (batching per hop);
//  * pings when it sent nothing for `heartbeat`, answers pings, and closes a peer that sent
//    nothing for `peer_timeout` (naming whether it stalled mid-message);
//  * counts the bytes it carried (application level and, from TCP_INFO, on the wire).
// Every member function runs on the node's strand; completion handlers are bound to it, so the
// link needs no lock. close() is idempotent and reports the reason once.
#pragma once

#include <utility>  // Boost 1.74's Asio wants <utility> before it (coroutine support)

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "bitrefit/transport/relay/frame_store.hpp"
#include "bitrefit/transport/relay/framing.hpp"
#include "bitrefit/transport/relay/options.hpp"

namespace bitrefit::transport::relay {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using strand_t = asio::strand<asio::io_context::executor_type>;

/// What one link carried, both directions.
struct link_counters {
  std::uint64_t bytes_in = 0, bytes_out = 0;              // framing bytes (headers included), before TLS
  std::uint64_t frame_bytes_in = 0, frame_bytes_out = 0;  // payload frame bytes only
  std::uint64_t control_bytes_in = 0, control_bytes_out = 0;  // whole control messages (protocol traffic)
  std::uint64_t wire_bytes_in = 0, wire_bytes_out = 0;    // TCP payload bytes (TLS included), from TCP_INFO
  std::uint64_t messages_in = 0, messages_out = 0;
};

class link : public std::enable_shared_from_this<link> {
 public:
  struct callbacks {
    std::function<void(framing::decoded&&)> message;
    std::function<void(const std::string& reason)> closed;  // exactly once
    std::function<void()> writable;                         // the queue fell below the window
    std::function<void()> secured;                          // TLS done (client: send the hello now)
  };

  link(strand_t strand, asio::ssl::context& ctx, std::uint64_t id, const node_options& opt, framing::limits lim)
      : strand_(strand), stream_(strand, ctx), id_(id), opt_(opt), dec_(lim),
        timer_(strand), resolver_(strand), rbuf_(256 << 10) {}

  std::uint64_t id() const noexcept { return id_; }
  tcp::socket& socket() noexcept { return stream_.next_layer(); }
  const std::string& remote() const noexcept { return remote_; }
  bool is_open() const noexcept { return !closed_; }
  bool is_established() const noexcept { return established_; }

  /// Server side: `socket()` was just accepted.
  void accept(callbacks cb) {
    cb_ = std::move(cb);
    boost::system::error_code ec;
    const auto ep = socket().remote_endpoint(ec);
    remote_ = ec ? "?" : endpoint_spec{ep.address().to_string(), ep.port()}.to_string();
    socket().set_option(tcp::no_delay(true), ec);
    arm_handshake_deadline();
    stream_.async_handshake(asio::ssl::stream_base::server,
                            asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& e) { self->on_tls(e); }));
  }

  /// Client side: resolve, connect within connect_timeout, TLS.
  void connect(const endpoint_spec& to, callbacks cb) {
    cb_ = std::move(cb);
    remote_ = to.to_string();
    arm_timer(opt_.connect_timeout, "connect to " + remote_ + " timed out");
    resolver_.async_resolve(to.host, std::to_string(to.port),
        asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec, tcp::resolver::results_type rs) {
          if (self->closed_) return;
          if (ec) return self->close("cannot resolve " + self->remote_ + ": " + ec.message());
          asio::async_connect(self->socket(), rs,
              asio::bind_executor(self->strand_, [self](const boost::system::error_code& e, const tcp::endpoint&) {
                if (self->closed_) return;
                if (e) return self->close("cannot connect to " + self->remote_ + ": " + e.message());
                boost::system::error_code ig;
                self->socket().set_option(tcp::no_delay(true), ig);
                self->arm_handshake_deadline();
                self->stream_.async_handshake(asio::ssl::stream_base::client,
                    asio::bind_executor(self->strand_, [self](const boost::system::error_code& e2) { self->on_tls(e2); }));
              }));
        }));
  }

  /// The hello/welcome exchange is done: the handshake deadline is lifted, heartbeats begin.
  void established() {
    if (closed_ || established_) return;
    established_ = true;
    timer_.cancel();
    tick();
  }

  /// Queues one encoded message. Urgent messages overtake queued bulk ones.
  void send(std::vector<std::byte> encoded, bool urgent = true) {
    if (closed_) return;
    queued_ += encoded.size();
    ++counters_.messages_out;
    if (encoded.size() > 1 && encoded[1] == static_cast<std::byte>(framing::type::control)) counters_.control_bytes_out += encoded.size();
    (urgent ? urgent_ : bulk_).push_back(item{std::move(encoded), nullptr});
    write_more();
  }
  void send(const framing::message& m, std::uint32_t channel = 0, bool urgent = true) { send(framing::encode(m, channel), urgent); }

  /// Queues one block of a frame transfer on `channel` (bulk, in order with its begin/abort).
  void send_block(std::uint32_t channel, block b) {
    if (closed_) return;
    const auto h = framing::header(framing::type::frame_block, channel, static_cast<std::uint32_t>(b->size()));
    queued_ += framing::header_size + b->size();
    counters_.frame_bytes_out += b->size();
    ++counters_.messages_out;
    bulk_.push_back(item{std::vector<std::byte>(h.begin(), h.end()), std::move(b)});
    write_more();
  }

  /// Bytes queued and not yet written to the socket.
  std::size_t queued() const noexcept { return queued_; }

  /// Closes once the queued bytes are written (a refusal or redirect reaches the peer first).
  void close_after_flush(std::string reason) {
    if (closed_) return;
    close_reason_after_flush_ = std::move(reason);
    if (!writing_ && urgent_.empty() && bulk_.empty()) close(*close_reason_after_flush_);
  }

  /// Closes the connection (idempotent); `closed` is called once, asynchronously.
  void close(std::string reason) {
    if (closed_) return;
    closed_ = true;
    final_wire_ = wire_now();
    boost::system::error_code ec;
    timer_.cancel();
    resolver_.cancel();
    socket().shutdown(tcp::socket::shutdown_both, ec);
    socket().close(ec);
    urgent_.clear();
    bulk_.clear();
    queued_ = 0;
    asio::post(strand_, [self = shared_from_this(), r = std::move(reason)] {
      if (self->cb_.closed) self->cb_.closed(r);
      self->cb_ = {};  // break cycles through captured node pointers
    });
  }

  link_counters counters() const {
    link_counters c = counters_;
    const auto w = closed_ ? final_wire_ : wire_now();
    c.wire_bytes_out = w.first;
    c.wire_bytes_in = w.second;
    return c;
  }

 private:
  struct item {
    std::vector<std::byte> small;  // a whole message, or a block's header
    block data;                    // a block's bytes, shared with the store and other links
  };

  void arm_timer(std::chrono::milliseconds d, std::string why) {
    timer_.expires_after(d);
    timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this(), why = std::move(why)](const boost::system::error_code& ec) {
      if (!ec && !self->established_) self->close(why);
    }));
  }
  void arm_handshake_deadline() {
    arm_timer(opt_.handshake_timeout, "handshake not finished within " + std::to_string(opt_.handshake_timeout.count()) +
                                          " ms (TLS + hello; slow or silent peer)");
  }

  void on_tls(const boost::system::error_code& ec) {
    if (closed_) return;
    if (ec) return close("TLS handshake failed (unauthenticated peer?): " + ec.message());
    secured_ = true;
    last_recv_ = last_send_ = std::chrono::steady_clock::now();
    read_more();
    if (cb_.secured) cb_.secured();
    write_more();
  }

  void read_more() {
    stream_.async_read_some(asio::buffer(rbuf_), asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
      self->on_read(ec, n);
    }));
  }

  void on_read(const boost::system::error_code& ec, std::size_t n) {
    if (closed_) return;
    if (ec) {
      const bool eof = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated || ec == asio::error::connection_reset;
      return close(eof ? "peer closed the connection" : "read failed: " + ec.message());
    }
    last_recv_ = std::chrono::steady_clock::now();
    counters_.bytes_in += n;
    auto err = dec_.feed(std::span<const std::byte>(rbuf_.data(), n), [&](framing::decoded&& d) {
      if (closed_) return;
      ++counters_.messages_in;
      if (auto* b = std::get_if<framing::frame_block>(&d.msg)) counters_.frame_bytes_in += b->data.size();
      if (auto* c = std::get_if<framing::control>(&d.msg)) {
        counters_.control_bytes_in += framing::header_size + 4;
        for (auto& it : c->items) counters_.control_bytes_in += 8 + it.mailbox.size() + it.message.size();
      }
      if (auto* p = std::get_if<framing::ping>(&d.msg)) return send(framing::pong{p->nonce});
      if (std::holds_alternative<framing::pong>(d.msg)) return;
      if (cb_.message) cb_.message(std::move(d));
    });
    if (err) return close("framing error: " + err->to_string());
    if (!closed_) read_more();
  }

  void write_more() {
    if (writing_ || closed_ || !secured_) return;
    stage_.clear();
    block data;
    constexpr std::size_t coalesce = 64 << 10;
    while (!urgent_.empty() && stage_.size() < coalesce) {
      auto& s = urgent_.front().small;
      stage_.insert(stage_.end(), s.begin(), s.end());
      urgent_.pop_front();
    }
    while (!bulk_.empty() && stage_.size() < coalesce && !data) {
      auto& it = bulk_.front();
      stage_.insert(stage_.end(), it.small.begin(), it.small.end());
      data = std::move(it.data);
      bulk_.pop_front();
    }
    if (stage_.empty() && !data) {
      if (close_reason_after_flush_) close(*close_reason_after_flush_);
      return;
    }
    writing_ = true;
    std::array<asio::const_buffer, 2> bufs{asio::buffer(stage_), data ? asio::buffer(*data) : asio::const_buffer()};
    asio::async_write(stream_, bufs, asio::bind_executor(strand_, [self = shared_from_this(), data](const boost::system::error_code& ec, std::size_t n) {
      self->writing_ = false;
      if (self->closed_) return;
      if (ec) return self->close("write failed: " + ec.message());
      self->queued_ -= std::min(self->queued_, n);
      self->counters_.bytes_out += n;
      self->last_send_ = std::chrono::steady_clock::now();
      self->write_more();
      if (!self->closed_ && self->queued_ < self->opt_.link_window_bytes && self->cb_.writable) self->cb_.writable();
    }));
  }

  void tick() {
    timer_.expires_after(opt_.heartbeat);
    timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed_) return;
      const auto now = std::chrono::steady_clock::now();
      if (now - self->last_recv_ > self->opt_.peer_timeout) {
        const auto ms = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - self->last_recv_).count());
        return self->close(self->dec_.mid_message() ? "peer stalled mid-message for " + ms + " ms" : "peer silent for " + ms + " ms");
      }
      if (now - self->last_send_ >= self->opt_.heartbeat && !self->writing_) self->send(framing::ping{++self->nonce_});
      self->tick();
    }));
  }

  /// TCP payload bytes acked out and received in (Linux TCP_INFO: tcpi_bytes_acked at offset 120,
  /// tcpi_bytes_received at 128 of the kernel's struct tcp_info; glibc's copy predates them).
  std::pair<std::uint64_t, std::uint64_t> wire_now() const {
    unsigned char buf[160] = {};
    socklen_t len = sizeof buf;
    auto& s = const_cast<link*>(this)->socket();
    if (!s.is_open() || ::getsockopt(s.native_handle(), IPPROTO_TCP, TCP_INFO, buf, &len) != 0 || len < 136) return {0, 0};
    std::uint64_t acked = 0, received = 0;
    std::memcpy(&acked, buf + 120, 8);
    std::memcpy(&received, buf + 128, 8);
    return {acked, received};
  }

  strand_t strand_;
  asio::ssl::stream<tcp::socket> stream_;
  std::uint64_t id_;
  const node_options& opt_;
  framing::decoder dec_;
  asio::steady_timer timer_;
  tcp::resolver resolver_;
  std::vector<std::byte> rbuf_;
  std::vector<std::byte> stage_;
  std::deque<item> urgent_, bulk_;
  std::size_t queued_ = 0;
  bool writing_ = false, secured_ = false, established_ = false, closed_ = false;
  std::optional<std::string> close_reason_after_flush_;
  callbacks cb_;
  std::string remote_;
  std::chrono::steady_clock::time_point last_recv_{}, last_send_{};
  std::uint64_t nonce_ = 0;
  link_counters counters_;
  std::pair<std::uint64_t, std::uint64_t> final_wire_{0, 0};
};

}  // namespace bitrefit::transport::relay
