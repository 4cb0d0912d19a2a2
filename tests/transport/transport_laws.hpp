// tests/transport/transport_laws.hpp — the conformance checks of transport/concepts.hpp, shared by
// every model's tests: the in-process and directory transports (test_transport.cpp) and the S3
// transport (test_s3_store.cpp) must pass the very same checks.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport {

inline bytes make_bytes(std::size_t n, unsigned seed) {
  bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xFF);
  return b;
}

/// Laws 1-6 of Transport on a fresh transport `t`.
template <class T>
void check_transport_laws(T t) {
  const attempt_id a{3, 7};
  const stream_key s = attempt_stream(a);
  // Law 1 + 3: publish then fetch round-trips; list is sorted by (owner, seq) and names only s.
  std::vector<payload_id> ids{{a, 2, 0}, {a, 0, 1}, {a, 0, 0}, {a, 1, 300}};
  for (unsigned i = 0; i < ids.size(); ++i) t.publish(key_of(ids[i]), make_bytes(100 + i, i));
  t.publish(key_of({{3, 8}, 0, 0}), make_bytes(5, 9));  // another attempt's stream
  auto keys = t.list(s);
  ASSERT_EQ(keys.size(), 4u);
  for (std::size_t i = 1; i < keys.size(); ++i)
    EXPECT_LT(std::pair(keys[i - 1].owner, keys[i - 1].seq), std::pair(keys[i].owner, keys[i].seq));
  for (unsigned i = 0; i < ids.size(); ++i) {
    auto got = t.fetch(key_of(ids[i]));
    ASSERT_TRUE(got);
    EXPECT_EQ(*got, make_bytes(100 + i, i));
  }
  // Law 2: idempotent publish.
  t.publish(key_of(ids[0]), make_bytes(100, 0));
  EXPECT_EQ(t.list(s).size(), 4u);
  // Empty frames are legal objects.
  t.publish(key_of({a, 9, 9}), bytes{});
  EXPECT_EQ(t.fetch(key_of({a, 9, 9}))->size(), 0u);
  // Law 4: discard.
  t.discard(s);
  EXPECT_TRUE(t.list(s).empty());
  EXPECT_FALSE(t.fetch(key_of(ids[0])));
  EXPECT_EQ(t.list(attempt_stream({3, 8})).size(), 1u);
  // Law 5 + 6: control messages reach their mailbox only, and receive consumes them.
  t.post("receiver/1", make_bytes(3, 1));
  t.post("receiver/10", make_bytes(4, 2));
  t.post("receiver/1", make_bytes(5, 3));
  auto got = t.receive("receiver/1", std::chrono::milliseconds(200));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], make_bytes(3, 1));
  EXPECT_EQ(got[1], make_bytes(5, 3));
  EXPECT_TRUE(t.receive("receiver/1", std::chrono::milliseconds(5)).empty());
  EXPECT_EQ(t.receive("receiver/10", std::chrono::milliseconds(5)).size(), 1u);
}

/// The ObjectStore laws on a fresh, empty store `s`: get after put returns the bytes put (empty
/// objects included), a second put replaces the object whole, list(prefix) returns exactly the
/// keys under prefix sorted byte-wise, get of an absent key is nullopt, remove of an absent key is
/// a no-op.
template <class S>
void check_object_store_laws(S s) {
  const std::vector<std::string> keys{"p/b", "p/a/2", "p/a/10", "p/a/1", "q/a", "p-x"};
  for (unsigned i = 0; i < keys.size(); ++i) s.put(keys[i], make_bytes(10 * i, i));
  for (unsigned i = 0; i < keys.size(); ++i) {
    auto got = s.get(keys[i]);
    ASSERT_TRUE(got) << keys[i];
    EXPECT_EQ(*got, make_bytes(10 * i, i)) << keys[i];
  }
  EXPECT_EQ(s.list("p/"), (std::vector<std::string>{"p/a/1", "p/a/10", "p/a/2", "p/b"}));
  EXPECT_EQ(s.list("p/a/1"), (std::vector<std::string>{"p/a/1", "p/a/10"}));
  EXPECT_TRUE(s.list("none/").empty());
  s.put("p/b", make_bytes(77, 9));  // replaced whole
  EXPECT_EQ(*s.get("p/b"), make_bytes(77, 9));
  EXPECT_FALSE(s.get("p/absent"));
  s.remove("p/absent");  // no-op
  s.remove("p/b");
  EXPECT_FALSE(s.get("p/b"));
  EXPECT_EQ(s.list("p/"), (std::vector<std::string>{"p/a/1", "p/a/10", "p/a/2"}));
  s.remove("p/b");  // again: still a no-op
}

}  // namespace bitrefit::transport
