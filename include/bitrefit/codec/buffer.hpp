// bitrefit/codec/buffer.hpp — a grow-only buffer of trivially copyable elements whose growth does
// not zero memory (std::vector::resize would write every byte of a 64 MiB scratch per chunk).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>

namespace bitrefit::codec {

template <class T>
class scratch_buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  scratch_buffer() = default;
  scratch_buffer(scratch_buffer&&) noexcept = default;
  scratch_buffer& operator=(scratch_buffer&&) noexcept = default;

  /// Sets the size to n, keeping the first min(n, size()) elements; new elements are
  /// uninitialised. Capacity never shrinks, so a reused buffer allocates once.
  void resize_uninit(std::size_t n) {
    if (n > cap_) {
      std::size_t nc = cap_ ? cap_ : 64;
      while (nc < n) nc *= 2;
      std::unique_ptr<T[]> nd(new T[nc]);
      if (size_) std::memcpy(nd.get(), data_.get(), size_ * sizeof(T));
      data_ = std::move(nd);
      cap_ = nc;
    }
    size_ = n;
  }
  void clear() noexcept { size_ = 0; }
  void push_back(const T& v) {
    if (size_ == cap_) {
      std::size_t s = size_;
      resize_uninit(s + 1);
      size_ = s;
    }
    data_[size_++] = v;
  }
  void append(std::span<const T> s) {
    std::size_t old = size_;
    resize_uninit(old + s.size());
    if (!s.empty()) std::memcpy(data_.get() + old, s.data(), s.size() * sizeof(T));
  }

  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return cap_; }
  std::size_t capacity_bytes() const noexcept { return cap_ * sizeof(T); }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  std::span<T> span() noexcept { return {data_.get(), size_}; }
  std::span<const T> span() const noexcept { return {data_.get(), size_}; }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

using byte_buffer = scratch_buffer<std::byte>;

}  // namespace bitrefit::codec
