// bitrefit/durability/filesystem.hpp — commit log and baseline store in a directory (crash-safe).
//
// Commit log: <dir>/commit.json holds {epoch, committed K, prepared attempt}. Every change runs
//   lock (flock on <dir>/LOCK, bounded wait) -> read -> check epoch and expected K -> write temp ->
//   fsync temp -> rename over commit.json -> fsync <dir> -> unlock.
// A crash before the rename leaves the old record (and a stray temp file that is ignored); after
// it, the new one. flock is released by the kernel when a holder dies, so a crash never wedges it.
// Baseline store: full images and sparse deltas in baseline_format.hpp's format
// (filesystem_baseline_store below), each an atomic, fsync'd file with a digest, so a torn or
// corrupt image reads as "lost" rather than as wrong bits.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <cstring>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/baseline_format.hpp"
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

/// How the commit log makes a rename durable: fsync of the directory (throws errc::io on failure).
/// A policy so that tests can make it fail (tests/durability), as a disk can.
struct posix_directory_sync {
  void operator()(const std::filesystem::path& dir) const { transport::detail::fsync_path(dir, true); }
};

template <class DirectorySync = posix_directory_sync>
class basic_filesystem_commit_log {
 public:
  using options = commit_log_options;

  explicit basic_filesystem_commit_log(std::filesystem::path dir, options o = {}, DirectorySync sync = {})
      : dir_(std::move(dir)), opt_(std::move(o)), sync_(std::move(sync)) {
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
      return failed;
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
    auto text = transport::detail::read_file(file(), json_io::control_json_limits.max_bytes);
    if (!text) return protocol::log_snapshot{};
    return json_io::snapshot_from(std::string(reinterpret_cast<const char*>(text->data()), text->size()), file().string());
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
      sync_(dir_);
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
  DirectorySync sync_;
};

using filesystem_commit_log = basic_filesystem_commit_log<>;
static_assert(CommitLog<filesystem_commit_log>);

struct baseline_store_options {
  /// The longest delta chain behind one image. retain_only(v) (called when K advances to v) folds
  /// v's chain into a full image once it is this long, or once its deltas weigh as much as the full
  /// image, whichever comes first: a refit then durably writes its change set only (a few percent
  /// of the model), and a full image every max_chain versions at most. A load reads one full image
  /// and at most max_chain deltas. 0 or 1: every retained version is folded at once.
  std::uint32_t max_chain = 16;
  /// Test hook: simulate a crash at one named point of the next write that passes it. Points:
  /// "<kind>_after_temp" (temp written and fsync'd, before the rename), "<kind>_after_rename"
  /// (renamed, before the directory fsync) for kind "full" (save), "delta" (save_changes) and
  /// "fold" (retain_only's full image); "delta_after_unlink" (save_changes removed the earlier
  /// images of the target, before writing the delta); "fold_before_cleanup" (folded image durable, older
  /// files not yet removed).
  std::string crash_at;
};

/// Owners' baseline images in a directory: full images and sparse deltas in baseline_format.hpp's
/// format (full-v<v>.bin, delta-v<t>.bin linked to the digest of its base's file), each one
/// atomic, fsync'd and digest-checked file, so a torn or corrupt image reads as "lost" rather than
/// as wrong bits.
///
/// Why a bounded chain folded synchronously at retain_only: the full image is the expensive write
/// (the whole model, fsync'd), and it is off the before-encoding path there (retain_only runs after
/// the commit, when the owner advances). Folding in the same thread keeps ONE writer per store, so
/// every state a crash can leave is a prefix of a sequence of atomic renames: before the fold's
/// rename the chain is intact; after it, the full image and the chain hold the same bits (either
/// serves a load); the cleanup only removes files nothing links to. A background fold would need a
/// second writer and its own crash analysis for a saving that is 1/max_chain of a full write.
///
/// Invariant (kept by save and save_changes removing any image of t BEFORE writing theirs):
/// when full-v<v> and delta-v<v> both exist, they hold the same bits (only a fold creates the pair).
class filesystem_baseline_store {
 public:
  using options = baseline_store_options;

  explicit filesystem_baseline_store(std::filesystem::path dir, options o = {}) : dir_(std::move(dir)), opt_(std::move(o)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
  }

  /// Streams the image to a temp file (hashing as it goes, so no second copy of the image is ever
  /// built), fsyncs it, renames it over full-v<v>.bin and fsyncs the directory. A delta of v is
  /// removed first (durably), so no crash leaves two different images of v.
  void save(version_t v, const baseline_image& img) {
    remove_durably(delta_path(v));  // law 4: no crash leaves an earlier image of v loadable
    remove_durably(full_path(v));
    write_full(v, img, "full");
  }

  /// Law 4: writes delta-v<t>.bin, linked to the file that holds b's image now. Cost: the change
  /// set's bytes (positions gap-coded as LEB128, values raw), never the model's.
  void save_changes(version_t b, version_t t, const change_set& cs) {
    if (t == b) throw error(errc::invalid_argument, "save_changes: target equals base", {.file = {}, .tensor = {}, .field = "target"});
    files f{dir_};
    const auto link = baseline_format::image_link(f, b);
    if (!link)
      throw error(errc::mismatch, "save_changes: no durable image of base version " + std::to_string(b),
                  {.file = dir_.string(), .tensor = {}, .field = "base"});
    // an image of t from an earlier freeze must not outlive this one, whatever point a crash hits
    remove_durably(full_path(t));
    remove_durably(delta_path(t));
    if (take_crash("delta_after_unlink")) throw injected_crash("baseline store: crashed after removing the old full image of the target");
    write_file(delta_path(t), "delta", [&](auto&& put_bytes) { baseline_format::write_delta(put_bytes, t, b, link->second, cs); });
  }

