// The demo's transport, picked at run time (--transport dir|s3|relay): dir and s3 come from
// stores.hpp; `relay` is the relay tree (transport/relay/): the trainer runs the root relay
// in-process on loopback and its sender attaches as an owner; each rollout process is a member that
// relays to up to --fanout children. Certificates come from a throwaway cluster CA under <dir>/pki.
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
#include "stores.hpp"

namespace demo {


/// What a process needs to build its end of the transport.
struct net_config {
  store_flags stores;  // --transport dir|s3|relay and the stores' flags
  std::filesystem::path dir;
  std::uint32_t fanout = 4;
  bitrefit::transport::relay::endpoint_spec root;  // relay: the root relay's address
  bool relay() const { return stores.transport == "relay"; }
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

/// Trainer side: the directory store or S3, or an owner attached to the root relay.
inline any_transport trainer_net(const net_config& c) {
  if (!c.relay()) return make_transport(c.stores, c.dir, std::chrono::milliseconds(2));
  relay::tree_transport t(relay_options(c, relay::node_role::owner, "trainer"));
  t.wait_attached(std::chrono::seconds(10));
  return any_transport(std::move(t));
}

/// A rollout process: the directory store or S3, or a member of the tree serving receiver r's mailboxes.
inline any_transport rollout_net(const net_config& c, int r) {
  if (!c.relay()) return make_transport(c.stores, c.dir, std::chrono::milliseconds(5));
  auto o = relay_options(c, relay::node_role::member, "receiver-" + std::to_string(r));
  o.mailboxes = {"receiver/" + std::to_string(r), bitrefit::wire::restore_reply_mailbox(static_cast<std::uint32_t>(r))};
  return any_transport(relay::tree_transport(o));
}

/// Relay: issues the cluster's certificates and starts the root relay on loopback (it lives as long
/// as the returned handle). Dir, s3: nothing.
inline std::optional<relay::tree_transport> start_root(net_config& c, int receivers) {
  if (!c.relay()) return std::nullopt;
  relay::pki::make_cluster_ca(c.dir / "pki", "bitrefit-demo");
  for (auto n : {"root", "trainer"}) relay::pki::issue(c.dir / "pki", n);
  for (int r = 0; r < receivers; ++r) relay::pki::issue(c.dir / "pki", "receiver-" + std::to_string(r));
  relay::tree_transport root(relay_options(c, relay::node_role::root, "root"));
  c.root = root.listening();
  return root;
}

}  // namespace demo
