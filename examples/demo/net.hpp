// The demo's transport, picked at run time (--transport dir|relay): a type-erased Transport so the
// sender and receiver types stay one each. `dir` is the directory object store under <dir>/store;
// `relay` is the relay tree (transport/relay/): the trainer runs the root relay in-process on
// loopback and its sender attaches as an owner; each rollout process is a member that relays to up
// to --fanout children. Certificates come from a throwaway cluster CA under <dir>/pki.
#pragma once

#include <utility>  // Boost 1.74's Asio wants <utility> before it

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "bitrefit/refit/sender.hpp"  // the engine's mailbox names
#include "bitrefit/transport/object_store.hpp"
#include "bitrefit/transport/relay/pki.hpp"
#include "bitrefit/transport/relay/tree_transport.hpp"

namespace demo {

class any_transport {
 public:
  template <bitrefit::transport::Transport T>
  explicit any_transport(T t) : p_(std::make_shared<model<T>>(std::move(t))) {}

  void publish(const bitrefit::transport::frame_key& k, std::span<const std::byte> b) { p_->publish(k, b); }
  std::vector<bitrefit::transport::frame_key> list(const bitrefit::transport::stream_key& s) { return p_->list(s); }
  std::optional<bitrefit::transport::bytes> fetch(const bitrefit::transport::frame_key& k) { return p_->fetch(k); }
  void discard(const bitrefit::transport::stream_key& s) { p_->discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { p_->post(m, b); }
  std::vector<bitrefit::transport::bytes> receive(const std::string& m, std::chrono::milliseconds w) { return p_->receive(m, w); }

 private:
  struct concept_ {
    virtual ~concept_() = default;
    virtual void publish(const bitrefit::transport::frame_key&, std::span<const std::byte>) = 0;
    virtual std::vector<bitrefit::transport::frame_key> list(const bitrefit::transport::stream_key&) = 0;
    virtual std::optional<bitrefit::transport::bytes> fetch(const bitrefit::transport::frame_key&) = 0;
    virtual void discard(const bitrefit::transport::stream_key&) = 0;
    virtual void post(const std::string&, std::span<const std::byte>) = 0;
    virtual std::vector<bitrefit::transport::bytes> receive(const std::string&, std::chrono::milliseconds) = 0;
  };
  template <class T>
  struct model final : concept_ {
    explicit model(T x) : t(std::move(x)) {}
    void publish(const bitrefit::transport::frame_key& k, std::span<const std::byte> b) override { t.publish(k, b); }
    std::vector<bitrefit::transport::frame_key> list(const bitrefit::transport::stream_key& s) override { return t.list(s); }
    std::optional<bitrefit::transport::bytes> fetch(const bitrefit::transport::frame_key& k) override { return t.fetch(k); }
    void discard(const bitrefit::transport::stream_key& s) override { t.discard(s); }
    void post(const std::string& m, std::span<const std::byte> b) override { t.post(m, b); }
    std::vector<bitrefit::transport::bytes> receive(const std::string& m, std::chrono::milliseconds w) override { return t.receive(m, w); }
    T t;
  };
  std::shared_ptr<concept_> p_;
};
static_assert(bitrefit::transport::Transport<any_transport>);

/// What a process needs to build its end of the transport.
struct net_config {
  std::string kind = "dir";  // dir | relay
  std::filesystem::path dir;
  std::uint32_t fanout = 4;
  bitrefit::transport::relay::endpoint_spec root;  // relay: the root relay's address
};

namespace relay = bitrefit::transport::relay;

inline relay::node_options relay_options(const net_config& c, relay::node_role role, const std::string& name) {
  relay::node_options o;
  o.role = role;
  o.name = name;
  o.cluster = "bitrefit-demo";
  o.tls = relay::pki::files(c.dir / "pki", name);
  o.fanout = c.fanout;
  o.root = c.root;
  const auto log = c.dir / "relay.log";  // connection events of every process, one file
  o.log = [log](std::string_view line) {
    std::ofstream(log, std::ios::app) << line << '\n';
  };
  return o;
}

/// Trainer side: the directory store, or an owner attached to the root relay.
inline any_transport trainer_net(const net_config& c) {
  if (c.kind == "dir")
    return any_transport(bitrefit::transport::directory_transport{bitrefit::transport::directory_store(c.dir / "store"), {std::chrono::milliseconds(2)}});
  relay::tree_transport t(relay_options(c, relay::node_role::owner, "trainer"));
  t.wait_attached(std::chrono::seconds(10));
  return any_transport(std::move(t));
}

/// A rollout process: the directory store, or a member of the tree serving receiver r's mailboxes.
inline any_transport rollout_net(const net_config& c, int r) {
  if (c.kind == "dir")
    return any_transport(bitrefit::transport::directory_transport{bitrefit::transport::directory_store(c.dir / "store"), {std::chrono::milliseconds(5)}});
  auto o = relay_options(c, relay::node_role::member, "receiver-" + std::to_string(r));
  o.mailboxes = {"receiver/" + std::to_string(r), bitrefit::refit::restore_reply_mailbox(static_cast<std::uint32_t>(r))};
  return any_transport(relay::tree_transport(o));
}

/// Relay: issues the cluster's certificates and starts the root relay on loopback (it lives as long
/// as the returned handle). Dir: nothing.
inline std::optional<relay::tree_transport> start_root(net_config& c, int receivers) {
  if (c.kind != "relay") return std::nullopt;
  relay::pki::make_cluster_ca(c.dir / "pki", "bitrefit-demo");
  for (auto n : {"root", "trainer"}) relay::pki::issue(c.dir / "pki", n);
  for (int r = 0; r < receivers; ++r) relay::pki::issue(c.dir / "pki", "receiver-" + std::to_string(r));
  relay::tree_transport root(relay_options(c, relay::node_role::root, "root"));
  c.root = root.listening();
  return root;
}

}  // namespace demo
