// Laws of durability/concepts.hpp on the memory and filesystem models: compare-and-set, epoch
// fencing, crash points of the filesystem write path, concurrent writers in separate processes,
// and a baseline store that stays consistent with the commit log across crashes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/memory.hpp"

using namespace bitrefit;
using namespace bitrefit::durability;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("bitrefit-test-durability-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p;
}

attempt_record attempt(std::uint64_t epoch, std::uint64_t counter, const commit_record& base, std::uint64_t next) {
  return {.attempt = {epoch, counter}, .base_version = base.version, .base = base.baseline, .next = {next},
          .members = {"receiver/0", "receiver/1"}, .overwrite = counter > 1};
}

template <class L>
void check_log_laws(L log, L reopened_view) {
  EXPECT_EQ(log.read(), log_state{});
  const std::uint64_t e1 = log.begin_epoch();
  EXPECT_EQ(e1, 1u);
  const commit_record k0 = log.read().committed;
  // Law 2: prepare only against the committed record, only from the current epoch.
  EXPECT_EQ(log.prepare(e1, attempt(e1, 1, k0, 11)), cas_outcome::success);
  EXPECT_EQ(log.read().prepared->next.value, 11u);
  EXPECT_EQ(log.prepare(e1, attempt(e1, 2, {.version = 5, .baseline = {}, .committed_by = {}}, 12)), cas_outcome::conflict);
  // Law 3: CAS from the expected record succeeds once; a second CAS from the same expected conflicts.
  const commit_record k1{.version = 1, .baseline = {11}, .committed_by = {e1, 1}};
  EXPECT_EQ(log.compare_and_set(e1, k0, k1), cas_outcome::success);
  EXPECT_EQ(log.read().committed, k1);
  EXPECT_FALSE(log.read().prepared);
  EXPECT_EQ(log.compare_and_set(e1, k0, {.version = 1, .baseline = {99}, .committed_by = {e1, 2}}), cas_outcome::conflict);
  EXPECT_EQ(log.read().committed, k1);
  // Law 1: a new coordinator's epoch fences the old one, which then changes nothing.
  const std::uint64_t e2 = reopened_view.begin_epoch();
  EXPECT_GT(e2, e1);
  const log_state before = log.read();
  EXPECT_EQ(log.prepare(e1, attempt(e1, 3, k1, 13)), cas_outcome::fenced);
  EXPECT_EQ(log.compare_and_set(e1, k1, {.version = 2, .baseline = {13}, .committed_by = {e1, 3}}), cas_outcome::fenced);
  EXPECT_EQ(log.read(), before);
  // The new epoch proceeds; the committed record names the attempt that wrote it (read_commit).
  EXPECT_EQ(reopened_view.prepare(e2, attempt(e2, 1, k1, 21)), cas_outcome::success);
  const commit_record k2{.version = 2, .baseline = {21}, .committed_by = {e2, 1}};
  EXPECT_EQ(reopened_view.compare_and_set(e2, k1, k2), cas_outcome::success);
  EXPECT_EQ(log.read().committed.committed_by, (attempt_id{e2, 1}));
}

}  // namespace

TEST(CommitLog, MemoryLaws) {
  memory_commit_log a;
  check_log_laws(a, a);
}

