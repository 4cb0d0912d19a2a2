// Laws of transport/concepts.hpp checked on every shipped model, plus the directory store's
// atomicity and the fault injector's determinism.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "bitrefit/transport/any_transport.hpp"
#include "bitrefit/transport/faulty.hpp"
#include "bitrefit/transport/inprocess.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "transport_laws.hpp"

using namespace bitrefit;
using namespace bitrefit::transport;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("bitrefit-test-transport-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p;
}

/// A fresh directory, removed when the holder goes: also when an assertion ends the test early.
/// A property runs its body many times in one directory, held by a function-local static that is
/// destroyed at exit (before, that directory was left behind in /tmp by every run).
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name) : path(fresh_dir(name)) {}
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;  // never throw from a destructor; a leftover directory is not a failure
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST(Transport, InProcessLaws) { check_transport_laws(inprocess_transport{}); }

// any_transport forwards every call, so it must pass the very laws of the model it holds.
TEST(Transport, AnyTransportLaws) {
  check_transport_laws(any_transport(inprocess_transport{}));
  const scratch_dir scratch("any-transport");
  const fs::path& dir = scratch.path;
  check_transport_laws(any_transport(directory_transport(directory_store(dir))));
}

TEST(Transport, AnyTransportCopiesShareTheOneModel) {
  any_transport a(inprocess_transport{});
  any_transport b = a;
  const frame_key k = key_of({{1, 1}, 0, 0});
  a.publish(k, make_bytes(64, 1));
  const auto got = b.fetch(k);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, make_bytes(64, 1));  // bits, not "it ran"
  b.post("m", make_bytes(3, 2));
  const auto msgs = a.receive("m", std::chrono::milliseconds(0));
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0], make_bytes(3, 2));
}

TEST(Transport, DirectoryLaws) {
  const scratch_dir scratch("laws");
  const fs::path& dir = scratch.path;
  check_transport_laws(directory_transport(directory_store(dir)));
  check_object_store_laws(directory_store(dir / "objects"));
}

TEST(Transport, DirectoryKeysDerivedFromPayloadId) {
  const scratch_dir scratch("keys");
  const fs::path& dir = scratch.path;
  directory_transport t{directory_store(dir)};
  t.publish(key_of({{1, 2}, 3, 4}), make_bytes(8, 1));
  EXPECT_TRUE(fs::exists(dir / "payloads/a1.2/00000003.00000004"));
  // A second process handle over the same directory sees the frame (shared filesystem model).
  directory_transport other{directory_store(dir)};
  EXPECT_EQ(*other.fetch(key_of({{1, 2}, 3, 4})), make_bytes(8, 1));
}

TEST(Transport, DirectoryRejectsEscapingKeys) {
  const scratch_dir scratch("escape");
  const fs::path& dir = scratch.path;
  directory_store s(dir);
  EXPECT_THROW(s.put("../x", make_bytes(1, 1)), error);
  EXPECT_THROW(s.put("/abs", make_bytes(1, 1)), error);
  EXPECT_THROW(s.put("a/.tmp.x", make_bytes(1, 1)), error);
}

TEST(Transport, DirectoryRefusesObjectsAboveItsLimitUnread) {
  const scratch_dir scratch("limit");
  const fs::path& dir = scratch.path;
  directory_store s(dir, {.durable = false, .max_object_bytes = 1024});
  s.put("a/small", bytes(1024));
  EXPECT_EQ(s.get("a/small")->size(), 1024u);
  s.put("a/big", bytes(1025));
  try {
    (void)s.get("a/big");
    FAIL() << "an object above the limit was read";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::integrity);
    EXPECT_EQ(e.where().field, "size");
    EXPECT_EQ(e.where().file, (dir / "a/big").string());
  }
}

