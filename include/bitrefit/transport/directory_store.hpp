// bitrefit/transport/directory_store.hpp — an ObjectStore kept in a directory tree.
//
// The embedded default object store: works on one machine and on shared filesystems (NFS, Lustre)
// because every write is a whole new file renamed into place, and rename within one directory is
// atomic on POSIX. Keys are '/'-separated relative paths; a reader sees the old object, nothing,
// or the whole new one, never a prefix. Temp files start with ".tmp." and are never listed.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport {

namespace detail {

inline void check_key(const std::string& key) {
  if (key.empty() || key.front() == '/' || key.find("..") != std::string::npos ||
      key.find("/.tmp.") != std::string::npos || key.rfind(".tmp.", 0) == 0)
    throw error(errc::invalid_argument, "object key must be a relative path without '..' or '.tmp.' parts",
                {.file = key, .tensor = {}, .field = "key"});
}

/// Writes all of `b` to fd; throws errc::io naming `path`.
inline void write_all(int fd, std::span<const std::byte> b, const std::string& path) {
  const std::byte* p = b.data();
  std::size_t left = b.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw error(errc::io, std::string("write failed: ") + std::strerror(errno), {.file = path, .tensor = {}, .field = {}});
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

inline void fsync_path(const std::filesystem::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw error(errc::io, std::string("open for fsync failed: ") + std::strerror(errno), {.file = p.string(), .tensor = {}, .field = {}});
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) throw error(errc::io, std::string("fsync failed: ") + std::strerror(e), {.file = p.string(), .tensor = {}, .field = {}});
}

/// A name unique across processes and threads, for temp files.
inline std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = std::random_device{}();
  return std::to_string(::getpid()) + "." + std::to_string(salt & 0xFFFFFF) + "." + std::to_string(counter++);
}

/// Writes `b` to `target` atomically: temp file in the same directory, optional fsync, rename,
/// optional fsync of the directory. On failure nothing exists under `target` that was not there.
inline void atomic_write(const std::filesystem::path& target, std::span<const std::byte> b, bool durable) {
  namespace fs = std::filesystem;
  const fs::path dir = target.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path tmp = dir / (".tmp." + unique_suffix() + "." + target.filename().string());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw error(errc::io, std::string("create failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
  try {
    write_all(fd, b, tmp.string());
    if (durable && ::fsync(fd) != 0)
      throw error(errc::io, std::string("fsync failed: ") + std::strerror(errno), {.file = tmp.string(), .tensor = {}, .field = {}});
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw error(errc::io, std::string("rename failed: ") + std::strerror(e), {.file = target.string(), .tensor = {}, .field = {}});
  }
  if (durable) fsync_path(dir, true);
}

/// Reads a whole file; nullopt when it does not exist.
/// The whole file; nullopt when it does not exist. A file larger than `max_bytes` is refused unread
/// (errc::integrity, field "size"): a hostile or damaged object never costs more than the limit.
inline std::optional<bytes> read_file(const std::filesystem::path& p, std::uint64_t max_bytes = ~std::uint64_t{0}) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw error(errc::io, std::string("open failed: ") + std::strerror(errno), {.file = p.string(), .tensor = {}, .field = {}});
  }
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw error(errc::integrity, "object of " + std::to_string(st.st_size) + " bytes exceeds the limit of " + std::to_string(max_bytes),
                {.file = p.string(), .tensor = {}, .field = "size"});
  }
  bytes out(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

}  // namespace detail

struct directory_store_options {
  bool durable = false;  // fsync each object and its directory (payloads need not survive a crash)
  /// get() refuses a larger object unread (errc::integrity). The default holds any payload frame
  /// (at most 64 MiB of input, codec/types.hpp) and any control message with a wide margin.
  std::uint64_t max_object_bytes = std::uint64_t{1} << 30;
};

class directory_store {
 public:
  using options = directory_store_options;

  explicit directory_store(std::filesystem::path root, options o = {}) : root_(std::move(root)), opt_(o) {
    std::error_code ec;
    std::filesystem::create_directories(root_, ec);
    if (!std::filesystem::is_directory(root_))
      throw error(errc::io, "object store root is not a directory", {.file = root_.string(), .tensor = {}, .field = {}});
  }

  void put(const std::string& key, std::span<const std::byte> b) {
    detail::check_key(key);
    detail::atomic_write(root_ / key, b, opt_.durable);
  }
  std::optional<bytes> get(const std::string& key) {
    detail::check_key(key);
    return detail::read_file(root_ / key, opt_.max_object_bytes);
  }
  /// Every key starting with `prefix`, sorted byte-wise. Walks only the directory that the prefix
  /// names up to its last '/', so listing one stream does not scan the whole store.
  std::vector<std::string> list(const std::string& prefix) {
    namespace fs = std::filesystem;
    const auto slash = prefix.rfind('/');
    const std::string dir_part = slash == std::string::npos ? std::string() : prefix.substr(0, slash);
    const fs::path dir = dir_part.empty() ? root_ : root_ / dir_part;
    std::vector<std::string> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const std::string name = it->path().filename().string();
      if (name.rfind(".tmp.", 0) == 0) continue;
      std::string key = fs::relative(it->path(), root_, ec).generic_string();
      if (key.rfind(prefix, 0) == 0) out.push_back(std::move(key));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  void remove(const std::string& key) {
    detail::check_key(key);
    std::error_code ec;
    std::filesystem::remove(root_ / key, ec);
  }
  /// Removes an empty directory left after removing its objects (best effort, for tidiness).
  void prune(const std::string& dir_key) {
    std::error_code ec;
    std::filesystem::remove(root_ / dir_key, ec);
  }

  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
  options opt_;
};

static_assert(ObjectStore<directory_store>);

}  // namespace bitrefit::transport
