// python/src/tensors.cpp — see tensors.hpp.
#include "tensors.hpp"

#include <Python.h>
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string_view>

#include "bitrefit/core/error.hpp"

namespace py = pybind11;

namespace bitrefit::python {
namespace {

// DLPack type codes newer than the 0.6 header (dlpack.h v0.8 / v1.1), so that producers built
// against a newer DLPack still resolve: bool, and the two float8 formats safetensors carries.
constexpr std::uint8_t dl_bool = 6;
constexpr std::uint8_t dl_float8_e4m3fn = 10;
constexpr std::uint8_t dl_float8_e5m2 = 12;

[[noreturn]] void fail(errc code, const std::string& tensor, const char* field, const std::string& message) {
  throw error(code, message, {.file = {}, .tensor = tensor, .field = field});
}

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__qualname__")); }

std::string type_module(py::handle obj) {
  py::object mod = py::getattr(py::type::handle_of(obj), "__module__", py::none());
  return mod.is_none() ? std::string() : std::string(py::str(mod));
}

bool is_torch_tensor(py::handle obj) {
  const std::string mod = type_module(obj);
  return mod == "torch" || mod.rfind("torch.", 0) == 0;
}

/// The dtype an object declares through its `dtype` attribute, if it has one.
/// @throws unsupported for a dtype safetensors cannot carry or a non-native byte order.
std::optional<dtype> declared_dtype(const std::string& name, py::handle obj) {
  if (!py::hasattr(obj, "dtype")) return std::nullopt;
  py::object dt = obj.attr("dtype");
  if (py::hasattr(dt, "isnative") && !py::cast<bool>(dt.attr("isnative")))
    fail(errc::unsupported, name, "dtype",
         "array with non-native byte order (" + std::string(py::str(dt)) + "): safetensors stores little-endian");
  // numpy dtypes spell themselves by .name ('float32', 'bfloat16' from ml_dtypes); torch dtypes
  // by str() ('torch.bfloat16').
  const std::string spelled = py::hasattr(dt, "name") && !is_torch_tensor(obj) ? std::string(py::str(dt.attr("name")))
                                                                               : std::string(py::str(dt));
  if (auto t = parse_dtype_name(spelled)) return t;
  fail(errc::unsupported, name, "dtype",
       "dtype " + spelled + " is not one a safetensors checkpoint carries (bool, u/int8-64, float16, bfloat16, "
       "float32, float64, float8_e4m3fn, float8_e5m2); bitrefit.with_dtype(x, ...) reinterprets same-size bytes");
}

/// The integer dtype of a signedness and element size.
std::optional<dtype> integer_dtype(bool is_signed, std::size_t bytes) {
  switch (bytes) {
    case 1: return is_signed ? dtype::I8 : dtype::U8;
    case 2: return is_signed ? dtype::I16 : dtype::U16;
    case 4: return is_signed ? dtype::I32 : dtype::U32;
    case 8: return is_signed ? dtype::I64 : dtype::U64;
  }
  return std::nullopt;
}

std::optional<dtype> buffer_format_dtype(std::string_view fmt, std::size_t itemsize) {
  if (!fmt.empty() && (fmt.front() == '@' || fmt.front() == '=' || fmt.front() == '<')) fmt.remove_prefix(1);
  if (fmt.size() != 1) return std::nullopt;
  const char c = fmt.front();
  if (std::string_view("bhilq").find(c) != std::string_view::npos) return integer_dtype(true, itemsize);
  if (std::string_view("BHILQc").find(c) != std::string_view::npos) return integer_dtype(false, itemsize);
  switch (c) {
    case '?': return dtype::BOOL;
    case 'e': return dtype::F16;
    case 'f': return dtype::F32;
    case 'd': return dtype::F64;
  }
  return std::nullopt;
}

std::optional<dtype> dlpack_dtype(const DLDataType& t) {
  if (t.lanes != 1 || t.bits % 8 != 0) return std::nullopt;
  switch (t.code) {
    case kDLInt: return integer_dtype(true, t.bits / 8);
    case kDLUInt: return integer_dtype(false, t.bits / 8);
    case kDLFloat:
      switch (t.bits) {
        case 16: return dtype::F16;
        case 32: return dtype::F32;
        case 64: return dtype::F64;
      }
      break;
    case kDLBfloat:
      if (t.bits == 16) return dtype::BF16;
      break;
    case dl_bool:
      if (t.bits == 8) return dtype::BOOL;
      break;
    case dl_float8_e4m3fn:
      if (t.bits == 8) return dtype::F8_E4M3;
      break;
    case dl_float8_e5m2:
      if (t.bits == 8) return dtype::F8_E5M2;
      break;
  }
  return std::nullopt;
}

/// Row-major compactness, with strides in units of `unit` bytes (DLPack: elements; buffer: bytes).
/// Extents of 1 may have any stride; a tensor with no elements is trivially compact.
bool compact(std::span<const std::int64_t> shape, const std::int64_t* strides, std::int64_t unit) {
  if (!strides) return true;
  for (auto d : shape)
    if (d == 0) return true;
  std::int64_t expect = unit;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

/// Checks the device an object says it lives on, before anything is exported.
void check_device(const std::string& name, py::handle obj) {
  if (!py::hasattr(obj, "device")) return;
  py::object dev = obj.attr("device");
  if (PyCallable_Check(dev.ptr())) return;  // jax-style device() method: DLPack says below
  const std::string d = py::str(dev);
  if (d != "cpu" && d.rfind("cpu:", 0) != 0)
    fail(errc::unsupported, name, "device",
         "tensor on device '" + d + "': this build reads and writes host memory only (move it with .cpu())");
}

tensor_ref from_buffer(const std::string& name, py::handle obj, access need, std::optional<dtype> dt) {
  auto* view = new Py_buffer{};
  if (PyObject_GetBuffer(obj.ptr(), view, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
    delete view;
    PyErr_Clear();
    fail(errc::invalid_argument, name, "type",
         "a " + type_name(obj) + " that exports no usable buffer (numpy without bfloat16/float8: pass "
         "bitrefit.with_dtype(x.view(numpy.uint16), 'BF16'))");
  }
  std::shared_ptr<void> hold(view, [](void* p) {
    py::gil_scoped_acquire gil;
    PyBuffer_Release(static_cast<Py_buffer*>(p));
    delete static_cast<Py_buffer*>(p);
  });
  if (need == access::write && view->readonly)
    fail(errc::invalid_argument, name, "writable", "read-only " + type_name(obj) + ": a receiver writes refits into it");
  const std::string fmt = view->format ? view->format : "B";
  if (fmt.find_first_of(">!") != std::string::npos)
    fail(errc::unsupported, name, "dtype", "big-endian buffer format '" + fmt + "': safetensors stores little-endian");
  if (!dt) dt = buffer_format_dtype(fmt, static_cast<std::size_t>(view->itemsize));
  if (!dt) fail(errc::unsupported, name, "dtype", "buffer format '" + fmt + "' is not a dtype safetensors carries");
  if (element_size(*dt) != static_cast<std::size_t>(view->itemsize))
    fail(errc::invalid_argument, name, "dtype",
         "dtype " + std::string(dtype_name(*dt)) + " has " + std::to_string(element_size(*dt)) + "-byte elements, the data " +
             std::to_string(view->itemsize) + "-byte ones");
  std::vector<std::int64_t> extents(view->shape, view->shape + view->ndim);
  std::vector<std::int64_t> strides;
  if (view->strides) strides.assign(view->strides, view->strides + view->ndim);
  if (!compact(extents, view->strides ? strides.data() : nullptr, view->itemsize))
    fail(errc::invalid_argument, name, "contiguous",
         "non-contiguous " + type_name(obj) + ": pass a compact row-major tensor (.contiguous() / numpy.ascontiguousarray)");
  tensor_ref r;
  r.name = name;
  r.type = *dt;
  for (auto e : extents) r.shape.push_back(static_cast<std::uint64_t>(e));
  r.bytes = std::span<std::byte>(static_cast<std::byte*>(view->buf), static_cast<std::size_t>(view->len));
  r.hold = std::move(hold);
  return r;
}

tensor_ref from_dlpack(const std::string& name, py::handle obj, std::optional<dtype> dt) {
  py::object x = py::reinterpret_borrow<py::object>(obj);
  if (is_torch_tensor(x)) {
    // DLPack refuses tensors that require grad (the storage is what we want: detach shares it),
    // and DLPack 0.6 producers cannot carry bool or float8: view those as uint8, same bytes.
    if (py::cast<bool>(x.attr("requires_grad"))) x = x.attr("detach")();
    if (dt && element_size(*dt) == 1 && *dt != dtype::U8 && *dt != dtype::I8)
      x = x.attr("view")(py::module_::import("torch").attr("uint8"));
  }
  if (py::hasattr(x, "__dlpack_device__")) {
    py::tuple dev;
    try {
      dev = x.attr("__dlpack_device__")();
    } catch (py::error_already_set& e) {
      fail(errc::unsupported, name, "device", std::string("tensor on a device DLPack cannot export: ") + e.what());
    }
    const int type = py::cast<int>(dev[0]);
    if (type != kDLCPU && type != kDLCUDAHost)
      fail(errc::unsupported, name, "device",
           "tensor on DLPack device type " + std::to_string(type) + ": this build reads and writes host memory only");
  }
  py::object capsule;
  try {
    capsule = x.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    fail(errc::invalid_argument, name, "type", std::string("the tensor cannot be exported through DLPack: ") + e.what());
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!managed) {
    PyErr_Clear();
    fail(errc::invalid_argument, name, "type", "__dlpack__ returned no unconsumed 'dltensor' capsule");
  }
  // Consumed: from now on the producer's capsule destructor leaves it to us (DLPack protocol).
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  std::shared_ptr<void> hold(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter) {
      py::gil_scoped_acquire gil;  // numpy's deleter decrefs the array
      m->deleter(m);
    }
  });
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    fail(errc::unsupported, name, "device",
         "tensor on DLPack device type " + std::to_string(t.device.device_type) + ": this build reads and writes host memory only");
  const auto exported = dlpack_dtype(t.dtype);
  if (!dt) dt = exported;
  if (!dt)
    fail(errc::unsupported, name, "dtype",
         "DLPack dtype (code " + std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) + " bits, " +
             std::to_string(t.dtype.lanes) + " lanes) is not one a safetensors checkpoint carries");
  if (t.dtype.lanes != 1 || std::size_t(t.dtype.bits) != 8 * element_size(*dt))
    fail(errc::invalid_argument, name, "dtype",
         "dtype " + std::string(dtype_name(*dt)) + " has " + std::to_string(element_size(*dt)) + "-byte elements, the data " +
             std::to_string(t.dtype.bits) + "-bit ones");
  std::span<const std::int64_t> extents(t.shape, static_cast<std::size_t>(t.ndim));
  if (!compact(extents, t.strides, 1))
    fail(errc::invalid_argument, name, "contiguous",
         "non-contiguous " + type_name(obj) + ": pass a compact row-major tensor (.contiguous())");
  tensor_ref r;
  r.name = name;
  r.type = *dt;
  std::uint64_t n = 1;
  for (auto e : extents) {
    r.shape.push_back(static_cast<std::uint64_t>(e));
    n *= static_cast<std::uint64_t>(e);
  }
  auto* data = static_cast<std::byte*>(t.data) + t.byte_offset;
  r.bytes = std::span<std::byte>(n ? data : nullptr, n * element_size(*dt));
  r.hold = std::move(hold);
  return r;
}

}  // namespace

