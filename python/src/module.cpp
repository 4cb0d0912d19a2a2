// python/src/module.cpp — the `bitrefit._bitrefit` extension module (re-exported by bitrefit/__init__.py).
//
// A thin, typed binding of the C++ library, not a second implementation: the checkpoint operations
// are ops/checkpoint_ops.hpp (what the CLI runs), refits are refit::sender / refit::receiver over
// the directory object store with the filesystem commit log and baseline stores (what the demo
// runs), and tensors are read and written in place through DLPack or the buffer protocol.
#include <pybind11/pybind11.h>

#include "errors.hpp"
#include "ops.hpp"
#include "refit.hpp"
#include "tensors.hpp"

PYBIND11_MODULE(_bitrefit, m) {
  m.doc() =
      "bitrefit: bit-exact delta refit of model weights from trainers to rollout engines.\n"
      "Checkpoint operations (stat, diff, apply, verify, digest), tensor interop (torch CPU tensors,\n"
      "numpy arrays, with_dtype), and refits in place (Sender, Receiver). Errors are bitrefit.Error.";
  m.attr("__version__") = "0.1.0";
  bitrefit::python::register_errors(m);
  bitrefit::python::register_tensors(m);
  bitrefit::python::register_ops(m);
  bitrefit::python::register_refit(m);
}
