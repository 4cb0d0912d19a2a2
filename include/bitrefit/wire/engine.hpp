// bitrefit/wire/engine.hpp — the engine's side messages beside the checked protocol, typed, with
// one encoder and one decoder.
//
//   restore_request          receiver -> owners   "engine/restore"        a restarted receiver needs K.v
//   restore_offer            owners -> receiver r "engine/restored/<r>"   K and the dense frames per owner
//   stats_report             receiver -> sender   "engine/stats"          phase times of a transition
//   placement_announcement   receiver -> sender   "engine/placement"      the digest of its Loader's placement
//
// They are not protocol messages: a lost or stale one delays a restore or a statistic, never
// changes what a commit means (a restore's bits are digest-checked frames of K; see
// protocol::serves_dense_restore for when they may be served). Every message is a JSON object
// with a "type"; decode<M>() refuses anything else with errc::format naming the field.
//
// Receiving loops never swallow what they cannot decode: for_each_decoded() counts it, logs one
// line naming the mailbox and the error, and drops it (as the network could have).
#pragma once

#include <concepts>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/wire/json.hpp"

namespace bitrefit::wire {

struct restore_request {
  std::uint32_t receiver = 0;
  std::uint64_t incarnation = 0;
  static constexpr std::string_view type = "restore_request";
  friend bool operator==(const restore_request&, const restore_request&) = default;
};
struct restore_offer {
  protocol::commit_record record{};
  std::vector<std::uint32_t> chunks;  // dense frames of owner o's part of K.v
  static constexpr std::string_view type = "restore_offer";
  friend bool operator==(const restore_offer&, const restore_offer&) = default;
};
struct stats_report {
  std::uint32_t receiver = 0;
  attempt_id attempt{};
  double apply_s = 0, sync_s = 0, gate_closed_s = 0;
  static constexpr std::string_view type = "stats";
  friend bool operator==(const stats_report&, const stats_report&) = default;
};
struct placement_announcement {
  std::uint32_t receiver = 0;
  digest128 digest{};
  static constexpr std::string_view type = "placement";
  friend bool operator==(const placement_announcement&, const placement_announcement&) = default;
};

inline const std::string restore_mailbox = "engine/restore";
inline const std::string stats_mailbox = "engine/stats";
inline const std::string placement_mailbox = "engine/placement";
inline std::string restore_reply_mailbox(std::uint32_t r) { return "engine/restored/" + std::to_string(r); }

namespace detail {
inline json body(const restore_request& m) { return {{"receiver", m.receiver}, {"incarnation", m.incarnation}}; }
inline json body(const restore_offer& m) {
  return {{"version", m.record.version}, {"baseline", m.record.baseline.value}, {"chunks", m.chunks}};
}
inline json body(const stats_report& m) {
  return {{"receiver", m.receiver}, {"attempt", to_json(m.attempt)}, {"apply_s", m.apply_s}, {"sync_s", m.sync_s},
          {"gate_closed_s", m.gate_closed_s}};
}
inline json body(const placement_announcement& m) {
  return {{"receiver", m.receiver}, {"low", m.digest.low64}, {"high", m.digest.high64}};
}
inline void read(const json& x, restore_request& m) {
  m.receiver = integer<std::uint32_t>(member(x, "receiver"), "receiver");
  m.incarnation = integer<std::uint64_t>(member(x, "incarnation"), "incarnation");
}
inline void read(const json& x, restore_offer& m) {
  m.record = {integer<std::uint64_t>(member(x, "version"), "version"), baseline_id{integer<std::uint64_t>(member(x, "baseline"), "baseline")}};
  m.chunks = u32_list(member(x, "chunks"), "chunks");
}
inline void read(const json& x, stats_report& m) {
  m.receiver = integer<std::uint32_t>(member(x, "receiver"), "receiver");
  m.attempt = attempt_from(member(x, "attempt"));
  m.apply_s = x.at("apply_s").get<double>();
  m.sync_s = x.at("sync_s").get<double>();
  m.gate_closed_s = x.at("gate_closed_s").get<double>();
}
inline void read(const json& x, placement_announcement& m) {
  m.receiver = integer<std::uint32_t>(member(x, "receiver"), "receiver");
  m.digest = {integer<std::uint64_t>(member(x, "low"), "low"), integer<std::uint64_t>(member(x, "high"), "high")};
}
}  // namespace detail

template <class M>
concept engine_message = requires(const M& m, const json& x, M& out) {
  { M::type } -> std::convertible_to<std::string_view>;
  detail::body(m);
  detail::read(x, out);
};

template <engine_message M>
std::vector<std::byte> encode(const M& m) {
  json x = detail::body(m);
  x["type"] = std::string(M::type);
  const std::string s = x.dump();
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

/// @throws errc::format naming the field when `bytes` are not an M.
template <engine_message M>
M decode(std::span<const std::byte> bytes) {
  try {
    const auto x = io::parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), control_json_limits);
    const json& type = detail::member(x, "type");
    if (!type.is_string() || type.get_ref<const std::string&>() != M::type)
      throw error(errc::format, "engine message of type " + type.dump() + ", expected '" +
                                    std::string(M::type) + "'",
                  {.file = {}, .tensor = {}, .field = "type"});
    M m;
    detail::read(x, m);
    return m;
  } catch (const json::exception& e) {
    throw error(errc::format, "engine message '" + std::string(M::type) + "' does not parse: " + e.what(),
                {.file = {}, .tensor = {}, .field = "msg"});
  }
}

/// Decodes each item with `decode_one` and hands it to `use`. An item that does not decode (a
/// bitrefit::error) is counted in `undecodable`, logged once with the mailbox's name and the
/// error, and dropped: it counts as lost, which every exchange here tolerates.
template <class Items, class Decode, class Use>
void for_each_decoded(Items&& items, std::string_view mailbox, std::uint64_t& undecodable, Decode decode_one, Use use,
                      const std::function<void(const error&)>& refused = {}) {
  for (auto& bytes : items) {
    std::optional<decltype(decode_one(bytes))> m;
    try {
      m.emplace(decode_one(bytes));
    } catch (const error& e) {
      ++undecodable;
      std::fprintf(stderr, "bitrefit: dropped an undecodable message on mailbox '%.*s': %s\n", int(mailbox.size()),
                   mailbox.data(), e.what());
      if (refused) refused(error(e.code(), e.message(), {.file = std::string(mailbox), .tensor = e.where().tensor, .field = e.where().field}));
      continue;
    }
    use(*m);
  }
}

}  // namespace bitrefit::wire