std::optional<dtype> parse_dtype_name(std::string_view s) {
  if (auto t = parse_dtype(s)) return t;
  if (s.rfind("torch.", 0) == 0) s.remove_prefix(6);
  struct alias {
    std::string_view name;
    dtype type;
  };
  static constexpr alias aliases[] = {
      {"bool", dtype::BOOL},       {"uint8", dtype::U8},      {"int8", dtype::I8},          {"int16", dtype::I16},
      {"uint16", dtype::U16},      {"int32", dtype::I32},     {"uint32", dtype::U32},       {"int64", dtype::I64},
      {"uint64", dtype::U64},      {"float16", dtype::F16},   {"half", dtype::F16},         {"bfloat16", dtype::BF16},
      {"float32", dtype::F32},     {"float", dtype::F32},     {"float64", dtype::F64},      {"double", dtype::F64},
      {"float8_e4m3fn", dtype::F8_E4M3}, {"float8_e5m2", dtype::F8_E5M2},
  };
  for (const auto& a : aliases)
    if (a.name == s) return a.type;
  return std::nullopt;
}

tensor_ref resolve_tensor(const std::string& name, py::handle obj, access need) {
  std::optional<dtype> dt;
  py::handle x = obj;
  if (py::isinstance<typed_tensor>(obj)) {
    const auto& typed = py::cast<const typed_tensor&>(obj);
    x = typed.tensor;
    dt = typed.type;
    check_device(name, x);
    // A reinterpretation keeps the bytes per element: its dtype must have the data's size.
    const auto own = declared_dtype(name, x);
    if (own && element_size(*own) != element_size(*dt))
      fail(errc::invalid_argument, name, "dtype",
           "with_dtype(" + std::string(dtype_name(*dt)) + ") over " + std::string(dtype_name(*own)) +
               " data: the element sizes differ (reinterpretation keeps the bytes per element)");
  } else {
    check_device(name, x);
    dt = declared_dtype(name, x);
  }
  if (PyObject_CheckBuffer(x.ptr())) return from_buffer(name, x, need, dt);
  if (py::hasattr(x, "__dlpack__")) return from_dlpack(name, x, dt);
  fail(errc::invalid_argument, name, "type",
       "expected a tensor (torch.Tensor on the CPU, numpy array, buffer or DLPack producer), got " + type_name(x));
}

