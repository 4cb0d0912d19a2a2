// bitrefit/durability/filesystem.hpp — commit log and baseline store in a directory (crash-safe).
//
// Commit log: <dir>/commit.json holds {epoch, committed K, prepared attempt}. Every change runs
//   lock (flock on <dir>/LOCK, bounded wait) -> read -> check epoch and expected K -> write temp ->
//   fsync temp -> rename over commit.json -> fsync <dir> -> unlock.
// A crash before the rename leaves the old record (and a stray temp file that is ignored); after
// it, the new one. flock is released by the kernel when a holder dies, so a crash never wedges it.
// Baseline store: <dir>/baseline-v<version>.bin, each an atomic, fsync'd file with a checksum, so a torn
// or corrupt image reads as "lost" rather than as wrong bits.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/durability/record_json.hpp"
#include "bitrefit/transport/directory_store.hpp"

namespace bitrefit::durability {

/// Thrown by test hooks that simulate a crash at a named point: the files are left exactly as a
/// process killed there would leave them.
struct injected_crash : std::runtime_error {
  using std::runtime_error::runtime_error;
};


struct commit_log_options {
  std::chrono::milliseconds lock_timeout{5000};  // the CAS deadline: past it, the outcome is `failed`
  /// Test hook: simulate a crash "after_temp" (temp written, before rename) or "after_rename"
  /// (renamed, before the directory fsync) in the next write.
  std::string crash_at;
};

class filesystem_commit_log {
 public:
  using options = commit_log_options;

  explicit filesystem_commit_log(std::filesystem::path dir, options o = {}) : dir_(std::move(dir)), opt_(std::move(o)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (!std::filesystem::is_directory(dir_))
      throw error(errc::io, "commit log directory cannot be created", {.file = dir_.string(), .tensor = {}, .field = {}});
  }

  /// Runs `req` through the pure protocol::commit_log on the state read under the lock, and
  /// writes the new state when the request changed it. Reads take the lock too (linearizable).
  protocol::log_reply apply(const protocol::log_request& req) {
    const protocol::log_reply failed{req, protocol::log_outcome::failed, {}};
    lock_guard g(*this);
    if (!g.held) return failed;  // nothing written: certainly did not happen
    protocol::commit_log log;
    try {
      log.state = read_unlocked();
    } catch (const error&) {
      return failed;
    }
    const protocol::log_snapshot before = log.state;
    protocol::log_reply r = log.apply(req);
    if (log.state == before) return r;
    const auto o = write(log.state);
    if (o != protocol::log_outcome::ok) return {req, o, {}};
    return r;
  }

  /// The durable state as a fresh process would see it (no lock: a single file read is atomic).
  protocol::log_snapshot read_unlocked() {
    auto text = transport::detail::read_file(file());
    if (!text) return protocol::log_snapshot{};
    return json_io::snapshot_from(std::string(reinterpret_cast<const char*>(text->data()), text->size()), file().string());
  }

  options& opts() { return opt_; }

 private:
  struct lock_guard {
    int fd = -1;
    bool held = false;
    explicit lock_guard(filesystem_commit_log& l) {
      fd = ::open(l.lock_path().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) throw error(errc::io, std::string("cannot open lock: ") + std::strerror(errno), {.file = l.lock_path(), .tensor = {}, .field = {}});
      const auto deadline = std::chrono::steady_clock::now() + l.opt_.lock_timeout;
      for (;;) {
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) { held = true; break; }
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ~lock_guard() {
      if (held) ::flock(fd, LOCK_UN);
      ::close(fd);
    }
  };

  /// temp + fsync + rename + fsync dir. Before the rename a failure is `failed`, after it `unknown`.
  protocol::log_outcome write(const protocol::log_snapshot& s) {
    const std::string text = json_io::to_json(s).dump();
    const auto tmp = dir_ / (".tmp." + transport::detail::unique_suffix() + ".commit.json");
    try {
      int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return protocol::log_outcome::failed;
      bool ok = true;
      try {
        transport::detail::write_all(fd, std::as_bytes(std::span(text.data(), text.size())), tmp.string());
      } catch (const error&) { ok = false; }
      ok = ok && ::fsync(fd) == 0;
      ::close(fd);
      if (!ok) { ::unlink(tmp.c_str()); return protocol::log_outcome::failed; }
      if (take_crash("after_temp")) throw injected_crash("commit log: crashed after writing the temp file");
      if (::rename(tmp.c_str(), file().c_str()) != 0) { ::unlink(tmp.c_str()); return protocol::log_outcome::failed; }
      if (take_crash("after_rename")) throw injected_crash("commit log: crashed after rename, before fsync of the directory");
      transport::detail::fsync_path(dir_, true);
    } catch (const error&) {
      return protocol::log_outcome::unknown;
    }
    return protocol::log_outcome::ok;
  }

