// bitrefit/durability/filesystem.hpp — commit log and baseline store in a directory (crash-safe).
//
// Commit log: <dir>/commit.json holds {epoch, committed K, prepared attempt}. Every change runs
//   lock (flock on <dir>/LOCK, bounded wait) -> read -> check epoch and expected K -> write temp ->
//   fsync temp -> rename over commit.json -> fsync <dir> -> unlock.
// A crash before the rename leaves the old record (and a stray temp file that is ignored); after
// it, the new one. flock is released by the kernel when a holder dies, so a crash never wedges it.
// Baseline store: full images and sparse deltas (filesystem_baseline_store below), each an atomic,
// fsync'd file with a digest, so a torn or corrupt image reads as "lost" rather than as wrong bits.
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

/// Owners' baseline images in a directory: full images and sparse deltas, each one atomic, fsync'd
/// and digest-checked file.
///   full-v<v>.bin    BRBASE01: the whole image of v.
///   delta-v<t>.bin   BRDELT01: the change set of t against the image of its base version b, and
///                    the digest of the very file that held b's image when it was written (law 5:
///                    a delta never applies to any other bits; a link that does not resolve reads
///                    as loss).
/// Every file ends with XXH3-64 over all its other bytes, so a torn or flipped file is refused
/// (errc::integrity naming the file) and load() reports loss instead of wrong bits.
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
    const auto link = image_file(b);
    if (!link)
      throw error(errc::mismatch, "save_changes: no durable image of base version " + std::to_string(b),
                  {.file = dir_.string(), .tensor = {}, .field = "base"});
    // an image of t from an earlier freeze must not outlive this one, whatever point a crash hits
    remove_durably(full_path(t));
    remove_durably(delta_path(t));
    if (take_crash("delta_after_unlink")) throw injected_crash("baseline store: crashed after removing the old full image of the target");
    write_file(delta_path(t), "delta", [&](auto&& put_bytes) {
      byte_writer w;
      w.bytes("BRDELT01", 8);
      w.u64(t);
      w.u64(b);
      w.u64(link->second);
      w.u64(cs.size());
      for (const auto& [name, c] : cs) {
        if (c.element_size == 0 || c.values.size() != c.positions.size() * c.element_size)
          throw error(errc::invalid_argument, "save_changes: value bytes do not match the position count", {.file = {}, .tensor = name, .field = "values"});
        w.u64(name.size());
        w.bytes(name.data(), name.size());
        w.u64(c.element_size);
        w.u64(c.elements);
        w.u64(c.positions.size());
        byte_writer pos;
        std::uint64_t next = 0;  // gap coding: each position minus (previous + 1)
        for (std::uint64_t p : c.positions) {
          if (p < next || p >= c.elements)
            throw error(errc::invalid_argument, "save_changes: positions not strictly increasing within the tensor", {.file = {}, .tensor = name, .field = "positions"});
          pos.leb128(p - next);
          next = p + 1;
        }
        w.u64(pos.out.size());
        put_bytes(w.out);
        w.out.clear();
        put_bytes(pos.out);
        put_bytes(c.values);
      }
      put_bytes(w.out);
    });
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
    std::vector<delta_file> chain;
    std::optional<std::uint64_t> want;  // the digest the next link must have
    version_t cur = v;
    for (;;) {
      if (chain.size() > 100000) throw error(errc::format, "delta chain does not end", {.file = dir_.string(), .tensor = {}, .field = {}});
      const auto full = full_path(cur), delta = delta_path(cur);
      const bool has_full = exists(full), has_delta = exists(delta);
      // a full image serves when no particular file is wanted, or when it is the linked one
      if (has_full && (!want || stored_digest(full) == *want)) {
        try {
          baseline_image img = parse_full(read_verified(full), cur, full);
          for (auto it = chain.rbegin(); it != chain.rend(); ++it) apply_delta(img, *it);
          return img;
        } catch (const error&) {
          if (!has_delta || want) throw;  // else: the fold's twin is damaged, the chain may still serve
        }
      }
      if (has_delta && (!want || stored_digest(delta) == *want)) {
        delta_file d = delta_head(read_verified(delta), cur, delta);
        want = d.link;
        cur = d.base;
        chain.push_back(std::move(d));
        continue;
      }
      // name the damage when a file of that version is there but does not verify (torn, flipped)
      for (const auto& p : {full, delta})
        if (exists(p)) (void)read_verified(p);
      if (chain.empty()) throw error(errc::mismatch, "no image of version " + std::to_string(v), {.file = full.string(), .tensor = {}, .field = "version"});
      throw error(errc::mismatch, "the base image (version " + std::to_string(cur) + ") this delta was written against is gone or was replaced",
                  {.file = chain.back().path.string(), .tensor = {}, .field = "base"});
    }
  }

  /// Law 3: keeps v's image (and the links of its chain), removes every other image and any stray
  /// temp file; folds v's chain into full-v<v>.bin first when it reached max_chain deltas.
  void retain_only(version_t v) {
    std::set<std::string> keep = chain_files(v);
    std::uint32_t deltas = 0;
    std::uintmax_t delta_bytes = 0, full_bytes = 0;
    for (const auto& n : keep) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(dir_ / n, ec);
      if (n.rfind("delta-", 0) == 0) ++deltas, delta_bytes += ec ? 0 : size;
      else full_bytes = ec ? 0 : size;
    }
    // Fold when the chain reached its bound, or when its deltas together weigh as much as the full
    // image: the fold's write then costs no more than the deltas already written, so the durable
    // bytes per refit stay within twice the change sets' (and a load reads at most 2 images' worth).
    if (deltas > 0 && (deltas >= std::max<std::uint32_t>(opt_.max_chain, 1) || delta_bytes >= full_bytes)) {
      if (auto img = load(v)) {
        write_full(v, *img, "fold");
        if (take_crash("fold_before_cleanup")) throw injected_crash("baseline store: crashed after the fold, before removing the chain");
        keep = {full_path(v).filename().string()};
      }
    }
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      const bool ours = n.rfind("full-v", 0) == 0 || n.rfind("delta-v", 0) == 0 || n.rfind("baseline-", 0) == 0 || n.rfind(".tmp.", 0) == 0;
      if (ours && !keep.count(n)) std::filesystem::remove(e.path(), ec);
    }
  }

  /// Why the last load() returned nullopt (nullopt after a successful load).
  const std::optional<error>& last_error() const noexcept { return last_error_; }
  options& opts() { return opt_; }
  std::filesystem::path full_path(version_t v) const { return dir_ / ("full-v" + std::to_string(v) + ".bin"); }
  std::filesystem::path delta_path(version_t v) const { return dir_ / ("delta-v" + std::to_string(v) + ".bin"); }

 private:
  struct delta_file {
    std::filesystem::path path;
    version_t target = 0, base = 0;
    std::uint64_t link = 0;
    std::vector<std::byte> body;  // verified (digest stripped)
  };

  struct byte_writer {
    std::vector<std::byte> out;
    void bytes(const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    }
    void u64(std::uint64_t x) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(x >> (8 * i)));
    }
    void leb128(std::uint64_t x) {
      while (x >= 0x80) {
        out.push_back(static_cast<std::byte>((x & 0x7F) | 0x80));
        x >>= 7;
      }
      out.push_back(static_cast<std::byte>(x));
    }
  };

  /// Bounds-checked reader over a verified file's body; running past the end is errc::integrity.
  struct byte_reader {
    std::span<const std::byte> d;
    std::size_t at = 0;
    const std::filesystem::path& file;
    void need(std::uint64_t n) const {
      if (n > d.size() - at) throw error(errc::integrity, "baseline file ends inside a record", {.file = file.string(), .tensor = {}, .field = {}});
    }
    std::uint64_t u64() {
      need(8);
      std::uint64_t x = 0;
      for (int i = 0; i < 8; ++i) x |= std::uint64_t(std::to_integer<unsigned>(d[at + i])) << (8 * i);
      at += 8;
      return x;
    }
    std::span<const std::byte> take(std::uint64_t n) {
      need(n);
      auto s = d.subspan(at, n);
      at += n;
      return s;
    }
    std::uint64_t leb128() {
      std::uint64_t x = 0;
      for (int shift = 0; shift < 64; shift += 7) {
        need(1);
        const unsigned b = std::to_integer<unsigned>(d[at++]);
        x |= std::uint64_t(b & 0x7F) << shift;
        if (!(b & 0x80)) return x;
      }
      throw error(errc::integrity, "position varint too long", {.file = file.string(), .tensor = {}, .field = "positions"});
    }
  };

  static bool exists(const std::filesystem::path& p) {
    std::error_code ec;
    return std::filesystem::exists(p, ec);
  }

  /// The digest a file claims (its last 8 bytes); 0 when unreadable. Used only to pick the linked
  /// file; the file is then verified in full before anything of it is used.
  static std::uint64_t stored_digest(const std::filesystem::path& p) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st {};
    std::uint64_t x = 0;
    unsigned char b[8];
    if (::fstat(fd, &st) == 0 && st.st_size >= 8 && ::pread(fd, b, 8, st.st_size - 8) == 8)
      for (int i = 0; i < 8; ++i) x |= std::uint64_t(b[i]) << (8 * i);
    ::close(fd);
    return x;
  }

  /// The first n bytes of a file (fewer when it is shorter or unreadable).
  static std::vector<std::byte> read_head(const std::filesystem::path& p, std::size_t n) {
    std::vector<std::byte> out(n);
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    const ssize_t got = ::pread(fd, out.data(), n, 0);
    ::close(fd);
    out.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
    return out;
  }

  /// Which file holds b's image now, with its digest: the full image if any (a fold's twin holds the
  /// same bits), else the delta.
  std::optional<std::pair<std::filesystem::path, std::uint64_t>> image_file(version_t b) const {
    for (const auto& p : {full_path(b), delta_path(b)})
      if (exists(p)) return std::pair{p, stored_digest(p)};
    return std::nullopt;
  }

  /// A file's bytes without the trailing digest, after checking that digest.
  static std::vector<std::byte> read_verified(const std::filesystem::path& p) {
    auto data = transport::detail::read_file(p);
    if (!data) throw error(errc::mismatch, "baseline file is gone", {.file = p.string(), .tensor = {}, .field = {}});
    auto& d = *data;
    if (d.size() < 16) throw error(errc::integrity, "baseline file is truncated (torn write)", {.file = p.string(), .tensor = {}, .field = "digest"});
    std::uint64_t stored = 0;
    for (int i = 0; i < 8; ++i) stored |= std::uint64_t(std::to_integer<unsigned>(d[d.size() - 8 + i])) << (8 * i);
    if (stored != XXH3_64bits(d.data(), d.size() - 8))
      throw error(errc::integrity, "baseline file digest mismatch (torn or corrupt): refused", {.file = p.string(), .tensor = {}, .field = "digest"});
    d.resize(d.size() - 8);
    return std::move(d);
  }

  static baseline_image parse_full(const std::vector<std::byte>& d, version_t v, const std::filesystem::path& p) {
    byte_reader r{d, 0, p};
    if (std::memcmp(r.take(8).data(), "BRBASE01", 8) != 0) throw error(errc::format, "not a full baseline image (bad magic)", {.file = p.string(), .tensor = {}, .field = "magic"});
    if (r.u64() != v) throw error(errc::format, "full image of another version", {.file = p.string(), .tensor = {}, .field = "version"});
    baseline_image img;
    for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) {
      const auto name = r.take(r.u64());
      const auto bytes = r.take(r.u64());
      auto [it, fresh] = img.try_emplace(std::string(reinterpret_cast<const char*>(name.data()), name.size()));
      if (!fresh) throw error(errc::integrity, "full image lists a tensor twice", {.file = p.string(), .tensor = it->first, .field = {}});
      it->second.assign(bytes.begin(), bytes.end());
    }
    if (r.at != d.size()) throw error(errc::format, "trailing bytes after the last tensor", {.file = p.string(), .tensor = {}, .field = {}});
    return img;
  }

  /// A verified delta's header (magic, target, base, link); the body is decoded by apply_delta.
  static delta_file delta_head(std::vector<std::byte> d, version_t t, const std::filesystem::path& p) {
    byte_reader r{d, 0, p};
    if (std::memcmp(r.take(8).data(), "BRDELT01", 8) != 0) throw error(errc::format, "not a baseline delta (bad magic)", {.file = p.string(), .tensor = {}, .field = "magic"});
    if (r.u64() != t) throw error(errc::format, "delta of another version", {.file = p.string(), .tensor = {}, .field = "version"});
    delta_file f{p, t, r.u64(), r.u64(), {}};
    if (f.base >= t) throw error(errc::format, "delta's base is not older than its target", {.file = p.string(), .tensor = {}, .field = "base"});
    f.body = std::move(d);
    return f;
  }

  /// img := img + the delta's change set, decoded and applied in one pass (no change_set is built:
  /// a chain load touches each change once). Every position is range-checked before its write; on
  /// a throw `img` is a scratch copy the caller discards.
  static void apply_delta(baseline_image& img, const delta_file& f) {
    const auto& p = f.path;
    byte_reader r{f.body, 32, p};
    std::set<std::string, std::less<>> seen;
    for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) {
      const auto name_b = r.take(r.u64());
      const std::string name(reinterpret_cast<const char*>(name_b.data()), name_b.size());
      const std::uint64_t E = r.u64(), elements = r.u64(), count = r.u64(), pos_bytes = r.u64();
      if (E == 0 || E > 8 || count > elements || count > pos_bytes)
        throw error(errc::integrity, "delta: implausible element size or count", {.file = p.string(), .tensor = name, .field = "elements"});
      if (!seen.insert(name).second) throw error(errc::integrity, "delta: tensor listed twice", {.file = p.string(), .tensor = name, .field = {}});
      auto it = img.find(name);
      // No product of two file fields is ever formed (elements * E could wrap to the image's size):
      // the image's size is divided instead, so every later x * E stays below it.
      if (it == img.end() || it->second.size() % E != 0 || elements != it->second.size() / E)
        throw error(errc::integrity, "delta names a tensor the base image does not hold, or of another size", {.file = p.string(), .tensor = name, .field = "elements"});
      byte_reader pr{r.take(pos_bytes), 0, p};
      const std::byte* val = r.take(count * E).data();
      std::byte* dst = it->second.data();
      std::uint64_t next = 0;
      for (std::uint64_t k = 0; k < count; ++k, val += E) {
        const std::uint64_t x = next + pr.leb128();
        if (x < next || x >= elements) throw error(errc::integrity, "delta: position outside the tensor", {.file = p.string(), .tensor = name, .field = "positions"});
        std::memcpy(dst + x * E, val, E);
        next = x + 1;
      }
      if (pr.at != pos_bytes) throw error(errc::integrity, "delta: stray bytes after the positions", {.file = p.string(), .tensor = name, .field = "positions"});
    }
    if (r.at != f.body.size()) throw error(errc::format, "trailing bytes after the last tensor", {.file = p.string(), .tensor = {}, .field = {}});
  }

  /// The file names load(v) would read (headers of deltas only; nothing is verified here beyond
  /// what picking a link needs). Empty when v has no image.
  std::set<std::string> chain_files(version_t v) {
    std::set<std::string> out;
    std::optional<std::uint64_t> want;
    for (version_t cur = v; out.size() < 100000;) {
      const auto full = full_path(cur), delta = delta_path(cur);
      if (exists(full) && (!want || stored_digest(full) == *want)) {
        out.insert(full.filename().string());
        return out;
      }
      if (!exists(delta) || (want && stored_digest(delta) != *want)) return out;
      out.insert(delta.filename().string());
      // the header only (magic, target, base, link): the files are verified by load, not here
      const auto h = read_head(delta, 32);
      if (h.size() != 32 || std::memcmp(h.data(), "BRDELT01", 8) != 0) return out;  // damaged: load reports the loss
      byte_reader r{h, 8, delta};
      if (r.u64() != cur) return out;
      const version_t base = r.u64();
      if (base >= cur) return out;
      want = r.u64();
      cur = base;
    }
    return out;
  }

  void write_full(version_t v, const baseline_image& img, const std::string& kind) {
    write_file(full_path(v), kind, [&](auto&& put_bytes) {
      byte_writer w;
      w.bytes("BRBASE01", 8);
      w.u64(v);
      w.u64(img.size());
      for (auto& [name, b] : img) {
        w.u64(name.size());
        w.bytes(name.data(), name.size());
        w.u64(b.size());
        put_bytes(w.out);
        w.out.clear();
        put_bytes(b);
      }
    });
  }

  /// temp (hashing as it streams) + digest + fsync -> rename -> fsync dir, with crash hooks.
  /// Before the rename nothing under `target` changed; a failure removes the temp file.
  template <class Body>
  void write_file(const std::filesystem::path& target, const std::string& kind, Body&& body) {
    const auto tmp = dir_ / (".tmp." + transport::detail::unique_suffix() + "." + target.filename().string());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw error(errc::io, std::string("create failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
    XXH3_state_t* hash = XXH3_createState();
    XXH3_64bits_reset(hash);
    try {
      body([&](std::span<const std::byte> b) {
        XXH3_64bits_update(hash, b.data(), b.size());
        transport::detail::write_all(fd, b, tmp.string());
      });
      byte_writer tail;
      tail.u64(XXH3_64bits_digest(hash));
      transport::detail::write_all(fd, tail.out, tmp.string());
      if (::fsync(fd) != 0) throw error(errc::io, std::string("fsync failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
    } catch (...) {
      XXH3_freeState(hash);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    XXH3_freeState(hash);
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