std::vector<tensor_ref> resolve_mapping(py::handle mapping, access need) {
  if (!py::hasattr(mapping, "items"))
    fail(errc::invalid_argument, {}, "state_dict",
         "expected a mapping of canonical names to tensors (a state_dict), got " + type_name(mapping));
  std::vector<tensor_ref> refs;
  for (py::handle item : mapping.attr("items")()) {
    py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    if (!py::isinstance<py::str>(kv[0]))
      fail(errc::invalid_argument, {}, "name", "tensor names must be str, got " + type_name(kv[0]));
    refs.push_back(resolve_tensor(py::cast<std::string>(kv[0]), kv[1], need));
  }
  std::sort(refs.begin(), refs.end(), [](const tensor_ref& a, const tensor_ref& b) { return a.name < b.name; });
  return refs;
}

model_manifest manifest_of(const std::vector<tensor_ref>& refs) {
  std::vector<tensor_info> infos;
  infos.reserve(refs.size());
  for (const auto& r : refs) infos.push_back(r.info());
  return model_manifest(std::move(infos));
}

void check_matches(const model_manifest& m, const std::vector<tensor_ref>& refs, std::string_view what) {
  const auto& ts = m.tensors();
  std::size_t i = 0, j = 0;
  while (i < ts.size() || j < refs.size()) {
    if (j == refs.size() || (i < ts.size() && ts[i].name < refs[j].name))
      fail(errc::mismatch, ts[i].name, "name", "the model's tensor is missing from " + std::string(what));
    if (i == ts.size() || refs[j].name < ts[i].name)
      fail(errc::mismatch, refs[j].name, "name", std::string(what) + " holds a tensor the model does not have");
    const tensor_info& want = ts[i++];
    const tensor_ref& got = refs[j++];
    if (got.type != want.type)
      fail(errc::mismatch, got.name, "dtype",
           "dtype " + std::string(dtype_name(got.type)) + " in " + std::string(what) + ", the model's is " +
               std::string(dtype_name(want.type)));
    if (got.shape != want.shape) {
      auto spell = [](const shape_t& s) {
        std::string out = "[";
        for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
        return out + "]";
      };
      fail(errc::mismatch, got.name, "shape",
           "shape " + spell(got.shape) + " in " + std::string(what) + ", the model's is " + spell(want.shape));
    }
  }
}

