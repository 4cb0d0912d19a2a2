// bitrefit/refit/wire.hpp — protocol envelopes as bytes on the control plane (JSON).
//
// Control messages are small (a prepare record is the largest), so they travel as JSON objects:
// readable in a directory object store, easy to debug, and versioned by a "wire" field. Payload
// frames never pass through here (they are the data plane's bytes). decode() rejects anything
// that does not parse into exactly one protocol message with errc::format naming the field.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/record_json.hpp"
#include "bitrefit/protocol/messages.hpp"

namespace bitrefit::refit::wire {

using nlohmann::json;

namespace detail {

template <class T>
json j(const T& x) { return durability::json_io::to_json(x); }
inline json j(const protocol::endpoint& e) { return json::array({static_cast<int>(e.role), e.index}); }
inline json j(const payload_id& p) { return json::array({p.attempt.epoch, p.attempt.counter, p.owner, p.seq}); }

using durability::json_io::attempt_from;
inline attempt_id attempt(const json& x) { return durability::json_io::attempt_from(x); }
inline digest128 digest(const json& x) { return durability::json_io::digest_from(x); }
inline protocol::commit_record record(const json& x) { return durability::json_io::record_from(x); }
inline protocol::member member(const json& x) { return durability::json_io::member_from(x); }
inline protocol::mode mode(const json& x) { return durability::json_io::mode_from(x); }
inline protocol::prepare_record prepare(const json& x) { return durability::json_io::prepare_from(x); }
using durability::json_io::detail::element;
using durability::json_io::detail::integer;
using durability::json_io::detail::member;
inline protocol::endpoint endpoint(const json& x) {
  const int r = integer<int>(element(x, 0, 2, "endpoint"), "endpoint.role");
  if (r < 0 || r > 2) throw error(errc::format, "unknown role", {.file = {}, .tensor = {}, .field = "endpoint.role"});
  return {static_cast<protocol::role>(r), integer<std::uint32_t>(element(x, 1, 2, "endpoint"), "endpoint.index")};
}
inline payload_id pid(const json& x) {
  return {{integer<std::uint64_t>(element(x, 0, 4, "id"), "id.epoch"), integer<std::uint64_t>(element(x, 1, 4, "id"), "id.counter")},
          integer<std::uint32_t>(element(x, 2, 4, "id"), "id.owner"), integer<std::uint32_t>(element(x, 3, 4, "id"), "id.seq")};
}
inline std::vector<std::uint32_t> u32_list(const json& x, const char* field) {
  std::vector<std::uint32_t> out;
  for (auto& v : durability::json_io::detail::array(x, field)) out.push_back(integer<std::uint32_t>(v, field));
  return out;
}

struct to_json_visitor {
  json operator()(const protocol::prepare_msg& m) const { return {{"type", "prepare"}, {"record", j(m.record)}}; }
  json operator()(const protocol::obsolete_msg& m) const { return {{"type", "obsolete"}, {"attempt", j(m.attempt)}}; }
  json operator()(const protocol::open_msg& m) const { return {{"type", "open"}, {"attempt", j(m.attempt)}, {"chunks", m.chunks}}; }
  json operator()(const protocol::flush_msg& m) const { return {{"type", "flush"}, {"attempt", j(m.attempt)}}; }
  json operator()(const protocol::announce_msg& m) const {
    json x{{"type", "announce"}, {"record", j(m.record)}};
    if (m.roster) x["roster"] = j(*m.roster);
    if (m.evicted) x["evicted"] = true;
    return x;
  }
  json operator()(const protocol::roll_call_msg& m) const { return {{"type", "roll_call"}, {"epoch", m.epoch}}; }
  json operator()(const protocol::abort_msg& m) const { return {{"type", "abort"}, {"epoch", m.epoch}, {"attempt", j(m.attempt)}}; }
  json operator()(const protocol::manifest_msg& m) const {
    return {{"type", "manifest"}, {"attempt", j(m.attempt)}, {"owner", m.owner}, {"chunks", m.chunks}};
  }
  json operator()(const protocol::arrived_msg& m) const { return {{"type", "arrived"}, {"attempt", j(m.attempt)}, {"from", j(m.from)}}; }
  json operator()(const protocol::ack_msg& m) const {
    json x{{"type", "ack"}, {"attempt", j(m.attempt)}, {"from", j(m.from)}};
    if (m.attestation) x["attestation"] = j(*m.attestation);
    return x;
  }
  json operator()(const protocol::stopped_msg& m) const { return {{"type", "stopped"}, {"attempt", j(m.attempt)}, {"from", j(m.from)}}; }
  json operator()(const protocol::failed_msg& m) const {
    return {{"type", "failed"}, {"attempt", j(m.attempt)}, {"from", j(m.from)}, {"reason", static_cast<int>(m.reason)}};
  }
  json operator()(const protocol::join_msg& m) const { return {{"type", "join"}, {"from", j(m.from)}, {"at", j(m.at)}}; }
  json operator()(const protocol::baseline_msg& m) const { return {{"type", "baseline"}, {"owner", m.owner}, {"at", j(m.at)}}; }
  json operator()(const protocol::frozen_lost_msg& m) const {
    return {{"type", "frozen_lost"}, {"attempt", j(m.attempt)}, {"owner", m.owner}, {"target", m.target}};
  }
  json operator()(const protocol::payload_msg& m) const {
    return {{"type", "payload"}, {"id", j(m.id)},   {"base", m.base},
            {"target", m.target}, {"mode", static_cast<int>(m.mode)}, {"content", j(m.content)}};
  }
};

inline protocol::message message_from(const json& x) {
  const json& type = member(x, "type");
  if (!type.is_string()) throw error(errc::format, "message type is not a string", {.file = {}, .tensor = {}, .field = "type"});
  const std::string& t = type.get_ref<const std::string&>();
  if (t == "prepare") return protocol::prepare_msg{prepare(member(x, "record"))};
  if (t == "obsolete") return protocol::obsolete_msg{attempt(member(x, "attempt"))};
  if (t == "open") return protocol::open_msg{attempt(member(x, "attempt")), u32_list(member(x, "chunks"), "chunks")};
  if (t == "flush") return protocol::flush_msg{attempt(member(x, "attempt"))};
  if (t == "announce") {
    protocol::announce_msg m{record(member(x, "record")), std::nullopt, false};
    if (x.contains("evicted")) m.evicted = durability::json_io::detail::boolean(x.at("evicted"), "evicted");
    if (x.contains("roster")) m.roster = member(x.at("roster"));
    return m;
  }
  if (t == "roll_call") return protocol::roll_call_msg{integer<std::uint64_t>(member(x, "epoch"), "epoch")};
  if (t == "abort") return protocol::abort_msg{integer<std::uint64_t>(member(x, "epoch"), "epoch"), attempt(member(x, "attempt"))};
  if (t == "manifest")
    return protocol::manifest_msg{attempt(member(x, "attempt")), integer<std::uint32_t>(member(x, "owner"), "owner"),
                                  integer<std::uint32_t>(member(x, "chunks"), "chunks")};
  if (t == "arrived") return protocol::arrived_msg{attempt(member(x, "attempt")), member(member(x, "from"))};
  if (t == "ack") {
    protocol::ack_msg m{attempt(member(x, "attempt")), member(member(x, "from")), std::nullopt};
    if (x.contains("attestation")) m.attestation = digest(member(x, "attestation"));
    return m;
  }
  if (t == "stopped") return protocol::stopped_msg{attempt(member(x, "attempt")), member(member(x, "from"))};
  if (t == "failed") {
    const int r = integer<int>(member(x, "reason"), "reason");
    if (r < 0 || r > 2) throw error(errc::format, "unknown failure reason", {.file = {}, .tensor = {}, .field = "reason"});
    return protocol::failed_msg{attempt(member(x, "attempt")), member(member(x, "from")), static_cast<protocol::failure_reason>(r)};
  }
  if (t == "join") return protocol::join_msg{member(member(x, "from")), record(member(x, "at"))};
  if (t == "baseline") return protocol::baseline_msg{integer<std::uint32_t>(member(x, "owner"), "owner"), record(member(x, "at"))};
  if (t == "frozen_lost")
    return protocol::frozen_lost_msg{attempt(member(x, "attempt")), integer<std::uint32_t>(member(x, "owner"), "owner"),
                                     integer<std::uint64_t>(member(x, "target"), "target")};
  if (t == "payload")
    return protocol::payload_msg{pid(member(x, "id")), integer<std::uint64_t>(member(x, "base"), "base"),
                                 integer<std::uint64_t>(member(x, "target"), "target"), mode(member(x, "mode")), digest(member(x, "content"))};
  throw error(errc::format, "unknown message type '" + t + "'", {.file = {}, .tensor = {}, .field = "type"});
}

}  // namespace detail

inline constexpr int wire_version = 1;

inline std::vector<std::byte> encode(const protocol::envelope& e) {
  json x{{"wire", wire_version}, {"from", detail::j(e.from)}, {"to", detail::j(e.to)},
         {"msg", std::visit(detail::to_json_visitor{}, e.msg)}};
  const std::string s = x.dump();
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

/// @throws errc::format naming what does not parse (every number checked for type, sign and range;
/// the text bounded by durability::json_io::control_json_limits); errc::unsupported for another
/// wire version.
inline protocol::envelope decode(std::span<const std::byte> bytes) {
  try {
    const auto x = io::parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                  durability::json_io::control_json_limits);
    if (detail::integer<std::uint64_t>(detail::member(x, "wire"), "wire") != wire_version)
      throw error(errc::unsupported, "control message of another wire version", {.file = {}, .tensor = {}, .field = "wire"});
    return {detail::endpoint(detail::member(x, "from")), detail::endpoint(detail::member(x, "to")), detail::message_from(detail::member(x, "msg"))};
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

}  // namespace bitrefit::refit::wire
