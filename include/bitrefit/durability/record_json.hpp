// bitrefit/durability/record_json.hpp — JSON spelling of the protocol's durable records.
//
// The filesystem commit log stores its snapshot with these, and the control plane (refit/wire.hpp)
// reuses them for prepare records inside messages, so a record reads the same on disk and on the wire.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/io/json.hpp"
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

/// What one control record may cost (io/json.hpp): the commit log file and every control message
/// (refit/wire.hpp). A prepare record takes about 60 bytes per receiver, so 4 MiB holds ~70 K.
inline constexpr io::json_limits control_json_limits{.max_bytes = 4u << 20, .max_depth = 8, .max_tree_bytes = 64u << 20};

// Readers: every field is checked for its JSON type, and every number for integer-ness, sign and
// range (io::json_integer) before it is converted; a problem is errc::format naming the field.
namespace detail {
inline const json& element(const json& x, std::size_t i, std::size_t n, const char* field) {
  if (!x.is_array() || x.size() != n)
    throw error(errc::format, "not an array of " + std::to_string(n) + " elements", {.file = {}, .tensor = {}, .field = field});
  return x[i];
}
inline const json& member(const json& x, const char* key) {
  if (!x.is_object()) throw error(errc::format, "not a JSON object", {.file = {}, .tensor = {}, .field = key});
  const auto it = x.find(key);
  if (it == x.end()) throw error(errc::format, "missing field", {.file = {}, .tensor = {}, .field = key});
  return *it;
}
template <class T>
T integer(const json& x, const char* field) {
  return io::json_integer<T>(x, {.file = {}, .tensor = {}, .field = field});
}
inline bool boolean(const json& x, const char* field) {
  if (!x.is_boolean()) throw error(errc::format, "not a boolean", {.file = {}, .tensor = {}, .field = field});
  return x.get<bool>();
}
inline const json& array(const json& x, const char* field) {
  if (!x.is_array()) throw error(errc::format, "not an array", {.file = {}, .tensor = {}, .field = field});
  return x;
}
}  // namespace detail

inline attempt_id attempt_from(const json& x) {
  return {detail::integer<std::uint64_t>(detail::element(x, 0, 2, "attempt"), "attempt.epoch"),
          detail::integer<std::uint64_t>(detail::element(x, 1, 2, "attempt"), "attempt.counter")};
}
inline digest128 digest_from(const json& x) {
  if (!x.is_string()) throw error(errc::format, "digest is not a string", {.file = {}, .tensor = {}, .field = "digest"});
  auto d = digest128::from_hex(x.get_ref<const std::string&>());
  if (!d) throw error(errc::format, "digest is not 32 hex digits", {.file = {}, .tensor = {}, .field = "digest"});
  return *d;
}
inline protocol::commit_record record_from(const json& x) {
  return {detail::integer<std::uint64_t>(detail::element(x, 0, 2, "record"), "record.version"),
          baseline_id{detail::integer<std::uint64_t>(detail::element(x, 1, 2, "record"), "record.baseline")}};
}
inline protocol::member member_from(const json& x) {
  return {detail::integer<std::uint32_t>(detail::element(x, 0, 2, "member"), "member.receiver"),
          detail::integer<std::uint64_t>(detail::element(x, 1, 2, "member"), "member.incarnation")};
}
inline protocol::mode mode_from(const json& x) {
  const int m = detail::integer<int>(x, "mode");
  if (m < 0 || m > 1) throw error(errc::format, "unknown mode", {.file = {}, .tensor = {}, .field = "mode"});
  return static_cast<protocol::mode>(m);
}
inline protocol::prepare_record prepare_from(const json& x) {
  protocol::prepare_record r;
  r.attempt = attempt_from(detail::member(x, "attempt"));
  r.base = record_from(detail::member(x, "base"));
  r.target = detail::integer<std::uint64_t>(detail::member(x, "target"), "target");
  r.next = baseline_id{detail::integer<std::uint64_t>(detail::member(x, "next"), "next")};
  r.mode = mode_from(detail::member(x, "mode"));
  r.xor_allowed = detail::boolean(detail::member(x, "xor_allowed"), "xor_allowed");
  for (auto& m : detail::array(detail::member(x, "members"), "members")) r.members.push_back(member_from(m));
  for (auto& d : detail::array(detail::member(x, "expected"), "expected")) r.expected.push_back(digest_from(d));
  if (x.contains("frozen"))  // absent in records written before frozen identities were recorded
    for (auto& d : detail::array(x.at("frozen"), "frozen")) r.frozen.push_back(digest_from(d));
  if (x.contains("retry")) r.retry = detail::boolean(x.at("retry"), "retry");
  if (x.contains("aborted")) r.aborted = detail::boolean(x.at("aborted"), "aborted");  // absent before aborts were persisted
  return r;
}
/// @throws errc::format (naming `file` and the field) when the text is not a commit-log snapshot.
inline protocol::log_snapshot snapshot_from(const std::string& text, const std::string& file) {
  try {
    const auto x = io::parse_json(text, control_json_limits, {.file = file, .tensor = {}, .field = {}});
    const json& format = detail::member(x, "format");
    if (!format.is_string() || format != "bitrefit-commit-log/1")
      throw error(errc::unsupported, "unknown commit log format", {.file = file, .tensor = {}, .field = "format"});
    protocol::log_snapshot s;
    s.epoch = detail::integer<std::uint64_t>(detail::member(x, "epoch"), "epoch");
    s.record = record_from(detail::member(x, "record"));
    if (x.contains("prepared")) s.prepared = prepare_from(x.at("prepared"));
    return s;
  } catch (const error& e) {
    if (!e.where().file.empty()) throw;
    throw error(e.code(), "commit log: " + e.message(), {.file = file, .tensor = {}, .field = e.where().field});
  } catch (const json::exception& e) {
    throw error(errc::format, std::string("commit log does not parse: ") + e.what(), {.file = file, .tensor = {}, .field = {}});
  }
}

}  // namespace bitrefit::durability::json_io
