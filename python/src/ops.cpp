// python/src/ops.cpp — see ops.hpp. The GIL is released while an operation reads, encodes,
// applies or digests; it is taken back only to call the progress callback and to check for
// signals (Ctrl-C interrupts a long operation between two progress steps; nothing is written).
#include "ops.hpp"

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <string>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/ops/checkpoint_ops.hpp"
#include "json.hpp"
#include "tensors.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace bitrefit::python {
namespace {

/// ops::progress into an optional Python callable progress(phase, done, total), called at the start
/// of each phase (done = 0), as bytes are done, and at its end (done = total). Also the point where
/// a pending signal (KeyboardInterrupt) stops the operation.
class python_progress final : public ops::progress {
 public:
  explicit python_progress(py::object fn) : fn_(std::move(fn)) {}
  void begin(std::string_view phase, std::uint64_t total_bytes, bool) override {
    phase_ = phase;
    total_ = total_bytes;
    report(0);
  }
  void update(std::uint64_t done) override { report(done); }
  void end(bool ok) override {
    if (ok) report(total_);
  }

 private:
  void report(std::uint64_t done) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (!fn_.is_none()) fn_(phase_, done, total_);
  }
  py::object fn_;
  std::string phase_;
  std::uint64_t total_ = 0;
};

ops::codec_settings settings(int zstd_level, std::uint64_t frame_bytes, unsigned threads) {
  ops::codec_settings s;
  if (zstd_level < 1 || zstd_level > 22)
    throw error(errc::invalid_argument, "zstd_level must be between 1 and 22", {.file = {}, .tensor = {}, .field = "zstd_level"});
  if (frame_bytes == 0)
    throw error(errc::invalid_argument, "frame_bytes must be positive", {.file = {}, .tensor = {}, .field = "frame_bytes"});
  s.zstd_level = zstd_level;
  s.frame_bytes = frame_bytes;
  s.threads = threads;
  return s;
}

/// Runs `work` (returning an ops result) with the GIL released; converts the result's JSON.
template <class Work>
py::object run(py::object progress_fn, Work work) {
  python_progress progress(std::move(progress_fn));
  ops::ordered_json j;
  {
    py::gil_scoped_release nogil;
    j = ops::to_json(work(progress));
  }
  return to_python(j);
}

}  // namespace

