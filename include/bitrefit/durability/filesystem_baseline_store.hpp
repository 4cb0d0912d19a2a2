// bitrefit/durability/filesystem_baseline_store.hpp — the owners' baseline images in a directory.
//
// Full images and sparse deltas in baseline_format.hpp's format (the one home of those bytes,
// shared with s3_baseline_store.hpp), each one an atomic, fsync'd file (io/atomic_file.hpp) with a
// digest trailer, so a torn or corrupt image reads as "lost" rather than as wrong bits. The commit
// log beside it is filesystem_commit_log.hpp.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/baseline_format.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/io/atomic_file.hpp"

namespace bitrefit::durability {

struct baseline_store_options {
  /// The longest delta chain behind one image. retain_only(v) (called when K advances to v) folds
  /// v's chain into a full image once it is this long, or once its deltas weigh as much as the full
  /// image, whichever comes first: a refit then durably writes its change set only (a few percent
  /// of the model), and a full image every max_chain versions at most. A load reads one full image
  /// and at most max_chain deltas. 0 or 1: every retained version is folded at once.
  std::uint32_t max_chain = 16;
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
/// Crash (core/crash_points.hpp) is a test policy, passed with the directory as `who`: points
/// "<kind>_after_temp" (temp written and fsync'd, before the rename) and "<kind>_after_rename"
/// (renamed, before the directory fsync) for kind "full" (save), "delta" (save_changes) and "fold"
/// (retain_only's full image); "delta_after_unlink" (save_changes removed the earlier images of the
/// target, before writing the delta); "fold_before_cleanup" (folded image durable, older files not
/// yet removed).
template <CrashPoints Crash = no_crash_points>
class basic_filesystem_baseline_store {
 public:
  using options = baseline_store_options;

  explicit basic_filesystem_baseline_store(std::filesystem::path dir, options o = {}, Crash crash = {})
      : dir_(std::move(dir)), opt_(std::move(o)), crash_(std::move(crash)) {
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
    crash_.pass("delta_after_unlink", dir_.string());
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

  /// Law 6: t's change set against b, read from delta-v<t>.bin alone, when that delta is linked
  /// to the file holding b's image now; else nullopt (last_error() says why when a file on the way
  /// does not verify). Cost: the delta's bytes.
  std::optional<change_set> load_changes(version_t b, version_t t) {
    last_error_.reset();
    try {
      files f{dir_};
      return baseline_format::delta_changes(f, b, t);
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
        crash_.pass("fold_before_cleanup", dir_.string());
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
    std::optional<std::vector<std::byte>> read(const std::string& name) const { return io::read_whole_file(dir / name); }
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

  /// io::atomic_file; the body streams the whole file, trailer included (baseline_format). Crash
  /// points: kind + "_after_temp" (synced, before the rename) and kind + "_after_rename" (before the
  /// directory fsync), where the files stay as a process killed there leaves them.
  template <class Body>
  void write_file(const std::filesystem::path& target, const std::string& kind, Body&& body) {
    std::optional<io::atomic_file> f;
    try {
      f.emplace(target);
      body([&](std::span<const std::byte> b) { f->write(b); });
      f->commit([&](std::string_view step) { crash_.pass(kind + "_" + std::string(step), dir_.string()); });
    } catch (const typename Crash::crash&) {
      if (f) f->release();  // a killed process leaves its temp file; retain_only sweeps it
      throw;
    }
  }

  void remove_durably(const std::filesystem::path& p) {
    if (::unlink(p.c_str()) == 0) io::detail::fsync_directory(dir_);
  }

  std::filesystem::path dir_;
  options opt_;
  Crash crash_;
  std::optional<error> last_error_;
};

/// The shipped baseline store: no crash points.
using filesystem_baseline_store = basic_filesystem_baseline_store<>;
static_assert(ChangeSetStore<filesystem_baseline_store>);

}  // namespace bitrefit::durability
