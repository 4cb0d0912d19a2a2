// io/json.hpp: bounded parsing of untrusted JSON and checked integers — each limit refused by name.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "bitrefit/io/json.hpp"

namespace bitrefit::io::test {
namespace {

std::string field_of(const std::string& text, const json_limits& limits) {
  try {
    (void)parse_json(text, limits, {.file = "doc.json", .tensor = {}, .field = {}});
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format) << e.what();
    EXPECT_EQ(e.where().file, "doc.json");
    return e.where().field;
  }
  return "accepted";
}

TEST(Json, EachLimitIsRefusedByName) {
  const json_limits l{.max_bytes = 1000, .max_depth = 4, .max_tree_bytes = 4096};
  EXPECT_EQ(field_of(R"({"a":[1,2,{"b":"c"}]})", l), "accepted");
  EXPECT_EQ(field_of(std::string(1001, ' '), l), "json.size");
  EXPECT_EQ(field_of("[[[[1]]]]", l), "accepted");
  EXPECT_EQ(field_of("[[[[[1]]]]]", l), "json.depth");
  EXPECT_EQ(field_of(R"({"a":{"b":{"c":{"d":{}}}}})", l), "json.depth");
  EXPECT_EQ(field_of(R"({"a":1,"b":2,"a":3})", l), "json.duplicate_key");
  EXPECT_EQ(field_of(R"({"x":{"k":1,"k":1}})", l), "json.duplicate_key");
  EXPECT_EQ(field_of(R"([{"k":1},{"k":1}])", l), "accepted");  // same key in two objects
  EXPECT_EQ(field_of("{", l), "json");
  EXPECT_EQ(field_of("[1,]", l), "json");
  EXPECT_EQ(field_of("", l), "json");
  // many small values: text under the size bound, tree above its bound
  std::string many = "[";
  for (int i = 0; i < 150; ++i) many += "[],";
  many += "[]]";
  EXPECT_LT(many.size(), 1000u);
  EXPECT_EQ(field_of(many, l), "json.tree");
}

TEST(Json, TreeEstimateIsAnUpperBoundOfWhatTheTreeTakes) {
  // The estimate must never be below what nlohmann's tree really holds, or max_tree_bytes would
  // not bound memory: compare with the smallest tree bound that accepts each document.
  for (const std::string& doc :
       {std::string(R"({"name":"model.layers.0.mlp.down_proj.weight","dtype":"BF16","shape":[4096,11008]})"),
        std::string("[[],[],[],[],[],[],[],[],[],[]]"), std::string(R"(["a long string value past sixteen chars",1,2.5,null,true])")}) {
    std::size_t lo = 0, hi = 1 << 20;
    while (lo < hi) {  // smallest accepted max_tree_bytes
      const std::size_t mid = (lo + hi) / 2;
      if (field_of(doc, {.max_bytes = 1 << 20, .max_depth = 8, .max_tree_bytes = mid}) == "accepted") hi = mid;
      else lo = mid + 1;
    }
    // a lower bound of the real tree: 16 bytes per value plus each string's characters
    std::size_t values = 0, chars = 0;
    for (char c : doc) values += c == ',' || c == '[' || c == '{';
    for (char c : doc) chars += c != '"';
    EXPECT_GE(lo, 16 * values) << doc;
    EXPECT_LE(lo, 64 * doc.size()) << doc;
    (void)chars;
  }
}

TEST(Json, IntegersAreCheckedForTypeSignAndRange) {
  auto j = [](const char* t) { return nlohmann::json::parse(t); };
  const error_context w{.file = {}, .tensor = {}, .field = "n"};
  EXPECT_EQ(json_integer<std::uint32_t>(j("4294967295"), w), 4294967295u);
  EXPECT_EQ(json_integer<std::int64_t>(j("-5"), w), -5);
  EXPECT_EQ(json_integer<std::uint64_t>(j("18446744073709551615"), w), std::numeric_limits<std::uint64_t>::max());
  for (const char* bad : {"4294967296", "-1", "1.0", "1e300", "18446744073709551616", "true", "null", "\"1\"", "[1]"}) {
    try {
      (void)json_integer<std::uint32_t>(j(bad), w);
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format) << bad;
      EXPECT_EQ(e.where().field, "n") << bad;
    }
  }
  EXPECT_THROW((void)json_integer<std::int32_t>(j("-2147483649"), w), error);
  EXPECT_THROW((void)json_integer<std::uint64_t>(j("-5"), w), error);
  const auto o = j(R"({"a":7})");
  EXPECT_EQ(json_integer_at<int>(o, "a", {}), 7);
  try {
    (void)json_integer_at<int>(o, "b", {.file = "f", .tensor = {}, .field = {}});
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.where().field, "b");
    EXPECT_EQ(e.where().file, "f");
  }
}

}  // namespace
}  // namespace bitrefit::io::test
