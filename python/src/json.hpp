// python/src/json.hpp — nlohmann JSON values as Python objects (dict, list, str, int, float, bool,
// None), so every result the library already describes as JSON reaches Python as plain data with
// the same keys (one schema for the CLI's --json and the binding's dicts).
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

namespace bitrefit::python {

template <class Json>
pybind11::object to_python(const Json& j) {
  namespace py = pybind11;
  switch (j.type()) {
    case nlohmann::json::value_t::null: return py::none();
    case nlohmann::json::value_t::boolean: return py::bool_(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return py::int_(j.template get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return py::int_(j.template get<std::uint64_t>());
    case nlohmann::json::value_t::number_float: return py::float_(j.template get<double>());
    case nlohmann::json::value_t::string: return py::str(j.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      py::list out;
      for (const auto& x : j) out.append(to_python(x));
      return out;
    }
    case nlohmann::json::value_t::object: {
      py::dict out;
      for (auto it = j.begin(); it != j.end(); ++it) out[py::str(it.key())] = to_python(it.value());
      return out;
    }
    default: return py::none();  // binary and discarded values never occur in results
  }
}

}  // namespace bitrefit::python
