// Laws of durability/concepts.hpp on the memory and filesystem models: compare-and-set, epoch
// fencing, crash points of the filesystem write path, concurrent writers in separate processes,
// and a baseline store that stays consistent with the commit log across crashes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sys/file.h>
#include <fcntl.h>

#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/testing/crash_points.hpp"
#include "durability_laws.hpp"

#include "../fuzz/reseal.hpp"

#include <random>

using namespace bitrefit;
using namespace bitrefit::durability;
using namespace bitrefit::durability::laws;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("bitrefit-test-durability-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p;
}

using namespace bitrefit::protocol;

}  // namespace

TEST(CommitLog, MemoryBehavesLikeThePureLog) {
  memory_commit_log a;
  check_log_laws(a, a);
}

TEST(CommitLog, FilesystemBehavesLikeThePureLogAcrossHandles) {
  auto dir = fresh_dir("laws");
  check_log_laws(filesystem_commit_log(dir), filesystem_commit_log(dir));
  filesystem_commit_log restarted(dir);  // a fresh process reads the last successful state
  EXPECT_EQ(snapshot_of(restarted).record.version, 2u);
  EXPECT_TRUE(snapshot_of(restarted).prepared.has_value());
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemCrashBeforeRenameKeepsOldRecord) {
  auto dir = fresh_dir("crash1");
  bitrefit::testing::crash_points crash;
  basic_filesystem_commit_log<bitrefit::testing::crash_points> log(dir, {}, crash);
  ASSERT_EQ(log.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  const commit_record k0{};
  crash.arm("commit_log_after_temp", 1);
  EXPECT_THROW(log.apply(compare_and_set_request{1, {1, 1}, k0, {1, baseline_id{5}}}), bitrefit::testing::injected_crash);
  EXPECT_TRUE(std::any_of(fs::directory_iterator(dir), fs::directory_iterator(), [](const auto& e) {
    return e.path().filename().string().rfind(".tmp.", 0) == 0;
  })) << "a process killed there leaves its temp file";
  filesystem_commit_log restarted(dir);
  EXPECT_EQ(snapshot_of(restarted).record, k0);  // the stray temp file is ignored
  EXPECT_EQ(restarted.apply(compare_and_set_request{1, {1, 2}, k0, {1, baseline_id{6}}}).outcome, log_outcome::ok);
  EXPECT_EQ(snapshot_of(restarted).record.baseline.value, 6u);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemCrashAfterRenameIsResolvedByReading) {
  // The writer dies after the rename, before the directory fsync: it cannot know the outcome
  // (DESIGN's "unknown"); read_commit by a successor finds the attempt's g' committed.
  auto dir = fresh_dir("crash2");
  bitrefit::testing::crash_points crash;
  basic_filesystem_commit_log<bitrefit::testing::crash_points> log(dir, {}, crash);
  ASSERT_EQ(log.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  crash.arm("commit_log_after_rename", 1);
  const commit_record k1{1, baseline_of({1, 1})};
  EXPECT_THROW(log.apply(compare_and_set_request{1, {1, 1}, commit_record{}, k1}), bitrefit::testing::injected_crash);
  filesystem_commit_log successor(dir);
  ASSERT_EQ(successor.apply(claim_epoch_request{2}).outcome, log_outcome::ok);
  EXPECT_EQ(snapshot_of(successor).record, k1);
  EXPECT_EQ(log.apply(compare_and_set_request{1, {1, 2}, k1, {2, baseline_id{7}}}).outcome, log_outcome::fenced);
  fs::remove_all(dir);
}

namespace {
/// A directory fsync that fails while `failing` is set (a disk error), shared across copies.
struct flaky_directory_sync {
  std::shared_ptr<int> failing = std::make_shared<int>(0);
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  void operator()(const fs::path& dir) const {
    ++*calls;
    if (*failing) throw error(errc::io, "injected: directory fsync failed", {.file = dir.string(), .tensor = {}, .field = {}});
    posix_directory_sync{}(dir);
  }
};
}  // namespace

TEST(CommitLog, FilesystemReadOfAnUnknownWriteMakesItDurableFirst) {
  // Finding B5: the rename of a compare-and-set is done, the directory fsync fails: the writer
  // sees "unknown". A read must not report that record as committed while a power loss could
  // still revert it: it fsyncs the directory first, and reports `failed` while it cannot.
  auto dir = fresh_dir("unknown-durable");
  flaky_directory_sync sync;
  basic_filesystem_commit_log<no_crash_points, flaky_directory_sync> log(dir, {}, {}, sync);
  ASSERT_EQ(log.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  const commit_record k1{1, baseline_of({1, 1})};
  *sync.failing = 1;
  EXPECT_EQ(log.apply(compare_and_set_request{1, {1, 1}, commit_record{}, k1}).outcome, log_outcome::unknown);
  // The read (the same handle, or a successor process) cannot make it durable: no answer yet.
  EXPECT_EQ(log.apply(read_request{}).outcome, log_outcome::failed);
  basic_filesystem_commit_log<no_crash_points, flaky_directory_sync> successor(dir, {}, {}, sync);
  EXPECT_EQ(successor.apply(read_request{}).outcome, log_outcome::failed);
  // Nor a request that is refused without writing (fenced, conflict): its snapshot would show k1.
  EXPECT_EQ(successor.apply(compare_and_set_request{1, {1, 2}, commit_record{}, {1, baseline_id{9}}}).outcome,
            log_outcome::failed);
  // Once the directory syncs, the read first makes k1 durable, then reports it.
  *sync.failing = 0;
  const int before = *sync.calls;
  const auto r = successor.apply(read_request{});
  EXPECT_EQ(r.outcome, log_outcome::ok);
  EXPECT_EQ(r.snapshot.record, k1);
  EXPECT_EQ(*sync.calls, before + 1);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemConcurrentWritersInSeparateProcessesCommitOnce) {
  // Eight processes race to compare-and-set from the same record: exactly one succeeds.
  auto dir = fresh_dir("race");
  filesystem_commit_log log(dir);
  ASSERT_EQ(log.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  std::vector<pid_t> kids;
  for (std::uint64_t i = 0; i < 8; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      filesystem_commit_log mine(dir);
      auto o = mine.apply(compare_and_set_request{1, {1, 1 + i}, commit_record{}, {1, baseline_id{100 + i}}}).outcome;
      ::_exit(o == log_outcome::ok ? 0 : o == log_outcome::conflict ? 1 : 2);
    }
    kids.push_back(pid);
  }
  int successes = 0, conflicts = 0;
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WEXITSTATUS(status) == 0) ++successes;
    if (WEXITSTATUS(status) == 1) ++conflicts;
  }
  EXPECT_EQ(successes, 1);
  EXPECT_EQ(conflicts, 7);
  EXPECT_EQ(snapshot_of(log).record.version, 1u);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemLockTimeoutIsAFailedOutcome) {
  auto dir = fresh_dir("lock");
  filesystem_commit_log log(dir, {.lock_timeout = std::chrono::milliseconds(30)});
  ASSERT_EQ(log.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  const auto before = snapshot_of(log);
  int fd = ::open((dir / "LOCK").c_str(), O_RDWR);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  EXPECT_EQ(log.apply(compare_and_set_request{1, {1, 1}, commit_record{}, {1, baseline_id{1}}}).outcome, log_outcome::failed);
  ::close(fd);
  EXPECT_EQ(snapshot_of(log), before);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemRejectsCorruptRecordByName) {
  auto dir = fresh_dir("corrupt");
  fs::create_directories(dir);
  { std::ofstream(dir / "commit.json") << "{not json"; }
  try {
    filesystem_commit_log(dir).read_unlocked();
    FAIL() << "expected a format error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("commit.json"), std::string::npos);
  }
  // Through the protocol interface, an unreadable log is a failed request, never a guess.
  EXPECT_EQ(filesystem_commit_log(dir).apply(read_request{}).outcome, log_outcome::failed);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemChecksEveryIntegerOfTheRecord) {
  auto dir = fresh_dir("integers");
  fs::create_directories(dir);
  const std::string good = wire::to_json(log_snapshot{3, {4, baseline_id{9}}, prep(3, 1, {4, baseline_id{9}})}).dump();
  { std::ofstream(dir / "commit.json") << good; }
  EXPECT_EQ(filesystem_commit_log(dir).read_unlocked().epoch, 3u);
  // Each replacement is a number nlohmann would convert through undefined behaviour or wrap.
  const std::pair<std::string, std::string> cases[] = {
      {"\"epoch\":3", "\"epoch\":-5"},           {"\"epoch\":3", "\"epoch\":1e300"},
      {"\"epoch\":3", "\"epoch\":3.5"},          {"\"record\":[4,9]", "\"record\":[4,18446744073709551616]"},
      {"\"members\":[[0,1]", "\"members\":[[-1,1]"}, {"\"members\":[[0,1]", "\"members\":[[4294967296,1]"},
      {"\"target\":5", "\"target\":true"},        {"\"record\":[4,9]", "\"record\":[4,9,1]"}};
  for (const auto& [from, to] : cases) {
    std::string text = good;
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    { std::ofstream(dir / "commit.json", std::ios::trunc) << text; }
    try {
      filesystem_commit_log(dir).read_unlocked();
      FAIL() << to;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format) << to;
      EXPECT_EQ(e.where().file, (dir / "commit.json").string()) << to;
      EXPECT_FALSE(e.where().field.empty()) << to;
    }
  }
  fs::remove_all(dir);
}

TEST(BaselineStore, MemoryLaws) {
  memory_baseline_store s;
  check_baseline_laws(s, s);
}

TEST(BaselineStore, FilesystemLawsAndCorruptionReadsAsLost) {
  auto dir = fresh_dir("baseline");
  check_baseline_laws(filesystem_baseline_store(dir), filesystem_baseline_store(dir));
  // Flip one byte: the image no longer verifies, and the owner must report lost state.
  auto p = filesystem_baseline_store(dir).full_path(11);
  auto data = *io::read_whole_file(p);
  data[data.size() / 2] ^= std::byte{1};
  io::write_file_atomically(p, data, false);
  EXPECT_FALSE(filesystem_baseline_store(dir).load(11));
  fs::remove_all(dir);
}

// ---- sparse persistence of transitions: change sets, delta chains, folds, crashes ----------------

namespace {

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(ChangeSet, DiffThenApplyIsBitExactForEveryWidth) {
  image_model m;
  baseline_image a = m.initial(), b = m.step(a);
  const change_set cs = diff_images(a, b, [&](const std::string& n) { return m.width(n); });
  // every listed position really differs, and only those (counted bytewise per element)
  std::uint64_t differing = 0;
  for (auto& [n, bytes] : a)
    for (std::size_t i = 0; i < bytes.size(); i += m.width(n)) differing += std::memcmp(&bytes[i], &b.at(n)[i], m.width(n)) != 0;
  EXPECT_EQ(changed_elements(cs), differing);
  baseline_image c = a;
  apply_changes(c, cs);
  EXPECT_TRUE(same_bits(c, b));
  // an unchanged image yields an empty set; a set that does not fit is refused, nothing written
  EXPECT_TRUE(diff_images(a, a, [&](const std::string& n) { return m.width(n); }).empty());
  change_set bad = cs;
  bad.begin()->second.positions.back() = bad.begin()->second.elements;  // one past the end
  baseline_image d = a;
  try {
    apply_changes(d, bad);
    FAIL() << "expected a mismatch";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_EQ(e.where().tensor, bad.begin()->first);
  }
  EXPECT_TRUE(same_bits(d, a));
}

TEST(BaselineStore, MemoryChangeSetChain) {
  memory_baseline_store s;
  check_change_set_chain(s, s, 12);
  EXPECT_EQ(s.size(), 1u);
  EXPECT_THROW(s.save_changes(99, 100, {}), error);  // base absent: law 4 refuses
}

TEST(BaselineStore, FilesystemChangeSetChainFoldsEveryMaxChainVersions) {
  auto dir = fresh_dir("chain");
  for (std::uint32_t max_chain : {1u, 3u, 8u}) {
    fs::remove_all(dir);
    check_change_set_chain(filesystem_baseline_store(dir, {.max_chain = max_chain}),
                           filesystem_baseline_store(dir, {.max_chain = max_chain}), 20);
    // after 20 versions: one full image (the last fold's) and a chain shorter than the bound, whose
    // deltas weigh less than the full image
    const auto files = files_in(dir);
    std::uintmax_t delta_bytes = 0, full_bytes = 0;
    std::size_t fulls = 0, deltas = 0;
    for (auto& n : files) {
      if (n.rfind("full-v", 0) == 0) ++fulls, full_bytes += fs::file_size(dir / n);
      if (n.rfind("delta-v", 0) == 0) ++deltas, delta_bytes += fs::file_size(dir / n);
    }
    EXPECT_EQ(fulls, 1u) << max_chain;
    EXPECT_EQ(fulls + deltas, files.size()) << max_chain;
    EXPECT_LT(deltas, std::max(max_chain, 1u)) << max_chain;
    EXPECT_LT(delta_bytes, full_bytes) << max_chain;
  }
  fs::remove_all(dir);
}

TEST(BaselineStore, FilesystemLoadChangesIsTheStoredChangeSet) {
  auto dir = fresh_dir("changes");
  check_load_changes(filesystem_baseline_store(dir), filesystem_baseline_store(dir));
  // a damaged delta is no change set, and says why
  filesystem_baseline_store s(dir);
  const auto p = s.delta_path(2);
  ASSERT_TRUE(fs::exists(p));
  fs::resize_file(p, fs::file_size(p) - 3);
  EXPECT_FALSE(s.load_changes(1, 2));
  ASSERT_TRUE(s.last_error());
  EXPECT_EQ(s.last_error()->code(), errc::integrity);
  fs::remove_all(dir);
}

TEST(BaselineStore, FilesystemDeltaIsSmallerThanTheImage) {
  auto dir = fresh_dir("small");
  image_model m;
  filesystem_baseline_store s(dir);
  const baseline_image a = m.initial(), b = m.step(a);
  s.save(0, a);
  s.save_changes(0, 1, diff_images(a, b, [&](const std::string& n) { return m.width(n); }));
  EXPECT_LT(fs::file_size(s.delta_path(1)) * 5, fs::file_size(s.full_path(0)));
  fs::remove_all(dir);
}

// A crash at every step of save, save_changes and the fold: afterwards (a fresh handle, as a
// restarted owner) K.v loads bit-identically, the target loads either not at all or exactly, and
// the store goes on working and sweeps leftover temp files.
TEST(BaselineStore, FilesystemCrashAtEveryStepNeverYieldsWrongBits) {
  struct point {
    const char* name;
    bool target_durable;  // whether the interrupted write already took effect
  };
  const point delta_points[] = {{"delta_after_unlink", false}, {"delta_after_temp", false}, {"delta_after_rename", true}};
  const point fold_points[] = {{"fold_after_temp", true}, {"fold_after_rename", true}, {"fold_before_cleanup", true}};
  const point full_points[] = {{"full_after_temp", false}, {"full_after_rename", true}};
  auto dir = fresh_dir("crashes");
  image_model m;
  auto width = [&](const std::string& n) { return m.width(n); };

  // save_changes (K.v = 2 on a chain of 2 deltas; an older image of the target 3, full or a delta, with other
  // bits exists, as a failed transition's freeze would leave it)
  for (bool stale_full : {true, false})
  for (const auto& p : delta_points) {
    fs::remove_all(dir);
    bitrefit::testing::crash_points crash;
    basic_filesystem_baseline_store<bitrefit::testing::crash_points> s(dir, {.max_chain = 8}, crash);
    std::vector<baseline_image> ref{m.initial()};
    s.save(0, ref[0]);
    for (version_t v = 1; v <= 2; ++v) {
      ref.push_back(m.step(ref.back()));
      s.save_changes(v - 1, v, diff_images(ref[v - 1], ref[v], width));
      s.retain_only(v);
    }
    if (stale_full) s.save(3, m.step(ref[2]));  // the stale image of version 3, full or as a delta
    else s.save_changes(2, 3, diff_images(ref[2], m.step(ref[2]), width));
    ref.push_back(m.step(ref[2]));
    crash.arm(p.name, 1);
    EXPECT_THROW(s.save_changes(2, 3, diff_images(ref[2], ref[3], width)), bitrefit::testing::injected_crash) << p.name;
    filesystem_baseline_store restarted(dir);
    EXPECT_TRUE(same_bits(restarted.load(2), ref[2])) << p.name;
    auto t = restarted.load(3);
    if (p.target_durable) EXPECT_TRUE(same_bits(t, ref[3])) << p.name;
    else EXPECT_FALSE(t) << p.name << ": the stale target or a torn one must never load";
    // the owner retries the save and commits; the store sweeps the leftovers
    restarted.save_changes(2, 3, diff_images(ref[2], ref[3], width));
    restarted.retain_only(3);
    EXPECT_TRUE(same_bits(filesystem_baseline_store(dir).load(3), ref[3])) << p.name;
    for (auto& n : files_in(dir)) EXPECT_NE(n.rfind(".tmp.", 0), 0u) << p.name << ": " << n;
  }

  // the fold: K advances to 3, whose chain reached max_chain = 3
  for (const auto& p : fold_points) {
    fs::remove_all(dir);
    bitrefit::testing::crash_points crash;
    basic_filesystem_baseline_store<bitrefit::testing::crash_points> s(dir, {.max_chain = 3}, crash);
    std::vector<baseline_image> ref{m.initial()};
    s.save(0, ref[0]);
    for (version_t v = 1; v <= 3; ++v) {
      ref.push_back(m.step(ref.back()));
      s.save_changes(v - 1, v, diff_images(ref[v - 1], ref[v], width));
      if (v < 3) s.retain_only(v);
    }
    crash.arm(p.name, 1);
    EXPECT_THROW(s.retain_only(3), bitrefit::testing::injected_crash) << p.name;
    filesystem_baseline_store restarted(dir, {.max_chain = 3});
    EXPECT_TRUE(same_bits(restarted.load(3), ref[3])) << p.name;
    // the restarted owner retains K.v again (recover_owner does): the store ends folded and clean
    restarted.retain_only(3);
    EXPECT_EQ(files_in(dir), std::vector<std::string>{"full-v3.bin"}) << p.name;
    EXPECT_TRUE(same_bits(restarted.load(3), ref[3])) << p.name;
  }

  // a full save of a target whose delta exists with other bits
  for (const auto& p : full_points) {
    fs::remove_all(dir);
    bitrefit::testing::crash_points crash;
    basic_filesystem_baseline_store<bitrefit::testing::crash_points> s(dir, {}, crash);
    const baseline_image a = m.initial(), stale = m.step(a), fresh = m.step(a);
    s.save(0, a);
    s.save_changes(0, 1, diff_images(a, stale, width));
    crash.arm(p.name, 1);
    EXPECT_THROW(s.save(1, fresh), bitrefit::testing::injected_crash) << p.name;
    filesystem_baseline_store restarted(dir);
    EXPECT_TRUE(same_bits(restarted.load(0), a)) << p.name;
    auto t = restarted.load(1);
    if (p.target_durable) EXPECT_TRUE(same_bits(t, fresh)) << p.name;
    else EXPECT_FALSE(t) << p.name;
  }
  fs::remove_all(dir);
}

// Torn or flipped delta files are refused by their digest with an error that names the file; a
// delta whose base image was replaced is refused by its link; never are wrong bits returned.
TEST(BaselineStore, FilesystemTornCorruptOrUnlinkedDeltaReadsAsNamedLoss) {
  auto dir = fresh_dir("torn");
  image_model m;
  auto width = [&](const std::string& n) { return m.width(n); };
  const baseline_image a = m.initial(), b = m.step(a), c = m.step(b);
  auto setup = [&] {
    fs::remove_all(dir);
    filesystem_baseline_store s(dir);
    s.save(0, a);
    s.save_changes(0, 1, diff_images(a, b, width));
    s.save_changes(1, 2, diff_images(b, c, width));
    return s;
  };
  auto expect_loss = [&](version_t v, errc code, const fs::path& file, const std::string& what) {
    filesystem_baseline_store s(dir);
    EXPECT_FALSE(s.load(v)) << what;
    ASSERT_TRUE(s.last_error()) << what;
    EXPECT_EQ(s.last_error()->code(), code) << what << ": " << s.last_error()->what();
    EXPECT_EQ(s.last_error()->where().file, file.string()) << what;
    EXPECT_THROW(s.load_checked(v), error) << what;
  };
  {
    auto s = setup();
    const auto p = s.delta_path(1);
    fs::resize_file(p, fs::file_size(p) / 2);  // torn: a write that never completed
    expect_loss(1, errc::integrity, p, "torn delta");
    expect_loss(2, errc::integrity, p, "a chain through a torn delta");
    EXPECT_TRUE(same_bits(filesystem_baseline_store(dir).load(0), a));
  }
  for (std::size_t at : {std::size_t{0}, std::size_t{20}, std::size_t{100}}) {
    auto s = setup();
    const auto p = s.delta_path(2);
    auto data = *io::read_whole_file(p);
    data[std::min(at, data.size() - 1)] ^= std::byte{0x10};
    io::write_file_atomically(p, data, false);
    expect_loss(2, errc::integrity, p, "flipped byte " + std::to_string(at));
    EXPECT_TRUE(same_bits(filesystem_baseline_store(dir).load(1), b));
  }
  {
    auto s = setup();
    s.save(1, m.step(a));  // version 1 replaced by other bits: delta 2 was built on the old ones
    expect_loss(2, errc::mismatch, s.delta_path(2), "replaced base");
  }
  {
    auto s = setup();
    fs::remove(s.full_path(0));
    expect_loss(2, errc::mismatch, s.delta_path(1), "root image gone");
    filesystem_baseline_store t(dir);
    EXPECT_THROW(t.save_changes(5, 6, {}), error);  // no base: law 4 refuses, nothing written
    EXPECT_FALSE(fs::exists(t.delta_path(6)));
  }
  fs::remove_all(dir);
}

// The hardening findings (kept as fuzz regression inputs, tests/fuzz/corpus/fuzz_durability) and a
// constructed record: a delta whose element count times element size wraps to the image's size
// once passed the bounds check and wrote outside the image (heap-buffer-overflow under ASan).
// Now every such record is errc::integrity naming the file, and the image is never touched.
TEST(BaselineStore, FilesystemDeltaRecordsOutsideTheImageAreRefusedByName) {
  const auto dir = fresh_dir("hostile-delta");
  filesystem_baseline_store s(dir);
  baseline_image img;
  img["a"] = std::vector<std::byte>(64, std::byte{1});
  img["b"] = std::vector<std::byte>(40, std::byte{2});
  img["c"] = std::vector<std::byte>(16, std::byte{3});
  s.save(1, img);
  std::uint64_t link = 0;
  {
    std::ifstream in(s.full_path(1), std::ios::binary | std::ios::ate);
    in.seekg(-8, std::ios::end);
    unsigned char b[8];
    in.read(reinterpret_cast<char*>(b), 8);
    for (int i = 0; i < 8; ++i) link |= std::uint64_t(b[i]) << (8 * i);
  }
  auto expect_refused = [&](std::vector<std::byte> body, const std::string& what) {
    const auto file = fuzz::seal_delta_v2(std::move(body), link);
    { std::ofstream(s.delta_path(2), std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size())); }
    EXPECT_FALSE(s.load(2)) << what;
    ASSERT_TRUE(s.last_error()) << what;
    EXPECT_EQ(s.last_error()->code(), errc::integrity) << what << ": " << s.last_error()->what();
    EXPECT_EQ(s.last_error()->where().file, s.delta_path(2).string()) << what;
    // the change-set reader (law 6) walks the same records: refused by the walk (nothing sized by
    // a claim), or a set that does not fit the base image, which check_fits refuses
    if (auto cs = s.load_changes(1, 2)) {
      EXPECT_THROW(check_fits(img, *cs), error) << what;
    } else {
      ASSERT_TRUE(s.last_error()) << what;
      EXPECT_EQ(s.last_error()->code(), errc::integrity) << what << ": " << s.last_error()->what();
    }
    EXPECT_EQ(*s.load(1), img) << what;
  };
  for (const char* name : {"crash-baseline_delta_oob", "crash-baseline_delta_use_after_free"}) {
    std::ifstream in(fs::path(BITREFIT_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_durability" / name, std::ios::binary);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(c.size(), 1u) << name;
    std::vector<std::byte> body(c.size() - 1);
    std::memcpy(body.data(), c.data() + 1, body.size());  // the first byte selects the fuzz target's format
    expect_refused(std::move(body), name);
  }
  // constructed: tensor "a" (64 bytes), E = 8, elements = 2^61 + 8 (x 8 wraps to 64), one change at
  // position 2^40 (inside the claimed element count, 8 TiB past the image)
  fuzz::byte_writer w;
  w.bytes("BRDELT01", 8);
  for (std::uint64_t v : {std::uint64_t{2}, std::uint64_t{1}, link, std::uint64_t{1}, std::uint64_t{1}}) w.u64(v);
  w.bytes("a", 1);
  for (std::uint64_t v : {std::uint64_t{8}, (std::uint64_t{1} << 61) + 8, std::uint64_t{1}}) w.u64(v);
  fuzz::byte_writer pos;
  pos.leb128(std::uint64_t{1} << 40);
  w.u64(pos.out.size());
  w.bytes(pos.out.data(), pos.out.size());
  w.bytes("\xAA\xAA\xAA\xAA\xAA\xAA\xAA\xAA", 8);
  expect_refused(w.out, "elements x element size wrapping to the image's size");
  // constructed: a record claiming 2^40 changes of 8 bytes behind 2^40 position bytes, in a file of
  // a few dozen bytes (a reader that reserved by the claim would ask for 16 TiB)
  fuzz::byte_writer big;
  big.bytes("BRDELT01", 8);
  for (std::uint64_t v : {std::uint64_t{2}, std::uint64_t{1}, link, std::uint64_t{1}, std::uint64_t{1}}) big.u64(v);
  big.bytes("a", 1);
  for (std::uint64_t v : {std::uint64_t{8}, std::uint64_t{1} << 41, std::uint64_t{1} << 40, std::uint64_t{1} << 40}) big.u64(v);
  big.bytes("\x01\x01\x01\x01", 4);
  expect_refused(big.out, "a change count far beyond the file");
  fs::remove_all(dir);
}
