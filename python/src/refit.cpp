#include "refit.hpp"
namespace bitrefit::python {
void register_refit(pybind11::module_&) {}
}
