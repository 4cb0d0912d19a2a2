// bitrefit/transport/directory_store.hpp — an ObjectStore kept in a directory tree.
//
// The embedded default object store: works on one machine and on shared filesystems (NFS, Lustre)
// because every write is a whole new file renamed into place (io/atomic_file.hpp), and rename
// within one directory is atomic on POSIX. Keys are '/'-separated relative paths; a reader sees the old object, nothing,
// or the whole new one, never a prefix. Temp files start with ".tmp." and are never listed.
#pragma once

#include <algorithm>
#include <filesystem>

#include "bitrefit/core/error.hpp"
#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport {

namespace detail {

inline void check_key(const std::string& key) {
  if (key.empty() || key.front() == '/' || key.find("..") != std::string::npos ||
      key.find("/.tmp.") != std::string::npos || key.rfind(".tmp.", 0) == 0)
    throw error(errc::invalid_argument, "object key must be a relative path without '..' or '.tmp.' parts",
                {.file = key, .tensor = {}, .field = "key"});
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
    const auto path = root_ / key;
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    io::write_file_atomically(path, b, opt_.durable);  // io/atomic_file.hpp: the one atomic write
  }
  std::optional<bytes> get(const std::string& key) {
    detail::check_key(key);
    return io::read_whole_file(root_ / key, opt_.max_object_bytes);
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
      if (io::detail::is_temporary_name(name)) continue;
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
