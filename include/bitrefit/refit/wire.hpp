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
inline protocol::endpoint endpoint(const json& x) {
  const int r = x.at(0).get<int>();
  if (r < 0 || r > 2) throw error(errc::format, "unknown role", {.file = {}, .tensor = {}, .field = "role"});
  return {static_cast<protocol::role>(r), x.at(1).get<std::uint32_t>()};
}
inline payload_id pid(const json& x) {
  return {{x.at(0).get<std::uint64_t>(), x.at(1).get<std::uint64_t>()}, x.at(2).get<std::uint32_t>(), x.at(3).get<std::uint32_t>()};
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
  const std::string t = x.at("type").get<std::string>();
  if (t == "prepare") return protocol::prepare_msg{prepare(x.at("record"))};
  if (t == "obsolete") return protocol::obsolete_msg{attempt(x.at("attempt"))};
  if (t == "open") return protocol::open_msg{attempt(x.at("attempt")), x.at("chunks").get<std::vector<std::uint32_t>>()};
  if (t == "flush") return protocol::flush_msg{attempt(x.at("attempt"))};
  if (t == "announce") {
    protocol::announce_msg m{record(x.at("record")), std::nullopt, x.value("evicted", false)};
    if (x.contains("roster")) m.roster = member(x.at("roster"));
    return m;
  }
  if (t == "roll_call") return protocol::roll_call_msg{x.at("epoch").get<std::uint64_t>()};
  if (t == "abort") return protocol::abort_msg{x.at("epoch").get<std::uint64_t>(), attempt(x.at("attempt"))};
  if (t == "manifest")
    return protocol::manifest_msg{attempt(x.at("attempt")), x.at("owner").get<std::uint32_t>(), x.at("chunks").get<std::uint32_t>()};
  if (t == "arrived") return protocol::arrived_msg{attempt(x.at("attempt")), member(x.at("from"))};
  if (t == "ack") {
    protocol::ack_msg m{attempt(x.at("attempt")), member(x.at("from")), std::nullopt};
    if (x.contains("attestation")) m.attestation = digest(x.at("attestation"));
    return m;
  }
  if (t == "stopped") return protocol::stopped_msg{attempt(x.at("attempt")), member(x.at("from"))};
  if (t == "failed") {
    const int r = x.at("reason").get<int>();
    if (r < 0 || r > 2) throw error(errc::format, "unknown failure reason", {.file = {}, .tensor = {}, .field = "reason"});
    return protocol::failed_msg{attempt(x.at("attempt")), member(x.at("from")), static_cast<protocol::failure_reason>(r)};
  }
  if (t == "join") return protocol::join_msg{member(x.at("from")), record(x.at("at"))};
  if (t == "baseline") return protocol::baseline_msg{x.at("owner").get<std::uint32_t>(), record(x.at("at"))};
  if (t == "frozen_lost")
    return protocol::frozen_lost_msg{attempt(x.at("attempt")), x.at("owner").get<std::uint32_t>(), x.at("target").get<std::uint64_t>()};
  if (t == "payload")
    return protocol::payload_msg{pid(x.at("id")), x.at("base").get<std::uint64_t>(), x.at("target").get<std::uint64_t>(),
                                 mode(x.at("mode")), digest(x.at("content"))};
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

/// @throws errc::format naming what does not parse; errc::unsupported for another wire version.
inline protocol::envelope decode(std::span<const std::byte> bytes) {
  try {
    const auto x = json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    if (x.at("wire").get<int>() != wire_version)
      throw error(errc::unsupported, "control message of another wire version", {.file = {}, .tensor = {}, .field = "wire"});
    return {detail::endpoint(x.at("from")), detail::endpoint(x.at("to")), detail::message_from(x.at("msg"))};
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
