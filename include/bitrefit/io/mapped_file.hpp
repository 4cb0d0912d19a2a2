// bitrefit/io/mapped_file.hpp — a read-only memory mapping of a whole file.
//
// Checkpoints are read through mmap so that opening a 100 GB model costs a header parse, and
// tensors are paged in only when touched. The mapping lives as long as the object; moving it keeps
// every span handed out valid (the address does not change). Like any mmap, a file truncated by
// someone else while mapped faults on access: bitrefit never modifies a file it has mapped, it
// writes a new one and renames it (see atomic_file.hpp).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include "bitrefit/core/error.hpp"

namespace bitrefit::io {

namespace detail {
/// errc::io naming the file and what the operating system said.
inline error os_error(const std::string& what, const std::filesystem::path& file, int err = errno) {
  return error(errc::io, what + ": " + std::strerror(err), {.file = file.string(), .tensor = {}, .field = {}});
}
}  // namespace detail

class mapped_file {
 public:
  mapped_file() = default;

  /// Maps `file` read-only. Throws errc::io naming the file when it cannot be opened, is not a
  /// regular file, or cannot be mapped. An empty file gives an empty span (mmap refuses length 0).
  explicit mapped_file(std::filesystem::path file) : path_(std::move(file)) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw detail::os_error("cannot open for reading", path_);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      throw detail::os_error("cannot stat", path_, e);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw error(errc::io, "not a regular file", {.file = path_.string(), .tensor = {}, .field = {}});
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        throw detail::os_error("cannot mmap", path_, e);
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~mapped_file() { unmap(); }

  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  std::size_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A read-write shared mapping of a whole existing file: stores through bytes() reach the file
/// (page cache), sync() makes them durable. For a file bitrefit created itself and has not yet
/// renamed into place (e.g. `bitrefit apply` patching its staged output), never for an input.
class writable_mapping {
 public:
  explicit writable_mapping(std::filesystem::path file) : path_(std::move(file)) {
    int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw detail::os_error("cannot open for writing", path_);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      int e = errno;
      ::close(fd);
      throw detail::os_error("not a regular file", path_, e);
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        throw detail::os_error("cannot mmap for writing", path_, e);
      }
      data_ = static_cast<std::byte*>(p);
    }
    ::close(fd);
  }
  writable_mapping(const writable_mapping&) = delete;
  writable_mapping& operator=(const writable_mapping&) = delete;
  writable_mapping(writable_mapping&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ~writable_mapping() {
    if (data_) ::munmap(data_, size_);
  }

  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  /// Writes dirty pages back to the file and waits (msync MS_SYNC). errc::io on failure.
  void sync() const {
    if (data_ && ::msync(data_, size_, MS_SYNC) != 0) throw detail::os_error("msync failed", path_);
  }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace bitrefit::io
