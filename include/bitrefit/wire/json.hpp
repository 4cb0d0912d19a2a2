// bitrefit/wire/json.hpp — the one JSON spelling of protocol values.
//
// Two forms, both here so a value reads the same wherever it is written:
//  * NAMED (records, messages, envelopes): objects with field names, for what other processes and
//    disks read — the control plane (wire/control.hpp), the filesystem commit log's commit.json
//    (durability/filesystem_commit_log.hpp) and etcd_commit_log.hpp, and messages inside traces. Decoders validate what they
//    read and throw errc::format naming the field.
//  * POSITIONAL (`value_to_json` / `value_from_json`): any value with a field list
//    (core/fields.hpp) as a JSON array of its fields in order; a variant as [index, value]. Used
//    for the events and actions of a trace (wire/trace.hpp): generated from the same field list as
//    the state hash, so no field can be forgotten, and readable back into the exact value.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/fields.hpp"
#include "bitrefit/io/json.hpp"
#include "bitrefit/protocol/commit_log.hpp"
#include "bitrefit/protocol/messages.hpp"

namespace bitrefit::wire {

using nlohmann::json;

// ---- records (named) ------------------------------------------------------------------------

/// What one control record may cost (io/json.hpp): the commit log file and every control message
/// (wire/control.hpp). A prepare record takes about 60 bytes per receiver, so 4 MiB holds ~70 K.
inline constexpr io::json_limits control_json_limits{.max_bytes = 4u << 20, .max_depth = 8, .max_tree_bytes = 64u << 20};

inline json to_json(const attempt_id& a) { return json::array({a.epoch, a.counter}); }
inline json to_json(const digest128& d) { return d.to_hex(); }
inline json to_json(const protocol::commit_record& k) { return json::array({k.version, k.baseline.value}); }
inline json to_json(const protocol::member& m) { return json::array({m.receiver, m.incarnation}); }
inline json to_json(const protocol::endpoint& e) { return json::array({static_cast<int>(e.role), e.index}); }
inline json to_json(const payload_id& p) { return json::array({p.attempt.epoch, p.attempt.counter, p.owner, p.seq}); }
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
inline std::vector<std::uint32_t> u32_list(const json& x, const char* field) {
  std::vector<std::uint32_t> out;
  for (auto& v : array(x, field)) out.push_back(integer<std::uint32_t>(v, field));
  return out;
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
inline protocol::endpoint endpoint_from(const json& x) {
  const int r = detail::integer<int>(detail::element(x, 0, 2, "endpoint"), "endpoint.role");
  if (r < 0 || r > 2) throw error(errc::format, "unknown role", {.file = {}, .tensor = {}, .field = "endpoint.role"});
  return {static_cast<protocol::role>(r), detail::integer<std::uint32_t>(detail::element(x, 1, 2, "endpoint"), "endpoint.index")};
}
inline payload_id payload_id_from(const json& x) {
  using detail::element, detail::integer;
  return {{integer<std::uint64_t>(element(x, 0, 4, "id"), "id.epoch"), integer<std::uint64_t>(element(x, 1, 4, "id"), "id.counter")},
          integer<std::uint32_t>(element(x, 2, 4, "id"), "id.owner"), integer<std::uint32_t>(element(x, 3, 4, "id"), "id.seq")};
}
inline protocol::prepare_record prepare_from(const json& x) {
  using detail::member;
  protocol::prepare_record r;
  r.attempt = attempt_from(member(x, "attempt"));
  r.base = record_from(member(x, "base"));
  r.target = detail::integer<std::uint64_t>(member(x, "target"), "target");
  r.next = baseline_id{detail::integer<std::uint64_t>(member(x, "next"), "next")};
  r.mode = mode_from(member(x, "mode"));
  r.xor_allowed = detail::boolean(member(x, "xor_allowed"), "xor_allowed");
  for (auto& m : detail::array(member(x, "members"), "members")) r.members.push_back(member_from(m));
  for (auto& d : detail::array(member(x, "expected"), "expected")) r.expected.push_back(digest_from(d));
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

// ---- messages (named) -----------------------------------------------------------------------

namespace detail {
struct message_to_json {
  json operator()(const protocol::prepare_msg& m) const { return {{"type", "prepare"}, {"record", to_json(m.record)}}; }
  json operator()(const protocol::obsolete_msg& m) const { return {{"type", "obsolete"}, {"attempt", to_json(m.attempt)}}; }
  json operator()(const protocol::open_msg& m) const { return {{"type", "open"}, {"attempt", to_json(m.attempt)}, {"chunks", m.chunks}}; }
  json operator()(const protocol::flush_msg& m) const { return {{"type", "flush"}, {"attempt", to_json(m.attempt)}}; }
  json operator()(const protocol::announce_msg& m) const {
    json x{{"type", "announce"}, {"record", to_json(m.record)}, {"epoch", m.epoch}};
    if (m.roster) x["roster"] = to_json(*m.roster);
    if (m.evicted) x["evicted"] = true;
    if (m.confirm) x["confirm"] = true;
    return x;
  }
  json operator()(const protocol::roll_call_msg& m) const { return {{"type", "roll_call"}, {"epoch", m.epoch}}; }
  json operator()(const protocol::abort_msg& m) const { return {{"type", "abort"}, {"epoch", m.epoch}, {"attempt", to_json(m.attempt)}}; }
  json operator()(const protocol::manifest_msg& m) const {
    return {{"type", "manifest"}, {"attempt", to_json(m.attempt)}, {"owner", m.owner}, {"chunks", m.chunks}};
  }
  json operator()(const protocol::arrived_msg& m) const { return {{"type", "arrived"}, {"attempt", to_json(m.attempt)}, {"from", to_json(m.from)}}; }
  json operator()(const protocol::ack_msg& m) const {
    json x{{"type", "ack"}, {"attempt", to_json(m.attempt)}, {"from", to_json(m.from)}};
    if (m.attestation) x["attestation"] = to_json(*m.attestation);
    return x;
  }
  json operator()(const protocol::stopped_msg& m) const { return {{"type", "stopped"}, {"attempt", to_json(m.attempt)}, {"from", to_json(m.from)}}; }
  json operator()(const protocol::failed_msg& m) const {
    return {{"type", "failed"}, {"attempt", to_json(m.attempt)}, {"from", to_json(m.from)}, {"reason", static_cast<int>(m.reason)}};
  }
  json operator()(const protocol::join_msg& m) const {
    return {{"type", "join"}, {"from", to_json(m.from)}, {"at", to_json(m.at)}, {"epoch", m.epoch}};
  }
  json operator()(const protocol::baseline_msg& m) const { return {{"type", "baseline"}, {"owner", m.owner}, {"at", to_json(m.at)}}; }
  json operator()(const protocol::frozen_lost_msg& m) const {
    return {{"type", "frozen_lost"}, {"attempt", to_json(m.attempt)}, {"owner", m.owner}, {"target", m.target}};
  }
  json operator()(const protocol::payload_msg& m) const {
    return {{"type", "payload"}, {"id", to_json(m.id)},   {"base", m.base},
            {"target", m.target}, {"mode", static_cast<int>(m.mode)}, {"content", to_json(m.content)}};
  }
};
}  // namespace detail

inline json to_json(const protocol::message& m) { return std::visit(detail::message_to_json{}, m); }

inline protocol::message message_from(const json& x) {
  using detail::integer, detail::member;
  const json& type = member(x, "type");
  if (!type.is_string()) throw error(errc::format, "message type is not a string", {.file = {}, .tensor = {}, .field = "type"});
  const std::string& t = type.get_ref<const std::string&>();
  if (t == "prepare") return protocol::prepare_msg{prepare_from(member(x, "record"))};
  if (t == "obsolete") return protocol::obsolete_msg{attempt_from(member(x, "attempt"))};
  if (t == "open") return protocol::open_msg{attempt_from(member(x, "attempt")), detail::u32_list(member(x, "chunks"), "chunks")};
  if (t == "flush") return protocol::flush_msg{attempt_from(member(x, "attempt"))};
  if (t == "announce") {
    protocol::announce_msg m{record_from(member(x, "record")), std::nullopt, false, false,
                             integer<std::uint64_t>(member(x, "epoch"), "epoch")};
    if (x.contains("evicted")) m.evicted = detail::boolean(x.at("evicted"), "evicted");
    if (x.contains("confirm")) m.confirm = detail::boolean(x.at("confirm"), "confirm");
    if (x.contains("roster")) m.roster = member_from(x.at("roster"));
    return m;
  }
  if (t == "roll_call") return protocol::roll_call_msg{integer<std::uint64_t>(member(x, "epoch"), "epoch")};
  if (t == "abort") return protocol::abort_msg{integer<std::uint64_t>(member(x, "epoch"), "epoch"), attempt_from(member(x, "attempt"))};
  if (t == "manifest")
    return protocol::manifest_msg{attempt_from(member(x, "attempt")), integer<std::uint32_t>(member(x, "owner"), "owner"),
                                  integer<std::uint32_t>(member(x, "chunks"), "chunks")};
  if (t == "arrived") return protocol::arrived_msg{attempt_from(member(x, "attempt")), member_from(member(x, "from"))};
  if (t == "ack") {
    protocol::ack_msg m{attempt_from(member(x, "attempt")), member_from(member(x, "from")), std::nullopt};
    if (x.contains("attestation")) m.attestation = digest_from(member(x, "attestation"));
    return m;
  }
  if (t == "stopped") return protocol::stopped_msg{attempt_from(member(x, "attempt")), member_from(member(x, "from"))};
  if (t == "failed") {
    const int r = integer<int>(member(x, "reason"), "reason");
    if (r < 0 || r > 2) throw error(errc::format, "unknown failure reason", {.file = {}, .tensor = {}, .field = "reason"});
    return protocol::failed_msg{attempt_from(member(x, "attempt")), member_from(member(x, "from")), static_cast<protocol::failure_reason>(r)};
  }
  if (t == "join")
    return protocol::join_msg{member_from(member(x, "from")), record_from(member(x, "at")),
                              integer<std::uint64_t>(member(x, "epoch"), "epoch")};
  if (t == "baseline") return protocol::baseline_msg{integer<std::uint32_t>(member(x, "owner"), "owner"), record_from(member(x, "at"))};
  if (t == "frozen_lost")
    return protocol::frozen_lost_msg{attempt_from(member(x, "attempt")), integer<std::uint32_t>(member(x, "owner"), "owner"),
                                     integer<std::uint64_t>(member(x, "target"), "target")};
  if (t == "payload")
    return protocol::payload_msg{payload_id_from(member(x, "id")), integer<std::uint64_t>(member(x, "base"), "base"),
                                 integer<std::uint64_t>(member(x, "target"), "target"), mode_from(member(x, "mode")),
                                 digest_from(member(x, "content"))};
  throw error(errc::format, "unknown message type '" + t + "'", {.file = {}, .tensor = {}, .field = "type"});
}

inline json to_json(const protocol::envelope& e) {
  return {{"from", to_json(e.from)}, {"to", to_json(e.to)}, {"msg", to_json(e.msg)}};
}
inline protocol::envelope envelope_from(const json& x) {
  return {endpoint_from(detail::member(x, "from")), endpoint_from(detail::member(x, "to")), message_from(detail::member(x, "msg"))};
}

// ---- any value with a field list (positional) -----------------------------------------------

template <class T>
json value_to_json(const T& x);
template <class T>
void value_from_json(const json& j, T& x);

namespace detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};
template <class T>
struct is_variant : std::false_type {};
template <class... T>
struct is_variant<std::variant<T...>> : std::true_type {};

template <class V, std::size_t... I>
void variant_from(const json& j, V& v, std::size_t index, std::index_sequence<I...>) {
  const bool found = ((index == I ? (value_from_json(j, v.template emplace<I>()), true) : false) || ...);
  if (!found) throw error(errc::format, "variant index " + std::to_string(index) + " out of range", {.file = {}, .tensor = {}, .field = "variant"});
}
}  // namespace detail

/// Positional JSON of `x`: integers and enums as numbers, bool as bool, digests as hex strings,
/// strings as strings, optional as null or the value, vectors as arrays, variants as
/// [index, value], envelopes in the named form, anything else as the array of its fields.
template <class T>
json value_to_json(const T& x) {
  if constexpr (std::is_same_v<T, bool>) return x;
  else if constexpr (std::is_enum_v<T>) return static_cast<std::uint64_t>(x);
  else if constexpr (std::is_integral_v<T>) return x;
  else if constexpr (std::is_same_v<T, std::string>) return x;
  else if constexpr (std::is_same_v<T, digest128>) return to_json(x);
  else if constexpr (std::is_same_v<T, protocol::envelope>) return to_json(x);
  else if constexpr (detail::is_optional<T>::value) return x ? value_to_json(*x) : json(nullptr);
  else if constexpr (detail::is_vector<T>::value) {
    json a = json::array();
    for (const auto& e : x) a.push_back(value_to_json(e));
    return a;
  } else if constexpr (detail::is_variant<T>::value) {
    return json::array({x.index(), std::visit([](const auto& v) { return value_to_json(v); }, x)});
  } else {
    static_assert(has_fields<T>, "value_to_json: the type has no field list (BITREFIT_FIELDS)");
    json a = json::array();
    std::apply([&](const auto&... f) { (a.push_back(value_to_json(f)), ...); }, fields_of(x));
    return a;
  }
}

/// The inverse of value_to_json. @throws errc::format when `j` does not have the value's shape.
template <class T>
void value_from_json(const json& j, T& x) {
  try {
    if constexpr (std::is_same_v<T, bool>) x = j.get<bool>();
    else if constexpr (std::is_enum_v<T>) x = static_cast<T>(j.get<std::underlying_type_t<T>>());
    else if constexpr (std::is_integral_v<T>) x = j.get<T>();
    else if constexpr (std::is_same_v<T, std::string>) x = j.get<std::string>();
    else if constexpr (std::is_same_v<T, digest128>) x = digest_from(j);
    else if constexpr (std::is_same_v<T, protocol::envelope>) x = envelope_from(j);
    else if constexpr (detail::is_optional<T>::value) {
      if (j.is_null()) x.reset();
      else value_from_json(j, x.emplace());
    } else if constexpr (detail::is_vector<T>::value) {
      x.clear();
      for (const auto& e : j) value_from_json(e, x.emplace_back());
    } else if constexpr (detail::is_variant<T>::value) {
      detail::variant_from(j.at(1), x, j.at(0).get<std::size_t>(), std::make_index_sequence<std::variant_size_v<T>>{});
    } else {
      static_assert(has_fields<T>, "value_from_json: the type has no field list (BITREFIT_FIELDS)");
      auto fields = fields_of(x);
      constexpr std::size_t n = std::tuple_size_v<decltype(fields)>;
      if (!j.is_array() || j.size() != n)
        throw error(errc::format, "expected an array of " + std::to_string(n) + " fields", {.file = {}, .tensor = {}, .field = "value"});
      [&]<std::size_t... I>(std::index_sequence<I...>) { (value_from_json(j.at(I), std::get<I>(fields)), ...); }(std::make_index_sequence<n>{});
    }
  } catch (const json::exception& e) {
    throw error(errc::format, std::string("value does not parse: ") + e.what(), {.file = {}, .tensor = {}, .field = "value"});
  }
}

template <class T>
T value_from_json(const json& j) {
  T x{};
  value_from_json(j, x);
  return x;
}

}  // namespace bitrefit::wire
