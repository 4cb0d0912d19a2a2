// bitrefit/durability/filesystem.hpp — commit log and baseline store in a directory (crash-safe).
//
// Commit log: <dir>/commit.json holds {epoch, committed K, prepared attempt}. Every change runs
//   lock (flock on <dir>/LOCK, bounded wait) -> read -> check epoch and expected K -> write temp ->
//   fsync temp -> rename over commit.json -> fsync <dir> -> unlock.
// A crash before the rename leaves the old record (and a stray temp file that is ignored); after
// it, the new one. flock is released by the kernel when a holder dies, so a crash never wedges it.
// Baseline store: <dir>/baseline-<g>.bin, each an atomic, fsync'd file with a checksum, so a torn
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
#include "bitrefit/transport/directory_store.hpp"

namespace bitrefit::durability {

/// Thrown by test hooks that simulate a crash at a named point: the files are left exactly as a
/// process killed there would leave them.
struct injected_crash : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

inline nlohmann::json to_json(const attempt_id& a) { return {a.epoch, a.counter}; }
inline attempt_id attempt_from(const nlohmann::json& j) { return {j.at(0).get<std::uint64_t>(), j.at(1).get<std::uint64_t>()}; }

inline std::string serialize(const log_state& s) {
  nlohmann::json j;
  j["format"] = "bitrefit-commit-log/1";
  j["epoch"] = s.epoch;
  j["version"] = s.committed.version;
  j["baseline"] = s.committed.baseline.value;
  j["committed_by"] = to_json(s.committed.committed_by);
  if (s.prepared) {
    const auto& a = *s.prepared;
    j["prepared"] = {{"attempt", to_json(a.attempt)}, {"base_version", a.base_version}, {"base", a.base.value},
                     {"next", a.next.value},         {"members", a.members},          {"overwrite", a.overwrite}};
  }
  return j.dump();
}

inline log_state parse(const std::string& text, const std::string& file) {
  try {
    auto j = nlohmann::json::parse(text);
    if (j.at("format") != "bitrefit-commit-log/1")
      throw error(errc::unsupported, "unknown commit log format", {.file = file, .tensor = {}, .field = "format"});
    log_state s;
    s.epoch = j.at("epoch").get<std::uint64_t>();
    s.committed.version = j.at("version").get<std::uint64_t>();
    s.committed.baseline.value = j.at("baseline").get<std::uint64_t>();
    s.committed.committed_by = attempt_from(j.at("committed_by"));
    if (j.contains("prepared")) {
      const auto& p = j["prepared"];
      attempt_record a;
      a.attempt = attempt_from(p.at("attempt"));
      a.base_version = p.at("base_version").get<std::uint64_t>();
      a.base.value = p.at("base").get<std::uint64_t>();
      a.next.value = p.at("next").get<std::uint64_t>();
      a.members = p.at("members").get<std::vector<std::string>>();
      a.overwrite = p.at("overwrite").get<bool>();
      s.prepared = a;
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::format, std::string("commit log does not parse: ") + e.what(), {.file = file, .tensor = {}, .field = {}});
  }
}

}  // namespace detail

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

  log_state read() {
    auto text = transport::detail::read_file(file());
    if (!text) return {};
    return detail::parse(std::string(reinterpret_cast<const char*>(text->data()), text->size()), file().string());
  }

  std::uint64_t begin_epoch() {
    lock_guard g(*this);
    if (!g.held) throw error(errc::io, "commit log lock not acquired before the deadline", {.file = lock_path(), .tensor = {}, .field = {}});
    log_state s = read();
    ++s.epoch;
    // Any outcome but success leaves the caller without a usable epoch; it may retry.
    if (auto o = write(s); o != cas_outcome::success)
      throw error(errc::io, std::string("epoch bump not durable: ") + cas_outcome_name(o), {.file = file().string(), .tensor = {}, .field = "epoch"});
    return s.epoch;
  }

  cas_outcome prepare(std::uint64_t epoch, const attempt_record& a) {
    return mutate(epoch, [&](log_state& s) {
      if (a.base_version != s.committed.version || a.base != s.committed.baseline) return cas_outcome::conflict;
      s.prepared = a;
      return cas_outcome::success;
    });
  }

  cas_outcome compare_and_set(std::uint64_t epoch, const commit_record& expected, const commit_record& desired) {
    return mutate(epoch, [&](log_state& s) {
      if (!(s.committed == expected)) return cas_outcome::conflict;
      s.committed = desired;
      s.prepared.reset();
      return cas_outcome::success;
    });
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

  template <class F>
  cas_outcome mutate(std::uint64_t epoch, F&& f) {
    lock_guard g(*this);
    if (!g.held) return cas_outcome::failed;  // nothing written: certainly did not happen
    log_state s;
    try {
      s = read();
    } catch (const error&) {
      return cas_outcome::failed;
    }
    if (epoch != s.epoch) return cas_outcome::fenced;
    cas_outcome o = f(s);
    if (o != cas_outcome::success) return o;
    return write(s);
  }

  /// temp + fsync + rename + fsync dir. Before the rename a failure is `failed`, after it `unknown`.
  cas_outcome write(const log_state& s) {
    const std::string text = detail::serialize(s);
    const auto tmp = dir_ / (".tmp." + transport::detail::unique_suffix() + ".commit.json");
    try {
      int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return cas_outcome::failed;
      bool ok = true;
      try {
        transport::detail::write_all(fd, std::as_bytes(std::span(text.data(), text.size())), tmp.string());
      } catch (const error&) { ok = false; }
      ok = ok && ::fsync(fd) == 0;
      ::close(fd);
      if (!ok) { ::unlink(tmp.c_str()); return cas_outcome::failed; }
      if (take_crash("after_temp")) throw injected_crash("commit log: crashed after writing the temp file");
      if (::rename(tmp.c_str(), file().c_str()) != 0) { ::unlink(tmp.c_str()); return cas_outcome::failed; }
      if (take_crash("after_rename")) throw injected_crash("commit log: crashed after rename, before fsync of the directory");
      transport::detail::fsync_path(dir_, true);
    } catch (const error&) {
      return cas_outcome::unknown;
    }
    return cas_outcome::success;
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

/// Owners' baseline images as checksummed files, one per baseline id g.
class filesystem_baseline_store {
 public:
  explicit filesystem_baseline_store(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
  }

  void save(baseline_id g, const baseline_image& img) {
    std::vector<std::byte> out;
    auto put_u64 = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
    };
    const char magic[8] = {'B', 'R', 'B', 'A', 'S', 'E', '0', '1'};
    for (char c : magic) out.push_back(static_cast<std::byte>(c));
    put_u64(g.value);
    put_u64(img.size());
    for (auto& [name, b] : img) {
      put_u64(name.size());
      for (char c : name) out.push_back(static_cast<std::byte>(c));
      put_u64(b.size());
      out.insert(out.end(), b.begin(), b.end());
    }
    put_u64(XXH3_64bits(out.data(), out.size()));
    transport::detail::atomic_write(path(g), out, /*durable=*/true);
  }

  /// nullopt when the image is absent or does not verify (torn, corrupt, another g).
  std::optional<baseline_image> load(baseline_id g) {
    auto data = transport::detail::read_file(path(g));
    if (!data || data->size() < 32) return std::nullopt;
    const auto& d = *data;
    auto get_u64 = [&](std::size_t at) {
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<unsigned>(d[at + i])) << (8 * i);
      return v;
    };
    if (get_u64(d.size() - 8) != XXH3_64bits(d.data(), d.size() - 8)) return std::nullopt;
    if (std::memcmp(d.data(), "BRBASE01", 8) != 0 || get_u64(8) != g.value) return std::nullopt;
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

  void retain_only(baseline_id g) {
    std::error_code ec;
    const std::string keep = path(g).filename().string();
    for (auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      if (n != keep && (n.rfind("baseline-", 0) == 0 || n.rfind(".tmp.", 0) == 0)) std::filesystem::remove(e.path(), ec);
    }
  }

 private:
  std::filesystem::path path(baseline_id g) const { return dir_ / ("baseline-" + std::to_string(g.value) + ".bin"); }
  std::filesystem::path dir_;
};

static_assert(BaselineStore<filesystem_baseline_store>);

}  // namespace bitrefit::durability
