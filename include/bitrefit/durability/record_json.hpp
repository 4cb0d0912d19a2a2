// bitrefit/durability/record_json.hpp — JSON spelling of the protocol's durable records.
//
// The filesystem commit log stores its snapshot with these, and the control plane (refit/wire.hpp)
// reuses them for prepare records inside messages, so a record reads the same on disk and on the wire.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/protocol/commit_log.hpp"

namespace bitrefit::durability::json_io {

using nlohmann::json;

inline json to_json(const attempt_id& a) { return json::array({a.epoch, a.counter}); }
inline json to_json(const digest128& d) { return d.to_hex(); }
inline json to_json(const protocol::commit_record& k) { return json::array({k.version, k.baseline.value}); }
inline json to_json(const protocol::member& m) { return json::array({m.receiver, m.incarnation}); }
inline json to_json(const protocol::prepare_record& r) {
  json members = json::array(), expected = json::array(), frozen = json::array();
  for (auto& m : r.members) members.push_back(to_json(m));
  for (auto& d : r.expected) expected.push_back(to_json(d));
  for (auto& d : r.frozen) frozen.push_back(to_json(d));
  return {{"attempt", to_json(r.attempt)}, {"base", to_json(r.base)}, {"target", r.target},
          {"next", r.next.value},          {"mode", static_cast<int>(r.mode)}, {"xor_allowed", r.xor_allowed},
          {"members", members},            {"expected", expected}, {"frozen", frozen},
          {"retry", r.retry},              {"aborted", r.aborted}};
}
inline json to_json(const protocol::log_snapshot& s) {
  json x{{"format", "bitrefit-commit-log/1"}, {"epoch", s.epoch}, {"record", to_json(s.record)}};
  if (s.prepared) x["prepared"] = to_json(*s.prepared);
  return x;
}

inline attempt_id attempt_from(const json& x) { return {x.at(0).get<std::uint64_t>(), x.at(1).get<std::uint64_t>()}; }
inline digest128 digest_from(const json& x) {
  auto d = digest128::from_hex(x.get<std::string>());
  if (!d) throw error(errc::format, "digest is not 32 hex digits", {.file = {}, .tensor = {}, .field = "digest"});
  return *d;
}
inline protocol::commit_record record_from(const json& x) {
  return {x.at(0).get<std::uint64_t>(), baseline_id{x.at(1).get<std::uint64_t>()}};
}
inline protocol::member member_from(const json& x) { return {x.at(0).get<std::uint32_t>(), x.at(1).get<std::uint64_t>()}; }
inline protocol::mode mode_from(const json& x) {
  const int m = x.get<int>();
  if (m < 0 || m > 1) throw error(errc::format, "unknown mode", {.file = {}, .tensor = {}, .field = "mode"});
  return static_cast<protocol::mode>(m);
}
inline protocol::prepare_record prepare_from(const json& x) {
  protocol::prepare_record r;
  r.attempt = attempt_from(x.at("attempt"));
  r.base = record_from(x.at("base"));
  r.target = x.at("target").get<std::uint64_t>();
  r.next = baseline_id{x.at("next").get<std::uint64_t>()};
  r.mode = mode_from(x.at("mode"));
  r.xor_allowed = x.at("xor_allowed").get<bool>();
  for (auto& m : x.at("members")) r.members.push_back(member_from(m));
  for (auto& d : x.at("expected")) r.expected.push_back(digest_from(d));
  if (x.contains("frozen"))  // absent in records written before frozen identities were recorded
    for (auto& d : x.at("frozen")) r.frozen.push_back(digest_from(d));
  r.retry = x.value("retry", false);
  r.aborted = x.value("aborted", false);  // absent in records written before aborts were persisted
  return r;
}
/// @throws errc::format (naming `file`) when the text is not a commit-log snapshot.
inline protocol::log_snapshot snapshot_from(const std::string& text, const std::string& file) {
  try {
    const auto x = json::parse(text);
    if (x.at("format") != "bitrefit-commit-log/1")
      throw error(errc::unsupported, "unknown commit log format", {.file = file, .tensor = {}, .field = "format"});
    protocol::log_snapshot s;
    s.epoch = x.at("epoch").get<std::uint64_t>();
    s.record = record_from(x.at("record"));
    if (x.contains("prepared")) s.prepared = prepare_from(x.at("prepared"));
    return s;
  } catch (const json::exception& e) {
    throw error(errc::format, std::string("commit log does not parse: ") + e.what(), {.file = file, .tensor = {}, .field = {}});
  }
}

}  // namespace bitrefit::durability::json_io