void register_ops(py::module_& m) {
  const ops::codec_settings defaults;
  m.def(
      "stat",
      [](const fs::path& old_path, const fs::path& new_path, int zstd_level, std::uint64_t frame_bytes, unsigned threads,
         py::object progress) {
        const auto s = settings(zstd_level, frame_bytes, threads);
        return run(std::move(progress), [&](ops::progress& p) { return ops::compute_stat(old_path, new_path, s, p); });
      },
      py::arg("old"), py::arg("new"), py::kw_only(), py::arg("zstd_level") = defaults.zstd_level,
      py::arg("frame_bytes") = defaults.frame_bytes, py::arg("threads") = 0u, py::arg("progress") = py::none(),
      "What a delta from OLD to NEW would cost, per tensor and in total (`bitrefit stat --json`).\n"
      "OLD and NEW are .safetensors files or sharded checkpoint directories. Returns a dict: equal,\n"
      "tensors (per tensor: name, dtype, shape, elements, changed, change_rate, dense_bytes,\n"
      "overwrite_only_bytes, xor_bytes, chosen_bytes, entropy_bytes), total, payload, seconds (per phase).\n"
      "progress: optional callable(phase, done_bytes, total_bytes).");
  m.def(
      "diff",
      [](const fs::path& old_path, const fs::path& new_path, const fs::path& delta, const std::string& mode, bool directory,
         int zstd_level, std::uint64_t frame_bytes, unsigned threads, py::object progress) {
        if (mode != "xor" && mode != "overwrite")
          throw error(errc::invalid_argument, "mode must be 'xor' or 'overwrite', not '" + mode + "'",
                      {.file = {}, .tensor = {}, .field = "mode"});
        const auto s = settings(zstd_level, frame_bytes, threads);
        std::string out = delta.string();
        const bool as_dir = directory || (!out.empty() && out.back() == '/');
        return run(std::move(progress), [&](ops::progress& p) {
          return ops::write_diff(old_path, new_path, out, as_dir, mode == "overwrite", s, p);
        });
      },
      py::arg("old"), py::arg("new"), py::arg("delta"), py::kw_only(), py::arg("mode") = "xor", py::arg("directory") = false,
      py::arg("zstd_level") = defaults.zstd_level, py::arg("frame_bytes") = defaults.frame_bytes, py::arg("threads") = 0u,
      py::arg("progress") = py::none(),
      "Writes the delta bundle OLD -> NEW to DELTA atomically (`bitrefit diff --json`): a single file, or a\n"
      "directory when directory=True or DELTA ends in '/'. mode: 'xor' (the encoder chooses per chunk) or\n"
      "'overwrite'. Returns a dict: delta, base_digest, target_digest, tensors, elements, changed,\n"
      "change_rate, dense_bytes, frames, frame_bytes, bundle_bytes, seconds.");
  m.def(
      "apply",
      [](const fs::path& base, const fs::path& delta, std::optional<fs::path> out, bool in_place, py::object progress) {
        if (in_place == out.has_value())
          throw error(errc::invalid_argument, "apply takes either out=PATH or in_place=True", {.file = {}, .tensor = {}, .field = "out"});
        const fs::path target = in_place ? base : *out;
        return run(std::move(progress), [&](ops::progress& p) { return ops::apply_delta(base, delta, target, p); });
      },
      py::arg("base"), py::arg("delta"), py::arg("out") = py::none(), py::kw_only(), py::arg("in_place") = false,
      py::arg("progress") = py::none(),
      "Rebuilds the target of DELTA from BASE and writes it to OUT (or over BASE with in_place=True),\n"
      "atomically, after every digest checked out (`bitrefit apply --json`). Returns a dict: base_digest,\n"
      "target_digest, frames, changed, seconds. A delta for another base raises MismatchError, a damaged\n"
      "one IntegrityError; nothing is written then.");
  m.def(
      "verify",
      [](const fs::path& a, const fs::path& b, std::uint64_t limit, py::object progress) {
        if (limit == 0) throw error(errc::invalid_argument, "limit must be positive", {.file = {}, .tensor = {}, .field = "limit"});
        return run(std::move(progress), [&](ops::progress& p) { return ops::verify_checkpoints(a, b, limit, p); });
      },
      py::arg("a"), py::arg("b"), py::kw_only(), py::arg("limit") = 5u, py::arg("progress") = py::none(),
      "Compares two checkpoints by tensor name: dtypes, shapes and every stored bit (`bitrefit verify\n"
      "--json`). Returns a dict: equal, a_digest, b_digest, differing_tensors, differences (at most\n"
      "`limit`: tensor, reason, differing_elements, first_indices).");
  m.def(
      "digest",
      [](py::object what, py::object progress) -> py::object {
        if (py::hasattr(what, "items")) {  // a mapping of names to in-memory tensors
          const auto refs = resolve_mapping(what, access::read);
          ops::digest_result r;
          {
            py::gil_scoped_release nogil;
            std::vector<tensor_view> views;
            for (const auto& t : refs) views.push_back(t.view());
            r.digest = codec::attestation_digest(std::span<const tensor_view>(views));
            r.tensors = views.size();
            for (const auto& t : refs) {
              r.elements += element_count(t.shape, t.name);
              r.bytes += t.bytes.size();
            }
          }
          return to_python(ops::to_json(r));
        }
        const fs::path path = py::cast<fs::path>(what);
        return run(std::move(progress), [&](ops::progress& p) { return ops::digest_checkpoint(path, p); });
      },
      py::arg("checkpoint"), py::kw_only(), py::arg("progress") = py::none(),
      "The attestation digest (XXH3-128 over names, dtypes, shapes and every bit, in name order) of a\n"
      "checkpoint path, or of a mapping of names to tensors held in memory (a state_dict): a refit\n"
      "receiver whose tensors digest like the trainer's export holds exactly its bits. Returns a dict:\n"
      "digest (32 hex digits), tensors, elements, bytes.");
}

}  // namespace bitrefit::python
