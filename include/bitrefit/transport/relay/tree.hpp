// bitrefit/transport/relay/tree.hpp — the shape of the relay tree (pure rules).
//
// The tree is built by the nodes themselves, without a global view: every node (re)joins by
// contacting an ancestor, and a relay whose `fanout` member slots are full sends the newcomer
// down to its child with the smallest subtree (redirect). Each child reports its subtree size
// upward (framing::routes), so a k-ary tree fills level by level, and a subtree that loses a relay
// is re-balanced as its orphans rejoin. Owners attach to the root and take no member slot.
//
// Rejoin order (a relay died, a link went down): the nearest live ancestor first — the old
// parent, then its parent, ... then the root, which every node knows from its options. A
// redirect chain has at most one hop per tree level, because a node only redirects downward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "bitrefit/transport/relay/options.hpp"

namespace bitrefit::transport::relay {

/// What a relay knows about one of its member children.
struct child_view {
  std::uint64_t id = 0;         // link id (arrival order): ties go to the older child
  std::uint32_t subtree = 1;    // nodes in its subtree, itself included
  endpoint_spec listen;         // port 0: it takes no children
};

struct placement {
  enum class kind { accept, redirect, refuse } what = kind::accept;
  endpoint_spec to;  // redirect target
};

/// Where a new member goes: here while fewer than `fanout` members are attached, else to the
/// child with the smallest subtree that takes children; refuse when none does.
inline placement place(std::span<const child_view> children, std::uint32_t fanout) {
  if (children.size() < fanout) return {placement::kind::accept, {}};
  const child_view* best = nullptr;
  for (const auto& c : children)
    if (c.listen.port != 0 && (!best || c.subtree < best->subtree || (c.subtree == best->subtree && c.id < best->id))) best = &c;
  if (!best) return {placement::kind::refuse, {}};
  return {placement::kind::redirect, best->listen};
}

/// Addresses to try when (re)joining, in order: the ancestors from nearest (the parent) to the
/// root, then the configured root if the chain did not end there.
inline std::vector<endpoint_spec> rejoin_order(const std::vector<endpoint_spec>& chain_root_first, const endpoint_spec& root) {
  std::vector<endpoint_spec> out;
  for (auto it = chain_root_first.rbegin(); it != chain_root_first.rend(); ++it)
    if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
  if (std::find(out.begin(), out.end(), root) == out.end()) out.push_back(root);
  return out;
}

/// A redirect chain longer than this means the tree's views disagree; the node starts over.
inline constexpr int max_redirects = 32;

}  // namespace bitrefit::transport::relay