void register_tensors(py::module_& m) {
  py::class_<typed_tensor>(m, "TypedTensor",
                           "A tensor whose bytes are read as another dtype of the same element size (from with_dtype).")
      .def_property_readonly("tensor", [](const typed_tensor& t) { return t.tensor; })
      .def_property_readonly("dtype", [](const typed_tensor& t) { return std::string(dtype_name(t.type)); })
      .def("__repr__", [](const typed_tensor& t) {
        return "bitrefit.with_dtype(" + std::string(py::repr(t.tensor)) + ", '" + std::string(dtype_name(t.type)) + "')";
      });
  m.def(
      "with_dtype",
      [](py::object tensor, const std::string& name) {
        const auto t = parse_dtype_name(name);
        if (!t) fail(errc::unsupported, {}, "dtype", "unknown dtype '" + name + "'");
        return typed_tensor{std::move(tensor), *t};
      },
      py::arg("tensor"), py::arg("dtype"),
      "Declares that `tensor`'s bytes hold `dtype` values (a safetensors spelling such as 'BF16', 'F8_E4M3',\n"
      "or 'bfloat16', 'float8_e4m3fn'). The element size must match: e.g. bfloat16 bits in a numpy uint16\n"
      "array, float8 bits in a uint8 array or tensor. Nothing is copied.");
  m.def(
      "dtypes", [] {
        std::vector<std::string> out;
        for (dtype t : all_dtypes) out.emplace_back(dtype_name(t));
        return out;
      },
      "The dtypes a checkpoint (and so a refit) can carry, in safetensors spelling.");
}

}  // namespace bitrefit::python
