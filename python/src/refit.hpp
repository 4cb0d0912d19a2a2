// python/src/refit.hpp — bitrefit.Sender and bitrefit.Receiver (see refit.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace bitrefit::python {

void register_refit(pybind11::module_& m);

}  // namespace bitrefit::python