  /// The image of v: a full image, or the full image at the root of v's delta chain with every
  /// delta applied in order. nullopt when it is absent or any file on the way does not verify
  /// (torn, corrupt, a link to bits that are gone); last_error() then names why.
  std::optional<baseline_image> load(version_t v) {
    last_error_.reset();
    try {
      return load_checked(v);
    } catch (const error& e) {
      last_error_ = e;
      return std::nullopt;
    }
  }

  /// Same, but throws the reason: errc::integrity (a file's digest does not match: torn or corrupt;
  /// or a record whose count, position or length does not fit the image or the file), errc::format
  /// (a verified file of another kind or version), errc::mismatch (absent, or a delta whose base
  /// image is gone or was replaced). Every error names the file.
  baseline_image load_checked(version_t v) {
    files f{dir_};
    return baseline_format::load_chain(f, v);
  }

  /// Law 3: keeps v's image (and the links of its chain), removes every other image and any stray
  /// temp file; folds v's chain into full-v<v>.bin first when it reached max_chain deltas.
  void retain_only(version_t v) {
    files f{dir_};
    std::set<std::string> keep = baseline_format::chain_names(f, v);
    std::uint32_t deltas = 0;
    std::uintmax_t delta_bytes = 0, full_bytes = 0;
    for (const auto& n : keep) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(dir_ / n, ec);
      if (baseline_format::is_delta_name(n)) ++deltas, delta_bytes += ec ? 0 : size;
      else full_bytes = ec ? 0 : size;
    }
    if (baseline_format::fold_due(deltas, delta_bytes, full_bytes, opt_.max_chain)) {
      if (auto img = load(v)) {
        write_full(v, *img, "fold");
        if (take_crash("fold_before_cleanup")) throw injected_crash("baseline store: crashed after the fold, before removing the chain");
        keep = {full_path(v).filename().string()};
      }
    }
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      const bool ours = baseline_format::is_image_name(n) || n.rfind(".tmp.", 0) == 0;
      if (ours && !keep.count(n)) std::filesystem::remove(e.path(), ec);
    }
  }

  /// Why the last load() returned nullopt (nullopt after a successful load).
  const std::optional<error>& last_error() const noexcept { return last_error_; }
  options& opts() { return opt_; }
  std::filesystem::path full_path(version_t v) const { return dir_ / baseline_format::full_name(v); }
  std::filesystem::path delta_path(version_t v) const { return dir_ / baseline_format::delta_name(v); }

 private:
  /// The directory as baseline_format's chain walk reads it (BaselineFiles).
  struct files {
    const std::filesystem::path& dir;
    std::optional<std::uint64_t> digest_of(const std::string& name) const {
      const auto p = dir / name;
      int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
        return 0;  // there but unreadable: the read names why
      }
      struct stat st {};
      std::uint64_t x = 0;
      std::byte b[8];
      if (::fstat(fd, &st) == 0 && st.st_size >= 8 && ::pread(fd, b, 8, st.st_size - 8) == 8) x = baseline_format::load_u64(b);
      ::close(fd);
      return x;
    }
    std::optional<std::vector<std::byte>> read(const std::string& name) const { return transport::detail::read_file(dir / name); }
    std::vector<std::byte> read_head(const std::string& name, std::size_t n) const {
      std::vector<std::byte> out(n);
      int fd = ::open((dir / name).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return {};
      const ssize_t got = ::pread(fd, out.data(), n, 0);
      ::close(fd);
      out.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
      return out;
    }
    std::string where(const std::string& name) const { return name.empty() ? dir.string() : (dir / name).string(); }
  };
  static_assert(BaselineFiles<files>);

  void write_full(version_t v, const baseline_image& img, const std::string& kind) {
    write_file(full_path(v), kind, [&](auto&& put_bytes) { baseline_format::write_full(put_bytes, v, img); });
  }

  /// temp (the body streams the file, trailer included) + fsync -> rename -> fsync dir, with crash
  /// hooks. Before the rename nothing under `target` changed; a failure removes the temp file.
  template <class Body>
  void write_file(const std::filesystem::path& target, const std::string& kind, Body&& body) {
    const auto tmp = dir_ / (".tmp." + transport::detail::unique_suffix() + "." + target.filename().string());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw error(errc::io, std::string("create failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
    try {
      body([&](std::span<const std::byte> b) { transport::detail::write_all(fd, b, tmp.string()); });
      if (::fsync(fd) != 0) throw error(errc::io, std::string("fsync failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    ::close(fd);
    if (take_crash(kind + "_after_temp")) throw injected_crash("baseline store: crashed after writing " + tmp.string());
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      throw error(errc::io, std::string("rename failed: ") + std::strerror(e), {.file = target.string(), .tensor = {}, .field = {}});
    }
    if (take_crash(kind + "_after_rename")) throw injected_crash("baseline store: crashed after renaming " + target.string());
    transport::detail::fsync_path(dir_, true);
  }

  void remove_durably(const std::filesystem::path& p) {
    if (::unlink(p.c_str()) == 0) transport::detail::fsync_path(dir_, true);
  }

  bool take_crash(const std::string& point) {
    if (opt_.crash_at != point) return false;
    opt_.crash_at.clear();
    return true;
  }

  std::filesystem::path dir_;
  options opt_;
  std::optional<error> last_error_;
};

static_assert(DeltaBaselineStore<filesystem_baseline_store>);

}  // namespace bitrefit::durability
