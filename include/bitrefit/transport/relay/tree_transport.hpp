// bitrefit/transport/relay/tree_transport.hpp — the relay tree as a Transport policy.
//
// A cheap, copyable handle that owns one relay node (node.hpp): the trainer's sender gets one
// started as an owner, each rollout process's receiver one started as a member, and a root relay
// process (or thread) one started as the root. The last copy to go stops the node.
//
//   relay::node_options o;
//   o.role = relay::node_role::member;  o.name = "receiver-3";  o.cluster = "prod";
//   o.root = relay::parse_endpoint("10.0.0.1:7000");  o.tls = {"ca.pem", "r3.pem", "r3.key"};
//   o.mailboxes = {"receiver/3", "engine/restored/3"};
//   relay::tree_transport net(o);                     // joins the tree in the background
//   refit::receiver<Loader, relay::tree_transport, Log> r(loader, net, log, ro);
//
// Besides the Transport members it offers the node's asynchronous operations, which take Asio
// completion tokens (callbacks, asio::use_future, asio::use_awaitable, ...): see AsyncTransport
// in transport/concepts.hpp.
#pragma once

#include <utility>  // Boost 1.74's Asio wants <utility> before it (coroutine support)

#include <memory>

#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/relay/node.hpp"

namespace bitrefit::transport::relay {

class tree_transport {
 public:
  /// Starts the node (see node::create). @throws bitrefit::error for bad options or TLS files.
  explicit tree_transport(node_options o) : g_(std::make_shared<guard>(node::create(std::move(o)))) {}

  void publish(const frame_key& k, std::span<const std::byte> b) { g_->n->publish(k, b); }
  std::vector<frame_key> list(const stream_key& s) { return g_->n->list(s); }
  std::optional<bytes> fetch(const frame_key& k) { return g_->n->fetch(k); }
  void discard(const stream_key& s) { g_->n->discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { g_->n->post(m, b); }
  std::vector<bytes> receive(const std::string& m, std::chrono::milliseconds wait) { return g_->n->receive(m, wait); }

  template <class Token>
  auto async_receive(std::string m, std::chrono::milliseconds wait, Token&& t) {
    return g_->n->async_receive(std::move(m), wait, std::forward<Token>(t));
  }
  template <class Token>
  auto async_fetch(frame_key k, Token&& t) {
    return g_->n->async_fetch(std::move(k), std::forward<Token>(t));
  }
  template <class Token>
  auto async_publish(frame_key k, bytes b, Token&& t) {
    return g_->n->async_publish(std::move(k), std::move(b), std::forward<Token>(t));
  }
  template <class Token>
  auto async_wait_attached(std::chrono::milliseconds timeout, Token&& t) {
    return g_->n->async_wait_attached(timeout, std::forward<Token>(t));
  }

  /// Members and owners: waits until this node has a parent in the tree.
  bool wait_attached(std::chrono::milliseconds timeout) { return g_->n->wait_attached(timeout); }
  /// Root and members: the address children connect to.
  endpoint_spec listening() const { return g_->n->listening(); }
  node_stats stats() const { return g_->n->stats(); }
  /// Stops the node now (all copies see it stopped).
  void stop() { g_->n->stop(); }
  node& underlying() const { return *g_->n; }

 private:
  struct guard {
    std::shared_ptr<node> n;
    explicit guard(std::shared_ptr<node> x) : n(std::move(x)) {}
    guard(const guard&) = delete;
    guard& operator=(const guard&) = delete;
    ~guard() { n->stop(); }
  };
  std::shared_ptr<guard> g_;
};

static_assert(Transport<tree_transport>);
static_assert(AsyncTransport<tree_transport>);

}  // namespace bitrefit::transport::relay
