// bitrefit/durability/filesystem_commit_log.hpp — the commit log in a directory (crash-safe).
//
// <dir>/commit.json holds {epoch, committed K, prepared attempt} (the named JSON of wire/json.hpp).
// Every change runs
//   lock (flock on <dir>/LOCK, bounded wait) -> read -> protocol::commit_log::apply (the pure
//   semantics, request for request) -> write the new state atomically (io/atomic_file.hpp: temp,
//   fsync, rename, fsync <dir>) -> unlock.
// A crash before the rename leaves the old record (and a stray temp file that is ignored); after
// it, the new one. flock is released by the kernel when a holder dies, so a crash never wedges it.
// Outcomes: a failure before the rename is `failed` (certainly not applied), after it `unknown`
// (resolve with a read), as the CommitLog laws ask.
//
// Crash (core/crash_points.hpp) is a test policy: points "commit_log_after_temp" (temp written,
// before rename) and "commit_log_after_rename" (renamed, before the directory fsync), passed with
// the directory as `who`. The files are then left exactly as a process killed there leaves them.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/wire/json.hpp"

namespace bitrefit::durability {

struct commit_log_options {
  std::chrono::milliseconds lock_timeout{5000};  // the CAS deadline: past it, the outcome is `failed`
};

/// How the commit log makes a rename durable: fsync of the directory (throws errc::io on failure).
/// A policy so that tests can make it fail (tests/durability), as a disk can.
struct posix_directory_sync {
  void operator()(const std::filesystem::path& dir) const { io::detail::fsync_directory(dir); }
};

template <CrashPoints Crash = no_crash_points, class DirectorySync = posix_directory_sync>
class basic_filesystem_commit_log {
 public:
  using options = commit_log_options;

  explicit basic_filesystem_commit_log(std::filesystem::path dir, options o = {}, Crash crash = {}, DirectorySync sync = {})
      : dir_(std::move(dir)), opt_(o), crash_(std::move(crash)), sync_(std::move(sync)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (!std::filesystem::is_directory(dir_))
      throw error(errc::io, "commit log directory cannot be created", {.file = dir_.string(), .tensor = {}, .field = {}});
  }

  /// Runs `req` through the pure protocol::commit_log on the state read under the lock, and
  /// writes the new state when the request changed it. Reads take the lock too (linearizable).
  /// Nothing is reported that a power loss could still revert: the state read may be a rename
  /// whose directory entry is not durable yet (its writer saw "unknown": the directory fsync
  /// failed, or it died there), so a request that writes nothing makes it durable first and
  /// reports `failed` if it cannot (finding B5); one that writes makes it durable with its own.
  protocol::log_reply apply(const protocol::log_request& req) {
    const protocol::log_reply failed{req, protocol::log_outcome::failed, {}};
    lock_guard g(*this);
    if (!g.held) return failed;  // nothing written: certainly did not happen
    protocol::commit_log log;
    try {
      log.state = read_unlocked();
    } catch (const error&) {
      return failed;  // unreadable now: nothing was applied; the caller may retry
    }
    const protocol::log_snapshot before = log.state;
    protocol::log_reply r = log.apply(req);
    if (log.state == before) {
      try {
        sync_(dir_);
      } catch (const error&) {
        return failed;  // the caller reads again
      }
      return r;
    }
    const auto o = write(log.state);
    if (o != protocol::log_outcome::ok) return {req, o, {}};
    return r;
  }

  /// The durable state as a fresh process would see it (no lock: a single file read is atomic).
  protocol::log_snapshot read_unlocked() {
    auto text = io::read_whole_file(file(), wire::control_json_limits.max_bytes);
    if (!text) return protocol::log_snapshot{};
    return wire::snapshot_from(std::string(reinterpret_cast<const char*>(text->data()), text->size()), file().string());
  }

  options& opts() { return opt_; }

 private:
  struct lock_guard {
    int fd = -1;
    bool held = false;
    explicit lock_guard(basic_filesystem_commit_log& l) {
      fd = ::open(l.lock_path().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) throw error(errc::io, std::string("cannot open lock: ") + std::strerror(errno), {.file = l.lock_path(), .tensor = {}, .field = {}});
      const auto deadline = std::chrono::steady_clock::now() + l.opt_.lock_timeout;
      for (;;) {
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
          held = true;
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ~lock_guard() {
      if (held) ::flock(fd, LOCK_UN);
      ::close(fd);
    }
  };

  /// io::atomic_file. Before the rename a failure is `failed`, after it `unknown`.
  protocol::log_outcome write(const protocol::log_snapshot& s) {
    const std::string text = wire::to_json(s).dump();
    std::optional<io::atomic_file> f;
    try {
      f.emplace(file());
      f->write(text);
      f->commit([&](std::string_view step) { crash_.pass("commit_log_" + std::string(step), dir_.string()); }, sync_);
    } catch (const typename Crash::crash&) {
      if (f) f->release();  // a killed process leaves its temp file; readers ignore it
      throw;
    } catch (const error&) {
      return f && f->renamed() ? protocol::log_outcome::unknown : protocol::log_outcome::failed;
    }
    return protocol::log_outcome::ok;
  }

  std::filesystem::path file() const { return dir_ / "commit.json"; }
  std::string lock_path() const { return (dir_ / "LOCK").string(); }

  std::filesystem::path dir_;
  options opt_;
  Crash crash_;
  DirectorySync sync_;
};

/// The shipped commit log: no crash points.
using filesystem_commit_log = basic_filesystem_commit_log<>;
static_assert(CommitLog<filesystem_commit_log>);

}  // namespace bitrefit::durability