TEST(CommitLog, FilesystemLawsAcrossHandles) {
  auto dir = fresh_dir("laws");
  check_log_laws(filesystem_commit_log(dir), filesystem_commit_log(dir));
  // Law 4: a fresh handle (a restarted process) reads the last successful state.
  EXPECT_EQ(filesystem_commit_log(dir).read().committed.version, 2u);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemCrashBeforeRenameKeepsOldRecord) {
  auto dir = fresh_dir("crash1");
  filesystem_commit_log log(dir);
  auto e = log.begin_epoch();
  const commit_record k0 = log.read().committed;
  log.opts().crash_at = "after_temp";
  EXPECT_THROW(log.compare_and_set(e, k0, {.version = 1, .baseline = {5}, .committed_by = {e, 1}}), injected_crash);
  filesystem_commit_log restarted(dir);
  EXPECT_EQ(restarted.read().committed, k0);  // the stray temp file is ignored
  EXPECT_EQ(restarted.compare_and_set(e, k0, {.version = 1, .baseline = {6}, .committed_by = {e, 2}}), cas_outcome::success);
  EXPECT_EQ(restarted.read().committed.baseline.value, 6u);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemCrashAfterRenameIsResolvedByReading) {
  // The writer dies after the rename: it cannot know the outcome (DESIGN's "unknown"); read_commit
  // by a successor finds the record committed by that attempt.
  auto dir = fresh_dir("crash2");
  filesystem_commit_log log(dir);
  auto e = log.begin_epoch();
  const commit_record k0 = log.read().committed;
  log.opts().crash_at = "after_rename";
  EXPECT_THROW(log.compare_and_set(e, k0, {.version = 1, .baseline = {5}, .committed_by = {e, 1}}), injected_crash);
  filesystem_commit_log successor(dir);
  const auto e2 = successor.begin_epoch();
  EXPECT_EQ(successor.read().committed.committed_by, (attempt_id{e, 1}));
  EXPECT_EQ(successor.read().committed.version, 1u);
  EXPECT_EQ(log.compare_and_set(e, successor.read().committed, {.version = 2, .baseline = {7}, .committed_by = {e, 2}}),
            cas_outcome::fenced);
  EXPECT_GT(e2, e);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemConcurrentWritersInSeparateProcessesCommitOnce) {
  // Eight processes race to compare-and-set from the same record: exactly one succeeds.
  auto dir = fresh_dir("race");
  filesystem_commit_log log(dir);
  const auto e = log.begin_epoch();
  const commit_record k0 = log.read().committed;
  std::vector<pid_t> kids;
  for (int i = 0; i < 8; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      filesystem_commit_log mine(dir);
      auto o = mine.compare_and_set(e, k0, {.version = 1, .baseline = {100u + i}, .committed_by = {e, 1u + i}});
      ::_exit(o == cas_outcome::success ? 0 : o == cas_outcome::conflict ? 1 : 2);
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
  const auto k1 = log.read().committed;
  EXPECT_EQ(k1.version, 1u);
  EXPECT_EQ(k1.baseline.value, 100u + (k1.committed_by.counter - 1));
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemLockTimeoutIsAFailedOutcome) {
  auto dir = fresh_dir("lock");
  filesystem_commit_log log(dir, {.lock_timeout = std::chrono::milliseconds(30), .crash_at = {}});
  auto e = log.begin_epoch();
  int fd = ::open((dir / "LOCK").c_str(), O_RDWR);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const auto before = log.read();
  EXPECT_EQ(log.compare_and_set(e, before.committed, {.version = 1, .baseline = {1}, .committed_by = {e, 1}}),
            cas_outcome::failed);
  ::close(fd);
  EXPECT_EQ(log.read(), before);
  fs::remove_all(dir);
}

TEST(CommitLog, FilesystemRejectsCorruptRecordByName) {
  auto dir = fresh_dir("corrupt");
  fs::create_directories(dir);
  { std::ofstream(dir / "commit.json") << "{not json"; }
  try {
    filesystem_commit_log(dir).read();
    FAIL() << "expected a format error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("commit.json"), std::string::npos);
  }
  fs::remove_all(dir);
}

namespace {
template <class S>
void check_baseline_laws(S s, S restarted) {
  baseline_image v0{{"a", {std::byte{1}, std::byte{2}}}, {"b", {}}};
  baseline_image v1{{"a", {std::byte{1}, std::byte{3}}}, {"b", {}}};
  s.save({10}, v0);
  EXPECT_EQ(*restarted.load({10}), v0);
  // Law 2: the next image is saved under g' before commit; both coexist until K names g'.
  s.save({11}, v1);
  EXPECT_EQ(*restarted.load({10}), v0);
  EXPECT_EQ(*restarted.load({11}), v1);
  s.retain_only({11});
  EXPECT_FALSE(restarted.load({10}));
  EXPECT_EQ(*restarted.load({11}), v1);
  s.retain_only({11});  // idempotent
  EXPECT_EQ(*restarted.load({11}), v1);
  EXPECT_FALSE(restarted.load({12}));
}
}  // namespace

TEST(BaselineStore, MemoryLaws) {
  memory_baseline_store s;
  check_baseline_laws(s, s);
}

TEST(BaselineStore, FilesystemLawsAndCorruptionReadsAsLost) {
  auto dir = fresh_dir("baseline");
  check_baseline_laws(filesystem_baseline_store(dir), filesystem_baseline_store(dir));
  // Flip one byte: the image no longer verifies, and the owner must report lost state.
  auto p = dir / "baseline-11.bin";
  auto data = *transport::detail::read_file(p);
  data[data.size() / 2] ^= std::byte{1};
  transport::detail::atomic_write(p, data, false);
  EXPECT_FALSE(filesystem_baseline_store(dir).load({11}));
  fs::remove_all(dir);
}
