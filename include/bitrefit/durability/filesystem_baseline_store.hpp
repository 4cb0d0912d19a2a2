// bitrefit/durability/filesystem_baseline_store.hpp — the owners' baseline images in a directory.
//
// Full images and sparse deltas (durability/file_format.hpp), each one an atomic, fsync'd file
// (io/atomic_file.hpp) with a digest trailer, so a torn or corrupt image reads as "lost" rather
// than as wrong bits. The commit log beside it is filesystem_commit_log.hpp.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/durability/file_format.hpp"
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
///
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
      : dir_(std::move(dir)), opt_(o), crash_(std::move(crash)) {
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
    crash_.pass("delta_after_unlink", dir_.string());
    write_file(delta_path(t), "delta", [&](auto&& put_bytes) {
      file_format::byte_writer w;
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
        file_format::byte_writer pos;
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

  /// Same, but throws the reason: errc::integrity (a file's digest does not match: torn or corrupt),
  /// errc::format (a verified file that does not parse), errc::mismatch (absent, or a delta whose
  /// base image is gone or was replaced).
  baseline_image load_checked(version_t v) {
    std::vector<file_format::delta_file> chain;
    std::optional<std::uint64_t> want;  // the digest the next link must have
    version_t cur = v;
    for (;;) {
      if (chain.size() > 100000) throw error(errc::format, "delta chain does not end", {.file = dir_.string(), .tensor = {}, .field = {}});
      const auto full = full_path(cur), delta = delta_path(cur);
      const bool has_full = exists(full), has_delta = exists(delta);
      // a full image serves when no particular file is wanted, or when it is the linked one
      if (has_full && (!want || file_format::stored_digest(full) == *want)) {
        try {
          baseline_image img = file_format::parse_full(file_format::read_verified(full), cur, full);
          for (auto it = chain.rbegin(); it != chain.rend(); ++it) file_format::apply_delta(img, *it);
          return img;
        } catch (const error&) {
          if (!has_delta || want) throw;  // else: the fold's twin is damaged, the chain may still serve
        }
      }
      if (has_delta && (!want || file_format::stored_digest(delta) == *want)) {
        file_format::delta_file d = file_format::delta_head(file_format::read_verified(delta), cur, delta);
        want = d.link;
        cur = d.base;
        chain.push_back(std::move(d));
        continue;
      }
      // name the damage when a file of that version is there but does not verify (torn, flipped)
      for (const auto& p : {full, delta})
        if (exists(p)) (void)file_format::read_verified(p);
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
        crash_.pass("fold_before_cleanup", dir_.string());
        keep = {full_path(v).filename().string()};
      }
    }
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      const bool ours = n.rfind("full-v", 0) == 0 || n.rfind("delta-v", 0) == 0 || n.rfind("baseline-", 0) == 0 || io::detail::is_temporary_name(n);
      if (ours && !keep.count(n)) std::filesystem::remove(e.path(), ec);
    }
  }

  /// Why the last load() returned nullopt (nullopt after a successful load).
  const std::optional<error>& last_error() const noexcept { return last_error_; }
  options& opts() { return opt_; }
  std::filesystem::path full_path(version_t v) const { return dir_ / ("full-v" + std::to_string(v) + ".bin"); }
  std::filesystem::path delta_path(version_t v) const { return dir_ / ("delta-v" + std::to_string(v) + ".bin"); }

 private:
  static bool exists(const std::filesystem::path& p) {
    std::error_code ec;
    return std::filesystem::exists(p, ec);
  }

  /// Which file holds b's image now, with its digest: the full image if any (a fold's twin holds the
  /// same bits), else the delta.
  std::optional<std::pair<std::filesystem::path, std::uint64_t>> image_file(version_t b) const {
    for (const auto& p : {full_path(b), delta_path(b)})
      if (exists(p)) return std::pair{p, file_format::stored_digest(p)};
    return std::nullopt;
  }

  /// The file names load(v) would read (headers of deltas only; nothing is verified here beyond
  /// what picking a link needs). Empty when v has no image.
  std::set<std::string> chain_files(version_t v) {
    std::set<std::string> out;
    std::optional<std::uint64_t> want;
    for (version_t cur = v; out.size() < 100000;) {
      const auto full = full_path(cur), delta = delta_path(cur);
      if (exists(full) && (!want || file_format::stored_digest(full) == *want)) {
        out.insert(full.filename().string());
        return out;
      }
      if (!exists(delta) || (want && file_format::stored_digest(delta) != *want)) return out;
      out.insert(delta.filename().string());
      // the header only (magic, target, base, link): the files are verified by load, not here
      const auto h = file_format::read_head(delta, 32);
      if (h.size() != 32 || std::memcmp(h.data(), "BRDELT01", 8) != 0) return out;  // damaged: load reports the loss
      file_format::byte_reader r{h, 8, delta};
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
      file_format::byte_writer w;
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

  /// io::atomic_file, hashing as it streams; the XXH3-64 trailer last. Crash points: kind +
  /// "_after_temp" (synced, before the rename) and kind + "_after_rename" (before the directory
  /// fsync), where the files stay as a process killed there leaves them.
  template <class Body>
  void write_file(const std::filesystem::path& target, const std::string& kind, Body&& body) {
    std::optional<io::atomic_file> f;
    XXH3_state_t* hash = XXH3_createState();
    XXH3_64bits_reset(hash);
    try {
      f.emplace(target);
      body([&](std::span<const std::byte> b) {
        XXH3_64bits_update(hash, b.data(), b.size());
        f->write(b);
      });
      file_format::byte_writer tail;
      tail.u64(XXH3_64bits_digest(hash));
      f->write(tail.out);
      f->commit([&](std::string_view step) { crash_.pass(kind + "_" + std::string(step), dir_.string()); });
    } catch (const typename Crash::crash&) {
      XXH3_freeState(hash);
      if (f) f->release();  // a killed process leaves its temp file; retain_only sweeps it
      throw;
    } catch (...) {
      XXH3_freeState(hash);
      throw;
    }
    XXH3_freeState(hash);
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
static_assert(DeltaBaselineStore<filesystem_baseline_store>);

}  // namespace bitrefit::durability
