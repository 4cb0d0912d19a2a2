// bitrefit/wire/control.hpp — protocol envelopes as bytes on the control plane, and mailbox names.
//
// Control messages are small (a prepare record is the largest), so they travel as JSON objects
// (the named form of wire/json.hpp): readable in a directory object store, easy to debug, and
// versioned by a "wire" field. Payload frames never pass through here (they are the data plane's
// bytes). decode() rejects anything that does not parse into exactly one protocol message with
// errc::format naming the field. The engine's own side messages (restore, stats, placement) are in
// wire/engine.hpp.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/protocol/messages.hpp"
#include "bitrefit/wire/json.hpp"

namespace bitrefit::wire {

inline constexpr int wire_version = 1;

inline std::vector<std::byte> encode(const protocol::envelope& e) {
  json x = to_json(e);
  x["wire"] = wire_version;
  const std::string s = x.dump();
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

/// @throws errc::format naming what does not parse (every number checked for type, sign and range;
/// the text bounded by control_json_limits); errc::unsupported for another wire version.
inline protocol::envelope decode(std::span<const std::byte> bytes) {
  try {
    const auto x = io::parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), control_json_limits);
    if (detail::integer<std::uint64_t>(detail::member(x, "wire"), "wire") != wire_version)
      throw error(errc::unsupported, "control message of another wire version", {.file = {}, .tensor = {}, .field = "wire"});
    return envelope_from(x);
  } catch (const json::exception& e) {
    throw error(errc::format, std::string("control message does not parse: ") + e.what(), {.file = {}, .tensor = {}, .field = "msg"});
  }
}

/// The mailbox name of an endpoint on the control plane ("coordinator", "owner/1", "receiver/2").
inline std::string mailbox(const protocol::endpoint& e) {
  switch (e.role) {
    case protocol::role::coordinator: return "coordinator";
    case protocol::role::owner: return "owner/" + std::to_string(e.index);
    case protocol::role::receiver: return "receiver/" + std::to_string(e.index);
  }
  return "unknown";
}

}  // namespace bitrefit::wire
