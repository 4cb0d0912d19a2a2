// bitrefit/io/atomic_file.hpp — write a file or a directory so that readers see all of it or none.
// The one home of this rule: checkpoints (io/), the directory object store (transport/), the
// commit log and baseline files (durability/) and delta bundles (codec/) all write through it.
//
// The recipe: write under a hidden temporary name in the target's own directory (same filesystem,
// so rename is atomic), fsync the data, rename over the target, fsync the directory. Until
// commit() the target is untouched; if anything throws before, the destructor deletes the
// temporary, so a failed write leaves no partial file under the target name and no litter.
// Temporary names start with ".tmp." (readers that list a directory skip them; owners of a
// directory may sweep them) and are unique across threads and processes. A writer that does not
// need durability (payload objects that may be lost) can skip both fsyncs; atomicity stays.
#pragma once

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28 with _GNU_SOURCE)
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/io/mapped_file.hpp"  // detail::os_error

namespace bitrefit::io {

namespace detail {

/// A hidden sibling name that no other writer (thread or process) picks:
/// ".tmp.<pid>.<n>.<name>" (the pid and a per-process counter make it unique).
inline std::filesystem::path temporary_sibling(const std::filesystem::path& target) {
  static std::atomic<unsigned long> counter{0};
  std::filesystem::path dir = target.parent_path();
  std::string name = ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) + "." +
                     target.filename().string();
  return dir.empty() ? std::filesystem::path(name) : dir / name;
}

/// Whether a directory entry is such a temporary (a reader skips it; a sweep may remove it).
inline bool is_temporary_name(std::string_view name) noexcept { return name.rfind(".tmp.", 0) == 0; }

inline void fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw os_error("cannot open directory to fsync", dir);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) throw os_error("cannot fsync directory", dir, e);
}

/// A file descriptor opened for writing a new file (O_EXCL: never reuses an existing file).
class fd_writer {
 public:
  explicit fd_writer(std::filesystem::path file) : path_(std::move(file)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0) throw os_error("cannot create", path_);
  }
  fd_writer(const fd_writer&) = delete;
  fd_writer& operator=(const fd_writer&) = delete;
  ~fd_writer() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(std::span<const std::byte> bytes) {
    const std::byte* p = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      // Linux writes at most ~2 GiB per call; loop on short writes and EINTR.
      ssize_t n = ::write(fd_, p, left < (std::size_t{1} << 30) ? left : (std::size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw os_error("cannot write", path_);
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    written_ += bytes.size();
  }
  void write(std::string_view s) { write(std::as_bytes(std::span<const char>(s.data(), s.size()))); }

  /// fsync (when `durable`) and close; errors are reported (a close error can mean lost data on NFS).
  void finish(bool durable = true) {
    if (durable && ::fsync(fd_) != 0) throw os_error("cannot fsync", path_);
    int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) throw os_error("cannot close", path_);
  }

  std::uint64_t written() const noexcept { return written_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

}  // namespace detail

/// One file written atomically: write(...) any number of times, then commit().
/// @post before commit() the target is unchanged; after a successful commit() it holds exactly the
///       bytes written; if the object is destroyed without commit(), the temporary is removed.
/// `durable`: fsync the data before the rename and the directory after it (default). Without it
/// the file is still atomic, but a machine crash may lose it.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target, bool durable = true)
      : target_(std::move(target)), temp_(detail::temporary_sibling(target_)), out_(temp_), durable_(durable) {}
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (!committed_ && !released_) {
      std::error_code ec;
      std::filesystem::remove(temp_, ec);
    }
  }

  void write(std::span<const std::byte> bytes) { out_.write(bytes); }
  void write(std::string_view s) { out_.write(s); }
  std::uint64_t written() const noexcept { return out_.written(); }

  /// Makes the new content visible under the target name, replacing any old file atomically.
  void commit() {
    commit([](std::string_view) {});
  }
  /// Same, calling `between(step)` at the two points a crash tests must reach: "after_temp" (data
  /// written and synced, target untouched) and "after_rename" (visible, directory not yet synced).
  /// If it throws, the file stays as a process killed there would leave it (the destructor
  /// removes an unrenamed temporary, as a restarted owner's sweep would).
  template <class Between>
  void commit(Between&& between) {
    commit(between, [](const std::filesystem::path& dir) { detail::fsync_directory(dir); });
  }
  /// Same, making the rename durable with `sync_directory(dir)` (the commit log takes this as a
  /// policy, so that a test can make the directory fsync fail as a disk can).
  template <class Between, class SyncDirectory>
  void commit(Between&& between, SyncDirectory&& sync_directory) {
    out_.finish(durable_);
    between(std::string_view("after_temp"));
    if (::rename(temp_.c_str(), target_.c_str()) != 0) throw detail::os_error("cannot rename into place", target_);
    committed_ = true;
    between(std::string_view("after_rename"));
    if (durable_) sync_directory(target_.parent_path().empty() ? std::filesystem::path(".") : target_.parent_path());
  }
  /// Whether the rename happened (after a commit() that threw: the new content may be visible).
  bool renamed() const noexcept { return committed_; }
  /// Leaves the temporary file behind, as a process killed now would (crash tests; the directory's
  /// owner sweeps ".tmp." names).
  void release() noexcept { released_ = true; }

  const std::filesystem::path& target() const noexcept { return target_; }
  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  detail::fd_writer out_;
  bool durable_ = true;
  bool committed_ = false;
  bool released_ = false;
};

