// python/src/ops.hpp — bitrefit.stat/diff/apply/verify/digest: ops/checkpoint_ops.hpp, the CLI's
// operations, with Python progress callbacks and the results as dicts (the CLI's --json keys).
#pragma once

#include <pybind11/pybind11.h>

namespace bitrefit::python {

void register_ops(pybind11::module_& m);

}  // namespace bitrefit::python