  bool take_crash(const char* point) {
    if (opt_.crash_at != point) return false;
    opt_.crash_at.clear();
    return true;
  }

  std::filesystem::path file() const { return dir_ / "commit.json"; }
  std::string lock_path() const { return (dir_ / "LOCK").string(); }

  std::filesystem::path dir_;
  options opt_;
};

static_assert(CommitLog<filesystem_commit_log>);

/// Owners' baseline images as checksummed files, one per version.
class filesystem_baseline_store {
 public:
  explicit filesystem_baseline_store(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
  }

  /// Streams the image to a temp file (hashing as it goes, so no second copy of the image is ever
  /// built), fsyncs it, renames it over baseline-v<v>.bin and fsyncs the directory.
  void save(version_t v, const baseline_image& img) {
    namespace fs = std::filesystem;
    const fs::path target = path(v), tmp = dir_ / (".tmp." + transport::detail::unique_suffix() + "." + target.filename().string());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw error(errc::io, std::string("create failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
    XXH3_state_t* hash = XXH3_createState();
    XXH3_64bits_reset(hash);
    std::vector<std::byte> small;  // headers, flushed before each tensor's bytes
    auto put_u64 = [&](std::uint64_t x) {
      for (int i = 0; i < 8; ++i) small.push_back(static_cast<std::byte>(x >> (8 * i)));
    };
    auto emit = [&](std::span<const std::byte> b) {
      XXH3_64bits_update(hash, b.data(), b.size());
      transport::detail::write_all(fd, b, tmp.string());
    };
    try {
      const char magic[8] = {'B', 'R', 'B', 'A', 'S', 'E', '0', '1'};
      for (char c : magic) small.push_back(static_cast<std::byte>(c));
      put_u64(v);
      put_u64(img.size());
      for (auto& [name, b] : img) {
        put_u64(name.size());
        for (char c : name) small.push_back(static_cast<std::byte>(c));
        put_u64(b.size());
        emit(small);
        small.clear();
        emit(b);
      }
      const std::uint64_t digest = XXH3_64bits_digest(hash);
      put_u64(digest);
      transport::detail::write_all(fd, small, tmp.string());
      if (::fsync(fd) != 0) throw error(errc::io, std::string("fsync failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
    } catch (...) {
      XXH3_freeState(hash);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    XXH3_freeState(hash);
    ::close(fd);
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      throw error(errc::io, std::string("rename failed: ") + std::strerror(e), {.file = target.string(), .tensor = {}, .field = {}});
    }
    transport::detail::fsync_path(dir_, true);
  }

  /// nullopt when the image is absent or does not verify (torn, corrupt, another g).
  std::optional<baseline_image> load(version_t v) {
    auto data = transport::detail::read_file(path(v));
    if (!data || data->size() < 32) return std::nullopt;
    const auto& d = *data;
    auto get_u64 = [&](std::size_t at) {
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<unsigned>(d[at + i])) << (8 * i);
      return v;
    };
    if (get_u64(d.size() - 8) != XXH3_64bits(d.data(), d.size() - 8)) return std::nullopt;
    if (std::memcmp(d.data(), "BRBASE01", 8) != 0 || get_u64(8) != v) return std::nullopt;
    baseline_image img;
    std::size_t at = 24, end = d.size() - 8;
    for (std::uint64_t i = 0, n = get_u64(16); i < n; ++i) {
      if (at + 8 > end) return std::nullopt;
      std::uint64_t len = get_u64(at); at += 8;
      if (len > end - at) return std::nullopt;
      std::string name(reinterpret_cast<const char*>(d.data() + at), len); at += len;
      if (at + 8 > end) return std::nullopt;
      std::uint64_t blen = get_u64(at); at += 8;
      if (blen > end - at) return std::nullopt;
      img[name].assign(d.begin() + static_cast<std::ptrdiff_t>(at), d.begin() + static_cast<std::ptrdiff_t>(at + blen));
      at += blen;
    }
    if (at != end) return std::nullopt;
    return img;
  }

  void retain_only(version_t v) {
    std::error_code ec;
    const std::string keep = path(v).filename().string();
    for (auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      if (n != keep && (n.rfind("baseline-", 0) == 0 || n.rfind(".tmp.", 0) == 0)) std::filesystem::remove(e.path(), ec);
    }
  }

 private:
  std::filesystem::path path(version_t v) const { return dir_ / ("baseline-v" + std::to_string(v) + ".bin"); }
  std::filesystem::path dir_;
};

static_assert(BaselineStore<filesystem_baseline_store>);

}  // namespace bitrefit::durability
