// python/src/tensors.hpp — Python tensors as typed byte spans, without copies.
//
// What a tensor argument may be (resolve_tensor):
//   - a torch.Tensor (CPU), exported through DLPack (`__dlpack__`); a tensor that requires grad is
//     detached first (same storage), and dtypes DLPack 0.6 cannot carry (bool, float8) are viewed
//     as a same-size integer type first, keeping their declared dtype;
//   - a numpy array, or anything else with the buffer protocol (memoryview, bytearray, array);
//   - any other DLPack producer with a CPU device;
//   - bitrefit.with_dtype(x, "BF16"): x's bytes read as another dtype of the same element size
//     (bf16 and float8 data held in numpy uint16/uint8 arrays, or float8 in a torch without it).
// The dtype comes from the object's own dtype name (torch.bfloat16 -> BF16, numpy float32 -> F32,
// ml_dtypes' bfloat16 / float8_e4m3fn / float8_e5m2 too), else from the buffer format.
// Everything is checked before anything is read or written, and each refusal is a bitrefit::error
// naming the tensor and the field: dtype (unsupported, non-native byte order), device (not CPU),
// contiguous (not compact row-major), writable (a read-only array given to a receiver), type (not
// a tensor at all).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"

namespace bitrefit::python {

enum class access { read, write };

/// One resolved tensor: its bytes stay valid (and the producer's memory stays alive) as long as
/// `hold` lives. Release holds with the GIL held or from a thread that may take it.
struct tensor_ref {
  std::string name;
  dtype type = dtype::U8;
  shape_t shape;
  std::span<std::byte> bytes;
  std::shared_ptr<void> hold;

  tensor_view view() const { return tensor_view(name, type, shape, std::span<const std::byte>(bytes)); }
  mutable_tensor_view mutable_view() const { return mutable_tensor_view(name, type, shape, bytes); }
  tensor_info info() const { return {name, type, shape}; }
};

/// `bitrefit.with_dtype(x, dtype)`: x's bytes declared as `type`.
struct typed_tensor {
  pybind11::object tensor;
  dtype type = dtype::U8;
};

/// Resolves one tensor argument (see the header comment). @throws bitrefit::error
tensor_ref resolve_tensor(const std::string& name, pybind11::handle obj, access need);

/// Resolves every value of a mapping of canonical names to tensors (a state_dict), in byte-wise
/// name order. @throws bitrefit::error naming the first tensor that fails; a non-str key or a
/// non-mapping is errc::invalid_argument.
std::vector<tensor_ref> resolve_mapping(pybind11::handle mapping, access need);

/// The model a resolved mapping describes (names, dtypes, shapes).
model_manifest manifest_of(const std::vector<tensor_ref>& refs);

/// Checks that `refs` (name order) describe exactly `m`: the same names, dtypes and shapes.
/// @throws errc::mismatch naming the first tensor (and field: name, dtype or shape) that differs.
void check_matches(const model_manifest& m, const std::vector<tensor_ref>& refs, std::string_view what);

/// Parses a dtype name as users write it: the safetensors spelling ("BF16", "F8_E4M3") or the
/// framework's ("bfloat16", "torch.bfloat16", "float8_e4m3fn"). std::nullopt when unknown.
std::optional<dtype> parse_dtype_name(std::string_view s);

void register_tensors(pybind11::module_& m);

}  // namespace bitrefit::python