/// Writes `bytes` to `target` atomically (durably unless `durable` is false).
inline void write_file_atomically(const std::filesystem::path& target, std::span<const std::byte> bytes, bool durable = true) {
  atomic_file f(target, durable);
  f.write(bytes);
  f.commit();
}

/// A whole file's bytes; nullopt when it does not exist. @throws errc::io naming the file otherwise.
/// A file larger than `max_bytes` is refused unread (errc::integrity, field "size"): a hostile or
/// damaged object never costs more than the limit.
inline std::optional<std::vector<std::byte>> read_whole_file(const std::filesystem::path& p, std::uint64_t max_bytes = ~std::uint64_t{0}) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw detail::os_error("cannot open", p);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw detail::os_error("cannot stat", p, e);
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw error(errc::integrity, "object of " + std::to_string(st.st_size) + " bytes exceeds the limit of " + std::to_string(max_bytes),
                {.file = p.string(), .tensor = {}, .field = "size"});
  }
  std::vector<std::byte> out(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

/// A directory populated under a temporary name and then renamed into place as a whole.
/// Files inside are created with `create(name)` (new files only) and must be finish()ed.
/// @post before commit() the target is unchanged; without commit() the temporary tree is removed.
class atomic_directory {
 public:
  explicit atomic_directory(std::filesystem::path target)
      : target_(std::move(target)), temp_(detail::temporary_sibling(target_)) {
    if (::mkdir(temp_.c_str(), 0777) != 0) throw detail::os_error("cannot create directory", temp_);
  }
  atomic_directory(const atomic_directory&) = delete;
  atomic_directory& operator=(const atomic_directory&) = delete;
  ~atomic_directory() {
    std::error_code ec;
    std::filesystem::remove_all(temp_, ec);  // after commit() it holds the replaced old tree, or nothing
  }

  /// Path of `name` inside the directory being built.
  std::filesystem::path path_of(std::string_view name) const { return temp_ / std::string(name); }

  /// Makes the directory visible under the target name. An existing target is replaced only when
  /// `replace_existing` (it is swapped out atomically with renameat2(RENAME_EXCHANGE) where the
  /// filesystem supports it, else moved aside first, and then deleted); otherwise it is an
  /// errc::invalid_argument naming the target.
  void commit(bool replace_existing) {
    detail::fsync_directory(temp_);
    std::error_code ec;
    const bool exists = std::filesystem::exists(std::filesystem::symlink_status(target_, ec));
    if (exists && !replace_existing)
      throw error(errc::invalid_argument, "target already exists", {.file = target_.string(), .tensor = {}, .field = {}});
    if (!exists) {
      if (::rename(temp_.c_str(), target_.c_str()) != 0) throw detail::os_error("cannot rename into place", target_);
    } else {
      bool swapped = false;
#ifdef RENAME_EXCHANGE
      swapped = ::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0;
#endif
      if (!swapped) {
        // Fallback: a short window where the target name is absent, but never half-written.
        std::filesystem::path aside = detail::temporary_sibling(target_);
        if (::rename(target_.c_str(), aside.c_str()) != 0) throw detail::os_error("cannot move old target aside", target_);
        if (::rename(temp_.c_str(), target_.c_str()) != 0) {
          int e = errno;
          ::rename(aside.c_str(), target_.c_str());
          throw detail::os_error("cannot rename into place", target_, e);
        }
        std::filesystem::rename(aside, temp_, ec);  // so the destructor deletes the old tree
      }
    }
    detail::fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& target() const noexcept { return target_; }
  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
};

}  // namespace bitrefit::io
