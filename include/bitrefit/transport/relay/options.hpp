// bitrefit/transport/relay/options.hpp — what one relay-tree node is configured with.
//
// A node is the root relay, a member (a rollout process: it receives and relays to up to `fanout`
// children) or an owner (a trainer-side client of the root). All of them authenticate with the
// cluster's certificates (mutual TLS, tls.hpp) and name the cluster in their hello; everything else
// has a default that suits one rack. The memory a relay can hold is set here too (README:
// "Memory"): retained frames beyond `retain_memory_bytes` go to an unlinked spool file, and each
// link's queue of encoded bytes stays under `link_window_bytes`.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/error.hpp"

namespace bitrefit::transport::relay {

/// A TCP address: a host name or numeric address, and a port.
struct endpoint_spec {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const endpoint_spec&, const endpoint_spec&) = default;
  std::string to_string() const { return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port); }
};

/// Parses "host:port" or "[v6]:port". @throws errc::invalid_argument naming the text.
inline endpoint_spec parse_endpoint(std::string_view s) {
  const auto bad = [&] { return error(errc::invalid_argument, "not a host:port address: '" + std::string(s) + "'", {.file = {}, .tensor = {}, .field = "endpoint"}); };
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) throw bad();
  std::string host(s.substr(0, colon));
  if (host.front() == '[') {
    if (host.back() != ']') throw bad();
    host = host.substr(1, host.size() - 2);
  }
  unsigned long port = 0;
  for (char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9') throw bad();
    port = port * 10 + static_cast<unsigned long>(c - '0');
    if (port > 65535) throw bad();
  }
  return {host, static_cast<std::uint16_t>(port)};
}

/// Certificates of mutual TLS, all PEM files: the cluster CA that signs every node's certificate,
/// this node's certificate chain and its private key.
struct tls_files {
  std::filesystem::path ca, cert, key;
};

enum class node_role : std::uint8_t {
  root = 0,    // listens; accepts owners and members; no parent
  member = 1,  // a rollout process: attaches below the root, relays to children
  owner = 2,   // a trainer-side client: attaches to the root only, never relays
};

constexpr std::string_view to_string(node_role r) {
  switch (r) {
    case node_role::root: return "root";
    case node_role::member: return "member";
    case node_role::owner: return "owner";
  }
  return "?";
}

struct node_options {
  node_role role = node_role::member;
  /// This node's name, unique in the cluster (log lines and the tree's views use it).
  std::string name;
  /// Every hello names the cluster; a peer of another cluster is refused by name.
  std::string cluster = "bitrefit";
  tls_files tls;

  /// Members and owners: the root relay's address (the first and last resort of every (re)join).
  endpoint_spec root;
  /// Root and members: where children connect. Port 0 picks a free port (see node::listening()).
  std::string listen_host = "127.0.0.1";
  std::uint16_t listen_port = 0;
  /// The host children are told to use; empty: listen_host (or, if that is a wildcard, the address
  /// the parent sees this node connect from).
  std::string advertise_host;

  /// Children per relay (root and members): a k-ary tree. Owners do not count against it.
  std::uint32_t fanout = 4;
  /// Mailboxes served here (registered with the tree at once; a receive() registers its mailbox
  /// too). An owner also gets every message that the tree routes to the trainer side.
  std::vector<std::string> mailboxes;

  /// Payload frames travel in blocks of at most this size; a relay forwards a block as soon as it
  /// arrived (cut-through), so each tree level adds about one block time.
  std::size_t block_bytes = 256 << 10;
  /// Encoded bytes queued on one link; frames are pulled from the store as the queue drains.
  std::size_t link_window_bytes = 4 << 20;
  /// A child further behind than this (bytes of frames it still has to receive) is disconnected:
  /// it slows only its own subtree until then; afterwards the protocol's retry takes over.
  std::uint64_t max_child_lag_bytes = 256ull << 20;
  /// Owner: publish() blocks while more than this many bytes wait for the root (backpressure to
  /// the encoder), and drops the frame after `publish_timeout` without a root.
  std::uint64_t owner_queue_bytes = 32ull << 20;
  std::chrono::milliseconds publish_timeout{10'000};
  /// Retained frames (the active attempt's and pulled restore frames) kept in memory; the rest is
  /// written to an unlinked spool file under `spool_dir` (default: the temp directory).
  std::uint64_t retain_memory_bytes = 64ull << 20;
  std::filesystem::path spool_dir;

  /// Decoder limits: the largest control batch / hello the peer may send (a block is limited by
  /// framing::max_block_bytes).
  std::size_t max_control_bytes = 16 << 20;

  std::chrono::milliseconds connect_timeout{1'000};
  /// TLS handshake plus hello/welcome must finish within this, or the connection is dropped
  /// (slowloris at connect).
  std::chrono::milliseconds handshake_timeout{3'000};
  /// A ping goes out when a link was quiet this long; a peer silent (no byte at all, also not
  /// mid-message) for `peer_timeout` is disconnected.
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds peer_timeout{4'000};
  /// Rejoin: after trying every ancestor once, wait this long (doubling up to max) and try again.
  std::chrono::milliseconds reconnect_backoff{50};
  std::chrono::milliseconds max_reconnect_backoff{1'000};
  /// fetch() of a frame this node does not hold asks the parent and waits at most this long.
  std::chrono::milliseconds fetch_timeout{3'000};
  /// The root keeps a want for a frame it does not hold yet this long (the frame may still be on
  /// its way from the owner) before answering "missing".
  std::chrono::milliseconds root_want_wait{2'000};
  /// Connections still in TLS/hello at once; more are closed at accept.
  std::size_t max_pending_handshakes = 64;

  /// Log lines (connections, refusals with their reason, rejoins). Default: stderr.
  std::function<void(std::string_view)> log;
};

}  // namespace bitrefit::transport::relay