TEST(Transport, DirectoryWritesAreAtomicForConcurrentReaders) {
  // A writer process replaces one object with alternating full-size contents; the reader must only
  // ever see one of the two whole objects, never a prefix or a mix.
  const scratch_dir scratch("atomic");
  const fs::path& dir = scratch.path;
  directory_store s(dir);
  const bytes A = make_bytes(1 << 20, 1), B = make_bytes(1 << 20, 2);
  s.put("obj", A);
  pid_t pid = ::fork();
  if (pid == 0) {
    directory_store w(dir);
    for (int i = 0; i < 60; ++i) w.put("obj", i % 2 ? A : B);
    ::_exit(0);
  }
  int seen = 0;
  for (int i = 0; i < 300; ++i) {
    auto got = s.get("obj");
    ASSERT_TRUE(got);
    ASSERT_TRUE(*got == A || *got == B) << "torn read";
    ++seen;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().filename().string().rfind(".tmp.", 0), 0u);
}

TEST(Transport, DirectoryReceiveWaitsBoundedAndWakesOnPost) {
  const scratch_dir scratch("poll");
  const fs::path& dir = scratch.path;
  directory_transport t{directory_store(dir), {.max_poll_interval = std::chrono::milliseconds(5)}};
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(t.receive("coordinator", std::chrono::milliseconds(60)).empty());
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(55));
  EXPECT_LT(waited, std::chrono::milliseconds(1000));
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    directory_transport p{directory_store(dir)};
    p.post("coordinator", make_bytes(2, 2));
  });
  auto got = t.receive("coordinator", std::chrono::milliseconds(5000));
  poster.join();
  ASSERT_EQ(got.size(), 1u);
}

TEST(Transport, FaultsAreDeterministicAndRecoverable) {
  fault_rules r{.seed = 42, .corrupt_one_in = 2, .corrupt_copies = 1, .duplicate_one_in = 3, .reorder = true,
                .delay_one_in = 4, .delay_lists = 1, .drop_posts = {2}, .duplicate_posts = {3}};
  auto run = [&] {
    faulty_transport<inprocess_transport> t(inprocess_transport{}, r);
    const attempt_id a{1, 1};
    for (std::uint32_t i = 0; i < 16; ++i) t.publish(key_of({a, i % 2, i}), make_bytes(64, i));
    std::vector<std::pair<std::uint32_t, bool>> trace;  // (seq, intact?) per listed copy
    for (int round = 0; round < 3; ++round)
      for (auto& k : t.list(attempt_stream(a))) trace.emplace_back(k.seq, *t.fetch(k) == make_bytes(64, k.seq));
    for (int i = 0; i < 4; ++i) t.post("m", make_bytes(1, i));
    auto got = t.receive("m", std::chrono::milliseconds(1));
    return std::tuple(trace, got.size(), t.counters().corrupted, t.counters().duplicated, t.counters().delayed);
  };
  auto a = run(), b = run();
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::get<1>(a), 4u);  // one dropped, one duplicated
  EXPECT_GT(std::get<2>(a), 0u);
  EXPECT_GT(std::get<3>(a), 0u);
  EXPECT_GT(std::get<4>(a), 0u);
  // Every frame was eventually seen intact (a corrupt copy is followed by a good one).
  std::set<std::uint32_t> intact;
  for (auto& [seq, ok] : std::get<0>(a)) if (ok) intact.insert(seq);
  EXPECT_EQ(intact.size(), 16u);
}

RC_GTEST_PROP(Transport, DirectoryRoundTripsArbitraryBytes, (const std::vector<std::uint8_t>& data, std::uint32_t owner, std::uint32_t seq)) {
  static const scratch_dir dir("prop");
  directory_transport t{directory_store(dir.path)};
  bytes b(data.size());
  std::ranges::transform(data, b.begin(), [](std::uint8_t x) { return std::byte{x}; });  // (memcpy of an empty vector's null data() is UB)
  const frame_key k = key_of({{5, 5}, owner, seq});
  t.publish(k, b);
  RC_ASSERT(*t.fetch(k) == b);
  auto keys = t.list(k.stream);
  RC_ASSERT(std::find(keys.begin(), keys.end(), k) != keys.end());
  t.discard(k.stream);
}
