// python/src/errors.hpp — bitrefit::error as typed Python exceptions.
//
// Every library failure reaches Python as an instance of bitrefit.Error (or the subclass of its
// errc: InvalidArgumentError, IoError, FormatError, IntegrityError, MismatchError, ProtocolError,
// FencedError, UnsupportedError) with the attributes errc, file, tensor, field, message and, for
// a checkpoint that breaks a safetensors rule, problem (io::checkpoint_errc's name). Code that
// catches ValueError keeps working for the argument-like ones; OSError for IoError.
#pragma once

#include <pybind11/pybind11.h>

namespace bitrefit::python {

/// Creates the exception classes in `m` and registers the translator of bitrefit::error.
void register_errors(pybind11::module_& m);

}  // namespace bitrefit::python
