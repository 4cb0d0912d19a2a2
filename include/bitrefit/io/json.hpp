// bitrefit/io/json.hpp — JSON from untrusted bytes: bounded parsing and checked numbers.
//
// Every JSON document bitrefit reads from another machine or from disk (control messages, the
// delta bundle manifest, the commit log, the checkpoint index) goes through here, so the rules
// live in one place:
//  - parse_json(text, limits, where) refuses, before building any tree: text above
//    limits.max_bytes (field "json.size"), nesting deeper than limits.max_depth ("json.depth"), a
//    tree whose memory would exceed limits.max_tree_bytes ("json.tree"), an object holding a key
//    twice ("json.duplicate_key"; nlohmann would silently keep the last) and text that is not JSON
//    ("json"). All are errc::format with `where.file` kept. A first SAX pass builds nothing, so a
//    refused document costs its text and the SAX pass's key sets only; an accepted one costs at
//    most max_tree_bytes for its tree (nlohmann's tree takes 20-50x the text for small values,
//    e.g. "[[],[],...]", which is why the text bound alone is not enough).
//  - json_integer<T>(j, where) returns the value as T only when it is a JSON integer (not a float,
//    bool or string) inside T's range; anything else is errc::format naming where.field.
//    nlohmann's get<int>() on 1e300 or 2^64 is undefined behaviour or silent wrapping, and
//    get<std::uint32_t>() on -1 wraps to 4294967295.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"

namespace bitrefit::io {

/// What one JSON document may cost. Each kind of document states its own (next to its format).
struct json_limits {
  std::size_t max_bytes = 1 << 20;
  std::size_t max_depth = 16;  // arrays and objects nested inside each other, the outermost counts 1
  std::size_t max_tree_bytes = 64 << 20;
};

namespace detail {

/// Upper bounds of what nlohmann's tree (libstdc++ containers, 16-byte malloc headers) takes per
/// element, with the growth slack of vectors: every value 16 bytes where it is stored; an array or
/// object a heap-allocated container; an array element twice its size (vector doubling); an
/// object member an rb-tree node holding the key and the value; a string its heap object and,
/// past 15 characters, its buffer.
inline constexpr std::size_t json_value_cost = 16, json_container_cost = 64, json_array_element_cost = 32,
                             json_member_cost = 112, json_string_cost = 64, json_heap_header = 16;

/// The first pass: checks every limit and duplicate keys, builds nothing.
class json_bounds_sax {
 public:
  using json = nlohmann::json;
  explicit json_bounds_sax(const json_limits& l) : limits_(l) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t& s) { return value() && charge(json_string_cost + text_cost(s.size())); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open() && (keys_.emplace_back(), true); }
  bool end_object() {
    keys_.pop_back();
    return close();
  }
  bool start_array(std::size_t) { return open(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second) return stop("json.duplicate_key", "key '" + k + "' appears twice in one object");
    pending_member_ = true;
    return charge(json_member_cost + text_cost(k.size()));
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    return stop("json", std::string("not valid JSON: ") + e.what());
  }

  const std::string& failed_field() const noexcept { return field_; }
  const std::string& failure() const noexcept { return message_; }

 private:
  static std::size_t text_cost(std::size_t n) { return n > 15 ? n + 1 + json_heap_header : 0; }
  bool charge(std::size_t bytes) {
    tree_ += bytes;
    if (tree_ > limits_.max_tree_bytes)
      return stop("json.tree", "its parsed tree would take more than " + std::to_string(limits_.max_tree_bytes) + " bytes");
    return true;
  }
  // each value is either an object member (charged at its key) or an array element / the root
  bool value() {
    const bool member = pending_member_;
    pending_member_ = false;
    return charge(member ? 0 : json_value_cost + (depth_ > 0 ? json_array_element_cost : 0));
  }
  bool open() {
    if (!value() || !charge(json_container_cost)) return false;
    if (++depth_ > limits_.max_depth) return stop("json.depth", "nesting deeper than " + std::to_string(limits_.max_depth) + " levels");
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  bool stop(std::string field, std::string message) {
    if (field_.empty()) {
      field_ = std::move(field);
      message_ = std::move(message);
    }
    return false;
  }

  const json_limits& limits_;
  std::size_t depth_ = 0, tree_ = 0;
  bool pending_member_ = false;
  std::vector<std::set<std::string, std::less<>>> keys_;  // one set per open object
  std::string field_, message_;
};

}  // namespace detail

/// Parses `text` under `limits` (see the file comment). @throws errc::format naming `where.file`
/// and the field of the broken rule.
inline nlohmann::json parse_json(std::string_view text, const json_limits& limits, error_context where = {}) {
  if (text.size() > limits.max_bytes) {
    where.field = "json.size";
    throw error(errc::format, "JSON document of " + std::to_string(text.size()) + " bytes exceeds the limit of " + std::to_string(limits.max_bytes), where);
  }
  detail::json_bounds_sax sax(limits);
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &sax)) {
    where.field = sax.failed_field().empty() ? "json" : sax.failed_field();
    throw error(errc::format, "JSON document refused: " + (sax.failure().empty() ? std::string("not valid JSON") : sax.failure()), where);
  }
  return nlohmann::json::parse(text.begin(), text.end());  // cannot fail: the same text passed the SAX pass
}

/// The value of `j` as T: only a JSON integer inside T's range. @throws errc::format naming where.field.
template <std::integral T>
  requires(!std::same_as<T, bool>)
T json_integer(const nlohmann::json& j, const error_context& where) {
  auto bad = [&](const std::string& what) -> error {
    return error(errc::format, what + " where an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                                   std::to_string(std::numeric_limits<T>::max()) + "] is expected",
                 where);
  };
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) throw bad(std::to_string(v) + " is out of range");
    return static_cast<T>(v);
  }
  if (j.is_number_integer()) {  // negative (nlohmann stores non-negative integers as unsigned)
    const auto v = j.get<std::int64_t>();
    if constexpr (std::is_unsigned_v<T>) throw bad(std::to_string(v) + " is negative");
    else if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) || v > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
      throw bad(std::to_string(v) + " is out of range");
    return static_cast<T>(v);
  }
  if (j.is_number_float()) throw bad("floating-point number " + j.dump());
  throw bad(std::string(j.type_name()));
}

/// json_integer of member `key` of object `j` (errc::format naming `key` when absent or not an object).
template <std::integral T>
T json_integer_at(const nlohmann::json& j, std::string_view key, error_context where) {
  where.field = std::string(key);
  if (!j.is_object()) throw error(errc::format, "not a JSON object", where);
  const auto it = j.find(std::string(key));
  if (it == j.end()) throw error(errc::format, "missing field", where);
  return json_integer<T>(*it, where);
}

}  // namespace bitrefit::io
