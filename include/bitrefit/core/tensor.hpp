// bitrefit/core/tensor.hpp — named, typed, shaped views over stored bytes.
//
// A view never owns memory. Construction is checked: the byte span must hold exactly
// product(shape) * element_size(dtype) bytes, so every later index computation can trust it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"

namespace bitrefit {

using shape_t = std::vector<std::uint64_t>;

/// Number of elements of a shape; a 0-d shape has one element, any zero extent gives zero.
/// Throws errc::invalid_argument on overflow of 64 bits.
inline std::uint64_t element_count(const shape_t& shape, std::string_view tensor = {}) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d)
      throw error(errc::invalid_argument, "shape element count overflows 64 bits",
                  {.file = {}, .tensor = std::string(tensor), .field = "shape"});
    n *= d;
  }
  return n;
}

/// Byte size of a tensor of `shape` and `t`, checked for overflow.
inline std::uint64_t byte_size(dtype t, const shape_t& shape, std::string_view tensor = {}) {
  std::uint64_t n = element_count(shape, tensor);
  if (n > UINT64_MAX / element_size(t))
    throw error(errc::invalid_argument, "tensor byte size overflows 64 bits",
                {.file = {}, .tensor = std::string(tensor), .field = "shape"});
  return n * element_size(t);
}

/// Name, dtype, shape and the stored bytes of one tensor. `Byte` is `const std::byte` for a
/// read-only view (tensor_view) or `std::byte` for a writable one (mutable_tensor_view).
template <class Byte>
class basic_tensor_view {
  static_assert(std::is_same_v<std::remove_const_t<Byte>, std::byte>);

 public:
  basic_tensor_view() = default;

  /// @pre bytes.size() == byte_size(type, shape); otherwise throws errc::mismatch naming the tensor.
  basic_tensor_view(std::string name, dtype type, shape_t shape, std::span<Byte> bytes)
      : name_(std::move(name)), dtype_(type), shape_(std::move(shape)), bytes_(bytes) {
    const std::uint64_t expect = byte_size(dtype_, shape_, name_);
    if (bytes_.size() != expect)
      throw error(errc::mismatch,
                  "byte span holds " + std::to_string(bytes_.size()) + " bytes but dtype " +
                      std::string(dtype_name(dtype_)) + " and shape need " + std::to_string(expect),
                  {.file = {}, .tensor = name_, .field = "data"});
  }

  /// A writable view converts to a read-only one.
  template <class B = Byte>
    requires std::is_const_v<B>
  basic_tensor_view(const basic_tensor_view<std::byte>& w)  // NOLINT(google-explicit-constructor)
      : name_(w.name()), dtype_(w.type()), shape_(w.shape()), bytes_(w.bytes()) {}

  const std::string& name() const noexcept { return name_; }
  dtype type() const noexcept { return dtype_; }
  const shape_t& shape() const noexcept { return shape_; }
  std::span<Byte> bytes() const noexcept { return bytes_; }
  std::uint64_t elements() const noexcept { return bytes_.size() / element_size(dtype_); }
  std::size_t elem_size() const noexcept { return element_size(dtype_); }

 private:
  std::string name_;
  dtype dtype_ = dtype::U8;
  shape_t shape_;
  std::span<Byte> bytes_;
};

using tensor_view = basic_tensor_view<const std::byte>;
using mutable_tensor_view = basic_tensor_view<std::byte>;

}  // namespace bitrefit
