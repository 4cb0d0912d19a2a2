// bitrefit/transport/relay/handshake.hpp — who may attach to a relay (pure rules).
//
// A connection reaches this check only after mutual TLS succeeded: the peer holds a certificate of
// the cluster's CA. Its first message must be a hello (the link enforces that); admit() then says
// whether it may attach here, or names the reason it may not. The reason is sent back in a refuse
// message and written to the log, and the connection is closed: nothing the peer sends is routed,
// stored or applied.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "bitrefit/transport/relay/framing.hpp"

namespace bitrefit::transport::relay {

/// nullopt: `h` may attach to a node of role `self` serving `cluster`; else why not.
inline std::optional<std::string> admit(const framing::hello& h, std::string_view cluster, node_role self) {
  if (h.version != framing::link_version)
    return "link version " + std::to_string(h.version) + ", this relay speaks " + std::to_string(framing::link_version);
  if (h.cluster != cluster)
    return "peer belongs to another cluster: it says '" + h.cluster + "', this relay serves '" + std::string(cluster) + "'";
  if (self == node_role::owner) return "an owner accepts no connections";
  switch (h.role) {
    case node_role::root: return std::string("a root relay does not attach below another relay");
    case node_role::owner:
      if (self != node_role::root) return std::string("owners attach to the root relay only");
      if (h.subtree != 1) return std::string("an owner has no subtree");
      return std::nullopt;
    case node_role::member: return std::nullopt;
  }
  return std::string("unknown role");
}

}  // namespace bitrefit::transport::relay
