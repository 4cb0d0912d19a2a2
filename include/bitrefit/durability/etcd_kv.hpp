// bitrefit/durability/etcd_kv.hpp — the two etcd v3 requests the commit log needs, through etcd's
// JSON gateway (grpc-gateway: POST /v3/kv/range and /v3/kv/txn; keys and values base64, 64-bit
// integers as JSON strings), over libcurl; and a delete for tools that tidy up.
//
// Every answer says whether the request certainly did not take effect:
//   range: a linearizable read (etcd's default): it returns only what a quorum made durable, so a
//          read that resolves an "unknown" never reports a record that a crash could still revert;
//   put_if: one txn — "if mod_revision(key) == expected then put(key, value)"; expected 0 means
//          "the key does not exist". Outcome applied / not_applied (the comparison failed: someone
//          else wrote first) / not_sent (no endpoint could be reached: certainly not applied) /
//          unknown (it reached a server but no answer came back in time: maybe applied).
// Endpoints are tried in order until one accepts the connection; a request that may have reached
// a server is never sent again (that would turn "unknown" into a guess) — which is also why a txn
// goes on a connection of its own (curl resends a request silently when a reused one died).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/http.hpp"

namespace bitrefit::durability {

struct etcd_options {
  /// Client URLs of the etcd members ("http://127.0.0.1:2379"); tried in order.
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  /// The deadline of one request: past it, a read fails and a txn's outcome is unknown.
  std::chrono::milliseconds timeout{3000};
  std::chrono::milliseconds connect_timeout{1000};
};

class etcd_kv {
 public:
  struct value {
    std::string data;
    std::int64_t mod_revision = 0;
  };
  enum class outcome : std::uint8_t { applied, not_applied, not_sent, unknown };
  /// A range answer: `ok` false when no member answered (`why` says what happened).
  struct read_result {
    bool ok = false;
    std::optional<value> kv;  // absent key: nullopt
    std::string why;
  };
  struct txn_result {
    outcome result = outcome::unknown;
    std::string why;
  };

  explicit etcd_kv(etcd_options o) : opt_(std::move(o)) {
    if (opt_.endpoints.empty())
      throw error(errc::invalid_argument, "etcd: no endpoints given", {.file = {}, .tensor = {}, .field = "endpoints"});
    for (auto& e : opt_.endpoints)
      while (!e.empty() && e.back() == '/') e.pop_back();
  }

  read_result range(const std::string& key) const {
    const nlohmann::json q{{"key", transport::http::base64_encode(key)}};
    std::string why;
    for (const auto& ep : opt_.endpoints) {
      const auto r = post(ep + "/v3/kv/range", q.dump());
      if (r.failed != transport::http::failure::none || r.status != 200) {
        why = describe(ep, r);
        continue;  // a read changes nothing: any member may answer it
      }
      try {
        const auto x = nlohmann::json::parse(r.text());
        read_result out{true, std::nullopt, {}};
        if (x.contains("kvs") && !x["kvs"].empty()) {
          const auto& kv = x["kvs"][0];
          out.kv = value{kv.contains("value") ? transport::http::base64_decode(kv["value"].get<std::string>()) : std::string(),
                         integer(kv, "mod_revision")};
        }
        return out;
      } catch (const std::exception& e) {
        why = ep + ": answer does not parse: " + e.what();
      }
    }
    return {false, std::nullopt, why};
  }

  txn_result put_if(const std::string& key, std::int64_t expected_mod_revision, const std::string& data) const {
    const std::string k = transport::http::base64_encode(key);
    const nlohmann::json q{
        {"compare", {{{"key", k}, {"target", "MOD"}, {"result", "EQUAL"}, {"mod_revision", std::to_string(expected_mod_revision)}}}},
        {"success", {{{"request_put", {{"key", k}, {"value", transport::http::base64_encode(data)}}}}}}};
    std::string why;
    for (const auto& ep : opt_.endpoints) {
      const auto r = post(ep + "/v3/kv/txn", q.dump(), /*fresh_connection=*/true);
      if (r.failed == transport::http::failure::not_sent) {
        why += (why.empty() ? "" : "; ") + describe(ep, r);
        continue;  // never reached a server: try the next member
      }
      if (r.failed != transport::http::failure::none || r.status != 200) return {outcome::unknown, describe(ep, r)};
      try {
        const auto x = nlohmann::json::parse(r.text());
        return {x.value("succeeded", false) ? outcome::applied : outcome::not_applied, {}};
      } catch (const std::exception& e) {
        return {outcome::unknown, ep + ": answer does not parse: " + e.what()};
      }
    }
    return {outcome::not_sent, why};
  }

  /// Deletes the key (tools and demos that tidy up after themselves). True when a member answered.
  bool remove(const std::string& key) const {
    const nlohmann::json q{{"key", transport::http::base64_encode(key)}};
    for (const auto& ep : opt_.endpoints) {
      const auto r = post(ep + "/v3/kv/deleterange", q.dump(), /*fresh_connection=*/true);
      if (r.failed == transport::http::failure::none && r.status == 200) return true;
    }
    return false;
  }

  const etcd_options& options() const noexcept { return opt_; }

 private:
  transport::http::response post(const std::string& url, const std::string& body, bool fresh_connection = false) const {
    transport::http::request q;
    q.method = "POST";
    q.url = url;
    q.headers = {"Content-Type: application/json"};
    q.body = std::as_bytes(std::span(body.data(), body.size()));
    q.connect_timeout = opt_.connect_timeout;
    q.timeout = opt_.timeout;
    q.fresh_connection = fresh_connection;
    return http_.perform(q);
  }

  static std::string describe(const std::string& ep, const transport::http::response& r) {
    if (r.failed != transport::http::failure::none) return ep + ": " + transport::http::to_string(r.failed) + ": " + r.error;
    return ep + ": HTTP " + std::to_string(r.status) + ": " + std::string(r.text().substr(0, 200));
  }

  /// grpc-gateway spells int64 as a JSON string and leaves out zero values.
  static std::int64_t integer(const nlohmann::json& x, const char* name) {
    if (!x.contains(name)) return 0;
    const auto& v = x[name];
    return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<std::int64_t>();
  }

  etcd_options opt_;
  transport::http::client http_;
};

}  // namespace bitrefit::durability
