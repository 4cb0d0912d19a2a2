// python/src/errors.cpp — see errors.hpp.
#include "errors.hpp"

#include <Python.h>

#include <array>
#include <string>

#include "bitrefit/core/error.hpp"
#include "bitrefit/io/checkpoint_error.hpp"

namespace py = pybind11;

namespace bitrefit::python {
namespace {

/// One Python class per errc, in enum order; the Python name of the errc is the enum's spelling.
struct errc_class {
  errc code;
  const char* errc_name;   // attribute value: "mismatch", ...
  const char* class_name;  // "MismatchError"
  PyObject* extra_base;    // a builtin that existing handlers catch, or nullptr
  const char* doc;
};

std::array<PyObject*, 8> classes{};  // indexed by errc; module-lifetime references (never released)
PyObject* base_class = nullptr;

PyObject* class_of(errc c) {
  const auto i = static_cast<std::size_t>(c);
  return i < classes.size() && classes[i] ? classes[i] : base_class;
}

const char* errc_attr(errc c) {
  switch (c) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::io: return "io";
    case errc::format: return "format";
    case errc::integrity: return "integrity";
    case errc::mismatch: return "mismatch";
    case errc::protocol: return "protocol";
    case errc::fenced: return "fenced";
    case errc::unsupported: return "unsupported";
  }
  return "unknown";
}

py::object optional_str(const std::string& s) { return s.empty() ? py::object(py::none()) : py::object(py::str(s)); }

void raise_python(const error& e, const io::checkpoint_error* problem) {
  PyObject* cls = class_of(e.code());
  py::object instance = py::reinterpret_steal<py::object>(PyObject_CallFunction(cls, "s", e.what()));
  if (!instance) return;  // the constructor raised: that exception stands
  instance.attr("errc") = py::str(errc_attr(e.code()));
  instance.attr("message") = py::str(e.message());
  instance.attr("file") = optional_str(e.where().file);
  instance.attr("tensor") = optional_str(e.where().tensor);
  instance.attr("field") = optional_str(e.where().field);
  instance.attr("problem") = problem ? py::object(py::str(std::string(io::checkpoint_errc_name(problem->problem()))))
                                     : py::object(py::none());
  PyErr_SetObject(cls, instance.ptr());
}

}  // namespace

void register_errors(py::module_& m) {
  py::dict attrs;
  for (const char* a : {"errc", "message", "file", "tensor", "field", "problem"}) attrs[a] = py::none();
  base_class = PyErr_NewExceptionWithDoc(
      "bitrefit.Error",
      "Base of every bitrefit failure. Attributes: errc (the category: 'invalid_argument', 'io', 'format',\n"
      "'integrity', 'mismatch', 'protocol', 'fenced', 'unsupported'), message (the bare description),\n"
      "file, tensor and field (where it happened, None when not applicable) and problem (for a\n"
      "checkpoint that breaks a safetensors rule: the rule's name, e.g. 'offsets_overlap'; else None).",
      PyExc_Exception, attrs.ptr());
  if (!base_class) throw py::error_already_set();
  m.add_object("Error", py::handle(base_class));

  const errc_class table[] = {
      {errc::invalid_argument, "invalid_argument", "InvalidArgumentError", PyExc_ValueError,
       "A caller broke a documented precondition: a wrong dtype, shape, a non-contiguous or read-only tensor, a bad option."},
      {errc::io, "io", "IoError", PyExc_OSError, "The operating system refused a read, write or rename."},
      {errc::format, "format", "FormatError", PyExc_ValueError,
       "Bytes that do not parse: a safetensors header, a delta bundle, a frame, JSON."},
      {errc::integrity, "integrity", "IntegrityError", nullptr, "A digest or size check failed: corruption or truncation."},
      {errc::mismatch, "mismatch", "MismatchError", PyExc_ValueError,
       "Well-formed input that does not fit: another tensor set, dtype or shape, a delta for another base."},
      {errc::protocol, "protocol", "ProtocolError", nullptr,
       "The refit protocol cannot go on (a transition that needs an operator, a timeout)."},
      {errc::fenced, "fenced", "FencedError", nullptr, "A newer coordinator epoch or receiver incarnation took over."},
      {errc::unsupported, "unsupported", "UnsupportedError", PyExc_ValueError,
       "A dtype, device, format version or transport this build does not implement."},
  };
  for (const auto& c : table) {
    PyObject* bases = c.extra_base ? PyTuple_Pack(2, base_class, c.extra_base) : PyTuple_Pack(1, base_class);
    const std::string qualified = std::string("bitrefit.") + c.class_name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), c.doc, bases, nullptr);
    Py_DECREF(bases);
    if (!cls) throw py::error_already_set();
    classes[static_cast<std::size_t>(c.code)] = cls;
    m.add_object(c.class_name, py::handle(cls));
  }

  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const io::checkpoint_error& e) {
      raise_python(e, &e);
    } catch (const error& e) {
      raise_python(e, nullptr);
    }
  });
}

}  // namespace bitrefit::python
